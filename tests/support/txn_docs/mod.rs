//! Shared helpers of `tests/txn_docs.rs`: one ZooKeeper and one osmem-server per test binary,
//! an index, a log index and a lock root per test, the CLI, and coordinators paused at a point
//! of the protocol in a child process.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use zkguard::config::{Settings, TxnSettings, ZkSettings};
use zkguard::es::{Doc, DocStore, EsStore, Refresh, WriteCondition};
use zkguard::testkit::{OsmemServer, ZkServer};
use zkguard::txn::multi::{MultiState, Transactions};
use zkguard::{LockService, ZkLockService, ZkSession};

fn zk() -> &'static ZkServer {
    static SERVER: OnceLock<ZkServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        ZkServer::builder()
            .tick_time(500)
            .start()
            .expect("start ZooKeeper (run scripts/install-deps.sh)")
    })
}

fn es() -> &'static OsmemServer {
    static SERVER: OnceLock<OsmemServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        OsmemServer::start().expect("start osmem-server (run scripts/install-deps.sh)")
    })
}

/// What a CLI run ended with.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// One test's world: its documents' index, its log index, its lock root.
pub struct Env {
    pub index: String,
    pub settings: TxnSettings,
    pub zk: ZkSettings,
    pub store: Arc<dyn DocStore>,
    config: tempfile::NamedTempFile,
}

impl Env {
    pub async fn new(tag: &str) -> Self {
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let mut settings = Settings::default().txn;
        settings.log_index = format!("t-{tag}-log-{suffix}");
        settings.recovery_after = Duration::ZERO;
        let mut zk_settings = Settings::default().zookeeper;
        zk_settings.servers = zk().connect_string();
        zk_settings.session_timeout = Duration::from_secs(4);
        zk_settings.foreground_timeout = Duration::from_secs(10);
        zk_settings.background_timeout = Duration::from_secs(10);
        zk_settings.lock_root = format!("/zkguard-test/txn-{tag}-{suffix}");
        let mut config = tempfile::Builder::new()
            .suffix(".properties")
            .tempfile()
            .unwrap();
        // Children get 2 s sessions, so that a killed or stopped one's locks go quickly.
        writeln!(
            config,
            "zookeeper.servers={}\nzookeeper.lock.root={}\nzookeeper.session.timeout=2000\nzookeeper.connection.delay=100\nelasticsearch.url={}\ntxn.log.index={}\ntxn.recovery.after=0\ntxn.accounts.index=t-{tag}-acc-{suffix}\ntxn.transactions.index=t-{tag}-txn-{suffix}",
            zk_settings.servers,
            zk_settings.lock_root,
            es().url(),
            settings.log_index,
        )
        .unwrap();
        Self {
            index: format!("t-{tag}-docs-{suffix}"),
            settings,
            zk: zk_settings,
            store: Arc::new(EsStore::from_url(es().url()).expect("client")),
            config,
        }
    }

    /// A lock service over a session of its own.
    pub async fn locks(&self) -> Arc<dyn LockService> {
        Arc::new(ZkLockService::new(
            ZkSession::connect(&self.zk)
                .await
                .expect("connect to ZooKeeper"),
        ))
    }

    pub async fn transactions(&self) -> Transactions {
        Transactions::new(
            self.locks().await,
            self.store.clone(),
            self.settings.clone(),
        )
    }

    pub async fn seed(&self, docs: &[(&str, Value)]) {
        for (id, source) in docs {
            self.store
                .index(&self.index, id, source, WriteCondition::Always, Refresh::No)
                .await
                .expect("seed a document");
        }
    }

    pub async fn doc(&self, id: &str) -> Option<Doc> {
        self.store
            .get(&self.index, id)
            .await
            .expect("read a document")
    }

    /// A document's source without zkguard's stamp, `None` when absent.
    pub async fn source(&self, id: &str) -> Option<Value> {
        self.doc(id).await.map(|d| {
            let mut s = d.source;
            s.as_object_mut().unwrap().remove("zkguard");
            s
        })
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = crate::cli::zkguard();
        c.arg("--config")
            .arg(self.config.path())
            .arg("txn")
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("ZKGUARD_CONFIG");
        c
    }

    /// Runs `zkguard txn ARGS` with `stdin`.
    pub fn cli(&self, args: &[&str], stdin: &str) -> Run {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run zkguard");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// The points a coordinator of `size` documents is stopped at.
pub fn points(size: usize) -> Vec<String> {
    let mut p = vec!["locked".to_string(), "logged".to_string()];
    for n in [1, size / 2, size] {
        let point = format!("applied:{n}");
        if n >= 1 && !p.contains(&point) {
            p.push(point);
        }
    }
    p.extend(["committed", "cleared", "finished"].map(String::from));
    p
}

/// A transaction of `size` documents stopped at `point`: document `k` is updated (`k % 3 ==
/// 0`, it exists), deleted (`1`, it exists) or created (`2`, it does not exist).
pub struct CrashCase {
    pub id: String,
    pub size: usize,
    pub point: String,
    ops: String,
}

impl CrashCase {
    pub fn new(env: &Env, size: usize, point: &str) -> Self {
        let id = format!("c{size}-{}", point.replace(':', "-"));
        let ops = (0..size)
            .map(|k| {
                let doc = format!("{id}-{k}");
                match k % 3 {
                    0 => json!({"action": "update", "index": env.index, "id": doc, "doc": {"v": "after"}, "expect": {"exists": true}}),
                    1 => json!({"action": "delete", "index": env.index, "id": doc}),
                    _ => json!({"action": "index", "index": env.index, "id": doc, "doc": {"v": "after", "k": k}}),
                }
                .to_string()
                    + "\n"
            })
            .collect();
        Self {
            id,
            size,
            point: point.to_string(),
            ops,
        }
    }

    pub async fn seed(&self, env: &Env) {
        for k in (0..self.size).filter(|k| k % 3 != 2) {
            let doc = format!("{}-{k}", self.id);
            env.seed(&[(doc.as_str(), json!({"v": "before", "k": k}))])
                .await;
        }
    }

    fn before(&self, k: usize) -> Option<Value> {
        (k % 3 != 2).then(|| json!({"v": "before", "k": k}))
    }

    fn after(&self, k: usize) -> Option<Value> {
        match k % 3 {
            0 => Some(json!({"v": "after", "k": k})),
            1 => None,
            _ => Some(json!({"v": "after", "k": k})),
        }
    }

    /// Whether the transaction is decided (committed) at its point.
    fn committed(&self) -> bool {
        matches!(self.point.as_str(), "committed" | "cleared" | "finished")
    }

    /// Starts the coordinator and returns once it says it is paused at the point.
    pub fn spawn_paused(&self, env: &Env) -> Paused {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &self.ops).unwrap();
        let mut child = env
            .command(&[
                "apply",
                "--file",
                file.path().to_str().unwrap(),
                "--id",
                &self.id,
                "--pause-after",
                &self.point,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run zkguard txn apply");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut seen = String::new();
        loop {
            let mut line = String::new();
            let n = stderr.read_line(&mut line).unwrap();
            assert!(
                n > 0,
                "{}: the coordinator ended before its pause: {seen}",
                self.id
            );
            seen.push_str(&line);
            if line.starts_with("paused after") {
                break;
            }
        }
        Paused {
            stdin: child.stdin.take(),
            child,
            stderr,
            _file: file,
        }
    }

    /// Every document wholly in its before state (not committed) or its after state
    /// (committed), with no mark; the log says which.
    pub async fn check(&self, env: &Env) {
        let committed = self.committed();
        for k in 0..self.size {
            let doc = format!("{}-{k}", self.id);
            let want = if committed {
                self.after(k)
            } else {
                self.before(k)
            };
            let stored = env.doc(&doc).await;
            if let Some(d) = &stored {
                assert!(
                    d.source["zkguard"].get("txn").is_none(),
                    "{} ({}): `{doc}` still marked: {}",
                    self.id,
                    self.point,
                    d.source
                );
            }
            assert_eq!(
                env.source(&doc).await,
                want,
                "{} stopped after {}: `{doc}`",
                self.id,
                self.point
            );
        }
        let record = Transactions::new(
            Arc::new(ZkLockService::new(
                ZkSession::connect(&env.zk).await.unwrap(),
            )),
            env.store.clone(),
            env.settings.clone(),
        )
        .get(&self.id)
        .await
        .unwrap();
        let state = record.map(|r| r.state);
        let want = match self.point.as_str() {
            "locked" => None,
            _ if committed => Some(MultiState::Finished),
            _ => Some(MultiState::RolledBack),
        };
        assert_eq!(state, want, "{} stopped after {}", self.id, self.point);
    }
}

/// A coordinator paused at a point.
pub struct Paused {
    child: Child,
    stdin: Option<ChildStdin>,
    stderr: BufReader<std::process::ChildStderr>,
    _file: tempfile::NamedTempFile,
}

impl Paused {
    pub fn kill(&mut self) {
        self.signal(Signal::SIGKILL);
        let _ = self.child.wait();
    }

    pub fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), signal).expect("signal the coordinator");
    }

    /// Lets it go on and waits for its end.
    pub fn resume_and_wait(mut self) -> Run {
        let mut stdin = self.stdin.take().unwrap();
        let _ = stdin.write_all(b"\n");
        drop(stdin);
        let mut stderr = String::new();
        let _ = std::io::Read::read_to_string(&mut self.stderr, &mut stderr);
        let out = self.child.wait_with_output().unwrap();
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr,
        }
    }
}

/// Applies every write and loses the reply of each odd one (`index` on the log, `_bulk` on the
/// documents), as when a connection drops after the server acted: the coordinator's retries
/// must recognise its own writes.
pub struct LoseEveryOtherReply {
    pub seen: std::sync::atomic::AtomicU64,
    pub lost: std::sync::atomic::AtomicU64,
}

#[async_trait::async_trait]
impl zkguard::es::StoreHook for LoseEveryOtherReply {
    async fn after(
        &self,
        call: &zkguard::es::StoreCall<'_>,
        outcome: Result<(), &zkguard::es::EsError>,
    ) -> Option<zkguard::es::EsError> {
        use std::sync::atomic::Ordering;
        if !matches!(
            call,
            zkguard::es::StoreCall::Index { .. } | zkguard::es::StoreCall::Bulk { .. }
        ) || outcome.is_err()
        {
            return None;
        }
        if self.seen.fetch_add(1, Ordering::SeqCst) % 2 == 0 {
            self.lost.fetch_add(1, Ordering::SeqCst);
            return Some(zkguard::es::EsError::Transport {
                url: "lossy".into(),
                reason: "reply lost (injected)".into(),
            });
        }
        None
    }
}
