//! The session's reaper: one task per ZooKeeper session that removes the nodes of acquisitions
//! that went away (a waiter dropped or timed out mid-request, a held guard dropped), including
//! nodes whose create was still in flight, found again by session and attempt id.
//!
//! The reaper never deletes blindly: by the time it runs, a path it was handed may name another
//! node. A contender cancelled while giving the mutex back still counts the mutex as its own,
//! though the server may have applied the give-back and the rightful successor created
//! `privateLock` again; a queue node's name repeats once the fast path recreated an empty
//! monitor. So each node goes only if it is this session's and carries the attempt id
//! ([`delete_carefully`]): a read and a conditional delete per node, on a path that only
//! abandoned acquisitions and dropped guards take.

use std::time::Duration;

use tokio::sync::mpsc;
use tracing::debug;
use zookeeper_client::{Client, Error as ZkError};

use super::node::NodeData;
use super::release::delete_carefully;
use super::sync_then;

/// Cleanup work handed to the session's reaper task: delete these nodes if they still carry
/// `attempt`, retrying on connection loss until done or until the session ends (which deletes
/// them anyway).
#[derive(Debug)]
pub(crate) struct Reap {
    pub queue_node: Option<String>,
    pub mutex: Option<String>,
    /// A create was in flight when the waiter went away: find what it made under this monitor
    /// path by session and attempt id, and delete it.
    pub search: Option<(String, String)>,
    /// The attempt id carried by the nodes to delete, checked before deleting each.
    pub attempt: String,
}

/// Starts the reaper task of the session behind `client`; it ends when the sender is dropped.
pub(super) fn spawn(client: Client) -> mpsc::UnboundedSender<Reap> {
    let (reaper, mut reap_rx) = mpsc::unbounded_channel::<Reap>();
    tokio::spawn(async move {
        while let Some(job) = reap_rx.recv().await {
            let _ = delete_carefully(
                &client,
                job.queue_node.as_deref(),
                job.mutex.as_deref(),
                &job.attempt,
                false,
            )
            .await;
            if let Some((monitor, attempt)) = job.search {
                delete_by_attempt(&client, &monitor, &attempt).await;
            }
        }
    });
    reaper
}

/// Deletes the queue node and the mutex that attempt `attempt` of this session made under
/// `monitor`, if any (cleanup after a waiter went away with a create in flight).
async fn delete_by_attempt(client: &Client, monitor: &str, attempt: &str) {
    let me = client.session_id().0;
    let mut backoff = crate::Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
    // Retried on connection loss until it completes or the session ends (which removes them).
    'scan: loop {
        // The create whose answer was lost may not be applied yet on the server this session
        // reads from (a lagging follower): let it catch up with the leader first.
        let children = match sync_then(client, monitor, || client.get_children(monitor)).await {
            Ok((c, _)) => c,
            Err(ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_)) => {
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
            Err(_) => return,
        };
        for name in children {
            let path = format!("{monitor}/{name}");
            match client.get_data(&path).await {
                Ok((bytes, stat)) => {
                    if stat.ephemeral_owner == me
                        && serde_json::from_slice::<NodeData>(&bytes)
                            .is_ok_and(|d| d.attempt == attempt)
                    {
                        debug!(node = %path, "removing a node of an abandoned acquisition");
                        if let Err(
                            ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_),
                        ) = client.delete(&path, Some(stat.version)).await
                        {
                            tokio::time::sleep(backoff.next_delay()).await;
                            continue 'scan;
                        }
                    }
                }
                Err(ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_)) => {
                    tokio::time::sleep(backoff.next_delay()).await;
                    continue 'scan;
                }
                Err(_) => {}
            }
        }
        return;
    }
}
