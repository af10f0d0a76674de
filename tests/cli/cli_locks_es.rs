//! `zkguard locks` with `lock.backend=elasticsearch` shows the lease documents.

use std::sync::Arc;

use zkguard::config::{LockBackendKind, Settings};
use zkguard::es::EsStore;
use zkguard::eslock::EsLockService;
use zkguard::testkit::OsmemServer;
use zkguard::{LockRequest, LockService};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_lists_elasticsearch_leases() {
    let es = tokio::task::spawn_blocking(OsmemServer::start)
        .await
        .unwrap()
        .expect("start osmem-server");
    let mut settings = Settings::default();
    settings.backend = LockBackendKind::Elasticsearch;
    settings.elasticsearch.urls = vec![es.url().parse().unwrap()];
    let service =
        EsLockService::from_settings(&settings, Arc::new(EsStore::from_url(es.url()).unwrap()))
            .unwrap();
    let guard = service
        .acquire(LockRequest::new("article-7", "Save Content"))
        .await
        .unwrap();

    let out = crate::cli::zkguard()
        .env("ZKGUARD_LOCK_BACKEND", "elasticsearch")
        .env("ZKGUARD_ELASTICSEARCH_URL", es.url())
        .args(["locks", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["monitor"], "article-7");
    assert_eq!(rows[0]["state"], "held");
    assert_eq!(rows[0]["info"], "Save Content");
    assert_eq!(rows[0]["token"].as_u64(), Some(guard.fencing_token()));
    guard.unlock().await.unwrap();

    let out = crate::cli::zkguard()
        .env("ZKGUARD_LOCK_BACKEND", "elasticsearch")
        .env("ZKGUARD_ELASTICSEARCH_URL", es.url())
        .args(["locks", "--monitor", "article-7"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("article-7") && table.contains("free"),
        "{table}"
    );
}
