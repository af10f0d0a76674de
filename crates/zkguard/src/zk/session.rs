//! One ZooKeeper session shared by many locks, replaced after expiry.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch, Mutex};
use tracing::{debug, info, warn};

use zookeeper_client::{Client, SessionState, StateWatcher};

use crate::config::grace::{effective_loss_grace, tls_connection_timeout, TLS_CONNECT_TIMEOUT};
use crate::config::ZkSettings;
use crate::lock::LockError;

use super::confirm::Confirmation;
use super::map_zk;
use super::protocol::SessionKnowledge;
use super::reaper::Reap;

/// The state of every session this process opened, so that [`wait_for_sessions_to_end`] can let
/// them end in order before the runtime goes away.
static SESSIONS: StdMutex<Vec<StateWatcher>> = StdMutex::new(Vec::new());

fn register_session(client: &Client) {
    let mut sessions = SESSIONS.lock().unwrap_or_else(|e| e.into_inner());
    sessions.retain(|s| !s.peek_state().is_terminated());
    sessions.push(client.state_watcher());
}

/// Waits, up to `limit`, until every connected ZooKeeper session this process opened has ended.
///
/// A session ends once nothing uses it any more (its [`ZkSession`] clones and guards are gone):
/// the client then closes it, which deletes its ephemeral nodes at once. Call this before the
/// tokio runtime shuts down (the `zkguard` binary does, before it exits): a runtime that shuts
/// down under a live session drops the session's task mid-way, so its nodes stay until the
/// session timeout and its watches end without a terminal event. Disconnected sessions are not
/// waited for (they cannot close in order).
pub async fn wait_for_sessions_to_end(limit: Duration) {
    let sessions: Vec<StateWatcher> = SESSIONS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .drain(..)
        .collect();
    let all = async {
        for mut s in sessions {
            while let SessionState::SyncConnected | SessionState::ConnectedReadOnly = s.peek_state()
            {
                s.changed().await;
            }
        }
    };
    if tokio::time::timeout(limit, all).await.is_err() {
        debug!("a ZooKeeper session was still in use when the process ended");
    }
}

/// Connection health of one ZooKeeper session, as the locks need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Health {
    /// Connected.
    Connected,
    /// Disconnected since this instant (when the client noticed it, which may be long after its
    /// last answer: a held lock's loss counts from the session's confirmation instead, see
    /// [`Slot::confirmed`]); the session may still be alive.
    Disconnected { since: Instant },
    /// The session expired: every ephemeral node of it is gone.
    Expired,
    /// The client was closed.
    Closed,
}

/// One live ZooKeeper session (one `Client`).
pub(crate) struct Slot {
    pub client: Client,
    pub session_id: i64,
    /// How long after [`Slot::confirmed`] a held lock of this session counts as lost: the
    /// configured `zookeeper.lock.loss.grace`, at most `config::grace::max_loss_grace` of the
    /// negotiated timeout (and that bound by default).
    pub grace: Duration,
    health: watch::Receiver<Health>,
    /// When the quorum last answered for this session, and its confirmer (`zk::confirm`).
    confirmation: Confirmation,
    /// What this session's acquisitions learned about it (its ACL's refusals, the monitors
    /// busy lately), kept by the lock's core: see [`SessionKnowledge`].
    pub learned: StdMutex<SessionKnowledge>,
    reaper: mpsc::UnboundedSender<Reap>,
    /// Whether the lock root's ACL was checked against `zookeeper.acl` in this session.
    pub lock_root_checked: AtomicBool,
    /// Whether releases may mark the holder's queue node (`release::release_held`): cleared
    /// when `zookeeper.acl` does not let this session write its own nodes.
    pub mark_releases: AtomicBool,
    /// The fast paths of this session's acquisitions on their way, sent together
    /// (`zk::batch`).
    pub fast_paths: Arc<super::batch::FastPaths>,
    /// The session's releases going together (`zk::release_batch`).
    pub releases: Arc<super::release_batch::Releases>,
    /// The size limit of the session's requests (`zookeeper.max.request.bytes`).
    pub limit: super::request_size::Limit,
    /// This session's waiters that a holder of the session may hand its lock to
    /// (`zk::successor`).
    pub successors: super::successor::Successors,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("session_id", &format_args!("{:#x}", self.session_id))
            .finish()
    }
}

/// The connector `settings` describe: session timeout, authentication (digest or SASL) and TLS.
/// This is the one place where `zookeeper.auth.*`, `zookeeper.sasl.*` and `zookeeper.tls.*` are
/// applied; every session of every command is made through it.
fn connector(settings: &ZkSettings) -> Result<zookeeper_client::Connector, LockError> {
    let mut connector = Client::connector().with_session_timeout(settings.session_timeout);
    match &settings.auth {
        Some(auth) if auth.is_sasl() => {
            connector = connector.with_sasl(zookeeper_client::SaslOptions::digest_md5(
                auth.user().to_string(),
                auth.password().to_string(),
            ));
        }
        Some(auth) => connector = connector.with_auth(&auth.scheme, auth.credentials.as_bytes()),
        None => {}
    }
    if let Some(tls) = &settings.tls {
        connector = connector
            .with_tls(super::tls::options(tls)?)
            .with_connection_timeout(tls_connection_timeout(settings.session_timeout));
    }
    Ok(connector)
}

impl Slot {
    /// Current health.
    pub fn health(&self) -> Health {
        *self.health.borrow()
    }

    /// A receiver of health changes.
    pub fn health_watch(&self) -> watch::Receiver<Health> {
        self.health.clone()
    }

    /// The send instant of the newest request that the ZooKeeper quorum is known to have answered
    /// for this session: a confirmation (`zk::confirm`), the session's creation, or an
    /// acquisition ([`Slot::credit`]). The leader cannot have expired the session before this
    /// plus the bound of the grace.
    pub fn confirmed(&self) -> Instant {
        self.confirmation.confirmed()
    }

    /// Records an answer of the quorum for this session to a request sent at `at` (see
    /// [`Slot::confirmed`]).
    pub fn credit(&self, at: Instant) {
        self.confirmation.credit(at);
    }

    /// One more lock held by this session: it is confirmed with the quorum while it holds one.
    /// Each call is matched by one [`Slot::unhold`].
    pub fn hold(&self) {
        self.confirmation.hold();
    }

    /// One lock less held by this session.
    pub fn unhold(&self) {
        self.confirmation.unhold();
    }

    /// Queues cleanup for the reaper task (never blocks, never panics).
    pub fn reap(&self, reap: Reap) {
        if self.reaper.send(reap).is_err() {
            debug!("reaper gone; the session's end removes the nodes");
        }
    }

    /// What this session's acquisitions learned about it.
    pub fn learned(&self) -> std::sync::MutexGuard<'_, SessionKnowledge> {
        self.learned.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct Inner {
    settings: ZkSettings,
    owner: String,
    host: String,
    current: RwLock<Option<Arc<Slot>>>,
    connecting: Mutex<()>,
    closed: AtomicBool,
    /// The connection state reported by [`ZkSession::connection_state`].
    state: super::state::StateSender,
    /// The application's connector ([`ZkSession::from_connector`]), if any.
    connector: Option<zookeeper_client::Connector>,
}

/// A ZooKeeper session serving many locks.
///
/// It connects with `zookeeper.connection.retry` attempts `zookeeper.connection.delay` apart,
/// asks for `zookeeper.session.timeout`, and after a session expiry connects a new session for
/// the next lock (locks held by the expired session report [`crate::LossReason::SessionExpired`]).
/// Cloning is cheap; clones share the session.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use zkguard::{config::Settings, LockRequest, LockService, ZkLockService, ZkSession};
///
/// let settings = Settings::load(None)?;
/// let session = ZkSession::connect(&settings.zookeeper).await?;
/// // One session serves every lock of the process.
/// let locks = ZkLockService::new(session.clone());
/// let guard = locks.acquire(LockRequest::new("article-42", "Save Content")).await?;
/// guard.unlock().await?;
/// // At the end: close the session and wait until ZooKeeper has removed its nodes.
/// session.close_and_wait(Duration::from_secs(2)).await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZkSession {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ZkSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkSession")
            .field("servers", &self.inner.settings.servers)
            .field("owner", &self.inner.owner)
            .field("session_id", &self.session_id().map(|s| format!("{s:#x}")))
            .finish()
    }
}

/// Fails with [`LockError::MissingChroot`] when `servers` ends with a chroot that does not exist
/// (every path would otherwise fail with a baffling "no node"). One request, only with a chroot.
async fn check_chroot(client: &Client, servers: &str) -> Result<(), LockError> {
    let (hosts, Some(chroot)) = crate::config::split_zk_chroot(servers) else {
        return Ok(());
    };
    if chroot == "/" {
        return Ok(());
    }
    match client.check_stat("/").await {
        Ok(Some(_)) => Ok(()),
        Ok(None) | Err(zookeeper_client::Error::NoNode) => Err(LockError::MissingChroot {
            chroot: chroot.to_string(),
            servers: hosts.to_string(),
        }),
        Err(e) => Err(map_zk(e, "checking the chroot of zookeeper.servers")),
    }
}

impl ZkSession {
    /// Connects to `settings.servers`.
    ///
    /// # Errors
    /// [`LockError::ConnectionLoss`] naming the servers when no attempt succeeded.
    ///
    /// # Cancellation safety
    /// Cancel-safe: nothing is left behind.
    pub async fn connect(settings: &ZkSettings) -> Result<Self, LockError> {
        Self::connect_with(settings, None).await
    }

    pub(super) async fn connect_with(
        settings: &ZkSettings,
        connector: Option<zookeeper_client::Connector>,
    ) -> Result<Self, LockError> {
        let host = hostname::get()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "unknown".into());
        let owner = format!(
            "{host}:{}:{}",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let session = Self {
            inner: Arc::new(Inner {
                settings: settings.clone(),
                owner,
                host,
                current: RwLock::new(None),
                connecting: Mutex::new(()),
                closed: AtomicBool::new(false),
                state: super::state::channel(),
                connector,
            }),
        };
        session.slot().await?;
        Ok(session)
    }

    pub(super) fn state_sender(&self) -> &super::state::StateSender {
        &self.inner.state
    }

    /// The settings this session was made with.
    pub fn settings(&self) -> &ZkSettings {
        &self.inner.settings
    }

    /// This process's owner id, written into every node it creates (`host:pid:random`).
    pub fn owner_id(&self) -> &str {
        &self.inner.owner
    }

    /// The host name written into nodes.
    pub fn host(&self) -> &str {
        &self.inner.host
    }

    /// The current ZooKeeper session id, if connected.
    pub fn session_id(&self) -> Option<i64> {
        self.inner
            .current
            .read()
            .expect("slot lock")
            .as_ref()
            .map(|s| s.session_id)
    }

    /// The live session, connecting a new one if the previous expired.
    pub(crate) async fn slot(&self) -> Result<Arc<Slot>, LockError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(LockError::Backend {
                context: String::new(),
                detail: "the ZooKeeper session was closed".into(),
            });
        }
        if let Some(slot) = self.live_slot() {
            return Ok(slot);
        }
        let _connecting = self.inner.connecting.lock().await;
        if let Some(slot) = self.live_slot() {
            return Ok(slot);
        }
        let slot = Arc::new(self.connect_slot().await?);
        *self.inner.current.write().expect("slot lock") = Some(slot.clone());
        Ok(slot)
    }

    fn live_slot(&self) -> Option<Arc<Slot>> {
        let cur = self.inner.current.read().expect("slot lock");
        cur.as_ref()
            .filter(|s| !matches!(s.health(), Health::Expired | Health::Closed))
            .cloned()
    }

    async fn connect_slot(&self) -> Result<Slot, LockError> {
        let s = &self.inner.settings;
        let attempts = s.connection_retry.max(1);
        let mut last = String::new();
        let configured = match &self.inner.connector {
            Some(c) => c.clone(),
            None => connector(s)?,
        };
        // A TLS handshake with a server that has not made one yet can take a second or more
        // (the JVM warms up), beyond the client's default of 2/5 of the session timeout.
        let per_attempt = if s.tls.is_some() {
            s.session_timeout.max(TLS_CONNECT_TIMEOUT * 2)
        } else {
            s.session_timeout.max(Duration::from_secs(2))
        };
        let mut advice = "check zookeeper.servers and that ZooKeeper is running";
        for attempt in 1..=attempts {
            // Creating the session goes through the leader: the session counts as confirmed
            // from the start of the attempt that created it.
            let attempted = Instant::now();
            let connector = configured.clone().with_fail_eagerly();
            let connecting = async {
                if s.tls.is_some() {
                    connector.secure_connect(&s.servers).await
                } else {
                    connector.connect(&s.servers).await
                }
            };
            match tokio::time::timeout(per_attempt, connecting).await {
                Ok(Ok(client)) => {
                    check_chroot(&client, &s.servers).await?;
                    return Ok(self.start_slot(client, attempted));
                }
                Ok(Err(zookeeper_client::Error::AuthFailed)) => {
                    last = "ZooKeeper refused the authentication (AuthFailed)".into();
                    advice = match &s.auth {
                        Some(a) if a.is_sasl() => "check zookeeper.sasl.username and zookeeper.sasl.password against the server's JAAS Server section",
                        _ => "check zookeeper.auth.scheme and its credentials",
                    };
                }
                Ok(Err(e)) => {
                    last = e.to_string();
                    if let Some(tls) = &s.tls {
                        if let Some(problem) = super::tls::diagnose(&s.servers, tls).await {
                            last = problem;
                            advice = "check zookeeper.tls.ca (and zookeeper.tls.cert/key when the server requires a client certificate), and that the servers' certificates name the hosts of zookeeper.servers";
                        }
                    }
                }
                Err(_) => last = "timed out".into(),
            }
            warn!(attempt, attempts, servers = %s.servers, error = %last, "cannot connect to ZooKeeper");
            if attempt < attempts {
                tokio::time::sleep(s.connection_delay).await;
            }
        }
        Err(LockError::ConnectionLoss {
            context: format!("connecting to ZooKeeper at {}", s.servers),
            detail: format!(
                "{attempts} attempt{} failed, last: {last}; {advice}",
                if attempts == 1 { "" } else { "s" }
            ),
        })
    }

    fn start_slot(&self, client: Client, attempted: Instant) -> Slot {
        let session_id = client.session_id().0;
        let negotiated = client.session_timeout();
        let settings = &self.inner.settings;
        // zkguard's own connector sets a connection timeout with TLS only; an application's
        // connector may have set any, taken at its worst (see `config::grace::max_loss_grace`).
        let connection_timeout = match &self.inner.connector {
            Some(_) => Some(negotiated * 3 / 5),
            None => settings.connection_timeout(settings.session_timeout),
        };
        let (grace, cut) =
            effective_loss_grace(settings.loss_grace, negotiated, connection_timeout);
        if cut {
            warn!(
                configured_ms = settings.loss_grace.unwrap_or_default().as_millis() as u64,
                grace_ms = grace.as_millis() as u64,
                negotiated_timeout_ms = negotiated.as_millis() as u64,
                bound = %crate::config::grace::describe_max_loss_grace(negotiated, connection_timeout),
                "zookeeper.lock.loss.grace exceeds the safe bound for the session timeout the server granted: using the bound"
            );
        }
        info!(
            session_id = format!("{session_id:#x}"),
            timeout_ms = negotiated.as_millis() as u64,
            grace_ms = grace.as_millis() as u64,
            "ZooKeeper session established"
        );
        register_session(&client);
        let (health_tx, health_rx) = watch::channel(Health::Connected);
        let mut states = client.state_watcher();
        let state_tx = self.inner.state.clone();
        super::state::publish(&state_tx, super::ConnectionState::Connected);
        tokio::spawn(async move {
            loop {
                let state = states.changed().await;
                super::state::publish(&state_tx, state.into());
                let health = match state {
                    SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                        Health::Connected
                    }
                    SessionState::Disconnected => Health::Disconnected {
                        since: Instant::now(),
                    },
                    SessionState::Expired | SessionState::AuthFailed => Health::Expired,
                    SessionState::Closed => Health::Closed,
                };
                debug!(?state, "ZooKeeper session state");
                let terminal = matches!(health, Health::Expired | Health::Closed);
                if health_tx.send(health).is_err() || terminal {
                    break;
                }
            }
        });
        let reaper = super::reaper::spawn(client.clone());
        let confirmation = Confirmation::start(&client, attempted, grace);
        let limit = super::request_size::Limit::of(&client, settings.max_request_bytes);
        let fast_paths = super::batch::FastPaths::new(client.clone(), reaper.clone(), limit);
        let releases = super::release_batch::Releases::new(client.clone(), limit);
        Slot {
            client,
            session_id,
            grace,
            health: health_rx,
            confirmation,
            learned: StdMutex::new(SessionKnowledge::new()),
            lock_root_checked: AtomicBool::new(false),
            mark_releases: AtomicBool::new(true),
            fast_paths,
            releases,
            limit,
            successors: super::successor::Successors::default(),
            reaper,
        }
    }

    /// How many acquisitions of the current session wait where a holder of the same session
    /// can hand them its lock in one transaction (`docs/zookeeper-lock.md`, "Hand-over within a
    /// session"): how a test or a benchmark knows that a hand-over can happen before it
    /// releases.
    pub fn waiting_for_hand_over(&self) -> usize {
        self.live_slot().map_or(0, |slot| slot.successors.len())
    }

    /// Whether the current session is connected to a server (false while disconnected, after
    /// an expiry until a new session is connected, and after [`ZkSession::close`]).
    pub fn is_connected(&self) -> bool {
        self.inner
            .current
            .read()
            .expect("slot lock")
            .as_ref()
            .is_some_and(|s| s.health() == Health::Connected)
    }

    /// Connects a new session if the current one expired (a no-op while it lives, even when
    /// disconnected: the client reconnects by itself). Long-running services call it so that
    /// they report ready again without waiting for the next lock.
    ///
    /// # Errors
    /// [`LockError::ConnectionLoss`] when no attempt succeeded; an error after
    /// [`ZkSession::close`].
    ///
    /// # Cancellation safety
    /// Cancel-safe.
    pub async fn ensure_session(&self) -> Result<(), LockError> {
        self.slot().await.map(|_| ())
    }

    /// Closes the session and waits up to `limit` until the client has ended it with the server,
    /// so that its ephemeral nodes (queue places, held locks) are gone when this returns. Call it
    /// after every guard of the session was released or dropped: a guard still alive keeps the
    /// session open, and this returns `false` at the limit. No new lock can be taken afterwards.
    pub async fn close_and_wait(&self, limit: Duration) -> bool {
        self.inner.closed.store(true, Ordering::Release);
        super::state::publish(&self.inner.state, super::ConnectionState::Closed);
        let Some(slot) = self.inner.current.write().expect("slot lock").take() else {
            return true;
        };
        let mut health = slot.health.clone();
        drop(slot);
        tokio::time::timeout(limit, async move {
            loop {
                if matches!(
                    *health.borrow_and_update(),
                    Health::Closed | Health::Expired
                ) {
                    return;
                }
                if health.changed().await.is_err() {
                    return;
                }
            }
        })
        .await
        .is_ok()
    }

    /// Closes the session once the last guard of it is gone: its ephemeral nodes (queue places,
    /// held locks) then go away at once rather than after the session timeout. No new lock can
    /// be taken through this session afterwards.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        super::state::publish(&self.inner.state, super::ConnectionState::Closed);
        self.inner.current.write().expect("slot lock").take();
    }
}

// The connection-state watch (`zk::state`) and sessions from an application's connector.
impl ZkSession {
    /// A receiver of this session's connection state: [`watch::Receiver::borrow`] gives the
    /// current one, [`watch::Receiver::changed`] waits for the next change. Changes that follow
    /// each other quickly may be seen as their last one only (a `Suspended` then `Connected`
    /// within a moment may read as `Connected`);
    /// [`ConnectionState::Lost`](super::ConnectionState::Lost) stays until a new session is
    /// connected, and [`ConnectionState::Closed`](super::ConnectionState::Closed) is final.
    ///
    /// ```no_run
    /// # async fn example(session: zkguard::ZkSession) {
    /// use zkguard::zk::ConnectionState;
    /// let mut states = session.connection_state();
    /// tokio::spawn(async move {
    ///     while states.changed().await.is_ok() {
    ///         let state = *states.borrow_and_update();
    ///         match state {
    ///             ConnectionState::Suspended => eprintln!("pausing writes"),
    ///             ConnectionState::Lost => eprintln!("locks lost; re-acquire"),
    ///             ConnectionState::Connected => eprintln!("connected"),
    ///             _ => break,
    ///         }
    ///     }
    /// });
    /// # }
    /// ```
    pub fn connection_state(&self) -> watch::Receiver<super::ConnectionState> {
        self.state_sender().subscribe()
    }

    /// Like [`ZkSession::connect`], connecting with `connector` (authentication, TLS, SASL,
    /// read-only mode, connection timeout: whatever the application set on it) instead of one
    /// built from `settings`. `settings` still gives the servers, the connection attempts and
    /// their delay, the lock root, prefixes and timeouts; `zookeeper.session.timeout`,
    /// `zookeeper.auth.*`, `zookeeper.sasl.*` and `zookeeper.tls.*` are not applied (set them on
    /// the connector with `with_session_timeout`, `with_auth`, `with_sasl` and `with_tls`; with
    /// `zookeeper.tls.enabled` the servers are reached over TLS, which needs `with_tls`). zkguard adds
    /// `with_fail_eagerly` so that each attempt ends when no server answers. The connector is
    /// used again for each new session after an expiry, so it must not carry a session
    /// (`with_session`).
    ///
    /// # Errors
    /// As [`ZkSession::connect`].
    pub async fn from_connector(
        connector: zookeeper_client::Connector,
        settings: &ZkSettings,
    ) -> Result<Self, LockError> {
        Self::connect_with(settings, Some(connector)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::ZkServer;

    /// The sequence behind a rare panic at process exit: the runtime that runs a session's task
    /// shuts down (dropping the task, so no terminal event is ever sent) while a watch of that
    /// session (a waiter's or a holder's watch on a lock node) is still polled. Polling must
    /// report the end, not panic.
    #[test]
    fn a_watch_polled_after_its_session_task_is_gone_reports_the_end() {
        let zk = ZkServer::builder()
            .tick_time(500)
            .start()
            .expect("start ZooKeeper (run scripts/install-deps.sh)");
        let mut settings = crate::config::Settings::default().zookeeper;
        settings.servers = zk.connect_string();
        settings.connection_retry = 3;
        let session_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let path = "/watch-end";
        let (session, watcher) = session_rt.block_on(async {
            let session = ZkSession::connect(&settings).await.unwrap();
            let slot = session.slot().await.unwrap();
            let open = zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::anyone_all());
            slot.client.create(path, &[], &open).await.unwrap();
            let (_, _, watcher) = slot.client.get_and_watch_data(path).await.unwrap();
            (session, watcher)
        });
        // The session task goes away with its runtime, without a terminal event.
        drop(session_rt);
        // Before the fix this panicked in the client (a cancelled oneshot unwrapped in
        // `OneshotReceiver::recv`).
        let event = futures::executor::block_on(watcher.changed());
        assert_eq!(event.event_type, zookeeper_client::EventType::Session);
        assert!(
            event.session_state.is_terminated(),
            "the end of the session must reach the watcher: {event:?}"
        );
        drop(session);
    }
}
