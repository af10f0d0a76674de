//! One guarded document write: lock its monitor, read the document when the write depends on
//! it, send the write with the lock's token as its external version, release.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;
use serde_json::{json, Map, Value};
use tracing::Instrument;
use zkguard::{Guard, LockRequest};

use crate::server::hub::{Happened, Kind};

use super::current::{read_failed, unreadable};
use super::gate::{
    encode, lock_failed, lock_lost, lost_during_write, unavailable, Gateway, LockPlan, TOKEN_ANSWER,
};
use super::merge::merge;
use super::params::{cas_errors, check, validation, Checked, Shape, SourceFilter};
use super::reply::{Dress, GateError};
use super::route::DocOp;

pub use super::current::Current;

/// The document of a realtime GET answer's `body` (`concrete/id`); `None` when not found.
///
/// # Errors
/// [`unreadable`] when the body is not JSON the gate can read.
pub fn found(concrete: &str, id: &str, body: &[u8]) -> Result<Option<Current>, GateError> {
    let answer: Value =
        serde_json::from_slice(body).map_err(|e| unreadable(concrete, id, &e.to_string()))?;
    Ok(Current::of(&answer))
}

/// `if_seq_no` and `if_primary_term`, when given.
pub type IfMatch = Option<(i64, i64)>;

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

/// What an `_update` body asks for: the fields of Elasticsearch's `UpdateRequest` parser.
#[derive(Debug, Clone)]
pub struct UpdateBody {
    /// `doc`.
    pub doc: Option<Map<String, Value>>,
    /// `upsert`.
    pub upsert: Option<Value>,
    /// `doc_as_upsert`.
    pub doc_as_upsert: bool,
    /// `detect_noop` (default true).
    pub detect_noop: bool,
    /// What the answer returns under `get`: the URL's `_source` parameters, or the body's
    /// `_source` (which wins, as in Elasticsearch); `None`: no `get`.
    pub source: Option<SourceFilter>,
    /// `if_seq_no` given in the body.
    pub if_seq_no: Option<i64>,
    /// `if_primary_term` given in the body.
    pub if_primary_term: Option<i64>,
    /// Whether a `script` was given (refused).
    pub script: bool,
}

impl Default for UpdateBody {
    fn default() -> Self {
        Self {
            doc: None,
            upsert: None,
            doc_as_upsert: false,
            detect_noop: true,
            source: None,
            if_seq_no: None,
            if_primary_term: None,
            script: false,
        }
    }
}

/// Parses and validates an `_update` body (or a `_bulk` update's source line);
/// `source_param`: the answer returns the whole new source under `get`.
///
/// # Errors
/// See [`parse_update_with`] and [`validate_update`].
pub fn parse_update(body: &[u8], source_param: bool) -> Result<UpdateBody, GateError> {
    let update = parse_update_with(body, source_param.then(SourceFilter::all))?;
    validate_update(&update, update.if_seq_no, update.if_primary_term, 0)?;
    Ok(update)
}

/// 400 `x_content_parse_exception`, as Elasticsearch's parser of `_update` bodies words it.
fn parse_error(reason: impl Into<String>) -> GateError {
    GateError::new(
        StatusCode::BAD_REQUEST,
        "x_content_parse_exception",
        reason.into(),
    )
}

/// The token type Elasticsearch names for a JSON value.
fn token(v: &Value) -> &'static str {
    match v {
        Value::Null => "VALUE_NULL",
        Value::Bool(_) => "VALUE_BOOLEAN",
        Value::Number(_) => "VALUE_NUMBER",
        Value::String(_) => "VALUE_STRING",
        Value::Array(_) => "START_ARRAY",
        Value::Object(_) => "START_OBJECT",
    }
}

/// Reads an `_update` body as strictly as Elasticsearch's `UpdateRequest` parser: `doc`,
/// `upsert`, `doc_as_upsert`, `detect_noop`, `scripted_upsert`, `script`, `_source`,
/// `if_seq_no`, `if_primary_term`, nothing else. `url_source`: the URL's `_source`
/// parameters. An empty body is an empty object (Elasticsearch's validation then answers).
///
/// # Errors
/// 400 `x_content_parse_exception` for a body that is not a JSON object, an unknown field or a
/// field of the wrong type; 400 `illegal_argument_exception` for a script (it cannot carry a
/// fencing token).
pub fn parse_update_with(
    body: &[u8],
    url_source: Option<SourceFilter>,
) -> Result<UpdateBody, GateError> {
    let value: Value = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Map::new())
    } else {
        serde_json::from_slice(body)
            .map_err(|e| parse_error(format!("the update body is not JSON: {e}")))?
    };
    let Value::Object(mut map) = value else {
        return Err(parse_error(format!(
            "[UpdateRequest] Expected START_OBJECT but was: {}",
            token(&value)
        )));
    };
    super::meta::strip_update(&mut map);
    let mut u = UpdateBody {
        source: url_source,
        ..UpdateBody::default()
    };
    for (key, v) in map {
        let object = |v: Value| match v {
            Value::Object(m) => Ok(m),
            other => Err(parse_error(format!(
                "[UpdateRequest] {key} doesn't support values of type: {}",
                token(&other)
            ))),
        };
        let flag = |v: &Value| match v {
            Value::Bool(b) => Ok(*b),
            Value::String(s) if s == "true" || s == "false" => Ok(s == "true"),
            _ => Err(parse_error(format!(
                "[UpdateRequest] failed to parse field [{key}]"
            ))),
        };
        let long = |v: &Value| {
            v.as_i64().ok_or_else(|| {
                parse_error(format!("[UpdateRequest] failed to parse field [{key}]"))
            })
        };
        match key.as_str() {
            "doc" => u.doc = Some(object(v)?),
            "upsert" => u.upsert = Some(Value::Object(object(v)?)),
            "doc_as_upsert" => u.doc_as_upsert = flag(&v)?,
            "detect_noop" => u.detect_noop = flag(&v)?,
            "scripted_upsert" => {
                flag(&v)?;
            }
            "script" => u.script = true,
            "_source" => u.source = Some(SourceFilter::from_body(&v)?),
            "if_seq_no" => u.if_seq_no = Some(long(&v)?),
            "if_primary_term" => u.if_primary_term = Some(long(&v)?),
            _ => {
                return Err(parse_error(format!(
                    "[UpdateRequest] unknown field [{key}]"
                )))
            }
        }
    }
    if u.script {
        return Err(GateError::refused(
            "zkguard: scripted updates are refused on a guarded index: a script runs inside Elasticsearch, where the write cannot carry the lock's fencing token; send a partial `doc` (or read, change and index the whole document) instead",
        ));
    }
    Ok(u)
}

/// Elasticsearch's validation of an update request (`UpdateRequest.validate`), with the
/// `if_seq_no`/`if_primary_term` and `retry_on_conflict` it carries.
///
/// # Errors
/// 400 `action_request_validation_exception` listing every failure, as Elasticsearch does.
pub fn validate_update(
    u: &UpdateBody,
    if_seq_no: Option<i64>,
    if_primary_term: Option<i64>,
    retry_on_conflict: i64,
) -> Result<(), GateError> {
    let mut errors = cas_errors(if_seq_no, if_primary_term);
    if if_seq_no.is_some() {
        if retry_on_conflict > 0 {
            errors.push("compare and write operations can not be retried".into());
        }
        if u.doc_as_upsert {
            errors.push("compare and write operations can not be used with upsert".into());
        }
        if u.upsert.is_some() {
            errors.push("upsert requests don't support `if_seq_no` and `if_primary_term`".into());
        }
    }
    if u.doc.is_none() {
        errors.push("script or doc is missing".into());
        if u.doc_as_upsert {
            errors.push("doc must be specified if doc_as_upsert is enabled".into());
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(validation(&errors))
    }
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

/// The parameters of a write fenced by `token`: the library's fencing rule
/// ([`zkguard::write::fence::params`]), which its own guarded writes follow too. A token larger
/// than Elasticsearch's largest version is refused (500), never sent otherwise.
pub(super) fn fence(token: u64) -> Result<Map<String, Value>, GateError> {
    zkguard::write::fence::params(token).map_err(|e| {
        GateError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "exception",
            format!("zkguard: {e}; nothing was written"),
        )
    })
}

/// The query string of a fenced write: the caller's parameters and the fence of `token`.
pub fn fenced_query(rest: &[(String, String)], token: u64) -> Result<String, GateError> {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in rest {
        q.append_pair(k, v);
    }
    for (k, v) in fence(token)? {
        q.append_pair(
            &k,
            v.as_str().map_or(v.to_string(), str::to_string).as_str(),
        );
    }
    Ok(q.finish())
}

/// Reads the current document under the lock.
pub(super) async fn read(
    gate: &Gateway,
    concrete: &str,
    id: &str,
    rest: &[(String, String)],
) -> Result<Option<Current>, GateError> {
    if super::dot_id::is_dot(id) {
        return super::dot_id::read(gate, concrete, id, rest).await;
    }
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
        s if s.is_success() => found(concrete, id, &answer.body),
        s => Err(read_failed(
            concrete,
            id,
            s,
            String::from_utf8_lossy(&answer.body),
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
        .map_err(|e| unavailable(format!("deciding transaction `{txn}`, whose mark {concrete}/{id} carries, failed: {e}; nothing was written")))?;
    if rewritten {
        return read(gate, concrete, id, rest).await;
    }
    Ok(current.map(|mut c| {
        super::meta::unmark(&mut c.source);
        c
    }))
}

/// A guarded single-document write as asked, checked before anything is locked.
struct Asked {
    op: DocOp,
    checked: Checked,
    if_match: IfMatch,
    update: Option<UpdateBody>,
    body: Bytes,
}

/// Checks a guarded write's parameters and body as Elasticsearch's handler and validation do,
/// before anything is locked or written.
fn prepare(
    op: DocOp,
    index: &str,
    id: &str,
    params: &[(String, String)],
    body: Bytes,
) -> Result<Asked, GateError> {
    let checked = check(op, index, id, params)?;
    // `source` stands in for an absent body on `_update` only: Elasticsearch's update handler
    // reads the body or `source`, its index handler the body alone.
    let body = match &checked.body {
        Some(b) if body.is_empty() && op == DocOp::Update => Bytes::from(b.clone().into_bytes()),
        _ => body,
    };
    let (mut seq, mut term) = (checked.if_seq_no, checked.if_primary_term);
    let update = match op {
        DocOp::Update => {
            let u = parse_update_with(&body, checked.source.clone())?;
            seq = u.if_seq_no.or(seq);
            term = u.if_primary_term.or(term);
            validate_update(&u, seq, term, checked.retry_on_conflict)?;
            Some(u)
        }
        DocOp::Index | DocOp::Create if body.iter().all(u8::is_ascii_whitespace) => {
            return Err(GateError::new(
                StatusCode::BAD_REQUEST,
                "parse_exception",
                "request body is required",
            ))
        }
        _ => None,
    };
    Ok(Asked {
        op,
        checked,
        if_match: seq.zip(term),
        update,
        body,
    })
}

/// `require_alias` and `require_data_stream`, checked on the target as given (the fenced
/// write goes to the concrete index, so they are not passed on).
///
/// # Errors
/// Elasticsearch's 404s: `index_not_found_exception` when `target` is not an alias,
/// `resource_not_found_exception` when it is not a data stream; 503 when the cluster cannot
/// be asked.
async fn check_target(gate: &Gateway, target: &str, checked: &Checked) -> Result<(), GateError> {
    let ask = |path: String| async move {
        gate.cluster
            .own(Method::GET, &path, "application/json", None)
            .await
            .map_err(unavailable)
    };
    if checked.require_alias {
        let answer = ask(format!("/_alias/{}", encode(target))).await?;
        let body = answer.json();
        let alias = answer.status.is_success()
            && body
                .as_object()
                .is_some_and(|o| !o.is_empty() && !o.contains_key(target));
        if !alias {
            let mut e = GateError::new(
                StatusCode::NOT_FOUND,
                "index_not_found_exception",
                format!("no such index [{target}] and [require_alias] request flag is [true] and [{target}] is not an alias"),
            );
            e.extra = json!({"resource.type": "index_or_alias", "resource.id": target, "index_uuid": "_na_", "index": target});
            return Err(e);
        }
    }
    if checked.require_data_stream {
        let answer = ask(format!("/_data_stream/{}", encode(target))).await?;
        let stream = answer.status.is_success()
            && answer.json()["data_streams"]
                .as_array()
                .is_some_and(|d| d.iter().any(|s| s["name"] == target));
        if !stream {
            return Err(GateError::new(
                StatusCode::NOT_FOUND,
                "resource_not_found_exception",
                format!("[require_data_stream] request flag is [true] and [{target}] is not a data stream"),
            ));
        }
    }
    Ok(())
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
    let shape = Shape::of(&params);
    let span = tracing::info_span!("gateway_write", op = op.name(), index, id);
    // Set once the write is on its way to the cluster: a timeout after it cannot say that
    // nothing was written.
    let sent = AtomicBool::new(false);
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
        let asked = prepare(op, index, id, &params, body).map_err(|e| ("refused", e))?;
        check_target(gate, index, &asked.checked)
            .await
            .map_err(|e| ("refused", e))?;
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
        let result = under_lock(gate, guard.as_ref(), &asked, &concrete, id, &shape, dress, &sent).await;
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
    .instrument(span);
    // The service's request timeout, as on `/v1` and the atomic `_bulk`: past it the write is
    // abandoned (its lock, if held, released as the guard is dropped).
    let limit = gate.state.settings.request_timeout;
    let outcome = tokio::time::timeout(limit, outcome)
        .await
        .unwrap_or_else(|_| Err(("failed", timed_out(limit, sent.load(Ordering::Acquire)))));
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
            shape.error(dress, &e)
        }
    }
}

/// 503 `zkguard_request_timeout_exception` with `Retry-After` for a single-document write
/// abandoned at `server.request.timeout` (`limit`); `sent`: whether the write had been sent to
/// the cluster (it may then have been applied).
fn timed_out(limit: std::time::Duration, sent: bool) -> GateError {
    let what = if sent {
        "after it was sent to the cluster: it may have been applied; send it again (an index, update or delete converges; a create may then answer 409)"
    } else {
        "before it was sent to the cluster; nothing was written: send it again"
    };
    GateError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "zkguard_request_timeout_exception",
        format!(
            "zkguard: the write took longer than server.request.timeout ({}ms) and was abandoned {what}",
            limit.as_millis()
        ),
    )
    .retry_after(1)
}

/// The `get` of an `_update` answer: `source` filtered as `filter` asks, when it asks.
fn get_part(
    filter: Option<&SourceFilter>,
    seq_no: &Value,
    term: &Value,
    source: &Value,
) -> Option<Value> {
    let f = filter.filter(|f| f.fetch)?;
    Some(
        json!({"_seq_no": seq_no, "_primary_term": term, "found": true, "_source": f.apply(source)}),
    )
}

/// The noop answer of an update that changes nothing in `c`.
fn noop(concrete: &str, id: &str, c: &Current, update: &UpdateBody) -> Value {
    let mut answer = json!({
        "_index": concrete, "_id": id, "_version": c.version, "result": "noop",
        "_shards": {"total": 0, "successful": 0, "failed": 0},
        "_seq_no": c.seq_no, "_primary_term": c.primary_term,
    });
    if let Some(get) = get_part(
        update.source.as_ref(),
        &json!(c.seq_no),
        &json!(c.primary_term),
        &c.source,
    ) {
        answer["get"] = get;
    }
    answer
}

/// The `_update` answer of the fenced index `written` that stored `source`.
fn updated(written: &Value, created: bool, source: &Value, update: &UpdateBody) -> Value {
    let mut reply = json!({
        "_index": written["_index"], "_id": written["_id"], "_version": written["_version"],
        "result": if created { "created" } else { "updated" },
        "_shards": written["_shards"], "_seq_no": written["_seq_no"],
        "_primary_term": written["_primary_term"],
    });
    if written["forced_refresh"] == true {
        reply["forced_refresh"] = json!(true);
    }
    if let Some(get) = get_part(
        update.source.as_ref(),
        &written["_seq_no"],
        &written["_primary_term"],
        source,
    ) {
        reply["get"] = get;
    }
    reply
}

/// The write under the held lock; `sent` is set when the write goes to the cluster.
#[allow(clippy::too_many_arguments)]
async fn under_lock(
    gate: &Gateway,
    guard: &dyn Guard,
    asked: &Asked,
    concrete: &str,
    id: &str,
    shape: &Shape,
    dress: &Dress,
    sent: &AtomicBool,
) -> Result<Response, (&'static str, GateError)> {
    let token = guard.fencing_token();
    let (op, rest) = (asked.op, &asked.checked.forward);
    let needs_read = asked.if_match.is_some() || matches!(op, DocOp::Create | DocOp::Update);
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
    // An update of a missing document is answered 404 `document_missing_exception` (below),
    // whatever its `if_seq_no`, as Elasticsearch answers it.
    if !(op == DocOp::Update && current.is_none()) {
        check_if_match(concrete, id, asked.if_match, current.as_ref())
            .map_err(|e| ("conflict", e))?;
    }
    let doc_path = format!("/{}/_doc/{}", encode(concrete), encode(id));
    let (method, payload, created) = match op {
        DocOp::Index => (
            Method::PUT,
            Some(super::meta::client_source(&asked.body).to_vec()),
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
                Some(super::meta::client_source(&asked.body).to_vec()),
                None,
            )
        }
        DocOp::Delete => (Method::DELETE, None, None),
        DocOp::Update => {
            let update = asked.update.as_ref().expect("an update carries its body");
            match apply_update(concrete, id, update, current.as_ref().map(|c| &c.source))
                .map_err(|e| ("failed", e))?
            {
                UpdateOutcome::Noop => {
                    let c = current.as_ref().expect("a noop has a stored document");
                    return Ok(shape.json(dress, StatusCode::OK, &noop(concrete, id, c, update)));
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
    let query = fenced_query(rest, token).map_err(|e| ("failed", e))?;
    let target = format!("{doc_path}?{query}");
    sent.store(true, Ordering::Release);
    let answer = if super::dot_id::is_dot(id) {
        super::dot_id::write(gate, &method, concrete, id, rest, token, payload).await
    } else {
        gate.cluster
            .own(method, &target, "application/json", payload)
            .await
    }
    .map_err(|e| ("failed", unavailable(e)))?;
    // Applied, but the lock lost by the time the answer came: the next holder may have read
    // the document before the write landed, so it is not acknowledged.
    if answer.status.is_success() && !guard.is_held() {
        return Err(("failed", lost_during_write(guard)));
    }
    if answer.status == StatusCode::CONFLICT {
        gate.state.metrics.fenced_write(guard.lock_type());
        tracing::warn!(
            token,
            "the gate's write was fenced: the document holds a newer version"
        );
    }
    let (Some((created, source)), Some(update)) = (
        created.filter(|_| answer.status.is_success()),
        asked.update.as_ref(),
    ) else {
        return Ok(dress.bytes(answer.status, answer.body.to_vec()));
    };
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let reply = updated(&answer.json(), created, &source, update);
    Ok(shape.json(dress, status, &reply))
}
