//! Answers of Elasticsearch read as zkguard's types: an HTTP status and its body mapped onto
//! [`EsError`], the per-item arrays of `_bulk` and `_mget`, write metadata and documents.

use serde_json::Value;

use super::{Doc, DocMeta, EsError};

/// Maps a failed HTTP status and its body to an [`EsError`].
///
/// `index`/`id` name the document for conflicts (empty when not about one document).
/// The per-item array `key` of the answer to a request of `asked` items (`_bulk`'s `items`,
/// `_mget`'s `docs`), one entry per item in order: the status's error unless it is 2xx, a
/// protocol error when the array is missing or has another length.
pub(super) fn answer_items<'a>(
    status: u16,
    answer: &'a Value,
    key: &str,
    asked: usize,
    what: &str,
) -> Result<&'a [Value], EsError> {
    if !(200..=299).contains(&status) {
        return Err(error_for_status(status, answer, "", ""));
    }
    let items = answer
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| EsError::Protocol(format!("{what}: the answer has no {key} array")))?;
    if items.len() != asked {
        return Err(EsError::Protocol(format!(
            "{what}: the answer has {} {key} entries for {asked} asked",
            items.len()
        )));
    }
    Ok(items)
}

pub(crate) fn error_for_status(status: u16, body: &Value, index: &str, id: &str) -> EsError {
    let reason = reason_of(body);
    match status {
        409 => EsError::Conflict {
            index: index.to_string(),
            id: id.to_string(),
            reason,
        },
        404 => EsError::NotFound {
            what: if id.is_empty() {
                format!("index {index}: {reason}")
            } else {
                format!("{index}/{id}: {reason}")
            },
        },
        429 => EsError::TooManyRequests { reason },
        500..=599 => EsError::Server { status, reason },
        _ => EsError::BadRequest { status, reason },
    }
}

/// `type: reason` of an Elasticsearch error body (`{"error": {"type", "reason"}}`), or the body.
fn reason_of(body: &Value) -> String {
    let err = body.get("error").unwrap_or(body);
    match err {
        Value::String(s) => s.clone(),
        Value::Object(o) => {
            let ty = o.get("type").and_then(Value::as_str);
            let reason = o.get("reason").and_then(Value::as_str);
            let caused = o
                .get("caused_by")
                .and_then(|c| c.get("reason"))
                .and_then(Value::as_str)
                .filter(|c| Some(*c) != reason);
            let mut text = match (ty, reason) {
                (Some(t), Some(r)) => format!("{t}: {r}"),
                (Some(t), None) => t.to_string(),
                (None, Some(r)) => r.to_string(),
                (None, None) => body.to_string(),
            };
            if let Some(c) = caused {
                text.push_str(&format!(" (caused by: {c})"));
            }
            text
        }
        Value::Null => "no details in the answer".to_string(),
        other => other.to_string(),
    }
}

pub(super) fn error_type(body: &Value) -> Option<&str> {
    body.get("error")
        .and_then(|e| e.get("type"))
        .and_then(Value::as_str)
}

pub(super) fn truncate(s: &str, n: usize) -> String {
    let t = s.trim();
    match t.char_indices().nth(n) {
        Some((i, _)) => format!("{}...", &t[..i]),
        None => t.to_string(),
    }
}

fn int_field(v: &Value, key: &str) -> Option<i64> {
    v.get(key).and_then(Value::as_i64)
}

/// `_seq_no`, `_primary_term` and `_version` of a write answer or bulk item.
pub(super) fn write_meta(v: &Value, what: &str) -> Result<DocMeta, EsError> {
    match (
        int_field(v, "_seq_no"),
        int_field(v, "_primary_term"),
        int_field(v, "_version"),
    ) {
        (Some(seq_no), Some(primary_term), Some(version)) => Ok(DocMeta {
            seq_no,
            primary_term,
            version,
        }),
        _ => Err(EsError::Protocol(format!(
            "{what}: the answer lacks _seq_no/_primary_term/_version: {}",
            truncate(&v.to_string(), 200)
        ))),
    }
}

/// A document of a GET answer or a search hit; metadata the server did not send is -1.
pub(super) fn doc_of(v: &Value, what: &str) -> Result<Doc, EsError> {
    let id = v.get("_id").and_then(Value::as_str).ok_or_else(|| {
        EsError::Protocol(format!(
            "{what}: a document without _id: {}",
            truncate(&v.to_string(), 200)
        ))
    })?;
    Ok(Doc {
        id: id.to_string(),
        source: v.get("_source").cloned().unwrap_or(Value::Null),
        meta: DocMeta {
            seq_no: int_field(v, "_seq_no").unwrap_or(-1),
            primary_term: int_field(v, "_primary_term").unwrap_or(-1),
            version: int_field(v, "_version").unwrap_or(-1),
        },
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn statuses_map_to_variants() {
        let body = json!({"error": {"type": "x_exception", "reason": "because"}, "status": 0});
        assert!(matches!(
            error_for_status(409, &body, "i", "d"),
            EsError::Conflict { .. }
        ));
        assert!(matches!(
            error_for_status(404, &body, "i", "d"),
            EsError::NotFound { .. }
        ));
        assert!(matches!(
            error_for_status(429, &body, "i", "d"),
            EsError::TooManyRequests { .. }
        ));
        assert!(matches!(
            error_for_status(503, &body, "i", "d"),
            EsError::Server { status: 503, .. }
        ));
        assert!(matches!(
            error_for_status(403, &body, "i", "d"),
            EsError::BadRequest { status: 403, .. }
        ));
        let e = error_for_status(400, &body, "i", "d").to_string();
        assert!(e.contains("x_exception: because"), "{e}");
    }

    #[test]
    fn reason_includes_cause_and_survives_odd_bodies() {
        let body = json!({"error": {"type": "mapper_parsing_exception", "reason": "bad", "caused_by": {"reason": "deep"}}});
        assert_eq!(
            reason_of(&body),
            "mapper_parsing_exception: bad (caused by: deep)"
        );
        assert_eq!(reason_of(&json!({"error": "plain"})), "plain");
        assert_eq!(reason_of(&Value::Null), "no details in the answer");
    }
}
