//! The priority-lock recipe: acquisition, waiting, release, loss detection.
//!
//! See `docs/zookeeper-lock.md` for the znode layout and the state machines.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{debug, info, instrument, warn, Instrument};
use zookeeper_client::{
    Acls, Client, CreateMode, CreateOptions, Error as ZkError, MultiWriteError, MultiWriteResult,
};

use super::map_zk;
use super::names::{Queue, MUTEX_NODE};
use super::session::{Health, Reap, Slot, ZkSession};
use crate::lock::{
    validate_monitor, Blocker, Guard, LockError, LockRequest, LockService, LockType, LossReason,
    LossSignal,
};

const EPHEMERAL_SEQ: CreateOptions<'static> =
    CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
const EPHEMERAL: CreateOptions<'static> = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
const CONTAINER: CreateOptions<'static> = CreateMode::Container.with_acls(Acls::anyone_all());
const PERSISTENT: CreateOptions<'static> = CreateMode::Persistent.with_acls(Acls::anyone_all());

/// The JSON data of a queue node and of the mutex node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeData {
    /// The lock info ("Save Content").
    pub info: String,
    /// Owner id of the process (`host:pid:random`).
    pub owner: String,
    /// Id of this acquisition attempt: finds the node again after a connection loss.
    pub attempt: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Lock type.
    #[serde(rename = "type")]
    pub lock_type: LockType,
    /// Milliseconds since the Unix epoch when the attempt started.
    pub created_ms: u64,
    /// The queue node of the holder (mutex node only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Set when a background waiter was re-queued as foreground (anti-starvation).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub promoted: bool,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A lock on one monitor object, in the shape of the design's `ZkBlockingWriteLock`.
///
/// ```no_run
/// # async fn f(zk: &zkguard::ZkSession) -> Result<(), zkguard::LockError> {
/// use zkguard::{LockType, ZkBlockingWriteLock};
/// let guard = ZkBlockingWriteLock::new("Bulk Propagation", zk, "article-42")?
///     .with_type(LockType::Background)
///     .lock_with_timeout()
///     .await?;
/// // ... at most one writer of article-42 runs here ...
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct ZkBlockingWriteLock {
    session: ZkSession,
    request: LockRequest,
}

impl ZkBlockingWriteLock {
    /// A foreground lock on `monitor_object` described by `lock_info`.
    ///
    /// # Errors
    /// [`LockError::InvalidMonitor`] when the name cannot be a znode (see
    /// [`crate::lock::validate_monitor`]).
    pub fn new(
        lock_info: impl Into<String>,
        zk: &ZkSession,
        monitor_object: impl Into<String>,
    ) -> Result<Self, LockError> {
        let request = LockRequest::new(monitor_object, lock_info);
        validate_monitor(&request.monitor)?;
        Ok(Self {
            session: zk.clone(),
            request,
        })
    }

    /// Sets the lock type (default foreground).
    pub fn with_type(mut self, lock_type: LockType) -> Self {
        self.request.lock_type = lock_type;
        self
    }

    /// Overrides the configured timeout of the lock type.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.request.timeout = Some(timeout);
        self
    }

    /// Queues for the lock and waits until it is held or the timeout passes. A zero timeout
    /// ([`Duration::ZERO`]) tries once, as [`ZkBlockingWriteLock::try_lock`].
    ///
    /// # Errors
    /// - [`LockError::Timeout`] (the design's `InstanceLockException`): not acquired in time;
    ///   the queue node was removed before this returns. The error names what stood in the way
    ///   when the wait ended (the holder, a stray mutex node or the contenders queued ahead).
    /// - [`LockError::SessionExpired`], [`LockError::ConnectionLoss`]: ZooKeeper trouble.
    ///
    /// # Cancellation safety
    /// Cancel-safe: dropping the future removes the queue node (and the mutex node, if it was
    /// just taken) in the background; nothing outlives the waiter.
    pub async fn lock_with_timeout(&self) -> Result<LockGuard, LockError> {
        acquire(&self.session, self.request.clone()).await
    }

    /// Tries once: takes the lock if it is free right now and no contender that goes first is
    /// queued (a background try fails while foreground contenders wait), in one round trip;
    /// otherwise fails at once. Nothing stays queued either way.
    ///
    /// # Errors
    /// - [`LockError::Timeout`] when the lock is not free, naming the holder (owner and lock
    ///   info from its node), a stray mutex node, or the contenders queued ahead;
    /// - [`LockError::SessionExpired`], [`LockError::ConnectionLoss`]: ZooKeeper trouble.
    ///
    /// # Cancellation safety
    /// As [`ZkBlockingWriteLock::lock_with_timeout`].
    pub async fn try_lock(&self) -> Result<LockGuard, LockError> {
        acquire(
            &self.session,
            self.request.clone().with_timeout(Duration::ZERO),
        )
        .await
    }
}

/// Deletes a queue node and/or the mutex node of attempt `attempt` (one multi when both).
///
/// The first try deletes them blindly: the caller knows they are its own. When that is no
/// longer certain (one of them was already gone, or a connection loss left it unknown whether
/// the delete happened), each is deleted only if it still belongs to this session, and the mutex
/// only if it also carries `attempt`: by then the mutex may be the next holder's. Retries on
/// connection loss until done or until the session ends (which removes them anyway).
///
/// Returns `Err(NoNode)` when one of them was already gone before this call.
pub(crate) async fn delete_nodes(
    client: &Client,
    queue_node: Option<&str>,
    mutex: Option<&str>,
    attempt: &str,
) -> Result<(), ZkError> {
    let first = match (queue_node, mutex) {
        (Some(q), Some(m)) => {
            let mut multi = client.new_multi_writer();
            multi
                .add_delete(m, None)
                .and_then(|_| multi.add_delete(q, None))?;
            multi.commit().await.map(|_| ()).map_err(ZkError::from)
        }
        (Some(p), None) | (None, Some(p)) => client.delete(p, None).await,
        (None, None) => return Ok(()),
    };
    let gone_before = match first {
        Ok(()) => return Ok(()),
        Err(ZkError::NoNode) => true,
        Err(ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_)) => false,
        Err(e) => return Err(e),
    };
    let mut backoff = crate::Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
    loop {
        let mut result = Ok(());
        if let Some(m) = mutex {
            result = delete_if_ours(client, m, Some(attempt)).await;
        }
        if let (Ok(()), Some(q)) = (&result, queue_node) {
            result = delete_if_ours(client, q, None).await;
        }
        match result {
            Err(ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_)) => {
                tokio::time::sleep(backoff.next_delay()).await
            }
            Err(e) => return Err(e),
            Ok(()) if gone_before => return Err(ZkError::NoNode),
            Ok(()) => return Ok(()),
        }
    }
}

/// Deletes `path` if it is an ephemeral node of this session (and, with `attempt`, carries that
/// attempt id); leaves anyone else's node alone.
async fn delete_if_ours(client: &Client, path: &str, attempt: Option<&str>) -> Result<(), ZkError> {
    let (bytes, stat) = match client.get_data(path).await {
        Ok(x) => x,
        Err(ZkError::NoNode) => return Ok(()),
        Err(e) => return Err(e),
    };
    let ours = stat.ephemeral_owner == client.session_id().0
        && attempt.is_none_or(|a| {
            serde_json::from_slice::<NodeData>(&bytes).is_ok_and(|d| d.attempt == a)
        });
    if !ours {
        debug!(path, "not deleting a node that is no longer ours");
        return Ok(());
    }
    match client.delete(path, Some(stat.version)).await {
        Err(ZkError::NoNode | ZkError::BadVersion) => Ok(()),
        other => other,
    }
}

/// Deletes the queue node and the mutex that attempt `attempt` of this session made under
/// `monitor`, if any (cleanup after a waiter went away with a create in flight).
pub(crate) async fn delete_by_attempt(client: &Client, monitor: &str, attempt: &str) {
    let me = client.session_id().0;
    let mut backoff = crate::Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
    // Retried on connection loss until it completes or the session ends (which removes them).
    'scan: loop {
        let children = match client.get_children(monitor).await {
            Ok((c, _)) => c,
            Err(ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_)) => {
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
            Err(_) => return,
        };
        for name in children {
            let path = format!("{monitor}/{name}");
            match client.get_data(&path).await {
                Ok((bytes, stat)) => {
                    if stat.ephemeral_owner == me
                        && serde_json::from_slice::<NodeData>(&bytes)
                            .is_ok_and(|d| d.attempt == attempt)
                    {
                        debug!(node = %path, "removing a node of an abandoned acquisition");
                        let _ = delete_nodes(client, Some(&path), None, attempt).await;
                    }
                }
                Err(ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_)) => {
                    tokio::time::sleep(backoff.next_delay()).await;
                    continue 'scan;
                }
                Err(_) => {}
            }
        }
        return;
    }
}

struct Paths {
    monitor: String,
    mutex: String,
}

impl Paths {
    fn new(root: &str, monitor: &str) -> Self {
        let monitor = format!("{root}/{monitor}");
        let mutex = format!("{monitor}/{MUTEX_NODE}");
        Self { monitor, mutex }
    }
    fn child(&self, name: &str) -> String {
        format!("{}/{name}", self.monitor)
    }
}

/// What a contender owns while it waits; cleaned up by the reaper if dropped while armed.
struct Pending {
    slot: Arc<Slot>,
    node: Option<String>,
    holds_mutex: bool,
    mutex_path: String,
    armed: bool,
    /// A create (queue node or mutex) was sent and its answer not yet handled.
    in_flight: bool,
    attempt: String,
}

impl Pending {
    fn node_path(&self) -> Option<String> {
        let monitor = self.mutex_path.rsplit_once('/').map_or("", |(m, _)| m);
        self.node.as_ref().map(|n| format!("{monitor}/{n}"))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.armed && (self.node.is_some() || self.holds_mutex || self.in_flight) {
            debug!(node = ?self.node, holds_mutex = self.holds_mutex, in_flight = self.in_flight, "acquisition abandoned; removing its nodes");
            let monitor = self
                .mutex_path
                .rsplit_once('/')
                .map_or("", |(m, _)| m)
                .to_string();
            self.slot.reap(Reap {
                queue_node: self.node_path(),
                mutex: self.holds_mutex.then(|| self.mutex_path.clone()),
                search: self.in_flight.then(|| (monitor, self.attempt.clone())),
                attempt: self.attempt.clone(),
            });
        }
    }
}

/// How a contender step ended.
enum Step {
    Acquired {
        token: u64,
    },
    Wait(Queue),
    /// The mutex was held and the contender did not queue (try once).
    Busy,
}

#[instrument(name = "zk_lock", skip_all, fields(monitor = %request.monitor, lock_type = %request.lock_type))]
async fn acquire(session: &ZkSession, request: LockRequest) -> Result<LockGuard, LockError> {
    validate_monitor(&request.monitor)?;
    let settings = session.settings().clone();
    let timeout = request
        .timeout
        .unwrap_or_else(|| settings.timeout(request.lock_type));
    let try_once = timeout.is_zero();
    let started = Instant::now();
    let deadline = started + timeout;
    let slot = session.slot().await?;
    let paths = Paths::new(&settings.lock_root, &request.monitor);
    // Registered before any request below, so no mutex change after this point is missed.
    let mut mutex_rx = slot.mutex_events(&paths.mutex).await?;
    mutex_rx.borrow_and_update();

    let attempt = uuid::Uuid::new_v4().simple().to_string();
    let mut data = NodeData {
        info: request.info.clone(),
        owner: session.owner_id().to_string(),
        attempt,
        host: session.host().to_string(),
        pid: std::process::id(),
        lock_type: request.lock_type,
        created_ms: now_ms(),
        node: None,
        promoted: false,
    };
    let mut prefix = settings.prefix(request.lock_type).to_string();
    let mut pending = Pending {
        slot: slot.clone(),
        node: None,
        holds_mutex: false,
        mutex_path: paths.mutex.clone(),
        armed: true,
        in_flight: false,
        attempt: data.attempt.clone(),
    };
    let promote_at = match (request.lock_type, settings.background_max_wait) {
        (LockType::Background, Some(wait)) => Some(started + wait),
        _ => None,
    };
    let client = &slot.client;

    // Fast path: queue node and mutex node in one multi, the child list pipelined behind it;
    // skipped on a monitor that was contended last time.
    // A try-once contender always tries the fast path, without queueing when the mutex is held.
    let contended_before = slot.contended(&paths.mutex) && !try_once;
    let mut others_seen = false;
    // Every contender tries at least once, however short its timeout (creating the monitor node
    // first is not a try).
    let mut tried = false;
    let mut step = loop {
        if tried && Instant::now() >= deadline && pending.node.is_none() {
            return Err(give_up(&mut pending, &paths, &prefix, &request, started).await);
        }
        tried = true;
        let attempt = if contended_before {
            plain_create(client, &paths, &prefix, &data, &mut pending).await
        } else {
            fast_path(
                client,
                &paths,
                &prefix,
                &mut data,
                &mut pending,
                &mut mutex_rx,
                !try_once,
            )
            .await
        };
        match attempt {
            Ok(step) => break step,
            Err(ZkError::NoNode) => {
                ensure_monitor(client, &settings.lock_root, &paths.monitor).await?;
                tried = false;
            }
            Err(e @ (ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_))) => {
                debug!(error = %e, "connection loss while queueing; looking for our own node");
                loop {
                    wait_connected(&slot, deadline).await?;
                    match recover_own(client, &paths, &data, &mut pending).await {
                        Ok(()) => break,
                        Err(LockError::ConnectionLoss { .. }) => continue,
                        Err(e) => return Err(e),
                    }
                }
                pending.in_flight = false;
                if pending.node.is_some() {
                    break Step::Wait(Queue::default());
                }
            }
            Err(e) => return Err(map_zk(e, "queueing for the lock")),
        }
    };

    loop {
        let queue = match step {
            Step::Acquired { token } => {
                pending.armed = false;
                slot.set_contended(&paths.mutex, others_seen);
                let node = pending.node.clone().expect("acquired with a node");
                info!(node = %node, token, waited_ms = started.elapsed().as_millis() as u64, "lock acquired");
                return Ok(LockGuard::start(
                    slot.clone(),
                    paths,
                    node,
                    data.attempt.clone(),
                    request,
                    token,
                    mutex_rx,
                ));
            }
            Step::Busy => {
                return Err(give_up(&mut pending, &paths, &prefix, &request, started).await)
            }
            Step::Wait(_) if try_once => {
                return Err(give_up(&mut pending, &paths, &prefix, &request, started).await)
            }
            Step::Wait(queue) => queue,
        };
        let node = pending.node.clone().expect("waiting with a node");
        // An empty queue means "not read yet".
        let queue = if queue.nodes.is_empty() {
            read_queue(client, &paths, &slot, deadline).await?
        } else {
            queue
        };
        others_seen |= queue.nodes.len() > 1 || queue.mutex_present;
        let Some(pos) = queue.position(&node) else {
            // Our node is gone while our session lives: someone deleted it. Queue again.
            warn!(node = %node, "our queue node disappeared; queueing again");
            pending.node = None;
            step = loop {
                match plain_create(client, &paths, &prefix, &data, &mut pending).await {
                    Ok(s) => break s,
                    Err(ZkError::NoNode) => {
                        ensure_monitor(client, &settings.lock_root, &paths.monitor).await?
                    }
                    Err(ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_)) => {
                        wait_connected(&slot, deadline).await?;
                        recover_own(client, &paths, &data, &mut pending).await?;
                        pending.in_flight = false;
                        if pending.node.is_some() {
                            break Step::Wait(Queue::default());
                        }
                    }
                    Err(e) => return Err(map_zk(e, "queueing for the lock again")),
                }
            };
            continue;
        };
        debug!(node = %node, pos, queued = queue.nodes.len(), mutex_present = queue.mutex_present, "queue read");
        let now = Instant::now();
        if now >= deadline {
            return Err(give_up(&mut pending, &paths, &prefix, &request, started).await);
        }
        if promote_at.is_some_and(|at| now >= at && prefix != settings.foreground_prefix) {
            step = promote(
                client,
                &paths,
                &settings.foreground_prefix,
                &mut data,
                &mut pending,
            )
            .await?;
            prefix = settings.foreground_prefix.clone();
            continue;
        }
        let wake_at = promote_at
            .filter(|_| prefix != settings.foreground_prefix)
            .map_or(deadline, |p| p.min(deadline));
        let mut health = slot.health_watch();
        if pos == 0 {
            if !queue.mutex_present {
                // We are first and the mutex is free: take it (we just read the queue).
                step = take_mutex(
                    client,
                    &paths,
                    &data,
                    &node,
                    &mut pending,
                    &mut mutex_rx,
                    false,
                )
                .await?;
                continue;
            }
            // First in line; the mutex is held (by a lower class or a yielding contender).
            tokio::select! {
                _ = mutex_rx.changed() => {}
                _ = tokio::time::sleep_until(wake_at.into()) => { step = Step::Wait(Queue::default()); continue; }
                r = health_failure(&mut health) => return Err(abandon(&mut pending, r).await),
            }
            step = take_mutex(
                client,
                &paths,
                &data,
                &node,
                &mut pending,
                &mut mutex_rx,
                true,
            )
            .await?;
        } else {
            let pred = queue.predecessor(&node).expect("pos > 0").name.clone();
            let was_second = pos == 1;
            let watcher = match client.check_and_watch_stat(&paths.child(&pred)).await {
                Ok((Some(_), w)) => w,
                Ok((None, _)) => {
                    step = Step::Wait(Queue::default());
                    continue;
                }
                Err(ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_)) => {
                    wait_connected(&slot, deadline).await?;
                    step = Step::Wait(Queue::default());
                    continue;
                }
                Err(e) => return Err(map_zk(e, "watching the node ahead")),
            };
            tokio::select! {
                _ = watcher.changed() => {}
                _ = tokio::time::sleep_until(wake_at.into()) => { step = Step::Wait(Queue::default()); continue; }
                r = health_failure(&mut health) => return Err(abandon(&mut pending, r).await),
            }
            // The node just ahead left; if it was the head we are most likely first now, so try
            // the mutex right away with the queue read pipelined (the verification).
            step = if was_second {
                take_mutex(
                    client,
                    &paths,
                    &data,
                    &node,
                    &mut pending,
                    &mut mutex_rx,
                    true,
                )
                .await?
            } else {
                Step::Wait(Queue::default())
            };
        }
    }
}

/// Timeout: read what stands in the way, remove our node now (retrying on connection loss),
/// then report.
async fn give_up(
    pending: &mut Pending,
    paths: &Paths,
    prefix: &str,
    request: &LockRequest,
    started: Instant,
) -> LockError {
    let waited = started.elapsed();
    let blocked_by = match super::inspect::read_monitor(&pending.slot.client, &paths.monitor).await
    {
        Ok(Some(view)) => Some(Box::new(view.blocker(
            &paths.mutex,
            prefix,
            pending.node.as_deref(),
        ))),
        Ok(None) => Some(Box::new(Blocker::Released)),
        Err(e) => {
            debug!(error = %e, "could not read what held the lock");
            None
        }
    };
    let node = pending.node_path();
    pending.node = None;
    let mutex = pending.holds_mutex.then(|| pending.mutex_path.clone());
    pending.holds_mutex = false;
    if let Err(e) = delete_nodes(
        &pending.slot.client,
        node.as_deref(),
        mutex.as_deref(),
        &pending.attempt,
    )
    .await
    {
        if !matches!(
            e,
            ZkError::NoNode | ZkError::SessionExpired | ZkError::ClientClosed
        ) {
            warn!(error = %e, "could not remove the queue node after a timeout; the session's end will");
        }
    }
    debug!(blocked_by = ?blocked_by, "timed out; queue node removed");
    LockError::Timeout {
        monitor: request.monitor.clone(),
        lock_type: request.lock_type,
        waited,
        blocked_by,
    }
}

async fn abandon(pending: &mut Pending, err: LockError) -> LockError {
    // Session gone: its ephemeral nodes are gone too.
    pending.armed = false;
    err
}

/// Resolves when the session expires or closes.
async fn health_failure(health: &mut watch::Receiver<Health>) -> LockError {
    loop {
        match *health.borrow_and_update() {
            Health::Expired => {
                return LockError::SessionExpired {
                    context: "waiting for the lock".into(),
                }
            }
            Health::Closed => {
                return LockError::Backend {
                    context: "waiting for the lock".into(),
                    detail: "session closed".into(),
                }
            }
            _ => {}
        }
        if health.changed().await.is_err() {
            return LockError::SessionExpired {
                context: "waiting for the lock".into(),
            };
        }
    }
}

/// Waits for the connection to come back (before `deadline`).
async fn wait_connected(slot: &Slot, deadline: Instant) -> Result<(), LockError> {
    let mut health = slot.health_watch();
    loop {
        match *health.borrow_and_update() {
            Health::Connected => return Ok(()),
            Health::Expired => {
                return Err(LockError::SessionExpired {
                    context: "waiting to reconnect".into(),
                })
            }
            Health::Closed => {
                return Err(LockError::Backend {
                    context: "waiting to reconnect".into(),
                    detail: "session closed".into(),
                })
            }
            Health::Disconnected { .. } => {}
        }
        tokio::select! {
            r = health.changed() => if r.is_err() { return Err(LockError::SessionExpired { context: "waiting to reconnect".into() }) },
            _ = tokio::time::sleep_until(deadline.into()) => return Err(LockError::ConnectionLoss {
                context: "waiting for the lock".into(),
                detail: "still disconnected from ZooKeeper at the deadline; check that ZooKeeper is running and reachable".into(),
            }),
        }
    }
}

fn encode(data: &NodeData) -> Vec<u8> {
    serde_json::to_vec(data).expect("node data serializes")
}

fn child_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_string()
}

/// One multi creating our queue node and the mutex node, with the queue read pipelined. When
/// the mutex is held, queues with a plain create if `queue_if_held`, else returns
/// [`Step::Busy`] (nothing was created: the multi is atomic).
async fn fast_path(
    client: &Client,
    paths: &Paths,
    prefix: &str,
    data: &mut NodeData,
    pending: &mut Pending,
    mutex_rx: &mut watch::Receiver<u64>,
    queue_if_held: bool,
) -> Result<Step, ZkError> {
    let node_path = format!("{}/{prefix}-", paths.monitor);
    let node_bytes = encode(data);
    // Deletions before this point cannot concern the mutex we may create below.
    pending.slot.flush_mutex_events(&paths.mutex);
    mutex_rx.borrow_and_update();
    let mut multi = client.new_multi_writer();
    multi.add_create(&node_path, &node_bytes, &EPHEMERAL_SEQ)?;
    // The mutex names its holder's node, which is not known yet: the owner and attempt suffice.
    multi.add_create(&paths.mutex, &node_bytes, &EPHEMERAL)?;
    let commit = multi.commit();
    let children = client.get_children(&paths.monitor);
    pending.in_flight = true;
    let (committed, children) = tokio::join!(commit, children);
    // After a connection loss the multi may or may not have happened: stay "in flight" until
    // `recover_own` has looked, so that an abandoned attempt is searched for and removed.
    pending.in_flight = matches!(
        committed,
        Err(MultiWriteError::RequestFailed {
            source: ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_)
        })
    );
    match committed {
        Ok(results) => {
            let mut created = results.into_iter();
            let Some(MultiWriteResult::Create { path, .. }) = created.next() else {
                return Err(ZkError::UnexpectedError(
                    "multi returned no create result".into(),
                ));
            };
            let mutex_stat = match created.next() {
                Some(MultiWriteResult::Create { stat, .. }) => stat,
                _ => {
                    return Err(ZkError::UnexpectedError(
                        "multi returned no mutex result".into(),
                    ))
                }
            };
            let name = child_name(&path);
            pending.node = Some(name.clone());
            pending.holds_mutex = true;
            let (children, parent) = match children {
                Ok(c) => c,
                Err(_) => {
                    // We hold the mutex but could not verify the order: give it back and wait.
                    yield_mutex(client, paths, pending).await?;
                    return Ok(Step::Wait(Queue::default()));
                }
            };
            let queue = Queue::from_children(&children);
            if queue.position(&name) == Some(0) {
                // czxid of the mutex node when the server returned a valid stat (3.8.2+, see
                // ZOOKEEPER-4026); otherwise the monitor's pzxid, read right after our multi in
                // our session's order: not smaller than the multi's zxid and smaller than any later
                // transaction's, so tokens still increase strictly.
                let token = if mutex_stat.is_invalid() {
                    parent.pzxid
                } else {
                    mutex_stat.czxid
                };
                Ok(Step::Acquired {
                    token: token as u64,
                })
            } else {
                yield_mutex(client, paths, pending).await?;
                Ok(Step::Wait(queue))
            }
        }
        Err(MultiWriteError::OperationFailed {
            index: 1,
            source: ZkError::NodeExists,
        }) => {
            // Mutex held: queue normally (or not at all, trying once).
            if !queue_if_held {
                return Ok(Step::Busy);
            }
            plain_create(client, paths, prefix, data, pending).await
        }
        Err(MultiWriteError::OperationFailed { source, .. }) => Err(source),
        Err(MultiWriteError::RequestFailed { source }) => Err(source),
    }
}

/// Creates our queue node alone, with the queue read pipelined.
async fn plain_create(
    client: &Client,
    paths: &Paths,
    prefix: &str,
    data: &NodeData,
    pending: &mut Pending,
) -> Result<Step, ZkError> {
    let node_path = format!("{}/{prefix}-", paths.monitor);
    let bytes = encode(data);
    let create = client.create(&node_path, &bytes, &EPHEMERAL_SEQ);
    let children = client.get_children(&paths.monitor);
    pending.attempt = data.attempt.clone();
    pending.in_flight = true;
    let (created, children) = tokio::join!(create, children);
    pending.in_flight = matches!(
        created,
        Err(ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_))
    );
    let (_, seq) = created?;
    pending.node = Some(format!("{prefix}-{seq}"));
    Ok(Step::Wait(
        children
            .map(|(c, _)| Queue::from_children(&c))
            .unwrap_or_default(),
    ))
}

/// Re-queues a starving background waiter in the foreground class: new node first, then the old
/// one goes, so it never leaves the queue.
async fn promote(
    client: &Client,
    paths: &Paths,
    fg_prefix: &str,
    data: &mut NodeData,
    pending: &mut Pending,
) -> Result<Step, LockError> {
    let old = pending.node.clone();
    data.promoted = true;
    data.attempt = uuid::Uuid::new_v4().simple().to_string();
    let step = plain_create(client, paths, fg_prefix, data, pending)
        .await
        .map_err(|e| {
            pending.node = old.clone();
            map_zk(e, "re-queueing a starving background waiter")
        })?;
    info!(old = ?old, new = ?pending.node, "background waiter re-queued as foreground after zookeeper.background.max.wait");
    if let Some(old) = old {
        let _ = delete_nodes(client, Some(&paths.child(&old)), None, &data.attempt).await;
    }
    Ok(step)
}

/// Tries to create the mutex node. With `verify`, the queue is read in the same round trip and
/// the mutex given back if someone else is first; without, the caller has just seen itself first.
async fn take_mutex(
    client: &Client,
    paths: &Paths,
    data: &NodeData,
    node: &str,
    pending: &mut Pending,
    mutex_rx: &mut watch::Receiver<u64>,
    verify: bool,
) -> Result<Step, LockError> {
    // Deletions before this point cannot concern the mutex we may create below; any later one
    // is flagged on `mutex_rx` (which the guard inherits).
    pending.slot.flush_mutex_events(&paths.mutex);
    mutex_rx.borrow_and_update();
    let mut mutex_data = data.clone();
    mutex_data.node = Some(node.to_string());
    let bytes = encode(&mutex_data);
    let create = client.create(&paths.mutex, &bytes, &EPHEMERAL);
    pending.in_flight = true;
    let (created, children) = if verify {
        let children = client.get_children(&paths.monitor);
        let (a, b) = tokio::join!(create, children);
        (a, Some(b))
    } else {
        (create.await, None)
    };
    pending.in_flight = matches!(
        created,
        Err(ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_))
    );
    match created {
        Ok((stat, _)) => {
            pending.holds_mutex = true;
            let token = stat.czxid as u64;
            match children {
                None => Ok(Step::Acquired { token }),
                Some(Ok((children, _))) => {
                    let queue = Queue::from_children(&children);
                    if queue.position(node) == Some(0) {
                        Ok(Step::Acquired { token })
                    } else {
                        debug!("took the mutex but someone of higher priority is first: giving it back");
                        yield_mutex(client, paths, pending)
                            .await
                            .map_err(|e| map_zk(e, "giving the mutex back"))?;
                        Ok(Step::Wait(queue))
                    }
                }
                Some(Err(_)) => {
                    yield_mutex(client, paths, pending)
                        .await
                        .map_err(|e| map_zk(e, "giving the mutex back"))?;
                    Ok(Step::Wait(Queue::default()))
                }
            }
        }
        Err(ZkError::NodeExists) => Ok(Step::Wait(match children {
            Some(Ok((c, _))) => Queue::from_children(&c),
            _ => Queue::default(),
        })),
        Err(ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_)) => {
            debug!("connection loss while taking the mutex; checking whether it is ours");
            // Did our create happen? Read the mutex and compare the attempt id.
            wait_connected(&pending.slot, Instant::now() + Duration::from_secs(3600)).await?;
            let ours = mutex_is_ours(client, &paths.mutex, &data.attempt).await?;
            pending.in_flight = false;
            if ours {
                pending.holds_mutex = true;
                let (_, stat) = client
                    .get_data(&paths.mutex)
                    .await
                    .map_err(|e| map_zk(e, "reading the mutex"))?;
                // Verify order as usual.
                let (children, _) = client
                    .get_children(&paths.monitor)
                    .await
                    .map_err(|e| map_zk(e, "reading the queue"))?;
                if Queue::from_children(&children).position(node) == Some(0) {
                    return Ok(Step::Acquired {
                        token: stat.czxid as u64,
                    });
                }
                yield_mutex(client, paths, pending)
                    .await
                    .map_err(|e| map_zk(e, "giving the mutex back"))?;
            }
            Ok(Step::Wait(Queue::default()))
        }
        Err(e) => Err(map_zk(e, "taking the mutex")),
    }
}

async fn yield_mutex(client: &Client, paths: &Paths, pending: &mut Pending) -> Result<(), ZkError> {
    match delete_nodes(client, None, Some(&paths.mutex), &pending.attempt).await {
        Ok(()) | Err(ZkError::NoNode) => {
            pending.holds_mutex = false;
            Ok(())
        }
        Err(e) => Err(e),
    }
}

async fn mutex_is_ours(client: &Client, mutex: &str, attempt: &str) -> Result<bool, LockError> {
    match client.get_data(mutex).await {
        Ok((bytes, stat)) => Ok(stat.ephemeral_owner == client.session_id().0
            && serde_json::from_slice::<NodeData>(&bytes)
                .map(|d| d.attempt == attempt)
                .unwrap_or(false)),
        Err(ZkError::NoNode) => Ok(false),
        Err(e) => Err(map_zk(e, "reading the mutex")),
    }
}

/// After a connection loss during a create: find our queue node (and mutex) by session and
/// attempt id instead of creating a second one.
async fn recover_own(
    client: &Client,
    paths: &Paths,
    data: &NodeData,
    pending: &mut Pending,
) -> Result<(), LockError> {
    let children = match client.get_children(&paths.monitor).await {
        Ok((c, _)) => c,
        Err(ZkError::NoNode) => return Ok(()),
        Err(e) => return Err(map_zk(e, "looking for our queue node")),
    };
    let me = client.session_id().0;
    for name in Queue::from_children(&children)
        .nodes
        .iter()
        .map(|n| &n.name)
    {
        match client.get_data(&paths.child(name)).await {
            Ok((bytes, stat)) if stat.ephemeral_owner == me => {
                if serde_json::from_slice::<NodeData>(&bytes)
                    .map(|d| d.attempt == data.attempt)
                    .unwrap_or(false)
                {
                    info!(node = %name, "found our queue node after a connection loss");
                    pending.node = Some(name.clone());
                }
            }
            Ok(_) | Err(ZkError::NoNode) => {}
            Err(e) => return Err(map_zk(e, "looking for our queue node")),
        }
    }
    if mutex_is_ours(client, &paths.mutex, &data.attempt).await? {
        pending.holds_mutex = true;
        if pending.node.is_some() {
            // Re-verify the order on the next step; give the mutex back to keep it simple.
            yield_mutex(client, paths, pending)
                .await
                .map_err(|e| map_zk(e, "giving the mutex back"))?;
        } else {
            yield_mutex(client, paths, pending)
                .await
                .map_err(|e| map_zk(e, "removing a stray mutex"))?;
        }
    }
    Ok(())
}

async fn read_queue(
    client: &Client,
    paths: &Paths,
    slot: &Slot,
    deadline: Instant,
) -> Result<Queue, LockError> {
    loop {
        match client.get_children(&paths.monitor).await {
            Ok((children, _)) => return Ok(Queue::from_children(&children)),
            Err(ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_)) => {
                wait_connected(slot, deadline).await?
            }
            Err(ZkError::NoNode) => return Ok(Queue::default()),
            Err(e) => return Err(map_zk(e, "reading the queue")),
        }
    }
}

/// Creates the lock root (persistent) and the monitor node (container) when missing.
async fn ensure_monitor(client: &Client, root: &str, monitor: &str) -> Result<(), LockError> {
    match client.create(monitor, &[], &CONTAINER).await {
        Ok(_) | Err(ZkError::NodeExists) => return Ok(()),
        Err(ZkError::NoNode) => {}
        Err(e) => return Err(map_zk(e, "creating the monitor node")),
    }
    let mut path = String::new();
    for seg in root.trim_start_matches('/').split('/') {
        path.push('/');
        path.push_str(seg);
        match client.create(&path, &[], &PERSISTENT).await {
            Ok(_) | Err(ZkError::NodeExists) => {}
            Err(e) => return Err(map_zk(e, "creating the lock root")),
        }
    }
    match client.create(monitor, &[], &CONTAINER).await {
        Ok(_) | Err(ZkError::NodeExists) => Ok(()),
        Err(e) => Err(map_zk(e, "creating the monitor node")),
    }
}

/// A held ZooKeeper lock.
///
/// Dropping a held guard releases it in the background (never panics, needs no runtime in the
/// dropping thread); [`LockGuard::unlock`] releases it and reports the outcome.
#[derive(Debug)]
pub struct LockGuard {
    slot: Arc<Slot>,
    monitor: String,
    lock_type: LockType,
    node_path: String,
    mutex_path: String,
    attempt: String,
    token: u64,
    loss: LossSignal,
    released: Arc<AtomicBool>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl LockGuard {
    fn start(
        slot: Arc<Slot>,
        paths: Paths,
        node: String,
        attempt: String,
        request: LockRequest,
        token: u64,
        mutex_rx: watch::Receiver<u64>,
    ) -> Self {
        let loss = LossSignal::new();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let released = Arc::new(AtomicBool::new(false));
        let node_path = paths.child(&node);
        let guard = Self {
            slot: slot.clone(),
            monitor: request.monitor.clone(),
            lock_type: request.lock_type,
            node_path,
            mutex_path: paths.mutex.clone(),
            attempt: attempt.clone(),
            token,
            loss: loss.clone(),
            released,
            stop: Some(stop_tx),
        };
        let span = tracing::info_span!("zk_lock_held", monitor = %request.monitor, token);
        debug!(node = %node, "watching the held lock");
        tokio::spawn(
            watch_for_loss(slot, paths.mutex, attempt, mutex_rx, loss, stop_rx).instrument(span),
        );
        guard
    }

    /// The fencing token: strictly greater than every token issued before, for any monitor.
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// Whether the lock is still held.
    pub fn is_held(&self) -> bool {
        !self.released.load(Ordering::Acquire) && self.loss.get().is_none()
    }

    /// The loss reason, if lost.
    pub fn loss(&self) -> Option<LossReason> {
        self.loss.get()
    }

    /// The monitor object.
    pub fn monitor(&self) -> &str {
        &self.monitor
    }

    /// Completes when the lock is lost (session expired, disconnected longer than the grace,
    /// mutex node deleted by someone else).
    ///
    /// # Cancellation safety
    /// Cancel-safe: it only observes.
    pub async fn lost(&self) -> LossReason {
        self.loss.wait().await
    }

    /// Releases the lock: deletes the queue node and the mutex node in one multi.
    ///
    /// # Errors
    /// - [`LockError::NoNode`]: the lock no longer existed (it was lost before the release);
    /// - [`LockError::SessionExpired`]: the session expired (the nodes went with it).
    ///
    /// # Cancellation safety
    /// Not cancel-safe in the sense that a cancelled release finishes in the background: the
    /// nodes are removed either way.
    #[instrument(name = "zk_unlock", skip_all, fields(monitor = %self.monitor, token = self.token))]
    pub async fn unlock(mut self) -> Result<(), LockError> {
        self.released.store(true, Ordering::Release);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let mutex_deleted = self.loss.get() == Some(LossReason::MutexDeleted);
        let mutex = (!mutex_deleted).then(|| self.mutex_path.clone());
        let node = self.node_path.clone();
        let slot = self.slot.clone();
        // Hand the work to the reaper if this future is dropped midway.
        let mut reap = Some(Reap {
            queue_node: Some(node.clone()),
            mutex: mutex.clone(),
            search: None,
            attempt: self.attempt.clone(),
        });
        struct ReapOnDrop<'a>(&'a Slot, &'a mut Option<Reap>);
        impl Drop for ReapOnDrop<'_> {
            fn drop(&mut self) {
                if let Some(r) = self.1.take() {
                    self.0.reap(r);
                }
            }
        }
        let on_drop = ReapOnDrop(&slot, &mut reap);
        let result = delete_nodes(&slot.client, Some(&node), mutex.as_deref(), &self.attempt).await;
        on_drop.1.take();
        drop(on_drop);
        match result {
            Ok(()) if mutex_deleted => Err(LockError::NoNode {
                monitor: self.monitor.clone(),
                detail: "the mutex node had been deleted by someone else".into(),
            }),
            Ok(()) => {
                debug!("lock released");
                Ok(())
            }
            Err(ZkError::NoNode) => Err(LockError::NoNode {
                monitor: self.monitor.clone(),
                detail: format!("{node} or its mutex node was already gone"),
            }),
            Err(ZkError::SessionExpired | ZkError::ClientClosed) => {
                Err(LockError::SessionExpired {
                    context: format!("releasing `{}`", self.monitor),
                })
            }
            Err(e) => Err(map_zk(e, "releasing the lock")),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
            if !self.released.swap(true, Ordering::AcqRel) {
                let mutex_deleted = self.loss.get() == Some(LossReason::MutexDeleted);
                self.slot.reap(Reap {
                    queue_node: Some(self.node_path.clone()),
                    mutex: (!mutex_deleted).then(|| self.mutex_path.clone()),
                    search: None,
                    attempt: self.attempt.clone(),
                });
            }
        }
    }
}

/// Watches a held lock: session expiry, long disconnection, and the mutex node changing hands.
async fn watch_for_loss(
    slot: Arc<Slot>,
    mutex_path: String,
    attempt: String,
    mut mutex_rx: watch::Receiver<u64>,
    loss: LossSignal,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let mut health = slot.health_watch();
    // `mutex_rx` was marked just before the mutex was created: any deletion since is flagged.
    let mut verify = false;
    loop {
        if verify {
            verify = false;
            let released = |stop: &mut tokio::sync::oneshot::Receiver<()>| {
                !matches!(
                    stop.try_recv(),
                    Err(tokio::sync::oneshot::error::TryRecvError::Empty)
                )
            };
            // Released meanwhile: the deletion seen may be our own release.
            if released(&mut stop) {
                return;
            }
            debug!("verifying the mutex after a deletion event");
            let lost = match slot.client.get_data(&mutex_path).await {
                Ok((bytes, stat)) => {
                    let ours = stat.ephemeral_owner == slot.session_id
                        && serde_json::from_slice::<NodeData>(&bytes)
                            .map(|d| d.attempt == attempt)
                            .unwrap_or(false);
                    (!ours).then_some("the mutex node now belongs to someone else: lock lost")
                }
                Err(ZkError::NoNode) => Some("the mutex node was deleted: lock lost"),
                // Connection trouble: health decides.
                Err(_) => None,
            };
            if let Some(what) = lost {
                // Released while reading: not a loss.
                if !released(&mut stop) {
                    warn!("{what}");
                    loss.fire(LossReason::MutexDeleted);
                }
                return;
            }
        }
        let state = *health.borrow_and_update();
        match state {
            Health::Expired => {
                warn!("session expired: lock lost");
                loss.fire(LossReason::SessionExpired);
                return;
            }
            Health::Closed => {
                loss.fire(LossReason::Closed);
                return;
            }
            Health::Disconnected { since } => {
                let until = since + slot.grace;
                tokio::select! {
                biased;
                        _ = &mut stop => return,
                        _ = tokio::time::sleep_until(until.into()) => {
                            if matches!(*health.borrow(), Health::Disconnected { .. }) {
                                warn!(grace_ms = slot.grace.as_millis() as u64, "disconnected longer than the grace: lock counts as lost");
                                loss.fire(LossReason::Disconnected { grace: slot.grace });
                                return;
                            }
                        }
                        r = health.changed() => if r.is_err() { loss.fire(LossReason::SessionExpired); return; },
                    }
                continue;
            }
            Health::Connected => {}
        }
        tokio::select! {
            biased;
            _ = &mut stop => return,
            r = mutex_rx.changed() => {
                if r.is_err() { loss.fire(LossReason::SessionExpired); return; }
                verify = true;
            }
            r = health.changed() => {
                if r.is_err() { loss.fire(LossReason::SessionExpired); return; }
                // After a reconnection the mutex may have changed unseen: check it.
                if *health.borrow() == Health::Connected { verify = true; }
            }
        }
    }
}

#[async_trait]
impl Guard for LockGuard {
    fn monitor(&self) -> &str {
        &self.monitor
    }
    fn lock_type(&self) -> LockType {
        self.lock_type
    }
    fn fencing_token(&self) -> u64 {
        self.token
    }
    fn is_held(&self) -> bool {
        LockGuard::is_held(self)
    }
    fn loss(&self) -> Option<LossReason> {
        LockGuard::loss(self)
    }
    async fn lost(&self) -> LossReason {
        LockGuard::lost(self).await
    }
    async fn unlock(self: Box<Self>) -> Result<(), LockError> {
        LockGuard::unlock(*self).await
    }
}

/// The ZooKeeper backend of [`LockService`].
#[derive(Debug, Clone)]
pub struct ZkLockService {
    session: ZkSession,
}

impl ZkLockService {
    /// A service over a session.
    pub fn new(session: ZkSession) -> Self {
        Self { session }
    }

    /// The session.
    pub fn session(&self) -> &ZkSession {
        &self.session
    }
}

#[async_trait]
impl LockService for ZkLockService {
    async fn acquire(&self, request: LockRequest) -> Result<Box<dyn Guard>, LockError> {
        Ok(Box::new(acquire(&self.session, request).await?))
    }

    fn backend_name(&self) -> &'static str {
        "zookeeper"
    }
}
