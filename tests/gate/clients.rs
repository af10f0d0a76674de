//! Clients generated from the service's OpenAPI document (`docs/openapi.json`), at test time, and
//! used against a live service on real ZooKeeper and osmem-server: the Python client of
//! openapi-python-client, and the TypeScript types of openapi-typescript with openapi-fetch,
//! type-checked by tsc. Each runs the examples' four steps (`examples/generated_client.py`,
//! `examples/generated_client.mts`): a foreground save, a background bulk job waited for, an
//! explicit lock with keep-alive, a write under it and release, and the dead letters, one of
//! which the script parked first. The script checks every typed answer; this test checks its
//! summary against the service and Elasticsearch.
//!
//! Nothing is downloaded here: `make deps` installs openapi-python-client (pip) and the npm
//! packages of `tests/support/clients` (`npm ci`, from its committed package-lock.json).

use crate::common;
use crate::serve_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use common::uuid_tag;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use serve_support::*;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn support() -> PathBuf {
    repo().join("tests/support/clients")
}

const DEPS: &str = "run `make deps` (scripts/install-deps.sh) to install it";

/// Runs `cmd` (named `what`), panics with its output when it fails; prints how long it took.
fn run(cmd: &mut Command, what: &str) -> Output {
    let started = Instant::now();
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what} could not be started ({e}): {DEPS}"));
    println!("{what}: {:.1?}", started.elapsed());
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The script's summary: its last line of output, a JSON object.
fn summary(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("no JSON summary ({e}) in:\n{stdout}"))
}

/// A service that parks a background operation at once when its first attempt fails (one that
/// can never apply is parked at once anyway).
fn service(tag: &str) -> (Env, Service) {
    let env = Env::new(&shared_zk().connect_string(), tag)
        .with("ZKGUARD_ELASTIC_REQUEST_RETRY_COUNT", "1");
    let s = env.start(tag);
    (env, s)
}

fn u64_of(v: &Value, what: &str) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("{what} is not an unsigned integer: {v}"))
}

/// Checks what a client's summary says against the service and Elasticsearch: the operations
/// it saw applied are applied with those tokens and their documents carry them, the article's
/// last write is the one made under the explicit lock (with its token), the lock is released,
/// and the dead letter it read is the operation the service parked, for the reason it gave.
async fn check_summary(s: &Service, index: &str, summary: &Value) {
    let c = client();
    let saved = &summary["saved"];
    assert_eq!(saved["result"], "written", "{summary}");
    let saved_token = u64_of(&saved["token"], "saved.token");

    let operations = summary["operations"].as_array().expect("operations");
    assert_eq!(operations.len(), 3, "{summary}");
    for (n, op) in operations.iter().enumerate() {
        let id = op["operation_id"].as_str().expect("operation_id");
        let token = u64_of(&op["token"], "operation token");
        assert!(token > saved_token, "{op}");
        let state = op_status(&c, s, id).await;
        assert_eq!(state["status"], "applied", "{state}");
        assert_eq!(state["token"], op["token"], "{state}");
        let doc = es_doc(&c, index, &format!("42-related-{n}")).await;
        assert_eq!(doc["_version"], op["token"], "{doc}");
        assert_eq!(doc["_source"]["zkguard"]["op"], id, "{doc}");
    }

    let lock = &summary["lock"];
    let token = u64_of(&lock["token"], "lock.token");
    assert_eq!(lock["monitor"], format!("{index}:42"), "{lock}");
    assert_eq!(summary["kept"]["lock_id"], lock["lock_id"], "{summary}");
    assert_eq!(summary["written_under_lock"]["token"], token, "{summary}");
    assert_eq!(summary["released"]["released"], true, "{summary}");
    let article = es_doc(&c, index, "42").await;
    assert_eq!(u64_of(&article["_version"], "_version"), token, "{article}");
    assert_eq!(
        article["_source"]["body"], "Edited under an explicit lock",
        "{article}"
    );
    assert_eq!(
        article["_source"]["zkguard"]["op"], summary["written_under_lock"]["operation_id"],
        "{article}"
    );
    assert_eq!(scraped(&c, s, "zkguard_explicit_locks").await, 0.0);
    let (status, monitor) = call(
        &c,
        Method::GET,
        &s.url(&format!("/v1/locks/{index}:42")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{monitor}");
    // Nobody holds or waits: an empty list (or the monitor without holder and queue).
    assert!(
        monitor
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["holder"].is_null() && m["queue"].as_array().is_some_and(|q| q.is_empty())),
        "still held: {monitor}"
    );

    let letter = &summary["dead_letter"];
    let id = letter["id"].as_str().expect("dead_letter.id");
    assert_eq!(letter["reason"], "not_retryable", "{letter}");
    assert_eq!(letter["error_kind"], "not_found", "{letter}");
    let state = op_status(&c, s, id).await;
    assert_eq!(state["status"], "parked", "{state}");
    assert!(
        state["reason"]
            .as_str()
            .unwrap()
            .contains(letter["last_error"].as_str().unwrap()),
        "{state} {letter}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generated_python_client_saves_bulks_locks_and_reads_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    let package = dir.path().join("zkguard-client");
    let generated = run(
        Command::new("openapi-python-client")
            .current_dir(dir.path())
            .args(["generate", "--path"])
            .arg(repo().join("docs/openapi.json"))
            .arg("--config")
            .arg(repo().join("examples/openapi-python-client.yaml"))
            .arg("--output-path")
            .arg(&package),
        "openapi-python-client generate",
    );
    // Every route is generated (the config file makes the NDJSON bulk route one of them); the
    // generator warns only that it leaves out /metrics' OpenMetrics text.
    let said = String::from_utf8_lossy(&generated.stdout).to_string()
        + &String::from_utf8_lossy(&generated.stderr);
    assert!(!said.contains("will not be generated"), "{said}");
    assert!(
        package.join("zkguard_client/api/writes/bulk.py").is_file(),
        "{said}"
    );

    let (_env, s) = service("clients-py");
    let index = format!("clients-py-{}", uuid_tag());
    let pythonpath = std::env::join_paths([package.clone(), repo().join("examples")]).unwrap();
    let out = run(
        Command::new("python3")
            .current_dir(dir.path())
            .env("PYTHONPATH", pythonpath)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .arg(support().join("python_client.py"))
            .args([&s.base, &index]),
        "python_client.py",
    );
    check_summary(&s, &index, &summary(&out)).await;
}

/// A tool of `tests/support/clients/node_modules`, or a panic that says how to install it.
fn npm_tool(name: &str) -> PathBuf {
    let path = support().join("node_modules/.bin").join(name);
    assert!(path.exists(), "{} is missing: {DEPS}", path.display());
    path
}

/// Puts the TypeScript client in `dir`: the example, the test script, the compiler settings,
/// the packages (a link to tests/support/clients/node_modules) and the types generated from
/// `document`; then type-checks and compiles them with tsc (strict, nothing written on an
/// error). Returns tsc's output when it fails, None when it succeeds.
fn compile_ts(dir: &Path, document: &Path) -> Option<String> {
    for (from, to) in [
        (
            repo().join("examples/generated_client.mts"),
            "generated_client.mts",
        ),
        (support().join("client_test.mts"), "client_test.mts"),
        (support().join("tsconfig.json"), "tsconfig.json"),
    ] {
        std::fs::copy(&from, dir.join(to)).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    }
    std::os::unix::fs::symlink(support().join("node_modules"), dir.join("node_modules")).unwrap();
    run(
        Command::new(npm_tool("openapi-typescript"))
            .arg(document)
            .arg("-o")
            .arg(dir.join("zkguard-api.d.ts")),
        "openapi-typescript",
    );
    let started = Instant::now();
    let tsc = Command::new(npm_tool("tsc"))
        .arg("-p")
        .arg(dir.join("tsconfig.json"))
        .output()
        .expect("run tsc");
    println!("tsc: {:.1?}", started.elapsed());
    (!tsc.status.success()).then(|| {
        String::from_utf8_lossy(&tsc.stdout).to_string() + &String::from_utf8_lossy(&tsc.stderr)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generated_typescript_client_saves_bulks_locks_and_reads_dead_letters() {
    let node = run(Command::new("node").arg("--version"), "node --version");
    println!("node {}", String::from_utf8_lossy(&node.stdout).trim());

    let dir = tempfile::tempdir().unwrap();
    if let Some(errors) = compile_ts(dir.path(), &repo().join("docs/openapi.json")) {
        panic!("the TypeScript client does not compile against docs/openapi.json:\n{errors}");
    }

    // The generated types are really used: with a field of the document renamed (the token
    // of a foreground write), the same code no longer compiles.
    let renamed = tempfile::tempdir().unwrap();
    let mut doc: Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("docs/openapi.json")).unwrap())
            .unwrap();
    let written = &mut doc["components"]["schemas"]["Written"];
    let token = written["properties"]
        .as_object_mut()
        .unwrap()
        .remove("token")
        .expect("Written.token");
    written["properties"]["fencing_token"] = token;
    for name in written["required"].as_array_mut().unwrap() {
        if name == "token" {
            *name = "fencing_token".into();
        }
    }
    let document = renamed.path().join("openapi.json");
    std::fs::write(&document, doc.to_string()).unwrap();
    let errors = compile_ts(renamed.path(), &document)
        .expect("the TypeScript client compiled against a document without Written.token");
    assert!(
        errors.contains("error TS") && errors.contains("'token'"),
        "{errors}"
    );

    let (_env, s) = service("clients-ts");
    let index = format!("clients-ts-{}", uuid_tag());
    let out = run(
        Command::new("node")
            .current_dir(dir.path())
            .arg(dir.path().join("client_test.mjs"))
            .args([&s.base, &index]),
        "node client_test.mjs",
    );
    check_summary(&s, &index, &summary(&out)).await;
}
