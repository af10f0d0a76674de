//! The ZooKeeper priority lock under lost answers and cancellations at the worst moment: each
//! test pins down one interleaving in which a clean-up of this session's own nodes could remove
//! a node that is no longer the one it meant (the next acquisition's queue node of the same
//! name, the rightful successor's mutex).

use crate::common;

use std::sync::OnceLock;
use std::time::Duration;

use crate::logs::init_tracing;
use crate::queue::queued;
use common::*;
use zkguard::config::ZkSettings;
use zkguard::lock::Release;
use zkguard::testkit::proxy::{
    ZkProxy, CONNECTED, OP_CREATE2, OP_DELETE, OP_GET_CHILDREN, OP_GET_CHILDREN2, OP_GET_DATA,
    OP_MULTI, OP_MULTI_READ, OP_PING, OP_REMOVE_WATCHES, OP_SYNC,
};
use zkguard::testkit::ZkServer;
use zkguard::zk::list_locks;
use zkguard::zk::LockGuard;
use zkguard::{LockType, ZkBlockingWriteLock, ZkSession};
use zookeeper_client::{Acls, CreateMode};

/// One server shared by the tests of this file (each uses its own lock root).
fn shared() -> &'static ZkServer {
    static SERVER: OnceLock<ZkServer> = OnceLock::new();
    SERVER.get_or_init(zk_server)
}

fn watched(zk: &ZkServer, path: &str) -> bool {
    zk.four_letter("wchp")
        .unwrap()
        .lines()
        .any(|l| l.trim() == path)
}

/// The requests relayed since `before`, and the first two the session sent once it reconnected
/// (pings and notifications left out).
fn first_after_reconnecting(proxy: &ZkProxy, before: usize) -> (Vec<i32>, Vec<i32>) {
    let log = proxy.requests()[before..].to_vec();
    let reconnected = log
        .iter()
        .position(|&op| op == CONNECTED)
        .expect("the session reconnected");
    let first = log[reconnected + 1..]
        .iter()
        .copied()
        .filter(|&op| op != OP_PING && op < 100)
        .take(2)
        .collect();
    (log, first)
}

/// Node data as another zkguard process would write it.
fn foreign_node_data(lock_type: &str, attempt: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "info": "elsewhere", "owner": "other-host:1:0000abcd", "attempt": attempt,
        "host": "other-host", "pid": 1, "type": lock_type, "created_ms": 0
    }))
    .unwrap()
}

/// A lone holder's release is applied by the server and its answer lost with the connection;
/// while the session is disconnected, the same session's next acquisition of the monitor queues
/// behind the release's careful clean-up. The fast path recreates the empty monitor, so the new
/// queue node has the released one's name (`A-0000000000`): the clean-up must not take it for
/// the released one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_answer_was_lost_leaves_the_next_acquisitions_node_of_the_same_name() {
    init_tracing();
    let zk = shared();
    let direct = zk.connect_string();
    let proxy = ZkProxy::start(&direct);
    let mut settings = zk_settings(&proxy.connect_string(), "stale-release");
    settings.session_timeout = Duration::from_secs(20);
    let monitor = format!("{}/S1", settings.lock_root);
    let s = session(&settings).await;
    let lock = ZkBlockingWriteLock::new("w", &s, "S1")
        .unwrap()
        .with_timeout(Duration::from_secs(30));
    let first = lock.lock_with_timeout().await.unwrap();
    let names = children(&direct, &monitor).await;
    assert_eq!(names, ["A-0000000000", "privateLock"], "taken alone");

    // The release multi is applied; its answer is lost with the connection, and the proxy
    // refuses reconnections for now.
    proxy.cut_after_and_block(OP_MULTI);
    let release = first.release();
    eventually(
        Duration::from_secs(10),
        "the release applied and its answer cut",
        || async { proxy.cuts() == 1 && children(&direct, &monitor).await.is_empty() },
    )
    .await;
    // The next acquisition goes out while disconnected (queued in the session, in order).
    let mut next = Box::pin({
        let lock = lock.clone();
        async move { lock.lock_with_timeout().await }
    });
    assert!(futures::poll!(next.as_mut()).is_pending());
    let next = tokio::spawn(next);
    proxy.unblock();
    let second = next
        .await
        .unwrap()
        .expect("the next acquisition takes the lock");
    release
        .await
        .expect("the release had been applied before its answer was lost");

    let names = children(&direct, &monitor).await;
    assert_eq!(
        names,
        ["A-0000000000", "privateLock"],
        "the new holder keeps its queue node"
    );
    let mut viewer_settings = settings.clone();
    viewer_settings.servers = direct.clone();
    let viewer = session(&viewer_settings).await;
    let view = list_locks(&viewer, Some("S1")).await.unwrap();
    assert!(
        !view[0].stray,
        "a live holder is not shown as stray: {view:?}"
    );
    assert!(view[0].holder.is_some(), "{view:?}");
    assert!(second.is_held());
    second
        .unlock()
        .await
        .expect("the new holder releases its own nodes");
    assert!(children(&direct, &monitor).await.is_empty());
}

/// A background contender takes the mutex, finds a foreground contender ahead of it and gives
/// the mutex back; the give-back is applied but its answer has not arrived when the contender
/// is cancelled. Meanwhile the rightful successor took the mutex: the cancelled contender's
/// clean-up must leave that mutex alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_cancelled_while_giving_the_mutex_back_leaves_the_successors_mutex() {
    init_tracing();
    let zk = shared();
    let direct = zk.connect_string();
    let proxy = ZkProxy::start(&direct);
    let mut settings = zk_settings(&proxy.connect_string(), "giveback");
    settings.session_timeout = Duration::from_secs(20);
    let mut direct_settings = settings.clone();
    direct_settings.servers = direct.clone();
    let monitor = format!("{}/R1", settings.lock_root);
    let mutex = format!("{monitor}/privateLock");

    let sh = session(&direct_settings).await;
    let holder = ZkBlockingWriteLock::new("h", &sh, "R1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    let sc = session(&settings).await;
    let contender = ZkBlockingWriteLock::new("c", &sc, "R1")
        .unwrap()
        .with_type(LockType::Background)
        .with_timeout(Duration::from_secs(30));
    let waiting = tokio::spawn(async move { contender.lock_with_timeout().await });
    let head = format!("{monitor}/A-0000000000");
    eventually(
        Duration::from_secs(10),
        "the background contender watches the holder's node",
        || async { queued(&direct, &monitor, "B-").await == 1 && watched(zk, &head) },
    )
    .await;
    // A foreground contender of another process queues ahead of it, unseen by it.
    let admin = zookeeper_client::Client::connect(&direct).await.unwrap();
    admin
        .create(
            &format!("{monitor}/A-"),
            &foreign_node_data("foreground", "successor"),
            &CreateMode::EphemeralSequential.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();

    // The holder leaves: the contender takes the mutex (a multi), sees the foreground node ahead
    // and gives the mutex back (a multi that checks the monitor's version and deletes it). The
    // server applies the give-back; its answer is held.
    proxy.hold_after_skipping(OP_MULTI, 1);
    holder.unlock().await.unwrap();
    eventually(
        Duration::from_secs(10),
        "the mutex was given back, the answer held",
        || async {
            proxy.holds() == 1
                && !children(&direct, &monitor)
                    .await
                    .contains(&"privateLock".to_string())
        },
    )
    .await;
    // The successor takes the mutex.
    admin
        .create(
            &mutex,
            &foreign_node_data("foreground", "successor"),
            &CreateMode::Ephemeral.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    // The contender is cancelled before the give-back's answer arrives.
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    proxy.release_held();
    eventually(
        Duration::from_secs(10),
        "the cancelled contender's queue node is removed",
        || async { queued(&direct, &monitor, "B-").await == 0 },
    )
    .await;
    // The clean-up deletes the mutex (if at all) before or with the queue node: decided by now.
    let (_, stat) = admin
        .get_data(&mutex)
        .await
        .expect("the successor's mutex is still there");
    assert_eq!(stat.ephemeral_owner, admin.session_id().0);
}

/// After a create whose answer was lost, the contender looks for what it made by attempt id;
/// on an ensemble the server it reconnected to may lag behind the leader and apply the create
/// only after a plain read (then the read misses the node, and a second one is queued while
/// the first stays as a ghost). So the search is ordered behind a `sync`, which that server
/// answers only once it has caught up with the leader: the first request of the search after
/// the reconnection is the sync, with the read right behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_search_for_a_create_whose_answer_was_lost_reads_after_a_sync() {
    init_tracing();
    let zk = shared();
    let direct = zk.connect_string();
    let proxy = ZkProxy::start(&direct);
    let settings = zk_settings(&proxy.connect_string(), "sync-search");
    let monitor = format!("{}/Y1", settings.lock_root);
    let s = session(&settings).await;
    let lock = ZkBlockingWriteLock::new("w", &s, "Y1").unwrap();
    // Warm up the root and the monitor node.
    lock.lock_with_timeout()
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    // The fast path's multi is applied; its answer is lost with the connection.
    let before = proxy.requests().len();
    proxy.cut_after(OP_MULTI);
    let g = lock.lock_with_timeout().await.unwrap();
    assert_eq!(proxy.cuts(), 1);
    let (log, search) = first_after_reconnecting(&proxy, before);
    assert_eq!(
        search,
        [OP_SYNC, OP_GET_CHILDREN2],
        "the search reads the queue behind a sync (all requests since the multi: {log:?})"
    );
    assert_eq!(queued(&direct, &monitor, "A-").await, 1, "no ghost");
    g.unlock().await.unwrap();
}

/// A release whose answer was lost goes on with careful deletes: each node is read, and deleted
/// only if still ours, by its version. On an ensemble the server the session reconnected to may
/// not have applied the release yet; its read would show the mutex as still ours while the next
/// holder has taken it again (at version 0), and the delete, applied by the leader, would remove
/// the new holder's mutex. So the careful reads go behind a `sync` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_careful_deletes_after_a_lost_release_read_after_a_sync() {
    init_tracing();
    let zk = shared();
    let direct = zk.connect_string();
    let proxy = ZkProxy::start(&direct);
    let settings = zk_settings(&proxy.connect_string(), "sync-careful");
    let monitor = format!("{}/Z1", settings.lock_root);
    let s = session(&settings).await;
    let g = ZkBlockingWriteLock::new("w", &s, "Z1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    // The release multi is applied; its answer is lost with the connection.
    let before = proxy.requests().len();
    proxy.cut_after(OP_MULTI);
    g.unlock().await.unwrap();
    assert_eq!(proxy.cuts(), 1);
    let (log, careful) = first_after_reconnecting(&proxy, before);
    assert_eq!(
        careful,
        [OP_SYNC, OP_GET_DATA],
        "the careful deletes read behind a sync (all requests since the release: {log:?})"
    );
    assert!(children(&direct, &monitor).await.is_empty(), "nothing left");
    s.close();
}

/// A holder that has not watched its mutex yet (a short hold) does not know that someone
/// deleted it and that the next in line took the lock. Its release must not delete the new
/// holder's mutex: the release is conditional on the monitor's data version, which every take
/// of the mutex moves in the same transaction, so it fails and leaves the lock alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_an_unseen_loss_leaves_the_next_holders_mutex() {
    init_tracing();
    let zk = shared();
    let direct = zk.connect_string();
    let proxy = ZkProxy::start(&direct);
    let mut settings = zk_settings(&proxy.connect_string(), "unseen-loss");
    settings.session_timeout = Duration::from_secs(20);
    let mut direct_settings = settings.clone();
    direct_settings.servers = direct.clone();
    let monitor = format!("{}/U1", settings.lock_root);
    let mutex = format!("{monitor}/privateLock");

    let sh = session(&settings).await;
    // From the holder's first read of its mutex on (its watch, 100 ms after it took the lock),
    // it hears nothing: whatever happens to the mutex stays unseen until after its release
    // went out. Armed before the acquisition (which reads no node's data), so that a busy
    // machine that delays this test past the watch's start cannot let the read through.
    proxy.hold_after(OP_GET_DATA);
    let holder = ZkBlockingWriteLock::new("h", &sh, "U1")
        .unwrap()
        .with_type(LockType::Background)
        .lock_with_timeout()
        .await
        .unwrap();
    let sf = session(&direct_settings).await;
    let foreground = ZkBlockingWriteLock::new("f", &sf, "U1")
        .unwrap()
        .with_timeout(Duration::from_secs(30));
    let next = tokio::spawn(async move { foreground.lock_with_timeout().await });
    eventually(
        Duration::from_secs(10),
        "the foreground contender is first in line, waiting for the mutex",
        || async { queued(&direct, &monitor, "A-").await == 1 && watched(zk, &mutex) },
    )
    .await;
    let admin = zookeeper_client::Client::connect(&direct).await.unwrap();
    admin.delete(&mutex, None).await.unwrap();
    let next = next
        .await
        .unwrap()
        .expect("the next in line takes the free mutex");
    let release = holder.release();
    proxy.release_held();
    let outcome = release.await;
    assert!(
        matches!(outcome, Err(zkguard::LockError::NoNode { .. })),
        "the holder learns that its lock was gone: {outcome:?}"
    );
    let (_, stat) = admin
        .get_data(&mutex)
        .await
        .expect("the next holder's mutex is still there");
    assert_eq!(Some(stat.ephemeral_owner), sf.session_id());
    assert!(next.is_held());
    assert_eq!(
        queued(&direct, &monitor, "B-").await,
        0,
        "the holder's queue node went"
    );
    next.unlock().await.unwrap();
}

/// A holder's release multi never reaches the server (the connection is cut before it): the
/// release goes on with careful deletes, which read the mutex (still its own, version 0) and
/// delete it by that version. Between the read and the delete, an operator deletes the mutex and
/// the foreground contender first in line takes the lock: its mutex is version 0 too. The
/// careful delete checks the monitor's data version, read with the mutex and moved by every
/// take, in the same multi: it fails and leaves the new holder's mutex (issue 53's
/// counterexample of the model check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_careful_release_leaves_the_mutex_an_operator_freed_for_the_next_holder() {
    init_tracing();
    let CarefulCase {
        direct,
        proxy,
        direct_settings,
        monitor,
        mutex,
        holder,
        _session,
    } = careful_case("O1", "careful-operator").await;
    let sf = session(&direct_settings).await;
    let foreground = ZkBlockingWriteLock::new("f", &sf, "O1")
        .unwrap()
        .with_timeout(Duration::from_secs(30));
    let next = tokio::spawn(async move { foreground.lock_with_timeout().await });
    eventually(
        Duration::from_secs(10),
        "the foreground contender is first in line, waiting for the mutex",
        || async { queued(&direct, &monitor, "A-").await == 1 },
    )
    .await;
    let release = release_with_careful_reads_held(&proxy, holder).await;
    let admin = zookeeper_client::Client::connect(&direct).await.unwrap();
    admin.delete(&mutex, None).await.unwrap();
    let next = next
        .await
        .unwrap()
        .expect("the next in line takes the free mutex");
    the_release_leaves_the_next_holders_mutex(&proxy, release, &admin, &mutex, &sf, &next).await;
    eventually(
        Duration::from_secs(10),
        "the holder's queue node went",
        || async { queued(&direct, &monitor, "B-").await == 0 },
    )
    .await;
    next.unlock().await.unwrap();
}

/// As above, and the operator deletes the holder's queue node with its mutex: the monitor,
/// empty, is deleted and created again by the next contender's fast path (as the container
/// reaper would delete it), whose take sets the new monitor's data to version 1, the version the
/// holder's take left on the old one. The careful delete, checked against the monitor's version
/// alone, removed the new holder's mutex (issue 53's last counterexample of the model check,
/// `a_careful_delete_after_the_monitor_was_created_again_leaves_the_next_holders_mutex`). It
/// checks the lock root's version as well, read first, which every creation of a monitor moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_careful_release_leaves_the_mutex_of_a_monitor_created_again_meanwhile() {
    init_tracing();
    let CarefulCase {
        direct,
        proxy,
        direct_settings,
        monitor,
        mutex,
        holder,
        _session,
    } = careful_case("R1", "careful-recreated").await;
    let admin = zookeeper_client::Client::connect(&direct).await.unwrap();
    let (_, taken) = admin.get_data(&monitor).await.unwrap();
    let release = release_with_careful_reads_held(&proxy, holder).await;
    let (nodes, _) = admin.get_children(&monitor).await.unwrap();
    for node in nodes {
        admin
            .delete(&format!("{monitor}/{node}"), None)
            .await
            .unwrap();
    }
    let sf = session(&direct_settings).await;
    let next = ZkBlockingWriteLock::new("f", &sf, "R1")
        .unwrap()
        .with_timeout(Duration::from_secs(30))
        .lock_with_timeout()
        .await
        .expect("the next contender takes the emptied lock");
    let (_, recreated) = admin.get_data(&monitor).await.unwrap();
    assert_ne!(
        recreated.czxid, taken.czxid,
        "the monitor was created again"
    );
    assert_eq!(
        recreated.version, taken.version,
        "the new monitor's data version starts over"
    );
    the_release_leaves_the_next_holders_mutex(&proxy, release, &admin, &mutex, &sf, &next).await;
    assert_eq!(queued(&direct, &monitor, "A-").await, 1);
    next.unlock().await.unwrap();
}

/// A starving background waiter is re-queued as foreground: its new node is created (the answer
/// held) when the waiter is cancelled. Its clean-up removes both its old background node and the
/// new one; before, the reaper checked the old node against the new attempt id and left it in
/// the queue for the rest of the session, where later background contenders waited behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cancelled_while_promoted_leaves_neither_of_its_nodes() {
    init_tracing();
    let zk = shared();
    let direct = zk.connect_string();
    let proxy = ZkProxy::start(&direct);
    let mut settings = zk_settings(&proxy.connect_string(), "promotecancel");
    settings.session_timeout = Duration::from_secs(20);
    settings.background_max_wait = Some(Duration::from_millis(500));
    let mut direct_settings = settings.clone();
    direct_settings.servers = direct.clone();
    let monitor = format!("{}/P1", settings.lock_root);

    let sh = session(&direct_settings).await;
    let holder = ZkBlockingWriteLock::new("h", &sh, "P1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    let sc = session(&settings).await;
    let contender = ZkBlockingWriteLock::new("c", &sc, "P1")
        .unwrap()
        .with_type(LockType::Background)
        .with_timeout(Duration::from_secs(30));
    let waiting = tokio::spawn(async move { contender.lock_with_timeout().await });
    eventually(
        Duration::from_secs(10),
        "the background contender queued",
        || async { queued(&direct, &monitor, "B-").await == 1 },
    )
    .await;
    // From the next create on (the promotion's, once it waited 500 ms), answers are held.
    proxy.hold_after(OP_CREATE2);
    eventually(
        Duration::from_secs(10),
        "the promotion's node created, its answer held",
        || async { proxy.holds() == 1 && queued(&direct, &monitor, "A-").await == 2 },
    )
    .await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    proxy.release_held();
    eventually(
        Duration::from_secs(10),
        "the cancelled waiter's nodes are gone",
        || async {
            queued(&direct, &monitor, "B-").await == 0 && queued(&direct, &monitor, "A-").await == 1
        },
    )
    .await;
    holder.unlock().await.unwrap();
    sc.close();
    sh.close();
}

/// `LockService::release_all` releases the locks of one session in one multi, sent before it
/// returns: the session's next request finds every monitor free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_released_together_go_in_one_multi() {
    use zkguard::{LockRequest, LockService, ZkLockService};
    init_tracing();
    let zk = shared();
    let proxy = ZkProxy::start(&zk.connect_string());
    let settings = zk_settings(&proxy.connect_string(), "together");
    let locks = ZkLockService::new(session(&settings).await);
    // Held past MUTEX_WATCH_AFTER on a slow machine, a lock would read its mutex to watch it,
    // maybe inside the count: these watch later, so only the release is counted.
    let request = |i: usize| {
        LockRequest::new(format!("doc-{i}"), "together")
            .with_loss_watch_after(Duration::from_secs(3600))
    };
    let mut held = Vec::new();
    for i in 0..12 {
        held.push(locks.acquire(request(i)).await.unwrap());
    }
    let before = proxy.requests().len();
    locks.release_all(held).await.await.unwrap();
    let sent: Vec<i32> = proxy.sent_since(before);
    assert_eq!(sent, [OP_MULTI], "one multi released the twelve locks");
    // Taken again and released together without waiting: the same session's next requests,
    // try-once acquisitions, go out behind the release and find every monitor free.
    let mut held = Vec::new();
    for i in 0..12 {
        held.push(locks.acquire(request(i)).await.unwrap());
    }
    let release = locks.release_all(held).await;
    for i in 0..12 {
        let g = locks
            .acquire(LockRequest::new(format!("doc-{i}"), "after").with_timeout(Duration::ZERO))
            .await
            .unwrap_or_else(|e| panic!("doc-{i} is still held: {e}"));
        g.unlock().await.unwrap();
    }
    release.await.unwrap();
}

/// A lock lost among those released together (its mutex deleted by someone else): the multi
/// cannot be applied, so each lock is released on its own; the others end released, the lost
/// one reports `NoNode`, and no node of this session is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_among_those_released_together_leaves_the_others_released() {
    use zkguard::{LockError, LockRequest, LockService, ZkLockService};
    init_tracing();
    let zk = shared();
    let direct = zk.connect_string();
    let settings = zk_settings(&direct, "together-lost");
    let locks = ZkLockService::new(session(&settings).await);
    let mut held = Vec::new();
    for i in 0..4 {
        held.push(
            locks
                .acquire(LockRequest::new(format!("m{i}"), "together"))
                .await
                .unwrap(),
        );
    }
    let admin = zookeeper_client::Client::connect(&direct).await.unwrap();
    admin
        .delete(&format!("{}/m2/privateLock", settings.lock_root), None)
        .await
        .unwrap();
    let outcome = locks.release_all(held).await.await;
    assert!(
        matches!(outcome, Err(LockError::NoNode { .. })),
        "the lost lock is reported: {outcome:?}"
    );
    for i in 0..4 {
        let monitor = format!("{}/m{i}", settings.lock_root);
        eventually(Duration::from_secs(10), "the monitor is empty", || {
            let (direct, monitor) = (direct.clone(), monitor.clone());
            async move { children(&direct, &monitor).await.is_empty() }
        })
        .await;
    }
}

/// Bulk acquisition: a session's acquisitions of many quiet monitors, asked for at once, go to
/// ZooKeeper in a few multis instead of one each; the locks of one multi share its token. A
/// monitor held by another session fails its part of a multi: that acquisition queues as if it
/// had gone alone (and gets the lock once it is released), the others go again together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_asked_for_together_share_multis_and_a_busy_monitor_queues_alone() {
    use std::collections::{HashMap, HashSet};
    use std::sync::Arc;
    use zkguard::{LockRequest, LockService, ZkLockService};
    init_tracing();
    let zk = shared();
    let direct = zk.connect_string();
    let proxy = ZkProxy::start(&direct);
    let settings = zk_settings(&proxy.connect_string(), "bulk");
    let locks = Arc::new(ZkLockService::new(session(&settings).await));
    let mut elsewhere = settings.clone();
    elsewhere.servers = direct.clone();
    let other = ZkLockService::new(session(&elsewhere).await);
    let busy = other
        .acquire(LockRequest::new("doc-7", "elsewhere"))
        .await
        .unwrap();
    let before = proxy.requests().len();
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let locks = locks.clone();
            tokio::spawn(async move {
                let request = LockRequest::new(format!("doc-{i}"), "bulk job")
                    .with_type(LockType::Background);
                locks.acquire(request).await
            })
        })
        .collect();
    // Every quiet monitor is taken while doc-7 is still held.
    let queued = format!("{}/doc-7", settings.lock_root);
    eventually(Duration::from_secs(10), "doc-7 has a queue node", || {
        let (direct, queued) = (direct.clone(), queued.clone());
        async move { children(&direct, &queued).await.len() == 3 }
    })
    .await;
    let mut held = HashMap::new();
    let mut waiting = None;
    for (i, task) in tasks.into_iter().enumerate() {
        if i == 7 {
            waiting = Some(task);
            continue;
        }
        let guard = task.await.unwrap().unwrap();
        held.insert(guard.monitor().to_string(), guard);
    }
    let sent: Vec<i32> = proxy.sent_since(before);
    let multis = sent.iter().filter(|&&op| op == OP_MULTI).count();
    assert!(
        multis <= 12,
        "64 acquisitions asked for at once went in {multis} multis: {sent:?}"
    );
    // The monitors a multi's session has not seen are read before it in one request, not
    // one read each: at most one multi of reads per multi (the queued doc-7 lists its monitor
    // once more, plainly).
    let reads = sent
        .iter()
        .filter(|&&op| op == OP_GET_CHILDREN || op == OP_MULTI_READ)
        .count();
    assert!(
        reads <= multis + 2,
        "{reads} reads of monitors for {multis} multis: {sent:?}"
    );
    let tokens: HashSet<u64> = held.values().map(|g| g.fencing_token()).collect();
    assert!(
        tokens.len() < held.len(),
        "locks taken by one multi share its token: {} tokens for {} locks",
        tokens.len(),
        held.len()
    );
    // The busy monitor's acquisition queued behind the holder and gets the lock from it.
    busy.unlock().await.unwrap();
    let late = waiting.unwrap().await.unwrap().unwrap();
    // Granted after every lock of the bulk's multis: a higher token than all of them.
    assert!(late.fencing_token() > tokens.iter().copied().max().unwrap());
    held.insert(late.monitor().to_string(), late);
    assert_eq!(held.len(), 64);
    // Each monitor holds exactly its holder's queue node and the mutex.
    for i in [0, 7, 63] {
        let monitor = format!("{}/doc-{i}", settings.lock_root);
        let nodes = children(&direct, &monitor).await;
        assert_eq!(nodes.len(), 2, "{monitor}: {nodes:?}");
    }
    locks
        .release_all(held.into_values().collect())
        .await
        .await
        .unwrap();
    for i in 0..64 {
        let monitor = format!("{}/doc-{i}", settings.lock_root);
        assert!(children(&direct, &monitor).await.is_empty(), "{monitor}");
    }
}

/// Acquisitions dropped while their fast paths wait for, or ride in, a shared multi leave
/// nothing behind: what a multi made for an acquisition that went away is searched for and
/// removed once its answer is in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_dropped_while_their_multi_is_on_its_way_leave_nothing() {
    use std::sync::Arc;
    use zkguard::{LockRequest, LockService, ZkLockService};
    init_tracing();
    let zk = shared();
    let direct = zk.connect_string();
    let settings = zk_settings(&direct, "bulk-dropped");
    let locks = Arc::new(ZkLockService::new(session(&settings).await));
    for round in 0..5 {
        let tasks: Vec<_> = (0..40)
            .map(|i| {
                let locks = locks.clone();
                tokio::spawn(async move {
                    let guard = locks
                        .acquire(LockRequest::new(format!("doc-{i}"), "dropped"))
                        .await?;
                    guard.unlock().await
                })
            })
            .collect();
        // Abort them at different moments: before they are sent, while their multi is on
        // its way, after it was applied.
        for (i, task) in tasks.iter().enumerate() {
            if (i + round) % 3 == 0 {
                task.abort();
            }
            if i % 10 == 0 {
                tokio::task::yield_now().await;
            }
        }
        for task in tasks {
            match task.await {
                Ok(outcome) => outcome.unwrap(),
                Err(e) => assert!(e.is_cancelled(), "{e}"),
            }
        }
    }
    for i in 0..40 {
        let monitor = format!("{}/doc-{i}", settings.lock_root);
        eventually(Duration::from_secs(10), "the monitor is empty", || {
            let (direct, monitor) = (direct.clone(), monitor.clone());
            async move { children(&direct, &monitor).await.is_empty() }
        })
        .await;
    }
    // And the session can take every one of them again at once.
    let guards = futures::future::join_all((0..40).map(|i| {
        let locks = locks.clone();
        async move {
            locks
                .acquire(LockRequest::new(format!("doc-{i}"), "again").with_timeout(Duration::ZERO))
                .await
                .unwrap()
        }
    }))
    .await;
    locks.release_all(guards).await.await.unwrap();
}

/// Monitors a session saw go in its multis unread; once they are gone (the container reaper
/// removes empty monitors), the first failed multi has the others read again, so the bulk
/// still goes in a few multis rather than in one failed multi per monitor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitors_reaped_since_the_session_saw_them_are_read_again_not_failed_one_by_one() {
    use std::sync::Arc;
    use zkguard::{LockRequest, LockService, ZkLockService};
    init_tracing();
    let zk = shared();
    let direct = zk.connect_string();
    let proxy = ZkProxy::start(&direct);
    let settings = zk_settings(&proxy.connect_string(), "bulk-reaped");
    let locks = Arc::new(ZkLockService::new(session(&settings).await));
    let take_all = |tag: &'static str| {
        let locks = locks.clone();
        async move {
            futures::future::join_all((0..64).map(|i| {
                let locks = locks.clone();
                async move {
                    locks
                        .acquire(LockRequest::new(format!("doc-{i}"), tag))
                        .await
                        .unwrap()
                }
            }))
            .await
        }
    };
    let held = take_all("first").await;
    locks.release_all(held).await.await.unwrap();
    // What the container reaper does to empty monitors, all at once.
    let admin = zookeeper_client::Client::connect(&direct).await.unwrap();
    for i in 0..64 {
        let monitor = format!("{}/doc-{i}", settings.lock_root);
        admin.delete(&monitor, None).await.unwrap();
    }
    let before = proxy.requests().len();
    let held = take_all("again").await;
    let multis = proxy.requests()[before..]
        .iter()
        .filter(|&&op| op == OP_MULTI)
        .count();
    // How many multis depends on how the acquisitions meet the multis in flight (up to four
    // at a time), which the machine's load moves (at most 12 alone, 16 beside another test
    // binary); one failed multi per reaped monitor would be 64 or more.
    assert!(
        multis <= 32,
        "64 acquisitions of reaped monitors went in {multis} multis"
    );
    locks.release_all(held).await.await.unwrap();
}

/// A lock released while its holder's read of the mutex (which sets the mutex watch, once the
/// lock was held for `MUTEX_WATCH_AFTER`) is on its way: the watch that read sets is kept until
/// the release's deletion fires it. Dropped with the read, the client removed it with a request
/// of its own (seen in a full suite run: a release of twelve locks sent a multi and a
/// `removeWatches`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_while_the_mutex_watch_is_being_set_sends_no_request_to_remove_it() {
    init_tracing();
    let zk = shared();
    let proxy = ZkProxy::start(&zk.connect_string());
    let settings = zk_settings(&proxy.connect_string(), "watchrace");
    let s = session(&settings).await;
    let g = ZkBlockingWriteLock::new("holder", &s, "w")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    // The holder's read of its mutex reaches the server; its answer is held.
    proxy.hold_after(OP_GET_DATA);
    eventually(
        zkguard::zk::MUTEX_WATCH_AFTER + Duration::from_secs(5),
        "the holder's read of its mutex sent, its answer held",
        || async { proxy.holds() == 1 },
    )
    .await;
    let before = proxy.requests().len();
    let release = tokio::spawn(async move { g.unlock().await });
    eventually(Duration::from_secs(5), "the release multi sent", || async {
        proxy.requests()[before..].contains(&OP_MULTI)
    })
    .await;
    proxy.release_held();
    release.await.unwrap().unwrap();
    // The session's next request comes after anything the answers above made it send.
    let again = ZkBlockingWriteLock::new("again", &s, "w2")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    again.unlock().await.unwrap();
    let sent: Vec<i32> = proxy.sent_since(before);
    assert!(
        !sent.contains(&OP_REMOVE_WATCHES),
        "a request removed the mutex watch: {sent:?}"
    );
}

/// A waiter's take of the mutex is applied by the server, and its answer is held. The caller
/// gets its error by the deadline plus `DEADLINE_OVERRUN` (it used to wait for the answer, then
/// for the reconnection, and took the lock long after its deadline). Once the answers flow
/// again, the session's reaper removes what the abandoned attempt made, the mutex included:
/// another contender takes the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_whose_answer_is_withheld_ends_by_the_deadline_and_leaves_no_ghost() {
    init_tracing();
    let zk = shared();
    let direct = zk.connect_string();
    let proxy = ZkProxy::start(&direct);
    let mut settings = zk_settings(&proxy.connect_string(), "withheld-take");
    // The client notices a silent connection after 2/5 of this: long after the deadline.
    settings.session_timeout = Duration::from_secs(40);
    let mut direct_settings = settings.clone();
    direct_settings.servers = direct.clone();
    let monitor = format!("{}/W1", settings.lock_root);

    let sh = session(&direct_settings).await;
    let holder = ZkBlockingWriteLock::new("h", &sh, "W1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    let sc = session(&settings).await;
    let timeout = Duration::from_secs(5);
    let contender = ZkBlockingWriteLock::new("c", &sc, "W1")
        .unwrap()
        .with_timeout(timeout);
    let started = std::time::Instant::now();
    let waiting = tokio::spawn(async move {
        let result = contender.lock_with_timeout().await;
        (result, started.elapsed())
    });
    let head = format!("{monitor}/A-0000000000");
    eventually(
        Duration::from_secs(10),
        "the contender watches the holder's node",
        || async { queued(&direct, &monitor, "A-").await == 2 && watched(zk, &head) },
    )
    .await;
    // The holder leaves; the contender's take (a multi) is applied, its answer held.
    proxy.hold_after(OP_MULTI);
    holder.unlock().await.unwrap();
    eventually(
        Duration::from_secs(10),
        "the take applied, its answer held",
        || async {
            proxy.holds() == 1
                && children(&direct, &monitor)
                    .await
                    .contains(&"privateLock".to_string())
        },
    )
    .await;
    let (result, waited) = waiting.await.unwrap();
    let err = result.expect_err("the take's answer never came: the lock is not the caller's");
    assert!(
        matches!(err, zkguard::LockError::ConnectionLoss { .. }),
        "{err}"
    );
    let bound = timeout + zkguard::zk::DEADLINE_OVERRUN;
    assert!(
        waited < bound + Duration::from_secs(1),
        "ended after {waited:?}, past the deadline and its overrun ({bound:?}): {err}"
    );

    // The answers flow again: the reaper finds the mutex and the queue node by attempt id (the
    // contender's session lives on, so nothing else would remove them).
    proxy.release_held();
    eventually(
        Duration::from_secs(20),
        "the abandoned attempt's nodes are removed",
        || async { children(&direct, &monitor).await.is_empty() },
    )
    .await;
    let next = ZkBlockingWriteLock::new("next", &sh, "W1")
        .unwrap()
        .with_timeout(Duration::from_secs(10))
        .lock_with_timeout()
        .await
        .expect("no ghost mutex blocks the monitor");
    next.unlock().await.unwrap();
    // The contender's session lived throughout: its nodes went by the reaper, not with it.
    drop(sc);
}

/// A holder that hears nothing from ZooKeeper for longer than a quarter of the session timeout
/// (the former default grace: 500 ms of a 2 s session, which a busy machine exceeded), but for
/// well under the time after which the leader may expire its session, keeps its lock: by default
/// a lock counts as lost only once the session may have expired (`max_loss_grace`, half the
/// session timeout here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_silent_for_longer_than_a_quarter_of_the_session_keeps_its_lock() {
    init_tracing();
    let zk = shared();
    let proxy = ZkProxy::start(&zk.connect_string());
    let mut settings = zk_settings(&proxy.connect_string(), "silent-holder");
    let timeout = Duration::from_secs(16);
    settings.session_timeout = timeout;
    settings.loss_grace = None;
    let sh = session(&settings).await;
    let holder = ZkBlockingWriteLock::new("h", &sh, "S1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    // From the answer to the holder's first confirmation on, it hears nothing. The confirmation
    // is sent half a grace after the acquisition (c); the lock counts as lost a grace after c:
    // the confirmation goes at c + T/8 and the loss at c + T/4 with a quarter of T, at c + T/4 and
    // c + T/2 with the bound.
    proxy.hold_after(OP_SYNC);
    eventually(
        Duration::from_secs(30),
        "the holder's first confirmation is held",
        || async { proxy.holds() == 1 },
    )
    .await;
    let silent = timeout * 3 / 16;
    tokio::time::sleep(silent).await;
    assert!(
        holder.is_held(),
        "the holder heard nothing for {} ms (more than a quarter of the {} ms session timeout since its acquisition) and lost its lock: {:?}",
        silent.as_millis(),
        timeout.as_millis(),
        holder.loss()
    );
    // The held answers arrive: the session goes on, and so does the lock.
    proxy.release_held();
    assert_eq!(holder.loss(), None);
    holder.unlock().await.unwrap();
}

/// A waiter past its deadline gives up: its node's delete never reaches the server (the
/// connection is cut before it, and reconnections are refused), and the acquisition is dropped
/// at its deadline plus `DEADLINE_OVERRUN` while its removal waits for the connection. The
/// removal under way goes to the session's reaper, which deletes the node once the session
/// reaches the server again: nothing blocks the monitor for as long as the session lives (issue
/// 48, item 5; the model check's walk `6764751749694679655`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_dropped_while_giving_up_disconnected_leaves_no_node_on_its_live_session() {
    init_tracing();
    let zk = shared();
    let direct = zk.connect_string();
    let proxy = ZkProxy::start(&direct);
    let mut settings = zk_settings(&proxy.connect_string(), "ghost-giving-up");
    // The session outlives the whole test: only the reaper can remove the node.
    settings.session_timeout = Duration::from_secs(40);
    let mut direct_settings = settings.clone();
    direct_settings.servers = direct.clone();
    let monitor = format!("{}/G1", settings.lock_root);

    let sh = session(&direct_settings).await;
    let holder = ZkBlockingWriteLock::new("h", &sh, "G1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    let sc = session(&settings).await;
    let waiter = ZkBlockingWriteLock::new("w", &sc, "G1")
        .unwrap()
        .with_timeout(Duration::from_secs(2));
    let waiting = tokio::spawn(async move { waiter.lock_with_timeout().await });
    let head = format!("{monitor}/A-0000000000");
    eventually(
        Duration::from_secs(10),
        "the waiter watches the holder's node",
        || async { queued(&direct, &monitor, "A-").await == 2 && watched(zk, &head) },
    )
    .await;
    // At the deadline the waiter deletes its node: the delete never reaches the server.
    proxy.cut_before_and_block(OP_DELETE);
    let err = waiting
        .await
        .unwrap()
        .expect_err("the waiter's deadline passes while the lock is held");
    assert_eq!(proxy.cuts(), 1, "the waiter's delete was cut: {err}");
    assert_eq!(
        queued(&direct, &monitor, "A-").await,
        2,
        "the waiter's node is still there once its acquisition ended: {err}"
    );

    // The session reaches the server again: its reaper removes the node.
    proxy.unblock();
    eventually(
        Duration::from_secs(20),
        "the abandoned waiter's node is removed",
        || async { queued(&direct, &monitor, "A-").await == 1 },
    )
    .await;
    holder.unlock().await.unwrap();
    let next = ZkBlockingWriteLock::new("next", &sh, "G1")
        .unwrap()
        .with_timeout(Duration::from_secs(10))
        .lock_with_timeout()
        .await
        .expect("no node of the abandoned waiter blocks the monitor");
    next.unlock().await.unwrap();
    drop(sc);
}

/// A starving background waiter is re-queued as foreground: its new node exists, and the delete
/// of its old background node never reaches the server (the connection is cut before it, and
/// reconnections are refused). Cancelled while that delete waits for the connection, the waiter
/// hands its old node (of its old attempt id) to the session's reaper, which deletes it once the
/// session reaches the server again, and the new one (found by its new attempt id): no
/// background node is left on the live session, where later background contenders would wait
/// behind it for as long as it lives (issue 48, item 5's kind; the model check's
/// `a_promoted_waiter_cancelled_while_its_old_node_goes_holds_every_property`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_waiter_cancelled_while_its_old_node_goes_leaves_no_node_on_its_live_session() {
    init_tracing();
    let zk = shared();
    let direct = zk.connect_string();
    let proxy = ZkProxy::start(&direct);
    let mut settings = zk_settings(&proxy.connect_string(), "ghost-promoted");
    // The session outlives the whole test: only the reaper can remove the nodes.
    settings.session_timeout = Duration::from_secs(40);
    settings.background_max_wait = Some(Duration::from_millis(500));
    let mut direct_settings = settings.clone();
    direct_settings.servers = direct.clone();
    let monitor = format!("{}/G2", settings.lock_root);

    let sh = session(&direct_settings).await;
    let holder = ZkBlockingWriteLock::new("h", &sh, "G2")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    let sc = session(&settings).await;
    // The waiter's first single delete is the promotion's delete of its old node: it never
    // reaches the server. (Its queueing sends creates and multis, never a single delete.)
    proxy.cut_before_and_block(OP_DELETE);
    let waiter = ZkBlockingWriteLock::new("w", &sc, "G2")
        .unwrap()
        .with_type(LockType::Background)
        .with_timeout(Duration::from_secs(30));
    let waiting = tokio::spawn(async move { waiter.lock_with_timeout().await });
    eventually(
        Duration::from_secs(20),
        "the promoted waiter's new node exists and the delete of its old one was cut",
        || async {
            proxy.cuts() == 1
                && queued(&direct, &monitor, "A-").await == 2
                && queued(&direct, &monitor, "B-").await == 1
        },
    )
    .await;
    waiting.abort();
    if let Ok(result) = waiting.await {
        assert!(result.is_err(), "the waiter cannot take a held lock");
    }
    assert_eq!(
        (
            queued(&direct, &monitor, "A-").await,
            queued(&direct, &monitor, "B-").await
        ),
        (2, 1),
        "both of the cancelled waiter's nodes are there while its session cannot reach the server"
    );

    // The session reaches the server again: its reaper removes both nodes.
    proxy.unblock();
    eventually(
        Duration::from_secs(20),
        "the cancelled waiter's old and new nodes are removed",
        || async {
            queued(&direct, &monitor, "B-").await == 0 && queued(&direct, &monitor, "A-").await == 1
        },
    )
    .await;
    holder.unlock().await.unwrap();
    let next = ZkBlockingWriteLock::new("next", &sh, "G2")
        .unwrap()
        .with_type(LockType::Background)
        .with_timeout(Duration::from_secs(10))
        .lock_with_timeout()
        .await
        .expect("no node of the cancelled waiter blocks the monitor's background contenders");
    next.unlock().await.unwrap();
    drop(sc);
}

/// A background holder of `key` on a session behind a proxy (session timeout 20 s), watching
/// its mutex: the start of the careful-release cases.
struct CarefulCase {
    direct: String,
    proxy: ZkProxy,
    /// The same settings, straight to the server.
    direct_settings: ZkSettings,
    monitor: String,
    mutex: String,
    holder: LockGuard,
    /// The holder's session, open as long as the case.
    _session: ZkSession,
}

async fn careful_case(key: &str, tag: &str) -> CarefulCase {
    let zk = shared();
    let direct = zk.connect_string();
    let proxy = ZkProxy::start(&direct);
    let mut settings = zk_settings(&proxy.connect_string(), tag);
    settings.session_timeout = Duration::from_secs(20);
    let mut direct_settings = settings.clone();
    direct_settings.servers = direct.clone();
    let monitor = format!("{}/{key}", settings.lock_root);
    let mutex = format!("{monitor}/privateLock");
    let session = session(&settings).await;
    let holder = ZkBlockingWriteLock::new("h", &session, key)
        .unwrap()
        .with_type(LockType::Background)
        .lock_with_timeout()
        .await
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "the holder watches its mutex",
        || async { watched(zk, &mutex) },
    )
    .await;
    CarefulCase {
        direct,
        proxy,
        direct_settings,
        monitor,
        mutex,
        holder,
        _session: session,
    }
}

/// Releases `holder` with its release multi cut before the server sees it, and the careful
/// deletes that follow reading the mutex, their answers held: the release, once they are.
async fn release_with_careful_reads_held(proxy: &ZkProxy, holder: LockGuard) -> Release {
    proxy.hold_after(OP_GET_DATA);
    proxy.cut_before(OP_MULTI);
    let release = holder.release();
    eventually(
        Duration::from_secs(10),
        "the careful deletes read the mutex, the answers held",
        || async { proxy.cuts() == 1 && proxy.holds() == 1 },
    )
    .await;
    release
}

/// Lets the careful reads of `release` (from [`release_with_careful_reads_held`]) through and
/// awaits it: the next holder's `mutex`, created by session `next_session`, must still be
/// there, and `next` still held.
async fn the_release_leaves_the_next_holders_mutex(
    proxy: &ZkProxy,
    release: Release,
    admin: &zookeeper_client::Client,
    mutex: &str,
    next_session: &ZkSession,
    next: &LockGuard,
) {
    proxy.release_held();
    let outcome = release.await;
    let (_, stat) = admin
        .get_data(mutex)
        .await
        .unwrap_or_else(|e| panic!("the next holder's mutex is gone ({e}); release: {outcome:?}"));
    assert_eq!(Some(stat.ephemeral_owner), next_session.session_id());
    assert!(next.is_held());
}
