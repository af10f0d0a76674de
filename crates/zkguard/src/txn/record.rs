//! The log document of a document transaction: what recovery needs to finish or undo it.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{Action, Decision, DocResult, MultiError, MultiState, Outcome, TxnOp};
use crate::es::{Doc, DocMeta};
use crate::lock::LockType;
use crate::write::ops::{strip_meta, Stamp};

/// One document of a logged transaction: its operation's before-image, read under the lock,
/// and the lock's token its writes carry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Participant {
    /// Whether the document existed when read under the lock.
    pub found: bool,
    /// Its source then (with its `zkguard` stamp), when it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<Value>,
    /// The fencing token of the coordinator's lock on it.
    pub token: u64,
}

/// A document transaction as stored in the log index (`txn.log.index`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TxnRecord {
    /// The id (`_id`).
    pub transaction_id: String,
    /// The state.
    pub state: MultiState,
    /// The class of its locks.
    pub lock_type: LockType,
    /// The operations, as requested.
    pub operations: Vec<TxnOp>,
    /// One per operation, in the same order; empty when it was rolled back before anything was
    /// logged (an expectation failed, a lock was not acquired in time).
    pub participants: Vec<Participant>,
    /// Why it was rolled back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The document that stood in the way (`index/id`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// The monitor whose lock was not acquired in time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<String>,
    /// When it was logged (RFC 3339).
    pub created: String,
    /// When its state last changed (RFC 3339).
    pub modified: String,
    #[serde(skip)]
    pub(super) meta: DocMeta,
}

impl TxnRecord {
    /// A record of `req` in `state`, not stored yet.
    pub(super) fn new(
        req: &super::TxnRequest,
        state: MultiState,
        participants: Vec<Participant>,
    ) -> Self {
        let now = crate::txn::now_rfc3339();
        Self {
            transaction_id: req.id.clone(),
            state,
            lock_type: req.lock_type,
            operations: req.operations.clone(),
            participants,
            reason: None,
            failed: None,
            blocked_by: None,
            created: now.clone(),
            modified: now,
            meta: DocMeta {
                seq_no: -1,
                primary_term: -1,
                version: -1,
            },
        }
    }

    /// The stored source.
    pub(super) fn to_source(&self) -> Value {
        let mut v = json!({
            "state": self.state,
            "lock_type": self.lock_type.as_str(),
            "operations": self.operations,
            "participants": self.participants,
            "created": self.created,
            "modified": self.modified,
        });
        for (key, value) in [
            ("reason", &self.reason),
            ("failed", &self.failed),
            ("blocked_by", &self.blocked_by),
        ] {
            if let Some(value) = value {
                v[key] = Value::String(value.clone());
            }
        }
        v
    }

    pub(super) fn from_doc(index: &str, doc: Doc) -> Result<Self, MultiError> {
        #[derive(Deserialize)]
        struct Stored {
            state: MultiState,
            lock_type: String,
            operations: Vec<TxnOp>,
            #[serde(default)]
            participants: Vec<Participant>,
            reason: Option<String>,
            failed: Option<String>,
            blocked_by: Option<String>,
            created: String,
            modified: String,
        }
        let corrupt = |reason: String| MultiError::Corrupt {
            index: index.to_string(),
            id: doc.id.clone(),
            reason,
        };
        let s: Stored =
            serde_json::from_value(doc.source.clone()).map_err(|e| corrupt(e.to_string()))?;
        if !s.participants.is_empty() && s.participants.len() != s.operations.len() {
            return Err(corrupt(format!(
                "{} participants for {} operations",
                s.participants.len(),
                s.operations.len()
            )));
        }
        Ok(Self {
            state: s.state,
            lock_type: s.lock_type.parse().map_err(corrupt)?,
            operations: s.operations,
            participants: s.participants,
            reason: s.reason,
            failed: s.failed,
            blocked_by: s.blocked_by,
            created: s.created,
            modified: s.modified,
            meta: doc.meta,
            transaction_id: doc.id,
        })
    }

    /// Concurrency metadata of the log document this was read from or written as.
    pub fn meta(&self) -> DocMeta {
        self.meta
    }

    /// The answer a caller gets for it: committed once the log says committed or finished,
    /// rolled back once it says rolled-back; `None` while the decision is not made.
    pub fn outcome(&self) -> Option<Outcome> {
        let state = match self.state {
            MultiState::Committed | MultiState::Finished => Decision::Committed,
            MultiState::RolledBack => Decision::RolledBack,
            MultiState::Pending | MultiState::RollingBack => return None,
        };
        let documents = self
            .operations
            .iter()
            .enumerate()
            .map(|(i, op)| {
                let part = self
                    .participants
                    .get(i)
                    .filter(|_| state == Decision::Committed);
                DocResult {
                    index: op.index.clone(),
                    id: op.id.clone(),
                    action: op.action,
                    result: part.map(|p| result_name(op.action, p.found).to_string()),
                    version: part
                        .filter(|_| op.action != Action::Delete)
                        .map(|p| p.token),
                }
            })
            .collect();
        Some(Outcome {
            transaction_id: self.transaction_id.clone(),
            state,
            reason: self.reason.clone(),
            failed: self.failed.clone(),
            blocked_by: self.blocked_by.clone(),
            documents,
            replayed: false,
        })
    }

    /// When the state last changed, if `modified` parses.
    pub fn modified_at(&self) -> Option<std::time::SystemTime> {
        humantime::parse_rfc3339_weak(&self.modified).ok()
    }
}

/// Reads transaction `id` from the log index `index` (no lock needed: `zkguard txn show`).
///
/// # Errors
/// [`MultiError::Store`], [`MultiError::Corrupt`].
///
/// # Cancellation safety
/// Cancel-safe: it only reads.
pub async fn read_record(
    store: &dyn crate::es::DocStore,
    index: &str,
    id: &str,
) -> Result<Option<TxnRecord>, MultiError> {
    let doc = store.get(index, id).await.map_err(|e| MultiError::Store {
        context: format!("reading transaction `{id}`"),
        source: e,
    })?;
    doc.map(|d| TxnRecord::from_doc(index, d)).transpose()
}

/// The `_bulk`-style result name of an applied operation.
fn result_name(action: Action, found: bool) -> &'static str {
    match (action, found) {
        (Action::Delete, true) => "deleted",
        (Action::Delete, false) => "not_found",
        (_, true) => "updated",
        (_, false) => "created",
    }
}

/// Mappings of the log index: the operations and images are stored, not indexed (any documents
/// may be in them).
pub(super) fn log_mappings() -> Value {
    json!({
        "properties": {
            "state": { "type": "keyword" },
            "lock_type": { "type": "keyword" },
            "operations": { "type": "object", "enabled": false },
            "participants": { "type": "object", "enabled": false },
            "reason": { "type": "text" },
            "failed": { "type": "keyword" },
            "blocked_by": { "type": "keyword" },
            "created": { "type": "date" },
            "modified": { "type": "date" },
            "zkguard": { "type": "object", "enabled": false }
        }
    })
}

/// Whether a stored document carries the mark of transaction `id`.
pub(super) fn marked_by(source: &Value, id: &str) -> bool {
    Stamp::of(source).is_some_and(|s| s.txn.as_deref() == Some(id))
}

/// Whether `doc`, which carries a transaction's mark, is as a zkguard transaction step wrote it
/// (the coordinator's marked write, or a fencing rewrite of it by another transaction's
/// recovery): each of those writes the stamp's `token` as the document's external version. A
/// later write that copied the `zkguard` object along with the document (a client that read
/// it straight from the cluster and wrote it back, by any path) carries the version of its own
/// writer instead: its mark is not the transaction's write, and finishing or undoing the
/// transaction must not rewrite it. A document read without its version (`-1`) counts as the
/// transaction's.
pub(super) fn is_own_write(doc: &Doc) -> bool {
    super::decide::Rules::PRODUCT
        .own_write(Stamp::of(&doc.source).map(|s| s.token), doc.meta.version)
}

/// `source` without the mark of transaction `id` (anything else as it is).
pub(super) fn without_mark(source: Value, id: &str) -> Value {
    let Some(mut stamp) = Stamp::of(&source).filter(|s| s.txn.as_deref() == Some(id)) else {
        return source;
    };
    stamp.txn = None;
    crate::write::ops::with_stamp(source, &stamp)
}

/// The source of a document without zkguard's object.
pub(super) fn user_source(source: &Value) -> Value {
    strip_meta(source)
}
