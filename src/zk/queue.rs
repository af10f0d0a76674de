//! The queue: the monitor node, queue nodes (created alone or with the mutex in one multi),
//! re-queueing a starved background waiter as foreground, and reading the queue in order.

use std::time::Instant;

use tokio::sync::watch;
use tracing::info;
use zookeeper_client::{Client, CreateMode, Error as ZkError, MultiWriteError, MultiWriteResult};

use super::contender::{wait_connected, Pending, Step};
use super::map_zk;
use super::mutex::yield_mutex;
use super::names::Queue;
use super::node::{attempt_id, child_name, encode, NodeData, Paths};
use super::release::delete_nodes;
use super::session::Slot;
use crate::lock::LockError;

/// One multi creating our queue node and the mutex node, with the queue read pipelined. When
/// the mutex is held, queues with a plain create if `queue_if_held`, else returns
/// [`Step::Busy`] (nothing was created: the multi is atomic).
pub(super) async fn fast_path(
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
    multi.add_create(
        &node_path,
        &node_bytes,
        &paths.create(CreateMode::EphemeralSequential),
    )?;
    // The mutex names its holder's node, which is not known yet: the owner and attempt suffice.
    multi.add_create(
        &paths.mutex,
        &node_bytes,
        &paths.create(CreateMode::Ephemeral),
    )?;
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
    data.promoted = true;
    data.attempt = attempt_id();
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
