//! `PATCH /v1/indices/{index}/docs/{id}`: a JSON merge patch applied under the lock to the
//! document as stored, so concurrent read-modify-write clients lose no update; and the bulk
//! `update` action.

use crate::common;
use crate::serve_support;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use serve_support::*;

async fn patch(c: &reqwest::Client, s: &Service, path: &str, body: &Value) -> (StatusCode, Value) {
    call(c, Method::PATCH, &s.url(path), Some(body.to_string())).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_patches_of_different_fields_all_survive() {
    let env = Env::new(&shared_zk().connect_string(), "patch");
    let s = env.start("patch");
    let c = client();
    let index = format!("patched-{}", uuid_tag());
    let doc = format!("/v1/indices/{index}/docs/1");
    let (status, v) = put(&c, &s, &doc, &json!({"title": "t", "draft": true})).await;
    assert_eq!(status, StatusCode::OK, "{v}");

    // Twelve clients patch one field each, all at once: each patch is merged into the document
    // as stored when its lock is granted, so none overwrites another.
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let (c, url) = (c.clone(), s.url(&doc));
            tokio::spawn(async move {
                call(
                    &c,
                    Method::PATCH,
                    &url,
                    Some(json!({ format!("f{i}"): i }).to_string()),
                )
                .await
            })
        })
        .collect();
    for t in tasks {
        let (status, v) = t.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["result"], "written", "{v}");
    }
    let stored = es_doc(&c, &index, "1").await;
    for i in 0..12 {
        assert_eq!(stored["_source"][format!("f{i}")], json!(i), "{stored}");
    }
    assert_eq!(stored["_source"]["title"], "t");

    // null removes a field; objects merge; a retry with the same op_id is applied once.
    let op_id = uuid::Uuid::new_v4();
    let retried = format!("{doc}?op_id={op_id}");
    let body = json!({"draft": null, "meta": {"by": "editor"}});
    let (status, first) = patch(&c, &s, &retried, &body).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, again) = patch(&c, &s, &retried, &body).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["result"], "already_applied", "{again}");
    let stored = es_doc(&c, &index, "1").await;
    assert!(stored["_source"].get("draft").is_none(), "{stored}");
    assert_eq!(stored["_source"]["meta"], json!({"by": "editor"}));
    assert_eq!(stored["_version"], first["token"], "{stored}");

    // A missing document: 404 unless upsert=true.
    let missing = format!("/v1/indices/{index}/docs/2");
    let (status, v) = patch(&c, &s, &missing, &json!({"a": 1})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["error"], "not_found", "{v}");
    let (status, v) = patch(&c, &s, &format!("{missing}?upsert=true"), &json!({"a": 1})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(es_doc(&c, &index, "2").await["_source"]["a"], 1);

    // Bad patches name what is wrong.
    for (path, body, error, says) in [
        (doc.clone(), json!([1]), "bad_document", "merge patch"),
        (
            doc.clone(),
            json!({"zkguard": 1}),
            "invalid_operation",
            "zkguard",
        ),
        (
            format!("{doc}?mode=hard"),
            json!({"a": 1}),
            "bad_parameter",
            "upsert",
        ),
        (
            format!("{doc}?upsert=yes"),
            json!({"a": 1}),
            "bad_parameter",
            "upsert `yes`",
        ),
    ] {
        let (status, v) = patch(&c, &s, &path, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {v}");
        assert_eq!(v["error"], error, "{path}: {v}");
        assert!(v["message"].as_str().unwrap().contains(says), "{path}: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_and_bulk_patches_are_applied() {
    let env = Env::new(&shared_zk().connect_string(), "patch-bg");
    let s = env.start("patch-bg");
    let c = client();
    let index = format!("patched-bg-{}", uuid_tag());
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/1"),
        &json!({"title": "t", "views": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");

    let (status, v) = patch(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/1?type=background"),
        &json!({"views": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let mut ids = vec![v["operation_id"].as_str().unwrap().to_string()];

    let body = [
        json!({"action": "update", "index": index, "id": "1", "doc": {"summary": "s"}}),
        json!({"action": "update", "index": index, "id": "3", "doc": {"new": true}, "upsert": true}),
    ]
    .iter()
    .map(|l| format!("{l}\n"))
    .collect::<String>();
    let (status, v) = call(&c, Method::POST, &s.url("/v1/bulk"), Some(body)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    for o in v["operations"].as_array().unwrap() {
        ids.push(o["operation_id"].as_str().unwrap().to_string());
    }
    let done = wait_finished(&c, &s, &ids).await;
    for id in &ids {
        assert_eq!(done[id]["status"], "applied", "{:?}", done[id]);
    }
    let one = es_doc(&c, &index, "1").await;
    assert_eq!(
        (
            &one["_source"]["title"],
            &one["_source"]["views"],
            &one["_source"]["summary"]
        ),
        (&json!("t"), &json!(2), &json!("s")),
        "{one}"
    );
    assert_eq!(es_doc(&c, &index, "3").await["_source"]["new"], true);

    // A bulk line with a field of another action is refused, naming the line.
    let bad = format!(
        "{}\n",
        json!({"action": "update", "index": index, "id": "1", "doc": {"a": 1}, "mode": "hard"})
    );
    let (status, v) = call(&c, Method::POST, &s.url("/v1/bulk"), Some(bad)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["message"].as_str().unwrap().starts_with("line 1:"), "{v}");
}
