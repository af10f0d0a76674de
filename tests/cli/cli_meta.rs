//! `zkguard config check|show`, `zkguard completions` and `zkguard man`: commands that read no
//! server, run through the built binary.

use std::io::Write;
use std::process::{Command, Output};

/// A `zkguard` command with no `ZKGUARD_*` variable from the test's environment.
fn zkguard() -> Command {
    crate::cli::zkguard()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn properties(content: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new()
        .suffix(".properties")
        .tempfile()
        .unwrap();
    f.write_all(content.as_bytes()).unwrap();
    f
}

fn run(c: &mut Command) -> Output {
    c.output().expect("run zkguard")
}

#[test]
fn config_check_accepts_a_valid_configuration_without_connecting() {
    // Nothing listens on port 1: a check that connected would fail.
    let file = properties("zookeeper.servers=127.0.0.1:1\nelasticsearch.url=http://127.0.0.1:1\n");
    let out = run(zkguard()
        .arg("--config")
        .arg(file.path())
        .args(["config", "check"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("configuration valid"));

    let out = run(zkguard()
        .arg("--config")
        .arg(file.path())
        .args(["config", "check", "--json"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["valid"], true);
    assert_eq!(v["file"], file.path().display().to_string());
    assert_eq!(v["warnings"], serde_json::json!([]));

    // A misspelt variable is valid configuration with a warning: in the object with --json, as
    // a JSON line on stderr for the other --json commands.
    let out = run(zkguard()
        .env("ZKGUARD_ZOOKEEPER_SESION_TIMEOUT", "3000")
        .args(["config", "check", "--json"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["warnings"][0]
            .as_str()
            .unwrap()
            .contains("did you mean ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT"),
        "{v}"
    );
    let out = run(zkguard()
        .env("ZKGUARD_ZOOKEEPER_SESION_TIMEOUT", "3000")
        .args(["config", "show", "--json"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let w: serde_json::Value = serde_json::from_slice(&out.stderr).expect("a JSON warning");
    assert_eq!(w["warning"], "config");
    assert!(w["message"]
        .as_str()
        .unwrap()
        .contains("ZKGUARD_ZOOKEEPER_SESION_TIMEOUT"));
}

#[test]
fn config_check_rejects_a_bad_value_with_78() {
    let file = properties("zookeeper.session.timeout=soon\n");
    let out = run(zkguard()
        .arg("--config")
        .arg(file.path())
        .args(["config", "check"]));
    assert_eq!(out.status.code(), Some(78));
    let err = text(&out.stderr);
    assert!(err.contains("zookeeper.session.timeout"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    let out = run(zkguard().args([
        "--config",
        "/nonexistent/zkguard.properties",
        "config",
        "check",
    ]));
    assert_eq!(out.status.code(), Some(78));
}

#[test]
fn config_show_names_the_source_of_each_value_and_masks_secrets() {
    let file =
        properties("zookeeper.servers=zk1:2181\nelasticsearch.url=http://alice:hunter2@es1:9200\n");
    let show = |json: bool| {
        let mut c = zkguard();
        c.arg("--config")
            .arg(file.path())
            .env("ZKGUARD_TXN_RECOVERY_AFTER", "5s")
            .args(["config", "show"]);
        if json {
            c.arg("--json");
        }
        let out = run(&mut c);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let plain = show(false);
    assert!(!plain.contains("hunter2"), "{plain}");
    assert!(!plain.contains("alice"), "{plain}");
    let line = |key: &str| {
        plain
            .lines()
            .find(|l| l.starts_with(&format!("{key} ")))
            .unwrap_or_else(|| panic!("{key} not in {plain}"))
            .to_string()
    };
    assert!(line("zookeeper.servers").contains("zk1:2181"));
    assert!(line("zookeeper.servers").contains(&format!("(file {})", file.path().display())));
    assert!(
        line("txn.recovery.after").contains("(environment variable ZKGUARD_TXN_RECOVERY_AFTER)")
    );
    assert!(line("lock.backend").contains("zookeeper  (default)"));
    assert!(line("elasticsearch.url").contains("http://***@es1:9200"));

    let json: serde_json::Value = serde_json::from_str(&show(true)).unwrap();
    let entries = json.as_array().unwrap();
    assert_eq!(entries.len(), zkguard::config::KEYS.len());
    let entry = |key: &str| {
        entries
            .iter()
            .find(|e| e["key"] == key)
            .unwrap_or_else(|| panic!("{key} not in {json}"))
            .clone()
    };
    assert_eq!(
        entry("zookeeper.servers"),
        serde_json::json!({"key": "zookeeper.servers", "value": "zk1:2181", "source": "file",
            "origin": file.path().display().to_string()})
    );
    assert_eq!(entry("txn.recovery.after")["source"], "env");
    assert_eq!(
        entry("txn.recovery.after")["origin"],
        "ZKGUARD_TXN_RECOVERY_AFTER"
    );
    assert_eq!(entry("txn.recovery.after")["value"], "5s");
    assert_eq!(entry("deadletter.sink")["source"], "default");
    assert_eq!(entry("elasticsearch.url")["value"], "http://***@es1:9200");

    // A password from the environment is masked too.
    let out = run(zkguard()
        .env("ZKGUARD_ELASTICSEARCH_USERNAME", "bob")
        .env("ZKGUARD_ELASTICSEARCH_PASSWORD", "s3cret-value")
        .args(["config", "show", "--json"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!text(&out.stdout).contains("s3cret-value"));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let password = json
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["key"] == "elasticsearch.password")
        .unwrap()
        .clone();
    assert_eq!(password["value"], "***");
    assert_eq!(password["source"], "env");
}

#[test]
fn secret_keys_are_recognised_by_name() {
    use zkguard::config::{is_secret_key, masked_value};
    for key in [
        "elasticsearch.password",
        "kafka.sasl.secret",
        "auth.token",
        "tls.private.key",
        "cloud.credentials",
    ] {
        assert!(is_secret_key(key), "{key}");
        assert_eq!(masked_value(key, "x"), "***");
    }
    for key in ["zookeeper.servers", "lock.backend", "zookeeper.lock.root"] {
        assert!(!is_secret_key(key), "{key}");
    }
    assert_eq!(
        masked_value("elasticsearch.url", "https://u:p@a:9200/,http://b:9200"),
        "https://***@a:9200/,http://b:9200"
    );
}

#[test]
fn completions_for_each_shell() {
    for (shell, marker) in [
        ("bash", "complete -F _zkguard"),
        ("zsh", "#compdef zkguard"),
        ("fish", "complete -c zkguard"),
    ] {
        let out = run(zkguard().args(["completions", shell]));
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        assert!(script.contains(marker), "{shell}: {marker:?} missing");
        for sub in ["exec", "locks", "txn", "config"] {
            assert!(script.contains(sub), "{shell}: subcommand {sub} missing");
        }
    }
    let out = run(zkguard().args(["completions", "tcsh"]));
    assert_eq!(out.status.code(), Some(64));
    // Test-only options are not offered.
    for shell in ["bash", "zsh", "fish"] {
        let script = text(&run(zkguard().args(["completions", shell])).stdout);
        assert!(
            !script.contains("crash-after"),
            "{shell} offers --crash-after"
        );
        assert!(script.contains("discard"), "{shell}: dlq discard missing");
    }
}

/// A usage error is one line starting with `zkguard:`, with clap's tip and the usage, exit 64.
#[test]
fn usage_errors_are_one_line() {
    let out = run(zkguard().args(["dlq", "replay", "--al"]));
    assert_eq!(out.status.code(), Some(64));
    let e = text(&out.stderr);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.starts_with("zkguard: unexpected argument '--al'"), "{e}");
    assert!(
        e.contains("'--all'") && e.contains("`zkguard dlq replay --help`"),
        "{e}"
    );
    let out = run(zkguard().args(["exec", "--monitor"]));
    assert_eq!(out.status.code(), Some(64));
    let e = text(&out.stderr);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.starts_with("zkguard: a value is required for '--monitor"),
        "{e}"
    );
    // Help is still the help, on stdout, exit 0.
    let out = run(zkguard().args(["dlq", "--help"]));
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("discard"));
}

/// A missing argument reads as one sentence (the list joined into its heading, no `:;`), and an
/// unknown command typed as a synonym of one is pointed to it; both stay usage errors (64) and run
/// nothing.
#[test]
fn usage_errors_read_as_sentences_and_suggest_the_command_meant() {
    let out = run(zkguard().args(["exec", "--monitor", "x"]));
    assert_eq!(out.status.code(), Some(64));
    let e = text(&out.stderr);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.starts_with("zkguard: the following required arguments were not provided: <CMD>...; usage: zkguard exec"),
        "{e}"
    );
    assert!(!e.contains(":;"), "{e}");
    let out = run(zkguard().args(["exec"]));
    let e = text(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{e}");
    assert!(
        e.contains("not provided: --monitor <ID>, <CMD>...; usage:"),
        "{e}"
    );
    for (typed, meant) in [
        (&["deadletters"][..], "`zkguard dlq`"),
        (&["dead-letters", "list"][..], "`zkguard dlq`"),
        (&["transactions"][..], "`zkguard txn`"),
        (&["dlq", "delete"][..], "`zkguard dlq discard`"),
    ] {
        let out = run(zkguard().args(typed));
        let e = text(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{typed:?}: {e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(
            e.contains(&format!("did you mean {meant}?")),
            "{typed:?}: {e}"
        );
        assert!(out.stdout.is_empty(), "{typed:?} ran something");
    }
    // clap's own suggestion for a typo stays, and the real command keeps working.
    let e = text(&run(zkguard().args(["serv"])).stderr);
    assert!(e.contains("similar subcommand exists: 'serve'"), "{e}");
    assert!(!e.contains("did you mean"), "{e}");
    let out = run(zkguard().args(["dlq", "--help"]));
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn man_page_is_roff_for_every_subcommand() {
    // A broken configuration does not stop the man page or the completions.
    let out = run(zkguard()
        .env("ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT", "x")
        .arg("man"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let page = text(&out.stdout);
    assert!(page.contains(".TH zkguard 1"), "{page}");
    for sub in [
        "exec",
        "locks",
        "dlq",
        "txn",
        "serve",
        "config",
        "completions",
    ] {
        assert!(
            page.contains(&format!(".SS \"zkguard {sub}\"")),
            "subcommand {sub} missing from the man page"
        );
    }
    // One page: no references to pages that do not exist, and the sections readers look for.
    assert!(!page.contains("\\-exec(1)"), "refers to zkguard-exec(1)");
    for section in [
        ".SH \"EXIT STATUS\"",
        ".SH ENVIRONMENT",
        ".SH FILES",
        ".SH \"SEE ALSO\"",
    ] {
        assert!(page.contains(section), "{section} missing");
    }
    for needle in [
        "ZKGUARD_ZOOKEEPER_SERVERS",
        "ZKGUARD_FENCING_TOKEN",
        "RUST_LOG",
        "XDG_STATE_HOME",
        "zkguard dlq discard",
        "75",
    ] {
        assert!(page.contains(needle), "{needle} missing from the man page");
    }
    assert!(
        !page.contains("crash"),
        "a test-only option is in the man page"
    );
}

/// The variables `cargo run` and `cargo test` give to what they start: every
/// `cargo:rustc-env=NAME=VALUE` of zkguard's build script, read from the output of its latest
/// run in this target directory (the one of the build that made the binary under test).
fn build_script_variables() -> Vec<(String, String)> {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_zkguard"));
    let build = bin.parent().unwrap().join("build");
    let latest = std::fs::read_dir(&build)
        .unwrap()
        .flatten()
        .filter(|d| d.file_name().to_string_lossy().starts_with("zkguard-"))
        .map(|d| d.path().join("output"))
        .filter_map(|output| Some((output.metadata().ok()?.modified().ok()?, output)))
        .max()
        .expect("an output of zkguard's build script");
    std::fs::read_to_string(latest.1)
        .unwrap()
        .lines()
        .filter_map(|line| line.strip_prefix("cargo:rustc-env=")?.split_once('='))
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

#[test]
fn a_zkguard_started_by_cargo_run_warns_of_no_variable_of_its_build() {
    let vars = build_script_variables();
    assert!(
        !vars.is_empty(),
        "no output of zkguard's build script found"
    );
    let file = properties("zookeeper.servers=127.0.0.1:1\nelasticsearch.url=http://127.0.0.1:1\n");
    let out = run(zkguard().envs(vars.iter().map(|(k, v)| (k, v))).args([
        "--config",
        file.path().to_str().unwrap(),
        "config",
        "check",
    ]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !text(&out.stderr).contains("warning"),
        "with {vars:?}: {}",
        text(&out.stderr)
    );
}
