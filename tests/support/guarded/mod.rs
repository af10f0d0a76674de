//! Shared helpers of the guarded-write, background and dead-letter tests: real ZooKeeper and
//! osmem-server processes, settings pointing at them, and a few polling helpers.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::Value;
use zkguard::config::Settings;
use zkguard::es::{DocStore, EsStore};
use zkguard::testkit::{OsmemServer, ZkServer};
use zkguard::{LockService, ZkLockService, ZkSession};

/// One ZooKeeper (tickTime 500 ms) and one osmem-server, started together.
pub struct Servers {
    pub zk: ZkServer,
    pub es: OsmemServer,
}

impl Servers {
    pub fn start() -> Servers {
        let zk = std::thread::spawn(|| {
            ZkServer::builder()
                .tick_time(500)
                .start()
                .expect("start ZooKeeper (run scripts/install-deps.sh)")
        });
        let es = OsmemServer::start().expect("start osmem-server (run scripts/install-deps.sh)");
        Servers {
            zk: zk.join().expect("ZooKeeper start thread"),
            es,
        }
    }
}

/// Servers shared by the tests of one test binary (each test uses its own lock root and index).
pub fn shared() -> &'static Servers {
    static SERVERS: OnceLock<Servers> = OnceLock::new();
    SERVERS.get_or_init(Servers::start)
}

/// A short random tag.
pub fn tag() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..10].to_string()
}

/// Settings for a ZooKeeper connect string and an Elasticsearch URL: a lock root of its own,
/// 2 s sessions, 10 s lock waits, 2 s Elasticsearch requests, fast retries, a dead-letter file in
/// `dir`.
pub fn settings(zk: &str, es_url: &str, dir: &std::path::Path) -> Settings {
    let mut s = Settings::default();
    s.zookeeper.servers = zk.to_string();
    s.zookeeper.session_timeout = Duration::from_millis(2000);
    s.zookeeper.connection_retry = 3;
    s.zookeeper.connection_delay = Duration::from_millis(200);
    s.zookeeper.foreground_timeout = Duration::from_secs(10);
    s.zookeeper.background_timeout = Duration::from_secs(10);
    s.zookeeper.lock_root = format!("/zkguard-test/{}", tag());
    s.elasticsearch.urls = vec![url::Url::parse(es_url).expect("osmem url")];
    // Generous: a loaded machine can hold an answer back; tests that need a short timeout set it.
    s.elasticsearch.request_timeout = Duration::from_secs(10);
    s.retry.retry_count = 3;
    s.retry.backoff_initial = Duration::from_millis(50);
    s.retry.backoff_max = Duration::from_millis(200);
    s.retry.file_path = dir.join("deadletters.jsonl");
    s
}

pub fn settings_for(servers: &Servers, dir: &std::path::Path) -> Settings {
    settings(&servers.zk.connect_string(), servers.es.url(), dir)
}

/// A lock service over a new ZooKeeper session.
pub async fn locks(settings: &Settings) -> (ZkSession, Arc<dyn LockService>) {
    let session = ZkSession::connect(&settings.zookeeper)
        .await
        .expect("connect to ZooKeeper");
    let service: Arc<dyn LockService> = Arc::new(ZkLockService::new(session.clone()));
    (session, service)
}

/// The Elasticsearch store of `settings`.
pub fn store(settings: &Settings) -> Arc<dyn DocStore> {
    Arc::new(EsStore::new(&settings.elasticsearch).expect("Elasticsearch client"))
}

/// The stored source of `index/id` (panics when it is missing).
pub async fn source(store: &dyn DocStore, index: &str, id: &str) -> Value {
    store
        .get(index, id)
        .await
        .expect("GET")
        .unwrap_or_else(|| panic!("{index}/{id} is missing"))
        .source
}

/// Dead letters, as the executor parks them, for the tests of their order.
pub mod parked {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use serde_json::json;
    use zkguard::config::Settings;
    use zkguard::write::deadletter::{DeadLetter, DeadLetterError, DeadLetterSink};
    use zkguard::write::guarded::GuardedWriter;
    use zkguard::write::ops::Operation;
    use zkguard::LockType;

    use super::{locks, store};

    /// A sink that keeps what the executor parks, so that the test can store it in the real sink
    /// in another order: concurrent workers give up in no particular order.
    #[derive(Default)]
    struct Collected(std::sync::Mutex<Vec<DeadLetter>>);

    #[async_trait::async_trait]
    impl DeadLetterSink for Collected {
        async fn park(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
            self.0.lock().unwrap().push(letter.clone());
            Ok(())
        }
        async fn list(&self) -> Result<Vec<DeadLetter>, DeadLetterError> {
            Ok(self.0.lock().unwrap().clone())
        }
        async fn remove(&self, id: uuid::Uuid) -> Result<bool, DeadLetterError> {
            let mut v = self.0.lock().unwrap();
            let before = v.len();
            v.retain(|l| l.id != id);
            Ok(v.len() < before)
        }
        fn describe(&self) -> String {
            "collected".into()
        }
    }

    /// The ids of a replay report's `results`, in the order they were replayed.
    pub fn replayed_ids(report: &serde_json::Value) -> Vec<&str> {
        report["results"]
            .as_array()
            .expect("a replay report has results")
            .iter()
            .map(|r| r["id"].as_str().expect("each result names its entry"))
            .collect()
    }

    /// Background writes `{"n": from..to}` of `index/id`, submitted in that order while the test
    /// holds the document's lock: each one times out and is parked by the executor. Returns the
    /// operations (in acceptance order) and their dead letters, which `sink` then stores in a
    /// shuffled order (`i * 7 % len`, so the newest is not stored last).
    pub async fn park_shuffled(
        settings: &Settings,
        sink: &dyn DeadLetterSink,
        monitor: &str,
        index: &str,
        id: &str,
        n: std::ops::Range<i64>,
    ) -> Vec<Operation> {
        use zkguard::write::background::BackgroundExecutor;
        let (_s, l) = locks(settings).await;
        let held = l
            .acquire(
                zkguard::LockRequest::new(monitor, "test holder").with_type(LockType::Foreground),
            )
            .await
            .unwrap();
        let collected = Arc::new(Collected::default());
        let executor = BackgroundExecutor::builder(
            GuardedWriter::new(l.clone(), store(settings)),
            collected.clone(),
        )
        .attempts(1)
        .lock_timeout(Duration::from_millis(100))
        .concurrency(64)
        .build();
        let mut ops = Vec::new();
        let mut tasks = Vec::new();
        for v in n {
            let op = Operation::index(monitor, index, id, json!({ "n": v }));
            ops.push(op.clone());
            tasks.push(executor.submit(op).await);
        }
        for t in tasks {
            assert!(t.await.unwrap().unwrap().is_parked());
        }
        held.unlock().await.unwrap();
        let letters = collected.list().await.unwrap();
        let len = letters.len();
        let by_id: std::collections::HashMap<_, _> =
            letters.into_iter().map(|l| (l.id, l)).collect();
        for i in 0..len {
            let mut letter = by_id[&ops[i * 7 % len].id].clone();
            // Parked now: the sinks that list by parking time list them in this order.
            letter.parked_at = SystemTime::now();
            sink.park(&letter).await.unwrap();
        }
        ops
    }
}
