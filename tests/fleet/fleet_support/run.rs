//! One fleet run: the servers, three instances, the clients, the faults in rotation (an
//! instance SIGKILLed and started again with its state directory deleted; another SIGSTOPped
//! past its session timeout and continued), then the outcomes and the documents for the
//! checker.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::{Client, StatusCode};
use serde_json::Value;

use super::checker::{
    check_documents, slow_takeovers, takeovers, Answer, Fault, FinalDoc, Outcome, Report, Seen,
    Sent,
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

/// The verdict, with the faults injected.
pub struct Done {
    pub report: Report,
    pub faults: Vec<Fault>,
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
    let faults = inject(&servers, &mut instances, &bases, &seen, &plan, t0).await;
    shared.stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let sent = shared.sent.lock().unwrap().clone();
    let bases_now = bases.read().unwrap().clone();
    // The journal settled (or 20 s passed) first: then an operation still queued waits no more.
    let journal = settled_listing(&servers).await;
    let wait = if settled(&journal) { "20s" } else { "1s" };
    let outcomes = outcomes(&bases_now, &sent, wait).await;
    watching.store(true, Ordering::Relaxed);
    watcher.await.unwrap();
    let names = shared.docs.lock().unwrap().all();
    let docs = documents(servers.es.url(), &names).await;
    let mut report = check_documents(&sent, &docs, &outcomes, WINDOW);
    let seen = seen.lock().unwrap().clone();
    report.takeovers = takeovers(&seen, &faults);
    report.violations.extend(slow_takeovers(
        &report.takeovers,
        TAKEOVER_LIMIT + OBSERVATION_DELAY,
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
    Done {
        report,
        faults,
        logs,
        metrics,
        journal,
    }
}

/// Copies the instances' logs, with what the test saw of each partition (`seen.csv`: seconds,
/// instance, partition, owned here, committed offset), to a directory the run leaves behind;
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
                format!("{at:.3},{i},{p},{o},{c}\n")
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

/// `zkguard journal --json` once it shows the journal settled, or after 20 s as it is then (the
/// owners commit their progress a moment after the last outcome).
async fn settled_listing(servers: &Arc<Servers>) -> Value {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let s = servers.clone();
        let listing = tokio::task::spawn_blocking(move || s.journal_listing())
            .await
            .unwrap();
        if settled(&listing) || Instant::now() > end {
            return listing;
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
/// empty; then pause instance k+1 past its session timeout and continue it.
async fn inject(
    servers: &Arc<Servers>,
    instances: &mut [Instance],
    bases: &Arc<RwLock<Vec<String>>>,
    seen: &Arc<Mutex<Vec<Seen>>>,
    plan: &Plan,
    t0: Instant,
) -> Vec<Fault> {
    let mut faults = Vec::new();
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
        faults.push(Fault {
            instance: p,
            at: t0.elapsed(),
            kind: "pause",
        });
        tokio::time::sleep(SESSION + Duration::from_secs(3)).await;
        instances[p].resume();
        round += 1;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    faults
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

/// Every sent operation's outcome, each asked (with `?wait=`) of an instance other than the
/// one that accepted it.
async fn outcomes(bases: &[String], sent: &[Sent], wait: &str) -> HashMap<String, Outcome> {
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
