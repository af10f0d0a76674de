//! The service's contract: the OpenAPI document it serves is the one committed as
//! `docs/openapi.json` (and the one `zkguard openapi` prints), a valid OpenAPI 3.1 document; the
//! API docs at `/docs` render it offline in a real browser; and a fuzzer (schemathesis) driven by
//! the document finds no server error and no answer that departs from it.

use crate::serve_support;

use std::path::Path;
use std::process::Command;

use reqwest::StatusCode;
use serve_support::*;

fn committed() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json");
    std::fs::read_to_string(&path).expect("docs/openapi.json")
}

const REGENERATE: &str = "the API changed without its committed document: run `make openapi` (it rewrites docs/openapi.json from the handlers) and commit the result";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_document_is_the_committed_one_and_valid() {
    let printed = crate::cli::zkguard()
        .arg("openapi")
        .output()
        .expect("zkguard openapi");
    assert!(printed.status.success());
    let printed = String::from_utf8(printed.stdout).unwrap();
    assert!(printed == committed(), "zkguard openapi: {REGENERATE}");

    let env = Env::new(&shared_zk().connect_string(), "openapi");
    let s = env.start("openapi");
    let c = client();
    let served = c.get(s.url("/openapi.json")).send().await.unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    assert_eq!(served.headers()["content-type"], "application/json");
    let served = served.text().await.unwrap();
    assert!(served == committed(), "GET /openapi.json: {REGENERATE}");

    // A valid OpenAPI 3.1 document, as an independent validator reads it.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, &served).unwrap();
    let check = Command::new("python3")
        .args([
            "-c",
            "import json,sys; from openapi_spec_validator import validate; d=json.load(open(sys.argv[1])); validate(d); print(d['openapi'], len(d['paths']))",
        ])
        .arg(&file)
        .output()
        .expect("python3 with openapi-spec-validator (make deps)");
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(out.starts_with("3.1"), "{out}");
    let doc: serde_json::Value = serde_json::from_str(&served).unwrap();
    for path in [
        "/healthz",
        "/readyz",
        "/metrics",
        "/v1/indices/{index}/docs/{id}",
        "/v1/locks/{monitor}",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} is not documented");
    }
}

/// schemathesis, driven by the served document, against a live service on real ZooKeeper and
/// osmem-server: every documented operation with generated valid and invalid input (examples,
/// the coverage phase's edge values, random fuzzing), bounded so that it takes well under a
/// minute. No answer may be a 5xx the document does not name, and every status, header and body
/// must be the document's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fuzzer_finds_no_server_error_and_no_answer_outside_the_document() {
    let env = Env::new(&shared_zk().connect_string(), "fuzz")
        // Short bounds: a generated lock with a long lease or a long lock wait must not stall
        // the run.
        .with("ZKGUARD_SERVER_REQUEST_TIMEOUT", "3000")
        .with("ZKGUARD_SERVER_LOCK_TTL", "200")
        .with("ZKGUARD_SERVER_LOCK_TTL_MAX", "500")
        .with("ZKGUARD_ZOOKEEPER_FOREGROUND_TASK_TIMEOUT", "200");
    let s = env.start("fuzz");
    let dir = tempfile::tempdir().unwrap();
    let examples = std::env::var("ZKGUARD_FUZZ_EXAMPLES").unwrap_or_else(|_| "12".into());
    let run = Command::new("schemathesis")
        .current_dir(dir.path())
        .args(["run", &s.url("/openapi.json")])
        .env("SCHEMATHESIS_HOOKS", "hooks")
        .env(
            "PYTHONPATH",
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/openapi"),
        )
        // Everything but positive_data_acceptance, which expects a 2xx for any input the
        // document admits: a valid request can still be refused by what the document cannot
        // know (a lease above server.lock.ttl.max, a transfer between unknown accounts).
        .args([
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
        ])
        // A stream never ends, so its answer cannot be read whole: tests/serve_events.rs
        // checks the stream.
        .args(["--exclude-path", "/v1/events"])
        .args(["--max-examples", &examples])
        .args(["--workers", "1", "--seed", "26", "--no-color"])
        .args(["--suppress-health-check", "all"])
        .args(["--request-timeout", "10"])
        .output()
        .expect("schemathesis (make deps installs it)");
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    println!("{out}");
    assert!(run.status.success(), "schemathesis found problems:\n{out}");
    // It ran the operations: a run that tested nothing passes too.
    assert!(out.contains("passed"), "{out}");
}

/// `/docs` is served by the service itself: a page whose only script is the vendored Redoc
/// bundle (with its two documented substitutions: the logo from the service, NDJSON examples as
/// text), loaded by a relative URL, and nothing on the page points elsewhere. With bearer tokens
/// configured, the page, its script, its logo and the document still open without one (they
/// hold no data, and a browser cannot send one), while `/v1` needs one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_docs_are_served_offline_without_the_apis_tokens() {
    let env = Env::new(&shared_zk().connect_string(), "docs");
    let token = "docs-test-token-0123456789abcdef0123456789";
    let file = env.dir.path().join("tokens");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    let env = env.with("ZKGUARD_SERVER_AUTH_TOKENS_FILE", file.to_str().unwrap());
    let s = env.start("docs");
    let c = client();
    let r = c.get(s.url("/v1/locks")).send().await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::UNAUTHORIZED,
        "/v1/locks without a token"
    );
    let get = |path: &str| c.get(s.url(path)).send();
    let logo = get("/docs/redoc-logo.svg").await.unwrap();
    assert_eq!(logo.status(), StatusCode::OK);
    assert_eq!(logo.headers()["content-type"], "image/svg+xml");
    let page = get("/docs").await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    let page = page.text().await.unwrap();
    assert!(page.contains(r#"<redoc spec-url="openapi.json""#), "{page}");
    assert!(
        page.contains(r#"<script src="docs/redoc.standalone.js">"#),
        "{page}"
    );
    assert!(
        !page.contains("http://") && !page.contains("https://") && !page.contains("//cdn"),
        "the page must not load anything from elsewhere: {page}"
    );
    let script = get("/docs/redoc.standalone.js").await.unwrap();
    assert_eq!(script.status(), StatusCode::OK);
    assert_eq!(
        script.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );
    let vendored = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/redoc/redoc.standalone.js"),
    )
    .unwrap()
    .replacen(
        r#"src:"https://cdn.redoc.ly/redoc/logo-mini.svg""#,
        r#"src:"docs/redoc-logo.svg""#,
        1,
    )
    .replacen(
        "function ea(e){return-1!==e.search(/json/i)}",
        "function ea(e){return-1!==e.search(/json/i)&&-1===e.search(/ndjson/i)}",
        1,
    );
    assert!(
        script.text().await.unwrap() == vendored,
        "the served script is not the vendored bundle with its two substitutions"
    );
    let doc = get("/openapi.json").await.unwrap();
    assert_eq!(doc.status(), StatusCode::OK);
    assert!(doc.text().await.unwrap() == committed());
}

/// The API docs render in a real browser, offline: headless Chromium (with its background
/// networking off, so that nothing but the service could answer it) loads `/docs`, which loads
/// the vendored Redoc and the document from the service, and the rendered page lists the
/// operations by their summaries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_docs_render_in_a_browser() {
    let env = Env::new(&shared_zk().connect_string(), "browser");
    let s = env.start("browser");
    let profile = tempfile::tempdir().unwrap();
    let chromium = which("chromium");
    let out = tokio::process::Command::new(&chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            // Long enough for the script and the document to load and render; virtual time
            // ends as soon as the page is idle.
            "--virtual-time-budget=15000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(s.url("/docs"))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), out)
        .await
        .expect("chromium rendered /docs within 60 s")
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&out.stdout);
    for summary in [
        "Write a whole document under its lock",
        "Take a lock on a monitor and hold it",
        "The lock events, as a server-sent-events stream",
        "Liveness",
    ] {
        assert!(
            dom.contains(summary),
            "the rendered /docs does not show `{summary}` ({} bytes of DOM; chromium said: {})",
            dom.len(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn which(program: &str) -> std::path::PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{program} is not installed: run `make deps` (scripts/install-deps.sh)")
        })
}
