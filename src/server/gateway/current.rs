//! The stored document a guarded write reads under its lock, shared by the single-document
//! routes, `_bulk` and the writes of ids `.` and `..`.

use axum::http::StatusCode;
use serde_json::Value;

use super::reply::GateError;

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

/// 422 `zkguard_unreadable_document_exception`: the stored document `concrete/id`, which the
/// write depends on, cannot be read by the gate (`why`: the JSON parser's reason). Not 5xx,
/// which clients retry in vain; not 404 or 409, which would misstate what is stored.
pub fn unreadable(concrete: &str, id: &str, why: &str) -> GateError {
    GateError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "zkguard_unreadable_document_exception",
        format!(
            "zkguard: the stored document [{concrete}/{id}] cannot be read by the gate ({why}; the gate reads no lone UTF-16 surrogate escape such as \\ud800 and no nesting deeper than 128 levels), and this write depends on it (create, update, if_seq_no); nothing was written: replace the document whole (an index, which does not read it) or delete it, then send the write again"
        ),
    )
    .about(concrete, id)
}

/// 503 `zkguard_cluster_unavailable_exception`: the realtime read of `concrete/id` under the
/// lock was answered `status` with `why` (the cluster's error); nothing was written.
pub fn read_failed(
    concrete: &str,
    id: &str,
    status: StatusCode,
    why: impl std::fmt::Display,
) -> GateError {
    GateError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "zkguard_cluster_unavailable_exception",
        format!(
            "zkguard: reading {concrete}/{id} under the lock failed ({status}): {why}; nothing was written"
        ),
    )
}
