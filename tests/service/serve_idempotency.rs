//! A retried operation is applied once, whoever else writes the document: a caller that holds an
//! explicit lock and writes with its own Elasticsearch client drops the document's record of
//! applied operation ids, so the service answers a retry from its journal too; and a write under
//! an explicit lock can go through the service (`?lock_id=`), which keeps the record.

use crate::common;
use crate::serve_support;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use serve_support::*;

async fn take_document_lock(c: &reqwest::Client, s: &Service, index: &str, id: &str) -> Value {
    let (status, lock) = call(
        c,
        Method::POST,
        &s.url(&format!("/v1/locks?index={index}&id={id}&ttl=30s")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{lock}");
    lock
}

async fn release(c: &reqwest::Client, s: &Service, lock: &Value) {
    let url = s.url(&format!(
        "/v1/locks/{}/{}",
        lock["monitor"].as_str().unwrap(),
        lock["lock_id"].as_str().unwrap()
    ));
    let (status, v) = call(c, Method::DELETE, &url, None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

/// The explicit-lock recipe with the caller's own client: the newer content survives a retry of
/// an operation applied before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_not_applied_again_after_a_write_by_the_callers_own_client() {
    let env = Env::new(&shared_zk().connect_string(), "idem-own");
    let s = env.start("idem-own");
    let c = client();
    let index = format!("articles-{}", uuid_tag());
    let op_id = uuid::Uuid::new_v4().to_string();
    let doc = format!("/v1/indices/{index}/docs/42?op_id={op_id}");
    let (status, first) = put(&c, &s, &doc, &json!({"title": "old"})).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["result"], "written", "{first}");

    // An editor takes the document's lock and writes with its own client and the lock's token,
    // as docs/serve.md shows: the `zkguard` record is not in what it sends.
    let lock = take_document_lock(&c, &s, &index, "42").await;
    let token = lock["token"].as_u64().unwrap();
    let url = format!(
        "{}/{index}/_doc/42?version={token}&version_type=external_gte",
        shared_es().url()
    );
    let (status, v) = call(
        &c,
        Method::PUT,
        &url,
        Some(json!({"title": "new"}).to_string()),
    )
    .await;
    assert!(status.is_success(), "{v}");
    release(&c, &s, &lock).await;

    // The first caller never saw its answer and retries.
    let (status, retry) = put(&c, &s, &doc, &json!({"title": "old"})).await;
    assert_eq!(status, StatusCode::OK, "{retry}");
    assert_eq!(retry["result"], "already_applied", "{retry}");
    assert_eq!(retry["token"], first["token"], "{retry}");
    let stored = es_doc(&c, &index, "42").await;
    assert_eq!(stored["_source"]["title"], "new", "{stored}");
    assert_eq!(stored["_version"].as_u64(), Some(token), "{stored}");
}

/// `PUT ...?lock_id=` writes under the caller's explicit lock with its token and keeps the
/// record, so even a service that never saw the operation recognises a retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_under_an_explicit_lock_through_the_service_keeps_the_record() {
    let env = Env::new(&shared_zk().connect_string(), "idem-lockid");
    let s = env.start("idem-lockid");
    let c = client();
    let index = format!("articles-{}", uuid_tag());
    let lock = take_document_lock(&c, &s, &index, "7").await;
    let lock_id = lock["lock_id"].as_str().unwrap();
    let token = lock["token"].as_u64().unwrap();

    let op_id = uuid::Uuid::new_v4().to_string();
    let under = format!("/v1/indices/{index}/docs/7?lock_id={lock_id}&op_id={op_id}");
    let (status, v) = put(&c, &s, &under, &json!({"title": "under the lock"})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["result"], "written", "{v}");
    assert_eq!(v["token"].as_u64(), Some(token), "{v}");
    // Several writes under one lock: each with the lock's token.
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/7?lock_id={lock_id}"),
        &json!({"title": "again"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["token"].as_u64(), Some(token), "{v}");
    // The lock is still held: a write without it waits.
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/7?timeout=300ms"),
        &json!({"title": "other"}),
    )
    .await;
    assert_eq!(status, StatusCode::LOCKED, "{v}");

    // Refusals: another document's lock, a background write, an unknown lock.
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/8?lock_id={lock_id}"),
        &json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["error"], "wrong_lock", "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains(&format!("{index}:7")),
        "{v}"
    );
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/7?lock_id={lock_id}&type=background"),
        &json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["message"].as_str().unwrap().contains("lock_id"), "{v}");
    let unknown = uuid::Uuid::new_v4();
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/7?lock_id={unknown}"),
        &json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["error"], "unknown_lock", "{v}");
    release(&c, &s, &lock).await;

    // Newer writes, then the first operation retried through a service with a journal of its
    // own: the document's record answers.
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/7"),
        &json!({"title": "newest"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let other = env.start("idem-lockid-other");
    let (status, v) = put(
        &c,
        &other,
        &format!("/v1/indices/{index}/docs/7?op_id={op_id}"),
        &json!({"title": "under the lock"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["result"], "already_applied", "{v}");
    let stored = es_doc(&c, &index, "7").await;
    assert_eq!(stored["_source"]["title"], "newest", "{stored}");
    assert!(
        stored["_source"]["zkguard"]["ops"]
            .as_array()
            .unwrap()
            .contains(&json!(op_id)),
        "{stored}"
    );
}
