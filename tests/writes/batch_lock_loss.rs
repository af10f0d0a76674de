//! Background lanes (batched by monitor) against a real ZooKeeper and osmem-server, when a
//! lane's lock is lost after its last check while its writes wait in the bulk writer behind
//! another lane's `_bulk` request: the writes must not be sent under the lost lock.

use crate::guarded_support;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use tokio::sync::Notify;
use zkguard::es::{EsError, HookedStore, StoreCall, StoreHook};
use zkguard::write::background::{BackgroundExecutor, Outcome};
use zkguard::write::deadletter::{DeadLetterSink, FileSink};
use zkguard::write::guarded::GuardedWriter;
use zkguard::write::ops::Operation;
use zkguard::{Guard, LockError, LockRequest, LockService, LockType, LossReason, Release};

use crate::wait::eventually;
use guarded_support::{locks, settings_for, shared, source, store, tag};

/// Holds the first `_bulk` request until let through; every other call passes.
#[derive(Default)]
struct FirstBulkGate {
    reached: Notify,
    open: Notify,
    passed: AtomicBool,
}

#[async_trait]
impl StoreHook for FirstBulkGate {
    async fn before(&self, call: &StoreCall<'_>) -> Result<(), EsError> {
        if let StoreCall::Bulk { .. } = call {
            if !self.passed.swap(true, Ordering::AcqRel) {
                self.reached.notify_one();
                self.open.notified().await;
            }
        }
        Ok(())
    }
}

/// A lock service whose first guard of `monitor` counts as lost right after its second check:
/// a lane checks the lock before it reads its documents and again before it hands its writes
/// to the bulk writer, so the lock is lost once the lane's last check has passed. Later
/// guards are the real ones.
struct LosesOnceAfterTwoChecks {
    inner: Arc<dyn LockService>,
    monitor: String,
    done: AtomicBool,
    /// The token of the guard that was lost.
    lost_token: Arc<AtomicU64>,
    /// Set once that guard counts as lost.
    lost: Arc<AtomicBool>,
}

#[derive(Debug)]
struct LostAfterTwoChecks {
    inner: Box<dyn Guard>,
    checks: AtomicUsize,
    lost: Arc<AtomicBool>,
}

#[async_trait]
impl Guard for LostAfterTwoChecks {
    fn monitor(&self) -> &str {
        self.inner.monitor()
    }
    fn lock_type(&self) -> LockType {
        self.inner.lock_type()
    }
    fn fencing_token(&self) -> u64 {
        self.inner.fencing_token()
    }
    fn is_held(&self) -> bool {
        let held = !self.lost.load(Ordering::Acquire) && self.inner.is_held();
        if self.checks.fetch_add(1, Ordering::AcqRel) + 1 >= 2 {
            self.lost.store(true, Ordering::Release);
        }
        held
    }
    fn loss(&self) -> Option<LossReason> {
        if self.lost.load(Ordering::Acquire) {
            Some(LossReason::MutexDeleted)
        } else {
            self.inner.loss()
        }
    }
    async fn lost(&self) -> LossReason {
        self.inner.lost().await
    }
    async fn unlock(self: Box<Self>) -> Result<(), LockError> {
        self.inner.unlock().await
    }
    async fn release(self: Box<Self>) -> Release {
        self.inner.release().await
    }
}

#[async_trait]
impl LockService for LosesOnceAfterTwoChecks {
    async fn acquire(&self, request: LockRequest) -> Result<Box<dyn Guard>, LockError> {
        let guard = self.inner.acquire(request).await?;
        if guard.monitor() == self.monitor && !self.done.swap(true, Ordering::AcqRel) {
            self.lost_token
                .store(guard.fencing_token(), Ordering::Release);
            return Ok(Box::new(LostAfterTwoChecks {
                inner: guard,
                checks: AtomicUsize::new(0),
                lost: self.lost.clone(),
            }));
        }
        Ok(guard)
    }
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lanes_writes_waiting_behind_another_bulk_are_not_sent_once_its_lock_is_lost() {
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_for(servers, dir.path());
    let es = store(&settings);
    let index = format!("lane-loss-{}", tag());
    let (m1, m2) = (format!("{index}:1"), format!("{index}:2"));
    let (_s, zk_locks) = locks(&settings).await;
    let plain = GuardedWriter::new(zk_locks.clone(), es.clone());
    for (m, id) in [(&m1, "1"), (&m2, "2")] {
        plain
            .on(m)
            .index(&index, id, json!({"n": 0}))
            .await
            .unwrap();
    }
    let (lost_token, lost_flag) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let locks: Arc<dyn LockService> = Arc::new(LosesOnceAfterTwoChecks {
        inner: zk_locks,
        monitor: m2.clone(),
        done: AtomicBool::new(false),
        lost_token: lost_token.clone(),
        lost: lost_flag.clone(),
    });
    let gated = Arc::new(HookedStore::new(es.clone(), FirstBulkGate::default()));
    let exec = BackgroundExecutor::builder(
        GuardedWriter::new(locks, gated.clone()),
        Arc::new(FileSink::new(&settings.retry.file_path)) as Arc<dyn DeadLetterSink>,
    )
    .retry(&settings.retry)
    .concurrency(4)
    .batch_by_monitor(4, 64)
    .build();

    // Lane 1's `_bulk` is under way (held).
    let first = exec
        .submit(Operation::increment(&m1, &index, "1", "n", 1))
        .await;
    gated.hook().reached.notified().await;
    // Lane 2 reads, plans, passes its last check, hands its writes to the bulk writer (which
    // waits for lane 1's request), and its lock is lost.
    let second = exec
        .submit(Operation::increment(&m2, &index, "2", "n", 1))
        .await;
    eventually(
        Duration::from_secs(20),
        "lane 2's lock was lost after its last check",
        || async { lost_flag.load(Ordering::Acquire) },
    )
    .await;
    gated.hook().open.notify_one();

    match first.await.unwrap().unwrap() {
        Outcome::Applied { .. } => {}
        other => panic!("lane 1's write: {other:?}"),
    }
    let lost = lost_token.load(Ordering::Acquire);
    match second.await.unwrap().unwrap() {
        Outcome::Applied {
            attempts, written, ..
        } => {
            assert_ne!(
                written.token, lost,
                "lane 2's write went out under the lock it had lost"
            );
            assert_eq!(attempts, 2, "the first attempt was not sent; the retry was");
        }
        other => panic!("lane 2's write: {other:?}"),
    }
    assert_eq!(source(es.as_ref(), &index, "2").await["n"], json!(1));
}
