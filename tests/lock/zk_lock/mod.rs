//! The ZooKeeper priority lock against a real ZooKeeper: the design's scenarios, timeouts,
//! cancellation, fencing tokens, request counts, loss detection and ghost nodes.

use crate::common;

// The tests by topic; the helpers several of them use stay here.
mod bulk_release;
mod handover;
mod loss;
mod request_size;
mod requests;
mod scenarios;
mod try_and_stray;
mod waiting;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::logs::init_tracing;
use crate::queue::queued;
use common::*;
use zkguard::testkit::proxy::{ZkProxy, OP_CREATE2, OP_MULTI};
use zkguard::testkit::ZkServer;
use zkguard::zk::{clear_stray, list_locks, StrayOutcome};
use zkguard::{Blocker, LockError, LockType, LossReason, ZkBlockingWriteLock};
use zookeeper_client::{Acls, CreateMode, EventType};

/// One server shared by the tests that do not stop or pause it (each uses its own lock root).
fn shared() -> &'static ZkServer {
    static SERVER: OnceLock<ZkServer> = OnceLock::new();
    SERVER.get_or_init(zk_server)
}

/// Creates `path` and its missing parents as persistent nodes, through a raw client.
async fn create_path(admin: &zookeeper_client::Client, path: &str) {
    let mut p = String::new();
    for seg in path.trim_start_matches('/').split('/') {
        p.push('/');
        p.push_str(seg);
        match admin
            .create(
                &p,
                &[],
                &CreateMode::Persistent.with_acls(Acls::anyone_all()),
            )
            .await
        {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
            Err(e) => panic!("create {p}: {e}"),
        }
    }
}

/// Whether the server holds a watch on `path` (four-letter word `wchp`).
fn watched(zk: &ZkServer, path: &str) -> bool {
    zk.four_letter("wchp")
        .unwrap()
        .lines()
        .any(|l| l.trim() == path)
}

/// Takes `a`'s lock after waiting behind `b`, three times: from then on the monitor counts as
/// busy for `a`'s session (its acquisitions queue at once). Each time, `b` lets go only once `a`
/// watches `b`'s queue node, so `a`'s reading of the queue saw `b` (an acquisition that met
/// nobody would lower the score). Returns `a`'s guard.
async fn held_after_contention(
    a: &ZkBlockingWriteLock,
    b: &ZkBlockingWriteLock,
    zk: &ZkServer,
    monitor: &str,
) -> zkguard::LockGuard {
    let servers = zk.connect_string();
    let mut held: Option<zkguard::LockGuard> = None;
    for _ in 0..3 {
        if let Some(g) = held.take() {
            g.unlock().await.unwrap();
        }
        let gb = b.lock_with_timeout().await.unwrap();
        let mut nodes = children(&servers, monitor).await;
        nodes.retain(|n| n.starts_with("A-"));
        let [b_node] = <[String; 1]>::try_from(nodes).expect("b's node alone");
        let b_node = format!("{monitor}/{b_node}");
        let wa = tokio::spawn({
            let a = a.clone();
            async move { a.lock_with_timeout().await }
        });
        eventually(
            Duration::from_secs(10),
            "a waits behind b, watching b's node",
            || async { watched(zk, &b_node) },
        )
        .await;
        gb.unlock().await.unwrap();
        held = Some(wa.await.unwrap().unwrap());
    }
    held.unwrap()
}

/// Queue-node data as another zkguard process would write it.
fn foreign_node_data(lock_type: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "info": "elsewhere", "owner": "other-host:1:0000abcd", "attempt": "a1", "host": "other-host",
        "pid": 1, "type": lock_type, "created_ms": 0
    }))
    .unwrap()
}

/// Runs `lock` in a task that records `label` in `order` while it holds the lock.
pub fn take_turn(
    lock: zkguard::ZkBlockingWriteLock,
    order: &std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>,
    label: &'static str,
) -> tokio::task::JoinHandle<()> {
    let order = order.clone();
    tokio::spawn(async move {
        let g = lock.lock_with_timeout().await.unwrap();
        order.lock().unwrap().push(label);
        g.unlock().await.unwrap();
    })
}
