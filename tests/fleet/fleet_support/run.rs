//! One fleet run: the servers, three instances, the clients, the faults in rotation (an
//! instance SIGKILLed and started again with its state directory deleted; another SIGSTOPped
//! past its session timeout and continued; the broker SIGKILLed and started again on its
//! storage), then the outcomes, the documents and the journal for the checker.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::{Client, StatusCode};
use serde_json::Value;

use super::checker::{
    check_documents, journal_violations, slow_takeovers, takeovers, Answer, Fault, FinalDoc,
    Outcome, PartitionEnd, Report, Seen, Sent,
};
use super::clients::{client, Shared, INDEX};
use super::cluster::{Instance, Servers, SESSION, WINDOW};
use super::observe::watch;

/// How long a partition of a faulted instance may take to be applied by another instance.
pub const TAKEOVER_LIMIT: Duration = Duration::from_secs(SESSION.as_secs() + 5);
/// How late the test can see a takeover: an instance refreshes its journal status every second
/// and the test scrapes every 200 ms. A measured takeover is at most this much later than the
/// real one, so a violation is a measured takeover beyond the limit plus this.
pub const OBSERVATION_DELAY: Duration = Duration::from_millis(1200);

/// What a run does.
pub struct Plan {
    /// How long the clients write at least; they go on until one kill and one pause were
    /// injected.
    pub workload: Duration,
    pub clients: usize,
    pub seed: u64,
}

/// How long a broker restart may take to be over: every instance refusing writes once the
/// broker is killed, then every instance accepting writes again once it is back. Not a timing
/// claim (they recover within about a second): a bound past which the run reports them stuck.
pub const RECOVERY_LIMIT: Duration = Duration::from_secs(60);

/// One broker restart (SIGKILL, then started again on its storage).
#[derive(Debug, Clone)]
pub struct Restart {
    /// When the broker was killed and when it was ready again, since the run's start.
    pub down: Duration,
    pub up: Duration,
    /// For each instance, how long after `up` it first acknowledged a write sent after it
    /// (`None`: not within [`RECOVERY_LIMIT`]).
    pub recovered: Vec<Option<Duration>>,
}

/// How long the journal's committed offsets may stand still, with records left to apply, before
/// the run takes the journal as it is (an applier stuck) at the end.
pub const DRAIN_STILL: Duration = Duration::from_secs(15);
/// How long the run waits at most for the journal to be applied to its end.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// The verdict, with the faults injected.
pub struct Done {
    pub report: Report,
    pub faults: Vec<Fault>,
    /// The broker restarts, one per round of faults.
    pub restarts: Vec<Restart>,
    /// Answers that break the service's contract (a 503 without `Retry-After`).
    pub odd: Vec<String>,
    pub logs: String,
    /// An instance's `/metrics` page at the end.
    pub metrics: String,
    /// `zkguard journal --json` at the end.
    pub journal: Value,
}

/// Runs the fleet under `plan` and checks it.
pub async fn run(plan: Plan) -> Done {
    let servers = Arc::new(tokio::task::spawn_blocking(Servers::start).await.unwrap());
    let mut instances = Vec::new();
    for i in 0..3 {
        instances.push(start(&servers, i, 0).await);
    }
    let bases = Arc::new(RwLock::new(
        instances.iter().map(|s| s.base.clone()).collect::<Vec<_>>(),
    ));
    let t0 = Instant::now();
    let seen = Arc::new(Mutex::new(Vec::<Seen>::new()));
    let watching = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn(watch(bases.clone(), t0, seen.clone(), watching.clone()));
    let shared = Arc::new(Shared::new(bases.clone(), t0));
    let workers: Vec<_> = (0..plan.clients)
        .map(|c| tokio::spawn(client(shared.clone(), c, plan.seed)))
        .collect();
    let (faults, restarts) = inject(&servers, &mut instances, &bases, &seen, &shared, &plan).await;
    shared.stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let sent = shared.sent.lock().unwrap().clone();
    let bases_now = bases.read().unwrap().clone();
    // The journal settled (or stuck) first: then an operation still queued waits no more.
    let (journal, listed_at) = settled_listing(&servers, t0).await;
    let wait = if settled(&journal) { "20s" } else { "1s" };
    let asked: Vec<&Sent> = sent
        .iter()
        .filter(|s| matches!(s.answer, Answer::Accepted(_) | Answer::Unknown))
        .collect();
    let outcomes = outcomes(&bases_now, &asked, wait).await;
    watching.store(true, Ordering::Relaxed);
    watcher.await.unwrap();
    let names = shared.docs.lock().unwrap().all();
    let mut report = check_history(servers.es.url(), &bases_now, &sent, &names, outcomes).await;
    let seen = seen.lock().unwrap().clone();
    report.takeovers = takeovers(&seen, &faults);
    report.violations.extend(slow_takeovers(
        &report.takeovers,
        TAKEOVER_LIMIT + OBSERVATION_DELAY,
    ));
    // Offsets committed before the listing was asked for: none may be past the ends it lists.
    let before: Vec<Seen> = seen.iter().filter(|s| s.at <= listed_at).cloned().collect();
    let applied = report.accepted + report.unknown_applied + report.unavailable_applied;
    report.violations.extend(journal_violations(
        &partition_ends(&journal),
        &before,
        applied,
    ));
    let metrics = match Client::new().get(instances[0].url("/metrics")).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(e) => format!("no /metrics: {e}"),
    };
    let kept = if report.violations.is_empty() {
        String::new()
    } else {
        keep_logs(&servers, &seen)
    };
    let logs = std::iter::once(kept)
        .chain(instances.iter().enumerate().map(|(i, s)| {
            format!(
                "--- instance {i} ({}) ---\n{}",
                s.log.display(),
                s.log_tail(30)
            )
        }))
        .collect::<Vec<_>>()
        .join("\n");
    let odd = std::mem::take(&mut *shared.odd.lock().unwrap());
    Done {
        report,
        faults,
        restarts,
        odd,
        logs,
        metrics,
        journal,
    }
}

/// Copies the instances' logs, with what the test saw of each partition (`seen.csv`: seconds,
/// instance, partition, owned here, committed offset, owner's token), to a directory the run leaves behind;
/// returns a line naming it.
fn keep_logs(servers: &Servers, seen: &[Seen]) -> String {
    let dir = std::env::temp_dir().join(format!(
        "zkguard-fleet-{}",
        servers.topic.trim_start_matches("zkguard-journal-")
    ));
    let copied = std::fs::create_dir_all(&dir).and_then(|()| {
        for entry in std::fs::read_dir(servers.dir.path())?.flatten() {
            if entry.path().extension().is_some_and(|e| e == "log") {
                std::fs::copy(entry.path(), dir.join(entry.file_name()))?;
            }
        }
        let rows: String = seen
            .iter()
            .map(|s| {
                let at = s.at.as_secs_f64();
                let (i, p, o, c) = (s.instance, s.partition, s.owned_here, s.committed);
                let t = s.token.map_or_else(String::new, |t| t.to_string());
                format!("{at:.3},{i},{p},{o},{c},{t}\n")
            })
            .collect();
        std::fs::write(dir.join("seen.csv"), rows)
    });
    match copied {
        Ok(()) => format!(
            "--- the instances' logs and seen.csv are kept in {} ---",
            dir.display()
        ),
        Err(e) => format!(
            "--- the logs could not be kept in {}: {e} ---",
            dir.display()
        ),
    }
}

/// The documents `names` as Elasticsearch holds them, checked against what was `sent` and the
/// `outcomes` (those of the writes refused with 503 `journal_unavailable` yet found applied are
/// asked here, for the tokens' order: asking those not applied would wait in vain).
async fn check_history(
    es: &str,
    bases: &[String],
    sent: &[Sent],
    names: &[String],
    mut outcomes: HashMap<String, Outcome>,
) -> Report {
    let docs = documents(es, names).await;
    let found: std::collections::HashSet<&str> = docs
        .iter()
        .flat_map(|d| d.applied.iter().map(String::as_str))
        .collect();
    let unavailable: Vec<&Sent> = sent
        .iter()
        .filter(|s| s.answer == Answer::Unavailable && found.contains(s.id.as_str()))
        .collect();
    outcomes.extend(self::outcomes(bases, &unavailable, "2s").await);
    check_documents(sent, &docs, &outcomes, WINDOW)
}

/// Whether `zkguard journal --json` lists every partition owned by a live member, with
/// nothing left to apply.
pub fn settled(listing: &Value) -> bool {
    let parts = listing["partitions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    parts.len() == super::cluster::PARTITIONS as usize
        && parts
            .iter()
            .all(|p| p["owner_live"] == true && p["lag"] == 0)
}

/// Each partition's committed and end offsets as `zkguard journal --json` lists them.
fn partition_ends(listing: &Value) -> Vec<PartitionEnd> {
    let parts = listing["partitions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    parts
        .iter()
        .map(|p| PartitionEnd {
            partition: p["partition"].as_u64().unwrap_or(u64::MAX) as u32,
            committed: p["committed_offset"].as_i64().unwrap_or(-1),
            end: p["end_offset"].as_i64().unwrap_or(-1),
        })
        .collect()
}

/// `zkguard journal --json` once it shows the journal settled (the owners commit their progress
/// a moment after the last outcome), and when (since `t0`) it was asked for. It waits as long
/// as the partitions' committed offsets move (the durable broker answers fetches slowly on a
/// busy machine, and the clients may have left a backlog), and gives up, taking the journal as
/// it is, once they stood still for [`DRAIN_STILL`] or after [`DRAIN_LIMIT`].
async fn settled_listing(servers: &Arc<Servers>, t0: Instant) -> (Value, Duration) {
    let end = Instant::now() + DRAIN_LIMIT;
    let mut progress = (i64::MIN, Instant::now());
    loop {
        let s = servers.clone();
        let asked = t0.elapsed();
        let listing = tokio::task::spawn_blocking(move || s.journal_listing())
            .await
            .unwrap();
        let committed: i64 = partition_ends(&listing).iter().map(|p| p.committed).sum();
        if committed != progress.0 {
            progress = (committed, Instant::now());
        }
        if settled(&listing) || Instant::now() > end || progress.1.elapsed() > DRAIN_STILL {
            return (listing, asked);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Starts instance `i` and waits until it is ready.
async fn start(servers: &Arc<Servers>, i: usize, n: usize) -> Instance {
    let s = servers.clone();
    let instance = tokio::task::spawn_blocking(move || s.start_instance(i, n))
        .await
        .unwrap();
    let http = Client::new();
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = http.get(instance.url("/readyz")).send().await;
        if ready.is_ok_and(|r| r.status() == StatusCode::OK) {
            return instance;
        }
        assert!(
            Instant::now() < end,
            "instance {i} not ready within 60 s:\n{}",
            instance.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The faults, in rotation until the workload's time is up: kill instance k (and delete its
/// state directory), wait for its partitions to be taken over (or the limit), start it again
/// empty; then pause instance k+1 past its session timeout and continue it; then, once its
/// partitions were taken over (so that the outage does not delay that takeover), restart the
/// broker while the clients write.
async fn inject(
    servers: &Arc<Servers>,
    instances: &mut [Instance],
    bases: &Arc<RwLock<Vec<String>>>,
    seen: &Arc<Mutex<Vec<Seen>>>,
    shared: &Shared,
    plan: &Plan,
) -> (Vec<Fault>, Vec<Restart>) {
    let t0 = shared.start;
    let mut faults = Vec::new();
    let mut restarts = Vec::new();
    let mut starts = [1usize; 3];
    let mut round = 0;
    while faults.len() < 2 || t0.elapsed() < plan.workload {
        let k = round % 3;
        tokio::time::sleep(Duration::from_secs(3)).await;
        wait_owning(seen, k, t0).await;
        instances[k].kill();
        let fault = Fault {
            instance: k,
            at: t0.elapsed(),
            kind: "kill",
        };
        faults.push(fault.clone());
        let _ = std::fs::remove_dir_all(servers.state_dir(k));
        wait_takeover(seen, &fault).await;
        instances[k] = start(servers, k, starts[k]).await;
        starts[k] += 1;
        bases.write().unwrap()[k] = instances[k].base.clone();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let p = (k + 1) % 3;
        wait_owning(seen, p, t0).await;
        instances[p].pause();
        let fault = Fault {
            instance: p,
            at: t0.elapsed(),
            kind: "pause",
        };
        faults.push(fault.clone());
        tokio::time::sleep(SESSION + Duration::from_secs(3)).await;
        instances[p].resume();
        wait_takeover(seen, &fault).await;
        // A broker whose records are in memory would lose them: not restarted.
        if super::cluster::on_kafka() && servers.kafka.is_durable() {
            restarts.push(restart_broker(servers, shared).await);
        }
        round += 1;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    (faults, restarts)
}

/// Kills the broker while the clients write, waits until every instance refused a write sent
/// after that (or [`RECOVERY_LIMIT`]), starts it again on its storage and waits until every
/// instance acknowledged a write sent after it was back (or the limit).
async fn restart_broker(servers: &Arc<Servers>, shared: &Shared) -> Restart {
    let t0 = shared.start;
    let s = servers.clone();
    let down = t0.elapsed();
    tokio::task::spawn_blocking(move || s.kafka.kill())
        .await
        .unwrap();
    let refused = |s: &Sent| s.answer == Answer::Unavailable;
    answered_by_all(shared, down, refused).await;
    let s = servers.clone();
    tokio::task::spawn_blocking(move || s.kafka.start_again())
        .await
        .unwrap()
        .expect("start the broker again on its storage");
    let up = t0.elapsed();
    let accepted = |s: &Sent| matches!(s.answer, Answer::Accepted(_));
    let recovered = answered_by_all(shared, up, accepted)
        .await
        .into_iter()
        .map(|at| at.map(|at| at.saturating_sub(up)))
        .collect();
    Restart {
        down,
        up,
        recovered,
    }
}

/// Waits until each instance gave an answer that `wanted` accepts to a request sent at or
/// after `since`, or [`RECOVERY_LIMIT`] passed; returns when each instance first did (since the
/// run's start: when the answer came for an acknowledgement, else when the request was sent).
async fn answered_by_all(
    shared: &Shared,
    since: Duration,
    wanted: impl Fn(&Sent) -> bool,
) -> Vec<Option<Duration>> {
    let end = Instant::now() + RECOVERY_LIMIT;
    loop {
        let mut first = vec![None; 3];
        for s in shared
            .sent
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.sent >= since && wanted(s))
        {
            let at = match s.answer {
                Answer::Accepted(at) => at,
                _ => s.sent,
            };
            let f: &mut Option<Duration> = &mut first[s.via];
            *f = Some(f.map_or(at, |f: Duration| f.min(at)));
        }
        if first.iter().all(Option::is_some) || Instant::now() > end {
            return first;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (30 s at most) until instance `i` has said within the last second that it owns a
/// partition: a fault then takes partitions out with it, whose takeover is measured.
async fn wait_owning(seen: &Arc<Mutex<Vec<Seen>>>, i: usize, t0: Instant) {
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end {
        let now = t0.elapsed();
        let owning = seen
            .lock()
            .unwrap()
            .iter()
            .rev()
            .take_while(|s| s.at + Duration::from_secs(1) >= now)
            .any(|s| s.instance == i && s.owned_here);
        if owning {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every partition the faulted instance owned was taken over, or the limit and
/// two seconds more passed.
async fn wait_takeover(seen: &Arc<Mutex<Vec<Seen>>>, fault: &Fault) {
    let end = Instant::now() + TAKEOVER_LIMIT + Duration::from_secs(2);
    while Instant::now() < end {
        let t = takeovers(&seen.lock().unwrap(), std::slice::from_ref(fault));
        if !t.is_empty() && t.iter().all(|t| t.by.is_some()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The outcomes of `sent`, each asked (with `?wait=`) of an instance other than the one that
/// accepted it: `wait` for one acknowledged, 2 s for the others.
async fn outcomes(bases: &[String], sent: &[&Sent], wait: &str) -> HashMap<String, Outcome> {
    let http = Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let asks = sent
        .iter()
        .filter(|s| s.answer != Answer::Refused)
        .map(|s| {
            let asked = (s.via + 1 + s.line % 2) % bases.len();
            let wait = if matches!(s.answer, Answer::Accepted(_)) {
                wait
            } else {
                "2s"
            };
            let url = format!("{}/v1/operations/{}?wait={wait}", bases[asked], s.id);
            let http = http.clone();
            let id = s.id.clone();
            async move {
                let outcome = match http.get(url).send().await {
                    Ok(r) if r.status() == StatusCode::NOT_FOUND => Outcome {
                        status: "unknown (404)".into(),
                        token: None,
                        asked,
                    },
                    Ok(r) => {
                        let v: Value = r.json().await.unwrap_or(Value::Null);
                        Outcome {
                            status: v["status"].as_str().unwrap_or("?").to_string(),
                            token: v["token"].as_u64(),
                            asked,
                        }
                    }
                    Err(e) => Outcome {
                        status: format!("no answer: {e}"),
                        token: None,
                        asked,
                    },
                };
                (id, outcome)
            }
        });
    futures::stream::iter(asks)
        .buffer_unordered(32)
        .collect()
        .await
}

/// The documents as Elasticsearch holds them.
async fn documents(es: &str, names: &[String]) -> Vec<FinalDoc> {
    let http = Client::new();
    let mut docs = Vec::with_capacity(names.len());
    for name in names {
        let r = http
            .get(format!("{es}/{INDEX}/_doc/{name}"))
            .send()
            .await
            .expect("read a document from osmem-server");
        let v: Value = r.json().await.unwrap_or(Value::Null);
        let mut source = v["_source"].clone();
        let applied = source["zkguard"]["ops"]
            .as_array()
            .map(|ops| {
                ops.iter()
                    .filter_map(|o| o.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let body = source.as_object_mut().map(|o| {
            o.remove("zkguard");
            Value::Object(o.clone())
        });
        docs.push(FinalDoc {
            doc: format!("{INDEX}/{name}"),
            body,
            applied,
        });
    }
    docs
}
