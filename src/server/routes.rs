//! The HTTP API: routes, request parsing and answers.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, RawQuery, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use futures::FutureExt;
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;
use zkguard::write::guarded::{GuardedError, Written};
use zkguard::write::ops::{DeleteMode, Operation};
use zkguard::{LockError, LockType};

use super::errors::{from_guarded, ApiError};
use super::journal::{Entry, Finished, OpState};
use super::lock_routes::{
    keep_alive, list_locks, monitor_locks, release_lock, take_document_lock, take_lock,
};
use super::params::{
    body_error, body_refusal, check_doc_id, check_index, check_monitor, document_monitor,
    parse_json, parse_op_id, parse_params, path_error, unknown_lock, WriteParams, WriteRoute, INFO,
};
use super::state::AppState;

/// The application: API routes under `/v1` (bearer tokens when configured, concurrency limit,
/// request timeout, body limit),
/// `/healthz`, `/readyz`, `/metrics`; JSON errors for unknown routes and methods; request
/// counting; panics turned into 500 answers.
pub fn router(state: Arc<AppState>, tokens: Arc<super::access::Tokens>) -> Router {
    let api = Router::new()
        .route(
            "/v1/indices/{index}/docs/{id}",
            put(put_doc).patch(patch_doc).delete(delete_doc),
        )
        .route("/v1/operations/{id}", get(get_operation))
        .route("/v1/bulk", post(bulk))
        .route("/v1/deadletters", get(super::admin::list_deadletters))
        .route(
            "/v1/deadletters/replay",
            post(super::admin::replay_deadletters),
        )
        .route(
            "/v1/deadletters/{id}",
            delete(super::admin::discard_deadletter),
        )
        .route("/v1/transfers", post(super::admin::transfer))
        .route("/v1/transfers/{id}", get(super::admin::get_transfer))
        .route("/v1/locks", get(list_locks).post(take_document_lock))
        .route("/v1/locks/{monitor}", get(monitor_locks).post(take_lock))
        .route("/v1/locks/{monitor}/{lock_id}", delete(release_lock))
        .route("/v1/locks/{monitor}/{lock_id}/keepalive", post(keep_alive))
        .route("/v1/events", get(super::events::stream))
        .route_layer(middleware::from_fn_with_state(state.clone(), guard_load))
        .route_layer(middleware::from_fn_with_state(
            tokens.clone(),
            super::access::authenticate,
        ))
        .layer(DefaultBodyLimit::max(state.settings.max_body));
    Router::new()
        .merge(api)
        .route("/healthz", get(healthz))
        .route(
            "/readyz",
            get({
                let tokens = tokens.clone();
                move |state: State<Arc<AppState>>, headers: axum::http::HeaderMap| {
                    readyz(state, tokens.admits(&headers))
                }
            }),
        )
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .layer(middleware::from_fn(catch_panic))
        .with_state(state)
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
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::unavailable(
            "request_timeout",
            format!(
                "the request took longer than server.request.timeout ({}ms) and was abandoned; a write may or may not have been applied: retry it with the same op_id",
                limit.as_millis()
            ),
        )
        .into_response(),
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

async fn healthz() -> Json<Value> {
    Json(json!({"status": "alive"}))
}

/// `/readyz`: ready, or what is not. It answers without a token; where tokens are configured,
/// only a caller with one is told where the unreachable servers are (their addresses), others
/// what is down.
async fn readyz(State(state): State<Arc<AppState>>, detailed: bool) -> Response {
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
    if let Some(p) = state.journal.problem() {
        problems.push(if detailed {
            p
        } else {
            "the journal cannot record outcomes (send a bearer token for details)".to_string()
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
        Json(json!({"status": "ready"})).into_response()
    } else {
        ApiError::unavailable("not_ready", problems.join("; ")).into_response()
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    state.refresh_gauges();
    let mut response = state.metrics.encode().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}

/// The request's body as a JSON object (`what` it holds, for the refusal of anything else).
fn object_body(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
    what: &str,
) -> Result<Value, ApiError> {
    let body = body.map_err(|e| body_error(e, state.settings.max_body))?;
    let value = parse_json(&body, "the body")?;
    if !value.is_object() {
        return Err(ApiError::bad(
            "bad_document",
            format!("the body must be a JSON object: {what}"),
        ));
    }
    Ok(value)
}

async fn put_doc(
    State(state): State<Arc<AppState>>,
    path: Result<Path<(String, String)>, PathRejection>,
    RawQuery(query): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Path((index, id)) = path.map_err(path_error)?;
    let params = parse_params(query, WriteRoute::Put, state.settings.request_timeout)?;
    let doc = object_body(&state, body, "the document's source")?;
    let (op, params) = build_op(&index, &id, params, |m| {
        Operation::index(m, &index, &id, doc)
    })?;
    submit(&state, op, params).await
}

/// `PATCH /v1/indices/{index}/docs/{id}`: an RFC 7386 JSON merge patch, applied under the lock
/// to the document as stored then (read, merge, fenced write), so concurrent patches of different
/// fields all survive; `?upsert=true` creates a missing document from `{}`.
async fn patch_doc(
    State(state): State<Arc<AppState>>,
    path: Result<Path<(String, String)>, PathRejection>,
    RawQuery(query): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Path((index, id)) = path.map_err(path_error)?;
    let params = parse_params(query, WriteRoute::Patch, state.settings.request_timeout)?;
    let patch = object_body(
        &state,
        body,
        "a JSON merge patch (RFC 7386), where null removes a field",
    )?;
    let upsert = params.upsert;
    let (op, params) = build_op(&index, &id, params, |m| {
        Operation::merge(m, &index, &id, patch).with_upsert(upsert)
    })?;
    submit(&state, op, params).await
}

async fn delete_doc(
    State(state): State<Arc<AppState>>,
    path: Result<Path<(String, String)>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let Path((index, id)) = path.map_err(path_error)?;
    let params = parse_params(query, WriteRoute::Delete, state.settings.request_timeout)?;
    let mode = params.mode.unwrap_or_default();
    let (op, params) = build_op(&index, &id, params, |m| {
        Operation::delete(m, &index, &id).with_delete_mode(mode)
    })?;
    submit(&state, op, params).await
}

fn build_op(
    index: &str,
    id: &str,
    params: WriteParams,
    make: impl FnOnce(String) -> Operation,
) -> Result<(Operation, WriteParams), ApiError> {
    check_index(index)?;
    check_doc_id(id)?;
    let monitor = params
        .monitor
        .clone()
        .unwrap_or_else(|| document_monitor(index, id));
    check_monitor(&monitor)?;
    let mut op = make(monitor).with_type(params.lock_type).with_info(INFO);
    if let Some(op_id) = params.op_id {
        op = op.with_id(op_id);
    }
    op.validate()
        .map_err(|e| ApiError::bad("invalid_operation", e.to_string()))?;
    Ok((op, params))
}

async fn submit(
    state: &Arc<AppState>,
    op: Operation,
    params: WriteParams,
) -> Result<Response, ApiError> {
    check_writable(state, op.target_index())?;
    if state.journal.reuses_id(&op) {
        return Err(op_id_reused(&op, None));
    }
    if params.lock_type == LockType::Foreground {
        if let Some(answer) = recorded(state, &op) {
            return Ok(answer);
        }
    }
    if let Some(lock_id) = params.lock_id {
        return under_lock(state, op, lock_id).await;
    }
    match params.lock_type {
        LockType::Foreground => foreground(state, op, params.timeout).await,
        LockType::Background => {
            let id = op.id;
            let status = accept(state, vec![op]).await?;
            Ok((
                StatusCode::ACCEPTED,
                Json(json!({"operation_id": id.to_string(), "status": status[0].as_str()})),
            )
                .into_response())
        }
    }
}

/// Refuses a write to zkguard's own indices and to system indices, unless `server.index.allow`
/// names the index.
fn check_writable(state: &AppState, index: &str) -> Result<(), ApiError> {
    match state.settings.protected_index(index) {
        None => Ok(()),
        Some(why) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "protected_index",
            format!("index `{index}` {why}: writes through the API would corrupt its records, so they are refused; name it in server.index.allow if you really mean to write it"),
        )),
    }
}

/// The answer to an operation whose id names another operation (`line`: its line in a bulk
/// request, and the line of the other one there, if any).
fn op_id_reused(op: &Operation, lines: Option<(usize, Option<usize>)>) -> ApiError {
    let (at, other) = match lines {
        Some((n, Some(first))) => (
            format!("line {n}: "),
            format!("line {first} of this request"),
        ),
        Some((n, None)) => (
            format!("line {n}: "),
            "an operation accepted before".to_string(),
        ),
        None => (String::new(), "an operation accepted before".to_string()),
    };
    ApiError::new(
        StatusCode::CONFLICT,
        "op_id_reused",
        format!("{at}op_id {} already names {other}, another write (another document, body or monitor); nothing was accepted. An op_id names one operation: send a retry exactly as the first, and give a new operation a new op_id (or none, to have one generated)", op.id),
    )
}

/// The answer to a foreground retry of an operation that the journal records as applied: it is
/// not written again, whoever wrote the document since (a caller writing with its own client
/// under an explicit lock drops the document's record of operation ids, which is the other
/// place a retry is recognised).
fn recorded(state: &AppState, op: &Operation) -> Option<Response> {
    let entry = state.journal.get(&op.id)?;
    let finished = entry.finished.as_ref()?;
    if finished.status != OpState::Applied {
        return None;
    }
    tracing::info!(op = %op.id, "the journal records this operation as applied; not writing it again");
    state.metrics.outcome("foreground", "applied");
    Some(
        Json(json!({
            "operation_id": op.id.to_string(),
            "token": finished.token,
            "result": "already_applied",
            "version": Value::Null,
        }))
        .into_response(),
    )
}

/// A write under the caller's explicit lock `lock_id` (`?lock_id=`): made at once with the lock's
/// token, keeping the document's record of operation ids; the lock stays held.
async fn under_lock(
    state: &Arc<AppState>,
    op: Operation,
    lock_id: Uuid,
) -> Result<Response, ApiError> {
    let (monitor, shared) = state
        .explicit
        .guard(&lock_id)
        .map_err(|_| unknown_lock(&op.monitor, &lock_id))?;
    if monitor != op.monitor {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "wrong_lock",
            format!("lock {lock_id} guards `{monitor}`, not `{}`, the monitor of this write; nothing was written. Take the lock of this document (POST /v1/locks?index=&id=), or pass the monitor the lock guards as ?monitor=", op.monitor),
        ));
    }
    let held = shared.read().await;
    let Some(guard) = held.as_ref() else {
        return Err(unknown_lock(&op.monitor, &lock_id));
    };
    let result = state.writer.write_under(guard.as_ref(), &op).await;
    drop(held);
    answer(state, op, result, None)
}

/// One foreground write: lock, fenced write, release; one attempt.
async fn foreground(
    state: &Arc<AppState>,
    op: Operation,
    timeout: Option<Duration>,
) -> Result<Response, ApiError> {
    if let Some(problem) = state.lock_problem() {
        state.metrics.outcome("foreground", "lock_unavailable");
        return Err(ApiError::unavailable(
            "lock_unavailable",
            format!("{problem}; nothing was written, retry when /readyz answers 200"),
        ));
    }
    let writer = state
        .writer
        .clone()
        .with_lock_timeout(state.lock_wait(timeout));
    let result = writer.run(&op).await;
    let timing = result.as_ref().ok().map(|w| (w.waited, w.held));
    // A try-once (timeout=0) was not meant to wait: its refusal does not advise waiting longer.
    let tried_once = match &result {
        Err(GuardedError::Lock(e)) => super::errors::tried_once(timeout, e),
        _ => None,
    };
    answer(state, op, result, timing).map_err(|mut e| {
        if let Some(message) = tried_once {
            e.message = message;
        }
        e
    })
}

/// The answer to a foreground write that ended with `result`, journaled when applied, counted
/// in the metrics (`timing`: the lock's wait and hold, when the write took a lock of its own).
fn answer(
    state: &AppState,
    op: Operation,
    result: Result<Written, GuardedError>,
    timing: Option<(Duration, Duration)>,
) -> Result<Response, ApiError> {
    let m = &state.metrics;
    let fg = super::metrics::TypeLabels {
        lock_type: "foreground",
    };
    match result {
        Ok(w) => {
            if let Some((waited, held)) = timing {
                m.lock_used("foreground", waited, held);
            }
            m.outcome("foreground", "applied");
            state.events.applied(&op, w.token);
            state.journal.note(Finished {
                id: op.id,
                status: OpState::Applied,
                reason: None,
                token: Some(w.token),
                attempts: Some(1),
                fingerprint: Some(op.fingerprint()),
            });
            let result = if w.already_applied {
                "already_applied"
            } else if matches!(op.kind, zkguard::write::ops::OpKind::Delete { .. }) {
                if w.meta.is_some() {
                    "deleted"
                } else {
                    "not_found"
                }
            } else {
                "written"
            };
            Ok(Json(json!({
                "operation_id": op.id.to_string(),
                "token": w.token,
                "result": result,
                "version": w.meta.map(|m| m.version),
            }))
            .into_response())
        }
        Err(e) => {
            match &e {
                GuardedError::Lock(LockError::Timeout { .. }) => {
                    m.lock_timeouts.get_or_create(&fg).inc()
                }
                GuardedError::Fenced { .. } => m.fenced.get_or_create(&fg).inc(),
                GuardedError::LockLost { .. } | GuardedError::Lock(LockError::Lost { .. }) => {
                    m.locks_lost.inc()
                }
                _ => 0,
            };
            m.outcome("foreground", e.kind());
            state.events.failed(&op, &e);
            Err(from_guarded(e))
        }
    }
}

/// Journals background operations (fsynced), queues the new ones, and returns each one's state
/// (`queued`, or the state of an operation already known under the same id).
async fn accept(state: &Arc<AppState>, ops: Vec<Operation>) -> Result<Vec<OpState>, ApiError> {
    let ids: Vec<Uuid> = ops.iter().map(|o| o.id).collect();
    // In a task of its own, so that a request abandoned (timeout, client gone) once its
    // operations are journaled still queues them.
    let st = state.clone();
    let journaled = tokio::spawn(async move {
        let fresh = st.journal.accept(ops).await?;
        st.enqueue(fresh);
        Ok::<(), super::journal::JournalError>(())
    })
    .await
    .map_err(|e| ApiError::internal(format!("journaling failed: {e}")))?;
    journaled.map_err(|e| match e {
        super::journal::JournalError::Full { .. } => {
            state.metrics.queue_full.inc();
            ApiError::unavailable("queue_full", e.to_string())
        }
        e => {
            tracing::error!(error = %e, "cannot journal background operations");
            ApiError::unavailable(
                "journal_unavailable",
                format!("the operation could not be made durable, so it was not accepted: {e}"),
            )
        }
    })?;
    Ok(ids
        .iter()
        .map(|id| state.journal.get(id).map_or(OpState::Queued, |e| e.state()))
        .collect())
}

/// `GET /v1/operations/{id}[?wait=DURATION]`: the operation's state; with `wait`, answered as
/// soon as the operation is no longer queued, or when the wait ends (with its state then).
async fn get_operation(
    State(state): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let Path(id) = path.map_err(path_error)?;
    let id = parse_op_id(&id)?;
    let wait =
        super::params::wait_param(&state, query.as_deref(), &[], "GET /v1/operations/{id}")?.0;
    let mut outcomes = state.journal.watch_outcomes();
    let mut entry = known_operation(&state, &id)?;
    let Some(wait) = wait else {
        return Ok(Json(operation_json(&id, &entry)));
    };
    let waiting = super::params::Waiting::new(&state.metrics);
    let deadline = tokio::time::Instant::now() + wait;
    let outcome = loop {
        if entry.state() != OpState::Queued {
            break "changed";
        }
        tokio::select! {
            changed = outcomes.changed() => if changed.is_err() { break "timeout" },
            _ = tokio::time::sleep_until(deadline) => break "timeout",
        }
        entry = known_operation(&state, &id)?;
    };
    drop(waiting);
    state.metrics.waited("operation", outcome);
    Ok(Json(operation_json(&id, &entry)))
}

fn known_operation(state: &AppState, id: &Uuid) -> Result<Entry, ApiError> {
    state.journal.get(id).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_operation",
            format!(
                "no operation {id} is known here: it was never accepted by this instance, or its outcome is older than the last {} kept",
                super::journal::KEEP_FINISHED
            ),
        )
    })
}

fn operation_json(id: &Uuid, entry: &Entry) -> Value {
    let mut v = json!({"operation_id": id.to_string(), "status": entry.state().as_str()});
    if let Some(f) = &entry.finished {
        if let Some(r) = &f.reason {
            v["reason"] = json!(r);
        }
        if let Some(t) = f.token {
            v["token"] = json!(t);
        }
        if let Some(a) = f.attempts {
            v["attempts"] = json!(a);
        }
    }
    if let Some(op) = &entry.op {
        v["monitor"] = json!(op.monitor);
        v["index"] = json!(op.target_index());
        v["id"] = json!(op.target_id());
    }
    v
}

/// One line of a bulk request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkLine {
    action: BulkAction,
    index: String,
    id: String,
    #[serde(default)]
    doc: Option<Value>,
    #[serde(default)]
    monitor: Option<String>,
    #[serde(default)]
    op_id: Option<String>,
    #[serde(default)]
    mode: Option<DeleteMode>,
    #[serde(default)]
    upsert: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum BulkAction {
    Index,
    Update,
    Delete,
}

/// `POST /v1/bulk`: NDJSON background operations, journaled as one batch, answered 202 once.
/// Every line is checked first: one bad line refuses the whole request (400 naming the line).
async fn bulk(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    if let Some(q) = query.filter(|q| !q.is_empty()) {
        return Err(ApiError::bad(
            "bad_parameter",
            format!("/v1/bulk takes no query parameters (got `{q}`); put monitor and op_id on each line"),
        ));
    }
    let body = body.map_err(|e| body_error(e, state.settings.max_body))?;
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::bad("bad_body", "the bulk body is not UTF-8 text"))?;
    let mut ops = Vec::new();
    let mut line_numbers = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let line_err = |e: ApiError| ApiError {
            message: format!("line {}: {}", n + 1, e.message),
            ..e
        };
        let parsed: BulkLine = serde_json::from_str(line).map_err(|e| {
            ApiError::bad(
                "malformed_json",
                format!("line {}: {e}; each line is {{\"action\":\"index\"|\"update\"|\"delete\",\"index\":...,\"id\":...,\"doc\":{{...}}}} with optional monitor, op_id, upsert (update) and mode (delete)", n + 1),
            )
        })?;
        let params = WriteParams {
            monitor: parsed.monitor,
            lock_type: LockType::Background,
            timeout: None,
            op_id: match &parsed.op_id {
                Some(s) => Some(parse_op_id(s).map_err(line_err)?),
                None => None,
            },
            lock_id: None,
            mode: parsed.mode,
            upsert: parsed.upsert.unwrap_or(false),
        };
        let misplaced = match parsed.action {
            BulkAction::Index => [
                ("mode", parsed.mode.is_some()),
                ("upsert", parsed.upsert.is_some()),
            ],
            BulkAction::Update => [("mode", parsed.mode.is_some()), ("upsert", false)],
            BulkAction::Delete => [
                ("doc", parsed.doc.is_some()),
                ("upsert", parsed.upsert.is_some()),
            ],
        };
        if let Some((field, _)) = misplaced.iter().find(|(_, given)| *given) {
            return Err(line_err(ApiError::bad(
                "bad_body",
                format!("\"{field}\" does not go with this action: mode is for delete, upsert for update, doc for index and update"),
            )));
        }
        let (index, id) = (parsed.index, parsed.id);
        let op = match parsed.action {
            BulkAction::Index => {
                let doc = parsed.doc.filter(Value::is_object).ok_or_else(|| {
                    line_err(ApiError::bad(
                        "bad_document",
                        "an index line needs \"doc\": a JSON object",
                    ))
                })?;
                build_op(&index, &id, params, |m| {
                    Operation::index(m, &index, &id, doc)
                })
            }
            BulkAction::Update => {
                let patch = parsed.doc.filter(Value::is_object).ok_or_else(|| {
                    line_err(ApiError::bad(
                        "bad_document",
                        "an update line needs \"doc\": a JSON merge patch (an object)",
                    ))
                })?;
                let upsert = params.upsert;
                build_op(&index, &id, params, |m| {
                    Operation::merge(m, &index, &id, patch).with_upsert(upsert)
                })
            }
            BulkAction::Delete => {
                let mode = params.mode.unwrap_or_default();
                build_op(&index, &id, params, |m| {
                    Operation::delete(m, &index, &id).with_delete_mode(mode)
                })
            }
        }
        .map_err(line_err)?
        .0;
        check_writable(&state, op.target_index()).map_err(line_err)?;
        ops.push(op);
        line_numbers.push(n + 1);
    }
    // An op_id names one operation: the same one twice is a resend (applied once); another
    // operation under a taken id would be acknowledged and never applied.
    let mut first_line: HashMap<Uuid, (usize, u64)> = HashMap::new();
    for (op, &n) in ops.iter().zip(&line_numbers) {
        match first_line.get(&op.id) {
            Some(&(first, fingerprint)) if fingerprint != op.fingerprint() => {
                return Err(op_id_reused(op, Some((n, Some(first)))));
            }
            Some(_) => {}
            None => {
                if state.journal.reuses_id(op) {
                    return Err(op_id_reused(op, Some((n, None))));
                }
                first_line.insert(op.id, (n, op.fingerprint()));
            }
        }
    }
    if ops.is_empty() {
        return Err(ApiError::bad(
            "empty_bulk",
            "the bulk body holds no operation; send one JSON object per line",
        ));
    }
    let ids: Vec<Uuid> = ops.iter().map(|o| o.id).collect();
    let states = accept(&state, ops).await?;
    let operations: Vec<Value> = ids
        .iter()
        .zip(states)
        .map(|(id, s)| json!({"operation_id": id.to_string(), "status": s.as_str()}))
        .collect();
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"count": operations.len(), "operations": operations})),
    )
        .into_response())
}
