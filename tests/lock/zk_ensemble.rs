//! A 3-node ensemble: killing the leader keeps the lock's guarantees (mutual exclusion,
//! increasing tokens) and the lock keeps working once a new leader is elected.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::logs::init_tracing;
use common::*;
use zkguard::testkit::ZkEnsemble;
use zkguard::{LockError, ZkBlockingWriteLock};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_keeps_exclusion_and_token_order() {
    init_tracing();
    let ensemble =
        tokio::task::spawn_blocking(|| ZkEnsemble::builder().size(3).tick_time(500).start())
            .await
            .unwrap()
            .expect("start a 3-node ensemble (run scripts/install-deps.sh)");
    let mut settings = zk_settings(&ensemble.connect_string(), "ensemble");
    // Longer than an election, so sessions survive the leader change.
    settings.session_timeout = Duration::from_millis(10_000);
    settings.foreground_timeout = Duration::from_secs(30);

    let inside = Arc::new(AtomicBool::new(false));
    let sections = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::<u64>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..3 {
        let s = session(&settings).await;
        let (inside, sections, tokens, stop) = (
            inside.clone(),
            sections.clone(),
            tokens.clone(),
            stop.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            while !stop.load(Ordering::Acquire) {
                match ZkBlockingWriteLock::new(format!("worker {w}"), &s, "shared")
                    .unwrap()
                    .lock_with_timeout()
                    .await
                {
                    Ok(g) => {
                        assert!(!inside.swap(true, Ordering::AcqRel), "two holders at once");
                        tokens.lock().unwrap().push(g.fencing_token());
                        tokio::task::yield_now().await;
                        inside.store(false, Ordering::Release);
                        sections.fetch_add(1, Ordering::AcqRel);
                        if let Err(e) = g.unlock().await {
                            errors.push(e.to_string());
                        }
                    }
                    // During the election requests fail with connection loss: retry.
                    Err(LockError::ConnectionLoss { .. }) => {}
                    Err(e) => panic!("worker {w}: {e}"),
                }
            }
            errors
        }));
    }
    let wait_sections = |n: usize, what: &'static str| {
        let sections = sections.clone();
        async move {
            let start = sections.load(Ordering::Acquire);
            eventually(Duration::from_secs(60), what, || {
                let sections = sections.clone();
                async move { sections.load(Ordering::Acquire) >= start + n }
            })
            .await;
        }
    };
    wait_sections(20, "lock cycles before the kill").await;
    let leader = ensemble.leader().expect("a leader");
    let killed_at = Instant::now();
    ensemble.kill(leader).unwrap();
    wait_sections(20, "lock cycles after the leader was killed").await;
    eprintln!(
        "20 lock cycles after killing leader {leader} within {:?}",
        killed_at.elapsed()
    );
    assert!(
        ensemble.leader().is_some_and(|l| l != leader),
        "a new leader"
    );
    stop.store(true, Ordering::Release);
    for w in workers {
        let errors = w.await.unwrap();
        // A release interrupted by the election may report the lock gone; never a panic.
        assert!(
            errors
                .iter()
                .all(|e| e.contains("no longer exists") || e.contains("connection")),
            "{errors:?}"
        );
    }
    let tokens = tokens.lock().unwrap();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens strictly increase: {tokens:?}"
    );
}
