//! Document transactions: several document writes, in any indices, applied all-or-nothing.
//!
//! A [`TxnRequest`] lists operations ([`TxnOp`]: `index` a whole source, `update` with a
//! partial document merged as Elasticsearch merges it, `delete`), each with an optional
//! [`Expect`]ation (the document exists, does not exist, or is at a given
//! `_seq_no`/`_primary_term`). [`Transactions::apply`] takes the participants' locks in one
//! canonical order, reads them, checks the expectations, logs the transaction (before- and
//! after-images) in the log index (`txn.log.index`), writes every document fenced with its
//! lock's token and marked with the transaction id, marks the log `committed`, then clears the
//! marks and releases the locks. Recovery ([`Transactions::recover_once`]; `zkguard txn recover`
//! and the service run it) finishes a committed transaction and undoes an uncommitted one, under
//! fresh locks, so that every document ends wholly in its before or its after state.
//! `docs/transactions.md` gives the protocol and its argument.
//!
//! ```no_run
//! # async fn demo(
//! #     locks: std::sync::Arc<dyn zkguard::LockService>,
//! #     store: std::sync::Arc<dyn zkguard::es::DocStore>,
//! # ) -> Result<(), zkguard::txn::multi::MultiError> {
//! use serde_json::json;
//! use zkguard::config::Settings;
//! use zkguard::txn::multi::{Expect, Transactions, TxnOp, TxnRequest};
//!
//! let txns = Transactions::new(locks, store, Settings::default().txn);
//! let outcome = txns
//!     .apply(TxnRequest::new(vec![
//!         TxnOp::index("products", "p1", json!({"name": "Lamp", "variants": 2})),
//!         TxnOp::update("counters", "lighting", json!({"products": 41})).expect(Expect::Exists),
//!         TxnOp::delete("drafts", "p1"),
//!     ]))
//!     .await?;
//! println!("{}: {:?}", outcome.transaction_id, outcome.state);
//! # Ok(()) }
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::es::EsError;
use crate::lock::{LockError, LockType};

pub mod decide;
mod engine;
mod plan;
mod record;
mod recover;
mod resolve;

pub use engine::Transactions;
pub use plan::parse_ndjson;
pub use record::{read_record, Participant, TxnRecord};
pub use recover::MultiRecovery;

// The account-transfer recipe (`crate::transfer`), at the paths it had in this module.
pub(crate) use crate::transfer::now_rfc3339;
pub use crate::transfer::{
    Account, Audit, Coordinator, HookAction, HookPoint, RecoveryReport, Rejection, RetryPolicy,
    Step, StepHook, Transaction, TransferRequest, TxnError, TxnState, AUDIT_LIMIT, MAX_ID_LEN,
};

/// Document transactions at their former path, `zkguard::txn::multi`: the same items as
/// [`crate::txn`].
#[doc(hidden)]
pub mod multi {
    pub use super::*;
}

/// What an operation of a transaction does to its document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Create or replace the whole document with `doc`.
    Index,
    /// Merge the partial document `doc` into the stored one, as Elasticsearch's `_update` does.
    Update,
    /// Delete the document.
    Delete,
}

impl Action {
    /// `index`, `update` or `delete`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Index => "index",
            Self::Update => "update",
            Self::Delete => "delete",
        }
    }
}

/// What must hold of a document, read under its lock, for the transaction to go ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Expect {
    /// `{"if_seq_no": N, "if_primary_term": M}`: the document exists and is at this version.
    Version {
        /// Expected `_seq_no`.
        if_seq_no: i64,
        /// Expected `_primary_term`.
        if_primary_term: i64,
    },
    /// `{"exists": true}` or `{"exists": false}`.
    Presence {
        /// Whether the document must exist (`true`) or must not (`false`).
        exists: bool,
    },
}

impl Expect {
    /// The document must exist.
    #[allow(non_upper_case_globals)]
    pub const Exists: Expect = Expect::Presence { exists: true };
    /// The document must not exist.
    #[allow(non_upper_case_globals)]
    pub const Absent: Expect = Expect::Presence { exists: false };
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Presence { exists: true } => f.write_str("the document exists"),
            Self::Presence { exists: false } => f.write_str("the document does not exist"),
            Self::Version {
                if_seq_no,
                if_primary_term,
            } => write!(
                f,
                "the document is at _seq_no {if_seq_no} and _primary_term {if_primary_term}"
            ),
        }
    }
}

/// One operation of a transaction, in the shape of a `/v1/bulk` line:
/// `{"action", "index", "id", "doc"?, "monitor"?, "expect"?}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[must_use]
pub struct TxnOp {
    /// What to do.
    pub action: Action,
    /// The document's index.
    pub index: String,
    /// The document's id.
    pub id: String,
    /// The whole source (`index`) or the partial document (`update`); absent for `delete`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doc: Option<Value>,
    /// Whether an `update` of a missing document creates it from `doc` (as `doc_as_upsert`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub upsert: bool,
    /// The lock's monitor object (default: the document's, `index/id` as
    /// [`crate::lock::document_monitor`] names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitor: Option<String>,
    /// A condition on the document, checked under its lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<Expect>,
}

impl TxnOp {
    fn new(action: Action, index: &str, id: &str, doc: Option<Value>) -> Self {
        Self {
            action,
            index: index.to_string(),
            id: id.to_string(),
            doc,
            upsert: false,
            monitor: None,
            expect: None,
        }
    }

    /// Creates or replaces `index/id` with `doc`.
    pub fn index(index: &str, id: &str, doc: Value) -> Self {
        Self::new(Action::Index, index, id, Some(doc))
    }

    /// Merges the partial document `doc` into `index/id` (which must exist unless
    /// [`TxnOp::upsert`]).
    pub fn update(index: &str, id: &str, doc: Value) -> Self {
        Self::new(Action::Update, index, id, Some(doc))
    }

    /// Deletes `index/id`.
    pub fn delete(index: &str, id: &str) -> Self {
        Self::new(Action::Delete, index, id, None)
    }

    /// Sets the condition checked under the lock.
    pub fn expect(mut self, expect: Expect) -> Self {
        self.expect = Some(expect);
        self
    }

    /// An `update` of a missing document creates it from the partial document.
    pub fn upsert(mut self) -> Self {
        self.upsert = true;
        self
    }

    /// Locks `monitor` instead of the document's own monitor.
    pub fn on_monitor(mut self, monitor: impl Into<String>) -> Self {
        self.monitor = Some(monitor.into());
        self
    }

    /// The lock's monitor object.
    pub fn monitor_name(&self) -> String {
        self.monitor
            .clone()
            .unwrap_or_else(|| crate::lock::document_monitor(&self.index, &self.id))
    }
}

/// A transaction to apply.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct TxnRequest {
    /// The transaction id: a random UUID unless set with [`TxnRequest::with_id`]. Applying the
    /// same id with the same operations again answers the stored outcome; with other operations
    /// it is refused.
    pub id: String,
    /// Foreground (someone waits) or background: the class of every lock it takes.
    pub lock_type: LockType,
    /// The operations, at most one per document.
    pub operations: Vec<TxnOp>,
    /// How long to wait for all the locks together (default: that of the [`Transactions`]).
    pub lock_timeout: Option<std::time::Duration>,
}

impl TxnRequest {
    /// A foreground transaction of `operations` with a fresh random id.
    pub fn new(operations: Vec<TxnOp>) -> Self {
        Self {
            id: uuid::Uuid::new_v4().to_string(),
            lock_type: LockType::Foreground,
            operations,
            lock_timeout: None,
        }
    }

    /// Sets the id (an application's own, so that a retry finds the first attempt).
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    /// Sets the lock type.
    pub fn with_type(mut self, lock_type: LockType) -> Self {
        self.lock_type = lock_type;
        self
    }

    /// Waits at most `timeout` for all the locks together; a transaction whose locks are not
    /// all acquired in time is rolled back (nothing written), naming the monitor in the way.
    pub fn with_lock_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.lock_timeout = Some(timeout);
        self
    }
}

/// The state of a transaction in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MultiState {
    /// Logged; documents being written. Recovery undoes it.
    Pending,
    /// Every document written: decided, never undone. The marks are being cleared.
    Committed,
    /// Done: every document in its after state (final).
    Finished,
    /// Being undone: documents going back to their before state.
    RollingBack,
    /// Undone, or refused before any write (final); `reason` says why.
    RolledBack,
}

impl MultiState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Committed => "committed",
            Self::Finished => "finished",
            Self::RollingBack => "rolling-back",
            Self::RolledBack => "rolled-back",
        }
    }

    /// Whether nothing follows.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Finished | Self::RolledBack)
    }
}

impl fmt::Display for MultiState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The decision a caller gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decision {
    /// Every operation applied.
    Committed,
    /// None applied; `reason` says why.
    RolledBack,
}

/// One document's part of an [`Outcome`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DocResult {
    /// Index.
    pub index: String,
    /// Id.
    pub id: String,
    /// The operation's action.
    pub action: Action,
    /// `created`, `updated`, `deleted`, `not_found` (a delete of a missing document) when
    /// committed; absent when rolled back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The document's `_version` after the transaction (its lock's fencing token), when
    /// committed and not deleted.
    #[serde(rename = "_version", skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
}

/// What became of a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// The id.
    pub transaction_id: String,
    /// Committed or rolled back.
    pub state: Decision,
    /// Why it was rolled back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The document whose expectation failed or whose lock could not be taken, as `index/id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// The monitor that stood in the way when a lock was not acquired in time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<String>,
    /// Every document, in the order of the request.
    pub documents: Vec<DocResult>,
    /// Whether this is the stored decision of an earlier request with the same id (nothing was
    /// done this time).
    #[serde(skip)]
    pub replayed: bool,
}

/// Errors of document transactions. A rolled-back transaction is not an error: it is an
/// [`Outcome`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MultiError {
    /// The request is malformed; nothing was locked or written.
    #[error("invalid transaction: {0}")]
    Invalid(String),
    /// More operations or bytes than the settings allow; nothing was locked or written.
    #[error("the transaction has {actual} {what}, more than the {limit} {key} allows; split it or raise {key}")]
    TooLarge {
        /// `operations` or `bytes of documents`.
        what: &'static str,
        /// The setting.
        key: &'static str,
        /// The size.
        actual: u64,
        /// The limit.
        limit: u64,
    },
    /// The id names a transaction with other operations.
    #[error("transaction id `{id}` is already used by a transaction with other operations; use a new id")]
    IdConflict {
        /// The id.
        id: String,
    },
    /// The id names a transaction that is still running (or left for recovery).
    #[error("transaction `{id}` is {state}: another coordinator is running it, or recovery will finish it; ask again later")]
    InProgress {
        /// The id.
        id: String,
        /// Its state.
        state: MultiState,
    },
    /// No transaction with this id.
    #[error("no transaction `{id}` in index `{index}`")]
    NotFound {
        /// The id.
        id: String,
        /// The log index.
        index: String,
    },
    /// A lock could not be taken for another reason than a timeout (connection, session).
    #[error("cannot lock `{monitor}`: {source}")]
    Lock {
        /// The monitor.
        monitor: String,
        /// The error.
        #[source]
        source: LockError,
    },
    /// The coordinator lost a lock (or the log changed under it) after the transaction was
    /// logged: it stopped writing, and recovery finishes or undoes the transaction.
    #[error("transaction `{id}` stopped: {reason}; recovery (zkguard txn recover, or the service) finishes or undoes it")]
    Fenced {
        /// The id.
        id: String,
        /// What happened.
        reason: String,
    },
    /// A hook stopped the coordinator (injected crash, for tests).
    #[error(
        "work on transaction `{id}` stopped after {point} (injected crash); recovery resumes it"
    )]
    Interrupted {
        /// The id.
        id: String,
        /// Where.
        point: String,
    },
    /// Elasticsearch failed. A logged transaction is left for recovery.
    #[error("Elasticsearch failed while {context}: {source}")]
    Store {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: EsError,
    },
    /// A log document is not what zkguard wrote.
    #[error("transaction log document `{index}/{id}` is malformed: {reason}")]
    Corrupt {
        /// The log index.
        index: String,
        /// The id.
        id: String,
        /// What is wrong.
        reason: String,
    },
}

impl MultiError {
    /// Whether the request itself was wrong (fix it rather than retry).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            Self::Invalid(_) | Self::TooLarge { .. } | Self::IdConflict { .. }
        )
    }

    /// A short machine-readable kind (`invalid`, `too_large`, `id_conflict`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "invalid_transaction",
            Self::TooLarge { .. } => "transaction_too_large",
            Self::IdConflict { .. } => "transaction_id_reused",
            Self::InProgress { .. } => "transaction_in_progress",
            Self::NotFound { .. } => "transaction_not_found",
            Self::Lock { .. } => "lock_unavailable",
            Self::Fenced { .. } => "transaction_fenced",
            Self::Interrupted { .. } => "interrupted",
            Self::Store { .. } => "elasticsearch_unavailable",
            Self::Corrupt { .. } => "corrupt_log",
        }
    }
}

/// A point of the protocol where a [`MultiHook`] is asked whether to stop (crash injection for
/// zkguard's tests and `zkguard txn apply --pause-after`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[doc(hidden)]
pub enum Point {
    /// Every lock is held; nothing logged.
    Locked,
    /// The transaction is logged `pending`; no document written.
    Logged,
    /// The first `n` documents (in canonical order) are written with their marks; asked for
    /// every `n` from 1 to the number of documents.
    Applied(usize),
    /// The log says `committed`.
    Committed,
    /// The marks are cleared.
    Cleared,
    /// The log says `finished`; the locks are still held.
    Finished,
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Locked => f.write_str("locked"),
            Self::Logged => f.write_str("logged"),
            Self::Applied(n) => write!(f, "applied:{n}"),
            Self::Committed => f.write_str("committed"),
            Self::Cleared => f.write_str("cleared"),
            Self::Finished => f.write_str("finished"),
        }
    }
}

impl std::str::FromStr for Point {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "locked" => Self::Locked,
            "logged" => Self::Logged,
            "committed" => Self::Committed,
            "cleared" => Self::Cleared,
            "finished" => Self::Finished,
            _ => match s.strip_prefix("applied:").map(str::parse::<usize>) {
                Some(Ok(n)) if n > 0 => Self::Applied(n),
                _ => {
                    return Err(format!(
                        "unknown point `{s}`: expected locked, logged, applied:N (N >= 1), committed, cleared or finished"
                    ))
                }
            },
        })
    }
}

/// Crash injection: asked at every [`Point`]; `true` stops the coordinator there (the call
/// returns [`MultiError::Interrupted`], leaving the log and documents for recovery). It may
/// block (the CLI's hook waits to be killed).
#[doc(hidden)]
#[async_trait::async_trait]
pub trait MultiHook: Send + Sync + 'static {
    /// Whether the hook may stop at `point` (the apply step splits its writes there so that
    /// the first documents are written before the hook is asked). Default: at every point.
    fn intervenes(&self, point: Point) -> bool {
        let _ = point;
        true
    }

    /// Whether to stop at `point` of transaction `id`.
    async fn stop_at(&self, id: &str, point: Point) -> bool;
}
