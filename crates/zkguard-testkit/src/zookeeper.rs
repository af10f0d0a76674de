//! [`ZkServer`]: a standalone ZooKeeper, with an optional TLS client port; the JVM command line
//! and `zoo.cfg` its ensemble members share.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use super::error::ServerError;
use super::four_letter::{four_letter_word, packets_received_at, parse_mntr, srvr_mode};
use super::process::{
    display_status, find_in_path, free_port, log_mentions_port_clash, open_log, retry_port_clashes,
    Attempt, Proc, TempDir,
};
use super::{DEFAULT_START_TIMEOUT, FOUR_LETTER_TIMEOUT, POLL, STOP_GRACE};

/// Where Debian's `zookeeper` package puts the server jar.
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
/// An slf4j binding placed first on the class path, so the server log is plain text on stderr.
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";

/// The `java` command and its class path, checked once.
pub(super) fn java_command() -> Result<(PathBuf, String), ServerError> {
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
pub(super) fn zk_command(
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
pub(super) fn zoo_cfg_common(
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
pub(super) fn probe_zk(
    port: u16,
    data_dir: &Path,
    mode_ok: impl Fn(&str) -> bool,
) -> Option<String> {
    let srvr = four_letter_word(("127.0.0.1", port), "srvr", Duration::from_secs(1)).ok()?;
    let mode = srvr_mode(&srvr)?;
    if !mode_ok(&mode) {
        return None;
    }
    let conf = four_letter_word(("127.0.0.1", port), "conf", Duration::from_secs(1)).ok()?;
    conf.contains(&format!("dataDir={}", data_dir.display()))
        .then_some(mode)
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
