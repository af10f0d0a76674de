//! Idempotency keys of the caller's choice: `op_id` (or the `Idempotency-Key` header) takes any
//! printable text up to 200 bytes. The same key is the same operation: applied once, refused
//! (409) for another write, answered with the key, found by it, and kept by the journal across a
//! restart and by the dead-letter sink.

use crate::common;
use crate::serve_support;

use common::uuid_tag;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use serve_support::*;

async fn send(
    c: &reqwest::Client,
    method: Method,
    url: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = c.request(method, url);
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_the_callers_choice_names_one_operation_everywhere() {
    let env = Env::new(&shared_zk().connect_string(), "keys")
        .with("ZKGUARD_ELASTIC_REQUEST_RETRY_COUNT", "1");
    let s = env.start("keys");
    let c = client();
    let tag = uuid_tag();
    let index = format!("keys-{tag}");
    let doc = |id: &str| s.url(&format!("/v1/indices/{index}/docs/{id}"));

    // A foreground save under a key: answered with the key; sent again, applied once.
    let key = format!("order-42-save-3 ({tag}) é");
    let q = encoded;
    let url = format!("{}?op_id={}", doc("1"), q(&key));
    let (status, first) = send(&c, Method::PUT, &url, None, Some(json!({"n": 1}))).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["operation_id"], key.as_str(), "{first}");
    assert_eq!(first["result"], "written", "{first}");
    let (status, again) = send(&c, Method::PUT, &url, None, Some(json!({"n": 1}))).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["result"], "already_applied", "{again}");
    assert_eq!(again["token"], first["token"], "{again}");
    // The same key for another write: 409, naming the key.
    let (status, v) = send(&c, Method::PUT, &url, None, Some(json!({"n": 2}))).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["error"], "op_id_reused", "{v}");
    assert!(v["message"].as_str().unwrap().contains(&key), "{v}");
    // Found by its key.
    let (status, v) = send(
        &c,
        Method::GET,
        &s.url(&format!("/v1/operations/{}", q(&key))),
        None,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["operation_id"], key.as_str(), "{v}");
    assert_eq!(v["status"], "applied", "{v}");

    // The header does the same; with op_id too, both must agree.
    let header_key = format!("req-{tag}-7");
    let (status, v) = send(
        &c,
        Method::PUT,
        &format!("{}?type=background", doc("2")),
        Some(&header_key),
        Some(json!({"n": 2})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    assert_eq!(v["operation_id"], header_key.as_str(), "{v}");
    let (status, v) = send(
        &c,
        Method::PUT,
        &format!("{}?op_id=other", doc("2")),
        Some(&header_key),
        Some(json!({"n": 2})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("Idempotency-Key"),
        "{v}"
    );

    // A bulk request's key names its lines: the same request again is the same operations.
    let body = [
        json!({"action": "index", "index": index, "id": "3", "doc": {"n": 3}}),
        json!({"action": "update", "index": index, "id": "missing", "doc": {"n": 4}}),
    ]
    .map(|l| l.to_string())
    .join("\n");
    let bulk_key = format!("job-{tag}");
    let post = |b: String| {
        c.post(s.url("/v1/bulk"))
            .header("Idempotency-Key", bulk_key.as_str())
            .header("content-type", "application/x-ndjson")
            .body(b)
            .send()
    };
    let v: Value = post(body.clone()).await.unwrap().json().await.unwrap();
    let ids: Vec<String> = v["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["operation_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        ids,
        [format!("{bulk_key}#1"), format!("{bulk_key}#2")],
        "{v}"
    );
    let again: Value = post(body).await.unwrap().json().await.unwrap();
    assert_eq!(again["operations"].as_array().unwrap().len(), 2, "{again}");
    let mut waited = vec![header_key.clone()];
    waited.extend(ids.iter().cloned());
    let done = wait_finished(&c, &s, &waited).await;
    assert_eq!(done[&header_key]["status"], "applied", "{done:?}");
    assert_eq!(done[&ids[0]]["status"], "applied", "{done:?}");
    // The update of a missing document can never apply: parked, its key in the dead letter.
    assert_eq!(done[&ids[1]]["status"], "parked", "{done:?}");
    let (_, letters) = send(&c, Method::GET, &s.url("/v1/deadletters"), None, None).await;
    let letter = letters
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["operation"]["key"] == ids[1].as_str())
        .unwrap_or_else(|| panic!("no dead letter keyed {}: {letters}", ids[1]));
    assert_eq!(letter["monitor"], format!("{index}:missing"), "{letter}");

    // Bad keys are named: too long, control characters, empty.
    for bad in ["x".repeat(201), "a\tb".to_string(), String::new()] {
        let (status, v) = send(
            &c,
            Method::PUT,
            &format!("{}?op_id={}", doc("4"), q(&bad)),
            None,
            Some(json!({})),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}: {v}");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("printable text of 1 to 200 bytes"),
            "{v}"
        );
    }
    let (status, _) = send(
        &c,
        Method::PUT,
        &format!("{}?op_id={}", doc("4"), "y".repeat(200)),
        None,
        Some(json!({})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);

    // Keys survive a restart: the journal keeps them with the outcomes of background
    // operations; a foreground retry is recognised by the document, which records the
    // operation's id.
    s.kill();
    let s = env.start("keys");
    for k in [header_key.as_str(), ids[0].as_str(), ids[1].as_str()] {
        let (status, v) = send(
            &c,
            Method::GET,
            &s.url(&format!("/v1/operations/{}", q(k))),
            None,
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{k}: {v}");
        assert_eq!(v["operation_id"], k, "{v}");
    }
    let url = s.url(&format!("/v1/indices/{index}/docs/1?op_id={}", q(&key)));
    let (status, v) = send(&c, Method::PUT, &url, None, Some(json!({"n": 1}))).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["result"], "already_applied", "{v}");
    assert_eq!(v["operation_id"], key.as_str(), "{v}");
}
