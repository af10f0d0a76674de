//! An operation id names one operation: `zkguard serve` refuses the same `op_id` for another
//! document or body (409, naming the line), in a bulk request and across requests, instead of
//! acknowledging the second and never applying it. The same operation sent again is still
//! recognised and applied once.

use crate::common;
use crate::serve_support;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::json;
use serve_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_op_id_reused_for_another_operation_is_refused_and_a_resent_one_applies_once() {
    let env = Env::new(&shared_zk().connect_string(), "opids");
    let s = env.start("opids");
    let c = client();
    let index = format!("opids-{}", uuid_tag());
    let shared = uuid::Uuid::new_v4();

    // Two lines of one bulk, one op_id, two documents: the second line is refused.
    let body = [
        json!({"action": "index", "index": index, "id": "1", "doc": {"n": 1}, "op_id": shared}),
        json!({"action": "index", "index": index, "id": "2", "doc": {"n": 2}, "op_id": shared}),
    ]
    .map(|l| l.to_string())
    .join("\n");
    let (status, v) = call(&c, Method::POST, &s.url("/v1/bulk"), Some(body)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["error"], "op_id_reused", "{v}");
    let message = v["message"].as_str().unwrap();
    assert!(
        message.contains("line 2") && message.contains("line 1"),
        "{v}"
    );

    // Accepted once...
    let doc1 = format!("/v1/indices/{index}/docs/1?type=background&op_id={shared}");
    let (status, v) = put(&c, &s, &doc1, &json!({"n": 1})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    // ... sent again as it was: recognised, not refused.
    let (status, v) = put(&c, &s, &doc1, &json!({"n": 1})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    // ... with another body, or for another document, in the background or the foreground: 409.
    for (path, doc) in [
        (doc1.clone(), json!({"n": 5})),
        (
            format!("/v1/indices/{index}/docs/2?type=background&op_id={shared}"),
            json!({"n": 1}),
        ),
        (
            format!("/v1/indices/{index}/docs/2?op_id={shared}"),
            json!({"n": 1}),
        ),
    ] {
        let (status, v) = put(&c, &s, &path, &doc).await;
        assert_eq!(status, StatusCode::CONFLICT, "{path}: {v}");
        assert_eq!(v["error"], "op_id_reused", "{v}");
    }
    let done = wait_finished(&c, &s, &[shared.to_string()]).await;
    assert_eq!(done[&shared.to_string()]["status"], "applied");
    // Once finished too.
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/3?type=background&op_id={shared}"),
        &json!({"n": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    let stored = es_doc(&c, &index, "1").await;
    assert_eq!(stored["_source"]["n"], 1, "{stored}");
    let (status, _) = call(
        &c,
        Method::GET,
        &format!("{}/{index}/_doc/2", shared_es().url()),
        None,
    )
    .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "nothing was written under the reused id"
    );
}

/// `GET /v1/operations/{id}?wait=...` answers as soon as the operation leaves `queued`: a
/// background write waits behind a held lock, a caller waits for it without polling, and its
/// answer (`applied`, with the token) comes right after the lock is released. A wait that ends
/// first answers `queued`; a wait beyond the request's limit is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_sees_its_operation_applied_as_soon_as_the_lock_is_released() {
    let env = Env::new(&shared_zk().connect_string(), "opwait");
    let s = env.start("opwait");
    let c = client();
    let index = format!("opwait-{}", uuid_tag());
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/setup"),
        &json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (holder, guard) = hold_lock(&env, &format!("{index}:d")).await;
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/d?type=background"),
        &json!({"n": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let op = v["operation_id"].as_str().unwrap().to_string();

    // A short wait ends with the operation still queued.
    let (status, v) = call(
        &c,
        Method::GET,
        &s.url(&format!("/v1/operations/{op}?wait=200ms")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "queued", "{v}");

    let waiter = tokio::spawn({
        let (c, url) = (c.clone(), s.url(&format!("/v1/operations/{op}?wait=20s")));
        async move {
            let answer = call(&c, Method::GET, &url, None).await;
            (answer, std::time::Instant::now())
        }
    });
    eventually(
        std::time::Duration::from_secs(10),
        "the waiter waits",
        || async { scraped(&c, &s, "zkguard_waiters").await == 1.0 },
    )
    .await;
    let released = std::time::Instant::now();
    guard.unlock().await.unwrap();
    drop(holder);
    let ((status, v), answered) = waiter.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "applied", "{v}");
    assert!(v["token"].as_u64().is_some(), "{v}");
    let after = answered.duration_since(released);
    // Woken by the write, not by the end of its 20 s wait (the bound leaves what a busy
    // machine adds: 355 ms beside stress-ng, against 250 ms before).
    assert!(
        after < std::time::Duration::from_secs(5),
        "the waiter heard {after:?} after the release, as if its 20 s wait had to end first"
    );
    let m = scrape(&c, &s).await;
    assert_eq!(
        m[r#"zkguard_waits_total{route="operation",outcome="changed"}"#], 1.0,
        "{m:?}"
    );
    assert_eq!(
        m[r#"zkguard_waits_total{route="operation",outcome="timeout"}"#], 1.0,
        "{m:?}"
    );
    assert_eq!(m["zkguard_waiters"], 0.0, "{m:?}");
    // Where the background write's time went: one lane acquisition waited for the held lock
    // (held at least 200 ms after the accept, the wait above; an uncontended acquisition takes
    // a few ms), one _bulk request; the accept fsynced before its 202
    // (the outcome's line may still be on its way).
    let stage = |what: &str, stage: &str| {
        m[&format!(r#"zkguard_background_stage_{what}_total{{stage="{stage}"}}"#)]
    };
    assert!(stage("requests", "lock_wait") >= 1.0, "{m:?}");
    assert!(stage("seconds", "lock_wait") > 0.1, "{m:?}");
    assert!(stage("requests", "write") >= 1.0, "{m:?}");
    assert!(stage("seconds", "write") > 0.0, "{m:?}");
    assert!(m["zkguard_journal_fsyncs_total"] >= 1.0, "{m:?}");
    assert!(m["zkguard_journal_fsync_seconds_total"] > 0.0, "{m:?}");

    // Beyond the request's limit (server.request.timeout, 30 s by default): refused, naming it.
    let (status, v) = call(
        &c,
        Method::GET,
        &s.url(&format!("/v1/operations/{op}?wait=1h")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("server.request.timeout"),
        "{v}"
    );
}
