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
use super::guard::{Held, LockGuard};
use super::map_zk;
use super::mutex::take_mutex;
use super::names::Queue;
use super::node::{attempt_id, now_ms, NodeData, Paths};
use super::queue::{
    ensure_monitor, fast_path, plain_create, promote, queue_after, read_queue, After,
};
use super::recover::recover_own;
use super::release::delete_nodes;
use super::session::{Slot, ZkSession};
use crate::config::ZkAcl;
use crate::lock::{
    release_then_acquire, validate_monitor, Blocker, Guard, LockError, LockRequest, LockService,
    LockType, Release,
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

    /// Releases `held` and acquires this lock, in one request where it can: when `held` is a
    /// lock of this session (of any monitor), the acquisition's first multi deletes `held`'s
    /// nodes too (see [`LockService::release_and_acquire`]). On the same monitor, the
    /// contenders queued behind `held` go first, as after [`LockGuard::unlock`]. Otherwise
    /// `held` is released ([`LockGuard::release`]) and the acquisition follows. Either way
    /// this then waits for the lock as [`ZkBlockingWriteLock::lock_with_timeout`]; a zero
    /// timeout releases `held` first and tries once.
    ///
    /// Returns the release under way, which resolves to what [`LockGuard::unlock`] would have
    /// reported, and the acquisition's outcome. A failed acquisition still releases `held`.
    ///
    /// # Errors
    /// The acquisition's are those of [`ZkBlockingWriteLock::lock_with_timeout`], the
    /// release's those of [`LockGuard::unlock`].
    ///
    /// # Cancellation safety
    /// Cancel-safe: dropped before the release was sent, `held` is released in the background
    /// as a dropped guard; a dropped acquisition removes what it queued, as a dropped
    /// [`ZkBlockingWriteLock::lock_with_timeout`].
    pub async fn release_and_lock(
        &self,
        held: LockGuard,
    ) -> (Release, Result<LockGuard, LockError>) {
        acquire_after(&self.session, self.request.clone(), held).await
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

pub(super) async fn acquire(
    session: &ZkSession,
    request: LockRequest,
) -> Result<LockGuard, LockError> {
    acquire_with(session, request, &mut Handover::default()).await
}

/// Releases `previous` and acquires `request`: when `previous` is a lock of this session, the
/// acquisition's first multi carries its release (the fast path's operations, or the create of
/// the queue node on a monitor busy lately); otherwise the release is sent first and the
/// acquisition follows, as [`LockGuard::release`] and [`acquire`].
pub(super) async fn acquire_after(
    session: &ZkSession,
    request: LockRequest,
    previous: LockGuard,
) -> (Release, Result<LockGuard, LockError>) {
    let mut handover = Handover {
        previous: Some(previous),
        release: None,
    };
    let result = acquire_with(session, request, &mut handover).await;
    (handover.finish(), result)
}

/// A held lock released by the acquisition that takes it ([`acquire_after`]).
#[derive(Default)]
struct Handover {
    /// Not released yet.
    previous: Option<LockGuard>,
    /// Its release, once under way.
    release: Option<Release>,
}

impl Handover {
    /// The release under way (sent now if the acquisition ended before it).
    fn finish(self) -> Release {
        match (self.release, self.previous) {
            (Some(release), _) => release,
            (None, Some(previous)) => previous.release(),
            (None, None) => Release::done(Ok(())),
        }
    }
}

#[instrument(name = "zk_lock", skip_all, fields(monitor = %request.monitor, lock_type = %request.lock_type))]
async fn acquire_with(
    session: &ZkSession,
    request: LockRequest,
    handover: &mut Handover,
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
        alone: false,
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
    // When a wait ends on its own: at the deadline, or when a starving background waiter is
    // due to be promoted.
    let wake_at = |p: &str| {
        promote_at
            .filter(|_| p != settings.foreground_prefix)
            .map_or(deadline, |at| at.min(deadline))
    };

    // Fast path: one multi that recreates the monitor node, empty, with our queue node and the
    // mutex in it; skipped on a monitor that was busy lately.
    // A try-once contender always tries the fast path, without queueing when the mutex is held.
    let contended_before = slot.contended(&paths.mutex) && !try_once;
    // The lock this acquisition releases, in its first multi when it is of this session.
    let mut to_carry = match handover.previous.take() {
        Some(p) if !try_once && p.can_release_with(&slot) => Some(p),
        Some(p) => {
            handover.release = Some(p.release());
            None
        }
        None => None,
    };
    let mut others_seen = false;
    // Every contender tries at least once, however short its timeout (creating the monitor node
    // first is not a try).
    let mut tried = false;
    let mut step = loop {
        if tried && Instant::now() >= deadline && pending.node.is_none() {
            return Err(give_up(&mut pending, &paths, &prefix, &request, started).await);
        }
        tried = true;
        let after = to_carry
            .take()
            .map(|previous| After::new(previous, &mut handover.release));
        let attempt = match after {
            Some(after) if contended_before => {
                queue_after(client, &paths, &prefix, &data, &mut pending, after).await
            }
            None if contended_before => {
                plain_create(client, &paths, &prefix, &data, &mut pending).await
            }
            after => {
                fast_path(
                    client,
                    &paths,
                    &prefix,
                    &data,
                    &mut pending,
                    !try_once,
                    after,
                )
                .await
            }
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
            Step::Acquired { token, version } => {
                let token = super::token::from_zxid(token);
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
                    Held {
                        token,
                        version,
                        alone: pending.alone,
                    },
                ));
            }
            Step::Busy => {
                return Err(give_up(&mut pending, &paths, &prefix, &request, started).await)
            }
            Step::Wait(_) | Step::FirstInLine if try_once => {
                return Err(give_up(&mut pending, &paths, &prefix, &request, started).await)
            }
            Step::FirstInLine => {
                // Our turn came while the mutex is still held (by a lower class, or by a
                // contender that took it and is giving it back): wait for it.
                step = match await_mutex(&slot, &paths, deadline, wake_at(&prefix)).await? {
                    MutexWait::Ended(e) => return Err(abandon(&mut pending, e).await),
                    MutexWait::Released => {
                        let node = pending.node.clone().expect("first in line with a node");
                        let verify = !sorts_first(&prefix);
                        take_mutex(client, &paths, &data, &node, &mut pending, verify).await?
                    }
                    MutexWait::LookAgain => Step::Wait(Queue::default()),
                };
                continue;
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
        if pos == 0 {
            // We are first (we just read the queue): take the mutex if it is free, else wait for
            // it.
            step = if queue.mutex_present {
                Step::FirstInLine
            } else {
                take_mutex(client, &paths, &data, &node, &mut pending, false).await?
            };
            continue;
        }
        let wake_at = wake_at(&prefix);
        let mut health = slot.health_watch();
        let pred = queue.predecessor(&node).expect("pos > 0").name.clone();
        let was_second = pos == 1;
        // A data watch (not an exists watch): on a node that is already gone it leaves no watch
        // behind on the server, which would otherwise cost a request to remove.
        let watcher = match client.get_and_watch_data(&paths.child(&pred)).await {
            Ok((_, _, w)) => w,
            Err(ZkError::NoNode) => {
                // Gone before we could watch it: as if woken by its deletion.
                step = if was_second {
                    take_mutex(
                        client,
                        &paths,
                        &data,
                        &node,
                        &mut pending,
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
            take_mutex(client, &paths, &data, &node, &mut pending, verify).await?
        } else {
            Step::Wait(Queue::default())
        };
    }
}

/// How waiting for the mutex ended.
enum MutexWait {
    /// The mutex node is gone (or was already): take it.
    Released,
    /// The deadline (or the time to promote a starving background waiter) came, or the
    /// connection was lost meanwhile: read the queue again.
    LookAgain,
    /// The session ended.
    Ended(LockError),
}

/// Waits, first in line, until the mutex node is gone: one read that leaves a data watch on it.
/// When it is already gone the read fails and leaves no watch on the server.
async fn await_mutex(
    slot: &Slot,
    paths: &Paths,
    deadline: Instant,
    wake_at: Instant,
) -> Result<MutexWait, LockError> {
    let mut health = slot.health_watch();
    let watcher = match slot.client.get_and_watch_data(&paths.mutex).await {
        Ok((_, _, watcher)) => watcher,
        Err(ZkError::NoNode) => return Ok(MutexWait::Released),
        Err(ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_)) => {
            wait_connected(slot, deadline).await?;
            return Ok(MutexWait::LookAgain);
        }
        Err(e) => return Err(map_zk(e, "watching the mutex node")),
    };
    tokio::select! {
        event = watcher.changed() => Ok(match event.event_type {
            // The end of the session: the next request says how.
            EventType::Session => MutexWait::LookAgain,
            // Deleted (or its data changed, which zkguard never does: the take will tell).
            _ => MutexWait::Released,
        }),
        _ = tokio::time::sleep_until(wake_at.into()) => Ok(MutexWait::LookAgain),
        e = health_failure(&mut health) => Ok(MutexWait::Ended(e)),
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

    async fn release_and_acquire(
        &self,
        held: Box<dyn Guard>,
        next: LockRequest,
    ) -> (Release, Result<Box<dyn Guard>, LockError>) {
        if !(held.as_ref() as &dyn std::any::Any).is::<LockGuard>() {
            // Another backend's guard (or one that wraps ours).
            return release_then_acquire(self, held, next).await;
        }
        let held: Box<dyn std::any::Any + Send + Sync> = held;
        let held = *held
            .downcast::<LockGuard>()
            .expect("a LockGuard, checked above");
        let (release, acquired) = acquire_after(&self.session, next, held).await;
        (release, acquired.map(|g| Box::new(g) as Box<dyn Guard>))
    }

    fn backend_name(&self) -> &'static str {
        "zookeeper"
    }
}
