//! The package manifest: the command line's dependencies sit behind the default `cli` feature,
//! so that a library user (`default-features = false`) does not compile them.

use std::process::Command;

fn metadata() -> serde_json::Value {
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
        .find(|p| p["name"] == "zkguard")
        .expect("the zkguard package")
        .clone()
}

#[test]
fn cli_dependencies_are_optional_behind_the_default_cli_feature() {
    let package = metadata();
    let features = &package["features"];
    assert!(
        features["default"]
            .as_array()
            .unwrap()
            .contains(&"cli".into()),
        "{features}"
    );
    let cli: Vec<&str> = features["cli"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
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
    ] {
        let normal = package["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == dep && d["kind"].is_null())
            .unwrap_or_else(|| panic!("{dep} is not a dependency"));
        assert_eq!(normal["optional"], true, "{dep} must be optional");
        assert!(
            cli.contains(&format!("dep:{dep}").as_str()),
            "{dep} not in the cli feature: {cli:?}"
        );
    }
    let bin = package["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "zkguard" && t["kind"][0] == "bin")
        .expect("the zkguard binary");
    let required = bin["required-features"].as_array().unwrap();
    assert!(required.contains(&"cli".into()), "{required:?}");
    assert!(required.contains(&"testkit".into()), "{required:?}");
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
