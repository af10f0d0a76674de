//! `zkguard bench --gateway`: the same writes sent straight to the cluster and through the
//! Elasticsearch-compatible gate of `zkguard serve`, side by side.
//!
//! - **foreground index**: `clients` concurrent clients index documents one request at a time
//!   (`PUT /{index}/_doc/{id}`) on `docs` shared documents: latency per write, p50 and p99;
//! - **bulk**: `bulk_docs` documents indexed in `_bulk` requests of `bulk_size` items from
//!   `clients` concurrent senders, through the gate under the background lock: documents per
//!   second, from the first request sent until the last answered;
//! - **service bulk**: the same documents as background operations of the service's own API,
//!   `POST /v1/bulk` requests of `bulk_size` lines from `clients` senders: documents per second,
//!   from the first request sent until the journal holds no unfinished operation, every one of
//!   them applied (the service's metrics).
//!
//! Both targets run in turns (straight, gate, straight, gate) on the same documents, so that
//! the machine's noise falls on both; every write must succeed (a failed item fails the run).
//! Before them, warm-up rounds of each run unmeasured, the gate's until ZooKeeper's JIT
//! compilers are done (as in `zkguard bench --service`): only the gate's writes use ZooKeeper,
//! so a server still compiling its hot code would slow the gate alone.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zkguard::config::Settings;

use super::measure::RequestCounter;
use super::service_bench::{
    background_applied, journal_empty, latencies, start_served, JitWatch, MAX_WARMUP_RUNS,
    SERVERS_WARM,
};

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct GatewayPlan {
    /// Concurrent clients.
    pub clients: u32,
    /// Shared documents of the foreground writes.
    pub docs: u32,
    /// Foreground writes per target and round.
    pub saves: u32,
    /// Documents per target and round of the bulk figure.
    pub bulk_docs: u32,
    /// Items per `_bulk` request.
    pub bulk_size: u32,
    /// The ZooKeeper server's process id, when known: the warm-up then lasts until its JIT
    /// compilers are done.
    pub zk_pid: Option<u32>,
}

/// Measured rounds per target (after one warm-up round each).
pub const ROUNDS: u32 = 2;

/// The figures.
#[derive(Debug, Clone)]
pub struct GatewayReport {
    /// The plan.
    pub plan: GatewayPlan,
    /// Foreground latency straight to the cluster, p50 and p99.
    pub straight: (Duration, Duration),
    /// Foreground latency through the gate, p50 and p99.
    pub gate: (Duration, Duration),
    /// Bulk documents per second straight to the cluster.
    pub straight_bulk: f64,
    /// Bulk documents per second through the gate.
    pub gate_bulk: f64,
    /// Bulk documents per second as background operations of `POST /v1/bulk`, until applied.
    pub service_bulk: f64,
    /// Unmeasured warm-up rounds of the gate.
    pub warmup_runs: u32,
    /// ZooKeeper requests per document of the gate's bulk, when counted (`mntr`).
    pub gate_bulk_zk: Option<f64>,
    /// ZooKeeper requests per document of the service's bulk, when counted (`mntr`).
    pub service_bulk_zk: Option<f64>,
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0 * 100.0).round() / 100.0
}

impl GatewayReport {
    /// Foreground p50 through the gate over straight.
    pub fn fg_ratio(&self) -> f64 {
        self.gate.0.as_secs_f64() / self.straight.0.as_secs_f64().max(1e-9)
    }

    /// Bulk throughput through the gate over straight.
    pub fn bulk_ratio(&self) -> f64 {
        self.gate_bulk / self.straight_bulk.max(1e-9)
    }

    /// Background bulk through the service's `/v1/bulk` over straight.
    pub fn service_bulk_ratio(&self) -> f64 {
        self.service_bulk / self.straight_bulk.max(1e-9)
    }

    /// One flat JSON object.
    pub fn to_json(&self) -> Value {
        json!({
            "clients": self.plan.clients,
            "docs": self.plan.docs,
            "saves": self.plan.saves * ROUNDS,
            "bulk_docs": self.plan.bulk_docs * ROUNDS,
            "bulk_size": self.plan.bulk_size,
            "warmup_runs": self.warmup_runs,
            "build": if cfg!(debug_assertions) { "debug" } else { "release" },
            "straight_fg_p50_ms": ms(self.straight.0),
            "straight_fg_p99_ms": ms(self.straight.1),
            "gateway_fg_p50_ms": ms(self.gate.0),
            "gateway_fg_p99_ms": ms(self.gate.1),
            "straight_bulk_docs_per_sec": self.straight_bulk.round(),
            "gateway_bulk_docs_per_sec": self.gate_bulk.round(),
            "service_bulk_docs_per_sec": self.service_bulk.round(),
            "gateway_bulk_zk_requests_per_doc": self.gate_bulk_zk.map(|r| (r * 100.0).round() / 100.0),
            "service_bulk_zk_requests_per_doc": self.service_bulk_zk.map(|r| (r * 100.0).round() / 100.0),
            "service_over_straight_bulk": (self.service_bulk_ratio() * 100.0).round() / 100.0,
            "gateway_over_straight_fg_p50": (self.fg_ratio() * 100.0).round() / 100.0,
            "gateway_over_straight_bulk": (self.bulk_ratio() * 100.0).round() / 100.0,
        })
    }

    /// A table for people.
    pub fn table(&self) -> String {
        let p = &self.plan;
        format!(
            "zkguard bench --gateway: {} clients, {} documents, {} foreground writes and {} bulk documents per target ({} per _bulk), {} build\n\
             \n\
             {:<28} {:>12} {:>12}\n\
             {:<28} {:>12.2} {:>12.2}\n\
             {:<28} {:>12.2} {:>12.2}\n\
             {:<28} {:>12.0} {:>12.0}\n\
             {:<28} {:>12} {:>12.0}  (background, POST /v1/bulk, until applied)\n\
             {:<28} {:>12} {:>12}  (gate bulk / service bulk)\n\
             ({} unmeasured warm-up rounds of the gate)\n\
             \n\
             foreground p50 through the gate: {:.2}x straight (goal: at most 1.5x)\n\
             bulk through the gate: {:.2}x straight (goal: at least 0.5x)\n\
             background bulk through zkguard serve's /v1/bulk: {:.2}x straight (goal: at least 0.5x)\n",
            p.clients,
            p.docs,
            p.saves * ROUNDS,
            p.bulk_docs * ROUNDS,
            p.bulk_size,
            if cfg!(debug_assertions) { "debug" } else { "release" },
            "",
            "straight",
            "gateway",
            "foreground index p50 (ms)",
            ms(self.straight.0),
            ms(self.gate.0),
            "foreground index p99 (ms)",
            ms(self.straight.1),
            ms(self.gate.1),
            "bulk documents per second",
            self.straight_bulk,
            self.gate_bulk,
            "service bulk documents/s",
            "",
            self.service_bulk,
            "ZooKeeper requests per doc",
            self.gate_bulk_zk.map_or("-".into(), |r| format!("{r:.2}")),
            self.service_bulk_zk.map_or("-".into(), |r| format!("{r:.2}")),
            self.warmup_runs,
            self.fg_ratio(),
            self.bulk_ratio(),
            self.service_bulk_ratio(),
        )
    }
}

/// Runs both targets against `settings`' ZooKeeper and Elasticsearch.
///
/// # Errors
/// The service did not start, or a write failed (the message says which and why).
pub async fn run(settings: Settings, plan: GatewayPlan) -> Result<GatewayReport, String> {
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let mut settings = settings;
    settings.zookeeper.lock_root = format!("/zkguard-bench-gateway/{tag}");
    let served = start_served(&settings, plan.clients, true).await?;
    let gate = served
        .gateway
        .clone()
        .ok_or("zkguard serve did not start its gate")?;
    let straight = settings
        .elasticsearch
        .urls
        .first()
        .map(|u| u.as_str().trim_end_matches('/').to_string())
        .ok_or("no elasticsearch.url")?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(plan.clients as usize * 2)
        .build()
        .map_err(|e| e.to_string())?;
    let index = format!("bench-gateway-{tag}");
    let bulk_index = format!("bench-gateway-bulk-{tag}");
    for i in [&index, &bulk_index] {
        let r = http
            .put(format!("{straight}/{i}"))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !r.status().is_success() {
            return Err(format!("creating index {i} answered {}", r.status()));
        }
    }
    let targets = [straight.as_str(), gate.as_str()];
    // Warm-up: connections open, the servers' code paths hot.
    foreground(&http, &straight, &index, plan, plan.saves.min(200)).await?;
    bulk(
        &http,
        &straight,
        &bulk_index,
        plan,
        plan.bulk_docs.min(2000),
    )
    .await?;
    let mut warmup_runs = 0;
    for run in 1..=MAX_WARMUP_RUNS {
        warmup_runs = run;
        let jit = JitWatch::start(plan.zk_pid);
        foreground(&http, &gate, &index, plan, plan.saves.min(1000)).await?;
        bulk(&http, &gate, &bulk_index, plan, plan.bulk_docs.min(5000)).await?;
        if jit.warm(run, SERVERS_WARM, 2, "gateway warm-up run") {
            break;
        }
    }
    service_bulk(
        &http,
        &served.base,
        &bulk_index,
        plan,
        plan.bulk_docs.min(2000),
    )
    .await?;
    let mut fg = [Vec::new(), Vec::new()];
    let mut docs_per_sec = [0.0f64; 3];
    // The ZooKeeper requests of the gate's and the service's bulk rounds (straight: none).
    let counter = RequestCounter::new(&settings, None);
    let mut zk: [Option<f64>; 2] = [Some(0.0), Some(0.0)];
    let mut count = |k: usize, before: Option<u64>, after: Option<u64>, docs: u32| {
        zk[k] = zk[k]
            .zip(counter.per_cycle(before, after, docs))
            .map(|(sum, r)| sum + r / f64::from(ROUNDS));
    };
    for _ in 0..ROUNDS {
        for (k, t) in targets.iter().enumerate() {
            fg[k].extend(foreground(&http, t, &index, plan, plan.saves).await?);
        }
        for (k, t) in targets.iter().enumerate() {
            let before = counter.read().await;
            let started = Instant::now();
            bulk(&http, t, &bulk_index, plan, plan.bulk_docs).await?;
            docs_per_sec[k] += f64::from(plan.bulk_docs) / started.elapsed().as_secs_f64();
            if k == 1 {
                count(0, before, counter.read().await, plan.bulk_docs);
            }
        }
        let before = counter.read().await;
        let started = Instant::now();
        service_bulk(&http, &served.base, &bulk_index, plan, plan.bulk_docs).await?;
        docs_per_sec[2] += f64::from(plan.bulk_docs) / started.elapsed().as_secs_f64();
        count(1, before, counter.read().await, plan.bulk_docs);
    }
    let [gate_bulk_zk, service_bulk_zk] = zk;
    drop(served);
    let [straight_fg, gate_fg] = fg;
    Ok(GatewayReport {
        plan,
        straight: latencies(straight_fg),
        gate: latencies(gate_fg),
        straight_bulk: docs_per_sec[0] / f64::from(ROUNDS),
        gate_bulk: docs_per_sec[1] / f64::from(ROUNDS),
        service_bulk: docs_per_sec[2] / f64::from(ROUNDS),
        warmup_runs,
        gate_bulk_zk,
        service_bulk_zk,
    })
}

/// `saves` foreground writes from `plan.clients` clients; their latencies.
async fn foreground(
    http: &reqwest::Client,
    base: &str,
    index: &str,
    plan: GatewayPlan,
    saves: u32,
) -> Result<Vec<Duration>, String> {
    let per = (saves / plan.clients).max(1);
    let mut tasks = Vec::new();
    for c in 0..plan.clients {
        let (http, base, index) = (http.clone(), base.to_string(), index.to_string());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::with_capacity(per as usize);
            for i in 0..per {
                let d = (c.wrapping_mul(7919).wrapping_add(i)) % plan.docs;
                let t = Instant::now();
                let r = http
                    .put(format!("{base}/{index}/_doc/{d}"))
                    .header("content-type", "application/json")
                    .body(json!({"client": c, "n": i}).to_string())
                    .send()
                    .await
                    .map_err(|e| format!("{base}: {e}"))?;
                let status = r.status();
                let body = r.bytes().await.unwrap_or_default();
                if !status.is_success() {
                    return Err(format!(
                        "{base} answered {status} to an index: {}",
                        String::from_utf8_lossy(&body)
                    ));
                }
                out.push(t.elapsed());
            }
            Ok::<_, String>(out)
        }));
    }
    super::measure::joined(tasks).await
}

/// Sends `docs` documents to `url` in NDJSON requests of `plan.bulk_size` documents from
/// `plan.clients` concurrent senders: `line(d, from)` is document `d`'s line(s) in the request
/// that starts at `from`; `check` reads each answer. `lock_type` goes in the gate's
/// `X-Zkguard-Lock-Type` header.
async fn in_requests<L, C, Fut>(
    http: &reqwest::Client,
    url: String,
    lock_type: Option<&'static str>,
    plan: GatewayPlan,
    docs: u32,
    line: L,
    check: C,
) -> Result<(), String>
where
    L: Fn(u32, u32) -> String + Clone + Send + 'static,
    C: Fn(reqwest::Response) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let requests: Vec<(u32, u32)> = (0..docs)
        .step_by(plan.bulk_size as usize)
        .map(|from| (from, (from + plan.bulk_size).min(docs)))
        .collect();
    let queue = std::sync::Arc::new(std::sync::Mutex::new(requests.into_iter()));
    let mut tasks = Vec::new();
    for _ in 0..plan.clients {
        let (http, url, queue, line, check) = (
            http.clone(),
            url.clone(),
            queue.clone(),
            line.clone(),
            check.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let next = queue.lock().unwrap_or_else(|p| p.into_inner()).next();
                let Some((from, to)) = next else {
                    return Ok::<_, String>(());
                };
                let body: String = (from..to).map(|d| line(d, from)).collect();
                let mut request = http
                    .post(&url)
                    .header("content-type", "application/x-ndjson");
                if let Some(lock_type) = lock_type {
                    request = request.header("x-zkguard-lock-type", lock_type);
                }
                let r = request
                    .body(body)
                    .send()
                    .await
                    .map_err(|e| format!("{url}: {e}"))?;
                check(r).await?;
            }
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// `docs` documents in `_bulk` requests of `plan.bulk_size` from `plan.clients` senders.
async fn bulk(
    http: &reqwest::Client,
    base: &str,
    index: &str,
    plan: GatewayPlan,
    docs: u32,
) -> Result<(), String> {
    let index = index.to_string();
    let line = move |d: u32, from: u32| {
        format!(
            "{{\"index\":{{\"_index\":\"{index}\",\"_id\":\"{d}\"}}}}\n{{\"n\":{d},\"at\":{from}}}\n"
        )
    };
    let at = base.to_string();
    let check = move |r: reqwest::Response| {
        let at = at.clone();
        async move {
            let status = r.status();
            let answer: Value = r.json().await.unwrap_or_default();
            if status.is_success() && answer["errors"] == false {
                return Ok(());
            }
            let first = answer["items"]
                .as_array()
                .and_then(|items| {
                    items.iter().find(|i| {
                        i.as_object()
                            .and_then(|o| o.values().next())
                            .is_some_and(|v| v.get("error").is_some())
                    })
                })
                .cloned()
                .unwrap_or(answer);
            Err(format!("{at} answered {status} to a _bulk: {first}"))
        }
    };
    let url = format!("{base}/_bulk");
    in_requests(http, url, Some("background"), plan, docs, line, check).await
}

/// `docs` documents as background operations of `POST /v1/bulk` requests of `plan.bulk_size`
/// lines from `plan.clients` senders, until the service applied every one of them.
async fn service_bulk(
    http: &reqwest::Client,
    base: &str,
    index: &str,
    plan: GatewayPlan,
    docs: u32,
) -> Result<(), String> {
    let applied_before = background_applied(http, base).await?;
    let index = index.to_string();
    let line = move |d: u32, from: u32| {
        format!(
            "{{\"action\":\"index\",\"index\":\"{index}\",\"id\":\"{d}\",\"doc\":{{\"n\":{d},\"at\":{from}}}}}\n"
        )
    };
    let check = |r: reqwest::Response| async move {
        let status = r.status();
        if status == reqwest::StatusCode::ACCEPTED {
            return Ok(());
        }
        let text = r.text().await.unwrap_or_default();
        Err(format!("/v1/bulk answered {status}: {text}"))
    };
    let url = format!("{base}/v1/bulk");
    in_requests(http, url, None, plan, docs, line, check).await?;
    // Until every accepted operation is finished (the journal holds no unfinished one).
    while !journal_empty(http, base).await? {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let applied = background_applied(http, base).await? - applied_before;
    if applied != u64::from(docs) {
        return Err(format!(
            "zkguard serve applied {applied} of {docs} background operations (see its dead letters)"
        ));
    }
    Ok(())
}
