//! [`ZkEnsemble`]: a ZooKeeper quorum of N members on loopback.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use super::error::{log_tail, ServerError};
use super::four_letter::{four_letter_word, srvr_mode};
use super::links;
use super::process::{
    display_status, free_port, log_mentions_port_clash, retry_port_clashes, Attempt, Proc, TempDir,
};
use super::zookeeper::{java_command, probe_zk, zk_command, zoo_cfg_common};
use super::{FOUR_LETTER_TIMEOUT, POLL, STOP_GRACE};

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
