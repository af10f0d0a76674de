//! An atomic `_bulk` (`X-Zkguard-Atomic: true`): its items applied as one document transaction,
//! all or nothing, answered in the `_bulk` shape with every item the same outcome.

use std::collections::HashSet;
use std::time::Instant;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};
use zkguard::txn::multi::{Decision, Expect, Outcome, TxnOp, TxnRequest};

use super::bulk::{answered, is_alias, not_an_alias, read};
use super::bulk_parse::{BulkParams, Item};
use super::gate::Gateway;
use super::merge::filter_path;
use super::reply::{Dress, GateError};
use super::route::{is_multi_target, DocOp};
use super::single::parse_update;

/// The header that asks for an atomic `_bulk`.
pub const ATOMIC_HEADER: &str = "x-zkguard-atomic";

/// Whether the request asks for an atomic `_bulk`.
///
/// # Errors
/// A value other than `true` or `false`.
pub fn asked(headers: &HeaderMap) -> Result<bool, GateError> {
    match headers
        .get(ATOMIC_HEADER)
        .map(|v| v.to_str().map(str::trim))
    {
        None => Ok(false),
        Some(Ok(v)) if v.eq_ignore_ascii_case("true") => Ok(true),
        Some(Ok(v)) if v.eq_ignore_ascii_case("false") => Ok(false),
        Some(_) => Err(GateError::refused(
            "zkguard: header X-Zkguard-Atomic takes `true` or `false`",
        )),
    }
}

fn refused(n: usize, item: &Item, why: &str) -> GateError {
    GateError::refused(format!(
        "zkguard: an atomic _bulk refuses item [{}] ({} on [{}]): {why}; nothing was written",
        n + 1,
        item.op.name(),
        item.index
    ))
}

/// The refusal of a URL parameter a transaction cannot honour.
fn unsupported_params(bp: &BulkParams) -> Result<(), GateError> {
    for (k, v) in &bp.forward {
        let honoured = k == "include_source_on_error" || (k == "refresh" && v == "false");
        if !honoured {
            return Err(GateError::refused(format!(
                "zkguard: an atomic _bulk refuses the parameter [{k}]: a transaction writes its documents itself, in several requests, and cannot carry it; drop it (refresh the index afterwards if needed)"
            )));
        }
    }
    Ok(())
}

/// The refusal of what item `n` asks that a transaction cannot do, or Elasticsearch's own
/// failure of the item (which would fail the transaction).
async fn unsupported_keys(gate: &Gateway, n: usize, item: &Item) -> Result<(), GateError> {
    if let Some(e) = &item.failed {
        return Err(e.clone());
    }
    let key = if item.pipeline.is_some() {
        Some("pipeline")
    } else if item.list_executed_pipelines {
        Some("list_executed_pipelines")
    } else if item.require_data_stream {
        Some("require_data_stream")
    } else if item.dynamic_templates.is_some() {
        Some("dynamic_templates")
    } else if item.fetch.as_ref().is_some_and(|f| f.fetch) {
        Some("_source")
    } else {
        None
    };
    if let Some(key) = key {
        return Err(refused(n, item, &format!("[{key}] cannot be applied in a transaction, which writes the documents itself (an ingest pipeline could also change what the transaction recorded); drop it, or send the item in a plain _bulk")));
    }
    if item.require_alias && !is_alias(gate, &item.index).await? {
        return Err(not_an_alias(&item.index));
    }
    Ok(())
}

/// The transaction of the items, or why the request is refused as a whole.
async fn transaction(
    gate: &Gateway,
    headers: &HeaderMap,
    items: &mut [Item],
) -> Result<TxnRequest, GateError> {
    let mut ops = Vec::with_capacity(items.len());
    let mut seen = HashSet::new();
    let mut lock_type = None;
    let mut wait = None;
    for (n, item) in items.iter_mut().enumerate() {
        unsupported_keys(gate, n, item).await?;
        if is_multi_target(&item.index) {
            return Err(refused(n, item, "it names several indices or a pattern"));
        }
        if let Some(refusal) = gate.own_index(&item.index) {
            return Err(refusal);
        }
        if !gate.guards(&item.index) {
            return Err(refused(n, item, "the index is not guarded (server.gateway.indices), so the gate cannot make it part of a transaction"));
        }
        if item.versioned {
            return Err(refused(n, item, "[version] and [version_type] are set by the gate (the lock's fencing token); use if_seq_no and if_primary_term"));
        }
        if item.routing.is_some() {
            return Err(refused(
                n,
                item,
                "custom routing is not supported in a transaction",
            ));
        }
        let Some(id) = item.id.clone() else {
            return Err(refused(
                n,
                item,
                "it has no _id; a transaction names every document",
            ));
        };
        let concrete = gate.concrete(&item.index).await?;
        let plan = gate.lock_plan(headers, &concrete)?;
        lock_type.get_or_insert(plan.lock_type);
        wait.get_or_insert(plan.wait);
        if !seen.insert((concrete.clone(), id.clone())) {
            return Err(refused(
                n,
                item,
                &format!(
                    "[{concrete}/{id}] appears twice; a transaction changes each document once"
                ),
            ));
        }
        let source = || -> Result<Value, GateError> {
            serde_json::from_slice(item.source.as_deref().unwrap_or_default()).map_err(|e| {
                GateError::new(
                    StatusCode::BAD_REQUEST,
                    "mapper_parsing_exception",
                    format!("failed to parse the source of item [{}]: {e}", n + 1),
                )
            })
        };
        let mut op = match item.op {
            DocOp::Index => TxnOp::index(&concrete, &id, source()?),
            DocOp::Create => TxnOp::index(&concrete, &id, source()?).expect(Expect::Absent),
            DocOp::Delete => TxnOp::delete(&concrete, &id),
            DocOp::Update => {
                let u = parse_update(item.source.as_deref().unwrap_or_default(), false)?;
                if u.upsert.is_some() {
                    return Err(refused(n, item, "an update in a transaction takes `doc` (with `doc_as_upsert` to create a missing document), not an `upsert` document"));
                }
                let doc = Value::Object(u.doc.unwrap_or_default());
                let op = TxnOp::update(&concrete, &id, doc);
                if u.doc_as_upsert {
                    op.upsert()
                } else {
                    op
                }
            }
        };
        if let Some((seq_no, term)) = item.if_match {
            op = op.expect(Expect::Version {
                if_seq_no: seq_no,
                if_primary_term: term,
            });
        }
        if let Some(m) = plan.monitor {
            op = op.on_monitor(m);
        }
        item.index = concrete;
        ops.push(op);
    }
    if ops.is_empty() {
        return Err(GateError::new(
            StatusCode::BAD_REQUEST,
            "action_request_validation_exception",
            "Validation Failed: 1: no requests added;",
        ));
    }
    let mut request = TxnRequest::new(ops).with_type(lock_type.unwrap_or_default());
    if let Some(w) = wait {
        request = request.with_lock_timeout(w);
    }
    if let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| !k.is_empty())
    {
        request = request.with_id(key);
    }
    Ok(request)
}

/// 503 `zkguard_request_timeout_exception` with `Retry-After` for an atomic `_bulk` abandoned
/// at `server.request.timeout` (`limit`), as `/v1/transactions` answers one: transaction `id`,
/// when it was started, goes on and is decided on its own.
fn timed_out(limit: std::time::Duration, id: Option<&str>) -> GateError {
    let next = match id {
        Some(id) => format!("transaction [{id}] goes on and is decided on its own: send the request again with the header Idempotency-Key: {id}, which answers its decision once made, or read it with GET /v1/transactions/{id}"),
        None => "nothing was locked or written: send the request again".to_string(),
    };
    GateError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "zkguard_request_timeout_exception",
        format!(
            "zkguard: the atomic _bulk took longer than server.request.timeout ({}ms) and was abandoned; {next}",
            limit.as_millis()
        ),
    )
    .retry_after(1)
}

/// The `_bulk` items of a decided transaction.
fn items_of(items: &[Item], outcome: &Outcome) -> Vec<Value> {
    let failed = outcome.failed.as_deref();
    items
        .iter()
        .zip(&outcome.documents)
        .map(|(item, doc)| {
            let name = item.op.name();
            if outcome.state == Decision::Committed {
                let result = doc.result.as_deref().unwrap_or("updated");
                let status = match result {
                    "created" => 201,
                    "not_found" => 404,
                    _ => 200,
                };
                let mut inner = json!({
                    "_index": doc.index, "_id": doc.id, "result": result, "status": status,
                    "_shards": {"total": 1, "successful": 1, "failed": 0},
                    "zkguard_transaction": outcome.transaction_id,
                });
                if let Some(v) = doc.version {
                    inner["_version"] = json!(v);
                }
                return json!({ name: inner });
            }
            let reason = format!(
                "zkguard: transaction [{}] rolled back: {}",
                outcome.transaction_id,
                outcome.reason.as_deref().unwrap_or("no reason recorded")
            );
            let this = failed == Some(format!("{}/{}", doc.index, doc.id).as_str());
            let e = if outcome.blocked_by.is_some() {
                GateError::new(StatusCode::TOO_MANY_REQUESTS, "es_rejected_execution_exception", reason)
            } else if this && item.op == DocOp::Update && reason.contains("does not exist") {
                GateError::new(StatusCode::NOT_FOUND, "document_missing_exception", reason)
            } else if this {
                GateError::conflict(&doc.index, &doc.id, reason)
            } else {
                GateError::new(StatusCode::CONFLICT, "zkguard_transaction_rolled_back_exception", reason)
            }
            .about(&doc.index, &doc.id);
            json!({name: {"_index": doc.index, "_id": doc.id, "status": e.status.as_u16(), "error": e.error_object()}})
        })
        .collect()
}

/// An atomic `_bulk`, answered in Elasticsearch's shape.
pub async fn run(
    gate: &Gateway,
    dress: &Dress,
    default_index: Option<String>,
    headers: &HeaderMap,
    params: Vec<(String, String)>,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let metrics = gate.state.metrics.clone();
    let refuse = |e: GateError| {
        metrics.gate("bulk_atomic", "refused");
        dress.error(&e)
    };
    let max = gate.settings.bulk_max_items;
    let (bp, mut items) = match read(default_index.as_deref(), &params, &body, max) {
        Ok(read) => read,
        Err(e) => return refuse(e),
    };
    if let Err(e) = unsupported_params(&bp) {
        return refuse(e);
    }
    // The service's request timeout, as on `/v1/transactions`; the transaction itself runs
    // in a task of its own and is decided whether or not its answer is awaited.
    let limit = gate.state.settings.request_timeout;
    let deadline = tokio::time::Instant::now() + limit;
    let abandoned = |id: Option<&str>| {
        metrics.gate("bulk_atomic", "failed");
        dress.error(&timed_out(limit, id))
    };
    let request =
        match tokio::time::timeout_at(deadline, transaction(gate, headers, &mut items)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return refuse(e),
            Err(_) => return abandoned(None),
        };
    let id = request.id.clone();
    let applied = crate::server::txn_routes::apply(&gate.state, request);
    let Ok(applied) = tokio::time::timeout_at(deadline, applied).await else {
        return abandoned(Some(&id));
    };
    let outcome = match applied {
        Ok(o) => o,
        Err(e) => {
            let status = e.status;
            let kind = match status {
                StatusCode::PAYLOAD_TOO_LARGE => "zkguard_transaction_too_large_exception",
                StatusCode::CONFLICT => "zkguard_transaction_conflict_exception",
                StatusCode::SERVICE_UNAVAILABLE => "zkguard_transaction_unavailable_exception",
                StatusCode::FORBIDDEN => "security_exception",
                _ => "illegal_argument_exception",
            };
            let mut g = GateError::new(status, kind, format!("zkguard: {}", e.message));
            if let Some(s) = e.retry_after {
                g = g.retry_after(s as u32);
            }
            metrics.gate("bulk_atomic", "failed");
            return dress.error(&g);
        }
    };
    let out = items_of(&items, &outcome);
    let mut answer = json!({
        "took": started.elapsed().as_millis() as u64,
        "errors": outcome.state == Decision::RolledBack,
        "items": out,
    });
    if let Some(f) = &bp.filter_path {
        answer = filter_path(answer, f);
    }
    metrics.gate(
        "bulk_atomic",
        match outcome.state {
            Decision::Committed => "guarded",
            Decision::RolledBack => "conflict",
        },
    );
    answered(dress, &bp, &answer)
}
