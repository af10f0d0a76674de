//! The design's scenario 3: a foreground request that arrives while a background job holds the
//! lock goes before every queued background request.
//!
//! Run against your ZooKeeper with `ZKGUARD_ZOOKEEPER_SERVERS=host:2181 cargo run --example
//! priority_lock`, or without the variable to start a local one (Debian's `zookeeper` package).

use std::time::Duration;

use zkguard::config::Settings;
use zkguard::testkit::ZkServer;
use zkguard::{LockType, ZkBlockingWriteLock, ZkSession};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut settings = Settings::load(None)?;
    let _local = if std::env::var_os("ZKGUARD_ZOOKEEPER_SERVERS").is_none() {
        let server = ZkServer::start()?;
        settings.zookeeper.servers = server.connect_string();
        Some(server)
    } else {
        None
    };
    settings.zookeeper.lock_root = "/zkguard-example/locks".into();
    let z = &settings.zookeeper;
    let (client1, client2, client3) = (
        ZkSession::connect(z).await?,
        ZkSession::connect(z).await?,
        ZkSession::connect(z).await?,
    );

    let held = ZkBlockingWriteLock::new("KPI update", &client1, "P1")?
        .with_type(LockType::Background)
        .lock_with_timeout()
        .await?;
    println!(
        "client1 (background) holds P1, token {}",
        held.fencing_token()
    );

    let bulk = ZkBlockingWriteLock::new("Bulk Propagation", &client2, "P1")?
        .with_type(LockType::Background)
        .with_timeout(Duration::from_secs(10));
    let background = tokio::spawn(async move {
        let g = bulk.lock_with_timeout().await?;
        println!("client2 (background) got P1, token {}", g.fencing_token());
        g.unlock().await
    });
    tokio::time::sleep(Duration::from_millis(200)).await; // let client2 queue first
    let save = ZkBlockingWriteLock::new("Save Content", &client3, "P1")?
        .with_timeout(Duration::from_secs(10));
    let foreground = tokio::spawn(async move {
        let g = save.lock_with_timeout().await?;
        println!("client3 (foreground) got P1, token {}", g.fencing_token());
        g.unlock().await
    });
    tokio::time::sleep(Duration::from_millis(200)).await; // let client3 queue too
    for state in zkguard::zk::list_locks(&client1, Some("P1")).await? {
        let queue: Vec<_> = state.queue.iter().map(|c| c.node.as_str()).collect();
        println!("queue of P1 in lock order: {queue:?}");
    }
    held.unlock().await?;
    foreground.await??;
    background.await??;
    Ok(())
}
