//! The priority-lock recipe's entry points and its acquisition loop: queue, wait for the
//! contenders ahead, take the mutex, or give up at the deadline.
//!
//! See `docs/zookeeper-lock.md` for the znode layout and the state machines.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tracing::{debug, info, instrument};
use zookeeper_client::{EventType, OneshotWatcher};

use super::acl::{acl_list, check_lock_root};
use super::carried::{Joined, NextOps};
use super::contender::{health_failure, wait_connected};
use super::driver::{add_ops, lock_error, perform, root_depth, Contents};
use super::guard::{keep_until_fired, Held, LockGuard, WatchEvent};
use super::handover::After;
use super::node::{attempt_id, now_ms, NodeData, Paths};
use super::protocol::{
    Acquisition, Action, Fired, Input, Outcome, Previous, Reply, Request, Send as Requests, Spec,
};
use super::reaper::Reap;
use super::session::{Slot, ZkSession};
use super::successor::Waiter;
use crate::config::ZkAcl;
use crate::lock::{
    release_then_acquire, validate_info, validate_monitor, Blocker, Guard, LockError, LockRequest,
    LockService, LockType, Release,
};

/// How long an acquisition may run past its deadline: the time it has to give up in order
/// (read what stands in the way, remove its queue node) once the deadline passed. Whatever the
/// session is doing (disconnected, a request without an answer, a new session being connected),
/// an acquisition returns by its deadline plus this; what it may have left on the server is
/// removed by the session's reaper once ZooKeeper answers again (see `docs/zookeeper-lock.md`,
/// "Deadlines").
pub const DEADLINE_OVERRUN: Duration = Duration::from_secs(1);

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
    /// [`crate::lock::validate_monitor`]); [`LockError::InfoTooLong`] when `lock_info` is longer
    /// than [`crate::lock::MAX_INFO_LEN`].
    pub fn new(
        lock_info: impl Into<String>,
        zk: &ZkSession,
        monitor_object: impl Into<String>,
    ) -> Result<Self, LockError> {
        let request = LockRequest::new(monitor_object, lock_info);
        validate_monitor(&request.monitor)?;
        validate_info(&request.info)?;
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
    /// ([`Duration::ZERO`]) tries once, as [`ZkBlockingWriteLock::try_lock`]. It returns by
    /// the deadline plus [`DEADLINE_OVERRUN`], whatever ZooKeeper does.
    ///
    /// # Errors
    /// - [`LockError::Timeout`] (the design's `InstanceLockException`): not acquired in time;
    ///   the queue node was removed before this returns. The error names what stood in the way
    ///   when the wait ended (the holder, a stray mutex node or the contenders queued ahead).
    /// - [`LockError::SessionExpired`], [`LockError::ConnectionLoss`]: ZooKeeper trouble. A
    ///   session still disconnected at the deadline, or a ZooKeeper that has not answered by
    ///   the deadline plus [`DEADLINE_OVERRUN`], is a connection loss; whatever the attempt may
    ///   have made (a queue node, the mutex) is removed by the session once ZooKeeper answers
    ///   again.
    /// - [`LockError::Backend`] when its requests could not fit `zookeeper.max.request.bytes`
    ///   (nothing is sent then).
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

/// Acquires `request` by its deadline plus [`DEADLINE_OVERRUN`], whatever the session does: an
/// acquisition still running then (a request without an answer, a session still connecting) is
/// dropped, which hands what it may have made to the session's reaper ([`Contender`]'s drop),
/// and fails with a connection loss.
#[instrument(name = "zk_lock", skip_all, fields(monitor = %request.monitor, lock_type = %request.lock_type))]
async fn acquire_with(
    session: &ZkSession,
    request: LockRequest,
    handover: &mut Handover,
) -> Result<LockGuard, LockError> {
    validate_monitor(&request.monitor)?;
    validate_info(&request.info)?;
    let timeout = request
        .timeout
        .unwrap_or_else(|| session.settings().timeout(request.lock_type));
    let started = Instant::now();
    let deadline = started + timeout;
    let monitor = request.monitor.clone();
    let acquisition = acquire_by(session, request, handover, started, timeout);
    let Some(limit) = deadline.checked_add(DEADLINE_OVERRUN) else {
        return acquisition.await;
    };
    match tokio::time::timeout_at(limit.into(), acquisition).await {
        Ok(result) => result,
        Err(_) => {
            debug!("no answer from ZooKeeper by the deadline; the session's reaper removes what the attempt made");
            Err(LockError::ConnectionLoss {
                context: format!("acquiring the lock on `{monitor}`"),
                detail: format!(
                    "ZooKeeper did not answer within the timeout ({}ms) and {}ms more to give up; whatever the attempt made is removed once it answers again; check that ZooKeeper is running and reachable",
                    timeout.as_millis(),
                    DEADLINE_OVERRUN.as_millis()
                ),
            })
        }
    }
}

/// The acquisition of [`acquire_with`]: queue, wait, take, or give up `timeout` after
/// `started`. The core decides every step ([`Acquisition`]); this loop performs what it asks
/// ([`Run`]) and tells it how long the acquisition has run.
async fn acquire_by(
    session: &ZkSession,
    request: LockRequest,
    handover: &mut Handover,
    started: Instant,
    timeout: Duration,
) -> Result<LockGuard, LockError> {
    let settings = session.settings();
    let slot = session.slot().await?;
    let paths = Paths::new(
        &settings.lock_root,
        &request.monitor,
        acl_list(&settings.acl),
    );
    check_lock_root_once(session, &slot).await?;
    let data = node_data(session, &request);
    // Each request fits `zookeeper.max.request.bytes`, or none is sent.
    let data_len = super::node::encode(&data).len();
    slot.limit
        .check_acquisition(&settings.lock_root, paths.acl(), data_len)?;
    let previous = handover.previous.take();
    let spec = spec_of(
        session,
        &request,
        &data,
        &slot,
        &paths,
        timeout,
        previous.as_ref(),
    );
    let core = Acquisition::new(spec, &slot.learned(), &paths.mutex);
    // The lock this acquisition releases: in its first multi where the core carries it, else
    // on its own at once.
    let carrier = match previous {
        Some(previous) if core.carrying() => Some(After::new(previous, &mut handover.release)),
        Some(previous) => {
            handover.release = Some(previous.release());
            None
        }
        None => None,
    };
    let mut run = Run {
        contender: Contender {
            slot: slot.clone(),
            paths,
            core,
            waiter: None,
        },
        data,
        carrier,
        watcher: None,
        started,
        deadline: started + timeout,
        blocked_by: None,
        ended: None,
        backoff: crate::Backoff::new(Duration::from_millis(20), Duration::from_secs(1)),
    };
    let mut action = run.contender.core.start(started.elapsed());
    loop {
        tracing::trace!(?action, "acquisition step");
        let input = match action {
            Action::Send(send) => run.send(send).await,
            Action::AwaitWatch => run.await_watch().await?,
            Action::AwaitConnected => {
                debug!("connection loss; waiting to reconnect");
                wait_connected(&slot, run.deadline).await?;
                Input::Connected
            }
            Action::Backoff => {
                tokio::time::sleep(run.backoff.next_delay()).await;
                Input::Woke
            }
            Action::Describe => {
                let contender = &run.contender;
                run.blocked_by = describe(&slot, &contender.paths, &contender.core).await;
                Input::Described
            }
            Action::Done => break,
        };
        tracing::trace!(?input, "acquisition input");
        action = run.contender.core.handle(input, started.elapsed());
        run.contender.learn();
    }
    run.outcome(request)
}

/// Checks the lock root's ACL against `zookeeper.acl` once per session (an open ACL needs no
/// check).
async fn check_lock_root_once(session: &ZkSession, slot: &Slot) -> Result<(), LockError> {
    let settings = session.settings();
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
    Ok(())
}

/// The data of the nodes an acquisition of `request` creates.
fn node_data(session: &ZkSession, request: &LockRequest) -> NodeData {
    NodeData {
        info: request.info.clone(),
        owner: session.owner_id().to_string(),
        attempt: attempt_id(),
        host: session.host().to_string(),
        pid: std::process::id(),
        lock_type: request.lock_type,
        created_ms: now_ms(),
        node: None,
        promoted: false,
    }
}

/// What the core needs to know of the acquisition of `request`: who it is, its class, its
/// deadline and promotion, and the lock before it releases (`previous`).
fn spec_of(
    session: &ZkSession,
    request: &LockRequest,
    data: &NodeData,
    slot: &Arc<Slot>,
    paths: &Paths,
    timeout: Duration,
    previous: Option<&LockGuard>,
) -> Spec {
    let settings = session.settings();
    Spec {
        me: slot.client.session_id().0,
        attempt: data.attempt.clone(),
        promoted_attempt: attempt_id(),
        prefix: settings.prefix(request.lock_type).to_string(),
        foreground: settings.foreground_prefix.clone(),
        background: settings.background_prefix.clone(),
        try_once: timeout.is_zero(),
        deadline: Some(timeout),
        promote_after: settings
            .background_max_wait
            .filter(|_| request.lock_type == LockType::Background),
        previous: previous.map(|p| Previous {
            held_here: p.can_release_with(slot),
            awaited: p.has_successor(),
            take_here: p.take_zxid_on(&paths.mutex),
        }),
        root_depth: root_depth(&settings.lock_root),
        flaw: None,
    }
}

/// One acquisition being driven: the contender, and what performing its core's actions needs.
struct Run<'r> {
    contender: Contender,
    /// The data of the nodes it creates (its attempt id and promotion follow the core's).
    data: NodeData,
    /// The lock released in this acquisition's first multi, until it goes.
    carrier: Option<After<'r>>,
    /// The watch the last requests left, for [`Action::AwaitWatch`].
    watcher: Option<OneshotWatcher>,
    started: Instant,
    /// The deadline, for the wait for a reconnection.
    deadline: Instant,
    /// What stood in the way when it gave up.
    blocked_by: Option<Box<Blocker>>,
    /// Why the session ended while it waited.
    ended: Option<LockError>,
    /// The pause before a retry after a connection loss.
    backoff: crate::Backoff,
}

impl Run<'_> {
    /// Sends the core's requests: with the release of the lock before where the core carries
    /// it, with the session's other fast paths where it sends its fast path alone, else
    /// pipelined on their own.
    async fn send(&mut self, send: Requests) -> Input {
        let core = &self.contender.core;
        let (slot, paths) = (&self.contender.slot, &self.contender.paths);
        self.data.attempt = core.attempt().to_string();
        self.data.promoted = core.promoted();
        let contents = Contents { data: &self.data };
        if send.carry {
            let replies =
                perform_carried(slot, paths, &contents, &send.requests, &mut self.carrier).await;
            return Input::Replies(replies);
        }
        if let Some(after) = self.carrier.take() {
            after.release_alone();
        }
        let replies = match send.requests.as_slice() {
            [Request::Multi(ops)] if core.sending_fast_path() => {
                let bytes = ops.iter().map(|op| contents.bytes_of(op)).collect();
                let attempt = core.attempt();
                vec![
                    slot.fast_paths
                        .send(paths, ops.clone(), bytes, attempt)
                        .await,
                ]
            }
            requests => {
                let (replies, w) = perform(&slot.client, paths, Some(&contents), requests).await;
                if w.is_some() {
                    self.watcher = w;
                }
                replies
            }
        };
        Input::Replies(replies)
    }

    /// Waits for the watch the last requests left, for the core's next wake-up
    /// ([`Acquisition::poll_timeout`]), for the session's end, or, at a hand-over point, for a
    /// holder of the session to hand the lock over.
    async fn await_watch(&mut self) -> Result<Input, LockError> {
        let slot = self.contender.slot.clone();
        let mut health = slot.health_watch();
        let Some(w) = self.watcher.take() else {
            return Err(LockError::Backend {
                context: "waiting for the lock".into(),
                detail: "no watch to wait on".into(),
            });
        };
        // Where a holder of this session may hand the lock over, it may say so.
        let waiter = self.contender.core.hand_over_point().map(|(awaits, ops)| {
            let contents = Contents { data: &self.data };
            let bytes = ops.iter().map(|op| contents.bytes_of(op)).collect();
            slot.successors
                .register(&self.contender.paths, awaits, ops, bytes)
        });
        self.contender.waiter = waiter.clone();
        let claimed = async {
            match &waiter {
                Some(waiter) => waiter.claimed().await,
                None => std::future::pending().await,
            }
        };
        // The core's next wake-up: its deadline, or a starving background waiter's promotion.
        let wake_at =
            (self.contender.core.poll_timeout()).and_then(|at| self.started.checked_add(at));
        let wake = async move {
            match wake_at {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        let mut fired: WatchEvent = Box::pin(w.changed());
        let (input, watch_fired) = tokio::select! {
            event = &mut fired => (Input::Fired(match event.event_type {
                EventType::NodeDataChanged => Fired::DataChanged,
                EventType::NodeDeleted => Fired::Deleted,
                _ => Fired::Session,
            }), true),
            () = claimed => (Input::Woke, false),
            () = wake => (Input::Woke, false),
            e = health_failure(&mut health) => { self.ended = Some(e); (Input::Ended, false) }
        };
        let Some(answer) = self.contender.take_claim() else {
            return Ok(input);
        };
        // Handed over: the holder's release carried this acquisition's take, whose answer is
        // the answer of that multi, whatever woke the wait.
        if !watch_fired {
            // The multi fires the watch: kept until then, it costs no request.
            tokio::spawn(keep_until_fired(Some(fired)));
        }
        self.contender.core.handed();
        self.ended = None;
        Ok(Input::Replies(vec![
            super::handover::joined_reply(answer).await,
        ]))
    }

    /// The acquisition's result, once the core is done.
    fn outcome(self, request: LockRequest) -> Result<LockGuard, LockError> {
        let Run {
            contender,
            started,
            blocked_by,
            ended,
            ..
        } = self;
        match contender.core.outcome().cloned() {
            Some(Outcome::Acquired {
                zxid,
                version,
                alone,
                node,
                others_seen,
            }) => {
                let token = super::protocol::from_zxid(zxid as u64);
                info!(node = %node, token, others_seen, waited_ms = started.elapsed().as_millis() as u64, "lock acquired");
                let attempt = contender.core.attempt().to_string();
                Ok(LockGuard::start(
                    contender.slot.clone(),
                    contender.paths.clone(),
                    node,
                    attempt,
                    request,
                    Held {
                        token,
                        version,
                        alone,
                    },
                ))
            }
            Some(Outcome::TimedOut) => {
                debug!(blocked_by = ?blocked_by, "timed out; queue node removed");
                Err(LockError::Timeout {
                    monitor: request.monitor.clone(),
                    lock_type: request.lock_type,
                    waited: started.elapsed(),
                    blocked_by,
                })
            }
            Some(Outcome::Ended) => Err(ended.unwrap_or(LockError::SessionExpired {
                context: "waiting for the lock".into(),
            })),
            Some(Outcome::Failed { code, context }) => Err(lock_error(&code, context)),
            None => Err(LockError::Backend {
                context: "acquiring the lock".into(),
                detail: "the acquisition ended without an outcome".into(),
            }),
        }
    }
}

/// An acquisition under way: the core, and what its session's reaper removes if it goes away
/// before it ends (cancelled, or failed with a node or a create in doubt).
struct Contender {
    slot: Arc<Slot>,
    paths: Paths,
    core: Acquisition,
    /// Its registration as a waiter a holder of the session may hand the lock to.
    waiter: Option<Arc<Waiter>>,
}

impl Contender {
    /// Ends its registration as a waiter at a hand-over point: the answer of its take, if a
    /// holder of the session sent it in its release.
    fn take_claim(&mut self) -> Option<tokio::sync::oneshot::Receiver<Joined>> {
        let waiter = self.waiter.take()?;
        self.slot.successors.close(&waiter)
    }

    /// Hands what the core's last step learnt of the session to the session's knowledge, for
    /// its later acquisitions (and says what it learnt).
    fn learn(&self) {
        let lessons = self.core.teach(&mut self.slot.learned(), &self.paths.mutex);
        if lessons.no_recreate {
            debug!("zookeeper.acl does not let this session recreate and write monitor nodes: the fast path reads the queue instead");
        }
        if lessons.no_versioned_takes {
            debug!("zookeeper.acl does not let this session write monitor nodes: its releases go without the check of the monitor's version");
        }
    }
}

impl Drop for Contender {
    fn drop(&mut self) {
        if self.take_claim().is_some() {
            // Gone while a holder's release carried its take: the mutex may be this attempt's.
            debug!("acquisition abandoned while handed the lock; removing its nodes");
            self.slot.reap(Reap {
                queue_node: self.core.node().map(|n| self.paths.child(n)),
                mutex: Some(self.paths.mutex.clone()),
                search: None,
                attempt: self.core.attempt().to_string(),
            });
            return;
        }
        if let Some(left) = self.core.leftovers() {
            debug!(node = ?left.node, holds_mutex = left.holds_mutex, search = ?left.search, "acquisition abandoned; removing its nodes");
            self.slot.reap(Reap {
                queue_node: left.node.as_deref().map(|n| self.paths.child(n)),
                mutex: left.holds_mutex.then(|| self.paths.mutex.clone()),
                search: left
                    .search
                    .map(|attempt| (self.paths.monitor.clone(), attempt)),
                attempt: left.attempt,
            });
        }
    }
}

/// Sends a multi with the release of the lock before (held, or waiting after a multi whose
/// acquisition part failed), and the requests pipelined behind it when it went out at once.
async fn perform_carried(
    slot: &Slot,
    paths: &Paths,
    contents: &Contents<'_>,
    requests: &[Request],
    carrier: &mut Option<After<'_>>,
) -> Vec<Reply> {
    let (Some(Request::Multi(ops)), Some(after)) = (requests.first(), carrier.take()) else {
        return perform(&slot.client, paths, Some(contents), requests)
            .await
            .0;
    };
    let ops: NextOps = {
        let (paths, ops) = (paths.clone(), ops.clone());
        let bytes: Vec<Vec<u8>> = ops.iter().map(|op| contents.bytes_of(op)).collect();
        Box::new(move |multi| add_ops(multi, &paths, &ops, &bytes))
    };
    let sent = after.send(ops);
    // Pipelined when the multi went out already: the reads then see it. (A release that
    // waited sends it from its task: the queue is read once the answer is in.)
    let rest = if sent.now {
        Some(perform(&slot.client, paths, Some(contents), &requests[1..]))
    } else {
        None
    };
    let (first, waiting) = sent.answer().await;
    *carrier = waiting;
    let mut replies = vec![first];
    match rest {
        Some(rest) => replies.extend(rest.await.0),
        None => replies.extend(requests[1..].iter().map(|_| Reply::Skipped)),
    }
    replies
}

/// What stands in the way of a contender that gives up, read from the lock itself just before
/// its node goes.
async fn describe(slot: &Slot, paths: &Paths, core: &Acquisition) -> Option<Box<Blocker>> {
    match super::inspect::read_monitor(&slot.client, &paths.monitor).await {
        Ok(Some(view)) => Some(Box::new(view.blocker(
            &paths.mutex,
            core.prefix(),
            core.node(),
        ))),
        Ok(None) => Some(Box::new(Blocker::Released)),
        Err(e) => {
            debug!(error = %e, "could not read what held the lock");
            None
        }
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

    async fn release_all(&self, held: Vec<Box<dyn Guard>>) -> Release {
        let mut ours = Vec::new();
        let mut others = Vec::new();
        for guard in held {
            if (guard.as_ref() as &dyn std::any::Any).is::<LockGuard>() {
                let guard: Box<dyn std::any::Any + Send + Sync> = guard;
                ours.push(
                    *guard
                        .downcast::<LockGuard>()
                        .expect("a LockGuard, checked above"),
                );
            } else {
                others.push(guard.release().await);
            }
        }
        // Several sessions' guards (of other services): one multi per session.
        let mut by_session: Vec<Vec<LockGuard>> = Vec::new();
        for guard in ours {
            match by_session.iter_mut().find(|g| g[0].same_session(&guard)) {
                Some(group) => group.push(guard),
                None => by_session.push(vec![guard]),
            }
        }
        others.extend(by_session.into_iter().map(LockGuard::release_together));
        Release::all(others)
    }

    fn backend_name(&self) -> &'static str {
        "zookeeper"
    }
}
