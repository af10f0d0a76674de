//! The document routes: `PUT|PATCH|DELETE /v1/indices/{index}/docs/{id}` (a foreground write:
//! lock, fenced write, release; or a background one, journaled and queued) and
//! `GET /v1/operations/{id}`, the outcome of an operation.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use uuid::Uuid;
use zkguard::write::guarded::{GuardedError, Written};
use zkguard::write::ops::Operation;
use zkguard::{LockError, LockType};

use super::errors::{from_guarded, ApiError};
use super::journal::{Entry, Finished, OpState};
use super::params::{
    body_error, check_doc_id, check_index, check_monitor, document_monitor, parse_json,
    parse_op_id, parse_params, path_error, WriteParams, WriteRoute, INFO,
};
use super::state::AppState;

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

#[utoipa::path(
    put,
    path = "/v1/indices/{index}/docs/{id}",
    summary = "Write a whole document under its lock",
    description = "Replaces the document (`index`), fenced with the lock's token as its external version. Foreground (default): lock, write, release, answered when done. Background: journaled and answered 202, applied later under a background lock (foreground writes go first), retried, parked in the dead-letter sink when it cannot be applied.",
    params(super::openapi::DocPath, super::openapi::WriteQuery, super::openapi::IdempotencyHeader),
    tag = "writes",
    request_body(content = std::collections::HashMap<String, Value>, content_type = "application/json", description = "The document's JSON source (an object)."),
    responses(super::openapi::WriteAnswers)
)]
pub(super) async fn put_doc(
    State(state): State<Arc<AppState>>,
    path: Result<Path<(String, String)>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Path((index, id)) = path.map_err(path_error)?;
    let params = parse_params(
        query,
        &headers,
        WriteRoute::Put,
        state.settings.request_timeout,
    )?;
    let doc = object_body(&state, body, "the document's source")?;
    let (op, params) = build_op(&index, &id, params, |m| {
        Operation::index(m, &index, &id, doc)
    })?;
    submit(&state, op, params).await
}

#[utoipa::path(
    patch,
    path = "/v1/indices/{index}/docs/{id}",
    summary = "Merge a patch into a document under its lock",
    description = "An RFC 7386 JSON merge patch, applied under the lock to the document as stored then (read, merge, fenced write): concurrent patches of different fields all survive. `upsert=true` creates a missing document from the patch.",
    params(super::openapi::DocPath, super::openapi::WriteQuery, super::openapi::IdempotencyHeader, super::openapi::PatchQuery),
    tag = "writes",
    request_body(content = std::collections::HashMap<String, Value>, content_type = "application/json", description = "A JSON merge patch (an object; null removes a field)."),
    responses(super::openapi::WriteAnswers)
)]
/// `PATCH /v1/indices/{index}/docs/{id}`: an RFC 7386 JSON merge patch, applied under the lock
/// to the document as stored then (read, merge, fenced write), so concurrent patches of different
/// fields all survive; `?upsert=true` creates a missing document from `{}`.
pub(super) async fn patch_doc(
    State(state): State<Arc<AppState>>,
    path: Result<Path<(String, String)>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Path((index, id)) = path.map_err(path_error)?;
    let params = parse_params(
        query,
        &headers,
        WriteRoute::Patch,
        state.settings.request_timeout,
    )?;
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

#[utoipa::path(
    delete,
    path = "/v1/indices/{index}/docs/{id}",
    summary = "Delete a document under its lock",
    description = "A delete carrying the lock's token (`mode=hard`), or a tombstone document that keeps fencing stale writers (`mode=tombstone`).",
    params(
        super::openapi::DocPath,
        super::openapi::WriteQuery,
        super::openapi::IdempotencyHeader,
        super::openapi::DeleteQuery
    ),
    tag = "writes",
    responses(super::openapi::WriteAnswers)
)]
pub(super) async fn delete_doc(
    State(state): State<Arc<AppState>>,
    path: Result<Path<(String, String)>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Path((index, id)) = path.map_err(path_error)?;
    let params = parse_params(
        query,
        &headers,
        WriteRoute::Delete,
        state.settings.request_timeout,
    )?;
    let mode = params.mode.unwrap_or_default();
    let (op, params) = build_op(&index, &id, params, |m| {
        Operation::delete(m, &index, &id).with_delete_mode(mode)
    })?;
    submit(&state, op, params).await
}

pub(super) fn build_op(
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
    if let Some(key) = &params.op_id {
        op = op.with_key(key);
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
            let id = op.display_id();
            let status = accept(state, vec![op]).await?;
            Ok((
                StatusCode::ACCEPTED,
                Json(json!({"operation_id": id, "status": status[0].as_str()})),
            )
                .into_response())
        }
    }
}

/// Refuses a write to zkguard's own indices and to system indices, unless `server.index.allow`
/// names the index.
pub(super) fn check_writable(state: &AppState, index: &str) -> Result<(), ApiError> {
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
pub(super) fn op_id_reused(op: &Operation, lines: Option<(usize, Option<usize>)>) -> ApiError {
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
        format!("{at}op_id {} already names {other}, another write (another document, body or monitor); nothing was accepted. An op_id names one operation: send a retry exactly as the first, and give a new operation a new op_id (or none, to have one generated)", op.display_id()),
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
            "operation_id": op.display_id(),
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
        .map_err(|_| super::lock_routes::lock_gone(state, &op.monitor, &lock_id))?;
    if monitor != op.monitor {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "wrong_lock",
            format!("lock {lock_id} guards `{monitor}`, not `{}`, the monitor of this write; nothing was written. Take the lock of this document (POST /v1/locks?index=&id=), or pass the monitor the lock guards as ?monitor=", op.monitor),
        ));
    }
    let held = shared.read().await;
    let Some(guard) = held.as_ref() else {
        return Err(super::lock_routes::lock_gone(state, &op.monitor, &lock_id));
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
            state.events.applied(&op, w.applied_token);
            state.journal.note(Finished {
                id: op.id,
                status: OpState::Applied,
                reason: None,
                token: w.applied_token,
                already_applied: w.already_applied,
                attempts: Some(1),
                fingerprint: Some(op.fingerprint()),
                key: op.key.clone(),
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
                "operation_id": op.display_id(),
                // Always a number: the applying write's token, or, for a retry found applied
                // under later operations (which keep its id, not its token), this request's.
                "token": w.applied_token.unwrap_or(w.token),
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
                GuardedError::LockLost { .. }
                | GuardedError::LostDuringWrite { .. }
                | GuardedError::Lock(LockError::Lost { .. }) => m.locks_lost.inc(),
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
pub(super) async fn accept(
    state: &Arc<AppState>,
    ops: Vec<Operation>,
) -> Result<Vec<OpState>, ApiError> {
    let ids: Vec<Uuid> = ops.iter().map(|o| o.id).collect();
    // In a task of its own, so that a request abandoned (timeout, client gone) once its
    // operations are journaled still queues them.
    let st = state.clone();
    let journaled = tokio::spawn(async move {
        match st.fleet() {
            // Queued by the partition's owner once it reads the records.
            Some(fleet) => {
                fleet.accept(ops).await?;
            }
            None => {
                let fresh = st.journal.accept(ops).await?;
                st.enqueue(fresh);
            }
        }
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

#[utoipa::path(
    get,
    path = "/v1/operations/{id}",
    summary = "An operation's state, or wait for it",
    description = "Where an operation stands: `queued`, `applied` (with its token), `rejected` or `parked` (with the reason). With `wait`, answered as soon as it is no longer queued, or when the wait ends (with its state then): no polling.",
    params(super::openapi::OperationPath, super::openapi::WaitQuery),
    tag = "writes",
    responses(
        (status = 200, description = "The operation's state.", body = super::openapi::Operation),
        (status = 404, description = "`unknown_operation`: never accepted here, or older than the outcomes kept.", body = super::openapi::Error),
    )
)]
/// `GET /v1/operations/{id}[?wait=DURATION]`: the operation's state; with `wait`, answered as
/// soon as the operation is no longer queued, or when the wait ends (with its state then).
pub(super) async fn get_operation(
    State(state): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let Path(id) = path.map_err(path_error)?;
    let asked = parse_op_id(&id)?;
    let id = zkguard::write::ops::Operation::key_id(&asked);
    let wait =
        super::params::wait_param(&state, query.as_deref(), &[], "GET /v1/operations/{id}")?.0;
    let mut outcomes = state.journal.watch_outcomes();
    if let Some(fleet) = state.fleet() {
        return fleet_operation(&state, fleet, &id, &asked, wait).await;
    }
    let mut entry = known_operation(&state, &id, &asked)?;
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
        entry = known_operation(&state, &id, &asked)?;
    };
    drop(waiting);
    state.metrics.waited("operation", outcome);
    Ok(Json(operation_json(&id, &entry)))
}

/// How often a wait on the Kafka journal looks for an outcome recorded by another instance.
const FLEET_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// `GET /v1/operations/{id}` with the Kafka journal: the outcome recorded by whichever
/// instance applied it (the journal's index), else queued if accepted or read here; with
/// `wait`, looked for again on every outcome recorded here and every [`FLEET_POLL`] until the
/// wait ends (an id unknown here is then looked for too, since another instance may have
/// accepted it).
async fn fleet_operation(
    state: &Arc<AppState>,
    fleet: &Arc<super::journal::kafka::KafkaJournal>,
    id: &Uuid,
    asked: &str,
    wait: Option<std::time::Duration>,
) -> Result<Json<Value>, ApiError> {
    let mut outcomes = state.journal.watch_outcomes();
    let mut entry = fleet.lookup(id).await;
    let Some(wait) = wait else {
        return entry
            .map(|e| Json(operation_json(id, &e)))
            .ok_or_else(|| unknown_operation(asked));
    };
    let waiting = super::params::Waiting::new(&state.metrics);
    let deadline = tokio::time::Instant::now() + wait;
    let outcome = loop {
        if entry.as_ref().is_some_and(|e| e.state() != OpState::Queued) {
            break "changed";
        }
        tokio::select! {
            _ = outcomes.changed() => {}
            _ = tokio::time::sleep(FLEET_POLL) => {}
            _ = tokio::time::sleep_until(deadline) => break "timeout",
        }
        entry = fleet.lookup(id).await;
    };
    drop(waiting);
    state.metrics.waited("operation", outcome);
    entry
        .map(|e| Json(operation_json(id, &e)))
        .ok_or_else(|| unknown_operation(asked))
}

fn unknown_operation(asked: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_operation",
        format!(
            "no operation {asked} is known: it was never accepted, or its outcome is older than those kept"
        ),
    )
}

fn known_operation(state: &AppState, id: &Uuid, asked: &str) -> Result<Entry, ApiError> {
    state.journal.get(id).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_operation",
            format!(
                "no operation {asked} is known here: it was never accepted by this instance, or its outcome is older than the last {} kept",
                super::journal::KEEP_FINISHED
            ),
        )
    })
}

fn operation_json(id: &Uuid, entry: &Entry) -> Value {
    let key = entry
        .op
        .as_ref()
        .and_then(|op| op.key.clone())
        .or_else(|| entry.finished.as_ref().and_then(|f| f.key.clone()));
    let shown = key.unwrap_or_else(|| id.to_string());
    let mut v = json!({"operation_id": shown, "status": entry.state().as_str()});
    if let Some(f) = &entry.finished {
        if let Some(r) = &f.reason {
            v["reason"] = json!(r);
        }
        if let Some(t) = f.token {
            v["token"] = json!(t);
        }
        if f.already_applied {
            v["already_applied"] = json!(true);
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
