//! `POST /v1/transactions` and `GET /v1/transactions/{id}`: document transactions, several
//! document writes applied all-or-nothing; and the service's periodic recovery of them.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::watch;
use zkguard::txn::multi::{MultiError, Outcome, TxnOp, TxnRecord, TxnRequest};
use zkguard::LockType;

use super::errors::ApiError;
use super::params::{body_error, idempotency_key};
use super::state::AppState;
use super::write_routes::check_writable;

/// Body of `POST /v1/transactions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TxnBody {
    #[serde(default)]
    id: Option<String>,
    #[serde(default, rename = "type")]
    lock_type: Option<LockType>,
    operations: Vec<TxnOp>,
}

/// The answer for a transaction error.
pub(super) fn txn_error(e: MultiError) -> ApiError {
    let kind = e.kind();
    let message = e.to_string();
    match e {
        MultiError::Invalid(_) => ApiError::bad(kind, message),
        MultiError::TooLarge { .. } => ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, kind, message),
        MultiError::IdConflict { .. } | MultiError::InProgress { .. } => {
            ApiError::new(StatusCode::CONFLICT, kind, message)
        }
        MultiError::NotFound { .. } => ApiError::new(StatusCode::NOT_FOUND, kind, message),
        MultiError::Lock { .. }
        | MultiError::Fenced { .. }
        | MultiError::Interrupted { .. }
        | MultiError::Store { .. } => ApiError::unavailable(kind, message),
        MultiError::Corrupt { .. } => ApiError::internal(message),
        _ => ApiError::internal(message),
    }
}

/// Checks what the service checks of any write (protected indices) and applies `request`
/// in a task of its own, so that a caller who goes away does not cut it short.
pub(super) async fn apply(state: &Arc<AppState>, request: TxnRequest) -> Result<Outcome, ApiError> {
    for op in &request.operations {
        check_writable(state, &op.index)?;
    }
    let txns = state.transactions.clone();
    let id = request.id.clone();
    let outcome = tokio::spawn(async move { txns.apply(request).await })
        .await
        .map_err(|e| ApiError::internal(format!("transaction `{id}` failed: {e}")))?
        .map_err(txn_error)?;
    if !outcome.replayed {
        state.metrics.transaction(outcome.state);
    }
    Ok(outcome)
}

#[utoipa::path(
    post,
    path = "/v1/transactions",
    summary = "Apply several document writes all or nothing",
    description = "Locks every document's monitor in one canonical order (foreground or background as `type` says), reads them, checks each `expect`, logs the transaction, writes every document fenced with its lock's token, commits, and answers once decided: 200 with `state` `committed` (each document's new `_version`) or `rolled-back` (with the `reason`, the document that `failed` or the monitor that `blocked_by` a lock not free in time; nothing was written). The id comes from `id`, else the `Idempotency-Key` header, else a new UUID; sending it again with the same operations answers the stored decision.",
    params(super::openapi::IdempotencyHeader),
    tag = "transactions",
    request_body(content = super::openapi::TxnBody, content_type = "application/json"),
    responses(
        (status = 200, description = "Decided: committed or rolled back.", body = super::openapi::TxnOutcome),
        (status = 403, description = "`protected_index` on an operation; nothing was locked.", body = super::openapi::Error),
        (status = 409, description = "`transaction_id_reused` (the id names other operations) or `transaction_in_progress` (not decided yet: ask `GET /v1/transactions/{id}` later).", body = super::openapi::Error),
        (status = 413, description = "`transaction_too_large`: more than txn.max.operations operations or txn.max.bytes bytes of documents.", body = super::openapi::Error),
        (status = 503, description = "`lock_unavailable`, `elasticsearch_unavailable`, `transaction_fenced` (the coordinator stopped after logging; recovery decides it), or one every route shares.", body = super::openapi::Error, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
/// `POST /v1/transactions`: `{"id"?, "type"?, "operations": [...]}`, answered once decided.
pub(super) async fn create_transaction(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    if let Some(q) = query.filter(|q| !q.is_empty()) {
        return Err(ApiError::bad(
            "bad_parameter",
            format!("/v1/transactions takes no query parameters (got `{q}`); put id and type in the body"),
        ));
    }
    let key = idempotency_key(&headers, None)?;
    let body = body.map_err(|e| body_error(e, state.settings.max_body))?;
    let parsed: TxnBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad(
            "malformed_json",
            format!("the body is not a transaction ({e}); send {{\"operations\": [{{\"action\": \"index\"|\"update\"|\"delete\", \"index\": ..., \"id\": ..., \"doc\": {{...}}}}]}} with optional \"id\", \"type\" (foreground|background), and per operation \"upsert\", \"monitor\", \"expect\""),
        )
    })?;
    let lock_type = parsed.lock_type.unwrap_or(LockType::Foreground);
    let wait = match lock_type {
        LockType::Foreground => state.lock_wait(None),
        LockType::Background => state.lock_wait(Some(state.bg_timeout)),
    };
    let mut request = TxnRequest::new(parsed.operations)
        .with_type(lock_type)
        .with_lock_timeout(wait);
    if let Some(id) = parsed.id.or(key) {
        request = request.with_id(id);
    }
    let outcome = apply(&state, request).await?;
    Ok(Json(json!(outcome)).into_response())
}

/// A logged transaction as `GET /v1/transactions/{id}` answers it: no images, the documents
/// with their results once decided.
fn view(record: &TxnRecord) -> Value {
    let outcome = record.outcome();
    let documents = match &outcome {
        Some(o) => json!(o.documents),
        None => json!(record
            .operations
            .iter()
            .map(|op| json!({"index": op.index, "id": op.id, "action": op.action}))
            .collect::<Vec<_>>()),
    };
    let mut v = json!({
        "transaction_id": record.transaction_id,
        "state": record.state,
        "decision": outcome.map(|o| o.state),
        "lock_type": record.lock_type.as_str(),
        "documents": documents,
        "created": record.created,
        "modified": record.modified,
    });
    for (key, value) in [
        ("reason", &record.reason),
        ("failed", &record.failed),
        ("blocked_by", &record.blocked_by),
    ] {
        if let Some(value) = value {
            v[key] = json!(value);
        }
    }
    v
}

#[utoipa::path(
    get,
    path = "/v1/transactions/{id}",
    summary = "A document transaction",
    description = "Its state in the log (`pending`, `committed`, `finished`, `rolling-back`, `rolled-back`), its `decision` once made, and its documents.",
    params(("id" = String, Path, description = "The transaction's id.")),
    tag = "transactions",
    responses(
        (status = 200, description = "The transaction.", body = super::openapi::TxnStatus),
        (status = 404, description = "`transaction_not_found`.", body = super::openapi::Error),
        (status = 503, description = "`elasticsearch_unavailable`, or one every route shares.", body = super::openapi::Error, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
/// `GET /v1/transactions/{id}`.
pub(super) async fn get_transaction(
    State(state): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path.map_err(|e| ApiError::bad("bad_path", e.to_string()))?;
    match state.transactions.get(&id).await {
        Ok(Some(record)) => Ok(Json(view(&record)).into_response()),
        Ok(None) => Err(txn_error(MultiError::NotFound {
            id,
            index: state.transactions.settings().log_index.clone(),
        })),
        Err(e) => Err(txn_error(e)),
    }
}

/// Recovers document transactions left undecided (a coordinator that died or stalled): one
/// pass at start, then one every half of `txn.recovery.after` (at least a second), each over
/// the transactions unchanged for `txn.recovery.after`. A transaction whose locks are held is
/// left for the next pass (its coordinator may be alive).
pub(super) async fn recovery(state: Arc<AppState>, mut stop: watch::Receiver<bool>) {
    let after = state.transactions.settings().recovery_after;
    let interval = (after / 2).max(Duration::from_secs(1));
    // The first pass (which creates the transactions' log) once Elasticsearch answers.
    if !state.elasticsearch_reached(&mut stop).await {
        return;
    }
    loop {
        match state.transactions.recover_once(after, Duration::ZERO).await {
            Ok(report) if report.examined > 0 => {
                for _ in &report.finished {
                    state.metrics.transaction_recovered("finished");
                }
                for _ in &report.rolled_back {
                    state.metrics.transaction_recovered("rolled-back");
                }
                tracing::info!(
                    examined = report.examined,
                    finished = report.finished.len(),
                    rolled_back = report.rolled_back.len(),
                    busy = report.busy.len(),
                    failed = report.failed.len(),
                    "recovery pass over document transactions"
                );
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "recovery pass over document transactions failed"),
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}
