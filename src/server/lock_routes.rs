//! The explicit-lock routes: `POST /v1/locks[/{monitor}]` takes a lock and holds it for the
//! caller, `.../keepalive` extends its lease, `DELETE` releases it, `GET` lists the monitors.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::Json;
use serde_json::{json, Value};
use zkguard::lock::validate_monitor;
use zkguard::write::guarded::GuardedError;
use zkguard::{LockError, LockType};

use super::errors::{from_guarded, ApiError};
use super::params::{
    check_doc_id, check_index, document_monitor, lock_id, path_error, refuse_repeated,
    unknown_lock, INFO,
};
use super::state::AppState;

/// Query parameters of `POST /v1/locks/{monitor}` (and of `POST /v1/locks`, which names a
/// document instead) and of the keep-alive.
#[derive(Debug, Default)]
struct LockParams {
    lock_type: LockType,
    timeout: Option<Duration>,
    ttl: Option<Duration>,
    info: Option<String>,
    index: Option<String>,
    id: Option<String>,
}

fn parse_lock_params(
    raw: Option<String>,
    state: &AppState,
    known: &[&str],
) -> Result<LockParams, ApiError> {
    let mut p = LockParams::default();
    let raw = raw.unwrap_or_default();
    refuse_repeated(&raw)?;
    for (key, value) in url::form_urlencoded::parse(raw.as_bytes()) {
        let duration = |what: &str, max: Duration, max_key: &str| {
            let t = zkguard::config::parse_bounded_duration(&value)
                .map_err(|e| ApiError::bad("bad_parameter", format!("{what} `{value}`: {e}")))?;
            if t > max {
                return Err(ApiError::bad(
                    "bad_parameter",
                    format!(
                        "{what} `{value}` is longer than {max_key} ({}ms); ask for less",
                        max.as_millis()
                    ),
                ));
            }
            Ok(t)
        };
        match key.as_ref() {
            k if !known.contains(&k) => {
                return Err(ApiError::bad(
                    "bad_parameter",
                    format!(
                        "unknown query parameter `{k}`; the known ones are {}",
                        known.join(", ")
                    ),
                ))
            }
            "type" => {
                p.lock_type = value
                    .parse()
                    .map_err(|e: String| ApiError::bad("bad_parameter", format!("type: {e}")))?
            }
            "timeout" => {
                p.timeout = Some(duration(
                    "timeout",
                    state.settings.request_timeout,
                    "server.request.timeout",
                )?)
            }
            "ttl" => {
                let t = duration("ttl", state.settings.lock_ttl_max, "server.lock.ttl.max")?;
                if t.is_zero() {
                    return Err(ApiError::bad(
                        "bad_parameter",
                        "ttl must be longer than 0; pass a lease such as 30s",
                    ));
                }
                p.ttl = Some(t)
            }
            "info" => {
                zkguard::lock::validate_info(&value)
                    .map_err(|e| ApiError::bad("bad_parameter", format!("info: {e}")))?;
                p.info = Some(value.into_owned())
            }
            "index" => p.index = Some(value.into_owned()),
            "id" => p.id = Some(value.into_owned()),
            _ => unreachable!("every known parameter is handled"),
        }
    }
    Ok(p)
}

#[utoipa::path(
    post,
    path = "/v1/locks/{monitor}",
    summary = "Take a lock on a monitor and hold it",
    description = "Waits for the lock (`type`, `timeout`) and holds it for you for `ttl`; keep it alive within the lease and release it. Its `token` fences your writes: send it as the external version, or write through the service with `?lock_id=`.",
    params(super::openapi::MonitorPath, super::openapi::LockQuery),
    tag = "locks",
    responses(
        (status = 200, description = "Acquired and held for you until released or its lease lapses.", body = super::openapi::Lock),
        (status = 423, description = "`lock_timeout`: not acquired within the timeout.", body = super::openapi::Error, headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 503, description = "`lock_unavailable` (the lock backend is unavailable), `too_many_locks` (server.lock.max), or one every route shares.", body = super::openapi::Error, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
/// `POST /v1/locks/{monitor}`: waits for the lock (`type`, `timeout`) and holds it for the caller
/// for `ttl`; answers `{lock_id, monitor, token, lock_type, expires, ttl_ms}`.
pub(super) async fn take_lock(
    State(state): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Json<super::locks::LockView>, ApiError> {
    let Path(monitor) = path.map_err(path_error)?;
    let params = parse_lock_params(query, &state, &["type", "timeout", "ttl", "info"])?;
    hold_for_caller(&state, monitor, format!("{INFO} explicit lock"), params).await
}

#[utoipa::path(
    post,
    path = "/v1/locks",
    summary = "Take the lock of one document and hold it",
    description = "As `POST /v1/locks/{monitor}` on the monitor a write of the document takes (`{index}:{id}`), so the writes through the service wait for it.",
    params(super::openapi::DocLockQuery, super::openapi::LockQuery),
    tag = "locks",
    responses(
        (status = 200, description = "Acquired and held for you until released or its lease lapses.", body = super::openapi::Lock),
        (status = 423, description = "`lock_timeout`: not acquired within the timeout.", body = super::openapi::Error, headers(("Retry-After" = u64, description = "Seconds to wait."))),
        (status = 503, description = "`lock_unavailable` (the lock backend is unavailable), `too_many_locks` (server.lock.max), or one every route shares.", body = super::openapi::Error, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
/// `POST /v1/locks?index=I&id=D`: as `POST /v1/locks/{monitor}` on the monitor a write of that
/// document takes (`{index}:{id}`), so the lock guards the document's writes through the service.
pub(super) async fn take_document_lock(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> Result<Json<super::locks::LockView>, ApiError> {
    let params = parse_lock_params(
        query,
        &state,
        &["index", "id", "type", "timeout", "ttl", "info"],
    )?;
    let (index, id) = match (&params.index, &params.id) {
        (Some(index), Some(id)) => (index.clone(), id.clone()),
        (index, id) => {
            let missing = match (index, id) {
                (None, None) => "`index` and `id`",
                (None, _) => "`index`",
                _ => "`id`",
            };
            return Err(ApiError::bad(
                "bad_parameter",
                format!("POST /v1/locks takes the lock of one document: give its {missing} (POST /v1/locks?index=articles&id=42), or name a monitor in the path (POST /v1/locks/{{monitor}})"),
            ));
        }
    };
    check_index(&index)?;
    check_doc_id(&id)?;
    let info = format!("{INFO} explicit lock on {index}/{id}");
    hold_for_caller(&state, document_monitor(&index, &id), info, params).await
}

/// Waits for the lock of `monitor` (`type`, `timeout`) and holds it for the caller for `ttl`,
/// described by the caller's `info` or else `default_info`.
async fn hold_for_caller(
    state: &Arc<AppState>,
    monitor: String,
    default_info: String,
    params: LockParams,
) -> Result<Json<super::locks::LockView>, ApiError> {
    validate_monitor(&monitor).map_err(|e| ApiError::bad("bad_monitor", e.to_string()))?;
    let info = params.info.clone().unwrap_or(default_info);
    let full = |max: usize| {
        ApiError::unavailable(
            "too_many_locks",
            format!("the service holds its limit of {max} explicit locks (server.lock.max); release locks you no longer need, or retry later"),
        )
    };
    if let Err(super::locks::Refused::Full(max)) = state.explicit.has_room() {
        return Err(full(max));
    }
    if let Some(problem) = state.lock_problem() {
        return Err(ApiError::unavailable(
            "lock_unavailable",
            format!("{problem}; retry when /readyz answers 200"),
        ));
    }
    let request = zkguard::LockRequest::new(monitor.clone(), info.clone())
        .with_type(params.lock_type)
        .with_timeout(state.lock_wait(params.timeout));
    let started = std::time::Instant::now();
    let lock_type = params.lock_type.as_str();
    let guard = match state.writer.locks().acquire(request).await {
        Ok(g) => g,
        Err(e) => {
            if matches!(e, LockError::Timeout { .. }) {
                state.metrics.lock_timed_out(params.lock_type);
            }
            let tried_once = super::errors::tried_once(params.timeout, &e);
            let mut answer = from_guarded(GuardedError::Lock(e));
            if let Some(message) = tried_once {
                answer.message = message;
            }
            return Err(answer);
        }
    };
    let waited = started.elapsed();
    let ttl = params.ttl.unwrap_or(state.settings.lock_ttl);
    let metrics = state.metrics.clone();
    let held_since = std::time::Instant::now();
    match state.explicit.insert(guard, info, ttl, move |ended| {
        metrics.lock_used(lock_type, waited, held_since.elapsed());
        if matches!(
            ended,
            super::locks::Ended::Lost | super::locks::Ended::Forced
        ) {
            metrics.locks_lost.inc();
        }
    }) {
        Ok(view) => {
            tracing::info!(lock = %view.lock_id, monitor = %view.monitor, token = view.token, ttl_ms = view.ttl_ms, "explicit lock taken");
            Ok(Json(view))
        }
        Err((super::locks::Refused::Full(max), guard)) => {
            let _ = guard.unlock().await;
            Err(full(max))
        }
        Err((_, guard)) => {
            let _ = guard.unlock().await;
            Err(ApiError::internal("the lock could not be recorded"))
        }
    }
}

#[utoipa::path(
    post,
    path = "/v1/locks/{monitor}/{lock_id}/keepalive",
    summary = "Extend a lock's lease",
    params(super::openapi::LockPath, super::openapi::TtlQuery),
    tag = "locks",
    responses(
        (status = 200, description = "The lease runs `ttl` from now.", body = super::openapi::Lock),
        (status = 404, description = "`unknown_lock`: released, lapsed, lost or force-released by an operator (the message says which); take it again.", body = super::openapi::Error),
    )
)]
/// `POST /v1/locks/{monitor}/{lock_id}/keepalive`: extends the lease by its ttl (or `ttl`).
pub(super) async fn keep_alive(
    State(state): State<Arc<AppState>>,
    path: Result<Path<(String, String)>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Json<super::locks::LockView>, ApiError> {
    let Path((monitor, id)) = path.map_err(path_error)?;
    let id = lock_id(&id)?;
    let params = parse_lock_params(query, &state, &["ttl"])?;
    state
        .explicit
        .keep_alive(&monitor, &id, params.ttl)
        .map(Json)
        .map_err(|_| lock_gone(&state, &monitor, &id))
}

#[utoipa::path(
    delete,
    path = "/v1/locks/{monitor}/{lock_id}",
    summary = "Release a lock",
    params(super::openapi::LockPath),
    tag = "locks",
    responses(
        (status = 200, description = "Released.", body = super::openapi::Released),
        (status = 404, description = "`unknown_lock`: released already, lapsed, lost or force-released by an operator (the message says which).", body = super::openapi::Error),
    )
)]
/// `DELETE /v1/locks/{monitor}/{lock_id}`: releases the lock; answered once it is released.
pub(super) async fn release_lock(
    State(state): State<Arc<AppState>>,
    path: Result<Path<(String, String)>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let Path((monitor, id)) = path.map_err(path_error)?;
    let id = lock_id(&id)?;
    parse_lock_params(query, &state, &[])?;
    let token = state
        .explicit
        .release(&monitor, &id)
        .await
        .map_err(|_| lock_gone(&state, &monitor, &id))?;
    Ok(Json(
        json!({"lock_id": id.to_string(), "monitor": monitor, "token": token, "released": true}),
    ))
}

/// The longest reason of a force release, in bytes.
const MAX_REASON: usize = 1024;

#[utoipa::path(
    post,
    path = "/v1/locks/{monitor}/{lock_id}/force-release",
    summary = "Force-release a caller's lock (operators)",
    description = "Releases an explicit lock this instance holds for a caller, as an operator: for a holder that hangs or is gone, instead of waiting for its lease to lapse. Writes in flight under it finish first. The release is logged at warn level with who asked (the client's address and which token of `server.auth.tokens.file`), the lock, its holder's `info` and the `reason`, and streamed as a `lost` event with reason `force-released: ...`. The holder's next keep-alive, release or write with the `lock_id` is refused (404 `unknown_lock`, naming the force release); its own writes with the old token are fenced once the next holder has written. The status page's *Force release* button calls it.",
    params(super::openapi::LockPath, super::openapi::ForceReleaseQuery),
    tag = "locks",
    responses(
        (status = 200, description = "Released.", body = super::openapi::ForceReleased),
        (status = 404, description = "`unknown_lock`: no such lock is held here (released, lapsed, lost, or held by another instance).", body = super::openapi::Error),
    )
)]
/// `POST /v1/locks/{monitor}/{lock_id}/force-release[?reason=TEXT]`: an operator releases a
/// caller's explicit lock; logged with who asked and why.
pub(super) async fn force_release(
    State(state): State<Arc<AppState>>,
    path: Result<Path<(String, String)>, PathRejection>,
    client: Option<axum::Extension<super::conns::ClientAddr>>,
    credential: Option<axum::Extension<super::access::Credential>>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let Path((monitor, id)) = path.map_err(path_error)?;
    let id = lock_id(&id)?;
    let reason = force_reason(query.as_deref())?;
    let by = format!(
        "client {}, {}",
        client.map_or_else(|| "unknown".to_string(), |c| c.0 .0.to_string()),
        credential.map_or_else(
            || "no token (server.auth.tokens.file is unset)".to_string(),
            |c| format!("token {} of server.auth.tokens.file", c.0 .0)
        )
    );
    let token = state
        .explicit
        .force_release(&monitor, &id, by, reason.clone())
        .await
        .map_err(|_| lock_gone(&state, &monitor, &id))?;
    Ok(Json(json!({
        "lock_id": id.to_string(), "monitor": monitor, "token": token, "released": true,
        "forced": true, "reason": reason,
    })))
}

/// The `reason` of a force release (the only query parameter).
fn force_reason(raw: Option<&str>) -> Result<Option<String>, ApiError> {
    let raw = raw.unwrap_or_default();
    refuse_repeated(raw)?;
    let mut reason = None;
    for (key, value) in url::form_urlencoded::parse(raw.as_bytes()) {
        match key.as_ref() {
            "reason" if value.len() > MAX_REASON => {
                return Err(ApiError::bad(
                    "bad_parameter",
                    format!("reason is longer than {MAX_REASON} bytes; say it shorter"),
                ))
            }
            "reason" => reason = Some(value.trim().to_string()).filter(|r| !r.is_empty()),
            other => {
                return Err(ApiError::bad(
                    "bad_parameter",
                    format!("unknown query parameter `{other}`; the known one is reason"),
                ))
            }
        }
    }
    Ok(reason)
}

/// The answer to a call with lock `id` that is not held here: 404 `unknown_lock`, saying who
/// force-released it and why when an operator did.
pub(super) fn lock_gone(state: &AppState, monitor: &str, id: &uuid::Uuid) -> ApiError {
    let Some(forced) = state.explicit.forced(id) else {
        return unknown_lock(monitor, id);
    };
    let at = chrono::DateTime::from_timestamp_millis(forced.at_ms as i64)
        .map_or_else(String::new, |t| {
            t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
        });
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "unknown_lock",
        format!(
            "lock {id} on `{}` was force-released by an operator at {at} ({}; reason: {}); nothing was done with it. Take the lock again (and do not write with its old token)",
            forced.monitor,
            forced.by,
            forced.reason.as_deref().unwrap_or("none given")
        ),
    )
}

#[utoipa::path(
    get,
    path = "/v1/locks",
    summary = "Every monitor's holder and queue",
    description = "What `zkguard locks --json` prints.",
    tag = "locks",
    responses(
        (status = 200, description = "The monitors under zookeeper.lock.root.", body = Vec<super::openapi::MonitorState>),
    )
)]
/// `GET /v1/locks`: what `zkguard locks --json` prints.
pub(super) async fn list_locks(
    State(state): State<Arc<AppState>>,
) -> Result<Json<Value>, ApiError> {
    lock_listing(&state, None).await
}

#[utoipa::path(
    get,
    path = "/v1/locks/{monitor}",
    summary = "One monitor's holder and queue, or wait for a change",
    description = "What `zkguard locks --monitor M --json` prints, with the monitor's change index in `X-Zkguard-Index`. Sent back as `index` with `wait`, a blocking query: answered once the holder or queue changed, or when the wait ends (ZooKeeper backend; the Elasticsearch lease lock answers 400 `unsupported`).",
    params(super::openapi::MonitorPath, super::openapi::MonitorQuery),
    tag = "locks",
    responses(
        (status = 200, description = "The monitor (an empty list when nobody holds or waits).", body = Vec<super::openapi::MonitorState>, headers(("X-Zkguard-Index" = i64, description = "The monitor's change index (zxid of the last change of its nodes; 0 without any)."))),
        (status = 503, description = "`lock_unavailable`, or one every route shares.", body = super::openapi::Error, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
/// `GET /v1/locks/{monitor}`: what `zkguard locks --monitor M --json` prints.
/// `GET /v1/locks/{monitor}[?wait=DURATION&index=N]`: the monitor's holder and queue, with its
/// change index in the header `X-Zkguard-Index` (ZooKeeper). With `wait`, a blocking query:
/// answered once the monitor's index differs from `index` (at once when it already does), or
/// when the wait ends.
pub(super) async fn monitor_locks(
    State(state): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let Path(monitor) = path.map_err(path_error)?;
    validate_monitor(&monitor).map_err(|e| ApiError::bad("bad_monitor", e.to_string()))?;
    let (wait, rest) = super::params::wait_param(
        &state,
        query.as_deref(),
        &["index"],
        "GET /v1/locks/{monitor}",
    )?;
    let seen: i64 = match rest.get("index") {
        Some(i) => i.parse().map_err(|_| {
            ApiError::bad(
                "bad_parameter",
                format!("index `{i}`: not a number; give the X-Zkguard-Index of an earlier answer"),
            )
        })?,
        None => 0,
    };
    let super::state::Backend::ZooKeeper(session) = &state.backend else {
        if wait.is_some() {
            return Err(ApiError::bad(
                "unsupported",
                "wait needs lock.backend=zookeeper: the Elasticsearch lease lock has no change notifications; ask without wait",
            ));
        }
        return lock_listing(&state, Some(&monitor))
            .await
            .map(IntoResponse::into_response);
    };
    let watched = |e: zkguard::LockError| from_guarded(GuardedError::Lock(e));
    let (mut index, mut watch) = zkguard::zk::watch_monitor(session, &monitor)
        .await
        .map_err(watched)?;
    if let Some(wait) = wait {
        let _waiting = super::params::Waiting::new(&state.metrics);
        let deadline = tokio::time::Instant::now() + wait;
        let outcome = loop {
            if index != seen {
                break "changed";
            }
            tokio::select! {
                _ = watch.changed() => {}
                _ = tokio::time::sleep_until(deadline) => break "timeout",
            }
            (index, watch) = zkguard::zk::watch_monitor(session, &monitor)
                .await
                .map_err(watched)?;
        };
        state.metrics.waited("lock", outcome);
    }
    let mut response = lock_listing(&state, Some(&monitor)).await?.into_response();
    if let Ok(v) = axum::http::HeaderValue::from_str(&index.to_string()) {
        response.headers_mut().insert("x-zkguard-index", v);
    }
    Ok(response)
}

#[utoipa::path(
    post,
    path = "/v1/locks/{monitor}/clear-stray",
    summary = "Remove a monitor's stray mutex",
    description = "As `zkguard locks --monitor M --clear-stray`: removes the monitor's `privateLock` if it is stray (persistent, or of a session that holds no queue node in the monitor), which blocks every contender. A live holder's mutex is never touched (409 `live_holder`). ZooKeeper backend only (the Elasticsearch lease lock answers 400 `unsupported`).",
    params(super::openapi::MonitorPath),
    tag = "locks",
    responses(
        (status = 200, description = "Removed, or there was no mutex node.", body = super::openapi::StrayCleared),
        (status = 409, description = "`live_holder`: the mutex belongs to a live holder and was left alone.", body = super::openapi::Error),
        (status = 503, description = "`lock_unavailable`, or one every route shares.", body = super::openapi::Error, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
/// `POST /v1/locks/{monitor}/clear-stray`: what `zkguard locks --monitor M --clear-stray` does.
pub(super) async fn clear_stray(
    State(state): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    use zkguard::zk::StrayOutcome;
    let Path(monitor) = path.map_err(path_error)?;
    validate_monitor(&monitor).map_err(|e| ApiError::bad("bad_monitor", e.to_string()))?;
    parse_lock_params(query, &state, &[])?;
    let super::state::Backend::ZooKeeper(session) = &state.backend else {
        return Err(ApiError::bad(
            "unsupported",
            "clear-stray applies to the ZooKeeper lock (lock.backend=zookeeper); the Elasticsearch lease lock has no mutex node",
        ));
    };
    let outcome = zkguard::zk::clear_stray(session, &monitor)
        .await
        .map_err(|e| from_guarded(GuardedError::Lock(e)))?;
    match outcome {
        StrayOutcome::Removed { session } => {
            tracing::warn!(%monitor, ?session, "stray mutex removed through the API");
            Ok(Json(
                json!({"monitor": monitor, "outcome": "removed", "session": session}),
            ))
        }
        StrayOutcome::NoMutex => Ok(Json(
            json!({"monitor": monitor, "outcome": "no_mutex", "session": null}),
        )),
        StrayOutcome::LiveHolder { owner, node } => Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "live_holder",
            format!(
                "the mutex of `{monitor}` belongs to a live holder ({}, node {}); it was left alone: wait for the holder to release",
                owner.as_deref().unwrap_or("owner unknown"),
                node.as_deref().unwrap_or("unknown")
            ),
        )),
    }
}

async fn lock_listing(state: &AppState, monitor: Option<&str>) -> Result<Json<Value>, ApiError> {
    let listed = match &state.backend {
        super::state::Backend::ZooKeeper(session) => zkguard::zk::list_locks(session, monitor)
            .await
            .map(|states| serde_json::to_value(states).unwrap_or(Value::Null)),
        super::state::Backend::Elasticsearch(service) => {
            crate::lock_rows::es_rows(service, monitor)
                .await
                .map(Value::Array)
        }
    };
    listed
        .map(Json)
        .map_err(|e| from_guarded(GuardedError::Lock(e)))
}
