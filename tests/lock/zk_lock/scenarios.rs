//! The design's scenarios, fencing tokens across monitors and sessions, and the errors raised
//! before any request (bad monitor names, an unreachable ZooKeeper).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_1_two_foreground_clients_take_turns() {
    let zk = shared();
    let settings = zk_settings(&zk.connect_string(), "s1");
    let (c1, c2) = (session(&settings).await, session(&settings).await);
    let g1 = ZkBlockingWriteLock::new("Save Content", &c1, "P1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    let monitor = format!("{}/P1", settings.lock_root);
    let kids = children(&zk.connect_string(), &monitor).await;
    assert_eq!(kids.len(), 2, "{kids:?}");
    assert!(kids.iter().any(|k| k == "privateLock"), "{kids:?}");
    assert!(
        kids.iter().any(|k| k.starts_with("A-") && k.len() == 12),
        "{kids:?}"
    );

    let lock2 = ZkBlockingWriteLock::new("Save Content", &c2, "P1").unwrap();
    let waiter = tokio::spawn(async move { lock2.lock_with_timeout().await });
    // Client2 queues behind Client1 with a second A- node.
    eventually(Duration::from_secs(5), "client2 queued", || async {
        queued(&zk.connect_string(), &monitor, "A-").await == 2
    })
    .await;
    assert!(!waiter.is_finished());
    let t1 = g1.fencing_token();
    g1.unlock().await.unwrap();
    let g2 = waiter.await.unwrap().unwrap();
    assert!(g2.fencing_token() > t1);
    g2.unlock().await.unwrap();
    assert!(children(&zk.connect_string(), &monitor).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_2_background_uses_b_nodes() {
    let zk = shared();
    let settings = zk_settings(&zk.connect_string(), "s2");
    let (c1, c2) = (session(&settings).await, session(&settings).await);
    let bg = |s| {
        ZkBlockingWriteLock::new("Bulk Propagation", s, "P1")
            .unwrap()
            .with_type(LockType::Background)
    };
    let g1 = bg(&c1).lock_with_timeout().await.unwrap();
    let monitor = format!("{}/P1", settings.lock_root);
    let l2 = bg(&c2);
    let waiter = tokio::spawn(async move { l2.lock_with_timeout().await });
    eventually(Duration::from_secs(5), "two B- nodes", || async {
        queued(&zk.connect_string(), &monitor, "B-").await == 2
    })
    .await;
    g1.unlock().await.unwrap();
    waiter.await.unwrap().unwrap().unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_3_foreground_overtakes_queued_background() {
    let zk = shared();
    let settings = zk_settings(&zk.connect_string(), "s3");
    let (c1, c2, c3) = (
        session(&settings).await,
        session(&settings).await,
        session(&settings).await,
    );
    let monitor = format!("{}/P1", settings.lock_root);
    let order = Arc::new(Mutex::new(Vec::new()));

    let g1 = ZkBlockingWriteLock::new("Save Content", &c1, "P1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    // Client2: background, queued first.
    let l2 = ZkBlockingWriteLock::new("Bulk Propagation", &c2, "P1")
        .unwrap()
        .with_type(LockType::Background);
    let w2 = take_turn(l2, &order, "client2-background");
    eventually(Duration::from_secs(5), "background queued", || async {
        children(&zk.connect_string(), &monitor)
            .await
            .iter()
            .any(|k| k.starts_with("B-"))
    })
    .await;
    // Client3: foreground, arrives later.
    let l3 = ZkBlockingWriteLock::new("Save Content", &c3, "P1").unwrap();
    let w3 = take_turn(l3, &order, "client3-foreground");
    eventually(
        Duration::from_secs(5),
        "second foreground queued",
        || async { queued(&zk.connect_string(), &monitor, "A-").await == 2 },
    )
    .await;
    // The B- node has the lower sequence number, the A- node the higher: priority decides.
    g1.unlock().await.unwrap();
    w3.await.unwrap();
    w2.await.unwrap();
    assert_eq!(
        *order.lock().unwrap(),
        ["client3-foreground", "client2-background"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_strictly_increase_across_monitors_and_sessions() {
    let zk = shared();
    let settings = zk_settings(&zk.connect_string(), "tokens");
    let sessions = [session(&settings).await, session(&settings).await];
    let mut last = 0u64;
    for i in 0..30 {
        let s = &sessions[i % 2];
        let monitor = format!("m{}", i % 3);
        let g = ZkBlockingWriteLock::new("t", s, monitor)
            .unwrap()
            .lock_with_timeout()
            .await
            .unwrap();
        assert!(
            g.fencing_token() > last,
            "token {} after {last}",
            g.fencing_token()
        );
        last = g.fencing_token();
        g.unlock().await.unwrap();
    }
}

#[tokio::test]
async fn invalid_monitor_names_are_rejected_before_any_request() {
    let zk = shared();
    let settings = zk_settings(&zk.connect_string(), "names");
    let c = session(&settings).await;
    for bad in ["", "a/b", "..", "x\u{7}"] {
        let err = ZkBlockingWriteLock::new("x", &c, bad).unwrap_err();
        assert!(
            matches!(err, LockError::InvalidMonitor { .. }),
            "{bad:?}: {err}"
        );
    }
}

#[tokio::test]
async fn unreachable_zookeeper_is_a_connection_error_naming_the_servers() {
    let port = zkguard::testkit::free_port().unwrap();
    let mut settings = zk_settings(&format!("127.0.0.1:{port}"), "down");
    settings.connection_retry = 2;
    settings.connection_delay = Duration::from_millis(50);
    let err = zkguard::ZkSession::connect(&settings).await.unwrap_err();
    assert!(matches!(err, LockError::ConnectionLoss { .. }), "{err}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}
