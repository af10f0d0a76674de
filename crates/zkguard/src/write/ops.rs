//! Serializable write operations: what a guarded write does, as data.
//!
//! An [`Operation`] names the monitor object to lock, the lock type, a short description, and
//! the write itself ([`OpKind`]): index a whole document, update one (a JSON merge patch or a
//! numeric increment, applied as read-modify-write under the lock), or delete one. Because it
//! is plain data, an operation that could not be applied can be parked in a dead-letter sink
//! ([`super::deadletter`]) and replayed later, by another process, exactly as it was submitted.
//!
//! # The `zkguard` field
//! Every document zkguard writes carries a [`META_FIELD`] object (a [`Stamp`]): the fencing
//! token of the writer, the id of the operation and the ids of the last operations applied to
//! the document (at most [`DEFAULT_OPS_WINDOW`] by default). Guarded writes look the operation
//! id up there before writing, so running the same operation twice (a retry after a lost
//! answer, a replay after a crash) applies it once. User documents and patches may not contain
//! that field themselves.
//!
//! ```
//! use serde_json::json;
//! use zkguard::write::ops::{Change, OpKind, Operation};
//!
//! let op = Operation::increment("article-42", "articles", "42", "views", 1)
//!     .with_info("KPI update");
//! let text = serde_json::to_string(&op).unwrap();
//! let back: Operation = serde_json::from_str(&text).unwrap();
//! assert_eq!(op, back);
//! assert!(matches!(back.kind, OpKind::Update { change: Change::Increment { .. }, .. }));
//! # let _ = json!({});
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::lock::{validate_monitor, LockType};

/// The top-level field zkguard keeps its bookkeeping in (see [`Stamp`]).
pub const META_FIELD: &str = "zkguard";

/// How many recent operation ids a document remembers by default (see
/// [`super::guarded::GuardedWriter::with_ops_window`]).
pub const DEFAULT_OPS_WINDOW: usize = 100;

/// An operation that is not well formed, whatever the state of the target document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpError {
    /// The monitor object name cannot be used as a lock.
    #[error("invalid monitor object {monitor:?}: {reason}")]
    Monitor {
        /// The name.
        monitor: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The index or document id is empty.
    #[error("the operation has an empty {what}; name the index and the document id to write")]
    EmptyTarget {
        /// `index` or `document id`.
        what: &'static str,
    },
    /// A document or patch is not a JSON object.
    #[error("the {what} must be a JSON object, got {got}")]
    NotAnObject {
        /// `document` or `merge patch`.
        what: &'static str,
        /// The JSON type found.
        got: &'static str,
    },
    /// A document, patch or increment touches zkguard's own field.
    #[error("the {what} touches the reserved field `{META_FIELD}`; zkguard maintains it, rename your field")]
    ReservedField {
        /// `document`, `merge patch` or `increment field`.
        what: &'static str,
    },
    /// A tombstone delete on an index whose documents carry no `zkguard` object
    /// (`elastic.stamp.off`, [`super::guarded::GuardedWriter::without_stamp`]): a tombstone is
    /// that object.
    #[error("index `{index}` keeps no `{META_FIELD}` object (elastic.stamp.off) and a tombstone is that object; delete with mode hard, or take the index out of elastic.stamp.off")]
    TombstoneUnstamped {
        /// The index.
        index: String,
    },
    /// An increment names no field or an empty path segment.
    #[error(
        "invalid increment field {field:?}: use a non-empty dotted path such as `stats.views`"
    )]
    BadField {
        /// The field path.
        field: String,
    },
}

/// A change applied to the stored document could not be computed from its current content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyError {
    /// The increment field (or one of its parents) holds something other than a number/object.
    #[error("field `{field}` holds {found}, not a number; fix the document or the operation")]
    NotNumeric {
        /// Field path.
        field: String,
        /// What was found.
        found: String,
    },
    /// The increment would overflow a 64-bit integer.
    #[error("incrementing `{field}` by {by} overflows a 64-bit integer")]
    Overflow {
        /// Field path.
        field: String,
        /// The increment.
        by: i64,
    },
}

/// How a delete is carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeleteMode {
    /// A real delete carrying the fencing token as external version. Elasticsearch keeps the
    /// version only for `index.gc_deletes` (60 s by default); after that a stale holder could
    /// re-create the document. The default.
    #[default]
    Hard,
    /// A soft delete: the document is replaced by a tombstone holding only the [`META_FIELD`]
    /// object with `deleted: true`. Its version (the token) stays forever, so stale holders stay
    /// fenced and replays of the delete are recognised. Searches must filter out tombstones
    /// (`zkguard.deleted: true`); guarded updates treat a tombstone as a missing document.
    Tombstone,
}

/// A change applied to an existing document by read-modify-write.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Change {
    /// An RFC 7386 JSON merge patch: objects merge recursively, `null` removes a field, anything
    /// else replaces.
    Merge {
        /// The patch (a JSON object).
        patch: Value,
    },
    /// Adds `by` to the numeric field at a dotted path; a missing field counts as 0.
    Increment {
        /// Dotted field path (`views`, `stats.views`).
        field: String,
        /// The amount (may be negative).
        by: i64,
    },
}

/// The write an operation performs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OpKind {
    /// Creates or replaces a whole document.
    Index {
        /// Target index.
        index: String,
        /// Document id.
        id: String,
        /// The document (a JSON object without the [`META_FIELD`] field).
        doc: Value,
    },
    /// Reads the document, applies a change and writes it back.
    Update {
        /// Target index.
        index: String,
        /// Document id.
        id: String,
        /// The change.
        change: Change,
        /// Whether a missing document is created from `{}` (otherwise the update fails with
        /// a "not found" error).
        #[serde(default)]
        upsert: bool,
    },
    /// Deletes a document.
    Delete {
        /// Target index.
        index: String,
        /// Document id.
        id: String,
        /// Hard delete or tombstone.
        #[serde(default)]
        mode: DeleteMode,
    },
}

/// A write, with everything needed to lock, perform, park and replay it.
///
/// # Examples
///
/// ```
/// use zkguard::write::ops::{OpError, Operation};
/// use zkguard::LockType;
///
/// let propagate = Operation::increment("article-42", "articles", "42", "propagations", 1)
///     .with_type(LockType::Background)
///     .with_info("Bulk Propagation");
/// assert_eq!(propagate.monitor, "article-42");
/// assert_eq!(propagate.summary(), "increment articles/42 propagations by 1");
/// assert!(propagate.validate().is_ok());
///
/// let nowhere = Operation::delete("article-42", "", "42");
/// assert!(matches!(nowhere.validate(), Err(OpError::EmptyTarget { .. })));
/// ```
///
/// Two operations are equal when they are the same write under the same id, key, monitor,
/// lock type and info; when they were accepted ([`Operation::accepted`]) is not compared.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[must_use]
pub struct Operation {
    /// Unique id; recorded in the target document so that the operation applies at most once.
    #[serde(with = "uuid_serde")]
    pub id: Uuid,
    /// The caller's idempotency key, when it named the operation with one that is not a UUID
    /// (`"order-42-save-3"`): [`Operation::with_key`] derives `id` from it. Shown instead of
    /// `id` wherever the caller reads the operation back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The monitor object whose lock guards the write (often the document id).
    pub monitor: String,
    /// Foreground or background.
    pub lock_type: LockType,
    /// Short description of the work ("Save Content", "Bulk Propagation").
    pub info: String,
    /// The write.
    pub kind: OpKind,
    /// When zkguard accepted the operation: microseconds since the Unix epoch, strictly
    /// increasing within one process ([`acceptance_now`]). Set by the service's journal and by
    /// [`super::background::BackgroundExecutor`] when the operation is handed in (unless the
    /// caller set it), kept in its dead letter, and recorded in the document it is applied to
    /// (the [`Stamp`]), so that a replay applies one document's dead letters in the order they
    /// were accepted and never applies one over a write accepted after it. `None` for an
    /// operation that was not handed to either (a direct [`super::guarded::GuardedWriter::run`]
    /// counts as accepted when it is written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted: Option<u64>,
}

impl PartialEq for Operation {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
            && self.key == other.key
            && self.monitor == other.monitor
            && self.lock_type == other.lock_type
            && self.info == other.info
            && self.kind == other.kind
    }
}

/// The time of an acceptance: microseconds since the Unix epoch, strictly greater than every
/// value returned before in this process (so that operations accepted one after another in a
/// process are ordered even within one microsecond, or when the clock steps back). Across
/// processes and hosts the order is that of their clocks.
pub fn acceptance_now() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let next = now.max(last + 1);
        match LAST.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

impl Operation {
    /// Sets when the operation was accepted (see [`Operation::accepted`]).
    pub fn with_accepted(mut self, at: u64) -> Self {
        self.accepted = Some(at);
        self
    }

    /// Sets [`Operation::accepted`] to [`acceptance_now`] unless it is set already.
    pub fn accept(mut self) -> Self {
        if self.accepted.is_none() {
            self.accepted = Some(acceptance_now());
        }
        self
    }

    /// Whether the operation is an increment: it adds to what the document holds instead of
    /// replacing it.
    pub fn is_increment(&self) -> bool {
        matches!(
            self.kind,
            OpKind::Update {
                change: Change::Increment { .. },
                ..
            }
        )
    }

    /// What the operation does, as a number: equal for two operations with the same monitor and
    /// the same write (target, document, field, amount, delete mode), whatever their ids, lock
    /// types and infos. Stable across processes and versions (FNV-1a over the canonical JSON),
    /// so that a journal can tell a resent operation from another one reusing its id.
    pub fn fingerprint(&self) -> u64 {
        let text = serde_json::to_string(&(&self.monitor, &self.kind)).unwrap_or_default();
        text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// An operation with a fresh id, locked as foreground with info `"guarded write"`.
    pub fn new(monitor: impl Into<String>, kind: OpKind) -> Self {
        Self {
            id: Uuid::new_v4(),
            key: None,
            monitor: monitor.into(),
            lock_type: LockType::Foreground,
            info: "guarded write".to_string(),
            kind,
            accepted: None,
        }
    }

    /// Indexes (creates or replaces) `doc` as `index/id`.
    pub fn index(
        monitor: impl Into<String>,
        index: impl Into<String>,
        id: impl Into<String>,
        doc: Value,
    ) -> Self {
        Self::new(
            monitor,
            OpKind::Index {
                index: index.into(),
                id: id.into(),
                doc,
            },
        )
    }

    /// Merges `patch` into the existing document `index/id`.
    pub fn merge(
        monitor: impl Into<String>,
        index: impl Into<String>,
        id: impl Into<String>,
        patch: Value,
    ) -> Self {
        Self::update(monitor, index, id, Change::Merge { patch })
    }

    /// Adds `by` to the numeric `field` of the existing document `index/id`.
    pub fn increment(
        monitor: impl Into<String>,
        index: impl Into<String>,
        id: impl Into<String>,
        field: impl Into<String>,
        by: i64,
    ) -> Self {
        Self::update(
            monitor,
            index,
            id,
            Change::Increment {
                field: field.into(),
                by,
            },
        )
    }

    /// Applies `change` to the existing document `index/id` (no upsert; see
    /// [`Operation::with_upsert`]).
    fn update(
        monitor: impl Into<String>,
        index: impl Into<String>,
        id: impl Into<String>,
        change: Change,
    ) -> Self {
        Self::new(
            monitor,
            OpKind::Update {
                index: index.into(),
                id: id.into(),
                change,
                upsert: false,
            },
        )
    }

    /// Deletes `index/id` (a hard delete; see [`Operation::with_delete_mode`]).
    pub fn delete(
        monitor: impl Into<String>,
        index: impl Into<String>,
        id: impl Into<String>,
    ) -> Self {
        Self::new(
            monitor,
            OpKind::Delete {
                index: index.into(),
                id: id.into(),
                mode: DeleteMode::Hard,
            },
        )
    }

    /// Sets the lock type.
    pub fn with_type(mut self, lock_type: LockType) -> Self {
        self.lock_type = lock_type;
        self
    }

    /// Sets the description.
    pub fn with_info(mut self, info: impl Into<String>) -> Self {
        self.info = info.into();
        self
    }

    /// Sets the id (for callers that derive ids from their own request ids, so that a resubmitted
    /// request is recognised as the same operation).
    pub fn with_id(mut self, id: Uuid) -> Self {
        self.id = id;
        self
    }

    /// Names the operation with the caller's idempotency key: a UUID is taken as the id itself;
    /// any other key gives the id [`Operation::key_id`] derives from it, and is kept as
    /// [`Operation::key`], so that the same key always names the same operation, across
    /// processes and restarts.
    pub fn with_key(mut self, key: &str) -> Self {
        match Uuid::parse_str(key) {
            Ok(id) => {
                self.id = id;
                self.key = None;
            }
            Err(_) => {
                self.id = Self::key_id(key);
                self.key = Some(key.to_string());
            }
        }
        self
    }

    /// The operation id an idempotency key names: the key itself when it is a UUID, else the
    /// name-based UUID (version 5, RFC 9562) of the key in zkguard's namespace.
    pub fn key_id(key: &str) -> Uuid {
        Uuid::parse_str(key).unwrap_or_else(|_| Uuid::new_v5(&OP_KEY_NAMESPACE, key.as_bytes()))
    }

    /// How the caller names the operation: its key, or else its id.
    pub fn display_id(&self) -> String {
        self.key.clone().unwrap_or_else(|| self.id.to_string())
    }

    /// For updates: create a missing document from `{}` instead of failing.
    pub fn with_upsert(mut self, yes: bool) -> Self {
        if let OpKind::Update { upsert, .. } = &mut self.kind {
            *upsert = yes;
        }
        self
    }

    /// For deletes: hard delete or tombstone.
    pub fn with_delete_mode(mut self, new: DeleteMode) -> Self {
        if let OpKind::Delete { mode, .. } = &mut self.kind {
            *mode = new;
        }
        self
    }

    /// The target index.
    pub fn target_index(&self) -> &str {
        match &self.kind {
            OpKind::Index { index, .. }
            | OpKind::Update { index, .. }
            | OpKind::Delete { index, .. } => index,
        }
    }

    /// The target document id.
    pub fn target_id(&self) -> &str {
        match &self.kind {
            OpKind::Index { id, .. } | OpKind::Update { id, .. } | OpKind::Delete { id, .. } => id,
        }
    }

    /// A one-line description (`increment articles/42 views by 1`).
    pub fn summary(&self) -> String {
        let target = format!("{}/{}", self.target_index(), self.target_id());
        match &self.kind {
            OpKind::Index { .. } => format!("index {target}"),
            OpKind::Update {
                change: Change::Merge { .. },
                upsert,
                ..
            } => {
                format!(
                    "merge into {target}{}",
                    if *upsert { " (upsert)" } else { "" }
                )
            }
            OpKind::Update {
                change: Change::Increment { field, by },
                upsert,
                ..
            } => {
                format!(
                    "increment {target} {field} by {by}{}",
                    if *upsert { " (upsert)" } else { "" }
                )
            }
            OpKind::Delete {
                mode: DeleteMode::Hard,
                ..
            } => format!("delete {target}"),
            OpKind::Delete {
                mode: DeleteMode::Tombstone,
                ..
            } => format!("tombstone {target}"),
        }
    }

    /// Checks that the operation is well formed (independently of the stored documents).
    ///
    /// # Errors
    /// [`OpError`] saying what is wrong.
    pub fn validate(&self) -> Result<(), OpError> {
        validate_monitor(&self.monitor).map_err(|e| OpError::Monitor {
            monitor: self.monitor.clone(),
            reason: match e {
                crate::lock::LockError::InvalidMonitor { reason, .. } => reason,
                other => other.to_string(),
            },
        })?;
        if self.target_index().is_empty() {
            return Err(OpError::EmptyTarget { what: "index" });
        }
        if self.target_id().is_empty() {
            return Err(OpError::EmptyTarget {
                what: "document id",
            });
        }
        match &self.kind {
            OpKind::Index { doc, .. } => check_object(doc, "document"),
            OpKind::Update {
                change: Change::Merge { patch },
                ..
            } => check_object(patch, "merge patch"),
            OpKind::Update {
                change: Change::Increment { field, .. },
                ..
            } => {
                if field.is_empty() || field.split('.').any(str::is_empty) {
                    return Err(OpError::BadField {
                        field: field.clone(),
                    });
                }
                if field.split('.').next() == Some(META_FIELD) {
                    return Err(OpError::ReservedField {
                        what: "increment field",
                    });
                }
                Ok(())
            }
            OpKind::Delete { .. } => Ok(()),
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} [{} on `{}`, {}]",
            self.summary(),
            self.lock_type,
            self.monitor,
            self.id
        )
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn check_object(v: &Value, what: &'static str) -> Result<(), OpError> {
    match v {
        Value::Object(m) if m.contains_key(META_FIELD) => Err(OpError::ReservedField { what }),
        Value::Object(_) => Ok(()),
        other => Err(OpError::NotAnObject {
            what,
            got: json_type(other),
        }),
    }
}

/// Applies an RFC 7386 JSON merge patch to `target`.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            let t = target.as_object_mut().expect("made an object above");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Applies `change` to a document source (without the [`META_FIELD`] field).
///
/// # Errors
/// [`ApplyError`] when an increment meets a non-numeric value or overflows.
pub(crate) fn apply_change(source: &mut Value, change: &Change) -> Result<(), ApplyError> {
    match change {
        Change::Merge { patch } => {
            merge_patch(source, patch);
            Ok(())
        }
        Change::Increment { field, by } => {
            if !source.is_object() {
                *source = Value::Object(Map::new());
            }
            let mut cur = source;
            let parts: Vec<&str> = field.split('.').collect();
            for (i, part) in parts.iter().enumerate() {
                let obj = match cur {
                    Value::Object(m) => m,
                    other => {
                        return Err(ApplyError::NotNumeric {
                            field: parts[..i].join("."),
                            found: json_type(other).to_string(),
                        })
                    }
                };
                let last = i + 1 == parts.len();
                let slot = obj.entry(part.to_string()).or_insert_with(|| {
                    if last {
                        Value::from(0)
                    } else {
                        Value::Object(Map::new())
                    }
                });
                if last {
                    let new = match &*slot {
                        Value::Null => Value::from(*by),
                        Value::Number(n) => {
                            if let Some(i) = n.as_i64() {
                                Value::from(i.checked_add(*by).ok_or_else(|| {
                                    ApplyError::Overflow {
                                        field: field.clone(),
                                        by: *by,
                                    }
                                })?)
                            } else {
                                let f = n.as_f64().unwrap_or(f64::NAN) + *by as f64;
                                serde_json::Number::from_f64(f)
                                    .map(Value::Number)
                                    .ok_or_else(|| ApplyError::Overflow {
                                        field: field.clone(),
                                        by: *by,
                                    })?
                            }
                        }
                        other => {
                            return Err(ApplyError::NotNumeric {
                                field: field.clone(),
                                found: json_type(other).to_string(),
                            })
                        }
                    };
                    *slot = new;
                    return Ok(());
                }
                cur = slot;
            }
            Ok(())
        }
    }
}

/// zkguard's bookkeeping inside every document it writes (the [`META_FIELD`] object).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Stamp {
    /// Fencing token of the last writer (also the document's external `_version`).
    pub token: u64,
    /// Id of the last operation applied.
    pub op: String,
    /// Ids of the most recent operations applied, oldest first.
    #[serde(default)]
    pub ops: Vec<String>,
    /// Whether the document is a tombstone (see [`DeleteMode::Tombstone`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    /// The document transaction ([`crate::txn::multi`]) whose uncommitted write this is: set
    /// while the transaction runs, cleared once it is decided. Any later write drops it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txn: Option<String>,
    /// The newest acceptance time ([`Operation::accepted`]) among the operations applied to
    /// the document (`None` before the first one that had one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted: Option<u64>,
}

impl Stamp {
    /// Reads the stamp of a stored document source, if it has one.
    pub fn of(source: &Value) -> Option<Stamp> {
        source
            .get(META_FIELD)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
    }

    /// Whether the operation `id` is among the remembered ones.
    pub fn contains(&self, id: &Uuid) -> bool {
        let id = id.to_string();
        self.op == id || self.ops.contains(&id)
    }

    /// The fencing token of the write that applied operation `id`, as far as the stamp tells:
    /// the stamp's own token when `id` is the document's last operation ([`Stamp::op`]),
    /// `None` otherwise (the stamp keeps the ids of earlier operations, not their tokens).
    pub fn token_of(&self, id: &Uuid) -> Option<u64> {
        (self.op == id.to_string()).then_some(self.token)
    }

    /// The stamp after applying `op_id` with `token`, remembering at most `window` ids.
    pub fn next(&self, op_id: &Uuid, token: u64, window: usize, deleted: bool) -> Stamp {
        let op = op_id.to_string();
        let mut ops = self.ops.clone();
        ops.push(op.clone());
        let excess = ops.len().saturating_sub(window.max(1));
        ops.drain(..excess);
        Stamp {
            token,
            op,
            ops,
            deleted,
            txn: None,
            accepted: self.accepted,
        }
    }

    /// The stamp recording that an operation accepted at `at` was applied: the acceptance
    /// mark only moves forward.
    pub fn accepting(mut self, at: u64) -> Stamp {
        self.accepted = Some(self.accepted.map_or(at, |a| a.max(at)));
        self
    }

    /// The acceptance time of a write the document has that `op` must not be applied over: one
    /// accepted after `op`. `None` when `op` may be applied: nothing newer, no acceptance time,
    /// or an increment, which adds to whatever the document holds instead of replacing it, so
    /// it overwrites nothing.
    pub fn newer_than(&self, op: &Operation) -> Option<u64> {
        let at = op.accepted?;
        if op.is_increment() {
            return None;
        }
        self.accepted.filter(|n| *n > at)
    }
}

/// Whether the stored document `source` records operation `id` as applied.
///
/// Reliable while fewer than the writer's ops window of later zkguard operations hit the same
/// document.
pub fn was_applied(source: &Value, id: &Uuid) -> bool {
    Stamp::of(source).is_some_and(|s| s.contains(id))
}

/// A document source without the [`META_FIELD`] object.
pub(crate) fn strip_meta(source: &Value) -> Value {
    let mut v = source.clone();
    if let Value::Object(m) = &mut v {
        m.remove(META_FIELD);
    }
    v
}

/// `source` (an object) with `stamp` stored in its [`META_FIELD`] field.
pub(crate) fn with_stamp(mut source: Value, stamp: &Stamp) -> Value {
    if !source.is_object() {
        source = Value::Object(Map::new());
    }
    source
        .as_object_mut()
        .expect("made an object above")
        .insert(
            META_FIELD.to_string(),
            serde_json::to_value(stamp).expect("a stamp serializes"),
        );
    source
}

/// The namespace of the operation ids derived from idempotency keys ([`Operation::key_id`]).
pub const OP_KEY_NAMESPACE: Uuid = Uuid::from_u128(0x6f1c_2b7e_93a4_4d5f_8e21_7c0d_b4a9_35e8);

/// Serde support for [`Uuid`] as its hyphenated string.
pub(crate) mod uuid_serde {
    use serde::{Deserialize, Deserializer, Serializer};
    use uuid::Uuid;

    pub fn serialize<S: Serializer>(id: &Uuid, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(id)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Uuid, D::Error> {
        let text = String::deserialize(d)?;
        Uuid::parse_str(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trips_as_tagged_json() {
        let op = Operation::merge("m1", "articles", "1", json!({"title": "x"}))
            .with_type(LockType::Background);
        let v = serde_json::to_value(&op).unwrap();
        assert_eq!(v["kind"]["type"], "update");
        assert_eq!(v["kind"]["change"]["type"], "merge");
        assert_eq!(v["lock_type"], "background");
        assert_eq!(v["id"], op.id.to_string());
        assert_eq!(serde_json::from_value::<Operation>(v).unwrap(), op);
        let del = Operation::delete("m", "i", "d");
        let mut v = serde_json::to_value(&del).unwrap();
        v["kind"].as_object_mut().unwrap().remove("mode");
        assert_eq!(
            serde_json::from_value::<Operation>(v).unwrap(),
            del,
            "mode defaults to hard"
        );
    }

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut doc = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut doc, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(doc, json!({"a": "z", "c": {"d": "e"}}));
        let mut doc = json!({"a": [1, 2]});
        merge_patch(&mut doc, &json!({"a": [3], "n": {"x": 1}}));
        assert_eq!(doc, json!({"a": [3], "n": {"x": 1}}));
    }

    #[test]
    fn increments() {
        let mut doc = json!({"n": 1, "f": 1.5, "s": "x"});
        apply_change(
            &mut doc,
            &Change::Increment {
                field: "n".into(),
                by: 2,
            },
        )
        .unwrap();
        apply_change(
            &mut doc,
            &Change::Increment {
                field: "f".into(),
                by: 1,
            },
        )
        .unwrap();
        apply_change(
            &mut doc,
            &Change::Increment {
                field: "new.deep".into(),
                by: -3,
            },
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"n": 3, "f": 2.5, "s": "x", "new": {"deep": -3}})
        );
        let e = apply_change(
            &mut doc,
            &Change::Increment {
                field: "s".into(),
                by: 1,
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("`s` holds a string"), "{e}");
        let e = apply_change(
            &mut doc,
            &Change::Increment {
                field: "s.x".into(),
                by: 1,
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("`s` holds a string"), "{e}");
        let mut big = json!({"n": i64::MAX});
        assert!(matches!(
            apply_change(
                &mut big,
                &Change::Increment {
                    field: "n".into(),
                    by: 1
                }
            ),
            Err(ApplyError::Overflow { .. })
        ));
    }

    #[test]
    fn validation_names_the_problem() {
        let bad = [
            (Operation::index("a/b", "i", "1", json!({})), "`/`"),
            (Operation::index("m", "", "1", json!({})), "empty index"),
            (
                Operation::index("m", "i", "", json!({})),
                "empty document id",
            ),
            (
                Operation::index("m", "i", "1", json!([1])),
                "must be a JSON object, got an array",
            ),
            (
                Operation::index("m", "i", "1", json!({"zkguard": 1})),
                "reserved field",
            ),
            (
                Operation::merge("m", "i", "1", json!({"zkguard": null})),
                "reserved field",
            ),
            (
                Operation::increment("m", "i", "1", "zkguard.token", 1),
                "reserved field",
            ),
            (
                Operation::increment("m", "i", "1", "a..b", 1),
                "dotted path",
            ),
        ];
        for (op, needle) in bad {
            let e = op.validate().unwrap_err().to_string();
            assert!(e.contains(needle), "{op}: {e}");
        }
        Operation::increment("m", "i", "1", "stats.views", 1)
            .validate()
            .unwrap();
    }

    #[test]
    fn stamp_window_keeps_the_latest_ids() {
        let mut s = Stamp::default();
        let ids: Vec<Uuid> = (0..5).map(|_| Uuid::new_v4()).collect();
        for (i, id) in ids.iter().enumerate() {
            s = s.next(id, i as u64 + 10, 3, false);
        }
        assert_eq!(s.token, 14);
        assert_eq!(s.ops.len(), 3);
        assert!(!s.contains(&ids[1]));
        assert!(s.contains(&ids[2]) && s.contains(&ids[4]));
        let doc = with_stamp(json!({"x": 1}), &s);
        assert!(was_applied(&doc, &ids[3]));
        assert_eq!(s.token_of(&ids[4]), Some(14), "the last operation's token");
        assert_eq!(
            s.token_of(&ids[3]),
            None,
            "an earlier operation's is not kept"
        );
        assert_eq!(strip_meta(&doc), json!({"x": 1}));
    }

    #[test]
    fn acceptance_times_increase_and_older_writes_are_superseded() {
        let a = acceptance_now();
        let b = acceptance_now();
        assert!(b > a, "strictly increasing: {a} {b}");
        let old = Operation::index("m", "i", "1", json!({"n": 1})).with_accepted(10);
        let new = Operation::index("m", "i", "1", json!({"n": 2})).with_accepted(20);
        let stamp = Stamp::default()
            .next(&new.id, 1, 10, false)
            .accepting(20)
            .accepting(15);
        assert_eq!(stamp.accepted, Some(20), "the mark only moves forward");
        assert_eq!(stamp.newer_than(&old), Some(20));
        assert_eq!(stamp.newer_than(&new), None);
        let inc = Operation::increment("m", "i", "1", "n", 1).with_accepted(5);
        assert_eq!(
            stamp.newer_than(&inc),
            None,
            "an increment overwrites nothing"
        );
        let unknown = Operation::index("m", "i", "1", json!({}));
        assert_eq!(stamp.newer_than(&unknown), None);
        // Carried by later stamps, absent from older JSON.
        assert_eq!(stamp.next(&old.id, 2, 10, false).accepted, Some(20));
        assert_eq!(
            serde_json::from_value::<Stamp>(json!({"token": 1, "op": "x"}))
                .unwrap()
                .accepted,
            None
        );
        // Equal operations whatever their acceptance; the time round-trips.
        assert_eq!(old.clone().with_accepted(99), old);
        let back: Operation = serde_json::from_str(&serde_json::to_string(&old).unwrap()).unwrap();
        assert_eq!(back.accepted, Some(10));
    }
}
