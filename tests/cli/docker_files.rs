//! Keeps `docker/` consistent with the code: the demo's properties file is a valid, complete
//! zkguard configuration that names the compose services, the compose file runs the demo with
//! it, and the multi-stage Dockerfile (parsed, not built: no Docker daemon is needed) compiles
//! the `dist` profile in a builder stage from files the build context holds, and ships the
//! binary alone on a slim runtime stage.

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
    assert!(dockerfile.contains("cargo build --profile dist --locked --bin zkguard"));
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

/// One stage of a Dockerfile: its name (`AS name`), its base image and its instructions.
#[derive(Debug)]
struct Stage {
    name: Option<String>,
    from: String,
    instructions: Vec<(String, String)>,
}

impl Stage {
    /// The arguments of each `instruction` of the stage.
    fn all(&self, instruction: &str) -> Vec<&str> {
        self.instructions
            .iter()
            .filter(|(i, _)| i == instruction)
            .map(|(_, a)| a.as_str())
            .collect()
    }
}

/// The stages of a Dockerfile: continuation lines joined, comments and blank lines left out;
/// the `ARG`s before the first `FROM` are not kept.
fn dockerfile_stages(text: &str) -> Vec<Stage> {
    let mut lines: Vec<String> = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        if current.is_empty() && (line.trim().is_empty() || line.trim_start().starts_with('#')) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                lines.push(std::mem::take(&mut current));
            }
        }
    }
    let mut stages: Vec<Stage> = Vec::new();
    for line in lines {
        let (word, rest) = line.trim().split_once(' ').unwrap_or((line.trim(), ""));
        let (word, rest) = (word.to_ascii_uppercase(), rest.trim().to_string());
        if word == "FROM" {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let name = match words.as_slice() {
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some(name.to_string()),
                [_] => None,
                _ => panic!("FROM {rest}: expected `FROM image [AS name]`"),
            };
            stages.push(Stage {
                name,
                from: words[0].to_string(),
                instructions: Vec::new(),
            });
        } else if let Some(stage) = stages.last_mut() {
            stage.instructions.push((word, rest));
        }
    }
    stages
}

/// Whether a `.dockerignore` pattern (Docker's rules: relative to the context's root, `*`
/// within one path element, a directory excluding what it holds) excludes `path`.
fn ignored(pattern: &str, path: &str) -> bool {
    fn glob(p: &[u8], s: &[u8]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(b'*'), _) => {
                glob(&p[1..], s) || (s.first().is_some_and(|c| *c != b'/') && glob(p, &s[1..]))
            }
            (Some(a), Some(b)) if a == b => glob(&p[1..], &s[1..]),
            _ => false,
        }
    }
    let pattern = pattern.trim().trim_start_matches('/').trim_end_matches('/');
    let path = path.trim_start_matches("./").trim_end_matches('/');
    // The path itself or one of the directories above it.
    path.match_indices('/')
        .map(|(i, _)| &path[..i])
        .chain([path])
        .any(|prefix| glob(pattern.as_bytes(), prefix.as_bytes()))
}

/// What `cargo build` of the binary reads besides src/: the manifest, the lock file, the build
/// script, every `path = ` of the manifest, and every `include_str!`/`include_bytes!` of src/.
fn build_inputs(root: &Path) -> Vec<String> {
    let mut inputs: Vec<String> = ["Cargo.toml", "Cargo.lock", "build.rs", "src"]
        .map(String::from)
        .to_vec();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    for part in manifest.split("path = \"").skip(1) {
        let path = part.split('"').next().unwrap();
        if path != "." {
            inputs.push(path.to_string());
        }
    }
    let mut dirs = vec![root.join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for macro_ in ["include_str!(\"", "include_bytes!(\""] {
                for part in text.split(macro_).skip(1) {
                    let relative = part.split('"').next().unwrap();
                    let target = path.parent().unwrap().join(relative);
                    let target = target
                        .canonicalize()
                        .unwrap_or_else(|e| panic!("{} includes {relative}: {e}", path.display()));
                    let target = target.strip_prefix(root.canonicalize().unwrap()).unwrap();
                    inputs.push(target.to_string_lossy().into_owned());
                }
            }
        }
    }
    inputs
}

#[test]
fn the_dockerfile_builds_in_a_builder_stage_and_ships_a_slim_runtime() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (_, dockerfile) = docker_file("Dockerfile");
    let stages = dockerfile_stages(&dockerfile);
    assert_eq!(stages.len(), 2, "{stages:#?}");
    let (builder, runtime) = (&stages[0], &stages[1]);
    assert_eq!(builder.name.as_deref(), Some("builder"));
    assert!(builder.from.starts_with("rust:"), "{}", builder.from);
    assert!(runtime.from.ends_with("-slim"), "{}", runtime.from);

    // The builder compiles the dist profile into /out/zkguard, with the commit passed in.
    let build = builder.all("RUN").join("\n");
    assert!(
        build.contains("cargo build --profile dist --locked --bin zkguard --no-default-features"),
        "{build}"
    );
    assert!(
        build.contains("target/dist/zkguard /out/zkguard"),
        "{build}"
    );
    assert!(
        builder.all("ARG").contains(&"ZKGUARD_BUILD_COMMIT="),
        "{builder:?}"
    );

    // The runtime takes the binary alone from the builder; every COPY from the context names
    // paths that exist there and that the .dockerignore leaves in.
    let (_, ignore) = docker_file("Dockerfile.dockerignore");
    let patterns: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert!(patterns.iter().all(|p| !p.starts_with('!')), "{patterns:?}");
    let excluded = |path: &str| patterns.iter().find(|p| ignored(p, path)).copied();
    let mut copied_from_builder = Vec::new();
    for stage in &stages {
        for copy in stage.all("COPY") {
            let words: Vec<&str> = copy.split_whitespace().collect();
            let (flags, paths): (Vec<&str>, Vec<&str>) =
                words.iter().partition(|w| w.starts_with("--"));
            let (dest, sources) = paths.split_last().expect("COPY sources destination");
            match flags.iter().find_map(|f| f.strip_prefix("--from=")) {
                Some(from) => {
                    assert_eq!(from, "builder", "{copy}");
                    copied_from_builder.push((sources.to_vec(), *dest));
                }
                None => {
                    for source in sources {
                        assert!(root.join(source).exists(), "COPY {source}: no such path");
                        assert_eq!(excluded(source), None, "COPY {source} is ignored");
                    }
                }
            }
        }
    }
    assert_eq!(
        copied_from_builder,
        [(vec!["/out/zkguard"], "/usr/local/bin/zkguard")]
    );
    assert!(builder.all("COPY").contains(&". ."), "{builder:?}");
    for input in build_inputs(root) {
        assert!(root.join(&input).exists(), "{input}");
        assert_eq!(
            excluded(&input),
            None,
            "the build reads {input}, which the context leaves out"
        );
    }
    // What the ignore file must keep out of the context.
    for heavy in ["target/debug/zkguard", ".git/HEAD"] {
        assert!(excluded(heavy).is_some(), "{heavy} is sent to the daemon");
    }
    assert_eq!(excluded("src/main.rs"), None);

    // The runtime stage: ca-certificates only, the user, the ports.
    let setup = runtime.all("RUN").join("\n");
    assert!(
        setup.contains("--no-install-recommends ca-certificates"),
        "{setup}"
    );
    assert!(
        setup.contains("useradd --system --uid 10001 --gid 10001"),
        "{setup}"
    );
    assert_eq!(runtime.all("USER"), ["10001:10001"]);
    assert_eq!(runtime.all("EXPOSE"), ["7717 9201"]);

    // The profile it builds: a single small binary.
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let dist = manifest
        .split("\n[profile.dist]\n")
        .nth(1)
        .expect("a [profile.dist] in Cargo.toml")
        .split("\n[")
        .next()
        .unwrap();
    for line in [
        "inherits = \"release\"",
        "lto = \"fat\"",
        "codegen-units = 1",
        "strip = true",
    ] {
        assert!(
            dist.lines().any(|l| l.trim() == line),
            "[profile.dist] lacks {line}"
        );
    }
}

#[test]
fn dockerignore_patterns_match_as_docker_matches_them() {
    assert!(ignored("target/", "target/debug/zkguard"));
    assert!(ignored("target/", "target"));
    assert!(!ignored("target/", "src/target.rs"));
    assert!(ignored("*.log", "build.log"));
    // `*` does not cross directories, as in Docker.
    assert!(!ignored("*.log", "logs/build.log"));
    assert!(ignored(".git/", ".git/refs/heads/main"));
    assert!(!ignored(".git/", ".github/workflows/ci.yml"));
}
