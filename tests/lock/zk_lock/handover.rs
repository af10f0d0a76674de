//! Hand-overs within one session: a holder whose next in line is a waiter of its own session
//! passes the lock on in one request; contenders of other sessions that sort first still go
//! first; a hand-over whose answer was lost leaves no ghost.

use super::requests::counted_server;
use super::*;

/// Waits until `n` acquisitions of `session` wait where a holder of the session can hand them
/// the lock.
async fn handover_points(session: &zkguard::ZkSession, n: usize) {
    eventually(
        Duration::from_secs(10),
        &format!("{n} waiters of the session wait at a hand-over point"),
        || async { session.waiting_for_hand_over() == n },
    )
    .await;
}

/// A chain of 20 foreground waiters of the holder's session, each queued behind the one
/// before: every hand-over is one request (the holder's release multi carrying the next
/// holder's take), the lock goes in queue order, tokens increase, and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_of_the_same_session_is_handed_the_lock_in_one_request() {
    let (zk, settings) = counted_server("handover");
    let s = session(&settings).await;
    let monitor = format!("{}/H1", settings.lock_root);
    let lock = ZkBlockingWriteLock::new("w", &s, "H1")
        .unwrap()
        .with_timeout(Duration::from_secs(30));
    // Warm up: creates the root and the monitor node.
    lock.try_lock().await.unwrap().unlock().await.unwrap();
    let holder = lock.lock_with_timeout().await.unwrap();
    let first_token = holder.fencing_token();
    let order = Arc::new(Mutex::new(Vec::new()));
    let waiters = 20usize;
    let mut tasks = Vec::new();
    for i in 0..waiters {
        let (lock, order) = (lock.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = lock.lock_with_timeout().await.unwrap();
            order.lock().unwrap().push((i, g.fencing_token()));
            g.unlock().await.unwrap();
        }));
        // Each queues behind the one before, and waits at its hand-over point.
        handover_points(&s, i + 1).await;
    }
    assert_eq!(
        queued(&zk.connect_string(), &monitor, "A-").await,
        waiters + 1
    );
    let before = zk.packets_received().unwrap();
    holder.unlock().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let after = zk.packets_received().unwrap();
    let order = order.lock().unwrap().clone();
    let turns: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(turns, (0..waiters).collect::<Vec<_>>(), "queue order");
    let mut token = first_token;
    for (i, t) in &order {
        assert!(*t > token, "waiter {i}'s token {t} after {token}");
        token = *t;
    }
    // 20 hand-overs and the last release: 21 requests (a handful more for pings and the
    // mntr connection). Released and taken on their own, they were 41.
    let requests = after - before;
    assert!(
        requests <= waiters as u64 + 4,
        "{requests} requests for {waiters} hand-overs and a release"
    );
    eventually(Duration::from_secs(5), "nothing left behind", || async {
        children(&zk.connect_string(), &monitor).await.is_empty()
    })
    .await;
}

/// Priority across sessions: a contender of another session queued ahead of the holder's own
/// waiter goes first (the waiter waits for that contender's node, not for the holder's), and a
/// foreground contender of another session that queued after a background waiter of the
/// holder's session goes before it (a background waiter is never handed the lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contenders_of_other_sessions_that_sort_first_go_first() {
    let zk = shared();
    let settings = zk_settings(&zk.connect_string(), "handover-priority");
    let (s1, s2) = (session(&settings).await, session(&settings).await);
    let monitor = format!("{}/P1", settings.lock_root);
    let lock = |s: &zkguard::ZkSession, t: LockType| {
        ZkBlockingWriteLock::new("w", s, "P1")
            .unwrap()
            .with_type(t)
            .with_timeout(Duration::from_secs(30))
    };
    let order = Arc::new(Mutex::new(Vec::new()));
    let servers = zk.connect_string();

    // Holder (s1), another session's contender (s2), then the holder's own waiter (s1).
    let holder = lock(&s1, LockType::Foreground)
        .lock_with_timeout()
        .await
        .unwrap();
    let other = take_turn(lock(&s2, LockType::Foreground), &order, "other");
    eventually(
        Duration::from_secs(10),
        "the other session queues",
        || async { queued(&servers, &monitor, "A-").await == 2 },
    )
    .await;
    let own = take_turn(lock(&s1, LockType::Foreground), &order, "own");
    handover_points(&s1, 1).await;
    holder.unlock().await.unwrap();
    other.await.unwrap();
    own.await.unwrap();
    assert_eq!(*order.lock().unwrap(), vec!["other", "own"]);

    // A background holder and a background waiter of s1; a foreground contender of s2 queues
    // after the waiter's listing and sorts ahead of it.
    order.lock().unwrap().clear();
    let holder = lock(&s1, LockType::Background)
        .lock_with_timeout()
        .await
        .unwrap();
    let own = take_turn(lock(&s1, LockType::Background), &order, "own");
    eventually(
        Duration::from_secs(10),
        "the background waiter queues",
        || async { queued(&servers, &monitor, "B-").await == 2 },
    )
    .await;
    let other = take_turn(lock(&s2, LockType::Foreground), &order, "other");
    eventually(
        Duration::from_secs(10),
        "the foreground contender waits for the mutex",
        || async { watched(zk, &format!("{monitor}/privateLock")) },
    )
    .await;
    assert_eq!(s1.waiting_for_hand_over(), 0, "a background waiter");
    holder.unlock().await.unwrap();
    other.await.unwrap();
    own.await.unwrap();
    assert_eq!(*order.lock().unwrap(), vec!["other", "own"]);
}

/// A hand-over whose multi the server applied and whose answer was lost: the waiter finds its
/// take by attempt id and holds the lock, with a larger token; the holder's careful release
/// leaves the waiter's mutex alone; no node is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_whose_answer_was_lost_leaves_the_waiter_holding_and_no_ghost() {
    let zk = shared();
    let proxy = ZkProxy::start(&zk.connect_string());
    let settings = zk_settings(&proxy.connect_string(), "handover-cut");
    let servers = zk.connect_string();
    let monitor = format!("{}/L1", settings.lock_root);
    let s = session(&settings).await;
    let lock = ZkBlockingWriteLock::new("w", &s, "L1")
        .unwrap()
        .with_timeout(Duration::from_secs(30));
    let holder = lock.lock_with_timeout().await.unwrap();
    let token = holder.fencing_token();
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.lock_with_timeout().await }
    });
    handover_points(&s, 1).await;
    // The hand-over multi reaches the server, which applies it; its answer is lost.
    let sent_before = proxy.requests().len();
    proxy.cut_after(OP_MULTI);
    let release = holder.release();
    let held = waiter.await.unwrap().expect("the waiter holds the lock");
    assert!(held.fencing_token() > token);
    assert_eq!(proxy.cuts(), 1);
    release
        .await
        .expect("the careful release finds its nodes gone with the applied multi");
    assert!(held.is_held());
    // One multi in all: the release that carried the waiter's take (released on its own, the
    // waiter would have sent a take of its own); the waiter found its take by reading.
    let multis = proxy.requests()[sent_before..]
        .iter()
        .filter(|&&op| op == OP_MULTI)
        .count();
    assert_eq!(multis, 1, "{:?}", &proxy.requests()[sent_before..]);
    let kids = children(&servers, &monitor).await;
    assert_eq!(
        kids.len(),
        2,
        "the waiter's node and mutex, no ghost: {kids:?}"
    );
    held.unlock().await.unwrap();
    eventually(Duration::from_secs(5), "nothing left behind", || async {
        children(&servers, &monitor).await.is_empty()
    })
    .await;
}
