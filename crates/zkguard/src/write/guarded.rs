//! Guarded, fenced Elasticsearch writes.
//!
//! A [`GuardedWriter`] acquires the lock of an operation's monitor object through any
//! [`LockService`], performs the write and releases the lock. Every write carries the guard's
//! fencing token as the document's external version (`version=<token>&version_type=external_gte`),
//! so Elasticsearch itself rejects a write from a holder whose token is older than the version
//! already stored: such a write fails with [`GuardedError::Fenced`] and is never retried blindly.
//!
//! ```no_run
//! # async fn demo(locks: std::sync::Arc<dyn zkguard::LockService>,
//! #               store: std::sync::Arc<dyn zkguard::es::DocStore>) -> Result<(), zkguard::write::guarded::GuardedError> {
//! use serde_json::json;
//! use zkguard::write::guarded::GuardedWriter;
//!
//! let writer = GuardedWriter::new(locks, store);
//! writer.on("article-42").info("Save Content").index("articles", "42", json!({"title": "Hello"})).await?;
//! writer.on("article-42").increment("articles", "42", "views", 1).await?;
//! # Ok(()) }
//! ```
//!
//! # How a write goes
//! 1. acquire the lock (skipped by [`GuardedWriter::write_under`], which takes a held guard);
//! 2. realtime GET of the document; if its [`Stamp`] lists the operation id, the operation was
//!    applied before (a retry after a lost answer, a replay after a crash) and nothing is written;
//! 3. compute the new whole document (index: the given one; update: the stored one with the
//!    change applied; tombstone: only the stamp), adding the [`Stamp`] with the token;
//! 4. if the guard reports the lock lost, stop: [`GuardedError::LockLost`], nothing was sent;
//! 5. `index` (or `delete`) with [`fence::condition`](super::fence::condition)`(token)`
//!    ([`WriteCondition::ExternalGte`](crate::es::WriteCondition::ExternalGte) of the token); a 409 is
//!    [`GuardedError::Fenced`];
//! 6. if the guard reports the lock lost once Elasticsearch answered, the write is not
//!    acknowledged: [`GuardedError::LostDuringWrite`] (the next holder may have read the
//!    document before it landed, and replace it);
//! 7. release the lock.
//!
//! # Limits of fencing through Elasticsearch versions
//! - The `_update` and `_create` APIs cannot carry external versions, so zkguard never uses them:
//!   updates are read-modify-write of the whole document with `index`, under the lock.
//! - A hard delete with an external version leaves a version tombstone only for
//!   `index.gc_deletes` (60 s by default); afterwards a stale holder's `index` would re-create
//!   the document. [`DeleteMode::Tombstone`] keeps a tombstone document (and its version) forever.
//! - A document written without zkguard has a small internal version (1, 2, ...) that any token
//!   exceeds, so the first guarded write replaces it; writes that bypass zkguard are not fenced
//!   and drop the stamp.
//! - Fencing orders *writes*: a stale holder whose write reaches Elasticsearch after the new
//!   holder read the document but before the new holder wrote it is not rejected (its token is
//!   still newer than the stored version), and the new holder's write then replaces it. Step 4
//!   and a loss grace that ends before the leader may expire the session make this window
//!   small; it cannot be closed with Elasticsearch's versioning alone.
//! - The check is per document: an operation that must change several documents atomically
//!   needs the transactions module.
//!
//! `docs/fencing.md` explains each of these with a sequence diagram.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use tracing::Instrument;
use uuid::Uuid;

use crate::es::{BulkAction, DocMeta, DocStore, EsError, Refresh};
use crate::lock::{Guard, LockError, LockRequest, LockService, LockType};
use crate::write::ops::{
    apply_change, strip_meta, with_stamp, ApplyError, Change, DeleteMode, OpError, OpKind,
    Operation, Stamp, DEFAULT_OPS_WINDOW,
};
use crate::write::stamp_mapping::StampMapping;
use crate::write::stamping::IndexPatterns;

/// Errors of guarded writes.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum GuardedError {
    /// The operation is not well formed; it can never succeed as it is.
    #[error("invalid operation: {0}")]
    Invalid(#[from] OpError),
    /// The lock could not be acquired (timeout, connection or session trouble).
    #[error("{0}")]
    Lock(#[from] LockError),
    /// The lock was lost before the write was sent; nothing was written.
    #[error("the lock on `{monitor}` was lost before the write to {index}/{id} was sent ({reason}); nothing was written, run the operation again with a new lock")]
    LockLost {
        /// Monitor object.
        monitor: String,
        /// Index.
        index: String,
        /// Document id.
        id: String,
        /// Why the lock was lost.
        reason: String,
    },
    /// The write was sent and Elasticsearch took it, but the lock was found lost when its answer
    /// came: the lock's next holder may have read the document before the write landed and
    /// replaced it from that read. The change is not acknowledged; running the operation again
    /// with a new lock applies it once (its id in the document tells whether it is there).
    #[error("the lock on `{monitor}` was lost while the write to {index}/{id} was under way ({reason}); Elasticsearch took it, but the lock's next holder may have read the document before it landed and replaced it: run the operation again with a new lock (its operation id tells whether it is still applied)")]
    LostDuringWrite {
        /// Monitor object.
        monitor: String,
        /// Index.
        index: String,
        /// Document id.
        id: String,
        /// Why the lock was lost.
        reason: String,
    },
    /// Elasticsearch rejected the write because the document's version is above the token:
    /// a newer lock holder wrote it, or a writer outside zkguard gave it that version.
    #[error("write to {index}/{id} with fencing token {token} was rejected: {by} (Elasticsearch: {reason})")]
    Fenced {
        /// Index.
        index: String,
        /// Document id.
        id: String,
        /// The rejected token.
        token: u64,
        /// Who set the version that won, as far as the document tells after the conflict.
        by: FencedBy,
        /// Elasticsearch's reason (names the stored version).
        reason: String,
    },
    /// An update found no document (or a tombstone).
    #[error("update of {index}/{id}: the document does not exist; index it first or set upsert on the operation")]
    NotFound {
        /// Index.
        index: String,
        /// Document id.
        id: String,
    },
    /// The change cannot be applied to the stored document.
    #[error("cannot apply the change to {index}/{id}: {source}")]
    CannotApply {
        /// Index.
        index: String,
        /// Document id.
        id: String,
        /// What failed.
        #[source]
        source: ApplyError,
    },
    /// A guard for one monitor was used to write an operation for another.
    #[error("the guard holds `{held}` but the operation is for `{wanted}`; acquire the operation's monitor")]
    WrongGuard {
        /// The guard's monitor.
        held: String,
        /// The operation's monitor.
        wanted: String,
    },
    /// Elasticsearch failed (other than a version conflict on the write).
    #[error("{0}")]
    Store(#[from] EsError),
    /// The document has a write accepted after the operation (see
    /// [`GuardedWriter::in_acceptance_order`]): applying the older operation over it would
    /// undo it. Nothing was written.
    #[error("{index}/{id} already has a newer write (accepted {}, after this operation, accepted {}); not applied over it", micros_text(*.newer), micros_text(*.accepted))]
    Superseded {
        /// Index.
        index: String,
        /// Document id.
        id: String,
        /// When the operation was accepted (microseconds since the Unix epoch).
        accepted: u64,
        /// When the newer write the document has was accepted.
        newer: u64,
    },
}

impl GuardedError {
    /// Whether running the same operation again later may succeed: lock timeouts and connection
    /// trouble, a lock lost before the write was sent, and Elasticsearch's 429, 5xx and transport
    /// errors. `Fenced`, invalid operations, missing documents and bad requests are not transient.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Lock(e) => e.is_transient(),
            Self::LockLost { .. } | Self::LostDuringWrite { .. } => true,
            Self::Store(e) => e.is_transient(),
            Self::Invalid(_)
            | Self::Fenced { .. }
            | Self::NotFound { .. }
            | Self::CannotApply { .. } => false,
            Self::WrongGuard { .. } | Self::Superseded { .. } => false,
        }
    }

    /// A short, stable name of the error class for counters and reports (`lock_timeout`,
    /// `fenced`, `es_unavailable`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "invalid",
            Self::Lock(LockError::Timeout { .. }) => "lock_timeout",
            Self::Lock(LockError::InvalidMonitor { .. } | LockError::InfoTooLong { .. }) => {
                "invalid"
            }
            Self::Lock(_) => "lock_unavailable",
            Self::LockLost { .. } | Self::LostDuringWrite { .. } => "lock_lost",
            Self::Fenced { .. } => "fenced",
            Self::NotFound { .. } => "not_found",
            Self::CannotApply { .. } => "cannot_apply",
            Self::WrongGuard { .. } => "wrong_guard",
            Self::Superseded { .. } => "superseded",
            Self::Store(EsError::TooManyRequests { .. }) => "es_overloaded",
            Self::Store(EsError::Server { .. } | EsError::Transport { .. }) => "es_unavailable",
            Self::Store(_) => "es_rejected",
        }
    }
}

/// Microseconds since the Unix epoch as RFC 3339 (UTC).
fn micros_text(us: u64) -> String {
    humantime::format_rfc3339_micros(std::time::UNIX_EPOCH + Duration::from_micros(us)).to_string()
}

/// What a guarded write sends (see [`GuardedWriter::plan`]).
#[derive(Debug)]
pub(crate) enum Plan {
    /// The document records the operation: nothing to send. `token`: the fencing token of the
    /// write that applied it, when the document tells ([`Stamp::token_of`]).
    AlreadyApplied {
        /// The token of the write that applied the operation, if known.
        token: Option<u64>,
    },
    /// The whole new document, or the delete, carrying the token.
    Send(BulkAction),
}

/// The result of a successful guarded write.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    /// The operation.
    pub op_id: Uuid,
    /// The fencing token of the lock this call wrote under (the token the write carried, when
    /// one was sent).
    pub token: u64,
    /// The fencing token of the write that applied the operation: [`Written::token`] when this
    /// call wrote it (or, for a hard delete, found no document). When the document already
    /// recorded the operation ([`Written::already_applied`]: an earlier attempt wrote it, say
    /// before a crash), the token of that earlier write as the document records it: known while
    /// the operation is the document's last one (its `zkguard.op`, the token then being the
    /// document's version), `None` once later operations were written over it (the document
    /// keeps their ids, not their tokens). Outcomes report this token, never a later lock's.
    pub applied_token: Option<u64>,
    /// The stored document's metadata after the write (`None` when nothing was written because
    /// the operation had been applied before, or a hard delete found no document).
    pub meta: Option<DocMeta>,
    /// Whether the document already recorded the operation, so nothing was written.
    pub already_applied: bool,
    /// Time spent waiting for the lock (zero for [`GuardedWriter::write_under`]).
    pub waited: Duration,
    /// Time between acquiring and releasing the lock (zero for [`GuardedWriter::write_under`]).
    pub held: Duration,
}

/// Performs [`Operation`]s under the lock of their monitor object, fenced by the lock's token.
///
/// Cheap to clone (two `Arc`s and a few settings); share one per process.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
///
/// use serde_json::json;
/// use zkguard::config::Settings;
/// use zkguard::es::EsStore;
/// use zkguard::write::guarded::{GuardedError, GuardedWriter};
/// use zkguard::write::ops::Operation;
/// use zkguard::{ZkLockService, ZkSession};
///
/// let settings = Settings::load(None)?;
/// let session = ZkSession::connect(&settings.zookeeper).await?;
/// let writer = GuardedWriter::new(
///     Arc::new(ZkLockService::new(session)),
///     Arc::new(EsStore::new(&settings.elasticsearch)?),
/// );
/// let save = Operation::index("article-42", "articles", "42", json!({"title": "Hello"}))
///     .with_info("Save Content");
/// match writer.run(&save).await {
///     Ok(written) => println!("saved with fencing token {}", written.token),
///     Err(GuardedError::Fenced { .. }) => println!("a later holder wrote article 42 first"),
///     Err(e) => return Err(e.into()),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use]
pub struct GuardedWriter {
    locks: Arc<dyn LockService>,
    store: Arc<dyn DocStore>,
    refresh: Refresh,
    ops_window: usize,
    unstamped: Arc<IndexPatterns>,
    mapping: Arc<StampMapping>,
    timeout: Option<Duration>,
    marks: Option<Arc<dyn crate::write::marks::MarkResolver>>,
    in_order: bool,
}

impl std::fmt::Debug for GuardedWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedWriter")
            .field("locks", &self.locks.backend_name())
            .field("refresh", &self.refresh)
            .field("ops_window", &self.ops_window)
            .field("unstamped", &self.unstamped.as_slice())
            .field("maps_stamp", &self.mapping.is_on())
            .field("timeout", &self.timeout)
            .field("in_order", &self.in_order)
            .finish()
    }
}

impl GuardedWriter {
    /// A writer over a lock service and a document store, with `Refresh::No`, an ops window of
    /// [`DEFAULT_OPS_WINDOW`] and the lock types' configured timeouts.
    pub fn new(locks: Arc<dyn LockService>, store: Arc<dyn DocStore>) -> Self {
        Self {
            locks,
            store,
            refresh: Refresh::No,
            ops_window: DEFAULT_OPS_WINDOW,
            unstamped: Arc::new(IndexPatterns::default()),
            mapping: Arc::new(StampMapping::new(true)),
            timeout: None,
            marks: None,
            in_order: false,
        }
    }

    /// Refuses, with [`GuardedError::Superseded`], an operation older than a write the document
    /// already has: one whose [`Operation::accepted`] is before the newest acceptance its
    /// [`Stamp`] records ([`Stamp::newer_than`]). Dead-letter replays write this way.
    /// Increments (which overwrite nothing), operations without an acceptance time, and
    /// documents without a stamp are written as usual.
    pub fn in_acceptance_order(mut self) -> Self {
        self.in_order = true;
        self
    }

    /// Has every document found under its lock with a document transaction's mark decided
    /// through `resolver` before it is built on (see [`crate::write::marks`]).
    pub fn with_mark_resolver(
        mut self,
        resolver: Arc<dyn crate::write::marks::MarkResolver>,
    ) -> Self {
        self.marks = Some(resolver);
        self
    }

    /// The document as it is once a transaction mark on it is decided.
    pub(crate) async fn settled(
        &self,
        index: &str,
        id: &str,
        doc: Option<crate::es::Doc>,
        token: u64,
    ) -> Result<Option<crate::es::Doc>, EsError> {
        crate::write::marks::settled(
            self.marks.as_deref(),
            self.store.as_ref(),
            index,
            id,
            doc,
            token,
        )
        .await
    }

    /// When written documents become visible to searches (GET by id is realtime anyway).
    pub fn with_refresh(mut self, refresh: Refresh) -> Self {
        self.refresh = refresh;
        self
    }

    /// How many recent operation ids each document remembers (at least 1). An operation is
    /// recognised as applied (and not applied again by a retry or a replay) as long as fewer
    /// than this many later zkguard operations wrote the same document.
    pub fn with_ops_window(mut self, window: usize) -> Self {
        self.ops_window = window.max(1);
        self
    }

    /// Indices whose documents get no `zkguard` object (see [`super::stamping`]): their writes
    /// are still locked and fenced, but a retry or replay of an operation applied already is
    /// applied again, and tombstone deletes are refused.
    pub fn without_stamp(mut self, indices: IndexPatterns) -> Self {
        self.unstamped = Arc::new(indices);
        self
    }

    /// Whether the writer maps the `zkguard` object as stored but not indexed before its first
    /// stamped write to an index (default: it does; see `elastic.stamp.mapping` in
    /// docs/fencing.md). Off, the mappings are left to the index's owner.
    pub fn with_stamp_mapping(mut self, on: bool) -> Self {
        self.mapping = Arc::new(StampMapping::new(on));
        self
    }

    /// Applies `elastic.stamp.window`, `elastic.stamp.off` and `elastic.stamp.mapping`.
    pub fn with_stamp_settings(self, settings: &crate::config::StampSettings) -> Self {
        self.with_ops_window(settings.window)
            .without_stamp(settings.off.clone())
            .with_stamp_mapping(settings.map)
    }

    /// Settles the mapping of the `zkguard` object in `index` before a stamped write to it
    /// (once per index and writer, shared by the writer's clones); nothing for an index whose
    /// documents get no object.
    pub(crate) async fn map_stamp(&self, index: &str) {
        if self.stamps(index) {
            self.mapping.ensure(self.store.as_ref(), index).await;
        }
    }

    /// Whether documents of `index` carry the `zkguard` object.
    pub fn stamps(&self, index: &str) -> bool {
        !self.unstamped.matches(index)
    }

    /// Overrides the lock wait of every operation (default: the lock type's configured timeout).
    pub fn with_lock_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The lock service.
    pub fn locks(&self) -> &Arc<dyn LockService> {
        &self.locks
    }

    /// The document store.
    pub fn store(&self) -> &Arc<dyn DocStore> {
        &self.store
    }

    /// A builder of operations on one monitor object (foreground, info `"guarded write"`).
    pub fn on(&self, monitor: impl Into<String>) -> MonitorWriter {
        MonitorWriter {
            writer: self.clone(),
            monitor: monitor.into(),
            lock_type: LockType::Foreground,
            info: "guarded write".to_string(),
        }
    }

    /// Acquires the operation's lock (its monitor, lock type and info), writes, releases.
    ///
    /// # Errors
    /// [`GuardedError::Lock`] when the lock was not acquired (nothing was read or written);
    /// the errors of [`GuardedWriter::write_under`]. The release is not awaited
    /// ([`Guard::release`]): it is sent (ZooKeeper) or done (lease lock) before this returns, and
    /// a failure is logged, not returned: the write is done and the lock goes with the session
    /// or lease.
    ///
    /// # Cancellation safety
    /// Dropping the future drops the guard, which releases the lock in the background. A write
    /// that was already sent may or may not be applied; running the same operation (same id)
    /// again is safe, since the document records the ids of applied operations.
    pub async fn run(&self, op: &Operation) -> Result<Written, GuardedError> {
        let span = tracing::info_span!(
            "guarded_write",
            op = %op.id,
            monitor = %op.monitor,
            lock_type = %op.lock_type,
            target = %format_args!("{}/{}", op.target_index(), op.target_id()),
        );
        async move {
            op.validate()?;
            let mut request =
                LockRequest::new(op.monitor.clone(), op.info.clone()).with_type(op.lock_type);
            if let Some(t) = self.timeout {
                request = request.with_timeout(t);
            }
            let started = Instant::now();
            let guard = self.locks.acquire(request).await?;
            let waited = started.elapsed();
            let acquired = Instant::now();
            tracing::debug!(
                token = guard.fencing_token(),
                waited_ms = waited.as_millis() as u64,
                "lock acquired"
            );
            let result = self.write_under(guard.as_ref(), op).await;
            let held = acquired.elapsed();
            // The answer to the release is not awaited: the write's outcome is known, and the
            // session's next acquisition is ordered behind the release anyway.
            guard.release().await.detach(match &result {
                Ok(_) => "the write succeeded but releasing the lock failed",
                Err(_) => "releasing the lock after a failed write failed",
            });
            result.map(|w| Written { waited, held, ..w })
        }
        .instrument(span)
        .await
    }

    /// Writes `op` under a guard the caller already holds (for callers that do several things
    /// under one lock, and for tests of fencing). The guard must be for `op.monitor`.
    ///
    /// # Errors
    /// - [`GuardedError::Invalid`] / [`GuardedError::WrongGuard`]: nothing was read or written;
    /// - [`GuardedError::LockLost`]: the guard reported the lock lost before the write was sent;
    /// - [`GuardedError::Fenced`]: Elasticsearch holds a newer token for the document;
    /// - [`GuardedError::NotFound`] / [`GuardedError::CannotApply`]: an update could not be applied;
    /// - [`GuardedError::Store`]: Elasticsearch failed (see [`EsError::is_transient`]).
    ///
    /// # Cancellation safety
    /// Dropping the future may leave the write sent or not; running the same operation again is
    /// safe (see [`GuardedWriter::run`]). The guard is not released.
    pub async fn write_under(
        &self,
        guard: &dyn Guard,
        op: &Operation,
    ) -> Result<Written, GuardedError> {
        op.validate()?;
        if guard.monitor() != op.monitor {
            return Err(GuardedError::WrongGuard {
                held: guard.monitor().to_string(),
                wanted: op.monitor.clone(),
            });
        }
        let token = guard.fencing_token();
        let index = op.target_index();
        let id = op.target_id();
        self.ensure_held(guard, op)?;
        let current = self.store.get(index, id).await?;
        let current = self.settled(index, id, current, token).await?;
        let written = |meta| Written {
            op_id: op.id,
            token,
            applied_token: Some(token),
            meta,
            already_applied: false,
            waited: Duration::ZERO,
            held: Duration::ZERO,
        };
        match self.plan(op, token, current.as_ref().map(|d| &d.source))? {
            Plan::AlreadyApplied { token: applied } => {
                tracing::info!(op = %op.id, applied_token = ?applied, "the document already records this operation; nothing to write");
                Ok(Written {
                    already_applied: true,
                    applied_token: applied,
                    ..written(current.map(|d| d.meta))
                })
            }
            Plan::Send(BulkAction::Delete { condition, .. }) => {
                self.ensure_held(guard, op)?;
                let sent = self.store.delete(index, id, condition, self.refresh).await;
                match sent {
                    Ok(meta) => self.still_held(guard, op).map(|()| written(meta)),
                    Err(e) => Err(fenced_or(self.store.as_ref(), e, index, id, token).await),
                }
            }
            Plan::Send(BulkAction::Index {
                source, condition, ..
            }) => {
                self.map_stamp(index).await;
                self.ensure_held(guard, op)?;
                let sent = self
                    .store
                    .index(index, id, &source, condition, self.refresh)
                    .await;
                match sent {
                    Ok(meta) => self.still_held(guard, op).map(|()| written(Some(meta))),
                    Err(e) => Err(fenced_or(self.store.as_ref(), e, index, id, token).await),
                }
            }
        }
    }

    /// What writing `op` with `token` sends, given the target document's source as stored now
    /// (`None`: absent): nothing when the document records the operation already, else the whole
    /// new document (or the delete), carrying `token` as its external version.
    pub(crate) fn plan(
        &self,
        op: &Operation,
        token: u64,
        current: Option<&Value>,
    ) -> Result<Plan, GuardedError> {
        let index = op.target_index();
        let id = op.target_id();
        let stamp = current.and_then(Stamp::of);
        if let Some(found) = stamp.as_ref().filter(|s| s.contains(&op.id)) {
            return Ok(Plan::AlreadyApplied {
                token: found.token_of(&op.id),
            });
        }
        if let Some(newer) = stamp
            .as_ref()
            .filter(|_| self.in_order)
            .and_then(|s| s.newer_than(op))
        {
            return Err(GuardedError::Superseded {
                index: index.to_string(),
                id: id.to_string(),
                accepted: op.accepted.unwrap_or_default(),
                newer,
            });
        }
        let accepted = op
            .accepted
            .unwrap_or_else(crate::write::ops::acceptance_now);
        let stamp = stamp.unwrap_or_default();
        let live = current.filter(|_| !stamp.deleted);
        let condition = super::fence::condition(token);
        let stamped = self.stamps(index);
        let stamp_onto = |source: Value| {
            if stamped {
                let next = stamp.next(&op.id, token, self.ops_window, false);
                with_stamp(source, &next.accepting(accepted))
            } else {
                source
            }
        };
        let new_source = match &op.kind {
            OpKind::Index { doc, .. } => stamp_onto(doc.clone()),
            OpKind::Update { change, upsert, .. } => {
                let mut source = match live {
                    Some(doc) => strip_meta(doc),
                    None if *upsert => Value::Object(Map::new()),
                    None => {
                        return Err(GuardedError::NotFound {
                            index: index.to_string(),
                            id: id.to_string(),
                        })
                    }
                };
                apply_change(&mut source, change).map_err(|source| GuardedError::CannotApply {
                    index: index.to_string(),
                    id: id.to_string(),
                    source,
                })?;
                if let Change::Merge { .. } = change {
                    // A merge patch cannot add the field (validated), but keep it out regardless.
                    source = strip_meta(&source);
                }
                stamp_onto(source)
            }
            OpKind::Delete {
                mode: DeleteMode::Tombstone,
                ..
            } if !stamped => {
                return Err(GuardedError::Invalid(OpError::TombstoneUnstamped {
                    index: index.to_string(),
                }))
            }
            OpKind::Delete {
                mode: DeleteMode::Tombstone,
                ..
            } => with_stamp(
                Value::Object(Map::new()),
                &stamp
                    .next(&op.id, token, self.ops_window, true)
                    .accepting(accepted),
            ),
            OpKind::Delete {
                mode: DeleteMode::Hard,
                ..
            } => {
                return Ok(Plan::Send(BulkAction::Delete {
                    index: index.to_string(),
                    id: id.to_string(),
                    condition,
                }))
            }
        };
        Ok(Plan::Send(BulkAction::Index {
            index: index.to_string(),
            id: id.to_string(),
            source: new_source,
            condition,
        }))
    }

    /// The lock wait override, if any.
    pub(crate) fn lock_timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// When written documents become visible to searches.
    pub(crate) fn refresh(&self) -> Refresh {
        self.refresh
    }

    /// After a write Elasticsearch took: whether the lock was still held when its answer came.
    ///
    /// Held then, the write landed while no one else could hold the lock (the loss grace ends
    /// before ZooKeeper may expire the session), so every later holder reads it. Lost, the next
    /// holder may have read the document before the write landed (the writer paused between
    /// its check and the request, or the request was slow) and then replace it from that read,
    /// since Elasticsearch took the older token while the newer one had not written yet: the
    /// write is [`GuardedError::LostDuringWrite`], not acknowledged.
    pub(crate) fn still_held(&self, guard: &dyn Guard, op: &Operation) -> Result<(), GuardedError> {
        if guard.is_held() {
            return Ok(());
        }
        Err(self.lost_during_write(guard, op))
    }

    /// The error of a write Elasticsearch took after the lock was lost (see
    /// [`GuardedWriter::still_held`]).
    pub(crate) fn lost_during_write(&self, guard: &dyn Guard, op: &Operation) -> GuardedError {
        let reason = guard.why_not_held();
        tracing::warn!(op = %op.id, %reason, "lock lost while the write was under way: the write is not acknowledged, the next holder may have replaced it");
        GuardedError::LostDuringWrite {
            monitor: op.monitor.clone(),
            index: op.target_index().to_string(),
            id: op.target_id().to_string(),
            reason,
        }
    }

    pub(crate) fn ensure_held(
        &self,
        guard: &dyn Guard,
        op: &Operation,
    ) -> Result<(), GuardedError> {
        if guard.is_held() {
            return Ok(());
        }
        let reason = guard.why_not_held();
        tracing::warn!(op = %op.id, %reason, "lock lost before the write was sent; not sending it");
        Err(GuardedError::LockLost {
            monitor: op.monitor.clone(),
            index: op.target_index().to_string(),
            id: op.target_id().to_string(),
            reason,
        })
    }
}

/// Who set the version that fenced a write: told apart by the document's `zkguard` stamp, read
/// back after the conflict (a zkguard writer stores its token both as the version and in the
/// stamp).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FencedBy {
    /// A newer zkguard lock holder wrote the document: its stamp carries `version` as its token,
    /// or it has no stamp and `version` is in the range of zkguard's tokens, 2^52 to 2^53 (an
    /// index without stamps, or a write by the caller's own client under an explicit lock).
    Holder {
        /// The document's `_version`, the newer holder's token.
        version: u64,
    },
    /// The document's version was set outside zkguard: the document has no stamp, or its stamp
    /// carries another token (a write with internal versioning or with another tool's external
    /// versions since).
    Outside {
        /// The document's `_version`.
        version: u64,
    },
    /// The document could not be read back (it is gone, or the read failed).
    Unknown,
}

impl std::fmt::Display for FencedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Holder { version } => write!(
                f,
                "a newer zkguard lock holder wrote the document (token {version}); re-read it and decide whether the change still applies"
            ),
            Self::Outside { version } => write!(
                f,
                "the document's version {version} was set outside zkguard (its zkguard stamp does not carry it) and is above the token; \
                 find the writer that uses external versions that high and stop it (zkguard's ZooKeeper tokens start at 2^52), \
                 then delete the document and write it again through zkguard \
                 (Elasticsearch forgets a deleted document's version after index.gc_deletes, 60 s by default)"
            ),
            Self::Unknown => write!(
                f,
                "a newer version was written meanwhile; re-read the document and decide whether the change still applies"
            ),
        }
    }
}

/// What a write that Elasticsearch answered with `e` failed with: a conflict is fencing, and
/// the document is read back to say who set the version that won.
pub(crate) async fn fenced_or(
    store: &dyn DocStore,
    e: EsError,
    index: &str,
    id: &str,
    token: u64,
) -> GuardedError {
    match e {
        EsError::Conflict { reason, .. } => {
            let by = match store.get(index, id).await {
                Ok(Some(doc)) => {
                    let version = doc.meta.version.max(0) as u64;
                    match Stamp::of(&doc.source) {
                        Some(stamp) if stamp.token == version => FencedBy::Holder { version },
                        Some(_) => FencedBy::Outside { version },
                        // No stamp: a zkguard token (an index without stamps, or a write under
                        // an explicit lock by the caller's own client), or a smaller version
                        // set outside zkguard.
                        None if crate::zk::protocol::is_token(version) => {
                            FencedBy::Holder { version }
                        }
                        None => FencedBy::Outside { version },
                    }
                }
                Ok(None) | Err(_) => FencedBy::Unknown,
            };
            tracing::warn!(%index, %id, token, %by, %reason, "write fenced");
            GuardedError::Fenced {
                index: index.to_string(),
                id: id.to_string(),
                token,
                by,
                reason,
            }
        }
        other => GuardedError::Store(other),
    }
}

/// Builds and runs operations on one monitor object. Made by [`GuardedWriter::on`].
#[derive(Debug, Clone)]
#[must_use]
pub struct MonitorWriter {
    writer: GuardedWriter,
    monitor: String,
    lock_type: LockType,
    info: String,
}

impl MonitorWriter {
    /// Sets the lock type (default foreground).
    pub fn lock_type(mut self, lock_type: LockType) -> Self {
        self.lock_type = lock_type;
        self
    }

    /// Sets the description recorded with the lock (default `"guarded write"`).
    pub fn info(mut self, info: impl Into<String>) -> Self {
        self.info = info.into();
        self
    }

    /// The operation this builder would run for `kind` (with a fresh id).
    pub fn operation(&self, kind: OpKind) -> Operation {
        Operation::new(self.monitor.clone(), kind)
            .with_type(self.lock_type)
            .with_info(self.info.clone())
    }

    /// Runs an operation of the given kind; see [`GuardedWriter::run`].
    ///
    /// # Errors
    /// See [`GuardedWriter::run`].
    ///
    /// # Cancellation safety
    /// See [`GuardedWriter::run`].
    pub async fn execute(&self, kind: OpKind) -> Result<Written, GuardedError> {
        self.writer.run(&self.operation(kind)).await
    }

    /// Creates or replaces `index/id` with `doc`.
    ///
    /// # Errors
    /// See [`GuardedWriter::run`].
    ///
    /// # Cancellation safety
    /// See [`GuardedWriter::run`].
    pub async fn index(&self, index: &str, id: &str, doc: Value) -> Result<Written, GuardedError> {
        self.execute(OpKind::Index {
            index: index.into(),
            id: id.into(),
            doc,
        })
        .await
    }

    /// Merges `patch` (RFC 7386) into the existing document `index/id`.
    ///
    /// # Errors
    /// [`GuardedError::NotFound`] when there is no such document; see [`GuardedWriter::run`].
    ///
    /// # Cancellation safety
    /// See [`GuardedWriter::run`].
    pub async fn update(
        &self,
        index: &str,
        id: &str,
        patch: Value,
    ) -> Result<Written, GuardedError> {
        self.execute(OpKind::Update {
            index: index.into(),
            id: id.into(),
            change: Change::Merge { patch },
            upsert: false,
        })
        .await
    }

    /// Adds `by` to the numeric `field` (dotted path) of the existing document `index/id`.
    ///
    /// # Errors
    /// [`GuardedError::NotFound`], [`GuardedError::CannotApply`] for a non-numeric field; see
    /// [`GuardedWriter::run`].
    ///
    /// # Cancellation safety
    /// See [`GuardedWriter::run`].
    pub async fn increment(
        &self,
        index: &str,
        id: &str,
        field: &str,
        by: i64,
    ) -> Result<Written, GuardedError> {
        self.execute(OpKind::Update {
            index: index.into(),
            id: id.into(),
            change: Change::Increment {
                field: field.into(),
                by,
            },
            upsert: false,
        })
        .await
    }

    /// Deletes `index/id` with the given mode.
    ///
    /// # Errors
    /// See [`GuardedWriter::run`].
    ///
    /// # Cancellation safety
    /// See [`GuardedWriter::run`].
    pub async fn delete(
        &self,
        index: &str,
        id: &str,
        mode: DeleteMode,
    ) -> Result<Written, GuardedError> {
        self.execute(OpKind::Delete {
            index: index.into(),
            id: id.into(),
            mode,
        })
        .await
    }
}
