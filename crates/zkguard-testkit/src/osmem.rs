//! [`OsmemServer`]: `osmem-server`, an in-memory OpenSearch-compatible server that stands in for
//! Elasticsearch.

use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use super::error::ServerError;
use super::process::{
    display_status, free_port, log_mentions_port_clash, open_log, python_shipped_binary,
    retry_port_clashes, Attempt, Proc, TempDir,
};
use super::{DEFAULT_START_TIMEOUT, STOP_GRACE};

/// The `osmem-server` binary, found once: `$ZKGUARD_OSMEM_BIN`, else what the `osmem_server`
/// Python package of `python3` on PATH resolves.
fn osmem_binary() -> Result<PathBuf, ServerError> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            python_shipped_binary(
                "ZKGUARD_OSMEM_BIN",
                "osmem_server",
                "resolve_binary",
                "osmem-server",
            )
        })
        .clone()
        .map_err(|detail| ServerError::Missing {
            what: "osmem-server",
            detail,
        })
}
/// The JSON line `osmem-server` prints once it listens.
#[derive(serde::Deserialize)]
struct OsmemHello {
    url: String,
}

/// An `osmem-server` (in-memory, OpenSearch/Elasticsearch-compatible HTTP API) on `127.0.0.1`,
/// started by [`OsmemServer::start`]. Its data lives in memory: a stop or kill loses it. Dropping
/// the handle stops the server.
#[derive(Debug)]
pub struct OsmemServer {
    proc: Mutex<Option<Proc>>,
    port: u16,
    url: String,
    log: PathBuf,
    start_timeout: Duration,
    dir: TempDir,
}

impl OsmemServer {
    /// Starts a server on a free loopback port and waits until it listens.
    ///
    /// # Errors
    ///
    /// [`ServerError::Missing`] when `osmem-server` is not installed; [`ServerError::StartFailed`]
    /// (with its log) when it exits or does not announce itself within 30 s.
    pub fn start() -> Result<Self, ServerError> {
        let binary = osmem_binary()?;
        let dir = TempDir::new("osmem")?;
        let log = dir.0.join("osmem.log");
        let (port, (proc, url)) = retry_port_clashes(|| {
            let port = free_port().map_err(|e| ServerError::io("find a free loopback port", e))?;
            Ok(launch_osmem(&binary, port, &log, &dir.0, DEFAULT_START_TIMEOUT).map(|r| (port, r)))
        })?;
        Ok(Self::started(proc, port, url, log, dir))
    }

    /// Starts a server on `port` of `127.0.0.1` (one that clients were given before any server
    /// listened there, say from [`free_port`](super::free_port)) and waits until it listens.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start); [`ServerError::StartFailed`] too when another program holds
    /// the port.
    pub fn start_on(port: u16) -> Result<Self, ServerError> {
        let binary = osmem_binary()?;
        let dir = TempDir::new("osmem")?;
        let log = dir.0.join("osmem.log");
        match launch_osmem(&binary, port, &log, &dir.0, DEFAULT_START_TIMEOUT) {
            Attempt::Ready((proc, url)) => Ok(Self::started(proc, port, url, log, dir)),
            Attempt::PortClash(e) | Attempt::Failed(e) => Err(e),
        }
    }

    fn started(proc: Proc, port: u16, url: String, log: PathBuf, dir: TempDir) -> Self {
        Self {
            proc: Mutex::new(Some(proc)),
            port,
            url,
            log,
            start_timeout: DEFAULT_START_TIMEOUT,
            dir,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Proc>> {
        self.proc.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `http://127.0.0.1:PORT`, the base URL for Elasticsearch clients. It stays the same across
    /// [`start_again`](Self::start_again).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The HTTP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Whether the server process is alive.
    pub fn is_running(&self) -> bool {
        self.lock().as_mut().is_some_and(Proc::running)
    }

    /// Stops the server (closes its standard input, then SIGKILL after 10 s) and waits for it to
    /// exit. Its documents are lost.
    pub fn stop(&self) {
        if let Some(p) = self.lock().as_mut() {
            p.terminate(STOP_GRACE);
        }
    }

    /// Kills the server (SIGKILL). Its documents are lost.
    pub fn kill(&self) {
        if let Some(p) = self.lock().as_mut() {
            p.kill_now();
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing is answered. Returns once
    /// every thread of the server has stopped.
    pub fn pause(&self) {
        if let Some(p) = self.lock().as_mut() {
            p.pause();
        }
    }

    /// Continues a paused server (SIGCONT).
    pub fn resume(&self) {
        if let Some(p) = self.lock().as_mut() {
            p.resume();
        }
    }

    /// Starts the server again on the same port (a running one is stopped first), so clients
    /// configured with [`url`](Self::url) reconnect. It starts empty: the data was in memory.
    ///
    /// # Errors
    ///
    /// [`ServerError::StartFailed`] when it does not come back within 30 s (for instance because
    /// another program took the port meanwhile).
    pub fn start_again(&self) -> Result<(), ServerError> {
        let binary = osmem_binary()?;
        let mut guard = self.lock();
        if let Some(p) = guard.as_mut() {
            p.terminate(STOP_GRACE);
        }
        let deadline = Instant::now() + self.start_timeout;
        loop {
            match launch_osmem(
                &binary,
                self.port,
                &self.log,
                &self.dir.0,
                self.start_timeout,
            ) {
                Attempt::Ready((proc, _url)) => {
                    *guard = Some(proc);
                    return Ok(());
                }
                Attempt::PortClash(_) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(250))
                }
                Attempt::PortClash(e) | Attempt::Failed(e) => return Err(e),
            }
        }
    }
}

fn launch_osmem(
    binary: &Path,
    port: u16,
    log: &Path,
    dir: &Path,
    timeout: Duration,
) -> Attempt<(Proc, String)> {
    let what = format!("osmem-server on 127.0.0.1:{port}");
    let failed = |reason: String| ServerError::start_failed(what.clone(), log, reason);
    let (mut log_out, log_err) = match open_log(log, &what) {
        Ok(files) => files,
        Err(e) => return Attempt::Failed(e),
    };
    let mut cmd = Command::new(binary);
    cmd.arg("-addr")
        .arg(format!("127.0.0.1:{port}"))
        .arg("-parent-pid")
        .arg(std::process::id().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log_err);
    let mut proc = match Proc::spawn(&mut cmd, Some(dir), "osmem-server") {
        Ok(p) => p,
        Err(e) => return Attempt::Failed(e),
    };
    let Some(stdout) = proc.child.stdout.take() else {
        return Attempt::Failed(failed("its standard output was not captured".into()));
    };
    // A thread reads the announcement, then copies the rest of stdout into the log (so the server
    // never blocks on a full pipe).
    let (tx, rx) = mpsc::channel();
    thread::Builder::new()
        .name(format!("osmem-{port}-stdout"))
        .spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut first = String::new();
            let read = reader.read_line(&mut first);
            let _ = tx.send(read.map(|_| first.clone()));
            let _ = writeln!(log_out, "{}", first.trim_end());
            let _ = io::copy(&mut reader, &mut log_out);
        })
        .ok();
    let hello = rx.recv_timeout(timeout);
    let url = match hello {
        Ok(Ok(line)) if !line.trim().is_empty() => {
            match serde_json::from_str::<OsmemHello>(line.trim()) {
                Ok(h) => h.url.trim_end_matches('/').to_owned(),
                Err(e) => {
                    proc.kill_now();
                    return Attempt::Failed(failed(format!(
                        "its first line `{}` is not the expected JSON ({e})",
                        line.trim()
                    )));
                }
            }
        }
        Ok(_) => {
            // End of output: it exited.
            proc.wait_exit(Duration::from_secs(5));
            let reason = format!("the process exited ({})", display_status(proc.exit));
            proc.kill_now();
            let err = failed(reason);
            return if log_mentions_port_clash(log) {
                Attempt::PortClash(err)
            } else {
                Attempt::Failed(err)
            };
        }
        Err(_) => {
            proc.kill_now();
            return Attempt::Failed(failed(format!(
                "no announcement on its standard output within {timeout:?}"
            )));
        }
    };
    // Make sure the announced server is ours and accepts connections.
    if TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2)).is_err()
        || !proc.running()
    {
        proc.kill_now();
        return Attempt::Failed(failed(format!(
            "announced {url} but does not accept connections"
        )));
    }
    Attempt::Ready((proc, url))
}
