//! Request counts: an uncontended cycle, releases, hand-overs, requeueing releases and going
//! from lock to lock, counted on servers of their own.

use super::*;

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
    // Warm up: creates the root and the monitor node. A lock with a timeout, not a try: a try
    // gives up 1 s (`DEADLINE_OVERRUN`) after its zero timeout, which a fresh server's first
    // creates can take on a busy machine.
    ZkBlockingWriteLock::new("w", &c, "R1")
        .unwrap()
        .with_timeout(Duration::from_secs(30))
        .lock_with_timeout()
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
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
    // The holder reads and watches its mutex once it has held it for MUTEX_WATCH_AFTER: done
    // before the count starts (otherwise that read may fall inside it).
    let mutex = format!("{monitor}/privateLock");
    eventually(
        zkguard::zk::MUTEX_WATCH_AFTER + Duration::from_secs(5),
        "the holder watches its mutex",
        || async { watched(&zk, &mutex) },
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

/// A server of its own, so that no other test's requests are counted, and settings for it under
/// the lock root tagged `tag`, with long sessions so that pings are rare.
pub(super) fn counted_server(tag: &str) -> (ZkServer, zkguard::config::ZkSettings) {
    let zk = zk_server();
    let mut settings = zk_settings(&zk.connect_string(), tag);
    settings.session_timeout = Duration::from_secs(30);
    (zk, settings)
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
async fn a_holder_that_queues_again_in_its_release_hands_over_in_three_requests() {
    let per_handoff = requests_per_handoff("requeue", true).await;
    // The holder's multi (release and new queue node) and its watch on the node ahead, which
    // the sequence numbers name without a listing; the successor's mutex create. With a
    // listing: 4; without the requeueing multi: 5.
    assert!(
        per_handoff < 3.5,
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

/// A lock asked for with a later loss watch (`LockRequest::with_loss_watch_after`, as the
/// lanes of background writes and the gate's `_bulk` batches do) does not read and watch its
/// mutex once held for `MUTEX_WATCH_AFTER`: a lock of the same session taken after it with the
/// default watches first. Awaiting `lost()` still starts its watch at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_asked_to_watch_later_does_not_watch_its_mutex_after_the_default_delay() {
    use zkguard::{LockRequest, LockService, ZkLockService};
    let (zk, settings) = counted_server("watchafter");
    let locks = ZkLockService::new(session(&settings).await);
    let late = locks
        .acquire(
            LockRequest::new("batch", "fenced batch")
                .with_type(LockType::Background)
                .with_loss_watch_after(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    let soon = locks
        .acquire(LockRequest::new("single", "one write"))
        .await
        .unwrap();
    let mutex = |monitor: &str| format!("{}/{monitor}/privateLock", settings.lock_root);
    eventually(
        zkguard::zk::MUTEX_WATCH_AFTER + Duration::from_secs(5),
        "the lock taken with the default delay watches its mutex",
        || async { watched(&zk, &mutex("single")) },
    )
    .await;
    // Held longer than `soon`: with the default delay, its read would have gone first, on the
    // same connection, and its watch would be set by now.
    assert!(
        !watched(&zk, &mutex("batch")),
        "the lock asked to watch later watches its mutex after the default delay"
    );
    // Someone waits for its loss: the watch starts at once.
    tokio::select! {
        reason = late.lost() => panic!("the lock was lost: {reason:?}"),
        () = eventually(
            Duration::from_secs(5),
            "the lock watches its mutex once its loss is awaited",
            || async { watched(&zk, &mutex("batch")) },
        ) => {}
    }
    late.release().await.await.unwrap();
    soon.release().await.await.unwrap();
}

/// What "The node ahead without a listing" (`docs/zookeeper-lock.md`) relies on: the server
/// names a sequential child after a counter of its parent that every creation of a child moves,
/// in order, a plain create (`privateLock`) and a create inside a multi included. Its safety
/// needs only that; that it works needs what ZooKeeper 3.8 does besides: a deletion does not
/// move the counter (were it to, a holder that queues again would list the queue instead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_numbers_count_the_creations_of_children() {
    let zk = shared();
    let admin = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    let monitor = "/sequence-count/m";
    create_path(&admin, monitor).await;
    let ephemeral = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
    let sequential = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let queue = format!("{monitor}/A-");
    let mutex = format!("{monitor}/privateLock");
    let (_, first) = admin.create(&queue, b"", &sequential).await.unwrap();
    let first = first.into_i64();
    // A plain create between two sequential ones takes a number.
    admin.create(&mutex, b"", &ephemeral).await.unwrap();
    let (_, second) = admin.create(&queue, b"", &sequential).await.unwrap();
    assert_eq!(
        second.into_i64(),
        first + 2,
        "a plain create takes a number"
    );
    // Deletions take none, alone or in a multi, and a create in a multi takes the next.
    admin.delete(&mutex, None).await.unwrap();
    admin
        .delete(&format!("{monitor}/A-{first:010}"), None)
        .await
        .unwrap();
    let mut multi = admin.new_multi_writer();
    multi
        .add_delete(&format!("{monitor}/A-{:010}", first + 2), None)
        .unwrap();
    multi.add_create(&queue, b"", &sequential).unwrap();
    let results = multi.commit().await.unwrap();
    let Some(zookeeper_client::MultiWriteResult::Create { path, .. }) = results.last() else {
        panic!("a create result last: {results:?}");
    };
    assert_eq!(
        path.as_str(),
        format!("{monitor}/A-{:010}", first + 3),
        "deletions take no number"
    );
}
