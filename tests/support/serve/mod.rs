//! Shared helpers of the `zkguard serve` tests: real ZooKeeper and osmem-server processes shared
//! by a binary's tests, the launcher (`launch.rs`, re-exported here), HTTP calls, and checks of
//! the stored documents. The service's process controls (signals, limits, kills) and the checks
//! only the service's tests make are in `controls.rs`, which only the service binary declares.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::common::*;
use reqwest::{Client, Method, StatusCode};
use serde_json::Value;
use zkguard::testkit::{OsmemServer, ZkServer};
use zkguard::{LockRequest, LockService, LockType, ZkLockService};

mod launch;

pub use launch::{Env, Service};

pub fn shared_zk() -> &'static ZkServer {
    static SERVER: OnceLock<ZkServer> = OnceLock::new();
    SERVER.get_or_init(zk_server)
}

pub fn shared_es() -> &'static OsmemServer {
    static SERVER: OnceLock<OsmemServer> = OnceLock::new();
    SERVER.get_or_init(|| OsmemServer::start().expect("start osmem-server"))
}

impl Env {
    pub fn new(zk: &str, tag: &str) -> Self {
        Env {
            zk: zk.to_string(),
            es: shared_es().url().to_string(),
            root: format!("/zkguard-serve/{tag}-{}", uuid_tag()),
            dir: Arc::new(tempfile::tempdir().unwrap()),
            extra: Vec::new(),
            args: Vec::new(),
            open_files: None,
            file_size: None,
        }
    }

    pub fn with(mut self, key: &str, value: &str) -> Self {
        self.extra.push((key.to_string(), value.to_string()));
        self
    }
}

impl Service {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

pub fn client() -> Client {
    Client::builder().build().unwrap()
}

/// Sends a request; returns the status and the body parsed as JSON (Null when empty or not JSON).
pub async fn call(
    c: &Client,
    method: Method,
    url: &str,
    body: Option<String>,
) -> (StatusCode, Value) {
    let mut req = c.request(method, url);
    if let Some(b) = body {
        req = req.header("content-type", "application/json").body(b);
    }
    let resp = req.send().await.expect("send request");
    let status = resp.status();
    let bytes = resp.bytes().await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

pub async fn put(c: &Client, s: &Service, path: &str, doc: &Value) -> (StatusCode, Value) {
    call(c, Method::PUT, &s.url(path), Some(doc.to_string())).await
}

/// `text` percent-encoded for a path segment or a query value (an idempotency key may hold
/// `#`, `/`, spaces, anything printable).
pub fn encoded(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

pub async fn op_status(c: &Client, s: &Service, id: &str) -> Value {
    let (status, v) = call(
        c,
        Method::GET,
        &s.url(&format!("/v1/operations/{}", encoded(id))),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v
}

/// Waits until every operation is finished (not queued) and returns their states.
pub async fn wait_finished(c: &Client, s: &Service, ids: &[String]) -> HashMap<String, Value> {
    let done = Arc::new(tokio::sync::Mutex::new(HashMap::new()));
    eventually(
        Duration::from_secs(60),
        "background operations finish",
        || {
            let done = done.clone();
            async move {
                let mut done = done.lock().await;
                for id in ids {
                    if !done.contains_key(id) {
                        let v = op_status(c, s, id).await;
                        if v["status"] != "queued" {
                            done.insert(id.clone(), v);
                        }
                    }
                }
                done.len() == ids.len()
            }
        },
    )
    .await;
    let done = done.lock().await.clone();
    done
}

/// The stored document, straight from Elasticsearch.
pub async fn es_doc(c: &Client, index: &str, id: &str) -> Value {
    let url = format!("{}/{index}/_doc/{id}", shared_es().url());
    let (status, v) = call(c, Method::GET, &url, None).await;
    assert_eq!(status, StatusCode::OK, "{url}: {v}");
    v
}

/// Holds the lock of `monitor` (foreground) through the library, as another writer would.
pub async fn hold_lock(env: &Env, monitor: &str) -> (ZkLockService, Box<dyn zkguard::Guard>) {
    let mut settings = zk_settings(&env.zk, "holder");
    settings.lock_root = env.root.clone();
    let service = ZkLockService::new(session(&settings).await);
    let guard = service
        .acquire(LockRequest::new(monitor, "test holder").with_type(LockType::Foreground))
        .await
        .unwrap();
    (service, guard)
}

/// Parses OpenMetrics text: every line is a comment (`# HELP`, `# TYPE`, `# UNIT`, `# EOF`
/// last) or a sample `name{labels} value`; returns the samples.
pub fn parse_metrics(text: &str) -> HashMap<String, f64> {
    let mut samples = HashMap::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "{text}");
    let mut typed = HashSet::new();
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let kind = parts.next().unwrap();
            let name = parts.next().expect("metric name");
            assert!(["HELP", "TYPE", "UNIT"].contains(&kind), "{line}");
            if kind == "TYPE" {
                let t = parts.next().expect("type");
                assert!(["counter", "gauge", "histogram"].contains(&t), "{line}");
                typed.insert(name.to_string());
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad sample line {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let name = series.split('{').next().unwrap();
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "{line}"
        );
        if let Some(labels) = series.strip_prefix(name) {
            if !labels.is_empty() {
                assert!(labels.starts_with('{') && labels.ends_with('}'), "{line}");
                for pair in labels[1..labels.len() - 1].split(',') {
                    let (k, v) = pair.split_once('=').unwrap_or_else(|| panic!("{line}"));
                    assert!(
                        !k.is_empty() && v.starts_with('"') && v.ends_with('"'),
                        "{line}"
                    );
                }
            }
        }
        assert!(
            typed.iter().any(|t| name.starts_with(t.as_str())),
            "sample {name} has no TYPE line"
        );
        samples.insert(series.to_string(), value);
    }
    samples
}

/// The service's metrics, checked as OpenMetrics text.
pub async fn scrape(c: &Client, s: &Service) -> HashMap<String, f64> {
    let resp = c.get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    parse_metrics(&resp.text().await.unwrap())
}

/// A metric's value in the service's metrics; panics when it has no such sample.
pub async fn scraped(c: &Client, s: &Service, series: &str) -> f64 {
    let samples = scrape(c, s).await;
    samples
        .get(series)
        .copied()
        .unwrap_or_else(|| panic!("no {series} in {samples:?}"))
}
