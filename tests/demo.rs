//! The demo workload against a real ZooKeeper and osmem-server: it must account for every
//! operation, show the fenced stalled writer and the slow editor's dead letters, and its
//! reconciliation must catch documents changed behind its back. Also `zkguard demo` end to end.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{json, Value};
use zkguard::config::Settings;
use zkguard::es::{DocStore, EsStore, Refresh, WriteCondition};
use zkguard::lock::LockType;
use zkguard::testkit::{OsmemServer, ZkServer};
use zkguard::write::deadletter::{DeadLetterSink, FileSink};
use zkguard::{LockService, ZkLockService, ZkSession};

// The demo workload belongs to the `zkguard` binary, not to the library: these tests compile its
// module from the binary's source tree (it uses the library's public API only).
#[allow(dead_code)]
#[path = "../src/workload/demo.rs"]
mod demo;
use demo::{reconcile, DemoEnv, DemoPlan, DemoProgress, OpStatus};

struct Servers {
    zk: ZkServer,
    es: OsmemServer,
}

fn servers() -> &'static Servers {
    static SERVERS: OnceLock<Servers> = OnceLock::new();
    SERVERS.get_or_init(|| {
        let zk = std::thread::spawn(|| {
            ZkServer::builder()
                .tick_time(500)
                .start()
                .expect("start ZooKeeper (run scripts/install-deps.sh)")
        });
        let es = OsmemServer::start().expect("start osmem-server (run scripts/install-deps.sh)");
        Servers {
            zk: zk.join().unwrap(),
            es,
        }
    })
}

fn tag() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..10].to_string()
}

/// Settings with fast retries, so that the slow editor needs to hold its lock only briefly.
fn settings(dir: &std::path::Path) -> Settings {
    let s = servers();
    let mut settings = Settings::default();
    settings.zookeeper.servers = s.zk.connect_string();
    settings.zookeeper.session_timeout = Duration::from_millis(2000);
    settings.zookeeper.lock_root = format!("/zkguard-demo-test/{}", tag());
    settings.zookeeper.foreground_timeout = Duration::from_secs(10);
    settings.elasticsearch.urls = vec![s.es.url().parse().unwrap()];
    settings.retry.retry_count = 3;
    settings.retry.backoff_initial = Duration::from_millis(20);
    settings.retry.backoff_max = Duration::from_millis(100);
    settings.retry.file_path = dir.join("deadletters.jsonl");
    settings
}

async fn env(settings: &Settings) -> (DemoEnv, ZkSession) {
    let session = ZkSession::connect(&settings.zookeeper)
        .await
        .expect("connect to ZooKeeper");
    let locks: Arc<dyn LockService> = Arc::new(ZkLockService::new(session.clone()));
    let store: Arc<dyn DocStore> = Arc::new(EsStore::new(&settings.elasticsearch).unwrap());
    let sink: Arc<dyn DeadLetterSink> = Arc::new(FileSink::new(&settings.retry.file_path));
    (
        DemoEnv {
            store,
            locks,
            sink,
            settings: settings.clone(),
        },
        session,
    )
}

fn plan(replay: bool) -> DemoPlan {
    DemoPlan {
        index: format!("demo-{}", tag()),
        background_lock_timeout: Duration::from_millis(100),
        replay,
        seed: 7,
        ..DemoPlan::small()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_accounts_for_every_operation() {
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(dir.path());
    let (env, _session) = env(&settings).await;
    let plan = plan(true);
    let progress = Arc::new(DemoProgress::default());
    let report = demo::run(&env, &plan, &progress).await.unwrap();
    assert!(report.is_consistent(), "{report}");

    // Every planned operation is in the report, once.
    assert_eq!(
        report.operations.len(),
        plan.planned_operations(),
        "{report}"
    );
    let mut ids: Vec<_> = report.operations.iter().map(|o| o.id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), report.operations.len());
    assert_eq!(
        report.foreground.operations,
        plan.writers * plan.saves_per_writer + 1 + 2
    );
    assert_eq!(
        report.background.operations,
        plan.jobs * plan.articles_per_job
    );
    assert_eq!(
        progress
            .foreground_done
            .load(std::sync::atomic::Ordering::Relaxed),
        report.foreground.operations
    );
    assert_eq!(
        progress
            .background_done
            .load(std::sync::atomic::Ordering::Relaxed),
        report.background.operations
    );

    // The stalled writer's stale write was fenced, and only that one.
    assert_eq!(report.fenced, 1, "{report}");
    let fenced: Vec<_> = report
        .operations
        .iter()
        .filter(|o| matches!(&o.status, OpStatus::Rejected { kind, .. } if kind == "fenced"))
        .collect();
    assert_eq!(fenced.len(), 1);
    assert_eq!(fenced[0].actor, "stalled writer");
    assert!(
        report.stalled_writer.contains("rejected by Elasticsearch"),
        "{}",
        report.stalled_writer
    );

    // The slow editor made the first job's background operation on its article end parked, and
    // the replay applied every dead letter.
    assert!(report.dead_letters >= 1, "{report}");
    assert!(report.retries >= 2, "{report}");
    assert_eq!(report.replayed, report.dead_letters, "{report}");
    assert_eq!(report.background.parked, 0);
    assert!(
        env.sink.list().await.unwrap().is_empty(),
        "the replay emptied the sink"
    );

    // Independently of the reconciliation: the counters in Elasticsearch sum to the applied
    // operations of each class.
    let applied = |class: LockType| {
        report
            .operations
            .iter()
            .filter(|o| {
                o.class == class
                    && matches!(o.status, OpStatus::Applied { .. } | OpStatus::Replayed)
            })
            .count() as i64
    };
    let (mut saves, mut propagations) = (0, 0);
    for id in plan.article_ids() {
        let doc = env
            .store
            .get(&plan.index, &id)
            .await
            .unwrap()
            .expect("article");
        saves += doc.source["saves"].as_i64().unwrap();
        propagations += doc.source["propagations"].as_i64().unwrap();
    }
    assert_eq!(saves, applied(LockType::Foreground));
    assert_eq!(propagations, applied(LockType::Background));
    assert!(report.foreground.lock_wait.count > 0 && report.background.lock_hold.count > 0);
    assert!(report
        .to_string()
        .contains("OK: every operation is accounted for"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_reconciliation_catches_changes_behind_its_back() {
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(dir.path());
    let (env, _session) = env(&settings).await;
    let plan = DemoPlan {
        stalled_writer: false,
        ..plan(false)
    };
    let report = demo::run(&env, &plan, &Arc::new(DemoProgress::default()))
        .await
        .unwrap();
    assert!(report.is_consistent(), "{report}");
    assert!(
        report.background.parked >= 1,
        "without replay the dead letters stay parked: {report}"
    );
    let clean = reconcile(
        env.store.as_ref(),
        &plan.index,
        &report.operations,
        env.sink.as_ref(),
    )
    .await
    .unwrap();
    assert!(clean.is_consistent(), "{:?}", clean.mismatches);

    // A counter changed without zkguard.
    let article = &plan.article_ids()[2];
    let mut doc = env
        .store
        .get(&plan.index, article)
        .await
        .unwrap()
        .unwrap()
        .source;
    doc["saves"] = json!(doc["saves"].as_i64().unwrap() + 1);
    env.store
        .index(
            &plan.index,
            article,
            &doc,
            WriteCondition::Always,
            Refresh::No,
        )
        .await
        .unwrap();
    // A parked operation dropped from the sink.
    let parked = report
        .operations
        .iter()
        .find(|o| matches!(o.status, OpStatus::Parked { .. }))
        .unwrap();
    assert!(env.sink.remove(parked.id).await.unwrap());
    // An applied operation erased from its document's record.
    let applied = report
        .operations
        .iter()
        .find(|o| matches!(o.status, OpStatus::Applied { .. }) && o.article != *article)
        .unwrap();
    let mut other = env
        .store
        .get(&plan.index, &applied.article)
        .await
        .unwrap()
        .unwrap()
        .source;
    let wanted = applied.id.to_string();
    let ops = other["zkguard"]["ops"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| *v != &Value::String(wanted.clone()))
        .cloned();
    other["zkguard"]["ops"] = Value::Array(ops.collect());
    other["zkguard"]["op"] = json!("someone-else");
    env.store
        .index(
            &plan.index,
            &applied.article,
            &other,
            WriteCondition::Always,
            Refresh::No,
        )
        .await
        .unwrap();

    let found = reconcile(
        env.store.as_ref(),
        &plan.index,
        &report.operations,
        env.sink.as_ref(),
    )
    .await
    .unwrap();
    assert!(!found.is_consistent());
    let text = found.mismatches.join("\n");
    assert!(
        text.contains(&format!("{}/{article}: saves is", plan.index)),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{} ({}): reported parked but it is not in the dead-letter",
            parked.id, parked.actor
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{} ({}): reported applied but",
            applied.id, applied.actor
        )),
        "{text}"
    );
}

#[test]
fn zkguard_demo_runs_end_to_end_with_local_servers() {
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_zkguard"))
        .args([
            "demo",
            "--servers",
            "local",
            "--json",
            "--articles",
            "5",
            "--writers",
            "2",
            "--saves",
            "4",
            "--jobs",
            "2",
            "--job-size",
            "3",
            "--background-timeout",
            "100ms",
        ])
        .env("ZKGUARD_ELASTIC_RETRY_BACKOFF_INITIAL", "20")
        .env("ZKGUARD_ELASTIC_RETRY_BACKOFF_MAX", "100")
        .env_remove("ZKGUARD_CONFIG")
        .env_remove("ZKGUARD_ZOOKEEPER_SERVERS")
        .env_remove("ZKGUARD_ELASTICSEARCH_URL")
        .env("RUST_LOG", "error")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "exit {:?}\nstdout: {stdout}\nstderr: {stderr}",
        output.status
    );
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert!(report["reconciliation"]["mismatches"]
        .as_array()
        .unwrap()
        .is_empty());
    assert_eq!(report["foreground"]["operations"], json!(2 * 4 + 1 + 2));
    assert_eq!(report["background"]["operations"], json!(2 * 3));
    assert_eq!(report["fenced"], json!(1), "{}", report["stalled_writer"]);
    assert_eq!(report["backend"], json!("zookeeper"));
    // A local run leaves nothing in the working directory.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
