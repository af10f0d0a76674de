//! Elasticsearch API-key authentication: the key, given inline or by a file, reaches the server as
//! `Authorization: ApiKey ...`. osmem-server accepts any credentials, so a loopback proxy in front
//! of it records what the client sends.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;

use serde_json::json;
use zkguard::config::Settings;
use zkguard::es::{DocStore, EsStore, Refresh, WriteCondition};
use zkguard::testkit::OsmemServer;

/// A TCP proxy to `upstream` that keeps a copy of every byte the clients send.
fn recording_proxy(upstream: &str) -> (String, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let upstream = upstream.to_string();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let record = sent.clone();
    thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let Ok(mut server) = TcpStream::connect(&upstream) else {
                return;
            };
            let (mut client_rx, mut server_tx) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            thread::spawn(move || {
                let _ = std::io::copy(&mut server, &mut client);
            });
            let record = record.clone();
            thread::spawn(move || {
                let mut buf = [0u8; 8192];
                while let Ok(n) = client_rx.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    record.lock().unwrap().extend_from_slice(&buf[..n]);
                    if server_tx.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = server_tx.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    (format!("http://{addr}"), sent)
}

async fn authorization_sent(vars: &[(&str, &str)]) -> Vec<String> {
    let osmem = OsmemServer::start().expect("start osmem-server (run scripts/install-deps.sh)");
    let upstream = osmem
        .url()
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let (url, sent) = recording_proxy(upstream);
    let mut vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    vars.push(("ZKGUARD_ELASTICSEARCH_URL".into(), url));
    let settings =
        Settings::load_with_vars(None, vars.into_iter().map(|(k, v)| (k.into(), v.into())))
            .unwrap();
    let es = EsStore::new(&settings.elasticsearch).unwrap();
    es.index(
        "articles",
        "a1",
        &json!({"title": "one"}),
        WriteCondition::Create,
        Refresh::No,
    )
    .await
    .unwrap();
    assert!(es.get("articles", "a1").await.unwrap().is_some());
    let text = String::from_utf8_lossy(&sent.lock().unwrap()).into_owned();
    text.lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("authorization:"))
        .map(|l| l["authorization:".len()..].trim().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_encoded_api_key_is_sent_as_is() {
    let sent =
        authorization_sent(&[("ZKGUARD_ELASTICSEARCH_API_KEY", "a2V5LWlkOmtleS1zM2NyZXQ=")]).await;
    assert!(sent.len() >= 2, "{sent:?}");
    assert!(
        sent.iter().all(|h| h == "ApiKey a2V5LWlkOmtleS1zM2NyZXQ="),
        "{sent:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_api_key_from_a_file_as_id_and_key_is_encoded() {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "key-id:key-s3cret\n").unwrap();
    let sent = authorization_sent(&[(
        "ZKGUARD_ELASTICSEARCH_API_KEY_FILE",
        file.path().to_str().unwrap(),
    )])
    .await;
    assert!(sent.len() >= 2, "{sent:?}");
    // base64("key-id:key-s3cret")
    assert!(
        sent.iter().all(|h| h == "ApiKey a2V5LWlkOmtleS1zM2NyZXQ="),
        "{sent:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_password_from_a_file_is_sent_as_basic_auth() {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "pw-s3cret\n").unwrap();
    let sent = authorization_sent(&[
        ("ZKGUARD_ELASTICSEARCH_USERNAME", "elastic"),
        (
            "ZKGUARD_ELASTICSEARCH_PASSWORD_FILE",
            file.path().to_str().unwrap(),
        ),
    ])
    .await;
    assert!(sent.len() >= 2, "{sent:?}");
    // base64("elastic:pw-s3cret")
    assert!(
        sent.iter().all(|h| h == "Basic ZWxhc3RpYzpwdy1zM2NyZXQ="),
        "{sent:?}"
    );
}

#[test]
fn config_show_masks_the_api_key() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zkguard"))
        .env_remove("ZKGUARD_CONFIG")
        .env("ZKGUARD_ELASTICSEARCH_API_KEY", "a2V5LWlkOmtleS1zM2NyZXQ=")
        .args(["config", "show"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.contains("a2V5LWlkOmtleS1zM2NyZXQ="), "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("elasticsearch.api.key "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains("***"), "{line}");
}
