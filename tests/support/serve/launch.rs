//! The launcher of `zkguard serve` for the tests: where a service runs ([`Env`]) and a service
//! started on a free port ([`Service`], killed when dropped). Every binary that starts a service
//! declares it: as `serve_support` itself when it needs nothing else (the history test's bank),
//! or through `mod.rs` (the shared servers and the HTTP helpers), which re-exports it.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::Arc;

use serde_json::Value;

/// Where a service runs: ZooKeeper, Elasticsearch, its lock root and a directory for its files.
#[derive(Clone)]
pub struct Env {
    pub zk: String,
    pub es: String,
    pub root: String,
    pub dir: Arc<tempfile::TempDir>,
    pub extra: Vec<(String, String)>,
    pub args: Vec<String>,
    /// The service's open-files limit (soft and hard), when the test sets one.
    pub open_files: Option<u64>,
    /// The service's file-size limit in bytes (`ulimit -f`), when the test sets one.
    pub file_size: Option<u64>,
}

impl Env {
    pub fn journal(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.journal"))
    }

    /// Starts `zkguard serve --listen 127.0.0.1:0` with journal `name` and waits for its
    /// address line.
    pub fn start(&self, name: &str) -> Service {
        let log = self.dir.path().join(format!("{name}.log"));
        let mut cmd = crate::cli::zkguard();
        cmd.args(["serve", "--listen", "127.0.0.1:0"])
            .args(&self.args)
            .env_remove("ZKGUARD_CONFIG")
            .env_remove("RUST_LOG")
            .env("ZKGUARD_ZOOKEEPER_SERVERS", &self.zk)
            .env("ZKGUARD_ZOOKEEPER_LOCK_ROOT", &self.root)
            // 6 s: the service gives up a lock after half of it without ZooKeeper (3 s), more
            // than a busy machine stalls ZooKeeper's JVM; a test about expiry sets its own.
            .env("ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT", "6000")
            .env("ZKGUARD_ZOOKEEPER_CONNECTION_RETRY", "2")
            .env("ZKGUARD_ZOOKEEPER_CONNECTION_DELAY", "100")
            .env("ZKGUARD_ZOOKEEPER_FOREGROUND_TASK_TIMEOUT", "10000")
            .env("ZKGUARD_ZOOKEEPER_BACKGROUND_TASK_TIMEOUT", "10000")
            .env("ZKGUARD_ELASTICSEARCH_URL", &self.es)
            .env("ZKGUARD_SERVER_JOURNAL_PATH", self.journal(name))
            .env(
                "ZKGUARD_DEADLETTER_FILE_PATH",
                self.dir.path().join(format!("{name}.dlq")),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        for (k, v) in &self.extra {
            cmd.env(k, v);
        }
        let limits: Vec<(nix::sys::resource::Resource, u64)> = [
            (nix::sys::resource::Resource::RLIMIT_NOFILE, self.open_files),
            (nix::sys::resource::Resource::RLIMIT_FSIZE, self.file_size),
        ]
        .into_iter()
        .filter_map(|(r, n)| n.map(|n| (r, n)))
        .collect();
        if !limits.is_empty() {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    for (r, n) in &limits {
                        nix::sys::resource::setrlimit(*r, *n, *n).map_err(std::io::Error::from)?;
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().expect("run zkguard serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let started: Value = serde_json::from_str(&line).unwrap_or_else(|_| {
            let _ = child.wait();
            panic!(
                "zkguard serve did not start: {line:?}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
        let scheme = if started["tls"] == true {
            "https"
        } else {
            "http"
        };
        Service {
            child,
            base: format!("{scheme}://{}", started["listening"].as_str().unwrap()),
            started,
            log,
            _dir: self.dir.clone(),
        }
    }
}

/// A running `zkguard serve`: its process, its base URL, its start line and its log file.
pub struct Service {
    pub child: Child,
    pub base: String,
    pub started: Value,
    pub log: PathBuf,
    /// Its directory (journal, log), kept while it runs even if its [`Env`] goes first.
    _dir: Arc<tempfile::TempDir>,
}

impl Drop for Service {
    /// Stops the service; when a test fails, prints the end of its log first (the log's
    /// directory goes with the test).
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL)..];
            eprintln!(
                "--- the last {} lines of {} ---\n{}",
                tail.len(),
                self.log.display(),
                tail.join("\n")
            );
        }
    }
}

/// How many lines of a failed test's service log are printed.
const LOG_TAIL: usize = 80;
