//! Recovery after a connection loss during a create: finding the queue node (and mutex) this
//! attempt may have made, by session and attempt id, instead of creating a second one.

use tracing::info;
use zookeeper_client::{Client, Error as ZkError};

use super::contender::Pending;
use super::mutex::{mutex_is_ours, yield_mutex};
use super::names::Queue;
use super::node::{NodeData, Paths};
use super::{map_zk, sync_then};
use crate::lock::LockError;

/// After a connection loss during a create: find our queue node (and mutex) by session and
/// attempt id instead of creating a second one, once the server has caught up
/// ([`sync_then`]).
pub(super) async fn recover_own(
    client: &Client,
    paths: &Paths,
    data: &NodeData,
    pending: &mut Pending,
) -> Result<(), LockError> {
    let children = match sync_then(client, &paths.monitor, || {
        client.get_children(&paths.monitor)
    })
    .await
    {
        Ok((c, _)) => c,
        Err(ZkError::NoNode) => return Ok(()),
        Err(e) => return Err(map_zk(e, "looking for our queue node")),
    };
    let me = client.session_id().0;
    for name in Queue::from_children(&children)
        .nodes
        .iter()
        .map(|n| &n.name)
    {
        match client.get_data(&paths.child(name)).await {
            Ok((bytes, stat)) if stat.ephemeral_owner == me => {
                if serde_json::from_slice::<NodeData>(&bytes)
                    .map(|d| d.attempt == data.attempt)
                    .unwrap_or(false)
                {
                    info!(node = %name, "found our queue node after a connection loss");
                    pending.node = Some(name.clone());
                }
            }
            Ok(_) | Err(ZkError::NoNode) => {}
            Err(e) => return Err(map_zk(e, "looking for our queue node")),
        }
    }
    if mutex_is_ours(client, &paths.mutex, &data.attempt).await? {
        pending.holds_mutex = true;
        if pending.node.is_some() {
            // Re-verify the order on the next step; give the mutex back to keep it simple.
            yield_mutex(client, paths, pending)
                .await
                .map_err(|e| map_zk(e, "giving the mutex back"))?;
        } else {
            yield_mutex(client, paths, pending)
                .await
                .map_err(|e| map_zk(e, "removing a stray mutex"))?;
        }
    }
    Ok(())
}
