//! Lock benchmarks: the figures behind `zkguard bench` and `make bench`.
//!
//! The figures are defined exactly as in the benchmark peers shipped with zkguard
//! (`bench/curator/CuratorBench.java` for Apache Curator's `InterProcessMutex`,
//! `bench/kazoo/kazoo_bench.py` for kazoo's `Lock`), so that the ratios between them mean
//! something:
//!
//! - **uncontended**: one client (one ZooKeeper session, or one Elasticsearch client) runs a
//!   warm-up ([`BenchPlan::warmup`] cycles, by default `max(50, iterations / 5)`), then
//!   `iterations` acquire+release cycles on one reused monitor object. The latency of a whole
//!   cycle is recorded; p50 and p99 are nearest-rank percentiles (rank `ceil(q * n)`).
//! - **requests per cycle**: on ZooKeeper, the growth of the server's own request count
//!   (`zk_packets_received` of the `mntr` four-letter word, read from the first host of
//!   `zookeeper.servers`) over those cycles, divided by `iterations`. On Elasticsearch, the
//!   number of requests the lock sent through its document store over those cycles (every store
//!   call is one HTTP request), divided by `iterations`.
//! - **contended**: `contenders` clients, each with its own session (ZooKeeper) or its own
//!   client and connection pool (Elasticsearch), run concurrently (one task each) and acquire
//!   and release ONE monitor object until `iterations` acquisitions happened in total; the
//!   figure is acquisitions (hand-offs) per second. A short warm-up (`min(warmup,
//!   20 * contenders)` acquisitions) runs first, untimed. A second figure counts only the
//!   acquisitions by another client than the previous holder (owner changes per second): a
//!   lock without a queue, like the Elasticsearch lease lock, lets a releasing holder take it
//!   again at once, and this figure shows how often the lock really changed hands. The
//!   requests of all clients during the measured hand-offs are counted as for the uncontended
//!   cycles (requests per hand-off).
//! - **client CPU time**: the user + system CPU time of the benchmarking process
//!   (`getrusage(RUSAGE_SELF)`, all threads) over the measured uncontended cycles and over the
//!   measured hand-offs, divided by their number (CPU milliseconds per cycle and per hand-off).
//!   The peers measure their own process the same way, so the client's own cost is comparable
//!   whatever the machine's load.
//! - **throughput**: the same clients over `monitors` monitor objects, each cycle on a monitor
//!   picked at random, until `iterations` cycles happened in total; cycles per second. Same
//!   warm-up. Its requests and the client CPU time are counted per cycle as above.
//! - **release**: in the contended and throughput phases each client goes from lock to lock
//!   with [`zkguard::LockService::release_and_acquire`], as `zkguard serve`'s lanes do: on
//!   ZooKeeper the next acquisition's first multi also releases the lock held (one request
//!   and one transaction for both), and the release's outcome is checked once the
//!   acquisition has its answer (a failed release fails the run). With
//!   [`BenchPlan::with_separate_release`] (`zkguard bench --separate-release`) each client
//!   goes through [`zkguard::lock::release_then_acquire`] instead: it releases with
//!   [`zkguard::Guard::release`], as guarded writes do (the release is sent on its own), and the
//!   next acquisition goes out right behind it. The uncontended cycle
//!   awaits [`zkguard::Guard::unlock`] either way, so its latency is the whole round of both.
//!   The peers release and acquire one after the other, waiting for each answer (their APIs
//!   have no other way).
//! - **server CPU time**: with [`BenchPlan::with_server_pid`] (`zkguard bench --server-pid`,
//!   which `make bench` passes; `--local` knows its own server), the user + system CPU time of
//!   the ZooKeeper server process (`/proc/PID/stat`, Linux) over the measured uncontended
//!   cycles, hand-offs and throughput cycles, divided by their number. On a small machine the
//!   server's CPU is what every client competes for, so this figure says what a lock costs the
//!   server whatever else runs; it is measured the same way by the peers. The JVM's clock ticks
//!   by 10 ms: use at least 1000 iterations.
//!
//! Every acquisition waits at most [`BenchPlan::lock_timeout`] (60 s by default, as the peers),
//! instead of the configured per-type timeouts, so that a slow machine yields slow figures
//! rather than errors.
//!
//! The monitors are named `zkguard-bench-<epoch ms>-…`, fresh for every run. On ZooKeeper they
//! are container nodes that the server reaps once empty; on Elasticsearch their lock documents
//! stay in `elasticsearch.lock.index` (lock documents are never deleted, see
//! [`zkguard::eslock`]).
//!
//! `zkguard bench` (`src/cli/bench.rs`) makes a [`BenchPlan`], calls [`run`] once per backend
//! and prints the [`BenchReport`] (text, or [`BenchReport::to_json`]).

use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::Rng;
use serde_json::{json, Value};
use tracing::{info, Instrument};

use zkguard::config::{LockBackendKind, Settings};
use zkguard::es::{DocStore, EsStore, HookedStore};
use zkguard::eslock::EsLockService;
use zkguard::lock::{release_then_acquire, Guard, LockError, LockRequest, LockService};
use zkguard::zk::{ZkLockService, ZkSession};

use super::measure::percentile;
use super::measure::{CountCalls, PhaseCost, PhaseMeter, RequestCounter, ServerCpu};

/// The lock info written by benchmark acquisitions (shown by `zkguard locks`).
pub const LOCK_INFO: &str = "zkguard bench";

/// How long one benchmark acquisition may wait, as in the peers.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(60);

/// What to measure: counts and limits of one benchmark run. Make one with [`BenchPlan::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct BenchPlan {
    /// Measured cycles of each figure (uncontended cycles, contended hand-offs, throughput
    /// cycles).
    pub iterations: u32,
    /// Concurrent clients (separate sessions) of the contended and throughput figures.
    pub contenders: u32,
    /// Monitor objects of the throughput figure.
    pub monitors: u32,
    /// Uncontended warm-up cycles; `None` means `max(50, iterations / 5)`, as the peers.
    pub warmup: Option<u32>,
    /// How long one acquisition may wait before the run fails.
    pub lock_timeout: Duration,
    /// The ZooKeeper server's process id, whose CPU time is measured when set.
    pub server_pid: Option<u32>,
    /// Whether the contended and throughput clients release each lock on its own
    /// ([`zkguard::Guard::release`]) instead of in their next acquisition
    /// ([`zkguard::LockService::release_and_acquire`]).
    pub separate_release: bool,
}

impl BenchPlan {
    /// A plan with the default warm-up and lock timeout.
    pub fn new(iterations: u32, contenders: u32, monitors: u32) -> Self {
        Self {
            iterations,
            contenders,
            monitors,
            warmup: None,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            server_pid: None,
            separate_release: false,
        }
    }

    /// Releases each lock on its own before the next acquisition, instead of in it (see the
    /// module docs, "release").
    pub fn with_separate_release(mut self) -> Self {
        self.separate_release = true;
        self
    }

    /// Measures the CPU time of the server process `pid` too (Linux `/proc`; on another system,
    /// or when the process cannot be read, the server figures are `null`).
    pub fn with_server_pid(mut self, pid: u32) -> Self {
        self.server_pid = Some(pid);
        self
    }

    /// Sets the number of uncontended warm-up cycles.
    pub fn with_warmup(mut self, warmup: u32) -> Self {
        self.warmup = Some(warmup);
        self
    }

    /// Uncontended warm-up cycles: the explicit value, or `max(50, iterations / 5)`.
    pub fn warmup(&self) -> u32 {
        self.warmup.unwrap_or_else(|| (self.iterations / 5).max(50))
    }

    /// Warm-up acquisitions before the contended and the throughput figures:
    /// `min(warmup, 20 * contenders)`.
    pub fn shared_warmup(&self) -> u32 {
        self.warmup().min(self.contenders.saturating_mul(20))
    }

    /// Checks that every count is at least 1.
    ///
    /// # Errors
    /// [`BenchError::InvalidPlan`] naming the count.
    pub fn validate(&self) -> Result<(), BenchError> {
        for (name, value) in [
            ("iterations", self.iterations),
            ("contenders", self.contenders),
            ("monitors", self.monitors),
        ] {
            if value == 0 {
                return Err(BenchError::InvalidPlan(format!(
                    "{name} must be at least 1, got 0"
                )));
            }
        }
        if self.lock_timeout.is_zero() {
            return Err(BenchError::InvalidPlan(
                "the lock timeout must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// The figures of one run. [`BenchReport::to_json`] gives the flat JSON object of
/// `zkguard bench --json`.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchReport {
    /// `"zookeeper"` or `"elasticsearch"`.
    pub backend: &'static str,
    /// Measured cycles of each figure.
    pub iterations: u32,
    /// Concurrent clients.
    pub contenders: u32,
    /// Monitor objects of the throughput figure.
    pub monitors: u32,
    /// Uncontended warm-up cycles that ran.
    pub warmup: u32,
    /// How the contended and throughput clients released: `"release_and_acquire"` or
    /// `"separate"` (see [`BenchPlan::separate_release`]).
    pub release: &'static str,
    /// Median uncontended acquire+release latency, in milliseconds.
    pub uncontended_p50_ms: f64,
    /// 99th-percentile uncontended acquire+release latency, in milliseconds.
    pub uncontended_p99_ms: f64,
    /// Requests per uncontended cycle, when they could be counted (see the module docs).
    pub requests_per_cycle: Option<f64>,
    /// Client CPU time (user + system of this process) per uncontended cycle, in milliseconds.
    pub cpu_ms_per_cycle: f64,
    /// Contended acquisitions (hand-offs) per second on one monitor.
    pub handoffs_per_sec: f64,
    /// Of those, acquisitions per second by another session than the previous holder: a lock
    /// that lets its releasing holder take it again at once (no queue) scores less here.
    pub owner_changes_per_sec: f64,
    /// Requests per contended acquisition (all clients' requests, counted as for
    /// [`requests_per_cycle`](Self::requests_per_cycle)).
    pub requests_per_handoff: Option<f64>,
    /// Client CPU time (user + system of this process, all clients) per contended
    /// acquisition, in milliseconds.
    pub cpu_ms_per_handoff: f64,
    /// Acquire+release cycles per second over all monitors.
    pub ops_per_sec: f64,
    /// Requests per throughput cycle (all clients' requests, counted as for
    /// [`requests_per_cycle`](Self::requests_per_cycle)).
    pub requests_per_op: Option<f64>,
    /// Client CPU time (user + system of this process, all clients) per throughput cycle, in
    /// milliseconds.
    pub cpu_ms_per_op: f64,
    /// Server CPU time per uncontended cycle, in milliseconds (with a server pid).
    pub server_cpu_ms_per_cycle: Option<f64>,
    /// Server CPU time per contended acquisition, in milliseconds (with a server pid).
    pub server_cpu_ms_per_handoff: Option<f64>,
    /// Server CPU time per throughput cycle, in milliseconds (with a server pid).
    pub server_cpu_ms_per_op: Option<f64>,
    /// Same-session hand-offs per second (ZooKeeper: `workload::chain`).
    pub same_session_handoffs_per_sec: Option<f64>,
    /// Requests per same-session hand-off.
    pub same_session_requests_per_handoff: Option<f64>,
    /// Client CPU time per same-session hand-off, in milliseconds.
    pub same_session_cpu_ms_per_handoff: Option<f64>,
    /// Server CPU time per same-session hand-off, in milliseconds (with a server pid).
    pub same_session_server_cpu_ms_per_handoff: Option<f64>,
}

fn round(value: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}

impl BenchReport {
    /// One flat JSON object whose keys name each figure and its unit:
    /// `backend`, `iterations`, `contenders`, `monitors`, `warmup`, `release`, `uncontended.p50_ms`,
    /// `uncontended.p99_ms`, `uncontended.requests_per_cycle` (`null` when not counted),
    /// `uncontended.cpu_ms_per_cycle`, `contended.handoffs_per_sec`,
    /// `contended.owner_changes_per_sec`, `contended.requests_per_handoff` (`null` when not
    /// counted), `contended.cpu_ms_per_handoff`, `throughput.ops_per_sec`,
    /// `throughput.requests_per_op` (`null` when not counted), `throughput.cpu_ms_per_op`, and
    /// the server's CPU time `uncontended.server_cpu_ms_per_cycle`,
    /// `contended.server_cpu_ms_per_handoff` and `throughput.server_cpu_ms_per_op` (`null`
    /// without a server pid). Latencies and CPU times are rounded to 0.1 µs, requests to 0.01,
    /// rates to 0.1 (as the peers print them).
    pub fn to_json(&self) -> Value {
        json!({
            "backend": self.backend,
            "iterations": self.iterations,
            "contenders": self.contenders,
            "monitors": self.monitors,
            "warmup": self.warmup,
            "release": self.release,
            "uncontended.p50_ms": round(self.uncontended_p50_ms, 4),
            "uncontended.p99_ms": round(self.uncontended_p99_ms, 4),
            "uncontended.requests_per_cycle": self.requests_per_cycle.map(|r| round(r, 2)),
            "uncontended.cpu_ms_per_cycle": round(self.cpu_ms_per_cycle, 4),
            "contended.handoffs_per_sec": round(self.handoffs_per_sec, 1),
            "contended.owner_changes_per_sec": round(self.owner_changes_per_sec, 1),
            "contended.requests_per_handoff": self.requests_per_handoff.map(|r| round(r, 2)),
            "contended.cpu_ms_per_handoff": round(self.cpu_ms_per_handoff, 4),
            "throughput.ops_per_sec": round(self.ops_per_sec, 1),
            "throughput.requests_per_op": self.requests_per_op.map(|r| round(r, 2)),
            "throughput.cpu_ms_per_op": round(self.cpu_ms_per_op, 4),
            "uncontended.server_cpu_ms_per_cycle": self.server_cpu_ms_per_cycle.map(|c| round(c, 4)),
            "contended.server_cpu_ms_per_handoff": self.server_cpu_ms_per_handoff.map(|c| round(c, 4)),
            "throughput.server_cpu_ms_per_op": self.server_cpu_ms_per_op.map(|c| round(c, 4)),
            "same_session.handoffs_per_sec": self.same_session_handoffs_per_sec.map(|r| round(r, 1)),
            "same_session.requests_per_handoff": self.same_session_requests_per_handoff.map(|r| round(r, 2)),
            "same_session.cpu_ms_per_handoff": self.same_session_cpu_ms_per_handoff.map(|c| round(c, 4)),
            "same_session.server_cpu_ms_per_handoff": self.same_session_server_cpu_ms_per_handoff.map(|c| round(c, 4)),
        })
    }
}

/// The stages of a run, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Connecting the clients.
    Connecting,
    /// Uncontended warm-up cycles.
    UncontendedWarmup,
    /// Measured uncontended cycles.
    Uncontended,
    /// Contended warm-up.
    ContendedWarmup,
    /// Measured contended hand-offs.
    Contended,
    /// Throughput warm-up.
    ThroughputWarmup,
    /// Measured throughput cycles.
    Throughput,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Connecting => "connecting",
            Self::UncontendedWarmup => "uncontended warm-up",
            Self::Uncontended => "uncontended",
            Self::ContendedWarmup => "contended warm-up",
            Self::Contended => "contended",
            Self::ThroughputWarmup => "throughput warm-up",
            Self::Throughput => "throughput",
        })
    }
}

/// Receives progress reports of a run (the CLI draws progress bars with them).
///
/// [`advance`](Self::advance) is called once per completed cycle, outside the timed part of an
/// uncontended cycle; keep it cheap.
pub trait BenchProgress: Send + Sync {
    /// A phase starts; `total` cycles (clients, for [`Phase::Connecting`]) are planned.
    fn start(&self, phase: Phase, total: u64);
    /// `n` more cycles of the current phase completed.
    fn advance(&self, n: u64);
    /// The current phase ended.
    fn finish(&self, phase: Phase);
}

/// Why a benchmark run failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The lock service could not be reached at the start.
    #[error("{backend} is unreachable at {at}: {detail}")]
    Unreachable {
        /// `ZooKeeper` or `Elasticsearch`.
        backend: &'static str,
        /// The configured endpoint.
        at: String,
        /// What went wrong and what to do.
        detail: String,
    },
    /// The lock service could not be built from the configuration.
    #[error("cannot set up the {backend} lock service: {detail}")]
    Setup {
        /// `ZooKeeper` or `Elasticsearch`.
        backend: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A lock operation failed during the run.
    #[error("the benchmark failed during the {phase} phase: {source}")]
    Lock {
        /// The phase that failed.
        phase: Phase,
        /// The lock error.
        #[source]
        source: LockError,
    },
    /// The plan has a count of zero.
    #[error("invalid benchmark plan: {0}")]
    InvalidPlan(String),
}

impl BenchError {
    fn lock(phase: Phase) -> impl FnOnce(LockError) -> Self {
        move |source| Self::Lock { phase, source }
    }
}

/// One benchmark client: a lock service over its own session or connection pool.
struct Client {
    service: Arc<dyn LockService>,
    zk: Option<ZkSession>,
    store_calls: Option<Arc<AtomicU64>>,
}

/// The clients' store-call counters, when every client has one.
fn store_calls(clients: &[Client]) -> Option<Vec<Arc<AtomicU64>>> {
    clients.iter().map(|c| c.store_calls.clone()).collect()
}

impl Client {
    fn close(&self) {
        if let Some(zk) = &self.zk {
            zk.close();
        }
    }
}

async fn connect(settings: &Settings, backend: LockBackendKind) -> Result<Client, BenchError> {
    match backend {
        LockBackendKind::ZooKeeper => {
            let session = ZkSession::connect(&settings.zookeeper).await.map_err(|e| {
                BenchError::Unreachable {
                    backend: "ZooKeeper",
                    at: settings.zookeeper.servers.clone(),
                    detail: e.to_string(),
                }
            })?;
            Ok(Client {
                service: Arc::new(ZkLockService::new(session.clone())),
                zk: Some(session),
                store_calls: None,
            })
        }
        LockBackendKind::Elasticsearch => {
            let setup = |e: &dyn fmt::Display| BenchError::Setup {
                backend: "Elasticsearch",
                detail: e.to_string(),
            };
            let store = EsStore::new(&settings.elasticsearch).map_err(|e| setup(&e))?;
            let calls = Arc::new(AtomicU64::new(0));
            let store = Arc::new(HookedStore::new(Arc::new(store), CountCalls(calls.clone())));
            let service = EsLockService::from_settings(settings, store).map_err(|e| setup(&e))?;
            Ok(Client {
                service: Arc::new(service),
                zk: None,
                store_calls: Some(calls),
            })
        }
    }
}

/// Fails fast when Elasticsearch cannot be reached (the lease lock itself retries transport
/// errors until the lock timeout).
async fn probe_es(settings: &Settings) -> Result<(), BenchError> {
    let urls = zkguard::config::display_urls(&settings.elasticsearch.urls);
    let store = EsStore::new(&settings.elasticsearch).map_err(|e| BenchError::Setup {
        backend: "Elasticsearch",
        detail: e.to_string(),
    })?;
    match store
        .get(&settings.es_lock.index, "zkguard-bench-probe")
        .await
    {
        Ok(_) => Ok(()),
        // A transport error carries its own advice; the others get it here, once.
        Err(e @ zkguard::es::EsError::Transport { .. }) => Err(BenchError::Unreachable {
            backend: "Elasticsearch",
            at: urls,
            detail: e.to_string(),
        }),
        Err(e) => Err(BenchError::Unreachable {
            backend: "Elasticsearch",
            at: urls,
            detail: format!(
                "{e}; check elasticsearch.url (or --es) and that the server is running"
            ),
        }),
    }
}

async fn cycle(
    service: &dyn LockService,
    monitor: &str,
    timeout: Duration,
) -> Result<(), LockError> {
    let guard = service
        .acquire(LockRequest::new(monitor, LOCK_INFO).with_timeout(timeout))
        .await?;
    guard.unlock().await
}

/// The outcome of [`run_shared`].
struct SharedRun {
    /// Cycles per second.
    per_sec: f64,
    /// Acquisitions per second by another client than the previous holder of the same monitor.
    owner_changes_per_sec: f64,
}

/// Every client runs in its own task, acquiring and releasing one of `monitors` (picked at
/// random per cycle when there are several) until `total` cycles completed in all.
async fn run_shared(
    clients: &[Client],
    monitors: &Arc<Vec<String>>,
    total: u32,
    timeout: Duration,
    phase: Phase,
    separate_release: bool,
    progress: &Arc<dyn BenchProgress>,
) -> Result<SharedRun, BenchError> {
    progress.start(phase, total.into());
    let remaining = Arc::new(AtomicI64::new(total.into()));
    // Per monitor, the id (index + 1) of the client that acquired it last; 0 = nobody yet.
    let holders = Arc::new(
        (0..monitors.len())
            .map(|_| AtomicUsize::new(0))
            .collect::<Vec<_>>(),
    );
    let changes = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(clients.len() + 1));
    let mut tasks = tokio::task::JoinSet::new();
    for (index, client) in clients.iter().enumerate() {
        let (service, monitors, remaining, barrier, progress, holders, changes) = (
            client.service.clone(),
            monitors.clone(),
            remaining.clone(),
            barrier.clone(),
            progress.clone(),
            holders.clone(),
            changes.clone(),
        );
        let me = index + 1;
        tasks.spawn(async move {
            barrier.wait().await;
            // The lock this client took last, held until its next acquisition releases it: in
            // one step when the backend can (`LockService::release_and_acquire`).
            let mut held: Option<Box<dyn Guard>> = None;
            while remaining.fetch_sub(1, Ordering::AcqRel) > 0 {
                let m = if monitors.len() == 1 {
                    0
                } else {
                    rand::thread_rng().gen_range(0..monitors.len())
                };
                let request = LockRequest::new(&monitors[m], LOCK_INFO).with_timeout(timeout);
                let (released, acquired) = match held.take() {
                    Some(guard) => {
                        let (release, acquired) = if separate_release {
                            release_then_acquire(service.as_ref(), guard, request).await
                        } else {
                            service.release_and_acquire(guard, request).await
                        };
                        (Some(release), acquired)
                    }
                    None => (None, service.acquire(request).await),
                };
                // The release's answer is in by the time the acquisition has its own.
                let outcome = match (released, acquired) {
                    (_, Err(e)) => Err(e),
                    (Some(release), Ok(guard)) => release.await.map(|()| guard),
                    (None, Ok(guard)) => Ok(guard),
                };
                match outcome {
                    Ok(guard) => {
                        // Holders of one monitor are mutually exclusive: these swaps are ordered.
                        if holders[m].swap(me, Ordering::AcqRel) != me {
                            changes.fetch_add(1, Ordering::Relaxed);
                        }
                        held = Some(guard);
                    }
                    Err(e) => {
                        remaining.store(0, Ordering::Release);
                        return Err(e);
                    }
                }
                progress.advance(1);
            }
            match held {
                Some(guard) => guard.unlock().await,
                None => Ok(()),
            }
        });
    }
    barrier.wait().await;
    let started = Instant::now();
    let mut failure = None;
    while let Some(joined) = tasks.join_next().await {
        let result = joined.unwrap_or_else(|e| {
            Err(LockError::Backend {
                context: format!("{phase} contender"),
                detail: e.to_string(),
            })
        });
        if let Err(e) = result {
            failure.get_or_insert(e);
        }
    }
    let elapsed = started.elapsed();
    progress.finish(phase);
    match failure {
        Some(e) => Err(BenchError::Lock { phase, source: e }),
        None => Ok(SharedRun {
            per_sec: f64::from(total) / elapsed.as_secs_f64(),
            owner_changes_per_sec: changes.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64(),
        }),
    }
}

/// Runs the benchmark against the lock service `backend` configured by `settings`.
///
/// Progress goes to `progress`; the run's own clients are closed before this returns.
///
/// # Errors
/// [`BenchError::Unreachable`] when the service cannot be reached at the start,
/// [`BenchError::Setup`] for unusable settings, [`BenchError::Lock`] when a lock operation
/// failed during the run, [`BenchError::InvalidPlan`] for a count of zero.
///
/// # Cancellation safety
/// Dropping the future abandons the run: held locks are released in the background by their
/// guards, and the ZooKeeper sessions end when their last user is gone.
pub async fn run(
    settings: &Settings,
    backend: LockBackendKind,
    plan: &BenchPlan,
    progress: Arc<dyn BenchProgress>,
) -> Result<BenchReport, BenchError> {
    plan.validate()?;
    let base = format!(
        "zkguard-bench-{}",
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0)
    );
    let span = tracing::info_span!("bench", backend = ?backend, %base);
    run_inner(settings, backend, plan, progress, base)
        .instrument(span)
        .await
}

async fn run_inner(
    settings: &Settings,
    backend: LockBackendKind,
    plan: &BenchPlan,
    progress: Arc<dyn BenchProgress>,
    base: String,
) -> Result<BenchReport, BenchError> {
    if backend == LockBackendKind::Elasticsearch {
        probe_es(settings).await?;
    }
    let timeout = plan.lock_timeout;

    // --- uncontended ---
    progress.start(Phase::Connecting, 1);
    let solo = connect(settings, backend).await?;
    progress.finish(Phase::Connecting);
    let counter = RequestCounter::new(settings, store_calls(std::slice::from_ref(&solo)));
    let server = ServerCpu(plan.server_pid);
    let monitor = format!("{base}-uncontended");
    let warmup = plan.warmup();
    let result = async {
        progress.start(Phase::UncontendedWarmup, warmup.into());
        for _ in 0..warmup {
            cycle(solo.service.as_ref(), &monitor, timeout)
                .await
                .map_err(BenchError::lock(Phase::UncontendedWarmup))?;
            progress.advance(1);
        }
        progress.finish(Phase::UncontendedWarmup);
        progress.start(Phase::Uncontended, plan.iterations.into());
        let mut samples = Vec::with_capacity(plan.iterations as usize);
        let meter = PhaseMeter::start(&counter, &server).await;
        for _ in 0..plan.iterations {
            let t0 = Instant::now();
            cycle(solo.service.as_ref(), &monitor, timeout)
                .await
                .map_err(BenchError::lock(Phase::Uncontended))?;
            samples.push(t0.elapsed());
            progress.advance(1);
        }
        let cost = meter.finish(plan.iterations).await;
        progress.finish(Phase::Uncontended);
        samples.sort_unstable();
        Ok::<_, BenchError>((samples, cost))
    }
    .await;
    solo.close();
    let (samples, cycle_cost) = result?;
    let PhaseCost {
        cpu_ms: cpu_ms_per_cycle,
        server_cpu_ms: server_cpu_ms_per_cycle,
        requests: requests_per_cycle,
    } = cycle_cost;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let p50 = ms(percentile(&samples, 0.50));
    let p99 = ms(percentile(&samples, 0.99));
    info!(
        p50_ms = p50,
        p99_ms = p99,
        requests_per_cycle,
        cpu_ms_per_cycle,
        server_cpu_ms_per_cycle,
        "uncontended figures"
    );

    // --- contended and throughput ---
    progress.start(Phase::Connecting, plan.contenders.into());
    let mut clients = Vec::with_capacity(plan.contenders as usize);
    for _ in 0..plan.contenders {
        match connect(settings, backend).await {
            Ok(c) => clients.push(c),
            Err(e) => {
                clients.iter().for_each(Client::close);
                return Err(e);
            }
        }
        progress.advance(1);
    }
    progress.finish(Phase::Connecting);
    let result = async {
        let contended = Arc::new(vec![format!("{base}-contended")]);
        let spread = Arc::new(
            (0..plan.monitors)
                .map(|p| format!("{base}-t{p}"))
                .collect::<Vec<_>>(),
        );
        let short = plan.shared_warmup();
        run_shared(
            &clients,
            &contended,
            short,
            timeout,
            Phase::ContendedWarmup,
            plan.separate_release,
            &progress,
        )
        .await?;
        let counter = RequestCounter::new(settings, store_calls(&clients));
        let meter = PhaseMeter::start(&counter, &server).await;
        let handoffs = run_shared(
            &clients,
            &contended,
            plan.iterations,
            timeout,
            Phase::Contended,
            plan.separate_release,
            &progress,
        )
        .await?;
        let handoff = meter.finish(plan.iterations).await;
        run_shared(
            &clients,
            &spread,
            short,
            timeout,
            Phase::ThroughputWarmup,
            plan.separate_release,
            &progress,
        )
        .await?;
        let meter = PhaseMeter::start(&counter, &server).await;
        let ops = run_shared(
            &clients,
            &spread,
            plan.iterations,
            timeout,
            Phase::Throughput,
            plan.separate_release,
            &progress,
        )
        .await?;
        let op = meter.finish(plan.iterations).await;
        // Hand-offs within one session (ZooKeeper only: the lease lock has no sessions).
        let same = match &clients[0].zk {
            Some(session) => Some(
                super::chain::same_session_handoffs(
                    session,
                    &format!("{base}-same-session"),
                    plan.iterations,
                    timeout,
                    &counter,
                    &server,
                )
                .await
                .map_err(BenchError::lock(Phase::Contended))?,
            ),
            None => None,
        };
        Ok::<_, BenchError>((handoffs, handoff, ops, op, same))
    }
    .await;
    clients.iter().for_each(Client::close);
    let (handoffs, handoff, ops, op, same) = result?;
    let (handoffs_per_sec, owner_changes_per_sec, ops_per_sec) = (
        handoffs.per_sec,
        handoffs.owner_changes_per_sec,
        ops.per_sec,
    );
    info!(
        handoffs_per_sec,
        owner_changes_per_sec,
        cpu_ms_per_handoff = handoff.cpu_ms,
        server_cpu_ms_per_handoff = handoff.server_cpu_ms,
        ops_per_sec,
        server_cpu_ms_per_op = op.server_cpu_ms,
        "contended figures"
    );

    Ok(BenchReport {
        backend: match backend {
            LockBackendKind::ZooKeeper => "zookeeper",
            LockBackendKind::Elasticsearch => "elasticsearch",
        },
        iterations: plan.iterations,
        contenders: plan.contenders,
        monitors: plan.monitors,
        warmup,
        release: if plan.separate_release {
            "separate"
        } else {
            "release_and_acquire"
        },
        uncontended_p50_ms: p50,
        uncontended_p99_ms: p99,
        requests_per_cycle,
        cpu_ms_per_cycle,
        handoffs_per_sec,
        owner_changes_per_sec,
        requests_per_handoff: handoff.requests,
        cpu_ms_per_handoff: handoff.cpu_ms,
        ops_per_sec,
        requests_per_op: op.requests,
        cpu_ms_per_op: op.cpu_ms,
        server_cpu_ms_per_cycle,
        server_cpu_ms_per_handoff: handoff.server_cpu_ms,
        server_cpu_ms_per_op: op.server_cpu_ms,
        same_session_handoffs_per_sec: same.as_ref().map(|s| s.handoffs_per_sec),
        same_session_requests_per_handoff: same.as_ref().and_then(|s| s.requests_per_handoff),
        same_session_cpu_ms_per_handoff: same.as_ref().map(|s| s.cpu_ms_per_handoff),
        same_session_server_cpu_ms_per_handoff: same.and_then(|s| s.server_cpu_ms_per_handoff),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmups_follow_the_peers() {
        assert_eq!(BenchPlan::new(1000, 4, 8).warmup(), 200);
        assert_eq!(BenchPlan::new(50, 2, 2).warmup(), 50);
        assert_eq!(BenchPlan::new(1000, 4, 8).shared_warmup(), 80);
        assert_eq!(
            BenchPlan::new(1000, 4, 8).with_warmup(10).shared_warmup(),
            10
        );
        assert!(BenchPlan::new(0, 1, 1).validate().is_err());
    }

    #[test]
    fn json_keys_name_figure_and_unit() {
        let r = BenchReport {
            backend: "zookeeper",
            iterations: 10,
            contenders: 2,
            monitors: 3,
            warmup: 50,
            release: "separate",
            uncontended_p50_ms: 1.234_56,
            uncontended_p99_ms: 2.0,
            requests_per_cycle: None,
            cpu_ms_per_cycle: 0.123_456,
            handoffs_per_sec: 100.04,
            owner_changes_per_sec: 99.0,
            requests_per_handoff: Some(7.123),
            cpu_ms_per_handoff: 0.5,
            ops_per_sec: 200.0,
            requests_per_op: Some(3.456),
            cpu_ms_per_op: 0.25,
            server_cpu_ms_per_cycle: None,
            server_cpu_ms_per_handoff: Some(0.333_33),
            server_cpu_ms_per_op: Some(0.2),
            same_session_handoffs_per_sec: Some(900.04),
            same_session_requests_per_handoff: Some(1.004),
            same_session_cpu_ms_per_handoff: Some(0.05),
            same_session_server_cpu_ms_per_handoff: None,
        };
        let j = r.to_json();
        assert_eq!(j["uncontended.p50_ms"], 1.2346);
        assert!(j["uncontended.requests_per_cycle"].is_null());
        assert_eq!(j["contended.handoffs_per_sec"], 100.0);
        assert_eq!(j["uncontended.cpu_ms_per_cycle"], 0.1235);
        assert_eq!(j["contended.cpu_ms_per_handoff"], 0.5);
        assert_eq!(j["backend"], "zookeeper");
        assert_eq!(j["release"], "separate");
        assert_eq!(j["throughput.requests_per_op"], 3.46);
        assert_eq!(j["throughput.cpu_ms_per_op"], 0.25);
        assert!(j["uncontended.server_cpu_ms_per_cycle"].is_null());
        assert_eq!(j["contended.server_cpu_ms_per_handoff"], 0.3333);
        assert_eq!(j["same_session.handoffs_per_sec"], 900.0);
        assert_eq!(j["same_session.requests_per_handoff"], 1.0);
        assert!(j["same_session.server_cpu_ms_per_handoff"].is_null());
    }
}
