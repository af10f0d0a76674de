//! Two-phase-commit transactions against a real `osmem-server`: crashes at every step, recovery,
//! stale and concurrent workers, lost replies, validation, and a bank of concurrent transfers.

use crate::txn_support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use serde_json::json;
use txn_support::*;
use zkguard::es::{Refresh, WriteCondition};
use zkguard::txn::{HookPoint, Rejection, RetryPolicy, Step, TransferRequest, TxnError, TxnState};

const CORE: [Step; 8] = [
    Step::Create,
    Step::MarkPending,
    Step::ApplySource,
    Step::ApplyDestination,
    Step::MarkCommitted,
    Step::RemoveSource,
    Step::RemoveDestination,
    Step::MarkFinished,
];

/// The stored state right after a crash at `point` of a transfer (None: not logged).
fn state_after_crash(point: HookPoint) -> Option<TxnState> {
    let (step, after) = match point {
        HookPoint::BeforeWrite(s) => (s, false),
        HookPoint::After(s) => (s, true),
    };
    let i = CORE.iter().position(|s| *s == step).unwrap();
    // Index of the last completed step.
    let done = if after { i as i64 } else { i as i64 - 1 };
    Some(match done {
        -1 => return None,
        0 => TxnState::Created,
        1..=3 => TxnState::Pending,
        4..=6 => TxnState::Committed,
        _ => TxnState::Finished,
    })
}

fn initial(names: &[&str], balance: i64) -> BTreeMap<String, i64> {
    names.iter().map(|n| (n.to_string(), balance)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_at_every_core_step_then_recovery_finishes_each_once() {
    let store = store();
    let s = settings("core");
    let c = coordinator(store.clone(), &s);
    open_accounts(&c, &["src", "dst"], 10_000).await;

    let mut ids = Vec::new();
    for (i, step) in CORE.iter().enumerate() {
        for point in [HookPoint::BeforeWrite(*step), HookPoint::After(*step)] {
            let id = format!("core-{step}-{}", matches!(point, HookPoint::After(_)));
            let amount = 10 * (i as i64 + 1) + i64::from(matches!(point, HookPoint::After(_)));
            let hook = CrashAt::new(point);
            let worker = coordinator(store.clone(), &s).with_hook(hook.clone());
            let err = worker
                .transfer(TransferRequest::new("src", "dst", amount).with_id(&id))
                .await
                .unwrap_err();
            assert!(
                matches!(err, TxnError::Interrupted { point: p, .. } if p == point),
                "{id}: {err}"
            );
            assert!(hook.fired());
            let stored = c.transaction(&id).await.unwrap().map(|t| t.state);
            assert_eq!(
                stored,
                state_after_crash(point),
                "state of {id} after a crash {point}"
            );
            ids.push((id, amount, stored.is_some()));
        }
    }

    recover_all(&c).await;
    for (id, _, logged) in &ids {
        let state = c.transaction(id).await.unwrap().map(|t| t.state);
        assert_eq!(state, logged.then_some(TxnState::Finished), "{id}");
    }
    assert_books(&store, &c, &s, &initial(&["src", "dst"], 10_000)).await;
    let moved: i64 = ids
        .iter()
        .filter(|(_, _, logged)| *logged)
        .map(|(_, a, _)| a)
        .sum();
    assert_eq!(balance(&c, "dst").await, 10_000 + moved);

    // Replaying every request now changes nothing; the unlogged one runs for the first time.
    for (id, amount, logged) in &ids {
        let t = c
            .transfer(TransferRequest::new("src", "dst", *amount).with_id(id))
            .await
            .unwrap();
        assert_eq!(t.state, TxnState::Finished);
        if !logged {
            assert_eq!(balance(&c, "dst").await, 10_000 + moved + amount);
        }
    }
    assert_eq!(c.recover_once().await.unwrap().examined, 0);
    assert_books(&store, &c, &s, &initial(&["src", "dst"], 10_000)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_at_every_rollback_step_then_recovery_rolls_back() {
    let store = store();
    let s = settings("rollback");
    let c = coordinator(store.clone(), &s);
    open_accounts(&c, &["src", "dst"], 10_000).await;

    let rollback_steps = [
        Step::MarkTerminating,
        Step::UndoSource,
        Step::UndoDestination,
        Step::MarkRolledBack,
    ];
    // (where the forward work stopped, the rollback steps that path goes through)
    let cases: [(HookPoint, &[Step]); 3] = [
        (HookPoint::After(Step::Create), &[Step::MarkRolledBack]),
        (HookPoint::After(Step::ApplySource), &rollback_steps),
        (HookPoint::After(Step::ApplyDestination), &rollback_steps),
    ];
    let mut ids = Vec::new();
    for (n, (stop, steps)) in cases.iter().enumerate() {
        for step in steps.iter() {
            for point in [HookPoint::BeforeWrite(*step), HookPoint::After(*step)] {
                let id = format!("rb-{n}-{step}-{}", matches!(point, HookPoint::After(_)));
                let worker = coordinator(store.clone(), &s).with_hook(CrashAt::new(*stop));
                let amount = 7 + ids.len() as i64;
                let err = worker
                    .transfer(TransferRequest::new("src", "dst", amount).with_id(&id))
                    .await
                    .unwrap_err();
                assert!(matches!(err, TxnError::Interrupted { .. }), "{err}");

                let hook = CrashAt::new(point);
                let roller = coordinator(store.clone(), &s).with_hook(hook.clone());
                let err = roller.rollback(&id, "test").await.unwrap_err();
                assert!(
                    matches!(err, TxnError::Interrupted { point: p, .. } if p == point),
                    "{id}: {err}"
                );
                let state = c.transaction(&id).await.unwrap().unwrap().state;
                let expected = match point {
                    HookPoint::After(Step::MarkRolledBack) => TxnState::RolledBack,
                    HookPoint::BeforeWrite(Step::MarkTerminating) => TxnState::Pending,
                    HookPoint::BeforeWrite(Step::MarkRolledBack)
                        if *stop == HookPoint::After(Step::Create) =>
                    {
                        TxnState::Created
                    }
                    _ => TxnState::Terminating,
                };
                assert_eq!(state, expected, "{id} after a crash {point}");
                ids.push((id, expected));
            }
        }
    }

    recover_all(&c).await;
    for (id, at_crash) in &ids {
        let t = c.transaction(id).await.unwrap().unwrap();
        // A rollback that crashed before its first write leaves a created or pending transaction,
        // which recovery runs forward: only a stored rollback decision is final.
        let expected = if matches!(at_crash, TxnState::Created | TxnState::Pending) {
            TxnState::Finished
        } else {
            TxnState::RolledBack
        };
        assert_eq!(t.state, expected, "{id}");
        if expected == TxnState::RolledBack {
            assert!(
                t.reason
                    .as_deref()
                    .unwrap()
                    .contains("rolled back on request: test"),
                "{t:?}"
            );
        }
    }
    assert_books(&store, &c, &s, &initial(&["src", "dst"], 10_000)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_rejected_before_anything_is_written() {
    let store = store();
    let s = settings("valid");
    let c = coordinator(store.clone(), &s);
    open_accounts(&c, &["A", "B"], 100).await;

    let cases = [
        (TransferRequest::new("A", "B", 0), "amount must be positive"),
        (
            TransferRequest::new("A", "B", -5),
            "amount must be positive, got -5",
        ),
        (TransferRequest::new("A", "A", 5), "same account `A`"),
        (
            TransferRequest::new("A", "nobody", 5),
            "unknown account `nobody`",
        ),
        (
            TransferRequest::new("ghost", "B", 5),
            "unknown account `ghost`",
        ),
        (
            TransferRequest::new("A", "B", 101),
            "`A` has 100 units, fewer than the 101",
        ),
    ];
    for (req, needle) in cases {
        let id = req.id.clone();
        let err = c.transfer(req).await.unwrap_err();
        assert!(matches!(err, TxnError::Rejected { .. }), "{err}");
        assert!(err.is_bad_input());
        assert!(err.to_string().contains(needle), "{err}");
        assert!(
            c.transaction(&id).await.unwrap().is_none(),
            "a rejected transfer was logged"
        );
    }
    for (req, needle) in [
        (
            TransferRequest::new("A", "B", 1).with_id("a/b"),
            "contains '/'",
        ),
        (
            TransferRequest::new("A", "B", 1).with_id("_x"),
            "starts with `_`",
        ),
        (TransferRequest::new("A", "B", 1).with_id(""), "empty"),
        (TransferRequest::new("A b", "B", 1), "invalid account id"),
    ] {
        let err = c.transfer(req).await.unwrap_err();
        assert!(
            matches!(err, TxnError::InvalidId { .. }) && err.to_string().contains(needle),
            "{err}"
        );
    }
    assert_eq!(
        c.audit()
            .await
            .unwrap()
            .transactions
            .values()
            .sum::<usize>(),
        0
    );

    // With overdrafts allowed the same transfer goes through.
    let mut lenient = s.clone();
    lenient.allow_overdraft = true;
    let l = coordinator(store.clone(), &lenient);
    l.transfer(TransferRequest::new("A", "B", 101))
        .await
        .unwrap();
    assert_eq!(balance(&c, "A").await, -1);
    assert_eq!(balance(&c, "B").await, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_failing_after_creation_end_rolled_back_with_the_reason() {
    let store = store();
    let s = settings("late");
    let c = coordinator(store.clone(), &s);
    open_accounts(&c, &["X", "Y", "Z"], 100).await;

    // Created, then the source is drained: the created transaction is rolled back.
    let t1 = c
        .submit(TransferRequest::new("X", "Y", 80).with_id("t1"))
        .await
        .unwrap();
    assert_eq!(t1.state, TxnState::Created);
    c.transfer(TransferRequest::new("X", "Y", 50))
        .await
        .unwrap();
    let t1 = c.resume("t1").await.unwrap();
    assert_eq!(t1.state, TxnState::RolledBack);
    assert!(
        t1.reason
            .as_deref()
            .unwrap()
            .contains("has 50 units, fewer than the 80"),
        "{t1:?}"
    );
    let err = c
        .transfer(TransferRequest::new("X", "Y", 80).with_id("t1"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, TxnError::RolledBack { transaction } if transaction.id == "t1"),
        "{err}"
    );
    assert!(err.to_string().contains("fewer than the 80"), "{err}");

    // Pending, then the source is drained: rolled back at the apply step, through `terminating`.
    let crash = CrashAt::new(HookPoint::After(Step::MarkPending));
    let w = coordinator(store.clone(), &s).with_hook(crash);
    assert!(w
        .transfer(TransferRequest::new("X", "Y", 40).with_id("t3"))
        .await
        .is_err());
    c.transfer(TransferRequest::new("X", "Y", 30))
        .await
        .unwrap();
    recover_all(&c).await;
    let t3 = c.transaction("t3").await.unwrap().unwrap();
    assert_eq!(t3.state, TxnState::RolledBack);
    assert!(
        t3.reason
            .as_deref()
            .unwrap()
            .contains("`X` has 20 units, fewer than the 40"),
        "{t3:?}"
    );

    // An account that disappears after creation.
    c.submit(TransferRequest::new("Y", "Z", 5).with_id("t5"))
        .await
        .unwrap();
    store
        .delete(&s.accounts_index, "Z", WriteCondition::Always, Refresh::No)
        .await
        .unwrap();
    let t5 = c.resume("t5").await.unwrap();
    assert_eq!(t5.state, TxnState::RolledBack);
    assert!(
        t5.reason
            .as_deref()
            .unwrap()
            .contains("unknown account `Z`"),
        "{t5:?}"
    );

    // Transactions logged by someone else with bad content.
    for (id, amount, to, needle) in [
        ("raw1", 0, "Y", "must be positive"),
        ("raw2", 3, "X", "same account"),
    ] {
        let now = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
        let doc = json!({"amount": amount, "src_acct": "X", "dest_acct": to, "transaction_state": "created",
                         "creation_time": now, "modification_time": now});
        store
            .index(
                &s.transactions_index,
                id,
                &doc,
                WriteCondition::Create,
                Refresh::No,
            )
            .await
            .unwrap();
        let t = c.resume(id).await.unwrap();
        assert_eq!(t.state, TxnState::RolledBack);
        assert!(t.reason.as_deref().unwrap().contains(needle), "{t:?}");
    }
    c.create_account("Z", 100).await.unwrap();
    assert_books(&store, &c, &s, &initial(&["X", "Y", "Z"], 100)).await;
    assert_eq!(balance(&c, "X").await, 20);
}

/// A worker that read the account and saw `pending`, and then stalls right before its write,
/// must not apply the transaction once another worker rolled it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_apply_is_fenced_after_a_rollback() {
    let store = store();
    let s = settings("stale-rb");
    let c = coordinator(store.clone(), &s);
    open_accounts(&c, &["A", "B"], 100).await;
    c.submit(TransferRequest::new("A", "B", 30).with_id("t"))
        .await
        .unwrap();

    let pause = PauseAt::new(HookPoint::BeforeWrite(Step::ApplySource));
    let stale = Arc::new(coordinator(store.clone(), &s).with_hook(pause.clone()));
    let task = tokio::spawn({
        let stale = stale.clone();
        async move { stale.resume("t").await }
    });
    pause.reached.notified().await;
    let t = c.rollback("t", "while a worker stalls").await.unwrap();
    assert_eq!(t.state, TxnState::RolledBack);
    pause.release.notify_one();
    let t = task.await.unwrap().unwrap();
    assert_eq!(
        t.state,
        TxnState::RolledBack,
        "the stale worker must observe the rollback"
    );
    assert_eq!(
        balance(&c, "A").await,
        100,
        "the stale worker applied a rolled-back transaction"
    );
    assert_books(&store, &c, &s, &initial(&["A", "B"], 100)).await;
}

/// Same with a transaction another worker completed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_apply_is_fenced_after_a_commit() {
    let store = store();
    let s = settings("stale-ok");
    let c = coordinator(store.clone(), &s);
    open_accounts(&c, &["A", "B"], 100).await;

    for step in [Step::ApplySource, Step::ApplyDestination] {
        let id = format!("t-{step}");
        c.submit(TransferRequest::new("A", "B", 10).with_id(&id))
            .await
            .unwrap();
        let pause = PauseAt::new(HookPoint::BeforeWrite(step));
        let stale = Arc::new(coordinator(store.clone(), &s).with_hook(pause.clone()));
        let task = tokio::spawn({
            let (stale, id) = (stale.clone(), id.clone());
            async move { stale.resume(&id).await }
        });
        pause.reached.notified().await;
        assert_eq!(c.resume(&id).await.unwrap().state, TxnState::Finished);
        pause.release.notify_one();
        assert_eq!(task.await.unwrap().unwrap().state, TxnState::Finished);
    }
    assert_eq!(balance(&c, "A").await, 100 - 10 - 10);
    assert_books(&store, &c, &s, &initial(&["A", "B"], 100)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_workers_on_the_same_transaction_apply_it_once() {
    let store = store();
    let s = settings("same-id");
    let c = Arc::new(coordinator(store.clone(), &s));
    open_accounts(&c, &["A", "B"], 10_000).await;
    let jitter = || {
        Arc::new(RandomCrashes {
            every: u32::MAX,
            crashes: AtomicU64::new(0),
        })
    };

    // Forward only: resumes and replays of the same request race on each transaction.
    for i in 0..8 {
        let id = format!("fw-{i}");
        let req = TransferRequest::new("A", "B", 10 + i).with_id(&id);
        c.submit(req.clone()).await.unwrap();
        let mut tasks = Vec::new();
        for w in 0..6 {
            let worker = coordinator(store.clone(), &s).with_hook(jitter());
            let (req, id) = (req.clone(), id.clone());
            tasks.push(tokio::spawn(async move {
                if w % 2 == 0 {
                    worker.resume(&id).await
                } else {
                    worker.transfer(req).await
                }
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap().state, TxnState::Finished);
        }
    }
    assert_eq!(balance(&c, "B").await, 10_000 + (10..18).sum::<i64>());

    // Forward workers racing a rollback: either outcome, never both, never twice.
    let mut outcomes = BTreeMap::new();
    for i in 0..12 {
        let id = format!("mix-{i}");
        c.submit(TransferRequest::new("A", "B", 5).with_id(&id))
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for w in 0..4 {
            let worker = coordinator(store.clone(), &s).with_hook(jitter());
            let id = id.clone();
            let delay = Duration::from_micros(rand::thread_rng().gen_range(0..3000));
            tasks.push(tokio::spawn(async move {
                if w == 0 {
                    tokio::time::sleep(delay).await;
                    worker.rollback(&id, "race").await.map(|t| t.state)
                } else {
                    worker.resume(&id).await.map(|t| t.state)
                }
            }));
        }
        let mut states = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(state) => states.push(state),
                Err(TxnError::NotRollbackable { state, .. }) => states.push(state),
                Err(e) => panic!("{id}: {e}"),
            }
        }
        let stored = c.transaction(&id).await.unwrap().unwrap().state;
        assert!(
            states.iter().all(|st| *st == stored),
            "{id}: workers saw {states:?}, stored {stored}"
        );
        *outcomes.entry(stored).or_insert(0) += 1;
    }
    assert_books(&store, &c, &s, &initial(&["A", "B"], 10_000)).await;
    eprintln!("rollback races: {outcomes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_reply_was_lost_is_recognised_on_replay() {
    let store = store();
    let s = settings("replay");
    let plain = coordinator(store.clone(), &s);
    open_accounts(&plain, &["A", "B"], 1000).await;
    let txn_index = s.transactions_index.clone();

    // The coordinator's own retry of the create meets the document its first attempt created.
    let lossy = lossy_store(store.clone(), move |_, index, cond| {
        index == txn_index && cond == WriteCondition::Create
    });
    let c = coordinator(lossy.clone(), &s);
    let t = c
        .transfer(TransferRequest::new("A", "B", 100).with_id("lost-1"))
        .await
        .unwrap();
    assert_eq!(t.state, TxnState::Finished);
    assert_eq!(lossy.hook().lost.load(Ordering::SeqCst), 1);
    assert_eq!(balance(&plain, "B").await, 1100);

    // Without retries the caller sees the failure and replays the request itself.
    let once = coordinator(lossy.clone(), &s).with_retry(RetryPolicy {
        attempts: 1,
        ..RetryPolicy::default()
    });
    let err = once
        .transfer(TransferRequest::new("A", "B", 50).with_id("lost-2"))
        .await
        .unwrap_err();
    assert!(matches!(err, TxnError::Store { .. }), "{err}");
    assert_eq!(
        plain.transaction("lost-2").await.unwrap().unwrap().state,
        TxnState::Created
    );
    let t = plain
        .transfer(TransferRequest::new("A", "B", 50).with_id("lost-2"))
        .await
        .unwrap();
    assert_eq!(t.state, TxnState::Finished);
    assert_eq!(balance(&plain, "B").await, 1150);

    // The same id with other content is refused, whatever the state of the stored transfer.
    for id in ["lost-1", "lost-2"] {
        let err = plain
            .transfer(TransferRequest::new("A", "B", 51).with_id(id))
            .await
            .unwrap_err();
        assert!(matches!(err, TxnError::IdConflict { .. }), "{err}");
        assert!(err.to_string().contains("not 51 from `A` to `B`"), "{err}");
        let err = plain
            .submit(TransferRequest::new("B", "A", 100).with_id(id))
            .await
            .unwrap_err();
        assert!(matches!(err, TxnError::IdConflict { .. }), "{err}");
    }

    // Lost replies on every kind of write: each step re-runs after its reply is lost.
    let every_third = lossy_store(store.clone(), |n, _, _| n % 3 == 0);
    let c = coordinator(every_third.clone(), &s);
    for i in 0..15 {
        let (from, to) = if i % 2 == 0 { ("A", "B") } else { ("B", "A") };
        let t = c
            .transfer(TransferRequest::new(from, to, 1 + i))
            .await
            .unwrap();
        assert_eq!(t.state, TxnState::Finished);
    }
    c.rollback(
        &c.submit(TransferRequest::new("A", "B", 9))
            .await
            .unwrap()
            .id,
        "x",
    )
    .await
    .unwrap();
    assert!(every_third.hook().lost.load(Ordering::SeqCst) >= 30);
    assert_books(&store, &plain, &s, &initial(&["A", "B"], 1000)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bank_of_concurrent_transfers_with_crashes_and_recovery() {
    const ACCOUNTS: [&str; 6] = ["a0", "a1", "a2", "a3", "a4", "a5"];
    let store = store();
    let s = settings("bank");
    let c = Arc::new(coordinator(store.clone(), &s).with_recovery_tuning(
        Duration::from_millis(50),
        20,
        3,
    ));
    open_accounts(&c, &ACCOUNTS, 1000).await;

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let recovery = tokio::spawn({
        let c = c.clone();
        async move {
            c.run_recovery(Duration::from_millis(20), async {
                stop_rx.await.unwrap_or(())
            })
            .await
        }
    });

    let crashes = Arc::new(RandomCrashes {
        every: 40,
        crashes: AtomicU64::new(0),
    });
    let mut workers = Vec::new();
    for w in 0..4u64 {
        let lossy = lossy_store(store.clone(), move |n, _, _| (n + w) % 11 == 0);
        let worker = coordinator(lossy, &s).with_hook(crashes.clone());
        workers.push(tokio::spawn(async move {
            let mut tally = BTreeMap::<&'static str, u32>::new();
            let mut mine: Vec<String> = Vec::new();
            let mut crashed: Vec<String> = Vec::new();
            for _ in 0..30 {
                let (from, to, amount, roll) = {
                    let mut rng = rand::thread_rng();
                    let from = rng.gen_range(0..ACCOUNTS.len());
                    let to = (from + rng.gen_range(1..ACCOUNTS.len())) % ACCOUNTS.len();
                    (
                        ACCOUNTS[from],
                        ACCOUNTS[to],
                        rng.gen_range(1..400),
                        rng.gen_range(0..8) == 0,
                    )
                };
                if roll && !mine.is_empty() {
                    // Prefer a transfer that crashed: it may still be in flight.
                    let id = crashed.pop().unwrap_or_else(|| {
                        mine[rand::thread_rng().gen_range(0..mine.len())].clone()
                    });
                    let key = match worker.rollback(&id, "bank").await {
                        Ok(_) => "rollback",
                        Err(TxnError::NotRollbackable { .. }) => "rollback-refused",
                        Err(TxnError::NotFound { .. }) => "rollback-unknown",
                        Err(TxnError::Interrupted { .. }) => "crashed",
                        Err(e) => panic!("rollback {id}: {e}"),
                    };
                    *tally.entry(key).or_default() += 1;
                    continue;
                }
                let req = TransferRequest::new(from, to, amount);
                let id = req.id.clone();
                mine.push(id.clone());
                let key = match worker.transfer(req).await {
                    Ok(_) => "finished",
                    Err(TxnError::Rejected { .. }) => "rejected",
                    Err(TxnError::RolledBack { .. }) => "rolled-back",
                    Err(TxnError::Interrupted { .. }) => {
                        crashed.push(id);
                        "crashed"
                    }
                    Err(e) => panic!("transfer: {e}"),
                };
                *tally.entry(key).or_default() += 1;
            }
            tally
        }));
    }
    let mut total = BTreeMap::new();
    for w in workers {
        for (k, v) in w.await.unwrap() {
            *total.entry(k).or_insert(0) += v;
        }
    }
    stop_tx.send(()).unwrap();
    recovery.await.unwrap();
    recover_all(&c).await;
    eprintln!(
        "bank: {total:?}, injected crashes: {}",
        crashes.crashes.load(Ordering::Relaxed)
    );
    assert!(
        crashes.crashes.load(Ordering::Relaxed) > 0,
        "no crash was injected"
    );
    assert!(
        total.get("finished").copied().unwrap_or(0) > 20,
        "{total:?}"
    );
    assert_books(&store, &c, &s, &initial(&ACCOUNTS, 1000)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_are_never_overwritten_and_rejections_are_typed() {
    let store = store();
    let s = settings("acct");
    let c = coordinator(store.clone(), &s);
    assert!(c.create_account("A", 10).await.unwrap());
    assert!(
        !c.create_account("A", 10).await.unwrap(),
        "an identical account is recognised"
    );
    let err = c.create_account("A", 11).await.unwrap_err();
    assert!(
        matches!(err, TxnError::AccountExists { balance: 10, .. }),
        "{err}"
    );
    c.reset_account("A", 11).await.unwrap();
    assert_eq!(balance(&c, "A").await, 11);
    let err = c
        .transfer(TransferRequest::new("A", "B", 1).with_id("x"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            TxnError::Rejected {
                reason: Rejection::UnknownAccount { .. },
                ..
            }
        ),
        "{err}"
    );
    let err = c.rollback("x", "r").await.unwrap_err();
    assert!(matches!(err, TxnError::NotFound { .. }), "{err}");
    // Indices are created with explicit mappings: the state is a keyword, so `rolled-back` is one term.
    c.create_account("B", 0).await.unwrap();
    c.submit(TransferRequest::new("A", "B", 1).with_id("y"))
        .await
        .unwrap();
    c.rollback("y", "r").await.unwrap();
    assert_eq!(
        c.audit().await.unwrap().transactions[&TxnState::RolledBack],
        1
    );
}
