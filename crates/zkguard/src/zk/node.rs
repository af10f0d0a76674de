//! What a contender writes into its nodes, and the paths of a monitor's nodes.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use zookeeper_client::{Acl, Acls, CreateMode, CreateOptions};

use super::names::MUTEX_NODE;
use crate::lock::LockType;

/// The JSON data of a queue node and of the mutex node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeData {
    /// The lock info ("Save Content").
    pub info: String,
    /// Owner id of the process (`host:pid:random`).
    pub owner: String,
    /// Id of this acquisition attempt: finds the node again after a connection loss.
    pub attempt: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Lock type.
    #[serde(rename = "type")]
    pub lock_type: LockType,
    /// Milliseconds since the Unix epoch when the attempt started.
    pub created_ms: u64,
    /// The queue node of the holder (mutex node only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Set when a background waiter was re-queued as foreground (anti-starvation).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub promoted: bool,
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[derive(Clone)]
pub(super) struct Paths {
    pub(super) monitor: String,
    pub(super) mutex: String,
    /// The ACL (`zookeeper.acl`) of every node created: lock root, monitor, queue nodes, mutex.
    acl: Vec<Acl>,
}

impl Paths {
    /// The paths of the monitor node `monitor` (a full path), for removals (which create
    /// nothing, so need no ACL).
    pub(super) fn of_monitor(monitor: &str) -> Self {
        Self {
            monitor: monitor.to_string(),
            mutex: format!("{monitor}/{MUTEX_NODE}"),
            acl: Vec::new(),
        }
    }

    pub(super) fn new(root: &str, monitor: &str, acl: Vec<Acl>) -> Self {
        let monitor = format!("{root}/{monitor}");
        let mutex = format!("{monitor}/{MUTEX_NODE}");
        Self {
            monitor,
            mutex,
            acl,
        }
    }
    /// The ACL of every node created.
    pub(super) fn acl(&self) -> &[Acl] {
        &self.acl
    }
    /// Options that create a node of `mode` with the configured ACL.
    pub(super) fn create(&self, mode: CreateMode) -> CreateOptions<'_> {
        mode.with_acls(Acls::new(&self.acl))
    }
    pub(super) fn child(&self, name: &str) -> String {
        format!("{}/{name}", self.monitor)
    }
}

pub(super) fn encode(data: &NodeData) -> Vec<u8> {
    serde_json::to_vec(data).expect("node data serializes")
}

/// The data of the mutex node: `data` naming the holder's queue node `node`, encoded as
/// `encode` would encode `data` with `node` set, without copying `data`.
pub(super) fn encode_mutex(data: &NodeData, node: &str) -> Vec<u8> {
    #[derive(Serialize)]
    struct MutexData<'a> {
        info: &'a str,
        owner: &'a str,
        attempt: &'a str,
        host: &'a str,
        pid: u32,
        #[serde(rename = "type")]
        lock_type: LockType,
        created_ms: u64,
        node: &'a str,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        promoted: bool,
    }
    serde_json::to_vec(&MutexData {
        info: &data.info,
        owner: &data.owner,
        attempt: &data.attempt,
        host: &data.host,
        pid: data.pid,
        lock_type: data.lock_type,
        created_ms: data.created_ms,
        node,
        promoted: data.promoted,
    })
    .expect("node data serializes")
}

/// A new acquisition attempt id: 32 hex digits from the thread's random generator (no system
/// call per attempt).
pub(super) fn attempt_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

pub(super) fn child_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutex_data_is_the_node_data_naming_the_holders_node() {
        for promoted in [false, true] {
            let mut data = NodeData {
                info: "Save \"Content\"".into(),
                owner: "h:1:abcd".into(),
                attempt: attempt_id(),
                host: "h".into(),
                pid: 1,
                lock_type: LockType::Background,
                created_ms: 42,
                node: None,
                promoted,
            };
            let bytes = encode_mutex(&data, "B-0000000007");
            data.node = Some("B-0000000007".into());
            assert_eq!(bytes, encode(&data));
            let back: NodeData = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(back, data);
        }
        let id = attempt_id();
        assert_eq!(id.len(), 32);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(id, attempt_id());
    }
}
