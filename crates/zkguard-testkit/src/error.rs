//! [`ServerError`], what goes wrong when a server is started or controlled.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::INSTALL_COMMAND;

/// How many log lines an error shows.
const LOG_TAIL_LINES: usize = 40;

/// Why a server could not be started or controlled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A program or package the server needs is not installed.
    #[error("{what} is not available: {detail}. Install it with `{INSTALL_COMMAND}` (as root or through sudo)")]
    Missing {
        /// What is missing (`java`, `the ZooKeeper jars`, `osmem-server`).
        what: &'static str,
        /// What was looked for and what went wrong.
        detail: String,
    },
    /// The server process exited or did not become ready in time.
    #[error("{what} failed to start: {reason}. Its log is {}; last lines:\n{tail}", log.display())]
    StartFailed {
        /// Which server (`ZooKeeper on 127.0.0.1:PORT`, ...).
        what: String,
        /// What went wrong.
        reason: String,
        /// The server's log file (removed with the handle).
        log: PathBuf,
        /// The last lines of that log.
        tail: String,
    },
    /// A file or process operation failed.
    #[error("could not {action}: {source}")]
    Io {
        /// What was being done.
        action: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A method was called with an argument that cannot work (an ensemble member index out of
    /// range, an ensemble of zero members).
    #[error("{0}")]
    InvalidArgument(String),
}

impl ServerError {
    /// [`ServerError::StartFailed`] of `what`, with the tail of its `log`.
    pub(super) fn start_failed(what: String, log: &Path, reason: String) -> Self {
        Self::StartFailed {
            what,
            reason,
            log: log.to_owned(),
            tail: log_tail(log, LOG_TAIL_LINES),
        }
    }

    pub(super) fn io(action: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            action: action.into(),
            source,
        }
    }
}

/// The last `lines` lines of a log file (or why it could not be read).
pub(super) fn log_tail(path: &Path, lines: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(log {} unreadable: {e})", path.display()),
    }
}
