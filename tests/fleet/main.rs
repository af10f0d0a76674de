//! A fleet of `zkguard serve` on the Kafka journal loses nothing when a host dies or the
//! broker restarts.
//!
//! A tansu broker (its records in S3 on a private moto server), a 3-member ZooKeeper ensemble,
//! one osmem-server and three `zkguard serve` instances with `server.journal.backend=kafka` (6
//! partitions, 6 s sessions). Six clients send background writes (`PUT ...?type=background`) and
//! `/v1/bulk` requests on shared documents through all three instances in turn and record every
//! operation with its answer (202 accepted, 503 `journal_unavailable`, otherwise refused, or no
//! answer) and when it was sent and acknowledged. Faults, in rotation: an instance SIGKILLed,
//! its state directory deleted and the instance started again empty (a host whose disk is
//! gone); another SIGSTOPped past its session timeout, then continued (a deposed owner waking
//! up); then the broker SIGKILLed while the clients write, and started again on its storage once
//! every instance refused a write (503 with `Retry-After`).
//!
//! Afterwards `fleet_support::checker` (whose own tests feed it lost, doubled and out-of-order
//! histories) checks: every 202 applied exactly once (its id once in its document's record of
//! operations, its outcome `applied` as read from another instance than the one that accepted
//! it); a write refused with 503 `journal_unavailable` (not acknowledged, not lost) or left
//! without an answer applied at most once (its record may have been appended all the same);
//! each document's operations in acceptance order and the document equal to its last applied
//! write; tokens never decreasing in each document's order (no write by a deposed owner after
//! its successor's); each partition of a killed or paused instance applied again under a lock
//! taken after the fault (by another instance, or by the faulted one back with a new session,
//! told by the owners' fencing tokens) within the session timeout plus 5 s (from the instances'
//! `/metrics`; the broker outage is not a takeover and is not timed); every instance taking writes again after the broker
//! restart; and, once the run drained, every partition committed to its end, no end below an
//! offset committed during the run, at least one record per operation applied.
//!
//! The workload lasts one round of faults by default, one kill, one pause and one broker
//! restart (about 30 s; `ZKGUARD_FLEET_SECS`, 20 by default, sets how long the rounds go on;
//! `make torture-fleet` gives it `DURATION`), so that `make test` runs it whole in about 50 s;
//! `ZKGUARD_HISTORY_SEED` repeats the clients' random choices. `ZKGUARD_FLEET_BACKEND=file`
//! runs the instances on file journals instead, `ZKGUARD_FLEET_BROKER=memory` on a memory
//! broker (much faster than the durable one; no broker restart in either).

mod fleet_support;
#[path = "../support/deploy/promtool.rs"]
mod promtool;

use std::time::Duration;

use fleet_support::deploy;
use fleet_support::run::{run, Plan};

fn workload() -> Duration {
    let secs = std::env::var("ZKGUARD_FLEET_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    Duration::from_secs(secs)
}

fn seed() -> u64 {
    std::env::var("ZKGUARD_HISTORY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_on_the_kafka_journal_loses_nothing_across_kills_pauses_and_disk_loss() {
    let seed = seed();
    let done = run(Plan {
        workload: workload(),
        clients: 6,
        seed,
    })
    .await;
    let r = &done.report;
    println!(
        "fleet run (seed {seed}): {} operations accepted, {} refused, {} refused with journal_unavailable ({} of them applied), {} unknown ({} of them applied), {} documents; faults: {:?}",
        r.accepted,
        r.refused,
        r.unavailable,
        r.unavailable_applied,
        r.unknown,
        r.unknown_applied,
        r.documents,
        done.faults
    );
    for b in &done.restarts {
        println!(
            "broker killed at {:?}, back at {:?}; each instance's first 202 after it: {:?}",
            b.down, b.up, b.recovered
        );
    }
    for t in &r.takeovers {
        println!(
            "takeover of partition {} after the {} of instance {}: {:?}",
            t.partition, t.fault.kind, t.fault.instance, t.by
        );
    }
    let mut problems: Vec<String> = Vec::new();
    if r.accepted == 0 {
        problems.push("no operation was accepted".into());
    }
    for b in &done.restarts {
        if b.recovered.iter().any(Option::is_none) {
            problems.push(format!(
                "an instance took no write within {:?} of the broker's restart (killed at {:?}, back at {:?}): {:?}",
                fleet_support::run::RECOVERY_LIMIT, b.down, b.up, b.recovered
            ));
        }
    }
    problems.extend(done.odd.iter().take(5).cloned());
    for fault in &done.faults {
        if !r.takeovers.iter().any(|t| t.fault == *fault) {
            problems.push(format!(
                "no partition was seen owned by instance {} before its {}: its /metrics showed no owned partition",
                fault.instance, fault.kind
            ));
        }
    }
    // Every metric the fleet's alerts and dashboard name is on a live instance's page.
    let dashboard: serde_json::Value =
        serde_json::from_str(&deploy::read(deploy::DASHBOARD)).unwrap();
    let mut named = deploy::metric_names(&deploy::read(deploy::RULES));
    for q in deploy::dashboard_queries(&dashboard) {
        named.extend(deploy::metric_names(&q));
    }
    for name in named {
        if !done
            .metrics
            .lines()
            .any(|l| l.starts_with(&format!("{name}{{")))
        {
            problems.push(format!(
                "{name} (named by the fleet's alerts or dashboard) is not on /metrics"
            ));
        }
    }
    // The owners' tokens, which tell a takeover's new lock from the old one, are on the page for
    // every partition (each has been claimed by the end).
    for p in 0..fleet_support::cluster::PARTITIONS {
        let series = format!("zkguard_journal_partition_token{{partition=\"{p}\"}} ");
        if !done.metrics.lines().any(|l| l.starts_with(&series)) {
            problems.push(format!("no {series}on /metrics"));
        }
    }
    // `zkguard journal` lists every partition, each owned by a live member, nothing left to apply.
    let parts = done.journal["partitions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let healthy = parts.len() == fleet_support::cluster::PARTITIONS as usize
        && parts
            .iter()
            .all(|p| p["owner_live"] == true && p["lag"] == 0);
    if !healthy {
        problems.push(format!(
            "zkguard journal --json at the end: {}",
            done.journal
        ));
    }
    let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
    for v in &r.violations {
        let kind = format!("{v:?}");
        let kind = kind
            .split([' ', '{'])
            .next()
            .unwrap_or_default()
            .to_string();
        *kinds.entry(kind).or_default() += 1;
    }
    if !r.violations.is_empty() {
        let shown: Vec<String> = r
            .violations
            .iter()
            .take(20)
            .map(|v| v.to_string())
            .collect();
        problems.push(format!(
            "{} violations {kinds:?} (first 20):\n{}",
            r.violations.len(),
            shown.join("\n")
        ));
    }
    assert!(
        problems.is_empty(),
        "{}\n{}",
        problems.join("\n"),
        done.logs
    );
}

#[test]
fn the_fleet_alerts_pass_promtool_are_tested_both_ways_and_documented() {
    deploy::check_alerts();
}

#[test]
fn every_query_of_the_fleet_dashboard_is_valid_promql() {
    deploy::check_dashboard();
}

#[test]
fn the_fleet_kubernetes_manifests_validate_and_keep_nothing_per_pod() {
    deploy::check_kubernetes();
}
