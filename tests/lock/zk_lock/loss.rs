//! Loss detection and ghost nodes: expired sessions, deleted mutexes, a paused server, cut
//! connections and lost answers.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_session_reports_loss_and_the_next_holder_gets_a_higher_token() {
    init_tracing();
    let zk = shared();
    let settings = zk_settings(&zk.connect_string(), "expire");
    // The holder reaches ZooKeeper through a partition that the test cuts: ZooKeeper expires
    // its session for real, as after a long GC pause or a network failure.
    let partition = zkguard::testkit::Partition::start(&settings.servers).unwrap();
    let mut cut_off = settings.clone();
    cut_off.servers = partition.connect_string().to_string();
    let (c1, c2) = (session(&cut_off).await, session(&settings).await);
    let g1 = ZkBlockingWriteLock::new("holder", &c1, "P1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    let l2 = ZkBlockingWriteLock::new("next", &c2, "P1").unwrap();
    let waiter = tokio::spawn(async move { l2.lock_with_timeout().await });
    partition.cut();
    // The holder counts its lock lost after the grace, well before the server expires it.
    let reason = tokio::time::timeout(Duration::from_secs(15), g1.lost())
        .await
        .expect("loss reported");
    assert!(
        matches!(reason, LossReason::Disconnected { .. }),
        "{reason}"
    );
    assert!(!g1.is_held());
    // ZooKeeper expires the session (4 s) and hands the lock on.
    let g2 = waiter.await.unwrap().expect("the waiter gets the lock");
    assert!(g2.fencing_token() > g1.fencing_token());
    partition.heal();
    // The old guard's unlock reports that its session is gone, and does not touch the new
    // holder's nodes.
    assert!(g1.unlock().await.is_err());
    assert!(g2.is_held());
    // The expired session's owner connects a new session for its next lock.
    g2.unlock().await.unwrap();
    let g3 = ZkBlockingWriteLock::new("again", &c1, "P1")
        .unwrap()
        .with_timeout(Duration::from_secs(10))
        .lock_with_timeout()
        .await
        .unwrap();
    g3.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_mutex_is_reported_as_loss() {
    let zk = shared();
    let settings = zk_settings(&zk.connect_string(), "mutexdel");
    let c1 = session(&settings).await;
    let g1 = ZkBlockingWriteLock::new("holder", &c1, "P1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    let admin = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    admin
        .delete(&format!("{}/P1/privateLock", settings.lock_root), None)
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(10), g1.lost())
        .await
        .expect("loss reported");
    assert_eq!(reason, LossReason::MutexDeleted);
    assert!(matches!(g1.unlock().await, Err(LockError::NoNode { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_server_makes_the_holder_report_loss_after_the_grace() {
    let zk = zk_server();
    let mut settings = zk_settings(&zk.connect_string(), "pause");
    settings.session_timeout = Duration::from_millis(2000);
    let c1 = session(&settings).await;
    let g1 = ZkBlockingWriteLock::new("holder", &c1, "P1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    zk.pause();
    let reason = tokio::time::timeout(Duration::from_secs(10), g1.lost())
        .await
        .expect("loss reported");
    zk.resume();
    assert!(
        matches!(
            reason,
            LossReason::Disconnected { .. } | LossReason::SessionExpired
        ),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_loss_during_create_leaves_no_ghost() {
    let zk = shared();
    let proxy = ZkProxy::start(&zk.connect_string());
    let settings = zk_settings(&proxy.connect_string(), "ghost");
    let direct = zk_settings(&zk.connect_string(), "unused");
    let monitor = format!("{}/P1", settings.lock_root);
    let c1 = session(&settings).await;
    // Warm up the root and the monitor node.
    ZkBlockingWriteLock::new("w", &c1, "P1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();

    // 1. Fast path (multi) cut after the server applied it.
    proxy.cut_after(OP_MULTI);
    let g = ZkBlockingWriteLock::new("x", &c1, "P1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    assert_eq!(proxy.cuts(), 1);
    let kids = children(&direct.servers, &monitor).await;
    assert_eq!(
        kids.iter().filter(|k| k.starts_with("A-")).count(),
        1,
        "one queue node, no ghost: {kids:?}"
    );
    g.unlock().await.unwrap();
    assert!(children(&direct.servers, &monitor).await.is_empty());

    // 2. Plain create of a waiter's node cut after the server applied it.
    let c2 = session(&zk_settings(&zk.connect_string(), "unused")).await;
    let mut s2 = settings.clone();
    s2.servers = zk.connect_string();
    let holder_session = session(&s2).await;
    let holder = ZkBlockingWriteLock::new("h", &holder_session, "P1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    drop(c2);
    proxy.cut_after(OP_CREATE2);
    let waiter_lock = ZkBlockingWriteLock::new("w", &c1, "P1").unwrap();
    let waiter = tokio::spawn(async move { waiter_lock.lock_with_timeout().await });
    eventually(
        Duration::from_secs(10),
        "the cut happened and the waiter is queued once",
        || async { proxy.cuts() == 2 && queued(&direct.servers, &monitor, "A-").await == 2 },
    )
    .await;
    holder.unlock().await.unwrap();
    let g = waiter.await.unwrap().unwrap();
    let kids = children(&direct.servers, &monitor).await;
    assert_eq!(
        kids.iter().filter(|k| k.starts_with("A-")).count(),
        1,
        "{kids:?}"
    );
    g.unlock().await.unwrap();
    eventually(Duration::from_secs(5), "nothing left behind", || async {
        children(&direct.servers, &monitor).await.is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_waiter_sees_the_release_after_its_connection_was_cut() {
    let zk = shared();
    let proxy = ZkProxy::start(&zk.connect_string());
    let direct = zk_settings(&zk.connect_string(), "reconnect");
    let mut via_proxy = direct.clone();
    via_proxy.servers = proxy.connect_string();
    let holder_session = session(&direct).await;
    let waiter_session = session(&via_proxy).await;
    let monitor = format!("{}/P1", direct.lock_root);
    // The holder is a background lock, so the foreground waiter is first in line and waits for
    // the mutex node itself (not for a queue node).
    let holder = ZkBlockingWriteLock::new("h", &holder_session, "P1")
        .unwrap()
        .with_type(LockType::Background)
        .lock_with_timeout()
        .await
        .unwrap();
    let l = ZkBlockingWriteLock::new("w", &waiter_session, "P1")
        .unwrap()
        .with_timeout(Duration::from_secs(20));
    let waiter = tokio::spawn(async move { l.lock_with_timeout().await });
    eventually(Duration::from_secs(5), "waiter queued", || async {
        children(&zk.connect_string(), &monitor)
            .await
            .iter()
            .any(|k| k.starts_with("A-"))
    })
    .await;
    // Cut the waiter's connection on its next request (a ping will do) and let it reconnect.
    let waiter_id = format!("{:#x}", waiter_session.session_id().unwrap());
    let mutex = format!("{monitor}/privateLock");
    let watched_by_waiter = || {
        let dump = zk.four_letter("wchp").unwrap();
        let mut lines = dump.lines().skip_while(|l| l.trim() != mutex).skip(1);
        lines.any(|l| l.trim() == waiter_id)
    };
    // First in line behind a background holder, the waiter watches the mutex node itself.
    eventually(
        Duration::from_secs(5),
        "the waiter watches the mutex before the cut",
        || async { watched_by_waiter() },
    )
    .await;
    proxy.cut_after(11);
    eventually(
        Duration::from_secs(10),
        "the waiter's connection was cut",
        || async { proxy.cuts() == 1 },
    )
    .await;
    // Once reconnected, the waiter watches the mutex again; only then does the holder release.
    eventually(
        Duration::from_secs(10),
        "the waiter watches the mutex again",
        || async { watched_by_waiter() },
    )
    .await;
    holder.unlock().await.unwrap();
    let g = waiter
        .await
        .unwrap()
        .expect("the waiter gets the lock after reconnecting");
    g.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_retried_after_a_lost_answer_leaves_the_next_holders_mutex_alone() {
    let zk = shared();
    let proxy = ZkProxy::start(&zk.connect_string());
    let direct = zk_settings(&zk.connect_string(), "release-retry");
    let mut via_proxy = direct.clone();
    via_proxy.servers = proxy.connect_string();
    let old_session = session(&via_proxy).await;
    let next_session = session(&direct).await;
    let mutex = format!("{}/P1/privateLock", direct.lock_root);
    let old = ZkBlockingWriteLock::new("old", &old_session, "P1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    let l = ZkBlockingWriteLock::new("next", &next_session, "P1").unwrap();
    let waiter = tokio::spawn(async move { l.lock_with_timeout().await });
    eventually(Duration::from_secs(5), "next queued", || async {
        children(&zk.connect_string(), &format!("{}/P1", direct.lock_root))
            .await
            .len()
            == 3
    })
    .await;
    // The release multi is applied, but its answer is lost and the old holder cannot reconnect
    // until the next holder has taken the lock.
    proxy.cut_after_and_block(OP_MULTI);
    let release = tokio::spawn(async move { old.unlock().await });
    let next = waiter
        .await
        .unwrap()
        .expect("the next holder gets the lock");
    proxy.unblock();
    // The retried release must not delete the next holder's mutex.
    let _ = release.await.unwrap();
    assert!(next.is_held());
    let admin = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    let (data, stat) = admin
        .get_data(&mutex)
        .await
        .expect("the next holder's mutex still exists");
    assert_eq!(stat.ephemeral_owner, next_session.session_id().unwrap());
    assert!(String::from_utf8_lossy(&data).contains("\"next\""));
    next.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeueing_release_cut_after_the_server_applied_it_leaves_no_ghost() {
    let zk = shared();
    let proxy = ZkProxy::start(&zk.connect_string());
    let settings = zk_settings(&proxy.connect_string(), "requeue-cut");
    let mut direct = settings.clone();
    direct.servers = zk.connect_string();
    let monitor = format!("{}/C1", settings.lock_root);
    let (sa, sb) = (session(&settings).await, session(&direct).await);
    let lock = |s: &zkguard::ZkSession, info: &str| {
        ZkBlockingWriteLock::new(info, s, "C1")
            .unwrap()
            .with_timeout(Duration::from_secs(30))
    };
    let (a, b) = (lock(&sa, "a"), lock(&sb, "b"));
    let held = held_after_contention(&a, &b, zk, &monitor).await;
    let wb = tokio::spawn({
        let b = b.clone();
        async move { b.lock_with_timeout().await }
    });
    eventually(Duration::from_secs(10), "b waits behind a", || async {
        queued(&direct.servers, &monitor, "A-").await == 2
    })
    .await;
    // The requeueing multi reaches the server, which applies it; its answer is lost.
    proxy.cut_after(OP_MULTI);
    let a_again = tokio::spawn({
        let a = a.clone();
        async move { a.release_and_lock(held).await }
    });
    let gb = wb.await.unwrap().expect("b takes the lock that a released");
    eventually(
        Duration::from_secs(10),
        "the cut happened and a is queued once, behind b",
        || async { proxy.cuts() == 1 && queued(&direct.servers, &monitor, "A-").await == 2 },
    )
    .await;
    // a's new node came with the release, in the transaction that woke b: before b's mutex.
    let admin = zookeeper_client::Client::connect(&direct.servers)
        .await
        .unwrap();
    let mut nodes = children(&direct.servers, &monitor).await;
    nodes.retain(|n| n.starts_with("A-"));
    nodes.sort();
    let (_, a_node) = admin
        .get_data(&format!("{monitor}/{}", nodes[1]))
        .await
        .unwrap();
    let (_, mutex) = admin
        .get_data(&format!("{monitor}/privateLock"))
        .await
        .unwrap();
    assert!(
        a_node.czxid < mutex.czxid,
        "a's node was created in the multi that released its lock, before b took the mutex"
    );
    gb.unlock().await.unwrap();
    let (release, next) = a_again.await.unwrap();
    release
        .await
        .expect("the careful release finds its nodes gone with the applied multi");
    let ga = next.expect("a finds its node by attempt id and takes the lock");
    let kids = children(&direct.servers, &monitor).await;
    assert_eq!(
        kids.iter().filter(|k| k.starts_with("A-")).count(),
        1,
        "one queue node, no ghost: {kids:?}"
    );
    ga.unlock().await.unwrap();
    eventually(Duration::from_secs(5), "nothing left behind", || async {
        children(&direct.servers, &monitor).await.is_empty()
    })
    .await;
}

/// With ZooKeeper stopped, an acquisition ends by its deadline plus
/// [`zkguard::zk::DEADLINE_OVERRUN`] with a connection error. Its requests wait in the
/// disconnected session, which the client keeps trying to reconnect for 7/5 of the session
/// timeout: the acquisition does not wait for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_zookeeper_stopped_an_acquisition_ends_by_its_deadline() {
    init_tracing();
    let zk = zk_server();
    let mut settings = zk_settings(&zk.connect_string(), "stopped");
    settings.session_timeout = Duration::from_secs(10);
    let s = session(&settings).await;
    zk.stop();
    eventually(
        Duration::from_secs(10),
        "the session sees the server gone",
        || async { !s.is_connected() },
    )
    .await;
    let timeout = Duration::from_secs(1);
    let lock = ZkBlockingWriteLock::new("w", &s, "D1")
        .unwrap()
        .with_timeout(timeout);
    let started = std::time::Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(60), lock.lock_with_timeout())
        .await
        .expect("the acquisition ends");
    let waited = started.elapsed();
    let err = result.expect_err("nothing to acquire with ZooKeeper stopped");
    assert!(matches!(err, LockError::ConnectionLoss { .. }), "{err}");
    let bound = timeout + zkguard::zk::DEADLINE_OVERRUN;
    assert!(
        waited < bound + Duration::from_secs(1),
        "ended after {waited:?}, past the deadline and its overrun ({bound:?}): {err}"
    );
}
