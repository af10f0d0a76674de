//! The exit-status contract: the sysexits statuses and the error that ends a command with one.

use zkguard::config::ConfigError;
use zkguard::LockError;

/// Bad usage (sysexits `EX_USAGE`).
pub const EX_USAGE: u8 = 64;
/// ZooKeeper/Elasticsearch unreachable, or the lock was lost (`EX_UNAVAILABLE`).
pub const EX_UNAVAILABLE: u8 = 69;
/// Internal error (`EX_SOFTWARE`).
pub const EX_SOFTWARE: u8 = 70;
/// Bad input data (sysexits `EX_DATAERR`): a rejected transfer, an unknown transaction, ...
pub const EX_DATAERR: u8 = 65;
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
            EX_DATAERR => "data",
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
            LockError::MissingChroot { .. } | LockError::LockRootAcl { .. } => EX_CONFIG,
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
