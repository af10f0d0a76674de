//! The workspace's manifests: the library (`crates/zkguard`) has none of the command line's
//! dependencies, so a library user does not compile them; the `zkguard` binary is the root
//! package's (`zkguard-cli`).

use std::process::Command;

/// The package `name` of the workspace, as `cargo metadata` describes it.
fn package(name: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    all["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("the {name} package"))
        .clone()
}

fn metadata() -> serde_json::Value {
    package("zkguard")
}

#[test]
fn the_library_has_none_of_the_command_lines_dependencies() {
    let library = metadata();
    let cli = package("zkguard-cli");
    let deps = |p: &serde_json::Value| -> Vec<String> {
        p["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["kind"].is_null())
            .map(|d| d["name"].as_str().unwrap().to_string())
            .collect()
    };
    for dep in [
        "clap",
        "clap_complete",
        "clap_mangen",
        "indicatif",
        "tracing-subscriber",
        "axum",
        "prometheus-client",
        "utoipa",
        "utoipa-axum",
        "mimalloc",
        "flate2",
    ] {
        assert!(
            !deps(&library).contains(&dep.to_string()),
            "the library depends on {dep}"
        );
        assert!(
            deps(&cli).contains(&dep.to_string()),
            "{dep} is not a dependency of the command line"
        );
    }
    let bin = cli["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "zkguard" && t["kind"][0] == "bin")
        .expect("the zkguard binary");
    // The demo and the benchmarks are a default feature the service's image leaves out.
    assert!(bin["required-features"].is_null(), "{bin}");
    assert!(cli["features"]["default"]
        .as_array()
        .unwrap()
        .contains(&"workload".into()));
}

#[test]
fn package_metadata_is_filled_in() {
    let package = metadata();
    assert!(!package["keywords"].as_array().unwrap().is_empty());
    assert!(!package["categories"].as_array().unwrap().is_empty());
    // The Elasticsearch client is pinned exactly; the README says why.
    let es = package["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "elasticsearch")
        .unwrap();
    assert!(es["req"].as_str().unwrap().starts_with('='), "{es}");
    let readme = include_str!("../../README.md");
    assert!(readme.contains(&format!("`{}`", es["req"].as_str().unwrap())));
}
