//! What every command starts with: logging, and the lock service `lock.backend` selects.

use zkguard::config::Settings;

use crate::exit::CliError;

/// Logging to stderr; `-v` raises the level, `RUST_LOG` overrides. With `json` (a command given
/// `--json`) each log event is a JSON line, so that everything zkguard writes on stderr parses.
pub fn init_tracing(verbose: u8, quiet: bool, json: bool) {
    let default = match verbose {
        0 if quiet => "error",
        // The Kafka client warns about every reconnection attempt; zkguard reports the outcome.
        0 => "warn,rskafka=error",
        1 => "info,zkguard=info",
        2 => "info,zkguard=debug",
        _ => "debug,zkguard=trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    use std::io::IsTerminal;
    if json {
        let _ = tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
        return;
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Connects the lock service selected by `lock.backend`.
pub async fn lock_service(
    settings: &Settings,
) -> Result<std::sync::Arc<dyn zkguard::LockService>, CliError> {
    use zkguard::config::LockBackendKind;
    match settings.backend {
        LockBackendKind::ZooKeeper => {
            let session = zkguard::ZkSession::connect(&settings.zookeeper).await?;
            Ok(std::sync::Arc::new(zkguard::ZkLockService::new(session)))
        }
        LockBackendKind::Elasticsearch => {
            let store = zkguard::es::EsStore::new(&settings.elasticsearch)?;
            let service = zkguard::eslock::EsLockService::from_settings(
                settings,
                std::sync::Arc::new(store),
            )?;
            Ok(std::sync::Arc::new(service))
        }
    }
}

/// [`lock_service`], with its ZooKeeper session connected by `limit` (`zkguard exec`, whose
/// `--timeout` of `wait` covers connecting): past it, a connection loss naming the servers.
pub async fn lock_service_by(
    settings: &Settings,
    limit: std::time::Instant,
    wait: std::time::Duration,
) -> Result<std::sync::Arc<dyn zkguard::LockService>, CliError> {
    match tokio::time::timeout_at(limit.into(), lock_service(settings)).await {
        Ok(service) => service,
        Err(_) => Err(zkguard::LockError::ConnectionLoss {
            context: format!("connecting to ZooKeeper at {}", settings.zookeeper.servers),
            detail: format!(
                "no session within the timeout ({}ms) and {}ms more; check zookeeper.servers and that ZooKeeper is running",
                wait.as_millis(),
                zkguard::zk::DEADLINE_OVERRUN.as_millis()
            ),
        }
        .into()),
    }
}
