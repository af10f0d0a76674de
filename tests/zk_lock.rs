//! The ZooKeeper priority lock against a real ZooKeeper: the design's scenarios, timeouts,
//! cancellation, fencing tokens, request counts, loss detection and ghost nodes.

mod common;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::proxy::{ZkProxy, OP_CREATE2, OP_MULTI};
use common::*;
use zkguard::testkit::ZkServer;
use zkguard::zk::{clear_stray, list_locks, StrayOutcome};
use zkguard::{Blocker, LockError, LockType, LossReason, ZkBlockingWriteLock};
use zookeeper_client::{Acls, CreateMode, EventType};

/// One server shared by the tests that do not stop or pause it (each uses its own lock root).
fn shared() -> &'static ZkServer {
    static SERVER: OnceLock<ZkServer> = OnceLock::new();
    SERVER.get_or_init(zk_server)
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_leaves_no_waiter_node() {
    let zk = shared();
    let settings = zk_settings(&zk.connect_string(), "timeout");
    let (c1, c2) = (session(&settings).await, session(&settings).await);
    let g1 = ZkBlockingWriteLock::new("holder", &c1, "P1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    let err = ZkBlockingWriteLock::new("waiter", &c2, "P1")
        .unwrap()
        .with_type(LockType::Background)
        .with_timeout(Duration::from_millis(300))
        .lock_with_timeout()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LockError::Timeout {
                lock_type: LockType::Background,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("not acquired within"), "{err}");
    // It names what held it, from the holder's node.
    match err.blocked_by() {
        Some(Blocker::Holder { owner, info, .. }) => {
            assert_eq!(owner.as_deref(), Some(c1.owner_id()));
            assert_eq!(info.as_deref(), Some("holder"));
        }
        _ => panic!("expected the holder to be named: {err}"),
    }
    // Removed before the error was returned.
    let kids = children(&zk.connect_string(), &format!("{}/P1", settings.lock_root)).await;
    assert_eq!(
        kids.iter().filter(|k| k.starts_with("B-")).count(),
        0,
        "{kids:?}"
    );
    g1.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiter_removes_its_node() {
    let zk = shared();
    let settings = zk_settings(&zk.connect_string(), "cancel");
    let (c1, c2) = (session(&settings).await, session(&settings).await);
    let monitor = format!("{}/P1", settings.lock_root);
    let g1 = ZkBlockingWriteLock::new("holder", &c1, "P1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    let l2 = ZkBlockingWriteLock::new("waiter", &c2, "P1").unwrap();
    let waiter = tokio::spawn(async move { l2.lock_with_timeout().await });
    eventually(Duration::from_secs(5), "waiter queued", || async {
        queued(&zk.connect_string(), &monitor, "A-").await == 2
    })
    .await;
    waiter.abort();
    eventually(
        Duration::from_secs(5),
        "cancelled waiter's node removed",
        || async { queued(&zk.connect_string(), &monitor, "A-").await == 1 },
    )
    .await;
    g1.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_guard_releases_in_the_background() {
    let zk = shared();
    let settings = zk_settings(&zk.connect_string(), "drop");
    let c1 = session(&settings).await;
    let g = ZkBlockingWriteLock::new("x", &c1, "P1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    drop(g);
    let g2 = ZkBlockingWriteLock::new("y", &c1, "P1")
        .unwrap()
        .with_timeout(Duration::from_secs(5))
        .lock_with_timeout()
        .await
        .unwrap();
    g2.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_cycle_needs_two_requests() {
    let (zk, settings) = counted_server("requests");
    let c = session(&settings).await;
    // Warm up: creates the root and the monitor node.
    for _ in 0..3 {
        ZkBlockingWriteLock::new("w", &c, "P1")
            .unwrap()
            .lock_with_timeout()
            .await
            .unwrap()
            .unlock()
            .await
            .unwrap();
    }
    let cycles = 200u64;
    let before = zk.packets_received().unwrap();
    for _ in 0..cycles {
        let g = ZkBlockingWriteLock::new("w", &c, "P1")
            .unwrap()
            .lock_with_timeout()
            .await
            .unwrap();
        g.unlock().await.unwrap();
    }
    let after = zk.packets_received().unwrap();
    // One multi that queues, takes the mutex and reads the monitor's stat (nobody else is
    // queued: no read of the queue), one release multi. Pings and the mntr connection itself
    // add a handful of packets.
    let per_cycle = (after - before) as f64 / cycles as f64;
    assert!(
        per_cycle <= 2.05,
        "{per_cycle} requests per acquire+release"
    );
}

/// `LockGuard::release` sends the release before it returns and awaits nothing: the session's
/// next acquisition, sent right behind it, finds the monitor free (a try-once fast path reports
/// the lock busy otherwise), a cycle still costs two requests, and a release dropped unawaited
/// still completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_goes_out_before_it_returns_and_the_next_acquisition_finds_it_applied() {
    let (zk, settings) = counted_server("pipelined");
    let c = session(&settings).await;
    let lock = ZkBlockingWriteLock::new("w", &c, "R1").unwrap();
    // Warm up: creates the root and the monitor node.
    lock.try_lock().await.unwrap().unlock().await.unwrap();
    let cycles = 100u64;
    let before = zk.packets_received().unwrap();
    let mut releasing = lock.try_lock().await.unwrap().release();
    let mut token = 0;
    for i in 1..cycles {
        let g = lock.try_lock().await.unwrap_or_else(|e| {
            panic!("cycle {i}: the release sent before this try was not applied first: {e}")
        });
        assert!(g.fencing_token() > token);
        token = g.fencing_token();
        releasing.await.unwrap();
        releasing = g.release();
    }
    releasing.await.unwrap();
    let after = zk.packets_received().unwrap();
    let per_cycle = (after - before) as f64 / cycles as f64;
    assert!(
        per_cycle <= 2.05,
        "{per_cycle} requests per acquire+release"
    );

    // Dropped unawaited, a release still completes: another session gets the lock.
    drop(lock.try_lock().await.unwrap().release());
    let other = session(&settings).await;
    ZkBlockingWriteLock::new("w", &other, "R1")
        .unwrap()
        .with_timeout(Duration::from_secs(20))
        .lock_with_timeout()
        .await
        .expect("the dropped release completed")
        .unlock()
        .await
        .unwrap();
}

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

/// A lock held beyond `MUTEX_WATCH_AFTER` watches its mutex node without anyone awaiting
/// `lost()`: a deletion by someone else shows in `is_held()`. Its release then costs one
/// request, and leaves no watch behind (the release's own deletion fires it: nothing to remove).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_a_while_watches_its_mutex_and_its_release_leaves_no_watch() {
    let (zk, settings) = counted_server("watchlater");
    let c = session(&settings).await;
    let mutex = format!("{}/W1/privateLock", settings.lock_root);
    // Takes the lock and holds it until the holder watches its mutex.
    let hold_until_watched = || async {
        let g = ZkBlockingWriteLock::new("long", &c, "W1")
            .unwrap()
            .lock_with_timeout()
            .await
            .unwrap();
        eventually(
            zkguard::zk::MUTEX_WATCH_AFTER + Duration::from_secs(5),
            "the holder watches its mutex",
            || async { watched(&zk, &mutex) },
        )
        .await;
        g
    };
    let g = hold_until_watched().await;
    let before = zk.packets_received().unwrap();
    g.unlock().await.unwrap();
    let after = zk.packets_received().unwrap();
    assert!(
        after - before <= 2,
        "{} packets for a release (expected the release multi and the mntr reading; a watch \
         dropped before it fired costs one more to remove)",
        after - before
    );
    assert!(!watched(&zk, &mutex), "a watch was left on {mutex}");

    // Deleted by someone else while held, unseen by any caller of lost(): the guard notices.
    let g = hold_until_watched().await;
    let admin = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    admin.delete(&mutex, None).await.unwrap();
    eventually(
        Duration::from_secs(5),
        "the holder sees its mutex deleted",
        || async { !g.is_held() },
    )
    .await;
    assert_eq!(g.loss(), Some(LossReason::MutexDeleted));
    assert!(matches!(g.unlock().await, Err(LockError::NoNode { .. })));
}

/// A lock taken on a monitor with no other node is released without the hand-over mark (every
/// waiter came later): a watcher of its queue node sees `NodeDeleted`, and the foreground waiter
/// queued right behind it takes the lock at once, without listing the queue again (the release
/// and the waiter's create of the mutex). A lock taken after waiting is released with the mark
/// (`NodeDataChanged`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_alone_is_released_without_the_mark_and_its_waiter_reads_nothing_more() {
    let (zk, settings) = counted_server("alone");
    let monitor = format!("{}/M1", settings.lock_root);
    let (h, w) = (session(&settings).await, session(&settings).await);
    let admin = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    let queue_nodes = || async {
        let (children, _) = admin.get_children(&monitor).await.unwrap();
        let mut nodes: Vec<String> = children
            .into_iter()
            .filter(|c| c != "privateLock")
            .map(|c| format!("{monitor}/{c}"))
            .collect();
        nodes.sort();
        nodes
    };
    let lock = |s: &zkguard::ZkSession, info: &str| {
        ZkBlockingWriteLock::new(info, s, "M1")
            .unwrap()
            .with_timeout(Duration::from_secs(20))
    };
    // Alone on the monitor: the fast path.
    let held = lock(&h, "holder").try_lock().await.unwrap();
    let [holder_node] = queue_nodes().await.try_into().unwrap();
    let waiter = tokio::spawn({
        let lock = lock(&w, "waiter");
        async move { lock.lock_with_timeout().await }
    });
    eventually(
        Duration::from_secs(10),
        "the waiter watches the holder's queue node",
        || async { watched(&zk, &holder_node) && queue_nodes().await.len() == 2 },
    )
    .await;
    let (_, _, seen) = admin.get_and_watch_data(&holder_node).await.unwrap();
    let before = zk.packets_received().unwrap();
    held.unlock().await.unwrap();
    let taken = waiter.await.unwrap().expect("the waiter takes the lock");
    let after = zk.packets_received().unwrap();
    assert_eq!(seen.changed().await.event_type, EventType::NodeDeleted);
    assert!(
        after - before <= 3,
        "{} packets from the release to the waiter's lock (expected the release, the waiter's \
         create of the mutex and the mntr reading: no second listing)",
        after - before
    );

    // The waiter took it after waiting: its release carries the mark for whoever queued behind.
    let [waiter_node] = queue_nodes().await.try_into().unwrap();
    let (_, _, seen) = admin.get_and_watch_data(&waiter_node).await.unwrap();
    taken.unlock().await.unwrap();
    assert_eq!(seen.changed().await.event_type, EventType::NodeDataChanged);
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
async fn starving_background_waiter_is_promoted_ahead_of_later_foreground() {
    let zk = shared();
    let mut settings = zk_settings(&zk.connect_string(), "starve");
    settings.background_max_wait = Some(Duration::from_millis(300));
    let (c1, c2, c3) = (
        session(&settings).await,
        session(&settings).await,
        session(&settings).await,
    );
    let monitor = format!("{}/P1", settings.lock_root);
    let order = Arc::new(Mutex::new(Vec::new()));
    let holder = ZkBlockingWriteLock::new("holder", &c1, "P1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();

    let lb = ZkBlockingWriteLock::new("starving job", &c2, "P1")
        .unwrap()
        .with_type(LockType::Background);
    let wb = take_turn(lb, &order, "background");
    // After zookeeper.background.max.wait the background waiter's node is a foreground node.
    eventually(
        Duration::from_secs(10),
        "background waiter promoted",
        || async {
            let kids = children(&zk.connect_string(), &monitor).await;
            kids.iter().filter(|k| k.starts_with("A-")).count() == 2
                && !kids.iter().any(|k| k.starts_with("B-"))
        },
    )
    .await;
    // A foreground request arriving after the promotion queues behind it.
    let lf = ZkBlockingWriteLock::new("late save", &c3, "P1").unwrap();
    let wf = take_turn(lf, &order, "foreground");
    eventually(Duration::from_secs(5), "late foreground queued", || async {
        queued(&zk.connect_string(), &monitor, "A-").await == 3
    })
    .await;
    holder.unlock().await.unwrap();
    wb.await.unwrap();
    wf.await.unwrap();
    assert_eq!(*order.lock().unwrap(), ["background", "foreground"]);
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

/// Queue-node data as another zkguard process would write it.
fn foreign_node_data(lock_type: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "info": "elsewhere", "owner": "other-host:1:0000abcd", "attempt": "a1", "host": "other-host",
        "pid": 1, "type": lock_type, "created_ms": 0
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_takes_a_free_lock_and_otherwise_fails_at_once_naming_the_holder() {
    let zk = shared();
    let servers = zk.connect_string();
    let settings = zk_settings(&servers, "tryonce");
    let (c1, c2) = (session(&settings).await, session(&settings).await);
    let monitor = format!("{}/T1", settings.lock_root);
    // Free (the monitor node does not even exist yet): taken on the single try.
    let g1 = ZkBlockingWriteLock::new("Save Content", &c1, "T1")
        .unwrap()
        .try_lock()
        .await
        .unwrap();
    // Held: fails at once for either class, naming the holder from its nodes, queueing nothing.
    for lock_type in [LockType::Foreground, LockType::Background] {
        let err = ZkBlockingWriteLock::new("second", &c2, "T1")
            .unwrap()
            .with_type(lock_type)
            .try_lock()
            .await
            .unwrap_err();
        match err.blocked_by() {
            Some(Blocker::Holder { owner, info, node }) => {
                assert_eq!(owner.as_deref(), Some(c1.owner_id()), "{err}");
                assert_eq!(info.as_deref(), Some("Save Content"), "{err}");
                assert!(
                    node.as_deref().is_some_and(|n| n.starts_with("A-")),
                    "{err}"
                );
            }
            _ => panic!("expected the holder to be named: {err}"),
        }
        assert!(err.to_string().contains(c1.owner_id()), "{err}");
        let kids = children(&servers, &monitor).await;
        assert_eq!(kids.len(), 2, "only the holder's nodes: {kids:?}");
    }
    // A zero timeout through lock_with_timeout is the same try.
    let err = ZkBlockingWriteLock::new("second", &c2, "T1")
        .unwrap()
        .with_timeout(Duration::ZERO)
        .lock_with_timeout()
        .await
        .unwrap_err();
    assert!(
        matches!(err.blocked_by(), Some(Blocker::Holder { .. })),
        "{err}"
    );
    g1.unlock().await.unwrap();
    // Free again: the try succeeds.
    let g2 = ZkBlockingWriteLock::new("second", &c2, "T1")
        .unwrap()
        .try_lock()
        .await
        .unwrap();
    g2.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_respects_the_queue_ahead_and_leaves_no_node() {
    let zk = shared();
    let servers = zk.connect_string();
    let settings = zk_settings(&servers, "tryqueue");
    let c1 = session(&settings).await;
    let monitor = format!("{}/T2", settings.lock_root);
    let admin = zookeeper_client::Client::connect(&servers).await.unwrap();
    create_path(&admin, &monitor).await;
    // A foreground contender is queued while the mutex is free (as between two holders).
    let (_, seq) = admin
        .create(
            &format!("{monitor}/A-"),
            &foreign_node_data("foreground"),
            &CreateMode::EphemeralSequential.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    let queued = format!("A-{seq}");
    // Neither a background try nor a later foreground try jumps ahead of it.
    for lock_type in [LockType::Background, LockType::Foreground] {
        let err = ZkBlockingWriteLock::new("try", &c1, "T2")
            .unwrap()
            .with_type(lock_type)
            .try_lock()
            .await
            .unwrap_err();
        match err.blocked_by() {
            Some(Blocker::QueueAhead {
                count,
                first_node,
                first_class,
                first_owner,
            }) => {
                assert_eq!(*count, 1, "{err}");
                assert_eq!(first_node, &queued, "{err}");
                assert_eq!(first_class, "foreground", "{err}");
                assert_eq!(
                    first_owner.as_deref(),
                    Some("other-host:1:0000abcd"),
                    "{err}"
                );
            }
            _ => panic!("expected the queue ahead to be named: {err}"),
        }
        assert_eq!(children(&servers, &monitor).await, vec![queued.clone()]);
    }
    // Once it is gone, the background try gets the lock.
    admin
        .delete(&format!("{monitor}/{queued}"), None)
        .await
        .unwrap();
    let g = ZkBlockingWriteLock::new("try", &c1, "T2")
        .unwrap()
        .with_type(LockType::Background)
        .try_lock()
        .await
        .unwrap();
    g.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stray_mutex_is_reported_named_and_cleared_but_a_live_holders_never() {
    let zk = shared();
    let servers = zk.connect_string();
    let settings = zk_settings(&servers, "stray");
    let c1 = session(&settings).await;
    let monitor = format!("{}/S1", settings.lock_root);
    let mutex = format!("{monitor}/privateLock");
    let admin = zookeeper_client::Client::connect(&servers).await.unwrap();
    create_path(&admin, &monitor).await;

    // A persistent privateLock, as any client could create it.
    admin
        .create(
            &mutex,
            b"{}",
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    let states = list_locks(&c1, Some("S1")).await.unwrap();
    assert_eq!(states.len(), 1);
    assert!(states[0].stray && states[0].holder.is_none());
    assert_eq!(states[0].stray_session.as_deref(), Some("0x0"));
    let err = ZkBlockingWriteLock::new("blocked", &c1, "S1")
        .unwrap()
        .with_timeout(Duration::from_millis(200))
        .lock_with_timeout()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.blocked_by(),
            Some(Blocker::StrayMutex { session: None, .. })
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("zkguard locks --monitor S1 --clear-stray"),
        "{err}"
    );
    assert_eq!(
        clear_stray(&c1, "S1").await.unwrap(),
        StrayOutcome::Removed { session: None }
    );

    // The lock works again; its holder's mutex is not stray and is never cleared.
    let g = ZkBlockingWriteLock::new("holder", &c1, "S1")
        .unwrap()
        .try_lock()
        .await
        .unwrap();
    assert!(!list_locks(&c1, Some("S1")).await.unwrap()[0].stray);
    match clear_stray(&c1, "S1").await.unwrap() {
        StrayOutcome::LiveHolder { owner, node } => {
            assert_eq!(owner.as_deref(), Some(c1.owner_id()));
            assert!(node.is_some_and(|n| n.starts_with("A-")));
        }
        other => panic!("a live holder's mutex must be left alone: {other:?}"),
    }
    assert!(g.is_held());
    assert!(children(&servers, &monitor)
        .await
        .contains(&"privateLock".to_string()));
    g.unlock().await.unwrap();
    assert_eq!(clear_stray(&c1, "S1").await.unwrap(), StrayOutcome::NoMutex);

    // An ephemeral privateLock of a session that holds no queue node is stray too.
    admin
        .create(
            &mutex,
            b"{}",
            &CreateMode::Ephemeral.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    let sid = format!("{:#x}", admin.session_id().0);
    let states = list_locks(&c1, Some("S1")).await.unwrap();
    assert!(states[0].stray);
    assert_eq!(states[0].stray_session.as_deref(), Some(sid.as_str()));
    let err = ZkBlockingWriteLock::new("blocked", &c1, "S1")
        .unwrap()
        .try_lock()
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&sid), "{err}");
    assert_eq!(
        clear_stray(&c1, "S1").await.unwrap(),
        StrayOutcome::Removed { session: Some(sid) }
    );
    assert!(children(&servers, &monitor).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_holders_are_never_seen_as_stray_while_the_lock_changes_hands() {
    let zk = shared();
    let servers = zk.connect_string();
    let settings = zk_settings(&servers, "notstray");
    let sessions = [session(&settings).await, session(&settings).await];
    // Uncontended cycles take the fast path (queue node and mutex in one multi); contended ones
    // hand the mutex over; releases delete both in one multi.
    let workers: Vec<_> = sessions
        .iter()
        .map(|s| {
            let s = s.clone();
            tokio::spawn(async move {
                for _ in 0..150 {
                    let g = ZkBlockingWriteLock::new("cycle", &s, "H1")
                        .unwrap()
                        .lock_with_timeout()
                        .await
                        .unwrap();
                    g.unlock().await.unwrap();
                }
            })
        })
        .collect();
    let inspector = session(&settings).await;
    let mut looks = 0;
    let mut held_seen = 0;
    while !workers.iter().all(|w| w.is_finished()) {
        for state in list_locks(&inspector, Some("H1")).await.unwrap() {
            assert!(!state.stray, "a live holder was taken for stray: {state:?}");
            held_seen += usize::from(state.holder.is_some());
        }
        looks += 1;
    }
    for w in workers {
        w.await.unwrap();
    }
    assert!(looks > 0, "the lock was never inspected");
    eprintln!("{looks} looks, {held_seen} with a holder");
}

/// Whether the server holds a watch on `path` (four-letter word `wchp`).
/// A server of its own, so that no other test's requests are counted, and settings for it under
/// the lock root tagged `tag`, with long sessions so that pings are rare.
fn counted_server(tag: &str) -> (ZkServer, zkguard::config::ZkSettings) {
    let zk = zk_server();
    let mut settings = zk_settings(&zk.connect_string(), tag);
    settings.session_timeout = Duration::from_secs(30);
    (zk, settings)
}

fn watched(zk: &ZkServer, path: &str) -> bool {
    zk.four_letter("wchp")
        .unwrap()
        .lines()
        .any(|l| l.trim() == path)
}

/// Creates a foreground queue node as another zkguard process would, through a raw client;
/// returns its path. It never takes the mutex: it stays first in line until deleted.
async fn foreign_foreground_node(admin: &zookeeper_client::Client, monitor: &str) -> String {
    let (_, seq) = admin
        .create(
            &format!("{monitor}/A-"),
            &foreign_node_data("foreground"),
            &CreateMode::EphemeralSequential.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    format!("{monitor}/A-{seq}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_waiter_woken_as_a_foreground_contender_arrives_leaves_it_the_mutex() {
    let zk = shared();
    let servers = zk.connect_string();
    let settings = zk_settings(&servers, "bgwake");
    let (c1, c2) = (session(&settings).await, session(&settings).await);
    let monitor = format!("{}/W1", settings.lock_root);
    let holder = ZkBlockingWriteLock::new("Save Content", &c1, "W1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    let holder_node = children(&servers, &monitor)
        .await
        .into_iter()
        .find(|k| k.starts_with("A-"))
        .unwrap();
    let bg = ZkBlockingWriteLock::new("Bulk Propagation", &c2, "W1")
        .unwrap()
        .with_type(LockType::Background);
    let waiter = tokio::spawn(async move { bg.lock_with_timeout().await });
    // The background waiter is second, watching the holder's node (the head).
    let holder_path = format!("{monitor}/{holder_node}");
    eventually(
        Duration::from_secs(5),
        "the background waiter watches the holder's node",
        || async { watched(zk, &holder_path) },
    )
    .await;
    // A foreground contender queues while the background waiter waits: it goes first.
    let admin = zookeeper_client::Client::connect(&servers).await.unwrap();
    let fg = foreign_foreground_node(&admin, &monitor).await;
    holder.unlock().await.unwrap();
    // Woken by the release of the head, the background waiter must see the foreground node
    // ahead of it and wait for that one instead of taking the mutex.
    eventually(
        Duration::from_secs(5),
        "the background waiter acquired or watches the foreground node",
        || async { waiter.is_finished() || watched(zk, &fg) },
    )
    .await;
    assert!(
        !waiter.is_finished(),
        "the background waiter took the lock while a foreground contender was queued ahead"
    );
    let kids = children(&servers, &monitor).await;
    assert!(!kids.iter().any(|k| k == "privateLock"), "{kids:?}");
    admin.delete(&fg, None).await.unwrap();
    waiter.await.unwrap().unwrap().unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreground_waiter_whose_node_ahead_left_behind_the_head_lists_the_queue_again() {
    let zk = shared();
    let servers = zk.connect_string();
    let settings = zk_settings(&servers, "relist");
    let c1 = session(&settings).await;
    let monitor = format!("{}/W2", settings.lock_root);
    let admin = zookeeper_client::Client::connect(&servers).await.unwrap();
    create_path(&admin, &monitor).await;
    // Two foreground contenders of another process are queued; the mutex is free (the head is
    // between two attempts).
    let head = foreign_foreground_node(&admin, &monitor).await;
    let second = foreign_foreground_node(&admin, &monitor).await;
    let l = ZkBlockingWriteLock::new("Save Content", &c1, "W2").unwrap();
    let waiter = tokio::spawn(async move { l.lock_with_timeout().await });
    eventually(
        Duration::from_secs(5),
        "the waiter watches the node just ahead of it",
        || async { watched(zk, &second) },
    )
    .await;
    // The node ahead leaves (as after its timeout) while it was not the head: the waiter is
    // not first, and must find the head by listing the queue again.
    admin.delete(&second, None).await.unwrap();
    eventually(
        Duration::from_secs(5),
        "the waiter acquired or watches the head",
        || async { waiter.is_finished() || watched(zk, &head) },
    )
    .await;
    assert!(
        !waiter.is_finished(),
        "the waiter took the lock while an older foreground contender was first in line"
    );
    let kids = children(&servers, &monitor).await;
    assert!(!kids.iter().any(|k| k == "privateLock"), "{kids:?}");
    admin.delete(&head, None).await.unwrap();
    waiter.await.unwrap().unwrap().unlock().await.unwrap();
}

/// Three sessions take turns on one monitor, 20 acquisitions each to warm up (the monitor node,
/// every session's "busy" mark for it), then 150 each, measured; each releases with
/// `release_and_lock` (`requeue`) or with `unlock` and then acquires. Asserts that no two hold the
/// lock at once and that tokens increase; returns the server's requests per acquisition.
async fn requests_per_handoff(tag: &str, requeue: bool) -> f64 {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let (zk, settings) = counted_server(tag);
    let sessions = [
        session(&settings).await,
        session(&settings).await,
        session(&settings).await,
    ];
    let inside = Arc::new(AtomicBool::new(false));
    let run = |cycles: usize| {
        let workers: Vec<_> = sessions
            .iter()
            .map(|s| {
                let lock = ZkBlockingWriteLock::new("h", s, "H1")
                    .unwrap()
                    .with_timeout(Duration::from_secs(20));
                let inside = inside.clone();
                tokio::spawn(async move {
                    let mut held = lock.lock_with_timeout().await.unwrap();
                    assert!(!inside.swap(true, SeqCst), "two holders at once");
                    let mut token = held.fencing_token();
                    for _ in 1..cycles {
                        inside.store(false, SeqCst);
                        held = if requeue {
                            let (release, next) = lock.release_and_lock(held).await;
                            release.await.expect("released in the requeueing multi");
                            next.unwrap()
                        } else {
                            held.unlock().await.unwrap();
                            lock.lock_with_timeout().await.unwrap()
                        };
                        assert!(!inside.swap(true, SeqCst), "two holders at once");
                        assert!(held.fencing_token() > token);
                        token = held.fencing_token();
                    }
                    inside.store(false, SeqCst);
                    held.unlock().await.unwrap();
                })
            })
            .collect();
        async move {
            for w in workers {
                w.await.unwrap();
            }
        }
    };
    run(20).await;
    let cycles = 150;
    let before = zk.packets_received().unwrap();
    run(cycles).await;
    let after = zk.packets_received().unwrap();
    let per_handoff = (after - before) as f64 / (3 * cycles) as f64;
    eprintln!("{per_handoff} requests per contended hand-off");
    per_handoff
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreground_handoff_needs_five_requests() {
    let per_handoff = requests_per_handoff("handoff", false).await;
    // Release multi; the re-queueing holder's create, pipelined child list and watch on the node
    // ahead; the successor's mutex create (no read: a foreground successor is first). The
    // first and last cycles of a run are not hand-offs, and a waiter whose node ahead is gone
    // before its watch is set lists the queue again: a little above 5 on average, well below
    // the 6 of a successor that reads the queue again.
    assert!(
        per_handoff < 5.5,
        "{per_handoff} requests per contended hand-off"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_without_write_permission_still_hands_the_lock_over() {
    use zkguard::config::{ZkAcl, ZkAclEntry, ZkAuth};
    let zk = shared();
    let servers = zk.connect_string();
    let credentials = "hand:s3cret-zk";
    // The digest id of these credentials, as ZooKeeper computes it.
    let admin = zookeeper_client::Client::connector()
        .with_auth("digest", credentials.as_bytes())
        .connect(&servers)
        .await
        .unwrap();
    let probe = format!("/probe-{}", uuid_tag());
    admin
        .create(
            &probe,
            &[],
            &CreateMode::Ephemeral.with_acls(Acls::creator_all()),
        )
        .await
        .unwrap();
    let (acl, _) = admin.get_acl(&probe).await.unwrap();
    // Create, delete, read and admin, but not write: zkguard never needs to overwrite a node.
    let entry = ZkAclEntry::parse(&format!("digest:{}:cdra", acl[0].id())).unwrap();
    let mut settings = zk_settings(&servers, "nowrite");
    settings.auth = Some(ZkAuth::digest(credentials));
    settings.acl = ZkAcl::Explicit(vec![entry]);
    // A root of its own: zkguard gives the root's missing parents the configured ACL, which
    // would keep the other tests (without credentials) out of a shared parent.
    settings.lock_root = format!("/zkguard-test-nowrite-{}", uuid_tag());
    let (c1, c2) = (session(&settings).await, session(&settings).await);
    for _ in 0..2 {
        let g1 = ZkBlockingWriteLock::new("first", &c1, "N1")
            .unwrap()
            .lock_with_timeout()
            .await
            .unwrap();
        let l2 = ZkBlockingWriteLock::new("second", &c2, "N1").unwrap();
        let waiter = tokio::spawn(async move { l2.lock_with_timeout().await });
        let monitor = format!("{}/N1", settings.lock_root);
        // Listed as the same identity: nobody else may read these nodes.
        eventually(
            Duration::from_secs(5),
            "second contender queued",
            || async {
                admin
                    .list_children(&monitor)
                    .await
                    .is_ok_and(|kids| kids.iter().filter(|k| k.starts_with("A-")).count() == 2)
            },
        )
        .await;
        g1.unlock()
            .await
            .expect("a release needs no write permission");
        let g2 = waiter.await.unwrap().unwrap();
        g2.unlock().await.unwrap();
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_queues_again_in_its_release_hands_over_in_four_requests() {
    let per_handoff = requests_per_handoff("requeue", true).await;
    // The holder's multi (release and new queue node), its pipelined child list and its watch
    // on the node ahead; the successor's mutex create. Without the requeueing multi: 5.
    assert!(
        per_handoff < 4.5,
        "{per_handoff} requests per contended hand-off"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_queues_again_in_its_release_goes_behind_its_waiters() {
    let zk = shared();
    let settings = zk_settings(&zk.connect_string(), "requeue-order");
    let monitor = format!("{}/O1", settings.lock_root);
    let (sa, sb) = (session(&settings).await, session(&settings).await);
    let lock = |s: &zkguard::ZkSession, info: &str| {
        ZkBlockingWriteLock::new(info, s, "O1")
            .unwrap()
            .with_timeout(Duration::from_secs(20))
    };
    let (a, b) = (lock(&sa, "a"), lock(&sb, "b"));
    let servers = zk.connect_string();
    let held = held_after_contention(&a, &b, zk, &monitor).await;
    let a_token = held.fencing_token();
    let wb = tokio::spawn({
        let b = b.clone();
        async move { b.lock_with_timeout().await }
    });
    eventually(Duration::from_secs(10), "b waits behind a", || async {
        queued(&servers, &monitor, "A-").await == 2
    })
    .await;
    let a_again = tokio::spawn({
        let a = a.clone();
        async move { a.release_and_lock(held).await }
    });
    let gb = wb.await.unwrap().expect("b takes the lock that a released");
    assert!(gb.fencing_token() > a_token);
    eventually(Duration::from_secs(10), "a queued again", || async {
        queued(&servers, &monitor, "A-").await == 2
    })
    .await;
    assert!(!a_again.is_finished(), "a took the lock while b holds it");
    let b_token = gb.fencing_token();
    gb.unlock().await.unwrap();
    let (release, next) = a_again.await.unwrap();
    release.await.expect("a's release");
    let ga = next.expect("a takes the lock after b");
    assert!(ga.fencing_token() > b_token);
    ga.unlock().await.unwrap();
    assert!(children(&servers, &monitor).await.is_empty());

    // A lock lost meanwhile (its mutex deleted by someone else): the release reports it, the
    // acquisition goes on its own.
    let held = held_after_contention(&a, &b, zk, &monitor).await;
    let admin = zookeeper_client::Client::connect(&servers).await.unwrap();
    admin
        .delete(&format!("{monitor}/privateLock"), None)
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(10), held.lost())
        .await
        .expect("loss reported");
    assert_eq!(reason, LossReason::MutexDeleted);
    let (release, next) = a.release_and_lock(held).await;
    assert!(
        matches!(release.await, Err(LockError::NoNode { .. })),
        "the release of a lost lock reports it"
    );
    next.expect("the acquisition does not depend on the lost lock")
        .unlock()
        .await
        .unwrap();
    assert!(children(&servers, &monitor).await.is_empty());
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn going_from_lock_to_lock_takes_one_request_per_cycle_and_waits_where_the_next_is_busy() {
    let (zk, settings) = counted_server("lock-to-lock");
    let c = session(&settings).await;
    let lock = |m: &str| {
        ZkBlockingWriteLock::new("w", &c, m)
            .unwrap()
            .with_timeout(Duration::from_secs(20))
    };
    let monitors = [lock("L1"), lock("L2"), lock("L3")];
    // Warm up: the root and the monitor nodes.
    for l in &monitors {
        l.lock_with_timeout().await.unwrap().unlock().await.unwrap();
    }
    let cycles = 99;
    let before = zk.packets_received().unwrap();
    let mut held = monitors[0].lock_with_timeout().await.unwrap();
    let mut token = held.fencing_token();
    for i in 1..=cycles {
        let (release, next) = monitors[i % 3].release_and_lock(held).await;
        held = next.unwrap();
        release.await.expect("released with the next acquisition");
        assert!(held.fencing_token() > token);
        token = held.fencing_token();
    }
    held.unlock().await.unwrap();
    let after = zk.packets_received().unwrap();
    let per_cycle = (after - before) as f64 / (cycles + 1) as f64;
    // One multi per cycle: the release of the lock held and the fast path of the next. Released
    // and acquired one after the other: 2.
    assert!(per_cycle < 1.1, "{per_cycle} requests per cycle");

    // The next lock busy: the fast path's part fails, so nothing of the multi was applied; the
    // release goes at once in a second multi with the create of the queue node, and the
    // acquisition waits.
    let other = session(&settings).await;
    let busy = ZkBlockingWriteLock::new("busy", &other, "L2")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    let held = monitors[0].lock_with_timeout().await.unwrap();
    let moving = tokio::spawn({
        let next = monitors[1].clone();
        async move { next.release_and_lock(held).await }
    });
    let l2 = format!("{}/L2", settings.lock_root);
    eventually(Duration::from_secs(10), "queued for L2", || async {
        queued(&zk.connect_string(), &l2, "A-").await == 2
    })
    .await;
    let admin = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    let mut nodes = children(&zk.connect_string(), &l2).await;
    nodes.retain(|n| n.starts_with("A-"));
    nodes.sort();
    let (_, waiting) = admin.get_data(&format!("{l2}/{}", nodes[1])).await.unwrap();
    let (_, l1) = admin
        .get_data(&format!("{}/L1", settings.lock_root))
        .await
        .unwrap();
    assert_eq!(
        waiting.czxid, l1.pzxid,
        "L1's nodes went in the transaction that queued for L2"
    );
    let freed = ZkBlockingWriteLock::new("x", &other, "L1")
        .unwrap()
        .with_timeout(Duration::from_secs(20))
        .lock_with_timeout()
        .await
        .expect("L1 is released while its holder waits for L2");
    assert!(
        !moving.is_finished(),
        "L2 taken while held by another session"
    );
    freed.unlock().await.unwrap();
    busy.unlock().await.unwrap();
    let (release, next) = moving.await.unwrap();
    release.await.unwrap();
    next.expect("L2 once free").unlock().await.unwrap();
}
