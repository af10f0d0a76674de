//! The mutex (`privateLock`): taking it when first in order, giving it back.

use std::time::{Duration, Instant};

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use tracing::debug;

use futures::FutureExt;
use zookeeper_client::{
    Client, CreateMode, Error as ZkError, MultiWriteError, MultiWriteResult, Stat,
};

use super::contender::{wait_connected, Pending, Step};
use super::names::Queue;
use super::node::{encode_mutex, NodeData, Paths};
use super::release::delete_nodes;
use super::{map_zk, sync_then};
use crate::lock::LockError;

/// Tries to create the mutex node, in a multi that also sets the monitor's data (where the
/// session may write monitor nodes): the monitor's data version then names the take, and the
/// release checks it (`release::add_release`); the multi's zxid, the monitor's `mzxid`, is the
/// token (the mutex's `czxid`). With `verify`, the queue is read in the same round trip and the
/// mutex given back if someone else is first; without, the caller knows it is first, and stays
/// first (`docs/zookeeper-lock.md`, "Handoff"): if the mutex is still held, it waits for the
/// mutex without reading the queue ([`Step::FirstInLine`]).
/// A take of the mutex under way: its token and the monitor's data version it left, or the
/// error of the create (`None`: refused because the session may not write monitor nodes).
type Take<'a> =
    Pin<Box<dyn Future<Output = Result<(i64, Option<i32>), Option<ZkError>>> + Send + 'a>>;

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
    let versioned = pending.slot.versioned_takes.load(Ordering::Relaxed);
    // Sent before the queue is read (requests go out when made, and are answered in order).
    let create: Take<'_> = if versioned {
        let mut multi = client.new_multi_writer();
        multi
            .add_create(&paths.mutex, &bytes, &options)
            .and_then(|()| multi.add_set_data(&paths.monitor, &[], None))
            .map_err(|e| map_zk(e, "taking the mutex"))?;
        Box::pin(multi.commit().map(|committed| {
            match committed {
            Ok(results) => match results.as_slice() {
                [_, MultiWriteResult::SetData { stat }] => Ok((stat.mzxid, Some(stat.version))),
                // Applied, but what it made is not known: in doubt, as after a lost answer.
                _ => Err(Some(ZkError::UnexpectedError(
                    "a take of the mutex answered with other results than a create and a setData"
                        .into(),
                ))),
            },
            Err(MultiWriteError::OperationFailed {
                index: 1,
                source: ZkError::NoAuth,
            }) => Err(None),
            Err(e) => Err(Some(e.into())),
        }
        }))
    } else {
        Box::pin(
            client
                .create(&paths.mutex, &bytes, &options)
                .map(|r| r.map(|(stat, _)| (stat.czxid, None)).map_err(Some)),
        )
    };
    pending.in_flight = true;
    let (created, children) = if verify {
        let children = client.get_children(&paths.monitor);
        let (a, b) = tokio::join!(create, children);
        (a, Some(b))
    } else {
        (create.await, None)
    };
    let created = match created {
        Ok(taken) => Ok(taken),
        Err(Some(e)) => Err(e),
        Err(None) => {
            // Refused, nothing applied: the session may not write monitor nodes.
            debug!("zookeeper.acl does not let this session write monitor nodes: its releases go without the check of the monitor's version");
            pending.in_flight = false;
            pending.slot.versioned_takes.store(false, Ordering::Relaxed);
            return Box::pin(take_mutex(client, paths, data, node, pending, verify)).await;
        }
    };
    pending.in_flight = matches!(
        created,
        Err(ZkError::ConnectionLoss
            | ZkError::Timeout
            | ZkError::Custom(_)
            | ZkError::UnexpectedError(_))
    );
    match created {
        Ok((token, version)) => {
            pending.holds_mutex = true;
            let token = token as u64;
            match children {
                None => Ok(Step::Acquired { token, version }),
                Some(Ok((children, _))) => {
                    let queue = Queue::from_children(&children);
                    if queue.position(node) == Some(0) {
                        Ok(Step::Acquired { token, version })
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
            let ours = mutex_read_is_ours(client, &read, &data.attempt)?;
            pending.in_flight = false;
            if let (true, Ok((_, stat))) = (ours, &read) {
                pending.holds_mutex = true;
                // Verify order as usual; the monitor's data version is still the one our take
                // left, since nobody else took the mutex since.
                let (queue, monitor) = tokio::join!(
                    client.get_children(&paths.monitor),
                    client.get_data(&paths.monitor)
                );
                let (children, _) = queue.map_err(|e| map_zk(e, "reading the queue"))?;
                let (_, monitor) = monitor.map_err(|e| map_zk(e, "reading the monitor"))?;
                if Queue::from_children(&children).position(node) == Some(0) {
                    return Ok(Step::Acquired {
                        token: stat.czxid as u64,
                        version: versioned.then_some(monitor.version),
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
    mutex_read_is_ours(client, &client.get_data(mutex).await, attempt)
}

/// Whether `read`, a read of the mutex, shows it as this session's, of attempt `attempt`.
fn mutex_read_is_ours(
    client: &Client,
    read: &Result<(Vec<u8>, Stat), ZkError>,
    attempt: &str,
) -> Result<bool, LockError> {
    match read {
        Ok((bytes, stat)) => Ok(stat.ephemeral_owner == client.session_id().0
            && serde_json::from_slice::<NodeData>(bytes)
                .map(|d| d.attempt == attempt)
                .unwrap_or(false)),
        Err(ZkError::NoNode) => Ok(false),
        Err(e) => Err(map_zk(e.clone(), "reading the mutex")),
    }
}
