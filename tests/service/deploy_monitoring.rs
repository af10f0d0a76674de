//! The dashboard and the alerts under `deploy/` (docs/operations.md): the alerting rules pass
//! `promtool check rules` and their unit tests, every alert has a test that fires it and one
//! that does not and a section in the docs, every query of the dashboard is valid PromQL, and
//! every metric (and label value) the dashboard and the rules name is on the `/metrics` page of
//! a live service. promtool comes with Debian's `prometheus` package (`make deps`).

use crate::common;
use crate::promtool::{promtool, read};
use crate::serve_controls::park_one;
use crate::serve_support;

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use serve_support::*;

const RULES: &str = "deploy/prometheus/alerts.yaml";
const RULE_TESTS: &str = "deploy/prometheus/alerts_test.yaml";
const DASHBOARD: &str = "deploy/grafana/zkguard.json";
const DOCS: &str = "docs/operations.md";

/// The alerts of the rules file, each with its lines.
fn alerts(rules: &str) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = Vec::new();
    for line in rules.lines() {
        if let Some(name) = line.trim().strip_prefix("- alert: ") {
            found.push((name.trim().to_string(), String::new()));
        } else if let Some((_, body)) = found.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    found
}

/// Every `zkguard_...` and `process_...` identifier in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    // (Without `:`, which only recording rules use: a description may follow a name with one.)
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    ["zkguard_", "process_"]
        .into_iter()
        .flat_map(|prefix| text.match_indices(prefix))
        .filter(|(i, _)| !text[..*i].chars().next_back().is_some_and(ident))
        .map(|(i, _)| text[i..].chars().take_while(|c| ident(*c)).collect())
        .collect()
}

/// The `label="value"` matchers of PromQL text (`=~` and `!=` left out).
fn matchers(expr: &str) -> BTreeSet<(String, String)> {
    expr.match_indices("=\"")
        .filter_map(|(i, _)| {
            let label: String = expr[..i]
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let value = expr[i + 2..].split('"').next()?;
            (!label.is_empty()).then(|| (label, value.to_string()))
        })
        .collect()
}

/// The panels of the dashboard, those inside collapsed rows included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    for p in dashboard["panels"].as_array().expect("panels") {
        all.push(p);
        all.extend(p["panels"].as_array().into_iter().flatten());
    }
    all
}

/// The PromQL of the dashboard: its panels' queries and its variables' queries.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    let mut queries: Vec<String> = panels(dashboard)
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .map(|t| t["expr"].as_str().expect("a target's expr").to_string())
        .collect();
    for v in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        if v["type"] == "query" {
            queries.push(v["definition"].as_str().expect("definition").to_string());
            queries.push(v["query"]["query"].as_str().expect("query").to_string());
        }
    }
    queries
}

#[test]
fn the_alerts_pass_promtool_and_each_is_tested_both_ways_and_documented() {
    let rules = read(RULES);
    let alerts = alerts(&rules);
    assert!(alerts.len() >= 7, "{alerts:?}");
    let checked = promtool(&["check", "rules", RULES]);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{checked}"
    );
    let tested = promtool(&["test", "rules", RULE_TESTS]);
    assert!(tested.contains("SUCCESS"), "{tested}");

    // The test file, cut at each `alertname:`: whether the case expects the alert to fire.
    let tests = read(RULE_TESTS);
    let mut cases: Vec<(String, bool)> = Vec::new();
    for line in tests.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix("alertname: ") {
            cases.push((name.to_string(), false));
        } else if line.starts_with("- interval:") {
            cases.push((String::new(), false));
        } else if line.starts_with("- exp_labels:") {
            cases.last_mut().expect("a case").1 = true;
        }
    }
    let docs = read(DOCS);
    for (name, body) in &alerts {
        assert!(
            cases.contains(&(name.clone(), true)),
            "{name}: no unit test fires it"
        );
        assert!(
            cases.contains(&(name.clone(), false)),
            "{name}: no unit test shows it quiet"
        );
        for part in [
            "expr: ",
            "for: ",
            "severity: ",
            "summary: ",
            "description: ",
        ] {
            assert!(body.contains(part), "{name} has no {part:?}:\n{body}");
        }
        let anchor = format!("{DOCS}#{}", name.to_lowercase());
        assert!(body.contains(&anchor), "{name} does not point to {anchor}");
        assert!(
            docs.contains(&format!("\n### {name}\n")),
            "{DOCS} has no section {name}"
        );
    }
}

#[test]
fn every_query_of_the_dashboard_is_valid_promql() {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).expect("dashboard JSON");
    assert_eq!(dashboard["uid"], "zkguard-serve");
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(variables, ["datasource", "job", "instance"]);
    let mut ids = BTreeSet::new();
    let mut queries = Vec::new();
    for p in panels(&dashboard) {
        let title = p["title"].as_str().expect("title");
        assert!(
            ids.insert(p["id"].as_u64().expect("id")),
            "{title}: id reused"
        );
        let pos = &p["gridPos"];
        assert!(
            pos["x"].as_u64().unwrap() + pos["w"].as_u64().unwrap() <= 24,
            "{title}: {pos}"
        );
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        for t in targets {
            let expr = t["expr"].as_str().unwrap();
            assert!(expr.contains("instance=~\"$instance\""), "{title}: {expr}");
            queries.push((
                p["id"].as_u64().unwrap(),
                t["refId"].as_str().unwrap(),
                expr,
            ));
        }
        if p["type"] == "heatmap" {
            assert!(targets.iter().all(|t| t["format"] == "heatmap"), "{title}");
        }
    }
    // Each query as a recording rule, Grafana's variables given values: promtool parses them.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (id, r, expr) in &queries {
        let expr = expr
            .replace("$__rate_interval", "1m")
            .replace("$__range", "1h")
            .replace("$job", ".*")
            .replace("$instance", ".*");
        rules.push_str(&format!(
            "      - record: dashboard:panel_{id}_{r}\n        expr: {}\n",
            Value::from(expr)
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard-queries.yaml");
    std::fs::write(&file, &rules).unwrap();
    let checked = promtool(&["check", "rules", file.to_str().unwrap()]);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{checked}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_of_the_dashboard_and_the_alerts_is_on_a_live_metrics_page() {
    // With the gate on: the dashboard has its panels.
    let env = Env::new(&shared_zk().connect_string(), "monitoring")
        .with("ZKGUARD_SERVER_GATEWAY_LISTEN", "127.0.0.1:0");
    let s = env.start("monitoring");
    let c = client();
    let index = format!("monitoring-{}", uuid_tag());

    // The series of both lock types exist from the start, at 0: increase() sees the first
    // fenced write or lock timeout.
    let fresh = scrape(&c, &s).await;
    for lock_type in ["foreground", "background"] {
        for family in [
            "zkguard_fenced_rejections_total",
            "zkguard_lock_timeouts_total",
            "zkguard_lock_acquisitions_total",
            "zkguard_lock_wait_seconds_count",
        ] {
            let series = format!("{family}{{lock_type=\"{lock_type}\"}}");
            assert_eq!(fresh.get(&series), Some(&0.0), "{series}");
        }
    }
    assert_eq!(fresh.get("zkguard_journal_oldest_seconds"), Some(&0.0));

    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/a"),
        &json!({"n": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    // A background write waits for a lock held elsewhere: the journal's oldest operation ages.
    let (holder, guard) = hold_lock(&env, &format!("{index}:b")).await;
    let (status, v) = put(
        &c,
        &s,
        &format!("/v1/indices/{index}/docs/b?type=background"),
        &json!({"n": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let id = v["operation_id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let waiting = scrape(&c, &s).await;
    assert_eq!(waiting["zkguard_journal_depth"], 1.0);
    let age = waiting["zkguard_journal_oldest_seconds"];
    assert!((1.2..60.0).contains(&age), "{age}");
    guard.unlock().await.unwrap();
    drop(holder);
    let done = wait_finished(&c, &s, std::slice::from_ref(&id)).await;
    assert_eq!(done[&id]["status"], "applied", "{:?}", done[&id]);

    // A document and a _bulk of one item through the gate.
    let gate = format!(
        "http://{}",
        s.started["gateway"].as_str().expect("the gate's address")
    );
    let resp = c
        .put(format!("{gate}/{index}/_doc/g"))
        .json(&json!({"n": 3}))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{:?}", resp.text().await);
    let bulk = format!(
        "{}\n{}\n",
        json!({"index": {"_index": index, "_id": "h"}}),
        json!({"n": 4})
    );
    let resp = c
        .post(format!("{gate}/_bulk"))
        .header("content-type", "application/x-ndjson")
        .body(bulk)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{:?}", resp.text().await);

    let resp = c.get(s.url("/metrics")).send().await.unwrap();
    let text = resp.text().await.unwrap();
    let samples: HashMap<String, f64> = parse_metrics(&text);
    assert_eq!(samples["zkguard_journal_oldest_seconds"], 0.0);
    assert_eq!(samples["zkguard_journal_depth"], 0.0);
    let names: BTreeSet<&str> = samples
        .keys()
        .map(|k| k.split('{').next().unwrap())
        .collect();
    let labelled = |label: &str, value: &str| {
        let pair = format!("{label}=\"{value}\"");
        samples.keys().any(|k| k.contains(&pair))
    };

    // Queries name series as the page has them (`_total`, `_bucket`); the dashboard's
    // descriptions may name a histogram by its family.
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    let queries = dashboard_queries(&dashboard).join("\n");
    let rules = read(RULES);
    let rule_tests = read(RULE_TESTS);
    for (what, text) in [
        ("the dashboard's queries", queries.as_str()),
        (RULES, rules.as_str()),
        (RULE_TESTS, rule_tests.as_str()),
    ] {
        let used = metric_names(text);
        assert!(used.len() >= 5, "{what}: {used:?}");
        let missing: Vec<&String> = used
            .iter()
            .filter(|n| !names.contains(n.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "{what} name series the service does not have: {missing:?}"
        );
    }
    let missing: Vec<String> = metric_names(&read(DASHBOARD))
        .into_iter()
        .filter(|n| !names.contains(n.as_str()) && !names.contains(format!("{n}_bucket").as_str()))
        .collect();
    assert!(missing.is_empty(), "{DASHBOARD} names {missing:?}");
    // Label values the queries select on exist (`job` and `instance` come from the scraper).
    for (label, value) in matchers(&queries).into_iter().chain(matchers(&rules)) {
        assert!(
            labelled(&label, &value),
            "no series has {label}=\"{value}\""
        );
    }
}

/// The process collector's metrics (read from `/proc` at each scrape), `zkguard_build_info`,
/// and `zkguard_deadletters`: the dead letters in the sink now, up at a parking and down at a
/// discard, while the parked counter only grows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_has_process_metrics_build_info_and_the_dead_letters_parked_now() {
    let now = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let before_start = now();
    let env = Env::new(&shared_zk().connect_string(), "processmetrics")
        .with("ZKGUARD_ELASTIC_REQUEST_RETRY_COUNT", "1");
    let s = env.start("processmetrics");
    let c = client();
    let index = format!("processmetrics-{}", uuid_tag());

    let m = scrape(&c, &s).await;
    // The service's own process, not the test's: started after this test began.
    let started = m["process_start_time_seconds"];
    assert!(
        started >= before_start - 1.0 && started <= now(),
        "{started} not between {before_start} and now"
    );
    assert!(m["process_cpu_seconds_total"] > 0.0, "{m:?}");
    assert!(m["process_resident_memory_bytes"] > 1e6, "{m:?}");
    assert!(m["process_virtual_memory_bytes"] >= m["process_resident_memory_bytes"]);
    assert!(m["process_threads"] >= 2.0, "{m:?}");
    let open = m["process_open_fds"];
    // stdin/stdout/stderr, the listener, the journal, the ZooKeeper connection at least.
    assert!(open >= 6.0 && open < m["process_max_fds"], "{m:?}");
    let build: Vec<&String> = m
        .keys()
        .filter(|k| k.starts_with("zkguard_build_info{"))
        .collect();
    assert_eq!(build.len(), 1, "{build:?}");
    let labels = build[0];
    assert!(
        labels.starts_with(&format!(
            "zkguard_build_info{{version=\"{}\",commit=\"",
            env!("CARGO_PKG_VERSION")
        )),
        "{labels}"
    );
    let commit = labels
        .split("commit=\"")
        .nth(1)
        .unwrap()
        .trim_end_matches("\"}");
    assert!(
        commit == "unknown"
            || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{labels}"
    );
    assert_eq!(m[build[0].as_str()], 1.0);
    assert_eq!(m["zkguard_deadletters"], 0.0);

    // A patch of a document that does not exist can never apply: it is parked.
    let id = park_one(&c, &s, &index).await;
    let m = scrape(&c, &s).await;
    assert_eq!(m["zkguard_deadletters"], 1.0);
    assert_eq!(m["zkguard_deadletters_parked_total"], 1.0);
    // Still parked at the next scrape, however long after the parking.
    assert_eq!(scraped(&c, &s, "zkguard_deadletters").await, 1.0);

    let (status, v) = call(
        &c,
        Method::DELETE,
        &s.url(&format!("/v1/deadletters/{id}?reason=never%20applies")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let m = scrape(&c, &s).await;
    assert_eq!(m["zkguard_deadletters"], 0.0);
    assert_eq!(m["zkguard_deadletters_parked_total"], 1.0);
    let cpu = m["process_cpu_seconds_total"];
    assert!(cpu > 0.0, "{cpu}");
}
