//! ZooKeeper authentication and ACLs: credentials reach the server, are never printed, and lock
//! nodes are protected from other identities.

use crate::common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;
use zkguard::config::{ZkAcl, ZkAclEntry, ZkAuth, ZkSettings};
use zkguard::{LockType, ZkBlockingWriteLock};
use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError};

fn zkguard(servers: &str, root: &str) -> Command {
    let mut c = crate::cli::zkguard();
    c.env("ZKGUARD_ZOOKEEPER_SERVERS", servers)
        .env("ZKGUARD_ZOOKEEPER_LOCK_ROOT", root)
        .env("ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT", "2000")
        .env("ZKGUARD_ZOOKEEPER_CONNECTION_RETRY", "1")
        .env("ZKGUARD_ZOOKEEPER_FOREGROUND_TASK_TIMEOUT", "10000")
        .env_remove("ZKGUARD_CONFIG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    c
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn all_output(o: &Output) -> String {
    format!("{}{}", text(&o.stdout), text(&o.stderr))
}

async fn client_as(servers: &str, credentials: Option<&str>) -> Client {
    let mut connector = Client::connector();
    if let Some(c) = credentials {
        connector = connector.with_auth("digest", c.as_bytes());
    }
    connector.connect(servers).await.expect("connect")
}

#[test]
fn config_show_masks_zookeeper_credentials() {
    let out = crate::cli::zkguard()
        .env_remove("ZKGUARD_CONFIG")
        .env("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "digest")
        .env("ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS", "alice:s3cret-zk")
        .args(["config", "show"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown = all_output(&out);
    assert!(!shown.contains("s3cret-zk"), "{shown}");
    let line = shown
        .lines()
        .find(|l| l.starts_with("zookeeper.auth.credentials "))
        .unwrap_or_else(|| panic!("no credentials line in {shown}"));
    assert!(line.contains("***"), "{line}");
}

/// A lock root that only `alice` may use: zkguard reaches it with alice's digest credentials
/// (from the environment or a file), and is refused without them, with no secret printed.
#[tokio::test(flavor = "multi_thread")]
async fn digest_credentials_are_sent_and_never_printed() {
    let zk = zk_server();
    let servers = zk.connect_string();
    let root = format!("/zkguard-auth-{}", uuid_tag());
    let alice = client_as(&servers, Some("alice:s3cret-zk")).await;
    alice
        .create(
            &root,
            &[],
            &CreateMode::Persistent.with_acls(Acls::creator_all()),
        )
        .await
        .unwrap();

    // Each run locks a monitor of its own: the monitor nodes created by the first runs outlive
    // them (containers are reaped later), and a new one must be created under the root.
    let runs = std::cell::Cell::new(0);
    let run = |auth: &[(&str, &str)]| {
        runs.set(runs.get() + 1);
        let monitor = format!("m{}", runs.get());
        let mut c = zkguard(&servers, &root);
        for (k, v) in auth {
            c.env(k, v);
        }
        c.args(["-vvv", "exec", "--monitor", &monitor, "--", "true"]);
        c.output().unwrap()
    };

    let out = run(&[
        ("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "digest"),
        ("ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS", "alice:s3cret-zk"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert!(!all_output(&out).contains("s3cret-zk"));

    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "alice:s3cret-zk\n").unwrap();
    let out = run(&[
        ("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "digest"),
        (
            "ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS_FILE",
            file.path().to_str().unwrap(),
        ),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert!(!all_output(&out).contains("s3cret-zk"));

    for auth in [
        vec![],
        vec![
            ("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "digest"),
            ("ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS", "mallory:other-s3cret"),
        ],
    ] {
        let out = run(&auth);
        let all = all_output(&out);
        assert_eq!(out.status.code(), Some(69), "{all}");
        assert!(all.contains("not authorized"), "{all}");
        assert!(!all.contains("other-s3cret"), "{all}");
    }
}

fn authed_settings(servers: &str, tag: &str, credentials: &str, acl: ZkAcl) -> ZkSettings {
    let mut s = zk_settings(servers, tag);
    s.auth = Some(ZkAuth::digest(credentials));
    s.acl = acl;
    s
}

/// With digest authentication and `zookeeper.acl=creator`, a client without credentials or with
/// other credentials can neither delete nor overwrite the holder's `privateLock` or the queue
/// nodes, nor delete the monitor node: ZooKeeper answers NoAuth and the holder keeps its lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creator_acl_protects_lock_nodes_from_other_identities() {
    let zk = zk_server();
    let servers = zk.connect_string();
    let settings = authed_settings(&servers, "creator", "alice:s3cret-zk", ZkAcl::Creator);
    let (holder, waiter) = (session(&settings).await, session(&settings).await);
    let guard = ZkBlockingWriteLock::new("holder", &holder, "doc-1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    let token = guard.fencing_token();
    let waiting = tokio::spawn(async move {
        let g = ZkBlockingWriteLock::new("waiter", &waiter, "doc-1")
            .unwrap()
            .with_type(LockType::Background)
            .lock_with_timeout()
            .await
            .unwrap();
        g.unlock().await.unwrap();
    });

    let monitor = format!("{}/doc-1", settings.lock_root);
    let alice = client_as(&servers, Some("alice:s3cret-zk")).await;
    let queue = || async {
        let mut c = alice.list_children(&monitor).await.unwrap();
        c.retain(|n| n != "privateLock");
        c
    };
    eventually(Duration::from_secs(10), "the waiter queued", || async {
        queue().await.len() == 2
    })
    .await;
    let mut targets = vec![format!("{monitor}/privateLock")];
    targets.extend(queue().await.into_iter().map(|n| format!("{monitor}/{n}")));
    let (acl, _) = alice.get_acl(&targets[0]).await.unwrap();
    assert!(
        acl.iter()
            .all(|a| a.scheme() == "digest" && a.id().starts_with("alice:")),
        "{acl:?}"
    );

    for intruder in [None, Some("mallory:other")] {
        let other = client_as(&servers, intruder).await;
        for path in &targets {
            assert_eq!(
                other.delete(path, None).await,
                Err(ZkError::NoAuth),
                "delete {path} as {intruder:?}"
            );
            assert!(
                matches!(
                    other.set_data(path, b"{}", None).await,
                    Err(ZkError::NoAuth)
                ),
                "overwrite {path} as {intruder:?}"
            );
        }
        assert_eq!(
            other.delete(&monitor, None).await,
            Err(ZkError::NoAuth),
            "delete the monitor as {intruder:?}"
        );
        assert!(matches!(
            other
                .create(
                    &format!("{monitor}/A-"),
                    b"{}",
                    &CreateMode::EphemeralSequential.with_acls(Acls::anyone_all())
                )
                .await,
            Err(ZkError::NoAuth)
        ));
    }
    for path in &targets {
        assert!(alice.check_stat(path).await.unwrap().is_some(), "{path}");
    }
    assert!(guard.is_held());
    assert_eq!(guard.loss(), None);
    assert_eq!(guard.fencing_token(), token);
    guard.unlock().await.unwrap();
    waiting.await.unwrap();
}

/// A lock root created earlier with another ACL is reported, not silently reused.
#[tokio::test(flavor = "multi_thread")]
async fn a_lock_root_with_another_acl_is_reported() {
    let zk = zk_server();
    let servers = zk.connect_string();
    let root = format!("/zkguard-open-{}", uuid_tag());
    let anyone = client_as(&servers, None).await;
    anyone
        .create(
            &root,
            &[],
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    let out = zkguard(&servers, &root)
        .env("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "digest")
        .env("ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS", "alice:s3cret-zk")
        .args(["exec", "--monitor", "m1", "--", "true"])
        .output()
        .unwrap();
    let all = all_output(&out);
    assert_eq!(out.status.code(), Some(78), "{all}");
    assert!(
        all.contains(&format!(
            "the lock root `{root}` exists with ACL world:anyone:cdrwa"
        )),
        "{all}"
    );
    assert!(all.contains("creator: digest:alice:<hash>:cdrwa"), "{all}");
    assert!(!all.contains("s3cret-zk"), "{all}");
    // Without authentication the default ACL is open, which this root has.
    let out = zkguard(&servers, &root)
        .args(["exec", "--monitor", "m1", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
}

/// With an explicit ACL that lets anyone read, `zkguard locks` shows the holder to a client
/// without credentials, which still cannot touch the nodes.
#[tokio::test(flavor = "multi_thread")]
async fn locks_works_for_a_read_only_identity() {
    let zk = zk_server();
    let servers = zk.connect_string();
    // The digest id of alice, as ZooKeeper computes it.
    let alice = client_as(&servers, Some("alice:s3cret-zk")).await;
    let probe = format!("/probe-{}", uuid_tag());
    alice
        .create(
            &probe,
            &[],
            &CreateMode::Persistent.with_acls(Acls::creator_all()),
        )
        .await
        .unwrap();
    let (acl, _) = alice.get_acl(&probe).await.unwrap();
    let alice_id = acl[0].id().to_string();
    let list = format!("digest:{alice_id}:cdrwa,world:anyone:r");
    let entries = list
        .split(',')
        .map(|e| ZkAclEntry::parse(e).unwrap())
        .collect();
    let settings = authed_settings(
        &servers,
        "readonly",
        "alice:s3cret-zk",
        ZkAcl::Explicit(entries),
    );
    let holder = session(&settings).await;
    let guard = ZkBlockingWriteLock::new("held-by-alice", &holder, "doc-7")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();

    let out = zkguard(&servers, &settings.lock_root)
        .args(["locks", "--json"])
        .output()
        .unwrap();
    let all = all_output(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(
        all.contains("doc-7") && all.contains("held-by-alice"),
        "{all}"
    );

    let anyone = client_as(&servers, None).await;
    let mutex = format!("{}/doc-7/privateLock", settings.lock_root);
    assert_eq!(anyone.delete(&mutex, None).await, Err(ZkError::NoAuth));
    assert!(guard.is_held());
    guard.unlock().await.unwrap();
}

/// A failing connection at `-vvv`, with every secret set, prints none of them.
#[test]
fn a_failing_connection_prints_no_secret_at_any_verbosity() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let servers = format!("127.0.0.1:{port}");
    for es_auth in [
        [
            ("ZKGUARD_ELASTICSEARCH_USERNAME", "elastic"),
            ("ZKGUARD_ELASTICSEARCH_PASSWORD", "es-s3cret-pw"),
        ],
        [
            ("ZKGUARD_ELASTICSEARCH_API_KEY", "ZXMtczNjcmV0LWtleQ=="),
            ("ZKGUARD_ELASTICSEARCH_URL", "http://127.0.0.1:9"),
        ],
    ] {
        let out = zkguard(&servers, "/zkguard-secrets")
            .env("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "digest")
            .env("ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS", "alice:zk-s3cret-pw")
            .envs(es_auth)
            .args(["-vvv", "exec", "--monitor", "m1", "--", "true"])
            .output()
            .unwrap();
        let all = all_output(&out);
        assert_eq!(out.status.code(), Some(69), "{all}");
        for secret in ["zk-s3cret-pw", "es-s3cret-pw", "ZXMtczNjcmV0LWtleQ=="] {
            assert!(!all.contains(secret), "{secret} in {all}");
        }
    }
}

/// A properties file holding a secret that every user may read draws a warning naming the key,
/// never the secret.
#[test]
fn a_world_readable_properties_file_with_a_secret_is_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let file = tempfile::Builder::new()
        .suffix(".properties")
        .tempfile()
        .unwrap();
    std::fs::write(
        file.path(),
        "zookeeper.auth.scheme=digest\nzookeeper.auth.credentials=alice:s3cret-zk\n",
    )
    .unwrap();
    let check = |mode: u32| {
        std::fs::set_permissions(file.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        let out = crate::cli::zkguard()
            .env_remove("ZKGUARD_CONFIG")
            .arg("--config")
            .arg(file.path())
            .args(["config", "check"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
        assert!(!all_output(&out).contains("s3cret-zk"));
        text(&out.stderr)
    };
    let warned = check(0o644);
    assert!(
        warned.contains("holds secrets (zookeeper.auth.credentials) and every user may read it"),
        "{warned}"
    );
    assert!(!check(0o600).contains("holds secrets"));
}

/// A ZooKeeper that authenticates with SASL DIGEST-MD5 (`SASLAuthenticationProvider` and a JAAS
/// `Server` section listing `alice` and `bob`).
fn sasl_zk_server(dir: &std::path::Path) -> zkguard::testkit::ZkServer {
    let jaas = dir.join("jaas.conf");
    std::fs::write(
        &jaas,
        "Server {\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n  user_alice=\"s3cret-sasl\"\n  user_bob=\"bob-s3cret\";\n};\n",
    )
    .unwrap();
    zkguard::testkit::ZkServer::builder()
        .tick_time(500)
        .config_line("authProvider.1=org.apache.zookeeper.server.auth.SASLAuthenticationProvider")
        .jvm_arg(format!(
            "-Djava.security.auth.login.config={}",
            jaas.display()
        ))
        .start()
        .expect("start ZooKeeper with SASL (run scripts/install-deps.sh)")
}

async fn sasl_client(servers: &str, user: &str, password: &str) -> Client {
    Client::connector()
        .with_sasl(zookeeper_client::SaslOptions::digest_md5(
            user.to_string(),
            password.to_string(),
        ))
        .connect(servers)
        .await
        .expect("connect with SASL")
}

/// SASL DIGEST-MD5 with `zookeeper.acl=creator` (the default when authenticated): `zkguard exec`
/// locks and unlocks as alice without printing her password; the nodes carry `sasl:alice`, and
/// neither an anonymous client nor bob may delete or overwrite them; a wrong password fails
/// with exit 69 and a message naming the SASL keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_digest_md5_locks_and_protects_the_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let zk = sasl_zk_server(dir.path());
    let servers = zk.connect_string();
    let root = format!("/zkguard-sasl-{}", uuid_tag());
    let password_file = dir.path().join("sasl-password");
    std::fs::write(&password_file, "s3cret-sasl\n").unwrap();
    let run = |password: (&str, &str), args: &[&str]| {
        zkguard(&servers, &root)
            .env("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "sasl")
            .env("ZKGUARD_ZOOKEEPER_SASL_USERNAME", "alice")
            .env(password.0, password.1)
            .arg("-vvv")
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(
        ("ZKGUARD_ZOOKEEPER_SASL_PASSWORD", "s3cret-sasl"),
        &["exec", "--monitor", "m1", "--", "true"],
    );
    let all = all_output(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(!all.contains("s3cret-sasl"), "{all}");
    let out = run(
        (
            "ZKGUARD_ZOOKEEPER_SASL_PASSWORD_FILE",
            password_file.to_str().unwrap(),
        ),
        &["exec", "--monitor", "m2", "--", "true"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    let alice = sasl_client(&servers, "alice", "s3cret-sasl").await;
    let (acl, _) = alice.get_acl(&root).await.unwrap();
    assert_eq!(acl.len(), 1, "{acl:?}");
    assert_eq!((acl[0].scheme(), acl[0].id()), ("sasl", "alice"), "{acl:?}");

    // A held lock: bob and an anonymous client cannot touch its nodes.
    let mut settings = zk_settings(&servers, "sasl");
    settings.lock_root = root.clone();
    settings.auth = Some(ZkAuth::sasl_digest_md5("alice", "s3cret-sasl"));
    settings.acl = ZkAcl::Creator;
    let holder = session(&settings).await;
    let guard = ZkBlockingWriteLock::new("holder", &holder, "doc-1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    let monitor = format!("{root}/doc-1");
    let mut targets: Vec<String> = alice
        .list_children(&monitor)
        .await
        .unwrap()
        .into_iter()
        .map(|n| format!("{monitor}/{n}"))
        .collect();
    targets.push(monitor.clone());
    let bob = sasl_client(&servers, "bob", "bob-s3cret").await;
    let anyone = client_as(&servers, None).await;
    for other in [&bob, &anyone] {
        for path in &targets {
            assert_eq!(
                other.delete(path, None).await,
                Err(ZkError::NoAuth),
                "{path}"
            );
            assert!(
                matches!(
                    other.set_data(path, b"{}", None).await,
                    Err(ZkError::NoAuth)
                ),
                "{path}"
            );
        }
    }
    assert!(guard.is_held());
    assert_eq!(guard.loss(), None);
    guard.unlock().await.unwrap();

    let out = run(
        ("ZKGUARD_ZOOKEEPER_SASL_PASSWORD", "wr0ng-pw"),
        &["exec", "--monitor", "m3", "--", "true"],
    );
    let all = all_output(&out);
    assert_eq!(out.status.code(), Some(69), "{all}");
    assert!(
        all.contains("refused the authentication")
            && all.contains("zookeeper.sasl.username and zookeeper.sasl.password"),
        "{all}"
    );
    assert!(!all.contains("wr0ng-pw"), "{all}");
}

/// GSSAPI is not built in: asking for it stops zkguard at start with exit 78.
#[test]
fn sasl_gssapi_is_refused_as_not_built_in() {
    let out = zkguard("127.0.0.1:1", "/zkguard")
        .env("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "sasl")
        .env("ZKGUARD_ZOOKEEPER_SASL_MECHANISM", "GSSAPI")
        .env("ZKGUARD_ZOOKEEPER_SASL_USERNAME", "zkguard")
        .env("ZKGUARD_ZOOKEEPER_SASL_PASSWORD", "unused-pw")
        .args(["exec", "--monitor", "m1", "--", "true"])
        .output()
        .unwrap();
    let all = all_output(&out);
    assert_eq!(out.status.code(), Some(78), "{all}");
    assert!(all.contains("without GSSAPI"), "{all}");
}

/// A certificate of `ca` for `leaf` and its private key in one file (a PEM key store, as
/// ZooKeeper's `ssl.keyStore.type=PEM` reads it).
fn issue_key_store(ca: &crate::certs::Ca, leaf: &str) -> std::path::PathBuf {
    let (cert, key) = ca.issue(leaf);
    let store = cert.with_file_name(format!("{leaf}-store.pem"));
    let text = format!(
        "{}{}",
        std::fs::read_to_string(&key).unwrap(),
        std::fs::read_to_string(&cert).unwrap()
    );
    std::fs::write(&store, text).unwrap();
    store
}

/// A ZooKeeper serving TLS on its secure client port, with a certificate of `ca`; `client_auth`
/// is its `ssl.clientAuth` (`none` or `need`).
fn tls_zk_server(ca: &crate::certs::Ca, client_auth: &str) -> zkguard::testkit::ZkServer {
    let store = issue_key_store(ca, "zookeeper");
    zkguard::testkit::ZkServer::builder()
        .tick_time(500)
        .secure_client_port()
        .config_line(format!("ssl.keyStore.location={}", store.display()))
        .config_line("ssl.keyStore.type=PEM")
        .config_line(format!("ssl.trustStore.location={}", ca.cert().display()))
        .config_line("ssl.trustStore.type=PEM")
        .config_line(format!("ssl.clientAuth={client_auth}"))
        .start()
        .expect("start ZooKeeper with TLS (run scripts/install-deps.sh)")
}

fn zkguard_tls(servers: &str, ca: &std::path::Path) -> Command {
    let mut c = zkguard(servers, "/zkguard-tls");
    // A server's first TLS handshakes are slow while its JVM warms up (more so on a busy
    // machine): give the connection a few attempts.
    c.env("ZKGUARD_ZOOKEEPER_TLS_ENABLED", "true")
        .env("ZKGUARD_ZOOKEEPER_TLS_CA", ca)
        .env("ZKGUARD_ZOOKEEPER_CONNECTION_RETRY", "4")
        .env("ZKGUARD_ZOOKEEPER_CONNECTION_DELAY", "200");
    c
}

/// zkguard locks over TLS when it trusts the server's CA, and refuses a server whose certificate
/// another CA signed, with exit 69 and a message that names the TLS problem.
#[test]
fn tls_to_zookeeper_verifies_the_server_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = crate::certs::Ca::new(dir.path(), "zk");
    let zk = tls_zk_server(&ca, "none");
    let servers = zk.secure_connect_string().unwrap();
    let out = zkguard_tls(&servers, &ca.cert())
        .args(["exec", "--monitor", "m1", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        all_output(&out),
        std::fs::read_to_string(zk.log_path()).unwrap_or_default()
    );
    let out = zkguard_tls(&servers, &ca.cert())
        .args(["locks", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));

    let other = crate::certs::Ca::new(dir.path(), "other");
    let out = zkguard_tls(&servers, &other.cert())
        .env("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "digest")
        .env("ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS", "alice:tls-s3cret-pw")
        .env("ZKGUARD_ELASTICSEARCH_API_KEY", "dGxzLWtleTp0bHMtczNjcmV0")
        .args(["-vvv", "exec", "--monitor", "m1", "--", "true"])
        .output()
        .unwrap();
    let all = all_output(&out);
    assert_eq!(out.status.code(), Some(69), "{all}");
    for secret in ["tls-s3cret-pw", "dGxzLWtleTp0bHMtczNjcmV0"] {
        assert!(!all.contains(secret), "{secret} in {all}");
    }
    assert!(all.contains("the TLS handshake with 127.0.0.1"), "{all}");
    assert!(all.contains("UnknownIssuer"), "{all}");
    assert!(all.contains("check zookeeper.tls.ca"), "{all}");
}

/// A server that requires client certificates (`ssl.clientAuth=need`) accepts zkguard with
/// `zookeeper.tls.cert`/`key`, and refuses it without them (exit 69, naming TLS).
#[test]
fn mutual_tls_to_zookeeper_with_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = crate::certs::Ca::new(dir.path(), "zk");
    let zk = tls_zk_server(&ca, "need");
    let servers = zk.secure_connect_string().unwrap();
    let (cert, key) = ca.issue("zkguard-client");
    let out = zkguard_tls(&servers, &ca.cert())
        .env("ZKGUARD_ZOOKEEPER_TLS_CERT", &cert)
        .env("ZKGUARD_ZOOKEEPER_TLS_KEY", &key)
        .args(["exec", "--monitor", "m1", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        all_output(&out),
        std::fs::read_to_string(zk.log_path()).unwrap_or_default()
    );
    let out = zkguard_tls(&servers, &ca.cert())
        .args(["exec", "--monitor", "m1", "--", "true"])
        .output()
        .unwrap();
    let all = all_output(&out);
    assert_eq!(out.status.code(), Some(69), "{all}");
    assert!(all.contains("TLS"), "{all}");
}

/// The ACL rule of monitor nodes (issue: an operator's per-monitor ACL, and creator ACLs with
/// several identities): zkguard owns the ACL of every node under the lock root, which is
/// `zookeeper.acl`. A quiet acquisition recreates the monitor node with it, so an ACL an
/// operator set on one monitor does not last (and could not protect it: deleting and creating
/// a monitor node takes only the lock root's permissions). Several identities with creator
/// ACLs cannot share a lock root: the second is refused before any lock node is touched, with
/// the ACL it found and the one it expected, instead of meeting `NoAuth` on monitors the first
/// created.
#[tokio::test(flavor = "multi_thread")]
async fn monitor_nodes_carry_the_configured_acl_and_a_second_identity_is_refused_at_the_root() {
    let zk = zk_server();
    let servers = zk.connect_string();
    let root = format!("/zkguard-owned-{}", uuid_tag());
    let alice = zkguard(&servers, &root)
        .env("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "digest")
        .env("ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS", "alice:s3cret-zk")
        .args(["exec", "--monitor", "m1", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(alice.status.code(), Some(0), "{}", all_output(&alice));

    // An operator narrows the monitor's ACL by hand.
    let admin = client_as(&servers, Some("alice:s3cret-zk")).await;
    let monitor = format!("{root}/m1");
    let narrowed = zookeeper_client::Acl::new(
        zookeeper_client::Permission::READ | zookeeper_client::Permission::WRITE,
        zookeeper_client::AuthId::new("world", "anyone"),
    );
    admin.set_acl(&monitor, &[narrowed], None).await.unwrap();
    let again = zkguard(&servers, &root)
        .env("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "digest")
        .env("ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS", "alice:s3cret-zk")
        .args(["exec", "--monitor", "m1", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(0), "{}", all_output(&again));
    let (acl, _) = admin.get_acl(&monitor).await.unwrap();
    assert!(
        !acl.is_empty()
            && acl.iter().all(|a| a.scheme() == "digest"
                && a.id().starts_with("alice:")
                && a.permission() == zookeeper_client::Permission::ALL),
        "the quiet acquisition recreated the monitor with zookeeper.acl (creator): {acl:?}"
    );

    // Bob, with the same creator ACL setting, is refused at the lock root, whose ACL he may not
    // even read (the same refusal as for wrong credentials: exit 69, naming the ACL of
    // zookeeper.lock.root), before any lock node is touched.
    let bob = zkguard(&servers, &root)
        .env("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "digest")
        .env("ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS", "bob:0ther-secret")
        .args(["exec", "--monitor", "m1", "--", "true"])
        .output()
        .unwrap();
    let all = all_output(&bob);
    assert_eq!(bob.status.code(), Some(69), "{all}");
    assert!(
        all.contains("reading the ACL of the lock root") && all.contains("not authorized"),
        "{all}"
    );
    assert!(all.contains("the ACL of zookeeper.lock.root"), "{all}");
    assert!(!all.contains("0ther-secret"), "{all}");
    let (_, stat) = admin.get_data(&monitor).await.unwrap();
    assert_eq!(stat.num_children, 0, "bob touched no lock node");
}
