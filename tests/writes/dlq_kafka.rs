//! The Kafka dead-letter sink against a real broker (`tansu`, started by each test), ZooKeeper
//! and osmem-server: records in the topic keyed and ordered per monitor, the file fallback when
//! the broker does not answer, `zkguard dlq list|replay` on the topic (including a replay killed
//! half-way), bad settings, and the demo with `--deadletters kafka`.

use crate::guarded_support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rskafka::client::partition::{OffsetAt, UnknownTopicHandling};
use rskafka::client::ClientBuilder;
use serde_json::{json, Value};
use zkguard::config::{DeadLetterSinkKind, Settings};
use zkguard::testkit::{free_port, TansuServer};
use zkguard::write::background::{BackgroundExecutor, Outcome};
use zkguard::write::deadletter::kafka::{
    KafkaSink, HEADER_ERROR_CLASS, HEADER_ID, HEADER_LOCK_TYPE,
};
use zkguard::write::deadletter::{DeadLetter, DeadLetterSink, FileSink, ReplaySelection};
use zkguard::write::guarded::{GuardedError, GuardedWriter};
use zkguard::write::ops::Operation;
use zkguard::{LockError, LockRequest, LockType};

use guarded_support::{locks, settings_for, shared, source, store, tag};

fn broker() -> TansuServer {
    TansuServer::start().expect("start tansu (run scripts/install-deps.sh)")
}

/// Test settings with the Kafka sink on `brokers`, a topic of its own, fast lock timeouts and a
/// 2 s delivery timeout.
fn kafka_settings(dir: &Path, brokers: &str) -> Settings {
    let mut s = settings_for(shared(), dir);
    s.retry.sink = DeadLetterSinkKind::Kafka;
    s.retry.kafka.brokers = vec![brokers.to_string()];
    s.retry.kafka.topic = format!("dl-{}", tag());
    s.retry.kafka.delivery_timeout = Duration::from_secs(2);
    s.retry.retry_count = 2;
    s.zookeeper.background_timeout = Duration::from_millis(200);
    s.zookeeper.foreground_timeout = Duration::from_millis(200);
    s
}

/// A properties file for the CLI with the test's servers and Kafka sink, plus `extra` lines.
fn write_config(dir: &Path, s: &Settings, extra: &str) -> PathBuf {
    let path = dir.join("zkguard.properties");
    let text = format!(
        "zookeeper.servers={}\nzookeeper.lock.root={}\nzookeeper.session.timeout=2000\n\
         zookeeper.background.task.timeout=5000\nelasticsearch.url={}\ndeadletter.sink=kafka\n\
         deadletter.file.path={}\ndeadletter.kafka.brokers={}\ndeadletter.kafka.topic={}\n\
         deadletter.kafka.delivery.timeout=2000\n{extra}",
        s.zookeeper.servers,
        s.zookeeper.lock_root,
        s.elasticsearch.urls[0],
        s.retry.file_path.display(),
        s.retry.kafka.brokers.join(","),
        s.retry.kafka.topic,
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn zkguard(config: &Path, args: &[&str]) -> Output {
    crate::cli::zkguard()
        .arg("--config")
        .arg(config)
        .args(args)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .output()
        .expect("run zkguard")
}

fn status(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// One record of the topic, as a plain consumer reads it.
#[derive(Debug)]
struct Read {
    partition: i32,
    key: String,
    headers: std::collections::BTreeMap<String, String>,
    value: Value,
}

/// Every record of `topic`, per partition in offset order, read with a plain client.
async fn read_topic(brokers: &str, topic: &str) -> Vec<Read> {
    let client = ClientBuilder::new(vec![brokers.to_string()])
        .build()
        .await
        .unwrap();
    let partitions = client
        .list_topics()
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.name == topic)
        .expect("the topic exists")
        .partitions;
    let mut out = Vec::new();
    for p in partitions {
        let pc = client
            .partition_client(topic, p, UnknownTopicHandling::Retry)
            .await
            .unwrap();
        let end = pc.get_offset(OffsetAt::Latest).await.unwrap();
        let mut at = 0;
        while at < end {
            let (records, _) = pc.fetch_records(at, 1..1_000_000, 100).await.unwrap();
            for r in records {
                at = r.offset + 1;
                out.push(Read {
                    partition: p,
                    key: String::from_utf8(r.record.key.unwrap()).unwrap(),
                    headers: r
                        .record
                        .headers
                        .into_iter()
                        .map(|(k, v)| (k, String::from_utf8(v).unwrap()))
                        .collect(),
                    value: serde_json::from_slice(&r.record.value.unwrap()).unwrap(),
                });
            }
        }
    }
    out
}

/// Background operations that exhaust their retries land in the topic: key = monitor, value =
/// the dead letter's JSON, headers with lock type, error class and id; one monitor's records in
/// one partition, in the order they were parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_background_operations_land_keyed_and_in_order() {
    let kafka = broker();
    let dir = tempfile::tempdir().unwrap();
    let settings = kafka_settings(dir.path(), &kafka.brokers());
    let es = store(&settings);
    let index = format!("kafka-{}", tag());
    let (_s, l) = locks(&settings).await;
    let writer = GuardedWriter::new(l, es.clone());
    let monitors = ["kafka-a", "kafka-b", "kafka-c"];
    for (i, m) in monitors.iter().enumerate() {
        writer
            .on(*m)
            .index(&index, &i.to_string(), json!({"n": 0}))
            .await
            .unwrap();
    }
    let sink = Arc::new(KafkaSink::new(
        &settings.retry.kafka,
        &settings.retry.file_path,
    ));
    let exec = BackgroundExecutor::from_settings(writer, sink.clone(), &settings);
    let (_hs, holder) = locks(&settings).await;
    let mut held = Vec::new();
    for m in monitors {
        held.push(
            holder
                .acquire(LockRequest::new(m, "long job"))
                .await
                .unwrap(),
        );
    }

    // Each monitor's operations one after the other; the monitors in parallel.
    let mut tasks = Vec::new();
    for (i, m) in monitors.iter().enumerate() {
        let exec = exec.clone();
        let index = index.clone();
        let m = m.to_string();
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for by in 1..=4 {
                let op = Operation::increment(&m, &index, i.to_string(), "n", by)
                    .with_type(LockType::Background);
                let outcome = exec.run(op.clone()).await.unwrap();
                assert!(matches!(outcome, Outcome::Parked { .. }), "{outcome:?}");
                ids.push(op.id.to_string());
            }
            (m, ids)
        }));
    }
    let mut expected = Vec::new();
    for t in tasks {
        expected.push(t.await.unwrap());
    }
    assert_eq!(sink.fallbacks(), 0, "the broker acknowledged every park");
    assert!(
        !settings.retry.file_path.exists(),
        "nothing went to the fallback file"
    );

    let records = read_topic(&kafka.brokers(), &settings.retry.kafka.topic).await;
    assert_eq!(records.len(), monitors.len() * 4, "{records:?}");
    let partitions: std::collections::HashSet<i32> = records.iter().map(|r| r.partition).collect();
    for (m, ids) in &expected {
        let mine: Vec<&Read> = records.iter().filter(|r| &r.key == m).collect();
        let got: Vec<String> = mine
            .iter()
            .map(|r| r.value["id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(&got, ids, "{m}: in parking order");
        assert!(
            mine.iter().all(|r| r.partition == mine[0].partition),
            "{m}: one partition"
        );
        for r in mine {
            assert_eq!(r.value["monitor"], json!(m));
            assert_eq!(r.value["attempts"], json!(2));
            assert_eq!(r.value["error_kind"], json!("lock_timeout"));
            assert_eq!(r.value["operation"]["monitor"], json!(m));
            assert!(r.value["last_error"]
                .as_str()
                .unwrap()
                .contains("not acquired"));
            assert!(r.value["parked_at"].as_str().unwrap().ends_with('Z'));
            assert_eq!(r.headers[HEADER_LOCK_TYPE], "background");
            assert_eq!(r.headers[HEADER_ERROR_CLASS], "lock_timeout");
            assert_eq!(&r.headers[HEADER_ID], r.value["id"].as_str().unwrap());
        }
    }
    assert!(
        !partitions.is_empty() && partitions.iter().all(|p| (0..3).contains(p)),
        "{partitions:?}"
    );

    // The same value the file sink stores: a DeadLetter, listed by the sink oldest first.
    let listed = sink.list().await.unwrap();
    assert_eq!(listed.len(), monitors.len() * 4);
    drop(held);
}

/// The broker stops answering while operations are parked: they go to the fallback file (the
/// sink says so) and nothing is lost; `zkguard dlq list` shows topic and file, and one
/// `zkguard dlq replay --all` drains both, applying each operation once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_at_park_time_falls_back_to_the_file_and_replay_drains_both() {
    let kafka = broker();
    let dir = tempfile::tempdir().unwrap();
    let settings = kafka_settings(dir.path(), &kafka.brokers());
    let config = write_config(dir.path(), &settings, "");
    let es = store(&settings);
    let index = format!("kafka-fb-{}", tag());
    let (_s, l) = locks(&settings).await;
    let writer = GuardedWriter::new(l, es.clone());
    writer
        .on("fb-1")
        .index(&index, "1", json!({"n": 0}))
        .await
        .unwrap();
    let sink = Arc::new(KafkaSink::new(
        &settings.retry.kafka,
        &settings.retry.file_path,
    ));
    let exec = BackgroundExecutor::from_settings(writer, sink.clone(), &settings);
    let (_hs, holder) = locks(&settings).await;
    let held = holder
        .acquire(LockRequest::new("fb-1", "long job"))
        .await
        .unwrap();
    let op = |by: i64| {
        Operation::increment("fb-1", &index, "1", "n", by).with_type(LockType::Background)
    };

    let first = op(1);
    assert!(exec.run(first.clone()).await.unwrap().is_parked());
    kafka.pause();
    let second = op(10);
    let outcome = exec.run(second.clone()).await.unwrap();
    kafka.resume();
    assert!(outcome.is_parked(), "not lost: {outcome:?}");
    assert_eq!(sink.fallbacks(), 1);
    let in_file = FileSink::new(&settings.retry.file_path)
        .list()
        .await
        .unwrap();
    assert_eq!(
        in_file.iter().map(|l| l.id).collect::<Vec<_>>(),
        vec![second.id]
    );
    assert!(
        sink.describe().contains("1 parked in the fallback file"),
        "{}",
        sink.describe()
    );
    let third = op(100);
    assert!(exec.run(third.clone()).await.unwrap().is_parked());
    assert_eq!(sink.fallbacks(), 1, "the broker answers again");
    drop(held);

    let listed = zkguard(&config, &["dlq", "list", "--json"]);
    assert_eq!(status(&listed), 0, "{}", text(&listed));
    let entries: Vec<Value> = serde_json::from_slice(&listed.stdout).unwrap();
    let mut ids: Vec<String> = entries
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    let mut want: Vec<String> = [&first, &second, &third]
        .iter()
        .map(|o| o.id.to_string())
        .collect();
    want.sort();
    assert_eq!(ids, want, "topic and file, each entry once");

    // One entry by id (from the topic): applied, and marked done there.
    let one = zkguard(&config, &["dlq", "replay", "--id", &first.id.to_string()]);
    assert_eq!(status(&one), 0, "{}", text(&one));
    assert_eq!(source(es.as_ref(), &index, "1").await["n"], 1);
    let listed = zkguard(&config, &["dlq", "list", "--json"]);
    let entries: Vec<Value> = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(entries.len(), 2, "{}", text(&listed));
    assert!(entries
        .iter()
        .all(|e| e["id"] != json!(first.id.to_string())));

    let replayed = zkguard(&config, &["dlq", "replay", "--all"]);
    assert_eq!(status(&replayed), 0, "{}", text(&replayed));
    assert!(
        !String::from_utf8_lossy(&replayed.stdout).contains(&first.id.to_string()),
        "the entry replayed by id is not replayed again: {}",
        text(&replayed)
    );
    assert_eq!(
        source(es.as_ref(), &index, "1").await["n"],
        111,
        "each applied once"
    );
    let after = zkguard(&config, &["dlq", "list"]);
    assert_eq!(status(&after), 0, "{}", text(&after));
    assert!(
        String::from_utf8_lossy(&after.stdout).contains("no parked operations"),
        "{}",
        text(&after)
    );
    let again = zkguard(&config, &["dlq", "replay", "--all"]);
    assert_eq!(status(&again), 0, "{}", text(&again));
    assert_eq!(source(es.as_ref(), &index, "1").await["n"], 111);
}

/// No broker at all (nothing listens on the configured port): every park, several at once, goes
/// to the fallback file; nothing is lost and the sink counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_broker_at_all_parks_everything_in_the_fallback_file() {
    let dir = tempfile::tempdir().unwrap();
    let unused = format!("127.0.0.1:{}", free_port().unwrap());
    let mut settings = kafka_settings(dir.path(), &unused);
    settings.retry.kafka.delivery_timeout = Duration::from_millis(500);
    let sink = Arc::new(KafkaSink::new(
        &settings.retry.kafka,
        &settings.retry.file_path,
    ));
    let mut tasks = Vec::new();
    for i in 0..4 {
        let sink = sink.clone();
        let e = GuardedError::Lock(LockError::Timeout {
            monitor: "none-1".into(),
            lock_type: LockType::Background,
            waited: Duration::from_millis(200),
            blocked_by: None,
        });
        tasks.push(tokio::spawn(async move {
            let op =
                Operation::increment("none-1", "idx", "1", "n", i).with_type(LockType::Background);
            let now = SystemTime::now();
            sink.park(&DeadLetter::new(&op, 2, &e, now, now))
                .await
                .unwrap();
            op.id
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap());
    }
    assert_eq!(sink.fallbacks(), 4);
    let mut in_file: Vec<_> = FileSink::new(&settings.retry.file_path)
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.id)
        .collect();
    in_file.sort();
    ids.sort();
    assert_eq!(in_file, ids);
    assert!(sink.describe().contains("4 parked in the fallback file"));
}

/// `zkguard dlq replay --all` is killed (SIGKILL) right after it applied its fourth operation;
/// the next replay applies the rest, nothing twice and nothing skipped: the amounts are powers
/// of two, so the final value tells exactly which operations were applied how often.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_killed_half_way_and_restarted_applies_each_operation_once() {
    let kafka = broker();
    let dir = tempfile::tempdir().unwrap();
    let settings = kafka_settings(dir.path(), &kafka.brokers());
    let config = write_config(dir.path(), &settings, "");
    let es = store(&settings);
    let index = format!("kafka-kill-{}", tag());
    let (_s, l) = locks(&settings).await;
    GuardedWriter::new(l, es.clone())
        .on("kill-1")
        .index(&index, "1", json!({"n": 0}))
        .await
        .unwrap();
    let sink = KafkaSink::new(&settings.retry.kafka, &settings.retry.file_path);
    let err = GuardedError::Lock(LockError::Timeout {
        monitor: "kill-1".into(),
        lock_type: LockType::Background,
        waited: Duration::from_millis(200),
        blocked_by: None,
    });
    for i in 0..8 {
        let op = Operation::increment("kill-1", &index, "1", "n", 1 << i)
            .with_type(LockType::Background);
        let now = SystemTime::now();
        sink.park(&DeadLetter::new(&op, 2, &err, now, now))
            .await
            .unwrap();
    }
    assert_eq!(sink.fallbacks(), 0);

    let mut child = crate::cli::zkguard()
        .arg("--config")
        .arg(&config)
        .args(["dlq", "replay", "--all"])
        .env("RUST_LOG", "zkguard=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut applied = 0;
    for line in BufReader::new(stderr).lines() {
        let line = line.unwrap();
        if line.contains("operation applied; committing its offset") {
            applied += 1;
            if applied == 4 {
                child.kill().unwrap();
                break;
            }
        }
    }
    assert_eq!(applied, 4, "the replay reported four applied operations");
    child.wait().unwrap();
    let partial = source(es.as_ref(), &index, "1").await["n"]
        .as_i64()
        .unwrap();
    assert!((15..255).contains(&partial), "killed half-way: {partial}");

    let again = zkguard(&config, &["dlq", "replay", "--all"]);
    assert_eq!(status(&again), 0, "{}", text(&again));
    assert_eq!(
        source(es.as_ref(), &index, "1").await["n"],
        255,
        "every operation applied exactly once: {}",
        text(&again)
    );
    assert!(sink.list().await.unwrap().is_empty());
}

/// A replay that stops for good right after an operation reached Elasticsearch and before its
/// offset was committed (the store never answers that write; the replay is then dropped, its
/// lock session closed): the next `zkguard dlq replay --all` starts at that operation, finds it
/// already applied, applies the rest, and does not touch the ones committed before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_stopped_between_apply_and_commit_resumes_at_that_operation() {
    use async_trait::async_trait;
    use zkguard::es::{EsError, HookedStore, StoreCall, StoreHook};

    /// Never answers the index call that brings `n` to `at` (after it was applied).
    struct HangAfter {
        at: i64,
        reached: tokio::sync::mpsc::UnboundedSender<()>,
    }

    #[async_trait]
    impl StoreHook for HangAfter {
        async fn after(
            &self,
            call: &StoreCall<'_>,
            outcome: Result<(), &EsError>,
        ) -> Option<EsError> {
            if let StoreCall::Index { source, .. } = call {
                if outcome.is_ok() && source["n"].as_i64() == Some(self.at) {
                    let _ = self.reached.send(());
                    std::future::pending::<()>().await;
                }
            }
            None
        }
    }

    let kafka = broker();
    let dir = tempfile::tempdir().unwrap();
    let settings = kafka_settings(dir.path(), &kafka.brokers());
    let config = write_config(dir.path(), &settings, "");
    let es = store(&settings);
    let index = format!("kafka-stop-{}", tag());
    let (_s, l) = locks(&settings).await;
    GuardedWriter::new(l, es.clone())
        .on("stop-1")
        .index(&index, "1", json!({"n": 0}))
        .await
        .unwrap();
    let sink = Arc::new(KafkaSink::new(
        &settings.retry.kafka,
        &settings.retry.file_path,
    ));
    let err = GuardedError::Lock(LockError::Timeout {
        monitor: "stop-1".into(),
        lock_type: LockType::Background,
        waited: Duration::from_millis(200),
        blocked_by: None,
    });
    let mut ops = Vec::new();
    for i in 0..6 {
        let op = Operation::increment("stop-1", &index, "1", "n", 1 << i)
            .with_type(LockType::Background);
        let now = SystemTime::now();
        sink.park(&DeadLetter::new(&op, 2, &err, now, now))
            .await
            .unwrap();
        ops.push(op);
    }

    // The third operation (n = 1 + 2 + 4) is applied, and its write never answers.
    let (tx, mut reached) = tokio::sync::mpsc::unbounded_channel();
    let hooked: Arc<dyn zkguard::es::DocStore> = Arc::new(HookedStore::new(
        es.clone(),
        HangAfter { at: 7, reached: tx },
    ));
    let (session, replay_locks) = locks(&settings).await;
    let writer = GuardedWriter::new(replay_locks, hooked);
    let replaying = {
        let sink = sink.clone();
        tokio::spawn(async move { sink.replay(&writer, ReplaySelection::All).await })
    };
    reached
        .recv()
        .await
        .expect("the third operation was applied");
    replaying.abort();
    let _ = replaying.await;
    session.close();
    assert_eq!(source(es.as_ref(), &index, "1").await["n"], 7);

    let again = zkguard(&config, &["dlq", "replay", "--all"]);
    assert_eq!(status(&again), 0, "{}", text(&again));
    let out = String::from_utf8_lossy(&again.stdout);
    assert!(
        out.contains(&format!("already applied  {}", ops[2].id)),
        "{out}"
    );
    for op in &ops[3..] {
        assert!(
            out.contains(&format!("applied          {}", op.id)),
            "{out}"
        );
    }
    for op in &ops[..2] {
        assert!(!out.contains(&op.id.to_string()), "committed before: {out}");
    }
    assert!(
        out.contains("replayed 4: 3 applied, 1 already applied"),
        "{out}"
    );
    assert_eq!(source(es.as_ref(), &index, "1").await["n"], 63);
}

/// Bad settings: no brokers (78), a missing topic with auto-create off (78), an unreachable
/// broker (69); each with one clear message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_kafka_settings_exit_78_or_69_with_clear_errors() {
    let kafka = broker();
    let dir = tempfile::tempdir().unwrap();
    let settings = kafka_settings(dir.path(), &kafka.brokers());

    let no_brokers = dir.path().join("none.properties");
    std::fs::write(
        &no_brokers,
        "deadletter.sink=kafka\ndeadletter.kafka.brokers=\n",
    )
    .unwrap();
    let out = zkguard(&no_brokers, &["dlq", "list"]);
    assert_eq!(status(&out), 78, "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("deadletter.kafka.brokers"), "{err}");
    assert_eq!(err.matches("e.g. kafka1:9092").count(), 1, "{err}");

    let bad_port = dir.path().join("port.properties");
    std::fs::write(
        &bad_port,
        "deadletter.sink=kafka\ndeadletter.kafka.brokers=kafka1\n",
    )
    .unwrap();
    let out = zkguard(&bad_port, &["dlq", "list"]);
    assert_eq!(status(&out), 78, "{}", text(&out));

    let config = write_config(
        dir.path(),
        &settings,
        "deadletter.kafka.auto.create=false\n",
    );
    let out = zkguard(&config, &["dlq", "list"]);
    assert_eq!(status(&out), 78, "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("`{}` does not exist", settings.retry.kafka.topic))
            && err.contains("deadletter.kafka.auto.create=true"),
        "{err}"
    );

    let mut unreachable = settings.clone();
    unreachable.retry.kafka.brokers = vec![format!("127.0.0.1:{}", free_port().unwrap())];
    let config = write_config(dir.path(), &unreachable, "");
    for args in [&["dlq", "list"][..], &["dlq", "replay", "--all"][..]] {
        let out = zkguard(&config, args);
        assert_eq!(status(&out), 69, "{args:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("cannot reach the Kafka brokers"), "{err}");
        assert_eq!(
            err.matches("check deadletter.kafka.brokers").count(),
            1,
            "{err}"
        );
    }

    // The demo checks the broker before its workload starts.
    let demo = zkguard(
        &config,
        &["demo", "--servers", "configured", "--deadletters", "kafka"],
    );
    assert_eq!(status(&demo), 69, "{}", text(&demo));
    assert!(
        String::from_utf8_lossy(&demo.stderr).contains("cannot reach the Kafka brokers"),
        "{}",
        text(&demo)
    );
    let mut file_sink = settings.clone();
    file_sink.retry.kafka.brokers = Vec::new();
    let config = write_config(dir.path(), &file_sink, "");
    let text_now = std::fs::read_to_string(&config)
        .unwrap()
        .replace("deadletter.sink=kafka", "deadletter.sink=file");
    std::fs::write(&config, text_now).unwrap();
    let demo = zkguard(
        &config,
        &["demo", "--servers", "configured", "--deadletters", "kafka"],
    );
    assert_eq!(status(&demo), 78, "{}", text(&demo));
    assert!(
        String::from_utf8_lossy(&demo.stderr).contains("needs deadletter.kafka.brokers"),
        "{}",
        text(&demo)
    );
}

/// `zkguard demo --deadletters kafka` with local servers starts a broker too; its dead letters
/// go to the topic, are replayed from it, and the reconciliation passes.
#[test]
fn demo_with_kafka_dead_letters_reconciles() {
    let dir = tempfile::tempdir().unwrap();
    let report = crate::local_demo::small_local_demo(dir.path(), &["--deadletters", "kafka"]);
    assert!(
        report["sink"]
            .as_str()
            .unwrap()
            .starts_with("Kafka topic zkguard-deadletters on 127.0.0.1:"),
        "{}",
        report["sink"]
    );
    let r = &report["reconciliation"];
    assert!(r["mismatches"].as_array().unwrap().is_empty(), "{r}");
    assert_eq!(r["lost"], json!(0), "{r}");
    assert_eq!(
        report["replayed"], report["dead_letters"],
        "every dead letter replayed from the topic"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Parks every fourth entry in the Kafka sink's fallback file, the others in the topic, as a
/// broker that misses some acknowledgements would.
struct SomeInTheFile {
    kafka: Arc<KafkaSink>,
    parked: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl DeadLetterSink for SomeInTheFile {
    async fn park(
        &self,
        letter: &DeadLetter,
    ) -> Result<(), zkguard::write::deadletter::DeadLetterError> {
        let n = self
            .parked
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n % 4 == 3 {
            self.kafka.fallback().park(letter).await
        } else {
            self.kafka.park(letter).await
        }
    }
    async fn list(&self) -> Result<Vec<DeadLetter>, zkguard::write::deadletter::DeadLetterError> {
        self.kafka.list().await
    }
    async fn remove(
        &self,
        id: uuid::Uuid,
    ) -> Result<bool, zkguard::write::deadletter::DeadLetterError> {
        self.kafka.remove(id).await
    }
    fn describe(&self) -> String {
        self.kafka.describe()
    }
}

/// Forty background writes of one document parked in shuffled order, in the topic and the
/// fallback file: `zkguard dlq replay --all` applies them in the order they were accepted, so
/// the document ends on the last one, and commits the topic's offsets past them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_applies_a_documents_entries_in_acceptance_order() {
    let kafka = broker();
    let dir = tempfile::tempdir().unwrap();
    let settings = kafka_settings(dir.path(), &kafka.brokers());
    let config = write_config(dir.path(), &settings, "");
    let es = store(&settings);
    let index = format!("kafka-order-{}", tag());
    let sink = Arc::new(KafkaSink::new(
        &settings.retry.kafka,
        &settings.retry.file_path,
    ));
    let mixed = SomeInTheFile {
        kafka: sink.clone(),
        parked: Default::default(),
    };
    let ops =
        guarded_support::parked::park_shuffled(&settings, &mixed, "korder-1", &index, "1", 0..40)
            .await;
    assert_eq!(sink.fallback().list().await.unwrap().len(), 10);
    assert_eq!(sink.list().await.unwrap().len(), 40);

    let all = zkguard(&config, &["dlq", "replay", "--all", "--json"]);
    assert_eq!(status(&all), 0, "{}", text(&all));
    let v: Value = serde_json::from_slice(&all.stdout).unwrap();
    assert_eq!(v["applied"], 40, "{v}");
    let order = guarded_support::parked::replayed_ids(&v);
    let accepted: Vec<String> = ops.iter().map(|o| o.id.to_string()).collect();
    assert_eq!(order, accepted, "acceptance order, topic and file together");
    assert_eq!(
        source(es.as_ref(), &index, "1").await["n"],
        39,
        "the last accepted write"
    );
    assert!(sink.list().await.unwrap().is_empty());
    let again = zkguard(&config, &["dlq", "replay", "--all"]);
    assert_eq!(status(&again), 0, "{}", text(&again));
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("no parked operations"),
        "{}",
        text(&again)
    );
}

/// `POST /v1/deadletters/replay` runs the library's `deadletter::replay` on the service's sink;
/// it replays a Kafka topic the way `zkguard dlq replay` does. An entry that fails again is
/// re-parked as a new record and its old record marked done, so the next replay finds it once
/// (the service's replay used to leave the old record pending: the next `dlq replay --all`
/// ran the entry twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_through_the_library_settles_records_as_the_cli_does() {
    let kafka = broker();
    let dir = tempfile::tempdir().unwrap();
    let settings = kafka_settings(dir.path(), &kafka.brokers());
    let config = write_config(dir.path(), &settings, "");
    let es = store(&settings);
    let index = format!("kafka-once-{}", tag());
    let sink = Arc::new(KafkaSink::new(
        &settings.retry.kafka,
        &settings.retry.file_path,
    ));
    let op = Operation::increment("once-1", &index, "1", "n", 1).with_type(LockType::Background);
    let err = GuardedError::Lock(LockError::Timeout {
        monitor: "once-1".into(),
        lock_type: LockType::Background,
        waited: Duration::from_millis(200),
        blocked_by: None,
    });
    let now = SystemTime::now();
    sink.park(&DeadLetter::new(&op, 2, &err, now, now))
        .await
        .unwrap();

    // The document does not exist yet: the replay fails again and re-parks the entry.
    let (session, l) = locks(&settings).await;
    let writer = GuardedWriter::new(l.clone(), es.clone());
    let as_service: Arc<dyn DeadLetterSink> = sink.clone();
    let first =
        zkguard::write::deadletter::replay(&writer, as_service.as_ref(), ReplaySelection::All)
            .await
            .unwrap();
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(
        matches!(
            first[0].result,
            zkguard::write::deadletter::ReplayResult::StillParked { .. }
        ),
        "{first:?}"
    );
    assert_eq!(sink.list().await.unwrap().len(), 1);

    // (the setup's write may wait: the test's lock timeouts are short for the parking above)
    GuardedWriter::new(l, es.clone())
        .with_lock_timeout(Duration::from_secs(10))
        .on("once-1")
        .index(&index, "1", json!({"n": 0}))
        .await
        .unwrap();
    session.close();
    let all = zkguard(&config, &["dlq", "replay", "--all", "--json"]);
    assert_eq!(status(&all), 0, "{}", text(&all));
    let v: Value = serde_json::from_slice(&all.stdout).unwrap();
    assert_eq!(v["replayed"], 1, "the entry once: {v}");
    assert_eq!(v["applied"], 1, "{v}");
    assert_eq!(source(es.as_ref(), &index, "1").await["n"], 1);
}
