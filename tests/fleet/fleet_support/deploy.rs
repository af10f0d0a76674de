//! The fleet's alerts, dashboard and Kubernetes manifests under `deploy/`, checked offline:
//! the rules pass `promtool check rules` and their unit tests, each alert has a section in
//! docs/operations.md, every query of the dashboard is valid PromQL and filters on the
//! dashboard's variables, and the manifests pass `k8s_fleet_check.py`.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

pub const RULES: &str = "deploy/prometheus/fleet-alerts.yaml";
const RULE_TESTS: &str = "deploy/prometheus/fleet-alerts_test.yaml";
pub const DASHBOARD: &str = "deploy/grafana/zkguard-fleet.json";

pub use crate::promtool::{promtool, read};

/// The alert names of a rules file.
pub fn alert_names(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(|n| n.trim().to_string())
        .collect()
}

/// Every query of the dashboard's panels.
pub fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] != "row")
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect()
}

/// The metric names (`zkguard_...`) a query or rule text names.
pub fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes: Vec<char> = text.chars().collect();
    let mut i = 0;
    while let Some(pos) = text[i..].find("zkguard_") {
        let start = i + pos;
        let end = text[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(text.len(), |e| start + e);
        let before = start.checked_sub(1).map(|b| bytes.get(b).copied());
        if !matches!(before, Some(Some(c)) if c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '/')
        {
            names.insert(text[start..end].to_string());
        }
        i = end;
    }
    names
}

pub fn check_alerts() {
    let checked = promtool(&["check", "rules", RULES]);
    let alerts = alert_names(&read(RULES));
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{checked}"
    );
    promtool(&["test", "rules", RULE_TESTS]);
    let tests = read(RULE_TESTS);
    let docs = read("docs/operations.md");
    for alert in &alerts {
        assert!(
            tests.contains(&format!("alertname: {alert}")),
            "{alert} has no unit test in {RULE_TESTS}"
        );
        assert!(
            docs.contains(&format!("### {alert}")),
            "{alert} has no section in docs/operations.md"
        );
    }
}

pub fn check_dashboard() {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).expect("dashboard JSON");
    assert_eq!(dashboard["uid"], "zkguard-fleet");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let queries = dashboard_queries(&dashboard);
    for (n, expr) in queries.iter().enumerate() {
        assert!(expr.contains("instance=~\"$instance\""), "{expr}");
        let expr = expr.replace("$job", ".*").replace("$instance", ".*");
        rules.push_str(&format!(
            "      - record: dashboard:query_{n}\n        expr: {}\n",
            Value::from(expr)
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fleet-dashboard-queries.yaml");
    std::fs::write(&file, &rules).unwrap();
    let checked = promtool(&["check", "rules", file.to_str().unwrap()]);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{checked}"
    );
}

pub fn check_kubernetes() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(repo.join("tests/fleet/fleet_support/k8s_fleet_check.py"))
        .arg(repo)
        .arg(env!("CARGO_BIN_EXE_zkguard"))
        .output()
        .expect("python3");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    assert_eq!(
        said.lines().filter(|l| l.starts_with("ok: ")).count(),
        4,
        "{said}"
    );
}
