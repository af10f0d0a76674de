//! The Elasticsearch lease lock against a real `osmem-server`.
//!
//! One server serves the whole file; every test works in indices of its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::Barrier;
use zkguard::config::Settings;
use zkguard::es::{DocStore, EsError, EsStore, Refresh, WriteCondition};
use zkguard::eslock::{EsLockService, EsLockServiceBuilder, LockState};
use zkguard::testkit::OsmemServer;
use zkguard::{Blocker, Guard, LockError, LockRequest, LockService, LockType, LossReason};

fn server() -> &'static OsmemServer {
    static SERVER: OnceLock<OsmemServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        OsmemServer::start().expect("start osmem-server (pip install osmem-server)")
    })
}

/// A store with a connection pool of its own (as another process would have).
fn store() -> Arc<dyn DocStore> {
    Arc::new(EsStore::from_url(server().url()).expect("EsStore"))
}

fn index(tag: &str) -> String {
    format!(
        "eslock-{tag}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// A builder on index `idx` with a short lease: TTL `ttl_ms`, skew `skew_ms`, 10 s waits.
fn builder(idx: &str, ttl_ms: u64, skew_ms: u64) -> EsLockServiceBuilder {
    EsLockService::builder(store())
        .index(idx)
        .ttl(Duration::from_millis(ttl_ms))
        .clock_skew(Duration::from_millis(skew_ms))
        .timeouts(Duration::from_secs(10), Duration::from_secs(10))
}

async fn wait_takeable(svc: &EsLockService, monitor: &str) {
    eventually(
        Duration::from_secs(10),
        "the lease to count as expired",
        || async {
            svc.status(monitor)
                .await
                .unwrap()
                .is_some_and(|s| s.takeable)
        },
    )
    .await;
}

/// Reads, increments and writes back a counter document, fenced by `token`.
async fn fenced_increment(
    store: &dyn DocStore,
    idx: &str,
    id: &str,
    token: u64,
) -> Result<(), EsError> {
    let n = match store.get(idx, id).await? {
        Some(doc) => doc.source["n"].as_u64().unwrap(),
        None => 0,
    };
    store
        .index(
            idx,
            id,
            &json!({ "n": n + 1, "token": token }),
            WriteCondition::ExternalGte(token),
            Refresh::No,
        )
        .await
        .map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exclusion_under_contention() {
    let idx = index("excl");
    let data = index("excl-data");
    let monitor = "article-1";
    const CONTENDERS: usize = 6;
    const ROUNDS: usize = 8;
    let inside = Arc::new(AtomicBool::new(false));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for c in 0..CONTENDERS {
        // Each contender has a service and a connection pool of its own, like a process.
        let svc = builder(&idx, 2000, 200)
            .timeouts(Duration::from_secs(30), Duration::from_secs(30))
            .build()
            .unwrap();
        let (inside, tokens, data) = (inside.clone(), tokens.clone(), data.clone());
        tasks.push(tokio::spawn(async move {
            let store = store();
            for r in 0..ROUNDS {
                let lock_type = if (c + r) % 2 == 0 {
                    LockType::Foreground
                } else {
                    LockType::Background
                };
                let guard = svc
                    .lock(LockRequest::new(monitor, "increment").with_type(lock_type))
                    .await
                    .unwrap();
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                tokens.lock().unwrap().push(guard.fencing_token());
                fenced_increment(&*store, &data, "counter", guard.fencing_token())
                    .await
                    .unwrap();
                tokio::task::yield_now().await;
                assert!(guard.is_held());
                inside.store(false, Ordering::SeqCst);
                guard.must_release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let doc = store().get(&data, "counter").await.unwrap().unwrap();
    assert_eq!(
        doc.source["n"],
        json!(CONTENDERS * ROUNDS),
        "an increment was lost"
    );
    let tokens = tokens.lock().unwrap().clone();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly increase: {tokens:?}"
    );
    let status = builder(&idx, 2000, 200)
        .build()
        .unwrap()
        .status(monitor)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.record.state, LockState::Free);
    assert_eq!(status.record.token, *tokens.last().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_one_winner_among_racing_takeovers() {
    let idx = index("race");
    let monitor = "contended";
    const RACERS: usize = 12;
    let observer = builder(&idx, 600, 100).build().unwrap();
    let stalled = builder(&idx, 600, 100).keep_alive(false).build().unwrap();
    let racers: Vec<EsLockService> = (0..RACERS)
        .map(|_| builder(&idx, 600, 100).build().unwrap())
        .collect();
    let mut last_token = 0;
    for round in 0..6 {
        // Even rounds race for an expired lease, odd rounds for a released one.
        let holder = stalled
            .lock(LockRequest::new(monitor, "stalls"))
            .await
            .unwrap();
        assert!(holder.fencing_token() > last_token);
        if round % 2 == 0 {
            wait_takeable(&observer, monitor).await;
            assert!(
                !holder.is_held(),
                "the holder must have stopped before the lease counts as expired"
            );
        } else {
            holder.must_release().await.unwrap();
        }
        let before = observer.status(monitor).await.unwrap().unwrap();
        assert!(before.takeable);
        let barrier = Arc::new(Barrier::new(RACERS));
        let attempts = racers.iter().cloned().map(|svc| {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                svc.lock(LockRequest::new(monitor, "race").with_timeout(Duration::ZERO))
                    .await
            })
        });
        let results: Vec<_> = futures::future::join_all(attempts)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let mut winners = Vec::new();
        for r in results {
            match r {
                Ok(g) => winners.push(g),
                Err(LockError::Timeout { .. }) => {}
                Err(e) => panic!("unexpected error: {e}"),
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "round {round}: exactly one racer must win"
        );
        let winner = winners.pop().unwrap();
        let after = observer.status(monitor).await.unwrap().unwrap();
        assert_eq!(after.record.owner, winner.owner());
        assert_eq!(after.record.token, winner.fencing_token());
        assert!(winner.fencing_token() > before.record.token);
        last_token = winner.fencing_token();
        winner.must_release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_keeps_the_lock_past_its_ttl() {
    let idx = index("keep");
    let monitor = "long-job";
    let svc = builder(&idx, 600, 100).build().unwrap();
    let other = builder(&idx, 600, 100).build().unwrap();
    let guard = svc
        .lock(LockRequest::new(monitor, "long job"))
        .await
        .unwrap();
    let acquired = svc.status(monitor).await.unwrap().unwrap().record.acquired;
    eventually(
        Duration::from_secs(10),
        "renewals to carry the lease past 3 TTLs",
        || async {
            svc.status(monitor).await.unwrap().unwrap().record.renewed >= acquired + 3 * 600
        },
    )
    .await;
    assert!(guard.is_held());
    assert_eq!(guard.loss(), None);
    let status = other.status(monitor).await.unwrap().unwrap();
    assert!(!status.takeable);
    assert_eq!(
        status.record.token,
        guard.fencing_token(),
        "renewals keep the token"
    );
    let err = other
        .lock(LockRequest::new(monitor, "intruder").with_timeout(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    guard.must_release().await.unwrap();
    assert_eq!(
        other.status(monitor).await.unwrap().unwrap().record.state,
        LockState::Free
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_holder_is_taken_over_and_fenced() {
    let idx = index("stall");
    let data = index("stall-data");
    let monitor = "article-7";
    let writes = store();
    let stalled = builder(&idx, 1000, 200).keep_alive(false).build().unwrap();
    let contender = builder(&idx, 1000, 200).build().unwrap();

    let old = stalled
        .lock(LockRequest::new(monitor, "stalls"))
        .await
        .unwrap();
    let old_token = old.fencing_token();
    fenced_increment(&*writes, &data, "doc", old_token)
        .await
        .unwrap();

    let new = contender
        .lock(LockRequest::new(monitor, "takes over"))
        .await
        .unwrap();
    assert!(
        new.acquired_at() >= old.valid_until(),
        "the takeover must start after the old holder's deadline"
    );
    assert!(!old.is_held());
    assert_eq!(old.loss(), Some(LossReason::LeaseExpired));
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(1), old.lost())
            .await
            .unwrap(),
        LossReason::LeaseExpired
    );
    assert!(new.fencing_token() > old_token);

    fenced_increment(&*writes, &data, "doc", new.fencing_token())
        .await
        .unwrap();
    // The old holder's late write is fenced off.
    let err = fenced_increment(&*writes, &data, "doc", old_token)
        .await
        .unwrap_err();
    assert!(matches!(err, EsError::Conflict { .. }), "{err}");
    assert_eq!(
        writes.get(&data, "doc").await.unwrap().unwrap().source["n"],
        json!(2)
    );

    // The old holder can neither renew nor release the new holder's lock.
    let before = contender.status(monitor).await.unwrap().unwrap();
    let err = old.renew().await.unwrap_err();
    assert!(matches!(err, LockError::Lost { .. }), "{err}");
    assert!(
        !old.release().await.unwrap(),
        "a stale holder must not release"
    );
    let after = contender.status(monitor).await.unwrap().unwrap();
    assert_eq!(after.record.owner, new.owner());
    assert_eq!(after.record.state, LockState::Held);
    assert_eq!(after.meta.seq_no, before.meta.seq_no);
    assert!(new.is_held());
    new.must_release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_holder_learns_the_new_owner_on_renewal() {
    let idx = index("renew");
    let monitor = "m";
    // The stalled holder assumes a tiny skew but the contender is 300 ms ahead: beyond the
    // assumption, so the takeover lands while the holder still counts on its lease. Its next
    // renewal must notice and report the new owner.
    let stalled = builder(&idx, 1000, 0).keep_alive(false).build().unwrap();
    let ahead = builder(&idx, 1000, 0).clock_offset(900).build().unwrap();
    let old = stalled
        .lock(LockRequest::new(monitor, "slow"))
        .await
        .unwrap();
    let new = ahead.lock(LockRequest::new(monitor, "fast")).await.unwrap();
    let err = old.renew().await.unwrap_err();
    match err {
        LockError::Lost {
            reason: LossReason::TakenOver { by },
            ..
        } => assert_eq!(by, new.owner()),
        other => panic!("expected a takeover, got {other}"),
    }
    assert_eq!(
        old.loss(),
        Some(LossReason::TakenOver {
            by: new.owner().to_string()
        })
    );
    let err = Box::new(old).unlock().await.unwrap_err();
    assert!(matches!(err, LockError::NoNode { .. }), "{err}");
    assert!(new.is_held());
    new.must_release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skew_within_the_setting_never_overlaps() {
    let idx = index("skew");
    let monitor = "m";
    // Clocks 250 ms apart, the configured maximum: the holder's own deadline still comes first.
    let holder_svc = builder(&idx, 1000, 250).keep_alive(false).build().unwrap();
    let ahead = builder(&idx, 1000, 250).clock_offset(250).build().unwrap();
    for _ in 0..3 {
        let old = holder_svc
            .lock(LockRequest::new(monitor, "holder"))
            .await
            .unwrap();
        let new = ahead
            .lock(LockRequest::new(monitor, "ahead"))
            .await
            .unwrap();
        assert!(
            new.acquired_at() >= old.valid_until(),
            "overlap: new lease from {:?}, old valid until {:?}",
            new.acquired_at(),
            old.valid_until()
        );
        assert!(!old.is_held());
        new.must_release().await.unwrap();
        drop(old);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_by_a_non_owner_changes_nothing() {
    let idx = index("nonowner");
    let monitor = "m";
    let svc = builder(&idx, 2000, 200).build().unwrap();
    let intruder = builder(&idx, 2000, 200).build().unwrap();

    assert!(matches!(
        intruder
            .must_release_as(monitor, "nobody")
            .await
            .unwrap_err(),
        LockError::NotHeld { .. }
    ));

    let guard = svc.lock(LockRequest::new(monitor, "owner")).await.unwrap();
    let before = svc.status(monitor).await.unwrap().unwrap();
    assert!(!intruder.release_as(monitor, "someone-else").await.unwrap());
    let err = intruder
        .must_release_as(monitor, "someone-else")
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::NotHeld { .. }), "{err}");
    let after = svc.status(monitor).await.unwrap().unwrap();
    assert_eq!(
        after.meta.seq_no, before.meta.seq_no,
        "a non-owner's release must not write"
    );
    assert_eq!(after.record, before.record);
    assert!(guard.is_held());

    guard.must_release().await.unwrap();
    // Nothing held any more: the owner's own id now releases nothing either.
    let owner = svc.status(monitor).await.unwrap().unwrap().record.owner;
    let err = svc.must_release_as(monitor, &owner).await.unwrap_err();
    assert!(matches!(err, LockError::NotHeld { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reacquiring_ones_own_lock_extends_it_with_a_new_token() {
    let idx = index("own");
    let monitor = "m";
    let svc = builder(&idx, 2000, 200).build().unwrap();
    let first = svc
        .lock_as("worker-7", LockRequest::new(monitor, "first"))
        .await
        .unwrap();
    let second = svc
        .lock_as(
            "worker-7",
            LockRequest::new(monitor, "again").with_timeout(Duration::ZERO),
        )
        .await
        .unwrap();
    assert!(second.fencing_token() > first.fencing_token());
    assert!(
        !first.is_held(),
        "the older guard of the same owner must be retired"
    );
    assert!(matches!(first.loss(), Some(LossReason::TakenOver { .. })));
    assert!(second.is_held());
    // Another owner still has to wait.
    let err = svc
        .lock_as(
            "worker-8",
            LockRequest::new(monitor, "other").with_timeout(Duration::ZERO),
        )
        .await;
    assert!(matches!(err, Err(LockError::Timeout { .. })));
    assert!(matches!(
        first.must_release().await.unwrap_err(),
        LockError::NotHeld { .. }
    ));
    // The owner id releases it (and retires its live guard).
    assert!(svc.release_as(monitor, "worker-7").await.unwrap());
    assert!(!second.is_held());
    assert_eq!(
        svc.status(monitor).await.unwrap().unwrap().record.state,
        LockState::Free
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn foreground_beats_queued_background() {
    let idx = index("prio");
    let monitor = "article-9";
    let order = Arc::new(Mutex::new(Vec::<String>::new()));
    let holder_svc = builder(&idx, 2000, 200).build().unwrap();
    for round in 0..3 {
        order.lock().unwrap().clear();
        let holder = holder_svc
            .lock(LockRequest::new(monitor, "holder").with_type(LockType::Background))
            .await
            .unwrap();
        let spawn = |name: String, lock_type: LockType| {
            let svc = builder(&idx, 2000, 200)
                .poll(Duration::from_millis(5), Duration::from_millis(40))
                .build()
                .unwrap();
            let order = order.clone();
            tokio::spawn(async move {
                let g = svc
                    .lock(LockRequest::new(monitor, name.clone()).with_type(lock_type))
                    .await
                    .unwrap();
                order.lock().unwrap().push(name);
                g.must_release().await.unwrap();
            })
        };
        let background: Vec<_> = (0..3)
            .map(|i| spawn(format!("bg{i}"), LockType::Background))
            .collect();
        let foreground = spawn("fg".into(), LockType::Foreground);
        eventually(
            Duration::from_secs(5),
            "the foreground waiter to register",
            || async {
                !holder_svc
                    .foreground_waiters(monitor)
                    .await
                    .unwrap()
                    .is_empty()
            },
        )
        .await;
        holder.must_release().await.unwrap();
        foreground.await.unwrap();
        for b in background {
            b.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        assert_eq!(order.len(), 4);
        assert_eq!(
            order[0], "fg",
            "round {round}: foreground must go first, got {order:?}"
        );
        eventually(
            Duration::from_secs(5),
            "the registration to be removed",
            || async {
                holder_svc
                    .foreground_waiters(monitor)
                    .await
                    .unwrap()
                    .is_empty()
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_foreground_waiter_does_not_block_background_forever() {
    let idx = index("crash");
    let monitor = "m";
    let svc = builder(&idx, 1000, 100).build().unwrap();
    let holder = svc.lock(LockRequest::new(monitor, "holder")).await.unwrap();

    // A foreground waiter registers, then "crashes": its future is leaked, so it neither
    // refreshes nor removes its registration.
    let waiter_svc = builder(&idx, 1000, 100).build().unwrap();
    let mut waiting = Box::pin(waiter_svc.lock(LockRequest::new(monitor, "will crash")));
    tokio::select! {
        r = &mut waiting => panic!("the waiter must not get the lock: {r:?}"),
        _ = eventually(Duration::from_secs(5), "the waiter to register", || async {
            !svc.foreground_waiters(monitor).await.unwrap().is_empty()
        }) => {}
    }
    std::mem::forget(waiting);
    let registration = svc.foreground_waiters(monitor).await.unwrap();
    assert_eq!(registration.len(), 1);
    let expires = registration[0].expires;

    holder.must_release().await.unwrap();
    let background = svc
        .lock(
            LockRequest::new(monitor, "background")
                .with_type(LockType::Background)
                .with_timeout(Duration::from_secs(10)),
        )
        .await
        .unwrap();
    let acquired = svc.status(monitor).await.unwrap().unwrap().record.acquired;
    assert!(
        acquired > expires + 100,
        "background took the lock at {acquired} while the registration was live until {}",
        expires + 100
    );
    assert!(svc.foreground_waiters(monitor).await.unwrap().is_empty());
    background.must_release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_foreground_waiter_unregisters() {
    let idx = index("cancel");
    let monitor = "m";
    let svc = builder(&idx, 5000, 100).build().unwrap();
    let holder = svc.lock(LockRequest::new(monitor, "holder")).await.unwrap();
    let waiter_svc = svc.clone();
    let task = tokio::spawn(async move {
        waiter_svc
            .lock(LockRequest::new(monitor, "cancelled"))
            .await
    });
    eventually(Duration::from_secs(5), "the waiter to register", || async {
        !svc.foreground_waiters(monitor).await.unwrap().is_empty()
    })
    .await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    // Removed right away in the background, long before its 5 s expiry.
    eventually(
        Duration::from_secs(2),
        "the registration to be removed",
        || async { svc.foreground_waiters(monitor).await.unwrap().is_empty() },
    )
    .await;
    // A background contender gets the lock as soon as the holder lets go.
    holder.must_release().await.unwrap();
    let bg = svc
        .lock(
            LockRequest::new(monitor, "bg")
                .with_type(LockType::Background)
                .with_timeout(Duration::from_secs(2)),
        )
        .await
        .unwrap();
    bg.must_release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_and_dropped_guard() {
    let idx = index("timeout");
    let monitor = "m";
    let svc = builder(&idx, 2000, 200).build().unwrap();
    let guard = svc.lock(LockRequest::new(monitor, "holder")).await.unwrap();
    let started = Instant::now();
    let err = svc
        .lock(
            LockRequest::new(monitor, "waiter")
                .with_type(LockType::Background)
                .with_timeout(Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    match &err {
        LockError::Timeout {
            monitor: m,
            lock_type,
            waited,
            ..
        } => {
            assert_eq!(m, monitor);
            assert_eq!(*lock_type, LockType::Background);
            assert!(*waited >= Duration::from_millis(300));
        }
        other => panic!("expected a timeout, got {other}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(300));
    // A dropped guard is released in the background.
    drop(guard);
    eventually(
        Duration::from_secs(2),
        "the dropped guard's release",
        || async { svc.status(monitor).await.unwrap().unwrap().record.state == LockState::Free },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_through_the_lock_service_trait() {
    let idx = index("trait");
    let mut settings = Settings::default();
    settings.es_lock.index = idx.clone();
    settings.es_lock.ttl = Duration::from_millis(2000);
    settings.es_lock.clock_skew = Duration::from_millis(200);
    settings.zookeeper.foreground_timeout = Duration::from_millis(250);
    let svc: Arc<dyn LockService> =
        Arc::new(EsLockService::from_settings(&settings, store()).unwrap());
    assert_eq!(svc.backend_name(), "elasticsearch");
    let guard = svc
        .acquire(LockRequest::new("doc-1", "through the trait"))
        .await
        .unwrap();
    assert_eq!(guard.monitor(), "doc-1");
    assert_eq!(guard.lock_type(), LockType::Foreground);
    assert!(guard.is_held());
    // The foreground timeout comes from zookeeper.foreground.task.timeout.
    let started = Instant::now();
    let err = svc
        .acquire(LockRequest::new("doc-1", "second"))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
    guard.unlock().await.unwrap();

    let err = svc
        .acquire(LockRequest::new("a/b", "bad"))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidMonitor { .. }), "{err}");

    let es_svc = EsLockService::from_settings(&settings, store()).unwrap();
    let listed = es_svc.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].record.monitor, "doc-1");
    assert_eq!(listed[0].record.state, LockState::Free);
}

#[test]
fn settings_out_of_range_are_rejected() {
    let store: Arc<dyn DocStore> = Arc::new(EsStore::from_url("http://127.0.0.1:9").unwrap());
    let err = EsLockService::builder(store.clone())
        .ttl(Duration::from_millis(1000))
        .clock_skew(Duration::from_millis(500))
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("elasticsearch.lock.clock.skew"), "{err}");
    let err = EsLockService::builder(store.clone())
        .index("Bad Index")
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("elasticsearch.lock.index"), "{err}");
    let err = EsLockService::builder(store)
        .ttl(Duration::from_millis(10))
        .clock_skew(Duration::ZERO)
        .build();
    assert!(err
        .unwrap_err()
        .to_string()
        .contains("elasticsearch.lock.ttl"));
}

#[tokio::test]
async fn unreachable_elasticsearch_is_a_connection_loss() {
    let store: Arc<dyn DocStore> = Arc::new(EsStore::from_url("http://127.0.0.1:9").unwrap());
    let svc = EsLockService::builder(store).build().unwrap();
    let err = svc
        .lock(LockRequest::new("m", "x").with_timeout(Duration::from_millis(100)))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::ConnectionLoss { .. }), "{err}");
    assert!(err.is_transient());
}

// ---------------------------------------------------------------------------------------------
// Several processes of `zkguard exec` with lock.backend=elasticsearch.

/// A `zkguard exec` command on the lock index `idx`, with a 2 s lease and 30 s waits.
fn exec_command(
    idx: &str,
    monitor: &str,
    lock_type: &str,
    script: &str,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::from(crate::cli::zkguard());
    cmd.args([
        "exec",
        "--monitor",
        monitor,
        "--type",
        lock_type,
        "--",
        "sh",
        "-c",
        script,
    ])
    .env("ZKGUARD_LOCK_BACKEND", "elasticsearch")
    .env("ZKGUARD_ELASTICSEARCH_URL", server().url())
    .env("ZKGUARD_ELASTICSEARCH_LOCK_INDEX", idx)
    .env("ZKGUARD_ELASTICSEARCH_LOCK_TTL", "2000")
    .env("ZKGUARD_ELASTICSEARCH_LOCK_CLOCK_SKEW", "200")
    .env("ZKGUARD_ZOOKEEPER_FOREGROUND_TASK_TIMEOUT", "30000")
    .env("ZKGUARD_ZOOKEEPER_BACKGROUND_TASK_TIMEOUT", "30000")
    .env_remove("ZKGUARD_CONFIG")
    .kill_on_drop(true);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exclusion_across_zkguard_exec_processes() {
    let idx = index("exec");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    // Inside the lock: claim a directory (mkdir fails if another holder has it), do a
    // read-increment-write of a counter file, log the fencing token, give the claim back.
    let script = format!(
        "mkdir {d}/inside || echo overlap >> {d}/overlaps; \
         n=$(cat {d}/counter 2>/dev/null || echo 0); sleep 0.02; echo $((n+1)) > {d}/counter; \
         echo $ZKGUARD_FENCING_TOKEN >> {d}/tokens; rmdir {d}/inside"
    );
    const WORKERS: usize = 4;
    const RUNS: usize = 4;
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (idx, script) = (idx.clone(), script.clone());
        workers.push(tokio::spawn(async move {
            for r in 0..RUNS {
                let lock_type = if (w + r) % 2 == 0 {
                    "foreground"
                } else {
                    "background"
                };
                let out = exec_command(&idx, "shared", lock_type, &script)
                    .output()
                    .await
                    .unwrap();
                assert!(
                    out.status.success(),
                    "zkguard exec failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    assert!(
        !dir.path().join("overlaps").exists(),
        "two processes ran under the lock at once"
    );
    let counter = std::fs::read_to_string(dir.path().join("counter")).unwrap();
    assert_eq!(
        counter.trim(),
        (WORKERS * RUNS).to_string(),
        "an increment was lost"
    );
    let tokens: Vec<u64> = std::fs::read_to_string(dir.path().join("tokens"))
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(tokens.len(), WORKERS * RUNS);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly increase: {tokens:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_foreground_exec_does_not_block_background_forever() {
    let idx = index("exec-crash");
    let monitor = "shared";
    let svc = builder(&idx, 2000, 200).build().unwrap();
    let holder = svc.lock(LockRequest::new(monitor, "holder")).await.unwrap();
    // A foreground `zkguard exec` queues up behind the holder, then is killed (SIGKILL): it
    // cannot remove its registration.
    let mut waiter = exec_command(&idx, monitor, "foreground", "true")
        .spawn()
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "the exec process to register",
        || async { !svc.foreground_waiters(monitor).await.unwrap().is_empty() },
    )
    .await;
    waiter.start_kill().unwrap();
    waiter.wait().await.unwrap();
    let registration = svc.foreground_waiters(monitor).await.unwrap();
    assert_eq!(
        registration.len(),
        1,
        "the killed waiter's registration stays behind"
    );
    let expires = registration[0].expires;
    holder.must_release().await.unwrap();
    let out = exec_command(&idx, monitor, "background", "echo $ZKGUARD_FENCING_TOKEN")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = svc.status(monitor).await.unwrap().unwrap();
    assert!(
        status.record.acquired > expires + 200,
        "background ran while the registration was live"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        status.record.token.to_string()
    );
    assert_eq!(status.record.state, LockState::Free);
}

use crate::common::eventually;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_takes_a_free_lock_and_otherwise_fails_at_once_naming_what_is_in_the_way() {
    let idx = index("try");
    let monitor = "m";
    let svc = builder(&idx, 5000, 100).build().unwrap();
    let other = builder(&idx, 5000, 100).build().unwrap();
    // Free (no lock document yet): taken on the single try.
    let g = svc
        .try_lock(LockRequest::new(monitor, "Save Content"))
        .await
        .unwrap();
    // Held: fails at once, naming the holder from the lock document, registering nothing.
    for request in [
        LockRequest::new(monitor, "second"),
        LockRequest::new(monitor, "second").with_type(LockType::Background),
    ] {
        let err = other.try_lock(request).await.unwrap_err();
        match err.blocked_by() {
            Some(Blocker::Holder { owner, info, .. }) => {
                assert_eq!(owner.as_deref(), Some(g.owner()), "{err}");
                assert_eq!(info.as_deref(), Some("Save Content"), "{err}");
            }
            _ => panic!("expected the holder to be named: {err}"),
        }
        assert!(err.to_string().contains(g.owner()), "{err}");
    }
    assert!(svc.foreground_waiters(monitor).await.unwrap().is_empty());
    // A zero timeout through the lock service trait is the same try.
    let err = LockService::acquire(
        &other,
        LockRequest::new(monitor, "second").with_timeout(Duration::ZERO),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");

    // A foreground contender waits (its registration outlives it: the future is leaked).
    let mut waiting = Box::pin(other.lock(LockRequest::new(monitor, "waiting")));
    tokio::select! {
        r = &mut waiting => panic!("the waiter must not get the lock: {r:?}"),
        _ = eventually(Duration::from_secs(5), "the waiter to register", || async {
            !svc.foreground_waiters(monitor).await.unwrap().is_empty()
        }) => {}
    }
    std::mem::forget(waiting);
    g.must_release().await.unwrap();
    // The lock is free, but a background try lets the foreground waiter go first.
    let err = svc
        .try_lock(LockRequest::new(monitor, "bg").with_type(LockType::Background))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.blocked_by(),
            Some(Blocker::ForegroundWaiters { count: 1 })
        ),
        "{err}"
    );
    // A foreground try takes it.
    let fg = svc.try_lock(LockRequest::new(monitor, "fg")).await.unwrap();
    fg.must_release().await.unwrap();
}
