//! `zkguard serve`: the lock service as a long-running write gate with an HTTP/JSON API.
//!
//! One process holds one ZooKeeper session (or uses the Elasticsearch lease lock, per
//! `lock.backend`), one Elasticsearch client and one background executor, and serves:
//!
//! - `PUT|DELETE /v1/indices/{index}/docs/{id}`: guarded writes, foreground (answered when
//!   done) or background (answered 202 once journaled);
//! - `POST /v1/bulk`: NDJSON background operations, one journal batch;
//! - `GET /v1/operations/{id}`: queued, applied, rejected or parked;
//! - `/v1/deadletters`, `/v1/transfers`: dead letters (list, replay) and 2PC transfers;
//! - `/v1/locks`: explicit locks (take, keep alive, release, list) for callers that write
//!   themselves;
//! - `GET /v1/events`: the lock events (acquired, released, lost, applied, rejected, parked) as
//!   server-sent events;
//! - `GET /ui`: the status page (locks, journal, dead letters, recent events);
//! - `GET /healthz`, `GET /readyz`, `GET /metrics`.
//!
//! At start it prints one JSON line on stdout with the address it listens on. SIGTERM (or
//! SIGINT) stops accepting, lets in-flight requests finish for `server.drain.timeout`, leaves
//! unfinished background operations in the journal, releases the locks and exits 0.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use zkguard::config::{LockBackendKind, Settings};
use zkguard::es::{DocStore, EsStore};
use zkguard::write::guarded::GuardedWriter;

use crate::exit::{CliError, EX_CONFIG, EX_DATAERR, EX_SOFTWARE, EX_UNAVAILABLE};

mod access;
mod admin;
mod bulk_route;
mod conns;
mod errors;
mod events;
mod gateway;
mod hub;
mod journal;
pub mod journal_cmd;
mod lock_routes;
mod locks;
mod metrics;
mod notify;
mod openapi;
mod params;
mod partition_metrics;
mod routes;
mod startup;
mod state;
mod txn_routes;
mod ui;
mod ui_cache;
mod write_routes;

use state::{AppState, Backend};

/// Background operations in flight (the executor's concurrency).
pub const BACKGROUND_IN_FLIGHT: usize = 2048;
/// Background operations of one monitor applied under one lock acquisition, at most.
pub const BACKGROUND_PER_LOCK: usize = 32;
/// Writes in one `_bulk` request, at most.
pub const BACKGROUND_PER_BULK: usize = 1024;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Arguments of `zkguard serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (default: server.listen, 127.0.0.1:7717); port 0 picks a free port.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Log format on stderr.
    #[arg(long, value_name = "FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

/// Logging on stderr for the service: `info` by default (`-v` for more, `RUST_LOG` overrides),
/// as text or JSON lines.
pub fn init_tracing(verbose: u8, format: LogFormat) {
    let default = match verbose {
        0 => "warn,zkguard=info",
        1 => "info,zkguard=debug",
        _ => "debug,zkguard=trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => {
            use std::io::IsTerminal;
            builder
                .with_ansi(std::io::stderr().is_terminal())
                .try_init()
        }
    };
}

/// The OpenAPI 3.1 document of the HTTP API, as pretty JSON (`zkguard openapi`; the service
/// serves the same at `GET /openapi.json`).
pub fn openapi_document() -> String {
    routes::pretty(&routes::document())
}

/// Runs the service until SIGTERM or SIGINT; `Ok(0)` after a clean shutdown.
///
/// Elasticsearch unreachable at start is not an error: the service starts, reports not ready
/// and waits for the cluster ([`startup::reach_elasticsearch`]).
///
/// # Errors
/// Configuration (78), journal in use or unreadable (78 / 70), the ZooKeeper lock backend
/// unreachable at start (69), address in use (69).
pub async fn run(settings: Settings, args: ServeArgs) -> Result<u8, CliError> {
    ignore_file_size_signal();
    let listen = args.listen.unwrap_or(settings.server.listen);
    let (journal, pending) = open_journal(&settings)?;
    let tokens = Arc::new(
        access::Tokens::load(settings.server.auth_tokens_file.as_deref())
            .map_err(|e| CliError::new(EX_CONFIG, e))?,
    );
    for w in tokens.warnings() {
        eprintln!("zkguard: warning: {w}");
    }
    let tls = match &settings.server.tls {
        Some((cert, key)) => {
            Some(access::acceptor(cert, key).map_err(|e| CliError::new(EX_CONFIG, e))?)
        }
        None => None,
    };
    let (state, queue, locks) = assemble(&settings, journal.clone()).await?;
    let listeners = Listeners::bind(listen, &state, &tokens, &settings).await?;
    let (bound, gate_bound) = (listeners.bound, listeners.gate_bound);
    if kafka_journal(&settings) {
        let store: Arc<dyn DocStore> = state.store.clone();
        let fleet = connect_fleet(&settings, &state, locks.clone(), store, bound).await?;
        tracing::info!(
            topic = fleet.topic(),
            instance = fleet.instance(),
            "background operations are journaled in Kafka"
        );
        state.set_fleet(fleet);
    }
    let gate = listeners.gate.as_ref().map(|(_, g)| g.clone());
    // One attempt now: with a cluster that answers, the service is ready from its first request.
    if let Err(problem) = startup::attempt(&state, gate.as_deref()).await {
        tracing::warn!(%problem, "Elasticsearch does not answer at start: the service starts not ready (/readyz answers 503) and tries again until it answers; check elasticsearch.url and that the cluster runs");
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    let replayed = pending.len();
    // Queued now, started by the dispatcher once Elasticsearch has answered.
    state.enqueue(pending);
    let dispatcher = tokio::spawn(state::dispatch(state.clone(), queue, stop_rx.clone()));
    let monitor = tokio::spawn(state::monitor(state.clone(), stop_rx.clone()));
    let fleet_owner = state.fleet().cloned().map(|fleet| {
        let (state, mut stop) = (state.clone(), stop_rx.clone());
        tokio::spawn(async move {
            if state.elasticsearch_reached(&mut stop).await {
                journal::kafka::owner::run(fleet, state, stop).await;
            }
        })
    });
    let txn_recovery = tokio::spawn(txn_routes::recovery(state.clone(), stop_rx.clone()));

    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| CliError::new(EX_SOFTWARE, e))?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| CliError::new(EX_SOFTWARE, e))?;
    let reloader = spawn_reloader(tokens.clone(), stop_rx.clone())?;
    let mut servers = listeners.serve(&state, &tokens, tls.as_ref(), &stop_rx);

    let mut started = serde_json::json!({
        "listening": bound.to_string(),
        "backend": locks.backend_name(),
        "journal": journal.path().display().to_string(),
        "replayed": replayed,
        "tls": tls.is_some(),
        "auth": tokens.enabled(),
    });
    if let Some(g) = gate_bound {
        started["gateway"] = serde_json::json!(g.to_string());
        tracing::info!(gateway = %g, guarded = ?state.settings.gateway.indices.as_slice(), "Elasticsearch-compatible gate listening: document writes to guarded indices are locked and fenced, everything else passes through");
    }
    println!("{started}");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let notifier = notify_started(&state, bound, replayed);
    let startup = {
        let (state, stop, notifier) = (state.clone(), stop_rx.clone(), notifier.clone());
        tokio::spawn(async move {
            let waited = state.start_problem().is_some();
            if startup::reach_elasticsearch(state, gate, stop).await && waited {
                notifier.send(&format!(
                    "STATUS=listening on {bound}, {replayed} operations replayed from the journal"
                ));
            }
        })
    };
    let watchdog = spawn_watchdog(&notifier, &stop_rx);
    log_access(&tokens, bound);
    tracing::info!(%bound, replayed, max_connections = servers.max_connections, backend = locks.backend_name(), "zkguard serve started");

    let (api_server, gate_server) = (&mut servers.api, &mut servers.gate);
    let gate_done = async {
        match gate_server.as_mut() {
            Some(g) => g.await,
            None => std::future::pending().await,
        }
    };
    let early = tokio::select! {
        _ = sigterm.recv() => None,
        _ = sigint.recv() => None,
        r = api_server => Some(r),
        r = gate_done => Some(r),
    };
    if let Some(r) = early {
        let _ = stop_tx.send(true);
        let detail = match r {
            Ok(Ok(())) => "the server stopped".to_string(),
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        return Err(CliError::new(
            EX_SOFTWARE,
            format!("the HTTP server failed: {detail}"),
        ));
    }

    tracing::info!(
        drain_ms = state.settings.drain_timeout.as_millis() as u64,
        "shutting down: no new requests, in-flight ones may finish"
    );
    notifier.send("STOPPING=1\nSTATUS=shutting down: draining requests");
    state.draining.store(true, Ordering::Release);
    // Event streams never finish on their own: they end now, so they do not hold up the drain.
    state.events.close();
    let _ = stop_tx.send(true);
    servers.drain(state.settings.drain_timeout).await;
    let released = state.explicit.release_all(Duration::from_secs(5)).await;
    if released > 0 {
        tracing::info!(released, "explicit locks released");
    }
    let _ = reloader.await;
    if let Some(w) = watchdog {
        let _ = w.await;
    }
    startup.abort();
    let _ = dispatcher.await;
    let _ = monitor.await;
    if let Some(owner) = fleet_owner {
        let _ = owner.await;
    }
    txn_recovery.abort();
    finish(state, &journal).await;
    drop(locks);
    tracing::info!("zkguard serve stopped");
    Ok(0)
}

/// Under a file-size limit (ulimit -f) a write beyond it fails with EFBIG, which the journal
/// reports and survives, instead of SIGXFSZ killing the service.
fn ignore_file_size_signal() {
    // SAFETY: ignoring a signal installs no handler code.
    unsafe {
        let _ = nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGXFSZ,
            nix::sys::signal::SigHandler::SigIgn,
        );
    }
}

/// Opens the journal (`server.journal.*`) with its limits: the journal and the operations it
/// holds from the last run. In use or unreadable, it is the service's configuration (78), its
/// data (65) or the machine (70) that is wrong.
fn open_journal(
    settings: &Settings,
) -> Result<(Arc<journal::Journal>, Vec<zkguard::write::ops::Operation>), CliError> {
    let (journal, pending) = if kafka_journal(settings) {
        // The operations are records of the topic: the table is in memory, and the partitions'
        // owners load what they read.
        let name = format!("kafka:{}", settings.server.journal_kafka.topic);
        (
            journal::Journal::in_memory(std::path::Path::new(&name)),
            Vec::new(),
        )
    } else {
        journal::Journal::open(
            &settings.server.journal_path,
            settings.server.journal_skip_corrupt,
        )
        .map_err(|e| match e {
            journal::JournalError::InUse { .. } => CliError::new(EX_CONFIG, e),
            journal::JournalError::Corrupt { .. } => CliError::new(EX_DATAERR, e),
            journal::JournalError::Io { .. }
            | journal::JournalError::Full { .. }
            | journal::JournalError::Broker { .. } => CliError::new(EX_SOFTWARE, e),
        })?
    };
    journal.set_limits(journal::Limits {
        operations: settings.server.queue_max,
        bytes: settings.server.queue_max_bytes,
        file_bytes: settings.server.journal_max_bytes,
    });
    Ok((journal, pending))
}

/// Builds the library's parts the service runs on (the document store, the lock backend, the
/// guarded writer, the background executor and its dead-letter sink, the transactions) and
/// the service's state over them: the state, its queue's receiving end, and the lock service.
async fn assemble(
    settings: &Settings,
    journal: Arc<journal::Journal>,
) -> Result<
    (
        Arc<AppState>,
        state::QueueReceiver,
        Arc<dyn zkguard::LockService>,
    ),
    CliError,
> {
    // EsStore::new reaches nothing: what it refuses (URLs, credentials, TLS files) is configuration.
    let store =
        Arc::new(EsStore::new(&settings.elasticsearch).map_err(|e| CliError::new(EX_CONFIG, e))?);
    let (locks, backend): (Arc<dyn zkguard::LockService>, Backend) = match settings.backend {
        LockBackendKind::ZooKeeper => {
            let session = zkguard::ZkSession::connect(&settings.zookeeper).await?;
            (
                Arc::new(zkguard::ZkLockService::new(session.clone())),
                Backend::ZooKeeper(session),
            )
        }
        LockBackendKind::Elasticsearch => {
            let service = zkguard::eslock::EsLockService::from_settings(
                settings,
                store.clone() as Arc<dyn DocStore>,
            )?;
            (Arc::new(service.clone()), Backend::Elasticsearch(service))
        }
    };
    let doc_store: Arc<dyn DocStore> = store.clone();
    let transactions = std::sync::Arc::new(
        zkguard::txn::multi::Transactions::new(
            locks.clone(),
            doc_store.clone(),
            settings.txn.clone(),
        )
        .with_retry(zkguard::txn::RetryPolicy::from_settings(&settings.retry))
        .with_stamp_settings(&settings.stamp)
        .with_stop_hook_for_tests(),
    );
    // A document found with a stopped transaction's mark is decided before a write builds on
    // it (src/write/marks.rs).
    let writer = GuardedWriter::new(locks.clone(), doc_store.clone())
        .with_stamp_settings(&settings.stamp)
        .with_mark_resolver(transactions.clone());
    let sink =
        zkguard::write::deadletter::sink_from_settings(&settings.retry, Some(doc_store.clone()))
            .map_err(|e| CliError::new(EX_CONFIG, e))?;
    // Background operations are grouped by monitor and written in shared bulk requests, with
    // enough of them in flight to fill those requests.
    let executor = zkguard::write::background::BackgroundExecutor::builder(writer.clone(), sink)
        .retry(&settings.retry)
        .concurrency(BACKGROUND_IN_FLIGHT)
        .batch_by_monitor(BACKGROUND_PER_LOCK, BACKGROUND_PER_BULK)
        .build();

    let coordinator = zkguard::txn::Coordinator::new(doc_store.clone(), settings.txn.clone())
        .with_retry(zkguard::txn::RetryPolicy::from_settings(&settings.retry))
        .with_lock_service(locks.clone());
    let (state, queue) = AppState::new(
        writer,
        executor,
        journal,
        backend,
        store,
        settings.server.clone(),
        settings.zookeeper.timeout(zkguard::LockType::Foreground),
        settings.zookeeper.timeout(zkguard::LockType::Background),
        coordinator,
        transactions,
    );
    Ok((state, queue, locks))
}

/// The service's listening sockets: the API's and, with the gate on, the gate's.
struct Listeners {
    api: tokio::net::TcpListener,
    bound: SocketAddr,
    gate: Option<(tokio::net::TcpListener, Arc<gateway::Gateway>)>,
    gate_bound: Option<SocketAddr>,
}

/// The servers running on [`Listeners`].
struct Servers {
    api: tokio::task::JoinHandle<std::io::Result<()>>,
    gate: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    /// The API's connection limit (fitted to the open-files limit).
    max_connections: usize,
}

impl Listeners {
    /// Binds `listen` and, with `server.gateway.listen` set, the gate's address (the gate
    /// built then). An address in use is unavailable (69), a gate that cannot start is
    /// configuration (78).
    async fn bind(
        listen: SocketAddr,
        state: &Arc<AppState>,
        tokens: &Arc<access::Tokens>,
        settings: &Settings,
    ) -> Result<Self, CliError> {
        let api = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
            CliError::new(
                EX_UNAVAILABLE,
                format!(
                    "cannot listen on {listen}: {e}; choose another --listen address or server.listen"
                ),
            )
        })?;
        let bound = api
            .local_addr()
            .map_err(|e| CliError::new(EX_SOFTWARE, e))?;
        state.ui.set_listening(bound.to_string());
        let gate = match state.settings.gateway.listen {
            Some(addr) => {
                let l = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                    CliError::new(
                        EX_UNAVAILABLE,
                        format!("cannot listen on {addr} for the gate: {e}; choose another server.gateway.listen address"),
                    )
                })?;
                let gate = gateway::Gateway::new(
                    state.clone(),
                    tokens.clone(),
                    &settings.elasticsearch,
                )
                .map_err(|e| CliError::new(EX_CONFIG, format!("the gate cannot start: {e}")))?;
                Some((l, std::sync::Arc::new(gate)))
            }
            None => None,
        };
        let gate_bound = match &gate {
            Some((l, _)) => Some(l.local_addr().map_err(|e| CliError::new(EX_SOFTWARE, e))?),
            None => None,
        };
        Ok(Self {
            api,
            bound,
            gate,
            gate_bound,
        })
    }

    /// Serves the API (and the gate) until `stop`. With the gate on, the two addresses'
    /// connections are fitted to the open-files limit together.
    fn serve(
        self,
        state: &Arc<AppState>,
        tokens: &Arc<access::Tokens>,
        tls: Option<&tokio_rustls::TlsAcceptor>,
        stop: &watch::Receiver<bool>,
    ) -> Servers {
        let app = routes::router(state.clone(), tokens.clone());
        let (connections, gate_connections) = if self.gate.is_some() {
            let (api, gate) = conns::Connections::pair(
                state.settings.max_connections,
                state.settings.header_timeout,
                state.metrics.clone(),
            );
            (Arc::new(api), Some(Arc::new(gate)))
        } else {
            let api = conns::Connections::new(
                state.settings.max_connections,
                state.settings.header_timeout,
                state.metrics.clone(),
            );
            (Arc::new(api), None)
        };
        let max_connections = connections.max();
        let api = tokio::spawn(conns::serve(
            self.api,
            tls.cloned(),
            app,
            connections,
            stop.clone(),
        ));
        let gate = self
            .gate
            .zip(gate_connections)
            .map(|((l, gate), connections)| {
                tokio::spawn(conns::serve(
                    l,
                    tls.cloned(),
                    gateway::router(gate),
                    connections,
                    stop.clone(),
                ))
            });
        Servers {
            api,
            gate,
            max_connections,
        }
    }
}

impl Servers {
    /// Lets the requests in flight finish for `drain` (the gate's for a second), then abandons
    /// them (their locks are released).
    async fn drain(&mut self, drain: Duration) {
        if tokio::time::timeout(drain, &mut self.api).await.is_err() {
            tracing::warn!("requests still running after server.drain.timeout; abandoning them (their locks are released)");
            self.api.abort();
        }
        if let Some(g) = self.gate.as_mut() {
            if tokio::time::timeout(Duration::from_secs(1), &mut *g)
                .await
                .is_err()
            {
                g.abort();
            }
        }
    }
}

/// Reloads the bearer tokens on SIGHUP until `stop`.
fn spawn_reloader(
    tokens: Arc<access::Tokens>,
    mut stop: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<()>, CliError> {
    let mut sighup = signal(SignalKind::hangup()).map_err(|e| CliError::new(EX_SOFTWARE, e))?;
    Ok(tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = sighup.recv() => {}
                _ = stop.changed() => return,
            }
            if !tokens.enabled() {
                tracing::info!(
                    "SIGHUP: no server.auth.tokens.file is configured; nothing to reload"
                );
                continue;
            }
            match tokens.reload() {
                Ok(n) => tracing::info!(tokens = n, "SIGHUP: bearer tokens reloaded"),
                Err(e) => {
                    tracing::error!(error = %e, "SIGHUP: the bearer tokens were not reloaded; the previous ones stay in use")
                }
            }
        }
    }))
}

/// Tells systemd (Type=notify) that the service started: the journal replayed and the
/// listeners bound (with Elasticsearch not answering yet, STATUS says so until it does).
fn notify_started(state: &AppState, bound: SocketAddr, replayed: usize) -> notify::Notifier {
    let notifier = notify::Notifier::from_env();
    let status = match state.start_problem() {
        None => format!("listening on {bound}, {replayed} operations replayed from the journal"),
        Some(_) => format!(
            "listening on {bound}, not ready: waiting for Elasticsearch at {}",
            state.store.urls()
        ),
    };
    notifier.send(&format!(
        "READY=1\nSTATUS={status}\nMAINPID={}",
        std::process::id()
    ));
    notifier
}

/// Pings systemd's watchdog while the runtime runs, when systemd asked for it.
fn spawn_watchdog(
    notifier: &notify::Notifier,
    stop: &watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    notify::watchdog_interval()
        .filter(|_| notifier.enabled())
        .map(|every| {
            let mut stop = stop.clone();
            let pings = notifier.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                loop {
                    tokio::select! {
                        _ = tick.tick() => pings.send("WATCHDOG=1"),
                        _ = stop.changed() => return,
                    }
                }
            })
        })
}

/// Says who may write: bearer tokens, loopback only, or (a warning) anyone who reaches the
/// address.
fn log_access(tokens: &access::Tokens, bound: SocketAddr) {
    if tokens.enabled() {
        tracing::info!(
            "bearer tokens required on /v1 (server.auth.tokens.file; SIGHUP reloads it)"
        );
    } else if bound.ip().is_loopback() {
        tracing::info!(%bound, "no bearer tokens configured (server.auth.tokens.file): listening on loopback only, so only this host can write");
    } else {
        tracing::warn!(%bound, "listening beyond loopback without authentication: every client that reaches this address can write; set server.auth.tokens.file");
    }
}

/// The end of a shutdown, once the servers and the tasks stopped: stops the background
/// operations (left in the journal for the next start), records the outcomes of applied ones,
/// and closes the ZooKeeper session, which deletes whatever it still had queued.
async fn finish(state: Arc<AppState>, journal: &Arc<journal::Journal>) {
    let stopped = state.stop_running(Duration::from_secs(5)).await;
    if state.journal.problem().is_some() {
        if let Err(e) = journal.checkpoint().await {
            tracing::error!(error = %e, "outcomes of applied operations could not be recorded in the journal: those operations run again at the next start (each is recognised by its document while the document remembers its id)");
        }
    }
    tracing::info!(
        left_in_journal = journal.depth(),
        stopped,
        "background operations left in the journal for the next start"
    );
    if let Backend::ZooKeeper(session) = &state.backend {
        // Every guard is gone: closing the session deletes whatever it still had queued.
        if !session.close_and_wait(Duration::from_secs(5)).await {
            tracing::warn!(
                "the ZooKeeper session did not close in time; its nodes go when it expires"
            );
        }
    }
    drop(state);
}

/// Whether accepted background operations go to Kafka (`server.journal.backend=kafka`).
fn kafka_journal(settings: &Settings) -> bool {
    settings.server.journal_backend == zkguard::config::JournalBackendKind::Kafka
}

/// Connects the Kafka journal (`server.journal.backend=kafka`): exits 78 for a topic with
/// another partition count, 69 when the brokers or the index cannot be reached.
async fn connect_fleet(
    settings: &Settings,
    state: &Arc<AppState>,
    locks: Arc<dyn zkguard::LockService>,
    store: Arc<dyn DocStore>,
    bound: std::net::SocketAddr,
) -> Result<Arc<journal::kafka::KafkaJournal>, CliError> {
    let Backend::ZooKeeper(session) = &state.backend else {
        return Err(CliError::new(
            EX_CONFIG,
            "server.journal.backend=kafka needs lock.backend=zookeeper",
        ));
    };
    let instance = match settings.server.instance_id.as_str() {
        "" => format!("{}:{}", session.host(), bound.port()),
        id => id.to_string(),
    };
    journal::kafka::KafkaJournal::connect(
        &settings.server.journal_kafka,
        instance,
        state.journal.clone(),
        store,
        session.clone(),
        locks,
        settings.server.queue_max,
    )
    .await
    .map_err(|e| match e {
        journal::kafka::KafkaJournalError::Partitions { .. } => CliError::new(EX_CONFIG, e),
        _ => CliError::new(EX_UNAVAILABLE, e),
    })
}

/// Fault injection for zkguard's own tests, honoured by debug builds only (release builds
/// ignore it): with `ZKGUARD_TEST_HOOK_TXN_STOP=N@POINT` (N >= 1, POINT as `zkguard txn apply
/// --pause-after` takes it: `committed`, `applied:1`, ...) every N-th document transaction's
/// coordinator stops at POINT, as one killed there whose session ended: its locks go, its log
/// and marks are left for the writers that find them and for recovery.
trait StopHookForTests {
    fn with_stop_hook_for_tests(self) -> Self;
}

impl StopHookForTests for zkguard::txn::multi::Transactions {
    fn with_stop_hook_for_tests(self) -> Self {
        let Some(spec) = std::env::var("ZKGUARD_TEST_HOOK_TXN_STOP")
            .ok()
            .filter(|_| cfg!(debug_assertions))
        else {
            return self;
        };
        let parsed = spec.split_once('@').and_then(|(every, point)| {
            Some((every.parse::<u64>().ok()?.max(1), point.parse().ok()?))
        });
        match parsed {
            Some((every, point)) => self.with_hook(Arc::new(StopEvery {
                every,
                point,
                seen: std::sync::atomic::AtomicU64::new(0),
            })),
            None => panic!("ZKGUARD_TEST_HOOK_TXN_STOP={spec}: expected N@POINT, e.g. 3@committed"),
        }
    }
}

/// Stops every `every`-th transaction that reaches `point` there.
struct StopEvery {
    every: u64,
    point: zkguard::txn::multi::Point,
    seen: std::sync::atomic::AtomicU64,
}

#[async_trait::async_trait]
impl zkguard::txn::multi::MultiHook for StopEvery {
    fn intervenes(&self, point: zkguard::txn::multi::Point) -> bool {
        point == self.point
    }

    async fn stop_at(&self, _id: &str, point: zkguard::txn::multi::Point) -> bool {
        point == self.point && self.seen.fetch_add(1, Ordering::Relaxed) % self.every == 0
    }
}
