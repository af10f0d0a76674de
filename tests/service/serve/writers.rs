//! Guarded writes from concurrent clients: token order, foreground over background, two
//! instances on one ZooKeeper, the journal across SIGKILL, a ZooKeeper outage, the Elasticsearch
//! lease lock backend.

use super::*;
use crate::serve_controls::{check_doc, outcome_token};

/// Runs a mixed workload of foreground and background writes from `clients` concurrent
/// clients, spread over `services`, on `docs` shared documents; returns op id -> token per doc.
async fn mixed_workload(
    services: &[&Service],
    index: &str,
    docs: usize,
    clients: usize,
    per_client: usize,
    background: bool,
) -> HashMap<String, HashMap<String, Option<u64>>> {
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
                    fg.push((doc, op, outcome_token(&v)));
                }
            }
            (fg, bg)
        }));
    }
    let mut per_doc: HashMap<String, HashMap<String, Option<u64>>> = HashMap::new();
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
                .insert(op.clone(), outcome_token(v));
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
    let mut per_doc: HashMap<String, HashMap<String, Option<u64>>> = HashMap::new();
    for (i, id) in ids.iter().enumerate() {
        let v = &states[id];
        assert_eq!(v["status"], "applied", "{v}");
        per_doc
            .entry(format!("d{}", i % 4))
            .or_default()
            .insert(id.clone(), outcome_token(v));
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

/// An operation the service finds already applied in its document (written before a kill or a
/// takeover, its outcome not recorded) reports the fencing token of the write that applied it,
/// not the token of the service's own later lock: the document's version while the operation
/// is the document's last one, no token (and `already_applied`) once later ones were written
/// over it. Forced here by writing the operations through the library under an earlier lock,
/// then sending them to the service, whose journal does not know them: a background one is
/// queued, applied under a new lock and found in its document, as a replay after a kill finds
/// the operations written but not recorded before it; a foreground one likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operation_found_applied_in_its_document_reports_the_token_of_the_write_that_applied_it()
{
    use std::sync::Arc;
    use zkguard::es::EsStore;
    use zkguard::write::guarded::GuardedWriter;
    use zkguard::write::ops::Operation;

    let env = Env::new(&shared_zk().connect_string(), "found");
    let c = client();
    let s = env.start("a");
    let index = format!("found-{}", uuid_tag());
    let monitor = format!("found-{}", uuid_tag());
    let op = |id: &str, n: i64| Operation::index(&monitor, &index, id, json!({ "n": n }));
    let (last, over, later, fg) = (op("last", 1), op("over", 1), op("over", 2), op("fg", 1));
    let (locks, guard) = hold_lock(&env, &monitor).await;
    let store = Arc::new(EsStore::from_url(shared_es().url()).unwrap());
    let writer = GuardedWriter::new(Arc::new(locks), store);
    for o in [&last, &over, &later, &fg] {
        writer.write_under(guard.as_ref(), o).await.unwrap();
    }
    let applied = guard.fencing_token();
    guard.unlock().await.unwrap();

    let send = |o: &Operation, ty: &str| {
        format!(
            "/v1/indices/{index}/docs/{}?type={ty}&monitor={monitor}&op_id={}",
            o.target_id(),
            o.id
        )
    };
    let mut ids = Vec::new();
    for o in [&last, &over] {
        let (status, v) = put(&c, &s, &send(o, "background"), &json!({"n": 1})).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{v}");
        assert_eq!(v["status"], "queued", "the journal does not know it: {v}");
        ids.push(o.id.to_string());
    }
    let states = wait_finished(&c, &s, &ids).await;
    let found = &states[&ids[0]];
    assert_eq!(found["status"], "applied", "{found}");
    assert_eq!(
        found["token"].as_u64(),
        Some(applied),
        "the outcome of an operation found applied reports the token of the write that applied it (the document's version), not the service's lock's: {found}"
    );
    assert_eq!(found["already_applied"], true, "{found}");
    assert_eq!(es_doc(&c, &index, "last").await["_version"], applied);
    let covered = &states[&ids[1]];
    assert_eq!(covered["status"], "applied", "{covered}");
    assert_eq!(covered["already_applied"], true, "{covered}");
    assert!(
        covered.get("token").is_none(),
        "a later operation was written over it: the document no longer tells its token, and the outcome says none rather than a wrong one: {covered}"
    );

    // A foreground retry found in its document answers the same token.
    let (status, v) = put(&c, &s, &send(&fg, "foreground"), &json!({"n": 1})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["result"], "already_applied", "{v}");
    assert_eq!(v["token"].as_u64(), Some(applied), "{v}");
    assert_eq!(
        op_status(&c, &s, &fg.id.to_string()).await["token"],
        applied
    );
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
