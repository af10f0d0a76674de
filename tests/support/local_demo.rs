//! A small run of `zkguard demo` on local servers.

use serde_json::Value;

/// Runs a small `zkguard demo --servers local --json` (5 articles, 2 writers, 2 jobs) in `dir`,
/// with `extra` arguments added, asserts that it exits 0, and returns its JSON report.
pub fn small_local_demo(dir: &std::path::Path, extra: &[&str]) -> Value {
    let output = crate::cli::zkguard()
        .args(["demo", "--servers", "local"])
        .args(extra)
        .args([
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
        .env("ZKGUARD_ELASTIC_RETRY_BACKOFF_INITIAL", "20")
        .env("ZKGUARD_ELASTIC_RETRY_BACKOFF_MAX", "100")
        .env_remove("ZKGUARD_CONFIG")
        .env_remove("ZKGUARD_ZOOKEEPER_SERVERS")
        .env_remove("ZKGUARD_ELASTICSEARCH_URL")
        .env("RUST_LOG", "error")
        .current_dir(dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "exit {:?}\nstdout: {stdout}\nstderr: {stderr}",
        output.status
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}
