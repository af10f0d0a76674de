//! Explicit locks named by the document they guard: `POST /v1/locks?index=I&id=D` takes the
//! lock of the same monitor as a write of that document, so the writes through the service wait
//! for it.

use crate::common;
use crate::serve_support;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::json;
use serve_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_lock_taken_on_a_document_guards_that_documents_writes() {
    let env = Env::new(&shared_zk().connect_string(), "doclock");
    let s = env.start("doclock");
    let c = client();
    let index = format!("articles-{}", uuid_tag());
    let (status, lock) = call(
        &c,
        Method::POST,
        &s.url(&format!(
            "/v1/locks?index={index}&id=42&ttl=30s&info=editor"
        )),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{lock}");
    let monitor = format!("{index}:42");
    assert_eq!(
        lock["monitor"],
        json!(monitor),
        "the monitor a write of the document uses"
    );

    // A write of the document waits for the lock: with a short wait, 423.
    let doc = format!("/v1/indices/{index}/docs/42");
    let (status, v) = put(&c, &s, &format!("{doc}?timeout=300ms"), &json!({"n": 1})).await;
    assert_eq!(status, StatusCode::LOCKED, "{v}");
    // Other documents are not held.
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/43"),
        &json!({"n": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");

    let lock_id = lock["lock_id"].as_str().unwrap();
    let (status, v) = call(
        &c,
        Method::DELETE,
        &s.url(&format!("/v1/locks/{monitor}/{lock_id}")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, v) = put(&c, &s, &doc, &json!({"n": 2})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(
        v["token"].as_u64() > lock["token"].as_u64(),
        "{v} after {lock}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_lock_needs_both_index_and_id_and_no_monitor_besides() {
    let env = Env::new(&shared_zk().connect_string(), "doclock-bad");
    let s = env.start("doclock-bad");
    let c = client();
    for (query, needle) in [
        ("index=articles", "`id`"),
        ("id=42", "`index`"),
        ("", "`index` and `id`"),
        ("index=articles&id=42&monitor=m", "`monitor`"),
        ("index=_bad&id=42", "index"),
    ] {
        let (status, v) = call(
            &c,
            Method::POST,
            &s.url(&format!("/v1/locks?{query}")),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {v}");
        let message = v["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{query}: {v}");
    }
}

/// Any document id has a monitor: one that a node name cannot hold (a `/`, an emoji, a control
/// character, 512 bytes) is escaped, and an explicit lock on the document guards its writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_a_node_name_cannot_hold_get_an_escaped_monitor() {
    let env = Env::new(&shared_zk().connect_string(), "docid");
    let s = env.start("docid");
    let c = client();
    let index = format!("files-{}", uuid_tag());
    let long = "y".repeat(512);
    for id in ["docs/a.txt", "emoji-🦀", "tab\tid", long.as_str()] {
        let encoded: String = url::form_urlencoded::byte_serialize(id.as_bytes()).collect();
        let path = format!("/v1/indices/{index}/docs/{}", encoded.replace('+', "%20"));
        let (status, v) = put(&c, &s, &path, &json!({"id": id})).await;
        assert_eq!(status, StatusCode::OK, "{id:?}: {v}");
        let stored = call(
            &c,
            Method::GET,
            &format!("{}/{index}/_doc/{encoded}", shared_es().url()),
            None,
        )
        .await;
        assert_eq!(stored.0, StatusCode::OK, "{id:?}: {}", stored.1);
        assert_eq!(stored.1["_source"]["id"], json!(id));
        assert_eq!(stored.1["_version"], v["token"], "{id:?}");

        // The explicit lock on the document derives the same monitor, so it holds the write.
        let (status, lock) = call(
            &c,
            Method::POST,
            &s.url(&format!("/v1/locks?index={index}&id={encoded}&ttl=30s")),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{id:?}: {lock}");
        assert_eq!(
            lock["monitor"],
            json!(zkguard::lock::document_monitor(&index, id))
        );
        let (status, v) = put(&c, &s, &format!("{path}?timeout=200ms"), &json!({"n": 2})).await;
        assert_eq!(status, StatusCode::LOCKED, "{id:?}: {v}");
        let url = s.url(&format!(
            "/v1/locks/{}/{}",
            url::form_urlencoded::byte_serialize(lock["monitor"].as_str().unwrap().as_bytes())
                .collect::<String>(),
            lock["lock_id"].as_str().unwrap()
        ));
        let (status, v) = call(&c, Method::DELETE, &url, None).await;
        assert_eq!(status, StatusCode::OK, "{id:?}: {v}");
    }
    assert_eq!(
        zkguard::lock::document_monitor(&index, "docs/a.txt"),
        format!("{index}:docs%2Fa.txt")
    );
}

/// A lock wait configured at or above `server.request.timeout` (here 5 s against 3 s) ends
/// before the request's own timeout, early enough for the acquisition to give up in order: a
/// lock that stays taken is a 423 (nothing written, safe to retry), never a 503
/// `request_timeout` (outcome unknown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_that_stays_taken_is_423_even_when_the_wait_reaches_the_request_timeout() {
    let env = Env::new(&shared_zk().connect_string(), "waitcap")
        .with("ZKGUARD_SERVER_REQUEST_TIMEOUT", "3000")
        .with("ZKGUARD_ZOOKEEPER_FOREGROUND_TASK_TIMEOUT", "5000");
    let s = env.start("waitcap");
    let c = client();
    let index = format!("waitcap-{}", uuid_tag());
    let (_holder, _guard) = hold_lock(&env, &format!("{index}:1")).await;
    let doc = format!("/v1/indices/{index}/docs/1");
    for path in [doc.clone(), format!("{doc}?timeout=3000ms")] {
        let (status, v) = put(&c, &s, &path, &json!({"n": 1})).await;
        assert_eq!(status, StatusCode::LOCKED, "{path}: {v}");
        assert_eq!(v["error"], "lock_timeout", "{path}: {v}");
    }
    let (status, v) = call(
        &c,
        Method::POST,
        &s.url(&format!("/v1/locks?index={index}&id=1")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::LOCKED, "{v}");
}

/// A lock wait gives up within its deadline plus the acquisition's stated bound for giving up
/// in order (`DEADLINE_OVERRUN`, 1 s), whatever ZooKeeper does; the service ends the wait early
/// enough for that bound to fit in `server.request.timeout`. Here ZooKeeper stops answering
/// while a write waits, so giving up cannot remove the waiter's node: the answer must still be
/// one that says nothing was written (423, or 503 `lock_unavailable`), never 503
/// `request_timeout` (outcome unknown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_gives_up_while_zookeeper_is_silent_still_answers_nothing_written() {
    let zk = zk_server();
    let env = Env::new(&zk.connect_string(), "silentcap")
        .with("ZKGUARD_SERVER_REQUEST_TIMEOUT", "3000")
        .with("ZKGUARD_ZOOKEEPER_FOREGROUND_TASK_TIMEOUT", "10000");
    let s = env.start("silentcap");
    let c = client();
    let index = format!("silentcap-{}", uuid_tag());
    let monitor = format!("{index}:1");
    let (_holder, _guard) = hold_lock(&env, &monitor).await;
    let (url, body) = (
        s.url(&format!("/v1/indices/{index}/docs/1")),
        json!({"n": 1}),
    );
    let write = tokio::spawn({
        let c = c.clone();
        async move {
            let r = c.put(url).json(&body).send().await.unwrap();
            let status = r.status();
            (status, r.json::<serde_json::Value>().await.unwrap())
        }
    });
    // The write is queued behind the holder: then ZooKeeper stops answering.
    // (a blocking query on the monitor answers when its queue changes)
    let mut index = 0i64;
    loop {
        let url = s.url(&format!("/v1/locks/{monitor}?wait=1s&index={index}"));
        let r = c.get(url).send().await.unwrap();
        index = r.headers()["x-zkguard-index"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let v: serde_json::Value = r.json().await.unwrap();
        if v[0]["queue"].as_array().is_some_and(|q| q.len() >= 2) {
            break;
        }
    }
    zk.pause();
    let (status, v) = write.await.unwrap();
    zk.resume();
    assert_ne!(v["error"], "request_timeout", "{status}: {v}");
    assert!(
        (status == StatusCode::LOCKED && v["error"] == "lock_timeout")
            || (status == StatusCode::SERVICE_UNAVAILABLE && v["error"] == "lock_unavailable"),
        "an answer that says nothing was written: {status}: {v}"
    );
}

/// `GET /v1/locks/{monitor}?wait=...&index=N` is a blocking query: its answer names the
/// monitor's change index (`X-Zkguard-Index`), and a caller that sends it back waits until the
/// holder or the queue changes; a waiter hears a release when it happens (woken by the change,
/// well before its wait ends: the bound leaves what a busy machine adds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_query_on_a_monitor_answers_when_its_holder_changes() {
    let env = Env::new(&shared_zk().connect_string(), "lockwait");
    let s = env.start("lockwait");
    let c = client();
    let monitor = format!("watched-{}", uuid_tag());
    let (holder, guard) = hold_lock(&env, &monitor).await;
    let url = s.url(&format!("/v1/locks/{monitor}"));
    let r = c.get(&url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let index: i64 = r.headers()["x-zkguard-index"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(index > 0);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v[0]["holder"]["info"], "test holder", "{v}");

    // Nothing changes: the wait ends with the same index.
    let r = c
        .get(format!("{url}?wait=200ms&index={index}"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers()["x-zkguard-index"].to_str().unwrap(),
        index.to_string()
    );

    let waiter = tokio::spawn({
        let (c, url) = (c.clone(), format!("{url}?wait=20s&index={index}"));
        async move {
            let r = c.get(&url).send().await.unwrap();
            let at = std::time::Instant::now();
            let status = r.status();
            let index: i64 = r.headers()["x-zkguard-index"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            let v: serde_json::Value = r.json().await.unwrap();
            (status, index, v, at)
        }
    });
    eventually(
        std::time::Duration::from_secs(10),
        "the query waits",
        || async { scraped(&c, &s, "zkguard_waiters").await == 1.0 },
    )
    .await;
    let released = std::time::Instant::now();
    guard.unlock().await.unwrap();
    drop(holder);
    let (status, new_index, v, answered) = waiter.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(new_index > index, "{new_index} after {index}");
    assert_eq!(v, json!([]), "the monitor is free");
    let after = answered.duration_since(released);
    assert!(
        after < std::time::Duration::from_secs(5),
        "the waiter heard {after:?} after the release, as if its 20 s wait had to end first"
    );
    let m = scrape(&c, &s).await;
    assert_eq!(
        m[r#"zkguard_waits_total{route="lock",outcome="changed"}"#], 1.0,
        "{m:?}"
    );
    assert_eq!(
        m[r#"zkguard_waits_total{route="lock",outcome="timeout"}"#], 1.0,
        "{m:?}"
    );
    let (status, v) = call(&c, Method::GET, &format!("{url}?wait=1s&since=3"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("it takes wait, index"),
        "{v}"
    );
}
