//! The Elasticsearch-compatible gate of `zkguard serve`, against real ZooKeeper and
//! osmem-server processes and the official Python clients: guarded writes carry their lock's
//! token as the document's version, the gate and `/v1` share the locks (foreground first),
//! a stale write is fenced, what cannot be fenced is refused, the rest passes through as is.

use crate::common;
use crate::gateway_support;
use crate::serve_support;

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use crate::queue::queued;
use common::*;
use gateway_support::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use serve_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_official_python_clients_write_through_the_gate_and_every_version_is_a_token() {
    // opensearch-py straight at the gate before osmem; elasticsearch-py 8 at a gate before the
    // front that answers as a real Elasticsearch (product header, its media types).
    let front = Front::start_with(shared_es().url(), &["--plain-media-types"]);
    for (name, es) in [
        ("opensearch", shared_es().url().to_string()),
        ("elasticsearch", front.url.clone()),
    ] {
        let env = gate_env(&shared_zk().connect_string(), name, &es);
        let s = env.start("a");
        let index = format!("gate-{name}-{}", uuid_tag());
        let summary = python_clients(name, &gate(&s), &index).await;
        let versions = summary["versions"].as_object().unwrap();
        let responses = summary["responses"].as_object().unwrap();
        assert!(
            versions.len() >= 2990,
            "{name}: {} documents",
            versions.len()
        );
        for (id, v) in versions {
            let v = v.as_u64().unwrap();
            assert!(v >= MIN_TOKEN, "{name}: {id} has version {v}, not a token");
            assert_eq!(
                Some(v),
                responses[id].as_u64(),
                "{name}: {id}: stored version is the last writer's token"
            );
        }
        let c = client();
        let m = scrape(&c, &s).await;
        for series in [
            r#"zkguard_gateway_requests_total{route="update",outcome="guarded"}"#,
            r#"zkguard_gateway_requests_total{route="create",outcome="conflict"}"#,
            r#"zkguard_gateway_requests_total{route="update",outcome="refused"}"#,
            r#"zkguard_gateway_requests_total{route="by_query",outcome="refused"}"#,
            r#"zkguard_gateway_requests_total{route="other",outcome="passed"}"#,
            r#"zkguard_gateway_bulk_items_total{route="index",outcome="guarded"}"#,
            r#"zkguard_gateway_bulk_items_total{route="update",outcome="guarded"}"#,
        ] {
            assert!(
                m.get(series).copied().unwrap_or(0.0) >= 1.0,
                "{name}: {series} in {m:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_gate_and_v1_share_the_locks_and_foreground_overtakes_queued_background() {
    let env = gate_env(&shared_zk().connect_string(), "share", shared_es().url());
    let s = env.start("a");
    let g = gate(&s);
    let c = client();
    let index = format!("gate-share-{}", uuid_tag());
    let (st, _, v) = send(
        &c,
        Method::PUT,
        &format!("{g}/{index}/_doc/setup"),
        Some("{}"),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");

    // A holder outside the gate; a background write queues, then a foreground one overtakes it.
    let monitor = format!("{index}:d");
    let lock_node = format!("{}/{monitor}", env.root);
    let (holder, guard) = hold_lock(&env, &monitor).await;
    let write = |who: &'static str, ty: &'static str| {
        let c = c.clone();
        let url = format!("{g}/{index}/_doc/d");
        tokio::spawn(async move {
            send(
                &c,
                Method::PUT,
                &url,
                Some(&json!({"who": who}).to_string()),
                &[("x-zkguard-lock-type", ty)],
            )
            .await
        })
    };
    let bg = write("bg", "background");
    eventually(
        Duration::from_secs(10),
        "the background write queues",
        || async { queued(&env.zk, &lock_node, "B-").await == 1 },
    )
    .await;
    let fg = write("fg", "foreground");
    eventually(
        Duration::from_secs(10),
        "the foreground write queues",
        || async { queued(&env.zk, &lock_node, "A-").await == 2 },
    )
    .await;
    guard.unlock().await.unwrap();
    drop(holder);
    let (fg_status, fg_h, fg_v) = fg.await.unwrap();
    let (bg_status, bg_h, bg_v) = bg.await.unwrap();
    assert_eq!(fg_status, StatusCode::CREATED, "{fg_v}");
    assert_eq!(bg_status, StatusCode::OK, "{bg_v}");
    assert!(
        token_of(&fg_h) < token_of(&bg_h),
        "the foreground write went first"
    );
    let doc = es_doc(&c, &index, "d").await;
    assert_eq!(doc["_source"]["who"], "bg");
    assert_eq!(doc["_version"].as_u64(), Some(token_of(&bg_h)));

    // Writers through the gate (single writes and bulks, both lock types) and through /v1 on
    // the same three documents at once: no write is ever fenced (no two holders), and each
    // document ends at the highest token written.
    let mut tasks = Vec::new();
    for k in 0..6usize {
        let c = c.clone();
        let (g, v1, index) = (g.clone(), s.base.clone(), index.clone());
        tasks.push(tokio::spawn(async move {
            let mut tokens: Vec<(String, u64)> = Vec::new();
            for i in 0..12usize {
                let doc = format!("s{}", (k + i) % 3);
                let body = json!({"k": k, "i": i}).to_string();
                match (k + i) % 4 {
                    0 => {
                        let url = format!("{v1}/v1/indices/{index}/docs/{doc}?timeout=20s");
                        let (st, v) = call(&c, Method::PUT, &url, Some(body)).await;
                        assert_eq!(st, StatusCode::OK, "{v}");
                        tokens.push((doc, v["token"].as_u64().unwrap()));
                    }
                    1 => {
                        let bulk = format!(
                            "{{\"index\":{{\"_index\":\"{index}\",\"_id\":\"{doc}\"}}}}\n{body}\n{{\"update\":{{\"_index\":\"{index}\",\"_id\":\"{doc}\"}}}}\n{{\"doc\":{{\"u\":{i}}}}}\n"
                        );
                        let (st, _, v) = send(&c, Method::POST, &format!("{g}/_bulk"), Some(&bulk), &[("x-zkguard-lock-type", "background"), ("x-zkguard-timeout", "20s")]).await;
                        assert_eq!(st, StatusCode::OK, "{v}");
                        assert_eq!(v["errors"], false, "{v}");
                        for item in v["items"].as_array().unwrap() {
                            let inner = item.as_object().unwrap().values().next().unwrap();
                            tokens.push((doc.clone(), inner["_version"].as_u64().unwrap()));
                        }
                    }
                    n => {
                        let ty = if n == 2 { "foreground" } else { "background" };
                        let url = format!("{g}/{index}/_doc/{doc}");
                        let (st, h, v) = send(&c, Method::PUT, &url, Some(&body), &[("x-zkguard-lock-type", ty), ("x-zkguard-timeout", "20s")]).await;
                        assert!(st.is_success(), "{st} {v}");
                        tokens.push((doc, token_of(&h)));
                    }
                }
            }
            tokens
        }));
    }
    let mut per_doc: HashMap<String, Vec<u64>> = HashMap::new();
    for t in tasks {
        for (doc, token) in t.await.unwrap() {
            per_doc.entry(doc).or_default().push(token);
        }
    }
    for (doc, tokens) in &per_doc {
        let stored = es_doc(&c, &index, doc).await;
        assert_eq!(
            stored["_version"].as_u64(),
            tokens.iter().max().copied(),
            "{doc}: {stored}"
        );
    }
    let m = scrape(&c, &s).await;
    let fenced: f64 = m
        .iter()
        .filter(|(k, _)| k.starts_with("zkguard_fenced_rejections_total"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(fenced, 0.0, "no write was fenced: {m:?}");
}

/// A gate write (`path` with `body`, sent with `method`) on its way to the cluster: the service
/// reaches ZooKeeper through a partition the test can cut (a short session, so that it expires
/// soon after the cut) and the cluster through a front holding its fenced writes; a document
/// `x` is written first, then the write is sent and waits at the front.
struct GateWriteOnItsWay {
    zk: String,
    partition: zkguard::testkit::Partition,
    front: Front,
    env: Env,
    _s: Service,
    c: reqwest::Client,
    index: String,
    /// The gate's answer, once the front lets the write through.
    stale: tokio::task::JoinHandle<(StatusCode, reqwest::header::HeaderMap, Value)>,
}

impl GateWriteOnItsWay {
    async fn start(tag: &str, method: Method, path: &str, body: Option<&str>) -> Self {
        let zk = shared_zk().connect_string();
        let partition = zkguard::testkit::Partition::start(&zk).unwrap();
        let front = Front::start(shared_es().url());
        let env = gate_env(partition.connect_string(), tag, &front.url)
            .with("ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT", "2000");
        let s = env.start("a");
        let g = gate(&s);
        let c = client();
        let index = format!("gate-{tag}-{}", uuid_tag());
        let seed = format!("{g}/{index}/_doc/x");
        let (st, _, v) = send(&c, Method::PUT, &seed, Some(r#"{"owner":"seed"}"#), &[]).await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
        front.hold().await;
        let stale = tokio::spawn({
            let url = format!("{g}{}", path.replace("{index}", &index));
            let (c, body) = (c.clone(), body.map(str::to_string));
            async move { send(&c, method, &url, body.as_deref(), &[]).await }
        });
        eventually(
            Duration::from_secs(10),
            "the gate's write waits at the front",
            || async { front.held().await == 1 },
        )
        .await;
        Self {
            zk,
            partition,
            front,
            env,
            _s: s,
            c,
            index,
            stale,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gate_write_whose_lock_is_lost_on_the_way_is_fenced() {
    // The service reaches ZooKeeper through a partition the test cuts, and Elasticsearch
    // through a front that holds its fenced writes: the gate's write is on the way, its
    // session expires, another writer takes the lock and writes, then the stale write arrives.
    let w = GateWriteOnItsWay::start(
        "stale",
        Method::PUT,
        "/{index}/_doc/x",
        Some(r#"{"owner":"stale"}"#),
    )
    .await;
    let (zk, env, index, c, front, partition) =
        (&w.zk, &w.env, &w.index, &w.c, &w.front, &w.partition);
    // While it holds the lock, `zkguard locks` names the gate's route as the holder's info.
    let out = crate::cli::zkguard()
        .args(["locks", "--json"])
        .env("ZKGUARD_ZOOKEEPER_SERVERS", zk)
        .env("ZKGUARD_ZOOKEEPER_LOCK_ROOT", &env.root)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains(&format!("gateway index {index}/x")),
        "{listed}"
    );

    partition.cut();
    let mut settings = zk_settings(zk, "newer");
    settings.lock_root = env.root.clone();
    let locks: std::sync::Arc<dyn zkguard::LockService> =
        std::sync::Arc::new(zkguard::ZkLockService::new(session(&settings).await));
    let store: std::sync::Arc<dyn zkguard::es::DocStore> =
        std::sync::Arc::new(zkguard::es::EsStore::from_url(shared_es().url()).unwrap());
    let newer = zkguard::write::guarded::GuardedWriter::new(locks, store)
        .without_stamp(zkguard::write::stamping::IndexPatterns::parse("*").unwrap())
        .on(zkguard::lock::document_monitor(index, "x"))
        .index(index, "x", json!({"owner": "newer"}))
        .await
        .unwrap();
    front.release().await;
    let (st, _, v) = w.stale.await.unwrap();
    assert_eq!(st, StatusCode::CONFLICT, "the stale write is fenced: {v}");
    assert_eq!(
        v["error"]["type"], "version_conflict_engine_exception",
        "{v}"
    );
    let doc = es_doc(c, index, "x").await;
    assert_eq!(doc["_source"]["owner"], "newer", "{doc}");
    assert_eq!(doc["_version"].as_u64(), Some(newer.token));
    partition.heal();
}

/// A gate write (`path` with `body`, sent with `method`) whose lock is lost while it is on its
/// way to the cluster, landing between the next holder's read and write: the service reaches
/// ZooKeeper through a partition the test cuts and the cluster through a front that holds its
/// fenced writes; once the gate's write waits at the front, the service's session is cut off
/// until it expires, another writer (B) takes the lock, reads the document and is paused
/// before its write; then the gate's write lands (its token is older than B's, but B has not
/// written yet, so the cluster takes it) and only once the gate has answered does B write the
/// document it computed from its read. Returns the gate's answer and the document as B left it.
async fn a_gate_write_lost_on_the_way(
    tag: &str,
    method: Method,
    path: &str,
    body: Option<&str>,
) -> (StatusCode, reqwest::header::HeaderMap, Value, Value) {
    use std::sync::Arc;
    use zkguard::es::{DocStore, EsStore, HookedStore, IndexGate};
    let w = GateWriteOnItsWay::start(tag, method, path, body).await;
    let (zk, env, index, c, front, partition) =
        (&w.zk, &w.env, &w.index, &w.c, &w.front, &w.partition);
    partition.cut();
    let mut settings = zk_settings(zk, "newer");
    settings.lock_root = env.root.clone();
    let locks: Arc<dyn zkguard::LockService> =
        Arc::new(zkguard::ZkLockService::new(session(&settings).await));
    let store: Arc<dyn DocStore> = Arc::new(EsStore::from_url(shared_es().url()).unwrap());
    let paused_b = Arc::new(HookedStore::new(store, IndexGate::new()));
    let writer_b = zkguard::write::guarded::GuardedWriter::new(locks, paused_b.clone())
        .without_stamp(zkguard::write::stamping::IndexPatterns::parse("*").unwrap());
    // B gets the lock once ZooKeeper expired the service's session, reads the document and
    // waits before its write.
    let on_b = writer_b
        .on(zkguard::lock::document_monitor(index, "x"))
        .info("holder B");
    let b_write = on_b.update(index, "x", json!({"b": 1}));
    let scenario = async {
        paused_b.hook().reached().await;
        // B has read the document: the gate's write lands now.
        front.release().await;
        let answer = w.stale.await.unwrap();
        // Only once the gate answered does B's write go out.
        paused_b.hook().let_through();
        answer
    };
    let (b_result, (status, headers, answer)) = tokio::join!(b_write, scenario);
    b_result.expect("B writes the document it read");
    let doc = es_doc(c, index, "x").await;
    assert_eq!(
        doc["_source"]["b"], 1,
        "B's change is in the document: {doc}"
    );
    partition.heal();
    (status, headers, answer, doc)
}

/// What a gate write whose lock was lost while it was on its way is answered, the cluster
/// having taken it: not acknowledged (the next holder may have read the document before it
/// landed, and replaced it), 503 `zkguard_lock_lost_exception` with `Retry-After`, which the
/// clients' transports retry; in a `_bulk`, the item's error at 503, which no bulk helper
/// retries blindly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gate_write_whose_lock_is_lost_while_it_is_on_its_way_is_not_acknowledged() {
    let lost = |v: &Value| {
        let reason = v["error"]["reason"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert_eq!(v["error"]["type"], "zkguard_lock_lost_exception", "{v}");
        assert!(
            reason.contains("while the write was on its way") && reason.contains("may have"),
            "the reason says the write may have landed: {v}"
        );
    };
    for (tag, method, path, body) in [
        (
            "lost-update",
            Method::POST,
            "/{index}/_update/x",
            Some(r#"{"doc":{"a":1}}"#),
        ),
        ("lost-delete", Method::DELETE, "/{index}/_doc/x", None),
    ] {
        let (status, headers, answer, doc) =
            a_gate_write_lost_on_the_way(tag, method, path, body).await;
        assert!(
            !status.is_success(),
            "{tag}: the gate acknowledged a write ({status} {answer}) that B, which read the document before it landed, replaced: {doc}"
        );
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{tag}: {answer}");
        assert_eq!(
            headers.get("retry-after").and_then(|v| v.to_str().ok()),
            Some("1"),
            "{tag}"
        );
        assert_eq!(answer["status"], 503, "{tag}: {answer}");
        lost(&answer);
    }

    let bulk = "{\"update\":{\"_id\":\"x\"}}\n{\"doc\":{\"a\":1}}\n";
    let (status, _, answer, doc) =
        a_gate_write_lost_on_the_way("lost-bulk", Method::POST, "/{index}/_bulk", Some(bulk)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let item = &answer["items"][0]["update"];
    assert_eq!(
        item["status"], 503,
        "the item is not acknowledged ({answer}); B, which read the document before it landed, replaced it: {doc}"
    );
    assert_eq!(answer["errors"], true, "{answer}");
    lost(item);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn what_cannot_carry_a_token_is_refused_with_a_reason_and_writes_nothing() {
    let env = gate_env(&shared_zk().connect_string(), "refuse", shared_es().url());
    let s = env.start("a");
    let g = gate(&s);
    let c = client();
    let index = format!("gate-refuse-{}", uuid_tag());
    let (st, _, v) = send(
        &c,
        Method::PUT,
        &format!("{g}/{index}/_doc/1"),
        Some(r#"{"n":1}"#),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let before = es_doc(&c, &index, "1").await;
    for (method, path, body, says) in [
        (
            Method::POST,
            format!("/{index}/_update/1"),
            r#"{"script":{"source":"ctx._source.n++"}}"#.to_string(),
            "scripted updates are refused",
        ),
        (
            Method::POST,
            format!("/{index}/_update_by_query"),
            r#"{"query":{"match_all":{}}}"#.to_string(),
            "_update_by_query on",
        ),
        (
            Method::POST,
            format!("/{index}/_delete_by_query"),
            r#"{"query":{"match_all":{}}}"#.to_string(),
            "_delete_by_query on",
        ),
        (
            Method::POST,
            "/_reindex".to_string(),
            json!({"source":{"index":"elsewhere"},"dest":{"index":index}}).to_string(),
            "_reindex into",
        ),
        (
            Method::PUT,
            format!("/{index}/_doc/1?version=99&version_type=external"),
            r#"{"n":2}"#.to_string(),
            "[version] is refused",
        ),
        (
            Method::PUT,
            format!("/{index},other/_doc/1"),
            r#"{"n":2}"#.to_string(),
            "several indices or a pattern",
        ),
    ] {
        let (st, h, v) = send(&c, method, &format!("{g}{path}"), Some(&body), &[]).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{path}: {v}");
        assert_eq!(v["status"], 400, "{path}: {v}");
        assert_eq!(
            v["error"]["type"], "illegal_argument_exception",
            "{path}: {v}"
        );
        let reason = v["error"]["reason"].as_str().unwrap();
        assert!(reason.contains(says), "{path}: {reason}");
        assert!(
            h.get("x-elastic-product").is_some(),
            "{path}: the gate's answers carry the product header"
        );
    }
    // zkguard's own indices are refused outright.
    let (st, _, v) = send(
        &c,
        Method::PUT,
        &format!("{g}/zkguard-transactions/_doc/t"),
        Some("{}"),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{v}");
    assert!(
        v["error"]["reason"]
            .as_str()
            .unwrap()
            .contains("server.index.allow"),
        "{v}"
    );
    // In a bulk, a refused item is answered on its own; the others are written.
    let bulk = format!(
        "{{\"index\":{{\"_index\":\"{index}\",\"_id\":\"1\",\"version\":5,\"version_type\":\"external\"}}}}\n{{\"n\":3}}\n{{\"index\":{{\"_index\":\"{index}\",\"_id\":\"2\"}}}}\n{{\"n\":3}}\n"
    );
    let (st, _, v) = send(
        &c,
        Method::POST,
        &format!("{g}/_bulk?filter_path=errors,items.*.status"),
        Some(&bulk),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        v,
        json!({"errors": true, "items": [{"index": {"status": 400}}, {"index": {"status": 201}}]})
    );
    assert_eq!(
        es_doc(&c, &index, "1").await,
        before,
        "nothing was written by a refusal"
    );
}

/// A request sent to the gate and to the cluster: method, path and query, body, headers.
type Compared = (
    Method,
    String,
    Option<Vec<u8>>,
    Vec<(&'static str, &'static str)>,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn everything_else_passes_through_as_the_cluster_answers_it() {
    let env = gate_env(&shared_zk().connect_string(), "pass", shared_es().url());
    let s = env.start("a");
    let g = gate(&s);
    let es = shared_es().url().trim_end_matches('/').to_string();
    let c = client();
    let index = format!("gate-pass-{}", uuid_tag());
    let (st, _, v) = send(
        &c,
        Method::PUT,
        &format!("{g}/{index}"),
        Some(r#"{"mappings":{"properties":{"t":{"type":"keyword"}}}}"#),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    for i in 0..3 {
        let (st, _, v) = send(
            &c,
            Method::PUT,
            &format!("{g}/{index}/_doc/{i}?refresh=true"),
            Some(&json!({"t": format!("v{i}")}).to_string()),
            &[],
        )
        .await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
    }
    // A new document with an id the cluster picks is passed through (nobody else can be
    // writing it): its version is the cluster's own.
    let (st, _, v) = send(
        &c,
        Method::POST,
        &format!("{g}/{index}/_doc?refresh=true"),
        Some(r#"{"t":"auto"}"#),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(v["_version"], 1, "{v}");

    let search = r#"{"query":{"term":{"t":"v1"}},"sort":[{"t":"asc"}]}"#;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(search.as_bytes()).unwrap();
    let gzipped = gz.finish().unwrap();
    let requests: Vec<Compared> = vec![
        (Method::GET, format!("/{index}/_doc/1"), None, vec![]),
        (Method::HEAD, format!("/{index}/_doc/1"), None, vec![]),
        (Method::GET, format!("/{index}/_doc/nope"), None, vec![]),
        (Method::GET, format!("/{index}/_mapping"), None, vec![]),
        (
            Method::GET,
            // This test's own index: the other tests of this binary write to theirs meanwhile.
            format!("/_cat/indices/{index}?h=index,docs.count&s=index"),
            None,
            vec![],
        ),
        (
            Method::POST,
            format!("/{index}/_search"),
            Some(search.as_bytes().to_vec()),
            vec![("content-type", "application/json")],
        ),
        (
            Method::POST,
            format!("/{index}/_search"),
            Some(gzipped),
            vec![
                ("content-type", "application/json"),
                ("content-encoding", "gzip"),
            ],
        ),
        (
            Method::POST,
            "/_mget".to_string(),
            Some(
                json!({"docs":[{"_index": index, "_id": "2"}]})
                    .to_string()
                    .into_bytes(),
            ),
            vec![("content-type", "application/json")],
        ),
        (
            Method::PUT,
            format!("/{index}/_mapping"),
            Some(br#"{"properties":{"n":{"type":"long"}}}"#.to_vec()),
            vec![("content-type", "application/json")],
        ),
    ];
    for (method, path, body, headers) in requests {
        let mut answers = Vec::new();
        for base in [&g, &es] {
            let mut r = c.request(method.clone(), format!("{base}{path}"));
            for (k, v) in &headers {
                r = r.header(*k, *v);
            }
            if let Some(b) = &body {
                r = r.body(b.clone());
            }
            let r = r.send().await.unwrap();
            let status = r.status();
            let content_type = r.headers().get("content-type").cloned();
            let product = r.headers().get("x-elastic-product").cloned();
            let mut bytes = r.bytes().await.unwrap().to_vec();
            if path.ends_with("_search") {
                // `took` is the only part of a search's answer that differs between two runs.
                let mut v: Value = serde_json::from_slice(&bytes).unwrap();
                v["took"] = json!(0);
                bytes = serde_json::to_vec(&v).unwrap();
            }
            answers.push((status, content_type, product, bytes));
        }
        assert_eq!(
            answers[0], answers[1],
            "{method} {path}: the gate answers as the cluster does"
        );
    }
    let m = scrape(&c, &s).await;
    assert!(
        m.get(r#"zkguard_gateway_requests_total{route="auto_id",outcome="passed"}"#)
            .copied()
            .unwrap_or(0.0)
            >= 1.0,
        "{m:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_alias_locks_its_write_index_and_guarded_writes_need_a_token_when_tokens_are_on() {
    let base = gate_env(&shared_zk().connect_string(), "alias", shared_es().url());
    let tokens = base.dir.path().join("tokens");
    std::fs::write(&tokens, "gate-test-token-0123456789abcdef0123456789\n").unwrap();
    let env = base.with("ZKGUARD_SERVER_AUTH_TOKENS_FILE", tokens.to_str().unwrap());
    let s = env.start("a");
    let g = gate(&s);
    let c = client();
    let token = [(
        "x-zkguard-token",
        "gate-test-token-0123456789abcdef0123456789",
    )];
    let index = format!("gate-alias-{}", uuid_tag());
    let concrete = format!("{index}-000001");
    // Pass-through needs no zkguard token (the cluster checks the caller's own credentials).
    let (st, _, v) = send(
        &c,
        Method::PUT,
        &format!("{g}/{concrete}"),
        Some(&json!({"aliases": {&index: {"is_write_index": true}}}).to_string()),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    // A guarded write does.
    let (st, _, v) = send(
        &c,
        Method::PUT,
        &format!("{g}/{index}/_doc/a"),
        Some(r#"{"n":1}"#),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "{v}");
    assert!(
        v["error"]["reason"]
            .as_str()
            .unwrap()
            .contains("X-Zkguard-Token"),
        "{v}"
    );
    let (st, _, v) = send(
        &c,
        Method::POST,
        &format!("{g}/_bulk"),
        Some(&format!(
            "{{\"index\":{{\"_index\":\"{index}\",\"_id\":\"a\"}}}}\n{{}}\n"
        )),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "{v}");
    let (st, h, v) = send(
        &c,
        Method::PUT,
        &format!("{g}/{index}/_doc/a"),
        Some(r#"{"n":1}"#),
        &token,
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(v["_index"], concrete.as_str(), "{v}");
    assert_eq!(v["_version"].as_u64(), Some(token_of(&h)));

    // The lock is the write index's: a holder of `{concrete}:a` keeps a write through the alias
    // waiting, and it is answered 429 (what the clients retry) when it waited long enough.
    let (holder, guard) = hold_lock(&env, &format!("{concrete}:a")).await;
    let (st, h, v) = send(
        &c,
        Method::PUT,
        &format!("{g}/{index}/_doc/a"),
        Some(r#"{"n":2}"#),
        &[token[0], ("x-zkguard-timeout", "0")],
    )
    .await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["error"]["type"], "es_rejected_execution_exception", "{v}");
    assert!(
        v["error"]["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("{concrete}:a")),
        "{v}"
    );
    assert!(h.get("retry-after").is_some());
    guard.unlock().await.unwrap();
    drop(holder);
    assert_eq!(
        es_doc(&c, &concrete, "a").await["_source"]["n"],
        1,
        "nothing was written"
    );
}

/// A `_bulk` to refuse: query string, body after a valid first item, and Elasticsearch's
/// answer (`None`: the cluster's).
type Case = (&'static str, &'static str, Option<(u16, &'static str)>);

/// What a refused request answered: its status and `error.type`.
fn refusal(status: StatusCode, v: &Value) -> (u16, String) {
    (
        status.as_u16(),
        v["error"]["type"].as_str().unwrap_or("(none)").to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bulk_elasticsearch_refuses_whole_is_refused_whole_and_nothing_is_locked_or_written() {
    let env = gate_env(&shared_zk().connect_string(), "strict", shared_es().url());
    let s = env.start("a");
    let g = gate(&s);
    let es = shared_es().url().trim_end_matches('/').to_string();
    let c = client();
    let tag = uuid_tag();
    let (guarded, plain) = (
        format!("gate-strict-{tag}"),
        format!("gate-strict-es-{tag}"),
    );
    // Each body starts with an item the gate would write; `{i}` is the index. `None`: the
    // gate answers what the cluster answers (an Elasticsearch-compatible server, strict as
    // Elasticsearch here); `Some`: Elasticsearch 9's answer, from its BulkRequestParser.
    let first = "{\"index\":{\"_index\":\"{i}\",\"_id\":\"first\"}}\n{\"n\":1}\n";
    let cases: Vec<Case> = vec![
        ("", "{\"index\":{\"_index\":\"{i}\",\"_id\":\"r\",\"_routing\":\"x\"}}\n{\"n\":1}\n", None),
        ("", "{\"index\":{\"_index\":\"{i}\",\"_id\":\"t\",\"_type\":\"_doc\"}}\n{\"n\":1}\n", None),
        ("", "{\"index\":{\"_index\":\"{i}\",\"_id\":\"v\",\"_version\":3}}\n{\"n\":1}\n", None),
        ("", "{\"index\":{\"_index\":\"{i}\",\"_idd\":\"x\"}}\n{\"n\":1}\n", None),
        ("", "{\"delete\":{\"_index\":\"{i}\",\"_id\":\"\"}}\n", None),
        ("", "{\"update\":{\"_index\":\"{i}\",\"_id\":\"\"}}\n{\"doc\":{}}\n", None),
        ("", "{\"upsert\":{\"_index\":\"{i}\",\"_id\":\"u\"}}\n{\"n\":1}\n", None),
        ("", "{\"index\":null}\n{\"n\":1}\n", None),
        ("", "[1]\n{\"n\":1}\n", None),
        ("", "{\"index\":{\"_index\":\"{i}\",\"_id\":\"a\",\"routing\":[\"x\"]}}\n{\"n\":1}\n", None),
        ("", "{\"update\":{\"_index\":\"{i}\",\"_id\":\"first\",\"version\":2}}\n{\"doc\":{}}\n", None),
        ("", "{\"update\":{\"_index\":\"{i}\",\"_id\":\"first\"}}\n{\"doc\":{},\"dco\":1}\n", None),
        ("", "{\"update\":{\"_index\":\"{i}\",\"_id\":\"first\"}}\n{\"detect_noop\":false}\n", None),
        ("", "{\"create\":{\"_index\":\"{i}\",\"_id\":\"c\",\"if_seq_no\":0,\"if_primary_term\":1}}\n{\"n\":1}\n", None),
        ("", "{\"index\":{\"_index\":\"{i}\",\"_id\":\"s\",\"if_seq_no\":\"x\",\"if_primary_term\":1}}\n{\"n\":1}\n", None),
        ("", "{\"index\":{\"_index\":\"{i}\",\"_id\":\"s\",\"if_seq_no\":-5,\"if_primary_term\":1}}\n{\"n\":1}\n", None),
        ("", "{\"index\":{\"_index\":\"{i}\",\"_id\":\"w\",\"version_type\":\"newest\"}}\n{\"n\":1}\n", None),
        ("", "{\"index\":{\"_index\":\"{i}\",\"_id\":\"p\",\"pipeline\":\"\"}}\n{\"n\":1}\n", None),
        ("", "{\"index\":{\"_index\":\"{i}\",\"_id\":\"nl\"}}\n{\"n\":1}", None),
        ("?refresh=true&pipline=x", "", None),
        ("?refresh=soon", "", None),
        ("", "{\"index\":{\"_index\":\"{i}\",\"_id\":\"m\"}\n{\"n\":1}\n", Some((400, "x_content_parse_exception"))),
        ("", "{\"index\":{\"_index\":\"{i}\",\"_id\":\"k\"},\"delete\":{}}\n{\"n\":1}\n", Some((400, "illegal_argument_exception"))),
        ("", "{\"index\":{\"_index\":\"{i}\",\"_id\":\"d\",\"_id\":\"e\"}}\n{\"n\":1}\n", Some((400, "x_content_parse_exception"))),
        ("", "{\"update\":{\"_index\":\"{i}\",\"_id\":\"first\",\"require_data_stream\":true}}\n{\"doc\":{}}\n", Some((400, "illegal_argument_exception"))),
        ("", "{\"index\":{\"_index\":\"{i}\",\"_id\":\"l\",\"list_executed_pipelines\":\"yes\"}}\n{\"n\":1}\n", Some((400, "illegal_argument_exception"))),
    ];
    for (query, rest, expected) in cases {
        let body = |i: &str| format!("{first}{rest}").replace("{i}", i);
        let (st, h, v) = send(
            &c,
            Method::POST,
            &format!("{g}/_bulk{query}"),
            Some(&body(&guarded)),
            &[],
        )
        .await;
        let got = refusal(st, &v);
        let want = match expected {
            Some((status, kind)) => (status, kind.to_string()),
            None => {
                let (st, _, v) = send(
                    &c,
                    Method::POST,
                    &format!("{es}/_bulk{query}"),
                    Some(&body(&plain)),
                    &[],
                )
                .await;
                refusal(st, &v)
            }
        };
        assert_eq!(got, want, "{query} {rest}: the gate answered {v}");
        assert!(h.get("x-elastic-product").is_some(), "{v}");
    }
    // Nothing was written (the guarded index was not even created) and no lock was asked for.
    let (st, v) = call(&c, Method::GET, &format!("{es}/{guarded}/_doc/first"), None).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    let m = scrape(&c, &s).await;
    let asked: f64 = m
        .iter()
        .filter(|(k, _)| k.starts_with("zkguard_lock_acquisitions_total"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(asked, 0.0, "no lock was taken: {m:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bulk_write_conditions_are_read_as_elasticsearch_reads_them_in_plain_and_atomic_bulks() {
    let env = gate_env(&shared_zk().connect_string(), "cond", shared_es().url()).with(
        "ZKGUARD_TXN_LOG_INDEX",
        &format!("gate-cond-log-{}", uuid_tag()),
    );
    let s = env.start("a");
    let index = format!("gate-cond-{}", uuid_tag());
    let out = python_script(
        "tests/support/gateway/bulk_conditions.py",
        "opensearch",
        &gate(&s),
        &index,
    )
    .await;
    let conflict = |action: &str| json!({"status": 200, "items": [[action, 409, "version_conflict_engine_exception"]]});
    let expected = json!([
        conflict("index"),
        {"status": 400, "type": "action_request_validation_exception"},
        conflict("create"),
    ]);
    assert_eq!(out["plain"], expected, "{out}");
    assert_eq!(out["atomic"], expected, "{out}");
    assert_eq!(
        out["final"],
        json!({"v": 2}),
        "the newer document stays: {out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn guarded_bulk_items_keep_their_pipeline_require_alias_and_source() {
    let env = gate_env(&shared_zk().connect_string(), "keys", shared_es().url()).with(
        "ZKGUARD_TXN_LOG_INDEX",
        &format!("gate-keys-log-{}", uuid_tag()),
    );
    let s = env.start("a");
    let g = gate(&s);
    let es = shared_es().url().trim_end_matches('/').to_string();
    let c = client();
    let tag = uuid_tag();
    let index = format!("gate-keys-{tag}");
    let bulk = |query: &str, body: String| {
        let (c, url) = (c.clone(), format!("{g}/_bulk{query}"));
        async move {
            let (st, _, v) = send(&c, Method::POST, &url, Some(&body), &[]).await;
            assert_eq!(st, StatusCode::OK, "{v}");
            v["items"][0]
                .as_object()
                .unwrap()
                .values()
                .next()
                .unwrap()
                .clone()
        }
    };
    // A pipeline goes with the fenced write: the cluster (which has none) refuses the item
    // instead of the document being written without it.
    for (query, meta) in [
        (
            "",
            json!({"_index": index, "_id": "p1", "pipeline": "zkguard-no-such-pipeline"}),
        ),
        (
            "?pipeline=zkguard-no-such-pipeline",
            json!({"_index": index, "_id": "p2"}),
        ),
    ] {
        let item = bulk(query, format!("{}\n{{\"n\":1}}\n", json!({"index": meta}))).await;
        assert_eq!(item["status"], 400, "{item}");
        assert!(
            item["error"]["reason"]
                .as_str()
                .unwrap()
                .contains("zkguard-no-such-pipeline"),
            "{item}"
        );
    }
    let (st, v) = call(&c, Method::GET, &format!("{es}/{index}/_doc/p1"), None).await;
    assert_ne!(st, StatusCode::OK, "written without its pipeline: {v}");

    // require_alias: a name that is not an alias fails the item as in Elasticsearch, and no
    // index is created; through an alias the item is written to its write index.
    let missing = format!("gate-keys-missing-{tag}");
    let item = bulk(
        "",
        format!(
            "{}\n{{\"n\":1}}\n",
            json!({"index": {"_index": missing, "_id": "a", "require_alias": true}})
        ),
    )
    .await;
    assert_eq!(item["status"], 404, "{item}");
    assert_eq!(item["error"]["type"], "index_not_found_exception", "{item}");
    let (st, _) = call(&c, Method::HEAD, &format!("{es}/{missing}"), None).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "require_alias created the index");
    let alias = format!("gate-keys-alias-{tag}");
    let (st, _, v) = send(
        &c,
        Method::PUT,
        &format!("{g}/{alias}-000001"),
        Some(&json!({"aliases": {&alias: {"is_write_index": true}}}).to_string()),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let item = bulk(
        "?require_alias=true",
        format!(
            "{}\n{{\"n\":1}}\n",
            json!({"index": {"_index": alias, "_id": "a"}})
        ),
    )
    .await;
    assert_eq!(item["status"], 201, "{item}");
    assert_eq!(item["_index"], format!("{alias}-000001"), "{item}");

    // An update's `_source` (action line or URL) answers `get`, as Elasticsearch does.
    let item = bulk(
        "",
        format!(
            "{}\n{{\"n\":1,\"m\":1}}\n",
            json!({"index": {"_index": index, "_id": "u"}})
        ),
    )
    .await;
    assert_eq!(item["status"], 201, "{item}");
    for (query, meta, source) in [
        (
            "",
            json!({"_index": index, "_id": "u", "_source": true}),
            json!({"n": 2, "m": 1}),
        ),
        (
            "",
            json!({"_index": index, "_id": "u", "_source": {"includes": ["n"]}}),
            json!({"n": 3}),
        ),
        (
            "?_source_excludes=n",
            json!({"_index": index, "_id": "u"}),
            json!({"m": 1}),
        ),
    ] {
        let n = source.get("n").cloned().unwrap_or(json!(4));
        let item = bulk(
            query,
            format!(
                "{}\n{}\n",
                json!({"update": meta}),
                json!({"doc": {"n": n}})
            ),
        )
        .await;
        assert_eq!(item["status"], 200, "{item}");
        assert_eq!(item["get"]["_source"], source, "{query} {meta}: {item}");
        assert_eq!(item["get"]["found"], true, "{item}");
    }

    // An empty `_id` fails its item (as in Elasticsearch), before any lock.
    let item = bulk(
        "",
        format!(
            "{}\n{{\"n\":1}}\n",
            json!({"index": {"_index": index, "_id": ""}})
        ),
    )
    .await;
    assert_eq!(item["status"], 400, "{item}");
    assert_eq!(
        item["error"]["type"], "illegal_argument_exception",
        "{item}"
    );

    // An atomic _bulk cannot carry a pipeline: refused whole, naming it.
    let body = format!(
        "{}\n{{\"n\":1}}\n",
        json!({"index": {"_index": index, "_id": "t", "pipeline": "x"}})
    );
    let (st, _, v) = send(
        &c,
        Method::POST,
        &format!("{g}/_bulk"),
        Some(&body),
        &[("x-zkguard-atomic", "true")],
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["error"]["reason"].as_str().unwrap().contains("pipeline"),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_single_document_routes_take_what_elasticsearch_takes_through_the_python_clients() {
    // `_update` body fields and the URL parameters of index, create, update and delete, as
    // opensearch-py and elasticsearch-py 8 send them: honoured with Elasticsearch's effect and
    // answer shape, or refused with its status and error type, nothing written.
    let front = Front::start_with(shared_es().url(), &["--plain-media-types"]);
    for (name, es, checks) in [
        ("opensearch", shared_es().url().to_string(), 24),
        ("elasticsearch", front.url.clone(), 9),
    ] {
        let env = gate_env(&shared_zk().connect_string(), name, &es);
        let s = env.start("a");
        let index = format!("gate-single-{name}-{}", uuid_tag());
        let summary =
            python_script("tests/support/gateway/single.py", name, &gate(&s), &index).await;
        assert!(
            summary["checks"].as_u64().unwrap() >= checks,
            "{name}: {summary}"
        );
    }
}

/// One request of [`guarded_single_writes_answer_as_the_cluster_answers`]: method, path and
/// query after `/{index}` (`{index}` is the index's name), body.
type Twin = (Method, &'static str, Option<&'static str>);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn guarded_single_writes_answer_as_the_cluster_answers() {
    // The same requests to a guarded index through the gate and to a twin index straight at
    // the cluster (osmem-server answers as Elasticsearch does): the same status and error
    // type, and on success the same `result`, `forced_refresh` and `get`.
    let env = gate_env(&shared_zk().connect_string(), "twin", shared_es().url());
    let s = env.start("a");
    let g = gate(&s);
    let es = shared_es().url().trim_end_matches('/').to_string();
    let c = client();
    let tag = uuid_tag();
    let (guarded, plain) = (format!("gate-twin-{tag}"), format!("plain-twin-{tag}"));
    for (base, index) in [(&g, &guarded), (&es, &plain)] {
        let (st, _, v) = send(
            &c,
            Method::PUT,
            &format!("{base}/{index}/_doc/1?refresh=true"),
            Some(r#"{"a":1,"b":{"c":2,"d":3}}"#),
            &[],
        )
        .await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
    }
    let cases: Vec<Twin> = vec![
        // _update: the body as UpdateRequest's parser and validation take it.
        (
            Method::POST,
            "/_update/1",
            Some(r#"{"dac":{"a":2},"upsert":{"a":0}}"#),
        ),
        (Method::POST, "/_update/1", Some(r#"{"doc":"x"}"#)),
        (
            Method::POST,
            "/_update/1",
            Some(r#"{"doc":{},"detect_noop":"x"}"#),
        ),
        (
            Method::POST,
            "/_update/1",
            Some(r#"{"doc_as_upsert":true}"#),
        ),
        (Method::POST, "/_update/1", None),
        (Method::POST, "/_update/nope", Some(r#"{"upsert":{"a":1}}"#)),
        (
            Method::POST,
            "/_update/nope",
            Some(r#"{"doc":{"a":1},"upsert":{"a":1},"if_seq_no":1}"#),
        ),
        (Method::POST, "/_update/nope", Some(r#"{"doc":{"a":1}}"#)),
        (
            Method::POST,
            "/_update/nope?if_seq_no=1&if_primary_term=1",
            Some(r#"{"doc":{"a":1}}"#),
        ),
        (
            Method::POST,
            "/_update/1?if_seq_no=999&if_primary_term=1",
            Some(r#"{"doc":{"a":5}}"#),
        ),
        (
            Method::POST,
            "/_update/1?if_seq_no=1",
            Some(r#"{"doc":{"a":5}}"#),
        ),
        (
            Method::POST,
            "/_update/1?if_seq_no=-5&if_primary_term=1",
            Some(r#"{"doc":{}}"#),
        ),
        (
            Method::POST,
            "/_update/1?retry_on_conflict=2&if_seq_no=1&if_primary_term=1",
            Some(r#"{"doc":{}}"#),
        ),
        (
            Method::POST,
            "/_update/1?retry_on_conflict=x",
            Some(r#"{"doc":{}}"#),
        ),
        (Method::POST, "/_update/1?version=3", Some(r#"{"doc":{}}"#)),
        (Method::POST, "/_update/1?pipeline=x", Some(r#"{"doc":{}}"#)),
        (
            Method::POST,
            "/_update/1?op_type=create",
            Some(r#"{"doc":{}}"#),
        ),
        (
            Method::POST,
            "/_update/1?refresh=bogus",
            Some(r#"{"doc":{}}"#),
        ),
        (
            Method::POST,
            "/_update/1?require_alias=yes",
            Some(r#"{"doc":{}}"#),
        ),
        (
            Method::POST,
            "/_update/1?require_alias=true",
            Some(r#"{"doc":{}}"#),
        ),
        (
            Method::POST,
            "/_update/1?refresh=true&_source_includes=a",
            Some(r#"{"doc":{"b":{"c":4}}}"#),
        ),
        (
            Method::POST,
            "/_update/1?_source=false",
            Some(r#"{"doc":{"e":3},"_source":"b"}"#),
        ),
        (
            Method::POST,
            "/_update/1?_source_excludes=b.c",
            Some(r#"{"doc":{"e":3}}"#),
        ),
        (
            Method::POST,
            "/_update/1",
            Some(r#"{"doc":{"e":3},"_source":{"includes":["b.*"],"excludes":["b.d"]}}"#),
        ),
        (
            Method::POST,
            "/_update/1?filter_path=result,get._source.e&_source=true",
            Some(r#"{"doc":{"e":4}}"#),
        ),
        // index and create.
        (Method::PUT, "/_doc/1?foo=1", Some(r#"{"a":1}"#)),
        (Method::PUT, "/_doc/1?op_type=bogus", Some(r#"{"a":1}"#)),
        (Method::PUT, "/_doc/1?if_seq_no=1", Some(r#"{"a":1}"#)),
        (
            Method::PUT,
            "/_doc/1?if_seq_no=999&if_primary_term=1",
            Some(r#"{"a":1}"#),
        ),
        (Method::PUT, "/_doc/1?refresh=bogus", Some(r#"{"a":1}"#)),
        (
            Method::PUT,
            "/_doc/1?require_alias=true",
            Some(r#"{"a":1}"#),
        ),
        (
            Method::PUT,
            "/_doc/1?retry_on_conflict=1",
            Some(r#"{"a":1}"#),
        ),
        (Method::PUT, "/_doc/1?_source=a", Some(r#"{"a":1}"#)),
        (
            Method::PUT,
            "/_doc/1?filter_path=result",
            Some(r#"{"a":1,"b":{"c":2,"d":3}}"#),
        ),
        (Method::PUT, "/_create/1", Some(r#"{"a":1}"#)),
        (Method::PUT, "/_create/1", None),
        (Method::PUT, "/_doc/1?pipeline=p", Some(r#"{"a":1}"#)),
        (
            Method::PUT,
            "/_doc/1?include_source_on_error=false",
            Some(r#"{"a":1}"#),
        ),
        (Method::PUT, "/_doc/1?op_type=CREATE", Some(r#"{"a":1}"#)),
        (
            Method::PUT,
            "/_doc/s1?source=%7B%22a%22%3A1%7D&source_content_type=application%2Fjson",
            None,
        ),
        (
            Method::PUT,
            "/_create/1?filter_path=error.type",
            Some(r#"{"a":1}"#),
        ),
        (
            Method::PUT,
            "/_create/n2?if_seq_no=1&if_primary_term=1",
            Some(r#"{"a":1}"#),
        ),
        (
            Method::PUT,
            "/_doc/n2?op_type=create&if_seq_no=1&if_primary_term=1",
            Some(r#"{"a":1}"#),
        ),
        (Method::PUT, "/_create/n2?op_type=index", Some(r#"{"a":1}"#)),
        (Method::PUT, "/_create/n2?lang=x", Some(r#"{"a":1}"#)),
        // delete.
        (
            Method::DELETE,
            "/_doc/nope?if_seq_no=1&if_primary_term=1",
            None,
        ),
        (Method::DELETE, "/_doc/1?foo=1", None),
        (Method::DELETE, "/_doc/1?pipeline=x", None),
        (Method::DELETE, "/_doc/1?refresh=bogus", None),
        (Method::DELETE, "/_doc/nope", None),
    ];
    let mut differ = Vec::new();
    for (method, rest, body) in &cases {
        let mut answers = Vec::new();
        for (base, index) in [(&g, &guarded), (&es, &plain)] {
            let url = format!("{base}/{index}{rest}");
            let (st, _, v) = send(&c, method.clone(), &url, *body, &[]).await;
            let mut seen = json!({
                "status": st.as_u16(),
                "type": v["error"]["type"],
                "result": v["result"],
                "forced_refresh": v["forced_refresh"],
                "get": v["get"]["_source"],
            });
            if rest.contains("filter_path") {
                // Elasticsearch filters answers, never errors.
                seen["whole"] = if st.is_success() {
                    v.clone()
                } else {
                    json!(v.as_object().map(|o| o.keys().collect::<Vec<_>>()))
                };
            }
            answers.push(seen);
        }
        if answers[0] != answers[1] {
            differ.push(format!(
                "{method} {rest}: gate {} cluster {}",
                answers[0], answers[1]
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "{} differ:\n{}",
        differ.len(),
        differ.join("\n")
    );
}

/// The gate's `host:port`.
fn gate_addr(s: &Service) -> String {
    s.started["gateway"].as_str().unwrap().to_string()
}

/// Sends the head of a `POST path` announcing `Content-Length: 1000` with
/// `Expect: 100-continue`, waits for the gate's `100 Continue` (the request is then being
/// handled, its connection busy), sends part of the body and stalls.
async fn stall_body(addr: &str, path: &str) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(n > 0, "{path}: closed before 100 Continue");
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 100"), "{path}: {text}");
    tcp.write_all(br#"{"index":{"_index":"st"#).await.unwrap();
    tcp
}

/// A body that stalls, on a guarded `_bulk` or a passed-through `_search`, is answered 408 and
/// its connection closed once `server.body.timeout` is over, as on the main listener; with the
/// gate's connection limit filled by such bodies a newcomer is refused, and once they time out
/// a new request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stalled_bodies_time_out_and_free_the_gates_connections() {
    const MAX: usize = 4;
    let body_timeout = Duration::from_millis(6000);
    let env = gate_env(&shared_zk().connect_string(), "stall", shared_es().url())
        .with("ZKGUARD_SERVER_MAX_CONNECTIONS", &MAX.to_string())
        .with(
            "ZKGUARD_SERVER_BODY_TIMEOUT",
            &body_timeout.as_millis().to_string(),
        )
        .with("ZKGUARD_SERVER_HEADER_TIMEOUT", "60000");
    let s = env.start("a");
    let a = gate_addr(&s);
    let index = format!("gate-stall-{}", uuid_tag());
    let started = Instant::now();
    let mut stalled = Vec::new();
    let search = format!("/{index}/_search");
    for path in ["/_bulk", search.as_str()].repeat(MAX / 2) {
        stalled.push((path, stall_body(&a, path).await));
    }
    // Every connection of the gate is busy: a newcomer is refused.
    let mut probe = TcpStream::connect(&a).await.unwrap();
    probe
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let refused = until_closed(probe).await;
    assert!(
        refused.starts_with("HTTP/1.1 503") && refused.contains("too_many_connections"),
        "{refused}"
    );
    let bound = body_timeout + Duration::from_secs(30);
    for (path, tcp) in stalled {
        let answer = tokio::time::timeout(bound, until_closed(tcp))
            .await
            .unwrap_or_else(|_| panic!("{path}: a stalled body kept its connection open"));
        assert!(answer.starts_with("HTTP/1.1 408"), "{path}: {answer}");
        assert!(answer.contains("server.body.timeout"), "{path}: {answer}");
        assert!(
            answer.to_lowercase().contains("connection: close"),
            "{path}: {answer}"
        );
    }
    assert!(
        started.elapsed() >= body_timeout,
        "answered before the body timeout"
    );
    let c = client();
    let (st, _, v) = send(&c, Method::GET, &format!("{}/", gate(&s)), None, &[]).await;
    assert_eq!(st, StatusCode::OK, "{v}");
}

/// A chunked body whose framing is broken is answered 400 with a reason, not 413; headers
/// that stop half-way are cut off after `server.header.timeout`, as on the main listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_chunked_body_is_answered_400() {
    let env = gate_env(&shared_zk().connect_string(), "chunks", shared_es().url())
        .with("ZKGUARD_SERVER_HEADER_TIMEOUT", "2000");
    let s = env.start("a");
    let a = gate_addr(&s);
    let mut half = TcpStream::connect(&a).await.unwrap();
    half.write_all(b"POST /_bulk HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let half = tokio::spawn(until_closed(half));
    let index = format!("gate-chunks-{}", uuid_tag());
    for path in [
        "/_bulk".to_string(),
        format!("/{index}/_doc/1"),
        format!("/{index}/_search"),
    ] {
        let mut tcp = TcpStream::connect(&a).await.unwrap();
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{{\"a\":\r\nzz-not-a-size\r\n"
        );
        tcp.write_all(request.as_bytes()).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(30), until_closed(tcp))
            .await
            .expect("answered");
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
        assert!(answer.contains("could not be read"), "{path}: {answer}");
    }
    let cut = tokio::time::timeout(Duration::from_secs(30), half)
        .await
        .expect("half-sent headers were cut off")
        .unwrap();
    assert!(!cut.starts_with("HTTP/1.1 2"), "{cut}");
}

/// A request sent to the gate: method, path and query, body, headers.
type Sent = (Method, String, String, Vec<(&'static str, &'static str)>);

/// An alias (or a pattern) that reaches one of zkguard's own indices is refused 403 like the
/// index's own name, on guarded and passed-through writes, single, bulk, atomic and by query;
/// reads pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aliases_of_zkguards_own_indices_are_refused_like_their_names() {
    let tag = uuid_tag();
    let own = format!("gate-own-{tag}-log");
    let guarded = format!("gate-own-{tag}-guarded");
    let plain = format!("gate-own-{tag}-plain");
    let env = gate_env(&shared_zk().connect_string(), "own", shared_es().url())
        .with("ZKGUARD_TXN_LOG_INDEX", &own)
        .with("ZKGUARD_SERVER_GATEWAY_INDICES", &format!("{guarded}*"));
    let s = env.start("a");
    let g = gate(&s);
    let es = shared_es().url().trim_end_matches('/').to_string();
    let c = client();
    let (st, _, v) = send(&c, Method::PUT, &format!("{es}/{own}"), Some("{}"), &[]).await;
    assert!(
        st == StatusCode::OK || v["error"]["type"] == "resource_already_exists_exception",
        "{v}"
    );
    let aliases = json!({"actions": [
        {"add": {"index": own, "alias": guarded}},
        {"add": {"index": own, "alias": plain}},
    ]});
    let (st, _, v) = send(
        &c,
        Method::POST,
        &format!("{g}/_aliases"),
        Some(&aliases.to_string()),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let bulk = |index: &str| {
        format!(
            "{{\"index\":{{\"_index\":\"{index}\",\"_id\":\"b\"}}}}\n{{}}\n{{\"index\":{{\"_index\":\"{index}\"}}}}\n{{}}\n"
        )
    };
    let refused: Vec<Sent> = vec![
        (
            Method::PUT,
            format!("/{guarded}/_doc/1"),
            "{}".into(),
            vec![],
        ),
        (Method::PUT, format!("/{plain}/_doc/1"), "{}".into(), vec![]),
        (Method::POST, format!("/{plain}/_doc"), "{}".into(), vec![]),
        (
            Method::POST,
            format!("/{own}/_delete_by_query"),
            r#"{"query":{"match_all":{}}}"#.into(),
            vec![],
        ),
        (
            Method::POST,
            format!("/{plain}/_delete_by_query"),
            r#"{"query":{"match_all":{}}}"#.into(),
            vec![],
        ),
        (
            Method::POST,
            format!("/gate-own-{tag}-p*/_update_by_query"),
            r#"{"query":{"match_all":{}}}"#.into(),
            vec![],
        ),
        (
            Method::POST,
            "/_reindex".into(),
            json!({"source": {"index": "elsewhere"}, "dest": {"index": plain}}).to_string(),
            vec![],
        ),
        (
            Method::POST,
            "/_bulk".into(),
            bulk(&guarded),
            vec![("x-zkguard-atomic", "true")],
        ),
    ];
    for (method, path, body, headers) in refused {
        let (st, _, v) = send(&c, method, &format!("{g}{path}"), Some(&body), &headers).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{path}: {v}");
        assert_eq!(v["error"]["type"], "security_exception", "{path}: {v}");
        let reason = v["error"]["reason"].as_str().unwrap();
        assert!(reason.contains(&own), "{path}: {reason}");
    }
    for index in [&guarded, &plain] {
        let (st, _, v) = send(
            &c,
            Method::POST,
            &format!("{g}/_bulk?filter_path=errors,items.*.status"),
            Some(&bulk(index)),
            &[],
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert_eq!(
            v,
            json!({"errors": true, "items": [{"index": {"status": 403}}, {"index": {"status": 403}}]}),
            "{index}"
        );
    }
    // Reads pass through.
    let (st, _, v) = send(
        &c,
        Method::POST,
        &format!("{g}/{plain}/_search"),
        Some("{}"),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (st, _, v) = send(&c, Method::GET, &format!("{es}/{own}/_count"), None, &[]).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["count"], 0, "nothing was written to {own}");
}

/// A `_bulk` item whose lock was lost before its write was sent (nothing written) answers 429
/// with `Retry-After`, what the official bulk helpers retry: elasticsearch-py's
/// `helpers.streaming_bulk` (with `max_retries`) sends it again and it is written. The loss is
/// made deterministic: the gate's read under the lock waits at the front while the gate's
/// ZooKeeper server answers nothing (its answers held by a proxy) until the grace has run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bulk_item_whose_lock_was_lost_answers_429_and_the_python_helper_retries_it() {
    let front = Front::start_with(shared_es().url(), &["--plain-media-types"]);
    let proxy = zkguard::testkit::proxy::ZkProxy::start(&shared_zk().connect_string());
    // A short grace within a long session: the lock counts as lost long before the client
    // gives up on its silent connection (2/5 of the session timeout) and reconnects.
    let env = gate_env(&proxy.connect_string(), "lost", &front.url)
        .with("ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT", "10000")
        .with("ZKGUARD_ZOOKEEPER_LOCK_LOSS_GRACE", "300");
    let s = env.start("a");
    let g = gate(&s);
    let c = client();
    let index = format!("gate-lost-{}", uuid_tag());
    let (st, _, v) = send(
        &c,
        Method::PUT,
        &format!("{g}/{index}/_doc/d"),
        Some(r#"{"z":0}"#),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");

    // The helper's first `_bulk` takes the lock of `d` and its read of `d` waits at the front.
    front.hold_reads().await;
    let helper = {
        let (g, index) = (g.clone(), index.clone());
        tokio::spawn(async move {
            python_script(
                "tests/support/gateway/retry.py",
                "elasticsearch",
                &g,
                &index,
            )
            .await
        })
    };
    eventually(
        Duration::from_secs(30),
        "the gate reads d under its lock",
        || async { front.held_reads().await == 1 },
    )
    .await;
    // From the answer to the session's next confirmation on, ZooKeeper answers nothing: the
    // grace runs out and the lock counts as lost.
    proxy.hold_after(zkguard::testkit::proxy::OP_SYNC);
    eventually(
        Duration::from_secs(30),
        "the gate's lock counts as lost",
        || async { s.log().contains("lock counts as lost") },
    )
    .await;
    proxy.release_held();
    front.release_reads().await;

    let out = helper.await.unwrap();
    let answers = out["answers"].as_array().unwrap();
    let first = &answers[0];
    assert_eq!(
        first["items"],
        json!([
            [429, "zkguard_lock_lost_exception"],
            [429, "zkguard_lock_lost_exception"],
            [429, "zkguard_lock_lost_exception"]
        ]),
        "{out}"
    );
    assert_eq!(first["retry_after"], "1", "{out}");
    assert!(
        answers.len() >= 2,
        "the helper sent the refused items again: {out}"
    );
    assert_eq!(
        out["results"],
        json!([[true, 200, null], [true, 200, null], [true, 200, null]]),
        "{out}"
    );
    let doc = es_doc(&c, &index, "d").await;
    assert_eq!(doc["_source"]["a"], 0, "{doc}");
    assert_eq!(doc["_source"]["b"], 1, "{doc}");
    assert_eq!(doc["_source"]["c"], 2, "{doc}");
    assert!(doc["_version"].as_u64().unwrap() >= MIN_TOKEN, "{doc}");
}

/// Ids `.` and `..` on the single-document routes are documents, as Elasticsearch takes them
/// (and as `_bulk` takes them through the gate): guarded, fenced with the lock's token and
/// answered in the document route's shape; a delete of `..` deletes that document, not the
/// index; no answer shows a request of the gate's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ids_dot_and_dot_dot_are_documents_on_the_single_document_routes() {
    let env = gate_env(&shared_zk().connect_string(), "dots", shared_es().url())
        .with("ZKGUARD_SERVER_GATEWAY_INDICES", "gate-dots-*");
    let s = env.start("a");
    let (g, addr) = (gate(&s), gate_addr(&s));
    let c = client();
    let index = format!("gate-dots-{}", uuid_tag());
    let (st, _, _) = send(
        &c,
        Method::PUT,
        &format!("{g}/{index}/_doc/keep?refresh=true"),
        Some(r#"{"k":1}"#),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    for id in [".", ".."] {
        let (st, v) = raw(
            &addr,
            "PUT",
            &format!("/{index}/_doc/{id}?refresh=true"),
            Some("{\"a\":\n1}"),
        )
        .await;
        assert_eq!(
            (st, &v["_id"], &v["result"]),
            (201, &json!(id), &json!("created")),
            "{id}: {v}"
        );
        assert!(v["_version"].as_u64().unwrap() >= MIN_TOKEN, "{id}: {v}");
        assert!(v.get("status").is_none(), "{id}: {v}");
        let (st, v) = raw(
            &addr,
            "POST",
            &format!("/{index}/_update/{id}?refresh=true"),
            Some(r#"{"doc":{"b":2}}"#),
        )
        .await;
        assert_eq!((st, &v["result"]), (200, &json!("updated")), "{id}: {v}");
        let (st, v) = raw(&addr, "PUT", &format!("/{index}/_create/{id}"), Some("{}")).await;
        assert_eq!(st, 409, "{id}: {v}");
        assert_eq!(
            v["error"]["type"], "version_conflict_engine_exception",
            "{id}: {v}"
        );
        let text = v.to_string();
        assert!(
            !text.contains("realtime") && !text.contains("version_type"),
            "{id}: {text}"
        );
    }
    let mget = r#"{"docs":[{"_id":"."},{"_id":".."},{"_id":"keep"}]}"#;
    let (_, _, v) = send(
        &c,
        Method::POST,
        &format!("{g}/{index}/_mget"),
        Some(mget),
        &[],
    )
    .await;
    for (i, want) in [
        json!({"a": 1, "b": 2}),
        json!({"a": 1, "b": 2}),
        json!({"k": 1}),
    ]
    .iter()
    .enumerate()
    {
        let mut src = v["docs"][i]["_source"].clone();
        if let Some(o) = src.as_object_mut() {
            o.remove("zkguard");
        }
        assert_eq!(&src, want, "{v}");
    }
    let (st, v) = raw(
        &addr,
        "DELETE",
        &format!("/{index}/_doc/..?refresh=true"),
        None,
    )
    .await;
    assert_eq!(
        (st, &v["result"], &v["_id"]),
        (200, &json!("deleted"), &json!("..")),
        "{v}"
    );
    let (st, v) = raw(
        &addr,
        "DELETE",
        &format!("/{index}/_doc/..?refresh=true"),
        None,
    )
    .await;
    assert_eq!((st, &v["result"]), (404, &json!("not_found")), "{v}");
    let (_, _, v) = send(
        &c,
        Method::POST,
        &format!("{g}/{index}/_mget"),
        Some(mget),
        &[],
    )
    .await;
    assert_eq!(
        (
            &v["docs"][0]["found"],
            &v["docs"][1]["found"],
            &v["docs"][2]["found"]
        ),
        (&json!(true), &json!(false), &json!(true)),
        "{v}"
    );
    // What passes through (a read, a write to an index the gate does not guard) cannot carry
    // such a path unchanged: refused, saying so, rather than sent to another path.
    let (st, v) = raw(&addr, "GET", &format!("/{index}/_doc/%2e"), None).await;
    assert_eq!(
        (st, &v["error"]["type"]),
        (400, &json!("illegal_argument_exception")),
        "{v}"
    );
    assert!(
        v["error"]["reason"].as_str().unwrap().contains("_mget"),
        "{v}"
    );
    let open = format!("open-dots-{}", uuid_tag());
    let (st, _, _) = send(
        &c,
        Method::PUT,
        &format!("{g}/{open}/_doc/1?refresh=true"),
        Some("{}"),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, v) = raw(&addr, "DELETE", &format!("/{open}/_doc/.."), None).await;
    assert_eq!(st, 400, "{v}");
    let (st, _, _) = send(&c, Method::GET, &format!("{g}/{open}/_doc/1"), None, &[]).await;
    assert_eq!(st, StatusCode::OK, "the index is still there");
}

/// A raw request straight to the cluster (bodies the test must send byte for byte).
async fn raw_to_cluster(
    c: &reqwest::Client,
    method: Method,
    url: &str,
    body: String,
) -> (StatusCode, String) {
    let r = c
        .request(method, url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    (r.status(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stored_document_the_gate_cannot_read_is_an_error_never_absent() {
    let env = gate_env(&shared_zk().connect_string(), "unread", shared_es().url());
    let s = env.start("a");
    let g = gate(&s);
    let es = shared_es().url().trim_end_matches('/').to_string();
    let c = client();
    let index = format!("gate-unread-{}", uuid_tag());
    let (st, v) = raw_to_cluster(
        &c,
        Method::PUT,
        &format!("{es}/{index}"),
        json!({"settings": {"index.mapping.depth.limit": 1000}}).to_string(),
    )
    .await;
    assert!(st.is_success(), "{v}");
    // A lone surrogate (which serde_json refuses) and nesting deeper than its 128 levels,
    // written straight to the cluster, which stores them as sent.
    let deep = format!("{}1{}", "{\"d\":".repeat(200), "}".repeat(200));
    let stored = [
        ("surrogate", r#"{"s":"\ud800"}"#.to_string()),
        ("deep", deep),
    ];
    for (id, body) in &stored {
        let (st, v) = raw_to_cluster(
            &c,
            Method::PUT,
            &format!("{es}/{index}/_doc/{id}"),
            body.clone(),
        )
        .await;
        assert!(st.is_success(), "{v}");
    }
    let version = |text: &str| {
        let at = text.find("\"_version\":").expect("a version") + 11;
        text[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
    };
    for (id, _) in &stored {
        let refused = |st: StatusCode, v: &Value, what: &str| {
            assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{what} {id}: {v}");
            assert_eq!(
                v["error"]["type"], "zkguard_unreadable_document_exception",
                "{what} {id}: {v}"
            );
            let reason = v["error"]["reason"].as_str().unwrap_or_default();
            assert!(
                reason.contains(&format!("[{index}/{id}]")),
                "{what} {id}: {v}"
            );
        };
        let (st, _, v) = send(
            &c,
            Method::PUT,
            &format!("{g}/{index}/_create/{id}"),
            Some(r#"{"n":1}"#),
            &[],
        )
        .await;
        refused(st, &v, "_create");
        let upsert = r#"{"doc":{"n":1},"doc_as_upsert":true}"#;
        let (st, _, v) = send(
            &c,
            Method::POST,
            &format!("{g}/{index}/_update/{id}"),
            Some(upsert),
            &[],
        )
        .await;
        refused(st, &v, "_update doc_as_upsert");
        let (st, _, v) = send(
            &c,
            Method::POST,
            &format!("{g}/{index}/_update/{id}"),
            Some(r#"{"doc":{"n":1}}"#),
            &[],
        )
        .await;
        refused(st, &v, "_update");
        // In a _bulk the unreadable document fails its own items; a valid item beside them
        // (read in the same _mget) is written.
        let bulk = format!(
            "{{\"create\":{{\"_index\":\"{index}\",\"_id\":\"{id}\"}}}}\n{{\"n\":1}}\n\
             {{\"update\":{{\"_index\":\"{index}\",\"_id\":\"{id}\"}}}}\n{upsert}\n\
             {{\"create\":{{\"_index\":\"{index}\",\"_id\":\"ok-{id}\"}}}}\n{{\"n\":1}}\n"
        );
        let (st, _, v) = send(&c, Method::POST, &format!("{g}/_bulk"), Some(&bulk), &[]).await;
        assert_eq!(st, StatusCode::OK, "{v}");
        for (k, action) in ["create", "update"].into_iter().enumerate() {
            let item = &v["items"][k][action];
            assert_eq!(item["status"], 422, "bulk {action} {id}: {v}");
            assert_eq!(
                item["error"]["type"], "zkguard_unreadable_document_exception",
                "{v}"
            );
        }
        assert_eq!(v["items"][2]["create"]["status"], 201, "{v}");
        // The stored document is as it was.
        let (_, text) = raw_to_cluster(
            &c,
            Method::GET,
            &format!("{es}/{index}/_doc/{id}"),
            String::new(),
        )
        .await;
        assert_eq!(version(&text), "1", "{id} was not rewritten: {text}");
    }
    dot_ids_the_gate_cannot_read_are_refused_alike(&c, &g, &es, &index, &stored).await;
}

/// Ids `.` and `..` (read under the lock with an `_mget`) holding a document the gate cannot
/// parse: refused 422 as every other id, not 503 (which clients retry in vain); nothing
/// rewritten.
async fn dot_ids_the_gate_cannot_read_are_refused_alike(
    c: &reqwest::Client,
    g: &str,
    es: &str,
    index: &str,
    stored: &[(&str, String)],
) {
    let addr = g.trim_start_matches("http://");
    for ((_, body), id) in stored.iter().zip([".", ".."]) {
        // A path cannot carry these ids: stored with a one-item _bulk, as sent.
        let bulk = format!("{{\"index\":{{\"_index\":\"{index}\",\"_id\":\"{id}\"}}}}\n{body}\n");
        let (st, text) = raw_to_cluster(c, Method::POST, &format!("{es}/_bulk"), bulk).await;
        assert!(
            st.is_success() && !text.contains("\"errors\":true"),
            "{text}"
        );
        let upsert = r#"{"doc":{"n":1},"doc_as_upsert":true}"#;
        for (method, path, body) in [
            ("PUT", format!("/{index}/_create/{id}"), r#"{"n":1}"#),
            ("POST", format!("/{index}/_update/{id}"), upsert),
            (
                "POST",
                format!("/{index}/_update/{id}"),
                r#"{"doc":{"n":1}}"#,
            ),
        ] {
            let (st, v) = raw(addr, method, &path, Some(body)).await;
            assert_eq!(
                (st, &v["error"]["type"]),
                (422, &json!("zkguard_unreadable_document_exception")),
                "{method} {path}: {v}"
            );
            let reason = v["error"]["reason"].as_str().unwrap_or_default();
            assert!(reason.contains(&format!("[{index}/{id}]")), "{v}");
        }
        let mget = json!({"docs": [{"_id": id}]}).to_string();
        let (_, text) = raw_to_cluster(c, Method::POST, &format!("{es}/{index}/_mget"), mget).await;
        let at = text.find("\"_version\":").expect("a version") + 11;
        assert!(
            text[at..].starts_with('1')
                && !text[at + 1..].starts_with(|c: char| c.is_ascii_digit()),
            "{id} was not rewritten: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_item_fails_alone_as_the_cluster_fails_it() {
    let env = gate_env(
        &shared_zk().connect_string(),
        "malformed",
        shared_es().url(),
    );
    let s = env.start("a");
    let g = gate(&s);
    let es = shared_es().url().trim_end_matches('/').to_string();
    let c = client();
    let tag = uuid_tag();
    let body = |i: &str| {
        format!(
            "{{\"index\":{{\"_index\":\"{i}\",\"_id\":\"a\"}}}}\n{{\"n\":1}}\n\
             {{\"index\":{{\"_index\":\"{i}\",\"_id\":\"b\"}}}}\n{{\"n\":\n\
             {{\"create\":{{\"_index\":\"{i}\",\"_id\":\"c\"}}}}\n[1]\n\
             {{\"index\":{{\"_index\":\"{i}\",\"_id\":\"d\"}}}}\n{{\"n\":2}}\n"
        )
    };
    let seen = |v: &Value| -> Vec<(u64, Value)> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                let inner = i.as_object().unwrap().values().next().unwrap();
                (
                    inner["status"].as_u64().unwrap(),
                    inner["error"]["type"].clone(),
                )
            })
            .collect()
    };
    let (st, _, through) = send(
        &c,
        Method::POST,
        &format!("{g}/_bulk"),
        Some(&body(&format!("gate-bad-{tag}"))),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{through}");
    let (st, _, straight) = send(
        &c,
        Method::POST,
        &format!("{es}/_bulk"),
        Some(&body(&format!("gate-bad-es-{tag}"))),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{straight}");
    assert_eq!(
        seen(&through),
        seen(&straight),
        "gate {through}\ncluster {straight}"
    );
    assert_eq!(seen(&through)[0].0, 201, "{through}");
    assert_eq!(seen(&through)[1].0, 400, "{through}");
}

/// The peak resident memory of process `pid` so far (`VmHWM`), in bytes.
fn peak_memory(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .expect("VmHWM in /proc/PID/status");
    kb.trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// Items per `_bulk` of the memory test, and how many run at once.
const MEMORY_ITEMS: usize = 25_000;
const MEMORY_BULKS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_large_bulks_stay_within_a_memory_bound() {
    let env = gate_env(&shared_zk().connect_string(), "mem", shared_es().url());
    let s = env.start("a");
    let g = gate(&s);
    let c = client();
    let tag = uuid_tag();
    let before = peak_memory(s.child.id());
    let started = std::time::Instant::now();
    let runs: Vec<_> = (0..MEMORY_BULKS)
        .map(|b| {
            let index = format!("gate-mem-{tag}-{b}");
            let mut body = String::with_capacity(MEMORY_ITEMS * 40);
            for k in 0..MEMORY_ITEMS {
                body.push_str(&format!("{{\"index\":{{\"_id\":\"{k}\"}}}}\n{{\"n\":1}}\n"));
            }
            let (c, url) = (c.clone(), format!("{g}/{index}/_bulk"));
            tokio::spawn(async move {
                let r = c
                    .post(url)
                    .header("content-type", "application/x-ndjson")
                    .header("x-zkguard-lock-type", "background")
                    .body(body)
                    .send()
                    .await
                    .unwrap();
                let status = r.status();
                let v: Value = r.json().await.unwrap_or(Value::Null);
                (status, v)
            })
        })
        .collect();
    let mut answers = Vec::new();
    for run in runs {
        answers.push(run.await.unwrap());
    }
    let peak = peak_memory(s.child.id());
    let written = |(status, v): &(StatusCode, Value)| {
        let items = v["items"].as_array().map_or(&[][..], Vec::as_slice);
        (*status == StatusCode::OK).then_some(
            items
                .iter()
                .filter(|i| (200..300).contains(&i["index"]["status"].as_u64().unwrap_or(0)))
                .count(),
        )
    };
    let counts: Vec<_> = answers.iter().map(written).collect();
    let failed = answers.iter().find_map(|(_, v)| {
        v["items"]
            .as_array()?
            .iter()
            .find(|i| i["index"]["error"].is_object())
            .cloned()
    });
    eprintln!(
        "{MEMORY_BULKS} bulks of {MEMORY_ITEMS} items: peak {} MB (at start {} MB), {:?}, written {counts:?} (a failure: {failed:?})",
        peak >> 20,
        before >> 20,
        started.elapsed()
    );
    assert!(peak < 600 << 20, "the service peaked at {} MB", peak >> 20);
    // Every item is written, or answered with what a client retries (a lock that did not come
    // in time or was lost on a loaded machine: nothing written).
    for (status, v) in &answers {
        assert_eq!(*status, StatusCode::OK, "{v}");
        let items = v["items"].as_array().unwrap();
        assert_eq!(items.len(), MEMORY_ITEMS);
        for i in items {
            let st = i["index"]["status"].as_u64().unwrap_or(0);
            assert!(matches!(st, 201 | 429 | 503), "{i}");
        }
    }
    let total: usize = counts.iter().flatten().sum();
    assert!(total > MEMORY_BULKS * MEMORY_ITEMS / 2, "{counts:?}");

    // Four concurrent bulks of 100,000 items, beyond server.gateway.bulk.max.items: each is
    // refused whole (413, naming the key) while it is parsed, before anything is locked, and
    // the service's peak stays where the accepted bulks left it (before the bound, four such
    // bulks peaked at 5 GB).
    let huge: Vec<_> = (0..MEMORY_BULKS)
        .map(|b| {
            let mut body = String::with_capacity(100_000 * 40);
            for k in 0..100_000 {
                body.push_str(&format!("{{\"index\":{{\"_id\":\"{k}\"}}}}\n{{\"n\":1}}\n"));
            }
            let (c, url) = (c.clone(), format!("{g}/gate-mem-{tag}-huge-{b}/_bulk"));
            tokio::spawn(async move {
                let r = c
                    .post(url)
                    .header("content-type", "application/x-ndjson")
                    .body(body)
                    .send()
                    .await
                    .unwrap();
                (r.status(), r.text().await.unwrap_or_default())
            })
        })
        .collect();
    for run in huge {
        let (status, text) = run.await.unwrap();
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{text}");
        assert!(text.contains("server.gateway.bulk.max.items"), "{text}");
    }
    let after = peak_memory(s.child.id());
    eprintln!(
        "{MEMORY_BULKS} bulks of 100000 items: peak {} MB",
        after >> 20
    );
    assert!(
        after < 600 << 20,
        "the service peaked at {} MB",
        after >> 20
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bulks_beyond_the_gates_limits_are_refused_before_anything_is_locked() {
    let env = gate_env(&shared_zk().connect_string(), "limits", shared_es().url())
        .with("ZKGUARD_SERVER_GATEWAY_BULK_MAX_CONCURRENT", "1")
        .with("ZKGUARD_SERVER_GATEWAY_BULK_MAX_ITEMS", "3");
    let s = env.start("a");
    let g = gate(&s);
    let es = shared_es().url().trim_end_matches('/').to_string();
    let c = client();
    let index = format!("gate-limits-{}", uuid_tag());
    let items = |ids: &[&str]| -> String {
        ids.iter()
            .map(|id| {
                format!("{{\"index\":{{\"_index\":\"{index}\",\"_id\":\"{id}\"}}}}\n{{\"n\":1}}\n")
            })
            .collect()
    };
    let locks_taken = |m: &HashMap<String, f64>| -> f64 {
        m.iter()
            .filter(|(k, _)| k.starts_with("zkguard_lock_acquisitions_total"))
            .map(|(_, v)| v)
            .sum()
    };
    // More items than server.gateway.bulk.max.items: 413, as Elasticsearch answers a request
    // over its size limit (retrying it cannot help).
    let (st, _, v) = send(
        &c,
        Method::POST,
        &format!("{g}/_bulk"),
        Some(&items(&["a", "b", "c", "d"])),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert!(
        v["error"]["reason"]
            .as_str()
            .unwrap()
            .contains("server.gateway.bulk.max.items"),
        "{v}"
    );
    assert_eq!(locks_taken(&scrape(&c, &s).await), 0.0);

    // One bulk waits for a lock another writer holds: a second bulk is beyond
    // server.gateway.bulk.max.concurrent: after its wait (its X-Zkguard-Timeout) it gets 429
    // with Retry-After, nothing locked or written.
    let monitor = zkguard::lock::document_monitor(&index, "held");
    let (_holder, guard) = hold_lock(&env, &monitor).await;
    let first = tokio::spawn({
        let (c, url, body) = (c.clone(), format!("{g}/_bulk"), items(&["held"]));
        async move {
            send(
                &c,
                Method::POST,
                &url,
                Some(&body),
                &[("x-zkguard-timeout", "20s")],
            )
            .await
        }
    });
    eventually(
        Duration::from_secs(20),
        "the first bulk queues for its lock",
        || {
            let (zk, root, monitor) = (env.zk.clone(), env.root.clone(), monitor.clone());
            async move {
                let out = crate::cli::zkguard()
                    .args(["locks", "--json", "--monitor", &monitor])
                    .env("ZKGUARD_ZOOKEEPER_SERVERS", &zk)
                    .env("ZKGUARD_ZOOKEEPER_LOCK_ROOT", &root)
                    .output()
                    .unwrap();
                String::from_utf8_lossy(&out.stdout).contains("gateway bulk index")
            }
        },
    )
    .await;
    let (st, h, v) = send(
        &c,
        Method::POST,
        &format!("{g}/_bulk"),
        Some(&items(&["x1", "x2"])),
        &[("x-zkguard-timeout", "300ms")],
    )
    .await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["error"]["type"], "es_rejected_execution_exception", "{v}");
    assert!(h.get("retry-after").is_some(), "{h:?}");
    assert!(
        v["error"]["reason"]
            .as_str()
            .unwrap()
            .contains("server.gateway.bulk.max.concurrent"),
        "{v}"
    );
    assert_eq!(
        locks_taken(&scrape(&c, &s).await),
        0.0,
        "the refused bulk took no lock"
    );
    let (st, text) = raw_to_cluster(
        &c,
        Method::GET,
        &format!("{es}/{index}/_doc/x1"),
        String::new(),
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{text}");
    // Single-document writes are not held up by the bulks' limit.
    let (st, _, v) = send(
        &c,
        Method::PUT,
        &format!("{g}/{index}/_doc/single"),
        Some(r#"{"n":1}"#),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");

    guard.unlock().await.unwrap();
    let (st, _, v) = first.await.unwrap();
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["items"][0]["index"]["status"], 201, "{v}");
    let (st, _, v) = send(
        &c,
        Method::POST,
        &format!("{g}/_bulk"),
        Some(&items(&["x1", "x2"])),
        &[],
    )
    .await;
    assert_eq!(
        st,
        StatusCode::OK,
        "once the first is done the next bulk is handled: {v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_atomic_bulk_and_a_transaction_are_bounded_by_the_request_timeout() {
    let front = Front::start(shared_es().url());
    let env = gate_env(&shared_zk().connect_string(), "atomic-timeout", &front.url)
        .with("ZKGUARD_SERVER_REQUEST_TIMEOUT", "3000")
        .with(
            "ZKGUARD_TXN_LOG_INDEX",
            &format!("gate-tmo-log-{}", uuid_tag()),
        );
    let s = env.start("a");
    let g = gate(&s);
    let c = client();
    let index = format!("gate-tmo-{}", uuid_tag());
    // A first write creates the index, then the cluster holds every fenced write.
    let (st, _, v) = send(
        &c,
        Method::PUT,
        &format!("{g}/{index}/_doc/seed"),
        Some(r#"{"n":0}"#),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    front.hold().await;
    let key = format!("atomic-{}", uuid_tag());
    let body = format!(
        "{{\"index\":{{\"_index\":\"{index}\",\"_id\":\"a\"}}}}\n{{\"n\":1}}\n\
         {{\"index\":{{\"_index\":\"{index}\",\"_id\":\"b\"}}}}\n{{\"n\":1}}\n"
    );
    let asked = std::time::Instant::now();
    let (st, h, v) = send(
        &c,
        Method::POST,
        &format!("{g}/_bulk"),
        Some(&body),
        &[("x-zkguard-atomic", "true"), ("idempotency-key", &key)],
    )
    .await;
    let took = asked.elapsed();
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE, "after {took:?}: {v}");
    assert_eq!(
        v["error"]["type"], "zkguard_request_timeout_exception",
        "{v}"
    );
    let reason = v["error"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("server.request.timeout") && reason.contains(&key),
        "{v}"
    );
    assert!(h.get("retry-after").is_some(), "{h:?}");
    assert!(took < Duration::from_secs(20), "answered after {took:?}");

    // /v1/transactions answers its own timeout naming the transaction's id, not an op_id.
    let txn = json!({"id": format!("v1-{key}"), "operations": [
        {"action": "index", "index": index, "id": "c", "doc": {"n": 1}}
    ]});
    let (st, v) = call(
        &c,
        Method::POST,
        &s.url("/v1/transactions"),
        Some(txn.to_string()),
    )
    .await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    let message = v.to_string();
    assert!(message.contains("request_timeout"), "{v}");
    assert!(
        !message.contains("op_id") && message.contains("same id"),
        "{v}"
    );

    // Let the writes through: the abandoned transaction is decided on its own.
    front.release().await;
    eventually(
        Duration::from_secs(30),
        "the atomic bulk's transaction is decided",
        || {
            let (c, url) = (c.clone(), s.url(&format!("/v1/transactions/{key}")));
            async move {
                let (st, v) = call(&c, Method::GET, &url, None).await;
                st == StatusCode::OK && v["decision"] == "committed"
            }
        },
    )
    .await;
}

/// Whether a lock request whose info contains `info` waits on (or holds) `monitor`, as
/// `zkguard locks` reports it.
fn lock_listed(env: &Env, monitor: &str, info: &str) -> bool {
    let out = crate::cli::zkguard()
        .args(["locks", "--json", "--monitor", monitor])
        .env("ZKGUARD_ZOOKEEPER_SERVERS", &env.zk)
        .env("ZKGUARD_ZOOKEEPER_LOCK_ROOT", &env.root)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).contains(info)
}

/// A single-document write (index, create, update, delete) is answered within
/// `server.request.timeout`, as `/v1` and the atomic `_bulk` are. Waiting for a lock another
/// holder keeps, even asking for a longer wait, it gets 429 (the lock wait stays within the
/// timeout); once the lock comes, a read under it that the cluster does not answer ends at the
/// timeout with 503 `zkguard_request_timeout_exception` and `Retry-After`, the lock released
/// and nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_single_write_waiting_for_a_held_lock_ends_by_the_request_timeout() {
    let front = Front::start(shared_es().url());
    let env = gate_env(&shared_zk().connect_string(), "single-timeout", &front.url)
        .with("ZKGUARD_SERVER_REQUEST_TIMEOUT", "5000");
    let s = env.start("a");
    let g = gate(&s);
    let c = client();
    let index = format!("gate-single-tmo-{}", uuid_tag());
    let (st, _, v) = send(
        &c,
        Method::PUT,
        &format!("{g}/{index}/_doc/held"),
        Some(r#"{"n":0}"#),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let stored = es_doc(&c, &index, "held").await;
    let monitor = zkguard::lock::document_monitor(&index, "held");
    let (_holder, guard) = hold_lock(&env, &monitor).await;
    for (method, path, body) in [
        (Method::PUT, "_doc/held", Some(r#"{"n":1}"#)),
        (Method::DELETE, "_doc/held", None),
    ] {
        let asked = Instant::now();
        let (st, h, v) = send(
            &c,
            method.clone(),
            &format!("{g}/{index}/{path}"),
            body,
            &[("x-zkguard-timeout", "60s")],
        )
        .await;
        let took = asked.elapsed();
        // The lock wait ends first (429); on a loaded machine the steps before it may leave
        // the request timeout to end it: either way nothing was written, and it says so.
        let kind = v["error"]["type"].as_str().unwrap_or_default();
        let reason = v["error"]["reason"].as_str().unwrap_or_default();
        assert!(
            matches!(
                (st.as_u16(), kind),
                (429, "es_rejected_execution_exception")
                    | (503, "zkguard_request_timeout_exception")
            ) && reason.contains("nothing was written"),
            "{method} {path} after {took:?}: {st} {v}"
        );
        assert!(h.get("retry-after").is_some(), "{method} {path}: {h:?}");
        assert!(took < Duration::from_secs(30), "{method} {path}: {took:?}");
    }

    // The lock comes (its holder lets go once the write waits for it), then the cluster does
    // not answer the read under it.
    front.hold_reads().await;
    let update = tokio::spawn({
        let (c, url) = (c.clone(), format!("{g}/{index}/_update/held"));
        async move {
            let asked = Instant::now();
            let answer = send(&c, Method::POST, &url, Some(r#"{"doc":{"n":2}}"#), &[]).await;
            (answer, asked.elapsed())
        }
    });
    eventually(
        Duration::from_secs(20),
        "the update waits for the lock",
        || {
            let listed = lock_listed(&env, &monitor, "gateway update");
            async move { listed }
        },
    )
    .await;
    guard.unlock().await.unwrap();
    eventually(
        Duration::from_secs(20),
        "the update reads under the lock",
        || async { front.held_reads().await == 1 },
    )
    .await;
    let ((st, h, v), took) = update.await.unwrap();
    assert_eq!(
        (st, &v["error"]["type"]),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            &json!("zkguard_request_timeout_exception")
        ),
        "after {took:?}: {v}"
    );
    let reason = v["error"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("server.request.timeout") && reason.contains("nothing was written"),
        "{v}"
    );
    assert!(h.get("retry-after").is_some(), "{h:?}");
    front.release_reads().await;
    assert_eq!(es_doc(&c, &index, "held").await, stored, "nothing written");
    // The abandoned write's lock was released: a next write gets it (sent again while a
    // loaded machine answers it with a retryable refusal).
    eventually(Duration::from_secs(60), "a next write is applied", || {
        let (c, url) = (c.clone(), format!("{g}/{index}/_update/held"));
        async move {
            let (st, _, v) = send(&c, Method::POST, &url, Some(r#"{"doc":{"n":3}}"#), &[]).await;
            assert!(
                st == StatusCode::OK || (st.as_u16() == 429 || st.as_u16() == 503),
                "{st} {v}"
            );
            st == StatusCode::OK
        }
    })
    .await;
    assert_eq!(es_doc(&c, &index, "held").await["_source"]["n"], 3);
}

/// Bytes of request bodies the gate may hold at once in the body-bound test, and the size of
/// each body.
const INFLIGHT_BOUND: usize = 32 << 20;
const LARGE_BODY: usize = 12 << 20;
const LARGE_BODIES: usize = 24;

/// What became of one large body sent with `Expect: 100-continue`.
enum Received {
    /// Answered before its body was asked for: status and answer head.
    Answered(u16, String),
    /// Asked for (`100 Continue`): all but its last byte sent, the connection open.
    Stalled(TcpStream),
}

/// Sends the head of a `PUT path` of [`LARGE_BODY`] bytes; once the gate asks for the body,
/// sends all of it but the last byte.
async fn large_body(addr: &str, path: &str, body: &[u8]) -> Received {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "PUT {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(n > 0, "{path}: closed before an answer");
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got).to_string();
    if !text.starts_with("HTTP/1.1 100") {
        let status = text[9..12].parse().unwrap();
        return Received::Answered(status, text + &until_closed(tcp).await);
    }
    tcp.write_all(&body[..body.len() - 1]).await.unwrap();
    Received::Stalled(tcp)
}

/// Many large bodies sent at once: the gate takes in bodies up to
/// `server.gateway.body.max.inflight.bytes` and answers the others 429 with `Retry-After`
/// before reading them, so the service's memory stays bounded; the bodies it took are
/// answered normally, and so is a request once the bound has room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bodies_in_flight_are_bounded_and_the_excess_is_refused_429() {
    let env = gate_env(&shared_zk().connect_string(), "inflight", shared_es().url())
        .with(
            "ZKGUARD_SERVER_GATEWAY_BODY_MAX_INFLIGHT_BYTES",
            &INFLIGHT_BOUND.to_string(),
        )
        // The test holds the bodies it stalls open while it sends the rest and measures: on a
        // busy machine that passes the default 30 s of a request, which is not what it tests.
        .with("ZKGUARD_SERVER_BODY_TIMEOUT", "120000")
        .with("ZKGUARD_SERVER_REQUEST_TIMEOUT", "120000");
    let s = env.start("a");
    let (g, addr) = (gate(&s), gate_addr(&s));
    let c = client();
    let index = format!("gate-inflight-{}", uuid_tag());
    let (st, _, v) = send(
        &c,
        Method::PUT,
        &format!("{g}/{index}/_doc/seed"),
        Some("{}"),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(LARGE_BODY - 10)).into_bytes();
    assert_eq!((body.len(), body.last()), (LARGE_BODY, Some(&b'}')));
    let body = std::sync::Arc::new(body);
    let before = peak_memory(s.child.id());
    let sent = futures::future::join_all((0..LARGE_BODIES).map(|k| {
        let (addr, body, path) = (addr.clone(), body.clone(), format!("/{index}/_doc/big-{k}"));
        async move { large_body(&addr, &path, &body).await }
    }))
    .await;
    let peak = peak_memory(s.child.id());
    eprintln!(
        "{LARGE_BODIES} bodies of {} MiB: peak {} MiB (before {} MiB)",
        LARGE_BODY >> 20,
        peak >> 20,
        before >> 20
    );
    let mut stalled = Vec::new();
    for one in sent {
        match one {
            Received::Stalled(tcp) => stalled.push(tcp),
            Received::Answered(status, text) => {
                assert_eq!(status, 429, "{text}");
                let lower = text.to_ascii_lowercase();
                assert!(lower.contains("retry-after:"), "{text}");
                assert!(
                    text.contains("circuit_breaking_exception")
                        && text.contains("server.gateway.body.max.inflight.bytes"),
                    "{text}"
                );
            }
        }
    }
    assert_eq!(
        stalled.len(),
        INFLIGHT_BOUND / LARGE_BODY,
        "bodies taken in at once"
    );
    assert!(
        peak - before < (INFLIGHT_BOUND as u64) + (64 << 20),
        "the service grew by {} MiB",
        (peak - before) >> 20
    );
    for mut tcp in stalled {
        tcp.write_all(b"}").await.unwrap();
        let text = until_closed_or_answered(tcp).await;
        assert!(
            text.starts_with("HTTP/1.1 201"),
            "{}",
            &text[..text.len().min(300)]
        );
    }
    let (st, _, v) = send(
        &c,
        Method::PUT,
        &format!("{g}/{index}/_doc/after"),
        Some(r#"{"n":1}"#),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "within the bound: {v}");
}

/// The head of the answer on `tcp` (up to the end of its headers).
async fn until_closed_or_answered(mut tcp: TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match tcp.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).to_string()
}
