//! The queue: the monitor node, queue nodes (created alone or with the mutex in one multi),
//! re-queueing a starved background waiter as foreground, and reading the queue in order.

use std::sync::atomic::Ordering;
use std::time::Instant;

use tracing::{debug, info};
use zookeeper_client::{
    Client, CreateMode, Error as ZkError, MultiWriteError, MultiWriteResult, MultiWriter,
};

use super::contender::{wait_connected, Pending, Step};
use super::guard::{Joined, LockGuard, NextOps, Retry};
use super::map_zk;
use super::mutex::yield_mutex;
use super::names::Queue;
use super::node::{attempt_id, child_name, encode, NodeData, Paths};
use super::release::delete_nodes;
use super::session::Slot;
use crate::lock::{LockError, Release};

/// The fast path, one request: a multi that deletes the monitor node, creates it again,
/// creates our queue node and the mutex node in it, and sets the monitor's (empty) data, whose
/// answer carries the monitor's stat as of the multi. The delete fails (`NotEmpty`) unless the
/// monitor has no child at all: nobody holds the mutex and nobody is queued. So when the multi
/// succeeds we are alone and first: the lock is ours, with the multi's zxid (the monitor's
/// `mzxid`, also the mutex's `czxid`) as the token, and no read of the queue is needed. When it
/// fails, nothing was done (a multi is atomic): queues with a plain create if `queue_if_held`,
/// else returns [`Step::Busy`].
///
/// The multi needs the DELETE and CREATE permissions on the lock root and WRITE on the monitor
/// node; with a `zookeeper.acl` that withholds one of them the session falls back for good to
/// [`fast_path_listed`].
pub(super) async fn fast_path(
    client: &Client,
    paths: &Paths,
    prefix: &str,
    data: &NodeData,
    pending: &mut Pending,
    queue_if_held: bool,
    after: Option<After<'_>>,
) -> Result<Step, ZkError> {
    if !pending.slot.recreating_fast_path.load(Ordering::Relaxed) {
        if let Some(after) = after {
            after.release_alone();
        }
        return fast_path_listed(client, paths, prefix, data, pending, queue_if_held).await;
    }
    let bytes = encode(data);
    pending.in_flight = true;
    let mut after = after;
    // The release still waiting for operations to carry, once the fast path's failed.
    let mut waiting = None;
    let committed = loop {
        match after.take() {
            Some(after) => {
                let ops: NextOps = {
                    let (paths, prefix, bytes) = (paths.clone(), prefix.to_string(), bytes.clone());
                    Box::new(move |multi| add_fast_path(multi, &paths, &prefix, &bytes))
                };
                match after.send(ops).answer().await {
                    (Some(committed), retry) => {
                        waiting = retry;
                        break committed;
                    }
                    // The release's own part failed: it goes alone, and so does this.
                    (None, _) => continue,
                }
            }
            None => {
                let mut multi = client.new_multi_writer();
                add_fast_path(&mut multi, paths, prefix, &bytes)?;
                break multi.commit().await;
            }
        }
    };
    // After a connection loss the multi may or may not have happened: stay "in flight" until
    // `recover_own` has looked, so that an abandoned attempt is searched for and removed.
    pending.in_flight = lost_answer(&committed);
    // Busy: the queue node goes with the release. Anything else: the release goes on its own.
    let busy = matches!(
        committed,
        Err(MultiWriteError::OperationFailed {
            index: 0,
            source: ZkError::NotEmpty
        })
    );
    if !busy {
        if let Some(waiting) = waiting.take() {
            waiting.release_alone();
        }
    }
    match committed {
        Ok(results) => {
            let [_, _, MultiWriteResult::Create { path, .. }, _, MultiWriteResult::SetData { stat }] =
                results.as_slice()
            else {
                // Applied, but what it made is unknown: the reaper searches by attempt id.
                pending.in_flight = true;
                return Err(ZkError::UnexpectedError(
                    "the fast path's multi answered with other results than a delete, three creates and a setData".into(),
                ));
            };
            pending.node = Some(child_name(path));
            pending.holds_mutex = true;
            pending.alone = true;
            // The multi's zxid: it created the mutex and last modified the monitor.
            Ok(Step::Acquired {
                token: stat.mzxid as u64,
                version: Some(stat.version),
            })
        }
        Err(MultiWriteError::OperationFailed {
            index: 0,
            source: ZkError::NotEmpty,
        }) => {
            // Held, or contenders queued.
            queue_when_busy(client, paths, prefix, data, pending, queue_if_held, waiting).await
        }
        Err(MultiWriteError::OperationFailed {
            source: ZkError::NoAuth,
            ..
        }) => {
            debug!("zookeeper.acl does not let this session recreate and write monitor nodes: the fast path reads the queue instead");
            pending
                .slot
                .recreating_fast_path
                .store(false, Ordering::Relaxed);
            fast_path_listed(client, paths, prefix, data, pending, queue_if_held).await
        }
        Err(MultiWriteError::OperationFailed { source, .. }) => Err(source),
        Err(MultiWriteError::RequestFailed { source }) => Err(source),
    }
}

/// The fast path's operations: delete the monitor node, create it again (a container), create
/// our queue node and the mutex in it, set the monitor's (empty) data.
fn add_fast_path(
    multi: &mut MultiWriter<'_>,
    paths: &Paths,
    prefix: &str,
    bytes: &[u8],
) -> Result<(), ZkError> {
    multi.add_delete(&paths.monitor, None)?;
    multi.add_create(&paths.monitor, &[], &paths.create(CreateMode::Container))?;
    add_queue_node_and_mutex(multi, paths, prefix, bytes)?;
    multi.add_set_data(&paths.monitor, &[], None)
}

/// A lock of the same session that an acquisition releases in its first multi
/// (`LockGuard::release_with`), and where the release under way goes.
pub(super) struct After<'r> {
    how: Carrier,
    release: &'r mut Option<Release>,
}

/// What carries the next operations: the held lock, or its release waiting after a multi whose
/// acquisition part failed.
enum Carrier {
    Held(LockGuard),
    Waiting(Retry),
}

impl<'r> After<'r> {
    /// `previous`, whose release goes to `release` once under way.
    pub(super) fn new(previous: LockGuard, release: &'r mut Option<Release>) -> Self {
        Self {
            how: Carrier::Held(previous),
            release,
        }
    }

    /// Releases the lock on its own.
    pub(super) fn release_alone(self) {
        match self.how {
            Carrier::Held(previous) => *self.release = Some(previous.release()),
            // Dropped, the waiting release goes on its own.
            Carrier::Waiting(retry) => drop(retry),
        }
    }

    /// Has the release send `ops` with it in one multi: before this returns for a held lock,
    /// once the release's task runs for a waiting one ([`Sent::now`]).
    fn send(self, ops: NextOps) -> Sent<'r> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let now = match self.how {
            Carrier::Held(previous) => {
                *self.release = Some(previous.release_with(ops, tx));
                true
            }
            Carrier::Waiting(retry) => {
                retry.send(ops, tx);
                false
            }
        };
        Sent {
            rx,
            release: self.release,
            now,
        }
    }
}

/// Operations on their way with a release ([`After::send`]).
struct Sent<'r> {
    rx: tokio::sync::oneshot::Receiver<Joined>,
    release: &'r mut Option<Release>,
    /// Whether the request went out before `send` returned (a request sent after it is ordered
    /// behind the multi).
    now: bool,
}

impl<'r> Sent<'r> {
    /// Answers as `MultiWriter::commit` would for the operations alone: their results, the
    /// failure of one of them (nothing applied; then also the release, waiting for other
    /// operations), or a lost answer. `None` when the release's own part failed: nothing was
    /// applied, and the release went on its own.
    async fn answer(
        self,
    ) -> (
        Option<Result<Vec<MultiWriteResult>, MultiWriteError>>,
        Option<After<'r>>,
    ) {
        match self.rx.await {
            Ok(Joined::Applied(results)) => (Some(Ok(results)), None),
            Ok(Joined::NotApplied {
                next_failed: Some((index, source, retry)),
            }) => (
                Some(Err(MultiWriteError::OperationFailed { index, source })),
                Some(After {
                    how: Carrier::Waiting(retry),
                    release: self.release,
                }),
            ),
            Ok(Joined::NotApplied { next_failed: None }) => (None, None),
            Ok(Joined::Lost(source)) => {
                (Some(Err(MultiWriteError::RequestFailed { source })), None)
            }
            // The release task ended without a word (the runtime is shutting down).
            Err(_) => (
                Some(Err(MultiWriteError::RequestFailed {
                    source: ZkError::ConnectionLoss,
                })),
                None,
            ),
        }
    }
}

/// A fast path found the lock busy and created nothing: queue with a plain create (in the
/// multi of the release waiting in `after`, if any), or, trying once (not `queue_if_held`),
/// report [`Step::Busy`].
async fn queue_when_busy(
    client: &Client,
    paths: &Paths,
    prefix: &str,
    data: &NodeData,
    pending: &mut Pending,
    queue_if_held: bool,
    after: Option<After<'_>>,
) -> Result<Step, ZkError> {
    match after {
        Some(after) if queue_if_held => {
            queue_after(client, paths, prefix, data, pending, after).await
        }
        after => {
            if let Some(after) = after {
                after.release_alone();
            }
            if !queue_if_held {
                return Ok(Step::Busy);
            }
            plain_create(client, paths, prefix, data, pending).await
        }
    }
}

/// Adds the creates of our queue node and of the mutex (both with `bytes`, our node's data) to
/// a multi.
fn add_queue_node_and_mutex(
    multi: &mut MultiWriter<'_>,
    paths: &Paths,
    prefix: &str,
    bytes: &[u8],
) -> Result<(), ZkError> {
    add_queue_node(multi, paths, prefix, bytes)?;
    // The mutex names its holder's node, which is not known yet: the owner and attempt suffice.
    multi.add_create(&paths.mutex, bytes, &paths.create(CreateMode::Ephemeral))
}

/// Adds the create of our queue node (with `bytes`, its data) to a multi.
fn add_queue_node(
    multi: &mut MultiWriter<'_>,
    paths: &Paths,
    prefix: &str,
    bytes: &[u8],
) -> Result<(), ZkError> {
    multi.add_create(
        &format!("{}/{prefix}-", paths.monitor),
        bytes,
        &paths.create(CreateMode::EphemeralSequential),
    )
}

/// Whether a create's answer was lost or cannot be read: the create may or may not have
/// happened (a request that failed as a whole, a connection loss, an answer without the
/// results expected). Nothing was applied only when one operation was refused.
fn lost_answer<T>(result: &Result<T, MultiWriteError>) -> bool {
    matches!(result, Err(MultiWriteError::RequestFailed { .. }))
}

/// The fast path for a session that may not recreate monitor nodes: the multi creates the
/// queue node and the mutex (and sets the monitor's data, where the session may: see
/// `LockGuard`'s version), and the queue read is pipelined behind it (ZooKeeper answers a
/// session's requests in order, so the read sees the multi). If the read shows someone ahead (a
/// waiter between two holders), the mutex is given back at once.
async fn fast_path_listed(
    client: &Client,
    paths: &Paths,
    prefix: &str,
    data: &NodeData,
    pending: &mut Pending,
    queue_if_held: bool,
) -> Result<Step, ZkError> {
    let versioned = pending.slot.versioned_takes.load(Ordering::Relaxed);
    let mut multi = client.new_multi_writer();
    add_queue_node_and_mutex(&mut multi, paths, prefix, &encode(data))?;
    if versioned {
        multi.add_set_data(&paths.monitor, &[], None)?;
    }
    let commit = multi.commit();
    let children = client.get_children(&paths.monitor);
    pending.in_flight = true;
    let (committed, children) = tokio::join!(commit, children);
    pending.in_flight = lost_answer(&committed);
    match committed {
        Ok(results) => {
            let mut created = results.into_iter();
            let Some(MultiWriteResult::Create { path, .. }) = created.next() else {
                pending.in_flight = true;
                return Err(ZkError::UnexpectedError(
                    "multi returned no create result".into(),
                ));
            };
            let mutex_stat = match created.next() {
                Some(MultiWriteResult::Create { stat, .. }) => stat,
                _ => {
                    pending.in_flight = true;
                    return Err(ZkError::UnexpectedError(
                        "multi returned no mutex result".into(),
                    ));
                }
            };
            let set = match created.next() {
                Some(MultiWriteResult::SetData { stat }) => Some(stat),
                _ => None,
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
                // With the monitor's data set in the multi, its mzxid is the multi's zxid.
                let token = match &set {
                    Some(set) => set.mzxid,
                    None if mutex_stat.is_invalid() => parent.pzxid,
                    None => mutex_stat.czxid,
                };
                Ok(Step::Acquired {
                    token: token as u64,
                    version: set.map(|s| s.version),
                })
            } else {
                yield_mutex(client, paths, pending).await?;
                Ok(Step::Wait(queue))
            }
        }
        Err(MultiWriteError::OperationFailed {
            index: 1,
            source: ZkError::NodeExists,
        }) => queue_when_busy(client, paths, prefix, data, pending, queue_if_held, None).await,
        Err(MultiWriteError::OperationFailed {
            index: 2,
            source: ZkError::NoAuth,
        }) if versioned => {
            debug!("zookeeper.acl does not let this session write monitor nodes: its releases go without the check of the monitor's version");
            pending.slot.versioned_takes.store(false, Ordering::Relaxed);
            Box::pin(fast_path_listed(
                client,
                paths,
                prefix,
                data,
                pending,
                queue_if_held,
            ))
            .await
        }
        Err(MultiWriteError::OperationFailed { source, .. }) => Err(source),
        Err(MultiWriteError::RequestFailed { source }) => Err(source),
    }
}

/// Creates our queue node alone, with the queue read pipelined.
pub(super) async fn plain_create(
    client: &Client,
    paths: &Paths,
    prefix: &str,
    data: &NodeData,
    pending: &mut Pending,
) -> Result<Step, ZkError> {
    let node_path = format!("{}/{prefix}-", paths.monitor);
    let bytes = encode(data);
    let options = paths.create(CreateMode::EphemeralSequential);
    let create = client.create(&node_path, &bytes, &options);
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

/// Queues in the multi that releases a lock of the same session (`LockGuard::release_with`),
/// with the queue read pipelined behind it. When nothing was applied, queues with a plain
/// create (the release went on its own); when the answer was lost, returns the error with the
/// create still counted in flight, so that the caller looks for the node by attempt id.
pub(super) async fn queue_after(
    client: &Client,
    paths: &Paths,
    prefix: &str,
    data: &NodeData,
    pending: &mut Pending,
    after: After<'_>,
) -> Result<Step, ZkError> {
    pending.attempt = data.attempt.clone();
    pending.in_flight = true;
    let ops: NextOps = {
        let (paths, prefix, bytes) = (paths.clone(), prefix.to_string(), encode(data));
        Box::new(move |multi| add_queue_node(multi, &paths, &prefix, &bytes))
    };
    let sent = after.send(ops);
    // Pipelined when the multi went out already: the read then sees it. (A release that waited
    // sends it from its task: the queue is read once the node exists.)
    let children = sent.now.then(|| client.get_children(&paths.monitor));
    let (committed, waiting) = sent.answer().await;
    if let Some(waiting) = waiting {
        waiting.release_alone();
    }
    match committed {
        Some(Ok(results)) => {
            let Some(MultiWriteResult::Create { path, .. }) = results.first() else {
                // Still in flight: the reaper searches by attempt id.
                return Err(ZkError::UnexpectedError(
                    "the release multi answered without the queue node's create".into(),
                ));
            };
            pending.in_flight = false;
            pending.node = Some(child_name(path));
            let queue = match children {
                Some(children) => children
                    .await
                    .map(|(c, _)| Queue::from_children(&c))
                    .unwrap_or_default(),
                // An empty queue means "not read yet".
                None => Queue::default(),
            };
            Ok(Step::Wait(queue))
        }
        // Nothing was created. `NoNode`: the monitor node is gone, and the caller creates it
        // and queues again.
        Some(Err(MultiWriteError::OperationFailed { source, .. })) => {
            pending.in_flight = false;
            Err(source)
        }
        Some(Err(MultiWriteError::RequestFailed { source })) => Err(source),
        None => {
            pending.in_flight = false;
            plain_create(client, paths, prefix, data, pending).await
        }
    }
}

/// Re-queues a starving background waiter in the foreground class: new node first, then the old
/// one goes, so it never leaves the queue.
pub(super) async fn promote(
    client: &Client,
    paths: &Paths,
    fg_prefix: &str,
    data: &mut NodeData,
    pending: &mut Pending,
) -> Result<Step, LockError> {
    let old = pending.node.clone();
    let old_attempt = std::mem::replace(&mut data.attempt, attempt_id());
    data.promoted = true;
    let step = plain_create(client, paths, fg_prefix, data, pending)
        .await
        .map_err(|e| {
            pending.node = old.clone();
            map_zk(e, "re-queueing a starving background waiter")
        })?;
    info!(old = ?old, new = ?pending.node, "background waiter re-queued as foreground after zookeeper.background.max.wait");
    if let Some(old) = old {
        let _ = delete_nodes(client, Some(&paths.child(&old)), None, &old_attempt).await;
    }
    Ok(step)
}

pub(super) async fn read_queue(
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
pub(super) async fn ensure_monitor(
    client: &Client,
    root: &str,
    paths: &Paths,
) -> Result<(), LockError> {
    let monitor = &paths.monitor;
    let container = paths.create(CreateMode::Container);
    let persistent = paths.create(CreateMode::Persistent);
    match client.create(monitor, &[], &container).await {
        Ok(_) | Err(ZkError::NodeExists) => return Ok(()),
        Err(ZkError::NoNode) => {}
        Err(e) => return Err(map_zk(e, "creating the monitor node")),
    }
    let mut path = String::new();
    for seg in root.trim_start_matches('/').split('/') {
        path.push('/');
        path.push_str(seg);
        match client.create(&path, &[], &persistent).await {
            Ok(_) | Err(ZkError::NodeExists) => {}
            Err(e) => return Err(map_zk(e, "creating the lock root")),
        }
    }
    match client.create(monitor, &[], &container).await {
        Ok(_) | Err(ZkError::NodeExists) => Ok(()),
        Err(e) => Err(map_zk(e, "creating the monitor node")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A create whose answer cannot be read, for whatever reason, may have been applied: the
    /// attempt stays in flight, so that a caller that gives up has the reaper search for what
    /// it made (an applied `privateLock` would otherwise stay for the session's lifetime).
    #[test]
    fn a_create_whose_answer_cannot_be_read_stays_in_doubt() {
        let in_doubt = |source| lost_answer::<()>(&Err(MultiWriteError::RequestFailed { source }));
        assert!(in_doubt(ZkError::ConnectionLoss));
        assert!(in_doubt(ZkError::Timeout));
        assert!(in_doubt(ZkError::UnexpectedError(
            "a release multi answered without the next acquisition's results".into()
        )));
        // Refused: nothing was applied.
        assert!(!lost_answer::<()>(&Err(MultiWriteError::OperationFailed {
            index: 0,
            source: ZkError::NotEmpty
        })));
        assert!(!lost_answer(&Ok(())));
    }
}
