//! The fleet's servers: a tansu broker (its records in S3 on a private moto server, so that it
//! can be killed and started again without losing any), a 3-member ZooKeeper ensemble, one
//! osmem-server, and
//! `zkguard serve` instances sharing them, each with a state directory of its own that a test
//! can delete (a host whose disk is gone).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use zkguard::testkit::{OsmemServer, TansuServer, ZkEnsemble};

/// The ZooKeeper session of each instance: an instance paused longer than this is deposed.
pub const SESSION: Duration = Duration::from_secs(6);
/// The journal topic's partitions.
pub const PARTITIONS: u32 = 6;
/// Operation ids each document remembers (`elastic.stamp.window`, at its largest): the
/// clients send at most this many operations to one document, so that its record holds every
/// operation applied to it.
pub const WINDOW: usize = 1000;
/// `server.journal.kafka.timeout` (ms): how long a background write waits for the broker's
/// acknowledgement before its 503, and any other request of the journal (a fetch) for its
/// answer. Below the clients' own timeout ([`CLIENT_TIMEOUT`]), so that a write in flight when
/// the broker dies gets its 503 rather than no answer; well above what the durable broker (S3 on
/// moto, which lists a partition's objects on every fetch) takes on a busy machine, where a
/// fetch cut off every few seconds would never read anything.
pub const KAFKA_TIMEOUT_MS: u64 = 8000;
/// `server.queue.max`: records of the journal not applied yet, fleet-wide, beyond which the
/// instances refuse background writes (503 `queue_full`). The durable broker answers fetches
/// more slowly than it takes records (it lists a partition's objects on every fetch, ever more of
/// them), so that on a busy machine the clients would pile up a backlog the run could not apply
/// in bounded time; the fleet's own bound keeps it small, as an operator's would.
pub const QUEUE_MAX: usize = 100;
/// How long a client waits for an answer.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(12);

/// Whether the instances run on the Kafka journal (the default), not on file journals
/// (`ZKGUARD_FLEET_BACKEND=file`).
pub fn on_kafka() -> bool {
    std::env::var("ZKGUARD_FLEET_BACKEND").as_deref() != Ok("file")
}

/// The servers every instance shares.
pub struct Servers {
    pub kafka: TansuServer,
    pub zk: ZkEnsemble,
    pub es: OsmemServer,
    pub root: String,
    pub topic: String,
    pub dir: tempfile::TempDir,
}

impl Servers {
    /// Starts the broker, the ensemble and osmem-server.
    pub fn start() -> Servers {
        let tag = format!("{:08x}", rand::random::<u32>());
        Servers {
            kafka: if std::env::var("ZKGUARD_FLEET_BROKER").as_deref() == Ok("memory") {
                TansuServer::start().expect("start tansu (run scripts/install-deps.sh)")
            } else {
                TansuServer::start_durable()
                    .expect("start tansu with S3 storage (run scripts/install-deps.sh)")
            },
            zk: ZkEnsemble::builder()
                .size(3)
                .start()
                .expect("start a ZooKeeper ensemble (run scripts/install-deps.sh)"),
            es: OsmemServer::start().expect("start osmem-server (run scripts/install-deps.sh)"),
            root: format!("/zkguard-fleet/{tag}"),
            topic: format!("zkguard-journal-{tag}"),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// The state directory of instance `i`.
    pub fn state_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("instance-{i}"))
    }

    /// The log of instance `i` (kept outside its state directory, which a fault deletes).
    pub fn log(&self, i: usize, start: usize) -> PathBuf {
        self.dir.path().join(format!("instance-{i}.{start}.log"))
    }

    /// `zkguard journal --json` on the fleet's configuration.
    pub fn journal_listing(&self) -> Value {
        let out = Command::new(env!("CARGO_BIN_EXE_zkguard"))
            .args(["journal", "--json"])
            .env_remove("ZKGUARD_CONFIG")
            .env("ZKGUARD_ZOOKEEPER_SERVERS", self.zk.connect_string())
            .env("ZKGUARD_ZOOKEEPER_LOCK_ROOT", &self.root)
            .env("ZKGUARD_ELASTICSEARCH_URL", self.es.url())
            .env("ZKGUARD_SERVER_JOURNAL_BACKEND", "kafka")
            .env("ZKGUARD_SERVER_JOURNAL_KAFKA_BROKERS", self.kafka.brokers())
            .env("ZKGUARD_SERVER_JOURNAL_KAFKA_TOPIC", &self.topic)
            .env(
                "ZKGUARD_SERVER_JOURNAL_KAFKA_PARTITIONS",
                PARTITIONS.to_string(),
            )
            .env(
                "ZKGUARD_SERVER_JOURNAL_KAFKA_TIMEOUT",
                KAFKA_TIMEOUT_MS.to_string(),
            )
            .output()
            .expect("run zkguard journal");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            serde_json::json!({"failed": format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))})
        })
    }

    /// Starts `zkguard serve` instance `i` (its `start`-th start) on the Kafka journal and
    /// waits for its address line.
    pub fn start_instance(&self, i: usize, start: usize) -> Instance {
        let state = self.state_dir(i);
        std::fs::create_dir_all(&state).unwrap();
        let log = self.log(i, start);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_zkguard"));
        cmd.args(["serve", "--listen", "127.0.0.1:0"])
            .env_remove("ZKGUARD_CONFIG")
            .env_remove("ZKGUARD_FLEET_BACKEND")
            .env_remove("ZKGUARD_FLEET_SECS")
            .env_remove("ZKGUARD_FLEET_LOG")
            .env_remove("ZKGUARD_FLEET_BROKER")
            // `ZKGUARD_FLEET_LOG` sets the instances' RUST_LOG, to look into a failure.
            .env(
                "RUST_LOG",
                std::env::var("ZKGUARD_FLEET_LOG").unwrap_or_else(|_| "zkguard=warn".into()),
            )
            .env("ZKGUARD_ZOOKEEPER_SERVERS", self.zk.connect_string())
            .env("ZKGUARD_ZOOKEEPER_LOCK_ROOT", &self.root)
            .env(
                "ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT",
                SESSION.as_millis().to_string(),
            )
            .env("ZKGUARD_ZOOKEEPER_CONNECTION_RETRY", "2")
            .env("ZKGUARD_ZOOKEEPER_CONNECTION_DELAY", "100")
            .env("ZKGUARD_ZOOKEEPER_FOREGROUND_TASK_TIMEOUT", "10000")
            .env("ZKGUARD_ZOOKEEPER_BACKGROUND_TASK_TIMEOUT", "10000")
            .env("ZKGUARD_ELASTICSEARCH_URL", self.es.url())
            .env("ZKGUARD_ELASTIC_STAMP_WINDOW", WINDOW.to_string())
            .env("ZKGUARD_SERVER_QUEUE_MAX", QUEUE_MAX.to_string())
            .env("ZKGUARD_STATE_DIR", &state)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        // `ZKGUARD_FLEET_BACKEND=file` runs the fleet on file journals, one per instance: the
        // checker then shows what a lost disk costs there.
        if on_kafka() {
            cmd.env("ZKGUARD_SERVER_JOURNAL_BACKEND", "kafka")
                .env("ZKGUARD_SERVER_JOURNAL_KAFKA_BROKERS", self.kafka.brokers())
                .env("ZKGUARD_SERVER_JOURNAL_KAFKA_TOPIC", &self.topic)
                .env(
                    "ZKGUARD_SERVER_JOURNAL_KAFKA_PARTITIONS",
                    PARTITIONS.to_string(),
                )
                .env(
                    "ZKGUARD_SERVER_JOURNAL_KAFKA_TIMEOUT",
                    KAFKA_TIMEOUT_MS.to_string(),
                );
        }
        let mut child = cmd.spawn().expect("run zkguard serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let started: Value = serde_json::from_str(&line).unwrap_or_else(|_| {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "zkguard serve instance {i} did not start: {line:?}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
        Instance {
            child: Mutex::new(child),
            base: format!("http://{}", started["listening"].as_str().unwrap()),
            log,
        }
    }
}

/// One running `zkguard serve`.
pub struct Instance {
    child: Mutex<Child>,
    pub base: String,
    pub log: PathBuf,
}

impl Instance {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn signal(&self, sig: Signal) {
        let pid = self.child.lock().unwrap().id();
        let _ = kill(Pid::from_raw(pid as i32), sig);
    }

    /// SIGKILL, and waits for the exit.
    pub fn kill(&self) {
        let mut child = self.child.lock().unwrap();
        let _ = child.kill();
        let _ = child.wait();
    }

    /// SIGSTOP: the process keeps its connections and answers nothing.
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// The last lines of its log, for a failure's message.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}
