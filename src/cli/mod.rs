//! Subcommand implementations and the exit-status contract.

use zkguard::config::{ConfigError, Settings};
use zkguard::LockError;

use crate::{Cli, Command};

pub mod bench;
pub mod config;
pub mod demo;
pub mod dlq;
pub mod exec;
pub mod locks;
pub mod meta;
pub mod txn;

/// Bad usage (sysexits `EX_USAGE`).
pub const EX_USAGE: u8 = 64;
/// ZooKeeper/Elasticsearch unreachable, or the lock was lost (`EX_UNAVAILABLE`).
pub const EX_UNAVAILABLE: u8 = 69;
/// Internal error (`EX_SOFTWARE`).
pub const EX_SOFTWARE: u8 = 70;
/// Lock not acquired in time (`EX_TEMPFAIL`).
pub const EX_TEMPFAIL: u8 = 75;
/// Bad configuration (`EX_CONFIG`).
pub const EX_CONFIG: u8 = 78;

/// An error that ends the command with an exit status and one line on stderr.
#[derive(Debug)]
pub struct CliError {
    /// Exit status.
    pub code: u8,
    /// The line printed after `zkguard: `.
    pub message: String,
}

impl CliError {
    /// An error with a status.
    pub fn new(code: u8, message: impl std::fmt::Display) -> Self {
        Self {
            code,
            message: message.to_string().replace('\n', " "),
        }
    }
    /// Bad usage.
    pub fn usage(message: impl std::fmt::Display) -> Self {
        Self::new(EX_USAGE, message)
    }
}

impl CliError {
    /// A short name of the kind of error, from the exit status: `usage`, `data`, `unavailable`,
    /// `internal`, `timeout`, `config`, `not_runnable`, `not_found`, or `failed`.
    pub fn kind(&self) -> &'static str {
        match self.code {
            EX_USAGE => "usage",
            txn::EX_DATAERR => "data",
            EX_UNAVAILABLE => "unavailable",
            EX_SOFTWARE => "internal",
            EX_TEMPFAIL => "timeout",
            EX_CONFIG => "config",
            126 => "not_runnable",
            127 => "not_found",
            _ => "failed",
        }
    }
}

/// Prints `{"error": KIND, "message": TEXT}` as one line on stderr (the form of errors when
/// `--json` is given).
pub fn print_error_json(e: &CliError) {
    eprintln!(
        "{}",
        serde_json::json!({"error": e.kind(), "message": e.message})
    );
}

impl From<ConfigError> for CliError {
    fn from(e: ConfigError) -> Self {
        Self::new(EX_CONFIG, e)
    }
}

impl From<LockError> for CliError {
    fn from(e: LockError) -> Self {
        let code = match &e {
            LockError::Timeout { .. } => EX_TEMPFAIL,
            LockError::InvalidMonitor { .. } => EX_USAGE,
            LockError::MissingChroot { .. } => EX_CONFIG,
            _ => EX_UNAVAILABLE,
        };
        Self::new(code, e)
    }
}

impl From<zkguard::es::EsError> for CliError {
    fn from(e: zkguard::es::EsError) -> Self {
        Self::new(EX_UNAVAILABLE, e)
    }
}

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

/// Loads the configuration named by `--config`; prints its warnings on stderr.
pub fn settings(cli: &Cli) -> Result<Settings, CliError> {
    let settings = Settings::load(cli.config.as_deref())?;
    let json = cli.command.wants_json();
    for w in &settings.warnings {
        if json {
            eprintln!("{}", serde_json::json!({"warning": "config", "message": w}));
        } else {
            eprintln!("zkguard: warning: {w}");
        }
    }
    Ok(settings)
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

/// Runs a parsed command line; `Ok(status)` is the process exit status.
pub async fn run(cli: Cli) -> Result<u8, CliError> {
    // These read no configuration, or check it themselves.
    match &cli.command {
        Command::Config(args) => return config::run(&cli, args),
        Command::Completions(args) => return meta::completions(args),
        Command::Man => return meta::man(),
        _ => {}
    }
    let settings = settings(&cli)?;
    match cli.command {
        Command::Exec(args) => exec::run(settings, args).await,
        Command::Locks(args) => locks::run(settings, args).await,
        Command::Bench(args) => bench::run(settings, args).await,
        Command::Demo(args) => demo::run(settings, args).await,
        Command::Dlq(args) => dlq::run(settings, args).await,
        Command::Txn(args) => txn::run(settings, args).await,
        Command::Serve(args) => crate::server::run(settings, args).await,
        Command::Config(_) | Command::Completions(_) | Command::Man => Ok(0),
    }
}
