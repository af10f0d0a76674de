//! Explicit locks over HTTP: leases, keep-alive, release, listing, caps, SIGTERM, and two
//! instances.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_explicit_lock_without_keepalive_passes_on_and_its_late_write_is_fenced() {
    let env = Env::new(&shared_zk().connect_string(), "lapse");
    let s = env.start("a");
    let c = client();
    let index = format!("lapse-{}", uuid_tag());

    let (status, lock) = call(
        &c,
        Method::POST,
        &s.url("/v1/locks/article-7?ttl=1500ms&info=editor"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{lock}");
    let old_token = lock["token"].as_u64().unwrap();
    let lock_id = lock["lock_id"].as_str().unwrap().to_string();
    assert_eq!(lock["monitor"], "article-7");
    assert_eq!(lock["ttl_ms"], 1500);
    assert!(lock["expires"].as_u64().unwrap() > 0, "{lock}");

    // The holder sends no keep-alive. A foreground write on the same monitor waits for the
    // lease to lapse, then gets a newer token.
    let (status, written) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/1?monitor=article-7&timeout=10s"),
        &json!({"title": "saved after the lapse"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{written}");
    let new_token = written["token"].as_u64().unwrap();
    assert!(new_token > old_token, "{new_token} <= {old_token}");

    // The lock is gone: its keep-alive and release say so.
    let keepalive = s.url(&format!("/v1/locks/article-7/{lock_id}/keepalive"));
    let (status, v) = call(&c, Method::POST, &keepalive, None).await;
    assert_error(
        status,
        &v,
        StatusCode::NOT_FOUND,
        "unknown_lock",
        "lease lapsed",
    );
    let release = s.url(&format!("/v1/locks/article-7/{lock_id}"));
    let (status, v) = call(&c, Method::DELETE, &release, None).await;
    assert_error(
        status,
        &v,
        StatusCode::NOT_FOUND,
        "unknown_lock",
        "released",
    );

    // The late writer, writing directly with its old token, is fenced by Elasticsearch.
    let late = format!(
        "{}/{index}/_doc/1?version={old_token}&version_type=external_gte",
        shared_es().url()
    );
    let (status, v) = call(
        &c,
        Method::PUT,
        &late,
        Some(json!({"title": "late write"}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    let doc = es_doc(&c, &index, "1").await;
    assert_eq!(doc["_source"]["title"], "saved after the lapse", "{doc}");
    assert_eq!(doc["_version"].as_u64(), Some(new_token), "{doc}");
    assert!(s.log().contains("lapsed"), "{}", s.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn explicit_locks_keep_alive_release_list_and_are_capped() {
    let env = Env::new(&shared_zk().connect_string(), "explicit")
        .with("ZKGUARD_SERVER_LOCK_MAX", "1")
        .with("ZKGUARD_SERVER_LOCK_TTL_MAX", "60000");
    let s = env.start("a");
    let c = client();

    // Bad requests.
    let (status, v) = call(&c, Method::POST, &s.url("/v1/locks/m1?ttl=2m"), None).await;
    assert_error(
        status,
        &v,
        StatusCode::BAD_REQUEST,
        "bad_parameter",
        "server.lock.ttl.max",
    );
    let (status, v) = call(&c, Method::POST, &s.url("/v1/locks/m1?lease=1s"), None).await;
    assert_error(
        status,
        &v,
        StatusCode::BAD_REQUEST,
        "bad_parameter",
        "lease",
    );
    let (status, v) = call(&c, Method::POST, &s.url("/v1/locks/privateLock"), None).await;
    assert_error(
        status,
        &v,
        StatusCode::BAD_REQUEST,
        "bad_monitor",
        "reserved",
    );
    let (status, v) = call(&c, Method::POST, &s.url("/v1/locks/m1/xyz/keepalive"), None).await;
    assert_error(
        status,
        &v,
        StatusCode::BAD_REQUEST,
        "bad_lock_id",
        "not a UUID",
    );

    // A lock with a 1 s lease, kept alive past it by keep-alives.
    let (status, lock) = call(&c, Method::POST, &s.url("/v1/locks/m1?ttl=1s"), None).await;
    assert_eq!(status, StatusCode::OK, "{lock}");
    let id = lock["lock_id"].as_str().unwrap().to_string();
    let token = lock["token"].as_u64().unwrap();
    let keepalive = s.url(&format!("/v1/locks/m1/{id}/keepalive"));
    let mut expires = lock["expires"].as_u64().unwrap();
    for _ in 0..8 {
        // A client's keep-alive cadence: a third of the lease.
        tokio::time::sleep(Duration::from_millis(330)).await;
        let (status, v) = call(&c, Method::POST, &keepalive, None).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["token"].as_u64(), Some(token));
        assert!(v["expires"].as_u64().unwrap() >= expires, "{v}");
        expires = v["expires"].as_u64().unwrap();
    }
    // Still held, more than twice its lease later: the listing shows it with its token, as
    // `zkguard locks --json` does.
    let (status, v) = call(&c, Method::GET, &s.url("/v1/locks/m1"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v[0]["monitor"], "m1", "{v}");
    assert_eq!(v[0]["token"].as_u64(), Some(token), "{v}");
    assert_eq!(v[0]["holder"]["info"], "zkguard serve explicit lock", "{v}");
    assert_eq!(
        without_ages(v),
        without_ages(cli_locks(&env, &["--monitor", "m1"]))
    );
    let (status, all) = call(&c, Method::GET, &s.url("/v1/locks"), None).await;
    assert_eq!(status, StatusCode::OK, "{all}");
    assert_eq!(without_ages(all), without_ages(cli_locks(&env, &[])));
    assert_eq!(
        scrape(&c, &s).await.get("zkguard_explicit_locks"),
        Some(&1.0)
    );
    // The limit is per service: a lock on another monitor is refused.
    let (status, v) = call(&c, Method::POST, &s.url("/v1/locks/m2"), None).await;
    assert_error(
        status,
        &v,
        StatusCode::SERVICE_UNAVAILABLE,
        "too_many_locks",
        "server.lock.max",
    );

    // Released: a try-once contender gets it at once.
    let release = s.url(&format!("/v1/locks/m1/{id}"));
    let (status, v) = call(&c, Method::DELETE, &release, None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["released"], true);
    let (status, v) = call(&c, Method::DELETE, &release, None).await;
    assert_error(
        status,
        &v,
        StatusCode::NOT_FOUND,
        "unknown_lock",
        "released",
    );
    let (status, again) = call(&c, Method::POST, &s.url("/v1/locks/m1?timeout=0"), None).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert!(again["token"].as_u64().unwrap() > token, "{again}");
    // Held by another one: a try-once contender on the same monitor is 423 (after a release
    // there is room again).
    let again_id = again["lock_id"].as_str().unwrap();
    let (status, v) = call(
        &c,
        Method::DELETE,
        &s.url(&format!("/v1/locks/m1/{again_id}")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (_held_by, _g) = hold_lock(&env, "m1").await;
    let (status, v) = call(&c, Method::POST, &s.url("/v1/locks/m1?timeout=0"), None).await;
    assert_error(status, &v, StatusCode::LOCKED, "lock_timeout", "tried once");
    assert!(!v["message"].as_str().unwrap().contains("raise"), "{v}");
    assert_eq!(
        scrape(&c, &s).await.get("zkguard_explicit_locks"),
        Some(&0.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_releases_explicit_leases_on_the_elasticsearch_lock() {
    let env = Env::new(&shared_zk().connect_string(), "term-es")
        .with("ZKGUARD_LOCK_BACKEND", "elasticsearch")
        .with(
            "ZKGUARD_ELASTICSEARCH_LOCK_INDEX",
            &format!("term-locks-{}", uuid_tag()),
        )
        .with("ZKGUARD_ELASTICSEARCH_LOCK_TTL", "60000");
    let mut s = env.start("a");
    let c = client();
    let (status, lock) = call(&c, Method::POST, &s.url("/v1/locks/term-m?ttl=60s"), None).await;
    assert_eq!(status, StatusCode::OK, "{lock}");
    assert_eq!(
        cli_locks(&env, &["--monitor", "term-m"])[0]["state"],
        "held"
    );

    s.signal(nix::sys::signal::Signal::SIGTERM);
    let code = tokio::task::block_in_place(|| s.child.wait().unwrap());
    assert_eq!(code.code(), Some(0), "{}", s.log());
    // The lease was released, not left to expire in a minute.
    let listed = cli_locks(&env, &["--monitor", "term-m"]);
    assert_eq!(listed[0]["state"], "free", "{listed}");
    assert!(s.log().contains("explicit locks released"), "{}", s.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn explicit_locks_exclude_each_other_across_two_instances() {
    let env = Env::new(&shared_zk().connect_string(), "explicit-two");
    let (a, b) = (env.start("a"), env.start("b"));
    let c = client();
    let (status, held) = call(&c, Method::POST, &a.url("/v1/locks/shared-m?ttl=30s"), None).await;
    assert_eq!(status, StatusCode::OK, "{held}");
    // The other instance lists the holder and cannot take the lock.
    let (_, listed) = call(&c, Method::GET, &b.url("/v1/locks/shared-m"), None).await;
    assert_eq!(listed[0]["token"], held["token"], "{listed}");
    let (status, v) = call(
        &c,
        Method::POST,
        &b.url("/v1/locks/shared-m?timeout=0"),
        None,
    )
    .await;
    assert_error(
        status,
        &v,
        StatusCode::LOCKED,
        "lock_timeout",
        "is not free",
    );
    // A lock id belongs to the instance that gave it.
    let id = held["lock_id"].as_str().unwrap();
    let (status, v) = call(
        &c,
        Method::POST,
        &b.url(&format!("/v1/locks/shared-m/{id}/keepalive")),
        None,
    )
    .await;
    assert_error(
        status,
        &v,
        StatusCode::NOT_FOUND,
        "unknown_lock",
        "held here",
    );
    // Released on the first instance: the second one takes it, with a greater token.
    let (status, v) = call(
        &c,
        Method::DELETE,
        &a.url(&format!("/v1/locks/shared-m/{id}")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, next) = call(
        &c,
        Method::POST,
        &b.url("/v1/locks/shared-m?timeout=0"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{next}");
    assert!(
        next["token"].as_u64().unwrap() > held["token"].as_u64().unwrap(),
        "{next} after {held}"
    );
}
