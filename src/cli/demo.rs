//! `zkguard demo`: foreground and background writers on shared articles, with a report and a
//! reconciliation against Elasticsearch (the workload is [`crate::workload::demo`]).
//!
//! Where the servers come from (`--servers`):
//! - `local`: start a ZooKeeper and an `osmem-server` on free loopback ports (installed by
//!   `scripts/install-deps.sh`), run, stop them;
//! - `configured`: use `zookeeper.servers` and `elasticsearch.url` of the configuration;
//! - `auto` (default): `configured` when a configuration file is given (`--config` or
//!   `ZKGUARD_CONFIG`) or `ZKGUARD_ZOOKEEPER_SERVERS` / `ZKGUARD_ELASTICSEARCH_URL` is set,
//!   `local` otherwise.
//!
//! Once the workload has started, a report is printed whatever happens. Exit status: 0 when
//! every operation is accounted for; 1 when operations were lost (neither applied nor parked) or
//! the reconciliation found a mismatch; 69 when the reconciliation could not check everything
//! (Elasticsearch or the dead-letter sink unreadable at the end: the report says what was not
//! checked); and the usual codes when the servers cannot be started or reached before the
//! workload starts.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::workload::demo::{DemoEnv, DemoError, DemoPlan, DemoProgress};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use zkguard::config::{DeadLetterSinkKind, LockBackendKind, Settings};
use zkguard::es::{DocStore, EsStore};
use zkguard::testkit::{OsmemServer, ServerError, TansuServer, ZkServer};
use zkguard::write::deadletter::sink_from_settings;

use super::{CliError, EX_SOFTWARE, EX_UNAVAILABLE};

/// Exit status when the reconciliation finds a mismatch or operations were lost.
pub const EX_MISMATCH: u8 = 1;

/// Where the demo's servers come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ServersMode {
    /// `configured` when a configuration file or endpoint variable is given, else `local`.
    Auto,
    /// Start ZooKeeper and osmem-server on free loopback ports.
    Local,
    /// Use the configured `zookeeper.servers` and `elasticsearch.url`.
    Configured,
}

/// Where the demo parks dead letters (`--deadletters`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeadLettersMode {
    /// The configured `deadletter.sink` (a file in the run's directory for local servers).
    Configured,
    /// A JSON-lines file.
    File,
    /// An Elasticsearch index (`deadletter.index`).
    Elasticsearch,
    /// A Kafka topic: a local broker with `--servers local`, else `deadletter.kafka.brokers`.
    Kafka,
}

/// Arguments of `zkguard demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Where ZooKeeper and Elasticsearch come from.
    #[arg(long, value_enum, default_value_t = ServersMode::Auto)]
    pub servers: ServersMode,
    /// Index of the demo articles (created if missing; its articles are overwritten).
    #[arg(long, default_value = "zkguard-demo-articles")]
    pub index: String,
    /// Number of articles (at least 3).
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(3..=10_000))]
    pub articles: u32,
    /// Foreground "Save Content" writers.
    #[arg(long, default_value_t = 4)]
    pub writers: u32,
    /// Saves per foreground writer.
    #[arg(long, default_value_t = 15)]
    pub saves: u32,
    /// Background "Bulk Propagation" jobs.
    #[arg(long, default_value_t = 6)]
    pub jobs: u32,
    /// Articles per background job.
    #[arg(long, default_value_t = 8)]
    pub job_size: u32,
    /// How long a background operation waits for its lock per attempt (ms or with a unit).
    #[arg(long, default_value = "300ms", value_parser = parse_duration)]
    pub background_timeout: Duration,
    /// Skip the slow editor (who makes background operations end as dead letters).
    #[arg(long)]
    pub no_slow_editor: bool,
    /// Skip the stalled writer (whose stale write is fenced).
    #[arg(long)]
    pub no_stalled_writer: bool,
    /// Where dead letters go; `kafka` with local servers also starts a local Kafka broker.
    #[arg(long, value_enum, default_value_t = DeadLettersMode::Configured)]
    pub deadletters: DeadLettersMode,
    /// Leave the run's dead letters parked instead of replaying them at the end.
    #[arg(long)]
    pub no_replay: bool,
    /// Random seed (article choice and pauses); random by default.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print the report as JSON on stdout (no progress display).
    #[arg(long)]
    pub json: bool,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    zkguard::config::parse_bounded_duration(s)
}

impl DemoArgs {
    fn plan(&self) -> DemoPlan {
        let mut plan = DemoPlan {
            index: self.index.clone(),
            articles: self.articles as usize,
            writers: self.writers as usize,
            saves_per_writer: self.saves as usize,
            jobs: self.jobs as usize,
            articles_per_job: self.job_size as usize,
            background_lock_timeout: self.background_timeout,
            slow_editor: !self.no_slow_editor,
            stalled_writer: !self.no_stalled_writer,
            replay: !self.no_replay,
            ..DemoPlan::default()
        };
        if let Some(seed) = self.seed {
            plan.seed = seed;
        }
        plan
    }
}

/// Servers started for a local run; dropping them stops them.
struct LocalServers {
    _zk: Option<ZkServer>,
    _es: OsmemServer,
    _kafka: Option<TansuServer>,
    dir: PathBuf,
}

fn server_error(e: ServerError) -> CliError {
    CliError::new(
        EX_UNAVAILABLE,
        format!("cannot start the demo's local servers: {e}"),
    )
}

fn use_configured(mode: ServersMode, settings: &Settings) -> bool {
    match mode {
        ServersMode::Local => false,
        ServersMode::Configured => true,
        ServersMode::Auto => {
            settings.source.is_some()
                || ["ZKGUARD_ZOOKEEPER_SERVERS", "ZKGUARD_ELASTICSEARCH_URL"]
                    .iter()
                    .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()))
        }
    }
}

/// Starts ZooKeeper (for the ZooKeeper backend), osmem-server and (for the Kafka sink) a tansu
/// broker, and points `settings` at them.
async fn start_local(settings: &mut Settings, quiet: bool) -> Result<LocalServers, CliError> {
    let need_zk = settings.backend == LockBackendKind::ZooKeeper;
    let need_kafka = settings.retry.sink == DeadLetterSinkKind::Kafka;
    if !quiet {
        eprintln!(
            "starting {}osmem-server{} on loopback ports (use --servers configured for a real cluster) ...",
            if need_zk { "ZooKeeper, " } else { "" },
            if need_kafka { " and a Kafka broker (tansu)" } else { "" }
        );
    }
    let kafka = if need_kafka {
        let broker = tokio::task::spawn_blocking(TansuServer::start)
            .await
            .map_err(|e| CliError::new(EX_SOFTWARE, e))?
            .map_err(server_error)?;
        settings.retry.kafka.brokers = vec![broker.brokers()];
        Some(broker)
    } else {
        None
    };
    let zk = if need_zk {
        Some(
            tokio::task::spawn_blocking(|| ZkServer::builder().start())
                .await
                .map_err(|e| CliError::new(EX_SOFTWARE, e))?
                .map_err(server_error)?,
        )
    } else {
        None
    };
    let es = tokio::task::spawn_blocking(OsmemServer::start)
        .await
        .map_err(|e| CliError::new(EX_SOFTWARE, e))?
        .map_err(server_error)?;
    if let Some(zk) = &zk {
        settings.zookeeper.servers = zk.connect_string();
    }
    settings.elasticsearch.urls = vec![es
        .url()
        .parse()
        .map_err(|e| CliError::new(EX_SOFTWARE, e))?];
    let dir = std::env::temp_dir().join(format!(
        "zkguard-demo-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir)
        .map_err(|e| CliError::new(EX_SOFTWARE, format!("cannot create {}: {e}", dir.display())))?;
    if matches!(
        settings.retry.sink,
        DeadLetterSinkKind::File | DeadLetterSinkKind::Kafka
    ) {
        // The file sink, or the Kafka sink's fallback.
        settings.retry.file_path = dir.join("deadletters.jsonl");
    }
    if !quiet {
        eprintln!(
            "  ZooKeeper {}, Elasticsearch API {}{}",
            zk.as_ref()
                .map_or_else(|| "not needed".to_string(), ZkServer::connect_string),
            es.url(),
            kafka
                .as_ref()
                .map_or_else(String::new, |k| format!(", Kafka {}", k.brokers()))
        );
    }
    Ok(LocalServers {
        _zk: zk,
        _es: es,
        _kafka: kafka,
        dir,
    })
}

/// Shows progress: bars on a terminal, a plain line per second otherwise.
fn spawn_progress(
    progress: Arc<DemoProgress>,
    json: bool,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::watch::Sender<bool>,
) {
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let handle = tokio::spawn(async move {
        if json {
            let _ = stop_rx.wait_for(|s| *s).await;
            return;
        }
        let terminal = std::io::stderr().is_terminal();
        let bars = terminal.then(|| {
            let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{prefix:>11} [{bar:32.cyan/blue}] {pos:>4}/{len:<4} {msg}",
            )
            .expect("valid template")
            .progress_chars("=> ");
            let fg = multi.add(
                ProgressBar::new(0)
                    .with_style(style.clone())
                    .with_prefix("foreground"),
            );
            let bg = multi.add(
                ProgressBar::new(0)
                    .with_style(style)
                    .with_prefix("background"),
            );
            let phase = multi.add(ProgressBar::new_spinner());
            (multi, fg, bg, phase)
        });
        let mut last_line = String::new();
        let mut tick = tokio::time::interval(if terminal {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(1)
        });
        loop {
            let stop = tokio::select! {
                _ = tick.tick() => false,
                _ = stop_rx.changed() => true,
            };
            let fg_done = progress.foreground_done.load(Ordering::Relaxed);
            let fg_len = progress.foreground_planned.load(Ordering::Relaxed);
            let bg_done = progress.background_done.load(Ordering::Relaxed);
            let bg_len = progress.background_planned.load(Ordering::Relaxed);
            let parked = progress.parked.load(Ordering::Relaxed);
            let lost = progress.lost.load(Ordering::Relaxed);
            let fenced = progress.fenced.load(Ordering::Relaxed);
            match &bars {
                Some((_, fg, bg, phase)) => {
                    fg.set_length(fg_len as u64);
                    fg.set_position(fg_done as u64);
                    fg.set_message(if fenced > 0 {
                        format!("saves, {fenced} fenced")
                    } else {
                        "saves".to_string()
                    });
                    bg.set_length(bg_len as u64);
                    bg.set_position(bg_done as u64);
                    bg.set_message(if lost > 0 {
                        format!("propagations, {parked} parked, {lost} LOST")
                    } else {
                        format!("propagations, {parked} parked")
                    });
                    phase.set_message(progress.phase());
                    phase.tick();
                }
                None => {
                    let line = format!(
                        "[demo] {}: foreground {fg_done}/{fg_len}, background {bg_done}/{bg_len}, parked {parked}, lost {lost}, fenced {fenced}",
                        progress.phase()
                    );
                    if line != last_line {
                        eprintln!("{line}");
                        last_line = line;
                    }
                }
            }
            if stop {
                if let Some((multi, fg, bg, phase)) = bars {
                    fg.finish();
                    bg.finish();
                    phase.finish_and_clear();
                    let _ = multi.clear();
                }
                return;
            }
        }
    });
    (handle, stop_tx)
}

/// Runs `zkguard demo`.
pub async fn run(mut settings: Settings, args: DemoArgs) -> Result<u8, CliError> {
    let plan = args.plan();
    match args.deadletters {
        DeadLettersMode::Configured => {}
        DeadLettersMode::File => settings.retry.sink = DeadLetterSinkKind::File,
        DeadLettersMode::Elasticsearch => settings.retry.sink = DeadLetterSinkKind::Elasticsearch,
        DeadLettersMode::Kafka => settings.retry.sink = DeadLetterSinkKind::Kafka,
    }
    let configured = use_configured(args.servers, &settings);
    if configured
        && settings.retry.sink == DeadLetterSinkKind::Kafka
        && settings.retry.kafka.brokers.is_empty()
    {
        return Err(CliError::new(
            super::EX_CONFIG,
            "--deadletters kafka with configured servers needs deadletter.kafka.brokers (host:port,...); or run with --servers local to start a local broker",
        ));
    }
    let local = if configured {
        None
    } else {
        Some(start_local(&mut settings, args.json).await?)
    };
    let result = run_with(&settings, &plan, args.json).await;
    if let Some(local) = local {
        let LocalServers {
            _zk,
            _es,
            _kafka,
            dir,
        } = local;
        tokio::task::spawn_blocking(move || drop((_zk, _es, _kafka)))
            .await
            .ok();
        let parked_left = std::fs::read_to_string(dir.join("deadletters.jsonl"))
            .is_ok_and(|t| !t.trim().is_empty());
        if parked_left {
            eprintln!("dead letters of this run are kept in {}", dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    result
}

async fn run_with(settings: &Settings, plan: &DemoPlan, json: bool) -> Result<u8, CliError> {
    let store: Arc<dyn DocStore> = Arc::new(EsStore::new(&settings.elasticsearch)?);
    // The ZooKeeper session is kept to close it at the end (so that local servers stop after
    // the client said goodbye).
    let (locks, session): (Arc<dyn zkguard::LockService>, Option<zkguard::ZkSession>) =
        match settings.backend {
            LockBackendKind::ZooKeeper => {
                let session = zkguard::ZkSession::connect(&settings.zookeeper).await?;
                (
                    Arc::new(zkguard::ZkLockService::new(session.clone())),
                    Some(session),
                )
            }
            LockBackendKind::Elasticsearch => (super::lock_service(settings).await?, None),
        };
    let sink: Arc<dyn zkguard::write::deadletter::DeadLetterSink> =
        if settings.retry.sink == DeadLetterSinkKind::Kafka {
            let kafka = zkguard::write::deadletter::kafka::KafkaSink::new(
                &settings.retry.kafka,
                &settings.retry.file_path,
            );
            // An unreachable broker or a missing topic stops the demo before the workload.
            kafka.connect().await.map_err(|e| {
                let code = if e.is_config() {
                    super::EX_CONFIG
                } else {
                    EX_UNAVAILABLE
                };
                CliError::new(code, e)
            })?;
            Arc::new(kafka)
        } else {
            sink_from_settings(&settings.retry, Some(store.clone()))
                .map_err(|e| CliError::new(super::EX_CONFIG, e))?
        };
    let env = DemoEnv {
        store,
        locks,
        sink,
        settings: settings.clone(),
    };
    let progress = Arc::new(DemoProgress::default());
    let (ticker, stop) = spawn_progress(progress.clone(), json);
    let result = crate::workload::demo::run(&env, plan, &progress).await;
    let _ = stop.send(true);
    let _ = ticker.await;
    drop(env);
    if let Some(session) = session {
        session.close();
    }
    let report = result.map_err(|e| match &e {
        DemoError::Store { source, .. }
        | DemoError::Seed {
            source: zkguard::write::guarded::GuardedError::Store(source),
            ..
        } if source.is_transient() => CliError::new(EX_UNAVAILABLE, e),
        DemoError::Seed {
            source: zkguard::write::guarded::GuardedError::Lock(_),
            ..
        } => CliError::new(EX_UNAVAILABLE, e),
        _ => CliError::new(EX_SOFTWARE, e),
    })?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| CliError::new(EX_SOFTWARE, e))?
        );
    } else {
        println!("{report}");
    }
    let r = &report.reconciliation;
    let (mismatches, lost) = (r.mismatches.len(), r.lost);
    if mismatches + lost > 0 {
        let mut problems = Vec::new();
        if lost > 0 {
            problems.push(format!(
                "{lost} operations were lost: neither applied nor parked (LOST lines; their dead letters are on stderr)"
            ));
        }
        if mismatches > 0 {
            problems.push(format!("the reconciliation found {mismatches} mismatches"));
        }
        eprintln!("zkguard: {} (see the report)", problems.join("; "));
        Ok(EX_MISMATCH)
    } else if let Some(note) = r.unchecked.first() {
        eprintln!("zkguard: the demo's reconciliation is incomplete: {note} (see the report)");
        Ok(EX_UNAVAILABLE)
    } else {
        Ok(0)
    }
}
