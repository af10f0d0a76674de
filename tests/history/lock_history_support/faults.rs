//! The faults, each recorded as a window: `FaultStart` when it is injected, `FaultEnd` when it
//! is healed. What "healed" means for each kind is said at its function; the checker extends
//! each window over the operations it touched (see `checker`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::Rng;
use tokio::sync::Mutex;
use zkguard::testkit::{Partition, ZkEnsemble, ZkServer};
use zkguard::zk::{ConnectionState, TOKEN_BASE};
use zkguard::ZkSession;

use super::children::{signal, ChildEnv, ChildSpec};
use super::history::{Class, Ev, FaultKind, Outcome, Recorder, Target};
use zkguard::testkit::proxy::{
    ZkProxy, OP_CREATE, OP_CREATE2, OP_DELETE, OP_GET_CHILDREN, OP_GET_CHILDREN2, OP_GET_DATA,
    OP_MULTI, OP_MULTI_READ, OP_SYNC,
};

/// The ZooKeeper of a run.
pub enum Cluster {
    Standalone(ZkServer),
    Ensemble(ZkEnsemble),
}

impl Cluster {
    pub fn connect_string(&self) -> String {
        match self {
            Cluster::Standalone(zk) => zk.connect_string(),
            Cluster::Ensemble(e) => e.connect_string(),
        }
    }
}

/// A session of this process, its way to ZooKeeper, and how many of its workers hold a lock.
pub struct SessionHandle {
    pub client: String,
    pub session: ZkSession,
    /// Client → proxy (cuts at a chosen request) → partition (cuts everything) → server.
    pub proxy: Option<ZkProxy>,
    pub partition: Option<Partition>,
    pub holding: Arc<AtomicUsize>,
}

/// A plain client of its own that reads the lock nodes (reconnected after a failure).
pub struct Observer {
    servers: String,
    client: Mutex<Option<zookeeper_client::Client>>,
}

impl Observer {
    pub fn new(servers: &str) -> Self {
        Observer {
            servers: servers.to_string(),
            client: Mutex::new(None),
        }
    }

    async fn client(&self) -> Option<zookeeper_client::Client> {
        let mut c = self.client.lock().await;
        if c.is_none() {
            // A long session: the observer outlives server restarts and elections.
            let connect = zookeeper_client::Client::connector()
                .with_session_timeout(Duration::from_secs(30))
                .connect(&self.servers);
            *c = tokio::time::timeout(Duration::from_secs(5), connect)
                .await
                .ok()
                .and_then(Result::ok);
        }
        c.clone()
    }

    async fn forget(&self) {
        *self.client.lock().await = None;
    }

    /// The children of `path` (empty when it does not exist); `None` when ZooKeeper could not
    /// be read.
    pub async fn children(&self, path: &str) -> Option<Vec<String>> {
        let client = self.client().await?;
        match tokio::time::timeout(Duration::from_secs(5), client.list_children(path)).await {
            Ok(Ok(c)) => Some(c),
            Ok(Err(zookeeper_client::Error::NoNode)) => Some(Vec::new()),
            _ => {
                self.forget().await;
                None
            }
        }
    }

    /// `(czxid, ephemeral owner)` of `path`: `Some(None)` when it does not exist, `None` when
    /// ZooKeeper could not be read.
    pub async fn stat(&self, path: &str) -> Option<Option<(i64, i64)>> {
        let client = self.client().await?;
        match tokio::time::timeout(Duration::from_secs(5), client.check_stat(path)).await {
            Ok(Ok(s)) => Some(s.map(|s| (s.czxid, s.ephemeral_owner))),
            Ok(Err(zookeeper_client::Error::NoNode)) => Some(None),
            _ => {
                self.forget().await;
                None
            }
        }
    }

    /// The queue node through which a holder with `token` got the lock of `monitor`: the
    /// `czxid` of the node that `privateLock` names (as a token, `TOKEN_BASE` + zxid), read
    /// behind a `sync` while the lock is held. `None` when `privateLock` is not that holder's
    /// any more or cannot be read.
    pub async fn queue_node_token(
        &self,
        root: &str,
        monitor: &str,
        token: u64,
    ) -> Option<(String, u64)> {
        let client = self.client().await?;
        let mutex = format!("{root}/{monitor}/privateLock");
        let read = async {
            client.sync(&mutex).await?;
            let (data, stat) = client.get_data(&mutex).await?;
            if stat.czxid as u64 + TOKEN_BASE != token {
                return Ok(None);
            }
            let data: serde_json::Value = serde_json::from_slice(&data).unwrap_or_default();
            let Some(node) = data["node"].as_str() else {
                return Ok(None);
            };
            let stat = client
                .check_stat(&format!("{root}/{monitor}/{node}"))
                .await?;
            Ok::<_, zookeeper_client::Error>(
                stat.map(|s| (node.to_string(), s.czxid as u64 + TOKEN_BASE)),
            )
        };
        match tokio::time::timeout(Duration::from_secs(2), read).await {
            Ok(Ok(found)) => found,
            Ok(Err(zookeeper_client::Error::NoNode)) => None,
            _ => {
                self.forget().await;
                None
            }
        }
    }

    /// Every queue node and `privateLock` under `root`, with its ephemeral owner.
    pub async fn lock_nodes(&self, root: &str) -> Option<Vec<(String, i64)>> {
        let mut out = Vec::new();
        for monitor in self.children(root).await? {
            let path = format!("{root}/{monitor}");
            for node in self.children(&path).await? {
                if node == "privateLock" || node.starts_with("A-") || node.starts_with("B-") {
                    let node = format!("{path}/{node}");
                    if let Some((_, owner)) = self.stat(&node).await? {
                        out.push((node, owner));
                    }
                }
            }
        }
        Some(out)
    }
}

/// What the faults act on.
pub struct FaultCtx<'a> {
    pub rec: &'a Recorder,
    pub cluster: &'a Cluster,
    pub sessions: &'a [SessionHandle],
    pub children: Option<&'a ChildEnv>,
    pub observer: &'a Observer,
    pub lock_root: &'a str,
    pub monitors: &'a [String],
    pub session_timeout: Duration,
}

/// Polls `cond` every 10 ms until it holds (`true`) or `limit` passes (`false`).
async fn until<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + limit;
    loop {
        if cond().await {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

impl FaultCtx<'_> {
    fn start(&self, kind: FaultKind, target: Target) -> u64 {
        let fault = self.rec.id();
        self.rec.now(Ev::FaultStart {
            fault,
            kind,
            target,
        });
        fault
    }

    fn end(&self, fault: u64, injected: bool) {
        self.rec.now(Ev::FaultEnd { fault, injected });
    }

    /// A session that holds a lock right now if one does within a second, else any.
    async fn pick_session(&self, rng: &mut StdRng) -> &SessionHandle {
        let first = rng.gen_range(0..self.sessions.len());
        let order: Vec<&SessionHandle> = (0..self.sessions.len())
            .map(|i| &self.sessions[(first + i) % self.sessions.len()])
            .collect();
        let mut found = None;
        until(Duration::from_secs(1), || {
            found = order
                .iter()
                .find(|s| s.holding.load(Ordering::Acquire) > 0)
                .copied();
            std::future::ready(found.is_some())
        })
        .await;
        found.unwrap_or(order[0])
    }

    /// Waits until no session of this process is between connections (each is connected, or
    /// expired and waiting for its next lock call to connect a new one).
    async fn sessions_settled(&self) {
        until(Duration::from_secs(20), || {
            std::future::ready(
                self.sessions
                    .iter()
                    .all(|s| *s.session.connection_state().borrow() != ConnectionState::Suspended),
            )
        })
        .await;
    }

    /// Cuts a session's connection when it sends a chosen request: before the request reaches
    /// the server, or right after the server answered it. The window ends once the session is
    /// connected again (a new connection through the proxy, and the client says connected).
    /// Not injected if the session sends none of the requests tried within 3 s each (random
    /// ones, multis more often, a multi last).
    pub async fn cut(&self, rng: &mut StdRng, after: bool) -> bool {
        let kind = if after {
            FaultKind::CutAfterApplied
        } else {
            FaultKind::CutBeforeApplied
        };
        let s = self.pick_session(rng).await;
        let proxy = s.proxy.as_ref().expect("a session behind a proxy");
        for attempt in 0..4 {
            let fault = self.start(kind, Target::Client(s.client.clone()));
            let op = *[
                OP_MULTI,
                OP_MULTI,
                OP_MULTI,
                OP_CREATE,
                OP_CREATE2,
                OP_DELETE,
                OP_GET_DATA,
                OP_GET_CHILDREN,
                OP_GET_CHILDREN2,
                OP_MULTI_READ,
                OP_SYNC,
            ]
            .get(if attempt == 3 {
                0
            } else {
                rng.gen_range(0..11)
            })
            .unwrap();
            let (cuts, connections) = (proxy.cuts(), proxy.connections());
            if after {
                proxy.cut_after(op);
            } else {
                proxy.cut_before(op);
            }
            let cut = until(Duration::from_secs(3), || {
                std::future::ready(proxy.cuts() > cuts)
            })
            .await;
            proxy.cut_after(0);
            proxy.cut_before(0);
            if cut || proxy.cuts() > cuts {
                eprintln!(
                    "  cut {} {}",
                    if after { "after" } else { "before" },
                    op_name(op)
                );
                until(Duration::from_secs(20), || {
                    std::future::ready(
                        proxy.connections() > connections && s.session.is_connected(),
                    )
                })
                .await;
                self.end(fault, true);
                return true;
            }
            self.end(fault, false);
        }
        false
    }

    /// Cuts a session off from ZooKeeper (preferably while it holds a lock) until the server
    /// has expired it (it no longer appears in the server's `dump`), then lets it through
    /// again. The window ends there; the session's holds and waits that were under way last
    /// until their workers noticed.
    pub async fn expire_session(&self, rng: &mut StdRng) -> bool {
        let Cluster::Standalone(zk) = self.cluster else {
            panic!("session expiry is injected on the standalone server");
        };
        let s = self.pick_session(rng).await;
        let Some(id) = s.session.session_id() else {
            return false;
        };
        let partition = s.partition.as_ref().expect("a session behind a partition");
        let fault = self.start(FaultKind::SessionExpiry, Target::Client(s.client.clone()));
        partition.cut();
        let hex = format!("{id:#x}");
        let limit = self.session_timeout * 3 + Duration::from_secs(5);
        let expired = until(limit, || {
            let dump = tokio::task::block_in_place(|| zk.four_letter("dump"));
            // Unreadable: as if still there.
            let dump = dump.unwrap_or_else(|_| hex.clone());
            std::future::ready(!dump.split_whitespace().any(|w| w == hex))
        })
        .await;
        partition.heal();
        self.end(fault, expired);
        expired
    }

    /// Starts a `zkguard exec` holder with a long hold on a random monitor and waits until it
    /// holds the lock (up to three tries).
    async fn victim(&self, rng: &mut StdRng) -> Option<(super::children::Running, u64)> {
        let env = self.children.expect("child processes");
        for _ in 0..3 {
            let spec = ChildSpec {
                monitor: self.monitors[rng.gen_range(0..self.monitors.len())].clone(),
                class: Class::Foreground,
                hold_ms: 8000,
                writes: 40,
                timeout: Duration::from_secs(20),
            };
            let mut run = env.spawn(self.rec, spec);
            if let Some(held) = run.wait_held(Duration::from_secs(25)).await {
                return Some((run, held.token));
            }
            run.finish(self.rec).await;
        }
        None
    }

    /// Stops a holder process (SIGSTOP; every other time its command too, else the command
    /// keeps writing with the stale token) until its session expired (its `privateLock` is gone)
    /// and, if that happens within 5 s, another holder's write to the document was accepted
    /// (and, the command running, it has sent a few more writes); then continues it. zkguard notices the loss, stops the command and exits. The window
    /// ends when the process and its command are gone.
    pub async fn pause_process(&self, rng: &mut StdRng, with_command: bool) -> bool {
        let Some((run, token)) = self.victim(rng).await else {
            return false;
        };
        let held = run.held().expect("held");
        let fault = self.start(FaultKind::PausedProcess, Target::Client(run.client.clone()));
        signal(run.pid, Signal::SIGSTOP);
        if with_command {
            signal(held.pid, Signal::SIGSTOP);
        }
        let mutex = format!("{}/{}/privateLock", self.lock_root, run.spec.monitor);
        let czxid = (token - TOKEN_BASE) as i64;
        let limit = self.session_timeout * 3 + Duration::from_secs(10);
        let expired = until(limit, || async {
            matches!(self.observer.stat(&mutex).await, Some(s) if s.is_none_or(|(c, _)| c != czxid))
        })
        .await;
        let overtaken = until(Duration::from_secs(5), || {
            std::future::ready(accepted_above(self.rec, &run.spec.monitor, token))
        })
        .await;
        if overtaken && !with_command {
            // The command, still running, sends a few more writes with its stale token.
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        if with_command {
            signal(held.pid, Signal::SIGCONT);
        }
        signal(run.pid, Signal::SIGCONT);
        let gone = run.finish(self.rec).await;
        self.rec.at(
            gone,
            Ev::FaultEnd {
                fault,
                injected: expired,
            },
        );
        expired
    }

    /// Kills a holder process (SIGKILL; its command dies with it), and starts another process
    /// on the same monitor, which gets the lock once the killed one's session expired. The
    /// window ends when the killed process and its command are gone.
    pub async fn kill_process(&self, rng: &mut StdRng) -> bool {
        let Some((run, _)) = self.victim(rng).await else {
            return false;
        };
        let fault = self.start(FaultKind::KilledProcess, Target::Client(run.client.clone()));
        signal(run.pid, Signal::SIGKILL);
        let monitor = run.spec.monitor.clone();
        let gone = run.finish(self.rec).await;
        self.rec.at(
            gone,
            Ev::FaultEnd {
                fault,
                injected: true,
            },
        );
        let env = self.children.expect("child processes");
        let replacement = env.spawn(
            self.rec,
            ChildSpec {
                monitor,
                class: Class::Foreground,
                hold_ms: 100,
                writes: 2,
                timeout: Duration::from_secs(20),
            },
        );
        replacement.finish(self.rec).await;
        true
    }

    /// Kills the standalone server (SIGKILL), leaves it down for a second and starts it again
    /// on the same data directory. The window (every client) ends once it serves again and no
    /// session is between connections.
    pub async fn restart_zookeeper(&self) -> bool {
        let Cluster::Standalone(zk) = self.cluster else {
            panic!("a standalone server");
        };
        let fault = self.start(FaultKind::RestartedZooKeeper, Target::All);
        tokio::task::block_in_place(|| zk.kill());
        tokio::time::sleep(Duration::from_secs(1)).await;
        tokio::task::block_in_place(|| zk.start_again()).expect("start ZooKeeper again");
        self.sessions_settled().await;
        self.end(fault, true);
        true
    }

    /// Kills the ensemble's leader, leaves it down while the others elect a new one, and
    /// starts it again. The window (every client) ends once it is back in the quorum and no
    /// session is between connections.
    pub async fn kill_leader(&self) -> bool {
        let Cluster::Ensemble(e) = self.cluster else {
            panic!("an ensemble");
        };
        let Some(leader) = tokio::task::block_in_place(|| e.leader()) else {
            return false;
        };
        let fault = self.start(FaultKind::KilledLeader, Target::All);
        tokio::task::block_in_place(|| e.kill(leader)).unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        tokio::task::block_in_place(|| e.start_again(leader)).expect("the old leader rejoins");
        self.sessions_settled().await;
        self.end(fault, true);
        true
    }

    /// Cuts a follower off from the other members (its clients still reach it) for the session
    /// timeout and a second: its sessions expire at the leader while it goes on answering their
    /// pings. Then it rejoins. The window (every client) ends once the quorum has it again and
    /// no session is between connections.
    pub async fn isolate_follower(&self, rng: &mut StdRng) -> bool {
        let Cluster::Ensemble(e) = self.cluster else {
            panic!("an ensemble");
        };
        let Some(leader) = tokio::task::block_in_place(|| e.leader()) else {
            return false;
        };
        let followers: Vec<usize> = (0..e.size()).filter(|&i| i != leader).collect();
        let follower = followers[rng.gen_range(0..followers.len())];
        let fault = self.start(FaultKind::IsolatedFollower, Target::All);
        e.isolate(follower).unwrap();
        tokio::time::sleep(self.session_timeout + Duration::from_secs(1)).await;
        e.rejoin(follower).unwrap();
        tokio::task::block_in_place(|| e.wait_ready()).expect("the follower rejoins");
        self.sessions_settled().await;
        self.end(fault, true);
        true
    }
}

/// Whether a write to `doc` with a token above `token` was accepted (by a contender of this
/// process; children's writes are recorded once they are done).
fn accepted_above(rec: &Recorder, doc: &str, token: u64) -> bool {
    rec.scan(|events| {
        let mut sent = std::collections::HashSet::new();
        events.iter().any(|e| match &e.ev {
            Ev::WriteSent {
                w,
                doc: d,
                token: t,
                ..
            } => {
                if d == doc && *t > token {
                    sent.insert(*w);
                }
                false
            }
            Ev::WriteDone {
                w,
                outcome: Outcome::Accepted,
            } => sent.contains(w),
            _ => false,
        })
    })
}

fn op_name(op: i32) -> &'static str {
    match op {
        OP_MULTI => "multi",
        OP_CREATE => "create",
        OP_CREATE2 => "create2",
        OP_DELETE => "delete",
        OP_GET_DATA => "getData",
        OP_GET_CHILDREN => "getChildren",
        OP_GET_CHILDREN2 => "getChildren2",
        OP_MULTI_READ => "multiRead",
        OP_SYNC => "sync",
        _ => "another request",
    }
}
