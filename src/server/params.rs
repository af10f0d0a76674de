//! The request parts every write route checks the same way: query parameters, index names,
//! document ids, monitors, paths and bodies; each refusal names what was wrong and what to do.

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::http::StatusCode;
use serde_json::Value;
use uuid::Uuid;
use zkguard::lock::validate_monitor;
use zkguard::write::ops::DeleteMode;
use zkguard::LockType;

use super::errors::ApiError;

/// Info recorded in the lock nodes of the service's writes.
pub(super) const INFO: &str = "zkguard serve";

/// The monitor of a document's writes when no `monitor` is given: `{index}:{id}`, escaped when
/// the id holds what a node name cannot ([`zkguard::lock::document_monitor`]). Explicit locks
/// taken on a document (`POST /v1/locks?index=&id=`) use the same, so they guard its writes.
pub(super) fn document_monitor(index: &str, id: &str) -> String {
    zkguard::lock::document_monitor(index, id)
}

/// Which document route is asked: each takes the common parameters and its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WriteRoute {
    /// `PUT`: a whole document.
    Put,
    /// `PATCH`: a JSON merge patch; `upsert` too.
    Patch,
    /// `DELETE`: `mode` too.
    Delete,
}

/// The query parameters of a document write.
pub(super) struct WriteParams {
    pub(super) monitor: Option<String>,
    pub(super) lock_type: LockType,
    pub(super) timeout: Option<Duration>,
    /// The caller's idempotency key (checked by [`parse_op_id`]).
    pub(super) op_id: Option<String>,
    /// An explicit lock of the caller's to write under (its token, no wait of its own).
    pub(super) lock_id: Option<Uuid>,
    pub(super) mode: Option<DeleteMode>,
    /// For a merge patch: create a missing document from `{}`.
    pub(super) upsert: bool,
}

/// The query parameters of a document write, with the `Idempotency-Key` header of `headers`
/// (the same as `op_id`; both given, they must agree).
pub(super) fn parse_params(
    raw: Option<String>,
    headers: &axum::http::HeaderMap,
    route: WriteRoute,
    max_timeout: Duration,
) -> Result<WriteParams, ApiError> {
    let mut p = WriteParams {
        monitor: None,
        lock_type: LockType::Foreground,
        timeout: None,
        op_id: None,
        lock_id: None,
        mode: None,
        upsert: false,
    };
    let raw = raw.unwrap_or_default();
    refuse_repeated(&raw)?;
    for (key, value) in url::form_urlencoded::parse(raw.as_bytes()) {
        match key.as_ref() {
            "monitor" => p.monitor = Some(value.into_owned()),
            "type" => {
                p.lock_type = value
                    .parse()
                    .map_err(|e: String| ApiError::bad("bad_parameter", format!("type: {e}")))?
            }
            "timeout" => {
                let t = zkguard::config::parse_bounded_duration(&value).map_err(|e| {
                    ApiError::bad("bad_parameter", format!("timeout `{value}`: {e}"))
                })?;
                if t > max_timeout {
                    return Err(ApiError::bad(
                        "bad_parameter",
                        format!(
                            "timeout `{value}` is longer than server.request.timeout ({}ms); ask for less",
                            max_timeout.as_millis()
                        ),
                    ));
                }
                p.timeout = Some(t);
            }
            "op_id" => p.op_id = Some(parse_op_id(&value)?),
            "lock_id" => p.lock_id = Some(lock_id(&value)?),
            "upsert" if route == WriteRoute::Patch => {
                p.upsert = match value.as_ref() {
                    "true" => true,
                    "false" => false,
                    other => {
                        return Err(ApiError::bad(
                            "bad_parameter",
                            format!("upsert `{other}`: use true (create a missing document from the patch) or false"),
                        ))
                    }
                }
            }
            "mode" if route == WriteRoute::Delete => {
                p.mode = Some(match value.as_ref() {
                    "hard" => DeleteMode::Hard,
                    "tombstone" => DeleteMode::Tombstone,
                    other => {
                        return Err(ApiError::bad(
                            "bad_parameter",
                            format!("mode `{other}`: use hard or tombstone"),
                        ))
                    }
                })
            }
            other => {
                let known = match route {
                    WriteRoute::Put => "monitor, type, timeout, op_id, lock_id",
                    WriteRoute::Patch => "monitor, type, timeout, op_id, lock_id, upsert",
                    WriteRoute::Delete => "monitor, type, timeout, op_id, lock_id, mode",
                };
                return Err(ApiError::bad(
                    "bad_parameter",
                    format!("unknown query parameter `{other}`; the known ones are {known}"),
                ));
            }
        }
    }
    p.op_id = idempotency_key(headers, p.op_id.take())?;
    if p.lock_id.is_some() && p.lock_type == LockType::Background {
        return Err(ApiError::bad(
            "bad_parameter",
            "a write with lock_id is made at once under your explicit lock, with its token, while type=background queues a write for later, when the lock may be gone: leave type out (or drop lock_id to have the service take the lock)",
        ));
    }
    Ok(p)
}

/// Refuses a query that gives a parameter twice (`type=foreground&type=background`): which one
/// was meant is not for the service to guess.
pub(super) fn refuse_repeated(raw: &str) -> Result<(), ApiError> {
    let mut seen = std::collections::HashSet::new();
    for (key, _) in url::form_urlencoded::parse(raw.as_bytes()) {
        if !seen.insert(key.clone()) {
            return Err(ApiError::bad(
                "bad_parameter",
                format!("query parameter `{key}` is given twice; give it once"),
            ));
        }
    }
    Ok(())
}

/// The longest idempotency key taken, in bytes.
pub(super) const MAX_KEY: usize = 200;

/// Checks an operation's idempotency key (`op_id`, `Idempotency-Key`): any printable text of 1
/// to 200 bytes; a UUID is the operation's id itself, anything else names the id derived from
/// it ([`zkguard::write::ops::Operation::key_id`]).
pub(super) fn parse_op_id(text: &str) -> Result<String, ApiError> {
    let bad = |why: &str| {
        Err(ApiError::bad(
            "bad_parameter",
            format!("op_id `{}` {why}; use printable text of 1 to {MAX_KEY} bytes (\"order-42-save-3\", a request id, a UUID), or leave it out to have one generated", text.escape_debug()),
        ))
    };
    if text.is_empty() {
        return bad("is empty");
    }
    if text.len() > MAX_KEY {
        return bad(&format!("is {} bytes long", text.len()));
    }
    if text.chars().any(char::is_control) {
        return bad("holds a control character");
    }
    if text.trim() != text {
        return bad("starts or ends with white space");
    }
    Ok(text.to_string())
}

/// The idempotency key of a write: `op_id`, or the `Idempotency-Key` header (the convention of
/// payment and cloud APIs); both given, they must agree.
pub(super) fn idempotency_key(
    headers: &axum::http::HeaderMap,
    op_id: Option<String>,
) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(op_id);
    };
    let header = value.to_str().map_err(|_| {
        ApiError::bad(
            "bad_parameter",
            "the Idempotency-Key header is not visible ASCII text; send printable ASCII, or the key as ?op_id= (percent-encoded)",
        )
    })?;
    let header = parse_op_id(header)
        .map_err(|e| ApiError::bad(e.error, e.message.replacen("op_id", "Idempotency-Key", 1)))?;
    match op_id {
        Some(q) if q != header => Err(ApiError::bad(
            "bad_parameter",
            format!("op_id `{q}` and the Idempotency-Key header `{header}` differ: name the operation once (either one)"),
        )),
        _ => Ok(Some(header)),
    }
}

/// Checks an index name as Elasticsearch would, so that a bad name is the caller's 400.
pub(super) fn check_index(index: &str) -> Result<(), ApiError> {
    let bad = |why: &str| {
        Err(ApiError::bad(
            "bad_index",
            format!("index name `{index}` {why}"),
        ))
    };
    if index.is_empty() || index.len() > 255 {
        return bad("must be 1 to 255 bytes long");
    }
    if index == "." || index == ".." || index.starts_with(['-', '_', '+']) {
        return bad("must not be `.` or `..` nor start with -, _ or +");
    }
    if index.chars().any(|c| c.is_uppercase()) {
        return bad("must be lowercase");
    }
    if let Some(c) = index
        .chars()
        .find(|c| "\\/*?\"<>| ,#:".contains(*c) || c.is_control())
    {
        return bad(&format!("must not contain {c:?}"));
    }
    Ok(())
}

pub(super) fn check_doc_id(id: &str) -> Result<(), ApiError> {
    if id.is_empty() || id.len() > 512 {
        return Err(ApiError::bad(
            "bad_id",
            "document ids must be 1 to 512 bytes long",
        ));
    }
    if id == "." || id == ".." {
        return Err(dot_id(id));
    }
    Ok(())
}

/// The refusal of a document id `.` or `..`: Elasticsearch cannot address such a document by
/// URL (HTTP stacks remove those path segments), so neither path takes it.
pub(super) fn dot_id(id: &str) -> ApiError {
    ApiError::bad(
        "bad_id",
        format!("document id `{id}` cannot be written: document ids cannot be empty, `.` or `..` (URLs cannot carry them as path segments); choose another id"),
    )
}

pub(super) fn check_monitor(monitor: &str) -> Result<(), ApiError> {
    validate_monitor(monitor).map_err(|e| {
        ApiError::bad(
            "bad_monitor",
            format!("{e}; pass another ?monitor=, or leave it out to lock the document's own monitor ({{index}}:{{id}}, escaped)"),
        )
    })
}

pub(super) fn path_error(e: PathRejection) -> ApiError {
    ApiError::bad("bad_path", format!("cannot read the path: {e}"))
}

pub(super) fn body_error(e: BytesRejection, max: usize) -> ApiError {
    body_refusal(e.status() == StatusCode::PAYLOAD_TOO_LARGE, &e, max)
}

/// The answer to a body that could not be read: larger than `server.max.body` (`max`), or
/// failed with `e`.
pub(super) fn body_refusal(too_large: bool, e: &dyn std::fmt::Display, max: usize) -> ApiError {
    if too_large {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("the request body is larger than server.max.body ({max} bytes); send a smaller document or split the bulk request"),
        )
    } else {
        ApiError::bad("bad_body", format!("cannot read the request body: {e}"))
    }
}

pub(super) fn parse_json(bytes: &[u8], what: &str) -> Result<Value, ApiError> {
    serde_json::from_slice::<Value>(bytes).map_err(|e| {
        ApiError::bad(
            "malformed_json",
            format!("{what} is not valid JSON ({e}); send the document's JSON source"),
        )
    })
}

pub(super) fn lock_id(text: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(text).map_err(|_| {
        ApiError::bad(
            "bad_lock_id",
            format!("lock id `{text}` is not a UUID; use the lock_id that POST /v1/locks/{{monitor}} returned"),
        )
    })
}

/// The answer to a lock id that names no lock held here.
pub(super) fn unknown_lock(monitor: &str, id: &Uuid) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_lock",
        format!("no lock {id} on `{monitor}` is held here: it was released, its lease lapsed, or the lock backend lost it; take the lock again (and do not write with its old token)"),
    )
}

/// Counts a request as waiting while it lives (a caller gone drops it with the request).
pub struct Waiting<'a>(&'a super::metrics::Metrics);

impl<'a> Waiting<'a> {
    pub fn new(metrics: &'a super::metrics::Metrics) -> Self {
        metrics.waiters.inc();
        Self(metrics)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiters.dec();
    }
}

/// The `wait` parameter of a blocking `GET` (a duration within the request's limit), and the
/// values of the `other` parameters it also takes; any other parameter is refused, naming
/// `route`.
pub fn wait_param(
    state: &super::state::AppState,
    query: Option<&str>,
    other: &[&str],
    route: &str,
) -> Result<(Option<Duration>, HashMap<String, String>), ApiError> {
    let params = url::form_urlencoded::parse(query.unwrap_or_default().as_bytes());
    let mut wait = None;
    let mut rest = HashMap::new();
    for (key, value) in params {
        match key.as_ref() {
            "wait" => {
                let t = zkguard::config::parse_bounded_duration(&value)
                    .map_err(|e| ApiError::bad("bad_parameter", format!("wait `{value}`: {e}")))?;
                let max = super::state::lock_wait_cap(state.settings.request_timeout);
                if t > max {
                    return Err(ApiError::bad(
                        "bad_parameter",
                        format!(
                            "wait `{value}` is longer than the service waits ({}ms, within server.request.timeout); ask for less and ask again",
                            max.as_millis()
                        ),
                    ));
                }
                wait = Some(t);
            }
            k if other.contains(&k) => {
                rest.insert(k.to_string(), value.into_owned());
            }
            k => {
                let mut takes = vec!["wait"];
                takes.extend_from_slice(other);
                return Err(ApiError::bad(
                    "bad_parameter",
                    format!(
                        "unknown parameter `{k}` of {route}; it takes {}",
                        takes.join(", ")
                    ),
                ));
            }
        }
    }
    Ok((wait, rest))
}
