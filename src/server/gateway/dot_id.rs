//! Document ids `.` and `..` on the single-document routes (`PUT /idx/_doc/.`).
//!
//! Elasticsearch takes them there (its HTTP layer does not normalise paths), but the gate's
//! HTTP client does: `/idx/_doc/..` would reach the cluster as `/idx/` (`%2e` forms too). So a
//! guarded single-document write of such an id reads the document with a one-document `_mget`
//! and writes it with a one-item `_bulk`, whose answer is given back in the single-document
//! shape (status and body as the document route answers them).

use axum::http::{Method, StatusCode};
use serde_json::{json, Map, Value};

use super::backend::Answer;
use super::current::Current;
use super::current::{read_failed, unreadable};
use super::gate::{encode, unavailable, Gateway};
use super::reply::GateError;

/// Whether `id` (decoded) is one a path cannot carry through the gate's HTTP client.
pub fn is_dot(id: &str) -> bool {
    id == "." || id == ".."
}

/// The realtime read of `concrete/id` under the lock, as a one-document `_mget`.
///
/// # Errors
/// 422 ([`unreadable`]) when the stored document cannot be parsed; 503 when the cluster
/// cannot be reached or refuses the read.
pub(super) async fn read(
    gate: &Gateway,
    concrete: &str,
    id: &str,
    rest: &[(String, String)],
) -> Result<Option<Current>, GateError> {
    let mut doc = json!({ "_id": id });
    if let Some((_, r)) = rest.iter().find(|(k, _)| k == "routing") {
        doc["routing"] = json!(r);
    }
    let body = serde_json::to_vec(&json!({ "docs": [doc] })).unwrap_or_default();
    let path = format!("/{}/_mget?realtime=true", encode(concrete));
    let answer = gate
        .cluster
        .own(Method::POST, &path, "application/json", Some(body))
        .await
        .map_err(unavailable)?;
    // A stored document the gate cannot parse makes the whole answer unreadable: refused as
    // on every other id ([`unreadable`]), never taken for a failing cluster.
    let parsed: Value = match serde_json::from_slice(&answer.body) {
        Err(e) if answer.status.is_success() => {
            return Err(unreadable(concrete, id, &e.to_string()))
        }
        parsed => parsed.unwrap_or(Value::Null),
    };
    let found = parsed["docs"][0].clone();
    if !answer.status.is_success() || found.get("error").is_some() || found.is_null() {
        let why = found.get("error").cloned().unwrap_or_else(|| answer.json());
        return Err(read_failed(concrete, id, answer.status, why));
    }
    Ok(Current::of(&found))
}

/// The fenced write of `concrete/id` (`PUT` with `payload`, or `DELETE`) with `token`, as a
/// one-item `_bulk`; answered as the document route answers (status and body).
///
/// # Errors
/// The cluster cannot be reached (the caller answers 503).
pub(super) async fn write(
    gate: &Gateway,
    method: &Method,
    concrete: &str,
    id: &str,
    rest: &[(String, String)],
    token: u64,
    payload: Option<Vec<u8>>,
) -> Result<Answer, String> {
    let action = if *method == Method::DELETE {
        "delete"
    } else {
        "index"
    };
    let fence = zkguard::write::fence::params(token).map_err(|e| e.to_string())?;
    let (meta, path) = bulk_meta(action, concrete, id, rest, fence);
    let mut body = serde_json::to_vec(&json!({ action: meta })).unwrap_or_default();
    body.push(b'\n');
    if let Some(source) = payload {
        // A raw line break in valid JSON is whitespace: a space keeps it one NDJSON line.
        body.extend(source.into_iter().map(|b| match b {
            b'\n' | b'\r' => b' ',
            b => b,
        }));
        body.push(b'\n');
    }
    let answer = gate
        .cluster
        .own(Method::POST, &path, "application/x-ndjson", Some(body))
        .await?;
    if !answer.status.is_success() {
        return Ok(answer);
    }
    let item = answer.json()["items"][0][action].clone();
    let Value::Object(mut item) = item else {
        return Ok(answer);
    };
    Ok(single_shape(&mut item))
}

/// The `_bulk` action's metadata (the `fence` of the lock's token, the routing and pipeline
/// asked for) and the `_bulk` path with the other parameters asked for.
fn bulk_meta(
    action: &str,
    concrete: &str,
    id: &str,
    rest: &[(String, String)],
    fence: Map<String, Value>,
) -> (Value, String) {
    let mut meta = json!({"_index": concrete, "_id": id});
    meta.as_object_mut().expect("an object").extend(fence);
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in rest {
        match k.as_str() {
            "routing" => meta["routing"] = json!(v),
            "pipeline" if action == "index" => meta["pipeline"] = json!(v),
            // The answer is reshaped: options of its rendering are not forwarded.
            "pretty" | "filter_path" | "pipeline" => {}
            _ => {
                q.append_pair(k, v);
            }
        }
    }
    (meta, format!("/_bulk?{}", q.finish()))
}

/// A `_bulk` item as the document route answers it: its status, and its body without the
/// item's `status` (an error as `{"error": {...}, "status": N}`).
fn single_shape(item: &mut Map<String, Value>) -> Answer {
    let code = item
        .remove("status")
        .and_then(|s| s.as_u64())
        .and_then(|s| u16::try_from(s).ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = match item.remove("error") {
        Some(Value::Object(mut error)) => {
            let cause = Value::Object(error.clone());
            error.insert("root_cause".into(), json!([cause]));
            json!({ "error": error, "status": code.as_u16() })
        }
        Some(other) => json!({ "error": other, "status": code.as_u16() }),
        None => Value::Object(std::mem::take(item)),
    };
    Answer {
        status: code,
        body: serde_json::to_vec(&body).unwrap_or_default().into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_items_are_answered_in_the_document_shape() {
        let mut ok = json!({"_index": "a", "_id": ".", "_version": 7, "result": "created",
            "_seq_no": 0, "_primary_term": 1, "status": 201})
        .as_object()
        .unwrap()
        .clone();
        let a = single_shape(&mut ok);
        assert_eq!(a.status, StatusCode::CREATED);
        assert_eq!(a.json()["_id"], ".");
        assert!(a.json().get("status").is_none());
        let mut err = json!({"_index": "a", "_id": "..", "status": 409,
            "error": {"type": "version_conflict_engine_exception", "reason": "r"}})
        .as_object()
        .unwrap()
        .clone();
        let a = single_shape(&mut err);
        assert_eq!(a.status, StatusCode::CONFLICT);
        assert_eq!(a.json()["status"], 409);
        assert_eq!(
            a.json()["error"]["root_cause"][0]["type"],
            "version_conflict_engine_exception"
        );
        assert!(is_dot(".") && is_dot("..") && !is_dot("...") && !is_dot(".a"));
    }
}
