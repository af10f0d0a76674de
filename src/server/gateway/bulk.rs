//! A guarded `_bulk`: every item on a guarded index under the lock of its document, written in
//! shared `_bulk` requests with the locks' tokens as external versions; items whose locks come
//! later never hold up those whose locks came first.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use zkguard::{Guard, LockRequest, LockType};

use super::backend::Answer;
use super::bulk_parse::{filter_source, BulkParams, Item};
use super::gate::{lock_failed, lock_lost, lost_during_write, Gateway};
use super::merge::filter_path;
use super::reply::{Dress, GateError};
use super::route::{is_multi_target, DocOp};
use super::single::{apply_update, parse_update, Current, UpdateOutcome};

/// How long a batch of held locks waits for more to come in before it is written.
const GATHER_GAP: Duration = Duration::from_millis(1);

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
    /// The place in the flush's batch of the lock it is written under (set by [`flush`]).
    held: usize,
    lock_type: LockType,
    action: Value,
    source: Option<Vec<u8>>,
    created: Option<bool>,
    /// An update's new source as its answer's `get` shows it (`_source` asked for).
    get: Option<Value>,
}

/// Whether the cluster's `answer` to fenced line `action`, sent with a pipeline, names another
/// index, id or version than the line: the pipeline moved the write off its lock or token.
fn moved_by_pipeline(action: &Value, answer: &Value) -> bool {
    let Some(sent) = action.as_object().and_then(|o| o.values().next()) else {
        return false;
    };
    sent.get("pipeline").is_some()
        && (sent["_index"] != answer["_index"]
            || sent["_id"] != answer["_id"]
            || sent["version"] != answer["_version"])
}

/// Puts on a fenced index line what the item asks of ingest and mapping (`pipeline`,
/// `list_executed_pipelines`, `dynamic_templates`), for the cluster to apply as it would have.
fn with_ingest(action: &mut Value, it: &Item, templates: bool) {
    if let Some(p) = &it.pipeline {
        action["pipeline"] = json!(p);
    }
    if it.list_executed_pipelines {
        action["list_executed_pipelines"] = json!(true);
    }
    if let (true, Some(t)) = (templates, &it.dynamic_templates) {
        action["dynamic_templates"] = t.clone();
    }
}

fn bad(reason: impl Into<String>) -> GateError {
    GateError::new(
        StatusCode::BAD_REQUEST,
        "illegal_argument_exception",
        reason,
    )
}

/// The answer of item `op` on `index`/`id` that failed with `e`: 429 when nothing was written
/// and a retry is safe ([`GateError::item_status`]), what the official bulk helpers retry.
fn item_error(op: DocOp, index: &str, id: Option<&str>, e: &GateError) -> Value {
    json!({op.name(): {"_index": index, "_id": id, "status": e.item_status().as_u16(), "error": e.error_object()}})
}

/// `response` with `Retry-After: 1` when an item was refused for now, as on a single request
/// refused for now: when to send the refused items again.
fn with_retry_after(mut response: Response, retry: bool) -> Response {
    if retry {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(1u32));
    }
    response
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
    let max = gate.settings.bulk_max_items;
    let (bp, mut items) = match read(default_index.as_deref(), &params, &body, max) {
        Ok(read) => read,
        Err(e) => {
            metrics.gate("bulk", "refused");
            return dress.error(&e);
        }
    };
    let Sorted {
        mut answers,
        passed,
        groups,
    } = match sort_items(gate, headers, &mut items).await {
        Ok(sorted) => sorted,
        Err(e) => {
            metrics.gate("bulk", "refused");
            return dress.error(&e);
        }
    };

    let pass_run = async {
        if passed.is_empty() {
            return Vec::new();
        }
        pass_items(gate, &items, &passed, default_index.as_deref(), &params).await
    };
    let guarded_run = guarded(gate, &items, &groups, &bp.forward);
    let (pass_answers, guarded_answers) = futures::join!(pass_run, guarded_run);
    for (n, a) in pass_answers {
        answers[n] = Some(Answered::of(&a));
    }
    for (n, a) in guarded_answers {
        answers[n] = Some(a);
    }
    metrics.gate("bulk", "guarded");
    let took = started.elapsed().as_millis() as u64;
    let errors = answers.iter().flatten().any(|a| a.error);
    let retry = answers.iter().flatten().any(|a| a.retry);
    if bp.filter_path.is_none() && !bp.pretty {
        let body = Answered::join(took, errors, &answers);
        return with_retry_after(dress.bytes(StatusCode::OK, body), retry);
    }
    let items_out: Vec<Value> = answers
        .iter()
        .map(|a| {
            a.as_ref()
                .and_then(|a| serde_json::from_str(&a.json).ok())
                .unwrap_or(Value::Null)
        })
        .collect();
    drop(answers);
    let mut answer = json!({"took": took, "errors": errors, "items": items_out});
    if let Some(f) = &bp.filter_path {
        answer = filter_path(answer, f);
    }
    with_retry_after(answered(dress, &bp, &answer), retry)
}

/// Where the items of a guarded `_bulk` go.
struct Sorted {
    /// Per item, its answer when it was refused before anything was sent.
    answers: Vec<Option<Answered>>,
    /// The items passed through unguarded (an index the gate does not guard, a new document
    /// with an id Elasticsearch picks).
    passed: Vec<usize>,
    /// The guarded items, grouped by the monitor of their lock.
    groups: Vec<Group>,
}

/// Sorts the items of a `_bulk`: refuses those the gate does not take (naming why), passes
/// those it does not guard, and groups the guarded ones by the monitor of their lock (their
/// index resolved to the concrete one). `Err` when the request's lock plan is refused, which
/// refuses the whole request.
async fn sort_items(
    gate: &Gateway,
    headers: &HeaderMap,
    items: &mut [Item],
) -> Result<Sorted, GateError> {
    let mut answers: Vec<Option<Answered>> = Vec::new();
    answers.resize_with(items.len(), || None);
    let mut passed = Vec::new();
    let mut groups: Vec<Group> = Vec::new();
    let mut by_monitor: HashMap<String, usize> = HashMap::new();
    let mut concrete_of: HashMap<String, Result<String, GateError>> = HashMap::new();
    let mut alias_of: HashMap<String, Result<bool, GateError>> = HashMap::new();
    let metrics = &gate.state.metrics;
    for (n, item) in items.iter_mut().enumerate() {
        let refuse = |e: GateError| {
            Some(Answered::of(&item_error(
                item.op,
                &item.index,
                item.id.as_deref(),
                &e,
            )))
        };
        if let Some(e) = &item.failed {
            answers[n] = refuse(e.clone());
            continue;
        }
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
        if item.require_data_stream {
            answers[n] = refuse(bad(REQUIRE_DATA_STREAM_REFUSED));
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
            match parse_update(item.source.as_deref().unwrap_or_default(), false) {
                Ok(u) => item.update = Some(u),
                Err(e) => {
                    answers[n] = refuse(e);
                    continue;
                }
            }
        }
        if item.require_alias {
            if !alias_of.contains_key(&item.index) {
                let a = is_alias(gate, &item.index).await;
                alias_of.insert(item.index.clone(), a);
            }
            match &alias_of[&item.index] {
                Ok(true) => {}
                Ok(false) => {
                    answers[n] = refuse(not_an_alias(&item.index));
                    continue;
                }
                Err(e) => {
                    answers[n] = refuse(e.clone());
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
        // A lock plan refused refuses the whole request.
        let plan = gate.lock_plan(headers, &concrete)?;
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
    Ok(Sorted {
        answers,
        passed,
        groups,
    })
}

/// An item's answer, serialized as soon as it is known: a `Value` costs several times its
/// text, and a `_bulk` keeps every item's answer until the last is known.
struct Answered {
    /// The item's JSON.
    json: Box<str>,
    /// Whether it has an `error`.
    error: bool,
    /// Whether it was refused for now, nothing written (429: send it again).
    retry: bool,
}

impl Answered {
    /// `item` is `{action: {..., "status", "error"}}`: read its inner object once.
    fn of(item: &Value) -> Self {
        let inner = item.as_object().and_then(|o| o.values().next());
        Self {
            json: item.to_string().into_boxed_str(),
            error: inner.is_some_and(|i| i.get("error").is_some()),
            // Refused with 429: nothing written, to send again.
            retry: inner.is_some_and(|i| i["status"] == 429),
        }
    }

    /// The `_bulk` answer of `answers` (`null` for an item without one).
    fn join(took: u64, errors: bool, answers: &[Option<Answered>]) -> Vec<u8> {
        let size: usize = answers.iter().flatten().map(|a| a.json.len() + 1).sum();
        let mut body = Vec::with_capacity(size + 64);
        body.extend_from_slice(
            format!("{{\"took\":{took},\"errors\":{errors},\"items\":[").as_bytes(),
        );
        for (k, a) in answers.iter().enumerate() {
            if k > 0 {
                body.push(b',');
            }
            body.extend_from_slice(a.as_ref().map_or("null", |a| &a.json).as_bytes());
        }
        body.extend_from_slice(b"]}");
        body
    }
}

/// The request's URL parameters and items, read as Elasticsearch reads them; at most
/// `max_items` items.
///
/// # Errors
/// What Elasticsearch refuses as a whole (see [`super::bulk_parse`]); 413 beyond `max_items`.
pub(super) fn read(
    default_index: Option<&str>,
    params: &[(String, String)],
    body: &Bytes,
    max_items: usize,
) -> Result<(BulkParams, Vec<Item>), GateError> {
    let path = match default_index {
        Some(i) => format!("/{i}/_bulk"),
        None => "/_bulk".to_string(),
    };
    let bp = super::bulk_parse::params(&path, params)?;
    let items = super::bulk_parse::parse(body, default_index, &bp, max_items)?;
    Ok((bp, items))
}

/// The `_bulk` answer `answer`, indented when the caller asked for `pretty`.
pub(super) fn answered(dress: &Dress, bp: &BulkParams, answer: &Value) -> Response {
    if bp.pretty {
        let body = serde_json::to_vec_pretty(answer).unwrap_or_default();
        dress.bytes(StatusCode::OK, body)
    } else {
        dress.json(StatusCode::OK, answer)
    }
}

/// Why a guarded item with `require_data_stream` is refused.
const REQUIRE_DATA_STREAM_REFUSED: &str = "zkguard: [require_data_stream] is refused on a guarded write by id: the gate writes a data stream's documents by id to its backing index under their lock, where the flag cannot be checked; drop it, or let Elasticsearch pick the id (auto-id writes pass through with it)";

/// Whether `target` is an alias (the check of `require_alias`).
pub(super) async fn is_alias(gate: &Gateway, target: &str) -> Result<bool, GateError> {
    let path = format!("/_alias/{}", super::gate::encode(target));
    let answer = gate
        .cluster
        .own(Method::GET, &path, "application/json", None)
        .await
        .map_err(super::gate::unavailable)?;
    if !answer.status.is_success() {
        return Ok(false);
    }
    let body = answer.json();
    Ok(body.as_object().is_some_and(|o| {
        !o.contains_key(target) && o.values().any(|v| v["aliases"].get(target).is_some())
    }))
}

/// Elasticsearch's failure of an item with `require_alias` whose target is not an alias.
pub(super) fn not_an_alias(target: &str) -> GateError {
    let mut e = GateError::new(
        StatusCode::NOT_FOUND,
        "index_not_found_exception",
        format!("no such index [{target}] and [require_alias] request flag is [true] and [{target}] is not an alias"),
    );
    e.extra = json!({"index": target, "index_uuid": "_na_"});
    e
}

/// A query string of `params`. Items passed through get all of the caller's (checked)
/// parameters but the answer's own (`filter_path`, `pretty`, applied by the gate); the gate's
/// fenced `_bulk` gets [`BulkParams::forward`], its items carrying the rest on their lines.
fn forwarded(params: &[(String, String)], pass: bool) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in params {
        if !(pass && matches!(k.as_str(), "filter_path" | "pretty")) {
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
                    e.item(items[n].op, &items[n].index, items[n].id.as_deref()),
                )
            })
            .collect(),
    }
}

/// Why an answer of the cluster to one of the gate's own requests has no items.
#[derive(Debug, Clone)]
enum Failure {
    /// The cluster refused the request (4xx): its status and `error`, given to every item.
    Refused(u16, Value),
    /// The cluster failed or was not reached: the gate's 503.
    Gate(GateError),
}

impl Failure {
    /// The answer of item `op` on `index`/`id` that failed so.
    fn item(&self, op: DocOp, index: &str, id: Option<&str>) -> Value {
        match self {
            Failure::Refused(status, error) => {
                json!({op.name(): {"_index": index, "_id": id, "status": status, "error": error}})
            }
            Failure::Gate(e) => item_error(op, index, id, e),
        }
    }
}

/// The `key` array of a successful answer of the cluster to the gate's own request, the
/// cluster's refusal of it, or the 503 that names `what` failed and how.
fn listed(answer: Result<Answer, String>, key: &str, what: &str) -> Result<Vec<Value>, Failure> {
    match answer {
        Ok(a) if a.status.is_success() => Ok(a.json()[key].as_array().cloned().unwrap_or_default()),
        Ok(a) if a.status.is_client_error() && a.json()["error"].is_object() => Err(
            Failure::Refused(a.status.as_u16(), a.json()["error"].clone()),
        ),
        Ok(a) => Err(Failure::Gate(super::gate::unavailable(format!(
            "{what} was {}: {}",
            a.status,
            String::from_utf8_lossy(&a.body)
        )))),
        Err(e) => Err(Failure::Gate(super::gate::unavailable(e))),
    }
}

/// A lock asked for in a task of its own: the group, the outcome (`Err` if the task
/// panicked), and how long it took.
type Asked = (
    usize,
    Result<Result<Box<dyn Guard>, zkguard::LockError>, ()>,
    Duration,
);

/// Asks for group `g`'s lock in a task of its own, which sends the outcome on `tx`.
fn ask(
    locks: &std::sync::Arc<dyn zkguard::LockService>,
    items: &[Item],
    groups: &[Group],
    g: usize,
    tx: &mpsc::UnboundedSender<Asked>,
) {
    use futures::FutureExt;
    let group = &groups[g];
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
    let (locks, tx) = (locks.clone(), tx.clone());
    tokio::spawn(async move {
        let started = Instant::now();
        let result = std::panic::AssertUnwindSafe(locks.acquire(request))
            .catch_unwind()
            .await
            .map_err(|_| ());
        let _ = tx.send((g, result, started.elapsed()));
    });
}

/// The guarded items: their groups' locks asked for in a window of at most
/// `server.gateway.bulk.max.locks` asked or held at once; each batch of locks that came in is
/// written in one `_bulk` and released while the others are still coming, and its places in
/// the window go to the next groups.
async fn guarded(
    gate: &Gateway,
    items: &[Item],
    groups: &[Group],
    params: &[(String, String)],
) -> Vec<(usize, Answered)> {
    let mut out = Vec::new();
    let locks = gate.state.writer.locks().clone();
    let window = gate.settings.bulk_max_locks.max(1);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut asked = 0;
    while asked < groups.len().min(window) {
        ask(&locks, items, groups, asked, &tx);
        asked += 1;
    }
    let mut done = 0;
    while done < groups.len() {
        let Some(first) = rx.recv().await else {
            break;
        };
        // Locks come in bursts (the session's answers arrive together): gather until the
        // burst ends, so that a batch makes one `_bulk` rather than several small ones. A
        // lock waits at most one quiet gap longer; none waits for another that is taken.
        let mut ready = vec![first];
        while done + ready.len() < asked {
            match tokio::time::timeout(GATHER_GAP, rx.recv()).await {
                Ok(Some(more)) => ready.push(more),
                _ => break,
            }
        }
        done += ready.len();
        let mut batch: Vec<(usize, Box<dyn Guard>)> = Vec::new();
        let mut waits = Vec::new();
        for (g, result, waited) in ready {
            let failed = match result {
                Ok(Ok(guard)) => {
                    waits.push((groups[g].lock_type, waited));
                    batch.push((g, guard));
                    continue;
                }
                Ok(Err(e)) => lock_failed(&gate.state.metrics, groups[g].lock_type, &e),
                Err(()) => (
                    "failed",
                    super::gate::unavailable(format!(
                        "asking for the lock on `{}` failed unexpectedly; nothing was written, send the item again",
                        groups[g].monitor
                    )),
                ),
            };
            let (outcome, ge) = failed;
            for &n in &groups[g].items {
                let it = &items[n];
                gate.state.metrics.gate_item(it.op.name(), outcome);
                let answer = item_error(it.op, &it.index, it.id.as_deref(), &ge);
                out.push((n, Answered::of(&answer)));
            }
        }
        if !batch.is_empty() {
            let acquired = Instant::now();
            let flushed = flush(gate, items, groups, &batch, params).await;
            out.extend(flushed.iter().map(|(n, v)| (*n, Answered::of(v))));
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
        while asked < groups.len() && asked - done < window {
            ask(&locks, items, groups, asked, &tx);
            asked += 1;
        }
    }
    out
}

/// The URL parameters of a read with `routing`.
fn routed(routing: &Option<String>) -> Vec<(String, String)> {
    routing
        .iter()
        .map(|r| ("routing".to_string(), r.clone()))
        .collect()
}

/// The documents `to_read` (index, id, routing) as the `_mget` `answer` found them, each
/// `Ok(None)` when absent. One stored document the gate cannot read makes the whole answer
/// unreadable: the documents are then read one by one, so that only that document's items
/// fail ([`super::current::unreadable`]) and none is taken for absent.
///
/// # Errors
/// The cluster's refusal or failure of the `_mget`.
async fn documents(
    gate: &Gateway,
    answer: Result<Answer, String>,
    to_read: &[(String, String, Option<String>)],
) -> Result<Vec<Result<Option<Current>, GateError>>, Failure> {
    use futures::StreamExt;
    match answer {
        Ok(a) if a.status.is_success() => {
            if let Ok(v) = serde_json::from_slice::<Value>(&a.body) {
                let docs = v["docs"].as_array().cloned().unwrap_or_default();
                return Ok((0..to_read.len())
                    .map(|k| Ok(docs.get(k).and_then(Current::of)))
                    .collect());
            }
            let mut reads = Vec::with_capacity(to_read.len());
            for (i, id, routing) in to_read {
                let rest = routed(routing);
                reads.push(async move { super::single::read(gate, i, id, &rest).await });
            }
            Ok(futures::stream::iter(reads).buffered(16).collect().await)
        }
        // Not a success: `listed` names the failure.
        other => {
            listed(other, "docs", "reading the documents under their locks").map(|_| Vec::new())
        }
    }
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

/// Plans, checks and sends the items of a batch of held locks in one `_bulk`: reads what
/// their writes depend on ([`read_stored`]), plans each item's line ([`plan_item`]) and sends
/// the lines of the locks still held ([`send_lines`]).
async fn flush(
    gate: &Gateway,
    items: &[Item],
    groups: &[Group],
    batch: &[(usize, Box<dyn Guard>)],
    params: &[(String, String)],
) -> Vec<(usize, Value)> {
    let metrics = &gate.state.metrics;
    let mut known = match read_stored(gate, items, groups, batch).await {
        Ok(known) => known,
        Err(answers) => return answers,
    };
    let mut out = Vec::new();
    let mut lines: Vec<Line> = Vec::new();
    for (held, (g, guard)) in batch.iter().enumerate() {
        let token = guard.fencing_token();
        let mut group_lines = Vec::new();
        for &n in &groups[*g].items {
            match plan_item(gate, &items[n], n, &groups[*g], token, &mut known) {
                Planned::Line(line) => group_lines.push(Line { held, ..line }),
                Planned::Answer(answer) => out.push((n, answer)),
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
    if !lines.is_empty() {
        send_lines(gate, items, batch, &lines, params, &mut out).await;
    }
    out
}

/// What a flush knows of each document that a write of the batch depends on (a group that
/// needs a read: updates, creates, `if_seq_no`), read in one `_mget` under the locks and
/// settled (a document transaction's mark decided). `Err` holds every item's failed answer
/// when the read failed.
async fn read_stored(
    gate: &Gateway,
    items: &[Item],
    groups: &[Group],
    batch: &[(usize, Box<dyn Guard>)],
) -> Result<HashMap<(String, String), Known>, Vec<(usize, Value)>> {
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
    if to_read.is_empty() {
        return Ok(known);
    }
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
    let found = match documents(gate, answer, &to_read).await {
        Ok(found) => found,
        Err(e) => {
            let mut out = Vec::new();
            for (g, _) in batch {
                for &n in &groups[*g].items {
                    let it = &items[n];
                    gate.state.metrics.gate_item(it.op.name(), "failed");
                    out.push((n, e.item(it.op, &it.index, it.id.as_deref())));
                }
            }
            return Err(out);
        }
    };
    for (k, ((i, id, routing), doc)) in to_read.iter().zip(found).enumerate() {
        let settled = match doc {
            Ok(doc) => {
                super::single::settled(gate, i, id, doc, read_tokens[k], &routed(routing)).await
            }
            Err(e) => Err(e),
        };
        let doc = match settled {
            Ok(doc) => Known::Read(doc),
            Err(e) => Known::Failed(e),
        };
        known.insert((i.clone(), id.clone()), doc);
    }
    Ok(known)
}

/// What planning one item of a flush gave.
enum Planned {
    /// A line of the `_bulk`.
    Line(Line),
    /// Its answer, without a write (a conflict, a failure, an update that changes nothing).
    Answer(Value),
}

/// Plans item `n` (`it`, of `group`, fenced with `token`): checks it against what is known of
/// its document (`if_seq_no`, a create's existing document), builds its fenced line, and notes
/// what it writes for the items after it.
fn plan_item(
    gate: &Gateway,
    it: &Item,
    n: usize,
    group: &Group,
    token: u64,
    known: &mut HashMap<(String, String), Known>,
) -> Planned {
    let metrics = &gate.state.metrics;
    let id = it.id.clone().unwrap_or_default();
    let key = (it.index.clone(), id.clone());
    let state = known.get(&key).cloned();
    let answer = |e: GateError| item_error(it.op, &it.index, Some(&id), &e);
    if let Some(Known::Failed(e)) = &state {
        metrics.gate_item(it.op.name(), "failed");
        return Planned::Answer(answer(e.clone()));
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
            return Planned::Answer(answer(e));
        }
    }
    let stored: Option<Option<Value>> = match &state {
        Some(Known::Read(c)) => Some(c.as_ref().map(|c| c.source.clone())),
        Some(Known::Written(v)) => Some(v.clone()),
        Some(Known::Unknown | Known::Failed(_)) | None => None,
    };
    let fence = match super::single::fence(token) {
        Ok(fence) => fence,
        Err(e) => {
            metrics.gate_item(it.op.name(), "failed");
            return Planned::Answer(answer(e));
        }
    };
    let mut action = json!({"_index": it.index, "_id": id});
    action.as_object_mut().expect("an object").extend(fence);
    if let Some(r) = &it.routing {
        action["routing"] = json!(r);
    }
    let line = |action: Value, source: Option<Vec<u8>>| Line {
        item: n,
        held: 0,
        lock_type: group.lock_type,
        action,
        source,
        created: None,
        get: None,
    };
    match it.op {
        DocOp::Index | DocOp::Create => {
            if it.op == DocOp::Create && matches!(&stored, Some(Some(_))) {
                let version = match &state {
                    Some(Known::Read(Some(c))) => c.version,
                    _ => token as i64,
                };
                metrics.gate_item("create", "conflict");
                return Planned::Answer(answer(GateError::conflict(&it.index, &id, format!(
                    "[{id}]: version conflict, document already exists (current version [{version}])"
                ))));
            }
            if group.needs_read {
                let written = it
                    .source
                    .as_ref()
                    .and_then(|b| serde_json::from_slice::<Value>(b).ok());
                known.insert(
                    key,
                    written.map_or(Known::Unknown, |v| Known::Written(Some(v))),
                );
            }
            with_ingest(&mut action, it, true);
            let source = it.source.as_ref().map(|b| b.to_vec());
            Planned::Line(line(json!({"index": action}), source))
        }
        DocOp::Delete => {
            if group.needs_read {
                known.insert(key, Known::Written(None));
            }
            Planned::Line(line(json!({"delete": action}), None))
        }
        DocOp::Update => {
            let Some(stored) = stored else {
                metrics.gate_item("update", "conflict");
                return Planned::Answer(answer(GateError::conflict(&it.index, &id, format!("[{id}]: version conflict, an earlier item of this request wrote a document that is not JSON"))));
            };
            plan_update(
                gate,
                it,
                n,
                group,
                token,
                action,
                stored,
                state.as_ref(),
                known,
            )
        }
    }
}

/// Plans an `update` item (see [`plan_item`]) on the document as known (`stored`, `state`):
/// its merged source as a fenced `index` line, or the answer of an update that changes
/// nothing or fails.
#[allow(clippy::too_many_arguments)]
fn plan_update(
    gate: &Gateway,
    it: &Item,
    n: usize,
    group: &Group,
    token: u64,
    mut action: Value,
    stored: Option<Value>,
    state: Option<&Known>,
    known: &mut HashMap<(String, String), Known>,
) -> Planned {
    let metrics = &gate.state.metrics;
    let id = it.id.clone().unwrap_or_default();
    let update = it.update.as_ref().expect("parsed above");
    match apply_update(&it.index, &id, update, stored.as_ref()) {
        Err(e) => {
            metrics.gate_item("update", "failed");
            Planned::Answer(item_error(it.op, &it.index, Some(&id), &e))
        }
        Ok(UpdateOutcome::Noop) => {
            let (version, seq, term) = match state {
                Some(Known::Read(Some(c))) => (c.version, c.seq_no, c.primary_term),
                _ => (token as i64, -1, -1),
            };
            metrics.gate_item("update", "guarded");
            let mut inner = json!({
                "_index": it.index, "_id": id, "_version": version, "result": "noop",
                "_shards": {"total": 0, "successful": 0, "failed": 0},
                "_seq_no": seq, "_primary_term": term, "status": 200,
            });
            if let (Some(f), Some(s)) = (it.fetch.as_ref().filter(|f| f.fetch), &stored) {
                inner["get"] = json!({"_seq_no": seq, "_primary_term": term, "found": true, "_source": filter_source(s, f)});
            }
            Planned::Answer(json!({ "update": inner }))
        }
        Ok(UpdateOutcome::Write { source, created }) => {
            let bytes = serde_json::to_vec(&source).unwrap_or_default();
            let get = it
                .fetch
                .as_ref()
                .filter(|f| f.fetch)
                .map(|f| filter_source(&source, f));
            // Elasticsearch runs an update's pipeline on its `upsert` document only.
            if created && update.upsert.is_some() && !update.doc_as_upsert {
                with_ingest(&mut action, it, false);
            }
            known.insert((it.index.clone(), id), Known::Written(Some(source)));
            Planned::Line(Line {
                item: n,
                held: 0,
                lock_type: group.lock_type,
                action: json!({"index": action}),
                source: Some(bytes),
                created: Some(created),
                get,
            })
        }
    }
}

/// Sends the planned `lines` in one `_bulk` and adds each item's answer to `out`, as
/// Elasticsearch words it (an update's `result` and `get`), counting fenced writes. An item
/// the cluster applied after its lock (in `batch`) was lost is not acknowledged
/// ([`lost_during_write`]).
async fn send_lines(
    gate: &Gateway,
    items: &[Item],
    batch: &[(usize, Box<dyn Guard>)],
    lines: &[Line],
    params: &[(String, String)],
    out: &mut Vec<(usize, Value)>,
) {
    let metrics = &gate.state.metrics;
    let mut body = Vec::with_capacity(lines.len() * 128);
    for l in lines {
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
            for l in lines {
                let it = &items[l.item];
                metrics.gate_item(it.op.name(), "failed");
                out.push((l.item, e.item(it.op, &it.index, it.id.as_deref())));
            }
            return;
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
        let guard = batch[l.held].1.as_ref();
        // Applied, but the lock lost by the time the answer came: the next holder may have
        // read the document before the write landed, so it is not acknowledged.
        if (200..300).contains(&status) && !guard.is_held() {
            metrics.gate_item(it.op.name(), "failed");
            let e = lost_during_write(guard);
            out.push((l.item, item_error(it.op, &it.index, it.id.as_deref(), &e)));
            continue;
        }
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
        if ok && moved_by_pipeline(&l.action, &inner) {
            tracing::warn!(
                sent = %l.action, answer = %inner,
                "an ingest pipeline changed the _index, _id or _version of a fenced write of the gate: the document was written outside the lock it was fenced with; keep pipelines from setting these"
            );
        }
        if let (Some(source), true) = (&l.get, ok) {
            inner["get"] = json!({
                "_seq_no": inner["_seq_no"], "_primary_term": inner["_primary_term"],
                "found": true, "_source": source,
            });
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
}
