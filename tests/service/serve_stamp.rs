//! What the service keeps in the documents it writes: a `zkguard` object of at most
//! `elastic.stamp.window` operation ids, and none at all in the indices of `elastic.stamp.off`,
//! whose writes are still fenced and whose retries the journal still recognises.

use crate::common;
use crate::serve_support;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use serve_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_keep_a_bounded_stamp_and_opted_out_indices_none() {
    let tag = uuid_tag();
    let env = Env::new(&shared_zk().connect_string(), "stamp")
        .with("ZKGUARD_ELASTIC_STAMP_WINDOW", "3")
        .with("ZKGUARD_ELASTIC_STAMP_OFF", &format!("plain-{tag}-*"));
    let s = env.start("stamp");
    let c = client();

    // A stamped index remembers the last 3 operation ids, no more.
    let stamped = format!("stamped-{tag}");
    let mut ids = Vec::new();
    for i in 0..5 {
        let (status, v) = put(
            &c,
            &s,
            &format!("/v1/indices/{stamped}/docs/1"),
            &json!({ "n": i }),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        ids.push(v["operation_id"].as_str().unwrap().to_string());
    }
    let doc = es_doc(&c, &stamped, "1").await;
    let ops: Vec<String> =
        serde_json::from_value(doc["_source"]["zkguard"]["ops"].clone()).unwrap();
    assert_eq!(ops, ids[2..], "{doc}");

    // An opted-out index: written under the lock with the token as version, no zkguard object,
    // in the foreground and in the background.
    let plain = format!("plain-{tag}-a");
    let op_id = uuid::Uuid::new_v4().to_string();
    let (status, first) = put(
        &c,
        &s,
        &format!("/v1/indices/{plain}/docs/1?op_id={op_id}"),
        &json!({"title": "first"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let doc = es_doc(&c, &plain, "1").await;
    assert_eq!(doc["_source"], json!({"title": "first"}), "{doc}");
    assert_eq!(doc["_version"], first["token"], "{doc}");

    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{plain}/docs/2?type=background"),
        &json!({"title": "background"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let id = v["operation_id"].as_str().unwrap().to_string();
    let done = wait_finished(&c, &s, std::slice::from_ref(&id)).await;
    assert_eq!(done[&id]["status"], "applied", "{:?}", done[&id]);
    let doc = es_doc(&c, &plain, "2").await;
    assert_eq!(doc["_source"], json!({"title": "background"}), "{doc}");

    // A newer write, then a retry of the first operation: the document cannot recognise it, the
    // journal does, and the newer content stays.
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{plain}/docs/1"),
        &json!({"title": "newer"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, retry) = put(
        &c,
        &s,
        &format!("/v1/indices/{plain}/docs/1?op_id={op_id}"),
        &json!({"title": "first"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{retry}");
    assert_eq!(retry["result"], "already_applied", "{retry}");
    let doc = es_doc(&c, &plain, "1").await;
    assert_eq!(doc["_source"], json!({"title": "newer"}), "{doc}");

    // A tombstone is the zkguard object: refused there, with what to do.
    let (status, v): (StatusCode, Value) = call(
        &c,
        Method::DELETE,
        &s.url(&format!("/v1/indices/{plain}/docs/1?mode=tombstone")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"], "invalid_operation", "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("elastic.stamp.off"),
        "{v}"
    );
    let (status, v) = call(
        &c,
        Method::DELETE,
        &s.url(&format!("/v1/indices/{plain}/docs/1")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

/// The `zkguard` object is mapped as stored but not indexed before the first stamped write to
/// an index: a new index is created with that mapping, an existing one gets it added, and an
/// index that mapped the object dynamically already keeps its mapping and its writes go on.
/// With `elastic.stamp.mapping=off`, the mappings are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stamp_is_mapped_stored_not_indexed_before_the_first_write() {
    let tag = uuid_tag();
    let c = client();
    let es = shared_es().url();
    let mapping_of = |index: String| {
        let c = c.clone();
        let url = format!("{es}/{index}/_mapping");
        async move {
            let (status, v) = call(&c, Method::GET, &url, None).await;
            assert_eq!(status, StatusCode::OK, "{url}: {v}");
            v[index.as_str()]["mappings"]["properties"]["zkguard"].clone()
        }
    };
    let stored = json!({"type": "object", "enabled": false});

    // Outside zkguard: one index holding a plain document, one where a document with a
    // `zkguard` object was written straight (mapped dynamically, searchable).
    let existing = format!("mapexisting-{tag}");
    let dynamic = format!("mapdynamic-{tag}");
    for (index, doc) in [
        (&existing, json!({"n": 1})),
        (&dynamic, json!({"n": 1, "zkguard": {"op": "outside"}})),
    ] {
        let url = format!("{es}/{index}/_doc/0");
        let (status, v) = call(&c, Method::PUT, &url, Some(doc.to_string())).await;
        assert!(status.is_success(), "{url}: {v}");
    }

    let s = Env::new(&shared_zk().connect_string(), "stampmap").start("stampmap");
    let fresh = format!("mapfresh-{tag}");
    for index in [&fresh, &existing, &dynamic] {
        for id in ["1", "2"] {
            let (status, v) = put(
                &c,
                &s,
                &format!("/v1/indices/{index}/docs/{id}"),
                &json!({ "title": id }),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{index}: {v}");
        }
    }
    assert_eq!(mapping_of(fresh.clone()).await, stored);
    assert_eq!(mapping_of(existing.clone()).await, stored);
    let kept = mapping_of(dynamic.clone()).await;
    assert!(kept["properties"]["op"].is_object(), "{kept}");
    let doc = es_doc(&c, &dynamic, "2").await;
    assert!(doc["_source"]["zkguard"]["op"].is_string(), "{doc}");
    // Not indexed: a search for the operation id finds nothing in a mapped index.
    let op = es_doc(&c, &fresh, "1").await["_source"]["zkguard"]["op"].clone();
    let url = format!("{es}/{fresh}/_search");
    let (_, hits) = call(
        &c,
        Method::POST,
        &url,
        Some(json!({"query": {"term": {"zkguard.op": op}}}).to_string()),
    )
    .await;
    assert_eq!(hits["hits"]["total"]["value"], 0, "{hits}");
    // A document transaction's writes map it too, before the first one to an index.
    let txn_index = format!("maptxn-{tag}");
    let body = json!({
        "id": format!("maptxn-{tag}"),
        "operations": [{"action": "index", "index": txn_index, "id": "a", "doc": {"v": 1}}],
    });
    let (status, out) = call(
        &c,
        Method::POST,
        &s.url("/v1/transactions"),
        Some(body.to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["state"], "committed", "{out}");
    assert_eq!(mapping_of(txn_index).await, stored);
    drop(s);

    let off = Env::new(&shared_zk().connect_string(), "stampmapoff")
        .with("ZKGUARD_ELASTIC_STAMP_MAPPING", "off")
        .start("stampmapoff");
    let left = format!("mapoff-{tag}");
    let (status, v) = put(
        &c,
        &off,
        &format!("/v1/indices/{left}/docs/1"),
        &json!({ "title": "t" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let dynamic_map = mapping_of(left).await;
    assert!(dynamic_map["properties"]["op"].is_object(), "{dynamic_map}");
}
