//! Document transactions through `zkguard serve`: `POST /v1/transactions`,
//! `GET /v1/transactions/{id}`, the gate's atomic `_bulk` driven by the official Python
//! clients, the service's own recovery of a transaction whose coordinator died, and
//! transactions beside single writes through `/v1` and the gate and background jobs.

use crate::common;
use crate::gateway_support;
use crate::serve_support;

use std::collections::HashMap;
use std::process::{Command, Stdio};

use common::*;
use gateway_support::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use serve_support::*;

async fn post_txn(c: &reqwest::Client, s: &Service, body: &Value) -> (StatusCode, Value) {
    call(
        c,
        Method::POST,
        &s.url("/v1/transactions"),
        Some(body.to_string()),
    )
    .await
}

async fn source(c: &reqwest::Client, index: &str, id: &str) -> Option<Value> {
    let url = format!("{}/{index}/_doc/{id}", shared_es().url());
    let (_, mut doc) = call(c, Method::GET, &url, None).await;
    if doc["found"] != true {
        return None;
    }
    let mut src = doc["_source"].take();
    src.as_object_mut().unwrap().remove("zkguard");
    Some(src)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_through_v1_commit_roll_back_and_refuse_bad_input() {
    let env = Env::new(&shared_zk().connect_string(), "txn-v1")
        .with("ZKGUARD_TXN_MAX_OPERATIONS", "3")
        .with(
            "ZKGUARD_TXN_LOG_INDEX",
            &format!("txn-v1-log-{}", uuid_tag()),
        );
    let s = env.start("txn-v1");
    let c = client();
    let ix = format!("txn-v1-{}", uuid_tag());
    put(
        &c,
        &s,
        &format!("/v1/indices/{ix}/docs/keep"),
        &json!({"n": 1}),
    )
    .await;
    let ops = json!([
        {"action": "index", "index": ix, "id": "a", "doc": {"v": 1}, "expect": {"exists": false}},
        {"action": "update", "index": ix, "id": "keep", "doc": {"m": 2}},
    ]);
    let (status, out) = post_txn(&c, &s, &json!({"id": "t1", "operations": ops})).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["state"], "committed", "{out}");
    assert_eq!(out["documents"][0]["result"], "created");
    assert_eq!(source(&c, &ix, "keep").await, Some(json!({"n": 1, "m": 2})));
    let (status, got) = call(&c, Method::GET, &s.url("/v1/transactions/t1"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (got["state"].as_str(), got["decision"].as_str()),
        (Some("finished"), Some("committed")),
        "{got}"
    );
    // The same id, the same operations: the stored decision. Other operations: 409.
    let (status, again) = post_txn(&c, &s, &json!({"id": "t1", "operations": ops})).await;
    assert_eq!((status, &again), (StatusCode::OK, &out));
    let (status, e) = post_txn(&c, &s, &json!({"id": "t1", "operations": [ops[0]]})).await;
    assert_eq!(
        (status, e["error"].as_str()),
        (StatusCode::CONFLICT, Some("transaction_id_reused")),
        "{e}"
    );
    // A failed expectation: 200, rolled back, the document named, nothing written.
    let (status, out) = post_txn(&c, &s, &json!({"operations": [
        {"action": "index", "index": ix, "id": "b", "doc": {"v": 1}},
        {"action": "delete", "index": ix, "id": "a", "expect": {"if_seq_no": 9999, "if_primary_term": 1}},
    ]})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (out["state"].as_str(), out["failed"].as_str()),
        (Some("rolled-back"), Some(format!("{ix}/a").as_str())),
        "{out}"
    );
    assert_eq!(source(&c, &ix, "b").await, None);
    // Bad input, each with its kind and nothing written.
    let one = |id: &str| json!({"action": "index", "index": ix, "id": id, "doc": {}});
    for (body, want, kind) in [
        (
            json!({"operations": [one("1"), one("2"), one("3"), one("4")]}),
            StatusCode::PAYLOAD_TOO_LARGE,
            "transaction_too_large",
        ),
        (
            json!({"operations": [one("1"), one("1")]}),
            StatusCode::BAD_REQUEST,
            "invalid_transaction",
        ),
        (
            json!({"operations": [{"action": "upsert", "index": ix, "id": "1"}]}),
            StatusCode::BAD_REQUEST,
            "malformed_json",
        ),
        (
            json!({"operations": []}),
            StatusCode::BAD_REQUEST,
            "invalid_transaction",
        ),
        (
            json!({"operations": [{"action": "index", "index": env_log(&env), "id": "x", "doc": {}}]}),
            StatusCode::FORBIDDEN,
            "protected_index",
        ),
    ] {
        let (status, e) = post_txn(&c, &s, &body).await;
        assert_eq!(
            (status, e["error"].as_str()),
            (want, Some(kind)),
            "{body}: {e}"
        );
        assert!(!e["message"].as_str().unwrap().is_empty());
    }
    assert_eq!(source(&c, &ix, "1").await, None);
    let (status, e) = call(&c, Method::GET, &s.url("/v1/transactions/nope"), None).await;
    assert_eq!(
        (status, e["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("transaction_not_found"))
    );
    let m = scrape(&c, &s).await;
    assert_eq!(
        m.get(r#"zkguard_transactions_total{outcome="committed"}"#),
        Some(&1.0),
        "{m:?}"
    );
    assert_eq!(
        m.get(r#"zkguard_transactions_total{outcome="rolled-back"}"#),
        Some(&1.0)
    );
}

fn env_log(env: &Env) -> String {
    env.extra
        .iter()
        .find(|(k, _)| k == "ZKGUARD_TXN_LOG_INDEX")
        .unwrap()
        .1
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_applies_an_atomic_bulk_all_or_nothing_with_official_clients() {
    let front = Front::start(shared_es().url());
    let env = gate_env(&shared_zk().connect_string(), "txn-gate", &front.url).with(
        "ZKGUARD_TXN_LOG_INDEX",
        &format!("txn-gate-log-{}", uuid_tag()),
    );
    let s = env.start("txn-gate");
    let url = gate(&s);
    for client in ["opensearch", "elasticsearch"] {
        let ix = format!("txn-gate-{client}-{}", uuid_tag());
        let out = python_script("tests/support/txn_docs/atomic_bulk.py", client, &url, &ix).await;
        assert_eq!(out["client"], client);
    }
    // Refused as a whole, with Elasticsearch's error shape: an item with no id.
    let c = client();
    let body = "{\"index\":{\"_index\":\"txn-gate-x\"}}\n{\"v\":1}\n";
    let (status, _, e) = send(
        &c,
        Method::POST,
        &format!("{url}/_bulk"),
        Some(body),
        &[("x-zkguard-atomic", "true")],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{e}");
    assert!(
        e["error"]["reason"].as_str().unwrap().contains("no _id"),
        "{e}"
    );
}

/// Starts `zkguard txn apply` of `{"v": "after"}` on `docs` as transaction `id`, and kills it
/// (SIGKILL) once it says it paused at `point`.
fn kill_after(env: &Env, log: &str, ix: &str, docs: &[&str], id: &str, point: &str) {
    let ops: Vec<Value> = docs
        .iter()
        .map(|d| json!({"action": "update", "index": ix, "id": d, "doc": {"v": "after"}}))
        .collect();
    kill_after_ops(env, log, &ops, id, point);
}

/// `zkguard txn ARGS` against the service's ZooKeeper, cluster and log index.
fn txn_command(env: &Env, log: &str, args: &[&str]) -> Command {
    let mut command = crate::cli::zkguard();
    command
        .arg("txn")
        .args(args)
        .env_remove("ZKGUARD_CONFIG")
        .env("ZKGUARD_ZOOKEEPER_SERVERS", &env.zk)
        .env("ZKGUARD_ZOOKEEPER_LOCK_ROOT", &env.root)
        .env("ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT", "2000")
        .env("ZKGUARD_ELASTICSEARCH_URL", &env.es)
        .env("ZKGUARD_TXN_LOG_INDEX", log)
        .env("ZKGUARD_TXN_RECOVERY_AFTER", "0");
    command
}

/// Starts `zkguard txn apply` of `ops` as transaction `id`, and kills it (SIGKILL) once it
/// says it paused at `point`.
fn kill_after_ops(env: &Env, log: &str, ops: &[Value], id: &str, point: &str) {
    let ops: String = ops.iter().map(|op| op.to_string() + "\n").collect();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), ops).unwrap();
    let mut child = txn_command(env, log, &["apply", "--id", id, "--pause-after", point])
        .arg("--file")
        .arg(file.path())
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut err, &mut line).unwrap();
    assert!(line.starts_with(&format!("paused after {point}")), "{line}");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A coordinator killed after writing its three documents, before its commit, leaves them
/// marked. Single writers that build on them (a `/v1` merge patch, the gate's `_update`, a
/// background update) have that transaction decided first: they merge into the documents as
/// they were before it, and it ends rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_writers_never_build_on_a_stopped_transaction() {
    let log = format!("txn-dirty-log-{}", uuid_tag());
    let env = gate_env(
        &shared_zk().connect_string(),
        "txn-dirty",
        shared_es().url(),
    )
    .with("ZKGUARD_TXN_LOG_INDEX", &log)
    .with("ZKGUARD_TXN_RECOVERY_AFTER", "600000");
    let s = env.start("txn-dirty");
    let c = client();
    let ix = format!("txn-dirty-{}", uuid_tag());
    for id in ["x", "y", "z"] {
        put(
            &c,
            &s,
            &format!("/v1/indices/{ix}/docs/{id}"),
            &json!({"v": "before"}),
        )
        .await;
    }
    kill_after(&env, &log, &ix, &["x", "y", "z"], "stopped", "applied:3");
    for id in ["x", "y", "z"] {
        assert_eq!(
            source(&c, &ix, id).await,
            Some(json!({"v": "after"})),
            "{id}"
        );
    }
    let (status, v) = call(
        &c,
        Method::PATCH,
        &s.url(&format!("/v1/indices/{ix}/docs/x")),
        Some(json!({"w": "patch"}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, _, v) = send(
        &c,
        Method::POST,
        &format!("{}/{ix}/_update/y", gate(&s)),
        Some(&json!({"doc": {"w": "gate"}}).to_string()),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let bulk = json!({"action": "update", "index": ix, "id": "z", "doc": {"w": "bg"}}).to_string();
    let (status, accepted) = call(&c, Method::POST, &s.url("/v1/bulk"), Some(bulk)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let op = accepted["operations"][0]["operation_id"]
        .as_str()
        .unwrap()
        .to_string();
    let done = wait_finished(&c, &s, &[op]).await;
    assert!(done.values().all(|v| v["status"] == "applied"), "{done:?}");
    assert_eq!(
        source(&c, &ix, "x").await,
        Some(json!({"v": "before", "w": "patch"}))
    );
    assert_eq!(
        source(&c, &ix, "y").await,
        Some(json!({"v": "before", "w": "gate"}))
    );
    assert_eq!(
        source(&c, &ix, "z").await,
        Some(json!({"v": "before", "w": "bg"}))
    );
    let (_, t) = call(&c, Method::GET, &s.url("/v1/transactions/stopped"), None).await;
    assert_eq!(t["state"], "rolling-back", "{t}");
}

/// One recovery pass (`zkguard txn recover --once`) over the service's log.
fn recover_once(env: &Env, log: &str) {
    let out = txn_command(env, log, &["recover", "--once", "--lock-wait", "30s"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// A document's stored source, straight from the cluster, with its `zkguard` object.
async fn raw_source(c: &reqwest::Client, ix: &str, id: &str) -> Value {
    es_doc(c, ix, id).await["_source"].clone()
}

/// An `_update` through the gate: status and answer.
async fn gate_update(
    c: &reqwest::Client,
    s: &Service,
    ix: &str,
    id: &str,
    doc: Value,
) -> (StatusCode, Value) {
    let url = format!("{}/{ix}/_update/{id}", gate(s));
    let (status, _, v) = send(
        c,
        Method::POST,
        &url,
        Some(&json!({"doc": doc}).to_string()),
        &[],
    )
    .await;
    (status, v)
}

/// A `_bulk` of one update through the gate: the item's answer.
async fn gate_bulk_update(
    c: &reqwest::Client,
    s: &Service,
    ix: &str,
    id: &str,
    doc: Value,
) -> Value {
    let body = format!(
        "{}\n{}\n",
        json!({"update": {"_index": ix, "_id": id}}),
        json!({"doc": doc})
    );
    let (status, _, v) = send(
        c,
        Method::POST,
        &format!("{}/_bulk", gate(s)),
        Some(&body),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v["items"][0]["update"].clone()
}

/// A read-modify-write client: reads the document straight from the cluster (its `zkguard`
/// object included), sets `field` and sends it all back through the gate with a `PUT`.
async fn gate_put_as_read(c: &reqwest::Client, s: &Service, ix: &str, id: &str, field: &str) {
    let mut doc = raw_source(c, ix, id).await;
    assert!(
        doc["zkguard"]["txn"].is_string(),
        "read with the mark: {doc}"
    );
    doc[field] = json!(field);
    let url = format!("{}/{ix}/_doc/{id}", gate(s));
    let (status, _, v) = send(c, Method::PUT, &url, Some(&doc.to_string()), &[]).await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

/// A service that recovers only when told (`zkguard txn recover`), its log and a fresh index
/// of documents `ids` seeded as `{"v": "before"}` through `/v1`.
async fn stopped_txn_world(tag: &str, ids: &[&str]) -> (Env, String, Service, String) {
    let log = format!("{tag}-log-{}", uuid_tag());
    let env = gate_env(&shared_zk().connect_string(), tag, shared_es().url())
        .with("ZKGUARD_TXN_LOG_INDEX", &log)
        .with("ZKGUARD_TXN_RECOVERY_AFTER", "600000");
    let s = env.start(tag);
    let ix = format!("{tag}-{}", uuid_tag());
    for id in ids {
        let (status, v) = put(
            &client(),
            &s,
            &format!("/v1/indices/{ix}/docs/{id}"),
            &json!({"v": "before"}),
        )
        .await;
        assert!(status.is_success(), "{v}");
    }
    (env, log, s, ix)
}

/// A transaction committed, its coordinator killed before it cleared its marks. Writes
/// acknowledged afterwards (the gate's `_update`, a `_bulk` update, a `PUT` of the document as
/// read with its `zkguard` object, a `/v1` merge patch) are what the documents hold once
/// recovery has finished the transaction; `_update` of the document it deleted answers 404
/// as Elasticsearch does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_after_a_committed_stopped_transaction_survive_its_recovery() {
    let docs = ["u", "b", "p", "v", "d"];
    let (env, log, s, ix) = stopped_txn_world("txn-late", &docs).await;
    let c = client();
    let mut ops: Vec<Value> = docs[..4]
        .iter()
        .map(|d| json!({"action": "update", "index": ix, "id": d, "doc": {"v": "after"}}))
        .collect();
    ops.push(json!({"action": "delete", "index": ix, "id": "d"}));
    kill_after_ops(&env, &log, &ops, "late", "committed");
    assert_eq!(raw_source(&c, &ix, "u").await["zkguard"]["txn"], "late");

    let (status, v) = gate_update(&c, &s, &ix, "u", json!({"w": "update"})).await;
    assert_eq!(
        (status, v["result"].as_str()),
        (StatusCode::OK, Some("updated")),
        "{v}"
    );
    let item = gate_bulk_update(&c, &s, &ix, "b", json!({"w": "bulk"})).await;
    assert_eq!(item["status"], 200, "{item}");
    gate_put_as_read(&c, &s, &ix, "p", "put").await;
    let (status, v) = call(
        &c,
        Method::PATCH,
        &s.url(&format!("/v1/indices/{ix}/docs/v")),
        Some(json!({"w": "patch"}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, v) = gate_update(&c, &s, &ix, "d", json!({"w": "update"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["error"]["type"], "document_missing_exception", "{v}");

    recover_once(&env, &log);
    let (_, t) = call(&c, Method::GET, &s.url("/v1/transactions/late"), None).await;
    assert_eq!(t["state"], "finished", "{t}");
    for (id, want) in [
        ("u", json!({"v": "after", "w": "update"})),
        ("b", json!({"v": "after", "w": "bulk"})),
        ("p", json!({"v": "after", "put": "put"})),
        ("v", json!({"v": "after", "w": "patch"})),
    ] {
        assert_eq!(source(&c, &ix, id).await, Some(want), "{id}");
        let raw = raw_source(&c, &ix, id).await;
        assert!(
            raw["zkguard"].get("txn").is_none(),
            "{id} still marked: {raw}"
        );
    }
    assert_eq!(source(&c, &ix, "d").await, None);
}

/// A transaction stopped before its commit (its coordinator killed): a client's `PUT` of the
/// document as read (the uncommitted write, its mark included) is acknowledged, and neither a
/// later `_update` or `_bulk` update nor the transaction's recovery gives the document its
/// before-image back over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_of_a_marked_document_survives_the_rollback_of_its_transaction() {
    let docs = ["q", "r", "s"];
    let (env, log, s, ix) = stopped_txn_world("txn-undo", &docs).await;
    let c = client();
    kill_after(&env, &log, &ix, &docs, "undone", "applied:3");

    gate_put_as_read(&c, &s, &ix, "q", "put").await;
    let (status, v) = gate_update(&c, &s, &ix, "q", json!({"x": "update"})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    gate_put_as_read(&c, &s, &ix, "r", "put").await;
    let item = gate_bulk_update(&c, &s, &ix, "r", json!({"x": "bulk"})).await;
    assert_eq!(item["status"], 200, "{item}");

    recover_once(&env, &log);
    let (_, t) = call(&c, Method::GET, &s.url("/v1/transactions/undone"), None).await;
    assert_eq!(t["state"], "rolled-back", "{t}");
    for (id, x) in [("q", "update"), ("r", "bulk")] {
        assert_eq!(
            source(&c, &ix, id).await,
            Some(json!({"v": "after", "put": "put", "x": x})),
            "{id}"
        );
    }
    assert_eq!(source(&c, &ix, "s").await, Some(json!({"v": "before"})));
}

/// A document of `ix` read straight from the cluster with an `_mget` (ids `.` and `..` cannot
/// be carried by a path): its source, its `zkguard` object included; `None` when absent.
async fn mget_source(c: &reqwest::Client, ix: &str, id: &str) -> Option<Value> {
    let url = format!("{}/{ix}/_mget", shared_es().url().trim_end_matches('/'));
    let body = json!({"docs": [{"_id": id}]}).to_string();
    let (status, v) = call(c, Method::POST, &url, Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let doc = &v["docs"][0];
    (doc["found"] == true).then(|| doc["_source"].clone())
}

/// Ids `.` and `..` marked by a transaction whose coordinator stopped before its commit: a gate
/// write to each has the transaction decided on that document first (its write undone through
/// the library's document store, whose URLs cannot carry such ids as path segments: `.` gets
/// its before-image back, `..`, which the transaction created, is deleted), then applies; the
/// index and its other documents are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dot_ids_marked_by_a_stopped_transaction_are_settled_by_a_gate_write() {
    let (env, log, s, ix) = stopped_txn_world("txn-dots", &["keep"]).await;
    let c = client();
    let addr = gate(&s).trim_start_matches("http://").to_string();
    let (status, v) = raw(
        &addr,
        "PUT",
        &format!("/{ix}/_doc/."),
        Some(r#"{"v":"before"}"#),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let ops = [
        json!({"action": "update", "index": ix, "id": ".", "doc": {"v": "after"}}),
        json!({"action": "index", "index": ix, "id": "..", "doc": {"v": "after"}}),
    ];
    kill_after_ops(&env, &log, &ops, "dots", "applied:2");
    for id in [".", ".."] {
        let marked = mget_source(&c, &ix, id)
            .await
            .expect("written by the transaction");
        assert_eq!(marked["zkguard"]["txn"], "dots", "{id}: {marked}");
    }

    let (status, v) = raw(
        &addr,
        "POST",
        &format!("/{ix}/_update/."),
        Some(r#"{"doc":{"w":"gate"}}"#),
    )
    .await;
    assert_eq!((status, &v["result"]), (200, &json!("updated")), "{v}");
    let (status, v) = raw(
        &addr,
        "PUT",
        &format!("/{ix}/_create/.."),
        Some(r#"{"w":"gate"}"#),
    )
    .await;
    assert_eq!((status, &v["result"]), (201, &json!("created")), "{v}");

    for (id, want) in [
        (".", json!({"v": "before", "w": "gate"})),
        ("..", json!({"w": "gate"})),
    ] {
        let mut got = mget_source(&c, &ix, id).await.expect("written by the gate");
        assert!(
            got["zkguard"].get("txn").is_none(),
            "{id} still marked: {got}"
        );
        got.as_object_mut().unwrap().remove("zkguard");
        assert_eq!(got, want, "{id}");
    }
    assert_eq!(source(&c, &ix, "keep").await, Some(json!({"v": "before"})));
    let (_, t) = call(&c, Method::GET, &s.url("/v1/transactions/dots"), None).await;
    assert_eq!(t["state"], "rolling-back", "{t}");
    recover_once(&env, &log);
    let (_, t) = call(&c, Method::GET, &s.url("/v1/transactions/dots"), None).await;
    assert_eq!(t["state"], "rolled-back", "{t}");
    assert_eq!(
        mget_source(&c, &ix, ".").await.map(|mut d| {
            d.as_object_mut().unwrap().remove("zkguard");
            d
        }),
        Some(json!({"v": "before", "w": "gate"})),
        "recovery leaves the gate's write"
    );
}

/// A coordinator killed half-way (SIGKILL after writing one of its three documents) is
/// undone by the service's own recovery, without any command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_recovers_a_transaction_whose_coordinator_died() {
    let log = format!("txn-rec-log-{}", uuid_tag());
    let env = Env::new(&shared_zk().connect_string(), "txn-rec")
        .with("ZKGUARD_TXN_LOG_INDEX", &log)
        .with("ZKGUARD_TXN_RECOVERY_AFTER", "1000");
    let s = env.start("txn-rec");
    let c = client();
    let ix = format!("txn-rec-{}", uuid_tag());
    for id in ["a", "b", "c"] {
        put(
            &c,
            &s,
            &format!("/v1/indices/{ix}/docs/{id}"),
            &json!({"v": "before"}),
        )
        .await;
    }
    kill_after(&env, &log, &ix, &["a", "b", "c"], "dies", "applied:1");
    let marked = (futures::future::join_all(["a", "b", "c"].map(|id| es_doc(&c, &ix, id))).await)
        .iter()
        .filter(|d| d["_source"]["zkguard"]["txn"] == "dies")
        .count();
    assert_eq!(
        marked, 1,
        "one document written with the mark before the kill"
    );
    eventually(
        std::time::Duration::from_secs(30),
        "the service rolls the transaction back",
        || {
            let c = c.clone();
            let s = &s;
            async move {
                let (_, t) = call(&c, Method::GET, &s.url("/v1/transactions/dies"), None).await;
                t["state"] == "rolled-back"
            }
        },
    )
    .await;
    for id in ["a", "b", "c"] {
        assert_eq!(
            source(&c, &ix, id).await,
            Some(json!({"v": "before"})),
            "{id}"
        );
    }
    // The pass counts what it recovered once it has gone over every transaction it examined,
    // so the count may follow the log's state by a moment.
    let key = r#"zkguard_transactions_recovered_total{outcome="rolled-back"}"#;
    eventually(
        std::time::Duration::from_secs(30),
        "the recovery pass counts the rolled-back transaction",
        || {
            let c = c.clone();
            let s = &s;
            async move { scrape(&c, s).await.get(key).is_some_and(|v| *v >= 1.0) }
        },
    )
    .await;
    assert_eq!(scrape(&c, &s).await.get(key), Some(&1.0), "counted once");
}

/// Transactions over overlapping documents through `/v1/transactions` and the gate's atomic
/// `_bulk`, beside single writes through `/v1` and the gate and a background bulk job on the
/// same documents: everything acknowledged ends applied, and the final documents are those of
/// a serial order (a transaction that is the last writer of one of its documents was not
/// overwritten on another by a write granted its lock before it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_beside_single_and_background_writers_are_serializable() {
    let env = gate_env(&shared_zk().connect_string(), "txn-mix", shared_es().url()).with(
        "ZKGUARD_TXN_LOG_INDEX",
        &format!("txn-mix-log-{}", uuid_tag()),
    );
    let s = env.start("txn-mix");
    let url = gate(&s);
    let c = client();
    let ix = format!("txn-mix-{}", uuid_tag());
    let docs = ["d0", "d1", "d2", "d3", "d4"];
    let mut tasks = Vec::new();
    for w in 0..3 {
        let (c, base, url, ix) = (c.clone(), s.base.clone(), url.clone(), ix.clone());
        tasks.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for round in 0..8 {
                let id = format!("w{w}-{round}");
                let mut set: Vec<&str> = docs.iter().copied().enumerate().filter(|(i, _)| (i + round + w) % 3 != 0).map(|(_, d)| d).collect();
                if w % 2 == 1 {
                    set.reverse();
                }
                if w == 2 {
                    // Through the gate's atomic _bulk.
                    let body: String = set.iter().map(|d| format!("{{\"index\":{{\"_index\":\"{ix}\",\"_id\":\"{d}\"}}}}\n{{\"txn\":\"{id}\"}}\n")).collect();
                    let (status, _, out) = send(&c, Method::POST, &format!("{url}/_bulk"), Some(&body), &[("x-zkguard-atomic", "true"), ("idempotency-key", &id)]).await;
                    assert_eq!(status, StatusCode::OK, "{out}");
                    assert_eq!(out["errors"], false, "{out}");
                } else {
                    let ops: Vec<Value> = set.iter().map(|d| json!({"action": "index", "index": ix, "id": d, "doc": {"txn": id}})).collect();
                    let (status, out) = call(&c, Method::POST, &format!("{base}/v1/transactions"), Some(json!({"id": id, "operations": ops}).to_string())).await;
                    assert_eq!((status, out["state"].as_str()), (StatusCode::OK, Some("committed")), "{out}");
                }
                outcomes.push(id);
            }
            outcomes
        }));
    }
    let singles = {
        let (c, base, url, ix) = (c.clone(), s.base.clone(), url.clone(), ix.clone());
        tokio::spawn(async move {
            for n in 0..10 {
                let d = docs[n % docs.len()];
                let (status, v) = if n % 2 == 0 {
                    call(
                        &c,
                        Method::PUT,
                        &format!("{base}/v1/indices/{ix}/docs/{d}"),
                        Some(json!({"single": n}).to_string()),
                    )
                    .await
                } else {
                    let (st, _, v) = send(
                        &c,
                        Method::PUT,
                        &format!("{url}/{ix}/_doc/{d}"),
                        Some(&json!({"single": n}).to_string()),
                        &[],
                    )
                    .await;
                    (st, v)
                };
                assert!(status.is_success(), "{v}");
            }
        })
    };
    let bulk: String = docs
        .iter()
        .map(|d| {
            json!({"action": "update", "index": ix, "id": d, "doc": {"bg": true}, "upsert": true})
                .to_string()
                + "\n"
        })
        .collect();
    let (status, accepted) = call(&c, Method::POST, &s.url("/v1/bulk"), Some(bulk)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let ids: Vec<String> = accepted["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["operation_id"].as_str().unwrap().to_string())
        .collect();
    let mut txn_ids = Vec::new();
    for t in tasks {
        txn_ids.extend(t.await.unwrap());
    }
    singles.await.unwrap();
    let finished = wait_finished(&c, &s, &ids).await;
    assert!(
        finished.values().all(|v| v["status"] == "applied"),
        "{finished:?}"
    );
    // Each transaction's token on each of its documents, from the log.
    let mut tokens: Vec<(String, HashMap<String, u64>)> = Vec::new();
    for id in &txn_ids {
        let (_, t) = call(
            &c,
            Method::GET,
            &s.url(&format!("/v1/transactions/{id}")),
            None,
        )
        .await;
        assert_eq!(t["decision"], "committed", "{t}");
        let per_doc = t["documents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["id"].as_str().unwrap().to_string(),
                    d["_version"].as_u64().unwrap(),
                )
            })
            .collect();
        tokens.push((id.clone(), per_doc));
    }
    // Serializable: two transactions that share documents are ordered the same way on all of
    // them (each document's writes are ordered by their tokens).
    for (i, (a, ta)) in tokens.iter().enumerate() {
        for (b, tb) in &tokens[i + 1..] {
            let orders: std::collections::HashSet<bool> = ta
                .iter()
                .filter_map(|(d, x)| tb.get(d).map(|y| x < y))
                .collect();
            assert!(
                orders.len() <= 1,
                "{a} and {b} are ordered differently on different documents: {ta:?} {tb:?}"
            );
        }
    }
    // And a document that still shows a transaction's write shows the last transaction that
    // wrote it.
    for d in docs {
        let doc = es_doc(&c, &ix, d).await;
        if let Some(shown) = doc["_source"]["txn"].as_str() {
            let last = tokens
                .iter()
                .filter_map(|(id, t)| t.get(d).map(|tok| (tok, id)))
                .max()
                .unwrap()
                .1;
            assert_eq!(shown, last, "{d}: {doc}");
        }
    }
}

/// What a reader of the cluster finds after an atomic `_bulk` committed through the gate, as
/// docs/gateway.md says: its documents carry zkguard's stamp (a `zkguard` object, no mark
/// once cleared), a deleted document is gone (no tombstone), and a later single write through
/// the gate stores the document exactly as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_atomic_bulk_leaves_its_stamp_but_no_mark_or_tombstone() {
    let log = format!("txn-stamp-log-{}", uuid_tag());
    let env = gate_env(
        &shared_zk().connect_string(),
        "txn-stamp",
        shared_es().url(),
    )
    .with("ZKGUARD_TXN_LOG_INDEX", &log);
    let s = env.start("txn-stamp");
    let (url, c) = (gate(&s), client());
    let ix = format!("txn-stamp-{}", uuid_tag());
    let (st, _, _) = send(
        &c,
        Method::PUT,
        &format!("{url}/{ix}/_doc/c"),
        Some("{\"v\":0}"),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    assert!(raw_source(&c, &ix, "c").await.get("zkguard").is_none());
    let body = format!(
        "{{\"index\":{{\"_index\":\"{ix}\",\"_id\":\"a\"}}}}\n{{\"v\":1}}\n{{\"delete\":{{\"_index\":\"{ix}\",\"_id\":\"c\"}}}}\n"
    );
    let (st, _, v) = send(
        &c,
        Method::POST,
        &format!("{url}/_bulk"),
        Some(&body),
        &[("x-zkguard-atomic", "true")],
    )
    .await;
    assert_eq!((st, &v["errors"]), (StatusCode::OK, &json!(false)), "{v}");
    let a = raw_source(&c, &ix, "a").await;
    assert_eq!(a["v"], 1, "{a}");
    assert!(a["zkguard"].is_object(), "the stamp stays: {a}");
    assert!(
        a["zkguard"].get("txn").is_none(),
        "no mark once cleared: {a}"
    );
    let (st, gone) = call(
        &c,
        Method::GET,
        &format!("{}/{ix}/_doc/c", shared_es().url()),
        None,
    )
    .await;
    assert_eq!(
        (st, &gone["found"]),
        (StatusCode::NOT_FOUND, &json!(false)),
        "{gone}"
    );
    let (st, _, _) = send(
        &c,
        Method::PUT,
        &format!("{url}/{ix}/_doc/a"),
        Some("{\"v\":2}"),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(raw_source(&c, &ix, "a").await, json!({"v": 2}));
}
