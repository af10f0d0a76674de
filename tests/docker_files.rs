//! Keeps `docker/` consistent with the code: the demo's properties file is a valid, complete
//! zkguard configuration that names the compose services, and the compose file runs the demo with
//! it.

use std::path::{Path, PathBuf};

use zkguard::config::{Settings, KEYS};

fn docker_file(name: &str) -> (PathBuf, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docker")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (path, text)
}

/// The top-level service names of a compose file (two-space-indented keys under `services:`).
fn compose_services(compose: &str) -> Vec<String> {
    let mut in_services = false;
    let mut names = Vec::new();
    for line in compose.lines() {
        if !line.starts_with(' ') && !line.trim().is_empty() && !line.starts_with('#') {
            in_services = line.trim_end() == "services:";
            continue;
        }
        if in_services {
            if let Some(name) = line.strip_prefix("  ").and_then(|l| l.strip_suffix(':')) {
                if !name.starts_with(' ') && !name.starts_with('#') {
                    names.push(name.to_string());
                }
            }
        }
    }
    names
}

#[test]
fn demo_properties_are_complete_and_valid() {
    let (path, text) = docker_file("zkguard.properties");
    let settings =
        Settings::load_with_env(Some(&path), |_| None).expect("docker/zkguard.properties loads");
    let mut found = std::collections::HashSet::new();
    java_properties::PropertiesIter::new_with_encoding(text.as_bytes(), encoding_rs::UTF_8)
        .read_into(|k, _| {
            found.insert(k);
        })
        .unwrap();
    for (key, _, _) in KEYS {
        assert!(
            found.contains(*key),
            "docker/zkguard.properties lacks `{key}`"
        );
    }
    // The same keys as the shipped conf/zkguard.properties.
    let conf = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/zkguard.properties"),
    )
    .unwrap();
    let mut conf_keys = std::collections::HashSet::new();
    java_properties::PropertiesIter::new_with_encoding(conf.as_bytes(), encoding_rs::UTF_8)
        .read_into(|k, _| {
            conf_keys.insert(k);
        })
        .unwrap();
    assert_eq!(
        found, conf_keys,
        "docker/zkguard.properties and conf/zkguard.properties list different keys"
    );
    assert_eq!(settings.zookeeper.servers, "zk1:2181,zk2:2181,zk3:2181");
    assert_eq!(settings.elasticsearch.urls.len(), 1);
    assert_eq!(
        settings.elasticsearch.urls[0].as_str(),
        "http://elasticsearch:9200/"
    );
}

#[test]
fn compose_runs_the_demo_against_the_configured_services() {
    let (path, _) = docker_file("zkguard.properties");
    let settings = Settings::load_with_env(Some(&path), |_| None).unwrap();
    let (_, compose) = docker_file("compose.yaml");
    let services = compose_services(&compose);
    for service in ["zk1", "zk2", "zk3", "elasticsearch", "demo", "serve"] {
        assert!(
            services.iter().any(|s| s == service),
            "compose.yaml lacks service {service}: {services:?}"
        );
    }
    // Every ZooKeeper address of the properties file is a compose service on the client port, and
    // every ensemble member is listed.
    for server in settings.zookeeper.servers.split(',') {
        let (host, port) = server.split_once(':').expect("host:port");
        assert!(
            services.iter().any(|s| s == host),
            "zookeeper.servers names {host}, not a compose service"
        );
        assert_eq!(port, "2181");
        assert!(
            compose.contains(&format!("{host}:2888:3888;2181")),
            "ZOO_SERVERS lacks {host}"
        );
    }
    let es_host = settings.elasticsearch.urls[0]
        .host_str()
        .unwrap()
        .to_string();
    assert!(
        services.contains(&es_host),
        "elasticsearch.url names {es_host}, not a compose service"
    );
    assert!(
        compose.contains("elasticsearch/elasticsearch:8."),
        "Elasticsearch 8 image"
    );
    assert!(compose.contains("xpack.security.enabled: \"false\""));
    assert!(compose.contains("discovery.type: single-node"));
    assert!(compose.contains("image: zookeeper:3.9"));
    assert!(compose.contains(r#"command: ["--config", "/etc/zkguard/zkguard.properties", "demo"]"#));
    assert!(compose.contains("./zkguard.properties:/etc/zkguard/zkguard.properties:ro"));
    assert!(compose.contains("dockerfile: docker/Dockerfile"));
    // The dead-letter file lives in the mounted volume.
    assert!(settings.retry.file_path.starts_with("/var/lib/zkguard"));
    assert!(compose.contains("zkguard-data:/var/lib/zkguard"));
}

#[test]
fn compose_runs_the_service_with_its_journal_in_a_volume() {
    let (path, _) = docker_file("zkguard.properties");
    let settings = Settings::load_with_env(Some(&path), |_| None).unwrap();
    let (_, compose) = docker_file("compose.yaml");
    let serve = compose
        .split("\n  serve:\n")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .expect("a serve service in compose.yaml");
    assert!(
        serve.contains(r#"command: ["--config", "/etc/zkguard/zkguard.properties", "serve", "--log-format", "json"]"#),
        "{serve}"
    );
    assert!(serve.contains("./zkguard.properties:/etc/zkguard/zkguard.properties:ro"));
    assert!(serve.contains("dockerfile: docker/Dockerfile"));
    // The service listens on every interface inside the container, on the port compose
    // publishes (on the host's loopback only, since no bearer tokens are set).
    assert!(settings.server.listen.ip().is_unspecified());
    let port = settings.server.listen.port();
    assert!(
        serve.contains(&format!("\"127.0.0.1:{port}:{port}\"")),
        "{serve}"
    );
    assert!(settings.server.auth_tokens_file.is_none());
    // The journal survives the container: it lives in a named volume.
    assert!(settings.server.journal_path.starts_with("/var/lib/zkguard"));
    assert!(serve.contains("zkguard-serve-data:/var/lib/zkguard"));
    assert!(compose.contains("\n  zkguard-serve-data:"));
    // Readiness is checked on /readyz, and SIGTERM gets more than the drain timeout.
    assert!(serve.contains(&format!("/dev/tcp/127.0.0.1/{port}")) && serve.contains("/readyz"));
    let grace: u64 = serve
        .split("stop_grace_period: ")
        .nth(1)
        .and_then(|r| r.split('s').next())
        .and_then(|n| n.parse().ok())
        .expect("stop_grace_period in seconds");
    assert!(grace > settings.server.drain_timeout.as_secs(), "{grace}");
    for dep in ["zk1", "zk2", "zk3", "elasticsearch"] {
        assert!(
            serve.contains(&format!("      {dep}:\n        condition: service_healthy")),
            "{dep}"
        );
    }
}

#[test]
fn dockerfile_ships_the_binary_and_the_configuration() {
    let (_, dockerfile) = docker_file("Dockerfile");
    assert!(dockerfile.contains("cargo build --release --locked --bin zkguard"));
    assert!(dockerfile.contains("FROM debian:${DEBIAN_RELEASE}-slim"));
    assert!(dockerfile.contains("COPY conf/ /etc/zkguard/"));
    assert!(dockerfile.contains(r#"ENTRYPOINT ["/usr/local/bin/zkguard"]"#));
    // The man page and the completions come from the installed binary.
    assert!(dockerfile.contains("zkguard man > /usr/local/share/man/man1/zkguard.1"));
    for shell in ["bash", "zsh", "fish"] {
        assert!(
            dockerfile.contains(&format!("zkguard completions {shell} > ")),
            "completions for {shell} not installed"
        );
    }
    // The binary is declared under that name.
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    assert!(manifest.contains("name = \"zkguard\""));
}
