//! The stored document a guarded write reads under its lock, shared by the single-document
//! routes, `_bulk` and the writes of ids `.` and `..`.

use serde_json::Value;

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
