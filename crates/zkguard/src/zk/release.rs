//! Removing our own nodes safely: the queue node and the mutex at release, at a timeout and when
//! a waiter gives the mutex back. The decisions are the core's ([`Removal`]); this runs them.

use std::sync::atomic::{AtomicBool, Ordering};

use tracing::debug;
use zookeeper_client::{Client, Error as ZkError, MultiWriter};

use super::driver::{add_op, run_removal, run_removal_via};
use super::node::{child_name, Paths};
use super::protocol::{release_ops, Removal};
use super::release_batch::Releases;

/// The monitor's paths, from the path of one of its children.
fn paths_of(child: &str) -> Paths {
    Paths::of_monitor(child.rsplit_once('/').map_or("", |(monitor, _)| monitor))
}

/// The removal's monitor paths and the queue node's child name.
fn parts(queue_node: Option<&str>, mutex: Option<&str>) -> Option<(Paths, Option<String>)> {
    let paths = paths_of(queue_node.or(mutex)?);
    Some((paths, queue_node.map(child_name)))
}

/// Releases a held lock: one multi deletes both nodes (carefully after a lost answer), and the first try also empties
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
///
/// The multi goes with the session's other releases of the moment (`releases`, see
/// `zk::release_batch`); what follows a failure or a lost answer goes alone.
pub(crate) async fn release_held(
    client: &Client,
    releases: &std::sync::Arc<Releases>,
    queue_node: &str,
    mutex: Option<&str>,
    attempt: &str,
    mark: Option<&AtomicBool>,
    version: Option<i32>,
) -> Result<(), ZkError> {
    let paths = paths_of(queue_node);
    let marked = mark.is_some_and(|m| m.load(Ordering::Relaxed));
    let removal = Removal::release(
        client.session_id().0,
        attempt,
        child_name(queue_node),
        mutex.is_some(),
        marked,
        version,
    );
    let together = |ops| releases.send(&paths, ops);
    let (result, mark_refused) = run_removal_via(client, &paths, removal, Some(together)).await;
    if let (true, Some(mark)) = (mark_refused, mark) {
        debug!("zookeeper.acl does not let this session write its queue nodes: releasing without the hand-over mark");
        mark.store(false, Ordering::Relaxed);
    }
    result
}

/// Adds a held lock's release to a multi ([`release_ops`]): with `version`, check that the
/// monitor's data version is still the one the take of the mutex left; delete the mutex; empty
/// the queue node when `hand_over` (the hand-over mark, see [`release_held`]); delete the queue
/// node. Returns how many operations it added.
pub(crate) fn add_release(
    multi: &mut MultiWriter<'_>,
    queue_node: &str,
    hand_over: bool,
    version: Option<i32>,
) -> Result<usize, ZkError> {
    let paths = paths_of(queue_node);
    let ops = release_ops(&child_name(queue_node), hand_over, version);
    for op in &ops {
        add_op(multi, &paths, op, &[])?;
    }
    Ok(ops.len())
}

/// The careful deletes of a removal, from the start: after a request that deleted the
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
    let Some((paths, node)) = parts(queue_node, mutex) else {
        return if gone_before {
            Err(ZkError::NoNode)
        } else {
            Ok(())
        };
    };
    let removal = Removal::careful(
        client.session_id().0,
        attempt,
        node,
        mutex.is_some(),
        gone_before,
    );
    run_removal(client, &paths, removal).await.0
}
