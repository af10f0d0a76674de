//! A journal that cannot record outcomes (its file at the file-size limit, as on a full disk)
//! stops the service from applying background operations: an operation applied without a
//! recorded outcome runs again at the next start, and once more than the document's 100
//! remembered ids were written after it, it would go over newer data with a newer token.

mod common;
mod serve_support;

use std::time::Duration;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::json;
use serve_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_that_cannot_be_journaled_stop_background_work_and_nothing_stale_is_replayed() {
    let env = Env::new(&shared_zk().connect_string(), "journal-full").file_size(Some(96 * 1024));
    let s = env.start("journal-full");
    let c = client();
    let index = format!("full-{}", uuid_tag());
    let monitor = format!("full-{}", uuid_tag());
    let (_holder, guard) = hold_lock(&env, &monitor).await;

    // Background writes of one document queue behind the held lock until the journal is full.
    let mut accepted = Vec::new();
    let refused = loop {
        let n = accepted.len();
        let op_id = uuid::Uuid::new_v4().to_string();
        let (status, v) = put(
            &c,
            &s,
            &format!("/v1/indices/{index}/docs/d?type=background&monitor={monitor}&op_id={op_id}"),
            &json!({"n": n}),
        )
        .await;
        if status != StatusCode::ACCEPTED {
            break v;
        }
        accepted.push(op_id);
        assert!(n < 2000, "the journal never filled up");
    };
    assert_eq!(refused["error"], "journal_unavailable", "{refused}");
    let last = accepted.len() - 1;
    assert!(
        last > 150,
        "only {last} operations fit: too few to pass the document's memory of 100 ids"
    );

    // The lock is free: the first batch is applied, its outcomes cannot be recorded, and the
    // service stops there, saying so on /readyz (until it manages to rewrite the journal).
    guard.unlock().await.unwrap();
    eventually(
        Duration::from_secs(30),
        "/readyz reports the journal",
        || async {
            let (status, v) = call(&client(), Method::GET, &s.url("/readyz"), None).await;
            status == StatusCode::SERVICE_UNAVAILABLE
                && v["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("journal cannot record outcomes"))
        },
    )
    .await;
    // A crash now: what was applied without a recorded outcome runs again at the next start.
    s.kill();

    // Restarted with room: every operation ends applied once, in order, and the document holds
    // the last one.
    let roomy = env.clone().file_size(None);
    let s = roomy.start("journal-full");
    let done = wait_finished(&c, &s, &accepted).await;
    assert!(done.values().all(|v| v["status"] == "applied"), "{done:?}");
    let doc = es_doc(&c, &index, "d").await;
    assert_eq!(doc["_source"]["n"], json!(last), "{doc}");
}
