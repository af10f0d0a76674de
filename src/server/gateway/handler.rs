//! The gate's request handler: what each request is, whether its index is guarded, and who
//! handles it (pass-through, a guarded document write, a guarded `_bulk`, a refusal).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Router;

use super::body::{self, body_error, inflate, read_body, read_raw, BodyWatch};
use super::gate::{unavailable, Gateway};
use super::reply::{Dress, GateError};
use super::route::{self, Route};

/// The router of the gate's listener: one handler for every path.
pub fn router(gate: Arc<Gateway>) -> Router {
    Router::new().fallback(handle).with_state(gate)
}

async fn handle(State(gate): State<Arc<Gateway>>, request: Request) -> Response {
    // The body must arrive within server.body.timeout, whether it is read or streamed on.
    let (request, watch) = body::watch(request, gate.state.settings.body_timeout);
    let dress = match gate.product().await {
        Ok(product) => Dress::new(product, request.headers()),
        // The cluster has not answered since the start: no request can be served yet.
        Err(e) => return Dress::new(None, request.headers()).error(&e),
    };
    let params = route::params(request.uri().query());
    let route = route::classify(request.method(), request.uri().path(), &params);
    let metrics = gate.state.metrics.clone();
    let writes = !matches!(route, Route::Pass | Route::AutoId { .. });
    if writes && gate.draining() {
        return dress.error(
            &GateError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "zkguard_shutting_down_exception",
                "zkguard: the service is shutting down; send the request again (to another instance)",
            )
            .retry_after(1),
        );
    }
    if !matches!(route, Route::Pass) {
        if let Err(e) = gate.know_own().await {
            return dress.error(&e);
        }
    }
    match route {
        Route::Pass => pass(&gate, &dress, "other", request, &watch).await,
        Route::AutoId { index } => {
            if let Some(refusal) = gate.own_index(&index) {
                metrics.gate("auto_id", "refused");
                return dress.error(&refusal);
            }
            if route::is_multi_target(&index) && gate.guards_any(&index) {
                metrics.gate("auto_id", "refused");
                return dress.error(&multi_target(&index));
            }
            pass(&gate, &dress, "auto_id", request, &watch).await
        }
        Route::ByQuery { api, targets } => {
            if let Some(refusal) = gate.own_index(&targets) {
                metrics.gate("by_query", "refused");
                return dress.error(&refusal);
            }
            if gate.guards_any(&targets) {
                metrics.gate("by_query", "refused");
                return dress.error(&GateError::refused(format!(
                    "zkguard: {api} on [{targets}] is refused: it would write guarded documents without their locks and fencing tokens; search the documents and write each one (or use _bulk) through the gate"
                )));
            }
            pass(&gate, &dress, "by_query", request, &watch).await
        }
        Route::Reindex => reindex(&gate, &dress, request, &watch).await,
        Route::Doc { op, index, id } => {
            if let Some(refusal) = gate.own_index(&index) {
                metrics.gate(op.name(), "refused");
                return dress.error(&refusal);
            }
            if !gate.guards(&index) && !route::is_multi_target(&index) {
                return pass(&gate, &dress, op.name(), request, &watch).await;
            }
            if route::is_multi_target(&index) {
                metrics.gate(op.name(), "refused");
                return dress.error(&multi_target(&index));
            }
            if let Some(refusal) = gate.not_admitted(request.headers()) {
                metrics.gate(op.name(), "refused");
                return dress.error(&refusal);
            }
            let (parts, body) = request.into_parts();
            let body = match read_body(&parts.headers, body, &watch, &gate.bodies).await {
                Ok(b) => b,
                Err(e) => return body_error(&dress, &e, &watch),
            };
            super::single::write(&gate, &dress, op, &index, &id, &parts.headers, params, body).await
        }
        Route::Bulk { index } => {
            if let Some(refusal) = gate.not_admitted(request.headers()) {
                metrics.gate("bulk", "refused");
                return dress.error(&refusal);
            }
            let (parts, body) = request.into_parts();
            let body = match read_body(&parts.headers, body, &watch, &gate.bodies).await {
                Ok(b) => b,
                Err(e) => return body_error(&dress, &e, &watch),
            };
            // Its body read, a `_bulk` takes its places before anything is parsed or locked.
            let _places = match gate.bulk_places(&parts.headers).await {
                Ok(p) => p,
                Err(e) => {
                    metrics.gate("bulk", "refused");
                    return dress.error(&e);
                }
            };
            match super::atomic::asked(&parts.headers) {
                Ok(true) => {
                    super::atomic::run(&gate, &dress, index, &parts.headers, params, body).await
                }
                Ok(false) => {
                    super::bulk::run(&gate, &dress, index, &parts.headers, params, body).await
                }
                Err(e) => dress.error(&e),
            }
        }
    }
}

fn multi_target(target: &str) -> GateError {
    GateError::refused(format!(
        "zkguard: a document write to [{target}] is refused: it names several indices or a pattern; write to one index (or alias)"
    ))
}

async fn pass(
    gate: &Gateway,
    dress: &Dress,
    route: &'static str,
    request: Request,
    watch: &BodyWatch,
) -> Response {
    if route::has_dot_segment(request.uri().path()) {
        gate.state.metrics.gate(route, "refused");
        return dress.error(&GateError::new(
            StatusCode::BAD_REQUEST,
            "illegal_argument_exception",
            format!(
                "zkguard: the path [{}] has a `.` or `..` segment, which the gate cannot pass on unchanged (it would reach another path of the cluster); read documents with such ids with _mget or _search, write them through the gate's document routes or _bulk",
                request.uri().path()
            ),
        ));
    }
    let changes_aliases = route::may_change_aliases(request.method(), request.uri().path());
    let passed = gate.cluster.pass(request).await;
    if changes_aliases {
        gate.aliases_changed();
    }
    match passed {
        Ok(r) => {
            gate.state.metrics.gate(route, "passed");
            r
        }
        Err(e) => {
            if let Some(fault) = watch.fault() {
                // The caller's body, not the cluster, failed.
                gate.state.metrics.gate(route, "refused");
                return body_error(dress, &fault.error(), watch);
            }
            gate.state.metrics.gate(route, "failed");
            dress.error(&GateError::new(
                StatusCode::BAD_GATEWAY,
                "zkguard_cluster_unavailable_exception",
                format!("zkguard: the request could not be passed to Elasticsearch: {e}"),
            ))
        }
    }
}

async fn reindex(gate: &Gateway, dress: &Dress, request: Request, watch: &BodyWatch) -> Response {
    let (parts, body) = request.into_parts();
    let raw = match read_raw(&parts.headers, body, watch, &gate.bodies).await {
        Ok(b) => b,
        Err(e) => return body_error(dress, &e, watch),
    };
    let inflated = match inflate(&parts.headers, raw.clone(), watch, &gate.bodies) {
        Ok(b) => b,
        Err(e) => return dress.error(&e),
    };
    let body: serde_json::Value = serde_json::from_slice(&inflated).unwrap_or_default();
    let dest = body["dest"]["index"].as_str().unwrap_or_default();
    if let Some(refusal) = gate.own_index(dest) {
        gate.state.metrics.gate("reindex", "refused");
        return dress.error(&refusal);
    }
    if gate.guards_any(dest) {
        gate.state.metrics.gate("reindex", "refused");
        return dress.error(&GateError::refused(format!(
            "zkguard: _reindex into [{dest}] is refused: it would write guarded documents without their locks and fencing tokens; reindex into an index the gate does not guard (server.gateway.indices), or read the source and _bulk the documents through the gate"
        )));
    }
    let target = parts
        .uri
        .path_and_query()
        .map_or("/_reindex", |p| p.as_str());
    match gate
        .cluster
        .pass_buffered(parts.method.clone(), target, &parts.headers, raw)
        .await
    {
        Ok(r) => {
            gate.state.metrics.gate("reindex", "passed");
            r
        }
        Err(e) => dress.error(&unavailable(e)),
    }
}
