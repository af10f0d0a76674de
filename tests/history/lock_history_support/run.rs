//! One run: sessions and workers of this process, `zkguard exec` processes, the fault schedule,
//! the final state of ZooKeeper and Elasticsearch, and the checker's verdict.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zkguard::testkit::{OsmemServer, Partition};
use zkguard::ZkSession;

use super::checker::{check, Report};
use super::children::{ChildEnv, ChildSpec};
use super::faults::{Cluster, FaultCtx, Observer, SessionHandle};
use super::history::{Class, Ev, FaultKind, Recorder};
use super::workers::{worker, Es, WorkerCtx};
use crate::common::{uuid_tag, zk_settings};
use zkguard::testkit::proxy::ZkProxy;

/// What a run does.
pub struct Plan {
    pub name: &'static str,
    /// The faults, injected in this order, round after round, each followed by a quiet gap.
    pub faults: Vec<FaultKind>,
    /// One session of this process per entry, connected to these servers.
    pub session_servers: Vec<String>,
    /// Whether the sessions go through a proxy and a partition (cuts, expiry).
    pub cuttable: bool,
    pub workers_per_session: usize,
    /// How many `zkguard exec` processes run at a time (besides those the faults start).
    pub child_slots: usize,
    pub monitors: usize,
    pub session_timeout: Duration,
    /// How long the workload runs at least; it runs on until each fault was injected once.
    pub workload: Duration,
    pub quiet_gap: Duration,
}

/// The duration of a run's workload: `ZKGUARD_TORTURE_SECS` (split between the runs of the
/// test, `share` being this run's part), or `default` when unset.
pub fn workload(default: Duration, share: f64) -> Duration {
    match std::env::var("ZKGUARD_TORTURE_SECS") {
        Ok(s) if !s.trim().is_empty() => {
            let secs: f64 = s.trim().parse().expect("ZKGUARD_TORTURE_SECS: seconds");
            Duration::from_secs_f64((secs * share).max(1.0))
        }
        _ => default,
    }
}

/// The seed of the run's random choices: `ZKGUARD_HISTORY_SEED`, or a fresh one (printed).
pub fn seed() -> u64 {
    std::env::var("ZKGUARD_HISTORY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen())
}

/// Runs `plan` against `cluster` and `es`; returns the checker's report.
pub async fn run(plan: Plan, cluster: &Cluster, es: &OsmemServer) -> Report {
    let seed = seed();
    eprintln!(
        "[{}] seed {seed} (ZKGUARD_HISTORY_SEED), workload {:?}",
        plan.name, plan.workload
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let rec = Recorder::default();
    let tag = uuid_tag();
    let lock_root = format!("/zkguard-history/{}-{tag}", plan.name);
    let es = Es::new(es.url(), &format!("history-{}-{tag}", plan.name));
    es.create_index().await;
    let monitors: Arc<Vec<String>> =
        Arc::new((0..plan.monitors).map(|i| format!("m{i}")).collect());
    let dir = tempfile::tempdir().unwrap();
    let direct = cluster.connect_string();
    let children =
        (plan.child_slots > 0 || plan.faults.iter().any(|k| needs_children(*k))).then(|| {
            ChildEnv::new(
                dir.path(),
                &direct,
                &lock_root,
                plan.session_timeout,
                &es.url,
                &es.index,
            )
        });

    let mut sessions = Vec::new();
    for (i, servers) in plan.session_servers.iter().enumerate() {
        let (partition, proxy, via) = if plan.cuttable {
            let partition = Partition::start(servers).expect("partition");
            let proxy = ZkProxy::start(partition.connect_string());
            let via = proxy.connect_string();
            (Some(partition), Some(proxy), via)
        } else {
            (None, None, servers.clone())
        };
        let mut settings = zk_settings(&via, "unused");
        settings.lock_root = lock_root.clone();
        settings.session_timeout = plan.session_timeout;
        let session = ZkSession::connect(&settings)
            .await
            .expect("connect to ZooKeeper");
        sessions.push(SessionHandle {
            client: format!("s{i}"),
            session,
            proxy,
            partition,
            holding: Arc::new(AtomicUsize::new(0)),
        });
    }

    let observer = Arc::new(Observer::new(&direct));
    let stop = Arc::new(AtomicBool::new(false));
    let ctx = WorkerCtx {
        rec: rec.clone(),
        es: es.clone(),
        monitors: monitors.clone(),
        stop: stop.clone(),
        foreground_timeout: Duration::from_secs(3),
        background_timeout: Duration::from_secs(6),
        observer: observer.clone(),
        lock_root: lock_root.clone(),
    };
    let mut tasks = Vec::new();
    for s in &sessions {
        for _ in 0..plan.workers_per_session {
            tasks.push(tokio::spawn(worker(
                ctx.clone(),
                s.client.clone(),
                s.session.clone(),
                s.holding.clone(),
                rng.gen(),
            )));
        }
    }
    let children = children.map(Arc::new);
    for _ in 0..plan.child_slots {
        let (env, rec, stop, monitors) = (
            children.clone().unwrap(),
            rec.clone(),
            stop.clone(),
            monitors.clone(),
        );
        let mut rng = StdRng::seed_from_u64(rng.gen());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Acquire) {
                let spec = ChildSpec {
                    monitor: monitors[rng.gen_range(0..monitors.len())].clone(),
                    class: if rng.gen_bool(0.5) {
                        Class::Foreground
                    } else {
                        Class::Background
                    },
                    hold_ms: rng.gen_range(20..200),
                    writes: rng.gen_range(1..=3),
                    timeout: Duration::from_secs(5),
                };
                env.spawn(&rec, spec).finish(&rec).await;
            }
        }));
    }

    // The fault schedule.
    let faults = FaultCtx {
        rec: &rec,
        cluster,
        sessions: &sessions,
        children: children.as_deref(),
        observer: &observer,
        lock_root: &lock_root,
        monitors: &monitors,
        session_timeout: plan.session_timeout,
    };
    let started = Instant::now();
    let mut injected: std::collections::BTreeMap<FaultKind, usize> = Default::default();
    let mut round = 0usize;
    'schedule: loop {
        for &kind in &plan.faults {
            let all_once = plan
                .faults
                .iter()
                .all(|k| injected.get(k).copied().unwrap_or(0) > 0);
            let elapsed = started.elapsed();
            if (elapsed >= plan.workload && all_once) || elapsed >= plan.workload * 3 {
                break 'schedule;
            }
            tokio::time::sleep(plan.quiet_gap).await;
            let ok = match kind {
                FaultKind::CutBeforeApplied => faults.cut(&mut rng, false).await,
                FaultKind::CutAfterApplied => faults.cut(&mut rng, true).await,
                FaultKind::SessionExpiry => faults.expire_session(&mut rng).await,
                FaultKind::PausedProcess => faults.pause_process(&mut rng, round % 2 == 0).await,
                FaultKind::KilledProcess => faults.kill_process(&mut rng).await,
                FaultKind::RestartedZooKeeper => faults.restart_zookeeper().await,
                FaultKind::KilledLeader => faults.kill_leader().await,
                FaultKind::IsolatedFollower => faults.isolate_follower(&mut rng).await,
            };
            *injected.entry(kind).or_default() += usize::from(ok);
            eprintln!(
                "[{}] {:>6.1}s {}{}",
                plan.name,
                started.elapsed().as_secs_f64(),
                kind.name(),
                if ok { "" } else { " (did not take effect)" }
            );
        }
        round += 1;
    }
    tokio::time::sleep(plan.quiet_gap).await;
    stop.store(true, Ordering::Release);
    for t in tasks {
        t.await.expect("a contender panicked");
    }

    // Nothing left: first the nodes of this process's live sessions (every contender is done),
    // then, once every session is closed or expired, any node at all.
    let live: Vec<i64> = sessions
        .iter()
        .filter_map(|s| s.session.session_id())
        .collect();
    let left = settle(&observer, &lock_root, Duration::from_secs(10), |owner| {
        live.contains(&owner)
    })
    .await;
    rec.now(Ev::Leftovers {
        stage: "by live sessions once every contender was done".into(),
        nodes: left,
    });
    for s in &sessions {
        s.session.close_and_wait(Duration::from_secs(5)).await;
    }
    let limit = plan.session_timeout * 2 + Duration::from_secs(10);
    let left = settle(&observer, &lock_root, limit, |_| true).await;
    rec.now(Ev::Leftovers {
        stage: "once every session was closed or expired".into(),
        nodes: left,
    });
    for m in monitors.iter() {
        let version = es.version(m).await;
        rec.now(Ev::FinalVersion {
            doc: m.clone(),
            version,
        });
    }
    drop(sessions);
    let events = rec.events();
    if let Ok(dir) = std::env::var("ZKGUARD_HISTORY_DUMP") {
        let path = std::path::Path::new(&dir).join(format!("{}-{tag}.history", plan.name));
        let text: String = events
            .iter()
            .map(|e| format!("{} {:?}\n", e.at, e.ev))
            .collect();
        std::fs::write(&path, text).expect("write the history");
        eprintln!("[{}] history written to {}", plan.name, path.display());
    }
    let report = check(&events);
    eprintln!(
        "{}",
        report.counts.render(&format!(
            "{} ({:.0} s)",
            plan.name,
            started.elapsed().as_secs_f64()
        ))
    );
    for note in &report.notes {
        eprintln!("[{}] {note}", plan.name);
    }
    for (kind, n) in &injected {
        assert!(*n > 0, "[{}] {} never took effect", plan.name, kind.name());
    }
    report
}

fn needs_children(kind: FaultKind) -> bool {
    matches!(kind, FaultKind::PausedProcess | FaultKind::KilledProcess)
}

/// The lock nodes under `root` whose ephemeral owner `counts`, polled until there are none or
/// `limit` passed; returns what was left at the last look.
async fn settle(
    observer: &Observer,
    root: &str,
    limit: Duration,
    counts: impl Fn(i64) -> bool,
) -> Vec<String> {
    let end = Instant::now() + limit;
    loop {
        let left: Option<Vec<String>> = observer.lock_nodes(root).await.map(|nodes| {
            nodes
                .into_iter()
                .filter(|(_, owner)| counts(*owner))
                .map(|(path, owner)| format!("{path} (session {owner:#x})"))
                .collect()
        });
        match left {
            Some(left) if left.is_empty() || Instant::now() >= end => return left,
            None if Instant::now() >= end => return vec![format!("{root}: could not be listed")],
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}
