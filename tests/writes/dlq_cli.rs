//! `zkguard dlq list` and `zkguard dlq replay`, run as processes against a real ZooKeeper and
//! osmem-server, including a replay killed between applying an operation and removing its entry.

use crate::guarded_support;

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use zkguard::config::{DeadLetterSinkKind, Settings};
use zkguard::write::deadletter::{DeadLetter, DeadLetterSink, EsSink, FileSink};
use zkguard::write::guarded::{GuardedError, GuardedWriter};
use zkguard::write::ops::Operation;
use zkguard::{LockError, LockType};

use crate::wait::eventually;
use guarded_support::parked::park_shuffled;
use guarded_support::{locks, settings_for, shared, source, store, tag};

/// A properties file for the CLI with the test's servers, lock root and dead-letter sink.
fn write_config(dir: &Path, s: &Settings) -> PathBuf {
    let path = dir.join("zkguard.properties");
    let sink = match s.retry.sink {
        DeadLetterSinkKind::File => "file",
        DeadLetterSinkKind::Elasticsearch => "elasticsearch",
        DeadLetterSinkKind::Kafka => "kafka",
    };
    let text = format!(
        "zookeeper.servers={}\nzookeeper.lock.root={}\nzookeeper.session.timeout=2000\n\
         zookeeper.background.task.timeout=5000\nelasticsearch.url={}\ndeadletter.sink={sink}\n\
         deadletter.file.path={}\ndeadletter.index={}\n",
        s.zookeeper.servers,
        s.zookeeper.lock_root,
        s.elasticsearch.urls[0],
        s.retry.file_path.display(),
        s.retry.index,
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn zkguard(config: &Path, args: &[&str]) -> Output {
    crate::cli::zkguard()
        .arg("--config")
        .arg(config)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run zkguard")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn status(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// Parks increments of `index/id` field `n` by each amount, as the background executor would.
async fn park_increments(
    sink: &dyn DeadLetterSink,
    monitor: &str,
    index: &str,
    id: &str,
    by: &[i64],
) -> Vec<Operation> {
    let mut ops = Vec::new();
    for b in by {
        let op = Operation::increment(monitor, index, id, "n", *b).with_type(LockType::Background);
        let err = GuardedError::Lock(LockError::Timeout {
            monitor: monitor.into(),
            lock_type: LockType::Background,
            waited: Duration::from_millis(300),
            blocked_by: None,
        });
        let now = SystemTime::now();
        sink.park(&DeadLetter::new(&op, 3, &err, now, now))
            .await
            .unwrap();
        ops.push(op);
    }
    ops
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_replay_with_exit_statuses() {
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_for(servers, dir.path());
    let config = write_config(dir.path(), &settings);
    let es = store(&settings);
    let index = format!("cli-{}", tag());
    let (_s, l) = locks(&settings).await;
    GuardedWriter::new(l, es.clone())
        .on("cli-1")
        .index(&index, "1", json!({"n": 0}))
        .await
        .unwrap();

    let empty = zkguard(&config, &["dlq", "list"]);
    assert_eq!(status(&empty), 0);
    assert!(
        stdout(&empty).contains("no parked operations in file"),
        "{}",
        stdout(&empty)
    );

    let sink = FileSink::new(&settings.retry.file_path);
    let ops = park_increments(&sink, "cli-1", &index, "1", &[1, 10, 100]).await;

    let listed = zkguard(&config, &["dlq", "list", "--json"]);
    assert_eq!(status(&listed), 0, "{listed:?}");
    let entries: Vec<Value> = serde_json::from_slice(&listed.stdout).expect("a JSON array");
    assert_eq!(entries.len(), 3);
    for (e, op) in entries.iter().zip(&ops) {
        assert_eq!(e["id"], op.id.to_string());
        assert_eq!(e["monitor"], "cli-1");
        assert_eq!(e["attempts"], 3);
        assert_eq!(e["error_kind"], "lock_timeout");
        assert_eq!(e["operation"]["kind"]["type"], "update");
        assert!(e["parked_at"].as_str().unwrap().ends_with('Z'));
    }
    let table = zkguard(&config, &["dlq", "list"]);
    let text = stdout(&table);
    assert!(
        ops.iter().all(|o| text.contains(&o.id.to_string())),
        "{text}"
    );
    assert!(
        text.contains("increment") && text.contains("3 parked operation(s)"),
        "{text}"
    );

    // Usage errors: 64.
    assert_eq!(status(&zkguard(&config, &["dlq", "replay"])), 64);
    assert_eq!(
        status(&zkguard(&config, &["dlq", "replay", "--id", "not-an-id"])),
        64
    );
    let unknown = zkguard(
        &config,
        &["dlq", "replay", "--id", &uuid::Uuid::new_v4().to_string()],
    );
    assert_eq!(status(&unknown), 64);
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("no parked operation has id"),
        "{unknown:?}"
    );

    // One entry: the older entry of its document (accepted before it) is replayed first.
    let one = zkguard(&config, &["dlq", "replay", "--id", &ops[1].id.to_string()]);
    assert_eq!(status(&one), 0, "{one:?}");
    assert!(
        stdout(&one).contains(&format!("applied          {}", ops[1].id))
            && stdout(&one).contains(&format!("older entry      {}", ops[0].id)),
        "{}",
        stdout(&one)
    );
    assert_eq!(source(es.as_ref(), &index, "1").await["n"], 11);
    assert_eq!(sink.list().await.unwrap().len(), 1);

    let all = zkguard(&config, &["dlq", "replay", "--all"]);
    assert_eq!(status(&all), 0, "{all:?}");
    assert!(
        stdout(&all).contains("replayed 1: 1 applied"),
        "{}",
        stdout(&all)
    );
    assert_eq!(source(es.as_ref(), &index, "1").await["n"], 111);
    assert!(sink.list().await.unwrap().is_empty());

    // An entry that cannot be applied stays parked: 75, with the attempt recorded.
    let missing = park_increments(&sink, "cli-1", &index, "no-such-doc", &[1]).await;
    let failed = zkguard(&config, &["dlq", "replay", "--all"]);
    assert_eq!(status(&failed), 75, "{failed:?}");
    assert!(
        stdout(&failed).contains("still parked"),
        "{}",
        stdout(&failed)
    );
    let left = sink.list().await.unwrap();
    assert_eq!(
        (left.len(), left[0].id, left[0].attempts),
        (1, missing[0].id, 4)
    );
    assert_eq!(left[0].error_kind, "not_found");
}

/// `zkguard dlq replay --all` is killed after applying the first operation and before removing
/// its entry (the test holds the dead-letter file's lock, so the removal waits). The next replay
/// recognises the applied operation, removes its entry without writing, and applies the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_killed_between_apply_and_remove_does_not_apply_twice() {
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_for(servers, dir.path());
    let config = write_config(dir.path(), &settings);
    let es = store(&settings);
    let index = format!("crash-{}", tag());
    let (_s, l) = locks(&settings).await;
    GuardedWriter::new(l, es.clone())
        .on("crash-1")
        .index(&index, "1", json!({"n": 0}))
        .await
        .unwrap();
    let sink = FileSink::new(&settings.retry.file_path);
    let ops = park_increments(&sink, "crash-1", &index, "1", &[1, 10]).await;

    let lock_file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(sink.lock_path())
        .unwrap();
    let mut file_lock = fd_lock::RwLock::new(lock_file);
    let held = file_lock.write().unwrap();
    let mut child = crate::cli::zkguard()
        .arg("--config")
        .arg(&config)
        .args(["dlq", "replay", "--all"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let es2 = es.clone();
    let index2 = index.clone();
    eventually(
        Duration::from_secs(30),
        "the first operation applied by the replay",
        move || {
            let es = es2.clone();
            let index = index2.clone();
            async move {
                es.get(&index, "1")
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|d| d.source["n"] == 1)
            }
        },
    )
    .await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "the replay waits to remove the entry"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    drop(held);

    assert_eq!(
        sink.list().await.unwrap().len(),
        2,
        "the killed replay removed nothing"
    );
    assert_eq!(source(es.as_ref(), &index, "1").await["n"], 1);

    let again = zkguard(&config, &["dlq", "replay", "--all"]);
    assert_eq!(status(&again), 0, "{again:?}");
    let text = stdout(&again);
    assert!(
        text.contains(&format!("already applied  {}", ops[0].id)),
        "{text}"
    );
    assert!(
        text.contains(&format!("applied          {}", ops[1].id)),
        "{text}"
    );
    assert_eq!(
        source(es.as_ref(), &index, "1").await["n"],
        11,
        "applied once each"
    );
    assert!(sink.list().await.unwrap().is_empty());
}

/// The Elasticsearch sink: the CLI lists and replays entries parked in `deadletter.index`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elasticsearch_sink_through_the_cli() {
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings_for(servers, dir.path());
    settings.retry.sink = DeadLetterSinkKind::Elasticsearch;
    settings.retry.index = format!("dl-{}", tag());
    let config = write_config(dir.path(), &settings);
    let es = store(&settings);
    let index = format!("esdl-{}", tag());
    let (_s, l) = locks(&settings).await;
    GuardedWriter::new(l, es.clone())
        .on("esdl-1")
        .index(&index, "1", json!({"n": 0}))
        .await
        .unwrap();
    let sink: Arc<dyn DeadLetterSink> =
        zkguard::write::deadletter::sink_from_settings(&settings.retry, Some(es.clone())).unwrap();
    assert_eq!(sink.describe(), format!("index {}", settings.retry.index));
    // Different document shapes in the payload must not clash in the sink's mappings.
    let other_index = format!("{index}-other");
    let odd = Operation::index("esdl-1", &other_index, "2", json!({"n": "text"}))
        .with_type(LockType::Background);
    let now = SystemTime::now();
    let timeout = GuardedError::Lock(LockError::Timeout {
        monitor: "esdl-1".into(),
        lock_type: LockType::Background,
        waited: Duration::from_millis(1),
        blocked_by: None,
    });
    sink.park(&DeadLetter::new(&odd, 1, &timeout, now, now))
        .await
        .unwrap();
    let ops = park_increments(sink.as_ref(), "esdl-1", &index, "1", &[5, 7]).await;
    let plain =
        Operation::index("esdl-1", &index, "3", json!({"n": 5})).with_type(LockType::Background);
    sink.park(&DeadLetter::new(&plain, 1, &timeout, now, now))
        .await
        .unwrap();
    assert_eq!(
        sink.list()
            .await
            .unwrap()
            .iter()
            .map(|l| l.id)
            .collect::<Vec<_>>(),
        vec![odd.id, ops[0].id, ops[1].id, plain.id],
        "oldest first"
    );
    let paged = EsSink::new(es.clone(), settings.retry.index.clone()).with_page_size(3);
    assert_eq!(
        paged.list().await.unwrap(),
        sink.list().await.unwrap(),
        "pages of 3 give the same list"
    );
    let listed = zkguard(&config, &["dlq", "list", "--json"]);
    assert_eq!(status(&listed), 0, "{listed:?}");
    let entries: Vec<Value> = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(entries.len(), 4);
    assert_eq!(
        entries[1]["operation"],
        serde_json::to_value(&ops[0]).unwrap()
    );

    let all = zkguard(&config, &["dlq", "replay", "--all"]);
    assert_eq!(status(&all), 0, "{all:?}");
    assert_eq!(source(es.as_ref(), &index, "1").await["n"], 12);
    assert_eq!(source(es.as_ref(), &index, "3").await["n"], 5);
    assert_eq!(source(es.as_ref(), &other_index, "2").await["n"], "text");
    assert!(sink.list().await.unwrap().is_empty());
    let direct = EsSink::new(es.clone(), settings.retry.index.clone());
    assert!(!direct.remove(ops[0].id).await.unwrap());
}

/// The sink can be read but refuses writes (its lock file is a directory, which fails for root
/// too): a replay that fails cannot record the attempt, says so for the entry, and exits 75;
/// the entry stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_says_when_the_sink_refuses_to_record_a_failed_attempt() {
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_for(servers, dir.path());
    let config = write_config(dir.path(), &settings);
    let index = format!("cli-ro-{}", tag());
    let sink = FileSink::new(&settings.retry.file_path);
    // The document does not exist: the replay fails.
    let ops = park_increments(&sink, "cli-ro", &index, "missing", &[1]).await;
    std::fs::remove_file(sink.lock_path()).unwrap();
    std::fs::create_dir(sink.lock_path()).unwrap();

    let o = zkguard(&config, &["dlq", "replay", "--all"]);
    let text = stdout(&o);
    assert_eq!(
        status(&o),
        75,
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.contains(&ops[0].id.to_string()))
        .unwrap_or_else(|| panic!("a line for the entry: {text}"));
    assert!(
        line.starts_with("still parked") && line.contains("recording this attempt failed"),
        "{line}"
    );
    let left = sink.list().await.unwrap();
    assert_eq!((left.len(), left[0].attempts), (1, 3), "{left:?}");
}

/// `dlq replay --json`: one JSON object with the counts and each entry's result; errors as
/// `{"error", "message"}` on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_reports_as_json() {
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_for(servers, dir.path());
    let config = write_config(dir.path(), &settings);
    let es = store(&settings);
    let index = format!("cli-json-{}", tag());
    let (_s, l) = locks(&settings).await;
    GuardedWriter::new(l, es.clone())
        .on("cli-json")
        .index(&index, "1", json!({"n": 0}))
        .await
        .unwrap();

    let empty = zkguard(&config, &["dlq", "replay", "--all", "--json"]);
    assert_eq!(status(&empty), 0, "{empty:?}");
    let v: Value = serde_json::from_slice(&empty.stdout).unwrap();
    assert_eq!(v["replayed"], 0);
    assert_eq!(v["results"], json!([]));

    let sink = FileSink::new(&settings.retry.file_path);
    let ok = park_increments(&sink, "cli-json", &index, "1", &[5]).await;
    let bad = park_increments(&sink, "cli-json", &index, "no-such-doc", &[1]).await;
    let out = zkguard(&config, &["dlq", "replay", "--all", "--json"]);
    assert_eq!(status(&out), 75, "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["replayed"], 2);
    assert_eq!(v["applied"], 1);
    assert_eq!(v["still_parked"], 1);
    let results = v["results"].as_array().unwrap();
    let find = |id: uuid::Uuid| {
        results
            .iter()
            .find(|r| r["id"] == id.to_string())
            .unwrap()
            .clone()
    };
    assert_eq!(find(ok[0].id)["result"], "applied");
    assert_eq!(find(ok[0].id)["error"], Value::Null);
    // The shape of POST /v1/deadletters/replay: summary, attempts (parked after 3, then this
    // replay), the replay's token.
    assert!(find(ok[0].id)["summary"].as_str().unwrap().contains(&index));
    assert_eq!(find(ok[0].id)["attempts"], 4);
    assert!(find(ok[0].id)["token"].is_u64());
    assert_eq!(find(bad[0].id)["attempts"], 4);
    assert_eq!(find(bad[0].id)["result"], "still_parked");
    assert!(find(bad[0].id)["error"].is_string());
    assert_eq!(source(es.as_ref(), &index, "1").await["n"], 5);

    let usage = zkguard(&config, &["dlq", "replay", "--id", "not-an-id", "--json"]);
    assert_eq!(status(&usage), 64);
    let e: Value = serde_json::from_slice(&usage.stderr).expect("a JSON error");
    assert_eq!(e["error"], "usage");
    assert!(e["message"].as_str().unwrap().contains("not-an-id"));
}

/// `dlq discard`: an entry that can never apply is removed for good, without being run; the
/// entry and the reason are printed and logged. An unknown or malformed id is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discard_removes_one_entry_and_logs_it() {
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_for(servers, dir.path());
    let config = write_config(dir.path(), &settings);
    let index = format!("cli-discard-{}", tag());
    let sink = FileSink::new(&settings.retry.file_path);
    let never = park_increments(&sink, "cli-discard", &index, "no-such-doc", &[1]).await;
    let kept = park_increments(&sink, "cli-discard", &index, "other", &[2]).await;

    let id = never[0].id.to_string();
    let out = zkguard(
        &config,
        &[
            "dlq",
            "discard",
            "--id",
            &id,
            "--reason",
            "document deleted",
            "--json",
        ],
    );
    assert_eq!(status(&out), 0, "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["id"], json!(id));
    assert_eq!(v["reason"], "document deleted");
    assert_eq!(v["entry"]["operation"]["id"], json!(id));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("dead letter discarded")
            && log.contains(&id)
            && log.contains("document deleted"),
        "{log}"
    );
    let left = sink.list().await.unwrap();
    assert_eq!(
        left.iter().map(|l| l.id).collect::<Vec<_>>(),
        vec![kept[0].id],
        "only the other entry stays"
    );

    let again = zkguard(&config, &["dlq", "discard", "--id", &id]);
    assert_eq!(status(&again), 64, "{again:?}");
    assert!(
        String::from_utf8_lossy(&again.stderr).contains(&id),
        "{again:?}"
    );
    let bad = zkguard(&config, &["dlq", "discard", "--id", "nope"]);
    assert_eq!(status(&bad), 64, "{bad:?}");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("zkguard dlq list"),
        "{bad:?}"
    );
    let plain = zkguard(
        &config,
        &["dlq", "discard", "--id", &kept[0].id.to_string()],
    );
    assert_eq!(status(&plain), 0, "{plain:?}");
    assert!(
        stdout(&plain).starts_with("discarded "),
        "{}",
        stdout(&plain)
    );
    assert!(sink.list().await.unwrap().is_empty());
}

/// Forty background writes of one document, parked in shuffled order: `replay --all` applies
/// them in the order they were accepted, so the document ends on the last one. A replay of one
/// entry replays the older entries of its document first; an entry older than a write the
/// document already has is reported superseded and not applied over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_applies_one_documents_entries_in_acceptance_order() {
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_for(servers, dir.path());
    let config = write_config(dir.path(), &settings);
    let es = store(&settings);
    let index = format!("order-{}", tag());
    let sink = FileSink::new(&settings.retry.file_path);
    let ops = park_shuffled(&settings, &sink, "order-1", &index, "1", 0..40).await;
    assert_ne!(sink.list().await.unwrap().last().unwrap().id, ops[39].id);

    let all = zkguard(&config, &["dlq", "replay", "--all", "--json"]);
    assert_eq!(status(&all), 0, "{all:?}");
    let v: Value = serde_json::from_slice(&all.stdout).unwrap();
    assert_eq!(
        (v["replayed"].as_u64(), v["applied"].as_u64()),
        (Some(40), Some(40)),
        "{v}"
    );
    let replayed = guarded_support::parked::replayed_ids(&v);
    let accepted: Vec<String> = ops.iter().map(|o| o.id.to_string()).collect();
    assert_eq!(replayed, accepted, "replayed in acceptance order");
    assert_eq!(
        source(es.as_ref(), &index, "1").await["n"],
        39,
        "the last accepted write"
    );
    assert!(sink.list().await.unwrap().is_empty());

    // One entry by id: the older entries of its document go first, and the output says so.
    let more = park_shuffled(&settings, &sink, "order-1", &index, "1", 40..43).await;
    let one = zkguard(&config, &["dlq", "replay", "--id", &more[1].id.to_string()]);
    assert_eq!(status(&one), 0, "{one:?}");
    let text = stdout(&one);
    let older = text
        .find(&more[0].id.to_string())
        .unwrap_or_else(|| panic!("{text}"));
    let asked = text
        .find(&format!("applied          {}", more[1].id))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(older < asked, "the older entry first: {text}");
    assert!(text.contains("older"), "{text}");
    assert_eq!(source(es.as_ref(), &index, "1").await["n"], 41);
    let left: Vec<_> = sink.list().await.unwrap().iter().map(|l| l.id).collect();
    assert_eq!(left, vec![more[2].id]);

    // A newer write applied meanwhile: the parked, older one is superseded, not applied.
    let (_s, l) = locks(&settings).await;
    GuardedWriter::new(l, es.clone())
        .on("order-1")
        .index(&index, "1", json!({"n": 100}))
        .await
        .unwrap();
    let stale = zkguard(&config, &["dlq", "replay", "--all", "--json"]);
    assert_eq!(status(&stale), 0, "{stale:?}");
    let v: Value = serde_json::from_slice(&stale.stdout).unwrap();
    assert_eq!(v["superseded"], 1, "{v}");
    assert_eq!(v["results"][0]["result"], "superseded", "{v}");
    assert!(
        v["results"][0]["error"].as_str().unwrap().contains("newer"),
        "{v}"
    );
    assert_eq!(
        source(es.as_ref(), &index, "1").await["n"],
        100,
        "not overwritten"
    );
    assert!(sink.list().await.unwrap().is_empty());
}

/// The same through the Elasticsearch-index sink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elasticsearch_sink_replays_in_acceptance_order() {
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings_for(servers, dir.path());
    settings.retry.sink = DeadLetterSinkKind::Elasticsearch;
    settings.retry.index = format!("dl-order-{}", tag());
    let config = write_config(dir.path(), &settings);
    let es = store(&settings);
    let index = format!("esorder-{}", tag());
    let sink = EsSink::new(es.clone(), settings.retry.index.clone());
    let ops = park_shuffled(&settings, &sink, "esorder-1", &index, "1", 0..40).await;
    assert_ne!(sink.list().await.unwrap().last().unwrap().id, ops[39].id);
    let all = zkguard(&config, &["dlq", "replay", "--all"]);
    assert_eq!(status(&all), 0, "{all:?}");
    assert!(
        stdout(&all).contains("replayed 40: 40 applied"),
        "{}",
        stdout(&all)
    );
    assert_eq!(
        source(es.as_ref(), &index, "1").await["n"],
        39,
        "the last accepted write"
    );
    assert!(sink.list().await.unwrap().is_empty());
}

/// Dead letters by the caller's id: an operation named with an idempotency key that is not a
/// UUID shows the key beside its id in `dlq list`, and `--id` takes the key for replay and
/// discard (it exited 64, "not an entry id").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_are_found_by_the_callers_idempotency_key() {
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_for(servers, dir.path());
    let config = write_config(dir.path(), &settings);
    let es = store(&settings);
    let index = format!("cli-key-{}", tag());
    let (_s, l) = locks(&settings).await;
    GuardedWriter::new(l, es.clone())
        .on("cli-key-1")
        .index(&index, "1", json!({"n": 0}))
        .await
        .unwrap();
    let sink = FileSink::new(&settings.retry.file_path);
    let err = GuardedError::Lock(LockError::Timeout {
        monitor: "cli-key-1".into(),
        lock_type: LockType::Background,
        waited: Duration::from_millis(300),
        blocked_by: None,
    });
    let mut ops = Vec::new();
    for (key, by) in [("order-42-save-3", 1), ("order-42-save-4", 10)] {
        let op = Operation::increment("cli-key-1", &index, "1", "n", by)
            .with_type(LockType::Background)
            .with_key(key);
        let now = SystemTime::now();
        sink.park(&DeadLetter::new(&op, 3, &err, now, now))
            .await
            .unwrap();
        ops.push(op);
    }

    let table = stdout(&zkguard(&config, &["dlq", "list"]));
    assert!(table.lines().next().unwrap().contains("KEY"), "{table}");
    for op in &ops {
        let row = table
            .lines()
            .find(|l| l.contains(&op.id.to_string()))
            .unwrap_or_else(|| panic!("{table}"));
        assert!(row.contains(op.key.as_deref().unwrap()), "{table}");
    }
    let unknown = zkguard(&config, &["dlq", "replay", "--id", "order-42-save-9"]);
    assert_eq!(status(&unknown), 64, "{unknown:?}");
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("order-42-save-9"),
        "{unknown:?}"
    );

    let discarded = zkguard(
        &config,
        &[
            "dlq",
            "discard",
            "--id",
            "order-42-save-4",
            "--reason",
            "sent twice",
        ],
    );
    assert_eq!(status(&discarded), 0, "{discarded:?}");
    let replayed = zkguard(&config, &["dlq", "replay", "--id", "order-42-save-3"]);
    assert_eq!(status(&replayed), 0, "{replayed:?}");
    assert!(
        stdout(&replayed).contains("1 applied"),
        "{}",
        stdout(&replayed)
    );
    assert_eq!(source(es.as_ref(), &index, "1").await["n"], 1);
    assert!(sink.list().await.unwrap().is_empty());
}
