//! Background operations: retries with backoff, then dead letters.
//!
//! A [`BackgroundExecutor`] runs [`Operation`]s as background work
//! ([`LockType::Background`], the background lock timeout). An operation whose lock is not
//! acquired in time, or that fails transiently (Elasticsearch 429, 5xx or unreachable, ZooKeeper
//! connection or session trouble, a lock lost before the write was sent), is retried with
//! exponential backoff and jitter, up to `elastic.request.retry.count` attempts in all. Every
//! operation ends in exactly one [`Outcome`], or in a [`BackgroundError::Lost`]:
//!
//! - [`Outcome::Applied`]: written (or found already written by an earlier attempt whose answer
//!   was lost: the document records the operation id);
//! - [`Outcome::Parked`]: written to the dead-letter sink, durable before this is reported:
//!   after the last transient failure, or at once for failures that retrying cannot fix
//!   ([`super::guarded::GuardedError::Fenced`], a missing document, a field that cannot be
//!   incremented, a request Elasticsearch rejects). Nothing is dropped: a person looks at the
//!   entry and replays it (`zkguard dlq replay`) or removes it;
//! - [`Outcome::Rejected`]: the operation is malformed and can never be applied (bad monitor
//!   name, empty index, a document touching the reserved `zkguard` field);
//! - [`BackgroundError::Lost`]: the operation was not applied and the dead-letter sink refused
//!   it (a read-only or full disk, an unreachable dead-letter index). Parking is retried with
//!   backoff a few times first ([`PARK_TRIES`]); then the operation is neither in Elasticsearch
//!   nor in the sink, and the executor says so with an error, not an outcome: the caller cannot
//!   take it for handled. The error carries the complete [`DeadLetter`], so the caller still has
//!   the operation in memory, and the dead letter is also written to standard error as one JSON
//!   line (`zkguard: lost operation, dead letter: {...}`), bypassing log filters, so that it
//!   survives a caller that dropped the task's handle. It is counted in
//!   [`ExecutorStats::lost`].
//!
//! Foreground work is not retried here: [`BackgroundExecutor::run_foreground`] makes one attempt
//! and returns the lock error at once, so the waiting caller can answer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::Instrument;
use uuid::Uuid;

use crate::backoff::Backoff;
use crate::config::{RetrySettings, Settings};
use crate::lock::{LockError, LockType};
use crate::write::batch::Batcher;
use crate::write::deadletter::{DeadLetter, DeadLetterError, DeadLetterSink, ParkReason};
use crate::write::guarded::{GuardedError, GuardedWriter, Written};
use crate::write::ops::Operation;

/// How a background operation ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The operation is in Elasticsearch.
    Applied {
        /// The operation.
        op_id: Uuid,
        /// Attempts used (1 = first try).
        attempts: u32,
        /// The successful write.
        written: Written,
    },
    /// The operation can never be applied; see the reason.
    Rejected {
        /// The operation.
        op_id: Uuid,
        /// Why.
        reason: String,
    },
    /// The operation is in the dead-letter sink.
    Parked {
        /// The operation.
        op_id: Uuid,
        /// Attempts made.
        attempts: u32,
        /// Retries exhausted or not retryable.
        reason: ParkReason,
        /// The last error.
        error: String,
    },
}

impl Outcome {
    /// The operation id.
    pub fn op_id(&self) -> Uuid {
        match self {
            Self::Applied { op_id, .. }
            | Self::Rejected { op_id, .. }
            | Self::Parked { op_id, .. } => *op_id,
        }
    }

    /// Whether the operation was applied.
    pub fn is_applied(&self) -> bool {
        matches!(self, Self::Applied { .. })
    }

    /// Whether the operation was parked.
    pub fn is_parked(&self) -> bool {
        matches!(self, Self::Parked { .. })
    }
}

/// Counters of an executor, for reports (a snapshot; see [`BackgroundExecutor::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ExecutorStats {
    /// Background operations started.
    pub submitted: u64,
    /// Background operations applied.
    pub applied: u64,
    /// Of those, found already applied by an earlier attempt.
    pub already_applied: u64,
    /// Retries (attempts after the first).
    pub retried: u64,
    /// Background operations parked.
    pub parked: u64,
    /// Background operations rejected.
    pub rejected: u64,
    /// Writes rejected by fencing (background and foreground).
    pub fenced: u64,
    /// Failed attempts to write a dead letter (each retried a few times before giving up).
    pub park_failures: u64,
    /// Background operations lost: neither applied nor parked (see [`BackgroundError::Lost`]).
    pub lost: u64,
    /// Foreground operations applied.
    pub foreground_applied: u64,
    /// Foreground operations that failed (returned to the caller).
    pub foreground_failed: u64,
    /// Where background time goes (with
    /// [`BackgroundExecutorBuilder::batch_by_monitor`]; zero without): lock acquisitions of the
    /// monitors' lanes, the attempts applied under them, and the time spent waiting for them.
    pub lane_acquisitions: u64,
    /// Attempts applied under the lanes' acquisitions.
    pub lane_attempts: u64,
    /// Time the lanes waited for their locks, in microseconds.
    pub lock_wait_us: u64,
    /// `_mget` requests the lanes' reads went out in, and their time in microseconds.
    pub read_requests: u64,
    /// Time of those `_mget` requests, in microseconds.
    pub read_us: u64,
    /// `_bulk` requests the lanes' writes went out in.
    pub write_requests: u64,
    /// Writes sent in them.
    pub written: u64,
    /// Time of those `_bulk` requests, in microseconds.
    pub write_us: u64,
}

#[derive(Default)]
struct Counters {
    submitted: AtomicU64,
    applied: AtomicU64,
    already_applied: AtomicU64,
    retried: AtomicU64,
    parked: AtomicU64,
    rejected: AtomicU64,
    fenced: AtomicU64,
    park_failures: AtomicU64,
    lost: AtomicU64,
    foreground_applied: AtomicU64,
    foreground_failed: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

pub use super::batch::{BATCH_LOSS_WATCH_AFTER, BULK_MAX_BYTES};

/// How many times writing a dead letter is tried, with the executor's backoff between the
/// tries, before the operation is reported lost.
pub const PARK_TRIES: u32 = 5;

/// A background operation the caller must handle itself.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackgroundError {
    /// The operation was not applied, and the dead-letter sink refused it every time it was
    /// tried: it is in neither place. The complete dead letter is in the error (and was written
    /// to standard error as one JSON line).
    #[error("operation {op_id} ({summary}) is lost: it was not applied ({error}) and the dead-letter {sink} refused it {tries} times ({park_error}); make the sink writable, then park its dead letter again (append the JSON line printed on stderr to the dead-letter file) or submit the operation again")]
    Lost {
        /// The operation.
        op_id: Uuid,
        /// What it does.
        summary: String,
        /// Why it was not applied.
        error: String,
        /// The sink that refused it.
        sink: String,
        /// How many times parking was tried.
        tries: u32,
        /// The sink's last error.
        #[source]
        park_error: DeadLetterError,
        /// The dead letter that could not be written, with the complete operation.
        letter: Box<DeadLetter>,
    },
}

impl BackgroundError {
    /// The operation id.
    pub fn op_id(&self) -> Uuid {
        match self {
            Self::Lost { op_id, .. } => *op_id,
        }
    }

    /// The dead letter of the lost operation (the operation, complete, for a later replay).
    pub fn dead_letter(&self) -> &DeadLetter {
        match self {
            Self::Lost { letter, .. } => letter,
        }
    }
}

/// Builds a [`BackgroundExecutor`].
#[derive(Debug)]
#[must_use]
pub struct BackgroundExecutorBuilder {
    writer: GuardedWriter,
    sink: Arc<dyn DeadLetterSink>,
    attempts: u32,
    backoff_initial: Duration,
    backoff_max: Duration,
    lock_timeout: Option<Duration>,
    concurrency: usize,
    batch: Option<(usize, usize)>,
}

impl BackgroundExecutorBuilder {
    /// Takes attempts and backoff from the retry settings (`elastic.request.retry.count`,
    /// `elastic.retry.backoff.initial`, `elastic.retry.backoff.max`).
    pub fn retry(mut self, retry: &RetrySettings) -> Self {
        self.attempts = retry.retry_count.max(1);
        self.backoff_initial = retry.backoff_initial;
        self.backoff_max = retry.backoff_max;
        self
    }

    /// Attempts before parking (at least 1).
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts.max(1);
        self
    }

    /// First and largest retry delay.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.backoff_initial = initial;
        self.backoff_max = max;
        self
    }

    /// Overrides the background lock wait (default: the lock service's configured background
    /// timeout, `zookeeper.background.task.timeout`).
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = Some(timeout);
        self
    }

    /// How many background operations run at once (at least 1; default 16).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Groups background writes by monitor object: the attempts queued for one monitor run
    /// one after another under one lock acquisition (at most `max_per_lock` of them), and the
    /// writes of many monitors go to Elasticsearch in shared `_bulk` requests (at most
    /// `max_bulk` writes each; a request is sent as soon as the previous one is answered, with
    /// whatever was handed in meanwhile). Each write still carries its own lock's fencing token
    /// and records its operation id, so every guarantee of [`GuardedWriter::run`] holds per
    /// operation, as do retries, parking and the outcomes. Pair it with a larger
    /// [`BackgroundExecutorBuilder::concurrency`] (operations in flight): with 16 in flight, at
    /// most 16 writes can share a request.
    ///
    /// Without it (the default), every attempt is one [`GuardedWriter::run`]: one acquisition,
    /// one read and one write request.
    pub fn batch_by_monitor(mut self, max_per_lock: usize, max_bulk: usize) -> Self {
        self.batch = Some((max_per_lock.max(1), max_bulk.max(1)));
        self
    }

    /// The executor.
    pub fn build(self) -> BackgroundExecutor {
        let bg_writer = match self.lock_timeout {
            Some(t) => self.writer.clone().with_lock_timeout(t),
            None => self.writer.clone(),
        };
        let batcher = self
            .batch
            .map(|(per_lock, bulk)| Batcher::new(bg_writer.clone(), per_lock, bulk));
        BackgroundExecutor {
            inner: Arc::new(Inner {
                fg_writer: self.writer,
                batcher,
                bg_writer,
                sink: self.sink,
                attempts: self.attempts,
                backoff: Backoff::new(self.backoff_initial, self.backoff_max),
                permits: Arc::new(Semaphore::new(self.concurrency)),
                counters: Counters::default(),
            }),
        }
    }
}

/// Runs background operations with retries and dead letters. Cheap to clone (shared state).
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use serde_json::json;
/// use zkguard::config::Settings;
/// use zkguard::es::EsStore;
/// use zkguard::write::background::{BackgroundExecutor, Outcome};
/// use zkguard::write::deadletter::sink_from_settings;
/// use zkguard::write::guarded::GuardedWriter;
/// use zkguard::write::ops::Operation;
/// use zkguard::{ZkLockService, ZkSession};
///
/// let settings = Settings::load(None)?;
/// let store = Arc::new(EsStore::new(&settings.elasticsearch)?);
/// let locks = Arc::new(ZkLockService::new(ZkSession::connect(&settings.zookeeper).await?));
/// let writer = GuardedWriter::new(locks, store.clone());
/// let sink = sink_from_settings(&settings.retry, Some(store))?;
/// let executor = BackgroundExecutor::from_settings(writer, sink, &settings);
///
/// let op = Operation::merge("article-42", "articles", "42", json!({"searchable": true}))
///     .with_info("Bulk Propagation");
/// match executor.run(op).await? {
///     Outcome::Applied { attempts, .. } => println!("applied after {attempts} attempt(s)"),
///     Outcome::Parked { reason, .. } => println!("parked as a dead letter: {reason}"),
///     Outcome::Rejected { reason, .. } => println!("rejected: {reason}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct BackgroundExecutor {
    inner: Arc<Inner>,
}

struct Inner {
    fg_writer: GuardedWriter,
    bg_writer: GuardedWriter,
    batcher: Option<Arc<Batcher>>,
    sink: Arc<dyn DeadLetterSink>,
    attempts: u32,
    backoff: Backoff,
    permits: Arc<Semaphore>,
    counters: Counters,
}

impl std::fmt::Debug for BackgroundExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackgroundExecutor")
            .field("sink", &self.inner.sink.describe())
            .field("attempts", &self.inner.attempts)
            .field("stats", &self.stats())
            .finish()
    }
}

impl BackgroundExecutor {
    /// A builder with the default retry settings (3 attempts, 100 ms to 5 s backoff) and a
    /// concurrency of 16.
    pub fn builder(
        writer: GuardedWriter,
        sink: Arc<dyn DeadLetterSink>,
    ) -> BackgroundExecutorBuilder {
        BackgroundExecutorBuilder {
            writer,
            sink,
            attempts: 3,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            lock_timeout: None,
            concurrency: 16,
            batch: None,
        }
        .retry(&Settings::default().retry)
    }

    /// An executor configured from `settings` (retry count and backoff).
    pub fn from_settings(
        writer: GuardedWriter,
        sink: Arc<dyn DeadLetterSink>,
        settings: &Settings,
    ) -> Self {
        Self::builder(writer, sink).retry(&settings.retry).build()
    }

    /// The dead-letter sink.
    pub fn sink(&self) -> &Arc<dyn DeadLetterSink> {
        &self.inner.sink
    }

    /// The writer used for foreground operations.
    pub fn writer(&self) -> &GuardedWriter {
        &self.inner.fg_writer
    }

    /// The stage counters of the lanes, alone.
    fn stage_stats(&self) -> ExecutorStats {
        let Some(b) = &self.inner.batcher else {
            return ExecutorStats::default();
        };
        let s = &b.stages;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ExecutorStats {
            lane_acquisitions: get(&s.acquisitions),
            lane_attempts: get(&s.attempts),
            lock_wait_us: get(&s.lock_wait_us),
            read_requests: get(&s.reads),
            read_us: get(&s.read_us),
            write_requests: get(&s.writes),
            written: get(&s.written),
            write_us: get(&s.write_us),
            ..ExecutorStats::default()
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> ExecutorStats {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ExecutorStats {
            submitted: get(&c.submitted),
            applied: get(&c.applied),
            already_applied: get(&c.already_applied),
            retried: get(&c.retried),
            parked: get(&c.parked),
            rejected: get(&c.rejected),
            fenced: get(&c.fenced),
            park_failures: get(&c.park_failures),
            lost: get(&c.lost),
            foreground_applied: get(&c.foreground_applied),
            foreground_failed: get(&c.foreground_failed),
            ..self.stage_stats()
        }
    }

    /// Runs `op` as background work (its lock type is set to background), waiting for a
    /// concurrency slot first, with retries and parking; see the module documentation. The
    /// operation counts as accepted when it is handed in ([`Operation::accept`]), unless its
    /// [`Operation::accepted`] is set already.
    ///
    /// # Errors
    /// [`BackgroundError::Lost`] when the operation was not applied and could not be parked.
    ///
    /// # Cancellation safety
    /// Not cancel-safe: a dropped run may leave the operation applied, parked, or neither.
    /// Use [`BackgroundExecutor::submit`] to run operations to completion in a task.
    pub async fn run(&self, op: Operation) -> Result<Outcome, BackgroundError> {
        let op = op.accept();
        let permit = self
            .inner
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let outcome = self.inner.run_background(op, None).await;
        drop(permit);
        outcome
    }

    /// Accepts `op` ([`Operation::accept`]), waits for a concurrency slot, then runs it in a
    /// task (so that a producer slows down
    /// when the executor is saturated). The task runs to completion even if the handle is
    /// dropped; its result is that of [`BackgroundExecutor::run`] (a lost operation's dead
    /// letter also goes to standard error, so a dropped handle loses no operation text).
    ///
    /// # Cancellation safety
    /// Cancel-safe: if dropped while waiting for a slot, the operation was not started.
    pub async fn submit(&self, op: Operation) -> JoinHandle<Result<Outcome, BackgroundError>> {
        let op = op.accept();
        let permit = self
            .inner
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let inner = self.inner.clone();
        let op = op.with_type(LockType::Background);
        // The first attempt joins its monitor's lane now, in the order of the submissions: a
        // spawned task's start is not ordered, and two operations of one document applied
        // out of order would leave the older one's content.
        let first = inner.batcher.as_ref().map(|b| b.enqueue(op.clone()));
        tokio::spawn(async move {
            let outcome = inner.run_background(op, first).await;
            drop(permit);
            outcome
        })
    }

    /// Runs `op` as foreground work (its lock type is set to foreground): one attempt, no retry,
    /// no parking; the error goes back to the caller at once.
    ///
    /// # Errors
    /// See [`GuardedWriter::run`].
    ///
    /// # Cancellation safety
    /// See [`GuardedWriter::run`].
    pub async fn run_foreground(&self, op: Operation) -> Result<Written, GuardedError> {
        let op = op.with_type(LockType::Foreground);
        let c = &self.inner.counters;
        match self.inner.fg_writer.run(&op).await {
            Ok(w) => {
                bump(&c.foreground_applied);
                Ok(w)
            }
            Err(e) => {
                if matches!(e, GuardedError::Fenced { .. }) {
                    bump(&c.fenced);
                }
                bump(&c.foreground_failed);
                Err(e)
            }
        }
    }
}

/// An attempt already put in its monitor's lane (`Batcher::enqueue`).
type Queued = Result<tokio::sync::oneshot::Receiver<Result<Written, GuardedError>>, GuardedError>;

fn never_applicable(e: &GuardedError) -> bool {
    matches!(
        e,
        GuardedError::Invalid(_)
            | GuardedError::WrongGuard { .. }
            | GuardedError::Lock(LockError::InvalidMonitor { .. } | LockError::InfoTooLong { .. })
    )
}

impl Inner {
    /// Runs `op` with retries; `first`, when given, is its first attempt already in its lane.
    async fn run_background(
        &self,
        op: Operation,
        first: Option<Queued>,
    ) -> Result<Outcome, BackgroundError> {
        let op = op.with_type(LockType::Background);
        let span = tracing::info_span!(
            "background_op",
            op = %op.id,
            monitor = %op.monitor,
            target = %format_args!("{}/{}", op.target_index(), op.target_id()),
        );
        self.run_with_retries(op, first).instrument(span).await
    }

    async fn run_with_retries(
        &self,
        op: Operation,
        mut first: Option<Queued>,
    ) -> Result<Outcome, BackgroundError> {
        let c = &self.counters;
        bump(&c.submitted);
        let first_attempt = SystemTime::now();
        let mut backoff = self.backoff;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = match (first.take(), &self.batcher) {
                (Some(queued), _) => super::batch::answer(queued).await,
                (None, Some(batcher)) => batcher.run(op.clone()).await,
                (None, None) => self.bg_writer.run(&op).await,
            };
            let error = match result {
                Ok(written) => {
                    bump(&c.applied);
                    if written.already_applied {
                        bump(&c.already_applied);
                    }
                    tracing::debug!(attempt, "applied");
                    return Ok(Outcome::Applied {
                        op_id: op.id,
                        attempts: attempt,
                        written,
                    });
                }
                Err(e) => e,
            };
            if matches!(error, GuardedError::Fenced { .. }) {
                bump(&c.fenced);
            }
            if never_applicable(&error) {
                bump(&c.rejected);
                tracing::warn!(error = %error, "operation rejected");
                return Ok(Outcome::Rejected {
                    op_id: op.id,
                    reason: error.to_string(),
                });
            }
            if error.is_transient() && attempt < self.attempts {
                bump(&c.retried);
                let delay = backoff.next_delay();
                tracing::info!(attempt, error = %error, delay_ms = delay.as_millis() as u64, "transient failure; retrying");
                tokio::time::sleep(delay).await;
                continue;
            }
            return self.park(&op, attempt, &error, first_attempt).await;
        }
    }

    /// Parks `op`, trying the sink [`PARK_TRIES`] times with backoff; lost when it never
    /// accepts the dead letter.
    async fn park(
        &self,
        op: &Operation,
        attempts: u32,
        error: &GuardedError,
        first_attempt: SystemTime,
    ) -> Result<Outcome, BackgroundError> {
        let c = &self.counters;
        let letter = DeadLetter::new(op, attempts, error, first_attempt, SystemTime::now());
        let mut backoff = self.backoff;
        let mut tries = 0;
        let park_error = loop {
            tries += 1;
            match self.sink.park(&letter).await {
                Ok(()) => {
                    bump(&c.parked);
                    tracing::warn!(attempts, reason = %letter.reason, error = %error, sink = %self.sink.describe(), "operation parked");
                    return Ok(Outcome::Parked {
                        op_id: op.id,
                        attempts,
                        reason: letter.reason,
                        error: error.to_string(),
                    });
                }
                Err(e) => {
                    bump(&c.park_failures);
                    if tries >= PARK_TRIES {
                        break e;
                    }
                    let delay = backoff.next_delay();
                    tracing::warn!(tries, park_error = %e, delay_ms = delay.as_millis() as u64, "the dead-letter sink refused the operation; trying again");
                    tokio::time::sleep(delay).await;
                }
            }
        };
        bump(&c.lost);
        Err(lost(letter, error, self.sink.describe(), tries, park_error))
    }
}

/// The error of a lost operation; its dead letter also goes to standard error in one line.
fn lost(
    letter: DeadLetter,
    error: &GuardedError,
    sink: String,
    tries: u32,
    park_error: DeadLetterError,
) -> BackgroundError {
    let payload = serde_json::to_string(&letter)
        .unwrap_or_else(|e| format!("{{\"id\":\"{}\",\"encoding_error\":\"{e}\"}}", letter.id));
    tracing::error!(
        op = %letter.id,
        error = %error,
        park_error = %park_error,
        "operation LOST: not applied, and the dead-letter sink refused it"
    );
    // The last copy of the operation outside the caller's memory: not subject to log filters.
    eprintln!("zkguard: lost operation, dead letter: {payload}");
    BackgroundError::Lost {
        op_id: letter.id,
        summary: letter.operation.summary(),
        error: error.to_string(),
        sink,
        tries,
        park_error,
        letter: Box::new(letter),
    }
}
