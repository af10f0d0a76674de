//! Ports, temporary directories and child processes (with their watchdogs and logs), shared by
//! every server of the kit.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::error::ServerError;
use nix::sys::signal::{kill as send_signal, Signal};
use nix::unistd::Pid;

/// How many times a first start is retried on fresh ports after a port clash.
const PORT_ATTEMPTS: usize = 4;

/// Ports this process has handed out; never handed out twice, so two servers started by parallel
/// tests of one binary cannot pick the same port.
fn handed_out() -> MutexGuard<'static, HashSet<u16>> {
    static PORTS: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    PORTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// A free TCP port on `127.0.0.1`: the kernel picks one for a listener that is closed right away.
///
/// Another process may still take the port before the server binds it; the servers' start
/// functions detect that (the process exits, or a probe reaches a server with another data
/// directory) and retry on new ports.
///
/// # Errors
///
/// When no listener can be bound on `127.0.0.1`.
pub fn free_port() -> io::Result<u16> {
    for _ in 0..100 {
        let port = TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port();
        if handed_out().insert(port) {
            return Ok(port);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        "no unused loopback port found in 100 tries",
    ))
}

/// A directory under the system temporary directory, removed on drop (kept when the environment
/// variable `ZKGUARD_KEEP_SERVER_DIRS` is set, for post-mortems).
#[derive(Debug)]
pub(super) struct TempDir(pub(super) PathBuf);

impl TempDir {
    pub(super) fn new(kind: &str) -> Result<Self, ServerError> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "zkguard-{kind}-{}-{}-{nanos:08x}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        fs::create_dir_all(&path)
            .map_err(|e| ServerError::io(format!("create {}", path.display()), e))?;
        Ok(Self(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("ZKGUARD_KEEP_SERVER_DIRS").is_none() {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// A child process plus a watchdog that kills it (and removes `cleanup_dir`) when this program
/// dies without dropping the handle: the watchdog is a `sh` blocked reading a pipe that only this
/// program holds, so the pipe reaches end-of-file exactly when this program is gone.
#[derive(Debug)]
pub(super) struct Proc {
    pub(super) child: Child,
    watchdog: Option<Child>,
    /// For `osmem-server`: its stdin, whose closing asks it to exit.
    pub(super) stdin: Option<ChildStdin>,
    /// Set once the child has been reaped.
    pub(super) exit: Option<ExitStatus>,
}

impl Proc {
    pub(super) fn spawn(
        cmd: &mut Command,
        cleanup_dir: Option<&Path>,
        what: &str,
    ) -> Result<Self, ServerError> {
        let mut child = cmd
            .spawn()
            .map_err(|e| ServerError::io(format!("run {what}"), e))?;
        let stdin = child.stdin.take();
        let mut watchdog = Command::new("sh");
        watchdog
            .arg("-c")
            .arg(r#"read _zkguard_wait; kill -9 "$1" 2>/dev/null; if [ -n "$2" ]; then sleep 1; rm -rf "$2"; fi"#)
            .arg("zkguard-watchdog")
            .arg(child.id().to_string())
            .arg(cleanup_dir.map(|p| p.as_os_str().to_owned()).unwrap_or_default())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // Without a watchdog the server still dies with its handle; only a crash of this program
        // would leak it. Not worth failing the start for.
        let watchdog = watchdog.spawn().ok();
        Ok(Self {
            child,
            watchdog,
            stdin,
            exit: None,
        })
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    fn signal(&mut self, signal: Signal) {
        if self.running() {
            let _ = send_signal(self.pid(), signal);
        }
    }

    /// SIGSTOP, then waits (up to 5 s) until every thread is stopped: the signal is delivered
    /// asynchronously, and a thread that is still running could answer a request meanwhile.
    pub(super) fn pause(&mut self) {
        self.signal(Signal::SIGSTOP);
        self.wait_stopped(true);
    }

    /// SIGCONT, then waits (up to 5 s) until no thread is stopped any more.
    pub(super) fn resume(&mut self) {
        self.signal(Signal::SIGCONT);
        self.wait_stopped(false);
    }

    fn wait_stopped(&mut self, stopped: bool) {
        let tasks = PathBuf::from(format!("/proc/{}/task", self.child.id()));
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.running() && Instant::now() < deadline {
            let Ok(entries) = fs::read_dir(&tasks) else {
                return;
            };
            let all_match = entries.flatten().all(|task| {
                // The state follows the `(comm)` field, which may itself contain spaces.
                fs::read_to_string(task.path().join("stat"))
                    .ok()
                    .and_then(|stat| {
                        stat.rsplit_once(')')
                            .map(|(_, rest)| rest.trim_start().starts_with('T'))
                    })
                    .is_none_or(|is_stopped| is_stopped == stopped)
            });
            if all_match {
                return;
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    pub(super) fn running(&mut self) -> bool {
        if self.exit.is_some() {
            return false;
        }
        match self.child.try_wait() {
            Ok(Some(status)) => {
                self.exit = Some(status);
                self.disarm();
                false
            }
            Ok(None) => true,
            Err(_) => false,
        }
    }

    /// Waits up to `limit` for the process to exit.
    pub(super) fn wait_exit(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if !self.running() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub(super) fn kill_now(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            if let Ok(status) = self.child.wait() {
                self.exit = Some(status);
            }
        }
        self.stdin = None;
        self.disarm();
    }

    /// SIGTERM (or closing stdin, for servers that watch it), then SIGKILL after `grace`.
    pub(super) fn terminate(&mut self, grace: Duration) {
        if self.stdin.take().is_none() {
            self.signal(Signal::SIGTERM);
            // A paused process only acts on SIGTERM once continued.
            self.signal(Signal::SIGCONT);
        }
        if !self.wait_exit(grace) {
            self.kill_now();
        }
        self.disarm();
    }

    fn disarm(&mut self) {
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill_now();
    }
}

pub(super) fn log_mentions_port_clash(path: &Path) -> bool {
    fs::read(path)
        .map(|b| {
            let text = String::from_utf8_lossy(&b);
            text.contains("Address already in use") || text.contains("address already in use")
        })
        .unwrap_or(false)
}

/// Opens a log file for appending, with a marker line, and returns two handles (stdout, stderr).
pub(super) fn open_log(path: &Path, what: &str) -> Result<(File, File), ServerError> {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| ServerError::io(format!("open {}", path.display()), e))?;
    let _ = writeln!(file, "==== zkguard: starting {what} ====");
    let second = file
        .try_clone()
        .map_err(|e| ServerError::io(format!("open {}", path.display()), e))?;
    Ok((file, second))
}

pub(super) fn find_in_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// How a start attempt ended.
pub(super) enum Attempt<T> {
    Ready(T),
    /// The port was taken by someone else: retry on fresh ports (first start) or later.
    PortClash(ServerError),
    Failed(ServerError),
}

impl<T> Attempt<T> {
    pub(super) fn map<U>(self, f: impl FnOnce(T) -> U) -> Attempt<U> {
        match self {
            Attempt::Ready(t) => Attempt::Ready(f(t)),
            Attempt::PortClash(e) => Attempt::PortClash(e),
            Attempt::Failed(e) => Attempt::Failed(e),
        }
    }
}

/// Runs `attempt` until it is ready or fails, again after a port clash (on fresh ports) up to
/// [`PORT_ATTEMPTS`] times in all; then the last clash is the error.
pub(super) fn retry_port_clashes<T>(
    mut attempt: impl FnMut() -> Result<Attempt<T>, ServerError>,
) -> Result<T, ServerError> {
    let mut last = None;
    for _ in 0..PORT_ATTEMPTS {
        match attempt()? {
            Attempt::Ready(t) => return Ok(t),
            Attempt::PortClash(e) => last = Some(e),
            Attempt::Failed(e) => return Err(e),
        }
    }
    Err(last.expect("at least one attempt ran"))
}

pub(super) fn display_status(status: Option<ExitStatus>) -> String {
    status
        .map(|s| s.to_string())
        .unwrap_or_else(|| "status unknown".to_owned())
}

/// A server binary that a Python package ships: the path in the environment variable `var` if
/// set, else what `module.function()` of `python3` on PATH prints (the pip package `package`).
pub(super) fn python_shipped_binary(
    var: &str,
    module: &str,
    function: &str,
    package: &str,
) -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os(var) {
        let bin = PathBuf::from(bin);
        return if bin.is_file() {
            Ok(bin)
        } else {
            Err(format!(
                "{var} names {}, which does not exist",
                bin.display()
            ))
        };
    }
    let out = Command::new("python3")
        .args([
            "-c",
            &format!("import {module}; print({module}.{function}())"),
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("could not run python3 ({e})"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "python3 cannot run {module}.{function}() (pip package `{package}`): {}",
            err.lines().last().unwrap_or("").trim()
        ));
    }
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{module}.{function}() names {}, which does not exist",
            path.display()
        ))
    }
}
