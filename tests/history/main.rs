//! The ZooKeeper priority lock, checked over recorded histories of real runs with faults.
//!
//! Sessions of this process and `zkguard exec` processes contend on a few monitors, foreground
//! and background mixed, and write each monitor's document in Elasticsearch (osmem-server) with
//! their fencing token as external version (`external_gte`), while faults are injected:
//!
//! - against a standalone ZooKeeper: a session's connection cut right before the server got a
//!   request and right after it applied one, a session cut off until the server expired it, a
//!   holder process stopped (SIGSTOP) past its session timeout and continued, a holder process
//!   killed (SIGKILL) and another started in its place, and the server killed and started again
//!   on the same data directory;
//! - against a 3-member ensemble: the leader killed and started again, and a follower isolated
//!   from its peers (while it goes on serving its clients) past the session timeout.
//!
//! Every call for a lock, grant (with its token), end of hold, release, write (with
//! Elasticsearch's answer, 409 included) and fault (with its window) is recorded on one
//! monotonic clock. The checker (`lock_history_support::checker`, whose own tests show it
//! catching each kind of violation) then asserts over the history:
//!
//! - no two holds of one monitor overlap, except where the stale holder was inside a fault's
//!   window (paused, cut off, its server killed), and then its writes that came after the newer
//!   holder's were rejected;
//! - tokens are unique per monitor and grow with the order of acquisitions;
//! - Elasticsearch accepted no write with a token lower than one it had already accepted, each
//!   409 had a higher token behind it, and each document's final `_version` is the highest
//!   accepted token;
//! - outside every fault window a background contender never took the lock ahead of a
//!   foreground contender that had queued before it and was still waiting;
//! - nothing is left in ZooKeeper: no queue node or `privateLock` of a live session once every
//!   contender is done, none at all once the sessions are closed or expired.
//!
//! Priority is judged in ZooKeeper's order where it can be: right after each grant a contender
//! of this process reads the creation zxid of the queue node that got it the lock, and a
//! background hold whose take (its token) came after that zxid, while the foreground contender
//! still waited, is an overtake. For `zkguard exec` contenders it is judged by time: the
//! foreground one must have queued at least `checker::PRIORITY_MARGIN` before the background
//! one can have taken the lock (see the checker's documentation). `lock_history_support::race`
//! pins down the overtake the history once found: a background contender that had just read the
//! queue took the mutex without verifying it, ahead of a foreground contender queued in between.
//!
//! The bank run (`bank_through_the_gate_and_v1_under_service_and_zookeeper_faults`) checks the
//! same way what `zkguard serve` acknowledges: depositors write accounts through the gate and
//! `/v1` in every way the service takes a write while the service is SIGKILLed and ZooKeeper
//! killed and paused, and `lock_history_support::bank` finds every acknowledged write in the
//! final documents (docs/testing.md, "The history test").
//!
//! The two lock runs take about 40 seconds each (longer if a fault has not been injected yet), one
//! after the other (they share the machine's two cores with four ZooKeeper servers). `make torture DURATION=600` runs them for as long as asked
//! (`ZKGUARD_TORTURE_SECS`, split between the three runs) and prints the counts of operations and faults;
//! `ZKGUARD_HISTORY_SEED` repeats a run's random choices (not their timing), and
//! `ZKGUARD_HISTORY_DUMP=DIR` writes each history there, one event per line.

#[path = "../support/cli.rs"]
mod cli;
#[path = "../support/common/mod.rs"]
mod common;
mod lock_history_support;
#[path = "../support/common/logs.rs"]
mod logs;
#[path = "../support/common/process.rs"]
mod process;
#[path = "../support/common/queue.rs"]
mod queue;
#[path = "../support/serve/launch.rs"]
mod serve_support;

use std::sync::OnceLock;
use std::time::Duration;

use lock_history_support::bank_run::{run_bank, BankPlan};
use lock_history_support::checker::Report;
use lock_history_support::faults::Cluster;
use lock_history_support::history::FaultKind;
use lock_history_support::run::{run, seed, workload, Plan};
use zkguard::testkit::{OsmemServer, ZkEnsemble, ZkServer};

/// The runs share one osmem-server (each writes an index of its own) and take turns: the
/// fault schedule is timed, and two runs at once would starve each other's servers.
fn osmem() -> &'static OsmemServer {
    static ES: OnceLock<OsmemServer> = OnceLock::new();
    ES.get_or_init(|| {
        OsmemServer::start().expect("start osmem-server (run scripts/install-deps.sh)")
    })
}

static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn assert_clean(name: &str, report: &Report) {
    assert!(
        report.violations.is_empty(),
        "[{name}] the checker found {} violation(s):\n{}",
        report.violations.len(),
        report.violations.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_against_a_standalone_zookeeper_under_faults() {
    logs::init_tracing();
    let _turn = TURN.lock().await;
    let es = tokio::task::spawn_blocking(osmem).await.unwrap();
    let zk = tokio::task::spawn_blocking(|| ZkServer::builder().tick_time(500).start())
        .await
        .unwrap()
        .expect("start ZooKeeper (run scripts/install-deps.sh)");
    let cluster = Cluster::Standalone(zk);
    let servers = cluster.connect_string();
    let plan = Plan {
        name: "standalone",
        faults: vec![
            FaultKind::CutBeforeApplied,
            FaultKind::PausedProcess,
            FaultKind::CutAfterApplied,
            FaultKind::SessionExpiry,
            FaultKind::KilledProcess,
            FaultKind::RestartedZooKeeper,
        ],
        session_servers: vec![servers; 4],
        cuttable: true,
        workers_per_session: 2,
        child_slots: 2,
        monitors: 3,
        session_timeout: Duration::from_millis(2000),
        workload: workload(Duration::from_secs(30), 1.0 / 3.0),
        quiet_gap: Duration::from_millis(1500),
    };
    let report = run(plan, &cluster, es).await;
    assert_clean("standalone", &report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_against_an_ensemble_under_leader_kills_and_isolation() {
    logs::init_tracing();
    let _turn = TURN.lock().await;
    let es = tokio::task::spawn_blocking(osmem).await.unwrap();
    let ensemble = tokio::task::spawn_blocking(|| {
        ZkEnsemble::builder()
            .size(3)
            .tick_time(500)
            // A follower cut off from its peers serves its clients for 5 s.
            .limits(10, 10)
            .cuttable_peer_links()
            .start()
    })
    .await
    .unwrap()
    .expect("start a 3-member ensemble (run scripts/install-deps.sh)");
    // One session on each member (so that the member killed or isolated has one) and one on
    // the whole ensemble.
    let mut session_servers: Vec<String> =
        (0..3).map(|i| ensemble.member_connect_string(i)).collect();
    session_servers.push(ensemble.connect_string());
    let cluster = Cluster::Ensemble(ensemble);
    let plan = Plan {
        name: "ensemble",
        faults: vec![FaultKind::KilledLeader, FaultKind::IsolatedFollower],
        session_servers,
        cuttable: false,
        workers_per_session: 2,
        child_slots: 1,
        monitors: 3,
        session_timeout: Duration::from_millis(3000),
        workload: workload(Duration::from_secs(25), 1.0 / 3.0),
        quiet_gap: Duration::from_millis(2000),
    };
    let report = run(plan, &cluster, es).await;
    assert_clean("ensemble", &report);
}

/// The bank through `zkguard serve`: depositors write accounts through the gate (`_update`,
/// plain `_bulk`, read-modify-write `PUT` with `if_seq_no`, transfers as atomic `_bulk`s) and
/// through `/v1` (merge patches, transfers as `POST /v1/transactions`, background `/v1/bulk`
/// operations), while the service is SIGKILLed and started again on its journal (killing the
/// coordinators of the transactions in flight) and ZooKeeper is killed and paused. The checker
/// (`lock_history_support::bank`, shown able to fail in `bank_tests`) finds every acknowledged
/// write in the final documents, no write answered as failed, every transfer all or nothing,
/// every background operation applied or parked and no transaction's mark left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bank_through_the_gate_and_v1_under_service_and_zookeeper_faults() {
    logs::init_tracing();
    let _turn = TURN.lock().await;
    let es = tokio::task::spawn_blocking(osmem).await.unwrap();
    let zk = tokio::task::spawn_blocking(|| ZkServer::builder().tick_time(500).start())
        .await
        .unwrap()
        .expect("start ZooKeeper (run scripts/install-deps.sh)");
    let plan = BankPlan {
        accounts: 5,
        depositors: 6,
        workload: workload(Duration::from_secs(45), 1.0 / 3.0),
        quiet_gap: Duration::from_secs(3),
    };
    let report = run_bank(plan, &zk, es.url(), seed()).await;
    assert!(
        report.violations.is_empty(),
        "[bank] the checker found {} violation(s):\n{}",
        report.violations.len(),
        report.violations.join("\n")
    );
}
