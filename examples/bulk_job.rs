//! A background bulk job that works through objects one at a time, going from lock to lock with
//! `release_and_lock`: each object's acquisition also releases the previous object's lock, in the
//! same ZooKeeper request, one request per object where the next object's lock is free and its
//! monitor node exists. (Here every object is locked for the first time: its monitor node is
//! created first, and the previous lock is released on its own at once.)
//!
//! Run against your ZooKeeper with `ZKGUARD_ZOOKEEPER_SERVERS=host:2181 cargo run --example
//! bulk_job`, or without the variable to start a local one (Debian's `zookeeper` package).

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
    let session = ZkSession::connect(&settings.zookeeper).await?;
    let lock = |object: &str| -> Result<ZkBlockingWriteLock, zkguard::LockError> {
        Ok(
            ZkBlockingWriteLock::new("Bulk Propagation", &session, object)?
                .with_type(LockType::Background)
                .with_timeout(Duration::from_secs(30)),
        )
    };

    let objects = [
        "article-1",
        "article-2",
        "article-3",
        "article-4",
        "article-5",
    ];
    let mut held = lock(objects[0])?.lock_with_timeout().await?;
    println!("{}: token {}", objects[0], held.fencing_token());
    for object in &objects[1..] {
        // ... write the object held, with held.fencing_token() as its external version ...
        let (released, next) = lock(object)?.release_and_lock(held).await;
        held = next?;
        released.await?;
        println!("{object}: token {}", held.fencing_token());
    }
    held.unlock().await?;
    Ok(())
}
