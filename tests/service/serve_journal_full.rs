//! A journal that cannot record outcomes (its file at the file-size limit, as on a full disk)
//! stops the service from applying background operations: an operation applied without a
//! recorded outcome runs again at the next start, and once more than the document's 100
//! remembered ids were written after it, it would go over newer data with a newer token.

use crate::common;
use crate::eventually_value;
use crate::serve_controls::{check_doc, outcome_token};
use crate::serve_support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::json;
use serve_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_that_cannot_be_journaled_stop_background_work_and_nothing_stale_is_replayed() {
    let env = Env::new(&shared_zk().connect_string(), "journal-full").file_size(Some(96 * 1024));
    let s = env.start("journal-full");
    let c = client();
    let index = format!("full-{}", uuid_tag());
    let monitor = format!("full-{}", uuid_tag());
    let (_holder, guard) = hold_lock(&env, &monitor).await;

    // Background writes of one document queue behind the held lock until the journal is full.
    let mut accepted = Vec::new();
    let refused = loop {
        let n = accepted.len();
        let op_id = uuid::Uuid::new_v4().to_string();
        let (status, v) = put(
            &c,
            &s,
            &format!("/v1/indices/{index}/docs/d?type=background&monitor={monitor}&op_id={op_id}"),
            &json!({"n": n}),
        )
        .await;
        if status != StatusCode::ACCEPTED {
            break v;
        }
        accepted.push(op_id);
        assert!(n < 2000, "the journal never filled up");
    };
    assert_eq!(refused["error"], "journal_unavailable", "{refused}");
    let last = accepted.len() - 1;
    assert!(
        last > 150,
        "only {last} operations fit: too few to pass the document's memory of 100 ids"
    );

    // The lock is free: the first batch is applied, its outcomes cannot be recorded, and the
    // service stops there, saying so on /readyz and in its log, until it manages to rewrite
    // the journal (compaction frees room: on a fast machine within milliseconds, so /readyz
    // is read until either shows it).
    guard.unlock().await.unwrap();
    eventually(
        Duration::from_secs(30),
        "/readyz or the log reports the journal",
        || async {
            let (status, v) = call(&client(), Method::GET, &s.url("/readyz"), None).await;
            let readyz = status == StatusCode::SERVICE_UNAVAILABLE
                && v["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("journal cannot record outcomes"));
            readyz || s.log().contains("cannot record outcomes in the journal")
        },
    )
    .await;
    // A crash now: what was applied without a recorded outcome runs again at the next start.
    s.kill();

    // Restarted with room: every operation ends applied once, in order, and the document holds
    // the last one.
    let roomy = env.clone().file_size(None);
    let s = roomy.start("journal-full");
    let done = wait_finished(&c, &s, &accepted).await;
    assert!(done.values().all(|v| v["status"] == "applied"), "{done:?}");
    let doc = es_doc(&c, &index, "d").await;
    assert_eq!(doc["_source"]["n"], json!(last), "{doc}");
}

/// A small file system of its own (a 192 KiB tmpfs), mounted for the test.
struct SmallFs(std::path::PathBuf);

impl SmallFs {
    fn mount(dir: &std::path::Path, size: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "this test mounts a small tmpfs and needs root (as make test runs in CI): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self(dir.to_path_buf())
    }

    fn grow(&self, size: &str) {
        let out = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// The journal on a real, small file system: once the disk is full, background writes are
/// refused with 503 and nothing acknowledged is lost; the journal's age and depth show the
/// stuck work; when the disk has room again, the running service rewrites its journal and
/// applies every acknowledged operation, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_background_writes_and_loses_nothing() {
    let base = Env::new(&shared_zk().connect_string(), "small-disk");
    let disk = SmallFs::mount(&base.dir.path().join("disk"), "192k");
    let env = base.with(
        "ZKGUARD_SERVER_JOURNAL_PATH",
        disk.0.join("journal.jsonl").to_str().unwrap(),
    );
    let s = env.start("small-disk");
    let c = client();
    let index = format!("disk-{}", uuid_tag());
    let monitor = format!("disk-{}", uuid_tag());
    let (_holder, guard) = hold_lock(&env, &monitor).await;

    let mut accepted = Vec::new();
    let refused = loop {
        let n = accepted.len();
        let (status, v) = put(
            &c,
            &s,
            &format!("/v1/indices/{index}/docs/d?type=background&monitor={monitor}"),
            &json!({"n": n, "pad": "x".repeat(512)}),
        )
        .await;
        if status != StatusCode::ACCEPTED {
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{v}");
            break v;
        }
        accepted.push(v["operation_id"].as_str().unwrap().to_string());
        assert!(n < 5000, "the disk never filled up");
    };
    assert_eq!(refused["error"], "journal_unavailable", "{refused}");
    assert!(accepted.len() > 20, "{} operations fit", accepted.len());
    let m = scrape(&c, &s).await;
    assert_eq!(m["zkguard_journal_depth"], accepted.len() as f64, "{m:?}");
    assert!(m["zkguard_journal_oldest_seconds"] > 0.0, "{m:?}");

    // Room again, and the lock free: the service rewrites its journal and applies everything
    // it acknowledged, in order, without a restart.
    disk.grow("8m");
    guard.unlock().await.unwrap();
    let done = wait_finished(&c, &s, &accepted).await;
    assert!(done.values().all(|v| v["status"] == "applied"), "{done:?}");
    let doc = es_doc(&c, &index, "d").await;
    assert_eq!(doc["_source"]["n"], json!(accepted.len() - 1), "{doc}");
    eventually(
        Duration::from_secs(30),
        "/readyz is ready again",
        || async {
            call(&client(), Method::GET, &s.url("/readyz"), None)
                .await
                .0
                == StatusCode::OK
        },
    )
    .await;
    let m = scrape(&c, &s).await;
    assert_eq!(m["zkguard_journal_depth"], 0.0, "{m:?}");
    assert_eq!(m["zkguard_journal_oldest_seconds"], 0.0, "{m:?}");
}

/// A service journaling in Kafka (`server.journal.backend=kafka`) on `broker`, in a topic and
/// progress index of its own, named `instance` among its fleet, its state in `state_dir`.
fn kafka_env(
    broker: &zkguard::testkit::TansuServer,
    tag: &str,
    instance: &str,
    state_dir: &std::path::Path,
) -> Env {
    Env::new(&shared_zk().connect_string(), tag)
        .with("ZKGUARD_SERVER_JOURNAL_BACKEND", "kafka")
        .with("ZKGUARD_SERVER_JOURNAL_KAFKA_BROKERS", &broker.brokers())
        .with(
            "ZKGUARD_SERVER_JOURNAL_KAFKA_TOPIC",
            &format!("journal-{tag}"),
        )
        .with("ZKGUARD_SERVER_JOURNAL_KAFKA_PARTITIONS", "3")
        .with(
            "ZKGUARD_SERVER_JOURNAL_KAFKA_INDEX",
            &format!("zkguard-journal-{tag}"),
        )
        .with("ZKGUARD_SERVER_INSTANCE_ID", instance)
        .with("ZKGUARD_STATE_DIR", state_dir.to_str().unwrap())
}

/// A monitor whose operations go to journal partition `p` of 3 (and no other of `others`).
fn monitor_in(p: usize, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|m| zkguard::write::deadletter::kafka::partition_for(m.as_bytes(), 3) == p)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_journal_applies_every_operation_once_after_a_kill_that_loses_the_state_directory() {
    let broker = zkguard::testkit::TansuServer::start().expect("start tansu");
    let tag = uuid_tag();
    let state_a = tempfile::tempdir().unwrap();
    let env = kafka_env(&broker, &tag, "a", state_a.path());
    let s = env.start("kafka-a");
    assert_eq!(
        s.started["journal"],
        format!("kafka:journal-{tag}"),
        "{}",
        s.started
    );
    let c = client();
    let index = format!("kafka-{tag}");
    // Three documents in three partitions; the first one's lock is held, so its operations
    // are still unapplied when the service dies.
    let monitors: Vec<String> = (0..3).map(|p| monitor_in(p, &tag)).collect();
    let (_holder, guard) = hold_lock(&env, &monitors[0]).await;
    let mut ids = Vec::new();
    let mut last = HashMap::new();
    for n in 0..30 {
        let d = n % 3;
        let op_id = uuid::Uuid::new_v4().to_string();
        let (status, v) = put(
            &c,
            &s,
            &format!(
                "/v1/indices/{index}/docs/d{d}?type=background&monitor={}&op_id={op_id}",
                monitors[d]
            ),
            &json!({"n": n}),
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{v}");
        ids.push((d, op_id));
        last.insert(d, n);
    }
    // The free documents' operations are applied from the topic.
    let free: Vec<String> = ids
        .iter()
        .filter(|(d, _)| *d != 0)
        .map(|(_, id)| id.clone())
        .collect();
    let done = wait_finished(&c, &s, &free).await;
    assert!(done.values().all(|v| v["status"] == "applied"), "{done:?}");

    // SIGKILL, and the state directory is gone with the host.
    s.kill();
    std::fs::remove_dir_all(state_a.path()).unwrap();
    guard.unlock().await.unwrap();

    // Another instance takes the partitions over once the dead one's session expired, and
    // answers for the operations the first one accepted and applied.
    let state_b = tempfile::tempdir().unwrap();
    let env_b = env
        .clone()
        .with("ZKGUARD_SERVER_INSTANCE_ID", "b")
        .with("ZKGUARD_STATE_DIR", state_b.path().to_str().unwrap());
    let s = env_b.start("kafka-b");
    // An operation accepted by the dead instance is unknown here until this one reads it from
    // the topic or finds its outcome: `?wait=` looks for it until then.
    let mut done = HashMap::new();
    for (_, id) in &ids {
        let v = eventually_value(Duration::from_secs(60), || async {
            let url = s.url(&format!("/v1/operations/{id}?wait=5s"));
            let (status, v) = call(&client(), Method::GET, &url, None).await;
            (status == StatusCode::OK && v["status"] != "queued").then_some(v)
        })
        .await;
        assert_eq!(v["status"], "applied", "{v}");
        done.insert(id.clone(), v);
    }
    for d in 0..3 {
        let tokens: HashMap<String, Option<u64>> = ids
            .iter()
            .filter(|(doc, _)| *doc == d)
            .map(|(_, id)| (id.clone(), outcome_token(&done[id])))
            .collect();
        check_doc(&c, &index, &format!("d{d}"), &tokens).await;
        let doc = es_doc(&c, &index, &format!("d{d}")).await;
        assert_eq!(doc["_source"]["n"], json!(last[&d]), "{doc}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_journal_owner_whose_progress_a_newer_owner_claimed_applies_nothing_more() {
    let broker = zkguard::testkit::TansuServer::start().expect("start tansu");
    let tag = uuid_tag();
    let state = tempfile::tempdir().unwrap();
    let env = kafka_env(&broker, &tag, "a", state.path());
    let s = env.start("kafka-fenced");
    let c = client();
    let es = shared_es().url().to_string();
    let progress = format!(
        "{}/zkguard-journal-{tag}/_doc/progress-journal-{tag}-0",
        es.trim_end_matches('/')
    );
    // The instance owns partition 0: its claim is there, with its token as the version.
    let token = eventually_value(Duration::from_secs(30), || async {
        let (status, v) = call(&client(), Method::GET, &progress, None).await;
        (status == StatusCode::OK && v["_source"]["owner"] == "a")
            .then(|| v["_version"].as_u64())
            .flatten()
    })
    .await;
    // A newer owner (a greater token) claims it.
    let newer = token + 1_000_000;
    let (status, v) = call(
        &c,
        Method::PUT,
        &format!("{progress}?version={newer}&version_type=external_gte"),
        Some(json!({"offset": 0, "accepted": 0, "owner": "newer", "token": newer}).to_string()),
    )
    .await;
    assert!(status.is_success(), "{v}");

    let index = format!("fenced-{tag}");
    let m0 = monitor_in(0, &tag);
    let m1 = monitor_in(1, &tag);
    let op = |m: &str, d: &str| {
        let path = format!("/v1/indices/{index}/docs/{d}?type=background&monitor={m}");
        let (c, s) = (&c, &s);
        async move {
            let (status, v) = put(c, s, &path, &json!({"n": 1})).await;
            assert_eq!(status, StatusCode::ACCEPTED, "{v}");
            v["operation_id"].as_str().unwrap().to_string()
        }
    };
    let fenced = op(&m0, "d0").await;
    let free = op(&m1, "d1").await;
    // The other partitions go on; partition 0's applier finds its token refused and stops
    // before queueing what it read, and every later claim of this instance is refused too.
    let done = wait_finished(&c, &s, std::slice::from_ref(&free)).await;
    assert_eq!(done[&free]["status"], "applied", "{done:?}");
    eventually(
        Duration::from_secs(30),
        "the deposed applier stops",
        || async {
            let log = s.log();
            log.contains("no longer owned here")
                && log.contains("cannot claim a journal partition's progress")
        },
    )
    .await;
    assert_eq!(op_status(&c, &s, &fenced).await["status"], "queued");
    let (status, _) = call(
        &c,
        Method::GET,
        &format!("{}/{index}/_doc/d0", es.trim_end_matches('/')),
        None,
    )
    .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "the deposed owner wrote the document"
    );
    let (_, v) = call(&c, Method::GET, &progress, None).await;
    assert_eq!(v["_source"]["owner"], "newer", "{v}");
    assert_eq!(v["_version"].as_u64(), Some(newer), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_journal_that_cannot_take_writes_refuses_background_writes_and_readyz_says_so() {
    let broker = zkguard::testkit::TansuServer::start().expect("start tansu");
    let tag = uuid_tag();
    let state = tempfile::tempdir().unwrap();
    let env = kafka_env(&broker, &tag, "a", state.path())
        .with("ZKGUARD_SERVER_JOURNAL_KAFKA_TIMEOUT", "1000");
    let s = env.start("kafka-down");
    let c = client();
    let index = format!("down-{tag}");
    let write = |n: u32| {
        let url = s.url(&format!("/v1/indices/{index}/docs/d?type=background"));
        let c = c.clone();
        async move {
            c.put(url)
                .header("content-type", "application/json")
                .body(json!({ "n": n }).to_string())
                .send()
                .await
                .unwrap()
        }
    };
    let first = write(0).await;
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let first: serde_json::Value = first.json().await.unwrap();

    // A frozen broker acknowledges nothing: the write is refused, not answered 202.
    broker.pause();
    let refused = write(1).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.headers().contains_key("retry-after"));
    let v: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(v["error"], "journal_unavailable", "{v}");
    let (status, v) = call(&c, Method::GET, &s.url("/readyz"), None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{v}");

    // Back: writes are taken again, and every acknowledged one is applied.
    broker.resume();
    let second = eventually_value(Duration::from_secs(30), || async {
        let r = write(2).await;
        if r.status() == StatusCode::ACCEPTED {
            r.json::<serde_json::Value>().await.ok()
        } else {
            None
        }
    })
    .await;
    eventually(Duration::from_secs(30), "/readyz answers 200", || async {
        call(&client(), Method::GET, &s.url("/readyz"), None)
            .await
            .0
            == StatusCode::OK
    })
    .await;
    let ids: Vec<String> = [&first, &second]
        .iter()
        .map(|v| v["operation_id"].as_str().unwrap().to_string())
        .collect();
    let done = wait_finished(&c, &s, &ids).await;
    assert!(done.values().all(|v| v["status"] == "applied"), "{done:?}");
    assert_eq!(es_doc(&c, &index, "d").await["_source"]["n"], json!(2));
}

/// One background write a client of [`flood_client`] sent, and its answer.
struct Sent {
    doc: usize,
    op: String,
    body: serde_json::Value,
    sent: std::time::Instant,
    answered: std::time::Instant,
    /// [`BrokerPhase`] when it was sent and when it was answered.
    phases: (u8, u8),
    status: StatusCode,
    answer: serde_json::Value,
    retry_after: bool,
}

/// Where a broker restart stands: up, killed, started again.
struct BrokerPhase;

impl BrokerPhase {
    const UP: u8 = 0;
    const DOWN: u8 = 1;
    const BACK: u8 = 2;
}

/// The flood's shared state: the broker's phase, the writes answered, and the stop flag.
#[derive(Default)]
struct Flood {
    phase: std::sync::atomic::AtomicU8,
    stop: std::sync::atomic::AtomicBool,
    sent: std::sync::Mutex<Vec<Sent>>,
}

impl Flood {
    fn phase(&self) -> u8 {
        self.phase.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Writes answered so far that match `keep`.
    fn count(&self, keep: impl Fn(&Sent) -> bool) -> usize {
        self.sent.lock().unwrap().iter().filter(|s| keep(s)).count()
    }
}

/// A client of the flood: background writes with their own `op_id`, round robin over `docs`
/// (whose monitors are `monitors`), until the flood stops. After a refusal it waits 50 ms, as
/// a client honouring `Retry-After` would, only shorter.
async fn flood_client(
    flood: std::sync::Arc<Flood>,
    s: String,
    index: String,
    monitors: Vec<String>,
    client_no: usize,
) {
    let c = client();
    for n in 0.. {
        if flood.stop.load(std::sync::atomic::Ordering::SeqCst) {
            break;
        }
        let doc = (n + client_no) % monitors.len();
        let op = uuid::Uuid::new_v4().to_string();
        let body = json!({"client": client_no, "n": n});
        let url = format!(
            "{s}/v1/indices/{index}/docs/d{doc}?type=background&monitor={}&op_id={op}",
            monitors[doc]
        );
        let (sent, before) = (std::time::Instant::now(), flood.phase());
        let r = c
            .put(url)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("the service answers");
        let (status, retry_after) = (r.status(), r.headers().contains_key("retry-after"));
        let answer = r.json().await.unwrap_or(serde_json::Value::Null);
        let refused = status != StatusCode::ACCEPTED;
        flood.sent.lock().unwrap().push(Sent {
            doc,
            op,
            body,
            sent,
            answered: std::time::Instant::now(),
            phases: (before, flood.phase()),
            status,
            answer,
            retry_after,
        });
        if refused {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The broker of the Kafka journal (durable: tansu on S3 storage) SIGKILLed in the middle of a
/// flood of background writes on shared documents, and started again on its storage: while it
/// is down, background writes are refused with 503 `journal_unavailable` and `Retry-After` (none
/// is acknowledged), `/readyz` answers 503 naming the broker and foreground writes go on; once
/// it is back, the service
/// takes writes and is ready again by itself, and every operation answered 202 is applied
/// exactly once, each document's operations in acceptance order, each document holding its
/// last write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_journal_loses_nothing_acknowledged_when_its_broker_is_killed_and_started_again() {
    use std::sync::atomic::Ordering::SeqCst;
    let broker =
        zkguard::testkit::TansuServer::start_durable().expect("start tansu with S3 storage");
    let tag = uuid_tag();
    let state = tempfile::tempdir().unwrap();
    let s = kafka_env(&broker, &tag, "a", state.path())
        .with("ZKGUARD_SERVER_JOURNAL_KAFKA_TIMEOUT", "2000")
        .start("kafka-broker-restart");
    let index = format!("restart-{tag}");
    // Six documents, two in each partition, written by four clients each.
    let monitors: Vec<String> = (0..6)
        .map(|d| monitor_in(d % 3, &format!("{tag}-d{d}")))
        .collect();
    let state_of = std::sync::Arc::new(Flood::default());
    let clients: Vec<_> = (0..4)
        .map(|n| {
            let args = (state_of.clone(), s.base.clone(), index.clone());
            tokio::spawn(flood_client(args.0, args.1, args.2, monitors.clone(), n))
        })
        .collect();
    let accepted_in =
        |phase: u8| move |x: &Sent| x.status == StatusCode::ACCEPTED && x.phases.0 == phase;
    let c = client();
    eventually(Duration::from_secs(30), "40 writes accepted", || async {
        state_of.count(accepted_in(BrokerPhase::UP)) >= 40
    })
    .await;

    // SIGKILL: the broker is gone until it is started again.
    tokio::task::block_in_place(|| broker.kill());
    state_of.phase.store(BrokerPhase::DOWN, SeqCst);
    eventually(
        Duration::from_secs(30),
        "writes refused and /readyz 503 while the broker is down",
        || async {
            let refused = state_of.count(|x| x.phases == (BrokerPhase::DOWN, BrokerPhase::DOWN));
            let (status, v) = call(&client(), Method::GET, &s.url("/readyz"), None).await;
            let unready = status == StatusCode::SERVICE_UNAVAILABLE
                && v["message"].as_str().is_some_and(|m| m.contains("broker"));
            refused >= 3 && unready
        },
    )
    .await;
    // Foreground writes do not need the broker.
    let path = format!("/v1/indices/{index}/docs/fg?monitor={tag}-fg");
    let (status, v) = put(&c, &s, &path, &json!({"during": "the outage"})).await;
    assert_eq!(status, StatusCode::OK, "{v}");

    // Started again on the same port and storage: writes are taken again, and the service is
    // ready again, without being touched.
    state_of.phase.store(BrokerPhase::BACK, SeqCst);
    tokio::task::block_in_place(|| broker.start_again()).expect("start tansu again");
    eventually(
        Duration::from_secs(60),
        "40 writes accepted after the restart",
        || async { state_of.count(accepted_in(BrokerPhase::BACK)) >= 40 },
    )
    .await;
    state_of.stop.store(true, SeqCst);
    for client in clients {
        client.await.unwrap();
    }
    eventually(Duration::from_secs(30), "/readyz answers 200", || async {
        call(&client(), Method::GET, &s.url("/readyz"), None)
            .await
            .0
            == StatusCode::OK
    })
    .await;

    let sent = std::mem::take(&mut *state_of.sent.lock().unwrap());
    check_refusals(&sent);
    // Every 202 applied; a refused write whose record the broker had appended before it died
    // (only its acknowledgement lost) may be applied too, once, in its place.
    let accepted: Vec<String> = sent
        .iter()
        .filter(|x| x.status == StatusCode::ACCEPTED)
        .map(|x| x.op.clone())
        .collect();
    let done = wait_finished(&c, &s, &accepted).await;
    assert!(done.values().all(|v| v["status"] == "applied"), "{done:?}");
    let mut appended = accepted.len();
    for d in 0..monitors.len() {
        appended += check_restarted_doc(&c, &s, &index, d, &sent, &done).await;
    }
    // The broker kept every record it appended: every partition is applied to its end, and the
    // ends are past all of them (those answered 202 and those found applied above). A produce
    // in flight when the broker died may have taken an offset without its record: the ends may
    // be past them by such gaps, which the appliers read over.
    let series = |m: &HashMap<String, f64>, name: &str, p: i32| -> f64 {
        m[&format!("{name}{{partition=\"{p}\"}}")]
    };
    eventually(
        Duration::from_secs(30),
        "every partition applied to its end",
        || async {
            let m = scrape(&c, &s).await;
            let (mut committed, mut caught_up) = (0.0, true);
            for p in 0..3 {
                let at = series(&m, "zkguard_journal_partition_committed_offset", p);
                committed += at;
                caught_up &= at == series(&m, "zkguard_journal_partition_end_offset", p)
                    && series(&m, "zkguard_journal_partition_lag", p) == 0.0;
            }
            caught_up && committed >= appended as f64
        },
    )
    .await;
}

/// Every write not acknowledged was refused as the documentation promises (503
/// `journal_unavailable` with `Retry-After`), and none sent and answered while the broker was
/// down was acknowledged.
fn check_refusals(sent: &[Sent]) {
    for x in sent.iter().filter(|x| x.status != StatusCode::ACCEPTED) {
        assert_eq!(x.status, StatusCode::SERVICE_UNAVAILABLE, "{}", x.answer);
        assert_eq!(x.answer["error"], "journal_unavailable", "{}", x.answer);
        assert!(x.retry_after, "a 503 without Retry-After: {}", x.answer);
    }
    let down = (BrokerPhase::DOWN, BrokerPhase::DOWN);
    assert!(
        !sent
            .iter()
            .any(|x| x.phases == down && x.status == StatusCode::ACCEPTED),
        "a write was acknowledged while the broker was down"
    );
    assert!(sent.iter().any(|x| x.phases == down));
}

/// Document `d` after the restart: every 202 in its record of operations once (with the refused
/// writes applied after all, known by their outcome), tokens never decreasing (`check_doc`);
/// a write sent after another was answered applied after it; the document holds the body of
/// the write applied last. Returns how many refused writes it records.
async fn check_restarted_doc(
    c: &reqwest::Client,
    s: &Service,
    index: &str,
    d: usize,
    sent: &[Sent],
    done: &HashMap<String, serde_json::Value>,
) -> usize {
    let doc = es_doc(c, index, &format!("d{d}")).await;
    let ops: Vec<String> =
        serde_json::from_value(doc["_source"]["zkguard"]["ops"].clone()).unwrap();
    let mine: HashMap<&str, &Sent> = sent
        .iter()
        .filter(|x| x.doc == d)
        .map(|x| (x.op.as_str(), x))
        .collect();
    let mut tokens = HashMap::new();
    for op in &ops {
        let x = mine
            .get(op.as_str())
            .unwrap_or_else(|| panic!("d{d} records {op}, which no client sent: {ops:?}"));
        let outcome = match done.get(op) {
            Some(v) => v.clone(),
            None => op_status(c, s, op).await,
        };
        assert_eq!(
            outcome["status"], "applied",
            "{op} ({}): {outcome}",
            x.status
        );
        tokens.insert(op.clone(), outcome_token(&outcome));
    }
    for x in mine.values().filter(|x| x.status == StatusCode::ACCEPTED) {
        tokens
            .entry(x.op.clone())
            .or_insert_with(|| outcome_token(&done[&x.op]));
    }
    assert!(
        tokens.len() < 100,
        "d{d}: too many writes for its record of 100 operation ids"
    );
    check_doc(c, index, &format!("d{d}"), &tokens).await;
    let at: HashMap<&str, usize> = ops
        .iter()
        .enumerate()
        .map(|(i, o)| (o.as_str(), i))
        .collect();
    for a in ops.iter().map(|o| mine[o.as_str()]) {
        for b in ops.iter().map(|o| mine[o.as_str()]) {
            assert!(
                a.answered >= b.sent || at[a.op.as_str()] < at[b.op.as_str()],
                "d{d}: {} was sent after {} was answered, and applied before it: {ops:?}",
                b.op,
                a.op
            );
        }
    }
    let last = ops
        .last()
        .map(|o| mine[o.as_str()])
        .unwrap_or_else(|| panic!("d{d} was never written"));
    for key in ["client", "n"] {
        assert_eq!(doc["_source"][key], last.body[key], "d{d}: {doc}");
    }
    ops.iter()
        .filter(|o| mine[o.as_str()].status != StatusCode::ACCEPTED)
        .count()
}

/// `server.journal.*` combinations that cannot work are refused, naming the key.
#[test]
fn kafka_journal_settings_that_cannot_work_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let load = |text: &str| {
        let path = dir.path().join("zkguard.properties");
        std::fs::write(&path, text).unwrap();
        zkguard::config::Settings::load_with_env(Some(&path), |_| None)
    };
    for (text, key) in [
        ("server.journal.backend=kafka\n", "server.journal.kafka.brokers"),
        ("server.journal.backend=queue\n", "server.journal.backend"),
        (
            "server.journal.backend=kafka\nserver.journal.kafka.brokers=k1:9092\nlock.backend=elasticsearch\n",
            "server.journal.backend",
        ),
        (
            "server.journal.backend=kafka\nserver.journal.kafka.brokers=k1\n",
            "server.journal.kafka.brokers",
        ),
        ("server.journal.kafka.partitions=0\n", "server.journal.kafka.partitions"),
        ("server.journal.kafka.topic=a/b\n", "server.journal.kafka.topic"),
        ("server.instance.id=a/b\n", "server.instance.id"),
    ] {
        let err = load(text).expect_err(text).to_string();
        assert!(err.contains(key), "{text:?}: {err}");
    }
    let ok = load("server.journal.backend=kafka\nserver.journal.kafka.brokers=k1:9092,k2:9092\n")
        .unwrap();
    assert_eq!(
        ok.server.journal_backend,
        zkguard::config::JournalBackendKind::Kafka
    );
    assert_eq!(ok.server.journal_kafka.topic, "zkguard-journal");
    assert_eq!(ok.server.journal_kafka.brokers, ["k1:9092", "k2:9092"]);
    let default = load("").unwrap();
    assert_eq!(
        default.server.journal_backend,
        zkguard::config::JournalBackendKind::File
    );
}

/// The owners named in the progress documents of the journal's 3 partitions.
async fn owners(tag: &str) -> Vec<String> {
    let es = shared_es().url().to_string();
    let mut out = Vec::new();
    for p in 0..3 {
        let url = format!(
            "{}/zkguard-journal-{tag}/_doc/progress-journal-{tag}-{p}",
            es.trim_end_matches('/')
        );
        let (_, v) = call(&client(), Method::GET, &url, None).await;
        out.push(v["_source"]["owner"].as_str().unwrap_or("").to_string());
    }
    out
}

/// Each partition of the three as `s`'s `/metrics` reports it: whether `s` owns it, and its
/// owner's fencing token (`zkguard_journal_partition_token`); partitions without a token are
/// left out.
async fn partition_tokens(c: &reqwest::Client, s: &Service) -> HashMap<i32, (bool, f64)> {
    let m = scrape(c, s).await;
    (0..3)
        .filter_map(|p| {
            let at = |name: &str| m.get(&format!("{name}{{partition=\"{p}\"}}")).copied();
            let owned = at("zkguard_journal_partition_owned")? == 1.0;
            Some((p, (owned, at("zkguard_journal_partition_token")?)))
        })
        .collect()
}

/// Instance `a` started (and owning every partition of the topic of `tag`), then instance `b`
/// started beside it with the state directory `state_b`.
async fn a_then_b(
    env: &Env,
    tag: &str,
    name: &str,
    state_b: &std::path::Path,
) -> (Service, Service) {
    let a = env.start(&format!("{name}-a"));
    eventually(
        Duration::from_secs(30),
        "a owns every partition",
        || async { owners(tag).await.iter().all(|o| o == "a") },
    )
    .await;
    let b = env
        .clone()
        .with("ZKGUARD_SERVER_INSTANCE_ID", "b")
        .with("ZKGUARD_STATE_DIR", state_b.to_str().unwrap())
        .start(&format!("{name}-b"));
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_journal_partitions_are_shared_when_an_instance_joins_and_every_instance_answers() {
    let broker = zkguard::testkit::TansuServer::start().expect("start tansu");
    let tag = uuid_tag();
    let (state_a, state_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let env = kafka_env(&broker, &tag, "a", state_a.path());
    let (a, b) = a_then_b(&env, &tag, "share", state_b.path()).await;
    // b joins: a gives up what it owns beyond its share, and b takes it.
    eventually(
        Duration::from_secs(30),
        "a and b share the partitions",
        || async {
            let o = owners(&tag).await;
            o.iter().any(|o| o == "a") && o.iter().any(|o| o == "b")
        },
    )
    .await;
    // Writes sent to b for every partition are applied, and a answers for them.
    let c = client();
    let index = format!("share-{tag}");
    let mut ids = Vec::new();
    for p in 0..3 {
        let path = format!(
            "/v1/indices/{index}/docs/d{p}?type=background&monitor={}",
            monitor_in(p, &tag)
        );
        let (status, v) = put(&c, &b, &path, &json!({"p": p})).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{v}");
        ids.push(v["operation_id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        let (status, v) = call(
            &c,
            Method::GET,
            &a.url(&format!("/v1/operations/{id}?wait=20s")),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["status"], "applied", "{v}");
    }
    for p in 0..3 {
        let doc = es_doc(&c, &index, &format!("d{p}")).await;
        assert_eq!(doc["_source"]["p"], json!(p), "{doc}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_journal_topic_with_another_partition_count_is_refused_at_start() {
    let broker = zkguard::testkit::TansuServer::start().expect("start tansu");
    let tag = uuid_tag();
    let state = tempfile::tempdir().unwrap();
    let env = kafka_env(&broker, &tag, "a", state.path());
    // The first instance creates the topic with 3 partitions.
    let _a = env.start("count-a");
    let other = env
        .clone()
        .with("ZKGUARD_SERVER_JOURNAL_KAFKA_PARTITIONS", "2")
        .with("ZKGUARD_SERVER_INSTANCE_ID", "b");
    let Err(refused) =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| other.start("count-b")))
    else {
        panic!("a service whose partition count differs from the topic's must not start");
    };
    let message = refused
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(
        message.contains("has 3 partitions but server.journal.kafka.partitions is 2"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_journal_partitions_of_a_paused_instance_are_taken_over_and_it_stops_applying_them() {
    let broker = zkguard::testkit::TansuServer::start().expect("start tansu");
    let tag = uuid_tag();
    let (state_a, state_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let env = kafka_env(&broker, &tag, "a", state_a.path());
    let (a, b) = a_then_b(&env, &tag, "pause", state_b.path()).await;
    eventually(
        Duration::from_secs(30),
        "a and b share the partitions",
        || async { owners(&tag).await.iter().any(|o| o == "b") },
    )
    .await;

    let c = client();
    // The partitions a applies, each with its lock's token as a's /metrics reports it.
    let held = eventually_value(Duration::from_secs(30), || async {
        let held = partition_tokens(&c, &a).await;
        held.values().any(|(owned, _)| *owned).then_some(held)
    })
    .await;
    // a freezes past its session: b takes every partition over.
    a.signal(nix::sys::signal::Signal::SIGSTOP);
    eventually(
        Duration::from_secs(60),
        "b owns every partition",
        || async { owners(&tag).await.iter().all(|o| o == "b") },
    )
    .await;
    // b applies a's partitions under locks of its own: greater tokens than a's.
    let taken = eventually_value(Duration::from_secs(30), || async {
        let now = partition_tokens(&c, &b).await;
        held.iter()
            .filter(|(_, (owned, _))| *owned)
            .all(|(p, (_, old))| now.get(p).is_some_and(|(o, t)| *o && t > old))
            .then_some(now)
    })
    .await;
    let index = format!("pause-{tag}");
    let mut ids: Vec<(usize, String)> = Vec::new();
    let write = |s: &Service, p: usize, n: usize| {
        let path = format!(
            "/v1/indices/{index}/docs/d{p}?type=background&monitor={}",
            monitor_in(p, &tag)
        );
        let (c, s) = (c.clone(), s.base.clone());
        async move {
            let url = format!("{s}{path}");
            let r = c
                .put(url)
                .header("content-type", "application/json")
                .body(json!({ "n": n }).to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::ACCEPTED);
            let v: serde_json::Value = r.json().await.unwrap();
            v["operation_id"].as_str().unwrap().to_string()
        }
    };
    for p in 0..3 {
        ids.push((p, write(&b, p, 1).await));
    }
    // a wakes: its appliers find their locks lost and stop; it writes again through the topic.
    a.signal(nix::sys::signal::Signal::SIGCONT);
    eventually(Duration::from_secs(30), "a's appliers stop", || async {
        a.log().contains("no longer owned here")
    })
    .await;
    // a, no longer their owner, reports b's tokens from the partitions' progress.
    eventually(
        Duration::from_secs(30),
        "a reports b's tokens for the partitions b took",
        || async {
            let now = partition_tokens(&c, &a).await;
            held.iter()
                .filter(|(_, (owned, _))| *owned)
                .all(|(p, _)| now.get(p).map(|(o, t)| (*o, *t)) == Some((false, taken[p].1)))
        },
    )
    .await;
    for p in 0..3 {
        ids.push((p, write(&a, p, 2).await));
    }
    let mut done = HashMap::new();
    for (_, id) in &ids {
        let (status, v) = call(
            &c,
            Method::GET,
            &b.url(&format!("/v1/operations/{id}?wait=20s")),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["status"], "applied", "{v}");
        done.insert(id.clone(), outcome_token(&v));
    }
    for p in 0..3 {
        let tokens: HashMap<String, Option<u64>> = ids
            .iter()
            .filter(|(d, _)| *d == p)
            .map(|(_, id)| (id.clone(), done[id]))
            .collect();
        check_doc(&c, &index, &format!("d{p}"), &tokens).await;
        assert_eq!(
            es_doc(&c, &index, &format!("d{p}")).await["_source"]["n"],
            json!(2)
        );
    }
}

/// A request's records of one partition are one batch; tansu answers a partition's latest
/// offset (ListOffsets) with the last batch's first offset + 1, below the partition's end when
/// that batch holds several records: the journal's status must report the end the records
/// reach (committed offset never beyond it, lag 0 once everything is applied).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_journal_status_reports_the_end_of_a_partition_whose_last_batch_holds_several_records(
) {
    let broker = zkguard::testkit::TansuServer::start().expect("start tansu");
    let tag = uuid_tag();
    let state = tempfile::tempdir().unwrap();
    let s = kafka_env(&broker, &tag, "a", state.path()).start("kafka-end");
    let c = client();
    let index = format!("kafka-end-{tag}");
    let ids: Vec<String> = (0..5).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    let body: String = ids
        .iter()
        .enumerate()
        .map(|(n, id)| {
            let line = json!({"action": "index", "index": index, "id": "d",
                "doc": {"n": n}, "op_id": id});
            format!("{line}\n")
        })
        .collect();
    let (status, v) = call(&c, Method::POST, &s.url("/v1/bulk"), Some(body)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let done = wait_finished(&c, &s, &ids).await;
    assert!(done.values().all(|v| v["status"] == "applied"), "{done:?}");
    // The status is refreshed every second: once the commit is in it, every partition's end
    // is its committed offset, and the five records are counted.
    let m = eventually_value(Duration::from_secs(30), || async {
        let m = scrape(&c, &s).await;
        let series = |name: &str, p: i32| {
            m.get(&format!("{name}{{partition=\"{p}\"}}"))
                .copied()
                .unwrap_or(-1.0)
        };
        let committed: f64 = (0..3)
            .map(|p| series("zkguard_journal_partition_committed_offset", p))
            .sum();
        (committed == 5.0).then_some(m)
    })
    .await;
    for p in 0..3 {
        let at = |name: &str| m[&format!("{name}{{partition=\"{p}\"}}")];
        assert_eq!(
            at("zkguard_journal_partition_end_offset"),
            at("zkguard_journal_partition_committed_offset"),
            "partition {p}: {m:?}"
        );
        assert_eq!(at("zkguard_journal_partition_lag"), 0.0, "{m:?}");
    }
}

/// A TCP relay in front of Elasticsearch that counts the requests whose bytes contain `needle`
/// (a path: request bodies do not repeat it), for counting a service's requests of one kind.
struct CountingRelay {
    url: String,
    seen: Arc<AtomicUsize>,
}

impl CountingRelay {
    async fn start(upstream: &str, needle: String) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let target = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = seen.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = tokio::net::TcpStream::connect(&target).await else {
                    continue;
                };
                let (mut from_client, mut to_client) = inbound.into_split();
                let (mut from_server, mut to_server) = outbound.into_split();
                let (counter, needle) = (counter.clone(), needle.clone().into_bytes());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    // The last bytes of the previous read: a needle cut between two reads.
                    let mut tail: Vec<u8> = Vec::new();
                    while let Ok(n) = from_client.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let mut window = std::mem::take(&mut tail);
                        let old = window.len();
                        window.extend_from_slice(&buf[..n]);
                        let found = window
                            .windows(needle.len())
                            .enumerate()
                            .filter(|(i, w)| *w == needle && i + needle.len() > old)
                            .count();
                        counter.fetch_add(found, Ordering::Relaxed);
                        tail = window[window.len().saturating_sub(needle.len() - 1)..].to_vec();
                        if to_server.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                });
            }
        });
        Self { url, seen }
    }

    fn count(&self) -> usize {
        self.seen.load(Ordering::Relaxed)
    }
}

/// An applier does not write its partition's progress for every batch it reads: operations
/// applied one after the other (each read in a batch of its own) cost at most the commits of
/// every 200 ms and a check when the last write is older than 500 ms, not one write each; and
/// the journal's index does not index the outcomes' fields (it failed before: `attempts` and
/// `id` had been mapped dynamically).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_journal_applier_does_not_write_its_progress_for_every_batch_it_reads() {
    let broker = zkguard::testkit::TansuServer::start().expect("start tansu");
    let tag = uuid_tag();
    let state = tempfile::tempdir().unwrap();
    let writes = CountingRelay::start(
        shared_es().url(),
        format!("POST /zkguard-journal-{tag}/_doc/progress-journal-{tag}-0?version="),
    )
    .await;
    let mut env = kafka_env(&broker, &tag, "a", state.path());
    env.es = writes.url.clone();
    let s = env.start("kafka-progress-writes");
    let c = client();
    let index = format!("progress-writes-{tag}");
    let monitor = monitor_in(0, &tag);
    let path = format!("/v1/indices/{index}/docs/d?type=background&monitor={monitor}");
    // The first operation is applied once partition 0 is owned and claimed.
    let (status, v) = put(&c, &s, &path, &json!({"n": 0})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    wait_finished(&c, &s, &[v["operation_id"].as_str().unwrap().to_string()]).await;

    let (before, started) = (writes.count(), std::time::Instant::now());
    let count = 60;
    for n in 1..=count {
        let (status, v) = put(&c, &s, &path, &json!({"n": n})).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{v}");
        let id = v["operation_id"].as_str().unwrap();
        let (status, v) = call(
            &c,
            Method::GET,
            &s.url(&format!("/v1/operations/{id}?wait=20s")),
            None,
        )
        .await;
        assert_eq!(
            (status, v["status"].as_str()),
            (StatusCode::OK, Some("applied")),
            "{v}"
        );
    }
    let (written, ms) = (
        writes.count() - before,
        started.elapsed().as_millis() as usize,
    );
    // Commits at most every 200 ms, checks at most every 500 ms, one of each at the edges and
    // one sent before the count started.
    let most = ms / 200 + ms / 500 + 3;
    assert!(
        written <= most,
        "{written} progress writes for {count} operations applied one by one in {ms} ms (at most {most})"
    );
    let doc = es_doc(&c, &index, "d").await;
    assert_eq!(doc["_source"]["n"], json!(count), "{doc}");
    // The journal's index indexes the progress' fields and the outcomes' `ops` alone: the
    // outcomes written meanwhile added nothing to its mapping.
    let journal = format!("zkguard-journal-{tag}");
    let url = format!("{}/{journal}/_mapping", shared_es().url());
    let mapping: serde_json::Value = c.get(url).send().await.unwrap().json().await.unwrap();
    let m = &mapping[&journal]["mappings"];
    assert!(
        m["dynamic"] == json!(false) || m["dynamic"] == "false",
        "{mapping}"
    );
    let fields: Vec<&String> = m["properties"].as_object().unwrap().keys().collect();
    assert_eq!(
        fields,
        ["accepted", "offset", "ops", "owner", "status", "token"],
        "{mapping}"
    );
}

/// Sends `body` to the journal's index `index` in Elasticsearch (`PUT`, `path` under it).
async fn put_journal_index(index: &str, path: &str, body: &serde_json::Value) {
    let url = format!("{}/{index}{path}", shared_es().url().trim_end_matches('/'));
    let (status, v) = call(&client(), Method::PUT, &url, Some(body.to_string())).await;
    assert!(status.is_success(), "PUT {url}: {status} {v}");
}

/// Outcomes are recorded a batch to a document (`ops` lists its operations), and an index
/// created by an earlier version keeps answering: it gains the `ops` mapping, and its
/// one-operation outcome documents (`op-<id>`) are still read. An operation recorded twice
/// answers the outcome of the write that applied it, not the one that found it applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_journal_records_outcomes_a_batch_a_document_and_reads_earlier_ones() {
    let broker = zkguard::testkit::TansuServer::start().expect("start tansu");
    let tag = uuid_tag();
    let journal = format!("zkguard-journal-{tag}");
    let earlier = json!({"mappings": {"dynamic": false, "properties": {
        "offset": {"type": "long"}, "accepted": {"type": "long"}, "token": {"type": "long"},
        "owner": {"type": "keyword"}, "status": {"type": "keyword"}}}});
    put_journal_index(&journal, "", &earlier).await;
    let (old, twice) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let outcome = json!({"id": old, "status": "applied", "token": 7});
    put_journal_index(&journal, &format!("/_doc/op-{old}"), &outcome).await;
    let state = tempfile::tempdir().unwrap();
    let s = kafka_env(&broker, &tag, "a", state.path()).start("kafka-outcome-batches");
    // Two outcomes of one operation, in documents written after the start mapped `ops`.
    for (n, found_applied) in [(1, true), (2, false)] {
        let o = json!({"id": twice, "status": "applied", "token": 9,
            "already_applied": found_applied});
        let doc = json!({"ops": [twice], "outcomes": [o]});
        put_journal_index(&journal, &format!("/_doc/outcomes-test-{n}"), &doc).await;
    }
    let c = client();
    let get = |id: String| {
        let (c, url) = (c.clone(), s.url(&format!("/v1/operations/{id}")));
        async move { call(&c, Method::GET, &url, None).await }
    };
    let (status, v) = get(old.to_string()).await;
    assert_eq!(
        (status, &v["status"], &v["token"]),
        (StatusCode::OK, &json!("applied"), &json!(7)),
        "{v}"
    );
    let (status, v) = get(twice.to_string()).await;
    assert_eq!((status, &v["token"]), (StatusCode::OK, &json!(9)), "{v}");
    assert_eq!(v.get("already_applied"), None, "{v}");

    // Operations of one document sent at once are applied, each recorded in exactly one batch.
    let index = format!("outcome-batches-{tag}");
    let path = format!(
        "/v1/indices/{index}/docs/d?type=background&monitor={}",
        monitor_in(1, &tag)
    );
    let mut ids = Vec::new();
    for n in 0..20 {
        let (status, v) = put(&c, &s, &path, &json!({"n": n})).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{v}");
        ids.push(v["operation_id"].as_str().unwrap().to_string());
    }
    let done = wait_finished(&c, &s, &ids).await;
    assert!(done.values().all(|v| v["status"] == "applied"), "{done:?}");
    let url = format!(
        "{}/{journal}/_search",
        shared_es().url().trim_end_matches('/')
    );
    let query = json!({"size": 100, "query": {"terms": {"ops": ids}}});
    let (status, found) = call(&c, Method::POST, &url, Some(query.to_string())).await;
    assert_eq!(status, StatusCode::OK, "{found}");
    let mut recorded: Vec<String> = Vec::new();
    for hit in found["hits"]["hits"].as_array().unwrap() {
        let (id, source) = (hit["_id"].as_str().unwrap(), &hit["_source"]);
        assert!(id.starts_with("outcomes-"), "{hit}");
        let ops: Vec<&str> = source["ops"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|o| o.as_str())
            .collect();
        let outcomes: Vec<&str> = source["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|o| o["id"].as_str())
            .collect();
        assert_eq!(ops, outcomes, "{hit}");
        recorded.extend(ops.iter().map(|o| o.to_string()));
    }
    recorded.sort();
    ids.sort();
    assert_eq!(recorded, ids, "{found}");
}
