//! Shared helpers of the `zkguard serve` tests: real ZooKeeper and osmem-server processes, a
//! service started on a free port, HTTP calls, and checks of the stored documents.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::common::*;
use reqwest::{Client, Method, StatusCode};
use serde_json::Value;
use zkguard::testkit::{OsmemServer, ZkServer};
use zkguard::{LockRequest, LockService, LockType, ZkLockService};

pub fn shared_zk() -> &'static ZkServer {
    static SERVER: OnceLock<ZkServer> = OnceLock::new();
    SERVER.get_or_init(zk_server)
}

pub fn shared_es() -> &'static OsmemServer {
    static SERVER: OnceLock<OsmemServer> = OnceLock::new();
    SERVER.get_or_init(|| OsmemServer::start().expect("start osmem-server"))
}

/// Where a service runs: ZooKeeper, Elasticsearch, its lock root and a directory for its files.
#[derive(Clone)]
pub struct Env {
    pub zk: String,
    pub es: String,
    pub root: String,
    pub dir: Arc<tempfile::TempDir>,
    pub extra: Vec<(String, String)>,
    pub args: Vec<String>,
    /// The service's open-files limit (soft and hard), when the test sets one.
    pub open_files: Option<u64>,
    /// The service's file-size limit in bytes (`ulimit -f`), when the test sets one.
    pub file_size: Option<u64>,
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

    /// Runs the service under a file-size limit of `n` bytes (`ulimit -f`): a journal that
    /// reaches it cannot be appended to, as on a full disk.
    pub fn file_size(mut self, n: Option<u64>) -> Self {
        self.file_size = n;
        self
    }

    /// Runs the service under an open-files limit of `n` (`ulimit -n`).
    pub fn open_files(mut self, n: u64) -> Self {
        self.open_files = Some(n);
        self
    }

    pub fn with(mut self, key: &str, value: &str) -> Self {
        self.extra.push((key.to_string(), value.to_string()));
        self
    }

    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_string());
        self
    }

    pub fn journal(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.journal"))
    }

    /// Starts `zkguard serve --listen 127.0.0.1:0` with journal `name` and waits for its
    /// address line.
    pub fn start(&self, name: &str) -> Service {
        let log = self.dir.path().join(format!("{name}.log"));
        let mut cmd = crate::cli::zkguard();
        cmd.args(["serve", "--listen", "127.0.0.1:0"])
            .args(&self.args)
            .env_remove("ZKGUARD_CONFIG")
            .env_remove("RUST_LOG")
            .env("ZKGUARD_ZOOKEEPER_SERVERS", &self.zk)
            .env("ZKGUARD_ZOOKEEPER_LOCK_ROOT", &self.root)
            // 6 s: the service gives up a lock after half of it without ZooKeeper (3 s), more
            // than a busy machine stalls ZooKeeper's JVM; a test about expiry sets its own.
            .env("ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT", "6000")
            .env("ZKGUARD_ZOOKEEPER_CONNECTION_RETRY", "2")
            .env("ZKGUARD_ZOOKEEPER_CONNECTION_DELAY", "100")
            .env("ZKGUARD_ZOOKEEPER_FOREGROUND_TASK_TIMEOUT", "10000")
            .env("ZKGUARD_ZOOKEEPER_BACKGROUND_TASK_TIMEOUT", "10000")
            .env("ZKGUARD_ELASTICSEARCH_URL", &self.es)
            .env("ZKGUARD_SERVER_JOURNAL_PATH", self.journal(name))
            .env(
                "ZKGUARD_DEADLETTER_FILE_PATH",
                self.dir.path().join(format!("{name}.dlq")),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        for (k, v) in &self.extra {
            cmd.env(k, v);
        }
        let limits: Vec<(nix::sys::resource::Resource, u64)> = [
            (nix::sys::resource::Resource::RLIMIT_NOFILE, self.open_files),
            (nix::sys::resource::Resource::RLIMIT_FSIZE, self.file_size),
        ]
        .into_iter()
        .filter_map(|(r, n)| n.map(|n| (r, n)))
        .collect();
        if !limits.is_empty() {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    for (r, n) in &limits {
                        nix::sys::resource::setrlimit(*r, *n, *n).map_err(std::io::Error::from)?;
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().expect("run zkguard serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let started: Value = serde_json::from_str(&line).unwrap_or_else(|_| {
            let _ = child.wait();
            panic!(
                "zkguard serve did not start: {line:?}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
        let scheme = if started["tls"] == true {
            "https"
        } else {
            "http"
        };
        Service {
            child,
            base: format!("{scheme}://{}", started["listening"].as_str().unwrap()),
            started,
            log,
        }
    }
}

pub struct Service {
    pub child: Child,
    pub base: String,
    pub started: Value,
    pub log: PathBuf,
}

impl Service {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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

/// Parks one background operation on `index`: a patch of a document that does not exist,
/// which can never apply. Returns its operation id once the service says it is parked.
pub async fn park_one(c: &Client, s: &Service, index: &str) -> String {
    let (status, v) = call(
        c,
        Method::PATCH,
        &s.url(&format!("/v1/indices/{index}/docs/gone?type=background")),
        Some(serde_json::json!({"views": 1}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let id = v["operation_id"].as_str().unwrap().to_string();
    let done = wait_finished(c, s, std::slice::from_ref(&id)).await;
    assert_eq!(done[&id]["status"], "parked", "{:?}", done[&id]);
    id
}

/// The stored document, straight from Elasticsearch.
pub async fn es_doc(c: &Client, index: &str, id: &str) -> Value {
    let url = format!("{}/{index}/_doc/{id}", shared_es().url());
    let (status, v) = call(c, Method::GET, &url, None).await;
    assert_eq!(status, StatusCode::OK, "{url}: {v}");
    v
}

/// Checks one document against the writes that were answered as done: every one of them is
/// recorded in the document exactly once (none lost, none applied twice) and, in the order
/// they were applied, their fencing tokens never decrease; the stored version is the last
/// token. A token names one lock acquisition: several operations share one when the service
/// applied them one after another under one background acquisition, and then they sit next to
/// each other in the order applied (no other holder wrote in between), which a sequence that
/// never decreases guarantees. Two acquisitions' writes interleaving would show as a decrease.
pub async fn check_doc(c: &Client, index: &str, id: &str, tokens: &HashMap<String, u64>) {
    let doc = es_doc(c, index, id).await;
    let ops: Vec<String> =
        serde_json::from_value(doc["_source"]["zkguard"]["ops"].clone()).unwrap();
    let unique: HashSet<&String> = ops.iter().collect();
    assert_eq!(
        unique.len(),
        ops.len(),
        "an operation was applied twice: {ops:?}"
    );
    for op in tokens.keys() {
        assert!(
            ops.contains(op),
            "operation {op} answered as done is missing from {index}/{id}: {ops:?}"
        );
    }
    let applied: Vec<u64> = ops.iter().filter_map(|o| tokens.get(o).copied()).collect();
    assert!(
        applied.windows(2).all(|w| w[0] <= w[1]),
        "tokens of {index}/{id} in the order applied decrease: {applied:?}"
    );
    assert_eq!(doc["_version"].as_u64(), applied.last().copied(), "{doc}");
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
