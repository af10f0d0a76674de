//! Read-only inspection of the lock tree, for `zkguard locks`.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use zookeeper_client::Error as ZkError;

use super::names::{Queue, MUTEX_NODE};
use super::recipe::NodeData;
use super::{map_zk, ZkSession};
use crate::lock::LockError;

/// One contender of a monitor, as seen in ZooKeeper.
#[derive(Debug, Clone, Serialize)]
pub struct Contender {
    /// Queue-node name, e.g. `A-0000000012`.
    pub node: String,
    /// Class prefix.
    pub class: String,
    /// Sequence number.
    pub sequence: u64,
    /// Owner id (`host:pid:random`), when the node carries zkguard data.
    pub owner: Option<String>,
    /// Lock info.
    pub info: Option<String>,
    /// Lock type.
    pub lock_type: Option<String>,
    /// Milliseconds since the node was created.
    pub age_ms: u64,
    /// ZooKeeper session that owns the node.
    pub session: String,
    /// Whether this contender holds the mutex.
    pub holder: bool,
}

/// Holder and queue of one monitor.
#[derive(Debug, Clone, Serialize)]
pub struct MonitorState {
    /// Monitor object.
    pub monitor: String,
    /// The holder, if the mutex is held.
    pub holder: Option<Contender>,
    /// Fencing token of the current holder (czxid of the mutex node).
    pub token: Option<u64>,
    /// Everyone queued, in lock order (the holder included).
    pub queue: Vec<Contender>,
}

fn age(ctime_ms: i64) -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    (now - ctime_ms).max(0) as u64
}

/// Lists the holder and queue of `monitor`, or of every monitor under the lock root.
///
/// # Errors
/// Connection and session errors.
///
/// # Cancellation safety
/// Cancel-safe: it only reads.
pub async fn list_locks(
    session: &ZkSession,
    monitor: Option<&str>,
) -> Result<Vec<MonitorState>, LockError> {
    let slot = session.slot().await?;
    let client = &slot.client;
    let root = &session.settings().lock_root;
    let monitors = match monitor {
        Some(m) => {
            crate::lock::validate_monitor(m)?;
            vec![m.to_string()]
        }
        None => match client.list_children(root).await {
            Ok(mut m) => {
                m.sort();
                m
            }
            Err(ZkError::NoNode) => Vec::new(),
            Err(e) => return Err(map_zk(e, "listing monitors")),
        },
    };
    let mut out = Vec::new();
    for m in monitors {
        let path = format!("{root}/{m}");
        let children = match client.list_children(&path).await {
            Ok(c) => c,
            Err(ZkError::NoNode) => continue,
            Err(e) => return Err(map_zk(e, "listing contenders")),
        };
        let queue = Queue::from_children(&children);
        let (mutex, token) = match client.get_data(&format!("{path}/{MUTEX_NODE}")).await {
            Ok((bytes, stat)) => (
                serde_json::from_slice::<NodeData>(&bytes).ok(),
                Some(stat.czxid as u64),
            ),
            Err(ZkError::NoNode) => (None, None),
            Err(e) => return Err(map_zk(e, "reading the mutex")),
        };
        let mut contenders = Vec::new();
        for n in &queue.nodes {
            let (bytes, stat) = match client.get_data(&format!("{path}/{}", n.name)).await {
                Ok(x) => x,
                Err(ZkError::NoNode) => continue,
                Err(e) => return Err(map_zk(e, "reading a contender")),
            };
            let data = serde_json::from_slice::<NodeData>(&bytes).ok();
            let holder = mutex
                .as_ref()
                .zip(data.as_ref())
                .is_some_and(|(m, d)| m.attempt == d.attempt);
            contenders.push(Contender {
                node: n.name.clone(),
                class: n.prefix.clone(),
                sequence: n.sequence,
                owner: data.as_ref().map(|d| d.owner.clone()),
                info: data.as_ref().map(|d| d.info.clone()),
                lock_type: data.as_ref().map(|d| d.lock_type.to_string()),
                age_ms: age(stat.ctime),
                session: format!("{:#x}", stat.ephemeral_owner),
                holder,
            });
        }
        let holder = contenders.iter().find(|c| c.holder).cloned();
        if contenders.is_empty() && token.is_none() {
            continue;
        }
        out.push(MonitorState {
            monitor: m,
            holder,
            token: token.filter(|_| mutex.is_some()).or(token),
            queue: contenders,
        });
    }
    Ok(out)
}
