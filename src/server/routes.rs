//! The HTTP API: routes, request parsing and answers.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures::FutureExt;
use serde_json::{json, Value};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::errors::ApiError;
use super::openapi;
use super::params::body_refusal;
use super::state::AppState;

/// The API routes under `/v1`, each with its OpenAPI operation (from its handler's
/// `#[utoipa::path]`).
fn api_routes() -> OpenApiRouter<Arc<AppState>> {
    use super::{admin, bulk_route, lock_routes, txn_routes, write_routes};
    OpenApiRouter::with_openapi(openapi::base())
        .routes(routes!(
            write_routes::put_doc,
            write_routes::patch_doc,
            write_routes::delete_doc
        ))
        .routes(routes!(write_routes::get_operation))
        .routes(routes!(bulk_route::bulk))
        .routes(routes!(admin::list_deadletters))
        .routes(routes!(admin::replay_deadletters))
        .routes(routes!(admin::discard_deadletter))
        .routes(routes!(admin::transfer))
        .routes(routes!(admin::get_transfer))
        .routes(routes!(txn_routes::create_transaction))
        .routes(routes!(txn_routes::get_transaction))
        .routes(routes!(
            lock_routes::list_locks,
            lock_routes::take_document_lock
        ))
        .routes(routes!(lock_routes::monitor_locks, lock_routes::take_lock))
        .routes(routes!(lock_routes::release_lock))
        .routes(routes!(lock_routes::keep_alive))
        .routes(routes!(lock_routes::clear_stray))
        .routes(routes!(lock_routes::force_release))
        .routes(routes!(super::events::stream))
}

/// The routes operators call (`/healthz`, `/readyz`, `/metrics`), documented like the API.
fn operator_routes() -> OpenApiRouter<Arc<AppState>> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
}

/// The OpenAPI 3.1 document of the service's routes, as `GET /openapi.json` serves it and
/// `zkguard openapi` prints it.
pub fn document() -> utoipa::openapi::OpenApi {
    let (_, api) = api_routes().merge(operator_routes()).split_for_parts();
    openapi::finish(api)
}

/// The application: API routes under `/v1` (bearer tokens when configured, concurrency limit,
/// request timeout, body limit), the OpenAPI document and the API docs (without a token: they
/// hold no data, and a browser cannot send one), the status page `/ui` (read without a token;
/// concurrency limit and request timeout),
/// `/healthz`, `/readyz`, `/metrics`; JSON errors for unknown routes and methods; request
/// counting; panics turned into 500 answers.
pub fn router(state: Arc<AppState>, tokens: Arc<super::access::Tokens>) -> Router {
    let (api, _) = api_routes().split_for_parts();
    let api = api
        .route_layer(middleware::from_fn_with_state(state.clone(), guard_load))
        .route_layer(middleware::from_fn_with_state(
            tokens.clone(),
            super::access::authenticate,
        ))
        .layer(DefaultBodyLimit::max(state.settings.max_body));
    let document = Bytes::from(pretty(&document()));
    let contract = Router::new()
        .route(
            "/openapi.json",
            get(move || std::future::ready(openapi::openapi_json(document.clone()))),
        )
        .route("/docs", get(openapi::docs_page))
        .route("/docs/redoc.standalone.js", get(openapi::docs_asset))
        .route("/docs/redoc-logo.svg", get(openapi::docs_logo));
    // The status page reads without a token (its actions are `/v1` routes, which need one).
    let status_page = Router::new()
        .route("/ui", get(super::ui::page))
        .route("/ui/status", get(super::ui::status))
        .route("/ui/ui.js", get(super::ui::script))
        .route("/ui/ui.css", get(super::ui::style))
        .route_layer(middleware::from_fn_with_state(state.clone(), guard_load));
    let status_page = if state.settings.ui_enabled {
        status_page
    } else {
        Router::new()
    };
    let (operators, _) = operator_routes().split_for_parts();
    Router::new()
        .merge(api)
        .merge(contract)
        .merge(status_page.layer(axum::Extension(tokens.clone())))
        .merge(operators.layer(axum::Extension(tokens)))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .layer(middleware::from_fn(catch_panic))
        .with_state(state)
}

/// `api` as pretty JSON with a final newline: the form committed as `docs/openapi.json`.
pub fn pretty(api: &utoipa::openapi::OpenApi) -> String {
    let mut text = serde_json::to_string_pretty(api).unwrap_or_default();
    text.push('\n');
    text
}

async fn not_found(method: Method, uri: axum::http::Uri) -> ApiError {
    // `/v1/indices/{index}/docs/.` (or `..`) reaches here with the dot segment removed by the
    // HTTP stack: say what was wrong rather than name a route nobody asked for.
    let segments: Vec<&str> = uri.path().trim_end_matches('/').split('/').collect();
    let write = matches!(method, Method::PUT | Method::DELETE | Method::PATCH);
    if let (true, ["", "v1", "indices", _, "docs"] | ["", "v1", "indices", _]) =
        (write, segments.as_slice())
    {
        return ApiError::bad(
            "bad_id",
            format!("no document id in {}: document ids cannot be empty, `.` or `..` (URL path segments that HTTP stacks remove); choose another id", uri.path()),
        );
    }
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_route",
        format!(
            "no route for {method} {}; the API is under /v1 (see the README)",
            uri.path()
        ),
    )
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{method} is not allowed on {}", uri.path()),
    )
}

/// Turns a panic in a handler into a 500 answer (the service keeps running).
async fn catch_panic(request: Request, next: Next) -> Response {
    match AssertUnwindSafe(next.run(request)).catch_unwind().await {
        Ok(response) => response,
        Err(_) => {
            tracing::error!("a request handler panicked");
            ApiError::internal("the service failed while handling the request; see its log")
                .into_response()
        }
    }
}

/// Counts requests by route, method and status.
async fn count(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = request.method().to_string();
    let response = next.run(request).await;
    state
        .metrics
        .http_requests
        .get_or_create(&super::metrics::HttpLabels {
            route,
            method,
            status: response.status().as_u16(),
        })
        .inc();
    response
}

/// Refuses API requests beyond `server.max.concurrent` (503 with `Retry-After`) and while
/// draining, and bounds each request by `server.request.timeout`. The body is read first, under
/// `server.body.timeout` and before the request takes a slot: a client that trickles or stalls
/// its body holds no slot, and gets 408 (with the connection closed) once the body is overdue;
/// a request refused for load has had its body read, so its connection stays usable.
async fn guard_load(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if state.draining.load(Ordering::Acquire) {
        return ApiError::unavailable(
            "shutting_down",
            "the service is shutting down; send the request to another instance or retry after it restarts",
        )
        .into_response();
    }
    let request = match read_body(&state, request).await {
        Ok(request) => request,
        Err(refused) => return refused,
    };
    let path = request.uri().path();
    if path == "/v1/events" {
        // A stream: bounded by server.events.max, for as long as its client reads.
        return next.run(request).await;
    }
    // A wait (an operation's outcome, a monitor's change) takes a waiter's slot, not one of
    // the requests'.
    let waits = (path.starts_with("/v1/operations/") || path.starts_with("/v1/locks/"))
        && request.method() == Method::GET
        && request
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p.starts_with("wait=")));
    let semaphore = if waits {
        &state.waiters
    } else {
        &state.permits
    };
    let Ok(_permit) = semaphore.clone().try_acquire_owned() else {
        if waits {
            let route = if path.starts_with("/v1/locks/") {
                "lock"
            } else {
                "operation"
            };
            state.metrics.waited(route, "refused");
            return ApiError::unavailable(
                "too_many_waiters",
                format!(
                    "{} requests wait already (server.wait.max); retry after the Retry-After delay, or ask without wait",
                    state.settings.wait_max
                ),
            )
            .into_response();
        }
        return ApiError::unavailable(
            "overloaded",
            format!(
                "the service is handling its limit of {} requests (server.max.concurrent); retry after the Retry-After delay",
                state.settings.max_concurrent
            ),
        )
        .into_response();
    };
    let limit = state.settings.request_timeout;
    let retry = retry_advice(request.method(), request.uri().path());
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::unavailable(
            "request_timeout",
            format!(
                "the request took longer than server.request.timeout ({}ms) and was abandoned; {retry}",
                limit.as_millis()
            ),
        )
        .into_response(),
    }
}

/// What the client of an abandoned request on `path` can do: a transaction goes on in the
/// service and is named by its `id`, an operation by its `op_id`.
fn retry_advice(method: &Method, path: &str) -> &'static str {
    if path == "/v1/transactions" && method == Method::POST {
        "the transaction goes on and is decided on its own: send it again with the same id (the body's `id`, or the Idempotency-Key header), which answers its decision once made, or read it with GET /v1/transactions/{id}"
    } else {
        "a write may or may not have been applied: retry it with the same op_id"
    }
}

/// Reads `request`'s body (at most `server.max.body` bytes, within `server.body.timeout`) and
/// hands the request on with it.
async fn read_body(state: &AppState, request: Request) -> Result<Request, Response> {
    let (parts, body) = request.into_parts();
    let (limit, max) = (state.settings.body_timeout, state.settings.max_body);
    match tokio::time::timeout(limit, axum::body::to_bytes(body, max)).await {
        Ok(Ok(bytes)) => Ok(Request::from_parts(parts, axum::body::Body::from(bytes))),
        Ok(Err(e)) => {
            // http-body-util's LengthLimitError, somewhere in the chain.
            let too_large =
                std::iter::successors(Some(&e as &(dyn std::error::Error + 'static)), |e| {
                    e.source()
                })
                .any(|e| e.to_string() == "length limit exceeded");
            Err(closing(body_refusal(too_large, &e, max).into_response()))
        }
        Err(_) => {
            tracing::warn!(method = %parts.method, path = %parts.uri.path(), timeout_ms = limit.as_millis() as u64, "a request body did not arrive in time; closing the connection");
            Err(closing(
                ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "body_timeout",
                    format!("the request body did not arrive within server.body.timeout ({}ms); nothing was done: send the whole body at once and retry", limit.as_millis()),
                )
                .into_response(),
            ))
        }
    }
}

/// `response` with `Connection: close`: what is left of the request's body is not read.
fn closing(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

#[utoipa::path(
    get,
    path = "/healthz",
    summary = "Liveness",
    description = "200 while the process runs.",
    tag = "operations",
    responses((status = 200, description = "Alive.", body = openapi::Status, example = json!({"status": "alive"})))
)]
async fn healthz() -> Json<Value> {
    Json(json!({"status": "alive"}))
}

/// `/readyz`: ready, or what is not. It answers without a token; where tokens are configured,
/// only a caller with one is told where the unreachable servers are (their addresses), others
/// what is down.
#[utoipa::path(
    get,
    path = "/readyz",
    summary = "Readiness",
    description = "200 when the lock backend is usable, the journal can record outcomes and Elasticsearch answers. Answers without a token; with tokens configured, only a caller that sends one is told where the unreachable servers are.",
    tag = "operations",
    responses(
        (status = 200, description = "Ready.", body = openapi::Status, example = json!({"status": "ready"})),
        (status = 503, description = "`not_ready`, with what is not (and while shutting down).", body = openapi::Error, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
async fn readyz(
    State(state): State<Arc<AppState>>,
    axum::Extension(tokens): axum::Extension<Arc<super::access::Tokens>>,
    headers: axum::http::HeaderMap,
) -> Response {
    let detailed = tokens.admits(&headers);
    if state.draining.load(Ordering::Acquire) {
        return ApiError::unavailable("not_ready", "the service is shutting down").into_response();
    }
    let mut problems = Vec::new();
    if let Some(p) = state.lock_problem() {
        problems.push(if detailed {
            p
        } else {
            match &state.backend {
                super::state::Backend::ZooKeeper(_) => {
                    "the ZooKeeper session is not connected (send a bearer token to be told the servers)".to_string()
                }
                super::state::Backend::Elasticsearch(_) => {
                    "the Elasticsearch lease lock is unavailable (send a bearer token for details)"
                        .to_string()
                }
            }
        });
    }
    if let Some(p) = state.journal_problem() {
        problems.push(if detailed {
            p
        } else {
            "the journal cannot record outcomes or take operations (send a bearer token for details)".to_string()
        });
    }
    if let Err(p) = state.ping_es().await {
        let p = if detailed {
            p
        } else {
            "Elasticsearch does not answer (send a bearer token to be told where)".to_string()
        };
        if !problems.contains(&p) {
            problems.push(p);
        }
    }
    if problems.is_empty() {
        if let Some(p) = state.start_problem() {
            problems.push(if detailed {
                p
            } else {
                "starting: waiting for Elasticsearch (send a bearer token to be told where)"
                    .to_string()
            });
        }
    }
    if problems.is_empty() {
        Json(json!({"status": "ready"})).into_response()
    } else {
        ApiError::unavailable("not_ready", problems.join("; ")).into_response()
    }
}

#[utoipa::path(
    get,
    path = "/metrics",
    summary = "Prometheus metrics",
    description = "The service's metrics in the OpenMetrics text format (docs/serve.md lists them).",
    tag = "operations",
    responses((status = 200, description = "The metrics.", body = String, content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"))
)]
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    state.refresh_gauges();
    state
        .metrics
        .count_deadletters(state.executor.sink().as_ref())
        .await;
    let partitions = state.partition_views();
    let mut response = state.metrics.encode(&partitions).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}
