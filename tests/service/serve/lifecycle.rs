//! Start and stop: SIGTERM draining, a stalled Elasticsearch cut by the request timeout, and
//! the exit statuses of failed starts.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_lets_in_flight_requests_finish_and_exits_0() {
    let env = Env::new(&shared_zk().connect_string(), "term");
    let mut s = env.start("a");
    let c = client();
    let index = format!("term-{}", uuid_tag());
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/setup"),
        &json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let monitor = format!("{index}:a");
    let (holder, guard) = hold_lock(&env, &monitor).await;
    // A background operation that waits behind the holder, and a foreground request too.
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/a?type=background"),
        &json!({"bg": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let bg_id = v["operation_id"].as_str().unwrap().to_string();
    let fg = tokio::spawn({
        let c = c.clone();
        let url = s.url(&format!("/v1/indices/{index}/docs/a?timeout=20s"));
        async move { call(&c, Method::PUT, &url, Some("{\"fg\":1}".into())).await }
    });
    let lock_node = format!("{}/{monitor}", env.root);
    eventually(
        Duration::from_secs(10),
        "the foreground request queues",
        || async { queued(&env.zk, &lock_node, "A-").await >= 2 },
    )
    .await;
    s.signal(nix::sys::signal::Signal::SIGTERM);
    // New requests are refused (connection closed or 503) once the service drains.
    eventually(
        Duration::from_secs(10),
        "the service stops accepting",
        || async {
            match c.get(s.url("/readyz")).send().await {
                Err(_) => true,
                Ok(r) => r.status() == StatusCode::SERVICE_UNAVAILABLE,
            }
        },
    )
    .await;
    guard.unlock().await.unwrap();
    drop(holder);
    let (status, v) = fg.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{v}");
    let code = s.child.wait().unwrap();
    assert_eq!(code.code(), Some(0), "{}", s.log());
    // It released its locks and closed its session: none of its queue nodes is left behind.
    assert_eq!(children(&env.zk, &lock_node).await, Vec::<String>::new());
    // The background operation is applied, now or after the restart, exactly once.
    drop(s);
    let s = env.start("a");
    let states = wait_finished(&c, &s, std::slice::from_ref(&bg_id)).await;
    assert_eq!(states[&bg_id]["status"], "applied");
    let doc = es_doc(&c, &index, "a").await;
    let ops: Vec<String> =
        serde_json::from_value(doc["_source"]["zkguard"]["ops"].clone()).unwrap();
    assert_eq!(ops.iter().filter(|o| **o == bg_id).count(), 1, "{doc}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_elasticsearch_is_cut_by_the_request_timeout_and_readyz_says_why() {
    let es = OsmemServer::start().expect("start osmem-server");
    let mut env = Env::new(&shared_zk().connect_string(), "stall")
        .with("ZKGUARD_SERVER_REQUEST_TIMEOUT", "4000");
    env.es = es.url().to_string();
    let s = env.start("a");
    let c = client();
    // The first write creates the index, which on a busy machine may take longer than the
    // 4 s request timeout: it is cut, as any request past it is, and sent again.
    eventually(
        Duration::from_secs(60),
        "the first write is applied",
        || async {
            let (status, v) = put(&c, &s, "/v1/indices/stall/docs/setup", &json!({})).await;
            assert!(
                status == StatusCode::OK || v["error"] == "request_timeout",
                "{status}: {v}"
            );
            status == StatusCode::OK
        },
    )
    .await;
    es.pause();
    let (status, v) = put(&c, &s, "/v1/indices/stall/docs/a", &json!({"a": 1})).await;
    assert_error(
        status,
        &v,
        StatusCode::SERVICE_UNAVAILABLE,
        "request_timeout",
        "server.request.timeout",
    );
    let (status, v) = call(&c, Method::GET, &s.url("/readyz"), None).await;
    assert_error(
        status,
        &v,
        StatusCode::SERVICE_UNAVAILABLE,
        "not_ready",
        "Elasticsearch",
    );
    es.resume();
    eventually(Duration::from_secs(30), "readyz says 200 again", || async {
        call(&c, Method::GET, &s.url("/readyz"), None).await.0 == StatusCode::OK
    })
    .await;
    // The lock of the abandoned request was released: the same document can be written.
    let (status, v) = put(
        &c,
        &s,
        "/v1/indices/stall/docs/a?timeout=3s",
        &json!({"a": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

/// Elasticsearch down at start is waited for, not an exit (under a supervisor an exit is a crash
/// loop): the service starts, `/readyz` answers 503 naming the cluster and the error, a write
/// gets 503 with `Retry-After`, a background write is queued; once a cluster listens at that
/// address the service becomes ready without restarting and applies the queued write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elasticsearch_down_at_start_is_waited_for_not_an_exit() {
    let port = zkguard::testkit::free_port().unwrap();
    let mut env = Env::new(&shared_zk().connect_string(), "esdown")
        .with("ZKGUARD_SERVER_GATEWAY_LISTEN", "127.0.0.1:0");
    env.es = format!("http://127.0.0.1:{port}");
    let mut s = env.start("a");
    let gate = format!("http://{}", s.started["gateway"].as_str().unwrap());
    let c = client();
    let (status, v) = call(&c, Method::GET, &s.url("/readyz"), None).await;
    assert_error(
        status,
        &v,
        StatusCode::SERVICE_UNAVAILABLE,
        "not_ready",
        &format!("cannot reach Elasticsearch at http://127.0.0.1:{port}"),
    );
    let r = c
        .put(s.url("/v1/indices/esdown/docs/fg?timeout=5s"))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"), "{r:?}");
    let (status, v) = put(
        &c,
        &s,
        "/v1/indices/esdown/docs/bg?type=background",
        &json!({"bg": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let bg = v["operation_id"].as_str().unwrap().to_string();
    // The gate, which reads the cluster's product header when it first answers, says so too.
    let r = c.get(format!("{gate}/")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"), "{r:?}");
    assert!(s.child.try_wait().unwrap().is_none(), "{}", s.log());

    let es = OsmemServer::start_on(port).expect("start osmem-server on the service's port");
    eventually(Duration::from_secs(30), "readyz answers 200", || async {
        call(&c, Method::GET, &s.url("/readyz"), None).await.0 == StatusCode::OK
    })
    .await;
    assert!(s.child.try_wait().unwrap().is_none(), "{}", s.log());
    let states = wait_finished(&c, &s, std::slice::from_ref(&bg)).await;
    assert_eq!(states[&bg]["status"], "applied", "{}", states[&bg]);
    let (status, doc) = call(
        &c,
        Method::GET,
        &format!("{}/esdown/_doc/bg", es.url()),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    assert_eq!(doc["_source"]["bg"], 1, "{doc}");
    let r = c.get(format!("{gate}/")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let (status, v) = put(&c, &s, "/v1/indices/esdown/docs/fg", &json!({"fg": 1})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

#[test]
fn start_failures_exit_with_the_documented_status() {
    let env = Env::new(&shared_zk().connect_string(), "start");
    let run = |env: &Env, journal: &str| {
        crate::cli::zkguard()
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env_remove("ZKGUARD_CONFIG")
            .env("ZKGUARD_ZOOKEEPER_SERVERS", &env.zk)
            .env("ZKGUARD_ZOOKEEPER_LOCK_ROOT", &env.root)
            .env("ZKGUARD_ZOOKEEPER_CONNECTION_RETRY", "1")
            .env("ZKGUARD_ELASTICSEARCH_URL", &env.es)
            .env("ZKGUARD_SERVER_JOURNAL_PATH", env.journal(journal))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    // The journal of a running service.
    let _running = env.start("a");
    let o = run(&env, "a");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(78), "{err}");
    assert!(err.contains("in use by another zkguard serve"), "{err}");
    // ZooKeeper unreachable.
    let mut down = env.clone();
    down.zk = format!("127.0.0.1:{}", zkguard::testkit::free_port().unwrap());
    let o = run(&down, "b");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(69), "{err}");
    assert!(err.contains("ZooKeeper"), "{err}");
    // A bad server.* value.
    let o = crate::cli::zkguard()
        .args(["serve"])
        .env_remove("ZKGUARD_CONFIG")
        .env("ZKGUARD_SERVER_LISTEN", "localhost")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(78), "{err}");
    assert!(err.contains("server.listen"), "{err}");
}

/// On a one-node cluster of its own, the indices `zkguard serve` creates (the document
/// transactions' log at start, the lease lock's on the first lock) leave the cluster green.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_indices_the_service_creates_leave_a_one_node_cluster_green() {
    let es = OsmemServer::start().expect("start osmem-server");
    let mut env = Env::new(&shared_zk().connect_string(), "green")
        .with("ZKGUARD_LOCK_BACKEND", "elasticsearch");
    env.es = es.url().to_string();
    let s = env.start("a");
    let c = client();
    let es_get = |path: &str| {
        let (c, url) = (c.clone(), format!("{}/{path}", es.url()));
        async move { call(&c, Method::GET, &url, None).await }
    };
    eventually(
        Duration::from_secs(30),
        "the service created its transaction log",
        || async { es_get("zkguard-txn-log").await.0 == StatusCode::OK },
    )
    .await;
    let (status, lock) = call(&c, Method::POST, &s.url("/v1/locks/green-m?ttl=30s"), None).await;
    assert_eq!(status, StatusCode::OK, "{lock}");
    let (_, indices) = es_get("_cat/indices?format=json").await;
    let names: HashSet<&str> = indices
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["index"].as_str())
        .collect();
    assert_eq!(
        names,
        HashSet::from(["zkguard-txn-log", "zkguard-locks"]),
        "{indices}"
    );
    let (_, health) = es_get("_cluster/health?wait_for_status=green&timeout=5s").await;
    assert_eq!(health["status"], "green", "{health}");
}
