//! `zkguard bench --scale`: how zkguard's costs grow as the work grows 10x and 100x.
//!
//! Three dimensions, each measured at every level of the plan:
//!
//! - **monitors**: a background bulk job through the library over N distinct monitors never
//!   used before (one [`ZkSession`], one [`ZkLockService`], the lock root a new path of its own
//!   per level, made before the measured job by one lock cycle), acquiring background locks in waves of [`WAVE`] concurrent acquisitions
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
//!   the level (its idle keep-alive connections still open), the connections it closed or
//!   refused at `server.max.connections` (its `/metrics`), and the writes refused, by status
//!   and error code (`503 overloaded` is `server.max.concurrent`, `503 too_many_connections`
//!   `server.max.connections`, `503 request_timeout` `server.request.timeout`). Clients do not
//!   retry a refused write: a refusal is counted, not hidden.
//! - **instances**: the same figures with K `zkguard serve` children on the one ZooKeeper sharing
//!   [`INSTANCE_CLIENTS`] clients (client `c` writes to instance `c mod K`) and the same writes;
//!   the services' CPU, memory, descriptors and connection counters are summed.
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
pub use super::scale_report::{
    ClientLevel, MonitorLevel, ScalePlan, ScaleReport, DEFAULT_CLIENTS, DEFAULT_INSTANCES,
    DEFAULT_MONITORS, DEFAULT_WRITES, INSTANCE_CLIENTS, WARMUP_MONITORS, WAVE,
};
use super::service_bench::{
    latencies, mapped_index, start_served_with, JitWatch, MAX_WARMUP_RUNS, SERVERS_WARM,
};

/// Runs the benchmark against `settings`' ZooKeeper and Elasticsearch, on a single-threaded
/// runtime on a thread of its own.
///
/// # Errors
/// A server is unreachable, a lock could not be taken, or `zkguard serve` did not start (the
/// message says which and why).
pub async fn run(settings: Settings, plan: ScalePlan) -> Result<ScaleReport, String> {
    super::measure::on_own_thread("zkguard-bench-scale", move || measure(settings, plan)).await
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
        let jit = JitWatch::start(plan.zk_pid);
        let job = Job::connect(&settings, &format!("{root}/warm-{run}")).await?;
        job.run(plan.warmup).await?;
        job.close();
        if jit.warm(run, SERVERS_WARM, 2, "warm-up job") {
            break;
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
        clients.push(client_level(&settings, &zk, &index, c, plan.writes_at(c), 1).await?);
    }
    let mut instances = Vec::new();
    for &k in &plan.instances {
        tracing::info!(instances = k, "instances level");
        let index = format!("bench-scale-{tag}-i{k}");
        let c = INSTANCE_CLIENTS;
        instances.push(client_level(&settings, &zk, &index, c, plan.writes_at(c), k).await?);
    }
    Ok(ScaleReport {
        max_concurrent: settings.server.max_concurrent,
        max_connections: settings.server.max_connections,
        plan,
        monitors,
        clients,
        instances,
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
    let text = zkguard::es::error_chain(e);
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
    instances: u32,
) -> Result<ClientLevel, String> {
    mapped_index(settings, index).await?;
    let mut served = Vec::with_capacity(instances as usize);
    for _ in 0..instances {
        served.push(start_served_with(settings, None, false).await?);
    }
    let bases: Vec<String> = served.iter().map(|s| s.base.clone()).collect();
    let pids: Vec<Option<u32>> = served.iter().map(|s| s.pid()).collect();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients as usize)
        .build()
        .map_err(|e| e.to_string())?;
    // Each service's ZooKeeper session and Elasticsearch connection are open before the level.
    for (k, base) in bases.iter().enumerate() {
        let warm = http
            .put(format!("{base}/v1/indices/{index}/docs/warm-{k}"))
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
    }
    // Summed over the instances; `None` when one cannot be read.
    let services_cpu = || -> Option<Duration> {
        pids.iter()
            .map(|p| p.and_then(process_cpu_time))
            .sum::<Option<Duration>>()
    };

    let mntr_before = zk.mntr().await;
    let zk_cpu_before = zk.cpu();
    let svc_cpu_before = services_cpu();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(clients as usize);
    for c in 0..clients {
        let share = writes / clients + u32::from(c < writes % clients);
        let http = http.clone();
        let base = &bases[(c % instances) as usize];
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
    let service_cpu_ms_per_write = server_cpu_per(svc_cpu_before, services_cpu(), ok);
    let zk_cpu_ms_per_write = server_cpu_per(zk_cpu_before, zk.cpu(), ok);
    // The idle keep-alive connections are still open.
    let service_rss_kb = pids
        .iter()
        .map(|&p| p.and_then(|p| status_kb(Some(p), "VmRSS")))
        .sum::<Option<u64>>();
    let service_fds = pids
        .iter()
        .map(|p| p.and_then(open_fds))
        .sum::<Option<u64>>();
    let mntr_after = zk.mntr().await;
    let mut metrics = String::new();
    for base in &bases {
        if let Ok(r) = http.get(format!("{base}/metrics")).send().await {
            metrics.push_str(&r.text().await.unwrap_or_default());
            metrics.push('\n');
        }
    }
    drop(http);
    drop(served);
    let (p50, p99) = latencies(samples);
    Ok(ClientLevel {
        clients,
        instances,
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

    #[test]
    fn refusals_are_told_apart() {
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
                instances: vec![],
                writes: 10,
                warmup: 0,
                zk_pid: None
            }
            .writes_at(50),
            50
        );
    }
}
