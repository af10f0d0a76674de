//! Waiting for the lock: timeouts and cancellation leave no node, dropped guards release,
//! anti-starvation promotion, and waiters woken by changes of the queue ahead.

use super::*;

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
