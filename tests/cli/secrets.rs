//! No secret reaches the output: `zkguard demo` and `zkguard exec`, successful or failing, at
//! `-vvv`, with every secret set.

use std::process::{Command, Output, Stdio};

use zkguard::testkit::OsmemServer;

const ZK_PASSWORD: &str = "zk-s3cret-pw";
const SASL_PASSWORD: &str = "sasl-s3cret-pw";
const ES_PASSWORD: &str = "es-s3cret-pw";
/// base64("key-id:api-s3cret-key"), and the secret inside it.
const API_KEY: &str = "a2V5LWlkOmFwaS1zM2NyZXQta2V5";
const API_SECRET: &str = "api-s3cret-key";

fn all_output(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn assert_no_secret(o: &Output) {
    let all = all_output(o);
    for secret in [ZK_PASSWORD, SASL_PASSWORD, ES_PASSWORD, API_KEY, API_SECRET] {
        assert!(!all.contains(secret), "`{secret}` printed:\n{all}");
    }
}

fn zkguard(dir: &std::path::Path) -> Command {
    let mut c = crate::cli::zkguard();
    c.env_remove("ZKGUARD_CONFIG")
        .env_remove("RUST_LOG")
        .current_dir(dir)
        .stdin(Stdio::null())
        .arg("-vvv");
    c
}

/// A small local demo with ZooKeeper digest credentials (and so creator ACLs) and an
/// Elasticsearch API key: it runs, and prints neither.
#[test]
fn the_demo_prints_no_secret_at_any_verbosity() {
    let dir = tempfile::tempdir().unwrap();
    let out = zkguard(dir.path())
        .env("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "digest")
        .env(
            "ZKGUARD_ZOOKEEPER_AUTH_CREDENTIALS",
            format!("alice:{ZK_PASSWORD}"),
        )
        .env("ZKGUARD_ELASTICSEARCH_API_KEY", API_KEY)
        .env("ZKGUARD_ELASTIC_RETRY_BACKOFF_INITIAL", "20")
        .env("ZKGUARD_ELASTIC_RETRY_BACKOFF_MAX", "100")
        .env_remove("ZKGUARD_ZOOKEEPER_SERVERS")
        .env_remove("ZKGUARD_ELASTICSEARCH_URL")
        .args([
            "demo",
            "--servers",
            "local",
            "--json",
            "--articles",
            "5",
            "--writers",
            "2",
            "--saves",
            "4",
            "--jobs",
            "2",
            "--job-size",
            "3",
            "--background-timeout",
            "100ms",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert_no_secret(&out);
}

/// `exec` on a SASL ZooKeeper and on the Elasticsearch lock with basic authentication, then the
/// same with a wrong SASL password and with an unreachable Elasticsearch: no secret printed.
#[test]
fn exec_and_failing_connections_print_no_secret_at_any_verbosity() {
    let dir = tempfile::tempdir().unwrap();
    let jaas = dir.path().join("jaas.conf");
    std::fs::write(
        &jaas,
        format!("Server {{\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n  user_alice=\"{SASL_PASSWORD}\";\n}};\n"),
    )
    .unwrap();
    let zk = zkguard::testkit::ZkServer::builder()
        .config_line("authProvider.1=org.apache.zookeeper.server.auth.SASLAuthenticationProvider")
        .jvm_arg(format!(
            "-Djava.security.auth.login.config={}",
            jaas.display()
        ))
        .start()
        .expect("start ZooKeeper (run scripts/install-deps.sh)");
    let osmem = OsmemServer::start().expect("start osmem-server (run scripts/install-deps.sh)");
    let sasl = |password: &str| {
        let mut c = zkguard(dir.path());
        c.env("ZKGUARD_ZOOKEEPER_SERVERS", zk.connect_string())
            .env("ZKGUARD_ZOOKEEPER_CONNECTION_RETRY", "1")
            .env("ZKGUARD_ZOOKEEPER_AUTH_SCHEME", "sasl")
            .env("ZKGUARD_ZOOKEEPER_SASL_USERNAME", "alice")
            .env("ZKGUARD_ZOOKEEPER_SASL_PASSWORD", password)
            .env("ZKGUARD_ELASTICSEARCH_URL", osmem.url())
            .env("ZKGUARD_ELASTICSEARCH_USERNAME", "elastic")
            .env("ZKGUARD_ELASTICSEARCH_PASSWORD", ES_PASSWORD)
            .args(["exec", "--monitor", "m1", "--", "true"]);
        c.output().unwrap()
    };
    let out = sasl(SASL_PASSWORD);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert_no_secret(&out);
    let out = sasl("wrong-pw");
    assert_eq!(out.status.code(), Some(69), "{}", all_output(&out));
    assert_no_secret(&out);

    let es = |url: &str, auth: (&str, &str)| {
        let out = zkguard(dir.path())
            .env("ZKGUARD_LOCK_BACKEND", "elasticsearch")
            .env("ZKGUARD_ELASTICSEARCH_URL", url)
            .env("ZKGUARD_ELASTICSEARCH_REQUEST_TIMEOUT", "10000")
            .env(auth.0, auth.1)
            .env(
                "ZKGUARD_ELASTICSEARCH_USERNAME",
                if auth.0.ends_with("PASSWORD") {
                    "elastic"
                } else {
                    ""
                },
            )
            .args(["exec", "--monitor", "m2", "--", "true"])
            .output()
            .unwrap();
        assert_no_secret(&out);
        out
    };
    for auth in [
        ("ZKGUARD_ELASTICSEARCH_PASSWORD", ES_PASSWORD),
        ("ZKGUARD_ELASTICSEARCH_API_KEY", API_KEY),
    ] {
        assert_eq!(es(osmem.url(), auth).status.code(), Some(0));
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        assert_eq!(es(&closed, auth).status.code(), Some(69));
    }
}
