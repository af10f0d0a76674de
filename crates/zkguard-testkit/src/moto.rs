//! [`MotoServer`]: moto's S3-compatible server (PyPI `moto[server]`), which keeps its buckets in
//! memory, as the storage of a durable [`crate::TansuServer`].

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use super::error::ServerError;
use super::process::{
    display_status, free_port, log_mentions_port_clash, open_log, retry_port_clashes, Attempt,
    Proc, TempDir,
};
use super::{DEFAULT_START_TIMEOUT, POLL};

/// Time limit of one HTTP exchange with the server.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// How moto's server is run: `python3 -m moto.server`, once `python3` on PATH can import it
/// (checked once).
fn moto_command() -> Result<Vec<String>, ServerError> {
    static COMMAND: OnceLock<Result<Vec<String>, String>> = OnceLock::new();
    COMMAND
        .get_or_init(|| {
            let out = Command::new("python3")
                .args(["-c", "import moto.server"])
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("could not run python3 ({e})"))?;
            if out.status.success() {
                Ok(["python3", "-m", "moto.server"].map(String::from).to_vec())
            } else {
                let err = String::from_utf8_lossy(&out.stderr);
                Err(format!(
                    "python3 cannot import moto.server (pip package `moto[server]`): {}",
                    err.lines().last().unwrap_or("").trim()
                ))
            }
        })
        .clone()
        .map_err(|detail| ServerError::Missing {
            what: "moto's S3 server",
            detail,
        })
}

/// moto's S3-compatible server on `127.0.0.1`, in memory, started by [`MotoServer::start`]:
/// its buckets live as long as the process, whatever happens to the programs that store in
/// them. Dropping the handle stops it.
#[derive(Debug)]
pub struct MotoServer {
    proc: Mutex<Option<Proc>>,
    port: u16,
    log: PathBuf,
    _dir: TempDir,
}

impl MotoServer {
    /// Starts the server on a free loopback port and waits until it answers S3 requests.
    ///
    /// # Errors
    ///
    /// [`ServerError::Missing`] when `moto[server]` is not installed;
    /// [`ServerError::StartFailed`] (with its log) when it exits or does not answer within 30 s.
    pub fn start() -> Result<Self, ServerError> {
        let command = moto_command()?;
        let dir = TempDir::new("moto")?;
        let log = dir.0.join("moto.log");
        let (port, proc) = retry_port_clashes(|| {
            let port = free_port().map_err(|e| ServerError::io("find a free loopback port", e))?;
            Ok(launch_moto(&command, port, &log, &dir.0).map(|p| (port, p)))
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

    /// `http://127.0.0.1:PORT`, the S3 endpoint (`AWS_ENDPOINT`, `endpoint_url`). Any access key
    /// and secret are accepted.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's port.
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

    /// Creates the bucket `name` (an S3 `PUT /name`, unsigned: moto does not check signatures).
    ///
    /// # Errors
    ///
    /// [`ServerError::Io`] when the server does not answer 200 (an invalid bucket name, say).
    pub fn create_bucket(&self, name: &str) -> Result<(), ServerError> {
        let action = format!("create the S3 bucket {name:?} on {}", self.endpoint());
        match http_status(self.port, "PUT", &format!("/{name}")) {
            Ok(200) => Ok(()),
            Ok(status) => Err(ServerError::io(
                action,
                io::Error::other(format!("the server answered HTTP {status}")),
            )),
            Err(e) => Err(ServerError::io(action, e)),
        }
    }
}

fn launch_moto(command: &[String], port: u16, log: &Path, dir: &Path) -> Attempt<Proc> {
    let what = format!("moto's S3 server on 127.0.0.1:{port}");
    let failed = |reason: String| ServerError::start_failed(what.clone(), log, reason);
    let (log_out, log_err) = match open_log(log, &what) {
        Ok(files) => files,
        Err(e) => return Attempt::Failed(e),
    };
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..])
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(log_out)
        .stderr(log_err);
    let mut proc = match Proc::spawn(&mut cmd, Some(dir), "moto's S3 server") {
        Ok(p) => p,
        Err(e) => return Attempt::Failed(e),
    };
    let deadline = Instant::now() + DEFAULT_START_TIMEOUT;
    loop {
        if !proc.running() {
            let err = failed(format!(
                "the process exited ({})",
                display_status(proc.exit)
            ));
            return if log_mentions_port_clash(log) {
                Attempt::PortClash(err)
            } else {
                Attempt::Failed(err)
            };
        }
        // `GET /` lists the buckets: 200 once the server answers S3 requests.
        if http_status(port, "GET", "/").is_ok_and(|status| status == 200) {
            return Attempt::Ready(proc);
        }
        if Instant::now() >= deadline {
            proc.kill_now();
            return Attempt::Failed(failed(format!(
                "no answer to GET / within {DEFAULT_START_TIMEOUT:?}"
            )));
        }
        thread::sleep(POLL);
    }
}

/// Sends `method path` (no body) to `127.0.0.1:port` over plain HTTP/1.1 and returns the
/// status code of the answer.
fn http_status(port: u16, method: &str, path: &str) -> io::Result<u16> {
    let mut stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), HTTP_TIMEOUT)?;
    stream.set_read_timeout(Some(HTTP_TIMEOUT))?;
    stream.set_write_timeout(Some(HTTP_TIMEOUT))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let text = String::from_utf8_lossy(&answer);
    let status_line = text.lines().next().unwrap_or("");
    status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not an HTTP answer: {status_line:?}"),
            )
        })
}
