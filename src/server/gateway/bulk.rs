//! A guarded `_bulk`: every item on a guarded index under the lock of its document, written in
//! shared `_bulk` requests with the locks' tokens as external versions; items whose locks come
//! later never hold up those whose locks came first.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use zkguard::{Guard, LockRequest, LockType};

use super::backend::Answer;
use super::gate::{lock_failed, lock_lost, Gateway};
use super::merge::filter_path;
use super::reply::{Dress, GateError};
use super::route::{is_multi_target, DocOp};
use super::single::{apply_update, parse_update, Current, UpdateBody, UpdateOutcome};

/// How long a batch of held locks waits for more to come in before it is written.
const GATHER_GAP: Duration = Duration::from_millis(1);

/// One item of the request.
#[derive(Debug)]
pub(super) struct Item {
    pub(super) op: DocOp,
    pub(super) index: String,
    pub(super) id: Option<String>,
    pub(super) routing: Option<String>,
    pub(super) if_match: Option<(i64, i64)>,
    /// Whether the action names a `version` or `version_type` (refused on guarded indices).
    pub(super) versioned: bool,
    /// The action line and the source line, as sent (for items passed through).
    raw: Vec<Bytes>,
    pub(super) source: Option<Bytes>,
    update: Option<UpdateBody>,
}

/// A group of items under one monitor.
struct Group {
    monitor: String,
    lock_type: LockType,
    wait: Duration,
    items: Vec<usize>,
    needs_read: bool,
}

/// What the gate sends for an item in a flush.
struct Line {
    item: usize,
    lock_type: LockType,
    action: Value,
    source: Option<Vec<u8>>,
    created: Option<bool>,
}

fn bad(reason: impl Into<String>) -> GateError {
    GateError::new(
        StatusCode::BAD_REQUEST,
        "illegal_argument_exception",
        reason,
    )
}

/// Splits the NDJSON body into items.
pub(super) fn parse(body: &Bytes, default_index: Option<&str>) -> Result<Vec<Item>, GateError> {
    let mut lines = Vec::new();
    let mut start = 0;
    for (i, b) in body.iter().enumerate() {
        if *b == b'\n' {
            lines.push(body.slice(start..i));
            start = i + 1;
        }
    }
    if start < body.len() {
        lines.push(body.slice(start..));
    }
    let mut lines = lines
        .into_iter()
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .enumerate()
        .peekable();
    let mut items = Vec::new();
    while let Some((n, line)) = lines.next() {
        let action: Value = serde_json::from_slice(&line).map_err(|e| {
            bad(format!(
                "Malformed action/metadata line [{}], expected a JSON object: {e}",
                n + 1
            ))
        })?;
        let Some((name, meta)) = action.as_object().and_then(|o| o.iter().next()) else {
            return Err(bad(format!(
                "Malformed action/metadata line [{}], expected one of index, create, update, delete",
                n + 1
            )));
        };
        let op = match name.as_str() {
            "index" => DocOp::Index,
            "create" => DocOp::Create,
            "update" => DocOp::Update,
            "delete" => DocOp::Delete,
            other => {
                return Err(bad(format!(
                    "Malformed action/metadata line [{}], expected one of index, create, update, delete but found [{other}]",
                    n + 1
                )))
            }
        };
        let index = meta["_index"]
            .as_str()
            .map(str::to_string)
            .or_else(|| default_index.map(str::to_string))
            .ok_or_else(|| {
                GateError::new(
                    StatusCode::BAD_REQUEST,
                    "action_request_validation_exception",
                    format!("Validation Failed: 1: index is missing (line [{}]);", n + 1),
                )
            })?;
        let text = |k: &str| match &meta[k] {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        };
        let mut raw = vec![line.clone()];
        let source = if op == DocOp::Delete {
            None
        } else {
            let (_, s) = lines.next().ok_or_else(|| {
                bad(format!(
                    "the {name} action on line [{}] has no source line after it",
                    n + 1
                ))
            })?;
            raw.push(s.clone());
            Some(super::meta::client_source(&s))
        };
        let if_match = match (meta["if_seq_no"].as_i64(), meta["if_primary_term"].as_i64()) {
            (Some(s), Some(t)) => Some((s, t)),
            _ => None,
        };
        items.push(Item {
            op,
            index,
            id: text("_id"),
            routing: text("routing"),
            if_match,
            versioned: meta.get("version").is_some() || meta.get("version_type").is_some(),
            raw,
            source,
            update: None,
        });
    }
    Ok(items)
}

fn item_error(op: DocOp, index: &str, id: Option<&str>, e: &GateError) -> Value {
    json!({op.name(): {"_index": index, "_id": id, "status": e.status.as_u16(), "error": e.error_object()}})
}

/// A guarded `_bulk`, answered in Elasticsearch's shape.
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
    let mut items = match parse(&body, default_index.as_deref()) {
        Ok(items) => items,
        Err(e) => {
            metrics.gate("bulk", "refused");
            return dress.error(&e);
        }
    };
    let mut answers: Vec<Option<Value>> = vec![None; items.len()];
    let mut passed = Vec::new();
    let mut groups: Vec<Group> = Vec::new();
    let mut by_monitor: HashMap<String, usize> = HashMap::new();
    let mut concrete_of: HashMap<String, Result<String, GateError>> = HashMap::new();
    for (n, item) in items.iter_mut().enumerate() {
        let refuse = |e: GateError| Some(item_error(item.op, &item.index, item.id.as_deref(), &e));
        if is_multi_target(&item.index) {
            if gate.guards_any(&item.index) {
                answers[n] = refuse(bad(format!("zkguard: a document write to [{}] is refused: it names several indices or a pattern; write to one index (or alias)", item.index)));
            } else {
                passed.push(n);
            }
            continue;
        }
        if let Some(refusal) = gate.own_index(&item.index) {
            answers[n] = refuse(refusal);
            continue;
        }
        if !gate.guards(&item.index) {
            passed.push(n);
            continue;
        }
        if item.versioned {
            answers[n] = refuse(bad("zkguard: [version] and [version_type] are refused on a guarded index: the document's version is the fencing token of the writer's lock; drop them (use if_seq_no and if_primary_term for optimistic concurrency)"));
            continue;
        }
        let Some(id) = item.id.clone() else {
            if matches!(item.op, DocOp::Index | DocOp::Create) {
                // A new document with an id Elasticsearch picks: nobody else can be writing it.
                metrics.gate_item(item.op.name(), "passed");
                passed.push(n);
            } else {
                answers[n] = refuse(GateError::new(
                    StatusCode::BAD_REQUEST,
                    "action_request_validation_exception",
                    "Validation Failed: 1: id is missing;",
                ));
            }
            continue;
        };
        if item.op == DocOp::Update {
            let meta_source = serde_json::from_slice::<Value>(&item.raw[0])
                .ok()
                .and_then(|a| a["update"]["_source"].as_bool())
                == Some(true);
            match parse_update(item.source.as_deref().unwrap_or_default(), meta_source) {
                Ok(u) => item.update = Some(u),
                Err(e) => {
                    answers[n] = refuse(e);
                    continue;
                }
            }
        }
        if !concrete_of.contains_key(&item.index) {
            let c = gate.concrete(&item.index).await;
            concrete_of.insert(item.index.clone(), c);
        }
        let concrete = match &concrete_of[&item.index] {
            Ok(c) => c.clone(),
            Err(e) => {
                answers[n] = refuse(e.clone());
                continue;
            }
        };
        let plan = match gate.lock_plan(headers, &concrete) {
            Ok(p) => p,
            Err(e) => {
                metrics.gate("bulk", "refused");
                return dress.error(&e);
            }
        };
        let monitor = plan
            .monitor
            .unwrap_or_else(|| zkguard::lock::document_monitor(&concrete, &id));
        item.index = concrete;
        let g = *by_monitor.entry(monitor.clone()).or_insert_with(|| {
            groups.push(Group {
                monitor,
                lock_type: plan.lock_type,
                wait: plan.wait,
                items: Vec::new(),
                needs_read: false,
            });
            groups.len() - 1
        });
        groups[g].items.push(n);
        groups[g].needs_read |=
            item.if_match.is_some() || matches!(item.op, DocOp::Create | DocOp::Update);
    }
    for (n, a) in answers.iter().enumerate() {
        if a.is_some() {
            metrics.gate_item(items[n].op.name(), "refused");
        }
    }

    let pass_run = async {
        if passed.is_empty() {
            return Vec::new();
        }
        pass_items(gate, &items, &passed, default_index.as_deref(), &params).await
    };
    let guarded_run = guarded(gate, &items, &groups, &params);
    let (pass_answers, guarded_answers) = futures::join!(pass_run, guarded_run);
    for (n, a) in pass_answers.into_iter().chain(guarded_answers) {
        answers[n] = Some(a);
    }
    let items_out: Vec<Value> = answers
        .into_iter()
        .map(|a| a.unwrap_or(Value::Null))
        .collect();
    let errors = items_out.iter().any(|i| {
        i.as_object()
            .and_then(|o| o.values().next())
            .is_some_and(|inner| inner.get("error").is_some())
    });
    let mut answer = json!({
        "took": started.elapsed().as_millis() as u64,
        "errors": errors,
        "items": items_out,
    });
    if let Some((_, f)) = params.iter().find(|(k, _)| k == "filter_path") {
        answer = filter_path(answer, f);
    }
    metrics.gate("bulk", "guarded");
    dress.json(StatusCode::OK, &answer)
}

/// The query parameters a `_bulk` sent by the gate takes from the caller's.
fn forwarded(params: &[(String, String)], pass: bool) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in params {
        let keep = matches!(k.as_str(), "refresh" | "timeout" | "wait_for_active_shards")
            || (pass && matches!(k.as_str(), "pipeline" | "routing" | "require_alias"));
        if keep {
            q.append_pair(k, v);
        }
    }
    q.finish()
}

/// Items of unguarded indices (and auto-id items): one `_bulk`, as they were sent.
async fn pass_items(
    gate: &Gateway,
    items: &[Item],
    passed: &[usize],
    default_index: Option<&str>,
    params: &[(String, String)],
) -> Vec<(usize, Value)> {
    let mut body = Vec::new();
    for &n in passed {
        for line in &items[n].raw {
            body.extend_from_slice(line);
            body.push(b'\n');
        }
    }
    let path = match default_index {
        Some(i) => format!("/{}/_bulk", super::gate::encode(i)),
        None => "/_bulk".to_string(),
    };
    let target = format!("{path}?{}", forwarded(params, true));
    let answer = gate
        .cluster
        .own(Method::POST, &target, "application/x-ndjson", Some(body))
        .await;
    let metrics = &gate.state.metrics;
    match listed(answer, "items", "the cluster's answer to the _bulk") {
        Ok(results) => passed
            .iter()
            .enumerate()
            .map(|(k, &n)| {
                metrics.gate_item(items[n].op.name(), "passed");
                (n, results.get(k).cloned().unwrap_or(Value::Null))
            })
            .collect(),
        Err(e) => passed
            .iter()
            .map(|&n| {
                metrics.gate_item(items[n].op.name(), "failed");
                (
                    n,
                    item_error(items[n].op, &items[n].index, items[n].id.as_deref(), &e),
                )
            })
            .collect(),
    }
}

/// The `key` array of a successful answer of the cluster to the gate's own request, or the 503
/// that names `what` failed and how.
fn listed(answer: Result<Answer, String>, key: &str, what: &str) -> Result<Vec<Value>, GateError> {
    match answer {
        Ok(a) if a.status.is_success() => Ok(a.json()[key].as_array().cloned().unwrap_or_default()),
        Ok(a) => Err(super::gate::unavailable(format!(
            "{what} was {}: {}",
            a.status,
            String::from_utf8_lossy(&a.body)
        ))),
        Err(e) => Err(super::gate::unavailable(e)),
    }
}

/// The guarded items: every group's lock asked for at once; each batch of locks that came in
/// is written in one `_bulk` and released while the others are still coming.
async fn guarded(
    gate: &Gateway,
    items: &[Item],
    groups: &[Group],
    params: &[(String, String)],
) -> Vec<(usize, Value)> {
    let mut out = Vec::new();
    if groups.is_empty() {
        return out;
    }
    let locks = gate.state.writer.locks().clone();
    let (tx, mut rx) = mpsc::unbounded_channel();
    for (g, group) in groups.iter().enumerate() {
        let first = &items[group.items[0]];
        let request = LockRequest::new(
            group.monitor.clone(),
            format!(
                "gateway bulk {} {}/{}",
                first.op.name(),
                first.index,
                first.id.as_deref().unwrap_or_default()
            ),
        )
        .with_type(group.lock_type)
        .with_timeout(group.wait)
        .with_loss_watch_after(zkguard::write::background::BATCH_LOSS_WATCH_AFTER);
        let locks = locks.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let result = locks.acquire(request).await;
            let _ = tx.send((g, result, started.elapsed()));
        });
    }
    drop(tx);
    let mut left = groups.len();
    while left > 0 {
        let Some(first) = rx.recv().await else {
            break;
        };
        // Locks come in bursts (the session's answers arrive together): gather until the
        // burst ends, so that a batch makes one `_bulk` rather than several small ones. A
        // lock waits at most one quiet gap longer; none waits for another that is taken.
        let mut ready = vec![first];
        while ready.len() < left {
            match tokio::time::timeout(GATHER_GAP, rx.recv()).await {
                Ok(Some(more)) => ready.push(more),
                _ => break,
            }
        }
        left -= ready.len();
        let mut batch: Vec<(usize, Box<dyn Guard>)> = Vec::new();
        let mut waits = Vec::new();
        for (g, result, waited) in ready {
            match result {
                Ok(guard) => {
                    waits.push((groups[g].lock_type, waited));
                    batch.push((g, guard));
                }
                Err(e) => {
                    let (outcome, ge) = lock_failed(&gate.state.metrics, groups[g].lock_type, &e);
                    for &n in &groups[g].items {
                        let it = &items[n];
                        gate.state.metrics.gate_item(it.op.name(), outcome);
                        out.push((n, item_error(it.op, &it.index, it.id.as_deref(), &ge)));
                    }
                }
            }
        }
        if !batch.is_empty() {
            let acquired = Instant::now();
            out.extend(flush(gate, items, groups, &batch, params).await);
            for (lock_type, waited) in waits {
                gate.state
                    .metrics
                    .lock_used(lock_type.as_str(), waited, acquired.elapsed());
            }
            // One multi releases them all (see `LockService::release_all`).
            locks
                .release_all(batch.into_iter().map(|(_, guard)| guard).collect())
                .await
                .detach("releasing locks after the gate's bulk write failed");
        }
    }
    out
}

/// What is known of a document while a flush's items are planned.
#[derive(Clone)]
enum Known {
    /// As read (`_seq_no` and all).
    Read(Option<Current>),
    /// Written by an earlier item of this request: its source, but not its new `_seq_no`.
    Written(Option<Value>),
    /// Written by an earlier item whose source is not JSON.
    Unknown,
    /// It carried a document transaction's mark that could not be decided: its items fail.
    Failed(GateError),
}

/// Plans, checks and sends the items of a batch of held locks in one `_bulk`.
async fn flush(
    gate: &Gateway,
    items: &[Item],
    groups: &[Group],
    batch: &[(usize, Box<dyn Guard>)],
    params: &[(String, String)],
) -> Vec<(usize, Value)> {
    let metrics = &gate.state.metrics;
    let mut out = Vec::new();
    // One `_mget` for the documents whose writes depend on what is stored.
    let mut to_read: Vec<(String, String, Option<String>)> = Vec::new();
    let mut read_tokens: Vec<u64> = Vec::new();
    for (g, guard) in batch {
        if groups[*g].needs_read {
            for &n in &groups[*g].items {
                let it = &items[n];
                let key = (
                    it.index.clone(),
                    it.id.clone().unwrap_or_default(),
                    it.routing.clone(),
                );
                if !to_read.iter().any(|k| k.0 == key.0 && k.1 == key.1) {
                    to_read.push(key);
                    read_tokens.push(guard.fencing_token());
                }
            }
        }
    }
    let mut known: HashMap<(String, String), Known> = HashMap::new();
    if !to_read.is_empty() {
        let docs: Vec<Value> = to_read
            .iter()
            .map(|(i, id, r)| {
                let mut d = json!({"_index": i, "_id": id});
                if let Some(r) = r {
                    d["routing"] = json!(r);
                }
                d
            })
            .collect();
        let body = serde_json::to_vec(&json!({"docs": docs})).unwrap_or_default();
        let answer = gate
            .cluster
            .own(
                Method::POST,
                "/_mget?realtime=true",
                "application/json",
                Some(body),
            )
            .await;
        let found = match listed(answer, "docs", "reading the documents under their locks") {
            Ok(found) => found,
            Err(e) => {
                for (g, _) in batch {
                    for &n in &groups[*g].items {
                        let it = &items[n];
                        metrics.gate_item(it.op.name(), "failed");
                        out.push((n, item_error(it.op, &it.index, it.id.as_deref(), &e)));
                    }
                }
                return out;
            }
        };
        for (k, (i, id, routing)) in to_read.iter().enumerate() {
            let doc = found.get(k).and_then(Current::of);
            let rest: Vec<(String, String)> = routing
                .iter()
                .map(|r| ("routing".to_string(), r.clone()))
                .collect();
            let doc = match super::single::settled(gate, i, id, doc, read_tokens[k], &rest).await {
                Ok(doc) => Known::Read(doc),
                Err(e) => Known::Failed(e),
            };
            known.insert((i.clone(), id.clone()), doc);
        }
    }

    let mut lines: Vec<Line> = Vec::new();
    for (g, guard) in batch {
        let token = guard.fencing_token();
        let mut group_lines = Vec::new();
        for &n in &groups[*g].items {
            let it = &items[n];
            let id = it.id.clone().unwrap_or_default();
            let key = (it.index.clone(), id.clone());
            let state = known.get(&key).cloned();
            let answer = |e: GateError| item_error(it.op, &it.index, Some(&id), &e);
            if let Some(Known::Failed(e)) = &state {
                metrics.gate_item(it.op.name(), "failed");
                out.push((n, answer(e.clone())));
                continue;
            }
            // Optimistic concurrency against the stored document.
            if let Some((seq, term)) = it.if_match {
                let check = match &state {
                    Some(Known::Read(c)) => {
                        super::single::check_if_match(&it.index, &id, Some((seq, term)), c.as_ref())
                    }
                    _ => Err(GateError::conflict(&it.index, &id, format!(
                        "[{id}]: version conflict, required seqNo [{seq}], primary term [{term}]. the document was changed by an earlier item of this request"
                    ))),
                };
                if let Err(e) = check {
                    metrics.gate_item(it.op.name(), "conflict");
                    out.push((n, answer(e)));
                    continue;
                }
            }
            let stored: Option<Option<Value>> = match &state {
                Some(Known::Read(c)) => Some(c.as_ref().map(|c| c.source.clone())),
                Some(Known::Written(v)) => Some(v.clone()),
                Some(Known::Unknown | Known::Failed(_)) | None => None,
            };
            let mut action = json!({"_index": it.index, "_id": id, "version": token, "version_type": "external_gte"});
            if let Some(r) = &it.routing {
                action["routing"] = json!(r);
            }
            let parsed = |s: &Option<Bytes>| {
                s.as_ref()
                    .and_then(|b| serde_json::from_slice::<Value>(b).ok())
            };
            match it.op {
                DocOp::Index | DocOp::Create => {
                    if it.op == DocOp::Create {
                        let exists = match &stored {
                            Some(s) => s.is_some(),
                            None => false,
                        };
                        if exists {
                            let version = match &state {
                                Some(Known::Read(Some(c))) => c.version,
                                _ => token as i64,
                            };
                            metrics.gate_item("create", "conflict");
                            out.push((n, answer(GateError::conflict(&it.index, &id, format!(
                                "[{id}]: version conflict, document already exists (current version [{version}])"
                            )))));
                            continue;
                        }
                    }
                    if groups[*g].needs_read {
                        known.insert(
                            key,
                            parsed(&it.source).map_or(Known::Unknown, |v| Known::Written(Some(v))),
                        );
                    }
                    group_lines.push(Line {
                        item: n,
                        lock_type: groups[*g].lock_type,
                        action: json!({"index": action}),
                        source: it.source.as_ref().map(|b| b.to_vec()),
                        created: None,
                    });
                }
                DocOp::Delete => {
                    if groups[*g].needs_read {
                        known.insert(key, Known::Written(None));
                    }
                    group_lines.push(Line {
                        item: n,
                        lock_type: groups[*g].lock_type,
                        action: json!({"delete": action}),
                        source: None,
                        created: None,
                    });
                }
                DocOp::Update => {
                    let Some(stored) = stored else {
                        metrics.gate_item("update", "conflict");
                        out.push((n, answer(GateError::conflict(&it.index, &id, format!("[{id}]: version conflict, an earlier item of this request wrote a document that is not JSON")))));
                        continue;
                    };
                    let update = it.update.as_ref().expect("parsed above");
                    match apply_update(&it.index, &id, update, stored.as_ref()) {
                        Err(e) => {
                            metrics.gate_item("update", "failed");
                            out.push((n, answer(e)));
                        }
                        Ok(UpdateOutcome::Noop) => {
                            let (version, seq, term) = match &state {
                                Some(Known::Read(Some(c))) => (c.version, c.seq_no, c.primary_term),
                                _ => (token as i64, -1, -1),
                            };
                            metrics.gate_item("update", "guarded");
                            out.push((n, json!({"update": {
                                "_index": it.index, "_id": id, "_version": version, "result": "noop",
                                "_shards": {"total": 0, "successful": 0, "failed": 0},
                                "_seq_no": seq, "_primary_term": term, "status": 200,
                            }})));
                        }
                        Ok(UpdateOutcome::Write { source, created }) => {
                            let bytes = serde_json::to_vec(&source).unwrap_or_default();
                            known.insert(key, Known::Written(Some(source)));
                            group_lines.push(Line {
                                item: n,
                                lock_type: groups[*g].lock_type,
                                action: json!({"index": action}),
                                source: Some(bytes),
                                created: Some(created),
                            });
                        }
                    }
                }
            }
        }
        if guard.is_held() {
            lines.extend(group_lines);
        } else {
            let e = lock_lost(guard.as_ref());
            for l in group_lines {
                let it = &items[l.item];
                metrics.gate_item(it.op.name(), "failed");
                out.push((l.item, item_error(it.op, &it.index, it.id.as_deref(), &e)));
            }
        }
    }
    if lines.is_empty() {
        return out;
    }
    let mut body = Vec::with_capacity(lines.len() * 128);
    for l in &lines {
        body.extend(serde_json::to_vec(&l.action).unwrap_or_default());
        body.push(b'\n');
        if let Some(s) = &l.source {
            body.extend_from_slice(s);
            body.push(b'\n');
        }
    }
    let target = format!("/_bulk?{}", forwarded(params, false));
    let answer = gate
        .cluster
        .own(Method::POST, &target, "application/x-ndjson", Some(body))
        .await;
    let results = match listed(answer, "items", "the cluster's answer to the _bulk") {
        Ok(results) => results,
        Err(e) => {
            for l in &lines {
                let it = &items[l.item];
                metrics.gate_item(it.op.name(), "failed");
                out.push((l.item, item_error(it.op, &it.index, it.id.as_deref(), &e)));
            }
            return out;
        }
    };
    for (k, l) in lines.iter().enumerate() {
        let it = &items[l.item];
        let mut inner = results
            .get(k)
            .and_then(|r| r.as_object())
            .and_then(|o| o.values().next().cloned())
            .unwrap_or(Value::Null);
        let status = inner["status"].as_u64().unwrap_or(500);
        // A delete of a missing document answers 404 without an error, as Elasticsearch does.
        let ok = (200..300).contains(&status) || inner.get("error").is_none();
        if let (Some(created), true) = (l.created, ok) {
            if let Some(o) = inner.as_object_mut() {
                o.insert(
                    "result".into(),
                    json!(if created { "created" } else { "updated" }),
                );
                o.insert("status".into(), json!(if created { 201 } else { 200 }));
            }
        }
        if status == 409 {
            metrics.fenced_write(l.lock_type);
        }
        metrics.gate_item(
            it.op.name(),
            if ok {
                "guarded"
            } else if status == 409 {
                "conflict"
            } else {
                "failed"
            },
        );
        let mut wrapped = Map::new();
        wrapped.insert(it.op.name().to_string(), inner);
        out.push((l.item, Value::Object(wrapped)));
    }
    out
}
