//! The demo workload against a real ZooKeeper and osmem-server: it must account for every
//! operation, show the fenced stalled writer and the slow editor's dead letters, and its
//! reconciliation must catch documents changed behind its back. Also `zkguard demo` end to end,
//! and docs/tutorial.md's commands as a reader runs them.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{json, Value};
use zkguard::config::Settings;
use zkguard::es::{DocStore, EsStore, Refresh, WriteCondition};
use zkguard::lock::LockType;
use zkguard::testkit::{OsmemServer, ZkServer};
use zkguard::write::deadletter::{DeadLetterSink, FileSink};
use zkguard::{LockService, ZkLockService, ZkSession};

use crate::tutorial_support;

// The demo workload behind `zkguard demo` is the crate zkguard-demo (crates/zkguard-demo), which
// the binary runs under its `workload` feature.
use demo::{reconcile, DemoEnv, DemoPlan, DemoProgress, OpStatus};
use zkguard_demo as demo;

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
        &mut report.operations.clone(),
        env.sink.as_ref(),
    )
    .await;
    assert!(clean.is_consistent(), "{:?}", clean.mismatches);
    assert!(clean.is_complete(), "{:?}", clean.unchecked);

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
        &mut report.operations.clone(),
        env.sink.as_ref(),
    )
    .await;
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
    let report = crate::local_demo::small_local_demo(dir.path(), &[]);
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

/// Elasticsearch applies a save but its answer is lost: the writer sees a failure whose write
/// may have gone through. The reconciliation settles it by reading the document, and the
/// report's table and its reconciliation count it the same way (applied).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_uncertain_failure_counts_the_same_in_the_table_and_the_reconciliation() {
    use async_trait::async_trait;
    use zkguard::es::{EsError, HookedStore, StoreCall, StoreHook};

    /// Replaces the answer of the first save (an index call with `saves` above 0) with a
    /// transport error, after the write was applied.
    #[derive(Default)]
    struct LoseFirstSaveAnswer {
        done: std::sync::atomic::AtomicBool,
    }

    #[async_trait]
    impl StoreHook for LoseFirstSaveAnswer {
        async fn after(
            &self,
            call: &StoreCall<'_>,
            outcome: Result<(), &EsError>,
        ) -> Option<EsError> {
            let StoreCall::Index { source, .. } = call else {
                return None;
            };
            let save = source["saves"].as_i64().is_some_and(|n| n > 0);
            if save && outcome.is_ok() && !self.done.swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                return Some(EsError::Transport {
                    url: "test".into(),
                    reason: "the answer was lost after the write".into(),
                });
            }
            None
        }
    }

    let dir = tempfile::tempdir().unwrap();
    let settings = settings(dir.path());
    let (mut env, _session) = env(&settings).await;
    env.store = Arc::new(HookedStore::new(
        env.store.clone(),
        LoseFirstSaveAnswer::default(),
    ));
    let plan = DemoPlan {
        writers: 2,
        saves_per_writer: 3,
        jobs: 0,
        slow_editor: false,
        stalled_writer: false,
        ..plan(true)
    };
    let report = demo::run(&env, &plan, &Arc::new(DemoProgress::default()))
        .await
        .unwrap();
    assert!(report.is_consistent(), "{report}");
    let uncertain: Vec<_> = report
        .operations
        .iter()
        .filter(|o| {
            matches!(
                o.status,
                OpStatus::Rejected {
                    ambiguous: true,
                    ..
                }
            )
        })
        .collect();
    assert_eq!(uncertain.len(), 1, "{report}");
    assert_eq!(uncertain[0].recorded, Some(true), "the write went through");
    let (fg, r) = (&report.foreground, &report.reconciliation);
    assert_eq!(r.ambiguous_resolved, 1);
    assert_eq!((fg.rejected, r.rejected), (0, 0), "{report}");
    assert_eq!((fg.applied, r.applied), (6, 6), "{report}");
    let text = report.to_string();
    let (table_rejected, reconciled_rejected) = text_counts(&text);
    assert_eq!(table_rejected, reconciled_rejected, "{text}");
}

/// The "rejected" total of the report's table and of its reconciliation line.
fn text_counts(report: &str) -> (u64, u64) {
    let table = report
        .lines()
        .find(|l| l.starts_with("  rejected "))
        .unwrap_or_else(|| panic!("no rejected row: {report}"));
    let table: u64 = table
        .split_whitespace()
        .skip(1)
        .map(|n| n.parse::<u64>().unwrap())
        .sum();
    let line = report
        .lines()
        .find(|l| l.contains(" rejected with a reason"))
        .unwrap_or_else(|| panic!("no reconciliation line: {report}"));
    let reconciled = line
        .split(',')
        .find(|p| p.contains("rejected with a reason"))
        .and_then(|p| p.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    (table, reconciled)
}

/// `zkguard demo --servers configured` against the shared ZooKeeper and `es_url`, with the
/// dead-letter file `dead_letters`, fast retries and a slow editor that keeps the run going for
/// a few seconds. Progress lines go to stderr (not a terminal). The articles' index is created
/// first, so that the demo's own requests are quick (an index creation on a fresh osmem-server
/// takes a few seconds) and its request timeout can be short.
fn demo_command(es_url: &str, dead_letters: &std::path::Path) -> std::process::Command {
    let index = format!("demo-{}", tag());
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        EsStore::from_url(es_url)
            .unwrap()
            .ensure_index(&index, &demo::article_mappings())
            .await
            .unwrap()
    });
    let mut c = crate::cli::zkguard();
    c.args([
        "demo",
        "--servers",
        "configured",
        "--index",
        &index,
        "--articles",
        "4",
        "--writers",
        "2",
        "--saves",
        "3",
        "--jobs",
        "2",
        "--job-size",
        "3",
        "--no-stalled-writer",
    ])
    .env_remove("ZKGUARD_CONFIG")
    .env("ZKGUARD_ZOOKEEPER_SERVERS", servers().zk.connect_string())
    .env(
        "ZKGUARD_ZOOKEEPER_LOCK_ROOT",
        format!("/zkguard-demo-cli/{}", tag()),
    )
    .env("ZKGUARD_ELASTICSEARCH_URL", es_url)
    .env("ZKGUARD_ELASTICSEARCH_REQUEST_TIMEOUT", "1000")
    .env("ZKGUARD_ELASTIC_RETRY_BACKOFF_INITIAL", "20")
    .env("ZKGUARD_ELASTIC_RETRY_BACKOFF_MAX", "100")
    .env("ZKGUARD_DEADLETTER_FILE_PATH", dead_letters)
    .env("RUST_LOG", "error")
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    c
}

struct DemoRun {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `command`; `fault` is called once, when the progress shows the workload running.
fn run_demo(mut command: std::process::Command, fault: impl FnOnce()) -> DemoRun {
    use std::io::{BufRead, Read};
    let mut child = command.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).unwrap();
        s
    });
    let mut fault = Some(fault);
    let mut stderr = String::new();
    for line in std::io::BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.contains("running foreground writers") {
            if let Some(f) = fault.take() {
                f();
            }
        }
        stderr.push_str(&line);
        stderr.push('\n');
    }
    let status = child.wait().unwrap();
    DemoRun {
        code: status.code(),
        stdout: stdout.join().unwrap(),
        stderr,
    }
}

/// The dead-letter sink refuses every write: the demo's operations that would be parked are
/// lost. The report names each of them, their dead letters are on stderr, and the demo fails.
#[test]
fn zkguard_demo_reports_lost_operations_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let dead_letters = dir.path().join("deadletters.jsonl");
    // The sink's lock file is a directory: every park fails (for root too), listing works.
    std::fs::create_dir(dir.path().join("deadletters.jsonl.lock")).unwrap();
    let mut command = demo_command(servers().es.url(), &dead_letters);
    command.args(["--background-timeout", "100ms"]);
    let run = run_demo(command, || {});
    let (stdout, stderr) = (&run.stdout, &run.stderr);
    assert_eq!(run.code, Some(1), "stdout: {stdout}\nstderr: {stderr}");
    let lost: Vec<String> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("zkguard: lost operation, dead letter: "))
        .map(|json| {
            let v: Value = serde_json::from_str(json).unwrap();
            v["id"].as_str().unwrap().to_string()
        })
        .collect();
    assert!(
        !lost.is_empty(),
        "the slow editor's article makes dead letters: {stderr}"
    );
    for id in &lost {
        assert!(
            stdout
                .lines()
                .any(|l| l.trim_start().starts_with("LOST:") && l.contains(id.as_str())),
            "a report line names {id}: {stdout}"
        );
    }
    assert!(!stdout.contains("nothing lost"), "{stdout}");
    assert!(stderr.contains("operations were lost"), "{stderr}");
}

/// Elasticsearch is killed while the demo runs: the report is printed all the same, its table
/// and reconciliation agree, it says that the operations could not be checked, and the demo
/// exits 69.
#[test]
fn zkguard_demo_reports_when_elasticsearch_is_killed() {
    let es = OsmemServer::start().expect("start osmem-server");
    let dir = tempfile::tempdir().unwrap();
    let mut command = demo_command(es.url(), &dir.path().join("deadletters.jsonl"));
    command.args(["--background-timeout", "1s"]);
    let run = run_demo(command, || es.kill());
    check_incomplete_report(&run);
}

/// Elasticsearch is frozen (SIGSTOP) while the demo runs and stays frozen: the report is
/// printed, its numbers agree, it says what could not be checked, and the demo exits 69.
#[test]
fn zkguard_demo_reports_when_elasticsearch_is_paused() {
    let es = OsmemServer::start().expect("start osmem-server");
    let dir = tempfile::tempdir().unwrap();
    let mut command = demo_command(es.url(), &dir.path().join("deadletters.jsonl"));
    command.args(["--background-timeout", "1s"]);
    let run = run_demo(command, || es.pause());
    es.resume();
    check_incomplete_report(&run);
}

fn check_incomplete_report(run: &DemoRun) {
    let (stdout, stderr) = (&run.stdout, &run.stderr);
    assert!(
        stdout.contains("zkguard demo report"),
        "a report is printed: exit {:?}\nstdout: {stdout}\nstderr: {stderr}",
        run.code
    );
    let (table, reconciled) = text_counts(stdout);
    assert_eq!(table, reconciled, "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("NOT CHECKED") && l.contains("Elasticsearch")),
        "{stdout}"
    );
    assert!(!stdout.contains("nothing lost"), "{stdout}");
    assert_eq!(run.code, Some(69), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stderr.contains("reconciliation is incomplete"), "{stderr}");
}

/// Every ```sh block of docs/tutorial.md, in order, as a reader types them, against a fresh
/// ZooKeeper and osmem-server: the page's `export` lines point zkguard at them, its fixed ports
/// become free ones, the `zkguard` on PATH is the one built here. Each command must succeed and
/// print what the page says it prints; the services it leaves running stop cleanly on Ctrl-C.
#[test]
fn the_tutorial_runs_as_written() {
    use tutorial_support::{sh_blocks, Session, Substitutions};
    use zkguard::testkit::free_port;

    let zk = std::thread::spawn(|| ZkServer::start().expect("start ZooKeeper"));
    let es = OsmemServer::start().expect("start osmem-server");
    let zk = zk.join().unwrap();
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(repo.join("docs/tutorial.md")).unwrap();
    let home = tempfile::tempdir().unwrap();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_zkguard"));
    let port = || format!("127.0.0.1:{}", free_port().unwrap());
    let substitutions = Substitutions {
        exports: vec![
            ("ZKGUARD_ZOOKEEPER_SERVERS", zk.connect_string()),
            ("ZKGUARD_ELASTICSEARCH_URL", es.url().to_string()),
        ],
        text: vec![("127.0.0.1:7717", port()), ("127.0.0.1:9201", port())],
    };
    for (name, _) in &substitutions.exports {
        assert!(
            page.lines().any(|l| l.starts_with(&format!("export {name}="))),
            "docs/tutorial.md no longer has `export {name}=`: the test cannot point it at its servers"
        );
    }
    let mut session = Session::new(repo, bin.parent().unwrap(), home.path(), substitutions);

    let blocks = sh_blocks(&page);
    let run: Vec<_> = blocks.iter().filter(|b| !b.skip).collect();
    assert!(
        run.len() >= 8,
        "only {} blocks to run: {blocks:?}",
        run.len()
    );
    for block in run {
        session.run(block);
    }
    session.stop_all();
}
