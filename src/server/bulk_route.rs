//! `POST /v1/bulk`: NDJSON background operations, journaled as one batch.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;
use zkguard::write::ops::{DeleteMode, Operation};
use zkguard::LockType;

use super::errors::ApiError;
use super::params::{body_error, idempotency_key, parse_op_id, WriteParams};
use super::state::AppState;
use super::write_routes::{accept, build_op, check_writable, op_id_reused};

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

#[utoipa::path(
    post,
    path = "/v1/bulk",
    summary = "Queue many background writes at once",
    description = "NDJSON, one background operation per line: `action` (`index`, `update` or `delete`), `index`, `id`, `doc` (the document, or for `update` a merge patch) and optionally `monitor`, `op_id`, `upsert` (update) and `mode` (delete). Every line is checked first: one bad line refuses the whole request (400 naming the line). Journaled as one batch and answered once.",
    params(super::openapi::IdempotencyHeader),
    tag = "writes",
    request_body(content = String, content_type = "application/x-ndjson", description = "One JSON object per line.", example = "{\"action\":\"index\",\"index\":\"articles\",\"id\":\"42\",\"doc\":{\"title\":\"Hello\"}}\n{\"action\":\"delete\",\"index\":\"articles\",\"id\":\"43\"}\n"),
    responses(
        (status = 202, description = "Every operation journaled (or known already).", body = super::openapi::BulkAccepted),
        (status = 403, description = "`protected_index` on a line; nothing was accepted.", body = super::openapi::Error),
        (status = 409, description = "`op_id_reused`: a line's `op_id` names another operation; nothing was accepted.", body = super::openapi::Error),
        (status = 503, description = "`queue_full` (server.queue.max, server.queue.max.bytes, server.journal.max.bytes), `journal_unavailable`, or one every route shares; nothing was accepted.", body = super::openapi::Error, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
/// `POST /v1/bulk`: NDJSON background operations, journaled as one batch, answered 202 once.
/// Every line is checked first: one bad line refuses the whole request (400 naming the line).
pub(super) async fn bulk(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    // A request-wide key names each line's operation that has no op_id of its own:
    // `{key}#{line}`, so that the same request sent again names the same operations.
    let request_key = idempotency_key(&headers, None)?;
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
            op_id: match (&parsed.op_id, &request_key) {
                (Some(s), _) => Some(parse_op_id(s).map_err(line_err)?),
                (None, Some(key)) => Some(format!("{key}#{}", n + 1)),
                (None, None) => None,
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
    let ids: Vec<String> = ops.iter().map(Operation::display_id).collect();
    let states = accept(&state, ops).await?;
    let operations: Vec<Value> = ids
        .iter()
        .zip(states)
        .map(|(id, s)| json!({"operation_id": id, "status": s.as_str()}))
        .collect();
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"count": operations.len(), "operations": operations})),
    )
        .into_response())
}
