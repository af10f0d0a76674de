//! `DELETE /v1/deadletters/{id}`: an operation that can never apply is discarded for good, its
//! entry and the reason logged, its status `rejected` with the reason.

use crate::common;
use crate::serve_controls::park_one;
use crate::serve_support;

use common::uuid_tag;
use reqwest::{Method, StatusCode};
use serde_json::json;
use serve_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_operation_that_cannot_apply_is_discarded_with_its_reason() {
    let env = Env::new(&shared_zk().connect_string(), "discard")
        .with("ZKGUARD_ELASTIC_REQUEST_RETRY_COUNT", "1");
    let s = env.start("discard");
    let c = client();
    let index = format!("discard-{}", uuid_tag());

    // A patch of a document that does not exist can never apply: it is parked.
    let id = park_one(&c, &s, &index).await;

    // Bad requests name what is wrong; an id, or an idempotency key, that names no entry is a
    // 404 naming it.
    let (status, v) = call(&c, Method::DELETE, &s.url("/v1/deadletters/nope"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert!(v["message"].as_str().unwrap().contains("`nope`"), "{v}");
    let (status, v) = call(
        &c,
        Method::DELETE,
        &s.url(&format!("/v1/deadletters/{id}?why=x")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["message"].as_str().unwrap().contains("reason"), "{v}");
    let unknown = uuid::Uuid::new_v4();
    let (status, v) = call(
        &c,
        Method::DELETE,
        &s.url(&format!("/v1/deadletters/{unknown}")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["error"], "unknown_deadletter", "{v}");

    let (status, v) = call(
        &c,
        Method::DELETE,
        &s.url(&format!("/v1/deadletters/{id}?reason=article%20deleted")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["id"], json!(id), "{v}");
    assert_eq!(v["reason"], "article deleted", "{v}");
    assert_eq!(v["entry"]["operation"]["id"], json!(id), "{v}");
    assert!(v["summary"].as_str().unwrap().contains("gone"), "{v}");

    let (_, listed) = call(&c, Method::GET, &s.url("/v1/deadletters"), None).await;
    assert_eq!(listed, json!([]));
    let st = op_status(&c, &s, &id).await;
    assert_eq!(st["status"], "rejected", "{st}");
    assert!(
        st["reason"].as_str().unwrap().contains("article deleted"),
        "{st}"
    );
    // The log (written before the entry was removed) keeps the whole entry and the reason.
    let log = s.log();
    let line = log
        .lines()
        .find(|l| l.contains("dead letter discarded"))
        .unwrap_or_else(|| panic!("no discard in the log:\n{log}"));
    assert!(
        line.contains(&id) && line.contains("gone") && line.contains("article deleted"),
        "{line}"
    );
    let (status, v) = call(
        &c,
        Method::DELETE,
        &s.url(&format!("/v1/deadletters/{id}")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
}
