//! ZooKeeper authentication and ACLs: credentials reach the server, are never printed, and lock
//! nodes are protected from other identities.

mod common;

use std::process::{Command, Output, Stdio};

use common::*;
use zookeeper_client::{Acls, Client, CreateMode};

fn zkguard(servers: &str, root: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_zkguard"));
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
    let out = Command::new(env!("CARGO_BIN_EXE_zkguard"))
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
