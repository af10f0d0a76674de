//! Dead letters and two-phase-commit transfers over HTTP.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_letters_are_listed_and_replayed_over_http() {
    let env = Env::new(&shared_zk().connect_string(), "dlq")
        .with("ZKGUARD_ZOOKEEPER_BACKGROUND_TASK_TIMEOUT", "200")
        .with("ZKGUARD_ELASTIC_REQUEST_RETRY_COUNT", "1");
    let s = env.start("a");
    let c = client();
    let index = format!("dlq-{}", uuid_tag());

    let (status, v) = call(&c, Method::GET, &s.url("/v1/deadletters"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v, json!([]));

    // Background operations whose lock is held elsewhere run out of attempts and are parked.
    let (_holder, guard) = hold_lock(&env, "dlq-doc").await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let (status, v) = put(
            &c,
            &s,
            &format!("/v1/indices/{index}/docs/{n}?type=background&monitor=dlq-doc"),
            &json!({"n": n}),
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{v}");
        ids.push(v["operation_id"].as_str().unwrap().to_string());
    }
    let states = wait_finished(&c, &s, &ids).await;
    for id in &ids {
        assert_eq!(states[id]["status"], "parked", "{}", states[id]);
    }
    let (status, listed) = call(&c, Method::GET, &s.url("/v1/deadletters"), None).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    // Parked by concurrent workers: in the order they gave up, not necessarily submitted.
    let listed_ids: HashSet<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed_ids, ids.iter().map(String::as_str).collect());
    assert_eq!(listed[0]["monitor"], "dlq-doc");
    assert_eq!(listed[0]["error_kind"], "lock_timeout", "{listed}");

    // Bad requests.
    let replay = s.url("/v1/deadletters/replay");
    let (status, v) = call(&c, Method::POST, &replay, Some("{}".into())).await;
    assert_error(status, &v, StatusCode::BAD_REQUEST, "bad_body", "say which");
    let (status, v) = call(&c, Method::POST, &replay, Some("{\"id\":".into())).await;
    assert_error(
        status,
        &v,
        StatusCode::BAD_REQUEST,
        "malformed_json",
        "{\"all\": true}",
    );
    let unknown = json!({"id": uuid::Uuid::new_v4().to_string()}).to_string();
    let (status, v) = call(&c, Method::POST, &replay, Some(unknown)).await;
    assert_error(
        status,
        &v,
        StatusCode::NOT_FOUND,
        "unknown_deadletter",
        "/v1/deadletters",
    );

    // Replayed while the lock is still held: they stay parked.
    let (status, v) = call(
        &c,
        Method::POST,
        &replay,
        Some(json!({"all": true}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["still_parked"], 3, "{v}");
    assert_eq!(
        metric(&scrape(&c, &s).await, "zkguard_deadletters_replayed_total"),
        0.0
    );

    // Released: one by id, then the rest.
    guard.unlock().await.unwrap();
    let one = json!({"id": ids[0]}).to_string();
    let (status, v) = call(&c, Method::POST, &replay, Some(one)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        (v["replayed"].as_u64(), v["applied"].as_u64()),
        (Some(1), Some(1)),
        "{v}"
    );
    assert_eq!(v["results"][0]["id"], ids[0].as_str());
    let (status, v) = call(
        &c,
        Method::POST,
        &replay,
        Some(json!({"all": true}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        (v["replayed"].as_u64(), v["applied"].as_u64()),
        (Some(2), Some(2)),
        "{v}"
    );
    for (n, id) in ids.iter().enumerate() {
        let doc = es_doc(&c, &index, &n.to_string()).await;
        assert_eq!(doc["_source"]["n"], n);
        // The status after a replay has the replay's token and the attempts, as after the queue.
        let st = op_status(&c, &s, id).await;
        assert_eq!(st["status"], "applied", "{st}");
        assert_eq!(st["token"], doc["_version"], "{st}");
        assert_eq!(
            st["attempts"], 3,
            "parked after 1, a failed replay, the replay: {st}"
        );
    }
    assert_eq!(v["results"][0]["attempts"], 3, "{v}");
    assert!(v["results"][0]["summary"].is_string(), "{v}");
    assert!(v["results"][0]["token"].is_u64(), "{v}");
    let (_, v) = call(&c, Method::GET, &s.url("/v1/deadletters"), None).await;
    assert_eq!(v, json!([]));
    assert_eq!(
        metric(&scrape(&c, &s).await, "zkguard_deadletters_replayed_total"),
        3.0
    );
}

/// Forty background writes of one document parked, their entries stored in shuffled order:
/// `POST /v1/deadletters/replay {"all": true}` applies them in the order the service accepted
/// them, so the document ends on the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replay_over_http_applies_a_documents_writes_in_acceptance_order() {
    let env = Env::new(&shared_zk().connect_string(), "dlq-order")
        .with("ZKGUARD_ZOOKEEPER_BACKGROUND_TASK_TIMEOUT", "200")
        .with("ZKGUARD_ELASTIC_REQUEST_RETRY_COUNT", "1");
    let s = env.start("a");
    let c = client();
    let index = format!("dlq-order-{}", uuid_tag());
    let (_holder, guard) = hold_lock(&env, "order-doc").await;
    let mut ids = Vec::new();
    for n in 0..40 {
        let (status, v) = put(
            &c,
            &s,
            &format!("/v1/indices/{index}/docs/1?type=background&monitor=order-doc"),
            &json!({ "n": n }),
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{v}");
        ids.push(v["operation_id"].as_str().unwrap().to_string());
    }
    let states = wait_finished(&c, &s, &ids).await;
    assert!(
        ids.iter().all(|id| states[id]["status"] == "parked"),
        "{states:?}"
    );
    // The entries in shuffled order, as concurrent workers may park them.
    let file = env.dir.path().join("a.dlq");
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: HashMap<String, &str> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            (
                serde_json::from_str::<Value>(l).unwrap()["id"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                l,
            )
        })
        .collect();
    assert_eq!(lines.len(), 40);
    let shuffled: String = (0..40)
        .map(|i| format!("{}\n", lines[&ids[i * 7 % 40]]))
        .collect();
    std::fs::write(&file, shuffled).unwrap();
    guard.unlock().await.unwrap();

    let (status, v) = call(
        &c,
        Method::POST,
        &s.url("/v1/deadletters/replay"),
        Some(json!({"all": true}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        (v["replayed"].as_u64(), v["applied"].as_u64()),
        (Some(40), Some(40)),
        "{v}"
    );
    let order: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        order,
        ids.iter().map(String::as_str).collect::<Vec<_>>(),
        "acceptance order"
    );
    let doc = es_doc(&c, &index, "1").await;
    assert_eq!(doc["_source"]["n"], 39, "the last accepted write: {doc}");
    let (_, v) = call(&c, Method::GET, &s.url("/v1/deadletters"), None).await;
    assert_eq!(v, json!([]));

    // Three more parked; one by id replays the older one of its document first.
    let (_holder, guard) = hold_lock(&env, "order-doc").await;
    let mut more = Vec::new();
    for n in 40..43 {
        let path = format!("/v1/indices/{index}/docs/1?type=background&monitor=order-doc");
        let (status, v) = put(&c, &s, &path, &json!({ "n": n })).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{v}");
        more.push(v["operation_id"].as_str().unwrap().to_string());
    }
    wait_finished(&c, &s, &more).await;
    guard.unlock().await.unwrap();
    let one = json!({"id": more[1]}).to_string();
    let (status, v) = call(
        &c,
        Method::POST,
        &s.url("/v1/deadletters/replay"),
        Some(one),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["applied"], 2, "{v}");
    assert_eq!(v["results"][0]["id"], more[0].as_str(), "{v}");
    assert_eq!(v["results"][0]["replayed_before"], more[1].as_str(), "{v}");
    assert_eq!(v["results"][1]["id"], more[1].as_str(), "{v}");
    assert_eq!(es_doc(&c, &index, "1").await["_source"]["n"], 41);

    // A newer foreground write: the last parked one is superseded, not applied over it.
    let path = format!("/v1/indices/{index}/docs/1?monitor=order-doc");
    let (status, v) = put(&c, &s, &path, &json!({"n": 100})).await;
    assert!(status.is_success(), "{status} {v}");
    let all = json!({"all": true}).to_string();
    let (status, v) = call(
        &c,
        Method::POST,
        &s.url("/v1/deadletters/replay"),
        Some(all),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        (v["superseded"].as_u64(), v["applied"].as_u64()),
        (Some(1), Some(0)),
        "{v}"
    );
    assert_eq!(v["results"][0]["result"], "superseded", "{v}");
    assert_eq!(es_doc(&c, &index, "1").await["_source"]["n"], 100);
    let st = op_status(&c, &s, &more[2]).await;
    assert_eq!(st["status"], "rejected", "{st}");
    assert!(
        st["reason"].as_str().unwrap().contains("superseded"),
        "{st}"
    );
    let (_, v) = call(&c, Method::GET, &s.url("/v1/deadletters"), None).await;
    assert_eq!(v, json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transfers_run_the_two_phase_commit_over_http() {
    let tag = uuid_tag();
    let env = Env::new(&shared_zk().connect_string(), "txn")
        .with("ZKGUARD_TXN_ACCOUNTS_INDEX", &format!("accounts-{tag}"))
        .with(
            "ZKGUARD_TXN_TRANSACTIONS_INDEX",
            &format!("transactions-{tag}"),
        );
    let txn_cli = |args: &[&str]| {
        crate::cli::zkguard()
            .arg("txn")
            .args(args)
            .env_remove("ZKGUARD_CONFIG")
            .env("ZKGUARD_ZOOKEEPER_SERVERS", &env.zk)
            .env("ZKGUARD_ELASTICSEARCH_URL", &env.es)
            .envs(env.extra.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap()
    };
    let init = txn_cli(&["init", "--accounts", "A=500,B=500"]);
    assert!(init.status.success(), "{init:?}");
    let s = env.start("a");
    let c = client();
    let transfers = s.url("/v1/transfers");

    let body = json!({"from": "A", "to": "B", "amount": 100, "id": "t-1"}).to_string();
    let (status, txn) = call(&c, Method::POST, &transfers, Some(body.clone())).await;
    assert_eq!(status, StatusCode::OK, "{txn}");
    assert_eq!(txn["id"], "t-1");
    assert_eq!(txn["transaction_state"], "finished", "{txn}");
    // The same transfer again reports it; it is not applied twice.
    let (status, again) = call(&c, Method::POST, &transfers, Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["transaction_state"], "finished", "{again}");
    let (status, shown) = call(&c, Method::GET, &s.url("/v1/transfers/t-1"), None).await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown, txn);

    // Refusals.
    let over = json!({"from": "A", "to": "B", "amount": 10_000}).to_string();
    let (status, v) = call(&c, Method::POST, &transfers, Some(over)).await;
    assert_error(
        status,
        &v,
        StatusCode::UNPROCESSABLE_ENTITY,
        "rejected",
        "A",
    );
    let other = json!({"from": "B", "to": "A", "amount": 1, "id": "t-1"}).to_string();
    let (status, v) = call(&c, Method::POST, &transfers, Some(other)).await;
    assert_error(status, &v, StatusCode::CONFLICT, "id_conflict", "t-1");
    let (status, v) = call(
        &c,
        Method::POST,
        &transfers,
        Some("{\"from\":\"A\"}".into()),
    )
    .await;
    assert_error(
        status,
        &v,
        StatusCode::BAD_REQUEST,
        "malformed_json",
        "amount",
    );
    let (status, v) = call(&c, Method::GET, &s.url("/v1/transfers/t-none"), None).await;
    assert_error(
        status,
        &v,
        StatusCode::NOT_FOUND,
        "unknown_transaction",
        "t-none",
    );

    let audit = txn_cli(&["audit", "--expect-total", "1000"]);
    assert!(audit.status.success(), "{audit:?}");
}

/// Dead letters by the caller's idempotency key: `GET /v1/deadletters` lists the key with each
/// entry, and `DELETE /v1/deadletters/{id}` and `POST /v1/deadletters/replay {"id": ...}` take
/// the key wherever they take the id (a key was refused as "not a dead letter id").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_letters_are_found_by_the_callers_idempotency_key() {
    let env = Env::new(&shared_zk().connect_string(), "dlqkey")
        .with("ZKGUARD_ZOOKEEPER_BACKGROUND_TASK_TIMEOUT", "200")
        .with("ZKGUARD_ELASTIC_REQUEST_RETRY_COUNT", "1");
    let s = env.start("a");
    let c = client();
    let index = format!("dlqkey-{}", uuid_tag());
    let keys = ["order-7-save-1", "order-7-save-2"];
    let (_holder, guard) = hold_lock(&env, "dlq-key").await;
    let mut shown = Vec::new();
    for (n, key) in keys.iter().enumerate() {
        let path =
            format!("/v1/indices/{index}/docs/{n}?type=background&monitor=dlq-key&op_id={key}");
        let (status, v) = put(&c, &s, &path, &json!({"n": n})).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{v}");
        shown.push(v["operation_id"].as_str().unwrap().to_string());
    }
    let states = wait_finished(&c, &s, &shown).await;
    assert!(
        states.values().all(|st| st["status"] == "parked"),
        "{states:?}"
    );
    let (status, listed) = call(&c, Method::GET, &s.url("/v1/deadletters"), None).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let mut listed_keys: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["operation"]["key"].as_str().unwrap_or("no key"))
        .collect();
    listed_keys.sort_unstable();
    assert_eq!(listed_keys, keys, "{listed}");

    let (status, v) = call(
        &c,
        Method::DELETE,
        &s.url("/v1/deadletters/order-7-save-2?reason=sent%20twice"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let replay = s.url("/v1/deadletters/replay");
    let (status, v) = call(
        &c,
        Method::POST,
        &replay,
        Some(json!({"id": "order-7-save-9"}).to_string()),
    )
    .await;
    assert_error(
        status,
        &v,
        StatusCode::NOT_FOUND,
        "unknown_deadletter",
        "order-7-save-9",
    );
    guard.unlock().await.unwrap();
    let (status, v) = call(
        &c,
        Method::POST,
        &replay,
        Some(json!({"id": "order-7-save-1"}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["applied"], 1, "{v}");
    let (_, v) = call(&c, Method::GET, &s.url("/v1/deadletters"), None).await;
    assert_eq!(v, json!([]));
    assert_eq!(es_doc(&c, &index, "0").await["_source"]["n"], 0);
}
