//! Bad input, lock timeouts and load beyond the limits, and the metrics that count them.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_gets_clear_client_errors() {
    let env =
        Env::new(&shared_zk().connect_string(), "bad").with("ZKGUARD_SERVER_MAX_BODY", "1024");
    let s = env.start("a");
    let c = client();
    let docs = s.url("/v1/indices/bad/docs/1");
    // (method, URL, body, expected status, error kind, a piece of the message)
    type Case = (
        Method,
        String,
        Option<String>,
        StatusCode,
        &'static str,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (Method::PUT, docs.clone(), Some("{\"a\":".into()), StatusCode::BAD_REQUEST, "malformed_json", "not valid JSON"),
        (Method::PUT, docs.clone(), Some("[1,2]".into()), StatusCode::BAD_REQUEST, "bad_document", "JSON object"),
        (Method::PUT, docs.clone(), Some(format!("{{\"a\":\"{}\"}}", "x".repeat(2000))), StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", "server.max.body"),
        (Method::PUT, format!("{docs}?monitor=a%2Fb"), Some("{}".into()), StatusCode::BAD_REQUEST, "bad_monitor", "`/`"),
        (Method::PUT, format!("{docs}?op_id=%09tab"), Some("{}".into()), StatusCode::BAD_REQUEST, "bad_parameter", "printable text of 1 to 200 bytes"),
        (Method::PUT, format!("{docs}?type=urgent"), Some("{}".into()), StatusCode::BAD_REQUEST, "bad_parameter", "unknown lock type"),
        (Method::PUT, format!("{docs}?timeout=soon"), Some("{}".into()), StatusCode::BAD_REQUEST, "bad_parameter", "timeout"),
        (Method::PUT, format!("{docs}?colour=red"), Some("{}".into()), StatusCode::BAD_REQUEST, "bad_parameter", "unknown query parameter `colour`"),
        (Method::PUT, s.url("/v1/indices/Bad/docs/1"), Some("{}".into()), StatusCode::BAD_REQUEST, "bad_index", "lowercase"),
        (Method::PUT, docs.clone(), Some("{\"zkguard\":1}".into()), StatusCode::BAD_REQUEST, "invalid_operation", "zkguard"),
        (Method::PUT, s.url("/v1/indices/%FF/docs/1"), Some("{}".into()), StatusCode::BAD_REQUEST, "bad_path", "path"),
        (Method::PUT, docs.clone(), Some("{\"a\":\"\u{0}\"".into()), StatusCode::BAD_REQUEST, "malformed_json", "not valid JSON"),
        (Method::DELETE, format!("{docs}?mode=soft"), None, StatusCode::BAD_REQUEST, "bad_parameter", "hard or tombstone"),
        (Method::PUT, format!("{docs}?mode=hard"), Some("{}".into()), StatusCode::BAD_REQUEST, "bad_parameter", "unknown query parameter `mode`"),
        (Method::POST, s.url("/v1/bulk?type=foreground"), Some("{}".into()), StatusCode::BAD_REQUEST, "bad_parameter", "no query parameters"),
        (Method::GET, s.url("/v2/nothing"), None, StatusCode::NOT_FOUND, "no_route", "/v2/nothing"),
        (Method::POST, docs.clone(), Some("{}".into()), StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "POST"),
        (Method::GET, s.url("/v1/operations/xyz"), None, StatusCode::NOT_FOUND, "unknown_operation", "no operation xyz"),
        (Method::GET, s.url(&format!("/v1/operations/{}", uuid::Uuid::new_v4())), None, StatusCode::NOT_FOUND, "unknown_operation", "no operation"),
        (Method::POST, s.url("/v1/bulk"), Some("\n\n".into()), StatusCode::BAD_REQUEST, "empty_bulk", "no operation"),
        (Method::POST, s.url("/v1/bulk"), Some("{\"action\":\"index\",\"index\":\"bad\",\"id\":\"1\",\"doc\":{}}\n{\"action\":\"index\",\"index\":\"bad\",\"id\":\"2\"}\n".into()), StatusCode::BAD_REQUEST, "bad_document", "line 2"),
        (Method::POST, s.url("/v1/bulk"), Some("{\"action\":\"upsert\"}\n".into()), StatusCode::BAD_REQUEST, "malformed_json", "line 1"),
    ];
    for (method, url, body, want, kind, needle) in cases {
        let (status, v) = call(&c, method.clone(), &url, body).await;
        assert_error(status, &v, want, kind, needle);
    }
    // Nothing of the refused bulk request was accepted.
    let (status, _) = call(&c, Method::GET, &s.url("/healthz"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(std::fs::read_to_string(env.journal("a"))
        .unwrap()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_timeout_is_423_and_load_beyond_the_limit_is_503_with_retry_after() {
    let env =
        Env::new(&shared_zk().connect_string(), "load").with("ZKGUARD_SERVER_MAX_CONCURRENT", "1");
    let s = env.start("a");
    let c = client();
    let index = format!("load-{}", uuid_tag());
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/setup"),
        &json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (_holder, guard) = hold_lock(&env, &format!("{index}:a")).await;
    let resp = c
        .put(s.url(&format!("/v1/indices/{index}/docs/a?timeout=300ms")))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::LOCKED);
    assert!(resp.headers().contains_key("retry-after"));
    let v: Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
    assert_eq!(v["error"], "lock_timeout", "{v}");

    // One request waits for the lock; the next one is beyond the limit of 1.
    let waiting = tokio::spawn({
        let c = c.clone();
        let url = s.url(&format!("/v1/indices/{index}/docs/a?timeout=20s"));
        async move { call(&c, Method::PUT, &url, Some("{\"w\":1}".into())).await }
    });
    let lock_node = format!("{}/{index}:a", env.root);
    eventually(
        Duration::from_secs(10),
        "the request queues for the lock",
        || async { queued(&env.zk, &lock_node, "A-").await >= 2 },
    )
    .await;
    let resp = c
        .put(s.url(&format!("/v1/indices/{index}/docs/b")))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(resp.headers().contains_key("retry-after"));
    let v: Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
    assert_eq!(v["error"], "overloaded", "{v}");
    // Health and metrics are not limited.
    assert_eq!(
        call(&c, Method::GET, &s.url("/healthz"), None).await.0,
        StatusCode::OK
    );
    guard.unlock().await.unwrap();
    let (status, v) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_parse_and_count_what_happened() {
    let env = Env::new(&shared_zk().connect_string(), "metrics")
        .arg("--log-format")
        .arg("json");
    let s = env.start("a");
    let c = client();
    let index = format!("metrics-{}", uuid_tag());
    let before = scrape(&c, &s).await;
    let route = r#"zkguard_http_requests_total{route="/v1/indices/{index}/docs/{id}",method="PUT",status="200"}"#;
    assert_eq!(metric(&before, route), 0.0);
    for i in 0..3 {
        let (status, v) = put(
            &c,
            &s,
            &format!("/v1/indices/{index}/docs/{i}"),
            &json!({"i": i}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{v}");
    }
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/bg?type=background"),
        &json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let id = v["operation_id"].as_str().unwrap().to_string();
    wait_finished(&c, &s, std::slice::from_ref(&id)).await;
    let (status, _) = put(&c, &s, &format!("/v1/indices/{index}/docs/x"), &json!(1)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let after = scrape(&c, &s).await;
    assert_eq!(metric(&after, route), 3.0);
    assert_eq!(
        metric(
            &after,
            r#"zkguard_http_requests_total{route="/v1/indices/{index}/docs/{id}",method="PUT",status="400"}"#
        ),
        1.0
    );
    assert_eq!(
        metric(
            &after,
            r#"zkguard_operations_total{lock_type="foreground",outcome="applied"}"#
        ),
        3.0
    );
    assert_eq!(
        metric(
            &after,
            r#"zkguard_operations_total{lock_type="background",outcome="applied"}"#
        ),
        1.0
    );
    assert_eq!(
        metric(
            &after,
            r#"zkguard_lock_acquisitions_total{lock_type="foreground"}"#
        ),
        3.0
    );
    assert_eq!(
        metric(
            &after,
            r#"zkguard_lock_wait_seconds_count{lock_type="foreground"}"#
        ),
        3.0
    );
    assert_eq!(
        metric(
            &after,
            r#"zkguard_lock_hold_seconds_count{lock_type="background"}"#
        ),
        1.0
    );
    assert_eq!(metric(&after, "zkguard_journal_depth"), 0.0);
    assert_eq!(metric(&after, "zkguard_lock_backend_connected"), 1.0);
    // --log-format json: every log line is one JSON object.
    let log = s.log();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["message"] == "zkguard serve started"),
        "{log}"
    );
}
