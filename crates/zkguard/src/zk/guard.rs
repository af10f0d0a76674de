//! A held lock: its fencing token, loss detection while held, and release.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tracing::{debug, instrument, warn, Instrument};
use zookeeper_client::{Error as ZkError, EventType, MultiWriteError, WatchedEvent};

use super::carried::{Joined, NextOps, Retry};
use super::driver;
use super::map_zk;
use super::node::Paths;
use super::protocol::is_ours;
use super::reaper::Reap;
use super::release::{add_release, delete_carefully, release_held};
use super::session::{Health, Slot};
use crate::lock::{Guard, LockError, LockRequest, LockType, LossReason, LossSignal, Release};

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
    /// The monitor's data version that the take of the mutex left: the release applies only
    /// while it is unchanged (`None` where the session cannot write monitor nodes).
    version: Option<i32>,
    /// Whether the release empties the queue node before deleting it (see
    /// [`LockGuard::release`]).
    hand_over_mark: bool,
    loss: LossSignal,
    released: Arc<AtomicBool>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// What an acquisition hands to its guard: the token, the monitor's data version the take
/// left (see [`super::release::add_release`]), and whether the lock was taken on a monitor
/// with no other node (then its release needs no hand-over mark).
pub(super) struct Held {
    pub(super) token: u64,
    pub(super) version: Option<i32>,
    pub(super) alone: bool,
}

impl LockGuard {
    pub(super) fn start(
        slot: Arc<Slot>,
        paths: Paths,
        node: String,
        attempt: String,
        request: LockRequest,
        Held {
            token,
            version,
            alone,
        }: Held,
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
            version,
            hand_over_mark: !alone,
            loss: loss.clone(),
            released,
            stop: Some(stop_tx),
        };
        // The acquisition's last request was answered through the leader (it created the mutex,
        // or the queue node that holds it): the quorum knew the session a moment ago. This is
        // the instant the answer was handled, up to a round trip after the request was sent;
        // the margin of `config::grace::max_loss_grace` covers that.
        slot.credit(Instant::now());
        let holding = Holding::new(slot.clone());
        let span = tracing::info_span!("zk_lock_held", monitor = %request.monitor, token);
        debug!(node = %node, "watching the held lock");
        let held = Watched {
            mutex_path: paths.mutex,
            attempt,
            watch_after: request.loss_watch_after.unwrap_or(MUTEX_WATCH_AFTER),
        };
        tokio::spawn(watch_for_loss(slot, held, loss, stop_rx, holding).instrument(span));
        guard
    }

    /// The fencing token: strictly greater than every token issued before for this monitor,
    /// and for any monitor before this acquisition was asked for (locks of several monitors
    /// taken in one multi share it: see `docs/zookeeper-lock.md`, "Bulk acquisition").
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// Whether the lock is still held, as far as this process knows: a session expiry shows at
    /// once, and so does the grace (`zookeeper.lock.loss.grace`) running out since the last
    /// request the ZooKeeper quorum answered for the session (disconnected, or connected to a
    /// follower cut off from the leader: the session is confirmed with the leader while it holds
    /// a lock); a deletion of the mutex node by someone else once the holder watches it
    /// ([`MUTEX_WATCH_AFTER`] after the acquisition, or from the first call of
    /// [`LockGuard::lost`]).
    pub fn is_held(&self) -> bool {
        if self.released.load(Ordering::Acquire) || self.loss.get().is_some() {
            return false;
        }
        // The grace may have run out a moment before the loss watch wakes up: settle it here,
        // so that the answer is exact and never turns back.
        if Instant::now() >= self.slot.confirmed() + self.slot.grace {
            self.loss.fire(LossReason::Disconnected {
                grace: self.slot.grace,
            });
            return false;
        }
        true
    }

    /// The loss reason, if lost.
    pub fn loss(&self) -> Option<LossReason> {
        let _ = self.is_held();
        self.loss.get()
    }

    /// The monitor object.
    pub fn monitor(&self) -> &str {
        &self.monitor
    }

    /// Completes when the lock is lost (session expired, no answer of the ZooKeeper quorum for
    /// longer than the grace, mutex node deleted by someone else). The first call makes the
    /// holder watch the mutex node at once, if it does not yet (one request).
    ///
    /// # Cancellation safety
    /// Cancel-safe: it only observes.
    pub async fn lost(&self) -> LossReason {
        self.loss.wait().await
    }

    /// Releases the lock: deletes the queue node and the mutex node in one multi, and waits for
    /// the answer. The same as `self.release().await`.
    ///
    /// # Errors
    /// - [`LockError::NoNode`]: the lock no longer existed (it was lost before the release);
    /// - [`LockError::SessionExpired`]: the session expired (the nodes went with it).
    ///
    /// # Cancellation safety
    /// Cancel-safe: the release is sent at the first poll and finishes in the background.
    pub async fn unlock(self) -> Result<(), LockError> {
        self.release().await
    }

    /// Releases the lock without waiting: sends the release multi (or, after a loss, whatever
    /// is left to delete) before it returns, and answers the outcome through the returned
    /// [`Release`], which finishes in the background if dropped. ZooKeeper applies a session's
    /// requests in order: the session's next request, such as the next acquisition of the same
    /// monitor, goes out right behind the release and finds it applied, without a round trip
    /// of its own spent waiting for it (see [`Guard::release`]).
    ///
    /// The multi empties the queue node before deleting it (the hand-over mark, see
    /// `docs/zookeeper-lock.md`, "Handoff"), unless the lock was taken on a monitor with no
    /// other node: then every waiter came later, a first-class waiter right behind saw this
    /// lock's node as the head (all it needs to take the lock on `NodeDeleted`), and a waiter
    /// of another class verifies the queue anyway.
    ///
    /// # Errors
    /// The [`Release`] resolves to the errors of [`LockGuard::unlock`].
    ///
    /// # Panics
    /// Outside a Tokio runtime (as [`tokio::spawn`]); dropping the guard releases it anywhere.
    #[instrument(name = "zk_unlock", skip_all, fields(monitor = %self.monitor, token = self.token))]
    pub fn release(self) -> Release {
        let this = match self.hand_over() {
            Ok(release) => return release,
            Err(this) => this,
        };
        let releasing = this.stop_holding();
        // The first poll (in Release::start, before this returns) sends the first request.
        Release::start(releasing.run().in_current_span())
    }

    /// Releases the lock in a multi that also carries the next acquisition's first operations,
    /// `next` (on the same session), sent before this returns: the release multi's operations
    /// first, then `next`'s. The acquisition learns through `joined` whether they were applied
    /// (with the results of its own operations), were not (a multi is atomic), or whether the
    /// answer was lost (the release then deletes carefully, and the acquisition looks for what
    /// it created by attempt id). When one of `next`'s operations failed, the acquisition gets
    /// a [`Retry`]: through it, other operations go with the release in a new multi (the queue
    /// node, once the fast path found the monitor busy); dropped, the usual release runs. When
    /// the release's own part failed, the usual release runs at once.
    pub(super) fn release_with(
        self,
        next: NextOps,
        joined: tokio::sync::oneshot::Sender<Joined>,
    ) -> Release {
        let span = tracing::info_span!("zk_unlock", monitor = %self.monitor, token = self.token, joined = true);
        let releasing = self.stop_holding();
        let work = async move {
            let Some(mutex) = releasing.mutex.clone() else {
                let _ = joined.send(Joined::NotApplied { next_failed: None });
                return releasing.run().await;
            };
            let client = &releasing.slot.client;
            let mark =
                releasing.hand_over_mark && releasing.slot.mark_releases.load(Ordering::Relaxed);
            let (mut next, mut joined) = (next, joined);
            loop {
                let mut multi = client.new_multi_writer();
                let built = add_release(&mut multi, &releasing.node, mark, releasing.version)
                    .and_then(|own| next(&mut multi).map(|()| own));
                let Ok(own) = built else {
                    let _ = joined.send(Joined::NotApplied { next_failed: None });
                    return releasing.run().await;
                };
                return match multi.commit().await {
                    Ok(mut results) if results.len() > own => {
                        let _ = joined.send(Joined::Applied(results.split_off(own)));
                        releasing.outcome(Ok(()))
                    }
                    Ok(_) => {
                        let _ = joined.send(Joined::Lost(ZkError::UnexpectedError(
                            "a release multi answered without the next acquisition's results"
                                .into(),
                        )));
                        releasing.outcome(Ok(()))
                    }
                    // Nothing was done (a multi is atomic). The acquisition's part failed: it
                    // may send other operations to go with the release.
                    Err(MultiWriteError::OperationFailed { index, source }) if index >= own => {
                        let (retry, again) = tokio::sync::oneshot::channel();
                        let failed = (index - own, source, Retry(retry));
                        let _ = joined.send(Joined::NotApplied {
                            next_failed: Some(failed),
                        });
                        match again.await {
                            Ok((ops, answer)) => {
                                (next, joined) = (ops, answer);
                                continue;
                            }
                            Err(_) => releasing.run().await,
                        }
                    }
                    // The release's part failed: the usual release finds out what.
                    Err(MultiWriteError::OperationFailed { .. }) => {
                        let _ = joined.send(Joined::NotApplied { next_failed: None });
                        releasing.run().await
                    }
                    Err(MultiWriteError::RequestFailed { source }) => {
                        let _ = joined.send(Joined::Lost(source.clone()));
                        match source {
                            ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_) => {
                                let result = delete_carefully(
                                    client,
                                    Some(&releasing.node),
                                    Some(&mutex),
                                    &releasing.attempt,
                                    false,
                                )
                                .await;
                                releasing.outcome(result)
                            }
                            e => releasing.outcome(Err(e)),
                        }
                    }
                };
            }
        };
        Release::start(work.instrument(span))
    }

    /// Releases `guards` (all of one session) together: the release multis of those still
    /// holding their mutex in one multi per 256 (fewer when their bytes reach the session's
    /// `zookeeper.max.request.bytes`), sent before this returns; the others on their
    /// own. When a multi's release cannot be applied (a lock lost meanwhile), nothing of it is,
    /// and each of its locks is released on its own; after a lost answer, each deletes
    /// carefully. Resolves to the first error, the others released all the same.
    pub(super) fn release_together(guards: Vec<LockGuard>) -> Release {
        /// Releases in one multi at most (about 300 bytes each).
        const PER_MULTI: usize = 256;
        // A lock that a waiter of this session is next for goes to it in one transaction.
        let (handed, guards): (Vec<LockGuard>, Vec<LockGuard>) =
            guards.into_iter().partition(LockGuard::has_successor);
        if !handed.is_empty() {
            let mut releases: Vec<Release> = handed.into_iter().map(LockGuard::release).collect();
            if !guards.is_empty() {
                releases.push(Self::release_together(guards));
            }
            return Release::all(releases);
        }
        let span = tracing::info_span!("zk_unlock_together", locks = guards.len());
        let releasing: Vec<Releasing> = guards.into_iter().map(LockGuard::stop_holding).collect();
        let (together, alone): (Vec<Releasing>, Vec<Releasing>) =
            releasing.into_iter().partition(|r| r.mutex.is_some());
        let mut chunks: Vec<Vec<Releasing>> = Vec::new();
        let mut used = 0;
        for r in together {
            let limit = r.slot.limit;
            let size = limit.release(&r.node);
            match chunks.last_mut() {
                Some(chunk) if chunk.len() < PER_MULTI && limit.fits(used + size) => {
                    used += size;
                    chunk.push(r);
                }
                _ => {
                    used = size;
                    chunks.push(vec![r]);
                }
            }
        }
        let work = async move {
            let outcomes = futures::future::join_all(
                chunks.into_iter().map(release_chunk).chain(
                    alone
                        .into_iter()
                        .map(|r| Box::pin(async move { vec![r.run().await] }) as _),
                ),
            )
            .await;
            outcomes
                .into_iter()
                .flatten()
                .find(Result::is_err)
                .unwrap_or(Ok(()))
        };
        Release::start(work.instrument(span))
    }

    /// Ends holding: stops the loss watch and hands over what the release needs.
    fn stop_holding(mut self) -> Releasing {
        self.released.store(true, Ordering::Release);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let mutex_deleted = self.loss.get() == Some(LossReason::MutexDeleted);
        Releasing {
            slot: self.slot.clone(),
            mutex: (!mutex_deleted).then(|| self.mutex_path.clone()),
            node: self.node_path.clone(),
            attempt: self.attempt.clone(),
            monitor: self.monitor.clone(),
            version: self.version,
            hand_over_mark: self.hand_over_mark,
        }
    }

    /// Hands the lock to a waiter of this session that is next for certain (`zk::successor`):
    /// the release multi carries the waiter's take of the mutex, one transaction and one
    /// request for the release and the next hold. `Err(self)` when no such waiter waits, or
    /// when this lock cannot be released with a check of the monitor's version (its mutex was
    /// deleted by someone else, or the session may not write monitor nodes).
    #[allow(clippy::result_large_err)] // the guard itself comes back, to be released as usual
    fn hand_over(self) -> Result<Release, Self> {
        if self.version.is_none() || !self.is_held() {
            return Err(self);
        }
        let Some((monitor, node)) = self.monitor_and_node() else {
            return Err(self);
        };
        let (monitor, node) = (monitor.to_string(), node.to_string());
        let slot = self.slot.clone();
        slot.successors
            .hand_over(&monitor, &node, self, |held, ops, joined| {
                debug!("handing the lock over within the session");
                held.release_with(ops, joined)
            })
    }

    /// Whether a waiter of this session waits to be handed this lock (`zk::successor`).
    pub(super) fn has_successor(&self) -> bool {
        self.monitor_and_node()
            .is_some_and(|(monitor, node)| self.slot.successors.awaits(monitor, node))
    }

    /// The monitor's path and the name of this lock's queue node.
    fn monitor_and_node(&self) -> Option<(&str, &str)> {
        self.node_path.rsplit_once('/')
    }

    /// The zxid that created this lock's `privateLock` under `mutex_path`, when this is a lock
    /// of that monitor and its token says so exactly: its take set the monitor's data in the
    /// same transaction (or read the mutex), which every take does where the session may write
    /// monitor nodes. `None` otherwise.
    pub(super) fn take_zxid_on(&self, mutex_path: &str) -> Option<i64> {
        let zxid = self.token.checked_sub(super::protocol::TOKEN_BASE)?;
        (self.mutex_path == mutex_path && self.version.is_some())
            .then(|| i64::try_from(zxid).ok())
            .flatten()
    }

    /// Whether `other` was acquired through the same session as this guard.
    pub(super) fn same_session(&self, other: &LockGuard) -> bool {
        Arc::ptr_eq(&self.slot, &other.slot)
    }

    /// Whether this guard can release in the multi of `slot`'s next acquisition: the same
    /// session, and the lock still held.
    pub(super) fn can_release_with(&self, slot: &Arc<Slot>) -> bool {
        Arc::ptr_eq(&self.slot, slot) && self.is_held()
    }
}

/// What a release needs of its guard.
struct Releasing {
    slot: Arc<Slot>,
    /// The mutex node, unless someone else deleted it.
    mutex: Option<String>,
    node: String,
    attempt: String,
    monitor: String,
    /// See [`LockGuard`]'s field.
    version: Option<i32>,
    hand_over_mark: bool,
}

type Outcomes =
    std::pin::Pin<Box<dyn std::future::Future<Output = Vec<Result<(), LockError>>> + Send>>;

/// One multi of [`LockGuard::release_together`]: every release in it, or each on its own.
fn release_chunk(chunk: Vec<Releasing>) -> Outcomes {
    Box::pin(async move {
        let client = chunk[0].slot.client.clone();
        let mut multi = client.new_multi_writer();
        let built = chunk.iter().try_for_each(|r| {
            let mark = r.hand_over_mark && r.slot.mark_releases.load(Ordering::Relaxed);
            add_release(&mut multi, &r.node, mark, r.version).map(|_| ())
        });
        if built.is_err() {
            return futures::future::join_all(chunk.into_iter().map(Releasing::run)).await;
        }
        match multi.commit().await {
            Ok(_) => chunk.into_iter().map(|r| r.outcome(Ok(()))).collect(),
            // Nothing was applied (a multi is atomic): each finds out on its own what failed.
            Err(MultiWriteError::OperationFailed { .. }) => {
                futures::future::join_all(chunk.into_iter().map(Releasing::run)).await
            }
            Err(MultiWriteError::RequestFailed { source }) => match source {
                ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_) => {
                    futures::future::join_all(chunk.into_iter().map(|r| async move {
                        let result = delete_carefully(
                            &r.slot.client,
                            Some(&r.node),
                            r.mutex.as_deref(),
                            &r.attempt,
                            false,
                        )
                        .await;
                        r.outcome(result)
                    }))
                    .await
                }
                e => chunk
                    .into_iter()
                    .map(|r| r.outcome(Err(e.clone())))
                    .collect(),
            },
        }
    })
}

impl Releasing {
    /// The release on its own: the release multi (with the hand-over mark unless the lock was
    /// taken alone), careful deletes when that is no longer certain.
    async fn run(self) -> Result<(), LockError> {
        let result = release_held(
            &self.slot.client,
            &self.slot.releases,
            &self.node,
            self.mutex.as_deref(),
            &self.attempt,
            self.hand_over_mark.then_some(&self.slot.mark_releases),
            self.version,
        )
        .await;
        self.outcome(result)
    }

    /// The release's outcome from the answer of its deletes.
    fn outcome(self, result: Result<(), ZkError>) -> Result<(), LockError> {
        let Self {
            monitor,
            node,
            mutex,
            ..
        } = self;
        match result {
            Ok(()) if mutex.is_none() => Err(LockError::NoNode {
                monitor,
                detail: "the mutex node had been deleted by someone else".into(),
            }),
            Ok(()) => {
                debug!("lock released");
                Ok(())
            }
            Err(ZkError::NoNode) => Err(LockError::NoNode {
                monitor,
                detail: format!("{node} or its mutex node was already gone"),
            }),
            Err(ZkError::SessionExpired | ZkError::ClientClosed) => {
                Err(LockError::SessionExpired {
                    context: format!("releasing `{monitor}`"),
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

/// How long a lock is held before its holder watches the mutex node for a deletion by someone
/// else; at once when someone awaits [`LockGuard::lost`] (as `zkguard exec` does). A watch costs
/// a request; a lock held for less than this (a single fenced write) does without it, with
/// fencing to reject its write should the mutex have gone meanwhile. Session expiry and a long
/// disconnection are seen at once either way.
pub const MUTEX_WATCH_AFTER: Duration = Duration::from_millis(100);

/// How long a released lock's mutex watch is kept, at most, until the release's own deletion of
/// the mutex fires it: dropped before it fired, it would cost a request to remove.
const KEEP_FIRED_WATCH: Duration = Duration::from_secs(300);

/// A one-shot watch's event to come.
pub(super) type WatchEvent =
    std::pin::Pin<Box<dyn std::future::Future<Output = WatchedEvent> + Send>>;
type MutexEvent = WatchEvent;

/// One lock held by its session, from its acquisition until its loss watch ends: the session
/// is confirmed with the quorum while it holds one (`zk::confirm`).
pub(super) struct Holding(Arc<Slot>);

impl Holding {
    fn new(slot: Arc<Slot>) -> Self {
        slot.hold();
        Self(slot)
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.0.unhold();
    }
}

/// Watches a held lock: session expiry, the grace running out since the quorum last answered
/// for the session (disconnected, or connected to a follower cut off from the leader), and
/// (after [`MUTEX_WATCH_AFTER`], or once someone awaits the loss) the mutex node changing hands.
/// `holding` counts the lock as held by its session until the watch ends.
pub(super) async fn watch_for_loss(
    slot: Arc<Slot>,
    held: Watched,
    loss: LossSignal,
    stop: tokio::sync::oneshot::Receiver<()>,
    holding: Holding,
) {
    let keep = watch_held(&slot, &held, &loss, stop).await;
    // Released or lost: the session need not be confirmed for this lock any more.
    drop(holding);
    keep_until_fired(keep).await;
}

/// What [`watch_for_loss`] watches: the lock's mutex node, the attempt it carries, and when
/// the holder starts watching it ([`MUTEX_WATCH_AFTER`], or the request's
/// [`LockRequest::with_loss_watch_after`]).
pub(super) struct Watched {
    pub(super) mutex_path: String,
    pub(super) attempt: String,
    pub(super) watch_after: Duration,
}

/// The loop of [`watch_for_loss`]; returns the mutex watch to keep after a release.
async fn watch_held(
    slot: &Slot,
    held: &Watched,
    loss: &LossSignal,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> Option<MutexEvent> {
    let (mutex_path, attempt) = (held.mutex_path.as_str(), held.attempt.as_str());
    let released = |stop: &mut tokio::sync::oneshot::Receiver<()>| {
        !matches!(
            stop.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty)
        )
    };
    let mut health = slot.health_watch();
    let watch_at = tokio::time::Instant::now() + held.watch_after;
    // The mutex watch, once armed.
    let mut mutex: Option<MutexEvent> = None;
    let mut armed = false;
    // Read the mutex (and watch it) before waiting again.
    let mut check = false;
    loop {
        let state = *health.borrow_and_update();
        match state {
            Health::Expired => {
                warn!("session expired: lock lost");
                loss.fire(LossReason::SessionExpired);
                return None;
            }
            Health::Closed => {
                loss.fire(LossReason::Closed);
                return None;
            }
            Health::Connected | Health::Disconnected { .. } => {}
        }
        // The grace runs from the last request the quorum answered for the session, connected
        // or not: a follower cut off from the leader goes on answering pings and reads.
        let until = slot.confirmed() + slot.grace;
        if Instant::now() >= until {
            if released(&mut stop) {
                return mutex;
            }
            warn!(
                grace_ms = slot.grace.as_millis() as u64,
                connected = state == Health::Connected,
                "no answer of the ZooKeeper quorum for this session within the grace: lock counts as lost"
            );
            loss.fire(LossReason::Disconnected { grace: slot.grace });
            return None;
        }
        let connected = state == Health::Connected;
        // The read waits for no reconnection: while disconnected, the check waits for the
        // connection to come back (a reconnection sets it again), and the grace runs.
        if check && connected {
            check = false;
            armed = true;
            if released(&mut stop) {
                return mutex;
            }
            debug!("checking the mutex node");
            let reading = slot.client.get_and_watch_data(mutex_path);
            tokio::pin!(reading);
            let read = tokio::select! {
                biased;
                // Released while the read is on its way: its answer comes within a round trip,
                // and the watch it sets is kept until the release's deletion fires it (dropped
                // with the read, the client would send a request to remove it).
                _ = &mut stop => {
                    return match tokio::time::timeout(KEEP_FIRED_WATCH, reading).await {
                        Ok(Ok((_, _, watcher))) => Some(Box::pin(watcher.changed())),
                        _ => mutex,
                    };
                }
                r = &mut reading => Some(r),
                // Connection trouble, or the grace ran out: decided above, and the mutex is
                // read once connected.
                _ = health.changed() => None,
                _ = tokio::time::sleep_until(until.into()) => None,
            };
            let Some(read) = read else {
                check = true;
                continue;
            };
            let lost = match read {
                Ok((bytes, stat, watcher)) => {
                    // Replaces an earlier watch of the same node, which fired or is shared: no
                    // request to remove it.
                    mutex = Some(Box::pin(watcher.changed()));
                    // The core's ownership test: this session's, of this acquisition's attempt.
                    let ours =
                        is_ours(&driver::read(&bytes, &stat), slot.session_id, attempt, None);
                    (!ours).then_some("the mutex node now belongs to someone else: lock lost")
                }
                Err(ZkError::NoNode) => Some("the mutex node was deleted: lock lost"),
                // Connection trouble: health decides, and the mutex is read again once connected.
                Err(_) => None,
            };
            if let Some(what) = lost {
                // Released while reading: not a loss.
                if !released(&mut stop) {
                    warn!("{what}");
                    loss.fire(LossReason::MutexDeleted);
                }
                return None;
            }
            continue;
        }
        tokio::select! {
            biased;
            _ = &mut stop => return mutex,
            // Decided at the top of the loop (a confirmation may have come meanwhile).
            _ = tokio::time::sleep_until(until.into()) => {}
            event = async { mutex.as_mut().expect("guarded by the condition").await }, if connected && mutex.is_some() => {
                mutex = None;
                // Deleted or changed: read it again (a session event: health decides first).
                check = event.event_type != EventType::Session;
            }
            r = health.changed() => {
                if r.is_err() { loss.fire(LossReason::SessionExpired); return None; }
                // After a reconnection the mutex may have changed unseen: check it.
                if armed && *health.borrow() == Health::Connected { check = true; }
            }
            _ = loss.interest(), if !armed => { armed = true; check = true; }
            _ = tokio::time::sleep_until(watch_at), if !armed => { armed = true; check = true; }
        }
    }
}

/// Keeps a released lock's mutex watch until it fires (the release deletes the mutex, or the
/// session ends), so that dropping it sends no request to remove it.
pub(super) async fn keep_until_fired(mutex: Option<MutexEvent>) {
    if let Some(event) = mutex {
        let _ = tokio::time::timeout(KEEP_FIRED_WATCH, event).await;
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
    async fn release(self: Box<Self>) -> Release {
        LockGuard::release(*self)
    }
}
