//! The coordinator of document transactions: locks, log, fenced writes, commit, clear.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;
use tracing::{info, warn, Instrument};

use super::plan::{after_image, failed_expectation, op_id, stamped, validate};
use super::record::{log_mappings, marked_by, Participant, TxnRecord};
use super::{Action, MultiError, MultiHook, MultiState, Outcome, Point, TxnRequest};
use crate::config::TxnSettings;
use crate::es::{BulkAction, Doc, DocMeta, DocStore, EsError, Refresh, WriteCondition};
use crate::lock::{Guard, LockError, LockRequest, LockService, LockType};
use crate::txn::{now_rfc3339, RetryPolicy};
use crate::write::stamp_mapping::StampMapping;

/// Runs document transactions over a lock service and an Elasticsearch store; cheap to share
/// behind an `Arc`.
pub struct Transactions {
    pub(super) locks: Arc<dyn LockService>,
    pub(super) store: Arc<dyn DocStore>,
    pub(super) settings: TxnSettings,
    pub(super) retry: RetryPolicy,
    pub(super) lock_timeout: Option<Duration>,
    pub(super) refresh: Refresh,
    pub(super) stamp_window: usize,
    unstamped: crate::write::stamping::IndexPatterns,
    /// The `zkguard` object's mapping, put before the first write to each index
    /// (`elastic.stamp.mapping`), as guarded writes do.
    mapping: Arc<StampMapping>,
    hook: Option<Arc<dyn MultiHook>>,
    ready: OnceCell<()>,
}

impl std::fmt::Debug for Transactions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transactions")
            .field("log_index", &self.settings.log_index)
            .field("backend", &self.locks.backend_name())
            .finish_non_exhaustive()
    }
}

/// The locks of a transaction, in canonical order, by monitor.
pub(super) struct Held {
    guards: Vec<(String, Box<dyn Guard>)>,
}

impl Held {
    /// The token of the lock on `monitor`.
    pub(super) fn token(&self, monitor: &str) -> u64 {
        self.guards
            .iter()
            .find(|(m, _)| m == monitor)
            .map(|(_, g)| g.fencing_token())
            .expect("every participant's monitor is locked")
    }

    /// The first lock that is no longer held, with why.
    pub(super) fn lost(&self) -> Option<String> {
        self.guards
            .iter()
            .find(|(_, g)| !g.is_held())
            .map(|(m, g)| format!("the lock on `{m}` was lost ({})", g.why_not_held()))
    }

    pub(super) async fn release(self, locks: &dyn LockService) {
        let guards = self.guards.into_iter().map(|(_, g)| g).collect();
        locks
            .release_all(guards)
            .await
            .detach("releasing a transaction's locks failed");
    }
}

/// How taking a transaction's locks ended.
pub(super) enum Locking {
    Held(Held),
    /// A lock was not acquired in time: `(monitor, message)`.
    TimedOut(String, String),
}

impl Transactions {
    /// Transactions over `locks` and `store`, logged in `settings.log_index`, with the limits of
    /// `settings` and the lock types' configured timeouts.
    pub fn new(
        locks: Arc<dyn LockService>,
        store: Arc<dyn DocStore>,
        settings: TxnSettings,
    ) -> Self {
        Self {
            locks,
            store,
            settings,
            retry: RetryPolicy::default(),
            lock_timeout: None,
            refresh: Refresh::No,
            stamp_window: crate::write::ops::DEFAULT_OPS_WINDOW,
            unstamped: Default::default(),
            mapping: Arc::new(StampMapping::new(true)),
            hook: None,
            ready: OnceCell::new(),
        }
    }

    /// Sets how transient Elasticsearch failures are retried.
    #[must_use]
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = RetryPolicy {
            attempts: retry.attempts.max(1),
            ..retry
        };
        self
    }

    /// Waits at most `timeout` for all the locks of a transaction together (default: each lock
    /// waits up to its lock type's configured timeout).
    #[must_use]
    pub fn with_lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = Some(timeout);
        self
    }

    /// When the documents' writes become visible to searches (default: at the next refresh).
    #[must_use]
    pub fn with_refresh(mut self, refresh: Refresh) -> Self {
        self.refresh = refresh;
        self
    }

    /// How many operation ids each document's stamp remembers, and the indices whose documents
    /// carry no stamp (`elastic.stamp.*`): a transaction marks its writes in the stamp, so those
    /// indices are refused.
    #[must_use]
    pub fn with_stamp_settings(mut self, settings: &crate::config::StampSettings) -> Self {
        self.stamp_window = settings.window;
        self.unstamped = settings.off.clone();
        self.mapping = Arc::new(StampMapping::new(settings.map));
        self
    }

    /// Installs a crash-injection hook.
    #[doc(hidden)]
    #[must_use]
    pub fn with_hook(mut self, hook: Arc<dyn MultiHook>) -> Self {
        self.hook = Some(hook);
        self
    }

    /// The settings in use.
    pub fn settings(&self) -> &TxnSettings {
        &self.settings
    }

    /// Creates the log index with its mappings unless it exists (called once per value before
    /// the first use).
    ///
    /// # Errors
    /// [`MultiError::Store`] when Elasticsearch fails.
    ///
    /// # Cancellation safety
    /// Cancel-safe: creating an index is idempotent.
    pub async fn ensure_index(&self) -> Result<(), MultiError> {
        self.ready
            .get_or_try_init(|| async {
                let index = &self.settings.log_index;
                let mappings = crate::es::own_index_body(log_mappings());
                self.retrying(|| self.store.ensure_index(index, &mappings))
                    .await
                    .map_err(|e| store_err(format!("creating the log index `{index}`"), e))
            })
            .await
            .map(|_| ())
    }

    /// The logged transaction `id`, if any.
    ///
    /// # Errors
    /// [`MultiError::Store`], [`MultiError::Corrupt`].
    ///
    /// # Cancellation safety
    /// Cancel-safe: it only reads.
    pub async fn get(&self, id: &str) -> Result<Option<TxnRecord>, MultiError> {
        self.ensure_index().await?;
        let index = &self.settings.log_index;
        let doc = self
            .retrying(|| self.store.get(index, id))
            .await
            .map_err(|e| store_err(format!("reading transaction `{id}`"), e))?;
        doc.map(|d| TxnRecord::from_doc(index, d)).transpose()
    }

    /// Applies `request` all-or-nothing and returns the decision: committed (every document
    /// changed, each with its new version) or rolled back (none changed, with the reason: the
    /// expectation that failed, naming the document, or the lock that was not acquired in time,
    /// naming the monitor in the way).
    ///
    /// Applying an id again with the same operations answers the stored decision.
    ///
    /// # Errors
    /// - [`MultiError::Invalid`], [`MultiError::TooLarge`]: nothing was locked or written;
    /// - [`MultiError::IdConflict`]: the id names other operations;
    /// - [`MultiError::InProgress`]: the id names a transaction still undecided;
    /// - [`MultiError::Lock`]: a lock failed otherwise than by a timeout (nothing written);
    /// - [`MultiError::Fenced`], [`MultiError::Store`]: the coordinator stopped after logging;
    ///   recovery finishes or undoes the transaction (never leaves it half-applied).
    ///
    /// # Cancellation safety
    /// Not cancel-safe in effect, but safe in outcome: dropped half-way, the locks go with the
    /// guards and a logged transaction is left for recovery, as after a crash.
    pub async fn apply(&self, request: TxnRequest) -> Result<Outcome, MultiError> {
        let span = tracing::info_span!(
            "document_transaction",
            txn = %request.id,
            lock_type = %request.lock_type,
            documents = request.operations.len(),
        );
        self.apply_inner(request).instrument(span).await
    }

    async fn apply_inner(&self, req: TxnRequest) -> Result<Outcome, MultiError> {
        validate(&req, &self.settings, &self.unstamped)?;
        self.ensure_index().await?;
        if let Some(existing) = self.get(&req.id).await? {
            return answer_existing(existing, &req);
        }
        let id = req.id.clone();
        let held = match self
            .lock_all(
                &req.operations,
                req.lock_type,
                req.lock_timeout.or(self.lock_timeout),
                &id,
            )
            .await?
        {
            Locking::Held(h) => h,
            Locking::TimedOut(monitor, message) => {
                let failed = req
                    .operations
                    .iter()
                    .find(|op| op.monitor_name() == monitor)
                    .map(|op| format!("{}/{}", op.index, op.id));
                return self.refuse(&req, message, failed, Some(monitor)).await;
            }
        };
        self.stop(&id, Point::Locked).await?;
        // Read every document under its lock, check the expectations, compute the after-images.
        let docs = self.read_all(&req.operations).await?;
        let docs = match self.resolve_marks(&id, &req.operations, docs, &held).await {
            Ok(docs) => docs,
            Err(e) => {
                held.release(self.locks.as_ref()).await;
                return Err(e);
            }
        };
        let mut afters = Vec::with_capacity(docs.len());
        for (op, doc) in req.operations.iter().zip(&docs) {
            let failure = failed_expectation(op, doc.as_ref()).or_else(|| {
                after_image(op, doc.as_ref().map(|d| &d.source))
                    .map(|a| afters.push(a))
                    .err()
            });
            if let Some(reason) = failure {
                held.release(self.locks.as_ref()).await;
                let failed = Some(format!("{}/{}", op.index, op.id));
                return self.refuse(&req, reason, failed, None).await;
            }
        }
        let participants: Vec<Participant> = req
            .operations
            .iter()
            .zip(&docs)
            .map(|(op, doc)| Participant {
                found: doc.is_some(),
                before: doc.as_ref().map(|d| d.source.clone()),
                token: held.token(&op.monitor_name()),
            })
            .collect();
        let mut record = TxnRecord::new(&req, MultiState::Pending, participants);
        match self.log_write(&record, WriteCondition::Create).await {
            Ok(meta) => record.meta = meta,
            Err(MultiError::Store {
                source: EsError::Conflict { .. },
                ..
            }) => match self.get(&id).await? {
                // A retried create whose first reply was lost: the record is this one (the
                // tokens are of this coordinator's locks).
                Some(existing) if existing.participants == record.participants => {
                    record.meta = existing.meta;
                }
                // Another coordinator logged the same id meanwhile.
                other => {
                    held.release(self.locks.as_ref()).await;
                    return match other {
                        Some(existing) => answer_existing(existing, &req),
                        None => Err(MultiError::InProgress {
                            id,
                            state: MultiState::Pending,
                        }),
                    };
                }
            },
            Err(e) => {
                held.release(self.locks.as_ref()).await;
                return Err(e);
            }
        }
        self.stop(&id, Point::Logged).await?;
        // Apply: every document fenced with its lock's token and marked, in one _bulk (two
        // when a hook intervenes part-way).
        let order = canonical(&req.operations);
        let n = order.len();
        let cut = (1..n)
            .find(|&k| {
                self.hook
                    .as_ref()
                    .is_some_and(|h| h.intervenes(Point::Applied(k)))
            })
            .unwrap_or(n);
        for (from, to) in [(0, cut), (cut, n)] {
            if from == to {
                continue;
            }
            let writes: Vec<BulkAction> = order[from..to]
                .iter()
                .map(|&i| {
                    let token = record.participants[i].token;
                    let op = &record.operations[i];
                    BulkAction::Index {
                        index: op.index.clone(),
                        id: op.id.clone(),
                        source: stamped(
                            self.stamp_window,
                            afters[i].clone(),
                            record.participants[i].before.as_ref(),
                            &op_id(&id, i, false),
                            token,
                            Some(&id),
                        ),
                        condition: crate::write::fence::condition(token),
                    }
                })
                .collect();
            // Every index written is stamped (`validate`): its object mapped first, once.
            for index in order[from..to].iter().map(|&i| &record.operations[i].index) {
                self.mapping.ensure(self.store.as_ref(), index).await;
            }
            if let Some(lost) = held.lost() {
                return Err(self.fenced(&id, lost));
            }
            let applied = self.bulk(&writes).await;
            let failure = match &applied {
                Err(e) => Some(e.to_string()),
                Ok(items) => items.iter().zip(&order[from..to]).find_map(|(r, &i)| {
                    r.as_ref().err().map(|e| {
                        let op = &record.operations[i];
                        format!("writing `{}/{}` failed: {e}", op.index, op.id)
                    })
                }),
            };
            if let Some(reason) = failure {
                warn!(txn = %id, %reason, "a write of the transaction failed; undoing it");
                return self.undo_own(record, held, reason).await;
            }
            self.stop(&id, Point::Applied(to)).await?;
        }
        // Commit: the decision, taken only while every lock is still held, and only if the log
        // is as this coordinator wrote it (recovery changes it before undoing anything).
        if let Some(lost) = held.lost() {
            return Err(self.fenced(&id, lost));
        }
        record.state = MultiState::Committed;
        record.modified = now_rfc3339();
        record.meta = self.log_cas(&record).await?;
        self.stop(&id, Point::Committed).await?;
        let outcome = record.outcome().expect("a committed record has an outcome");
        // Clear the marks: the after-images again, unmarked, with the same tokens.
        let clears: Vec<BulkAction> = order
            .iter()
            .map(|&i| {
                clear_action(
                    self.stamp_window,
                    &record,
                    i,
                    &afters[i],
                    record.participants[i].token,
                )
            })
            .collect();
        let cleared = self.bulk(&clears).await;
        let all_cleared = cleared
            .as_ref()
            .is_ok_and(|items| items.iter().all(Result::is_ok));
        if !all_cleared {
            warn!(txn = %id, "committed, but some marks could not be cleared; recovery clears them");
            held.release(self.locks.as_ref()).await;
            return Ok(outcome);
        }
        self.stop(&id, Point::Cleared).await?;
        record.state = MultiState::Finished;
        record.modified = now_rfc3339();
        if let Err(e) = self.log_cas(&record).await {
            warn!(txn = %id, error = %e, "committed and cleared, but the log could not say finished; recovery will");
        }
        self.stop(&id, Point::Finished).await?;
        held.release(self.locks.as_ref()).await;
        info!(txn = %id, "committed");
        Ok(outcome)
    }

    /// Takes the locks of `ops` in canonical order (sorted monitors, each once), within
    /// `timeout` for all of them (`None`: each its lock type's configured timeout).
    ///
    /// First every lock is tried at once, trying once: on quiet monitors their fast paths go
    /// to ZooKeeper together, in one multi (a bulk acquisition). The locks taken in canonical
    /// order up to the first one that was not are kept, the others given back, and the rest
    /// are then taken one by one in order, waiting. A transaction thus only ever waits while
    /// holding a prefix of its locks in canonical order: no deadlock between transactions.
    ///
    /// # Errors
    /// [`MultiError::Lock`] for a failure other than a timeout (the locks taken are released).
    pub(super) async fn lock_all(
        &self,
        ops: &[super::TxnOp],
        lock_type: LockType,
        timeout: Option<Duration>,
        id: &str,
    ) -> Result<Locking, MultiError> {
        let monitors: Vec<String> = ops
            .iter()
            .map(super::TxnOp::monitor_name)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let request = |monitor: &str, wait: Option<Duration>| {
            let request =
                LockRequest::new(monitor, format!("transaction {id}")).with_type(lock_type);
            match wait {
                Some(wait) => request.with_timeout(wait),
                None => request,
            }
        };
        // `timeout` is for all the locks together: each waits what is left of it.
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let tries = futures::future::join_all(
            monitors
                .iter()
                .map(|m| self.locks.acquire(request(m, Some(Duration::ZERO)))),
        )
        .await;
        let mut held = Held {
            guards: Vec::with_capacity(monitors.len()),
        };
        let mut given_back = Vec::new();
        let mut first_missing: Option<(usize, LockError)> = None;
        let mut failure = None;
        for (i, (monitor, tried)) in monitors.iter().zip(tries).enumerate() {
            match tried {
                Ok(guard) if first_missing.is_none() => held.guards.push((monitor.clone(), guard)),
                Ok(guard) => given_back.push(guard),
                Err(e @ LockError::Timeout { .. }) => {
                    first_missing.get_or_insert((i, e));
                }
                // A try that ZooKeeper did not answer within its bound to give up (the try has no
                // wait of its own) is tried again below, within what the transaction may wait.
                Err(e @ LockError::ConnectionLoss { .. }) if timeout != Some(Duration::ZERO) => {
                    first_missing.get_or_insert((i, e));
                }
                // Every lock is given back below.
                Err(source) => {
                    failure.get_or_insert((monitor.clone(), source));
                }
            }
        }
        if !given_back.is_empty() {
            self.locks
                .release_all(given_back)
                .await
                .detach("giving back a transaction's locks taken out of order failed");
        }
        if let Some((monitor, source)) = failure {
            held.release(self.locks.as_ref()).await;
            return Err(MultiError::Lock { monitor, source });
        }
        let Some((from, tried)) = first_missing else {
            return Ok(Locking::Held(held));
        };
        if timeout == Some(Duration::ZERO) {
            held.release(self.locks.as_ref()).await;
            let message = tried
                .try_once_message()
                .unwrap_or_else(|| tried.to_string());
            return Ok(Locking::TimedOut(monitors[from].clone(), message));
        }
        for monitor in &monitors[from..] {
            let wait = deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
            match self.locks.acquire(request(monitor, wait)).await {
                Ok(guard) => held.guards.push((monitor.clone(), guard)),
                Err(e @ LockError::Timeout { .. }) => {
                    held.release(self.locks.as_ref()).await;
                    return Ok(Locking::TimedOut(monitor.clone(), e.to_string()));
                }
                Err(source) => {
                    held.release(self.locks.as_ref()).await;
                    return Err(MultiError::Lock {
                        monitor: monitor.clone(),
                        source,
                    });
                }
            }
        }
        Ok(Locking::Held(held))
    }

    /// Realtime reads of every document of `ops`, in order.
    pub(super) async fn read_all(
        &self,
        ops: &[super::TxnOp],
    ) -> Result<Vec<Option<Doc>>, MultiError> {
        let keys: Vec<(String, String)> = ops
            .iter()
            .map(|op| (op.index.clone(), op.id.clone()))
            .collect();
        let items = self
            .retrying(|| self.store.mget(&keys))
            .await
            .map_err(|e| store_err("reading the transaction's documents", e))?;
        items
            .into_iter()
            .zip(&keys)
            .map(|(r, (index, id))| r.map_err(|e| store_err(format!("reading `{index}/{id}`"), e)))
            .collect()
    }

    /// Logs a transaction refused before any write, and answers it rolled back.
    async fn refuse(
        &self,
        req: &TxnRequest,
        reason: String,
        failed: Option<String>,
        blocked_by: Option<String>,
    ) -> Result<Outcome, MultiError> {
        info!(txn = %req.id, %reason, "rolled back before any write");
        let record = TxnRecord {
            reason: Some(reason),
            failed,
            blocked_by,
            ..TxnRecord::new(req, MultiState::RolledBack, Vec::new())
        };
        match self.log_write(&record, WriteCondition::Create).await {
            Ok(_) => Ok(record.outcome().expect("rolled back")),
            Err(MultiError::Store {
                source: EsError::Conflict { .. },
                ..
            }) => match self.get(&req.id).await? {
                Some(existing) => answer_existing(existing, req),
                None => Ok(record.outcome().expect("rolled back")),
            },
            Err(e) => Err(e),
        }
    }

    /// Undoes a transaction whose apply failed, while its coordinator still holds the locks.
    async fn undo_own(
        &self,
        mut record: TxnRecord,
        held: Held,
        reason: String,
    ) -> Result<Outcome, MultiError> {
        let result = self.roll_back(&mut record, &held, &reason, false).await;
        held.release(self.locks.as_ref()).await;
        result?;
        Ok(record.outcome().expect("rolled back"))
    }

    /// Writes the log document.
    pub(super) async fn log_write(
        &self,
        record: &TxnRecord,
        condition: WriteCondition,
    ) -> Result<DocMeta, MultiError> {
        let index = &self.settings.log_index;
        let source = record.to_source();
        let id = &record.transaction_id;
        self.retrying(|| self.store.index(index, id, &source, condition, Refresh::No))
            .await
            .map_err(|e| store_err(format!("logging transaction `{id}` as {}", record.state), e))
    }

    pub(super) async fn bulk(
        &self,
        actions: &[BulkAction],
    ) -> Result<Vec<Result<DocMeta, EsError>>, EsError> {
        if actions.is_empty() {
            return Ok(Vec::new());
        }
        self.retrying(|| self.store.bulk(actions, self.refresh))
            .await
    }

    /// Runs `op`, retrying transient failures per the retry policy.
    pub(super) async fn retrying<T, F, Fut>(&self, op: F) -> Result<T, EsError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, EsError>>,
    {
        self.retry.run(op).await
    }

    async fn asks_stop(&self, id: &str, point: Point) -> bool {
        match &self.hook {
            Some(hook) => hook.stop_at(id, point).await,
            None => false,
        }
    }

    async fn stop(&self, id: &str, point: Point) -> Result<(), MultiError> {
        if self.asks_stop(id, point).await {
            return Err(self.interrupted(id, point));
        }
        Ok(())
    }

    fn interrupted(&self, id: &str, point: Point) -> MultiError {
        info!(txn = %id, %point, "injected crash");
        MultiError::Interrupted {
            id: id.to_string(),
            point: point.to_string(),
        }
    }

    fn fenced(&self, id: &str, reason: String) -> MultiError {
        warn!(txn = %id, %reason, "the coordinator stops; recovery decides the transaction");
        MultiError::Fenced {
            id: id.to_string(),
            reason,
        }
    }
}

/// The answer for a request whose id is logged already.
fn answer_existing(existing: TxnRecord, req: &TxnRequest) -> Result<Outcome, MultiError> {
    if existing.operations != req.operations {
        return Err(MultiError::IdConflict { id: req.id.clone() });
    }
    match existing.outcome() {
        Some(outcome) => Ok(Outcome {
            replayed: true,
            ..outcome
        }),
        None => Err(MultiError::InProgress {
            id: req.id.clone(),
            state: existing.state,
        }),
    }
}

/// The operations' positions in canonical order: by monitor, then index and id (the order the
/// locks are taken in and the documents written in).
pub(super) fn canonical(ops: &[super::TxnOp]) -> Vec<usize> {
    let mut keyed: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        keyed.insert((op.monitor_name(), op.index.clone(), op.id.clone()), i);
    }
    keyed.into_values().collect()
}

/// The write that leaves participant `i` in its after state, unmarked, with `token`.
pub(super) fn clear_action(
    window: usize,
    record: &TxnRecord,
    i: usize,
    after: &Option<serde_json::Value>,
    token: u64,
) -> BulkAction {
    let op = &record.operations[i];
    match after {
        None => BulkAction::Delete {
            index: op.index.clone(),
            id: op.id.clone(),
            condition: crate::write::fence::condition(token),
        },
        Some(source) => BulkAction::Index {
            index: op.index.clone(),
            id: op.id.clone(),
            // The stamp of the marked write without the mark: its op id stays recorded.
            source: stamped(
                window,
                Some(source.clone()),
                record.participants[i].before.as_ref(),
                &op_id(&record.transaction_id, i, false),
                token,
                None,
            ),
            condition: crate::write::fence::condition(token),
        },
    }
}

/// Whether a document read now is the marked write of `record`: it carries the mark, and as
/// the transaction's own write ([`super::record::is_own_write`]), not as a copy a later writer
/// made.
pub(super) fn is_marked(doc: Option<&Doc>, record: &TxnRecord) -> bool {
    doc.is_some_and(|d| {
        marked_by(&d.source, &record.transaction_id) && super::record::is_own_write(d)
    })
}

/// The condition "unchanged since read at `meta`".
pub(super) fn if_match(meta: DocMeta) -> WriteCondition {
    WriteCondition::IfMatch {
        seq_no: meta.seq_no,
        primary_term: meta.primary_term,
    }
}

pub(super) fn store_err(context: impl Into<String>, source: EsError) -> MultiError {
    MultiError::Store {
        context: context.into(),
        source,
    }
}

impl Action {
    /// Whether the operation leaves the document absent.
    pub fn deletes(self) -> bool {
        self == Action::Delete
    }
}
