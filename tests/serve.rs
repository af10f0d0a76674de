//! `zkguard serve` through HTTP, against real ZooKeeper and osmem-server processes: guarded
//! writes from concurrent clients, the journal across SIGKILL, a ZooKeeper outage, bad input,
//! load limits, metrics, SIGTERM draining and two instances sharing one ZooKeeper.

mod common;
mod serve_support;

use std::collections::{HashMap, HashSet};
use std::process::{Command, Stdio};

use std::time::Duration;

use common::*;
use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};
use serve_support::*;
use zkguard::testkit::OsmemServer;
use zkguard::LockType;

/// Runs a mixed workload of foreground and background writes from `clients` concurrent
/// clients, spread over `services`, on `docs` shared documents; returns op id -> token per doc.
async fn mixed_workload(
    services: &[&Service],
    index: &str,
    docs: usize,
    clients: usize,
    per_client: usize,
    background: bool,
) -> HashMap<String, HashMap<String, u64>> {
    let c = client();
    // Create the index first, so that the race is about locks, not index creation.
    let (status, v) = put(
        &c,
        services[0],
        &format!("/v1/indices/{index}/docs/setup"),
        &json!({"n": 0}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let mut tasks = Vec::new();
    for k in 0..clients {
        let c = c.clone();
        let urls: Vec<String> = services.iter().map(|s| s.base.clone()).collect();
        let index = index.to_string();
        tasks.push(tokio::spawn(async move {
            let mut fg = Vec::new();
            let mut bg = Vec::new();
            for i in 0..per_client {
                let base = &urls[(k + i) % urls.len()];
                let doc = format!("d{}", (k + i) % docs);
                let bg_write = background && (k + i) % 2 == 1;
                let ty = if bg_write { "background" } else { "foreground" };
                let url = format!("{base}/v1/indices/{index}/docs/{doc}?type={ty}&timeout=20s");
                let (status, v) = call(
                    &c,
                    Method::PUT,
                    &url,
                    Some(json!({"client": k, "i": i}).to_string()),
                )
                .await;
                let op = v["operation_id"].as_str().unwrap_or_default().to_string();
                if bg_write {
                    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
                    bg.push((doc, op, base.clone()));
                } else {
                    assert_eq!(status, StatusCode::OK, "{v}");
                    fg.push((doc, op, v["token"].as_u64().unwrap()));
                }
            }
            (fg, bg)
        }));
    }
    let mut per_doc: HashMap<String, HashMap<String, u64>> = HashMap::new();
    let mut bg_all = Vec::new();
    for t in tasks {
        let (fg, bg) = t.await.unwrap();
        for (doc, op, token) in fg {
            per_doc.entry(doc).or_default().insert(op, token);
        }
        bg_all.extend(bg);
    }
    for s in services {
        let ids: Vec<String> = bg_all
            .iter()
            .filter(|(_, _, base)| *base == s.base)
            .map(|(_, op, _)| op.clone())
            .collect();
        let states = wait_finished(&c, s, &ids).await;
        for (doc, op, base) in &bg_all {
            if *base != s.base {
                continue;
            }
            let v = &states[op];
            assert_eq!(v["status"], "applied", "{v}");
            per_doc
                .entry(doc.clone())
                .or_default()
                .insert(op.clone(), v["token"].as_u64().unwrap());
        }
    }
    per_doc
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_foreground_and_background_writers_keep_tokens_increasing() {
    let env = Env::new(&shared_zk().connect_string(), "mixed");
    let s = env.start("a");
    let index = format!("mixed-{}", uuid_tag());
    // One document, so that the writers contend (the document remembers its last 100 ops).
    let per_doc = mixed_workload(&[&s], &index, 1, 8, 12, true).await;
    let c = client();
    for (doc, tokens) in &per_doc {
        check_doc(&c, &index, doc, tokens).await;
    }
    assert_eq!(per_doc.values().map(HashMap::len).sum::<usize>(), 96);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn foreground_overtakes_queued_background_work() {
    let env = Env::new(&shared_zk().connect_string(), "overtake");
    let s = env.start("a");
    let c = client();
    let index = format!("overtake-{}", uuid_tag());
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/setup"),
        &json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let monitor = format!("{index}:d");
    let lock_node = format!("{}/{monitor}", env.root);
    let (holder, guard) = hold_lock(&env, &monitor).await;
    let mut bg = Vec::new();
    for i in 0..4 {
        let (status, v) = put(
            &c,
            &s,
            &format!("/v1/indices/{index}/docs/d?type=background"),
            &json!({"bg": i}),
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{v}");
        bg.push(v["operation_id"].as_str().unwrap().to_string());
    }
    // The four operations share one background acquisition (the service groups background work
    // by monitor): one queue node.
    eventually(
        Duration::from_secs(10),
        "the background operations queue for the lock",
        || async { queued(&env.zk, &lock_node, "B-").await == 1 },
    )
    .await;
    let fg = tokio::spawn({
        let c = c.clone();
        let url = s.url(&format!("/v1/indices/{index}/docs/d?timeout=20s"));
        async move { call(&c, Method::PUT, &url, Some("{\"fg\":1}".into())).await }
    });
    eventually(
        Duration::from_secs(10),
        "the foreground request queues",
        || async { queued(&env.zk, &lock_node, "A-").await == 2 },
    )
    .await;
    guard.unlock().await.unwrap();
    drop(holder);
    let (status, v) = fg.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{v}");
    let fg_id = v["operation_id"].as_str().unwrap().to_string();
    let states = wait_finished(&c, &s, &bg).await;
    assert!(
        states.values().all(|v| v["status"] == "applied"),
        "{states:?}"
    );
    let doc = es_doc(&c, &index, "d").await;
    let ops: Vec<String> =
        serde_json::from_value(doc["_source"]["zkguard"]["ops"].clone()).unwrap();
    assert_eq!(
        ops.first(),
        Some(&fg_id),
        "the foreground write went first: {ops:?}"
    );
    assert_eq!(ops.len(), 5, "{ops:?}");
    // Background operations applied under one acquisition share its token; the metrics count
    // each acquisition once.
    let tokens: HashSet<u64> = states
        .values()
        .map(|v| v["token"].as_u64().unwrap())
        .collect();
    let metrics = scrape(&c, &s).await;
    for name in [
        r#"zkguard_lock_acquisitions_total{lock_type="background"}"#,
        r#"zkguard_lock_hold_seconds_count{lock_type="background"}"#,
    ] {
        assert_eq!(metric(&metrics, name), tokens.len() as f64, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_on_one_zookeeper_exclude_each_other() {
    let env = Env::new(&shared_zk().connect_string(), "two");
    let a = env.start("a");
    let b = env.start("b");
    let index = format!("two-{}", uuid_tag());
    let per_doc = mixed_workload(&[&a, &b], &index, 1, 8, 12, false).await;
    let c = client();
    for (doc, tokens) in &per_doc {
        check_doc(&c, &index, doc, tokens).await;
    }
    assert_eq!(per_doc.values().map(HashMap::len).sum::<usize>(), 96);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_with_journaled_operations_then_restart_applies_each_once() {
    let env = Env::new(&shared_zk().connect_string(), "kill");
    let c = client();
    let index = format!("kill-{}", uuid_tag());
    let s = env.start("a");
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/setup"),
        &json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    // Another writer holds the lock of d0: its operations cannot finish before the kill.
    let (holder, guard) = hold_lock(&env, &format!("{index}:d0")).await;
    let mut body = String::new();
    for i in 0..40 {
        body.push_str(
            &json!({"action": "index", "index": index, "id": format!("d{}", i % 4), "doc": {"i": i}})
                .to_string(),
        );
        body.push('\n');
    }
    let (status, v) = call(&c, Method::POST, &s.url("/v1/bulk"), Some(body)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    assert_eq!(v["count"], 40);
    let ids: Vec<String> = v["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["operation_id"].as_str().unwrap().to_string())
        .collect();
    s.kill();
    guard.unlock().await.unwrap();
    drop(holder);

    let s = env.start("a");
    let replayed = s.started["replayed"].as_u64().unwrap();
    assert!(
        replayed >= 10,
        "the operations on d0 were unfinished at the kill: {}",
        s.started
    );
    let states = wait_finished(&c, &s, &ids).await;
    let mut per_doc: HashMap<String, HashMap<String, u64>> = HashMap::new();
    for (i, id) in ids.iter().enumerate() {
        let v = &states[id];
        assert_eq!(v["status"], "applied", "{v}");
        per_doc
            .entry(format!("d{}", i % 4))
            .or_default()
            .insert(id.clone(), v["token"].as_u64().unwrap());
    }
    for (doc, tokens) in &per_doc {
        check_doc(&c, &index, doc, tokens).await;
    }
    // Submitting the same operation again (same op_id) does not queue it twice.
    let again = &ids[0];
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/d0?type=background&op_id={again}"),
        &json!({"i": 0}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    assert_eq!(v["status"], "applied", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn zookeeper_outage_makes_the_service_unready_and_background_work_waits() {
    let zk = zk_server();
    let env = Env::new(&zk.connect_string(), "outage");
    let c = client();
    let index = format!("outage-{}", uuid_tag());
    let s = env.start("a");
    let (status, _) = call(&c, Method::GET, &s.url("/readyz"), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/setup"),
        &json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");

    zk.stop();
    eventually(Duration::from_secs(30), "readyz says 503", || async {
        call(&c, Method::GET, &s.url("/readyz"), None).await.0 == StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    let (status, v) = call(&c, Method::GET, &s.url("/readyz"), None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(v["message"].as_str().unwrap().contains("ZooKeeper"), "{v}");
    // Foreground: refused at once, not after the lock timeout.
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/a?timeout=20s"),
        &json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_eq!(v["error"], "lock_unavailable", "{v}");
    // Background: journaled and held.
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/b?type=background"),
        &json!({"b": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let id = v["operation_id"].as_str().unwrap().to_string();
    assert_eq!(op_status(&c, &s, &id).await["status"], "queued");

    zk.start_again().unwrap();
    let states = wait_finished(&c, &s, std::slice::from_ref(&id)).await;
    assert_eq!(states[&id]["status"], "applied", "{}", s.log());
    eventually(Duration::from_secs(30), "readyz says 200 again", || async {
        call(&c, Method::GET, &s.url("/readyz"), None).await.0 == StatusCode::OK
    })
    .await;
    assert_eq!(es_doc(&c, &index, "b").await["_source"]["b"], 1);
    // The service's monitor (every 250 ms) counts the return of the session.
    eventually(
        Duration::from_secs(10),
        "the reconnection is counted",
        || async {
            let samples = scrape(&c, &s).await;
            metric(&samples, "zkguard_lock_backend_reconnects_total") >= 1.0
                && metric(&samples, "zkguard_lock_backend_connected") == 1.0
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_elasticsearch_lease_lock_backend_serves_too() {
    let env = Env::new(&shared_zk().connect_string(), "eslock")
        .with("ZKGUARD_LOCK_BACKEND", "elasticsearch")
        .with(
            "ZKGUARD_ELASTICSEARCH_LOCK_INDEX",
            &format!("serve-locks-{}", uuid_tag()),
        );
    let s = env.start("a");
    assert_eq!(s.started["backend"], "elasticsearch");
    let c = client();
    let index = format!("eslock-{}", uuid_tag());
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/a"),
        &json!({"a": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/a?type=background"),
        &json!({"a": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let id = v["operation_id"].as_str().unwrap().to_string();
    let states = wait_finished(&c, &s, std::slice::from_ref(&id)).await;
    assert_eq!(states[&id]["status"], "applied", "{}", s.log());
    assert_eq!(es_doc(&c, &index, "a").await["_source"]["a"], 2);
    assert_eq!(
        call(&c, Method::GET, &s.url("/readyz"), None).await.0,
        StatusCode::OK
    );

    // Explicit locks on the lease lock; the listing is `zkguard locks --json`'s.
    let (status, lock) = call(&c, Method::POST, &s.url("/v1/locks/es-m?ttl=30s"), None).await;
    assert_eq!(status, StatusCode::OK, "{lock}");
    let (status, v) = call(&c, Method::GET, &s.url("/v1/locks/es-m"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v[0]["state"], "held", "{v}");
    assert_eq!(v[0]["token"], lock["token"], "{v}");
    assert_eq!(
        without_ages(v),
        without_ages(cli_locks(&env, &["--monitor", "es-m"]))
    );
    let release = s.url(&format!(
        "/v1/locks/es-m/{}",
        lock["lock_id"].as_str().unwrap()
    ));
    let (status, v) = call(&c, Method::DELETE, &release, None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, v) = call(&c, Method::GET, &s.url("/v1/locks/es-m"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_ne!(v[0]["state"], "held", "{v}");
}

fn assert_error(status: StatusCode, v: &Value, want: StatusCode, kind: &str, needle: &str) {
    assert_eq!(status, want, "{v}");
    assert_eq!(v["error"], kind, "{v}");
    let message = v["message"].as_str().unwrap_or_default();
    assert!(message.contains(needle), "{needle:?} not in {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_gets_clear_client_errors() {
    let env =
        Env::new(&shared_zk().connect_string(), "bad").with("ZKGUARD_SERVER_MAX_BODY", "1024");
    let s = env.start("a");
    let c = client();
    let docs = s.url("/v1/indices/bad/docs/1");
    // (method, URL, body, expected status, error kind, a piece of the message)
    type Case = (
        Method,
        String,
        Option<String>,
        StatusCode,
        &'static str,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (Method::PUT, docs.clone(), Some("{\"a\":".into()), StatusCode::BAD_REQUEST, "malformed_json", "not valid JSON"),
        (Method::PUT, docs.clone(), Some("[1,2]".into()), StatusCode::BAD_REQUEST, "bad_document", "JSON object"),
        (Method::PUT, docs.clone(), Some(format!("{{\"a\":\"{}\"}}", "x".repeat(2000))), StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", "server.max.body"),
        (Method::PUT, format!("{docs}?monitor=a%2Fb"), Some("{}".into()), StatusCode::BAD_REQUEST, "bad_monitor", "`/`"),
        (Method::PUT, format!("{docs}?op_id=%09tab"), Some("{}".into()), StatusCode::BAD_REQUEST, "bad_parameter", "printable text of 1 to 200 bytes"),
        (Method::PUT, format!("{docs}?type=urgent"), Some("{}".into()), StatusCode::BAD_REQUEST, "bad_parameter", "unknown lock type"),
        (Method::PUT, format!("{docs}?timeout=soon"), Some("{}".into()), StatusCode::BAD_REQUEST, "bad_parameter", "timeout"),
        (Method::PUT, format!("{docs}?colour=red"), Some("{}".into()), StatusCode::BAD_REQUEST, "bad_parameter", "unknown query parameter `colour`"),
        (Method::PUT, s.url("/v1/indices/Bad/docs/1"), Some("{}".into()), StatusCode::BAD_REQUEST, "bad_index", "lowercase"),
        (Method::PUT, docs.clone(), Some("{\"zkguard\":1}".into()), StatusCode::BAD_REQUEST, "invalid_operation", "zkguard"),
        (Method::PUT, s.url("/v1/indices/%FF/docs/1"), Some("{}".into()), StatusCode::BAD_REQUEST, "bad_path", "path"),
        (Method::PUT, docs.clone(), Some("{\"a\":\"\u{0}\"".into()), StatusCode::BAD_REQUEST, "malformed_json", "not valid JSON"),
        (Method::DELETE, format!("{docs}?mode=soft"), None, StatusCode::BAD_REQUEST, "bad_parameter", "hard or tombstone"),
        (Method::PUT, format!("{docs}?mode=hard"), Some("{}".into()), StatusCode::BAD_REQUEST, "bad_parameter", "unknown query parameter `mode`"),
        (Method::POST, s.url("/v1/bulk?type=foreground"), Some("{}".into()), StatusCode::BAD_REQUEST, "bad_parameter", "no query parameters"),
        (Method::GET, s.url("/v2/nothing"), None, StatusCode::NOT_FOUND, "no_route", "/v2/nothing"),
        (Method::POST, docs.clone(), Some("{}".into()), StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "POST"),
        (Method::GET, s.url("/v1/operations/xyz"), None, StatusCode::NOT_FOUND, "unknown_operation", "no operation xyz"),
        (Method::GET, s.url(&format!("/v1/operations/{}", uuid::Uuid::new_v4())), None, StatusCode::NOT_FOUND, "unknown_operation", "no operation"),
        (Method::POST, s.url("/v1/bulk"), Some("\n\n".into()), StatusCode::BAD_REQUEST, "empty_bulk", "no operation"),
        (Method::POST, s.url("/v1/bulk"), Some("{\"action\":\"index\",\"index\":\"bad\",\"id\":\"1\",\"doc\":{}}\n{\"action\":\"index\",\"index\":\"bad\",\"id\":\"2\"}\n".into()), StatusCode::BAD_REQUEST, "bad_document", "line 2"),
        (Method::POST, s.url("/v1/bulk"), Some("{\"action\":\"upsert\"}\n".into()), StatusCode::BAD_REQUEST, "malformed_json", "line 1"),
    ];
    for (method, url, body, want, kind, needle) in cases {
        let (status, v) = call(&c, method.clone(), &url, body).await;
        assert_error(status, &v, want, kind, needle);
    }
    // Nothing of the refused bulk request was accepted.
    let (status, _) = call(&c, Method::GET, &s.url("/healthz"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(std::fs::read_to_string(env.journal("a"))
        .unwrap()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_timeout_is_423_and_load_beyond_the_limit_is_503_with_retry_after() {
    let env =
        Env::new(&shared_zk().connect_string(), "load").with("ZKGUARD_SERVER_MAX_CONCURRENT", "1");
    let s = env.start("a");
    let c = client();
    let index = format!("load-{}", uuid_tag());
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/setup"),
        &json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (_holder, guard) = hold_lock(&env, &format!("{index}:a")).await;
    let resp = c
        .put(s.url(&format!("/v1/indices/{index}/docs/a?timeout=300ms")))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::LOCKED);
    assert!(resp.headers().contains_key("retry-after"));
    let v: Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
    assert_eq!(v["error"], "lock_timeout", "{v}");

    // One request waits for the lock; the next one is beyond the limit of 1.
    let waiting = tokio::spawn({
        let c = c.clone();
        let url = s.url(&format!("/v1/indices/{index}/docs/a?timeout=20s"));
        async move { call(&c, Method::PUT, &url, Some("{\"w\":1}".into())).await }
    });
    let lock_node = format!("{}/{index}:a", env.root);
    eventually(
        Duration::from_secs(10),
        "the request queues for the lock",
        || async { queued(&env.zk, &lock_node, "A-").await >= 2 },
    )
    .await;
    let resp = c
        .put(s.url(&format!("/v1/indices/{index}/docs/b")))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(resp.headers().contains_key("retry-after"));
    let v: Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
    assert_eq!(v["error"], "overloaded", "{v}");
    // Health and metrics are not limited.
    assert_eq!(
        call(&c, Method::GET, &s.url("/healthz"), None).await.0,
        StatusCode::OK
    );
    guard.unlock().await.unwrap();
    let (status, v) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{v}");
}

fn metric(samples: &HashMap<String, f64>, series: &str) -> f64 {
    samples.get(series).copied().unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_parse_and_count_what_happened() {
    let env = Env::new(&shared_zk().connect_string(), "metrics")
        .arg("--log-format")
        .arg("json");
    let s = env.start("a");
    let c = client();
    let index = format!("metrics-{}", uuid_tag());
    let before = scrape(&c, &s).await;
    let route = r#"zkguard_http_requests_total{route="/v1/indices/{index}/docs/{id}",method="PUT",status="200"}"#;
    assert_eq!(metric(&before, route), 0.0);
    for i in 0..3 {
        let (status, v) = put(
            &c,
            &s,
            &format!("/v1/indices/{index}/docs/{i}"),
            &json!({"i": i}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{v}");
    }
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/bg?type=background"),
        &json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let id = v["operation_id"].as_str().unwrap().to_string();
    wait_finished(&c, &s, std::slice::from_ref(&id)).await;
    let (status, _) = put(&c, &s, &format!("/v1/indices/{index}/docs/x"), &json!(1)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let after = scrape(&c, &s).await;
    assert_eq!(metric(&after, route), 3.0);
    assert_eq!(
        metric(
            &after,
            r#"zkguard_http_requests_total{route="/v1/indices/{index}/docs/{id}",method="PUT",status="400"}"#
        ),
        1.0
    );
    assert_eq!(
        metric(
            &after,
            r#"zkguard_operations_total{lock_type="foreground",outcome="applied"}"#
        ),
        3.0
    );
    assert_eq!(
        metric(
            &after,
            r#"zkguard_operations_total{lock_type="background",outcome="applied"}"#
        ),
        1.0
    );
    assert_eq!(
        metric(
            &after,
            r#"zkguard_lock_acquisitions_total{lock_type="foreground"}"#
        ),
        3.0
    );
    assert_eq!(
        metric(
            &after,
            r#"zkguard_lock_wait_seconds_count{lock_type="foreground"}"#
        ),
        3.0
    );
    assert_eq!(
        metric(
            &after,
            r#"zkguard_lock_hold_seconds_count{lock_type="background"}"#
        ),
        1.0
    );
    assert_eq!(metric(&after, "zkguard_journal_depth"), 0.0);
    assert_eq!(metric(&after, "zkguard_lock_backend_connected"), 1.0);
    // --log-format json: every log line is one JSON object.
    let log = s.log();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["message"] == "zkguard serve started"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_journaled_operation_already_in_elasticsearch_is_not_applied_twice() {
    // A crash after the write reached Elasticsearch but before its outcome was journaled leaves
    // the operation unfinished in the journal; the restart must recognise it.
    let env = Env::new(&shared_zk().connect_string(), "twice");
    let c = client();
    let index = format!("twice-{}", uuid_tag());
    let op =
        zkguard::write::ops::Operation::index(format!("{index}:d"), &index, "d", json!({"v": 1}))
            .with_type(LockType::Background);
    let token = {
        let s = env.start("writer");
        let (status, v) = put(
            &c,
            &s,
            &format!("/v1/indices/{index}/docs/d?op_id={}", op.id),
            &json!({"v": 1}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        s.kill();
        v["token"].as_u64().unwrap()
    };
    let line = json!({"r": "accepted", "ops": [op]}).to_string();
    std::fs::write(env.journal("a"), format!("{line}\n")).unwrap();
    let s = env.start("a");
    assert_eq!(s.started["replayed"], 1, "{}", s.started);
    let id = op.id.to_string();
    let states = wait_finished(&c, &s, std::slice::from_ref(&id)).await;
    assert_eq!(states[&id]["status"], "applied");
    let doc = es_doc(&c, &index, "d").await;
    let ops: Vec<String> =
        serde_json::from_value(doc["_source"]["zkguard"]["ops"].clone()).unwrap();
    assert_eq!(ops, vec![id], "{doc}");
    assert_eq!(
        doc["_version"].as_u64(),
        Some(token),
        "not written again: {doc}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_lets_in_flight_requests_finish_and_exits_0() {
    let env = Env::new(&shared_zk().connect_string(), "term");
    let mut s = env.start("a");
    let c = client();
    let index = format!("term-{}", uuid_tag());
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/setup"),
        &json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let monitor = format!("{index}:a");
    let (holder, guard) = hold_lock(&env, &monitor).await;
    // A background operation that waits behind the holder, and a foreground request too.
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/a?type=background"),
        &json!({"bg": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let bg_id = v["operation_id"].as_str().unwrap().to_string();
    let fg = tokio::spawn({
        let c = c.clone();
        let url = s.url(&format!("/v1/indices/{index}/docs/a?timeout=20s"));
        async move { call(&c, Method::PUT, &url, Some("{\"fg\":1}".into())).await }
    });
    let lock_node = format!("{}/{monitor}", env.root);
    eventually(
        Duration::from_secs(10),
        "the foreground request queues",
        || async { queued(&env.zk, &lock_node, "A-").await >= 2 },
    )
    .await;
    s.signal(nix::sys::signal::Signal::SIGTERM);
    // New requests are refused (connection closed or 503) once the service drains.
    eventually(
        Duration::from_secs(10),
        "the service stops accepting",
        || async {
            match c.get(s.url("/readyz")).send().await {
                Err(_) => true,
                Ok(r) => r.status() == StatusCode::SERVICE_UNAVAILABLE,
            }
        },
    )
    .await;
    guard.unlock().await.unwrap();
    drop(holder);
    let (status, v) = fg.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{v}");
    let code = s.child.wait().unwrap();
    assert_eq!(code.code(), Some(0), "{}", s.log());
    // It released its locks and closed its session: none of its queue nodes is left behind.
    assert_eq!(children(&env.zk, &lock_node).await, Vec::<String>::new());
    // The background operation is applied, now or after the restart, exactly once.
    drop(s);
    let s = env.start("a");
    let states = wait_finished(&c, &s, std::slice::from_ref(&bg_id)).await;
    assert_eq!(states[&bg_id]["status"], "applied");
    let doc = es_doc(&c, &index, "a").await;
    let ops: Vec<String> =
        serde_json::from_value(doc["_source"]["zkguard"]["ops"].clone()).unwrap();
    assert_eq!(ops.iter().filter(|o| **o == bg_id).count(), 1, "{doc}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_elasticsearch_is_cut_by_the_request_timeout_and_readyz_says_why() {
    let es = OsmemServer::start().expect("start osmem-server");
    let mut env = Env::new(&shared_zk().connect_string(), "stall")
        .with("ZKGUARD_SERVER_REQUEST_TIMEOUT", "4000");
    env.es = es.url().to_string();
    let s = env.start("a");
    let c = client();
    let (status, v) = put(&c, &s, "/v1/indices/stall/docs/setup", &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    es.pause();
    let (status, v) = put(&c, &s, "/v1/indices/stall/docs/a", &json!({"a": 1})).await;
    assert_error(
        status,
        &v,
        StatusCode::SERVICE_UNAVAILABLE,
        "request_timeout",
        "server.request.timeout",
    );
    let (status, v) = call(&c, Method::GET, &s.url("/readyz"), None).await;
    assert_error(
        status,
        &v,
        StatusCode::SERVICE_UNAVAILABLE,
        "not_ready",
        "Elasticsearch",
    );
    es.resume();
    eventually(Duration::from_secs(30), "readyz says 200 again", || async {
        call(&c, Method::GET, &s.url("/readyz"), None).await.0 == StatusCode::OK
    })
    .await;
    // The lock of the abandoned request was released: the same document can be written.
    let (status, v) = put(
        &c,
        &s,
        "/v1/indices/stall/docs/a?timeout=3s",
        &json!({"a": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

#[test]
fn start_failures_exit_with_the_documented_status() {
    let env = Env::new(&shared_zk().connect_string(), "start");
    let run = |env: &Env, journal: &str| {
        Command::new(env!("CARGO_BIN_EXE_zkguard"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env_remove("ZKGUARD_CONFIG")
            .env("ZKGUARD_ZOOKEEPER_SERVERS", &env.zk)
            .env("ZKGUARD_ZOOKEEPER_LOCK_ROOT", &env.root)
            .env("ZKGUARD_ZOOKEEPER_CONNECTION_RETRY", "1")
            .env("ZKGUARD_ELASTICSEARCH_URL", &env.es)
            .env("ZKGUARD_SERVER_JOURNAL_PATH", env.journal(journal))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    // The journal of a running service.
    let _running = env.start("a");
    let o = run(&env, "a");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(78), "{err}");
    assert!(err.contains("in use by another zkguard serve"), "{err}");
    // ZooKeeper unreachable.
    let mut down = env.clone();
    down.zk = format!("127.0.0.1:{}", zkguard::testkit::free_port().unwrap());
    let o = run(&down, "b");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(69), "{err}");
    assert!(err.contains("ZooKeeper"), "{err}");
    // A bad server.* value.
    let o = Command::new(env!("CARGO_BIN_EXE_zkguard"))
        .args(["serve"])
        .env_remove("ZKGUARD_CONFIG")
        .env("ZKGUARD_SERVER_LISTEN", "localhost")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(78), "{err}");
    assert!(err.contains("server.listen"), "{err}");
}

/// Drops the fields that change from one read to the next (`age_ms`, and `expires_ms` of a
/// lease that is renewed).
fn without_ages(mut v: Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("age_ms");
                m.remove("expires_ms");
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}

/// `zkguard locks --json` (plus `extra` arguments) against the service's ZooKeeper and lock root.
fn cli_locks(env: &Env, extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_zkguard"))
        .args(["locks", "--json"])
        .args(extra)
        .env_remove("ZKGUARD_CONFIG")
        .env("ZKGUARD_ZOOKEEPER_SERVERS", &env.zk)
        .env("ZKGUARD_ZOOKEEPER_LOCK_ROOT", &env.root)
        .env("ZKGUARD_ELASTICSEARCH_URL", &env.es)
        .envs(env.extra.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_explicit_lock_without_keepalive_passes_on_and_its_late_write_is_fenced() {
    let env = Env::new(&shared_zk().connect_string(), "lapse");
    let s = env.start("a");
    let c = client();
    let index = format!("lapse-{}", uuid_tag());

    let (status, lock) = call(
        &c,
        Method::POST,
        &s.url("/v1/locks/article-7?ttl=1500ms&info=editor"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{lock}");
    let old_token = lock["token"].as_u64().unwrap();
    let lock_id = lock["lock_id"].as_str().unwrap().to_string();
    assert_eq!(lock["monitor"], "article-7");
    assert_eq!(lock["ttl_ms"], 1500);
    assert!(lock["expires"].as_u64().unwrap() > 0, "{lock}");

    // The holder sends no keep-alive. A foreground write on the same monitor waits for the
    // lease to lapse, then gets a newer token.
    let (status, written) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/1?monitor=article-7&timeout=10s"),
        &json!({"title": "saved after the lapse"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{written}");
    let new_token = written["token"].as_u64().unwrap();
    assert!(new_token > old_token, "{new_token} <= {old_token}");

    // The lock is gone: its keep-alive and release say so.
    let keepalive = s.url(&format!("/v1/locks/article-7/{lock_id}/keepalive"));
    let (status, v) = call(&c, Method::POST, &keepalive, None).await;
    assert_error(
        status,
        &v,
        StatusCode::NOT_FOUND,
        "unknown_lock",
        "lease lapsed",
    );
    let release = s.url(&format!("/v1/locks/article-7/{lock_id}"));
    let (status, v) = call(&c, Method::DELETE, &release, None).await;
    assert_error(
        status,
        &v,
        StatusCode::NOT_FOUND,
        "unknown_lock",
        "released",
    );

    // The late writer, writing directly with its old token, is fenced by Elasticsearch.
    let late = format!(
        "{}/{index}/_doc/1?version={old_token}&version_type=external_gte",
        shared_es().url()
    );
    let (status, v) = call(
        &c,
        Method::PUT,
        &late,
        Some(json!({"title": "late write"}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    let doc = es_doc(&c, &index, "1").await;
    assert_eq!(doc["_source"]["title"], "saved after the lapse", "{doc}");
    assert_eq!(doc["_version"].as_u64(), Some(new_token), "{doc}");
    assert!(s.log().contains("lapsed"), "{}", s.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn explicit_locks_keep_alive_release_list_and_are_capped() {
    let env = Env::new(&shared_zk().connect_string(), "explicit")
        .with("ZKGUARD_SERVER_LOCK_MAX", "1")
        .with("ZKGUARD_SERVER_LOCK_TTL_MAX", "60000");
    let s = env.start("a");
    let c = client();

    // Bad requests.
    let (status, v) = call(&c, Method::POST, &s.url("/v1/locks/m1?ttl=2m"), None).await;
    assert_error(
        status,
        &v,
        StatusCode::BAD_REQUEST,
        "bad_parameter",
        "server.lock.ttl.max",
    );
    let (status, v) = call(&c, Method::POST, &s.url("/v1/locks/m1?lease=1s"), None).await;
    assert_error(
        status,
        &v,
        StatusCode::BAD_REQUEST,
        "bad_parameter",
        "lease",
    );
    let (status, v) = call(&c, Method::POST, &s.url("/v1/locks/privateLock"), None).await;
    assert_error(
        status,
        &v,
        StatusCode::BAD_REQUEST,
        "bad_monitor",
        "reserved",
    );
    let (status, v) = call(&c, Method::POST, &s.url("/v1/locks/m1/xyz/keepalive"), None).await;
    assert_error(
        status,
        &v,
        StatusCode::BAD_REQUEST,
        "bad_lock_id",
        "not a UUID",
    );

    // A lock with a 1 s lease, kept alive past it by keep-alives.
    let (status, lock) = call(&c, Method::POST, &s.url("/v1/locks/m1?ttl=1s"), None).await;
    assert_eq!(status, StatusCode::OK, "{lock}");
    let id = lock["lock_id"].as_str().unwrap().to_string();
    let token = lock["token"].as_u64().unwrap();
    let keepalive = s.url(&format!("/v1/locks/m1/{id}/keepalive"));
    let mut expires = lock["expires"].as_u64().unwrap();
    for _ in 0..8 {
        // A client's keep-alive cadence: a third of the lease.
        tokio::time::sleep(Duration::from_millis(330)).await;
        let (status, v) = call(&c, Method::POST, &keepalive, None).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["token"].as_u64(), Some(token));
        assert!(v["expires"].as_u64().unwrap() >= expires, "{v}");
        expires = v["expires"].as_u64().unwrap();
    }
    // Still held, more than twice its lease later: the listing shows it with its token, as
    // `zkguard locks --json` does.
    let (status, v) = call(&c, Method::GET, &s.url("/v1/locks/m1"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v[0]["monitor"], "m1", "{v}");
    assert_eq!(v[0]["token"].as_u64(), Some(token), "{v}");
    assert_eq!(v[0]["holder"]["info"], "zkguard serve explicit lock", "{v}");
    assert_eq!(
        without_ages(v),
        without_ages(cli_locks(&env, &["--monitor", "m1"]))
    );
    let (status, all) = call(&c, Method::GET, &s.url("/v1/locks"), None).await;
    assert_eq!(status, StatusCode::OK, "{all}");
    assert_eq!(without_ages(all), without_ages(cli_locks(&env, &[])));
    assert_eq!(
        scrape(&c, &s).await.get("zkguard_explicit_locks"),
        Some(&1.0)
    );
    // The limit is per service: a lock on another monitor is refused.
    let (status, v) = call(&c, Method::POST, &s.url("/v1/locks/m2"), None).await;
    assert_error(
        status,
        &v,
        StatusCode::SERVICE_UNAVAILABLE,
        "too_many_locks",
        "server.lock.max",
    );

    // Released: a try-once contender gets it at once.
    let release = s.url(&format!("/v1/locks/m1/{id}"));
    let (status, v) = call(&c, Method::DELETE, &release, None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["released"], true);
    let (status, v) = call(&c, Method::DELETE, &release, None).await;
    assert_error(
        status,
        &v,
        StatusCode::NOT_FOUND,
        "unknown_lock",
        "released",
    );
    let (status, again) = call(&c, Method::POST, &s.url("/v1/locks/m1?timeout=0"), None).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert!(again["token"].as_u64().unwrap() > token, "{again}");
    // Held by another one: a try-once contender on the same monitor is 423 (after a release
    // there is room again).
    let again_id = again["lock_id"].as_str().unwrap();
    let (status, v) = call(
        &c,
        Method::DELETE,
        &s.url(&format!("/v1/locks/m1/{again_id}")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (_held_by, _g) = hold_lock(&env, "m1").await;
    let (status, v) = call(&c, Method::POST, &s.url("/v1/locks/m1?timeout=0"), None).await;
    assert_error(status, &v, StatusCode::LOCKED, "lock_timeout", "tried once");
    assert!(!v["message"].as_str().unwrap().contains("raise"), "{v}");
    assert_eq!(
        scrape(&c, &s).await.get("zkguard_explicit_locks"),
        Some(&0.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_letters_are_listed_and_replayed_over_http() {
    let env = Env::new(&shared_zk().connect_string(), "dlq")
        .with("ZKGUARD_ZOOKEEPER_BACKGROUND_TASK_TIMEOUT", "200")
        .with("ZKGUARD_ELASTIC_REQUEST_RETRY_COUNT", "1");
    let s = env.start("a");
    let c = client();
    let index = format!("dlq-{}", uuid_tag());

    let (status, v) = call(&c, Method::GET, &s.url("/v1/deadletters"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v, json!([]));

    // Background operations whose lock is held elsewhere run out of attempts and are parked.
    let (_holder, guard) = hold_lock(&env, "dlq-doc").await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let (status, v) = put(
            &c,
            &s,
            &format!("/v1/indices/{index}/docs/{n}?type=background&monitor=dlq-doc"),
            &json!({"n": n}),
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{v}");
        ids.push(v["operation_id"].as_str().unwrap().to_string());
    }
    let states = wait_finished(&c, &s, &ids).await;
    for id in &ids {
        assert_eq!(states[id]["status"], "parked", "{}", states[id]);
    }
    let (status, listed) = call(&c, Method::GET, &s.url("/v1/deadletters"), None).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    // Parked by concurrent workers: in the order they gave up, not necessarily submitted.
    let listed_ids: HashSet<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed_ids, ids.iter().map(String::as_str).collect());
    assert_eq!(listed[0]["monitor"], "dlq-doc");
    assert_eq!(listed[0]["error_kind"], "lock_timeout", "{listed}");

    // Bad requests.
    let replay = s.url("/v1/deadletters/replay");
    let (status, v) = call(&c, Method::POST, &replay, Some("{}".into())).await;
    assert_error(status, &v, StatusCode::BAD_REQUEST, "bad_body", "say which");
    let (status, v) = call(&c, Method::POST, &replay, Some("{\"id\":".into())).await;
    assert_error(
        status,
        &v,
        StatusCode::BAD_REQUEST,
        "malformed_json",
        "{\"all\": true}",
    );
    let unknown = json!({"id": uuid::Uuid::new_v4().to_string()}).to_string();
    let (status, v) = call(&c, Method::POST, &replay, Some(unknown)).await;
    assert_error(
        status,
        &v,
        StatusCode::NOT_FOUND,
        "unknown_deadletter",
        "/v1/deadletters",
    );

    // Replayed while the lock is still held: they stay parked.
    let (status, v) = call(
        &c,
        Method::POST,
        &replay,
        Some(json!({"all": true}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["still_parked"], 3, "{v}");
    assert_eq!(
        metric(&scrape(&c, &s).await, "zkguard_deadletters_replayed_total"),
        0.0
    );

    // Released: one by id, then the rest.
    guard.unlock().await.unwrap();
    let one = json!({"id": ids[0]}).to_string();
    let (status, v) = call(&c, Method::POST, &replay, Some(one)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        (v["replayed"].as_u64(), v["applied"].as_u64()),
        (Some(1), Some(1)),
        "{v}"
    );
    assert_eq!(v["results"][0]["id"], ids[0].as_str());
    let (status, v) = call(
        &c,
        Method::POST,
        &replay,
        Some(json!({"all": true}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        (v["replayed"].as_u64(), v["applied"].as_u64()),
        (Some(2), Some(2)),
        "{v}"
    );
    for (n, id) in ids.iter().enumerate() {
        let doc = es_doc(&c, &index, &n.to_string()).await;
        assert_eq!(doc["_source"]["n"], n);
        // The status after a replay has the replay's token and the attempts, as after the queue.
        let st = op_status(&c, &s, id).await;
        assert_eq!(st["status"], "applied", "{st}");
        assert_eq!(st["token"], doc["_version"], "{st}");
        assert_eq!(
            st["attempts"], 3,
            "parked after 1, a failed replay, the replay: {st}"
        );
    }
    assert_eq!(v["results"][0]["attempts"], 3, "{v}");
    assert!(v["results"][0]["summary"].is_string(), "{v}");
    assert!(v["results"][0]["token"].is_u64(), "{v}");
    let (_, v) = call(&c, Method::GET, &s.url("/v1/deadletters"), None).await;
    assert_eq!(v, json!([]));
    assert_eq!(
        metric(&scrape(&c, &s).await, "zkguard_deadletters_replayed_total"),
        3.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transfers_run_the_two_phase_commit_over_http() {
    let tag = uuid_tag();
    let env = Env::new(&shared_zk().connect_string(), "txn")
        .with("ZKGUARD_TXN_ACCOUNTS_INDEX", &format!("accounts-{tag}"))
        .with(
            "ZKGUARD_TXN_TRANSACTIONS_INDEX",
            &format!("transactions-{tag}"),
        );
    let txn_cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_zkguard"))
            .arg("txn")
            .args(args)
            .env_remove("ZKGUARD_CONFIG")
            .env("ZKGUARD_ZOOKEEPER_SERVERS", &env.zk)
            .env("ZKGUARD_ELASTICSEARCH_URL", &env.es)
            .envs(env.extra.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap()
    };
    let init = txn_cli(&["init", "--accounts", "A=500,B=500"]);
    assert!(init.status.success(), "{init:?}");
    let s = env.start("a");
    let c = client();
    let transfers = s.url("/v1/transfers");

    let body = json!({"from": "A", "to": "B", "amount": 100, "id": "t-1"}).to_string();
    let (status, txn) = call(&c, Method::POST, &transfers, Some(body.clone())).await;
    assert_eq!(status, StatusCode::OK, "{txn}");
    assert_eq!(txn["id"], "t-1");
    assert_eq!(txn["transaction_state"], "finished", "{txn}");
    // The same transfer again reports it; it is not applied twice.
    let (status, again) = call(&c, Method::POST, &transfers, Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["transaction_state"], "finished", "{again}");
    let (status, shown) = call(&c, Method::GET, &s.url("/v1/transfers/t-1"), None).await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown, txn);

    // Refusals.
    let over = json!({"from": "A", "to": "B", "amount": 10_000}).to_string();
    let (status, v) = call(&c, Method::POST, &transfers, Some(over)).await;
    assert_error(
        status,
        &v,
        StatusCode::UNPROCESSABLE_ENTITY,
        "rejected",
        "A",
    );
    let other = json!({"from": "B", "to": "A", "amount": 1, "id": "t-1"}).to_string();
    let (status, v) = call(&c, Method::POST, &transfers, Some(other)).await;
    assert_error(status, &v, StatusCode::CONFLICT, "id_conflict", "t-1");
    let (status, v) = call(
        &c,
        Method::POST,
        &transfers,
        Some("{\"from\":\"A\"}".into()),
    )
    .await;
    assert_error(
        status,
        &v,
        StatusCode::BAD_REQUEST,
        "malformed_json",
        "amount",
    );
    let (status, v) = call(&c, Method::GET, &s.url("/v1/transfers/t-none"), None).await;
    assert_error(
        status,
        &v,
        StatusCode::NOT_FOUND,
        "unknown_transaction",
        "t-none",
    );

    let audit = txn_cli(&["audit", "--expect-total", "1000"]);
    assert!(audit.status.success(), "{audit:?}");
}

/// Sends `method url` with an optional `Authorization` header value.
async fn call_as(c: &Client, method: Method, url: &str, auth: Option<&str>) -> (StatusCode, Value) {
    let mut req = c.request(method, url);
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    let resp = req.send().await.expect("send request");
    let status = resp.status();
    let www = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string());
    let mut body: Value =
        serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap_or(Value::Null);
    if let Some(w) = www {
        body["www-authenticate"] = json!(w);
    }
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bearer_tokens_are_required_and_reloaded_on_sighup() {
    let base = Env::new(&shared_zk().connect_string(), "auth");
    let tokens = base.dir.path().join("tokens");
    std::fs::write(
        &tokens,
        "# service tokens\nalpha-secret-1\n\nbravo-secret-2\n",
    )
    .unwrap();
    let env = base.with("ZKGUARD_SERVER_AUTH_TOKENS_FILE", tokens.to_str().unwrap());
    let s = env.start("a");
    assert_eq!(s.started["auth"], true);
    let c = client();
    let ops = s.url("/v1/deadletters");
    eventually(
        Duration::from_secs(10),
        "the start says tokens are required",
        || async { s.log().contains("bearer tokens required") },
    )
    .await;

    let (status, v) = call_as(&c, Method::GET, &ops, None).await;
    assert_error(
        status,
        &v,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "Authorization: Bearer",
    );
    assert_eq!(v["www-authenticate"], "Bearer realm=\"zkguard\"", "{v}");
    let (status, v) = call_as(&c, Method::GET, &ops, Some("Bearer alpha-secret-X")).await;
    assert_error(
        status,
        &v,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "not accepted",
    );
    let (status, v) = call_as(&c, Method::GET, &ops, Some("Basic YWxwaGE6eA==")).await;
    assert_error(
        status,
        &v,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "not a bearer token",
    );
    let (status, v) = call_as(&c, Method::GET, &ops, Some("Bearer alpha-secret")).await;
    assert_error(
        status,
        &v,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "not accepted",
    );
    for good in ["Bearer alpha-secret-1", "Bearer bravo-secret-2"] {
        let (status, v) = call_as(&c, Method::GET, &ops, Some(good)).await;
        assert_eq!(status, StatusCode::OK, "{good}: {v}");
    }
    // A write with a token; probes need none.
    let put_url = s.url(&format!("/v1/indices/auth-{}/docs/1", uuid_tag()));
    let resp = c
        .put(&put_url)
        .header("authorization", "Bearer alpha-secret-1")
        .body(json!({"a": 1}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        call_as(&c, Method::PUT, &put_url, None).await.0,
        StatusCode::UNAUTHORIZED
    );
    for probe in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(
            call_as(&c, Method::GET, &s.url(probe), None).await.0,
            StatusCode::OK,
            "{probe}"
        );
    }

    // The file changes; SIGHUP reloads it: the new token works, the removed one no longer does.
    std::fs::write(&tokens, "charlie-secret-3\n").unwrap();
    s.signal(nix::sys::signal::Signal::SIGHUP);
    eventually(
        Duration::from_secs(10),
        "the new token is accepted",
        || async {
            call_as(&c, Method::GET, &ops, Some("Bearer charlie-secret-3"))
                .await
                .0
                == StatusCode::OK
        },
    )
    .await;
    let (status, v) = call_as(&c, Method::GET, &ops, Some("Bearer alpha-secret-1")).await;
    assert_error(
        status,
        &v,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "not accepted",
    );
    // A file emptied by mistake is refused; the tokens in use stay.
    std::fs::write(&tokens, "\n").unwrap();
    s.signal(nix::sys::signal::Signal::SIGHUP);
    eventually(
        Duration::from_secs(10),
        "the failed reload is logged",
        || async { s.log().contains("were not reloaded") },
    )
    .await;
    let (status, _) = call_as(&c, Method::GET, &ops, Some("Bearer charlie-secret-3")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        call_as(&c, Method::GET, &s.url("/healthz"), None).await.0,
        StatusCode::OK
    );

    let log = s.log();
    for secret in ["alpha-secret", "bravo-secret", "charlie-secret"] {
        assert!(!log.contains(secret), "a token was logged: {log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_serves_clients_that_trust_its_ca_and_no_others() {
    let base = Env::new(&shared_zk().connect_string(), "tls");
    let authority = common::certs::Ca::new(base.dir.path(), "serve");
    let ca = authority.cert();
    let (cert, key) = authority.issue("server");
    let env = base
        .with("ZKGUARD_SERVER_TLS_CERT", cert.to_str().unwrap())
        .with("ZKGUARD_SERVER_TLS_KEY", key.to_str().unwrap());
    let s = env.start("a");
    assert_eq!(s.started["tls"], true);
    assert_eq!(s.started["auth"], false);
    assert!(s.base.starts_with("https://"), "{}", s.base);
    eventually(
        Duration::from_secs(10),
        "the start says there is no authentication",
        || async {
            s.log().contains(
                "no bearer tokens configured (server.auth.tokens.file): listening on loopback only",
            )
        },
    )
    .await;

    let trusting = Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(&ca).unwrap()).unwrap())
        .tls_built_in_root_certs(false)
        .build()
        .unwrap();
    let (status, v) = call(&trusting, Method::GET, &s.url("/healthz"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, v) = put(
        &trusting,
        &s,
        &format!("/v1/indices/tls-{}/docs/1", uuid_tag()),
        &json!({"over": "tls"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");

    // A client that does not trust the CA refuses the service's certificate.
    let err = client().get(s.url("/healthz")).send().await.unwrap_err();
    assert!(err.is_connect(), "{err:?}");
    // Plain HTTP to the TLS port gets no answer.
    let plain = s.url("/healthz").replacen("https://", "http://", 1);
    assert!(client().get(plain).send().await.is_err());
    // The service still serves the trusting client after those failed handshakes.
    let (status, _) = call(&trusting, Method::GET, &s.url("/readyz"), None).await;
    assert_eq!(status, StatusCode::OK);
}

#[test]
fn bad_access_settings_are_refused_at_start_with_78() {
    let env = Env::new(&shared_zk().connect_string(), "access");
    let run = |vars: &[(&str, String)]| {
        let o = Command::new(env!("CARGO_BIN_EXE_zkguard"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env_remove("ZKGUARD_CONFIG")
            .env("ZKGUARD_ZOOKEEPER_SERVERS", &env.zk)
            .env("ZKGUARD_ZOOKEEPER_LOCK_ROOT", &env.root)
            .env("ZKGUARD_ELASTICSEARCH_URL", &env.es)
            .env("ZKGUARD_SERVER_JOURNAL_PATH", env.journal("x"))
            .envs(vars.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let dir = env.dir.path();
    let (code, err) = run(&[(
        "ZKGUARD_SERVER_TLS_CERT",
        dir.join("c.pem").display().to_string(),
    )]);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("server.tls.key"), "{err}");
    let (code, err) = run(&[
        (
            "ZKGUARD_SERVER_TLS_CERT",
            dir.join("missing.pem").display().to_string(),
        ),
        (
            "ZKGUARD_SERVER_TLS_KEY",
            dir.join("missing.key").display().to_string(),
        ),
    ]);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("server.tls.cert"), "{err}");
    let (code, err) = run(&[(
        "ZKGUARD_SERVER_AUTH_TOKENS_FILE",
        dir.join("no-tokens").display().to_string(),
    )]);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("server.auth.tokens.file"), "{err}");
    std::fs::write(dir.join("empty-tokens"), "# none yet\n").unwrap();
    let (code, err) = run(&[(
        "ZKGUARD_SERVER_AUTH_TOKENS_FILE",
        dir.join("empty-tokens").display().to_string(),
    )]);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("holds no token"), "{err}");
}

/// Runs `python3 examples/serve_client.py` with `args`; returns its status and stdout lines
/// parsed as JSON, and its stderr.
async fn python_client(args: Vec<String>) -> (Option<i32>, Vec<Value>, String) {
    tokio::task::spawn_blocking(move || {
        let o = Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/examples/serve_client.py"
            ))
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("run python3");
        let lines = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
            .collect();
        (
            o.status.code(),
            lines,
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_python_example_saves_in_the_foreground_and_submits_a_bulk_job() {
    let base = Env::new(&shared_zk().connect_string(), "python");
    let tokens = base.dir.path().join("tokens");
    std::fs::write(&tokens, "python-client-token\n").unwrap();
    let env = base.with("ZKGUARD_SERVER_AUTH_TOKENS_FILE", tokens.to_str().unwrap());
    let s = env.start("a");
    let c = client();
    let index = format!("python-{}", uuid_tag());
    let args = |token: &str| -> Vec<String> {
        [
            "--url",
            &s.base,
            "--token",
            token,
            "--index",
            &index,
            "--article",
            "7",
            "--jobs",
            "4",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect()
    };

    let (code, lines, err) = python_client(args("python-client-token")).await;
    assert_eq!(code, Some(0), "{lines:?}\n{err}");
    let summary = &lines.last().unwrap()["summary"];
    assert_eq!(summary["saved"], "written", "{summary}");
    let ops = summary["operations"].as_object().unwrap();
    assert_eq!(ops.len(), 4, "{summary}");
    assert!(ops.values().all(|s| s == "applied"), "{summary}");
    let article = es_doc(&c, &index, "7").await;
    assert_eq!(article["_source"]["title"], "Hello");
    assert_eq!(article["_version"], summary["token"], "{article}");
    for n in 0..4 {
        let related = es_doc(&c, &index, &format!("7-related-{n}")).await;
        assert_eq!(related["_source"]["source"], "7", "{related}");
    }

    // A refused request: exit 2 with the service's message.
    let (code, _, err) = python_client(args("wrong-token")).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("401") && err.contains("not accepted"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_releases_explicit_leases_on_the_elasticsearch_lock() {
    let env = Env::new(&shared_zk().connect_string(), "term-es")
        .with("ZKGUARD_LOCK_BACKEND", "elasticsearch")
        .with(
            "ZKGUARD_ELASTICSEARCH_LOCK_INDEX",
            &format!("term-locks-{}", uuid_tag()),
        )
        .with("ZKGUARD_ELASTICSEARCH_LOCK_TTL", "60000");
    let mut s = env.start("a");
    let c = client();
    let (status, lock) = call(&c, Method::POST, &s.url("/v1/locks/term-m?ttl=60s"), None).await;
    assert_eq!(status, StatusCode::OK, "{lock}");
    assert_eq!(
        cli_locks(&env, &["--monitor", "term-m"])[0]["state"],
        "held"
    );

    s.signal(nix::sys::signal::Signal::SIGTERM);
    let code = tokio::task::block_in_place(|| s.child.wait().unwrap());
    assert_eq!(code.code(), Some(0), "{}", s.log());
    // The lease was released, not left to expire in a minute.
    let listed = cli_locks(&env, &["--monitor", "term-m"]);
    assert_eq!(listed[0]["state"], "free", "{listed}");
    assert!(s.log().contains("explicit locks released"), "{}", s.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn explicit_locks_exclude_each_other_across_two_instances() {
    let env = Env::new(&shared_zk().connect_string(), "explicit-two");
    let (a, b) = (env.start("a"), env.start("b"));
    let c = client();
    let (status, held) = call(&c, Method::POST, &a.url("/v1/locks/shared-m?ttl=30s"), None).await;
    assert_eq!(status, StatusCode::OK, "{held}");
    // The other instance lists the holder and cannot take the lock.
    let (_, listed) = call(&c, Method::GET, &b.url("/v1/locks/shared-m"), None).await;
    assert_eq!(listed[0]["token"], held["token"], "{listed}");
    let (status, v) = call(
        &c,
        Method::POST,
        &b.url("/v1/locks/shared-m?timeout=0"),
        None,
    )
    .await;
    assert_error(
        status,
        &v,
        StatusCode::LOCKED,
        "lock_timeout",
        "is not free",
    );
    // A lock id belongs to the instance that gave it.
    let id = held["lock_id"].as_str().unwrap();
    let (status, v) = call(
        &c,
        Method::POST,
        &b.url(&format!("/v1/locks/shared-m/{id}/keepalive")),
        None,
    )
    .await;
    assert_error(
        status,
        &v,
        StatusCode::NOT_FOUND,
        "unknown_lock",
        "held here",
    );
    // Released on the first instance: the second one takes it, with a greater token.
    let (status, v) = call(
        &c,
        Method::DELETE,
        &a.url(&format!("/v1/locks/shared-m/{id}")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, next) = call(
        &c,
        Method::POST,
        &b.url("/v1/locks/shared-m?timeout=0"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{next}");
    assert!(
        next["token"].as_u64().unwrap() > held["token"].as_u64().unwrap(),
        "{next} after {held}"
    );
}
