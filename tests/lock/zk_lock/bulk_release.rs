//! Bulk release: the releases of one session's locks, asked for together, go to ZooKeeper in
//! a few multis (one transaction for many monitors); a release whose own part fails gets its
//! own failure and the others are released all the same.

use super::requests::counted_server;
use super::*;

/// Takes the lock of each of `monitors` (distinct objects) in session `s`.
async fn hold_all(s: &zkguard::ZkSession, monitors: &[String]) -> Vec<zkguard::LockGuard> {
    let mut held = Vec::new();
    for m in monitors {
        let lock = ZkBlockingWriteLock::new("bulk", s, m)
            .unwrap()
            .with_timeout(Duration::from_secs(30));
        held.push(lock.lock_with_timeout().await.unwrap());
    }
    held
}

/// 64 locks of one session released at once take far fewer than 64 requests, and each
/// monitor is left empty: another session takes every one of them at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_asked_for_together_go_in_a_few_multis() {
    let (zk, settings) = counted_server("bulkrel");
    let s = session(&settings).await;
    let names: Vec<String> = (0..64).map(|i| format!("R{i}")).collect();
    let held = hold_all(&s, &names).await;
    let before = zk.packets_received().unwrap();
    let tasks: Vec<_> = held
        .into_iter()
        .map(|g| tokio::spawn(async move { g.unlock().await }))
        .collect();
    for t in tasks {
        t.await.unwrap().expect("every release succeeds");
    }
    let requests = zk.packets_received().unwrap() - before;
    // One by one they were 64 multis. At most four go alone (while fewer than four multis are
    // on their way); the rest wait for one and go together. A handful more for pings and the
    // mntr connection.
    assert!(requests <= 40, "{requests} requests for 64 releases");
    for m in &names {
        let monitor = format!("{}/{m}", settings.lock_root);
        assert!(
            children(&zk.connect_string(), &monitor).await.is_empty(),
            "{monitor} left nodes"
        );
    }
    let other = session(&settings).await;
    for m in &names {
        let lock = ZkBlockingWriteLock::new("next", &other, m).unwrap();
        let g = lock.try_lock().await.unwrap();
        g.unlock().await.unwrap();
    }
}

/// Among 24 releases going together, one whose mutex an operator deleted fails on its own
/// (`NoNode`, as alone) and leaves no node; the other 23 are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_fails_in_a_shared_multi_leaves_the_others_released() {
    let zk = shared();
    let settings = zk_settings(&zk.connect_string(), "bulkrelfail");
    let s = session(&settings).await;
    let names: Vec<String> = (0..24).map(|i| format!("F{i}")).collect();
    let held = hold_all(&s, &names).await;
    let admin = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    let broken = 13;
    admin
        .delete(
            &format!("{}/{}/privateLock", settings.lock_root, names[broken]),
            None,
        )
        .await
        .unwrap();
    let tasks: Vec<_> = held
        .into_iter()
        .map(|g| tokio::spawn(async move { g.unlock().await }))
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let outcome = t.await.unwrap();
        if i == broken {
            assert!(
                matches!(outcome, Err(LockError::NoNode { .. })),
                "the release whose mutex was deleted: {outcome:?}"
            );
        } else {
            outcome.unwrap_or_else(|e| panic!("release {i}: {e}"));
        }
    }
    for m in &names {
        let monitor = format!("{}/{m}", settings.lock_root);
        assert!(
            children(&zk.connect_string(), &monitor).await.is_empty(),
            "{monitor} left nodes"
        );
    }
}
