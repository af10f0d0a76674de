//! Reacting to the connection state of a ZooKeeper session (Curator's
//! `ConnectionStateListener`, kazoo's `add_listener`): pause on `Suspended`, re-acquire on
//! `Lost`. The session is built from a `zookeeper_client::Connector` the application configured.
//!
//! Run with `cargo run --example connection_state`: it starts a local ZooKeeper (Debian's
//! `zookeeper` package) behind a proxy, cuts the network for a moment, then for longer than the
//! session timeout, and prints each state it sees.

use std::time::Duration;

use zkguard::config::Settings;
use zkguard::testkit::{Partition, ZkServer};
use zkguard::zk::ConnectionState;
use zkguard::ZkSession;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = ZkServer::builder().tick_time(500).start()?;
    let partition = Partition::start(&server.connect_string())?;
    let mut settings = Settings::default().zookeeper;
    settings.servers = partition.connect_string().to_string();
    settings.lock_root = "/zkguard-example/locks".into();

    // Authentication, TLS or SASL would be set here too.
    let connector =
        zookeeper_client::Client::connector().with_session_timeout(Duration::from_secs(2));
    let session = ZkSession::from_connector(connector, &settings).await?;

    let mut states = session.connection_state();
    println!("state: {}", *states.borrow_and_update());
    let watcher = tokio::spawn(async move {
        let mut seen = Vec::new();
        while states.changed().await.is_ok() {
            let state = *states.borrow_and_update();
            match state {
                ConnectionState::Suspended => println!("state: suspended: pause fenced writes"),
                ConnectionState::Lost => println!("state: lost: every lock is gone; re-acquire"),
                ConnectionState::Connected => println!("state: connected"),
                other => println!("state: {other}"),
            }
            seen.push(state);
            if state == ConnectionState::Closed {
                break;
            }
        }
        seen
    });

    let wait = |want: ConnectionState| {
        let mut rx = session.connection_state();
        async move {
            let _ = rx.wait_for(|s| *s == want).await;
        }
    };

    println!("cutting the network for a moment");
    partition.cut();
    wait(ConnectionState::Suspended).await;
    partition.heal();
    wait(ConnectionState::Connected).await;

    println!("cutting the network for longer than the session timeout");
    partition.cut();
    wait(ConnectionState::Suspended).await;
    tokio::time::sleep(Duration::from_secs(4)).await; // the server expires the session
    partition.heal();
    wait(ConnectionState::Lost).await;
    session.ensure_session().await?; // a new session
    wait(ConnectionState::Connected).await;

    session.close();
    let seen = watcher.await?;
    println!("states seen: {seen:?}");
    Ok(())
}
