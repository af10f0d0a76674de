//! The demo workload behind `zkguard demo`: foreground "Save Content" writers and background
//! "Bulk Propagation" jobs on overlapping articles, with a report and a reconciliation.
//!
//! [`run()`] seeds a set of articles, then runs at the same time
//!
//! - foreground writers, each saving random articles one after the other (one attempt per save,
//!   through [`BackgroundExecutor::run_foreground`]: a person is waiting, so no retries);
//! - background jobs, each propagating a change to a random set of articles through the
//!   [`BackgroundExecutor`] (retries with backoff, then the dead-letter sink);
//! - a *slow editor* who holds one article's lock longer than the background retry budget, so
//!   the background operations on it are retried and finally parked as dead letters;
//! - a *stalled writer* (ZooKeeper backend only) who takes an article's lock, stalls before its
//!   write is sent while its ZooKeeper session expires and another writer saves the article, and
//!   then sends its write: Elasticsearch rejects it through the fencing token.
//!
//! Every save adds 1 to the article's `saves` field and every propagation adds 1 to its
//! `propagations` field, by guarded read-modify-write. Afterwards the parked operations of the
//! run are replayed (unless [`DemoPlan::replay`] is off) and [`reconcile`] checks every operation
//! against Elasticsearch: an applied operation must be recorded in its document, a rejected,
//! parked or lost one must not, a parked one must be in the dead-letter sink, and each article's
//! counters must equal the number of its applied operations. Any difference is a mismatch.
//!
//! Every count of the report comes from one place: the operations' records, after the
//! reconciliation has settled the uncertain ones (a failure whose write may have been applied
//! anyway) by reading their documents. Once the workload has started, [`run()`] always returns a
//! report: when Elasticsearch or the dead-letter sink cannot be read at the end, the report says
//! what was not checked ([`Reconciliation::unchecked`]) instead of failing.
//!
//! Lock wait and hold times are measured by wrapping the lock service ([`ObservedLocks`]), which
//! also counts *overtakes*: a foreground contender that got a lock while a background contender
//! that had asked for it earlier was still waiting.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::Notify;
use uuid::Uuid;

use zkguard::config::{LockBackendKind, Settings};
use zkguard::es::{DocStore, EsError, HookedStore, IndexGate};
use zkguard::lock::{Guard, LockError, LockRequest, LockService, LockType, LossReason};
use zkguard::write::background::{BackgroundError, BackgroundExecutor, Outcome};
use zkguard::write::deadletter::{DeadLetterSink, ReplayResult, ReplaySelection};
use zkguard::write::guarded::{GuardedError, GuardedWriter};
use zkguard::write::ops::{Operation, Stamp};
use zkguard::zk::{ZkLockService, ZkSession};

/// Errors that stop the demo before it can report (a setup step failed).
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// Elasticsearch failed while preparing or checking the articles.
    #[error("demo: Elasticsearch failed while {context}: {source}")]
    Store {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: EsError,
    },
    /// Seeding an article failed.
    #[error("demo: cannot seed {id}: {source}{hint}")]
    Seed {
        /// The article.
        id: String,
        /// The error.
        #[source]
        source: GuardedError,
        /// What to do.
        hint: &'static str,
    },
    /// A demo task panicked or was cancelled.
    #[error("demo: a worker task failed: {0}")]
    Task(String),
}

/// The shape of a demo run.
#[derive(Debug, Clone)]
#[must_use]
pub struct DemoPlan {
    /// Index of the articles.
    pub index: String,
    /// Number of articles (at least 3).
    pub articles: usize,
    /// Foreground writers.
    pub writers: usize,
    /// Saves per foreground writer.
    pub saves_per_writer: usize,
    /// Background jobs.
    pub jobs: usize,
    /// Articles per background job.
    pub articles_per_job: usize,
    /// How many articles are "hot": most saves and every background job touch them, so
    /// foreground and background contenders meet in their lock queues.
    pub hot_articles: usize,
    /// How many background operations run at once.
    pub background_concurrency: usize,
    /// The background lock wait (shorter than the configured one, so that the slow editor's
    /// article produces dead letters quickly).
    pub background_lock_timeout: Duration,
    /// Largest pause of a foreground writer between two saves (a person typing).
    pub think_time: Duration,
    /// Whether the slow editor runs.
    pub slow_editor: bool,
    /// Whether the stalled writer runs (ZooKeeper backend only).
    pub stalled_writer: bool,
    /// Whether the run's parked operations are replayed at the end.
    pub replay: bool,
    /// Random seed (article choice and pauses).
    pub seed: u64,
}

impl Default for DemoPlan {
    fn default() -> Self {
        Self {
            index: "zkguard-demo-articles".into(),
            articles: 12,
            writers: 4,
            saves_per_writer: 15,
            jobs: 6,
            articles_per_job: 8,
            hot_articles: 3,
            background_concurrency: 8,
            background_lock_timeout: Duration::from_millis(300),
            think_time: Duration::from_millis(20),
            slow_editor: true,
            stalled_writer: true,
            replay: true,
            seed: rand::random(),
        }
    }
}

impl DemoPlan {
    /// A smaller run (for tests and slow machines).
    #[allow(dead_code)] // the binary does not use it; tests/demo.rs does
    pub fn small() -> Self {
        Self {
            articles: 6,
            writers: 3,
            saves_per_writer: 6,
            jobs: 3,
            articles_per_job: 4,
            ..Self::default()
        }
    }

    /// The article ids (`article-1` ...).
    pub fn article_ids(&self) -> Vec<String> {
        (1..=self.articles.max(3))
            .map(|n| format!("article-{n}"))
            .collect()
    }

    /// The monitor object (lock name) of an article.
    pub fn monitor(&self, article: &str) -> String {
        format!("zkguard-demo:{article}")
    }

    /// Operations the workload starts (without the seeding).
    pub fn planned_operations(&self) -> usize {
        self.writers * self.saves_per_writer
            + self.jobs * self.articles_per_job.min(self.articles.max(3))
            + usize::from(self.slow_editor)
            + 2 * usize::from(self.stalled_writer)
    }
}

/// What the demo needs: a store, a lock service, a dead-letter sink and the settings (retry
/// count and backoff; the ZooKeeper servers for the stalled writer).
#[derive(Clone)]
pub struct DemoEnv {
    /// The document store.
    pub store: Arc<dyn DocStore>,
    /// The lock service of `lock.backend`.
    pub locks: Arc<dyn LockService>,
    /// The dead-letter sink.
    pub sink: Arc<dyn DeadLetterSink>,
    /// The settings.
    pub settings: Settings,
}

impl fmt::Debug for DemoEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DemoEnv")
            .field("locks", &self.locks.backend_name())
            .field("sink", &self.sink.describe())
            .finish_non_exhaustive()
    }
}

/// Live counters of a run, for progress displays (all monotonic).
#[derive(Debug, Default)]
pub struct DemoProgress {
    /// Foreground operations planned.
    pub foreground_planned: AtomicUsize,
    /// Foreground operations finished (any outcome).
    pub foreground_done: AtomicUsize,
    /// Background operations planned.
    pub background_planned: AtomicUsize,
    /// Background operations finished (any outcome).
    pub background_done: AtomicUsize,
    /// Operations parked so far.
    pub parked: AtomicUsize,
    /// Operations lost so far (neither applied nor parked).
    pub lost: AtomicUsize,
    /// Writes rejected by fencing so far.
    pub fenced: AtomicUsize,
    phase: Mutex<String>,
}

impl DemoProgress {
    /// What the demo is doing now.
    pub fn phase(&self) -> String {
        self.phase.lock().expect("phase lock").clone()
    }

    fn set_phase(&self, phase: impl Into<String>) {
        *self.phase.lock().expect("phase lock") = phase.into();
    }
}

/// How one operation of the run ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum OpStatus {
    /// Written.
    Applied {
        /// Attempts (1 for foreground).
        attempts: u32,
    },
    /// Parked, then written by the replay at the end of the run.
    Replayed,
    /// Not written, with the reason (foreground failures, fenced writes, malformed operations).
    Rejected {
        /// Error class (`lock_timeout`, `fenced`, ...).
        kind: String,
        /// The error.
        reason: String,
        /// Whether the write may have been sent anyway (the answer was lost), so only the
        /// document can tell whether it was applied.
        ambiguous: bool,
    },
    /// In the dead-letter sink.
    Parked {
        /// Why.
        reason: String,
    },
    /// Neither applied nor parked: it failed and the dead-letter sink refused it (its dead
    /// letter went to standard error).
    Lost {
        /// Why.
        reason: String,
    },
}

/// One operation of the run.
#[derive(Debug, Clone, Serialize)]
pub struct OpRecord {
    /// The operation id (recorded in the article when applied).
    pub id: Uuid,
    /// Foreground or background.
    pub class: LockType,
    /// The article.
    pub article: String,
    /// The counter it increments (`saves` or `propagations`).
    pub field: &'static str,
    /// Who did it (`writer 2`, `job 4`, `slow editor`, ...).
    pub actor: String,
    /// The outcome.
    pub status: OpStatus,
    /// Whether its document records it, as read by the reconciliation; `None` when the
    /// document was not read. It settles an uncertain rejection.
    pub recorded: Option<bool>,
}

/// Lock timing of one class.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    /// Samples.
    pub count: usize,
    /// Median (ms).
    pub p50_ms: f64,
    /// 90th percentile (ms).
    pub p90_ms: f64,
    /// 99th percentile (ms).
    pub p99_ms: f64,
    /// Largest (ms).
    pub max_ms: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `samples`.
    pub fn of(samples: &[Duration]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        let mut s: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        s.sort_by(f64::total_cmp);
        let at = |p: f64| s[((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1];
        Self {
            count: s.len(),
            p50_ms: at(0.50),
            p90_ms: at(0.90),
            p99_ms: at(0.99),
            max_ms: s[s.len() - 1],
        }
    }
}

/// Figures of one class (foreground or background).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClassReport {
    /// Operations started.
    pub operations: usize,
    /// Applied at the first attempt or after retries.
    pub applied: usize,
    /// Parked, then applied by the replay.
    pub replayed: usize,
    /// Rejected with a reason (an uncertain failure that its document records counts as
    /// applied).
    pub rejected: usize,
    /// Of the rejected, those whose write may have been applied anyway and whose document could
    /// not be read to tell.
    pub uncertain: usize,
    /// Still parked.
    pub parked: usize,
    /// Neither applied nor parked.
    pub lost: usize,
    /// Rejections by error class.
    pub rejected_by_kind: BTreeMap<String, usize>,
    /// Lock acquisitions that timed out.
    pub lock_timeouts: usize,
    /// Time from asking for a lock to holding it.
    pub lock_wait: Percentiles,
    /// Time from holding a lock to releasing it.
    pub lock_hold: Percentiles,
}

/// The reconciliation of every operation with Elasticsearch. Its counts are those of the
/// operations' records (the same as the report's table); what it adds is the check of each
/// record against its document and the dead-letter sink.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Reconciliation {
    /// Operations checked against their document.
    pub checked: usize,
    /// Applied (at once, after retries, or by the replay).
    pub applied: usize,
    /// Rejected with a reason.
    pub rejected: usize,
    /// Parked.
    pub parked: usize,
    /// Neither applied nor parked.
    pub lost: usize,
    /// Failures whose write may have been sent, settled by reading the document.
    pub ambiguous_resolved: usize,
    /// Failures whose write may have been sent, not settled (their document was not read).
    pub uncertain: usize,
    /// Articles.
    pub articles: usize,
    /// Every difference found; empty when everything adds up.
    pub mismatches: Vec<String>,
    /// What could not be checked, and why; empty when everything was checked.
    pub unchecked: Vec<String>,
}

impl Reconciliation {
    /// Whether no difference was found (see also [`Reconciliation::is_complete`]).
    #[allow(dead_code)] // the demo's tests (tests/demo.rs) check it
    pub fn is_consistent(&self) -> bool {
        self.mismatches.is_empty()
    }

    /// Whether every operation and the dead-letter sink could be checked.
    pub fn is_complete(&self) -> bool {
        self.unchecked.is_empty()
    }
}

/// The report of a run.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    /// The lock backend.
    pub backend: String,
    /// The dead-letter sink.
    pub sink: String,
    /// The articles' index.
    pub index: String,
    /// Articles.
    pub articles: usize,
    /// Wall time of the workload and the replay.
    pub elapsed_ms: u64,
    /// Foreground figures.
    pub foreground: ClassReport,
    /// Background figures.
    pub background: ClassReport,
    /// Foreground contenders that got a lock while an earlier background contender still waited.
    pub overtakes: u64,
    /// Background retries (attempts after the first).
    pub retries: u64,
    /// Operations parked during the run (before the replay).
    pub dead_letters: usize,
    /// Parked operations applied by the replay.
    pub replayed: usize,
    /// Writes rejected by Elasticsearch through the fencing token.
    pub fenced: usize,
    /// What the stalled-writer episode showed, or why it did not run.
    pub stalled_writer: String,
    /// What the slow-editor episode did, or why it did not run.
    pub slow_editor: String,
    /// The reconciliation.
    pub reconciliation: Reconciliation,
    /// Every operation.
    pub operations: Vec<OpRecord>,
}

impl DemoReport {
    /// Whether the reconciliation found no mismatch.
    #[allow(dead_code)] // the demo's tests (tests/demo.rs) check it
    pub fn is_consistent(&self) -> bool {
        self.reconciliation.is_consistent()
    }

    /// The operations that were neither applied nor parked.
    pub fn lost(&self) -> Vec<&OpRecord> {
        self.operations
            .iter()
            .filter(|o| matches!(o.status, OpStatus::Lost { .. }))
            .collect()
    }
}

impl fmt::Display for DemoReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "zkguard demo report")?;
        writeln!(
            f,
            "  {} articles in index {}, lock backend {}, dead letters in {}, {:.1} s",
            self.articles,
            self.index,
            self.backend,
            self.sink,
            self.elapsed_ms as f64 / 1000.0
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "  operations      {:>10} {:>10}",
            "foreground", "background"
        )?;
        let row = |f: &mut fmt::Formatter<'_>, name: &str, a: usize, b: usize| {
            writeln!(f, "  {name:<15} {a:>10} {b:>10}")
        };
        let (fg, bg) = (&self.foreground, &self.background);
        row(f, "started", fg.operations, bg.operations)?;
        row(f, "applied", fg.applied, bg.applied)?;
        row(f, "replayed", fg.replayed, bg.replayed)?;
        row(f, "rejected", fg.rejected, bg.rejected)?;
        row(f, "still parked", fg.parked, bg.parked)?;
        row(f, "lost", fg.lost, bg.lost)?;
        row(f, "lock timeouts", fg.lock_timeouts, bg.lock_timeouts)?;
        for (kind, n) in fg.rejected_by_kind.iter().chain(bg.rejected_by_kind.iter()) {
            writeln!(f, "    rejected as {kind}: {n}")?;
        }
        if fg.uncertain + bg.uncertain > 0 {
            writeln!(
                f,
                "    of the rejected, {} may have been applied (their documents were not read)",
                fg.uncertain + bg.uncertain
            )?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "  lock times (ms)    count      p50      p90      p99      max"
        )?;
        for (name, p) in [
            ("foreground wait", &fg.lock_wait),
            ("foreground hold", &fg.lock_hold),
            ("background wait", &bg.lock_wait),
            ("background hold", &bg.lock_hold),
        ] {
            writeln!(
                f,
                "  {name:<16} {:>7} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
                p.count, p.p50_ms, p.p90_ms, p.p99_ms, p.max_ms
            )?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "  foreground-over-background overtakes  {}",
            self.overtakes
        )?;
        writeln!(
            f,
            "  background retries                    {}",
            self.retries
        )?;
        writeln!(
            f,
            "  dead letters (parked)                 {}",
            self.dead_letters
        )?;
        writeln!(
            f,
            "  replayed from the dead letters        {}",
            self.replayed
        )?;
        writeln!(f, "  fenced rejections                     {}", self.fenced)?;
        writeln!(f, "  slow editor:    {}", self.slow_editor)?;
        writeln!(f, "  stalled writer: {}", self.stalled_writer)?;
        writeln!(f)?;
        let r = &self.reconciliation;
        writeln!(
            f,
            "  reconciliation: {} of {} operations on {} articles checked against Elasticsearch:",
            r.checked,
            self.operations.len(),
            r.articles
        )?;
        writeln!(
            f,
            "    {} applied, {} rejected with a reason, {} parked, {} lost{}",
            r.applied,
            r.rejected,
            r.parked,
            r.lost,
            if r.ambiguous_resolved > 0 {
                format!(
                    " ({} uncertain failures resolved by reading the documents)",
                    r.ambiguous_resolved
                )
            } else {
                String::new()
            }
        )?;
        for note in &r.unchecked {
            writeln!(f, "    NOT CHECKED: {note}")?;
        }
        for op in self.lost() {
            let reason = match &op.status {
                OpStatus::Lost { reason } => reason.as_str(),
                _ => "",
            };
            writeln!(
                f,
                "    LOST: {} {} ({}, {} +1 on {}): {reason}",
                op.class, op.id, op.actor, op.field, op.article
            )?;
        }
        if !r.mismatches.is_empty() {
            writeln!(f, "    MISMATCH: {} problems", r.mismatches.len())?;
            for m in &r.mismatches {
                writeln!(f, "    - {m}")?;
            }
            return Ok(());
        }
        match (r.lost, r.is_complete()) {
            (0, true) => write!(
                f,
                "    OK: every operation is accounted for, nothing lost, nothing applied twice"
            ),
            (0, false) => write!(
                f,
                "    INCOMPLETE: no difference found in what could be checked"
            ),
            (n, _) => write!(
                f,
                "    LOST: {n} operations were neither applied nor parked (their dead letters went to standard error)"
            ),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Lock observation

#[derive(Default)]
struct LockStats {
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, (String, LockType, Instant)>>,
    wait: Mutex<HashMap<LockType, Vec<Duration>>>,
    hold: Mutex<HashMap<LockType, Vec<Duration>>>,
    timeouts: Mutex<HashMap<LockType, usize>>,
    overtakes: AtomicU64,
}

/// A [`LockService`] that measures lock wait and hold times per class and counts
/// foreground-over-background overtakes.
#[derive(Clone)]
pub struct ObservedLocks {
    inner: Arc<dyn LockService>,
    stats: Arc<LockStats>,
}

impl fmt::Debug for ObservedLocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObservedLocks")
            .field("backend", &self.inner.backend_name())
            .finish_non_exhaustive()
    }
}

impl ObservedLocks {
    /// Observes `inner`.
    pub fn new(inner: Arc<dyn LockService>) -> Self {
        Self {
            inner,
            stats: Arc::new(LockStats::default()),
        }
    }

    /// Observes another service into the same figures.
    pub fn sharing_stats(&self, inner: Arc<dyn LockService>) -> Self {
        Self {
            inner,
            stats: self.stats.clone(),
        }
    }

    /// Foreground contenders that got a lock while a background contender that asked for the
    /// same lock earlier was still waiting.
    pub fn overtakes(&self) -> u64 {
        self.stats.overtakes.load(Ordering::Relaxed)
    }

    /// Wait times of successful acquisitions of a class.
    pub fn wait_times(&self, class: LockType) -> Vec<Duration> {
        self.stats
            .wait
            .lock()
            .expect("stats lock")
            .get(&class)
            .cloned()
            .unwrap_or_default()
    }

    /// Hold times of a class.
    pub fn hold_times(&self, class: LockType) -> Vec<Duration> {
        self.stats
            .hold
            .lock()
            .expect("stats lock")
            .get(&class)
            .cloned()
            .unwrap_or_default()
    }

    /// Acquisitions of a class that timed out.
    pub fn timeouts(&self, class: LockType) -> usize {
        self.stats
            .timeouts
            .lock()
            .expect("stats lock")
            .get(&class)
            .copied()
            .unwrap_or(0)
    }
}

/// Removes a waiter's entry however its acquisition ends (also when it is cancelled).
struct Waiting<'a> {
    stats: &'a LockStats,
    key: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.stats
            .waiting
            .lock()
            .expect("stats lock")
            .remove(&self.key);
    }
}

#[async_trait]
impl LockService for ObservedLocks {
    async fn acquire(&self, request: LockRequest) -> Result<Box<dyn Guard>, LockError> {
        let stats = &*self.stats;
        let class = request.lock_type;
        let monitor = request.monitor.clone();
        let key = stats.next.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        stats
            .waiting
            .lock()
            .expect("stats lock")
            .insert(key, (monitor.clone(), class, started));
        let waiting = Waiting { stats, key };
        let result = self.inner.acquire(request).await;
        if class == LockType::Foreground && result.is_ok() {
            let overtaken = stats
                .waiting
                .lock()
                .expect("stats lock")
                .values()
                .filter(|(m, c, t)| *m == monitor && *c == LockType::Background && *t < started)
                .count();
            stats
                .overtakes
                .fetch_add(overtaken as u64, Ordering::Relaxed);
        }
        drop(waiting);
        match result {
            Ok(guard) => {
                stats
                    .wait
                    .lock()
                    .expect("stats lock")
                    .entry(class)
                    .or_default()
                    .push(started.elapsed());
                Ok(Box::new(ObservedGuard {
                    inner: Some(guard),
                    stats: self.stats.clone(),
                    acquired: Instant::now(),
                }))
            }
            Err(e) => {
                if matches!(e, LockError::Timeout { .. }) {
                    *stats
                        .timeouts
                        .lock()
                        .expect("stats lock")
                        .entry(class)
                        .or_default() += 1;
                }
                Err(e)
            }
        }
    }

    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
}

#[derive(Debug)]
struct ObservedGuard {
    inner: Option<Box<dyn Guard>>,
    stats: Arc<LockStats>,
    acquired: Instant,
}

impl fmt::Debug for LockStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LockStats")
    }
}

impl ObservedGuard {
    fn guard(&self) -> &dyn Guard {
        self.inner
            .as_deref()
            .expect("the guard is present until released")
    }

    fn record(&mut self) -> Option<Box<dyn Guard>> {
        let guard = self.inner.take()?;
        self.stats
            .hold
            .lock()
            .expect("stats lock")
            .entry(guard.lock_type())
            .or_default()
            .push(self.acquired.elapsed());
        Some(guard)
    }
}

impl Drop for ObservedGuard {
    fn drop(&mut self) {
        // Dropped without unlock: the inner guard releases in the background.
        let _ = self.record();
    }
}

#[async_trait]
impl Guard for ObservedGuard {
    fn monitor(&self) -> &str {
        self.guard().monitor()
    }
    fn lock_type(&self) -> LockType {
        self.guard().lock_type()
    }
    fn fencing_token(&self) -> u64 {
        self.guard().fencing_token()
    }
    fn is_held(&self) -> bool {
        self.guard().is_held()
    }
    fn loss(&self) -> Option<LossReason> {
        self.guard().loss()
    }
    async fn lost(&self) -> LossReason {
        self.guard().lost().await
    }
    async fn unlock(mut self: Box<Self>) -> Result<(), LockError> {
        match self.record() {
            Some(guard) => guard.unlock().await,
            None => Ok(()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The run

/// The mappings of the articles' index.
pub fn article_mappings() -> Value {
    json!({"properties": {
        "title": {"type": "text"},
        "saves": {"type": "long"},
        "propagations": {"type": "long"},
        "last_saved_by": {"type": "keyword"}
    }})
}

fn rejected(e: &GuardedError) -> OpStatus {
    // Store failures other than a refusal may hide a write that went through (a lost answer).
    let ambiguous = matches!(
        e,
        GuardedError::Store(EsError::Transport { .. } | EsError::Server { .. })
    );
    OpStatus::Rejected {
        kind: e.kind().to_string(),
        reason: e.to_string(),
        ambiguous,
    }
}

fn status_of(result: &Result<Outcome, BackgroundError>) -> OpStatus {
    match result {
        Ok(Outcome::Applied { attempts, .. }) => OpStatus::Applied {
            attempts: *attempts,
        },
        Ok(Outcome::Parked { reason, error, .. }) => OpStatus::Parked {
            reason: format!("{reason}: {error}"),
        },
        Ok(Outcome::Rejected { reason, .. }) => OpStatus::Rejected {
            kind: "rejected".into(),
            reason: reason.clone(),
            ambiguous: false,
        },
        Err(BackgroundError::Lost {
            error,
            sink,
            tries,
            park_error,
            ..
        }) => OpStatus::Lost {
            reason: format!(
                "not applied ({error}), and the dead-letter {sink} refused it {tries} times: {park_error}"
            ),
        },
        Err(other) => OpStatus::Rejected {
            kind: "error".into(),
            reason: other.to_string(),
            ambiguous: false,
        },
    }
}

/// Counts of records (of one class, or all), the one source of every count in the report.
fn tally<'a>(
    records: impl IntoIterator<Item = &'a OpRecord>,
    class: Option<LockType>,
) -> ClassReport {
    let mut c = ClassReport::default();
    for r in records
        .into_iter()
        .filter(|r| class.is_none_or(|k| r.class == k))
    {
        c.operations += 1;
        match &r.status {
            OpStatus::Applied { .. } => c.applied += 1,
            OpStatus::Replayed => c.replayed += 1,
            OpStatus::Parked { .. } => c.parked += 1,
            OpStatus::Lost { .. } => c.lost += 1,
            // The document settles an uncertain failure: it was applied after all.
            OpStatus::Rejected {
                ambiguous: true, ..
            } if r.recorded == Some(true) => c.applied += 1,
            OpStatus::Rejected {
                kind, ambiguous, ..
            } => {
                c.rejected += 1;
                if *ambiguous && r.recorded.is_none() {
                    c.uncertain += 1;
                }
                *c.rejected_by_kind
                    .entry(format!("{} {kind}", r.class))
                    .or_default() += 1;
            }
        }
    }
    c
}

struct Shared {
    records: Mutex<Vec<OpRecord>>,
}

impl Shared {
    fn push(&self, r: OpRecord) {
        self.records.lock().expect("records lock").push(r);
    }
}

/// Runs the demo in `env` and returns its report (check [`DemoReport::is_consistent`]).
///
/// # Errors
/// [`DemoError`] when a setup step fails (the index cannot be created, an article cannot be
/// seeded, the dead-letter sink cannot be read). Failures of single operations are part of the
/// report, not errors.
///
/// # Cancellation safety
/// Not cancel-safe: a dropped run leaves operations running in tasks and the articles in an
/// intermediate state (every written operation is still recorded in its article).
pub async fn run(
    env: &DemoEnv,
    plan: &DemoPlan,
    progress: &Arc<DemoProgress>,
) -> Result<DemoReport, DemoError> {
    let ids = plan.article_ids();
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let index = plan.index.clone();

    // Seed the articles through the plain lock service, so that only the workload is measured.
    progress.set_phase(format!("seeding {} articles", ids.len()));
    env.store
        .ensure_index(&index, &article_mappings())
        .await
        .map_err(|source| DemoError::Store {
            context: format!("creating index {index}"),
            source,
        })?;
    let ops_window = plan.planned_operations() + ids.len() + 16;
    let seeder =
        GuardedWriter::new(env.locks.clone(), env.store.clone()).with_ops_window(ops_window);
    for id in &ids {
        let doc = json!({"title": format!("Article {id}"), "saves": 0, "propagations": 0, "last_saved_by": "seed"});
        seeder.on(plan.monitor(id)).info("Seed").index(&index, id, doc).await.map_err(|source| {
            let hint = if matches!(source, GuardedError::Fenced { .. }) {
                "; the index holds versions written under another ZooKeeper (larger fencing tokens): choose another index with --index"
            } else {
                ""
            };
            DemoError::Seed { id: id.clone(), source, hint }
        })?;
    }

    let observed = ObservedLocks::new(env.locks.clone());
    let writer = GuardedWriter::new(Arc::new(observed.clone()), env.store.clone())
        .with_ops_window(ops_window);
    let executor = BackgroundExecutor::builder(writer.clone(), env.sink.clone())
        .retry(&env.settings.retry)
        .lock_timeout(plan.background_lock_timeout)
        .concurrency(plan.background_concurrency)
        .build();
    let shared = Arc::new(Shared {
        records: Mutex::new(Vec::new()),
    });

    // The slow editor holds the first article; foreground writers leave it alone, so only the
    // background operations on it wait (and end parked).
    let slow_article = ids[0].clone();
    let stalled_article = ids[1].clone();
    let fg_articles: Vec<String> = ids[1..].to_vec();
    // The hot articles (never the slow editor's, whose lock is held for a long time).
    let hot: Vec<String> = fg_articles
        .iter()
        .take(plan.hot_articles.clamp(1, fg_articles.len()))
        .cloned()
        .collect();
    let budget = retry_budget(&env.settings, plan.background_lock_timeout);
    let slow_hold = (budget * 2 + Duration::from_millis(500)).min(Duration::from_secs(20));

    progress.set_phase("running foreground writers and background jobs".to_string());
    progress.foreground_planned.store(
        plan.writers * plan.saves_per_writer
            + usize::from(plan.slow_editor)
            + 2 * usize::from(plan.stalled_writer),
        Ordering::Relaxed,
    );
    let job_size = plan.articles_per_job.min(ids.len());
    progress
        .background_planned
        .store(plan.jobs * job_size, Ordering::Relaxed);

    let mut tasks: Vec<tokio::task::JoinHandle<String>> = Vec::new();

    // The slow editor: take the lock before the jobs start, hold it past the retry budget, save.
    let slow_ready = Arc::new(Notify::new());
    if plan.slow_editor {
        let (writer, shared, index, article) = (
            writer.clone(),
            shared.clone(),
            index.clone(),
            slow_article.clone(),
        );
        let monitor = plan.monitor(&article);
        let ready = slow_ready.clone();
        let progress_ptr = progress.clone();
        tasks.push(tokio::spawn(async move {
            let op = Operation::increment(&monitor, &index, &article, "saves", 1)
                .with_info("Save Content (slow editor)");
            let mut record = OpRecord {
                id: op.id,
                class: LockType::Foreground,
                article: article.clone(),
                field: "saves",
                actor: "slow editor".into(),
                status: OpStatus::Applied { attempts: 1 },
                recorded: None,
            };
            let request = LockRequest::new(&monitor, "Save Content (slow editor)");
            let summary = match writer.locks().acquire(request).await {
                Ok(guard) => {
                    ready.notify_one();
                    tokio::time::sleep(slow_hold).await;
                    let result = writer.write_under(guard.as_ref(), &op).await;
                    let _ = guard.unlock().await;
                    match result {
                        Ok(_) => format!(
                            "held {article} for {} ms, then saved it",
                            slow_hold.as_millis()
                        ),
                        Err(e) => {
                            record.status = rejected(&e);
                            format!(
                                "held {article} for {} ms; its save failed: {e}",
                                slow_hold.as_millis()
                            )
                        }
                    }
                }
                Err(e) => {
                    ready.notify_one();
                    record.status = rejected(&GuardedError::Lock(e));
                    format!("could not lock {article}")
                }
            };
            shared.push(record);
            progress_ptr.foreground_done.fetch_add(1, Ordering::Relaxed);
            summary
        }));
        slow_ready.notified().await;
    }

    // Foreground writers.
    for w in 0..plan.writers {
        let (executor, shared) = (executor.clone(), shared.clone());
        let mut rng = StdRng::seed_from_u64(rng.gen());
        let picks: Vec<String> = (0..plan.saves_per_writer)
            .map(|_| {
                let from = if rng.gen_bool(0.7) {
                    &hot
                } else {
                    &fg_articles
                };
                from.choose(&mut rng).expect("articles").clone()
            })
            .collect();
        let pauses: Vec<Duration> = (0..plan.saves_per_writer)
            .map(|_| plan.think_time.mul_f64(rng.gen_range(0.0..1.0)))
            .collect();
        let (index, plan2) = (index.clone(), plan.clone());
        let progress_ptr = progress.clone();
        tasks.push(tokio::spawn(async move {
            for (article, pause) in picks.into_iter().zip(pauses) {
                tokio::time::sleep(pause).await;
                let actor = format!("writer {}", w + 1);
                let op =
                    Operation::increment(plan2.monitor(&article), &index, &article, "saves", 1)
                        .with_info(format!("Save Content ({actor})"));
                let status = match executor.run_foreground(op.clone()).await {
                    Ok(_) => OpStatus::Applied { attempts: 1 },
                    Err(e) => rejected(&e),
                };
                shared.push(OpRecord {
                    id: op.id,
                    class: LockType::Foreground,
                    article,
                    field: "saves",
                    actor,
                    status,
                    recorded: None,
                });
                progress_ptr.foreground_done.fetch_add(1, Ordering::Relaxed);
            }
            String::new()
        }));
    }

    // Background jobs: each propagates to a random set of articles; the first job starts with the
    // slow editor's article.
    for j in 0..plan.jobs {
        // The hot articles, then random others, in random order.
        let mut chosen: Vec<String> = hot.iter().take(job_size).cloned().collect();
        let others: Vec<&String> = ids.iter().filter(|a| !chosen.contains(a)).collect();
        chosen.extend(
            others
                .choose_multiple(&mut rng, job_size - chosen.len())
                .map(|a| (*a).clone()),
        );
        chosen.shuffle(&mut rng);
        if j == 0 && plan.slow_editor && !chosen.contains(&slow_article) {
            chosen[0] = slow_article.clone();
        }
        if j == 0 {
            if let Some(pos) = chosen.iter().position(|a| *a == slow_article) {
                chosen.swap(0, pos);
            }
        }
        let (executor, shared, index, plan2) = (
            executor.clone(),
            shared.clone(),
            index.clone(),
            plan.clone(),
        );
        let progress_ptr = progress.clone();
        tasks.push(tokio::spawn(async move {
            let actor = format!("job {}", j + 1);
            let mut handles = Vec::new();
            for article in chosen {
                let op = Operation::increment(
                    plan2.monitor(&article),
                    &index,
                    &article,
                    "propagations",
                    1,
                )
                .with_info(format!("Bulk Propagation ({actor})"));
                let id = op.id;
                handles.push((id, article, executor.submit(op).await));
            }
            for (id, article, handle) in handles {
                let status = match handle.await {
                    Ok(outcome) => status_of(&outcome),
                    Err(e) => OpStatus::Rejected {
                        kind: "task".into(),
                        reason: e.to_string(),
                        ambiguous: true,
                    },
                };
                let p = &progress_ptr;
                match status {
                    OpStatus::Parked { .. } => p.parked.fetch_add(1, Ordering::Relaxed),
                    OpStatus::Lost { .. } => p.lost.fetch_add(1, Ordering::Relaxed),
                    _ => 0,
                };
                shared.push(OpRecord {
                    id,
                    class: LockType::Background,
                    article,
                    field: "propagations",
                    actor: actor.clone(),
                    status,
                    recorded: None,
                });
                p.background_done.fetch_add(1, Ordering::Relaxed);
            }
            String::new()
        }));
    }

    // The stalled writer (ZooKeeper only: it needs a session of its own to expire).
    let stalled = if plan.stalled_writer && env.settings.backend == LockBackendKind::ZooKeeper {
        let result =
            stalled_writer(env, plan, &writer, &observed, &stalled_article, ops_window).await;
        match result {
            Ok((records, summary)) => {
                for r in records {
                    if matches!(&r.status, OpStatus::Rejected { kind, .. } if kind == "fenced") {
                        progress.fenced.fetch_add(1, Ordering::Relaxed);
                    }
                    shared.push(r);
                    progress.foreground_done.fetch_add(1, Ordering::Relaxed);
                }
                summary
            }
            Err(summary) => {
                progress.foreground_done.fetch_add(2, Ordering::Relaxed);
                summary
            }
        }
    } else if plan.stalled_writer {
        progress.foreground_done.fetch_add(2, Ordering::Relaxed);
        "not run: it needs lock.backend=zookeeper (a ZooKeeper session to expire)".to_string()
    } else {
        "not run (disabled)".to_string()
    };

    let mut slow = if plan.slow_editor {
        String::new()
    } else {
        "not run (disabled)".to_string()
    };
    for t in tasks {
        let s = t.await.map_err(|e| DemoError::Task(e.to_string()))?;
        if !s.is_empty() {
            slow = s;
        }
    }

    // Replay this run's dead letters (the slow editor is gone, so they apply now).
    let mut records = std::mem::take(&mut *shared.records.lock().expect("records lock"));
    let dead_letters = records
        .iter()
        .filter(|r| matches!(r.status, OpStatus::Parked { .. }))
        .count();
    let mut replayed = 0;
    if plan.replay && dead_letters > 0 {
        progress.set_phase(format!("replaying {dead_letters} dead letters"));
        for r in records
            .iter_mut()
            .filter(|r| matches!(r.status, OpStatus::Parked { .. }))
        {
            let entries = zkguard::write::deadletter::replay(
                &writer,
                env.sink.as_ref(),
                ReplaySelection::Id(r.id),
            )
            .await;
            match entries {
                Ok(entries) => {
                    for entry in entries {
                        match entry.result {
                            ReplayResult::Applied
                            | ReplayResult::AlreadyApplied
                            | ReplayResult::NotRemoved { .. } => {
                                r.status = OpStatus::Replayed;
                                replayed += 1;
                            }
                            ReplayResult::StillParked { error, .. } => {
                                r.status = OpStatus::Parked {
                                    reason: format!("replay failed: {error}"),
                                };
                            }
                        }
                    }
                }
                // The entry could not be read back: it stays parked, as far as this run knows.
                Err(e) => {
                    r.status = OpStatus::Parked {
                        reason: format!("replay failed: {e}"),
                    }
                }
            }
        }
    }

    progress.set_phase("reconciling with Elasticsearch".to_string());
    let reconciliation =
        reconcile(env.store.as_ref(), &index, &mut records, env.sink.as_ref()).await;
    let stats = executor.stats();
    let class_report = |class: LockType| ClassReport {
        lock_wait: Percentiles::of(&observed.wait_times(class)),
        lock_hold: Percentiles::of(&observed.hold_times(class)),
        lock_timeouts: observed.timeouts(class),
        ..tally(&records, Some(class))
    };
    let fenced = records
        .iter()
        .filter(|r| matches!(&r.status, OpStatus::Rejected { kind, .. } if kind == "fenced"))
        .count();
    progress.set_phase("done".to_string());
    Ok(DemoReport {
        backend: env.locks.backend_name().to_string(),
        sink: env.sink.describe(),
        index,
        articles: ids.len(),
        elapsed_ms: started.elapsed().as_millis() as u64,
        foreground: class_report(LockType::Foreground),
        background: class_report(LockType::Background),
        overtakes: observed.overtakes(),
        retries: stats.retried,
        dead_letters,
        replayed,
        fenced,
        stalled_writer: stalled,
        slow_editor: slow,
        reconciliation,
        operations: records,
    })
}

/// The longest a background operation can keep retrying: every attempt waits the lock timeout,
/// and the delays between attempts are at most the backoff ceilings.
fn retry_budget(settings: &Settings, lock_timeout: Duration) -> Duration {
    let attempts = settings.retry.retry_count.max(1);
    let mut backoff =
        zkguard::Backoff::new(settings.retry.backoff_initial, settings.retry.backoff_max);
    let mut total = lock_timeout * attempts;
    for _ in 1..attempts {
        total += backoff.ceiling();
        let _ = backoff.next_delay();
    }
    total
}

/// The stalled writer: lock `article` through a session of its own (behind a [`Partition`]),
/// stall before the write, cut the session off until ZooKeeper expires it, let another writer
/// save the article, send the stale write.
async fn stalled_writer(
    env: &DemoEnv,
    plan: &DemoPlan,
    writer: &GuardedWriter,
    observed: &ObservedLocks,
    article: &str,
    ops_window: usize,
) -> Result<(Vec<OpRecord>, String), String> {
    let monitor = plan.monitor(article);
    let partition = zkguard::testkit::Partition::start(&env.settings.zookeeper.servers)
        .map_err(|e| format!("not run: cannot start the network partition proxy: {e}"))?;
    let mut own_settings = env.settings.zookeeper.clone();
    own_settings.servers = partition.connect_string().to_string();
    // The shortest session ZooKeeper grants (it raises this to 2 x tickTime), so the stall
    // outlives it quickly.
    own_settings.session_timeout = Duration::from_millis(1000);
    let session = ZkSession::connect(&own_settings)
        .await
        .map_err(|e| format!("not run: cannot open a second ZooKeeper session: {e}"))?;
    let own_locks: Arc<dyn LockService> =
        Arc::new(observed.sharing_stats(Arc::new(ZkLockService::new(session.clone()))));
    // Holds back the stale writer's `index` call until let through: the stall of a writer
    // between its last lock check and its request reaching Elasticsearch.
    let stalling = Arc::new(HookedStore::new(env.store.clone(), IndexGate::new()));
    let stale_writer =
        GuardedWriter::new(own_locks.clone(), stalling.clone()).with_ops_window(ops_window);
    let request = LockRequest::new(&monitor, "Save Content (stalled writer)");
    let guard = match own_locks.acquire(request).await {
        Ok(g) => g,
        Err(e) => {
            session.close();
            return Err(format!("not run: could not lock {article}: {e}"));
        }
    };
    let token = guard.fencing_token();
    let stale_op = Operation::increment(&monitor, &plan.index, article, "saves", 1)
        .with_info("Save Content (stalled writer)");
    let new_op = Operation::increment(&monitor, &plan.index, article, "saves", 1)
        .with_info("Save Content (after the stall)");
    let stale_write = stale_writer.write_under(guard.as_ref(), &stale_op);
    let scenario = async {
        stalling.hook().reached().await;
        // The stalled writer is cut off from ZooKeeper (a long pause or a network partition):
        // ZooKeeper expires its session after the session timeout and deletes its nodes, and
        // the next writer gets the lock.
        partition.cut();
        let wait = env
            .settings
            .zookeeper
            .session_timeout
            .max(Duration::from_secs(5))
            * 4;
        let request =
            LockRequest::new(&monitor, "Save Content (after the stall)").with_timeout(wait);
        let next_guard = env.locks.acquire(request).await;
        let result = match next_guard {
            Ok(g) => {
                let result = writer.write_under(g.as_ref(), &new_op).await;
                let _ = g.unlock().await;
                result
            }
            Err(e) => Err(GuardedError::Lock(e)),
        };
        stalling.hook().let_through();
        result
    };
    let (stale_result, new_result) = tokio::join!(stale_write, scenario);
    drop(guard);
    session.close();
    let mut records = Vec::new();
    let new_token = new_result.as_ref().map(|w| w.token).ok();
    records.push(OpRecord {
        id: new_op.id,
        class: LockType::Foreground,
        article: article.to_string(),
        field: "saves",
        actor: "writer after the stall".into(),
        status: match &new_result {
            Ok(_) => OpStatus::Applied { attempts: 1 },
            Err(e) => rejected(e),
        },
        recorded: None,
    });
    let summary = match (&stale_result, new_token) {
        (Err(GuardedError::Fenced { .. }), Some(new_token)) => format!(
            "held {article} with token {token}, stalled while its session expired; another writer saved with token {new_token}; the stale write was rejected by Elasticsearch (fenced)"
        ),
        (Err(e), _) => format!("held {article} with token {token}; the stale write failed: {e}"),
        (Ok(_), _) => format!("held {article} with token {token}; the stale write was applied (no newer write reached the article first)"),
    };
    records.push(OpRecord {
        id: stale_op.id,
        class: LockType::Foreground,
        article: article.to_string(),
        field: "saves",
        actor: "stalled writer".into(),
        status: match &stale_result {
            Ok(_) => OpStatus::Applied { attempts: 1 },
            Err(e) => rejected(e),
        },
        recorded: None,
    });
    Ok((records, summary))
}

/// Checks every operation of `records` against the articles in `index` and the dead-letter
/// `sink`; see the module documentation. Sets each record's [`OpRecord::recorded`] from its
/// document, which settles the uncertain failures, and takes its counts from the records.
///
/// What cannot be read is reported in [`Reconciliation::unchecked`], not as an error: after
/// the first failure to read a document, the remaining articles are left unchecked (a server
/// that is down or frozen would make each read wait for its timeout).
///
/// # Cancellation safety
/// Cancel-safe: it only reads (a dropped call may leave some records' `recorded` set).
pub async fn reconcile(
    store: &dyn DocStore,
    index: &str,
    records: &mut [OpRecord],
    sink: &dyn DeadLetterSink,
) -> Reconciliation {
    let mut rec = Reconciliation::default();
    let parked_ids: Option<HashSet<Uuid>> = match sink.list().await {
        Ok(letters) => Some(letters.into_iter().map(|l| l.id).collect()),
        Err(e) => {
            rec.unchecked.push(format!(
                "the dead-letter {} could not be read, so parked and lost operations were not checked against it: {e}",
                sink.describe()
            ));
            None
        }
    };
    let mut by_article: BTreeMap<String, Vec<&mut OpRecord>> = BTreeMap::new();
    for r in records.iter_mut() {
        by_article.entry(r.article.clone()).or_default().push(r);
    }
    rec.articles = by_article.len();
    let mut unread: Option<(String, EsError)> = None;
    let mut unread_ops = 0;
    for (article, mut ops) in by_article {
        if unread.is_some() {
            unread_ops += ops.len();
            continue;
        }
        let doc = match store.get(index, &article).await {
            Ok(doc) => doc,
            Err(e) => {
                unread_ops += ops.len();
                unread = Some((article, e));
                continue;
            }
        };
        let Some(doc) = doc else {
            rec.mismatches.push(format!("{index}/{article} is missing"));
            continue;
        };
        let stamp = Stamp::of(&doc.source).unwrap_or_default();
        let mut expected: HashMap<&str, i64> = HashMap::new();
        for op in ops.iter_mut() {
            let recorded = stamp.contains(&op.id);
            op.recorded = Some(recorded);
            let who = format!("{} {} ({})", op.class, op.id, op.actor);
            let applied = match &op.status {
                OpStatus::Applied { .. } | OpStatus::Replayed => {
                    if !recorded {
                        rec.mismatches.push(format!(
                            "{who}: reported applied but {article} does not record it"
                        ));
                    }
                    true
                }
                OpStatus::Rejected {
                    ambiguous: true, ..
                } => recorded,
                OpStatus::Rejected { reason, .. } => {
                    if recorded {
                        rec.mismatches.push(format!(
                            "{who}: reported rejected ({reason}) but {article} records it"
                        ));
                    }
                    false
                }
                OpStatus::Parked { .. } => {
                    if recorded {
                        rec.mismatches
                            .push(format!("{who}: reported parked but {article} records it"));
                    } else if parked_ids.as_ref().is_some_and(|p| !p.contains(&op.id)) {
                        rec.mismatches.push(format!(
                            "{who}: reported parked but it is not in the dead-letter {}",
                            sink.describe()
                        ));
                    }
                    false
                }
                OpStatus::Lost { .. } => {
                    if recorded {
                        rec.mismatches
                            .push(format!("{who}: reported lost but {article} records it"));
                    } else if parked_ids.as_ref().is_some_and(|p| p.contains(&op.id)) {
                        rec.mismatches.push(format!(
                            "{who}: reported lost but it is in the dead-letter {}",
                            sink.describe()
                        ));
                    }
                    false
                }
            };
            if applied {
                *expected.entry(op.field).or_default() += 1;
            }
        }
        for field in ["saves", "propagations"] {
            let want = expected.get(field).copied().unwrap_or(0);
            let have = doc.source.get(field).and_then(Value::as_i64);
            if have != Some(want) {
                rec.mismatches.push(format!(
                    "{index}/{article}: {field} is {} but {want} operations were applied",
                    have.map_or_else(|| "missing".to_string(), |h| h.to_string())
                ));
            }
        }
    }
    if let Some((article, e)) = unread {
        rec.unchecked.push(format!(
            "{unread_ops} operations were not checked against Elasticsearch: reading {index}/{article} failed: {e}"
        ));
    }
    let all = tally(records.iter(), None);
    rec.checked = records.iter().filter(|r| r.recorded.is_some()).count();
    rec.ambiguous_resolved = records
        .iter()
        .filter(|r| {
            r.recorded.is_some()
                && matches!(
                    r.status,
                    OpStatus::Rejected {
                        ambiguous: true,
                        ..
                    }
                )
        })
        .count();
    rec.applied = all.applied + all.replayed;
    rec.rejected = all.rejected;
    rec.uncertain = all.uncertain;
    rec.parked = all.parked;
    rec.lost = all.lost;
    rec
}
