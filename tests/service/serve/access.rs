//! Bearer tokens (reloaded on SIGHUP), HTTPS, and access settings refused at start.

use super::*;

/// Sends `method url` with an optional `Authorization` header value.
async fn call_as(c: &Client, method: Method, url: &str, auth: Option<&str>) -> (StatusCode, Value) {
    let mut req = c.request(method, url);
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    let resp = req.send().await.expect("send request");
    let status = resp.status();
    let www = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string());
    let mut body: Value =
        serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap_or(Value::Null);
    if let Some(w) = www {
        body["www-authenticate"] = json!(w);
    }
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bearer_tokens_are_required_and_reloaded_on_sighup() {
    let base = Env::new(&shared_zk().connect_string(), "auth");
    let tokens = base.dir.path().join("tokens");
    std::fs::write(
        &tokens,
        "# service tokens\nalpha-secret-1\n\nbravo-secret-2\n",
    )
    .unwrap();
    let env = base.with("ZKGUARD_SERVER_AUTH_TOKENS_FILE", tokens.to_str().unwrap());
    let s = env.start("a");
    assert_eq!(s.started["auth"], true);
    let c = client();
    let ops = s.url("/v1/deadletters");
    eventually(
        Duration::from_secs(10),
        "the start says tokens are required",
        || async { s.log().contains("bearer tokens required") },
    )
    .await;

    let (status, v) = call_as(&c, Method::GET, &ops, None).await;
    assert_error(
        status,
        &v,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "Authorization: Bearer",
    );
    assert_eq!(v["www-authenticate"], "Bearer realm=\"zkguard\"", "{v}");
    let (status, v) = call_as(&c, Method::GET, &ops, Some("Bearer alpha-secret-X")).await;
    assert_error(
        status,
        &v,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "not accepted",
    );
    let (status, v) = call_as(&c, Method::GET, &ops, Some("Basic YWxwaGE6eA==")).await;
    assert_error(
        status,
        &v,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "not a bearer token",
    );
    let (status, v) = call_as(&c, Method::GET, &ops, Some("Bearer alpha-secret")).await;
    assert_error(
        status,
        &v,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "not accepted",
    );
    for good in ["Bearer alpha-secret-1", "Bearer bravo-secret-2"] {
        let (status, v) = call_as(&c, Method::GET, &ops, Some(good)).await;
        assert_eq!(status, StatusCode::OK, "{good}: {v}");
    }
    // A write with a token; probes need none.
    let put_url = s.url(&format!("/v1/indices/auth-{}/docs/1", uuid_tag()));
    let resp = c
        .put(&put_url)
        .header("authorization", "Bearer alpha-secret-1")
        .body(json!({"a": 1}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        call_as(&c, Method::PUT, &put_url, None).await.0,
        StatusCode::UNAUTHORIZED
    );
    for probe in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(
            call_as(&c, Method::GET, &s.url(probe), None).await.0,
            StatusCode::OK,
            "{probe}"
        );
    }

    // The file changes; SIGHUP reloads it: the new token works, the removed one no longer does.
    std::fs::write(&tokens, "charlie-secret-3\n").unwrap();
    s.signal(nix::sys::signal::Signal::SIGHUP);
    eventually(
        Duration::from_secs(10),
        "the new token is accepted",
        || async {
            call_as(&c, Method::GET, &ops, Some("Bearer charlie-secret-3"))
                .await
                .0
                == StatusCode::OK
        },
    )
    .await;
    let (status, v) = call_as(&c, Method::GET, &ops, Some("Bearer alpha-secret-1")).await;
    assert_error(
        status,
        &v,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "not accepted",
    );
    // A file emptied by mistake is refused; the tokens in use stay.
    std::fs::write(&tokens, "\n").unwrap();
    s.signal(nix::sys::signal::Signal::SIGHUP);
    eventually(
        Duration::from_secs(10),
        "the failed reload is logged",
        || async { s.log().contains("were not reloaded") },
    )
    .await;
    let (status, _) = call_as(&c, Method::GET, &ops, Some("Bearer charlie-secret-3")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        call_as(&c, Method::GET, &s.url("/healthz"), None).await.0,
        StatusCode::OK
    );

    let log = s.log();
    for secret in ["alpha-secret", "bravo-secret", "charlie-secret"] {
        assert!(!log.contains(secret), "a token was logged: {log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_serves_clients_that_trust_its_ca_and_no_others() {
    let base = Env::new(&shared_zk().connect_string(), "tls");
    let authority = crate::certs::Ca::new(base.dir.path(), "serve");
    let ca = authority.cert();
    let (cert, key) = authority.issue("server");
    let env = base
        .with("ZKGUARD_SERVER_TLS_CERT", cert.to_str().unwrap())
        .with("ZKGUARD_SERVER_TLS_KEY", key.to_str().unwrap());
    let s = env.start("a");
    assert_eq!(s.started["tls"], true);
    assert_eq!(s.started["auth"], false);
    assert!(s.base.starts_with("https://"), "{}", s.base);
    eventually(
        Duration::from_secs(10),
        "the start says there is no authentication",
        || async {
            s.log().contains(
                "no bearer tokens configured (server.auth.tokens.file): listening on loopback only",
            )
        },
    )
    .await;

    let trusting = Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(&ca).unwrap()).unwrap())
        .tls_built_in_root_certs(false)
        .build()
        .unwrap();
    let (status, v) = call(&trusting, Method::GET, &s.url("/healthz"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, v) = put(
        &trusting,
        &s,
        &format!("/v1/indices/tls-{}/docs/1", uuid_tag()),
        &json!({"over": "tls"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");

    // A client that does not trust the CA refuses the service's certificate.
    let err = client().get(s.url("/healthz")).send().await.unwrap_err();
    assert!(err.is_connect(), "{err:?}");
    // Plain HTTP to the TLS port gets no answer.
    let plain = s.url("/healthz").replacen("https://", "http://", 1);
    assert!(client().get(plain).send().await.is_err());
    // The service still serves the trusting client after those failed handshakes.
    let (status, _) = call(&trusting, Method::GET, &s.url("/readyz"), None).await;
    assert_eq!(status, StatusCode::OK);
}

#[test]
fn bad_access_settings_are_refused_at_start_with_78() {
    let env = Env::new(&shared_zk().connect_string(), "access");
    let run = |vars: &[(&str, String)]| {
        let o = crate::cli::zkguard()
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env_remove("ZKGUARD_CONFIG")
            .env("ZKGUARD_ZOOKEEPER_SERVERS", &env.zk)
            .env("ZKGUARD_ZOOKEEPER_LOCK_ROOT", &env.root)
            .env("ZKGUARD_ELASTICSEARCH_URL", &env.es)
            .env("ZKGUARD_SERVER_JOURNAL_PATH", env.journal("x"))
            .envs(vars.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let dir = env.dir.path();
    let (code, err) = run(&[(
        "ZKGUARD_SERVER_TLS_CERT",
        dir.join("c.pem").display().to_string(),
    )]);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("server.tls.key"), "{err}");
    let (code, err) = run(&[
        (
            "ZKGUARD_SERVER_TLS_CERT",
            dir.join("missing.pem").display().to_string(),
        ),
        (
            "ZKGUARD_SERVER_TLS_KEY",
            dir.join("missing.key").display().to_string(),
        ),
    ]);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("server.tls.cert"), "{err}");
    let (code, err) = run(&[(
        "ZKGUARD_SERVER_AUTH_TOKENS_FILE",
        dir.join("no-tokens").display().to_string(),
    )]);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("server.auth.tokens.file"), "{err}");
    std::fs::write(dir.join("empty-tokens"), "# none yet\n").unwrap();
    let (code, err) = run(&[(
        "ZKGUARD_SERVER_AUTH_TOKENS_FILE",
        dir.join("empty-tokens").display().to_string(),
    )]);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("holds no token"), "{err}");
}
