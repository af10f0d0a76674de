//! Dead letters and transactions over HTTP: `GET /v1/deadletters`,
//! `POST /v1/deadletters/replay`, `DELETE /v1/deadletters/{id}`, `POST /v1/transfers`, `GET /v1/transfers/{id}`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;
use zkguard::txn::{TransferRequest, TxnError};
use zkguard::write::deadletter::{self, DeadLetterError, ReplayResult, ReplaySelection};
use zkguard::write::ops::Operation;

use super::errors::ApiError;
use super::journal::{Finished, OpState};
use super::state::AppState;

/// The entry an `id` of the dead-letter routes names: its id, or the caller's idempotency key,
/// which names the id [`Operation::key_id`] derives from it (a key that is a UUID is the id).
fn entry_id(given: &str) -> Result<Uuid, String> {
    match given.trim() {
        "" => Err("the dead letter's id is empty; give its id or its idempotency key (GET /v1/deadletters lists both)".into()),
        given => Ok(Operation::key_id(given)),
    }
}

/// [`sink_error`], with an unknown entry named as the caller gave it (an id or a key).
fn named_sink_error(e: DeadLetterError, given: &str) -> ApiError {
    match &e {
        DeadLetterError::NoSuchEntry { .. } => ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_deadletter",
            format!(
                "no parked operation has id or idempotency key `{}`; GET /v1/deadletters lists the parked operations",
                given.trim()
            ),
        ),
        _ => sink_error(e),
    }
}

fn sink_error(e: DeadLetterError) -> ApiError {
    match &e {
        DeadLetterError::NoSuchEntry { .. } => ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_deadletter",
            format!("{e}; GET /v1/deadletters lists the parked operations"),
        ),
        DeadLetterError::Json { .. } => ApiError::internal(e.to_string()),
        _ => ApiError::unavailable("deadletters_unavailable", e.to_string()),
    }
}

#[utoipa::path(
    get,
    path = "/v1/deadletters",
    summary = "The parked operations",
    description = "The dead-letter sink's entries (deadletter.sink), oldest first, as `zkguard dlq list --json` prints them.",
    tag = "deadletters",
    responses(
        (status = 200, description = "The entries.", body = Vec<super::openapi::DeadLetter>),
        (status = 503, description = "`deadletters_unavailable`: the sink cannot be read; or one every route shares.", body = super::openapi::Error, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
/// `GET /v1/deadletters`: the parked operations, oldest first, as `zkguard dlq list --json`
/// prints them.
pub async fn list_deadletters(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    no_query(query, "/v1/deadletters")?;
    let letters = state.executor.sink().list().await.map_err(sink_error)?;
    Ok(Json(serde_json::to_value(letters).map_err(|e| {
        ApiError::internal(format!("cannot encode the dead letters: {e}"))
    })?))
}

fn no_query(query: Option<String>, route: &str) -> Result<(), ApiError> {
    match query.filter(|q| !q.is_empty()) {
        Some(q) => Err(ApiError::bad(
            "bad_parameter",
            format!("{route} takes no query parameters (got `{q}`)"),
        )),
        None => Ok(()),
    }
}

/// Body of `POST /v1/deadletters/replay`: `{"id": "..."}` or `{"all": true}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    all: bool,
}

#[utoipa::path(
    post,
    path = "/v1/deadletters/replay",
    summary = "Run parked operations again",
    description = "Runs one entry (`{\"id\": ...}`) or all (`{\"all\": true}`) again under their locks, as `zkguard dlq replay` does: one document's entries in the order they were accepted (for one id, the older entries of its document first); an entry is removed only once its operation is in its document, or when the document has a write accepted after it (`superseded`, not applied over it).",
    tag = "deadletters",
    request_body(content = super::openapi::ReplayRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "One result per entry.", body = super::openapi::ReplayReport),
        (status = 404, description = "`unknown_deadletter`.", body = super::openapi::Error),
        (status = 503, description = "`deadletters_unavailable`, or one every route shares.", body = super::openapi::Error, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
/// `POST /v1/deadletters/replay`: runs one parked operation (`{"id": ...}`) or all of them
/// (`{"all": true}`) again under its lock, as `zkguard dlq replay` does; an entry is removed only
/// once its operation is in the document. Answers 200 with one result per entry.
pub async fn replay_deadletters(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    no_query(query, "/v1/deadletters/replay")?;
    let body = body.map_err(|e| ApiError::bad("bad_body", format!("cannot read the body: {e}")))?;
    let usage = "send {\"id\": \"<dead letter id>\"} or {\"all\": true}";
    let parsed: ReplayBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad(
            "malformed_json",
            format!("the body is not valid ({e}); {usage}"),
        )
    })?;
    let selection = match (parsed.id.as_deref(), parsed.all) {
        (Some(_), true) => {
            return Err(ApiError::bad(
                "bad_body",
                format!("both id and all were given; {usage}"),
            ))
        }
        (Some(id), false) => {
            ReplaySelection::Id(entry_id(id).map_err(|e| ApiError::bad("bad_body", e))?)
        }
        (None, true) => ReplaySelection::All,
        (None, false) => {
            return Err(ApiError::bad(
                "bad_body",
                format!("say which entries to replay: {usage}"),
            ))
        }
    };
    let results = deadletter::replay(&state.writer, state.executor.sink().as_ref(), selection)
        .await
        .map_err(|e| named_sink_error(e, parsed.id.as_deref().unwrap_or_default()))?;
    state.ui.forget_deadletters();
    for r in &results {
        match &r.result {
            ReplayResult::StillParked { .. } => continue,
            ReplayResult::Superseded { error, .. } => {
                // It will never be applied: a newer write of its document stands.
                let finished = Finished {
                    id: r.id,
                    status: OpState::Rejected,
                    reason: Some(format!("superseded on replay: {error}")),
                    token: None,
                    already_applied: false,
                    attempts: Some(r.attempts),
                    fingerprint: None,
                    key: None,
                };
                if let Err(e) = state.journal.finish(finished).await {
                    tracing::warn!(op = %r.id, error = %e, "cannot record a superseded operation in the journal");
                }
                continue;
            }
            _ => {}
        }
        state.metrics.replayed.inc();
        // The operation is in its document now: its status says so from here on, with the
        // token of the write that applied it (the replay's, or an earlier one's it found) and
        // the attempts so far, as for an operation the queue applied.
        if let Err(e) = state
            .journal
            .finish(Finished {
                id: r.id,
                status: OpState::Applied,
                reason: None,
                token: r.applied_token,
                already_applied: r.already_applied,
                attempts: Some(r.attempts),
                fingerprint: None,
                key: None,
            })
            .await
        {
            tracing::warn!(op = %r.id, error = %e, "cannot record a replayed operation in the journal");
        }
    }
    let report = deadletter::replay_report(&results);
    tracing::info!(
        replayed = results.len(),
        applied = %report["applied"],
        already_applied = %report["already_applied"],
        still_parked = %report["still_parked"],
        "dead letters replayed"
    );
    Ok(Json(report))
}

#[utoipa::path(
    delete,
    path = "/v1/deadletters/{id}",
    summary = "Give up a parked operation",
    description = "Removes the entry for good without running it, as `zkguard dlq discard` does: the entry and the reason are logged first, and the operation's status becomes `rejected`.",
    params(super::openapi::DeadLetterPath, super::openapi::DiscardQuery),
    tag = "deadletters",
    responses(
        (status = 200, description = "What was removed.", body = super::openapi::Discarded),
        (status = 404, description = "`unknown_deadletter`.", body = super::openapi::Error),
        (status = 503, description = "`deadletters_unavailable`, or one every route shares.", body = super::openapi::Error, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
/// `DELETE /v1/deadletters/{id}?reason=TEXT`: removes one parked operation for good, without
/// running it, as `zkguard dlq discard` does: the entry and the reason go to the log first, and
/// the operation's status becomes `rejected` with the reason. Answers 200 with
/// `{"id", "summary", "reason", "entry"}`, 404 `unknown_deadletter`.
pub async fn discard_deadletter(
    State(state): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let Path(raw) = path.map_err(super::params::path_error)?;
    let id = entry_id(&raw).map_err(|e| ApiError::bad("bad_parameter", e))?;
    let query = query.unwrap_or_default();
    super::params::refuse_repeated(&query)?;
    let mut reason = None;
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        match key.as_ref() {
            "reason" => reason = Some(value.trim().to_string()).filter(|r| !r.is_empty()),
            other => {
                return Err(ApiError::bad(
                    "bad_parameter",
                    format!("unknown query parameter `{other}`; the known one is reason"),
                ))
            }
        }
    }
    let reason = reason.unwrap_or_else(|| "discarded through DELETE /v1/deadletters".to_string());
    let letter = deadletter::discard(state.executor.sink().as_ref(), id, &reason)
        .await
        .map_err(|e| named_sink_error(e, &raw))?;
    state.ui.forget_deadletters();
    if let Err(e) = state
        .journal
        .finish(Finished {
            id,
            status: OpState::Rejected,
            reason: Some(format!("discarded from the dead letters: {reason}")),
            token: None,
            already_applied: false,
            attempts: Some(letter.attempts),
            fingerprint: None,
            key: None,
        })
        .await
    {
        tracing::warn!(op = %id, error = %e, "cannot record a discarded operation in the journal");
    }
    Ok(Json(deadletter::discard_report(&letter, &reason)))
}

/// Body of `POST /v1/transfers`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TransferBody {
    from: String,
    to: String,
    amount: i64,
    #[serde(default)]
    id: Option<String>,
}

fn txn_error(e: TxnError) -> Response {
    let message = e.to_string();
    let (status, kind) = match &e {
        TxnError::Rejected { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "rejected"),
        TxnError::RolledBack { transaction } => {
            let body =
                json!({"error": "rolled_back", "message": message, "transaction": transaction});
            return (StatusCode::CONFLICT, Json(body)).into_response();
        }
        TxnError::IdConflict { .. } => (StatusCode::CONFLICT, "id_conflict"),
        TxnError::NotFound { .. } => (StatusCode::NOT_FOUND, "unknown_transaction"),
        TxnError::InvalidId { .. } => (StatusCode::BAD_REQUEST, "bad_id"),
        TxnError::Busy { .. } | TxnError::Contention { .. } | TxnError::Interrupted { .. } => {
            return ApiError::unavailable("txn_busy", message).into_response()
        }
        TxnError::Store { source, .. } if source.is_transient() => {
            return ApiError::unavailable("es_unavailable", message).into_response()
        }
        e if e.is_bad_input() => (StatusCode::UNPROCESSABLE_ENTITY, "rejected"),
        _ => return ApiError::internal(message).into_response(),
    };
    ApiError::new(status, kind, message).into_response()
}

#[utoipa::path(
    post,
    path = "/v1/transfers",
    summary = "Move an amount between two accounts, all or nothing",
    description = "The two-phase-commit transfer of `zkguard txn transfer`, under the service's lock on `txn:<id>`. Sending the same `id` again resumes or reports it.",
    tag = "transfers",
    request_body(content = super::openapi::TransferRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Committed and applied.", body = super::openapi::Transaction),
        (status = 409, description = "`rolled_back` (with the transaction) or `id_conflict` (the id names another transfer).", body = super::openapi::RolledBack),
        (status = 422, description = "`rejected`: an overdraft, an unknown account, a bad amount.", body = super::openapi::Error),
        (status = 503, description = "`txn_busy`, `es_unavailable`, or one every route shares.", body = super::openapi::Error, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
/// `POST /v1/transfers`: `{"from", "to", "amount", "id"?}`, the two-phase-commit transfer of
/// `zkguard txn transfer`. 200 with the transaction once committed and applied; sending the
/// same id again resumes or reports that transaction.
pub async fn transfer(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    no_query(query, "/v1/transfers")?;
    let body = body.map_err(|e| ApiError::bad("bad_body", format!("cannot read the body: {e}")))?;
    let parsed: TransferBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad(
            "malformed_json",
            format!("the body is not a transfer ({e}); send {{\"from\": \"A\", \"to\": \"B\", \"amount\": 100}} with an optional \"id\""),
        )
    })?;
    let mut request = TransferRequest::new(parsed.from, parsed.to, parsed.amount);
    if let Some(id) = parsed.id {
        request = request.with_id(id);
    }
    Ok(match state.coordinator.transfer(request).await {
        Ok(txn) => Json(json!(txn)).into_response(),
        Err(e) => txn_error(e),
    })
}

#[utoipa::path(
    get,
    path = "/v1/transfers/{id}",
    summary = "A transaction",
    description = "As `zkguard txn show --json` prints it.",
    params(super::openapi::TransferPath),
    tag = "transfers",
    responses(
        (status = 200, description = "The transaction.", body = super::openapi::Transaction),
        (status = 404, description = "`unknown_transaction`.", body = super::openapi::Error),
        (status = 503, description = "`es_unavailable`, or one every route shares.", body = super::openapi::Error, headers(("Retry-After" = u64, description = "Seconds to wait."))),
    )
)]
/// `GET /v1/transfers/{id}`: the transaction, as `zkguard txn show --json` prints it.
pub async fn get_transfer(
    State(state): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path.map_err(|e| ApiError::bad("bad_path", e.to_string()))?;
    Ok(match state.coordinator.transaction(&id).await {
        Ok(Some(txn)) => Json(json!(txn)).into_response(),
        Ok(None) => txn_error(TxnError::NotFound {
            id,
            index: state.coordinator.settings().transactions_index.clone(),
        }),
        Err(e) => txn_error(e),
    })
}
