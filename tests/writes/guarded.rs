//! Guarded, fenced writes against a real ZooKeeper and osmem-server.

use crate::guarded_support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use zkguard::config::Settings;
use zkguard::es::DocStore;
use zkguard::es::{EsError, HookedStore, IndexGate, Refresh, WriteCondition};
use zkguard::lock::{Guard, LockService};
use zkguard::testkit::Partition;
use zkguard::write::guarded::{GuardedError, GuardedWriter};
use zkguard::write::ops::{DeleteMode, Operation, Stamp};
use zkguard::{LockRequest, LossReason, ZkSession};

use guarded_support::{locks, settings_for, shared, source, store, tag};

/// N writers, each with its own ZooKeeper session, increment one counter K times each by
/// read-modify-write: the lock must serialise them so that the counter ends at exactly N x K.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_increments_through_separate_sessions_lose_nothing() {
    const WRITERS: usize = 8;
    const EACH: usize = 5;
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_for(servers, dir.path());
    let es = store(&settings);
    let index = format!("counters-{}", tag());
    let (_s0, l0) = locks(&settings).await;
    GuardedWriter::new(l0, es.clone())
        .on("counter")
        .index(&index, "c", json!({"n": 0}))
        .await
        .unwrap();

    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let settings = settings.clone();
        let es = es.clone();
        let index = index.clone();
        tasks.push(tokio::spawn(async move {
            let (session, l) = locks(&settings).await;
            let writer = GuardedWriter::new(l, es);
            let mut ids = Vec::new();
            for _ in 0..EACH {
                let op = Operation::increment("counter", &index, "c", "n", 1)
                    .with_info(format!("writer {w}"));
                let written = writer
                    .run(&op)
                    .await
                    .unwrap_or_else(|e| panic!("writer {w}: {e}"));
                assert!(!written.already_applied);
                ids.push((op.id, written.token));
            }
            drop(session);
            ids
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let doc = es.get(&index, "c").await.unwrap().unwrap();
    assert_eq!(
        doc.source["n"],
        json!(WRITERS * EACH),
        "lost or doubled increments: {}",
        doc.source
    );
    let stamp = Stamp::of(&doc.source).expect("stamp");
    assert!(
        all.iter().all(|(id, _)| stamp.contains(id)),
        "every operation id is recorded"
    );
    let max_token = all.iter().map(|(_, t)| *t).max().unwrap();
    assert_eq!(
        doc.meta.version as u64, max_token,
        "the stored version is the last writer's token"
    );
    let mut tokens: Vec<u64> = all.iter().map(|(_, t)| *t).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(
        tokens.len(),
        WRITERS * EACH,
        "every acquisition had its own token"
    );
}

/// Holder A is paused after checking its lock and before its write reaches Elasticsearch; its
/// session is killed on the server; holder B acquires and writes. When A's write goes out it must
/// be rejected as `Fenced`, and the document keeps B's content. Afterwards A's guard reports the
/// loss, and a further write through it is not sent at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stale_holder_is_fenced_after_its_session_is_killed() {
    let monitor = "article-7";
    let StaleHolder {
        settings,
        es,
        index,
        partition,
        locks_a,
        paused_a: paused,
        writer_a,
        guard_a,
        _session_a,
        _dir,
    } = stale_holder(monitor, "7").await;
    let token_a = guard_a.fencing_token();
    let op_a = Operation::index(monitor, &index, "7", json!({"owner": "A"}));

    let (session_b, locks_b) = locks(&settings).await;
    let writer_b = GuardedWriter::new(locks_b, es.clone());

    let a_write = writer_a.write_under(guard_a.as_ref(), &op_a);
    let scenario = async {
        // A checked its lock, read the document and is about to send: pause it there.
        paused.hook().reached().await;
        assert!(guard_a.is_held());
        partition.cut();
        // B gets the lock only once ZooKeeper expired A's session and deleted A's nodes.
        let written_b = writer_b
            .on(monitor)
            .info("holder B")
            .index(&index, "7", json!({"owner": "B"}))
            .await
            .unwrap();
        assert!(
            written_b.token > token_a,
            "B's token {} must exceed A's {token_a}",
            written_b.token
        );
        // A resumes and its write goes out.
        paused.hook().let_through();
        written_b
    };
    let (a_result, written_b) = tokio::join!(a_write, scenario);
    match a_result {
        Err(GuardedError::Fenced {
            token,
            index: ref fenced_index,
            ref id,
            ..
        }) => {
            assert_eq!(token, token_a);
            assert_eq!((fenced_index.as_str(), id.as_str()), (index.as_str(), "7"));
        }
        other => panic!("A's stale write must be fenced, got {other:?}"),
    }
    let doc = es.get(&index, "7").await.unwrap().unwrap();
    assert_eq!(doc.source["owner"], "B", "the document keeps B's content");
    assert_eq!(doc.meta.version as u64, written_b.token);

    // A's client counts the lock lost once cut off longer than the grace, and finds the session
    // expired when it comes back; from then on nothing is sent under its guard.
    let reason = tokio::time::timeout(Duration::from_secs(10), guard_a.lost())
        .await
        .expect("A notices the loss");
    assert!(
        matches!(
            reason,
            LossReason::Disconnected { .. } | LossReason::SessionExpired
        ),
        "{reason:?}"
    );
    partition.heal();
    let plain_a = GuardedWriter::new(locks_a.clone(), es.clone());
    let again = Operation::index(monitor, &index, "7", json!({"owner": "A again"}));
    let err = plain_a
        .write_under(guard_a.as_ref(), &again)
        .await
        .unwrap_err();
    assert!(matches!(err, GuardedError::LockLost { .. }), "{err:?}");
    assert!(
        err.is_transient(),
        "a write that was not sent can be retried with a new lock"
    );
    let after = es.get(&index, "7").await.unwrap().unwrap();
    assert_eq!(after.meta, doc.meta, "nothing was written");
    drop(session_b);
}

/// Holder A is paused after its read and lock check, before its write reaches Elasticsearch;
/// its session expires; holder B acquires and reads the document; then A's write lands (B has
/// not written yet, so Elasticsearch takes A's older token) and B's write, computed from its
/// read, replaces it. A must not be told that its change was applied: an acknowledged change
/// is never replaced by a holder that did not read it. A learns its lock was lost while its
/// write was under way, an error to run the operation again with a new lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_write_landing_between_the_new_holders_read_and_write_is_not_acknowledged() {
    let monitor = "article-8";
    let StaleHolder {
        settings,
        es,
        index,
        partition,
        paused_a,
        writer_a,
        guard_a,
        locks_a: _locks_a,
        _session_a,
        _dir,
    } = stale_holder(monitor, "8").await;
    let op_a = Operation::merge(monitor, &index, "8", json!({"a": 1}));
    // B's write is held back once B has read, so that A's write lands in between.
    let (_session_b, locks_b) = locks(&settings).await;
    let paused_b = Arc::new(HookedStore::new(es.clone(), IndexGate::new()));
    let writer_b = GuardedWriter::new(locks_b, paused_b.clone());

    let a_write = writer_a.write_under(guard_a.as_ref(), &op_a);
    let b_write = async {
        paused_a.hook().reached().await;
        partition.cut();
        // B gets the lock once ZooKeeper expired A's session.
        writer_b
            .on(monitor)
            .info("holder B")
            .update(&index, "8", json!({"b": 1}))
            .await
    };
    let scenario = async {
        paused_b.hook().reached().await;
        // B has read the document and is about to write: A resumes, its write lands first.
        paused_a.hook().let_through();
    };
    let (a_result, b_result, ()) = tokio::join!(
        async {
            let r = a_write.await;
            // Only once A's write is answered does B's go out.
            paused_b.hook().let_through();
            r
        },
        b_write,
        scenario
    );
    let written_b = b_result.unwrap();
    let doc = es.get(&index, "8").await.unwrap().unwrap();
    assert_eq!(doc.source["b"], 1, "B's change is in the document");
    assert_eq!(doc.meta.version as u64, written_b.token);
    match a_result {
        Ok(w) => assert_eq!(
            doc.source["a"], 1,
            "A was told its change was applied (token {}), and B, which read the document before A's write landed, replaced it: {}",
            w.token, doc.source
        ),
        Err(e) => {
            assert!(
                matches!(e, GuardedError::LostDuringWrite { .. }),
                "A learns that its lock was lost while its write was under way: {e:?}"
            );
            assert!(e.is_transient(), "{e}: run it again with a new lock");
            assert_eq!(e.kind(), "lock_lost");
        }
    }
    partition.heal();
}

/// Index, merge, increment, soft and hard delete, idempotent re-runs, missing documents, and a
/// document first written without zkguard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_kinds_reruns_and_foreign_documents() {
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_for(servers, dir.path());
    let es = store(&settings);
    let index = format!("kinds-{}", tag());
    let (_s, l) = locks(&settings).await;
    let writer = GuardedWriter::new(l, es.clone());
    let on = writer.on("doc-1");

    // A document written without zkguard has a small internal version; the first guarded write
    // replaces it and stamps it.
    es.index(
        &index,
        "1",
        &json!({"title": "plain", "views": 3}),
        WriteCondition::Always,
        Refresh::No,
    )
    .await
    .unwrap();
    let merged = on
        .update(&index, "1", json!({"title": "guarded", "tags": ["a"]}))
        .await
        .unwrap();
    let s = source(es.as_ref(), &index, "1").await;
    assert_eq!(s["title"], "guarded");
    assert_eq!(s["views"], 3);
    assert_eq!(s["tags"], json!(["a"]));
    assert_eq!(s["zkguard"]["token"], json!(merged.token));

    // Running the same operation again (same id) does not apply it twice.
    let inc = Operation::increment("doc-1", &index, "1", "views", 10);
    let first = writer.run(&inc).await.unwrap();
    let second = writer.run(&inc).await.unwrap();
    assert!(!first.already_applied && second.already_applied);
    assert_eq!(source(es.as_ref(), &index, "1").await["views"], 13);

    // Update of a missing document: not found, unless upsert.
    let err = on.increment(&index, "missing", "n", 1).await.unwrap_err();
    assert!(
        matches!(err, GuardedError::NotFound { .. }) && !err.is_transient(),
        "{err}"
    );
    writer
        .run(&Operation::increment("doc-1", &index, "missing", "n", 2).with_upsert(true))
        .await
        .unwrap();
    assert_eq!(source(es.as_ref(), &index, "missing").await["n"], 2);

    // A change that cannot apply to the stored content.
    let err = on.increment(&index, "1", "title", 1).await.unwrap_err();
    assert!(matches!(err, GuardedError::CannotApply { .. }), "{err}");
    assert!(err.to_string().contains("`title` holds a string"), "{err}");

    // Invalid operations are refused before locking.
    let err = on
        .index(&index, "1", json!({"zkguard": {"token": 1}}))
        .await
        .unwrap_err();
    assert!(matches!(err, GuardedError::Invalid(_)), "{err}");
    let err = writer
        .on("bad/monitor")
        .index(&index, "1", json!({}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("`/`"), "{err}");

    // Tombstone: the document stays as a fenced marker; updates treat it as missing; a replay
    // of the same delete is recognised.
    let tomb = Operation::delete("doc-1", &index, "1").with_delete_mode(DeleteMode::Tombstone);
    let w = writer.run(&tomb).await.unwrap();
    let s = source(es.as_ref(), &index, "1").await;
    assert_eq!(s, json!({"zkguard": s["zkguard"].clone()}));
    assert_eq!(s["zkguard"]["deleted"], true);
    assert_eq!(s["zkguard"]["token"], json!(w.token));
    assert!(writer.run(&tomb).await.unwrap().already_applied);
    assert!(matches!(
        on.increment(&index, "1", "views", 1).await,
        Err(GuardedError::NotFound { .. })
    ));
    // A stale token cannot resurrect it (as a lost holder would try).
    let stale = es
        .index(
            &index,
            "1",
            &json!({"title": "stale"}),
            WriteCondition::ExternalGte(w.token - 1),
            Refresh::No,
        )
        .await
        .unwrap_err();
    assert!(matches!(stale, EsError::Conflict { .. }), "{stale:?}");
    // A guarded index re-creates it.
    on.index(&index, "1", json!({"title": "back"}))
        .await
        .unwrap();
    assert_eq!(source(es.as_ref(), &index, "1").await["title"], "back");

    // Hard delete, twice: the second finds nothing and changes nothing.
    let d = on.delete(&index, "1", DeleteMode::Hard).await.unwrap();
    assert!(d.meta.is_some());
    assert!(es.get(&index, "1").await.unwrap().is_none());
    let d2 = on.delete(&index, "1", DeleteMode::Hard).await.unwrap();
    assert!(d2.meta.is_none());
    // A stale holder cannot re-create it while Elasticsearch keeps the delete's version.
    let stale = es
        .index(
            &index,
            "1",
            &json!({"title": "stale"}),
            WriteCondition::ExternalGte(d.token - 1),
            Refresh::No,
        )
        .await
        .unwrap_err();
    assert!(matches!(stale, EsError::Conflict { .. }), "{stale:?}");

    // Lock wait and hold are measured.
    let timed = on.index(&index, "2", json!({"x": 1})).await.unwrap();
    assert!(timed.held > Duration::ZERO);
}

/// Holder A of `monitor`, its document `id` written once before (`{"owner": "seed"}`): the start
/// of the stale-holder cases.
struct StaleHolder {
    settings: Settings,
    es: Arc<dyn DocStore>,
    index: String,
    /// A reaches ZooKeeper through it: the test cuts it, so that ZooKeeper expires A's session
    /// for real, as after a long pause.
    partition: Partition,
    locks_a: Arc<dyn LockService>,
    /// Holds back A's `index` call until the test lets it through: the "pause" of a holder
    /// between its last lock check and its request reaching Elasticsearch.
    paused_a: Arc<HookedStore<IndexGate>>,
    writer_a: GuardedWriter,
    guard_a: Box<dyn Guard>,
    _session_a: ZkSession,
    _dir: tempfile::TempDir,
}

async fn stale_holder(monitor: &str, id: &str) -> StaleHolder {
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_for(shared(), dir.path());
    let es = store(&settings);
    let index = format!("articles-{}", tag());
    let (_s0, l0) = locks(&settings).await;
    GuardedWriter::new(l0, es.clone())
        .on(monitor)
        .index(&index, id, json!({"owner": "seed"}))
        .await
        .unwrap();
    let partition = Partition::start(&settings.zookeeper.servers).unwrap();
    let mut settings_a = settings.clone();
    settings_a.zookeeper.servers = partition.connect_string().to_string();
    let (session_a, locks_a) = locks(&settings_a).await;
    let paused_a = Arc::new(HookedStore::new(es.clone(), IndexGate::new()));
    let writer_a = GuardedWriter::new(locks_a.clone(), paused_a.clone());
    let guard_a = locks_a
        .acquire(LockRequest::new(monitor, "holder A"))
        .await
        .unwrap();
    StaleHolder {
        settings,
        es,
        index,
        partition,
        locks_a,
        paused_a,
        writer_a,
        guard_a,
        _session_a: session_a,
        _dir: dir,
    }
}
