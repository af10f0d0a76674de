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
    let out = crate::cli::zkguard()
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

use crate::certs;

/// A TLS-terminating front for `upstream` (plain HTTP): serves a certificate of `ca` for
/// 127.0.0.1, requires a client certificate signed by `ca` when `client_ca` is set, and keeps a
/// copy of the decrypted bytes the clients send. Returns the `https://` URL.
async fn tls_front(
    upstream: &str,
    ca: &certs::Ca,
    require_client_cert: bool,
) -> (String, Arc<Mutex<Vec<u8>>>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (cert, key) = ca.issue("es-front");
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(&key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = if require_client_cert {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(ca.cert()).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                .build()
                .unwrap();
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let config = builder.with_single_cert(chain, key).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let upstream = upstream.to_string();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let record = sent.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, upstream, record) = (acceptor.clone(), upstream.clone(), record.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                let (mut client_rx, mut client_tx) = tokio::io::split(tls);
                let (mut server_rx, mut server_tx) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
                    let _ = client_tx.shutdown().await;
                });
                let mut buf = [0u8; 8192];
                while let Ok(n) = client_rx.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    record.lock().unwrap().extend_from_slice(&buf[..n]);
                    if server_tx.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = server_tx.shutdown().await;
            });
        }
    });
    (format!("https://{addr}"), sent)
}

fn authorization_headers(sent: &Mutex<Vec<u8>>) -> Vec<String> {
    String::from_utf8_lossy(&sent.lock().unwrap())
        .lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("authorization:"))
        .map(|l| l["authorization:".len()..].trim().to_string())
        .collect()
}

fn settings_from(vars: &[(&str, String)]) -> Settings {
    Settings::load_with_vars(
        None,
        vars.iter()
            .map(|(k, v)| (k.to_string().into(), v.clone().into())),
    )
    .unwrap()
}

async fn write_and_read(settings: &Settings) {
    let es = EsStore::new(&settings.elasticsearch).unwrap();
    es.index(
        "articles",
        "t1",
        &json!({"title": "over TLS"}),
        WriteCondition::Create,
        Refresh::No,
    )
    .await
    .unwrap();
    assert!(es.get("articles", "t1").await.unwrap().is_some());
}

fn upstream_of(osmem: &OsmemServer) -> String {
    osmem
        .url()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string()
}

/// An API key over TLS, the server's certificate checked against `elasticsearch.tls.ca`.
#[tokio::test(flavor = "multi_thread")]
async fn an_api_key_over_tls_with_the_configured_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = certs::Ca::new(dir.path(), "es");
    let osmem = OsmemServer::start().expect("start osmem-server (run scripts/install-deps.sh)");
    let (url, sent) = tls_front(&upstream_of(&osmem), &ca, false).await;
    let settings = settings_from(&[
        ("ZKGUARD_ELASTICSEARCH_URL", url),
        (
            "ZKGUARD_ELASTICSEARCH_API_KEY",
            "a2V5LWlkOmtleS1zM2NyZXQ=".into(),
        ),
        (
            "ZKGUARD_ELASTICSEARCH_TLS_CA",
            ca.cert().display().to_string(),
        ),
    ]);
    write_and_read(&settings).await;
    let auth = authorization_headers(&sent);
    assert!(auth.len() >= 2, "{auth:?}");
    assert!(
        auth.iter().all(|h| h == "ApiKey a2V5LWlkOmtleS1zM2NyZXQ="),
        "{auth:?}"
    );
}

/// Basic authentication together with a client certificate, for a server that requires one:
/// the certificate is presented and the credentials still reach the server.
#[tokio::test(flavor = "multi_thread")]
async fn basic_auth_with_a_client_certificate_over_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = certs::Ca::new(dir.path(), "es");
    let osmem = OsmemServer::start().expect("start osmem-server (run scripts/install-deps.sh)");
    let (url, sent) = tls_front(&upstream_of(&osmem), &ca, true).await;
    let (cert, key) = ca.issue("zkguard-client");
    let mut vars = vec![
        ("ZKGUARD_ELASTICSEARCH_URL", url),
        ("ZKGUARD_ELASTICSEARCH_USERNAME", "elastic".to_string()),
        ("ZKGUARD_ELASTICSEARCH_PASSWORD", "pw-s3cret".to_string()),
        (
            "ZKGUARD_ELASTICSEARCH_TLS_CA",
            ca.cert().display().to_string(),
        ),
    ];
    // Without the client certificate the server refuses the connection.
    let es = EsStore::new(&settings_from(&vars).elasticsearch).unwrap();
    let refused = es.get("articles", "t1").await.unwrap_err().to_string();
    assert!(refused.contains("check elasticsearch.tls.ca"), "{refused}");
    vars.push(("ZKGUARD_ELASTICSEARCH_TLS_CERT", cert.display().to_string()));
    vars.push(("ZKGUARD_ELASTICSEARCH_TLS_KEY", key.display().to_string()));
    write_and_read(&settings_from(&vars)).await;
    let auth = authorization_headers(&sent);
    assert!(auth.len() >= 2, "{auth:?}");
    // base64("elastic:pw-s3cret")
    assert!(
        auth.iter().all(|h| h == "Basic ZWxhc3RpYzpwdy1zM2NyZXQ="),
        "{auth:?}"
    );
}

fn zkguard_es(url: &str) -> std::process::Command {
    let mut c = crate::cli::zkguard();
    c.env_remove("ZKGUARD_CONFIG")
        .env_remove("RUST_LOG")
        .env("ZKGUARD_LOCK_BACKEND", "elasticsearch")
        .env("ZKGUARD_ELASTICSEARCH_URL", url)
        .env("ZKGUARD_ELASTICSEARCH_API_KEY", "a2V5LWlkOmtleS1zM2NyZXQ=")
        .env("ZKGUARD_ELASTICSEARCH_REQUEST_TIMEOUT", "10000")
        .args(["exec", "--monitor", "m1", "--", "true"])
        .stdin(std::process::Stdio::null());
    c
}

fn output_of(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `zkguard exec` on the Elasticsearch lock over TLS: works with the right CA; another CA fails
/// with exit 69 naming the certificate problem; a malformed client key stops it at start with
/// exit 78; `elasticsearch.tls.verify=false` works without a CA and is warned about.
#[tokio::test(flavor = "multi_thread")]
async fn the_cli_over_tls_checks_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let ca = certs::Ca::new(dir.path(), "es");
    let other = certs::Ca::new(dir.path(), "other");
    let osmem = OsmemServer::start().expect("start osmem-server (run scripts/install-deps.sh)");
    let (url, _) = tls_front(&upstream_of(&osmem), &ca, false).await;
    let url2 = url.clone();
    let (ca_pem, other_pem) = (ca.cert(), other.cert());
    let (cert, _) = ca.issue("zkguard-client");
    let bad_key = dir.path().join("bad.key");
    std::fs::write(
        &bad_key,
        "-----BEGIN PRIVATE KEY-----\nnot base64 at all\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let outputs = tokio::task::spawn_blocking(move || {
        let ok = zkguard_es(&url2)
            .env("ZKGUARD_ELASTICSEARCH_TLS_CA", &ca_pem)
            .output()
            .unwrap();
        let wrong_ca = zkguard_es(&url2)
            .env("ZKGUARD_ELASTICSEARCH_TLS_CA", &other_pem)
            .arg("-vvv")
            .output()
            .unwrap();
        let bad = zkguard_es(&url2)
            .env("ZKGUARD_ELASTICSEARCH_TLS_CA", &ca_pem)
            .env("ZKGUARD_ELASTICSEARCH_TLS_CERT", &cert)
            .env("ZKGUARD_ELASTICSEARCH_TLS_KEY", &bad_key)
            .output()
            .unwrap();
        let unverified = zkguard_es(&url2)
            .env("ZKGUARD_ELASTICSEARCH_TLS_VERIFY", "false")
            .output()
            .unwrap();
        (ok, wrong_ca, bad, unverified)
    })
    .await
    .unwrap();
    let (ok, wrong_ca, bad, unverified) = outputs;
    assert_eq!(ok.status.code(), Some(0), "{}", output_of(&ok));
    let all = output_of(&wrong_ca);
    assert_eq!(wrong_ca.status.code(), Some(69), "{all}");
    assert!(
        all.contains("UnknownIssuer") && all.contains("check elasticsearch.tls.ca"),
        "{all}"
    );
    assert!(!all.contains("a2V5LWlkOmtleS1zM2NyZXQ="), "{all}");
    let all = output_of(&bad);
    assert_eq!(bad.status.code(), Some(78), "{all}");
    assert!(all.contains("elasticsearch.tls.key"), "{all}");
    let all = output_of(&unverified);
    assert_eq!(unverified.status.code(), Some(0), "{all}");
    assert!(all.contains("elasticsearch.tls.verify=false"), "{all}");
    drop(url);
}
