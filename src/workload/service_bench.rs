//! `zkguard bench --service`: one write workload through three paths, side by side.
//!
//! - **library**: in-process [`GuardedWriter`] (foreground) and [`BackgroundExecutor`]
//!   (background) over one ZooKeeper session and one Elasticsearch client;
//! - **service**: a `zkguard serve` child process driven over HTTP by `clients` concurrent
//!   clients (keep-alive connections);
//! - **exec**: one `zkguard exec --monitor M -- curl ...` process per write, the command writing
//!   the document with the fencing token as its external version (what callers in other
//!   languages did before the service).
//!
//! Each path saves `saves` documents in the foreground from `clients` concurrent clients on
//! `docs` shared documents (latency per save: p50, p99), then runs the same background
//! operations on the same documents (operations per second, from the first submission until the
//! last is applied: the library awaits every outcome, the service's journal is empty and its
//! metrics count every operation applied, every exec process has exited after its write). The
//! library configures its executor as `zkguard serve` does (operations grouped by monitor,
//! [`crate::server::BACKGROUND_IN_FLIGHT`] in flight). Before the three paths, the library's
//! workload runs unmeasured until ZooKeeper's JIT compilers are done (see [`warm_up`]): the
//! servers are then equally warm for all of them; each `zkguard serve` instance then runs its
//! own workload the same way before its measured one (`ServiceRun::warm_up`). `zkguard exec`
//! runs the background operations from [`EXEC_BACKGROUND_CLIENTS_FACTOR`] times as many
//! concurrent processes, its best on a 2-core machine, since each is CPU-bound (a process and
//! a ZooKeeper session per write) rather than waiting.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zkguard::config::Settings;
use zkguard::es::{DocStore, EsStore};
use zkguard::write::background::BackgroundExecutor;
use zkguard::write::guarded::GuardedWriter;
use zkguard::write::ops::Operation;
use zkguard::LockType;

use super::measure::percentile;
use super::stages::Stages;

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct ServicePlan {
    /// Concurrent clients.
    pub clients: u32,
    /// Shared documents.
    pub docs: u32,
    /// Foreground saves per path, and `zkguard exec`'s background operations.
    pub saves: u32,
    /// Background operations of the library and the service: several times `saves`, so that
    /// their background phase lasts seconds (2,000 operations took them 0.1 s to 1 s, where the
    /// moments the first and the last operation take weigh as much as the throughput).
    pub background: u32,
    /// The ZooKeeper server's process id, when known: the warm-up then lasts until its JIT
    /// compilers are done (see [`warm_up`]).
    pub zk_pid: Option<u32>,
}

/// How many times `clients` concurrent `zkguard exec` processes run the background operations:
/// exec is bound by process starts and ZooKeeper sessions, not by waiting, and this many gave
/// it its best throughput on a 2-core machine (1x, 2x and 4x were tried).
pub const EXEC_BACKGROUND_CLIENTS_FACTOR: u32 = 4;

impl ServicePlan {
    /// Concurrent `zkguard exec` processes for the background operations, and the service's
    /// concurrent background clients.
    pub fn exec_clients(&self) -> u32 {
        self.clients * EXEC_BACKGROUND_CLIENTS_FACTOR
    }

    /// The service's background operations: `background` shared evenly among its
    /// [`Self::exec_clients`] clients.
    pub fn service_background(&self) -> u32 {
        self.background / self.exec_clients() * self.exec_clients()
    }
}

/// The figures of one path.
#[derive(Debug, Clone, Default)]
pub struct PathFigures {
    /// Foreground saves measured.
    pub saves: usize,
    /// Foreground save latency, median.
    pub p50: Duration,
    /// Foreground save latency, 99th percentile.
    pub p99: Duration,
    /// Background operations run.
    pub background: usize,
    /// Background operations per second.
    pub background_per_sec: f64,
    /// Where the background operations' time went.
    pub stages: Stages,
    /// Unmeasured runs of a service instance's own workload before its measured one
    /// (`ServiceRun::warm_up`); `None` for the other paths.
    pub warmup_runs: Option<u32>,
    /// CPU time ZooKeeper's JIT compiler threads took during a service instance's foreground
    /// phase, when its process is known: what a cold server adds to that phase's latency.
    pub fg_zk_jit: Option<Duration>,
}

impl PathFigures {
    /// The figures of the foreground latencies `samples` and of `n` background operations in
    /// `elapsed`; no warm-up of its own, no compiling measured.
    fn measured(samples: Vec<Duration>, n: u32, elapsed: Duration, stages: Stages) -> Self {
        let saves = samples.len();
        let (p50, p99) = latencies(samples);
        Self {
            saves,
            p50,
            p99,
            background: n as usize,
            background_per_sec: f64::from(n) / elapsed.as_secs_f64(),
            stages,
            warmup_runs: None,
            fg_zk_jit: None,
        }
    }

    fn to_json(&self, name: &str) -> Value {
        let mut v = json!({
            format!("{name}_fg_saves"): self.saves,
            format!("{name}_fg_p50_ms"): ms(self.p50),
            format!("{name}_fg_p99_ms"): ms(self.p99),
            format!("{name}_bg_ops"): self.background,
            format!("{name}_bg_ops_per_sec"): (self.background_per_sec * 10.0).round() / 10.0,
        });
        if let (Value::Object(all), Some(runs)) = (&mut v, self.warmup_runs) {
            all.insert(format!("{name}_warmup_runs"), runs.into());
        }
        if let (Value::Object(all), Some(jit)) = (&mut v, self.fg_zk_jit) {
            all.insert(format!("{name}_fg_zk_jit_ms"), ms(jit).into());
        }
        v
    }

    fn to_json_with_stages(&self, name: &str) -> Value {
        let mut v = self.to_json(name);
        if let (Value::Object(all), Value::Object(more)) =
            (&mut v, self.stages.to_json(name, self.background))
        {
            all.extend(more);
        }
        v
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0 * 100.0).round() / 100.0
}

/// The three paths.
#[derive(Debug, Clone)]
pub struct ServiceReport {
    /// The plan.
    pub plan: ServicePlan,
    /// In-process library.
    pub library: PathFigures,
    /// `zkguard serve` over HTTP.
    pub service: PathFigures,
    /// `zkguard serve` over HTTP with its journal on Kafka (`server.journal.backend=kafka`),
    /// when a broker was given.
    pub service_kafka: Option<PathFigures>,
    /// `zkguard exec` per write.
    pub exec: PathFigures,
    /// Unmeasured runs of the library's workload before the measured ones.
    pub warmup_runs: u32,
}

impl ServiceReport {
    /// Foreground p50 through the service over the library's.
    pub fn fg_ratio(&self) -> f64 {
        self.service.p50.as_secs_f64() / self.library.p50.as_secs_f64().max(1e-9)
    }

    /// Background throughput through the Kafka journal over the file journal's.
    pub fn kafka_bg_ratio(&self) -> Option<f64> {
        let k = self.service_kafka.as_ref()?;
        Some(k.background_per_sec / self.service.background_per_sec.max(1e-9))
    }

    /// Foreground p50 with the Kafka journal over the file journal's.
    pub fn kafka_fg_ratio(&self) -> Option<f64> {
        let k = self.service_kafka.as_ref()?;
        Some(k.p50.as_secs_f64() / self.service.p50.as_secs_f64().max(1e-9))
    }

    /// Background throughput through the service over `zkguard exec`'s.
    pub fn bg_ratio(&self) -> f64 {
        self.service.background_per_sec / self.exec.background_per_sec.max(1e-9)
    }

    /// One flat JSON object.
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "clients": self.plan.clients,
            "docs": self.plan.docs,
            "saves": self.plan.saves,
            "background_ops": self.plan.service_background(),
            "exec_background_clients": self.plan.exec_clients(),
            "warmup_runs": self.warmup_runs,
            "build": if cfg!(debug_assertions) { "debug" } else { "release" },
            "service_over_library_fg_p50": (self.fg_ratio() * 100.0).round() / 100.0,
            "service_over_exec_bg_throughput": (self.bg_ratio() * 10.0).round() / 10.0,
        });
        for (name, f) in [
            ("library", &self.library),
            ("service", &self.service),
            ("exec", &self.exec),
        ] {
            let figures = if name == "exec" {
                f.to_json(name)
            } else {
                f.to_json_with_stages(name)
            };
            if let (Value::Object(all), Value::Object(more)) = (&mut v, figures) {
                all.extend(more);
            }
        }
        if let (Value::Object(all), Some(k), Some(bg), Some(fg)) = (
            &mut v,
            &self.service_kafka,
            self.kafka_bg_ratio(),
            self.kafka_fg_ratio(),
        ) {
            if let Value::Object(more) = k.to_json_with_stages("service_kafka") {
                all.extend(more);
            }
            all.insert(
                "kafka_over_file_bg_throughput".into(),
                json!((bg * 100.0).round() / 100.0),
            );
            all.insert(
                "kafka_over_file_fg_p50".into(),
                json!((fg * 100.0).round() / 100.0),
            );
        }
        v
    }

    /// A table.
    pub fn table(&self) -> String {
        let per = self.plan.saves / self.plan.clients * self.plan.clients;
        let bg = self.plan.service_background();
        let mut out = format!(
            "{build} build; {docs} shared documents; per path {per} foreground saves from {clients} concurrent clients \
             (latency of each save), then {bg} background operations on the same documents (the service's from {exec} \
             concurrent clients, the library's submitted at once; operations per second from the first submission until the last is applied; \
             {per} from {exec} concurrent zkguard exec processes for exec); after {warm} unmeasured run(s) \
             of the workload that warmed the servers up, and {own} of each service instance's own\n\n{:<28} {:>10} {:>10} {:>16}\n",
            "path",
            "fg p50",
            "fg p99",
            "bg ops/s",
            build = if cfg!(debug_assertions) { "debug" } else { "release" },
            docs = self.plan.docs,
            clients = self.plan.clients,
            exec = self.plan.exec_clients(),
            warm = self.warmup_runs,
            own = std::iter::once(&self.service)
                .chain(&self.service_kafka)
                .map(|f| f.warmup_runs.unwrap_or(0).to_string())
                .collect::<Vec<_>>()
                .join(" and "),
        );
        let mut rows = vec![
            ("library (in-process)", &self.library),
            ("zkguard serve (HTTP)", &self.service),
        ];
        if let Some(k) = &self.service_kafka {
            rows.push(("zkguard serve, Kafka journal", k));
        }
        rows.push(("zkguard exec + curl", &self.exec));
        for (name, f) in rows {
            out.push_str(&format!(
                "{name:<28} {:>8.2}ms {:>8.2}ms {:>16.1}\n",
                ms(f.p50),
                ms(f.p99),
                f.background_per_sec
            ));
        }
        out.push_str("\nbackground stages (per lock acquisition, per operation, per request):\n");
        let mut staged = vec![("library", &self.library), ("zkguard serve", &self.service)];
        if let Some(k) = &self.service_kafka {
            staged.push(("serve, Kafka", k));
        }
        for (name, f) in staged {
            out.push_str(&format!("  {name:<14} {}\n", f.stages.line(f.background)));
        }
        out.push_str(&format!(
            "\nforeground p50, service / library: {:.2}x (goal: at most 1.5x)\nbackground throughput, service / exec: {:.1}x (goal: at least 10x)\n",
            self.fg_ratio(),
            self.bg_ratio()
        ));
        let jit: Vec<String> = [("file journal", &self.service)]
            .into_iter()
            .chain(self.service_kafka.as_ref().map(|k| ("Kafka journal", k)))
            .filter_map(|(name, f)| Some(format!("{name} {:.0} ms", ms(f.fg_zk_jit?))))
            .collect();
        if !jit.is_empty() {
            out.push_str(&format!(
                "ZooKeeper's JIT compilers during the service's foreground phase: {}\n",
                jit.join(", ")
            ));
        }
        if let (Some(bg), Some(fg)) = (self.kafka_bg_ratio(), self.kafka_fg_ratio()) {
            out.push_str(&format!(
                "background throughput, Kafka journal / file journal: {bg:.2}x (goal: at least 0.7x)\nforeground p50, Kafka journal / file journal: {fg:.2}x (goal: unchanged)\n"
            ));
        }
        out
    }
}

fn doc_of(client: u32, i: u32, docs: u32) -> u32 {
    (client.wrapping_mul(7919).wrapping_add(i)) % docs
}

pub(super) fn latencies(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (percentile(&samples, 0.50), percentile(&samples, 0.99))
}

/// Runs the three paths against `settings`' ZooKeeper and Elasticsearch, and the service again
/// with its journal on the Kafka brokers `kafka` (`host:port,...`) when given.
///
/// # Errors
/// A path failed (the message says which and why).
pub async fn run(
    settings: Settings,
    plan: ServicePlan,
    kafka: Option<String>,
) -> Result<ServiceReport, String> {
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let mut settings = settings;
    settings.zookeeper.lock_root = format!("/zkguard-bench-service/{tag}");
    let warmup_runs = warm_up(&settings, plan, &tag).await?;
    let library = library(&settings, plan, &format!("bench-lib-{tag}")).await?;
    let svc_index = format!("bench-svc-{tag}");
    mapped_index(&settings, &svc_index).await?;
    let service_kafka = match kafka.as_deref() {
        Some(brokers) => {
            let index = format!("bench-kafka-{tag}");
            mapped_index(&settings, &index).await?;
            Some(service(&settings, plan, &index, Some(brokers)).await?)
        }
        None => None,
    };
    let service = service(&settings, plan, &svc_index, None).await?;
    let exec_index = format!("bench-exec-{tag}");
    mapped_index(&settings, &exec_index).await?;
    let exec = exec(&settings, plan, &exec_index).await?;
    Ok(ServiceReport {
        plan,
        library,
        service,
        service_kafka,
        exec,
        warmup_runs,
    })
}

/// The mapping every index of the benchmark is created with: the `zkguard` object that guarded
/// writes store in each document is kept but not indexed, as docs/serve.md tells every
/// deployment to map it (indexing its list of operation ids, up to 100 keywords a document,
/// would cost the cluster more than the write itself).
pub(super) fn stamp_mapping() -> Value {
    json!({"properties": {"zkguard": {"type": "object", "enabled": false}}})
}

/// Creates `index` with [`stamp_mapping`].
pub(super) async fn mapped_index(settings: &Settings, index: &str) -> Result<(), String> {
    let store = EsStore::new(&settings.elasticsearch).map_err(|e| e.to_string())?;
    store
        .ensure_index(index, &stamp_mapping())
        .await
        .map_err(|e| format!("cannot create the benchmark's index {index}: {e}"))
}

/// At most this many unmeasured runs of the library's workload before the measured ones.
pub const MAX_WARMUP_RUNS: u32 = 10;

/// The CPU time the JIT compiler threads of process `pid` (a JVM) have used so far: the sum over
/// its threads named `C1 CompilerThread…` or `C2 CompilerThread…` (Linux `/proc`).
fn jit_cpu_time(pid: u32) -> Option<Duration> {
    let mut total = Duration::ZERO;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if name.starts_with("C1 Compiler") || name.starts_with("C2 Compiler") {
            total += super::measure::stat_cpu_time(&task.path().join("stat")).unwrap_or_default();
        }
    }
    Some(total)
}

/// The share of a warm-up run's time under which ZooKeeper's JIT compilers count as done for
/// the servers' warm-ups (the library's here, the gateway's, the transactions', the scale
/// benchmark's jobs).
pub(super) const SERVERS_WARM: f64 = 0.1;

/// ZooKeeper's JIT compilers from one instant on: a warm-up run's or a measured phase's.
pub(super) struct JitWatch {
    pid: Option<u32>,
    before: Option<Duration>,
    started: Instant,
}

impl JitWatch {
    /// From now on, for ZooKeeper's process `pid` when known.
    pub(super) fn start(pid: Option<u32>) -> Self {
        Self {
            pid,
            before: pid.and_then(jit_cpu_time),
            started: Instant::now(),
        }
    }

    /// The CPU time the compiler threads took since [`Self::start`]; `None` when the process
    /// is unknown.
    pub(super) fn compiled(&self) -> Option<Duration> {
        self.pid
            .and_then(jit_cpu_time)
            .zip(self.before)
            .map(|(after, before)| after.saturating_sub(before))
    }

    /// Whether warm-up run `run`, started at [`Self::start`], is the last: the compilers took
    /// less than `share` of its time, or, the process unknown, it is run `blind_runs`. Logged
    /// as `what`.
    pub(super) fn warm(&self, run: u32, share: f64, blind_runs: u32, what: &str) -> bool {
        let compiling = self.compiled();
        let took = self.started.elapsed();
        tracing::info!(run, compiling = ?compiling, took = ?took, "{what}");
        match compiling {
            Some(c) => c.as_secs_f64() < share * took.as_secs_f64(),
            None => run >= blind_runs,
        }
    }
}

/// Warm-up, not measured. A ZooKeeper that has just started spends several times the CPU per
/// request until its JVM has compiled its hot code (its compiler threads took a core for tens
/// of thousands of lock cycles here), which would slow whichever path ran first. So the
/// library's workload runs first, unmeasured, until the server's JIT compilers used less than
/// a tenth of the last run's time (they took 60 to 80% of each of the first runs here, and 5 to
/// 7% from the seventh on; at most [`MAX_WARMUP_RUNS`] runs); without the server's
/// process id (servers not started here), twice. The paths then run on servers as warm as each
/// other.
async fn warm_up(settings: &Settings, plan: ServicePlan, tag: &str) -> Result<u32, String> {
    for run in 1..=MAX_WARMUP_RUNS {
        let jit = JitWatch::start(plan.zk_pid);
        library(settings, plan, &format!("bench-warm-{tag}-{run}")).await?;
        if jit.warm(run, SERVERS_WARM, 2, "warm-up run") {
            return Ok(run);
        }
    }
    Ok(MAX_WARMUP_RUNS)
}

async fn library(
    settings: &Settings,
    plan: ServicePlan,
    index: &str,
) -> Result<PathFigures, String> {
    let store: Arc<dyn DocStore> =
        Arc::new(EsStore::new(&settings.elasticsearch).map_err(|e| e.to_string())?);
    let session = zkguard::ZkSession::connect(&settings.zookeeper)
        .await
        .map_err(|e| e.to_string())?;
    let locks: Arc<dyn zkguard::LockService> =
        Arc::new(zkguard::ZkLockService::new(session.clone()));
    let writer = GuardedWriter::new(locks, store.clone());
    store
        .ensure_index(index, &stamp_mapping())
        .await
        .map_err(|e| format!("cannot create the benchmark's index {index}: {e}"))?;
    // Warm-up: the index exists and the connections are open.
    writer
        .run(&Operation::index(
            "warm",
            index,
            "warm",
            json!({"warm": true}),
        ))
        .await
        .map_err(|e| e.to_string())?;

    let per = plan.saves / plan.clients;
    let mut tasks = Vec::new();
    for c in 0..plan.clients {
        let writer = writer.clone();
        let index = index.to_string();
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::with_capacity(per as usize);
            for i in 0..per {
                let d = doc_of(c, i, plan.docs);
                let op = Operation::index(
                    format!("{index}:{d}"),
                    &index,
                    d.to_string(),
                    json!({"client": c, "n": i}),
                );
                let t = Instant::now();
                writer.run(&op).await.map_err(|e| e.to_string())?;
                out.push(t.elapsed());
            }
            Ok::<_, String>(out)
        }));
    }
    let samples = super::measure::joined(tasks).await?;

    let sink = zkguard::write::deadletter::sink_from_settings(&settings.retry, Some(store))
        .map_err(|e| e.to_string())?;
    // Configured as `zkguard serve` configures its executor.
    let executor = BackgroundExecutor::builder(writer, sink)
        .retry(&settings.retry)
        .concurrency(crate::server::BACKGROUND_IN_FLIGHT)
        .batch_by_monitor(
            crate::server::BACKGROUND_PER_LOCK,
            crate::server::BACKGROUND_PER_BULK,
        )
        .build();
    let per = plan.background / plan.clients;
    let n = per * plan.clients;
    let before = executor.stats();
    let started = Instant::now();
    let mut handles = Vec::with_capacity(n as usize);
    // The service's clients' documents, in the order they send them.
    for i in 0..per {
        for c in 0..plan.clients {
            let d = doc_of(c, i, plan.docs);
            let op = Operation::index(
                format!("{index}:{d}"),
                index,
                d.to_string(),
                json!({"bg": i, "client": c}),
            )
            .with_type(LockType::Background);
            handles.push(executor.submit(op).await);
        }
    }
    for h in handles {
        let outcome = h
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        if !outcome.is_applied() {
            return Err(format!(
                "a background operation was not applied: {outcome:?}"
            ));
        }
    }
    let elapsed = started.elapsed();
    let stages = Stages::between(&before, &executor.stats());
    session.close();
    Ok(PathFigures::measured(samples, n, elapsed, stages))
}

/// A `zkguard serve` child process; killed when dropped.
pub(super) struct Served {
    child: tokio::process::Child,
    /// `http://` and the API's address.
    pub(super) base: String,
    /// `http://` and the gate's address, when it was started with one.
    pub(super) gateway: Option<String>,
    dir: std::path::PathBuf,
}

impl Served {
    /// The child's process id, while it runs.
    pub(super) fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn zkguard_command(settings: &Settings) -> Result<tokio::process::Command, String> {
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the zkguard binary: {e}"))?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.env_remove("ZKGUARD_CONFIG")
        .env("ZKGUARD_ZOOKEEPER_SERVERS", &settings.zookeeper.servers)
        .env("ZKGUARD_ZOOKEEPER_LOCK_ROOT", &settings.zookeeper.lock_root)
        .env(
            "ZKGUARD_ELASTICSEARCH_URL",
            settings
                .elasticsearch
                .urls
                .iter()
                .map(url::Url::as_str)
                .collect::<Vec<_>>()
                .join(","),
        )
        .stdin(std::process::Stdio::null());
    Ok(cmd)
}

async fn start_service(
    settings: &Settings,
    plan: ServicePlan,
    kafka: Option<&str>,
) -> Result<Served, String> {
    start_served_journal(settings, Some(plan.clients * 4 + 16), false, kafka).await
}

/// Starts `zkguard serve` for `clients` concurrent clients, with the Elasticsearch-compatible
/// gate on a free port when `gateway` is set.
pub(super) async fn start_served(
    settings: &Settings,
    clients: u32,
    gateway: bool,
) -> Result<Served, String> {
    start_served_with(settings, Some(clients * 4 + 16), gateway).await
}

/// Starts `zkguard serve` handling `max_concurrent` requests at once (`server.max.concurrent`),
/// or with `settings`' own `server.max.concurrent` and `server.max.connections` when `None`
/// (`zkguard bench --scale`, whose levels must meet the limits a deployment has), with the
/// Elasticsearch-compatible gate on a free port when `gateway` is set.
pub(super) async fn start_served_with(
    settings: &Settings,
    max_concurrent: Option<u32>,
    gateway: bool,
) -> Result<Served, String> {
    start_served_journal(settings, max_concurrent, gateway, None).await
}

/// As [`start_served_with`], with the journal on the Kafka brokers `kafka` (a topic of its own)
/// when given, else in a file.
async fn start_served_journal(
    settings: &Settings,
    max_concurrent: Option<u32>,
    gateway: bool,
    kafka: Option<&str>,
) -> Result<Served, String> {
    use tokio::io::AsyncBufReadExt;
    let dir = std::env::temp_dir().join(format!("zkguard-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut cmd = zkguard_command(settings)?;
    cmd.args(["serve", "--listen", "127.0.0.1:0"])
        .env("ZKGUARD_SERVER_JOURNAL_PATH", dir.join("journal.jsonl"))
        .env(
            "ZKGUARD_DEADLETTER_FILE_PATH",
            dir.join("deadletters.jsonl"),
        )
        .env(
            "ZKGUARD_SERVER_MAX_CONCURRENT",
            max_concurrent
                .map_or(settings.server.max_concurrent, |n| n as usize)
                .to_string(),
        )
        .env(
            "ZKGUARD_SERVER_MAX_CONNECTIONS",
            settings.server.max_connections.to_string(),
        )
        .env(
            "ZKGUARD_SERVER_GATEWAY_LISTEN",
            if gateway { "127.0.0.1:0" } else { "" },
        )
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    if let Some(brokers) = kafka {
        cmd.env("ZKGUARD_SERVER_JOURNAL_BACKEND", "kafka")
            .env("ZKGUARD_SERVER_JOURNAL_KAFKA_BROKERS", brokers)
            .env(
                "ZKGUARD_SERVER_JOURNAL_KAFKA_TOPIC",
                format!("zkguard-bench-journal-{}", uuid::Uuid::new_v4().simple()),
            );
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start zkguard serve: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    tokio::io::BufReader::new(stdout)
        .read_line(&mut line)
        .await
        .map_err(|e| e.to_string())?;
    let started: Value = serde_json::from_str(&line)
        .map_err(|_| format!("zkguard serve did not start: {line:?}"))?;
    let addr = started["listening"].as_str().ok_or("no address")?;
    Ok(Served {
        base: format!("http://{addr}"),
        gateway: started["gateway"].as_str().map(|g| format!("http://{g}")),
        child,
        dir,
    })
}

/// The service's `/metrics` page.
async fn metrics_text(http: &reqwest::Client, base: &str) -> Result<String, String> {
    http.get(format!("{base}/metrics"))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .text()
        .await
        .map_err(|e| e.to_string())
}

pub(super) async fn journal_empty(http: &reqwest::Client, base: &str) -> Result<bool, String> {
    let text = metrics_text(http, base).await?;
    Ok(text.lines().any(|l| l == "zkguard_journal_depth 0"))
}

/// Asks `done` every `every` until it answers true; `Err(late)` once `limit` has passed.
async fn poll_until<F, Fut>(
    limit: Duration,
    every: Duration,
    late: &str,
    mut done: F,
) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, String>>,
{
    let give_up = Instant::now() + limit;
    while !done().await? {
        if Instant::now() > give_up {
            return Err(late.into());
        }
        tokio::time::sleep(every).await;
    }
    Ok(())
}

/// Whether the service's metrics show every journal partition owned here.
async fn owns_every_partition(http: &reqwest::Client, base: &str) -> Result<bool, String> {
    let text = metrics_text(http, base).await?;
    let owned: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("zkguard_journal_partition_owned{"))
        .filter_map(|l| l.rsplit(' ').next())
        .collect();
    Ok(!owned.is_empty() && owned.iter().all(|v| *v == "1"))
}

/// `zkguard_operations_total{lock_type="background",outcome="applied"}`.
pub(super) async fn background_applied(http: &reqwest::Client, base: &str) -> Result<u64, String> {
    Ok(applied_in(&metrics_text(http, base).await?))
}

/// [`background_applied`] as the metrics page `text` counts it.
fn applied_in(text: &str) -> u64 {
    text.lines()
        .filter(|l| {
            l.starts_with("zkguard_operations_total{")
                && l.contains("lock_type=\"background\"")
                && l.contains("outcome=\"applied\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

async fn service(
    settings: &Settings,
    plan: ServicePlan,
    index: &str,
    kafka: Option<&str>,
) -> Result<PathFigures, String> {
    let served = start_service(settings, plan, kafka).await?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(plan.clients as usize * 2)
        .build()
        .map_err(|e| e.to_string())?;
    let run = ServiceRun {
        http,
        base: served.base.clone(),
        index: index.to_string(),
        plan,
        kafka: kafka.is_some(),
    };
    if run.kafka {
        // The instance's start (the journal's index, each partition's lock and claim) is not
        // measured as foreground latency: it owns every partition first, as a running one does.
        poll_until(
            Duration::from_secs(60),
            Duration::from_millis(50),
            "zkguard serve did not own every journal partition within a minute",
            || owns_every_partition(&run.http, &run.base),
        )
        .await?;
    }
    let warm_index = format!("{index}-warm");
    mapped_index(settings, &warm_index).await?;
    let warmup_runs = run.warm_up(&warm_index).await?;
    let jit = JitWatch::start(plan.zk_pid);
    let samples = run.foreground().await?;
    let fg_zk_jit = jit.compiled();
    let (n, elapsed, stages) = run.background().await?;
    drop(served);
    Ok(PathFigures {
        warmup_runs: Some(warmup_runs),
        fg_zk_jit,
        ..PathFigures::measured(samples, n, elapsed, stages)
    })
}

/// The share of a warm-up run of a service instance's workload that ZooKeeper's JIT compilers
/// may take for its warm-up to end (`ServiceRun::warm_up`).
const INSTANCE_WARM: f64 = 0.05;

/// One `zkguard serve` instance's workload (see [`service`]).
#[derive(Clone)]
struct ServiceRun {
    http: reqwest::Client,
    base: String,
    index: String,
    plan: ServicePlan,
    /// Whether its journal is on Kafka.
    kafka: bool,
}

impl ServiceRun {
    /// The instance's own workload (its saves and its background operations), unmeasured, until
    /// ZooKeeper's JIT compilers used less than [`INSTANCE_WARM`] of a run's time, as [`warm_up`] does for
    /// the library's; returns the runs. An instance brings ZooKeeper requests of its own (the
    /// Kafka journal's partition locks, its fleet's members): ZooKeeper compiles code again
    /// for them, 0.3 s to 0.8 s of a compiler thread's CPU in the first two-second foreground
    /// phase of a Kafka journal's instance and under 0.1 s in the file journal's that ran
    /// after it, which would be counted as that instance's foreground latency. The runs write
    /// `index` (another index than the measured runs': the documents these write are as new as
    /// the other paths'), and `saves` background operations instead of `background`: the code
    /// paths are the same, and the cluster's store grows less (with `background` operations
    /// per run, the Kafka journal's measured background throughput fell by half, its outcomes
    /// twice as many).
    async fn warm_up(&self, index: &str) -> Result<u32, String> {
        let warm = ServiceRun {
            index: index.to_string(),
            plan: ServicePlan {
                background: self.plan.saves,
                ..self.plan
            },
            ..self.clone()
        };
        let what = if self.kafka {
            "service warm-up run (Kafka journal)"
        } else {
            "service warm-up run"
        };
        for run in 1..=MAX_WARMUP_RUNS {
            let jit = JitWatch::start(self.plan.zk_pid);
            warm.foreground().await?;
            warm.background().await?;
            if jit.warm(run, INSTANCE_WARM, 1, what) {
                return Ok(run);
            }
        }
        Ok(MAX_WARMUP_RUNS)
    }

    /// The foreground phase: `saves` saves from `clients` concurrent clients (after one
    /// unmeasured save); the latency of each.
    async fn foreground(&self) -> Result<Vec<Duration>, String> {
        self.put(0, "", json!({"warm": true}), None).await?;
        let per = self.plan.saves / self.plan.clients;
        self.write_from_clients(self.plan.clients, per, false).await
    }

    /// The background phase: operations from as many concurrent clients as `zkguard exec`
    /// gets, until every one is finished; how many, how long from the first submission until
    /// the last was finished, and where their time went.
    ///
    /// With the foreground's few clients, each waiting for its 202 before the next, the
    /// throughput would be the clients over the acceptance latency and not what the service
    /// applies.
    async fn background(&self) -> Result<(u32, Duration, Stages), String> {
        let submitters = self.plan.exec_clients();
        let per = self.plan.service_background() / submitters;
        let n = per * submitters;
        let (http, base) = (&self.http, self.base.as_str());
        let scraped_before = metrics_text(http, base).await?;
        let applied_before = applied_in(&scraped_before);
        let started = Instant::now();
        let accepts = self.write_from_clients(submitters, per, true).await?;
        // Until every accepted operation is finished: the file journal holds no unfinished
        // one; on Kafka, the service counts every one applied (the partitions are applied by
        // their owner).
        poll_until(
            Duration::from_secs(600),
            Duration::from_millis(10),
            "zkguard serve did not finish its background operations within 10 minutes",
            || async {
                if self.kafka {
                    Ok(background_applied(http, base).await? >= applied_before + u64::from(n))
                } else {
                    journal_empty(http, base).await
                }
            },
        )
        .await?;
        let elapsed = started.elapsed();
        let scraped_after = metrics_text(http, base).await?;
        let mut stages = Stages::scraped(&scraped_before, &scraped_after);
        stages.accept_p50 = latencies(accepts).0;
        let applied = applied_in(&scraped_after) - applied_before;
        if applied != u64::from(n) {
            return Err(format!(
                "zkguard serve applied {applied} of {n} background operations (see its dead letters)"
            ));
        }
        Ok((n, elapsed, stages))
    }

    /// One save over HTTP: `PUT /v1/indices/{index}/docs/{d}{query}`; an error unless the
    /// answer is `expect` (or any success when `None`).
    async fn put(
        &self,
        d: u32,
        query: &str,
        body: Value,
        expect: Option<reqwest::StatusCode>,
    ) -> Result<(), String> {
        let r = self
            .http
            .put(format!(
                "{}/v1/indices/{}/docs/{d}{query}",
                self.base, self.index
            ))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = r.status();
        let _ = r.bytes().await;
        match expect {
            Some(want) if status != want => Err(format!(
                "zkguard serve answered {status} to a write (expected {want})"
            )),
            None if !status.is_success() => {
                Err(format!("zkguard serve answered {status} to a save"))
            }
            _ => Ok(()),
        }
    }

    /// `per` writes from each of `clients` concurrent clients, each waiting for its answer
    /// before the next; the latency of each.
    async fn write_from_clients(
        &self,
        clients: u32,
        per: u32,
        background: bool,
    ) -> Result<Vec<Duration>, String> {
        let mut tasks = Vec::new();
        for c in 0..clients {
            let run = self.clone();
            tasks.push(tokio::spawn(async move {
                let mut out = Vec::with_capacity(per as usize);
                for i in 0..per {
                    let d = doc_of(c, i, run.plan.docs);
                    let t = Instant::now();
                    if background {
                        let body = json!({"bg": i, "client": c});
                        let accepted = Some(reqwest::StatusCode::ACCEPTED);
                        run.put(d, "?type=background", body, accepted).await?;
                    } else {
                        run.put(d, "", json!({"client": c, "n": i}), None).await?;
                    }
                    out.push(t.elapsed());
                }
                Ok::<_, String>(out)
            }));
        }
        super::measure::joined(tasks).await
    }
}

async fn exec(settings: &Settings, plan: ServicePlan, index: &str) -> Result<PathFigures, String> {
    let es = settings
        .elasticsearch
        .urls
        .first()
        .ok_or("no elasticsearch.url")?
        .as_str()
        .trim_end_matches('/')
        .to_string();
    let settings = Arc::new(settings.clone());
    let index = index.to_string();
    let once = move |settings: Arc<Settings>, kind: &'static str, d: u32, i: u32| {
        let es = es.clone();
        let index = index.clone();
        async move {
            let url = format!("{es}/{index}/_doc/{d}?version_type=external_gte&version=");
            let body = json!({"n": i}).to_string();
            let mut cmd = zkguard_command(&settings)?;
            cmd.args(["exec", "--monitor", &format!("{index}:{d}"), "--type", kind, "--"])
                .args(["sh", "-c"])
                .arg(format!(
                    "curl -sf -o /dev/null -XPUT -H 'content-type: application/json' \"{url}$ZKGUARD_FENCING_TOKEN\" -d '{body}'"
                ))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            let t = Instant::now();
            let status = cmd
                .status()
                .await
                .map_err(|e| format!("zkguard exec: {e}"))?;
            if !status.success() {
                return Err(format!("zkguard exec with curl exited {status}"));
            }
            Ok::<_, String>(t.elapsed())
        }
    };
    once(settings.clone(), "foreground", 0, 0).await?;

    let per = plan.saves / plan.clients;
    let mut tasks = Vec::new();
    for c in 0..plan.clients {
        let settings = settings.clone();
        let once = once.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..per {
                out.push(once(settings.clone(), "foreground", doc_of(c, i, plan.docs), i).await?);
            }
            Ok::<_, String>(out)
        }));
    }
    let samples = super::measure::joined(tasks).await?;

    let started = Instant::now();
    let mut tasks = Vec::new();
    // The same operations as the other paths, taken from one queue by more concurrent exec
    // clients, so that exec's throughput is not held back by clients waiting on one another.
    let queue: std::collections::VecDeque<(u32, u32)> = (0..per)
        .flat_map(|i| (0..plan.clients).map(move |c| (c, i)))
        .collect();
    let queue = Arc::new(std::sync::Mutex::new(queue));
    for _ in 0..plan.exec_clients() {
        let settings = settings.clone();
        let once = once.clone();
        let queue = queue.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let next = queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
                let Some((c, i)) = next else { break };
                once(settings.clone(), "background", doc_of(c, i, plan.docs), i).await?;
            }
            Ok::<_, String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    let elapsed = started.elapsed();
    let n = per * plan.clients;
    Ok(PathFigures::measured(
        samples,
        n,
        elapsed,
        Stages::default(),
    ))
}
