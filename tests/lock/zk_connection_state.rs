//! `ZkSession::connection_state` against a real ZooKeeper behind a network partition, and
//! `ZkSession::from_connector`.

use crate::common;

use std::time::Duration;

use crate::logs::init_tracing;
use crate::queue::queued;
use common::*;
use tokio::sync::watch;
use zkguard::testkit::Partition;
use zkguard::zk::ConnectionState;
use zkguard::{LockRequest, LockService, ZkLockService, ZkSession};

/// Waits until the watched state is `want` (it stays there until the test changes something).
async fn wait_for(rx: &watch::Receiver<ConnectionState>, want: ConnectionState) {
    eventually(
        Duration::from_secs(20),
        &format!("state {want}"),
        || async { *rx.borrow() == want },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspended_on_a_partition_connected_after_it_lost_after_an_expiry() {
    init_tracing();
    let zk = zk_server();
    let partition = Partition::start(&zk.connect_string()).unwrap();
    let mut settings = zk_settings(partition.connect_string(), "state");
    settings.session_timeout = Duration::from_millis(2000);
    let session = session(&settings).await;
    let mut states = session.connection_state();
    assert_eq!(*states.borrow_and_update(), ConnectionState::Connected);
    let first_id = session.session_id().unwrap();

    // A short partition: suspended, then connected again with the same session.
    partition.cut();
    wait_for(&states, ConnectionState::Suspended).await;
    assert!(!session.is_connected());
    partition.heal();
    wait_for(&states, ConnectionState::Connected).await;
    assert_eq!(session.session_id(), Some(first_id));

    // A partition longer than the session timeout: the server expires the session (its queue
    // node, seen through a direct connection, goes away), and the client learns it when it
    // reaches the server again.
    let locks = ZkLockService::new(session.clone());
    let guard = locks
        .acquire(LockRequest::new("state-m", "held"))
        .await
        .unwrap();
    let monitor_path = format!("{}/state-m", settings.lock_root);
    assert_eq!(queued(&zk.connect_string(), &monitor_path, "A-").await, 1);
    partition.cut();
    wait_for(&states, ConnectionState::Suspended).await;
    let direct = zk.connect_string();
    eventually(
        Duration::from_secs(20),
        "the server expired the session",
        || {
            let (direct, path) = (direct.clone(), monitor_path.clone());
            async move { queued(&direct, &path, "A-").await == 0 }
        },
    )
    .await;
    partition.heal();
    wait_for(&states, ConnectionState::Lost).await;
    drop(guard);

    // A new session on demand: connected again, with another id.
    session.ensure_session().await.unwrap();
    wait_for(&states, ConnectionState::Connected).await;
    assert_ne!(session.session_id(), Some(first_id));

    session.close();
    wait_for(&states, ConnectionState::Closed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_from_the_applications_connector() {
    init_tracing();
    let zk = zk_server();
    let settings = zk_settings(&zk.connect_string(), "connector");
    // The application's own connector: here a session timeout other than the configured one.
    let connector =
        zookeeper_client::Client::connector().with_session_timeout(Duration::from_millis(3000));
    let session = ZkSession::from_connector(connector, &settings)
        .await
        .unwrap();
    assert_eq!(
        *session.connection_state().borrow(),
        ConnectionState::Connected
    );
    let locks = ZkLockService::new(session.clone());
    let guard = locks
        .acquire(LockRequest::new("connector-m", "held"))
        .await
        .unwrap();
    assert!(guard.fencing_token() > 0);
    let path = format!("{}/connector-m", settings.lock_root);
    assert_eq!(queued(&zk.connect_string(), &path, "A-").await, 1);
    guard.unlock().await.unwrap();

    // An unreachable server: the configured attempts, then the usual error.
    let mut unreachable = zk_settings(
        &format!("127.0.0.1:{}", zkguard::testkit::free_port().unwrap()),
        "connector",
    );
    unreachable.connection_retry = 1;
    let err = ZkSession::from_connector(zookeeper_client::Client::connector(), &unreachable)
        .await
        .unwrap_err();
    assert!(
        matches!(err, zkguard::LockError::ConnectionLoss { .. }),
        "{err}"
    );
}
