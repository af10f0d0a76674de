//! `zkguard serve`: the lock service as a long-running write gate with an HTTP/JSON API.
//!
//! One process holds one ZooKeeper session (or uses the Elasticsearch lease lock, per
//! `lock.backend`), one Elasticsearch client and one background executor, and serves:
//!
//! - `PUT|DELETE /v1/indices/{index}/docs/{id}`: guarded writes, foreground (answered when
//!   done) or background (answered 202 once journaled);
//! - `POST /v1/bulk`: NDJSON background operations, one journal batch;
//! - `GET /v1/operations/{id}`: queued, applied, rejected or parked;
//! - `GET /healthz`, `GET /readyz`, `GET /metrics`.
//!
//! At start it prints one JSON line on stdout with the address it listens on. SIGTERM (or
//! SIGINT) stops accepting, lets in-flight requests finish for `server.drain.timeout`, leaves
//! unfinished background operations in the journal, releases the locks and exits 0.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use zkguard::config::{LockBackendKind, Settings};
use zkguard::es::{DocStore, EsStore};
use zkguard::write::guarded::GuardedWriter;

use crate::cli::{CliError, EX_CONFIG, EX_SOFTWARE, EX_UNAVAILABLE};

mod errors;
mod journal;
mod metrics;
mod routes;
mod state;

use state::{AppState, Backend};

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

/// Runs the service until SIGTERM or SIGINT; `Ok(0)` after a clean shutdown.
///
/// # Errors
/// Configuration (78), journal in use or unreadable (78 / 70), lock backend or Elasticsearch
/// unreachable at start (69), address in use (69).
pub async fn run(settings: Settings, args: ServeArgs) -> Result<u8, CliError> {
    let listen = args.listen.unwrap_or(settings.server.listen);
    let (journal, pending) =
        journal::Journal::open(&settings.server.journal_path).map_err(|e| match e {
            journal::JournalError::InUse { .. } => CliError::new(EX_CONFIG, e),
            journal::JournalError::Io { .. } => CliError::new(EX_SOFTWARE, e),
        })?;

    let store = Arc::new(EsStore::new(&settings.elasticsearch)?);
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
                &settings,
                store.clone() as Arc<dyn DocStore>,
            )?;
            (Arc::new(service), Backend::Elasticsearch)
        }
    };
    let doc_store: Arc<dyn DocStore> = store.clone();
    let writer = GuardedWriter::new(locks.clone(), doc_store.clone());
    let sink = zkguard::write::deadletter::sink_from_settings(&settings.retry, Some(doc_store))
        .map_err(|e| CliError::new(EX_CONFIG, e))?;
    let executor = zkguard::write::background::BackgroundExecutor::from_settings(
        writer.clone(),
        sink,
        &settings,
    );

    let (state, queue) = AppState::new(
        writer,
        executor,
        journal.clone(),
        backend,
        store,
        settings.server.clone(),
        settings.zookeeper.timeout(zkguard::LockType::Foreground),
    );
    if let Err(problem) = state.ping_es().await {
        return Err(CliError::new(
            EX_UNAVAILABLE,
            format!("{problem}; check elasticsearch.url and that the server runs"),
        ));
    }

    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        CliError::new(
            EX_UNAVAILABLE,
            format!(
                "cannot listen on {listen}: {e}; choose another --listen address or server.listen"
            ),
        )
    })?;
    let bound = listener
        .local_addr()
        .map_err(|e| CliError::new(EX_SOFTWARE, e))?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let replayed = pending.len();
    state.enqueue(pending);
    let dispatcher = tokio::spawn(state::dispatch(state.clone(), queue, stop_rx.clone()));
    let monitor = tokio::spawn(state::monitor(state.clone(), stop_rx.clone()));

    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| CliError::new(EX_SOFTWARE, e))?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| CliError::new(EX_SOFTWARE, e))?;

    let app = routes::router(state.clone());
    let mut server_stop = stop_rx.clone();
    let mut server = tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = server_stop.changed().await;
            })
            .into_future(),
    );

    let started = serde_json::json!({
        "listening": bound.to_string(),
        "backend": locks.backend_name(),
        "journal": journal.path().display().to_string(),
        "replayed": replayed,
    });
    println!("{started}");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    if !bound.ip().is_loopback() {
        tracing::warn!(%bound, "listening beyond loopback without authentication: every client that reaches this address can write");
    }
    tracing::info!(%bound, replayed, backend = locks.backend_name(), "zkguard serve started");

    let early = tokio::select! {
        _ = sigterm.recv() => None,
        _ = sigint.recv() => None,
        r = &mut server => Some(r),
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
    state.draining.store(true, Ordering::Release);
    let _ = stop_tx.send(true);
    if tokio::time::timeout(state.settings.drain_timeout, &mut server)
        .await
        .is_err()
    {
        tracing::warn!("requests still running after server.drain.timeout; abandoning them (their locks are released)");
        server.abort();
    }
    let _ = dispatcher.await;
    let _ = monitor.await;
    let stopped = state.stop_running(Duration::from_secs(5)).await;
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
    drop(locks);
    tracing::info!("zkguard serve stopped");
    Ok(0)
}
