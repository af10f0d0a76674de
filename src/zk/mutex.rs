//! The mutex (`privateLock`): taking it when first in order, giving it back.

use std::time::{Duration, Instant};

use tracing::debug;
use zookeeper_client::{Client, CreateMode, Error as ZkError, Stat};

use super::contender::{wait_connected, Pending, Step};
use super::names::Queue;
use super::node::{encode_mutex, NodeData, Paths};
use super::release::delete_nodes;
use super::{map_zk, sync_then};
use crate::lock::LockError;

/// Tries to create the mutex node. With `verify`, the queue is read in the same round trip and
/// the mutex given back if someone else is first; without, the caller knows it is first, and
/// stays first (`docs/zookeeper-lock.md`, "Handoff"): if the mutex is still held, it waits for
/// the mutex without reading the queue ([`Step::FirstInLine`]).
pub(super) async fn take_mutex(
    client: &Client,
    paths: &Paths,
    data: &NodeData,
    node: &str,
    pending: &mut Pending,
    verify: bool,
) -> Result<Step, LockError> {
    let bytes = encode_mutex(data, node);
    let options = paths.create(CreateMode::Ephemeral);
    let create = client.create(&paths.mutex, &bytes, &options);
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
        Err(ZkError::NodeExists) => Ok(match children {
            None => Step::FirstInLine,
            Some(Ok((c, _))) => Step::Wait(Queue::from_children(&c)),
            Some(Err(_)) => Step::Wait(Queue::default()),
        }),
        Err(ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_)) => {
            debug!("connection loss while taking the mutex; checking whether it is ours");
            // Did our create happen? Read the mutex and compare the attempt id.
            wait_connected(&pending.slot, Instant::now() + Duration::from_secs(3600)).await?;
            // A lagging follower may not have applied our create yet: read after a sync.
            let read = sync_then(client, &paths.monitor, || client.get_data(&paths.mutex)).await;
            let ours = mutex_read_is_ours(client, read, &data.attempt)?;
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

pub(super) async fn yield_mutex(
    client: &Client,
    paths: &Paths,
    pending: &mut Pending,
) -> Result<(), ZkError> {
    match delete_nodes(client, None, Some(&paths.mutex), &pending.attempt).await {
        Ok(()) | Err(ZkError::NoNode) => {
            pending.holds_mutex = false;
            Ok(())
        }
        Err(e) => Err(e),
    }
}

pub(super) async fn mutex_is_ours(
    client: &Client,
    mutex: &str,
    attempt: &str,
) -> Result<bool, LockError> {
    mutex_read_is_ours(client, client.get_data(mutex).await, attempt)
}

/// Whether `read`, a read of the mutex, shows it as this session's, of attempt `attempt`.
fn mutex_read_is_ours(
    client: &Client,
    read: Result<(Vec<u8>, Stat), ZkError>,
    attempt: &str,
) -> Result<bool, LockError> {
    match read {
        Ok((bytes, stat)) => Ok(stat.ephemeral_owner == client.session_id().0
            && serde_json::from_slice::<NodeData>(&bytes)
                .map(|d| d.attempt == attempt)
                .unwrap_or(false)),
        Err(ZkError::NoNode) => Ok(false),
        Err(e) => Err(map_zk(e, "reading the mutex")),
    }
}
