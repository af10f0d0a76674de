//! Background work is bounded: beyond `server.queue.max` operations or `server.queue.max.bytes`
//! queued, a background write or bulk is refused with 503 `queue_full` and `Retry-After` before
//! anything of it is acknowledged, and accepted again once the queue drains.

use crate::common;
use crate::serve_support;

use std::time::Duration;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use serve_support::*;

/// A bulk of `n` index operations on documents of `index`, all guarded by `monitor`.
fn bulk_body(index: &str, monitor: &str, n: usize, pad: usize) -> (String, Vec<String>) {
    let mut ids = Vec::new();
    let mut body = String::new();
    for _ in 0..n {
        let op_id = uuid::Uuid::new_v4().to_string();
        let line = json!({
            "action": "index", "index": index, "id": op_id, "monitor": monitor,
            "op_id": op_id, "doc": {"pad": "x".repeat(pad)}
        });
        body.push_str(&line.to_string());
        body.push('\n');
        ids.push(op_id);
    }
    (body, ids)
}

async fn post_bulk(c: &reqwest::Client, s: &Service, body: String) -> (StatusCode, Value, bool) {
    let resp = c
        .post(s.url("/v1/bulk"))
        .header("content-type", "application/x-ndjson")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let retry_after = resp.headers().contains_key("retry-after");
    let v = resp.json().await.unwrap_or(Value::Null);
    (status, v, retry_after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_queue_bounds_background_work_is_refused_before_it_is_acknowledged() {
    let env = Env::new(&shared_zk().connect_string(), "queue-max")
        .with("ZKGUARD_SERVER_QUEUE_MAX", "50")
        .with("ZKGUARD_SERVER_QUEUE_MAX_BYTES", "30000");
    let s = env.start("queue-max");
    let c = client();
    let index = format!("queued-{}", uuid_tag());
    let monitor = format!("queue-{}", uuid_tag());
    // Nothing drains while the test holds the monitor's lock.
    let (_holder, guard) = hold_lock(&env, &monitor).await;

    for _ in 0..2 {
        let (body, _) = bulk_body(&index, &monitor, 20, 10);
        let (status, v, _) = post_bulk(&c, &s, body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    }
    // 40 queued: 20 more would pass 50.
    let (body, refused) = bulk_body(&index, &monitor, 20, 10);
    let (status, v, retry_after) = post_bulk(&c, &s, body).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_eq!(v["error"], "queue_full", "{v}");
    assert!(retry_after, "503 queue_full without Retry-After");
    let message = v["message"].as_str().unwrap();
    assert!(
        message.contains("server.queue.max (50)") && message.contains("40 operations are queued"),
        "{message}"
    );
    // Nothing of the refused bulk was acknowledged.
    for id in &refused {
        let (status, v) = call(
            &c,
            Method::GET,
            &s.url(&format!("/v1/operations/{id}")),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    }
    // Room for single writes up to the bound, in bytes as well: 3 KB documents fill 30,000
    // bytes before 50 operations.
    let mut accepted = 0;
    let refusal = loop {
        let (status, v) = put(
            &c,
            &s,
            &format!("/v1/indices/{index}/docs/big-{accepted}?type=background&monitor={monitor}"),
            &json!({"pad": "y".repeat(3000)}),
        )
        .await;
        if status != StatusCode::ACCEPTED {
            break (status, v);
        }
        accepted += 1;
        assert!(accepted <= 10, "the queue took more than it may hold");
    };
    assert_eq!(refusal.0, StatusCode::SERVICE_UNAVAILABLE, "{}", refusal.1);
    assert!(
        refusal.1["message"]
            .as_str()
            .unwrap()
            .contains("server.queue.max.bytes (30000)"),
        "{}",
        refusal.1
    );
    assert!(accepted >= 1, "no 1 KB write fitted");

    // The queue drains once the lock is free, and work is accepted again.
    guard.unlock().await.unwrap();
    eventually(Duration::from_secs(60), "the queue drains", || async {
        scraped(&client(), &s, "zkguard_journal_depth").await == 0.0
    })
    .await;
    let (body, _) = bulk_body(&index, &monitor, 20, 10);
    let (status, v, _) = post_bulk(&c, &s, body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
}
