//! One guarded document write: lock its monitor, read the document when the write depends on
//! it, send the write with the lock's token as its external version, release.

use std::time::Instant;

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;
use serde_json::{json, Map, Value};
use tracing::Instrument;
use zkguard::{Guard, LockRequest};

use crate::server::hub::{Happened, Kind};

use super::gate::{encode, lock_failed, lock_lost, unavailable, Gateway, LockPlan, TOKEN_ANSWER};
use super::merge::merge;
use super::reply::{Dress, GateError};
use super::route::DocOp;

/// A stored document, as a realtime GET found it.
#[derive(Debug, Clone, PartialEq)]
pub struct Current {
    /// `_source`.
    pub source: Value,
    /// `_seq_no`.
    pub seq_no: i64,
    /// `_primary_term`.
    pub primary_term: i64,
    /// `_version`.
    pub version: i64,
}

impl Current {
    /// The document of a GET answer (or an `_mget` item); `None` when not found.
    pub fn of(found: &Value) -> Option<Self> {
        (found["found"] == true).then(|| Current {
            source: found["_source"].clone(),
            seq_no: found["_seq_no"].as_i64().unwrap_or(-1),
            primary_term: found["_primary_term"].as_i64().unwrap_or(-1),
            version: found["_version"].as_i64().unwrap_or(-1),
        })
    }
}

/// `if_seq_no` and `if_primary_term`, when given.
pub type IfMatch = Option<(i64, i64)>;

/// The parameters a guarded write takes from the caller, checked: what must be refused is.
///
/// # Errors
/// A client-supplied `version`/`version_type`; an `if_seq_no` without `if_primary_term` (or
/// the other way round), or one that is not a number.
pub fn check_params(
    params: &[(String, String)],
) -> Result<(IfMatch, Vec<(String, String)>), GateError> {
    let mut seq = None;
    let mut term = None;
    let mut rest = Vec::new();
    for (k, v) in params {
        match k.as_str() {
            "version" | "version_type" => {
                return Err(GateError::refused(format!(
                    "zkguard: [{k}] is refused on a guarded index: the document's version is the fencing token of the writer's lock; drop {k} (use if_seq_no and if_primary_term for optimistic concurrency)"
                )))
            }
            "if_seq_no" => seq = Some(number(k, v)?),
            "if_primary_term" => term = Some(number(k, v)?),
            "op_type" | "retry_on_conflict" | "_source" | "_source_includes"
            | "_source_excludes" | "lang" | "filter_path" | "pretty" | "human" => {}
            _ => rest.push((k.clone(), v.clone())),
        }
    }
    let if_match = match (seq, term) {
        (Some(s), Some(t)) => Some((s, t)),
        (None, None) => None,
        _ => {
            return Err(GateError::new(
                StatusCode::BAD_REQUEST,
                "action_request_validation_exception",
                "Validation Failed: 1: if_seq_no and if_primary_term must be given together;",
            ))
        }
    };
    Ok((if_match, rest))
}

fn number(key: &str, value: &str) -> Result<i64, GateError> {
    value.parse().map_err(|_| {
        GateError::refused(format!(
            "Failed to parse [{key}]: [{value}] is not a number"
        ))
    })
}

/// The 409 of an `if_seq_no`/`if_primary_term` that does not match `current`.
pub fn check_if_match(
    index: &str,
    id: &str,
    if_match: IfMatch,
    current: Option<&Current>,
) -> Result<(), GateError> {
    let Some((seq, term)) = if_match else {
        return Ok(());
    };
    match current {
        Some(c) if c.seq_no == seq && c.primary_term == term => Ok(()),
        Some(c) => Err(GateError::conflict(index, id, format!(
            "[{id}]: version conflict, required seqNo [{seq}], primary term [{term}]. current document has seqNo [{}] and primary term [{}]",
            c.seq_no, c.primary_term
        ))),
        None => Err(GateError::conflict(index, id, format!(
            "[{id}]: version conflict, required seqNo [{seq}], primary term [{term}]. but no document was found"
        ))),
    }
}

/// What an `_update` body asks for.
#[derive(Debug, Clone, Default)]
pub struct UpdateBody {
    /// `doc`.
    pub doc: Option<Map<String, Value>>,
    /// `upsert`.
    pub upsert: Option<Value>,
    /// `doc_as_upsert`.
    pub doc_as_upsert: bool,
    /// `detect_noop` (default true).
    pub detect_noop: bool,
    /// `_source` (true: the answer carries the new source under `get`).
    pub source: bool,
}

/// Parses an `_update` body (or a `_bulk` update's source line).
///
/// # Errors
/// A script (refused: it cannot carry a fencing token), neither `doc` nor `upsert`, or a body
/// that is not a JSON object.
pub fn parse_update(body: &[u8], source_param: bool) -> Result<UpdateBody, GateError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        GateError::new(
            StatusCode::BAD_REQUEST,
            "x_content_parse_exception",
            format!("the update body is not JSON: {e}"),
        )
    })?;
    let Value::Object(mut map) = value else {
        return Err(GateError::refused(
            "the update body must be a JSON object with `doc`",
        ));
    };
    super::meta::strip_update(&mut map);
    if map.contains_key("script") || map.contains_key("scripted_upsert") {
        return Err(GateError::refused(
            "zkguard: scripted updates are refused on a guarded index: a script runs inside Elasticsearch, where the write cannot carry the lock's fencing token; send a partial `doc` (or read, change and index the whole document) instead",
        ));
    }
    let doc = match map.remove("doc") {
        Some(Value::Object(d)) => Some(d),
        Some(_) => return Err(GateError::refused("`doc` must be a JSON object")),
        None => None,
    };
    let upsert = map.remove("upsert");
    if doc.is_none() && upsert.is_none() {
        return Err(GateError::new(
            StatusCode::BAD_REQUEST,
            "action_request_validation_exception",
            "Validation Failed: 1: script or doc is missing;",
        ));
    }
    Ok(UpdateBody {
        doc,
        upsert,
        doc_as_upsert: map.remove("doc_as_upsert").and_then(|v| v.as_bool()) == Some(true),
        detect_noop: map.remove("detect_noop").and_then(|v| v.as_bool()) != Some(false),
        source: source_param || map.get("_source").and_then(Value::as_bool) == Some(true),
    })
}

/// What an update does to the stored document.
#[derive(Debug, Clone, PartialEq)]
pub enum UpdateOutcome {
    /// Write this whole document; `created` when none was stored.
    Write {
        /// The new source.
        source: Value,
        /// Whether the document is new.
        created: bool,
    },
    /// Nothing changes (`detect_noop`).
    Noop,
}

/// The update of `current` by `update`, as Elasticsearch applies it.
///
/// # Errors
/// 404 `document_missing_exception` when nothing is stored and nothing is to be upserted.
pub fn apply_update(
    index: &str,
    id: &str,
    update: &UpdateBody,
    current: Option<&Value>,
) -> Result<UpdateOutcome, GateError> {
    match current {
        Some(stored) => {
            let mut source = match stored {
                Value::Object(m) => m.clone(),
                _ => Map::new(),
            };
            let changed = match &update.doc {
                Some(doc) => merge(&mut source, doc),
                None => false,
            };
            if !changed && (update.detect_noop || update.doc.is_none()) {
                return Ok(UpdateOutcome::Noop);
            }
            Ok(UpdateOutcome::Write {
                source: Value::Object(source),
                created: false,
            })
        }
        None => {
            let source = match (&update.upsert, &update.doc) {
                (Some(u), _) if !update.doc_as_upsert => u.clone(),
                (_, Some(doc)) if update.doc_as_upsert => Value::Object(doc.clone()),
                (Some(u), _) => u.clone(),
                _ => {
                    return Err(GateError::new(
                        StatusCode::NOT_FOUND,
                        "document_missing_exception",
                        format!("[{id}]: document missing"),
                    )
                    .about(index, id))
                }
            };
            Ok(UpdateOutcome::Write {
                source,
                created: true,
            })
        }
    }
}

/// The query string of a fenced write: the caller's parameters and the token.
pub fn fenced_query(rest: &[(String, String)], token: u64) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in rest {
        q.append_pair(k, v);
    }
    q.append_pair("version", &token.to_string());
    q.append_pair("version_type", "external_gte");
    q.finish()
}

/// Reads the current document under the lock.
pub(super) async fn read(
    gate: &Gateway,
    concrete: &str,
    id: &str,
    rest: &[(String, String)],
) -> Result<Option<Current>, GateError> {
    let mut path = format!("/{}/_doc/{}?realtime=true", encode(concrete), encode(id));
    if let Some((_, r)) = rest.iter().find(|(k, _)| k == "routing") {
        path.push_str(&format!("&routing={}", encode(r)));
    }
    let answer = gate
        .cluster
        .own(Method::GET, &path, "application/json", None)
        .await
        .map_err(unavailable)?;
    match answer.status {
        StatusCode::NOT_FOUND => Ok(None),
        s if s.is_success() => Ok(Current::of(&answer.json())),
        s => Err(GateError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "zkguard_cluster_unavailable_exception",
            format!(
                "zkguard: reading {concrete}/{id} under the lock failed ({s}): {}; nothing was written",
                String::from_utf8_lossy(&answer.body)
            ),
        )),
    }
}

/// `current` (`concrete/id`, read under a lock whose token is `token`) as it is once a
/// document transaction's mark on it is decided (`src/write/marks.rs`): read again when the
/// transaction's write was undone.
///
/// # Errors
/// 503 when the transaction log or the document cannot be read or written.
pub async fn settled(
    gate: &Gateway,
    concrete: &str,
    id: &str,
    current: Option<Current>,
    token: u64,
    rest: &[(String, String)],
) -> Result<Option<Current>, GateError> {
    use zkguard::write::marks::{mark_of, MarkResolver};
    let Some(c) = &current else {
        return Ok(current);
    };
    let doc = zkguard::es::Doc {
        id: id.to_string(),
        source: c.source.clone(),
        meta: zkguard::es::DocMeta {
            seq_no: c.seq_no,
            primary_term: c.primary_term,
            version: c.version,
        },
    };
    let Some(txn) = mark_of(&doc) else {
        return Ok(current);
    };
    let rewritten = gate
        .state
        .transactions
        .resolve(&txn, concrete, id, &doc, token)
        .await
        .map_err(|e| unavailable(format!("zkguard: deciding transaction `{txn}`, whose mark {concrete}/{id} carries, failed: {e}; nothing was written")))?;
    if rewritten {
        return read(gate, concrete, id, rest).await;
    }
    Ok(current.map(super::meta::unmarked))
}

/// A guarded single-document write, answered as Elasticsearch answers it.
#[allow(clippy::too_many_arguments)]
pub async fn write(
    gate: &Gateway,
    dress: &Dress,
    op: DocOp,
    index: &str,
    id: &str,
    headers: &HeaderMap,
    params: Vec<(String, String)>,
    body: Bytes,
) -> Response {
    let metrics = gate.state.metrics.clone();
    let span = tracing::info_span!("gateway_write", op = op.name(), index, id);
    let outcome = async {
        let Ok(_permit) = gate.state.permits.clone().try_acquire_owned() else {
            return Err((
                "refused",
                GateError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "es_rejected_execution_exception",
                    format!(
                        "zkguard: {} requests are being handled (server.max.concurrent); send the request again shortly",
                        gate.state.settings.max_concurrent
                    ),
                )
                .retry_after(1),
            ));
        };
        let (if_match, rest) = check_params(&params).map_err(|e| ("refused", e))?;
        let update = match op {
            DocOp::Update => {
                let source_param = params
                    .iter()
                    .any(|(k, v)| k == "_source" && (v == "true" || v.is_empty()));
                Some(parse_update(&body, source_param).map_err(|e| ("refused", e))?)
            }
            _ => None,
        };
        let concrete = gate.concrete(index).await.map_err(|e| ("failed", e))?;
        let plan: LockPlan = gate.lock_plan(headers, &concrete).map_err(|e| ("refused", e))?;
        let monitor = plan
            .monitor
            .clone()
            .unwrap_or_else(|| zkguard::lock::document_monitor(&concrete, id));
        let request = LockRequest::new(
            monitor,
            format!("gateway {} {index}/{id}", op.name()),
        )
        .with_type(plan.lock_type)
        .with_timeout(plan.wait);
        let started = Instant::now();
        let guard = match gate.state.writer.locks().acquire(request).await {
            Ok(g) => g,
            Err(e) => return Err(lock_failed(&metrics, plan.lock_type, &e)),
        };
        let waited = started.elapsed();
        let acquired = Instant::now();
        let token = guard.fencing_token();
        let result = under_lock(
            gate,
            guard.as_ref(),
            op,
            &concrete,
            id,
            if_match,
            &rest,
            update.as_ref(),
            body,
            dress,
        )
        .await;
        metrics.lock_used(plan.lock_type.as_str(), waited, acquired.elapsed());
        if let Ok(answer) = &result {
            if answer.status().is_success() {
                let event = Happened::lock(Kind::Applied, guard.monitor(), plan.lock_type);
                gate.state
                    .events
                    .publish(event.token(token).document(&concrete, id));
            }
        }
        guard.release().await.detach(match &result {
            Ok(_) => "the gate's write is done but releasing its lock failed",
            Err(_) => "releasing the lock after a refused gate write failed",
        });
        let mut response = result?;
        if let Ok(v) = HeaderValue::from_str(&token.to_string()) {
            response.headers_mut().insert(TOKEN_ANSWER, v);
        }
        if response.status() == StatusCode::CONFLICT {
            return Ok(("conflict", response));
        }
        Ok(("guarded", response))
    }
    .instrument(span)
    .await;
    match outcome {
        Ok((label, response)) => {
            metrics.gate(op.name(), label);
            response
        }
        Err((label, e)) => {
            metrics.gate(
                op.name(),
                if e.status == StatusCode::CONFLICT {
                    "conflict"
                } else {
                    label
                },
            );
            dress.error(&e)
        }
    }
}

/// The write under the held lock.
#[allow(clippy::too_many_arguments)]
async fn under_lock(
    gate: &Gateway,
    guard: &dyn Guard,
    op: DocOp,
    concrete: &str,
    id: &str,
    if_match: IfMatch,
    rest: &[(String, String)],
    update: Option<&UpdateBody>,
    body: Bytes,
    dress: &Dress,
) -> Result<Response, (&'static str, GateError)> {
    let token = guard.fencing_token();
    let needs_read = if_match.is_some() || matches!(op, DocOp::Create | DocOp::Update);
    let current = if needs_read {
        let found = read(gate, concrete, id, rest)
            .await
            .map_err(|e| ("failed", e))?;
        settled(gate, concrete, id, found, token, rest)
            .await
            .map_err(|e| ("failed", e))?
    } else {
        None
    };
    check_if_match(concrete, id, if_match, current.as_ref()).map_err(|e| ("conflict", e))?;
    let doc_path = format!("/{}/_doc/{}", encode(concrete), encode(id));
    let (method, payload, created) = match op {
        DocOp::Index => (
            Method::PUT,
            Some(super::meta::client_source(&body).to_vec()),
            None,
        ),
        DocOp::Create => {
            if let Some(c) = &current {
                return Err((
                    "conflict",
                    GateError::conflict(
                        concrete,
                        id,
                        format!(
                            "[{id}]: version conflict, document already exists (current version [{}])",
                            c.version
                        ),
                    ),
                ));
            }
            (
                Method::PUT,
                Some(super::meta::client_source(&body).to_vec()),
                None,
            )
        }
        DocOp::Delete => (Method::DELETE, None, None),
        DocOp::Update => {
            let update = update.expect("an update carries its body");
            match apply_update(concrete, id, update, current.as_ref().map(|c| &c.source))
                .map_err(|e| ("failed", e))?
            {
                UpdateOutcome::Noop => {
                    let c = current.as_ref().expect("a noop has a stored document");
                    let mut answer = json!({
                        "_index": concrete, "_id": id, "_version": c.version, "result": "noop",
                        "_shards": {"total": 0, "successful": 0, "failed": 0},
                        "_seq_no": c.seq_no, "_primary_term": c.primary_term,
                    });
                    if update.source {
                        answer["get"] = json!({"_seq_no": c.seq_no, "_primary_term": c.primary_term, "found": true, "_source": c.source});
                    }
                    return Ok(dress.json(StatusCode::OK, &answer));
                }
                UpdateOutcome::Write { source, created } => (
                    Method::PUT,
                    Some(serde_json::to_vec(&source).unwrap_or_default()),
                    Some((created, source)),
                ),
            }
        }
    };
    if !guard.is_held() {
        return Err(("failed", lock_lost(guard)));
    }
    let target = format!("{doc_path}?{}", fenced_query(rest, token));
    let answer = gate
        .cluster
        .own(method, &target, "application/json", payload)
        .await
        .map_err(|e| ("failed", unavailable(e)))?;
    if answer.status == StatusCode::CONFLICT {
        gate.state.metrics.fenced_write(guard.lock_type());
        tracing::warn!(
            token,
            "the gate's write was fenced: the document holds a newer version"
        );
    }
    let Some((created, source)) = created.filter(|_| answer.status.is_success()) else {
        return Ok(dress.bytes(answer.status, answer.body.to_vec()));
    };
    let written = answer.json();
    let mut reply = json!({
        "_index": written["_index"], "_id": written["_id"], "_version": written["_version"],
        "result": if created { "created" } else { "updated" },
        "_shards": written["_shards"], "_seq_no": written["_seq_no"],
        "_primary_term": written["_primary_term"],
    });
    if update.is_some_and(|u| u.source) {
        reply["get"] = json!({"_seq_no": written["_seq_no"], "_primary_term": written["_primary_term"], "found": true, "_source": source});
    }
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(dress.json(status, &reply))
}
