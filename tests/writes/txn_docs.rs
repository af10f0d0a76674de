//! Document transactions (`zkguard::txn::multi`, `zkguard txn apply`, `zkguard txn recover`)
//! against a real ZooKeeper and osmem-server: all-or-nothing, expectations, limits, lock
//! timeouts, no deadlock, serializable results beside single-document writers, and recovery
//! after a coordinator killed (SIGKILL) after every step or stalled (SIGSTOP) past its locks.

use crate::txn_docs_support;

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::json;
use txn_docs_support::*;
use zkguard::lock::document_monitor;
use zkguard::txn::multi::{Decision, Expect, MultiError, MultiState, TxnOp, TxnRequest};
use zkguard::write::guarded::GuardedWriter;
use zkguard::{LockRequest, LockType};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_commits_every_document_or_none() {
    let env = Env::new("commit").await;
    env.seed(&[
        ("p", json!({"name": "Lamp", "stock": 3})),
        ("c", json!({"count": 7, "o": {"a": 1}})),
        ("old", json!({"x": 1})),
    ])
    .await;
    let p = env.doc("p").await.unwrap();
    let ops = vec![
        TxnOp::index(&env.index, "p", json!({"name": "Lamp", "stock": 2})).expect(
            Expect::Version {
                if_seq_no: p.meta.seq_no,
                if_primary_term: p.meta.primary_term,
            },
        ),
        TxnOp::update(&env.index, "c", json!({"count": 8, "o": {"b": 2}})).expect(Expect::Exists),
        TxnOp::delete(&env.index, "old"),
        TxnOp::index(&env.index, "new", json!({"fresh": true})).expect(Expect::Absent),
    ];
    let txns = env.transactions().await;
    let out = txns
        .apply(TxnRequest::new(ops.clone()).with_id("t-commit"))
        .await
        .unwrap();
    assert_eq!(out.state, Decision::Committed, "{out:?}");
    let results: Vec<_> = out
        .documents
        .iter()
        .map(|d| d.result.clone().unwrap())
        .collect();
    assert_eq!(results, ["updated", "updated", "deleted", "created"]);
    assert_eq!(
        env.source("p").await,
        Some(json!({"name": "Lamp", "stock": 2}))
    );
    assert_eq!(
        env.source("c").await,
        Some(json!({"count": 8, "o": {"a": 1, "b": 2}}))
    );
    assert_eq!(env.source("old").await, None);
    assert_eq!(env.source("new").await, Some(json!({"fresh": true})));
    // Each document's version is its lock's token, and no mark is left.
    for d in &out.documents[..2] {
        let stored = env.doc(&d.id).await.unwrap();
        assert_eq!(Some(stored.meta.version as u64), d.version);
        assert!(
            stored.source["zkguard"].get("txn").is_none(),
            "{:?}",
            stored.source
        );
    }
    assert_eq!(
        txns.get("t-commit").await.unwrap().unwrap().state,
        MultiState::Finished
    );
    // The same id and operations: the stored outcome; other operations: refused.
    let again = txns
        .apply(TxnRequest::new(ops).with_id("t-commit"))
        .await
        .unwrap();
    assert!(again.replayed && !out.replayed);
    assert_eq!((again.state, &again.documents), (out.state, &out.documents));
    let e = txns
        .apply(TxnRequest::new(vec![TxnOp::delete(&env.index, "p")]).with_id("t-commit"))
        .await
        .unwrap_err();
    assert!(matches!(e, MultiError::IdConflict { .. }), "{e}");
}

/// Every other reply of the log writes and the documents' `_bulk`s is lost after the server
/// applied the write: the coordinator's retries recognise its own writes, and the transaction
/// commits once, with every document in its after state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_replies_do_not_stop_a_transaction() {
    let env = Env::new("lossy").await;
    env.seed(&[("a", json!({"v": 1})), ("b", json!({"v": 1}))])
        .await;
    let hook = Arc::new(LoseEveryOtherReply {
        seen: Default::default(),
        lost: Default::default(),
    });
    let store = Arc::new(zkguard::es::HookedStore::new(
        env.store.clone(),
        hook.clone(),
    ));
    let txns =
        zkguard::txn::multi::Transactions::new(env.locks().await, store, env.settings.clone());
    let out = txns
        .apply(
            TxnRequest::new(vec![
                TxnOp::update(&env.index, "a", json!({"w": 2})),
                TxnOp::delete(&env.index, "b"),
                TxnOp::index(&env.index, "c", json!({"v": 3})),
            ])
            .with_id("lossy-1"),
        )
        .await
        .unwrap();
    assert_eq!(out.state, Decision::Committed, "{out:?}");
    assert!(hook.lost.load(std::sync::atomic::Ordering::SeqCst) >= 3);
    assert_eq!(env.source("a").await, Some(json!({"v": 1, "w": 2})));
    assert_eq!(env.source("b").await, None);
    assert_eq!(env.source("c").await, Some(json!({"v": 3})));
    assert_eq!(
        txns.get("lossy-1").await.unwrap().unwrap().state,
        MultiState::Finished
    );
}

/// A transaction first tries all its locks at once without waiting; a try that ZooKeeper does
/// not answer in time (here: its answers held for 2 s) is a connection loss for that try only:
/// the transaction goes on to wait for the lock within its own timeout (10 s), and commits once
/// ZooKeeper answers, instead of failing as unavailable after a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_try_zookeeper_does_not_answer_in_time_waits_within_the_transactions_timeout() {
    let mut env = Env::new("slowtry").await;
    let proxy = zkguard::testkit::proxy::ZkProxy::start(&env.zk.servers);
    env.zk.servers = proxy.connect_string();
    env.seed(&[("a", json!({"v": 1}))]).await;
    let txns = env.transactions().await;
    // From the first multi's answer on (the fast path of the first try), answers are held.
    proxy.hold_after(zkguard::testkit::proxy::OP_MULTI);
    let apply = tokio::spawn(async move {
        txns.apply(
            TxnRequest::new(vec![TxnOp::update(&env.index, "a", json!({"w": 2}))])
                .with_id("slowtry-1"),
        )
        .await
        .map(|out| (out, env))
    });
    // The fault: ZooKeeper's answers are late for 2 s, past the try's second to give up.
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.release_held();
    let (out, env) = apply
        .await
        .unwrap()
        .expect("the transaction waits within its timeout");
    assert_eq!(out.state, Decision::Committed, "{out:?}");
    assert!(proxy.holds() >= 1, "the answers were held");
    assert_eq!(env.source("a").await, Some(json!({"v": 1, "w": 2})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_expectation_rolls_back_naming_the_document() {
    let env = Env::new("expect").await;
    env.seed(&[("a", json!({"v": 1})), ("b", json!({"v": 1}))])
        .await;
    let txns = env.transactions().await;
    let cases = [
        (
            TxnOp::index(&env.index, "b", json!({"v": 2})).expect(Expect::Absent),
            "does not exist, but it exists",
        ),
        (
            TxnOp::update(&env.index, "zz", json!({"v": 2})),
            "set \"upsert\": true",
        ),
        (
            TxnOp::delete(&env.index, "b").expect(Expect::Version {
                if_seq_no: 999,
                if_primary_term: 1,
            }),
            "_seq_no 999",
        ),
    ];
    for (n, (op, needle)) in cases.into_iter().enumerate() {
        let failed = format!("{}/{}", op.index, op.id);
        let ops = vec![TxnOp::index(&env.index, "a", json!({"v": 2})), op];
        let id = format!("t-expect-{n}");
        let out = txns.apply(TxnRequest::new(ops).with_id(&id)).await.unwrap();
        assert_eq!(out.state, Decision::RolledBack, "{out:?}");
        assert_eq!(out.failed.as_deref(), Some(failed.as_str()));
        let reason = out.reason.clone().unwrap();
        assert!(
            reason.contains(needle) && reason.contains(&failed),
            "{reason}"
        );
        assert_eq!(
            txns.get(&id).await.unwrap().unwrap().state,
            MultiState::RolledBack
        );
    }
    assert_eq!(env.source("a").await, Some(json!({"v": 1})));
    assert_eq!(env.source("b").await, Some(json!({"v": 1})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_and_bad_input_are_refused_before_any_lock() {
    let mut env = Env::new("limits").await;
    env.settings.max_operations = 2;
    env.settings.max_bytes = 64;
    let txns = env.transactions().await;
    let op = |id: &str| TxnOp::index(&env.index, id, json!({"v": 1}));
    let e = txns
        .apply(TxnRequest::new(vec![op("1"), op("2"), op("3")]))
        .await
        .unwrap_err();
    assert!(
        matches!(e, MultiError::TooLarge { .. }) && e.to_string().contains("txn.max.operations"),
        "{e}"
    );
    let big = TxnOp::index(&env.index, "1", json!({"v": "x".repeat(100)}));
    let e = txns.apply(TxnRequest::new(vec![big])).await.unwrap_err();
    assert!(e.to_string().contains("txn.max.bytes"), "{e}");
    let e = txns
        .apply(TxnRequest::new(vec![op("1"), op("1")]))
        .await
        .unwrap_err();
    assert!(
        e.is_bad_input() && e.to_string().contains("appears twice"),
        "{e}"
    );
    let e = zkguard::txn::multi::parse_ndjson("{\"action\":\"move\",\"index\":\"a\",\"id\":\"1\"}")
        .unwrap_err();
    assert!(
        e.to_string().contains("line 1") && e.to_string().contains("move"),
        "{e}"
    );
    let mut stamp = zkguard::config::Settings::default().stamp;
    stamp.off = zkguard::write::stamping::IndexPatterns::parse(&env.index).unwrap();
    let e = env
        .transactions()
        .await
        .with_stamp_settings(&stamp)
        .apply(TxnRequest::new(vec![op("1")]))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("elastic.stamp.off"), "{e}");
    assert_eq!(env.source("1").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_not_acquired_in_time_rolls_back_naming_the_monitor() {
    let env = Env::new("timeout").await;
    env.seed(&[("a", json!({"v": 1})), ("b", json!({"v": 1}))])
        .await;
    let holder = env.locks().await;
    let monitor = document_monitor(&env.index, "b");
    let guard = holder
        .acquire(LockRequest::new(monitor.clone(), "someone else"))
        .await
        .unwrap();
    let txns = env
        .transactions()
        .await
        .with_lock_timeout(Duration::from_millis(300));
    let out = txns
        .apply(TxnRequest::new(vec![
            TxnOp::index(&env.index, "a", json!({"v": 2})),
            TxnOp::index(&env.index, "b", json!({"v": 2})),
        ]))
        .await
        .unwrap();
    assert_eq!(out.state, Decision::RolledBack);
    assert_eq!(out.blocked_by.as_deref(), Some(monitor.as_str()));
    assert!(
        out.reason.as_deref().unwrap().contains("someone else"),
        "{out:?}"
    );
    guard.unlock().await.unwrap();
    assert_eq!(env.source("a").await, Some(json!({"v": 1})));
}

/// Two workers apply transactions over the same documents listed in opposite orders, beside a
/// single-document writer on them: nobody deadlocks, every transaction commits, and the final
/// documents are those of a serial order (checked through the fencing tokens, which ZooKeeper
/// issues in the order the locks are granted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_do_not_deadlock_and_results_are_serial() {
    let env = Env::new("serial").await;
    let names = ["d0", "d1", "d2", "d3"];
    let txns = Arc::new(
        env.transactions()
            .await
            .with_lock_timeout(Duration::from_secs(20)),
    );
    let mut tasks = Vec::new();
    for worker in 0..2 {
        let txns = txns.clone();
        let index = env.index.clone();
        tasks.push(tokio::spawn(async move {
            let mut committed = Vec::new();
            for round in 0..12 {
                let mut docs: Vec<&str> = names
                    .iter()
                    .copied()
                    .filter(|d| (round + d.len() + worker) % 3 != 0 || *d == "d0")
                    .collect();
                if worker == 1 {
                    docs.reverse();
                }
                let id = format!("w{worker}-{round}");
                let ops = docs
                    .iter()
                    .map(|d| TxnOp::index(&index, d, json!({"txn": id})))
                    .collect();
                let lock_type = if round % 2 == 0 {
                    LockType::Foreground
                } else {
                    LockType::Background
                };
                let out = txns
                    .apply(TxnRequest::new(ops).with_id(&id).with_type(lock_type))
                    .await
                    .unwrap();
                assert_eq!(out.state, Decision::Committed, "{out:?}");
                committed.push(out);
            }
            committed
        }));
    }
    let single = {
        let writer = GuardedWriter::new(env.locks().await, env.store.clone());
        let index = env.index.clone();
        tokio::spawn(async move {
            for n in 0..12 {
                let doc = names[n % names.len()];
                writer
                    .on(document_monitor(&index, doc))
                    .index(&index, doc, json!({"single": n}))
                    .await
                    .unwrap();
            }
        })
    };
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.extend(t.await.unwrap());
    }
    single.await.unwrap();
    // Serializable: two transactions that share documents are ordered the same way on all of
    // them (each document's writes are ordered by their tokens), and a document that shows a
    // transaction's write shows the last transaction that wrote it, at that one's token.
    for (i, a) in outcomes.iter().enumerate() {
        for b in &outcomes[i + 1..] {
            let orders: std::collections::HashSet<bool> = a
                .documents
                .iter()
                .filter_map(|x| {
                    b.documents
                        .iter()
                        .find(|y| y.id == x.id)
                        .map(|y| x.version < y.version)
                })
                .collect();
            assert!(
                orders.len() <= 1,
                "{} and {} are ordered differently on different documents",
                a.transaction_id,
                b.transaction_id
            );
        }
    }
    for d in names {
        let doc = env.doc(d).await.unwrap();
        if let Some(shown) = doc.source["txn"].as_str() {
            let (token, last) = outcomes
                .iter()
                .filter_map(|o| {
                    o.documents
                        .iter()
                        .find(|x| x.id == d)
                        .map(|x| (x.version.unwrap(), o.transaction_id.as_str()))
                })
                .max()
                .unwrap();
            assert_eq!((shown, doc.meta.version as u64), (last, token), "{d}");
        }
    }
}

/// The coordinator is killed (SIGKILL) after every step of the protocol in turn, for
/// transactions of 2 to 10 documents; `zkguard txn recover` then leaves every document wholly
/// in its before or its after state, with no mark, and the log says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_killed_after_any_step_is_recovered_all_or_nothing() {
    let env = Env::new("kill").await;
    let mut cases = Vec::new();
    for size in 2..=10usize {
        for point in points(size) {
            cases.push(CrashCase::new(&env, size, &point));
        }
    }
    for chunk in cases.chunks(12) {
        for case in chunk {
            case.seed(&env).await;
        }
        let children: Vec<_> = chunk.iter().map(|c| c.spawn_paused(&env)).collect();
        for mut child in children {
            child.kill();
        }
    }
    let recovered = env.cli(&["recover", "--once", "--lock-wait", "30s", "--json"], "");
    assert_eq!(recovered.code, 0, "{recovered:?}");
    for case in &cases {
        case.check(&env).await;
    }
}

/// A coordinator stopped (SIGSTOP) half-way through its writes past its lock's session is
/// fenced: recovery takes fresh locks and undoes the transaction, and the coordinator, let go
/// on, writes nothing more and says it was stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_coordinator_is_fenced_and_its_transaction_undone() {
    let env = Env::new("stall").await;
    let case = CrashCase::new(&env, 3, "applied:1");
    case.seed(&env).await;
    let child = case.spawn_paused(&env);
    child.signal(Signal::SIGSTOP);
    let recovered = env.cli(&["recover", "--once", "--lock-wait", "30s", "--json"], "");
    assert_eq!(recovered.code, 0, "{recovered:?}");
    assert!(recovered.stdout.contains(&case.id), "{recovered:?}");
    child.signal(Signal::SIGCONT);
    let run = child.resume_and_wait();
    assert_eq!(run.code, 75, "{run:?}");
    assert!(run.stderr.contains("lost"), "{run:?}");
    case.check(&env).await;
    assert_eq!(
        env.transactions()
            .await
            .get(&case.id)
            .await
            .unwrap()
            .unwrap()
            .state,
        MultiState::RolledBack
    );
}

/// Stops a transaction (in this process) after its first document is written.
struct StopAfterFirst;

#[async_trait::async_trait]
impl zkguard::txn::multi::MultiHook for StopAfterFirst {
    fn intervenes(&self, point: zkguard::txn::multi::Point) -> bool {
        point == zkguard::txn::multi::Point::Applied(1)
    }
    async fn stop_at(&self, _id: &str, point: zkguard::txn::multi::Point) -> bool {
        point == zkguard::txn::multi::Point::Applied(1)
    }
}

/// Two coordinators stop half-way, the second on a document of the first's that the first had
/// not written yet (its locks were gone): recovering the first must leave the second's mark on
/// that document, so that recovering the second undoes it. Every document ends as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovering_one_transaction_keeps_the_marks_of_another() {
    let env = Env::new("marks").await;
    env.seed(&[
        ("x", json!({"v": "0"})),
        ("y", json!({"v": "0"})),
        ("z", json!({"v": "0"})),
    ])
    .await;
    let stopping = env.transactions().await.with_hook(Arc::new(StopAfterFirst));
    for (id, docs) in [("t1", ["x", "y"]), ("t2", ["y", "z"])] {
        let ops = docs
            .iter()
            .map(|d| TxnOp::index(&env.index, d, json!({"v": id})))
            .collect();
        let e = stopping
            .apply(TxnRequest::new(ops).with_id(id))
            .await
            .unwrap_err();
        assert!(matches!(e, MultiError::Interrupted { .. }), "{e}");
    }
    assert_eq!(env.source("y").await, Some(json!({"v": "t2"})));
    let recovery = env.transactions().await;
    for id in ["t1", "t2"] {
        let state = recovery.recover(id, Duration::from_secs(10)).await.unwrap();
        assert_eq!(state, Some(MultiState::RolledBack), "{id}");
    }
    for d in ["x", "y", "z"] {
        assert_eq!(env.source(d).await, Some(json!({"v": "0"})), "{d}");
    }
}

/// A transaction that finds an undecided transaction's mark on its document (the other's
/// coordinator stopped half-way; its locks are gone) undoes that write before it reads: its
/// merge never carries the other's uncommitted change, and the other is rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_never_builds_on_an_undecided_write() {
    let env = Env::new("dirty").await;
    env.seed(&[("x", json!({"a": "0", "b": "0"}))]).await;
    let stopping = env.transactions().await.with_hook(Arc::new(StopAfterFirst));
    let e = stopping
        .apply(
            TxnRequest::new(vec![
                TxnOp::update(&env.index, "x", json!({"a": "t1"})),
                TxnOp::update(&env.index, "y", json!({"a": "t1"})).upsert(),
            ])
            .with_id("t1"),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, MultiError::Interrupted { .. }), "{e}");
    assert_eq!(env.source("x").await, Some(json!({"a": "t1", "b": "0"})));
    let txns = env.transactions().await;
    let out = txns
        .apply(TxnRequest::new(vec![TxnOp::update(
            &env.index,
            "x",
            json!({"b": "t2"}),
        )]))
        .await
        .unwrap();
    assert_eq!(out.state, Decision::Committed, "{out:?}");
    assert_eq!(env.source("x").await, Some(json!({"a": "0", "b": "t2"})));
    assert_eq!(
        txns.get("t1").await.unwrap().unwrap().state,
        MultiState::RollingBack
    );
    let state = txns.recover("t1", Duration::from_secs(10)).await.unwrap();
    assert_eq!(state, Some(MultiState::RolledBack));
    assert_eq!(env.source("x").await, Some(json!({"a": "0", "b": "t2"})));
    assert_eq!(env.source("y").await, None);
}

/// Writes, once, a stalled coordinator's late marked write (`doc` with `version` on `id`) right
/// after the first write sent through it: a transaction's first write after its read is the log
/// move of a transaction whose mark it found.
struct LateWrite {
    store: Arc<dyn zkguard::es::DocStore>,
    index: String,
    id: String,
    doc: std::sync::Mutex<Option<(serde_json::Value, u64)>>,
}

#[async_trait::async_trait]
impl zkguard::es::StoreHook for LateWrite {
    async fn after(
        &self,
        call: &zkguard::es::StoreCall<'_>,
        _outcome: Result<(), &zkguard::es::EsError>,
    ) -> Option<zkguard::es::EsError> {
        use zkguard::es::StoreCall;
        if !matches!(
            call,
            StoreCall::Index { .. } | StoreCall::Bulk { .. } | StoreCall::Delete { .. }
        ) {
            return None;
        }
        let late = self.doc.lock().unwrap().take();
        if let Some((doc, version)) = late {
            self.store
                .index(
                    &self.index,
                    &self.id,
                    &doc,
                    zkguard::es::WriteCondition::ExternalGte(version),
                    zkguard::es::Refresh::No,
                )
                .await
                .expect("the late write lands (its token is above the stored version)");
        }
        None
    }
}

/// A coordinator stalled past its locks with its apply `_bulk` on its way: its marked write of
/// `x` has landed, that of `y` lands only after the next transaction read both documents (and
/// found `x` marked). The next transaction undoes `x`, reads again and must decide the mark it
/// now finds on `y` as well, not take the late write for `y`'s before-image: its update would
/// carry the stalled transaction's write, which is rolled back (issue 53's counterexample of
/// the model check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_marked_write_found_by_the_second_read_is_decided_too() {
    let env = Env::new("late").await;
    env.seed(&[("x", json!({"v": "0"})), ("y", json!({"v": "0"}))])
        .await;
    let stopping = env.transactions().await.with_hook(Arc::new(StopAfterFirst));
    let e = stopping
        .apply(
            TxnRequest::new(vec![
                TxnOp::update(&env.index, "x", json!({"a": "t1"})),
                TxnOp::update(&env.index, "y", json!({"a": "t1"})),
            ])
            .with_id("t1"),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, MultiError::Interrupted { .. }), "{e}");
    // What t1's `_bulk` would have written to `y`: its after-image, marked, with its token.
    let t1 = env.transactions().await.get("t1").await.unwrap().unwrap();
    let token = t1.participants[1].token;
    let mut late = env.doc("x").await.expect("x marked by t1").source;
    assert_eq!(late["zkguard"]["txn"], json!("t1"), "{late}");
    late["zkguard"]["token"] = json!(token);
    late["v"] = json!("0");
    let hook = Arc::new(LateWrite {
        store: env.store.clone(),
        index: env.index.clone(),
        id: "y".into(),
        doc: std::sync::Mutex::new(Some((late, token))),
    });
    let store = Arc::new(zkguard::es::HookedStore::new(
        env.store.clone(),
        hook.clone(),
    ));
    let txns =
        zkguard::txn::multi::Transactions::new(env.locks().await, store, env.settings.clone());
    let out = txns
        .apply(TxnRequest::new(vec![
            TxnOp::update(&env.index, "x", json!({"b": "t2"})),
            TxnOp::update(&env.index, "y", json!({"b": "t2"})),
        ]))
        .await
        .unwrap();
    assert_eq!(out.state, Decision::Committed, "{out:?}");
    assert!(hook.doc.lock().unwrap().is_none(), "the late write landed");
    let state = txns.recover("t1", Duration::from_secs(10)).await.unwrap();
    assert_eq!(state, Some(MultiState::RolledBack));
    assert_eq!(env.source("x").await, Some(json!({"v": "0", "b": "t2"})));
    assert_eq!(
        env.source("y").await,
        Some(json!({"v": "0", "b": "t2"})),
        "y carries no write of the rolled-back t1"
    );
}

/// Stops a transaction (in this process) once the log says it is committed.
struct StopAtCommit;

#[async_trait::async_trait]
impl zkguard::txn::multi::MultiHook for StopAtCommit {
    async fn stop_at(&self, _id: &str, point: zkguard::txn::multi::Point) -> bool {
        point == zkguard::txn::multi::Point::Committed
    }
}

/// A later write straight to the cluster of `id` as read, its `zkguard` object (the mark)
/// included, with `w` set: a writer that bypasses zkguard, as a read-modify-write client of
/// the cluster does (Elasticsearch's own versioning: the version moves by one).
async fn copy_with_mark(env: &Env, id: &str, w: &str) {
    let mut doc = env.doc(id).await.expect("the marked document").source;
    assert!(doc["zkguard"]["txn"].is_string(), "{doc}");
    doc["w"] = json!(w);
    env.store
        .index(
            &env.index,
            id,
            &doc,
            zkguard::es::WriteCondition::Always,
            zkguard::es::Refresh::No,
        )
        .await
        .unwrap();
}

/// Recovery finishes or undoes only the transaction's own marked writes: a document written
/// after it (its mark copied along, by a writer that bypasses zkguard) keeps that write, in a
/// committed transaction as in an undone one, and loses the copied mark only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_leaves_a_later_write_that_copied_the_mark() {
    let env = Env::new("copied").await;
    env.seed(&[("a", json!({"v": "0"})), ("b", json!({"v": "0"}))])
        .await;
    let txns = env.transactions().await;
    let ops = |id: &str| {
        ["a", "b"]
            .map(|d| TxnOp::update(&env.index, d, json!({"v": id})))
            .to_vec()
    };
    let stop_commit = env.transactions().await.with_hook(Arc::new(StopAtCommit));
    let e = stop_commit
        .apply(TxnRequest::new(ops("t1")).with_id("t1"))
        .await
        .unwrap_err();
    assert!(matches!(e, MultiError::Interrupted { .. }), "{e}");
    copy_with_mark(&env, "a", "later").await;
    let state = txns.recover("t1", Duration::from_secs(10)).await.unwrap();
    assert_eq!(state, Some(MultiState::Finished));
    assert_eq!(
        env.source("a").await,
        Some(json!({"v": "t1", "w": "later"}))
    );
    assert_eq!(env.source("b").await, Some(json!({"v": "t1"})));

    let stop_first = env.transactions().await.with_hook(Arc::new(StopAfterFirst));
    let e = stop_first
        .apply(TxnRequest::new(ops("t2")).with_id("t2"))
        .await
        .unwrap_err();
    assert!(matches!(e, MultiError::Interrupted { .. }), "{e}");
    copy_with_mark(&env, "a", "again").await;
    let state = txns.recover("t2", Duration::from_secs(10)).await.unwrap();
    assert_eq!(state, Some(MultiState::RolledBack));
    assert_eq!(
        env.source("a").await,
        Some(json!({"v": "t2", "w": "again"}))
    );
    assert_eq!(env.source("b").await, Some(json!({"v": "t1"})));
    let a = env.doc("a").await.unwrap().source;
    assert!(a["zkguard"].get("txn").is_none(), "{a}");
}

/// `zkguard txn apply` and `zkguard txn show` through the binary: exit statuses and JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_applies_shows_and_names_bad_input() {
    let env = Env::new("cli").await;
    env.seed(&[("a", json!({"v": 1}))]).await;
    let ops = format!(
        "{}\n{}\n",
        json!({"action": "update", "index": env.index, "id": "a", "doc": {"w": 2}}),
        json!({"action": "index", "index": env.index, "id": "b", "doc": {"v": 3}, "expect": {"exists": false}})
    );
    let run = env.cli(&["apply", "--file", "-", "--id", "cli-1", "--json"], &ops);
    assert_eq!(run.code, 0, "{run:?}");
    let out: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(out["state"], "committed");
    assert_eq!(out["documents"][1]["result"], "created");
    assert_eq!(env.source("a").await, Some(json!({"v": 1, "w": 2})));
    let shown = env.cli(&["show", "cli-1", "--json"], "");
    assert_eq!(shown.code, 0, "{shown:?}");
    let shown: serde_json::Value = serde_json::from_str(&shown.stdout).unwrap();
    assert_eq!(shown["state"], "finished");
    // The same operations under a new id: rolled back, since `b` exists now (status 65).
    let run = env.cli(&["apply", "--file", "-", "--json"], &ops);
    assert_eq!(run.code, 65, "{run:?}");
    assert!(run.stdout.contains("rolled-back"), "{run:?}");
    let run = env.cli(&["apply", "--file", "-"], "{\"action\":\"index\"}\n");
    assert_eq!(run.code, 65, "{run:?}");
    assert!(
        run.stderr.contains("line 1") && run.stderr.lines().count() == 1,
        "{run:?}"
    );
}

/// Stops a transaction (in this process) once every one of its `n` documents carries its mark,
/// before the commit.
struct StopAfterAll(usize);

#[async_trait::async_trait]
impl zkguard::txn::multi::MultiHook for StopAfterAll {
    fn intervenes(&self, point: zkguard::txn::multi::Point) -> bool {
        point == zkguard::txn::multi::Point::Applied(self.0)
    }
    async fn stop_at(&self, _id: &str, point: zkguard::txn::multi::Point) -> bool {
        point == zkguard::txn::multi::Point::Applied(self.0)
    }
}

/// Orders two settlers of transaction `id` so that both read its log record `pending` before
/// either moves it: the first reader goes on once the second has read; the second goes on once
/// the first's log write is answered and the clock has passed it (so that the two records
/// differ in `modified`, as two writers' do).
struct BothReadTheRecord {
    log: String,
    id: String,
    reads: std::sync::atomic::AtomicU64,
    writes: std::sync::atomic::AtomicU64,
    second_read: tokio::sync::Semaphore,
    first_write: tokio::sync::Semaphore,
    first_write_at: std::sync::Mutex<Option<std::time::SystemTime>>,
}

impl BothReadTheRecord {
    fn new(log: &str, id: &str) -> Self {
        Self {
            log: log.into(),
            id: id.into(),
            reads: Default::default(),
            writes: Default::default(),
            second_read: tokio::sync::Semaphore::new(0),
            first_write: tokio::sync::Semaphore::new(0),
            first_write_at: Default::default(),
        }
    }
}

fn millis(t: std::time::SystemTime) -> u128 {
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
}

#[async_trait::async_trait]
impl zkguard::es::StoreHook for BothReadTheRecord {
    async fn after(
        &self,
        call: &zkguard::es::StoreCall<'_>,
        _outcome: Result<(), &zkguard::es::EsError>,
    ) -> Option<zkguard::es::EsError> {
        use std::sync::atomic::Ordering::SeqCst;
        match call {
            zkguard::es::StoreCall::Get { index, id } if *index == self.log && *id == self.id => {
                match self.reads.fetch_add(1, SeqCst) {
                    0 => self.second_read.acquire().await.unwrap().forget(),
                    1 => {
                        self.second_read.add_permits(1);
                        self.first_write.acquire().await.unwrap().forget();
                        let at = millis(self.first_write_at.lock().unwrap().unwrap());
                        while millis(std::time::SystemTime::now()) <= at {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                    _ => {}
                }
            }
            zkguard::es::StoreCall::Index { index, id, .. }
                if *index == self.log
                    && *id == self.id
                    && self.writes.fetch_add(1, SeqCst) == 0 =>
            {
                *self.first_write_at.lock().unwrap() = Some(std::time::SystemTime::now());
                self.first_write.add_permits(1);
            }
            _ => {}
        }
        None
    }
}

/// Two writers of two documents marked by the same stopped (pending) transaction settle it at
/// once: a single writer (through the transactions' mark resolver) and another transaction.
/// Both read the record `pending` and both try to move it to `rolling-back`; the one whose log
/// write loses reads the record again and goes on from there: both succeed, neither is told of
/// the other's transaction as its own, and recovery ends the stopped one rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_settling_the_same_stopped_transaction_both_succeed() {
    let env = Env::new("settle2").await;
    env.seed(&[("x", json!({"v": "0"})), ("y", json!({"v": "0"}))])
        .await;
    let stopping = env
        .transactions()
        .await
        .with_hook(Arc::new(StopAfterAll(2)));
    let ops = ["x", "y"]
        .map(|d| TxnOp::update(&env.index, d, json!({"v": "t1"})))
        .to_vec();
    let e = stopping
        .apply(TxnRequest::new(ops).with_id("t1"))
        .await
        .unwrap_err();
    assert!(matches!(e, MultiError::Interrupted { .. }), "{e}");
    assert_eq!(env.source("y").await, Some(json!({"v": "t1"})));
    let hook = Arc::new(BothReadTheRecord::new(&env.settings.log_index, "t1"));
    let store: Arc<dyn zkguard::es::DocStore> = Arc::new(zkguard::es::HookedStore::new(
        env.store.clone(),
        hook.clone(),
    ));
    let txns = Arc::new(zkguard::txn::multi::Transactions::new(
        env.locks().await,
        store.clone(),
        env.settings.clone(),
    ));
    let writer =
        GuardedWriter::new(env.locks().await, env.store.clone()).with_mark_resolver(txns.clone());
    let on_x = writer.on(document_monitor(&env.index, "x"));
    let single = on_x.update(&env.index, "x", json!({"w": "single"}));
    let txn = txns.apply(TxnRequest::new(vec![TxnOp::update(
        &env.index,
        "y",
        json!({"w": "t2"}),
    )]));
    let (single, txn) = tokio::join!(single, txn);
    single.expect("the single writer settles the transaction and writes");
    let out = txn.expect("the transaction settles the other and commits");
    assert_eq!(out.state, Decision::Committed, "{out:?}");
    assert!(hook.writes.load(std::sync::atomic::Ordering::SeqCst) >= 2);
    assert_eq!(
        env.source("x").await,
        Some(json!({"v": "0", "w": "single"}))
    );
    assert_eq!(env.source("y").await, Some(json!({"v": "0", "w": "t2"})));
    let state = txns.recover("t1", Duration::from_secs(10)).await.unwrap();
    assert_eq!(state, Some(MultiState::RolledBack));
    assert_eq!(
        env.source("x").await,
        Some(json!({"v": "0", "w": "single"}))
    );
    assert_eq!(env.source("y").await, Some(json!({"v": "0", "w": "t2"})));
}
