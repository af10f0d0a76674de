//! Prometheus metrics of the service (`GET /metrics`), through the `prometheus-client` crate.
//!
//! The text is the OpenMetrics text format (which Prometheus scrapes natively): counters end in
//! `_total`, histograms have `_bucket`/`_sum`/`_count`, the answer ends with `# EOF`.
//!
//! Besides the service's own `zkguard_*` metrics, the page has `zkguard_build_info` and the
//! `process_*` metrics of Prometheus' process collector, read from `/proc` at each scrape.

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use zkguard::write::deadletter::DeadLetterSink;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Metric, Registry};
use zkguard::write::background::ExecutorStats;

/// Labels of HTTP request counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// The route pattern (`/v1/indices/{index}/docs/{id}`), or `unmatched`.
    pub route: String,
    /// HTTP method.
    pub method: String,
    /// Answer status.
    pub status: u16,
}

/// A lock type label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabels {
    /// `foreground` or `background`.
    pub lock_type: &'static str,
}

/// How operations ended, by lock type.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `foreground` or `background`.
    pub lock_type: &'static str,
    /// `applied`, `rejected`, `parked`, or for foreground requests the error kind.
    pub outcome: &'static str,
}

/// What a wait waited for, and how it ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitLabels {
    /// `operation` (`GET /v1/operations/{id}?wait=`) or `lock` (`GET /v1/locks/{monitor}?wait=`).
    pub route: &'static str,
    /// `changed` (the operation left `queued`, the monitor changed), `timeout` (nothing changed
    /// before the wait ended) or `refused` (`server.wait.max` waiters already).
    pub outcome: &'static str,
}

/// A stage of background work.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    /// `lock_wait` (lanes waiting for their monitors' locks), `read` (`_mget` requests),
    /// `write` (`_bulk` requests).
    pub stage: &'static str,
}

/// Labels of the Elasticsearch-compatible gate's counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GateLabels {
    /// `index`, `create`, `update`, `delete`, `bulk`, `auto_id`, `by_query`, `reindex` or
    /// `other` (requests); `index`, `create`, `update`, `delete` (bulk items).
    pub route: &'static str,
    /// `guarded` (locked and fenced), `passed` (passed through), `refused` (by the gate),
    /// `conflict` (409 under the lock), `lock_timeout`, `failed`.
    pub outcome: &'static str,
}

/// How a document transaction ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TxnLabels {
    /// `committed` or `rolled-back` (decided by its coordinator); for recovery, `finished` or
    /// `rolled-back`.
    pub outcome: &'static str,
}

/// The type of an event of `GET /v1/events`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// `acquired`, `released`, `lost`, `applied`, `rejected` or `parked`.
    pub r#type: &'static str,
}

/// Labels of `zkguard_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The package version (`0.1.0`).
    pub version: &'static str,
    /// The git commit the binary was built from (12 hex digits), or `unknown`.
    pub commit: &'static str,
}

/// The git commit this binary was built from, as build.rs found it (`unknown` without git).
pub const BUILD_COMMIT: &str = env!("BUILT_FROM_COMMIT");

type HistogramFamily = Family<TypeLabels, Histogram, fn() -> Histogram>;

fn seconds_histogram() -> Histogram {
    // 0.5 ms to about 16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// Every metric of the service.
pub struct Metrics {
    registry: Registry,
    /// HTTP requests by route, method and status.
    pub http_requests: Family<HttpLabels, Counter>,
    /// Time waited for a lock, by lock type.
    pub lock_wait: HistogramFamily,
    /// Time a lock was held, by lock type.
    pub lock_hold: HistogramFamily,
    /// Locks acquired, by lock type.
    pub acquisitions: Family<TypeLabels, Counter>,
    /// Locks not acquired in time, by lock type.
    pub lock_timeouts: Family<TypeLabels, Counter>,
    /// Locks lost while held.
    pub locks_lost: Counter,
    /// Writes rejected by fencing, by lock type.
    pub fenced: Family<TypeLabels, Counter>,
    /// Operations by lock type and outcome.
    pub operations: Family<OutcomeLabels, Counter>,
    /// Background retries (attempts after the first).
    pub retries: Counter,
    /// Operations parked in the dead-letter sink.
    pub parked: Counter,
    /// Dead letters replayed into their documents (`POST /v1/deadletters/replay`).
    pub replayed: Counter,
    /// Accepted background operations not finished yet (in the journal).
    pub journal_depth: Gauge,
    /// Seconds the oldest of them has been queued (0 when none is).
    pub journal_oldest: Gauge<f64, AtomicU64>,
    /// Background operations waiting to be started by the executor.
    pub queue_depth: Gauge,
    /// Explicit locks held for callers.
    pub explicit_locks: Gauge,
    /// 1 when the ZooKeeper session is connected (or the lock backend is reachable).
    pub zk_connected: Gauge,
    /// Times the lock backend came back after being unavailable.
    pub zk_reconnects: Counter,
    /// HTTP connections open.
    pub connections: Gauge,
    /// Bytes of queued background operations, as journaled.
    pub journal_bytes: Gauge,
    /// Background writes and bulks refused at a bound of the queue.
    pub queue_full: Counter,
    /// Connections closed to make room for a new one at `server.max.connections`.
    pub connections_evicted: Counter,
    /// Connections refused (503, closed) at `server.max.connections` with every one busy.
    pub connections_refused: Counter,
    /// Connections closed for not sending a request's headers within `server.header.timeout`.
    pub connections_timed_out: Counter,
    /// Requests waiting now (`?wait=`: an operation's outcome, a monitor's change).
    pub waiters: Gauge,
    /// Waits, by what they waited for and how they ended.
    pub waits: Family<WaitLabels, Counter>,
    /// Requests of the Elasticsearch-compatible gate, by route and outcome.
    pub gateway_requests: Family<GateLabels, Counter>,
    /// `_bulk` items through the gate, by operation and outcome.
    pub gateway_items: Family<GateLabels, Counter>,
    /// Event streams open (`GET /v1/events`).
    pub event_streams: Gauge,
    /// Event streams refused at `server.events.max`.
    pub event_streams_refused: Counter,
    /// Events of the service's lock activity, by type (whether or not a stream was open).
    pub events: Family<EventLabels, Counter>,
    /// Events that slow streams missed (told to them in a `lagged` event).
    pub events_missed: Counter,
    /// Time of background work by stage (cumulated over lanes and requests).
    pub stage_seconds: Family<StageLabels, Counter<f64, AtomicU64>>,
    /// Requests of background work by stage (`read`, `write`), and lane acquisitions
    /// (`lock_wait`).
    pub stage_requests: Family<StageLabels, Counter>,
    /// `fsync`s of the journal's appended lines (accepts and outcomes; group commit).
    pub journal_fsyncs: Counter,
    /// Their time.
    pub journal_fsync_seconds: Counter<f64, AtomicU64>,
    /// Document transactions decided by their coordinator (`/v1/transactions`, the gate's
    /// atomic `_bulk`), by decision.
    pub transactions: Family<TxnLabels, Counter>,
    /// Document transactions recovery finished or undone.
    pub transactions_recovered: Family<TxnLabels, Counter>,
    /// Dead letters in the dead-letter sink now, as last counted ([`Metrics::count_deadletters`]).
    pub deadletters: Gauge,
    /// The `process_*` metrics (no `zkguard_` prefix).
    process: Registry,
    seen: Mutex<(u64, u64)>,
    /// Last values seen of the cumulative stage and journal counters.
    seen_stages: Mutex<[u64; 8]>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The name (without the `zkguard_` prefix) and help text of every metric but `build_info`,
/// in the order of the exposition.
const HELP: &[(&str, &str)] = &[
    (
        "http_requests",
        "HTTP requests by route, method and status",
    ),
    (
        "lock_wait_seconds",
        "Time spent waiting for a lock, by lock type",
    ),
    (
        "lock_hold_seconds",
        "Time a lock was held, by lock type",
    ),
    (
        "lock_acquisitions",
        "Locks acquired, by lock type",
    ),
    (
        "lock_timeouts",
        "Locks not acquired in time, by lock type",
    ),
    (
        "locks_lost",
        "Locks lost before the write was sent",
    ),
    (
        "fenced_rejections",
        "Writes rejected by fencing (the document holds a newer version: a newer lock holder, or a writer outside zkguard, set it)",
    ),
    (
        "operations",
        "Write operations by lock type and outcome",
    ),
    (
        "background_retries",
        "Background attempts after the first",
    ),
    (
        "deadletters_parked",
        "Operations parked in the dead-letter sink",
    ),
    (
        "deadletters_replayed",
        "Dead letters replayed into their documents",
    ),
    (
        "journal_depth",
        "Accepted background operations not finished yet",
    ),
    (
        "journal_oldest_seconds",
        "Seconds the oldest accepted background operation not finished yet has been queued (0 when none is)",
    ),
    (
        "explicit_locks",
        "Explicit locks held for callers (POST /v1/locks)",
    ),
    (
        "background_queue_depth",
        "Background operations waiting for the executor",
    ),
    (
        "lock_backend_connected",
        "1 when the ZooKeeper session (or the Elasticsearch lock backend) is usable",
    ),
    (
        "lock_backend_reconnects",
        "Times the lock backend became usable again after an outage",
    ),
    (
        "waiters",
        "Requests waiting now (?wait= on /v1/operations/{id} and /v1/locks/{monitor})",
    ),
    (
        "waits",
        "Waits, by route (operation, lock) and how they ended (changed, timeout, refused)",
    ),
    (
        "gateway_requests",
        "Requests of the Elasticsearch-compatible gate, by route and outcome (guarded, passed, refused, conflict, lock_timeout, failed)",
    ),
    (
        "gateway_bulk_items",
        "_bulk items through the gate, by operation and outcome",
    ),
    (
        "journal_queued_bytes",
        "Bytes of accepted background operations not finished yet, as journaled",
    ),
    (
        "queue_full_refusals",
        "Background writes and bulks refused (503 queue_full) at server.queue.max, server.queue.max.bytes or server.journal.max.bytes",
    ),
    (
        "http_connections",
        "HTTP connections open",
    ),
    (
        "http_connections_evicted",
        "Idle connections closed to make room for a new one at server.max.connections",
    ),
    (
        "http_connections_refused",
        "Connections answered 503 and closed at server.max.connections, every one being busy",
    ),
    (
        "http_connections_timed_out",
        "Connections closed for not sending a request's headers within server.header.timeout",
    ),
    (
        "event_streams",
        "Event streams open (GET /v1/events)",
    ),
    (
        "event_streams_refused",
        "Event streams refused (503 too_many_streams) at server.events.max",
    ),
    (
        "events",
        "Events of the service's lock activity, by type (acquired, released, lost, applied, rejected, parked), whether or not a stream listened",
    ),
    (
        "events_missed",
        "Events that event streams missed because their client read too slowly (each told in a lagged event)",
    ),
    (
        "background_stage_seconds",
        "Time of background work by stage: lock_wait (lanes waiting for their monitors' locks), read (_mget requests), write (_bulk requests)",
    ),
    (
        "background_stage_requests",
        "Background lock acquisitions (lock_wait), _mget requests (read) and _bulk requests (write)",
    ),
    (
        "journal_fsyncs",
        "fsyncs of the journal's appended lines (one covers every line written before it)",
    ),
    (
        "journal_fsync_seconds",
        "Time spent in fsyncs of the journal's appended lines",
    ),
    (
        "transactions",
        "Document transactions decided by their coordinator, by outcome",
    ),
    (
        "transactions_recovered",
        "Document transactions recovery finished or rolled back (their coordinator stopped)",
    ),
    (
        "deadletters",
        "Dead letters in the dead-letter sink now (counted at each scrape; replicas sharing a sink each count all of them)",
    ),
];

/// Registers `build_info`: 1, labelled with the version and the commit zkguard was built from.
fn register_build_info(registry: &mut Registry) {
    let build = Family::<BuildLabels, Gauge>::default();
    registry.register(
        "build_info",
        "1, labelled with the version and the git commit zkguard was built from",
        build.clone(),
    );
    build
        .get_or_create(&BuildLabels {
            version: env!("CARGO_PKG_VERSION"),
            commit: BUILD_COMMIT,
        })
        .set(1);
}

/// A registry being filled: each metric registered under its name with its help text from
/// [`HELP`].
struct Registering(Registry);

impl Registering {
    /// Registers `metric` as `name` and returns it (a handle to the same series).
    fn add<M: Metric + Clone>(&mut self, name: &'static str, metric: M) -> M {
        let help = HELP
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("", |(_, help)| help);
        debug_assert!(!help.is_empty(), "metric {name} has no help text in HELP");
        self.0.register(name, help, metric.clone());
        metric
    }
}

impl Metrics {
    /// All metrics, registered under the `zkguard` prefix.
    pub fn new() -> Self {
        let mut r = Registering(Registry::with_prefix("zkguard"));
        let http_requests = r.add("http_requests", Family::<HttpLabels, Counter>::default());
        let lock_wait: HistogramFamily = r.add(
            "lock_wait_seconds",
            Family::new_with_constructor(seconds_histogram),
        );
        let lock_hold: HistogramFamily = r.add(
            "lock_hold_seconds",
            Family::new_with_constructor(seconds_histogram),
        );
        let acquisitions = r.add(
            "lock_acquisitions",
            Family::<TypeLabels, Counter>::default(),
        );
        let lock_timeouts = r.add("lock_timeouts", Family::<TypeLabels, Counter>::default());
        let locks_lost = r.add("locks_lost", Counter::default());
        let fenced = r.add(
            "fenced_rejections",
            Family::<TypeLabels, Counter>::default(),
        );
        let operations = r.add("operations", Family::<OutcomeLabels, Counter>::default());
        let retries = r.add("background_retries", Counter::default());
        let parked = r.add("deadletters_parked", Counter::default());
        let replayed = r.add("deadletters_replayed", Counter::default());
        let journal_depth = r.add("journal_depth", Gauge::default());
        let journal_oldest = r.add("journal_oldest_seconds", Gauge::<f64, AtomicU64>::default());
        let explicit_locks = r.add("explicit_locks", Gauge::default());
        let queue_depth = r.add("background_queue_depth", Gauge::default());
        let zk_connected = r.add("lock_backend_connected", Gauge::default());
        let zk_reconnects = r.add("lock_backend_reconnects", Counter::default());
        let waiters = r.add("waiters", Gauge::default());
        let waits = r.add("waits", Family::<WaitLabels, Counter>::default());
        let gateway_requests = r.add("gateway_requests", Family::<GateLabels, Counter>::default());
        let gateway_items = r.add(
            "gateway_bulk_items",
            Family::<GateLabels, Counter>::default(),
        );
        let journal_bytes = r.add("journal_queued_bytes", Gauge::default());
        let queue_full = r.add("queue_full_refusals", Counter::default());
        let connections = r.add("http_connections", Gauge::default());
        let connections_evicted = r.add("http_connections_evicted", Counter::default());
        let connections_refused = r.add("http_connections_refused", Counter::default());
        let connections_timed_out = r.add("http_connections_timed_out", Counter::default());
        let event_streams = r.add("event_streams", Gauge::default());
        let event_streams_refused = r.add("event_streams_refused", Counter::default());
        let events = r.add("events", Family::<EventLabels, Counter>::default());
        let events_missed = r.add("events_missed", Counter::default());
        let stage_seconds = r.add(
            "background_stage_seconds",
            Family::<StageLabels, Counter<f64, AtomicU64>>::default(),
        );
        let stage_requests = r.add(
            "background_stage_requests",
            Family::<StageLabels, Counter>::default(),
        );
        let journal_fsyncs = r.add("journal_fsyncs", Counter::default());
        let journal_fsync_seconds = r.add(
            "journal_fsync_seconds",
            Counter::<f64, AtomicU64>::default(),
        );
        let transactions = r.add("transactions", Family::<TxnLabels, Counter>::default());
        let transactions_recovered = r.add(
            "transactions_recovered",
            Family::<TxnLabels, Counter>::default(),
        );
        let deadletters = r.add("deadletters", Gauge::default());
        let mut registry = r.0;
        register_build_info(&mut registry);
        let mut process = Registry::default();
        process.register_collector(Box::new(ProcessCollector));
        for outcome in ["committed", "rolled-back"] {
            let _ = transactions.get_or_create(&TxnLabels { outcome });
        }
        for outcome in ["finished", "rolled-back"] {
            let _ = transactions_recovered.get_or_create(&TxnLabels { outcome });
        }
        // The series of both lock types exist from the start, at 0: a rule's `increase()` or
        // `rate()` sees the first lock timeout or fenced write, which it would miss if the series
        // appeared with it (at 1).
        for lock_type in [zkguard::LockType::Foreground, zkguard::LockType::Background] {
            let labels = TypeLabels {
                lock_type: lock_type.as_str(),
            };
            let _ = lock_wait.get_or_create(&labels);
            let _ = lock_hold.get_or_create(&labels);
            let _ = acquisitions.get_or_create(&labels);
            let _ = lock_timeouts.get_or_create(&labels);
            let _ = fenced.get_or_create(&labels);
        }
        Self {
            registry,
            process,
            deadletters,
            transactions,
            transactions_recovered,
            stage_seconds,
            stage_requests,
            journal_fsyncs,
            journal_fsync_seconds,
            seen_stages: Mutex::new([0; 8]),
            event_streams,
            event_streams_refused,
            events,
            events_missed,
            journal_bytes,
            queue_full,
            connections,
            connections_evicted,
            connections_refused,
            connections_timed_out,
            http_requests,
            lock_wait,
            lock_hold,
            acquisitions,
            lock_timeouts,
            locks_lost,
            fenced,
            operations,
            retries,
            parked,
            replayed,
            journal_depth,
            journal_oldest,
            queue_depth,
            explicit_locks,
            zk_connected,
            zk_reconnects,
            waiters,
            waits,
            gateway_requests,
            gateway_items,
            seen: Mutex::new((0, 0)),
        }
    }

    /// Counts a document transaction its coordinator decided.
    pub fn transaction(&self, decision: zkguard::txn::multi::Decision) {
        let outcome = match decision {
            zkguard::txn::multi::Decision::Committed => "committed",
            zkguard::txn::multi::Decision::RolledBack => "rolled-back",
        };
        self.transactions
            .get_or_create(&TxnLabels { outcome })
            .inc();
    }

    /// Counts a document transaction recovery `outcome` (`finished`, `rolled-back`).
    pub fn transaction_recovered(&self, outcome: &'static str) {
        self.transactions_recovered
            .get_or_create(&TxnLabels { outcome })
            .inc();
    }

    /// Counts a wait for `route` (`operation`, `lock`) that ended as `outcome`.
    pub fn waited(&self, route: &'static str, outcome: &'static str) {
        self.waits
            .get_or_create(&WaitLabels { route, outcome })
            .inc();
    }

    /// Counts a request of the gate.
    pub fn gate(&self, route: &'static str, outcome: &'static str) {
        self.gateway_requests
            .get_or_create(&GateLabels { route, outcome })
            .inc();
    }

    /// Counts a `_bulk` item of the gate.
    pub fn gate_item(&self, route: &'static str, outcome: &'static str) {
        self.gateway_items
            .get_or_create(&GateLabels { route, outcome })
            .inc();
    }

    /// Counts a lock of `lock_type` not acquired in time.
    pub fn lock_timed_out(&self, lock_type: zkguard::LockType) {
        self.lock_timeouts
            .get_or_create(&TypeLabels {
                lock_type: lock_type.as_str(),
            })
            .inc();
    }

    /// Counts a write under a lock of `lock_type` rejected by fencing.
    pub fn fenced_write(&self, lock_type: zkguard::LockType) {
        self.fenced
            .get_or_create(&TypeLabels {
                lock_type: lock_type.as_str(),
            })
            .inc();
    }

    /// Records a lock acquired after `waited` and held for `held`.
    pub fn lock_used(&self, lock_type: &'static str, waited: Duration, held: Duration) {
        let l = TypeLabels { lock_type };
        self.acquisitions.get_or_create(&l).inc();
        self.lock_wait
            .get_or_create(&l)
            .observe(waited.as_secs_f64());
        self.lock_hold.get_or_create(&l).observe(held.as_secs_f64());
    }

    /// Counts an operation's outcome.
    pub fn outcome(&self, lock_type: &'static str, outcome: &'static str) {
        self.operations
            .get_or_create(&OutcomeLabels { lock_type, outcome })
            .inc();
    }

    /// Takes the executor's retry and (background) fencing counts into the counters.
    /// Adds what the cumulative stage counters of the executor (`stats`) and the journal
    /// (`fsyncs`, `fsync_us`) gained since the last call.
    pub fn sync_stages(&self, stats: &ExecutorStats, fsyncs: u64, fsync_us: u64) {
        let mut seen = self.seen_stages.lock().unwrap_or_else(|p| p.into_inner());
        let now = [
            stats.lock_wait_us,
            stats.read_us,
            stats.write_us,
            stats.lane_acquisitions,
            stats.read_requests,
            stats.write_requests,
            fsyncs,
            fsync_us,
        ];
        let gained: Vec<u64> = now
            .iter()
            .zip(seen.iter())
            .map(|(n, s)| n.saturating_sub(*s))
            .collect();
        *seen = now;
        drop(seen);
        let seconds = |us: u64| us as f64 / 1e6;
        for (i, stage) in ["lock_wait", "read", "write"].into_iter().enumerate() {
            let labels = StageLabels { stage };
            self.stage_seconds
                .get_or_create(&labels)
                .inc_by(seconds(gained[i]));
            self.stage_requests
                .get_or_create(&labels)
                .inc_by(gained[3 + i]);
        }
        self.journal_fsyncs.inc_by(gained[6]);
        self.journal_fsync_seconds.inc_by(seconds(gained[7]));
    }

    pub fn sync_executor(&self, stats: &ExecutorStats) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if stats.retried > seen.0 {
            self.retries.inc_by(stats.retried - seen.0);
            seen.0 = stats.retried;
        }
        if stats.fenced > seen.1 {
            self.fenced
                .get_or_create(&TypeLabels {
                    lock_type: "background",
                })
                .inc_by(stats.fenced - seen.1);
            seen.1 = stats.fenced;
        }
    }

    /// Counts the entries of the dead-letter sink into `zkguard_deadletters`. A sink that cannot
    /// be read within [`DEADLETTER_COUNT_TIMEOUT`] leaves the last count (and is logged).
    pub async fn count_deadletters(&self, sink: &dyn DeadLetterSink) {
        match tokio::time::timeout(DEADLETTER_COUNT_TIMEOUT, sink.list()).await {
            Ok(Ok(letters)) => {
                self.deadletters.set(letters.len() as i64);
            }
            Ok(Err(e)) => {
                tracing::warn!(sink = %sink.describe(), error = %e, "cannot count the dead letters for /metrics; zkguard_deadletters keeps its last count")
            }
            Err(_) => {
                tracing::warn!(sink = %sink.describe(), "the dead-letter sink did not answer within {DEADLETTER_COUNT_TIMEOUT:?}; zkguard_deadletters keeps its last count")
            }
        }
    }

    /// The metrics in the OpenMetrics text format, with the Kafka journal's `partitions` (none
    /// with the file journal).
    pub fn encode(&self, partitions: &[super::journal::kafka::PartitionStatus]) -> String {
        use prometheus_client::encoding::text;
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = text::encode_registry(&mut out, &self.registry);
        super::partition_metrics::render(&mut out, partitions);
        let _ = text::encode_registry(&mut out, &self.process);
        let _ = text::encode_eof(&mut out);
        out
    }
}

/// How long a scrape waits for the dead-letter sink's count.
pub const DEADLETTER_COUNT_TIMEOUT: Duration = Duration::from_secs(2);

/// The metrics of Prometheus' process collector (`process_cpu_seconds_total`,
/// `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`,
/// `process_max_fds`, `process_start_time_seconds`, `process_threads`), read from `/proc/self`
/// and `getrusage`/`getrlimit` at each scrape. A value that cannot be read is left out.
#[derive(Debug)]
struct ProcessCollector;

/// Clock ticks per second of `/proc/<pid>/stat` times: the kernel's `USER_HZ`, 100 on the
/// architectures zkguard runs on (Prometheus' own procfs reader assumes the same).
const USER_HZ: f64 = 100.0;

/// What the process collector reads.
#[derive(Debug, Default, PartialEq)]
pub struct ProcessStats {
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: Option<f64>,
    /// Resident memory, in bytes.
    pub resident_bytes: Option<i64>,
    /// Virtual memory, in bytes.
    pub virtual_bytes: Option<i64>,
    /// Threads of the process.
    pub threads: Option<i64>,
    /// Open file descriptors.
    pub open_fds: Option<i64>,
    /// The soft limit of open file descriptors.
    pub max_fds: Option<i64>,
    /// Start of the process, in seconds since the Unix epoch.
    pub start_time_seconds: Option<f64>,
}

impl ProcessStats {
    /// The current process's figures.
    pub fn read() -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let kib = |field: &str| status_field(&status, field).map(|kb| kb * 1024);
        Self {
            cpu_seconds: nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
                .ok()
                .map(|u| {
                    let s =
                        |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
                    s(u.user_time()) + s(u.system_time())
                }),
            resident_bytes: kib("VmRSS:"),
            virtual_bytes: kib("VmSize:"),
            threads: status_field(&status, "Threads:"),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|d| d.count() as i64),
            max_fds: nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .ok()
                .map(|(soft, _)| i64::try_from(soft).unwrap_or(i64::MAX)),
            start_time_seconds: start_time_seconds(),
        }
    }
}

/// The number after `field` in `/proc/self/status` text (`VmRSS:   1234 kB` gives 1234).
fn status_field(status: &str, field: &str) -> Option<i64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// The process's start: the boot time (`btime` of `/proc/stat`) plus the `starttime` of
/// `/proc/self/stat` (clock ticks after boot).
fn start_time_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: fields after its
    // closing parenthesis start with field 3 (state); starttime is field 22.
    let after = &stat[stat.rfind(')')? + 1..];
    let ticks: f64 = after.split_whitespace().nth(22 - 3)?.parse().ok()?;
    let boot: f64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(boot + ticks / USER_HZ)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let p = ProcessStats::read();
        if let Some(v) = p.cpu_seconds {
            let c = ConstCounter::new(v);
            c.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                c.metric_type(),
            )?)?;
        }
        let gauges: [(&str, &str, Option<f64>); 6] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                p.resident_bytes.map(|v| v as f64),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                p.virtual_bytes.map(|v| v as f64),
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                p.open_fds.map(|v| v as f64),
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                p.max_fds.map(|v| v as f64),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                p.start_time_seconds,
            ),
            (
                "process_threads",
                "Number of OS threads in the process",
                p.threads.map(|v| v as f64),
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let g = ConstGauge::new(v);
                g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
            }
        }
        Ok(())
    }
}
