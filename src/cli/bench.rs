//! `zkguard bench`: lock latency and throughput (the figures are defined in
//! [`crate::workload::bench`]).
//!
//! Where the servers come from: `--local` starts a ZooKeeper (tickTime 2000, fsync on, as a
//! default production setup) or an `osmem-server` on a free loopback port and stops it at the
//! end; otherwise the configured `zookeeper.servers` / `elasticsearch.url` are used, overridden
//! by `--zk` / `--es`.
//!
//! Output: a table, or with `--json` one flat JSON object on stdout (see
//! [`bench::BenchReport::to_json`]). Progress goes to stderr: bars on a terminal
//! (without `--json`), plain lines otherwise.
//!
//! The measurement runs on a single-threaded Tokio runtime on a thread of its own: every
//! client's I/O task and every contender share that thread, so an answer from the server never
//! has to wake another thread. On a 2-core machine this gave lower latency and more hand-offs
//! per second than the multi-threaded runtime; the hidden `--runtime multi-thread` switch keeps
//! the comparison reproducible.
//!
//! Exit status: 0; 64 bad usage; 69 server unreachable (or a local one could not start);
//! 75 a benchmark acquisition timed out; 78 bad configuration.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Instant;

use crate::workload::bench::{self, BenchError, BenchPlan, BenchProgress, BenchReport, Phase};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use zkguard::config::{LockBackendKind, Settings};
use zkguard::testkit::{OsmemServer, ServerError, ZkServer};

use super::{CliError, EX_CONFIG, EX_SOFTWARE, EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE};

/// The lock backend to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    /// The ZooKeeper priority lock.
    Zookeeper,
    /// The Elasticsearch lease lock.
    Elasticsearch,
}

/// The async runtime the benchmark runs on (a diagnostic switch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeArg {
    /// A single-threaded runtime on a thread of its own: the client's I/O tasks and the lock
    /// calls share one thread, so no answer has to wake another thread.
    CurrentThread,
    /// The command's multi-threaded runtime, the benchmark in a worker task.
    MultiThread,
}

/// Arguments of `zkguard bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Print one JSON object (flat keys naming each figure and its unit) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Measured cycles of each figure (uncontended cycles, contended hand-offs, throughput
    /// cycles); with --txn, operations per size and way. Default 1000, 300 with --txn.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub iterations: Option<u32>,
    /// Concurrent clients (separate sessions) of the contended and throughput figures.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub contenders: u32,
    /// Monitor objects of the throughput figure.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub monitors: u32,
    /// Uncontended warm-up cycles (default max(50, iterations / 5), as the peers); with --txn,
    /// operations per size and way of each warm-up run (default max(5, iterations / 10)); with
    /// --scale, monitors of each warm-up bulk job (default 5000, 0 for none).
    #[arg(long, value_name = "N")]
    pub warmup: Option<u32>,
    /// Lock backend to measure (default: `lock.backend` of the configuration).
    #[arg(long, value_enum, value_name = "zookeeper|elasticsearch")]
    pub backend: Option<BackendArg>,
    /// ZooKeeper connect string (overrides `zookeeper.servers`).
    #[arg(long, value_name = "CONNECT", conflicts_with = "local")]
    pub zk: Option<String>,
    /// Elasticsearch URL(s), comma-separated (overrides `elasticsearch.url`).
    #[arg(long, value_name = "URL", conflicts_with = "local")]
    pub es: Option<String>,
    /// Start a local server (ZooKeeper with tickTime 2000, or osmem-server) for the run and stop
    /// it at the end.
    #[arg(long)]
    pub local: bool,
    /// Measure writes through `zkguard serve` over HTTP beside the in-process library and
    /// `zkguard exec`: --contenders concurrent clients on --monitors documents, --iterations
    /// foreground saves and background operations per path (at most 100 through exec). With
    /// --local, starts both a ZooKeeper and an osmem-server.
    #[arg(long, conflicts_with = "backend")]
    pub service: bool,
    /// Measure writes through the Elasticsearch-compatible gate of `zkguard serve` beside the
    /// same writes sent straight to the cluster: foreground index latency (--contenders
    /// clients on --monitors documents, --iterations writes per round) and bulk documents per
    /// second (--bulk-docs per round). With --local, starts both a ZooKeeper and an
    /// osmem-server.
    #[arg(long, conflicts_with_all = ["backend", "service"])]
    pub gateway: bool,
    /// Measure what a document transaction of N documents costs (latency p50/p99,
    /// Elasticsearch and ZooKeeper requests per operation) beside the same N writes as guarded
    /// writes one by one and as one plain `_bulk`, from one client, for each N of --sizes
    /// (--iterations operations per size and way). With --local, starts both a ZooKeeper and an
    /// osmem-server.
    #[arg(long, conflicts_with_all = ["backend", "service", "gateway"])]
    pub txn: bool,
    /// Measure how zkguard's costs grow as the work grows 10x and 100x: a background bulk job
    /// through the library over each number of new monitors of --scale-monitors (requests, CPU
    /// and memory per operation, znodes left behind), and a `zkguard serve` written to by each
    /// number of concurrent HTTP clients of --scale-clients (latency, requests, CPU, memory,
    /// file descriptors, refused writes), and the same figures with each number of
    /// `zkguard serve` processes of --scale-instances sharing 100 clients. With --local, starts
    /// both a ZooKeeper and an osmem-server.
    #[arg(long, conflicts_with_all = ["backend", "service", "gateway", "txn"])]
    pub scale: bool,
    /// Levels of --scale's monitors dimension: distinct new monitors of each bulk job,
    /// comma-separated.
    #[arg(long, value_name = "N,...", value_delimiter = ',', requires = "scale", default_values_t = crate::workload::scale_bench::DEFAULT_MONITORS, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub scale_monitors: Vec<u32>,
    /// Levels of --scale's clients dimension: concurrent HTTP clients of `zkguard serve`,
    /// comma-separated.
    #[arg(long, value_name = "N,...", value_delimiter = ',', requires = "scale", default_values_t = crate::workload::scale_bench::DEFAULT_CLIENTS, value_parser = clap::value_parser!(u32).range(1..=5000))]
    pub scale_clients: Vec<u32>,
    /// Levels of --scale's instances dimension: `zkguard serve` processes on one ZooKeeper
    /// sharing 100 concurrent HTTP clients and --scale-writes writes, comma-separated.
    #[arg(long, value_name = "N,...", value_delimiter = ',', requires = "scale", default_values_t = crate::workload::scale_bench::DEFAULT_INSTANCES, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub scale_instances: Vec<u32>,
    /// Foreground writes of each level of --scale's clients dimension (at least one per
    /// client).
    #[arg(long, value_name = "N", requires = "scale", default_value_t = crate::workload::scale_bench::DEFAULT_WRITES, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub scale_writes: u32,
    /// Documents per operation of --txn, comma-separated.
    #[arg(long, value_name = "N,...", value_delimiter = ',', default_values_t = crate::workload::txn_bench::DEFAULT_SIZES, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub sizes: Vec<u32>,
    /// Documents per round of the bulk figure of --gateway, in `_bulk` requests of 500.
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub bulk_docs: u32,
    /// Process id of the ZooKeeper server (Linux): also measure its CPU time per cycle,
    /// hand-off and throughput cycle. With --local, the server started for the run is measured.
    #[arg(long, value_name = "PID", conflicts_with = "local")]
    pub server_pid: Option<u32>,
    /// Release each lock on its own before the next acquisition (`Guard::release`), instead
    /// of in it (`LockService::release_and_acquire`), in the contended and throughput figures
    #[arg(long)]
    pub separate_release: bool,
    /// Async runtime of the benchmark (diagnostics).
    #[arg(long, value_enum, default_value_t = RuntimeArg::CurrentThread, hide = true)]
    pub runtime: RuntimeArg,
}

impl BenchArgs {
    /// `--iterations`, or its default: 300 with `--txn`, 1000 otherwise.
    fn iterations(&self) -> u32 {
        self.iterations.unwrap_or(if self.txn { 300 } else { 1000 })
    }
}

/// Local servers started for `--local`; stopped by [`LocalServer::stop`].
enum LocalServer {
    Zk(ZkServer),
    Es(OsmemServer),
}

impl LocalServer {
    /// The process id of a local ZooKeeper (for measuring its CPU time).
    fn zk_pid(&self) -> Option<u32> {
        match self {
            Self::Zk(zk) => zk.pid(),
            Self::Es(_) => None,
        }
    }

    async fn stop(self) {
        let _ = tokio::task::spawn_blocking(move || match self {
            Self::Zk(zk) => zk.stop(),
            Self::Es(es) => es.stop(),
        })
        .await;
    }
}

fn server_error(what: &str, e: ServerError) -> CliError {
    let text = match &e {
        // The log tail would not fit on one line; its path goes with the handle.
        ServerError::StartFailed { what, reason, .. } => {
            format!("{what} failed to start: {reason}")
        }
        other => other.to_string(),
    };
    CliError::new(
        EX_UNAVAILABLE,
        format!("cannot start a local {what} for the benchmark: {text}"),
    )
}

async fn start_local(
    settings: &mut Settings,
    backend: LockBackendKind,
) -> Result<LocalServer, CliError> {
    let joined = |e: tokio::task::JoinError| CliError::new(EX_SOFTWARE, e);
    match backend {
        LockBackendKind::ZooKeeper => {
            let zk = tokio::task::spawn_blocking(|| ZkServer::builder().tick_time(2000).start())
                .await
                .map_err(joined)?
                .map_err(|e| server_error("ZooKeeper", e))?;
            settings.zookeeper.servers = zk.connect_string();
            Ok(LocalServer::Zk(zk))
        }
        LockBackendKind::Elasticsearch => {
            let es = tokio::task::spawn_blocking(OsmemServer::start)
                .await
                .map_err(joined)?
                .map_err(|e| server_error("osmem-server", e))?;
            settings.elasticsearch.urls = vec![es
                .url()
                .parse()
                .map_err(|e| CliError::new(EX_SOFTWARE, format!("osmem-server URL: {e}")))?];
            Ok(LocalServer::Es(es))
        }
    }
}

fn parse_es_urls(text: &str) -> Result<Vec<url::Url>, CliError> {
    let mut urls = Vec::new();
    for part in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match url::Url::parse(part) {
            Ok(u) if u.scheme() == "http" || u.scheme() == "https" => urls.push(u),
            _ => {
                return Err(CliError::usage(format!(
                    "--es `{}` is not an http:// or https:// URL (e.g. http://localhost:9200)",
                    zkguard::config::redact_urls(part)
                )))
            }
        }
    }
    if urls.is_empty() {
        return Err(CliError::usage(
            "--es needs at least one http:// or https:// URL",
        ));
    }
    Ok(urls)
}

fn check_zk(text: &str) -> Result<String, CliError> {
    let t = text.trim();
    if t.is_empty() || t.starts_with('/') || t.chars().any(char::is_whitespace) {
        return Err(CliError::usage(format!(
            "--zk `{text}` is not a ZooKeeper connect string: use host:port[,host:port...][/chroot]"
        )));
    }
    Ok(t.to_string())
}

/// Progress bars on a terminal.
struct Bars {
    bar: ProgressBar,
    started: std::sync::Mutex<Instant>,
}

impl BenchProgress for Bars {
    fn start(&self, phase: Phase, total: u64) {
        *self.started.lock().expect("progress clock") = Instant::now();
        self.bar.reset();
        self.bar.set_length(total);
        self.bar.set_position(0);
        self.bar.set_message(phase.to_string());
    }
    fn advance(&self, n: u64) {
        self.bar.inc(n);
    }
    fn finish(&self, phase: Phase) {
        let secs = self
            .started
            .lock()
            .expect("progress clock")
            .elapsed()
            .as_secs_f64();
        self.bar
            .println(format!("  {phase}: {} in {secs:.2} s", self.bar.position()));
    }
}

/// Plain progress lines on stderr.
struct Lines {
    started: std::sync::Mutex<(Instant, u64)>,
}

impl BenchProgress for Lines {
    fn start(&self, phase: Phase, total: u64) {
        *self.started.lock().expect("progress clock") = (Instant::now(), total);
        let unit = if phase == Phase::Connecting {
            "client(s)"
        } else {
            "cycles"
        };
        eprintln!("zkguard bench: {phase}: {total} {unit} ...");
    }
    fn advance(&self, _n: u64) {}
    fn finish(&self, phase: Phase) {
        let (t0, total) = *self.started.lock().expect("progress clock");
        let secs = t0.elapsed().as_secs_f64();
        eprintln!("zkguard bench: {phase}: {total} done in {secs:.2} s");
    }
}

fn progress(json: bool) -> (Arc<dyn BenchProgress>, Option<ProgressBar>) {
    if !json && std::io::stderr().is_terminal() {
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{msg:>20} [{bar:40}] {pos}/{len} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        let handle = bar.clone();
        (
            Arc::new(Bars {
                bar,
                started: std::sync::Mutex::new(Instant::now()),
            }),
            Some(handle),
        )
    } else {
        (
            Arc::new(Lines {
                started: std::sync::Mutex::new((Instant::now(), 0)),
            }),
            None,
        )
    }
}

fn bench_error(e: BenchError) -> CliError {
    match e {
        BenchError::Unreachable { .. } => CliError::new(EX_UNAVAILABLE, e),
        BenchError::Setup { .. } => CliError::new(EX_CONFIG, e),
        BenchError::InvalidPlan(_) => CliError::new(EX_USAGE, e),
        BenchError::Lock { ref source, .. } => {
            let code = match source {
                zkguard::LockError::Timeout { .. } => EX_TEMPFAIL,
                _ => EX_UNAVAILABLE,
            };
            CliError::new(code, e)
        }
    }
}

/// Runs the benchmark on the chosen runtime.
async fn measure(
    settings: Settings,
    backend: LockBackendKind,
    plan: BenchPlan,
    progress: Arc<dyn BenchProgress>,
    runtime: RuntimeArg,
) -> Result<BenchReport, CliError> {
    match runtime {
        RuntimeArg::CurrentThread => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::Builder::new()
                .name("zkguard-bench".into())
                .spawn(move || {
                    let result = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt
                            .block_on(bench::run(&settings, backend, &plan, progress))
                            .map_err(bench_error),
                        Err(e) => Err(CliError::new(
                            EX_SOFTWARE,
                            format!("cannot start the benchmark runtime: {e}"),
                        )),
                    };
                    let _ = tx.send(result);
                })
                .map_err(|e| {
                    CliError::new(
                        EX_SOFTWARE,
                        format!("cannot start the benchmark thread: {e}"),
                    )
                })?;
            rx.await.map_err(|_| {
                CliError::new(EX_SOFTWARE, "the benchmark thread ended without a result")
            })?
        }
        RuntimeArg::MultiThread => {
            tokio::spawn(async move { bench::run(&settings, backend, &plan, progress).await })
                .await
                .map_err(|e| CliError::new(EX_SOFTWARE, e))?
                .map_err(bench_error)
        }
    }
}

fn endpoint(settings: &Settings, backend: LockBackendKind) -> String {
    match backend {
        LockBackendKind::ZooKeeper => settings.zookeeper.servers.clone(),
        LockBackendKind::Elasticsearch => {
            zkguard::config::display_urls(&settings.elasticsearch.urls)
        }
    }
}

fn print_table(report: &BenchReport, at: &str, local: bool) {
    let backend = match report.backend {
        "zookeeper" => "ZooKeeper",
        "elasticsearch" => "Elasticsearch",
        other => other,
    };
    println!(
        "zkguard bench: {backend} lock at {at}{}; {} iterations after {} warm-up cycles, {} contenders, {} monitors",
        if local { " (started for this run)" } else { "" },
        report.iterations,
        report.warmup,
        report.contenders,
        report.monitors
    );
    println!(
        "contended and throughput clients release {}",
        if report.release == "separate" {
            "each lock on its own, then acquire the next (--separate-release)"
        } else {
            "each lock in their next acquisition (release_and_acquire)"
        }
    );
    println!();
    let requests = report
        .requests_per_cycle
        .map_or_else(|| "n/a".to_string(), |r| format!("{r:.2}"));
    let rows = [
        (
            "uncontended acquire+release p50".to_string(),
            format!("{:.3} ms", report.uncontended_p50_ms),
        ),
        (
            "uncontended acquire+release p99".to_string(),
            format!("{:.3} ms", report.uncontended_p99_ms),
        ),
        ("requests per uncontended cycle".to_string(), requests),
        (
            "client CPU per uncontended cycle".to_string(),
            format!("{:.3} ms", report.cpu_ms_per_cycle),
        ),
        (
            format!(
                "contended hand-offs ({} sessions, 1 monitor)",
                report.contenders
            ),
            format!("{:.1} /s", report.handoffs_per_sec),
        ),
        (
            "  of which to another session".to_string(),
            format!("{:.1} /s", report.owner_changes_per_sec),
        ),
        (
            "  requests per hand-off".to_string(),
            report
                .requests_per_handoff
                .map_or_else(|| "n/a".to_string(), |r| format!("{r:.2}")),
        ),
        (
            "  client CPU per hand-off".to_string(),
            format!("{:.3} ms", report.cpu_ms_per_handoff),
        ),
        (
            format!(
                "throughput ({} sessions, {} monitors)",
                report.contenders, report.monitors
            ),
            format!("{:.1} ops/s", report.ops_per_sec),
        ),
        (
            "  requests per cycle".to_string(),
            report
                .requests_per_op
                .map_or_else(|| "n/a".to_string(), |r| format!("{r:.2}")),
        ),
        (
            "  client CPU per cycle".to_string(),
            format!("{:.3} ms", report.cpu_ms_per_op),
        ),
    ];
    let server = [
        (
            "server CPU per uncontended cycle",
            report.server_cpu_ms_per_cycle,
        ),
        ("server CPU per hand-off", report.server_cpu_ms_per_handoff),
        (
            "server CPU per same-session hand-off",
            report.same_session_server_cpu_ms_per_handoff,
        ),
        (
            "server CPU per throughput cycle",
            report.server_cpu_ms_per_op,
        ),
    ];
    let same_session = [
        (
            "same-session hand-offs (1 session, 1 monitor)",
            report
                .same_session_handoffs_per_sec
                .map(|r| format!("{r:.1} /s")),
        ),
        (
            "  requests per same-session hand-off",
            report
                .same_session_requests_per_handoff
                .map(|r| format!("{r:.2}")),
        ),
        (
            "  client CPU per same-session hand-off",
            report
                .same_session_cpu_ms_per_handoff
                .map(|ms| format!("{ms:.3} ms")),
        ),
    ];
    let rows: Vec<(String, String)> = rows
        .into_iter()
        .chain(
            same_session
                .into_iter()
                .filter_map(|(label, value)| Some((label.to_string(), value?))),
        )
        .chain(
            server
                .into_iter()
                .filter_map(|(label, ms)| Some((label.to_string(), format!("{:.3} ms", ms?)))),
        )
        .collect();
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let vwidth = rows.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
    println!("{:<width$}  {:>vwidth$}", "figure", "value");
    println!("{}  {}", "-".repeat(width), "-".repeat(vwidth));
    for (k, v) in rows {
        println!("{k:<width$}  {v:>vwidth$}");
    }
}

/// Runs `zkguard bench`.
pub async fn run(mut settings: Settings, args: BenchArgs) -> Result<u8, CliError> {
    let backend = match args.backend {
        Some(BackendArg::Zookeeper) => LockBackendKind::ZooKeeper,
        Some(BackendArg::Elasticsearch) => LockBackendKind::Elasticsearch,
        None => settings.backend,
    };
    if let Some(zk) = &args.zk {
        settings.zookeeper.servers = check_zk(zk)?;
    }
    if let Some(es) = &args.es {
        settings.elasticsearch.urls = parse_es_urls(es)?;
    }
    if args.service {
        return run_service(settings, &args).await;
    }
    if args.gateway {
        return run_gateway(settings, &args).await;
    }
    if args.txn {
        return run_txn(settings, &args).await;
    }
    if args.scale {
        return run_scale(settings, &args).await;
    }
    let mut plan = BenchPlan::new(args.iterations(), args.contenders, args.monitors);
    if let Some(w) = args.warmup {
        plan = plan.with_warmup(w);
    }
    if args.separate_release {
        plan = plan.with_separate_release();
    }
    let local = if args.local {
        Some(start_local(&mut settings, backend).await?)
    } else {
        None
    };
    let server_pid = match &local {
        Some(server) => server.zk_pid(),
        None => args.server_pid,
    };
    if let Some(pid) = server_pid.filter(|_| backend == LockBackendKind::ZooKeeper) {
        if crate::workload::measure::process_cpu_time(pid).is_none() {
            return Err(CliError::usage(format!(
                "--server-pid {pid}: no process whose CPU time can be read from /proc/{pid}/stat; give the pid of the running ZooKeeper server"
            )));
        }
        plan = plan.with_server_pid(pid);
    }
    let at = endpoint(&settings, backend);
    if !args.json {
        eprintln!(
            "zkguard bench: measuring the {} lock at {at} ...",
            if backend == LockBackendKind::ZooKeeper {
                "ZooKeeper"
            } else {
                "Elasticsearch"
            }
        );
    }
    let (progress, bar) = progress(args.json);
    let result = measure(settings, backend, plan, progress, args.runtime).await;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if let Some(server) = local {
        server.stop().await;
    }
    let report = result?;
    if args.json {
        println!("{}", report.to_json());
    } else {
        print_table(&report, &at, args.local);
    }
    Ok(0)
}

/// Background operations of the library and the service per foreground save in
/// `zkguard bench --service` (see `ServicePlan::background`).
const BACKGROUND_PER_SAVE: u32 = 5;

/// `zkguard bench --service`.
async fn run_service(settings: Settings, args: &BenchArgs) -> Result<u8, CliError> {
    use crate::workload::service_bench::{self, ServicePlan};
    if args.iterations() < args.contenders {
        return Err(CliError::usage(
            "--iterations must be at least --contenders (each client makes iterations / contenders saves)",
        ));
    }
    let measured = with_local_servers(
        settings,
        args,
        "--service: library, zkguard serve and zkguard exec",
        |settings, zk_pid| async move {
            let plan = ServicePlan {
                clients: args.contenders,
                docs: args.monitors,
                saves: args.iterations(),
                background: args.iterations().saturating_mul(BACKGROUND_PER_SAVE),
                zk_pid,
            };
            // The Kafka journal's column: a local tansu broker with --local, else the
            // configured server.journal.kafka.brokers, if any.
            let broker = if args.local {
                match tokio::task::spawn_blocking(zkguard::testkit::TansuServer::start).await {
                    Ok(Ok(b)) => Some(b),
                    Ok(Err(e)) => {
                        eprintln!("no Kafka journal column: {e}");
                        None
                    }
                    Err(e) => return Err(e.to_string()),
                }
            } else {
                None
            };
            let brokers = broker.as_ref().map(|b| b.brokers()).or_else(|| {
                let configured = settings.server.journal_kafka.brokers.join(",");
                (!configured.is_empty()).then_some(configured)
            });
            let report = service_bench::run(settings, plan, brokers).await;
            drop(broker);
            report.map(|r| (r.to_json(), r.table()))
        },
    )
    .await?;
    print_measured(args, measured)
}

/// `zkguard bench --gateway`.
async fn run_gateway(settings: Settings, args: &BenchArgs) -> Result<u8, CliError> {
    use crate::workload::gateway_bench::{self, GatewayPlan};
    let measured = with_local_servers(
        settings,
        args,
        "--gateway: straight to the cluster and through the gate",
        |settings, zk_pid| async move {
            let plan = GatewayPlan {
                clients: args.contenders,
                docs: args.monitors,
                saves: args.iterations(),
                bulk_docs: args.bulk_docs,
                bulk_size: 500,
                zk_pid,
            };
            gateway_bench::run(settings, plan)
                .await
                .map(|r| (r.to_json(), r.table()))
        },
    )
    .await?;
    print_measured(args, measured)
}

/// `zkguard bench --txn`.
async fn run_txn(settings: Settings, args: &BenchArgs) -> Result<u8, CliError> {
    use crate::workload::txn_bench::{self, TxnPlan};
    let mut sizes = args.sizes.clone();
    sizes.sort_unstable();
    sizes.dedup();
    let limit = settings.txn.max_operations;
    if let Some(n) = sizes.iter().find(|&&n| n as usize > limit) {
        return Err(CliError::usage(format!(
            "--sizes: a transaction of {n} documents is larger than txn.max.operations ({limit})"
        )));
    }
    let iterations = args.iterations();
    let measured = with_local_servers(
        settings,
        args,
        "--txn: document transactions beside guarded writes and a plain _bulk",
        |settings, zk_pid| async move {
            let plan = TxnPlan {
                sizes,
                iterations,
                warmup: args.warmup.unwrap_or((iterations / 10).max(5)),
                zk_pid,
            };
            txn_bench::run(settings, plan)
                .await
                .map(|r| (r.to_json(), r.table()))
        },
    )
    .await?;
    print_measured(args, measured)
}

/// `zkguard bench --scale`.
async fn run_scale(settings: Settings, args: &BenchArgs) -> Result<u8, CliError> {
    use crate::workload::scale_bench::{self, ScalePlan};
    let levels = |given: &[u32]| {
        let mut v = given.to_vec();
        v.sort_unstable();
        v.dedup();
        v
    };
    let monitors = levels(&args.scale_monitors);
    let clients = levels(&args.scale_clients);
    let instances = levels(&args.scale_instances);
    let most = clients
        .last()
        .copied()
        .unwrap_or(0)
        .max(scale_bench::INSTANCE_CLIENTS);
    ensure_open_files(u64::from(most) + 256)?;
    let measured = with_local_servers(
        settings,
        args,
        "--scale: costs as the monitors and the HTTP clients grow",
        |settings, zk_pid| async move {
            let plan = ScalePlan {
                monitors,
                clients,
                instances,
                writes: args.scale_writes,
                warmup: args.warmup.unwrap_or(scale_bench::WARMUP_MONITORS),
                zk_pid,
            };
            scale_bench::run(settings, plan)
                .await
                .map(|r| (r.to_json(), r.table()))
        },
    )
    .await?;
    print_measured(args, measured)
}

/// Raises this process's soft open-files limit to hold `wanted` descriptors (one connection
/// per HTTP client of `--scale`, and the rest), up to the hard limit; a usage error when even
/// that is too low.
fn ensure_open_files(wanted: u64) -> Result<(), CliError> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return Ok(());
    };
    if soft >= wanted {
        return Ok(());
    }
    if hard >= wanted && setrlimit(Resource::RLIMIT_NOFILE, wanted, hard).is_ok() {
        return Ok(());
    }
    Err(CliError::usage(format!(
        "--scale-clients: {} clients need about {wanted} open files, but the limit is {soft} (hard {hard}); raise it (ulimit -n) or ask for fewer clients",
        wanted - 256
    )))
}

/// Runs `measure` of a write benchmark (`--service`, `--gateway`, `--txn`, `--scale`): with `--local` on a
/// ZooKeeper and an osmem-server started for it (and stopped after), with the ZooKeeper's
/// process id when known; announced as `what` unless `--json`. Returns the report as JSON and as
/// a table.
async fn with_local_servers<F, Fut>(
    mut settings: Settings,
    args: &BenchArgs,
    what: &str,
    measure: F,
) -> Result<(serde_json::Value, String), CliError>
where
    F: FnOnce(Settings, Option<u32>) -> Fut,
    Fut: std::future::Future<Output = Result<(serde_json::Value, String), String>>,
{
    let mut locals = Vec::new();
    if args.local {
        locals.push(start_local(&mut settings, LockBackendKind::ZooKeeper).await?);
        locals.push(start_local(&mut settings, LockBackendKind::Elasticsearch).await?);
    }
    if !args.json {
        eprintln!("zkguard bench {what} ...");
    }
    let zk_pid = locals
        .iter()
        .find_map(LocalServer::zk_pid)
        .or(args.server_pid);
    let result = measure(settings, zk_pid).await;
    for server in locals {
        server.stop().await;
    }
    result.map_err(|e| CliError::new(EX_UNAVAILABLE, e))
}

fn print_measured(
    args: &BenchArgs,
    (json, table): (serde_json::Value, String),
) -> Result<u8, CliError> {
    if args.json {
        println!("{json}");
    } else {
        print!("{table}");
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_arguments_are_checked() {
        assert!(check_zk("127.0.0.1:2181,b:2182/chroot").is_ok());
        assert_eq!(check_zk("").unwrap_err().code, EX_USAGE);
        assert_eq!(check_zk("a b").unwrap_err().code, EX_USAGE);
        assert_eq!(parse_es_urls("http://a:9200, https://b").unwrap().len(), 2);
        assert_eq!(parse_es_urls("ftp://a").unwrap_err().code, EX_USAGE);
        assert_eq!(parse_es_urls(" , ").unwrap_err().code, EX_USAGE);
    }
}
