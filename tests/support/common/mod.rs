//! Shared helpers of the ZooKeeper-lock integration tests.

use std::time::{Duration, Instant};

use zkguard::config::{Settings, ZkSettings};
use zkguard::testkit::ZkServer;
use zkguard::ZkSession;

mod wait;
pub use wait::eventually;

/// A standalone ZooKeeper (tickTime 500 ms, so 1 s sessions are allowed).
pub fn zk_server() -> ZkServer {
    ZkServer::builder()
        .tick_time(500)
        .start()
        .expect("start ZooKeeper (run scripts/install-deps.sh)")
}

/// Settings for `servers`, with a lock root of its own so tests sharing a server do not meet.
pub fn zk_settings(servers: &str, root_tag: &str) -> ZkSettings {
    let mut s = Settings::default().zookeeper;
    s.servers = servers.to_string();
    s.session_timeout = Duration::from_millis(4000);
    s.connection_retry = 3;
    s.connection_delay = Duration::from_millis(200);
    s.foreground_timeout = Duration::from_secs(10);
    s.background_timeout = Duration::from_secs(10);
    s.lock_root = format!("/zkguard-test/{root_tag}-{}", uuid_tag());
    s
}

pub fn uuid_tag() -> String {
    format!("{:08x}", rand_u32())
}

fn rand_u32() -> u32 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos() as u64);
    h.finish() as u32
}

pub async fn session(settings: &ZkSettings) -> ZkSession {
    ZkSession::connect(settings)
        .await
        .expect("connect to ZooKeeper")
}

/// Children of a znode (sorted), through a raw client.
pub async fn children(servers: &str, path: &str) -> Vec<String> {
    let client = zookeeper_client::Client::connect(servers)
        .await
        .expect("connect");
    match client.list_children(path).await {
        Ok(mut c) => {
            c.sort();
            c
        }
        Err(zookeeper_client::Error::NoNode) => Vec::new(),
        Err(e) => panic!("list {path}: {e}"),
    }
}
