//! Input `zkguard serve` refuses up front with a clear 400, on the foreground and the background
//! path alike: ids Elasticsearch cannot address (`.`, `..`), and a query parameter given twice;
//! an explicit lock's info longer than 1 KiB.

use crate::common;
use crate::serve_support;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::json;
use serve_support::*;

/// A PUT sent byte for byte as given: returns the status and the JSON body.
fn raw_put(s: &Service, path: &str, body: &str) -> (u16, serde_json::Value) {
    use std::io::{Read, Write};
    let addr = s.url("").trim_start_matches("http://").to_string();
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        stream,
        "PUT {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer[9..12].parse().unwrap();
    let json = answer
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b.trim()).ok())
        .unwrap_or(serde_json::Value::Null);
    (status, json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dot_ids_and_repeated_parameters_are_refused_on_both_paths() {
    let env = Env::new(&shared_zk().connect_string(), "input");
    let s = env.start("input");
    let c = client();
    let index = format!("input-{}", uuid_tag());
    for id in [".", ".."] {
        for kind in ["foreground", "background"] {
            // Sent as is (URL libraries remove dot segments, as curl does without --path-as-is),
            // and percent-encoded.
            for shown in [id.to_string(), id.replace('.', "%2E")] {
                let path = format!("/v1/indices/{index}/docs/{shown}?type={kind}");
                let (status, v) = raw_put(&s, &path, r#"{"n":1}"#);
                assert_eq!(status, 400, "{kind} `{shown}`: {v}");
                assert_eq!(v["error"], "bad_id", "{v}");
                assert!(
                    v["message"].as_str().unwrap().contains("`.` or `..`"),
                    "{v}"
                );
            }
        }
        let line = json!({"action": "index", "index": index, "id": id, "doc": {"n": 1}});
        let (status, v) = call(&c, Method::POST, &s.url("/v1/bulk"), Some(line.to_string())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "bulk `{id}`: {v}");
        assert!(
            v["message"].as_str().unwrap().starts_with("line 1: "),
            "{v}"
        );
    }
    let path = format!("/v1/indices/{index}/docs/1?type=foreground&type=background");
    let (status, v) = put(&c, &s, &path, &json!({"n": 1})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("`type` is given twice"),
        "{v}"
    );
    let (status, _) = call(
        &c,
        Method::GET,
        &format!("{}/{index}/_doc/1", shared_es().url()),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was written");
}

/// An explicit lock's `info` is at most 1024 bytes, on both forms of `POST /v1/locks`: longer
/// is refused with 400 `bad_parameter` naming the limit, and nothing is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_info_over_1_kib_is_refused() {
    let env = Env::new(&shared_zk().connect_string(), "input-info");
    let s = env.start("input-info");
    let c = client();
    let long = "i".repeat(1025);
    for route in [
        "/v1/locks/info-m".to_string(),
        format!("/v1/locks?index=info-{}&id=1", uuid_tag()),
    ] {
        let sep = if route.contains('?') { '&' } else { '?' };
        let url = s.url(&format!("{route}{sep}ttl=30s&info={long}"));
        let (status, v) = call(&c, Method::POST, &url, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{route}: {v}");
        assert_eq!(v["error"], "bad_parameter", "{v}");
        let message = v["message"].as_str().unwrap();
        assert!(
            message.starts_with("info: ")
                && message.contains("1025 bytes")
                && message.contains("1024"),
            "{v}"
        );
        // 1024 bytes are taken.
        let url = s.url(&format!("{route}{sep}ttl=30s&info={}", &long[1..]));
        let (status, lock) = call(&c, Method::POST, &url, None).await;
        assert_eq!(status, StatusCode::OK, "{route}: {lock}");
        let monitor: String =
            url::form_urlencoded::byte_serialize(lock["monitor"].as_str().unwrap().as_bytes())
                .collect();
        let url = s.url(&format!(
            "/v1/locks/{monitor}/{}",
            lock["lock_id"].as_str().unwrap()
        ));
        let (status, v) = call(&c, Method::DELETE, &url, None).await;
        assert_eq!(status, StatusCode::OK, "{v}");
    }
    let (status, v) = call(&c, Method::GET, &s.url("/v1/locks"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(!v.to_string().contains("iiii"), "no lock is held: {v}");
}

/// zkguard's own indices (transactions, dead letters, the lease lock) and system indices (a
/// leading `.`) are not written through the API unless `server.index.allow` names them: a
/// caller's write there would corrupt zkguard's own records or the cluster's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_and_system_indices_are_refused_unless_allowed() {
    let env = Env::new(&shared_zk().connect_string(), "own-index")
        .with("ZKGUARD_SERVER_INDEX_ALLOW", ".kept-for-tests");
    let s = env.start("own-index");
    let c = client();
    for index in [
        "zkguard-accounts",
        "zkguard-transactions",
        "zkguard-deadletters",
        "zkguard-locks",
        ".security",
    ] {
        for kind in ["foreground", "background"] {
            let path = format!("/v1/indices/{index}/docs/1?type={kind}");
            let (status, v) = put(&c, &s, &path, &json!({"n": 1})).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{kind} {index}: {v}");
            assert_eq!(v["error"], "protected_index", "{v}");
            assert!(
                v["message"]
                    .as_str()
                    .unwrap()
                    .contains("server.index.allow"),
                "{v}"
            );
        }
        let line = json!({"action": "delete", "index": index, "id": "1"});
        let (status, v) = call(&c, Method::POST, &s.url("/v1/bulk"), Some(line.to_string())).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "bulk {index}: {v}");
    }
    let (status, v) = put(
        &c,
        &s,
        "/v1/indices/.kept-for-tests/docs/1",
        &json!({"n": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "an allowed index: {v}");
}

/// Connections that send their headers and then trickle (or stall) their bodies must not hold
/// the request slots (`server.max.concurrent`): the body is read, under `server.body.timeout`,
/// before a request takes a slot. Other clients are served meanwhile, and the slow senders get
/// a 408 once their body is overdue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_request_bodies_do_not_take_the_slots_of_other_requests() {
    use std::io::{Read, Write};
    let env = Env::new(&shared_zk().connect_string(), "slow-bodies")
        .with("ZKGUARD_SERVER_MAX_CONCURRENT", "4")
        .with("ZKGUARD_SERVER_BODY_TIMEOUT", "1500");
    let s = env.start("slow-bodies");
    let addr = s.url("").trim_start_matches("http://").to_string();
    let index = format!("slow-{}", uuid_tag());
    // Twice as many stalled bodies as there are slots: headers and one byte of 20.
    let stalled: Vec<std::net::TcpStream> = (0..8)
        .map(|i| {
            let mut t = std::net::TcpStream::connect(&addr).unwrap();
            write!(
                t,
                "PUT /v1/indices/{index}/docs/s{i} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n{{"
            )
            .unwrap();
            t
        })
        .collect();
    let c = client();
    // Wait until the service has all of them (each counted as a request in flight would show in
    // the metrics; here: a request of another client is answered while they stall).
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/ok"),
        &json!({"n": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "served while 8 bodies stall: {v}");
    // The stalled ones are answered 408 once their body is overdue, and closed.
    for mut t in stalled {
        t.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        let mut answer = String::new();
        let _ = t.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("body_timeout"), "{answer}");
        assert!(
            answer.to_ascii_lowercase().contains("connection: close"),
            "{answer}"
        );
    }
}

/// `/readyz` answers without a token, so it does not name the servers behind the service to
/// anyone who asks: without a token it says what is down, with one it also says where.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_the_servers_only_to_an_authenticated_caller() {
    let zk = zk_server();
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let token = "readyz-test-token-0123456789abcdef";
    std::fs::write(&tokens, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let env = Env::new(&zk.connect_string(), "readyz")
        .with("ZKGUARD_SERVER_AUTH_TOKENS_FILE", tokens.to_str().unwrap());
    let s = env.start("readyz");
    let c = client();
    let (status, v) = call(&c, Method::GET, &s.url("/readyz"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    zk.stop();
    let address = zk.connect_string();
    eventually(std::time::Duration::from_secs(20), "not ready", || async {
        call(&c, Method::GET, &s.url("/readyz"), None).await.0 == StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    let (_, anonymous) = call(&c, Method::GET, &s.url("/readyz"), None).await;
    let message = anonymous["message"].as_str().unwrap();
    assert!(
        message.contains("ZooKeeper session is not connected"),
        "{anonymous}"
    );
    assert!(!message.contains(&address), "{anonymous}");
    let told = c
        .get(s.url("/readyz"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap();
    assert!(
        told["message"].as_str().unwrap().contains(&address),
        "{told}"
    );
}
