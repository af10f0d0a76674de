//! The priority-lock recipe's entry points and its acquisition loop: queue, wait for the
//! contenders ahead, take the mutex, or give up at the deadline.
//!
//! See `docs/zookeeper-lock.md` for the znode layout and the state machines.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tracing::{debug, info, instrument, warn};
use zookeeper_client::{Error as ZkError, EventType};

use super::acl::{acl_list, check_lock_root};
use super::contender::{abandon, health_failure, wait_connected, Pending, Step};
use super::guard::LockGuard;
use super::map_zk;
use super::mutex::take_mutex;
use super::names::Queue;
use super::node::{attempt_id, now_ms, NodeData, Paths};
use super::queue::{ensure_monitor, fast_path, plain_create, promote, read_queue};
use super::recover::recover_own;
use super::release::delete_nodes;
use super::session::ZkSession;
use crate::config::ZkAcl;
use crate::lock::{
    validate_monitor, Blocker, Guard, LockError, LockRequest, LockService, LockType,
};

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

#[instrument(name = "zk_lock", skip_all, fields(monitor = %request.monitor, lock_type = %request.lock_type))]
pub(super) async fn acquire(
    session: &ZkSession,
    request: LockRequest,
) -> Result<LockGuard, LockError> {
    validate_monitor(&request.monitor)?;
    let settings = session.settings();
    let timeout = request
        .timeout
        .unwrap_or_else(|| settings.timeout(request.lock_type));
    let try_once = timeout.is_zero();
    let started = Instant::now();
    let deadline = started + timeout;
    let slot = session.slot().await?;
    let paths = Paths::new(
        &settings.lock_root,
        &request.monitor,
        acl_list(&settings.acl),
    );
    if settings.acl != ZkAcl::Open && !slot.lock_root_checked.load(Ordering::Acquire) {
        check_lock_root(
            &slot.client,
            &settings.lock_root,
            &settings.acl,
            settings.auth.as_ref(),
        )
        .await?;
        slot.lock_root_checked.store(true, Ordering::Release);
    }
    // Registered before any request below, so no mutex change after this point is missed.
    let mut mutex_rx = slot.mutex_events(&paths.mutex).await?;
    mutex_rx.borrow_and_update();

    let attempt = attempt_id();
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
    // Whether a node of prefix `p` sorts before every node another contender can create: then
    // once it is first in line (or the node ahead of it, the head, went), it stays first.
    let sorts_first = |p: &str| {
        p <= settings.foreground_prefix.as_str() && p <= settings.background_prefix.as_str()
    };

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
                ensure_monitor(client, &settings.lock_root, &paths).await?;
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
                        ensure_monitor(client, &settings.lock_root, &paths).await?
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
            // Nobody can have got ahead of a first-class head since our listing: take the mutex
            // without reading the queue again (`docs/zookeeper-lock.md`, "Handoff").
            let verify = !sorts_first(&prefix);
            step = take_mutex(
                client,
                &paths,
                &data,
                &node,
                &mut pending,
                &mut mutex_rx,
                verify,
            )
            .await?;
        } else {
            let pred = queue.predecessor(&node).expect("pos > 0").name.clone();
            let was_second = pos == 1;
            let watcher = match client.check_and_watch_stat(&paths.child(&pred)).await {
                Ok((Some(_), w)) => w,
                Ok((None, _)) => {
                    // Gone before we could watch it: as if woken by its deletion.
                    step = if was_second {
                        take_mutex(
                            client,
                            &paths,
                            &data,
                            &node,
                            &mut pending,
                            &mut mutex_rx,
                            !sorts_first(&prefix),
                        )
                        .await?
                    } else {
                        Step::Wait(Queue::default())
                    };
                    continue;
                }
                Err(ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_)) => {
                    wait_connected(&slot, deadline).await?;
                    step = Step::Wait(Queue::default());
                    continue;
                }
                Err(e) => return Err(map_zk(e, "watching the node ahead")),
            };
            let event = tokio::select! {
                event = watcher.changed() => event,
                _ = tokio::time::sleep_until(wake_at.into()) => { step = Step::Wait(Queue::default()); continue; }
                r = health_failure(&mut health) => return Err(abandon(&mut pending, r).await),
            };
            // The node just ahead left. If it left as the holder (its release empties its data
            // in the same multi that deletes it: `NodeDataChanged`), or it was the head at our
            // listing, every node that was ahead of us is gone, so try the mutex right away. A
            // first-class node is then certainly first: no node queued since can sort before
            // it (`docs/zookeeper-lock.md`, "Handoff"), so it takes the mutex without a read.
            // Any other node has the queue read pipelined with its create (the verification):
            // a first-class contender may have arrived meanwhile.
            let handed_over = event.event_type == EventType::NodeDataChanged;
            let deleted = event.event_type == EventType::NodeDeleted;
            step = if handed_over || was_second {
                let verify = !((handed_over || deleted) && sorts_first(&prefix));
                take_mutex(
                    client,
                    &paths,
                    &data,
                    &node,
                    &mut pending,
                    &mut mutex_rx,
                    verify,
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
pub(super) async fn give_up(
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
