//! Transactions with the ZooKeeper lock service: recovery leaves a transaction alone while a live
//! worker holds its lock, and takes it over once the worker is gone.

use crate::txn_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use txn_support::*;
use zkguard::config::Settings;
use zkguard::testkit::ZkServer;
use zkguard::txn::{HookPoint, Step, TransferRequest, TxnError, TxnState};
use zkguard::{LockService, ZkLockService, ZkSession};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_skips_locked_transactions_and_takes_over_from_dead_workers() {
    let zk = ZkServer::builder()
        .tick_time(500)
        .start()
        .expect("start ZooKeeper (run scripts/install-deps.sh)");
    let mut zs = Settings::default().zookeeper;
    zs.servers = zk.connect_string();
    zs.session_timeout = Duration::from_secs(4);
    zs.foreground_timeout = Duration::from_secs(5);
    zs.background_timeout = Duration::from_secs(5);
    zs.lock_root = "/zkguard-test/txn".into();
    let service =
        |session: ZkSession| -> Arc<dyn LockService> { Arc::new(ZkLockService::new(session)) };
    let live = service(ZkSession::connect(&zs).await.unwrap());
    let recovering = service(ZkSession::connect(&zs).await.unwrap());

    let store = store();
    let s = settings("lock");
    let c = coordinator(store.clone(), &s);
    open_accounts(&c, &["A", "B"], 100).await;
    let recovery = coordinator(store.clone(), &s)
        .with_lock_service(recovering)
        .with_recovery_tuning(Duration::from_millis(100), 100, 4);

    // 1. A live worker holds the lock: recovery reports the transaction busy and does not touch it.
    let pause = PauseAt::new(HookPoint::After(Step::ApplySource));
    let worker = Arc::new(
        coordinator(store.clone(), &s)
            .with_lock_service(live.clone())
            .with_hook(pause.clone()),
    );
    let task = tokio::spawn({
        let worker = worker.clone();
        async move {
            worker
                .transfer(TransferRequest::new("A", "B", 10).with_id("t1"))
                .await
        }
    });
    pause.reached.notified().await;
    let before = c.transaction("t1").await.unwrap().unwrap();
    assert_eq!(before.state, TxnState::Pending);
    let report = recovery.recover_once().await.unwrap();
    assert_eq!(report.busy, vec!["t1".to_string()], "{report:?}");
    assert!(report.finished.is_empty(), "{report:?}");
    assert_eq!(
        c.transaction("t1").await.unwrap().unwrap(),
        before,
        "recovery touched a locked transaction"
    );
    pause.release.notify_one();
    assert_eq!(task.await.unwrap().unwrap().state, TxnState::Finished);

    // 2. A worker that stops releases the lock on its way out: recovery finishes its transaction.
    let crashing = coordinator(store.clone(), &s)
        .with_lock_service(live.clone())
        .with_hook(CrashAt::new(HookPoint::After(Step::ApplySource)));
    let err = crashing
        .transfer(TransferRequest::new("A", "B", 20).with_id("t2"))
        .await
        .unwrap_err();
    assert!(matches!(err, TxnError::Interrupted { .. }), "{err}");
    let report = recovery.recover_once().await.unwrap();
    assert_eq!(report.finished, vec!["t2".to_string()], "{report:?}");

    // 3. A worker whose session dies while it holds the lock: recovery takes over, and when the
    //    worker wakes up its remaining steps find the work done and apply nothing twice.
    // The dying worker reaches ZooKeeper through a partition that the test cuts, so that
    // ZooKeeper expires its session for real.
    let partition = zkguard::testkit::Partition::start(&zs.servers).unwrap();
    let mut dying_settings = zs.clone();
    dying_settings.servers = partition.connect_string().to_string();
    let dying = ZkSession::connect(&dying_settings).await.unwrap();
    let pause = PauseAt::new(HookPoint::After(Step::MarkPending));
    let worker = Arc::new(
        coordinator(store.clone(), &s)
            .with_lock_service(service(dying.clone()))
            .with_hook(pause.clone()),
    );
    let task = tokio::spawn({
        let worker = worker.clone();
        async move {
            worker
                .transfer(TransferRequest::new("A", "B", 30).with_id("t3"))
                .await
        }
    });
    pause.reached.notified().await;
    partition.cut();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let report = recovery.recover_once().await.unwrap();
        if report.finished.contains(&"t3".to_string()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "recovery never took t3 over: {report:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pause.release.notify_one();
    assert_eq!(task.await.unwrap().unwrap().state, TxnState::Finished);

    let initial: BTreeMap<String, i64> = [("A".to_string(), 100), ("B".to_string(), 100)].into();
    assert_books(&store, &c, &s, &initial).await;
    assert_eq!(balance(&c, "B").await, 160);
}
