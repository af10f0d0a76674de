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

/// One exit status of zkguard: the code, its sysexits name, the kind of error `--json` names and
/// what it means. The man page's EXIT STATUS and `docs/reference/exit-status.md` are generated
/// from [`EXIT_STATUSES`], and [`CliError::kind`] reads its kinds from it.
pub struct ExitStatus {
    /// The status; `None`: any other status (the command's own, for `zkguard exec`).
    pub code: Option<u8>,
    /// The sysexits name (`EX_USAGE`), when it has one.
    pub name: &'static str,
    /// The `error` of a `--json` error line ending with this status (`None` for success).
    pub kind: Option<&'static str>,
    /// What it means, and which commands end with it.
    pub meaning: &'static str,
}

/// Every exit status of zkguard, in order.
pub const EXIT_STATUSES: &[ExitStatus] = &[
    ExitStatus {
        code: Some(0),
        name: "",
        kind: None,
        meaning: "success; `zkguard serve` and `zkguard txn recover` after a clean stop (SIGTERM or SIGINT); `zkguard locks --clear-stray` with nothing to clear",
    },
    ExitStatus {
        code: Some(1),
        name: "",
        kind: Some("failed"),
        meaning: "`zkguard demo`: an operation was lost, or the report and the reconciliation disagree; `zkguard txn audit`: an anomaly, or a total other than `--expect-total`",
    },
    ExitStatus {
        code: Some(EX_USAGE),
        name: "EX_USAGE",
        kind: Some("usage"),
        meaning: "bad usage: an unknown option, a missing or malformed value, an invalid monitor name, a duration over 7d, an unknown dead-letter id",
    },
    ExitStatus {
        code: Some(EX_DATAERR),
        name: "EX_DATAERR",
        kind: Some("data"),
        meaning: "bad data: the request cannot be carried out as given (a rejected or rolled-back transfer, an id used by another transaction, an unknown transaction, the rollback of a committed one, accounts that exist already, a malformed document, a document transaction rolled back because an expectation failed); `zkguard serve`: a damaged journal (see `server.journal.skip.corrupt`)",
    },
    ExitStatus {
        code: Some(EX_UNAVAILABLE),
        name: "EX_UNAVAILABLE",
        kind: Some("unavailable"),
        meaning: "unavailable: ZooKeeper, Elasticsearch or Kafka unreachable, an address in use, or the lock lost while `zkguard exec`'s command ran (the command got SIGTERM, then SIGKILL after `--kill-after`); `zkguard demo`: the reconciliation could not check everything; `zkguard serve` waits for an Elasticsearch unreachable at start instead (not ready until it answers)",
    },
    ExitStatus {
        code: Some(EX_SOFTWARE),
        name: "EX_SOFTWARE",
        kind: Some("internal"),
        meaning: "internal error of zkguard (a panic: `zkguard exec`'s command is stopped and the lock given up)",
    },
    ExitStatus {
        code: Some(EX_TEMPFAIL),
        name: "EX_TEMPFAIL",
        kind: Some("timeout"),
        meaning: "temporary failure, try again later: the lock was not acquired in time, or at once with `--timeout 0` (the message names the holder, the queue ahead or a stray mutex node); dead letters stay parked after a replay; a document transaction rolled back because a lock was not free in time; `zkguard txn`: an interruption injected for a demonstration, too much contention, `recover --once` with failures",
    },
    ExitStatus {
        code: Some(EX_CONFIG),
        name: "EX_CONFIG",
        kind: Some("config"),
        meaning: "bad configuration: the message names the key, the value and the file or variable; also an unreadable `--config` file, a chroot in `zookeeper.servers` missing on the server, a lock root with another ACL, a missing Kafka topic with `deadletter.kafka.auto.create=false`",
    },
    ExitStatus {
        code: Some(126),
        name: "",
        kind: Some("not_runnable"),
        meaning: "`zkguard exec`: the command could not be run",
    },
    ExitStatus {
        code: Some(127),
        name: "",
        kind: Some("not_found"),
        meaning: "`zkguard exec`: the command was not found",
    },
    ExitStatus {
        code: None,
        name: "",
        kind: Some("failed"),
        meaning: "`zkguard exec`: the command's own status (128+N when it died of signal N)",
    },
];

impl CliError {
    /// A short name of the kind of error, from the exit status (see [`EXIT_STATUSES`]):
    /// `usage`, `data`, `unavailable`, `internal`, `timeout`, `config`, `not_runnable`,
    /// `not_found`, or `failed`.
    pub fn kind(&self) -> &'static str {
        EXIT_STATUSES
            .iter()
            .find(|s| s.code == Some(self.code))
            .and_then(|s| s.kind)
            .unwrap_or("failed")
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
            LockError::InvalidMonitor { .. } | LockError::InfoTooLong { .. } => EX_USAGE,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_the_exit_statuses() {
        for (code, kind) in [
            (EX_USAGE, "usage"),
            (EX_DATAERR, "data"),
            (EX_UNAVAILABLE, "unavailable"),
            (EX_SOFTWARE, "internal"),
            (EX_TEMPFAIL, "timeout"),
            (EX_CONFIG, "config"),
            (126, "not_runnable"),
            (127, "not_found"),
            (1, "failed"),
            (3, "failed"),
        ] {
            assert_eq!(CliError::new(code, "x").kind(), kind, "{code}");
        }
    }
}
