//! Background operations: retries, dead letters and replays, against a real ZooKeeper and
//! osmem-server.

use crate::guarded_support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use serde_json::json;
use uuid::Uuid;
use zkguard::es::{Refresh, WriteCondition};
use zkguard::testkit::OsmemServer;
use zkguard::write::background::{BackgroundError, BackgroundExecutor, Outcome, PARK_TRIES};
use zkguard::write::deadletter::{
    replay, DeadLetter, DeadLetterError, DeadLetterSink, FileSink, ParkReason, ReplayResult,
    ReplaySelection,
};
use zkguard::write::guarded::{GuardedError, GuardedWriter};
use zkguard::write::ops::{Operation, Stamp};
use zkguard::{LockError, LockRequest, LockType};

use crate::wait::eventually;
use guarded_support::{locks, settings, settings_for, shared, source, store, tag};

/// A lock held longer than the whole retry budget: the background operation is tried
/// `elastic.request.retry.count` times and parked with everything needed to replay it; a
/// foreground operation fails at once with the lock error. After the holder lets go, the replay
/// applies the parked operation once and removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_held_past_the_retry_budget_parks_then_replay_applies() {
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings_for(servers, dir.path());
    settings.zookeeper.foreground_timeout = Duration::from_millis(300);
    settings.zookeeper.background_timeout = Duration::from_millis(300);
    let es = store(&settings);
    let index = format!("bg-{}", tag());
    let (_s, l) = locks(&settings).await;
    let writer = GuardedWriter::new(l, es.clone());
    writer
        .on("bg-1")
        .index(&index, "1", json!({"n": 0}))
        .await
        .unwrap();
    let sink: Arc<dyn DeadLetterSink> = Arc::new(FileSink::new(&settings.retry.file_path));
    let exec = BackgroundExecutor::from_settings(writer.clone(), sink.clone(), &settings);

    let (_hs, holder_locks) = locks(&settings).await;
    let held = holder_locks
        .acquire(LockRequest::new("bg-1", "long job"))
        .await
        .unwrap();

    // Foreground: one attempt, the lock error goes straight back, nothing is parked.
    let fg = exec
        .run_foreground(Operation::increment("bg-1", &index, "1", "n", 1))
        .await
        .unwrap_err();
    assert!(
        matches!(
            fg,
            GuardedError::Lock(LockError::Timeout {
                lock_type: LockType::Foreground,
                ..
            })
        ),
        "{fg}"
    );

    // Background: 3 attempts, then parked.
    let started = SystemTime::now();
    let op = Operation::increment("bg-1", &index, "1", "n", 1).with_info("Bulk Propagation");
    let outcome = exec.run(op.clone()).await.unwrap();
    match &outcome {
        Outcome::Parked {
            op_id,
            attempts,
            reason,
            error,
        } => {
            assert_eq!(*op_id, op.id);
            assert_eq!(*attempts, 3);
            assert_eq!(*reason, ParkReason::RetriesExhausted);
            assert!(error.contains("not acquired within"), "{error}");
        }
        other => panic!("expected parked, got {other:?}"),
    }
    let stats = exec.stats();
    assert_eq!(
        (stats.submitted, stats.retried, stats.parked, stats.applied),
        (1, 2, 1, 0),
        "{stats:?}"
    );
    assert_eq!((stats.foreground_failed, stats.foreground_applied), (1, 0));

    let parked = sink.list().await.unwrap();
    assert_eq!(parked.len(), 1, "only the background operation is parked");
    let letter = &parked[0];
    assert_eq!(letter.id, op.id);
    assert_eq!(letter.monitor, "bg-1");
    assert_eq!(letter.attempts, 3);
    assert_eq!(letter.error_kind, "lock_timeout");
    assert!(letter.last_error.contains("bg-1"), "{}", letter.last_error);
    assert_eq!(letter.operation, op.clone().with_type(LockType::Background));
    let ms = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    };
    assert!(ms(started) <= ms(letter.first_attempt));
    assert!(letter.first_attempt <= letter.last_attempt && letter.last_attempt <= letter.parked_at);
    // Durable: the file holds the full entry as one JSON line.
    let text = std::fs::read_to_string(&settings.retry.file_path).unwrap();
    let line: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(
        line["operation"]["kind"]["change"],
        json!({"type": "increment", "field": "n", "by": 1})
    );
    assert_eq!(
        source(es.as_ref(), &index, "1").await["n"],
        0,
        "nothing was applied"
    );

    // While the lock is still held, a replay keeps the entry and counts the attempt.
    let still = replay(&writer, sink.as_ref(), ReplaySelection::All)
        .await
        .unwrap();
    assert!(
        matches!(
            still[0].result,
            ReplayResult::StillParked {
                transient: true,
                ..
            }
        ),
        "{still:?}"
    );
    assert_eq!(sink.list().await.unwrap()[0].attempts, 4);

    held.unlock().await.unwrap();
    let replayed = replay(&writer, sink.as_ref(), ReplaySelection::Id(op.id))
        .await
        .unwrap();
    assert_eq!(replayed.len(), 1);
    assert_eq!(replayed[0].result, ReplayResult::Applied);
    assert_eq!(source(es.as_ref(), &index, "1").await["n"], 1);
    assert!(sink.list().await.unwrap().is_empty());
    let err = replay(&writer, sink.as_ref(), ReplaySelection::Id(op.id))
        .await
        .unwrap_err();
    assert!(matches!(err, DeadLetterError::NoSuchEntry { .. }), "{err}");
}

/// Failures that retrying cannot fix are parked at once (fenced) or rejected (malformed), and
/// nothing is lost either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_operations_are_parked_at_once_and_malformed_ones_rejected() {
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_for(servers, dir.path());
    let es = store(&settings);
    let index = format!("fenced-{}", tag());
    let (_s, l) = locks(&settings).await;
    let writer = GuardedWriter::new(l, es.clone());
    let sink: Arc<dyn DeadLetterSink> = Arc::new(FileSink::new(&settings.retry.file_path));
    let exec = BackgroundExecutor::from_settings(writer, sink.clone(), &settings);

    // A document whose version is beyond any ZooKeeper token (written with a far-future
    // external version by some other writer).
    es.index(
        &index,
        "1",
        &json!({"n": 5}),
        WriteCondition::ExternalGte(1 << 62),
        Refresh::No,
    )
    .await
    .unwrap();
    let op = Operation::increment("fenced-1", &index, "1", "n", 1);
    match exec.run(op.clone()).await.unwrap() {
        Outcome::Parked {
            attempts: 1,
            reason: ParkReason::NotRetryable,
            error,
            ..
        } => {
            assert!(error.contains("set outside zkguard"), "{error}")
        }
        other => panic!("expected parked after one attempt, got {other:?}"),
    }
    let letter = &sink.list().await.unwrap()[0];
    assert_eq!((letter.id, letter.error_kind.as_str()), (op.id, "fenced"));
    assert_eq!(source(es.as_ref(), &index, "1").await["n"], 5);

    let bad = Operation::index("fenced-1", &index, "2", json!({"zkguard": "mine"}));
    match exec.run(bad).await.unwrap() {
        Outcome::Rejected { reason, .. } => {
            assert!(reason.contains("reserved field `zkguard`"), "{reason}")
        }
        other => panic!("expected rejected, got {other:?}"),
    }
    let stats = exec.stats();
    assert_eq!(
        (stats.fenced, stats.retried, stats.parked, stats.rejected),
        (1, 0, 1, 1),
        "{stats:?}"
    );
    assert_eq!(sink.list().await.unwrap().len(), 1);
}

/// A sink whose next `remove` fails: a replay that "crashes" after applying an operation and
/// before removing its entry.
struct CrashBeforeRemove {
    inner: FileSink,
    crash: AtomicBool,
}

#[async_trait]
impl DeadLetterSink for CrashBeforeRemove {
    async fn park(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        self.inner.park(letter).await
    }
    async fn list(&self) -> Result<Vec<DeadLetter>, DeadLetterError> {
        self.inner.list().await
    }
    async fn remove(&self, id: Uuid) -> Result<bool, DeadLetterError> {
        if self.crash.swap(false, Ordering::SeqCst) {
            return Err(DeadLetterError::Io {
                action: "rewrite",
                path: self.inner.path().to_path_buf(),
                source: std::io::Error::other("injected crash"),
            });
        }
        self.inner.remove(id).await
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// Replay stops between applying and removing; the next replay finds the operation recorded in
/// the document, applies nothing and removes the entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_interrupted_between_apply_and_remove_applies_once() {
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_for(servers, dir.path());
    let es = store(&settings);
    let index = format!("replay-{}", tag());
    let (_s, l) = locks(&settings).await;
    let writer = GuardedWriter::new(l, es.clone());
    writer
        .on("r-1")
        .index(&index, "1", json!({"n": 10}))
        .await
        .unwrap();
    let sink = CrashBeforeRemove {
        inner: FileSink::new(&settings.retry.file_path),
        crash: AtomicBool::new(true),
    };
    let ops: Vec<Operation> = (0..3)
        .map(|_| Operation::increment("r-1", &index, "1", "n", 1).with_type(LockType::Background))
        .collect();
    let err = GuardedError::Lock(LockError::Timeout {
        monitor: "r-1".into(),
        lock_type: LockType::Background,
        waited: Duration::from_millis(1),
        blocked_by: None,
    });
    for op in &ops {
        let now = SystemTime::now();
        sink.park(&DeadLetter::new(op, 3, &err, now, now))
            .await
            .unwrap();
    }

    let first = replay(&writer, &sink, ReplaySelection::All).await.unwrap();
    assert!(
        matches!(first[0].result, ReplayResult::NotRemoved { .. }),
        "{first:?}"
    );
    assert_eq!(first[1].result, ReplayResult::Applied);
    assert_eq!(first[2].result, ReplayResult::Applied);
    assert_eq!(source(es.as_ref(), &index, "1").await["n"], 13);
    let left = sink.list().await.unwrap();
    assert_eq!(
        left.iter().map(|l| l.id).collect::<Vec<_>>(),
        vec![ops[0].id]
    );

    let second = replay(&writer, &sink, ReplaySelection::All).await.unwrap();
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].result, ReplayResult::AlreadyApplied);
    assert_eq!(
        source(es.as_ref(), &index, "1").await["n"],
        13,
        "not applied twice"
    );
    assert!(sink.list().await.unwrap().is_empty());
}

/// Elasticsearch freezes (SIGSTOP) while background increments run on four documents: the
/// operations in flight and those after it are retried and parked; once it continues, a replay
/// applies the parked ones. Every document ends with exactly its number of increments, and every
/// operation id is recorded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn elasticsearch_stopped_mid_run_parks_and_replay_loses_and_doubles_nothing() {
    const DOCS: usize = 4;
    const PER_DOC: usize = 6;
    let zk = &shared().zk;
    let es_server = OsmemServer::start().expect("start osmem-server");
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(&zk.connect_string(), es_server.url(), dir.path());
    settings.zookeeper.background_timeout = Duration::from_secs(2);
    // Seeding, replay and checks use the normal client; the executor gives up after 300 ms.
    let es = store(&settings);
    let mut short = settings.clone();
    short.elasticsearch.request_timeout = Duration::from_millis(300);
    let index = format!("stop-{}", tag());
    let (_s, l) = locks(&settings).await;
    let writer = GuardedWriter::new(l.clone(), es.clone());
    for d in 0..DOCS {
        writer
            .on(format!("doc-{d}"))
            .index(&index, &d.to_string(), json!({"n": 0}))
            .await
            .unwrap();
    }
    let sink: Arc<dyn DeadLetterSink> = Arc::new(FileSink::new(&settings.retry.file_path));
    let exec_writer = GuardedWriter::new(l, store(&short));
    let exec = BackgroundExecutor::builder(exec_writer, sink.clone())
        .retry(&settings.retry)
        .concurrency(DOCS)
        .build();

    let mut ops = Vec::new();
    for i in 0..DOCS * PER_DOC {
        let d = i % DOCS;
        ops.push(Operation::increment(
            format!("doc-{d}"),
            &index,
            d.to_string(),
            "n",
            1,
        ));
    }
    let mut handles = Vec::new();
    let submitter = {
        let exec = exec.clone();
        let ops = ops.clone();
        tokio::spawn(async move {
            let mut hs = Vec::new();
            for op in ops {
                hs.push(exec.submit(op).await);
            }
            hs
        })
    };
    eventually(
        Duration::from_secs(20),
        "a few operations applied",
        || async { exec.stats().applied >= 5 },
    )
    .await;
    es_server.pause();
    handles.extend(submitter.await.unwrap());
    let mut outcomes = Vec::new();
    for h in handles {
        outcomes.push(h.await.unwrap().unwrap());
    }
    es_server.resume();

    let applied = outcomes.iter().filter(|o| o.is_applied()).count();
    let parked = outcomes.iter().filter(|o| o.is_parked()).count();
    assert_eq!(
        applied + parked,
        ops.len(),
        "every operation ends applied or parked: {outcomes:?}"
    );
    assert!(parked > 0, "the freeze must have parked operations");
    let letters = sink.list().await.unwrap();
    assert_eq!(letters.len(), parked);
    assert!(
        letters
            .iter()
            .all(|l| l.reason == ParkReason::RetriesExhausted && l.attempts == 3),
        "{letters:?}"
    );

    let results = replay(&writer, sink.as_ref(), ReplaySelection::All)
        .await
        .unwrap();
    let already = results
        .iter()
        .filter(|r| r.result == ReplayResult::AlreadyApplied)
        .count();
    eprintln!("applied {applied}, parked {parked} (of which already in the document: {already}), stats {:?}", exec.stats());
    assert_eq!(results.len(), parked);
    assert!(
        results.iter().all(|r| matches!(
            r.result,
            ReplayResult::Applied | ReplayResult::AlreadyApplied
        )),
        "{results:?}"
    );
    assert!(sink.list().await.unwrap().is_empty());

    let mut seen: HashMap<Uuid, usize> = HashMap::new();
    for d in 0..DOCS {
        let s = source(es.as_ref(), &index, &d.to_string()).await;
        assert_eq!(
            s["n"],
            json!(PER_DOC),
            "doc {d}: lost or doubled increments: {s}"
        );
        for id in Stamp::of(&s).unwrap().ops {
            *seen.entry(Uuid::parse_str(&id).unwrap()).or_default() += 1;
        }
    }
    for op in &ops {
        assert_eq!(
            seen.get(&op.id),
            Some(&1),
            "operation {} recorded once",
            op.id
        );
    }
}

/// Elasticsearch killed (connection refused) and started again empty: operations are parked
/// quickly; after the restart the test re-seeds the documents and the replay applies them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elasticsearch_killed_and_restarted_replay_applies_parked_operations() {
    let zk = &shared().zk;
    let es_server = OsmemServer::start().expect("start osmem-server");
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(&zk.connect_string(), es_server.url(), dir.path());
    let es = store(&settings);
    let index = format!("restart-{}", tag());
    let (_s, l) = locks(&settings).await;
    let writer = GuardedWriter::new(l, es.clone());
    let sink: Arc<dyn DeadLetterSink> = Arc::new(FileSink::new(&settings.retry.file_path));
    let exec = BackgroundExecutor::from_settings(writer.clone(), sink.clone(), &settings);

    es_server.kill();
    let ops: Vec<Operation> = (0..3)
        .map(|_| Operation::increment("k-1", &index, "1", "n", 2))
        .collect();
    for op in &ops {
        match exec.run(op.clone()).await.unwrap() {
            Outcome::Parked {
                attempts: 3,
                reason: ParkReason::RetriesExhausted,
                ..
            } => {}
            other => panic!("expected parked, got {other:?}"),
        }
    }
    let letters = sink.list().await.unwrap();
    assert!(
        letters.iter().all(|l| l.error_kind == "es_unavailable"),
        "{letters:?}"
    );

    es_server.start_again().expect("restart osmem-server");
    // The seed is not what the test is about: a lock lost on a busy machine (2 s sessions) is
    // a transient error, and the seed is written again.
    let mut tries = 0;
    while let Err(e) = writer.on("k-1").index(&index, "1", json!({"n": 100})).await {
        tries += 1;
        assert!(e.is_transient() && tries < 5, "seeding the document: {e}");
    }
    let results = replay(&writer, sink.as_ref(), ReplaySelection::All)
        .await
        .unwrap();
    assert!(
        results.iter().all(|r| r.result == ReplayResult::Applied),
        "{results:?}"
    );
    assert_eq!(source(es.as_ref(), &index, "1").await["n"], 106);
    assert!(sink.list().await.unwrap().is_empty());
}

/// The dead-letter sink refuses every write (its file would be under a regular file, which fails
/// for root too): an operation that could not be applied is reported lost, with its complete
/// dead letter, as an error; it is not counted as rejected or parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_the_sink_refuses_is_lost_not_rejected() {
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings_for(servers, dir.path());
    let blocker = dir.path().join("not-a-directory");
    std::fs::write(&blocker, "a regular file").unwrap();
    settings.retry.file_path = blocker.join("deadletters.jsonl");
    let es = store(&settings);
    let index = format!("lost-{}", tag());
    let (_s, l) = locks(&settings).await;
    let writer = GuardedWriter::new(l, es.clone());
    writer
        .on("lost-1")
        .index(&index, "1", json!({"n": 0}))
        .await
        .unwrap();
    let sink: Arc<dyn DeadLetterSink> = Arc::new(FileSink::new(&settings.retry.file_path));
    let exec = BackgroundExecutor::builder(writer, sink.clone())
        .attempts(2)
        .backoff(Duration::from_millis(10), Duration::from_millis(40))
        .lock_timeout(Duration::from_millis(200))
        .build();
    let (_hs, holder_locks) = locks(&settings).await;
    let held = holder_locks
        .acquire(LockRequest::new("lost-1", "long job"))
        .await
        .unwrap();

    let op = Operation::increment("lost-1", &index, "1", "n", 1).with_info("Bulk Propagation");
    let err = exec.run(op.clone()).await.unwrap_err();
    let BackgroundError::Lost {
        op_id,
        tries,
        ref letter,
        ..
    } = err
    else {
        panic!("expected BackgroundError::Lost, got {err}");
    };
    assert_eq!(op_id, op.id);
    assert_eq!(tries, PARK_TRIES);
    assert_eq!(
        letter.operation,
        op.clone().with_type(LockType::Background),
        "the error keeps the whole operation"
    );
    assert_eq!(letter.error_kind, "lock_timeout");
    let message = err.to_string();
    assert!(
        message.contains("is lost")
            && message.contains(&settings.retry.file_path.display().to_string()),
        "{message}"
    );
    let stats = exec.stats();
    assert_eq!(
        (
            stats.lost,
            stats.parked,
            stats.rejected,
            stats.park_failures
        ),
        (1, 0, 0, u64::from(PARK_TRIES)),
        "{stats:?}"
    );
    held.unlock().await.unwrap();
    assert_eq!(
        source(es.as_ref(), &index, "1").await["n"],
        0,
        "not applied"
    );
}

/// Counts the calls of each kind, and the writes sent in bulk requests.
#[derive(Default)]
struct CallCounts {
    calls: std::sync::Mutex<HashMap<&'static str, usize>>,
    bulk_writes: std::sync::atomic::AtomicUsize,
    /// The writes of each bulk request.
    bulk_sizes: std::sync::Mutex<Vec<usize>>,
}

impl CallCounts {
    fn of(&self, method: &str) -> usize {
        self.calls.lock().unwrap().get(method).copied().unwrap_or(0)
    }
}

#[async_trait]
impl zkguard::es::StoreHook for CallCounts {
    async fn before(&self, call: &zkguard::es::StoreCall<'_>) -> Result<(), zkguard::es::EsError> {
        *self.calls.lock().unwrap().entry(call.method()).or_default() += 1;
        if let zkguard::es::StoreCall::Bulk { actions, .. } = call {
            self.bulk_writes.fetch_add(actions.len(), Ordering::Relaxed);
            self.bulk_sizes.lock().unwrap().push(actions.len());
        }
        Ok(())
    }
}

/// Batched by monitor: 200 increments on 4 documents submitted at once, and one operation
/// submitted twice. Every increment is applied exactly once (the counters add up, each document
/// records each of its operations), the duplicate once, and the writes travel in shared `_bulk`
/// requests and the reads in shared `_mget` requests: no single-document write or read, fewer
/// requests than operations, and fewer lock acquisitions (tokens) than operations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_by_monitor_applies_each_operation_once_in_shared_bulk_requests() {
    const DOCS: usize = 4;
    const OPS: usize = 200;
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_for(servers, dir.path());
    let es = store(&settings);
    let index = format!("batch-{}", tag());
    let monitor = |d: usize| format!("{index}:{d}");
    let (_s, l) = locks(&settings).await;
    let plain = GuardedWriter::new(l.clone(), es.clone());
    for d in 0..DOCS {
        plain
            .on(monitor(d))
            .index(&index, &d.to_string(), json!({"n": 0}))
            .await
            .unwrap();
    }
    let counted = Arc::new(zkguard::es::HookedStore::new(
        es.clone(),
        CallCounts::default(),
    ));
    let writer = GuardedWriter::new(l, counted.clone());
    let sink: Arc<dyn DeadLetterSink> = Arc::new(FileSink::new(&settings.retry.file_path));
    let exec = BackgroundExecutor::builder(writer, sink)
        .retry(&settings.retry)
        .concurrency(OPS + 2)
        .batch_by_monitor(16, 64)
        .build();

    let mut ops = Vec::new();
    for i in 0..OPS {
        let d = i % DOCS;
        ops.push(Operation::increment(
            monitor(d),
            &index,
            d.to_string(),
            "n",
            1,
        ));
    }
    let twice = Operation::increment(monitor(0), &index, "0", "n", 1000);
    ops.push(twice.clone());
    ops.push(twice.clone());
    let mut handles = Vec::new();
    for op in &ops {
        handles.push(exec.submit(op.clone()).await);
    }
    let mut tokens = std::collections::HashSet::new();
    let mut already = 0;
    for h in handles {
        match h.await.unwrap().unwrap() {
            Outcome::Applied { written, .. } => {
                tokens.insert(written.token);
                already += usize::from(written.already_applied);
            }
            other => panic!("not applied: {other:?}"),
        }
    }
    assert_eq!(already, 1, "the operation submitted twice is applied once");
    for d in 0..DOCS {
        let doc = source(es.as_ref(), &index, &d.to_string()).await;
        let extra = if d == 0 { 1000 } else { 0 };
        assert_eq!(doc["n"], json!(OPS / DOCS + extra), "{index}/{d}: {doc}");
        let stamp = Stamp::of(&doc).expect("stamped");
        for op in ops.iter().filter(|op| op.target_id() == d.to_string()) {
            assert!(stamp.contains(&op.id), "{index}/{d} records {}", op.id);
        }
    }
    let calls = counted.hook();
    assert_eq!(
        calls.of("index") + calls.of("delete"),
        0,
        "no single-document write"
    );
    assert_eq!(calls.of("get"), 0, "no single-document read");
    assert!(
        calls.of("mget") < OPS,
        "{} _mget requests for {OPS} operations",
        calls.of("mget")
    );
    assert_eq!(
        calls.bulk_writes.load(Ordering::Relaxed),
        OPS + 1,
        "one bulk item per applied operation"
    );
    assert!(
        calls.of("bulk") < OPS,
        "{} bulk requests for {OPS} operations",
        calls.of("bulk")
    );
    assert!(
        tokens.len() < OPS,
        "{} acquisitions for {OPS} operations",
        tokens.len()
    );
    let stats = exec.stats();
    assert_eq!(
        (
            stats.applied,
            stats.already_applied,
            stats.parked,
            stats.lost
        ),
        (OPS as u64 + 2, 1, 0, 0),
        "{stats:?}"
    );
}

/// Large documents: the lanes' writes go in shared `_bulk` requests of at most
/// `BULK_MAX_BYTES` (about), not in one request of every lane that is ready: 8 documents of
/// 2.5 MiB on 8 monitors, submitted at once, travel in requests of at most three, and every one
/// is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_bulk_requests_stop_at_their_size_in_bytes() {
    const DOCS: usize = 8;
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_for(servers, dir.path());
    let es = store(&settings);
    let index = format!("big-{}", tag());
    let (_s, l) = locks(&settings).await;
    let counted = Arc::new(zkguard::es::HookedStore::new(
        es.clone(),
        CallCounts::default(),
    ));
    let sink: Arc<dyn DeadLetterSink> = Arc::new(FileSink::new(&settings.retry.file_path));
    let exec = BackgroundExecutor::builder(GuardedWriter::new(l, counted.clone()), sink)
        .retry(&settings.retry)
        .concurrency(DOCS)
        .batch_by_monitor(4, 1024)
        .build();
    let text = "x".repeat(5 * 512 * 1024);
    let mut handles = Vec::new();
    for d in 0..DOCS {
        let doc = json!({"d": d, "text": text});
        let op = Operation::index(format!("{index}:{d}"), &index, d.to_string(), doc);
        handles.push(exec.submit(op).await);
    }
    for h in handles {
        assert!(matches!(h.await.unwrap().unwrap(), Outcome::Applied { .. }));
    }
    for d in 0..DOCS {
        assert_eq!(source(es.as_ref(), &index, &d.to_string()).await["d"], d);
    }
    let calls = counted.hook();
    let largest = *calls.bulk_sizes.lock().unwrap().iter().max().unwrap();
    assert!(
        largest <= 3,
        "a _bulk request carried {largest} documents of 2.5 MiB"
    );
    assert!(
        largest * 5 * 512 * 1024 <= zkguard::write::background::BULK_MAX_BYTES,
        "{largest} documents fit in BULK_MAX_BYTES"
    );
    assert!(
        calls.of("bulk") >= DOCS / 3,
        "{} _bulk requests",
        calls.of("bulk")
    );
}

/// A lane with a backlog on one monitor takes one batch per acquisition, and each acquisition
/// releases the previous batch's lock in the same ZooKeeper request: about one request per batch
/// (two when each batch's lock is released on its own). Every operation is applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_with_a_backlog_releases_each_batch_in_the_next_acquisition() {
    const OPS: usize = 40;
    // A ZooKeeper of its own: its request count is this test's alone.
    let Lane {
        zk,
        settings,
        es,
        index,
        monitor,
        exec,
        _session,
        _dir,
    } = lane("lane", OPS).await;
    let before = zk.packets_received().unwrap();
    let mut handles = Vec::new();
    for _ in 0..OPS {
        let op = Operation::increment(&monitor, &index, "0", "n", 1);
        handles.push(exec.submit(op).await);
    }
    let mut tokens = std::collections::HashSet::new();
    for h in handles {
        match h.await.unwrap().unwrap() {
            Outcome::Applied { written, .. } => {
                tokens.insert(written.token);
            }
            other => panic!("not applied: {other:?}"),
        }
    }
    // The last batch's lock goes once the lane is idle: the monitor is free again.
    let probe = session_locks_probe(&settings, &monitor).await;
    let after = zk.packets_received().unwrap();
    assert_eq!(source(es.as_ref(), &index, "0").await["n"], json!(OPS));
    let batches = tokens.len();
    assert!(
        batches >= OPS / 4,
        "{batches} acquisitions for batches of at most 4"
    );
    // Each batch's acquisition (its first multi also releases the previous batch's lock), the
    // last release, the probe's session and lock cycle, the reading of the count, a ping or two
    // (measured: 16 for 10 batches; 25 with each lock released on its own).
    let requests = after - before;
    eprintln!("{requests} requests for {batches} batches");
    assert!(
        (requests as f64) < 1.5 * batches as f64 + 6.0,
        "{requests} ZooKeeper requests for {batches} batches"
    );
    drop(probe);
}

/// Takes and releases `monitor`'s lock through a session of its own (waiting for the lane's
/// last release); returns that session.
async fn session_locks_probe(
    settings: &zkguard::config::Settings,
    monitor: &str,
) -> zkguard::ZkSession {
    let (session, locks) = locks(settings).await;
    locks
        .acquire(LockRequest::new(monitor, "probe").with_timeout(Duration::from_secs(10)))
        .await
        .expect("the monitor is released once the lane is idle")
        .unlock()
        .await
        .unwrap();
    session
}

/// An operation whose task is stopped while its attempt waits in its monitor's lane (the
/// service stops the operations of a journal partition it no longer owns) is not written when
/// the lane gets the lock: nobody waits for it, and the partition's new owner applies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_whose_operation_was_stopped_is_not_written_by_its_lane() {
    let Lane {
        settings,
        es,
        index,
        monitor,
        exec,
        _session,
        _dir,
        zk: _zk,
    } = lane("lane-stop", 4).await;
    // Another session holds the monitor: the attempt waits in the lane.
    let (_holder_session, holder_locks) = locks(&settings).await;
    let held = holder_locks
        .acquire(LockRequest::new(&monitor, "holder"))
        .await
        .unwrap();
    let stopped = exec
        .submit(Operation::increment(&monitor, &index, "0", "n", 1))
        .await;
    stopped.abort();
    assert!(stopped.await.unwrap_err().is_cancelled());
    held.unlock().await.unwrap();
    let next = exec
        .submit(Operation::increment(&monitor, &index, "0", "n", 10))
        .await;
    assert!(matches!(
        next.await.unwrap().unwrap(),
        Outcome::Applied { .. }
    ));
    assert_eq!(source(es.as_ref(), &index, "0").await["n"], json!(10));
}

/// A background executor batching by monitor (4 operations a batch), on a ZooKeeper of its own,
/// with `concurrency`, and the document `0` of a new index (`prefix-…`) written once (`n` 0)
/// under its monitor `index:0`.
struct Lane {
    zk: zkguard::testkit::ZkServer,
    settings: zkguard::config::Settings,
    es: Arc<dyn zkguard::es::DocStore>,
    index: String,
    monitor: String,
    exec: BackgroundExecutor,
    _session: zkguard::ZkSession,
    _dir: tempfile::TempDir,
}

async fn lane(prefix: &str, concurrency: usize) -> Lane {
    let servers = shared();
    let zk = zkguard::testkit::ZkServer::start().expect("ZooKeeper");
    let dir = tempfile::tempdir().unwrap();
    let settings = guarded_support::settings(&zk.connect_string(), servers.es.url(), dir.path());
    let es = store(&settings);
    let index = format!("{prefix}-{}", tag());
    let monitor = format!("{index}:0");
    let (session, l) = locks(&settings).await;
    GuardedWriter::new(l.clone(), es.clone())
        .on(&monitor)
        .index(&index, "0", json!({"n": 0}))
        .await
        .unwrap();
    let exec = BackgroundExecutor::builder(
        GuardedWriter::new(l, es.clone()),
        Arc::new(FileSink::new(&settings.retry.file_path)) as Arc<dyn DeadLetterSink>,
    )
    .retry(&settings.retry)
    .concurrency(concurrency)
    .batch_by_monitor(4, 64)
    .build();
    Lane {
        zk,
        settings,
        es,
        index,
        monitor,
        exec,
        _session: session,
        _dir: dir,
    }
}

/// An operation found already applied in its document (an earlier attempt wrote it, say before
/// a crash, and its outcome was not recorded) reports the fencing token of the write that
/// applied it (`Written::applied_token`), not the token of the later lock that found it: the
/// document's token while the operation is its last one, none once a later operation was
/// written over it. Alike through a single guarded write, the background executor's batches
/// and a dead-letter replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_found_applied_reports_the_token_of_the_write_that_applied_it() {
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_for(servers, dir.path());
    let index = format!("found-{}", tag());
    let monitor = format!("found-{}", tag());
    let (_s, l) = locks(&settings).await;
    let writer = GuardedWriter::new(l, store(&settings));
    let first = Operation::index(&monitor, &index, "d", json!({"n": 1}));
    let written = writer.run(&first).await.unwrap();
    assert_eq!(written.applied_token, Some(written.token), "{written:?}");
    let t1 = written.token;

    let again = writer.run(&first).await.unwrap();
    assert!(again.already_applied && again.token > t1, "{again:?}");
    assert_eq!(again.applied_token, Some(t1), "{again:?}");

    let sink: Arc<dyn DeadLetterSink> = Arc::new(FileSink::new(&settings.retry.file_path));
    let exec = BackgroundExecutor::from_settings(writer.clone(), sink.clone(), &settings);
    match exec.submit(first.clone()).await.await.unwrap().unwrap() {
        Outcome::Applied { written, .. } => {
            assert!(written.already_applied && written.token > t1, "{written:?}");
            assert_eq!(written.applied_token, Some(t1), "{written:?}");
        }
        other => panic!("{other:?}"),
    }
    let now = SystemTime::now();
    let err = GuardedError::Lock(LockError::Timeout {
        monitor: monitor.clone(),
        lock_type: LockType::Background,
        waited: Duration::from_millis(1),
        blocked_by: None,
    });
    sink.park(&DeadLetter::new(&first, 1, &err, now, now))
        .await
        .unwrap();
    let replayed = replay(&writer, sink.as_ref(), ReplaySelection::All)
        .await
        .unwrap();
    assert_eq!(
        replayed[0].result,
        ReplayResult::AlreadyApplied,
        "{replayed:?}"
    );
    assert!(replayed[0].already_applied, "{replayed:?}");
    assert_eq!(replayed[0].applied_token, Some(t1), "{replayed:?}");

    // Written over by a later operation: the document keeps the id, not the token.
    writer
        .run(&Operation::index(&monitor, &index, "d", json!({"n": 2})))
        .await
        .unwrap();
    let covered = writer.run(&first).await.unwrap();
    assert!(covered.already_applied, "{covered:?}");
    assert_eq!(covered.applied_token, None, "{covered:?}");
    match exec.submit(first.clone()).await.await.unwrap().unwrap() {
        Outcome::Applied { written, .. } => assert_eq!(written.applied_token, None),
        other => panic!("{other:?}"),
    }
}
