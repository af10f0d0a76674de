//! The documents of the lock index: one lock document and one waiters document per monitor.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::es::DocMeta;
use crate::lock::LockType;

/// `kind` of a lock document.
pub(crate) const KIND_LOCK: &str = "lock";
/// `kind` of a waiters document.
pub(crate) const KIND_WAITERS: &str = "waiters";

/// The id of the waiters document of `monitor`: `<monitor>/waiters`. Monitor names never contain
/// `/` (see [`crate::lock::validate_monitor`]), so it cannot collide with a lock document.
pub(crate) fn waiters_id(monitor: &str) -> String {
    format!("{monitor}/waiters")
}

/// Whether a lock document is held or free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LockState {
    /// Held by `owner` until `expires` (judged with the clock-skew margin).
    Held,
    /// Released; the next contender takes it without waiting.
    Free,
}

/// The source of a lock document (`_id` = monitor) in `elasticsearch.lock.index`.
///
/// Times are milliseconds since the Unix epoch, read from the writer's clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LockRecord {
    /// Always `"lock"`.
    pub kind: String,
    /// The monitor object (same as the document id).
    pub monitor: String,
    /// Held or free.
    pub state: LockState,
    /// The current owner; once free, the last owner.
    pub owner: String,
    /// What the owner does ("Save Content").
    pub info: String,
    /// The owner's lock type.
    pub lock_type: LockType,
    /// The fencing token of the current (or last) acquisition. Strictly increasing per monitor.
    pub token: u64,
    /// When the current owner acquired the lock (owner's clock).
    pub acquired: i64,
    /// When the lease ends (owner's clock): written as `now + ttl` at every acquisition and renewal.
    pub expires: i64,
    /// When the lease was last written (acquisition or renewal).
    pub renewed: i64,
    /// When it was released, if free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<i64>,
    /// The host of the owner.
    #[serde(default)]
    pub host: String,
    /// The process id of the owner.
    #[serde(default)]
    pub pid: u32,
}

impl LockRecord {
    /// Whether a contender whose clock reads `now_ms` may consider the lease over: free, or
    /// `now > expires + skew`.
    pub fn is_takeable(&self, now_ms: i64, skew_ms: i64) -> bool {
        self.state == LockState::Free || now_ms > self.expires.saturating_add(skew_ms)
    }

    pub(crate) fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("a lock record serializes")
    }
}

/// A lock document as read, with its concurrency metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EsLockStatus {
    /// The document source.
    pub record: LockRecord,
    /// `_seq_no`, `_primary_term`, `_version`.
    pub meta: DocMeta,
    /// Whether the lease counts as over for the service that read it (free, or expired by more
    /// than the clock skew on its clock).
    pub takeable: bool,
}

/// One registered foreground waiter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WaiterRecord {
    /// Unique id of this registration.
    pub id: String,
    /// The waiting contender's owner id.
    pub owner: String,
    /// What it wants to do.
    pub info: String,
    /// When it registered (its clock, ms since the epoch).
    pub registered: i64,
    /// When the registration lapses unless refreshed (its clock).
    pub expires: i64,
}

impl WaiterRecord {
    /// Whether a reader whose clock reads `now_ms` must still honour it: `now <= expires + skew`.
    pub fn is_live(&self, now_ms: i64, skew_ms: i64) -> bool {
        now_ms <= self.expires.saturating_add(skew_ms)
    }
}

/// The source of a waiters document (`_id` = `<monitor>/waiters`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WaitersDoc {
    pub kind: String,
    pub monitor: String,
    #[serde(default)]
    pub waiters: Vec<WaiterRecord>,
}

impl WaitersDoc {
    pub(crate) fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("a waiters document serializes")
    }
}

/// The explicit mappings of the lock index. `dynamic: false` keeps unknown fields out of the
/// mapping; the waiter list is stored, not indexed.
pub(crate) fn mappings() -> Value {
    let date = json!({ "type": "date", "format": "epoch_millis" });
    json!({
        "dynamic": false,
        "properties": {
            "kind": { "type": "keyword" },
            "monitor": { "type": "keyword" },
            "state": { "type": "keyword" },
            "owner": { "type": "keyword" },
            "info": { "type": "keyword", "ignore_above": 1024 },
            "lock_type": { "type": "keyword" },
            "token": { "type": "long" },
            "acquired": date,
            "expires": date,
            "renewed": date,
            "released": date,
            "host": { "type": "keyword" },
            "pid": { "type": "long" },
            "waiters": { "type": "object", "enabled": false }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takeable_only_past_expiry_plus_skew() {
        let rec = LockRecord {
            kind: KIND_LOCK.into(),
            monitor: "m".into(),
            state: LockState::Held,
            owner: "o".into(),
            info: String::new(),
            lock_type: LockType::Foreground,
            token: 1,
            acquired: 0,
            expires: 1_000,
            renewed: 0,
            released: None,
            host: String::new(),
            pid: 0,
        };
        assert!(!rec.is_takeable(1_000, 100));
        assert!(!rec.is_takeable(1_100, 100));
        assert!(rec.is_takeable(1_101, 100));
        let free = LockRecord {
            state: LockState::Free,
            ..rec
        };
        assert!(free.is_takeable(0, 100));
    }

    #[test]
    fn waiter_live_until_expiry_plus_skew() {
        let w = WaiterRecord {
            id: "w".into(),
            owner: "o".into(),
            info: String::new(),
            registered: 0,
            expires: 500,
        };
        assert!(w.is_live(600, 100));
        assert!(!w.is_live(601, 100));
    }
}
