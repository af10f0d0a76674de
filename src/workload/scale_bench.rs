//! `zkguard bench --scale`: how zkguard's costs grow as the work grows 10x and 100x.
//!
//! Two dimensions, each measured at every level of the plan:
//!
//! - **monitors**: a background bulk job through the library over N distinct monitors never
//!   used before (one [`ZkSession`], one [`ZkLockService`], the lock root a new path of its own
//!   per level), acquiring background locks in waves of [`WAVE`] concurrent acquisitions
//!   (`join_all`, so that their fast paths go together in multis, see `src/zk/batch.rs`), each
//!   wave released at once with [`LockService::release_all`]. Figures per level: operations
//!   (one acquisition and its release) per second; ZooKeeper requests per operation (the growth
//!   of the server's `zk_packets_received` over the job, less the `mntr` reading itself);
//!   ZooKeeper server CPU ms per operation (`/proc/PID/stat` of its process); this process's
//!   CPU ms per operation (`getrusage`); this process's resident memory growth over the job
//!   (`VmRSS` of `/proc/self/status`); and the znodes left behind (`zk_znode_count` of `mntr`
//!   after the job less before it): the empty monitor containers, which ZooKeeper's container
//!   reaper removes later (every `znode.container.checkIntervalMs`, 60 s by default, at most
//!   `znode.container.maxPerMinute`, 10,000 by default). The reaper may remove containers of
//!   earlier levels while a level runs, which lowers that figure; the children of the level's
//!   own lock root right after the job are therefore counted too.
//! - **HTTP clients**: for each level C, a fresh `zkguard serve` child (the configured
//!   `server.max.concurrent` and `server.max.connections`, 256 and 1024 by default: not raised
//!   for the benchmark, so that the limit a level meets shows) against the same ZooKeeper and
//!   Elasticsearch; C concurrent clients (one HTTP client, keep-alive connections) each writing
//!   distinct documents in the foreground, `PUT /v1/indices/{index}/docs/{id}`, a fixed total
//!   of [`ScalePlan::writes_at`] writes per level. Figures per level: latency p50 and p99 of
//!   the writes that succeeded, writes per second, ZooKeeper requests and CPU ms per write, the
//!   service's CPU ms per write, the service's resident memory and open file descriptors after
//!   the level (its idle keep-alive connections still open), and the writes refused, by status
//!   and error code (`503 overloaded` is `server.max.concurrent`, `503 too_many_connections`
//!   `server.max.connections`, `503 request_timeout` `server.request.timeout`). Clients do not
//!   retry a refused write: a refusal is counted, not hidden.
//!
//! Before the levels, unmeasured bulk jobs of [`ScalePlan::warmup`] monitors
//! ([`WARMUP_MONITORS`] by default) run until
//! ZooKeeper's JIT compilers are done (as the other benchmarks warm up; twice without the
//! server's process id), so that the first level is not measured on a cold server.
//!
//! The benchmark runs on a single-threaded Tokio runtime on a thread of its own, as the other
//! benchmarks do: the lock service's I/O tasks, the HTTP clients and the measurement share one
//! thread.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zkguard::config::Settings;
use zkguard::{LockRequest, LockService, LockType, ZkLockService, ZkSession};

use super::measure::{cpu_ms_per, cpu_time, first_zk_host, process_cpu_time};
use super::service_bench::{
    jit_cpu_time, latencies, mapped_index, start_served_with, MAX_WARMUP_RUNS,
};

/// The default levels of `--scale-monitors`.
pub const DEFAULT_MONITORS: [u32; 3] = [1000, 10_000, 100_000];
/// The default levels of `--scale-clients`.
pub const DEFAULT_CLIENTS: [u32; 3] = [10, 100, 1000];
/// The default total of writes per client level (`--scale-writes`).
pub const DEFAULT_WRITES: u32 = 2000;
/// Concurrent acquisitions per wave of the monitors' bulk job.
pub const WAVE: u32 = 500;
/// Monitors of each unmeasured warm-up job, by default.
pub const WARMUP_MONITORS: u32 = 5000;

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalePlan {
    /// Levels of the monitors dimension: distinct monitors of each bulk job.
    pub monitors: Vec<u32>,
    /// Levels of the clients dimension: concurrent HTTP clients.
    pub clients: Vec<u32>,
    /// Writes per client level (at least the level's clients, see [`ScalePlan::writes_at`]).
    pub writes: u32,
    /// Monitors of each unmeasured warm-up job ([`WARMUP_MONITORS`] by default; 0: none).
    pub warmup: u32,
    /// The ZooKeeper server's process id, when known: its CPU time is measured and the warm-up
    /// lasts until its JIT compilers are done.
    pub zk_pid: Option<u32>,
}

impl ScalePlan {
    /// Writes of the level of `clients` clients: [`ScalePlan::writes`], at least one per client.
    pub fn writes_at(&self, clients: u32) -> u32 {
        self.writes.max(clients)
    }
}

/// The figures of one level of the monitors dimension.
#[derive(Debug, Clone, Default)]
pub struct MonitorLevel {
    /// Distinct monitors, one lock cycle each.
    pub monitors: u32,
    /// From the first acquisition until the last release was answered.
    pub elapsed: Duration,
    /// ZooKeeper requests per operation, when `mntr` answered.
    pub zk_requests_per_op: Option<f64>,
    /// ZooKeeper server CPU ms per operation, with its process id.
    pub zk_cpu_ms_per_op: Option<f64>,
    /// This process's CPU ms per operation.
    pub client_cpu_ms_per_op: f64,
    /// Growth of this process's resident memory over the job, in KiB (Linux).
    pub rss_growth_kb: Option<i64>,
    /// `zk_znode_count` after the job less before it, when `mntr` answered.
    pub znodes_left: Option<i64>,
    /// Children of the level's lock root right after the job (its monitor containers).
    pub containers_left: Option<i64>,
}

impl MonitorLevel {
    /// Operations per second.
    pub fn ops_per_sec(&self) -> f64 {
        f64::from(self.monitors) / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// The figures of one level of the clients dimension.
#[derive(Debug, Clone, Default)]
pub struct ClientLevel {
    /// Concurrent clients.
    pub clients: u32,
    /// Writes sent.
    pub writes: u32,
    /// Writes that succeeded.
    pub ok: u32,
    /// From the first write sent until the last answer.
    pub elapsed: Duration,
    /// Latency of the writes that succeeded, median.
    pub p50: Duration,
    /// Latency of the writes that succeeded, 99th percentile.
    pub p99: Duration,
    /// ZooKeeper requests per successful write, when `mntr` answered.
    pub zk_requests_per_write: Option<f64>,
    /// ZooKeeper server CPU ms per successful write, with its process id.
    pub zk_cpu_ms_per_write: Option<f64>,
    /// The service's CPU ms per successful write.
    pub service_cpu_ms_per_write: Option<f64>,
    /// The service's resident memory after the level, in KiB.
    pub service_rss_kb: Option<u64>,
    /// The service's open file descriptors after the level.
    pub service_fds: Option<u64>,
    /// Writes refused or failed, by `status error_code` (`503 overloaded`), or `connection`
    /// and what became of it (`connection reset`).
    pub failures: BTreeMap<String, u32>,
    /// Idle connections the service closed to make room at `server.max.connections`
    /// (`zkguard_http_connections_evicted` of its `/metrics`).
    pub connections_evicted: Option<u64>,
    /// Connections the service refused at `server.max.connections`, every one being busy.
    pub connections_refused: Option<u64>,
}

impl ClientLevel {
    /// Successful writes per second.
    pub fn writes_per_sec(&self) -> f64 {
        f64::from(self.ok) / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Writes that did not succeed.
    pub fn failed(&self) -> u32 {
        self.failures.values().sum()
    }

    /// The configuration keys whose limits refused writes, by what the service answered, and
    /// `server.max.connections` when the service closed or refused connections at its limit.
    pub fn limits(&self) -> Vec<&'static str> {
        let at_connections =
            self.connections_evicted.unwrap_or(0) + self.connections_refused.unwrap_or(0) > 0;
        let mut out: Vec<&'static str> = self
            .failures
            .keys()
            .filter_map(|k| limit_of(k))
            .chain(at_connections.then_some("server.max.connections"))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// The configuration key behind a refusal (`503 overloaded` and the like).
pub fn limit_of(failure: &str) -> Option<&'static str> {
    let code = failure.split_once(' ').map_or(failure, |(_, c)| c);
    match code {
        "overloaded" => Some("server.max.concurrent"),
        "too_many_connections" => Some("server.max.connections"),
        "request_timeout" => Some("server.request.timeout"),
        "queue_full" => Some("server.queue.max"),
        _ => None,
    }
}

/// The report.
#[derive(Debug, Clone)]
pub struct ScaleReport {
    /// The plan.
    pub plan: ScalePlan,
    /// One per level of [`ScalePlan::monitors`], in its order.
    pub monitors: Vec<MonitorLevel>,
    /// One per level of [`ScalePlan::clients`], in its order.
    pub clients: Vec<ClientLevel>,
    /// Unmeasured warm-up jobs.
    pub warmup_runs: u32,
    /// `server.max.concurrent` of the services started.
    pub max_concurrent: usize,
    /// `server.max.connections` of the services started.
    pub max_connections: usize,
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

fn ms(d: Duration) -> f64 {
    round2(d.as_secs_f64() * 1000.0)
}

fn mb(kb: f64) -> f64 {
    round2(kb / 1024.0)
}

fn build() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// `value / first`, when both are known and the first is not zero.
fn growth(first: Option<f64>, value: Option<f64>) -> Option<f64> {
    match (first, value) {
        (Some(f), Some(v)) if f.abs() > 1e-12 => Some(round2(v / f)),
        _ => None,
    }
}

/// A figure of every level of one dimension: its JSON name, its label, and its values.
struct Row {
    key: &'static str,
    label: &'static str,
    values: Vec<Option<f64>>,
    /// Decimals in the table.
    decimals: usize,
}

impl ScaleReport {
    fn monitor_rows(&self) -> Vec<Row> {
        let m = &self.monitors;
        let col = |f: &dyn Fn(&MonitorLevel) -> Option<f64>| m.iter().map(f).collect::<Vec<_>>();
        vec![
            Row {
                key: "seconds",
                label: "job time, s",
                values: col(&|l| Some(round2(l.elapsed.as_secs_f64()))),
                decimals: 2,
            },
            Row {
                key: "ops_per_sec",
                label: "operations per second",
                values: col(&|l| Some(round2(l.ops_per_sec()))),
                decimals: 0,
            },
            Row {
                key: "zk_requests_per_op",
                label: "ZooKeeper requests per op",
                values: col(&|l| l.zk_requests_per_op.map(round4)),
                decimals: 3,
            },
            Row {
                key: "zk_cpu_ms_per_op",
                label: "ZooKeeper CPU ms per op",
                values: col(&|l| l.zk_cpu_ms_per_op.map(round4)),
                decimals: 4,
            },
            Row {
                key: "client_cpu_ms_per_op",
                label: "client CPU ms per op",
                values: col(&|l| Some(round4(l.client_cpu_ms_per_op))),
                decimals: 4,
            },
            Row {
                key: "rss_growth_mb",
                label: "client RSS growth, MB",
                values: col(&|l| l.rss_growth_kb.map(|k| mb(k as f64))),
                decimals: 1,
            },
            Row {
                key: "znodes_left",
                label: "znodes left (zk_znode_count)",
                values: col(&|l| l.znodes_left.map(|n| n as f64)),
                decimals: 0,
            },
            Row {
                key: "containers_left",
                label: "monitor containers left",
                values: col(&|l| l.containers_left.map(|n| n as f64)),
                decimals: 0,
            },
        ]
    }

    fn client_rows(&self) -> Vec<Row> {
        let c = &self.clients;
        let col = |f: &dyn Fn(&ClientLevel) -> Option<f64>| c.iter().map(f).collect::<Vec<_>>();
        vec![
            Row {
                key: "writes",
                label: "writes sent",
                values: col(&|l| Some(f64::from(l.writes))),
                decimals: 0,
            },
            Row {
                key: "ok",
                label: "writes that succeeded",
                values: col(&|l| Some(f64::from(l.ok))),
                decimals: 0,
            },
            Row {
                key: "failed",
                label: "writes refused or failed",
                values: col(&|l| Some(f64::from(l.failed()))),
                decimals: 0,
            },
            Row {
                key: "p50_ms",
                label: "latency p50, ms",
                values: col(&|l| (l.ok > 0).then(|| ms(l.p50))),
                decimals: 2,
            },
            Row {
                key: "p99_ms",
                label: "latency p99, ms",
                values: col(&|l| (l.ok > 0).then(|| ms(l.p99))),
                decimals: 2,
            },
            Row {
                key: "writes_per_sec",
                label: "writes per second",
                values: col(&|l| Some(round2(l.writes_per_sec()))),
                decimals: 0,
            },
            Row {
                key: "zk_requests_per_write",
                label: "ZooKeeper requests per write",
                values: col(&|l| l.zk_requests_per_write.map(round4)),
                decimals: 3,
            },
            Row {
                key: "zk_cpu_ms_per_write",
                label: "ZooKeeper CPU ms per write",
                values: col(&|l| l.zk_cpu_ms_per_write.map(round4)),
                decimals: 4,
            },
            Row {
                key: "service_cpu_ms_per_write",
                label: "service CPU ms per write",
                values: col(&|l| l.service_cpu_ms_per_write.map(round4)),
                decimals: 4,
            },
            Row {
                key: "service_rss_mb",
                label: "service RSS after, MB",
                values: col(&|l| l.service_rss_kb.map(|k| mb(k as f64))),
                decimals: 1,
            },
            Row {
                key: "connections_evicted",
                label: "idle connections closed at limit",
                values: col(&|l| l.connections_evicted.map(|n| n as f64)),
                decimals: 0,
            },
            Row {
                key: "connections_refused",
                label: "connections refused at limit",
                values: col(&|l| l.connections_refused.map(|n| n as f64)),
                decimals: 0,
            },
            Row {
                key: "service_fds",
                label: "service open fds after",
                values: col(&|l| l.service_fds.map(|n| n as f64)),
                decimals: 0,
            },
        ]
    }

    /// One flat JSON object: `monitors_n{N}_{figure}` and `clients_n{C}_{figure}` for every
    /// level and figure (`null` when not measured), `..._growth` for every figure of the levels
    /// after the first (the value over the first level's), `clients_n{C}_failed_{status}_{code}`
    /// per kind of refusal and `clients_n{C}_limits` (the configuration keys that refused
    /// writes, comma-separated, empty when none).
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "monitor_levels": self.plan.monitors,
            "client_levels": self.plan.clients,
            "writes": self.plan.writes,
            "wave": WAVE,
            "warmup_runs": self.warmup_runs,
            "warmup_monitors": self.plan.warmup,
            "server_max_concurrent": self.max_concurrent,
            "server_max_connections": self.max_connections,
            "build": build(),
        });
        let Value::Object(all) = &mut v else {
            unreachable!("a JSON object")
        };
        let dims: [(&str, Vec<u32>, Vec<Row>); 2] = [
            (
                "monitors",
                self.monitors.iter().map(|l| l.monitors).collect(),
                self.monitor_rows(),
            ),
            (
                "clients",
                self.clients.iter().map(|l| l.clients).collect(),
                self.client_rows(),
            ),
        ];
        for (dim, levels, rows) in dims {
            for row in rows {
                for (i, (n, value)) in levels.iter().zip(&row.values).enumerate() {
                    all.insert(format!("{dim}_n{n}_{}", row.key), json!(value));
                    if i > 0 {
                        all.insert(
                            format!("{dim}_n{n}_{}_growth", row.key),
                            json!(growth(row.values[0], *value)),
                        );
                    }
                }
            }
        }
        for l in &self.clients {
            for (kind, count) in &l.failures {
                let kind = kind.replace(' ', "_");
                all.insert(
                    format!("clients_n{}_failed_{kind}", l.clients),
                    json!(count),
                );
            }
            all.insert(
                format!("clients_n{}_limits", l.clients),
                json!(l.limits().join(",")),
            );
        }
        v
    }

    /// Tables for people: one per dimension, each figure's value per level and its growth from
    /// the first level.
    pub fn table(&self) -> String {
        let mut out = format!(
            "zkguard bench --scale, {} build; after {} unmeasured warm-up job(s) of {} monitors\n\n",
            build(),
            self.warmup_runs,
            self.plan.warmup
        );
        if !self.monitors.is_empty() {
            out.push_str(&format!(
                "monitors: one session's background bulk job over N new monitors, waves of {WAVE} \
                 concurrent acquisitions, each wave released in one release_all\n"
            ));
            let levels: Vec<String> = self
                .monitors
                .iter()
                .map(|l| l.monitors.to_string())
                .collect();
            out.push_str(&grid("N monitors", &levels, &self.monitor_rows()));
        }
        if !self.clients.is_empty() {
            out.push_str(&format!(
                "\nHTTP clients: C concurrent clients of one zkguard serve (server.max.concurrent {}, \
                 server.max.connections {}), foreground writes of distinct documents, {} in all \
                 (at least one per client), refused writes not retried\n",
                self.max_concurrent, self.max_connections, self.plan.writes
            ));
            let levels: Vec<String> = self.clients.iter().map(|l| l.clients.to_string()).collect();
            out.push_str(&grid("C clients", &levels, &self.client_rows()));
            for l in self.clients.iter().filter(|l| l.failed() > 0) {
                let kinds: Vec<String> = l
                    .failures
                    .iter()
                    .map(|(k, n)| match limit_of(k) {
                        Some(key) => format!("{n} x {k} ({key})"),
                        None => format!("{n} x {k}"),
                    })
                    .collect();
                out.push_str(&format!(
                    "  C={}: {} of {} writes refused or failed: {}\n",
                    l.clients,
                    l.failed(),
                    l.writes,
                    kinds.join(", ")
                ));
            }
        }
        out
    }
}

/// A table: one row per figure, one column per level (its value, and after the first its
/// growth from the first).
fn grid(what: &str, levels: &[String], rows: &[Row]) -> String {
    let label_width = rows
        .iter()
        .map(|r| r.label.len())
        .max()
        .unwrap_or(0)
        .max(what.len());
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            row.values
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let value =
                        v.map_or_else(|| "n/a".to_string(), |x| format!("{:.*}", row.decimals, x));
                    match growth(row.values[0], *v) {
                        Some(g) if i > 0 => format!("{value} ({g:.2}x)"),
                        None if i > 0 => format!("{value} (-)"),
                        _ => value,
                    }
                })
                .collect()
        })
        .collect();
    let width = cells
        .iter()
        .flatten()
        .chain(levels)
        .map(String::len)
        .max()
        .unwrap_or(0);
    let mut out = format!("{what:<label_width$}");
    for level in levels {
        out.push_str(&format!("  {level:>width$}"));
    }
    out.push('\n');
    out.push_str(&"-".repeat(label_width + levels.len() * (width + 2)));
    out.push('\n');
    for (row, cells) in rows.iter().zip(&cells) {
        out.push_str(&format!("{:<label_width$}", row.label));
        for cell in cells {
            out.push_str(&format!("  {cell:>width$}"));
        }
        out.push('\n');
    }
    out
}

/// Runs the benchmark against `settings`' ZooKeeper and Elasticsearch, on a single-threaded
/// runtime on a thread of its own.
///
/// # Errors
/// A server is unreachable, a lock could not be taken, or `zkguard serve` did not start (the
/// message says which and why).
pub async fn run(settings: Settings, plan: ScalePlan) -> Result<ScaleReport, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("zkguard-bench-scale".into())
        .spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start the benchmark runtime: {e}"))
                .and_then(|rt| rt.block_on(measure(settings, plan)));
            let _ = tx.send(result);
        })
        .map_err(|e| format!("cannot start the benchmark thread: {e}"))?;
    rx.await
        .map_err(|_| "the benchmark thread ended without a result".to_string())?
}

async fn measure(mut settings: Settings, plan: ScalePlan) -> Result<ScaleReport, String> {
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let root = format!("/zkguard-bench-scale/{tag}");
    settings.zookeeper.lock_root = root.clone();
    let zk = Zk {
        host: first_zk_host(&settings.zookeeper.servers),
        pid: plan.zk_pid,
    };
    let mut warmup_runs = 0;
    for run in (1..=MAX_WARMUP_RUNS).filter(|_| plan.warmup > 0) {
        warmup_runs = run;
        let before = plan.zk_pid.and_then(jit_cpu_time);
        let started = Instant::now();
        let job = Job::connect(&settings, &format!("{root}/warm-{run}")).await?;
        job.run(plan.warmup).await?;
        job.close();
        let compiling = plan
            .zk_pid
            .and_then(jit_cpu_time)
            .zip(before)
            .map(|(after, before)| after.saturating_sub(before));
        tracing::info!(run, compiling = ?compiling, took = ?started.elapsed(), "warm-up job");
        match compiling {
            Some(c) if c.as_secs_f64() < 0.1 * started.elapsed().as_secs_f64() => break,
            None if run >= 2 => break,
            _ => {}
        }
    }
    let mut monitors = Vec::new();
    for &n in &plan.monitors {
        tracing::info!(monitors = n, "monitors level");
        monitors.push(monitor_level(&settings, &zk, &format!("{root}/m{n}"), n).await?);
    }
    let mut clients = Vec::new();
    for &c in &plan.clients {
        tracing::info!(clients = c, "clients level");
        let index = format!("bench-scale-{tag}-c{c}");
        clients.push(client_level(&settings, &zk, &index, c, plan.writes_at(c)).await?);
    }
    Ok(ScaleReport {
        max_concurrent: settings.server.max_concurrent,
        max_connections: settings.server.max_connections,
        plan,
        monitors,
        clients,
        warmup_runs,
    })
}

/// The ZooKeeper server measured: its first host (`mntr`) and its process id.
struct Zk {
    host: String,
    pid: Option<u32>,
}

/// One `mntr` reading: `zk_packets_received` and `zk_znode_count`.
#[derive(Clone, Copy)]
struct Mntr {
    packets: Option<u64>,
    znodes: Option<i64>,
}

impl Zk {
    async fn mntr(&self) -> Mntr {
        let addr = self.host.clone();
        let answer = tokio::task::spawn_blocking(move || {
            zkguard::testkit::four_letter_word(addr.as_str(), "mntr", Duration::from_secs(5))
        })
        .await;
        match answer {
            Ok(Ok(text)) => {
                let m = zkguard::testkit::parse_mntr(&text);
                Mntr {
                    packets: m.get("zk_packets_received").and_then(|v| v.parse().ok()),
                    znodes: m.get("zk_znode_count").and_then(|v| v.parse().ok()),
                }
            }
            other => {
                tracing::warn!(at = %self.host, result = ?other.map(|r| r.err()), "cannot read mntr (add it to 4lw.commands.whitelist); ZooKeeper requests and znodes not counted");
                Mntr {
                    packets: None,
                    znodes: None,
                }
            }
        }
    }

    fn cpu(&self) -> Option<Duration> {
        self.pid.and_then(process_cpu_time)
    }
}

/// Requests per operation between two `mntr` readings, less the second reading itself.
fn requests_per(before: Mntr, after: Mntr, ops: u32) -> Option<f64> {
    let grew = after
        .packets?
        .checked_sub(before.packets?)?
        .saturating_sub(1);
    (ops > 0).then(|| grew as f64 / f64::from(ops))
}

fn server_cpu_per(before: Option<Duration>, after: Option<Duration>, ops: u32) -> Option<f64> {
    let (before, after) = (before?, after?);
    (ops > 0).then(|| cpu_ms_per(before, after, ops))
}

/// A `/proc/PID/status` field in KiB (`VmRSS`, `VmHWM`): `None` off Linux.
pub(super) fn status_kb(pid: Option<u32>, field: &str) -> Option<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_string(),
    };
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Open file descriptors of process `pid` (`/proc/PID/fd`).
fn open_fds(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// A bulk job's session and lock service, on a lock root of its own.
struct Job {
    session: ZkSession,
    locks: ZkLockService,
    root: String,
    servers: String,
}

impl Job {
    async fn connect(settings: &Settings, root: &str) -> Result<Self, String> {
        let mut zk = settings.zookeeper.clone();
        zk.lock_root = root.to_string();
        let session = ZkSession::connect(&zk)
            .await
            .map_err(|e| format!("ZooKeeper at {}: {e}", zk.servers))?;
        Ok(Self {
            locks: ZkLockService::new(session.clone()),
            session,
            root: root.to_string(),
            servers: zk.servers,
        })
    }

    /// `n` monitors never used before, one background lock cycle each, in waves of [`WAVE`]
    /// concurrent acquisitions, each wave released in one [`LockService::release_all`]; returns
    /// once every release is answered.
    async fn run(&self, n: u32) -> Result<(), String> {
        let mut releases = Vec::new();
        let mut next = 0;
        while next < n {
            let end = next.saturating_add(WAVE).min(n);
            let acquisitions = (next..end).map(|i| {
                self.locks.acquire(
                    LockRequest::new(format!("m{i}"), "bench --scale")
                        .with_type(LockType::Background),
                )
            });
            let mut guards = Vec::with_capacity((end - next) as usize);
            for result in futures::future::join_all(acquisitions).await {
                guards
                    .push(result.map_err(|e| format!("a background lock of {}: {e}", self.root))?);
            }
            releases.push(self.locks.release_all(guards).await);
            next = end;
        }
        for release in releases {
            release
                .await
                .map_err(|e| format!("a release under {}: {e}", self.root))?;
        }
        Ok(())
    }

    /// Makes the job's lock root exist before the measured job, as a deployment's does: one
    /// lock cycle of a monitor of its own (its empty container stays, one child of the root).
    /// Without it, the job's first multis would find no root (about 1,400 more requests a job
    /// here, the same at every level).
    async fn prime(&self) -> Result<(), String> {
        let guard = self
            .locks
            .acquire(LockRequest::new("prime", "bench --scale").with_type(LockType::Background))
            .await
            .map_err(|e| format!("a background lock of {}: {e}", self.root))?;
        guard
            .unlock()
            .await
            .map_err(|e| format!("a release under {}: {e}", self.root))
    }

    /// Children of the job's lock root (its monitors, held or empty), read with a connection of
    /// its own: `None` when it cannot be read.
    async fn children(&self) -> Option<i64> {
        let client = zookeeper_client::Client::connector()
            .with_session_timeout(Duration::from_secs(10))
            .connect(&self.servers)
            .await
            .ok()?;
        let stat = client.check_stat(&self.root).await.ok()??;
        // Less the monitor of [`Job::prime`].
        Some(i64::from(stat.num_children) - 1)
    }

    fn close(self) {
        self.session.close();
    }
}

async fn monitor_level(
    settings: &Settings,
    zk: &Zk,
    root: &str,
    n: u32,
) -> Result<MonitorLevel, String> {
    let job = Job::connect(settings, root).await?;
    job.prime().await?;
    let rss_before = status_kb(None, "VmRSS");
    let mntr_before = zk.mntr().await;
    let cpu_before = cpu_time();
    let zk_cpu_before = zk.cpu();
    let started = Instant::now();
    job.run(n).await?;
    let elapsed = started.elapsed();
    let client_cpu_ms_per_op = cpu_ms_per(cpu_before, cpu_time(), n);
    let zk_cpu_ms_per_op = server_cpu_per(zk_cpu_before, zk.cpu(), n);
    let rss_after = status_kb(None, "VmRSS");
    let mntr_after = zk.mntr().await;
    let containers_left = job.children().await;
    job.close();
    Ok(MonitorLevel {
        monitors: n,
        elapsed,
        zk_requests_per_op: requests_per(mntr_before, mntr_after, n),
        zk_cpu_ms_per_op,
        client_cpu_ms_per_op,
        rss_growth_kb: rss_before.zip(rss_after).map(|(b, a)| a as i64 - b as i64),
        znodes_left: mntr_before
            .znodes
            .zip(mntr_after.znodes)
            .map(|(b, a)| a - b),
        containers_left,
    })
}

/// What one write came to: its latency when it succeeded, else what refused it.
type WriteOutcome = Result<Duration, String>;

/// `503 overloaded` from the status and the error code of a JSON error body.
fn failure_kind(status: reqwest::StatusCode, body: &[u8]) -> String {
    let code = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string));
    match code {
        Some(code) => format!("{} {code}", status.as_u16()),
        None => status.as_u16().to_string(),
    }
}

/// The sum of the samples of counter `name` (`name_total`, any labels) in a Prometheus text
/// page: `None` when the page has none.
fn metric_sum(text: &str, name: &str) -> Option<u64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let rest = rest.strip_prefix("_total").unwrap_or(rest);
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        if let Some(v) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *found.get_or_insert(0) += v as u64;
        }
    }
    found
}

/// What became of a write that got no answer: `connection refused`, `connection closed` (the
/// service closed the connection, e.g. at `server.max.connections` or an idle one it dropped
/// while the request was on its way), `connection reset`, `connection timeout` or
/// `connection error`.
fn transport_failure(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    tracing::debug!(error = %text, "a write got no answer");
    let text = text.to_lowercase();
    let kind = if text.contains("refused") {
        "refused"
    } else if text.contains("reset") {
        "reset"
    } else if text.contains("closed") || text.contains("incomplete") || text.contains("eof") {
        "closed"
    } else if e.is_timeout() {
        "timeout"
    } else {
        "error"
    };
    format!("connection {kind}")
}

async fn client_level(
    settings: &Settings,
    zk: &Zk,
    index: &str,
    clients: u32,
    writes: u32,
) -> Result<ClientLevel, String> {
    mapped_index(settings, index).await?;
    let served = start_served_with(settings, None, false).await?;
    let base = served.base.clone();
    let pid = served.pid();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients as usize)
        .build()
        .map_err(|e| e.to_string())?;
    // The service's ZooKeeper session and Elasticsearch connection are open before the level.
    let warm = http
        .put(format!("{base}/v1/indices/{index}/docs/warm"))
        .header("content-type", "application/json")
        .body(json!({"warm": true}).to_string())
        .send()
        .await
        .map_err(|e| format!("zkguard serve: {e}"))?;
    if !warm.status().is_success() {
        return Err(format!(
            "zkguard serve answered {} to a write",
            warm.status()
        ));
    }

    let mntr_before = zk.mntr().await;
    let zk_cpu_before = zk.cpu();
    let svc_cpu_before = pid.and_then(process_cpu_time);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(clients as usize);
    for c in 0..clients {
        let share = writes / clients + u32::from(c < writes % clients);
        let http = http.clone();
        let url = format!("{base}/v1/indices/{index}/docs/c{c}-");
        tasks.push(tokio::spawn(async move {
            let mut out: Vec<WriteOutcome> = Vec::with_capacity(share as usize);
            for i in 0..share {
                let t = Instant::now();
                let sent = http
                    .put(format!("{url}{i}"))
                    .header("content-type", "application/json")
                    .body(json!({"client": c, "n": i}).to_string())
                    .send()
                    .await;
                out.push(match sent {
                    Ok(r) => {
                        let status = r.status();
                        let body = r.bytes().await.unwrap_or_default();
                        if status.is_success() {
                            Ok(t.elapsed())
                        } else {
                            Err(failure_kind(status, &body))
                        }
                    }
                    Err(e) => Err(transport_failure(&e)),
                });
            }
            out
        }));
    }
    let mut samples = Vec::with_capacity(writes as usize);
    let mut failures = BTreeMap::new();
    for task in tasks {
        for outcome in task.await.map_err(|e| e.to_string())? {
            match outcome {
                Ok(d) => samples.push(d),
                Err(kind) => *failures.entry(kind).or_insert(0) += 1,
            }
        }
    }
    let elapsed = started.elapsed();
    let ok = samples.len() as u32;
    let service_cpu_ms_per_write =
        server_cpu_per(svc_cpu_before, pid.and_then(process_cpu_time), ok);
    let zk_cpu_ms_per_write = server_cpu_per(zk_cpu_before, zk.cpu(), ok);
    // The idle keep-alive connections are still open.
    let service_rss_kb = status_kb(pid, "VmRSS");
    let service_fds = pid.and_then(open_fds);
    let mntr_after = zk.mntr().await;
    let metrics = match http.get(format!("{base}/metrics")).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    drop(http);
    drop(served);
    let (p50, p99) = latencies(samples);
    Ok(ClientLevel {
        clients,
        writes,
        ok,
        elapsed,
        p50,
        p99,
        zk_requests_per_write: requests_per(mntr_before, mntr_after, ok),
        zk_cpu_ms_per_write,
        service_cpu_ms_per_write,
        service_rss_kb,
        service_fds,
        failures,
        connections_evicted: metric_sum(&metrics, "zkguard_http_connections_evicted"),
        connections_refused: metric_sum(&metrics, "zkguard_http_connections_refused"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> ScaleReport {
        let level = |n: u32, secs: u64, req: f64| MonitorLevel {
            monitors: n,
            elapsed: Duration::from_secs(secs),
            zk_requests_per_op: Some(req),
            zk_cpu_ms_per_op: Some(0.1),
            client_cpu_ms_per_op: 0.05,
            rss_growth_kb: Some(1024),
            znodes_left: Some(i64::from(n)),
            containers_left: None,
        };
        let mut refused = BTreeMap::new();
        refused.insert("503 overloaded".to_string(), 7);
        ScaleReport {
            plan: ScalePlan {
                monitors: vec![100, 1000],
                clients: vec![2, 20],
                writes: 40,
                warmup: 0,
                zk_pid: None,
            },
            monitors: vec![level(100, 1, 1.0), level(1000, 5, 1.5)],
            clients: vec![
                ClientLevel {
                    clients: 2,
                    writes: 40,
                    ok: 40,
                    elapsed: Duration::from_secs(1),
                    p50: Duration::from_millis(2),
                    p99: Duration::from_millis(4),
                    ..ClientLevel::default()
                },
                ClientLevel {
                    clients: 20,
                    writes: 40,
                    ok: 33,
                    elapsed: Duration::from_secs(1),
                    p50: Duration::from_millis(3),
                    p99: Duration::from_millis(9),
                    failures: refused,
                    ..ClientLevel::default()
                },
            ],
            warmup_runs: 1,
            max_concurrent: 256,
            max_connections: 1024,
        }
    }

    #[test]
    fn the_report_is_flat_with_growth_from_the_first_level() {
        let v = report().to_json();
        assert!(v.as_object().unwrap().values().all(|x| !x.is_object()));
        assert_eq!(v["monitors_n100_ops_per_sec"], 100.0);
        assert_eq!(v["monitors_n1000_ops_per_sec"], 200.0);
        assert_eq!(v["monitors_n1000_ops_per_sec_growth"], 2.0);
        assert_eq!(v["monitors_n1000_zk_requests_per_op_growth"], 1.5);
        assert_eq!(v["monitors_n100_containers_left"], Value::Null);
        assert!(v.get("monitors_n100_ops_per_sec_growth").is_none());
        assert_eq!(v["clients_n20_failed"], 7.0);
        assert_eq!(v["clients_n20_failed_503_overloaded"], 7);
        assert_eq!(v["clients_n20_limits"], "server.max.concurrent");
        assert_eq!(v["clients_n2_limits"], "");
        assert_eq!(v["clients_n20_p99_ms_growth"], 2.25);
        assert_eq!(v["clients_n2_zk_requests_per_write"], Value::Null);
    }

    #[test]
    fn the_table_shows_values_growth_and_limits() {
        let table = report().table();
        for needle in [
            "operations per second",
            "(2.00x)",
            "ZooKeeper requests per op",
            "znodes left",
            "writes refused or failed",
            "7 x 503 overloaded (server.max.concurrent)",
            "n/a",
        ] {
            assert!(table.contains(needle), "{needle} in\n{table}");
        }
    }

    #[test]
    fn refusals_name_their_limit() {
        assert_eq!(limit_of("503 overloaded"), Some("server.max.concurrent"));
        assert_eq!(
            limit_of("503 too_many_connections"),
            Some("server.max.connections")
        );
        assert_eq!(limit_of("connection"), None);
        let body = br#"{"error":"overloaded","message":"..."}"#;
        assert_eq!(
            failure_kind(reqwest::StatusCode::SERVICE_UNAVAILABLE, body),
            "503 overloaded"
        );
        assert_eq!(failure_kind(reqwest::StatusCode::BAD_GATEWAY, b"x"), "502");
    }

    #[test]
    fn counters_are_read_from_the_metrics_page() {
        let page = "# HELP zkguard_http_connections_evicted Idle ...\n\
                    zkguard_http_connections_evicted_total 3\n\
                    zkguard_http_connections_evicted_totalx 9\n\
                    zkguard_http_connections 5\n";
        assert_eq!(
            metric_sum(page, "zkguard_http_connections_evicted"),
            Some(3)
        );
        assert_eq!(metric_sum(page, "zkguard_http_connections_refused"), None);
        assert_eq!(metric_sum(page, "zkguard_http_connections"), Some(5));
    }

    #[test]
    fn memory_is_read_from_proc() {
        let rss = status_kb(None, "VmRSS").expect("VmRSS of this process");
        assert!(rss > 0);
        assert_eq!(status_kb(Some(u32::MAX), "VmRSS"), None);
        assert!(open_fds(std::process::id()).unwrap_or(0) > 0);
        assert_eq!(
            ScalePlan {
                monitors: vec![],
                clients: vec![],
                writes: 10,
                warmup: 0,
                zk_pid: None
            }
            .writes_at(50),
            50
        );
    }
}
