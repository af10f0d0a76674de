//! Request sizes: a burst of acquisitions with a long lock info goes to ZooKeeper in multis that
//! stay under `zookeeper.max.request.bytes`. ZooKeeper closes the connection of a request larger
//! than its `jute.maxbuffer` (every request in flight on it is lost, and after the loss grace
//! every lock held on the session): the burst must leave the connection, the session and a lock
//! held on it alone.

use futures::FutureExt;
use tokio::sync::watch;
use zkguard::config::ZkSettings;
use zkguard::zk::ConnectionState;
use zkguard::{LockRequest, LockService, ZkLockService};

use super::*;

/// The longest lock info allowed, in bytes.
const INFO_LEN: usize = 1024;

/// How many times ZooKeeper refused a request as too large (`Len error` in its log).
fn len_errors(zk: &ZkServer) -> usize {
    std::fs::read_to_string(zk.log_path())
        .unwrap_or_default()
        .matches("Len error")
        .count()
}

/// The first state other than `Connected` that `states` reports, if any.
fn first_drop(mut states: watch::Receiver<ConnectionState>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while states.changed().await.is_ok() {
            let state = *states.borrow_and_update();
            if state != ConnectionState::Connected {
                return;
            }
        }
        // The session was dropped: never ends on its own.
        std::future::pending::<()>().await
    })
}

/// Holds a lock on a session of `settings`, then asks `n` locks on distinct monitors at once on
/// the same session, each with lock info `info` (every fast path asked for while four multis are
/// on their way goes in the next one), and releases them (together too): every one is taken
/// and released, ZooKeeper refused no request, the connection never dropped, the session is the
/// same and the lock held across the burst is still held (its release finds its nodes).
async fn burst_keeps_the_connection(zk: &ZkServer, settings: &ZkSettings, n: usize, info: &str) {
    init_tracing();
    let s = session(settings).await;
    let held = ZkBlockingWriteLock::new("held across the burst", &s, "held")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    let id = s.session_id().expect("a session");
    let refused_before = len_errors(zk);
    let dropped = first_drop(s.connection_state());
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (s, info) = (s.clone(), info.to_string());
            tokio::spawn(async move {
                ZkBlockingWriteLock::new(info, &s, format!("burst-{i}"))
                    .unwrap()
                    .with_timeout(Duration::from_secs(60))
                    .lock_with_timeout()
                    .await
            })
        })
        .collect();
    let mut guards = Vec::with_capacity(n);
    let mut failed = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        match task.await.unwrap() {
            Ok(g) => guards.push(g),
            Err(e) => failed.push(format!("burst-{i}: {e}")),
        }
    }
    assert!(failed.is_empty(), "{} failed: {failed:?}", failed.len());
    // Half released each on its own, at once (they go together, as acquisitions do); the other
    // half in one call (`release_all`).
    let together: Vec<Box<dyn zkguard::Guard>> = guards
        .split_off(n / 2)
        .into_iter()
        .map(|g| Box::new(g) as Box<dyn zkguard::Guard>)
        .collect();
    let released =
        futures::future::join_all(guards.into_iter().map(zkguard::LockGuard::unlock)).await;
    assert!(released.iter().all(Result::is_ok), "{released:?}");
    ZkLockService::new(s.clone())
        .release_all(together)
        .await
        .await
        .expect("every lock released");
    let refused = len_errors(zk) - refused_before;
    assert_eq!(
        refused, 0,
        "ZooKeeper refused {refused} requests as larger than its jute.maxbuffer (Len error)"
    );
    assert!(
        !dropped.is_finished(),
        "the session's connection dropped during the burst"
    );
    dropped.abort();
    assert_eq!(s.session_id(), Some(id), "the session is the same");
    assert!(
        held.lost().now_or_never().is_none(),
        "the held lock was lost"
    );
    held.unlock()
        .await
        .expect("the held lock's nodes are there");
}

/// With ZooKeeper's default `jute.maxbuffer` (1 MiB) and the default
/// `zookeeper.max.request.bytes`, 300 acquisitions at once with the longest lock info, made of
/// control characters (each written `\u0001` in the nodes' JSON: about 6 KiB per node, two
/// nodes per fast path): 128 fast paths in one multi would make 1.6 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_with_the_longest_info_keeps_the_sessions_connection() {
    let zk = shared();
    let settings = zk_settings(&zk.connect_string(), "reqsize");
    let info = "\u{1}".repeat(INFO_LEN);
    burst_keeps_the_connection(zk, &settings, 300, &info).await;
}

/// A server whose `jute.maxbuffer` was lowered to 64 KiB, and `zookeeper.max.request.bytes`
/// lowered to match, to the byte (so that a multi estimated too small would be refused): 300
/// acquisitions at once with a 1 KiB lock info (about 3 KiB per fast path; 128 in one multi
/// would make 380 KiB), then 150 releases asked for at once and 150 in one call (about 500
/// bytes each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_fits_a_lowered_jute_maxbuffer_when_the_limit_is_lowered_to_match() {
    let zk = ZkServer::builder()
        .jvm_arg("-Djute.maxbuffer=65536")
        .start()
        .expect("start ZooKeeper");
    let mut settings = zk_settings(&zk.connect_string(), "reqsize-low");
    settings.max_request_bytes = 65536;
    let info = "x".repeat(INFO_LEN);
    burst_keeps_the_connection(&zk, &settings, 300, &info).await;
}

/// A lock info longer than 1 KiB is refused before anything is sent, naming the limit: by
/// `ZkBlockingWriteLock::new` and by the lock service; 1 KiB exactly is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_info_over_the_limit_is_refused() {
    assert_eq!(zkguard::lock::MAX_INFO_LEN, INFO_LEN);
    let zk = shared();
    let settings = zk_settings(&zk.connect_string(), "reqsize-info");
    let s = session(&settings).await;
    let long = "é".repeat(INFO_LEN / 2 + 1);
    let check = |e: &LockError| {
        assert!(
            matches!(e, LockError::InfoTooLong { len, .. } if *len == INFO_LEN + 2),
            "{e:?}"
        );
        let message = e.to_string();
        assert!(
            message.contains("1026 bytes") && message.contains("1024"),
            "{message}"
        );
    };
    let e = ZkBlockingWriteLock::new(long.clone(), &s, "m").unwrap_err();
    check(&e);
    let service = ZkLockService::new(s.clone());
    let e = match service.acquire(LockRequest::new("m", long)).await {
        Err(e) => e,
        Ok(_) => panic!("a 1026-byte info was accepted"),
    };
    check(&e);
    assert!(
        children(&zk.connect_string(), &settings.lock_root)
            .await
            .is_empty(),
        "nothing was created"
    );
    let g = service
        .acquire(LockRequest::new("m", "é".repeat(INFO_LEN / 2)))
        .await
        .unwrap();
    g.unlock().await.unwrap();
}
