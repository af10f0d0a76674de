//! Removing our own nodes safely: the queue node and the mutex at release, at a timeout and when a
//! waiter gives the mutex back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tracing::debug;
use zookeeper_client::{Client, Error as ZkError, MultiWriter};

use super::node::NodeData;

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
    remove(client, queue_node, mutex, attempt, false, None).await
}

/// Releases a held lock: as [`delete_nodes`] with both nodes, and the first try also empties
/// the queue node's data in the same multi, just before deleting it. The contender watching
/// that node then gets `NodeDataChanged` instead of `NodeDeleted`: the node ahead of it left
/// as the holder, so every node that was ahead of it is gone (see `docs/zookeeper-lock.md`,
/// "Handoff"), at no extra request.
///
/// Writing the queue node needs the WRITE permission, which `zookeeper.acl` may withhold from
/// the holder: then the release goes without the mark (one more request, once per session, and
/// `mark` is cleared so that later releases of the session skip it). Without `mark` at all (a
/// lock taken alone), the release goes without the mark from the start.
///
/// With `version` (the monitor's data version that the take of the mutex left, see
/// [`add_release`]), the multi applies only if nobody took the mutex since: a holder whose
/// mutex was deleted by someone else, unseen, and taken by the next in line, leaves the new
/// holder's mutex alone and gets `Err(NoNode)`.
pub(crate) async fn release_held(
    client: &Client,
    queue_node: &str,
    mutex: Option<&str>,
    attempt: &str,
    mark: Option<&AtomicBool>,
    version: Option<i32>,
) -> Result<(), ZkError> {
    if let Some(mark) = mark.filter(|m| m.load(Ordering::Relaxed) && mutex.is_some()) {
        match remove(client, Some(queue_node), mutex, attempt, true, version).await {
            Err(ZkError::NoAuth) => {
                debug!("zookeeper.acl does not let this session write its queue nodes: releasing without the hand-over mark");
                mark.store(false, Ordering::Relaxed);
            }
            other => return other,
        }
    }
    remove(client, Some(queue_node), mutex, attempt, false, version).await
}

async fn remove(
    client: &Client,
    queue_node: Option<&str>,
    mutex: Option<&str>,
    attempt: &str,
    hand_over: bool,
    version: Option<i32>,
) -> Result<(), ZkError> {
    let first = match (queue_node, mutex) {
        (Some(q), Some(m)) => {
            let mut multi = client.new_multi_writer();
            add_release(&mut multi, q, m, hand_over, version)?;
            multi.commit().await.map(|_| ()).map_err(ZkError::from)
        }
        (Some(p), None) | (None, Some(p)) => client.delete(p, None).await,
        (None, None) => return Ok(()),
    };
    let gone_before = match first {
        Ok(()) => return Ok(()),
        // A node was gone, or (`BadVersion` of the check) the mutex changed hands: the lock was
        // lost before the release.
        Err(ZkError::NoNode | ZkError::BadVersion) => true,
        Err(ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_)) => false,
        Err(e) => return Err(e),
    };
    delete_carefully(client, queue_node, mutex, attempt, gone_before).await
}

/// Adds a held lock's release to a multi: with `version`, check that the monitor's data
/// version is still the one the take of the mutex left (every take of `privateLock` sets the
/// monitor's data in its own transaction, so the version moves exactly when the mutex changes
/// hands); delete the mutex; empty the queue node when `hand_over` (the hand-over mark, see
/// [`release_held`]); delete the queue node. Returns how many operations it added.
pub(crate) fn add_release(
    multi: &mut MultiWriter<'_>,
    queue_node: &str,
    mutex: &str,
    hand_over: bool,
    version: Option<i32>,
) -> Result<usize, ZkError> {
    let mut added = 2;
    if let Some(version) = version {
        let monitor = mutex.rsplit_once('/').map_or(mutex, |(m, _)| m);
        multi.add_check_version(monitor, version)?;
        added += 1;
    }
    multi.add_delete(mutex, None)?;
    if hand_over {
        multi.add_set_data(queue_node, &[], None)?;
        added += 1;
    }
    multi.add_delete(queue_node, None)?;
    Ok(added)
}

/// The careful deletes of [`delete_nodes`], from the start: after a request that deleted the
/// nodes, or did not, with its answer lost. Each node goes only if it is still this session's
/// and carries `attempt`: by then a node of that path may be another attempt's, the mutex the
/// next holder's, the queue node the same session's next acquisition's (the fast path
/// recreates an empty monitor, so queue node names repeat). Retries on connection loss.
/// Returns `Err(NoNode)` when `gone_before` (a node was found gone by the request before).
pub(crate) async fn delete_carefully(
    client: &Client,
    queue_node: Option<&str>,
    mutex: Option<&str>,
    attempt: &str,
    gone_before: bool,
) -> Result<(), ZkError> {
    let mut backoff = crate::Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
    loop {
        let mut result = Ok(());
        if let Some(m) = mutex {
            result = delete_if_ours(client, m, attempt).await;
        }
        if let (Ok(()), Some(q)) = (&result, queue_node) {
            result = delete_if_ours(client, q, attempt).await;
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

/// Deletes `path` if it is an ephemeral node of this session that carries attempt id `attempt`;
/// leaves anyone else's node alone, and this session's nodes of other attempts.
pub(super) async fn delete_if_ours(
    client: &Client,
    path: &str,
    attempt: &str,
) -> Result<(), ZkError> {
    let (bytes, stat) = match client.get_data(path).await {
        Ok(x) => x,
        Err(ZkError::NoNode) => return Ok(()),
        Err(e) => return Err(e),
    };
    let ours = stat.ephemeral_owner == client.session_id().0
        && serde_json::from_slice::<NodeData>(&bytes).is_ok_and(|d| d.attempt == attempt);
    if !ours {
        debug!(path, "not deleting a node that is no longer ours");
        return Ok(());
    }
    match client.delete(path, Some(stat.version)).await {
        Err(ZkError::NoNode | ZkError::BadVersion) => Ok(()),
        other => other,
    }
}
