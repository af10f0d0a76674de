//! Guarded writes against real Elasticsearch 8 and ZooKeeper 3.9 images, through testcontainers.
//!
//! Run with `cargo test --features docker --test docker_guarded`. Without a reachable Docker
//! daemon (`DOCKER_HOST`, or the usual socket paths) every test prints why it is skipped and
//! passes.
#![cfg(feature = "docker")]

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use testcontainers_modules::elastic_search::ElasticSearch;
use testcontainers_modules::testcontainers::core::{Healthcheck, WaitFor};
use testcontainers_modules::testcontainers::runners::AsyncRunner;
use testcontainers_modules::testcontainers::{ContainerAsync, ImageExt};
use testcontainers_modules::zookeeper::Zookeeper;
use zkguard::config::Settings;
use zkguard::es::{DocStore, EsStore, HookedStore, IndexGate};
use zkguard::write::guarded::{GuardedError, GuardedWriter};
use zkguard::write::ops::{Operation, Stamp};
use zkguard::{LockRequest, LockService, LossReason, ZkLockService, ZkSession};

/// The Elasticsearch image tag: the module defaults to 7.16.1.
const ES_TAG: &str = "8.15.5";

/// Where the Docker daemon should be, and whether it answers `GET /_ping`.
fn docker_reachable() -> Result<String, String> {
    let ping = |stream: &mut dyn ReadWrite| -> Result<(), String> {
        stream
            .write_all(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            .map_err(|e| e.to_string())?;
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        if answer.starts_with("HTTP/1.") && answer.contains(" 200 ") {
            Ok(())
        } else {
            Err(format!(
                "unexpected answer to /_ping: {:?}",
                answer.lines().next()
            ))
        }
    };
    let timeout = Some(Duration::from_secs(3));
    let mut candidates = Vec::new();
    match std::env::var("DOCKER_HOST") {
        Ok(host) if !host.is_empty() => candidates.push(host),
        _ => {
            candidates.push("unix:///var/run/docker.sock".to_string());
            if let Ok(dir) = std::env::var("XDG_RUNTIME_DIR") {
                candidates.push(format!("unix://{dir}/docker.sock"));
            }
            if let Ok(home) = std::env::var("HOME") {
                candidates.push(format!("unix://{home}/.docker/run/docker.sock"));
            }
        }
    }
    let mut why = Vec::new();
    for host in candidates {
        let result = if let Some(path) = host.strip_prefix("unix://") {
            std::os::unix::net::UnixStream::connect(path)
                .map_err(|e| e.to_string())
                .and_then(|mut s| {
                    s.set_read_timeout(timeout).map_err(|e| e.to_string())?;
                    ping(&mut s)
                })
        } else if let Some(addr) = host.strip_prefix("tcp://") {
            std::net::TcpStream::connect(addr.trim_end_matches('/'))
                .map_err(|e| e.to_string())
                .and_then(|mut s| {
                    s.set_read_timeout(timeout).map_err(|e| e.to_string())?;
                    ping(&mut s)
                })
        } else {
            Err("only unix:// and tcp:// hosts are probed".to_string())
        };
        match result {
            Ok(()) => return Ok(host),
            Err(e) => why.push(format!("{host}: {e}")),
        }
    }
    Err(why.join("; "))
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// Skips the calling test (returning early) when Docker is not reachable.
macro_rules! require_docker {
    () => {
        match docker_reachable() {
            Ok(host) => eprintln!("using the Docker daemon at {host}"),
            Err(why) => {
                eprintln!("skipping the Docker test: no Docker daemon reachable ({why})");
                println!("skipped: no Docker daemon reachable");
                return;
            }
        }
    };
}

/// Elasticsearch 8, single node, security off; ready once the cluster health answers.
async fn start_elasticsearch() -> (ContainerAsync<ElasticSearch>, String) {
    let health = Healthcheck::cmd_shell(
        "curl -fsS 'http://localhost:9200/_cluster/health?wait_for_status=yellow&timeout=2s' || exit 1",
    )
    .with_interval(Duration::from_secs(2))
    .with_timeout(Duration::from_secs(5))
    .with_retries(90);
    let container = ElasticSearch::default()
        .with_tag(ES_TAG)
        .with_env_var("discovery.type", "single-node")
        .with_env_var("xpack.security.enabled", "false")
        .with_env_var("ES_JAVA_OPTS", "-Xms512m -Xmx512m")
        .with_health_check(health)
        // The module waits for a "[YELLOW] to [GREEN]" log line, which Elasticsearch 8 does not
        // always print; the health check above is the readiness signal instead.
        .with_ready_conditions(vec![WaitFor::healthcheck()])
        .with_startup_timeout(Duration::from_secs(240))
        .start()
        .await
        .expect("start the Elasticsearch container");
    let host = container.get_host().await.expect("container host");
    let port = container
        .get_host_port_ipv4(9200)
        .await
        .expect("mapped port 9200");
    (container, format!("http://{host}:{port}"))
}

/// ZooKeeper 3.9 (the module's image).
async fn start_zookeeper() -> (ContainerAsync<Zookeeper>, String) {
    let container = Zookeeper::default()
        .with_startup_timeout(Duration::from_secs(120))
        .start()
        .await
        .expect("start the ZooKeeper container");
    let host = container.get_host().await.expect("container host");
    let port = container
        .get_host_port_ipv4(2181)
        .await
        .expect("mapped port 2181");
    (container, format!("{host}:{port}"))
}

fn zk_settings(servers: &str) -> zkguard::config::ZkSettings {
    let mut s = Settings::default().zookeeper;
    s.servers = servers.to_string();
    // The image's tickTime is 2 s, so 4 s is the shortest session it grants.
    s.session_timeout = Duration::from_secs(6);
    s.foreground_timeout = Duration::from_secs(60);
    s.background_timeout = Duration::from_secs(60);
    s.lock_root = format!("/zkguard-docker/{}", uuid::Uuid::new_v4().simple());
    s
}

async fn locks(settings: &zkguard::config::ZkSettings) -> (ZkSession, Arc<dyn LockService>) {
    let session = ZkSession::connect(settings)
        .await
        .expect("connect to ZooKeeper");
    let locks: Arc<dyn LockService> = Arc::new(ZkLockService::new(session.clone()));
    (session, locks)
}

/// Both guarded-write scenarios of the osmem suite (`tests/guarded.rs`) against the real images:
/// one container pair, the scenarios in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn guarded_writes_against_elasticsearch_8_and_zookeeper_3_9() {
    require_docker!();
    let ((_es_container, es_url), (_zk_container, zk_servers)) =
        tokio::join!(start_elasticsearch(), start_zookeeper());
    let es: Arc<dyn DocStore> = Arc::new(EsStore::from_url(&es_url).unwrap());
    let settings = zk_settings(&zk_servers);
    stale_holder_is_fenced(&settings, &es).await;
    concurrent_increments_lose_nothing(&settings, &es).await;
}

/// Holder A is paused after checking its lock and before its write reaches Elasticsearch; its
/// session is killed on the server; holder B acquires and writes. A's write must then be rejected
/// by Elasticsearch 8 as `Fenced`, and the document keeps B's content.
async fn stale_holder_is_fenced(settings: &zkguard::config::ZkSettings, es: &Arc<dyn DocStore>) {
    let index = "articles";
    let monitor = "article-42";
    let (_s0, l0) = locks(settings).await;
    GuardedWriter::new(l0, es.clone())
        .on(monitor)
        .index(index, "42", json!({"owner": "seed"}))
        .await
        .unwrap();

    // A reaches ZooKeeper through a partition that the test cuts, so that ZooKeeper expires
    // A's session for real.
    let partition = zkguard::testkit::Partition::start(&settings.servers).unwrap();
    let mut settings_a = settings.clone();
    settings_a.servers = partition.connect_string().to_string();
    let (_session_a, locks_a) = locks(&settings_a).await;
    // Holds back A's `index` call until the test lets it through: the "pause" of a holder
    // between its last lock check and its request reaching Elasticsearch.
    let paused = Arc::new(HookedStore::new(es.clone(), IndexGate::new()));
    let writer_a = GuardedWriter::new(locks_a.clone(), paused.clone());
    let guard_a = locks_a
        .acquire(LockRequest::new(monitor, "holder A"))
        .await
        .unwrap();
    let token_a = guard_a.fencing_token();
    let op_a = Operation::index(monitor, index, "42", json!({"owner": "A"}));
    let (session_b, locks_b) = locks(settings).await;
    let writer_b = GuardedWriter::new(locks_b, es.clone());

    let a_write = writer_a.write_under(guard_a.as_ref(), &op_a);
    let scenario = async {
        paused.hook().reached().await;
        assert!(guard_a.is_held());
        partition.cut();
        let written_b = writer_b
            .on(monitor)
            .info("holder B")
            .index(index, "42", json!({"owner": "B"}))
            .await
            .unwrap();
        assert!(
            written_b.token > token_a,
            "B's token {} must exceed A's {token_a}",
            written_b.token
        );
        paused.hook().let_through();
        written_b
    };
    let (a_result, written_b) = tokio::join!(a_write, scenario);
    match a_result {
        Err(GuardedError::Fenced { token, .. }) => assert_eq!(token, token_a),
        other => panic!("A's stale write must be fenced, got {other:?}"),
    }
    let doc = es.get(index, "42").await.unwrap().unwrap();
    assert_eq!(doc.source["owner"], "B", "the document keeps B's content");
    assert_eq!(doc.meta.version as u64, written_b.token);

    let reason = tokio::time::timeout(Duration::from_secs(30), guard_a.lost())
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
    let err = GuardedWriter::new(locks_a.clone(), es.clone())
        .write_under(
            guard_a.as_ref(),
            &Operation::index(monitor, index, "42", json!({"owner": "A again"})),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, GuardedError::LockLost { .. }), "{err:?}");
    assert_eq!(
        es.get(index, "42").await.unwrap().unwrap().meta,
        doc.meta,
        "nothing was written"
    );
    drop(session_b);
}

/// Writers with their own sessions increment one counter by read-modify-write: exactly N x K.
async fn concurrent_increments_lose_nothing(
    settings: &zkguard::config::ZkSettings,
    es: &Arc<dyn DocStore>,
) {
    const WRITERS: usize = 4;
    const EACH: usize = 5;
    let (_s0, l0) = locks(settings).await;
    GuardedWriter::new(l0, es.clone())
        .on("counter")
        .index("counters", "c", json!({"n": 0}))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let settings = settings.clone();
        let es = es.clone();
        tasks.push(tokio::spawn(async move {
            let (_session, l) = locks(&settings).await;
            let writer = GuardedWriter::new(l, es);
            let mut ids = Vec::new();
            for _ in 0..EACH {
                let op = Operation::increment("counter", "counters", "c", "n", 1)
                    .with_info(format!("writer {w}"));
                writer
                    .run(&op)
                    .await
                    .unwrap_or_else(|e| panic!("writer {w}: {e}"));
                ids.push(op.id);
            }
            ids
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.extend(t.await.unwrap());
    }
    let doc = es.get("counters", "c").await.unwrap().unwrap();
    assert_eq!(
        doc.source["n"],
        json!(WRITERS * EACH),
        "lost or doubled increments: {}",
        doc.source
    );
    let stamp = Stamp::of(&doc.source).expect("stamp");
    assert!(
        ids.iter().all(|id| stamp.contains(id)),
        "every operation id is recorded"
    );
}
