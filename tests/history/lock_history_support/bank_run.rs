//! The bank run: accounts in osmem-server, a `zkguard serve` with the gate on, depositors
//! writing through the gate and `/v1` in every way the service takes a write, the faults
//! (the service SIGKILLed and started again on its state, coordinators killed with it,
//! ZooKeeper killed and paused), then the outcomes decided after their answer and the final
//! documents for [`check_bank`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};
use zkguard::testkit::ZkServer;

use super::bank::{check_bank, BankHistory, BankReport, Outcome, Via, Write, INITIAL};
use crate::common::uuid_tag;
use crate::serve_support::{Env, Service};

/// What a bank run does.
pub struct BankPlan {
    pub accounts: usize,
    pub depositors: usize,
    /// How long the depositors write at least; they go on until every fault was injected.
    pub workload: Duration,
    /// The pause between two faults.
    pub quiet_gap: Duration,
}

/// The service's two addresses, which change at every start.
struct Endpoints {
    api: String,
    gate: String,
}

struct Ctx {
    http: Client,
    ends: RwLock<Endpoints>,
    index: String,
    accounts: Vec<String>,
    writes: Mutex<Vec<Write>>,
    /// Transactions sent and not answered yet: a service kill while there are some kills
    /// their coordinators mid-transaction.
    txns_in_flight: AtomicUsize,
    stop: AtomicBool,
}

/// An HTTP exchange as the history sees it.
pub(super) enum Reply {
    Answered(StatusCode, Value),
    /// The connection was refused: the request never left.
    NotSent,
    /// The request left and no answer came back.
    Lost(String),
}

/// The errors that the gate (docs/gateway.md, "Errors the gate answers itself") and `/v1`
/// (docs/serve.md, "Foreground") answer with a 5xx when nothing was written (a lost lock's
/// only when it was lost before the write was sent: [`nothing_written`]).
const NOTHING_WRITTEN: [&str; 6] = [
    "zkguard_lock_unavailable_exception",
    "zkguard_lock_lost_exception",
    "zkguard_shutting_down_exception",
    "lock_unavailable",
    "lock_lost",
    "lock_timeout",
];

impl Reply {
    /// The outcome of a single write answered so: 2xx done; 4xx, a 5xx whose error says that
    /// nothing was written, or never sent: not done; anything else unknown.
    pub(super) fn outcome(&self) -> Outcome {
        match self {
            Reply::Answered(s, _) if s.is_success() => Outcome::Acked,
            Reply::Answered(s, _) if s.is_client_error() => Outcome::Failed,
            Reply::Answered(_, v) if nothing_written(v) => Outcome::Failed,
            Reply::NotSent => Outcome::Failed,
            _ => Outcome::Unknown,
        }
    }

    fn summary(&self) -> String {
        match self {
            Reply::Answered(s, v) => format!("{} {}", s.as_u16(), error_type(v)),
            Reply::NotSent => "not sent".into(),
            Reply::Lost(e) => format!("lost: {e}"),
        }
    }
}

/// The `_version` (the fencing token) of a 2xx answer.
fn version(r: &Reply) -> Option<u64> {
    match r {
        Reply::Answered(s, v) if s.is_success() => v["_version"].as_u64(),
        _ => None,
    }
}

/// Whether a 5xx answer `v` says that nothing was written: its error is one of
/// [`NOTHING_WRITTEN`], and a lost lock's was lost before the write was sent (the gate's and
/// `/v1`'s reasons say so). A lock lost while the write was under way answers the same type,
/// but the cluster took the write: it may be in the document.
fn nothing_written(v: &Value) -> bool {
    let kind = error_type(v);
    let reason = v["error"]["reason"].as_str().or(v["message"].as_str());
    NOTHING_WRITTEN.contains(&kind)
        && (!kind.contains("lock_lost") || reason.is_some_and(|r| r.contains("before the write")))
}

/// The error type of an answer: Elasticsearch's `error.type` or `/v1`'s `error`.
fn error_type(v: &Value) -> &str {
    let e = &v["error"];
    e["type"].as_str().or(e.as_str()).unwrap_or("")
}

/// The innermost cause of a failed request (the URL left out): "connection closed before
/// message completed", "operation timed out".
fn root(e: &reqwest::Error) -> String {
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    if e.is_timeout() {
        "timed out".into()
    } else {
        cause.to_string()
    }
}

impl Ctx {
    fn api(&self, path: &str) -> String {
        format!("{}{path}", self.ends.read().unwrap().api)
    }

    fn gate(&self, path: &str) -> String {
        format!("{}{path}", self.ends.read().unwrap().gate)
    }

    async fn send(
        &self,
        method: Method,
        url: String,
        body: Option<String>,
        h: &[(&str, &str)],
    ) -> Reply {
        let mut req = self.http.request(method, &url);
        if let Some(b) = body {
            let ct = if url.contains("_bulk") || url.ends_with("/v1/bulk") {
                "application/x-ndjson"
            } else {
                "application/json"
            };
            req = req.header("content-type", ct).body(b);
        }
        for (k, v) in h {
            req = req.header(*k, *v);
        }
        match req.send().await {
            Ok(r) => {
                let status = r.status();
                match r.bytes().await {
                    Ok(b) => {
                        Reply::Answered(status, serde_json::from_slice(&b).unwrap_or(Value::Null))
                    }
                    Err(e) => Reply::Lost(format!("{status}, body: {}", root(&e))),
                }
            }
            Err(e) if e.is_connect() => {
                // The service is down or starting: wait a little rather than spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
                Reply::NotSent
            }
            Err(e) => Reply::Lost(root(&e)),
        }
    }

    fn record(
        &self,
        via: Via,
        key: &str,
        parts: Vec<(String, i64)>,
        tokens: Vec<Option<u64>>,
        outcome: Outcome,
        answer: String,
    ) {
        self.writes.lock().unwrap().push(Write {
            via,
            key: key.to_string(),
            parts,
            tokens,
            outcome,
            answer,
        });
    }

    /// Two different accounts.
    fn pair(&self, rng: &mut StdRng) -> (String, String) {
        let a = rng.gen_range(0..self.accounts.len());
        let b = (a + rng.gen_range(1..self.accounts.len())) % self.accounts.len();
        (self.accounts[a].clone(), self.accounts[b].clone())
    }

    fn account(&self, rng: &mut StdRng) -> String {
        self.accounts[rng.gen_range(0..self.accounts.len())].clone()
    }
}

/// A gate `_update` with a partial document.
async fn gate_update(ctx: &Ctx, key: &str, rng: &mut StdRng) {
    let (acct, amount) = (ctx.account(rng), rng.gen_range(1..10));
    let url = ctx.gate(&format!("/{}/_update/{acct}", ctx.index));
    let body = json!({"doc": {"credits": {key: amount}, "last": key}}).to_string();
    let r = ctx.send(Method::POST, url, Some(body), &[]).await;
    ctx.record(
        Via::GateUpdate,
        key,
        vec![(acct, amount)],
        vec![version(&r)],
        r.outcome(),
        r.summary(),
    );
}

/// A plain `_bulk` of two `update` items on two accounts, each its own deposit.
async fn gate_bulk(ctx: &Ctx, key: &str, rng: &mut StdRng) {
    let (a, b) = ctx.pair(rng);
    let items: Vec<(String, String, i64)> = [a, b]
        .into_iter()
        .enumerate()
        .map(|(i, acct)| (format!("{key}i{i}"), acct, rng.gen_range(1..10)))
        .collect();
    let body: String = items
        .iter()
        .map(|(k, acct, amount)| {
            format!(
                "{}\n{}\n",
                json!({"update": {"_index": ctx.index, "_id": acct}}),
                json!({"doc": {"credits": {k: amount}, "last": k}})
            )
        })
        .collect();
    let r = ctx
        .send(Method::POST, ctx.gate("/_bulk"), Some(body), &[])
        .await;
    for (i, (k, acct, amount)) in items.into_iter().enumerate() {
        let (outcome, answer, token) = match &r {
            Reply::Answered(s, v) if s.is_success() => {
                let item = &v["items"][i]["update"];
                let status = item["status"].as_u64().unwrap_or(0);
                let outcome = match status {
                    200..=299 => Outcome::Acked,
                    400..=499 => Outcome::Failed,
                    _ => Outcome::Unknown,
                };
                let answer = format!(
                    "item {status} {}",
                    item["error"]["type"].as_str().unwrap_or("")
                );
                (outcome, answer, item["_version"].as_u64())
            }
            other => (other.outcome(), other.summary(), None),
        };
        let token = token.filter(|_| outcome == Outcome::Acked);
        ctx.record(
            Via::GateBulk,
            &k,
            vec![(acct, amount)],
            vec![token],
            outcome,
            answer,
        );
    }
}

/// Reads an account through the gate and writes it back with `if_seq_no`/`if_primary_term`,
/// its balance raised.
async fn gate_rmw(ctx: &Ctx, key: &str, rng: &mut StdRng) {
    let (acct, amount) = (ctx.account(rng), rng.gen_range(1..10));
    let read = ctx
        .send(
            Method::GET,
            ctx.gate(&format!("/{}/_doc/{acct}", ctx.index)),
            None,
            &[],
        )
        .await;
    let Reply::Answered(StatusCode::OK, doc) = read else {
        return;
    };
    let mut source = doc["_source"].clone();
    // Sent back as read: the gate drops a client's zkguard object.
    if rng.gen_bool(0.5) {
        source.as_object_mut().unwrap().remove("zkguard");
    }
    let balance = source["balance"].as_i64().unwrap_or(i64::MIN);
    source["balance"] = json!(balance + amount);
    source["rmw"][key] = json!(amount);
    source["last"] = json!(key);
    let url = ctx.gate(&format!(
        "/{}/_doc/{acct}?if_seq_no={}&if_primary_term={}",
        ctx.index, doc["_seq_no"], doc["_primary_term"]
    ));
    let r = ctx
        .send(Method::PUT, url, Some(source.to_string()), &[])
        .await;
    ctx.record(
        Via::GateRmw,
        key,
        vec![(acct, amount)],
        vec![version(&r)],
        r.outcome(),
        r.summary(),
    );
}

/// A transfer through the gate's atomic `_bulk` (id: the key) or `POST /v1/transactions`.
async fn transfer(ctx: &Ctx, via: Via, key: &str, rng: &mut StdRng) {
    let (from, to) = ctx.pair(rng);
    let amount = rng.gen_range(1..10);
    let parts = vec![(from, -amount), (to, amount)];
    ctx.txns_in_flight.fetch_add(1, Ordering::SeqCst);
    let r = if via == Via::AtomicBulk {
        let body: String = parts
            .iter()
            .map(|(acct, amount)| {
                format!(
                    "{}\n{}\n",
                    json!({"update": {"_index": ctx.index, "_id": acct}}),
                    json!({"doc": {"credits": {key: amount}, "last": key}})
                )
            })
            .collect();
        let h = [("x-zkguard-atomic", "true"), ("idempotency-key", key)];
        ctx.send(Method::POST, ctx.gate("/_bulk"), Some(body), &h)
            .await
    } else {
        let ops: Vec<Value> = parts
            .iter()
            .map(|(acct, amount)| {
                json!({"action": "update", "index": ctx.index, "id": acct,
                       "doc": {"credits": {key: amount}, "last": key}})
            })
            .collect();
        let body = json!({"id": key, "operations": ops}).to_string();
        ctx.send(Method::POST, ctx.api("/v1/transactions"), Some(body), &[])
            .await
    };
    ctx.txns_in_flight.fetch_sub(1, Ordering::SeqCst);
    let outcome = match &r {
        Reply::Answered(StatusCode::OK, v) if via == Via::AtomicBulk && v["errors"] == true => {
            let statuses: Vec<u64> = v["items"]
                .as_array()
                .map(|items| {
                    items
                        .iter()
                        .filter_map(|i| i["update"]["status"].as_u64())
                        .collect()
                })
                .unwrap_or_default();
            if statuses.iter().any(|s| *s >= 500) {
                Outcome::Unknown
            } else {
                Outcome::Failed
            }
        }
        Reply::Answered(StatusCode::OK, v) if via == Via::V1Txn => match v["state"].as_str() {
            Some("committed") => Outcome::Acked,
            Some("rolled-back") => Outcome::Failed,
            _ => Outcome::Unknown,
        },
        other => other.outcome(),
    };
    let tokens = parts
        .iter()
        .enumerate()
        .map(|(i, (acct, _))| match &r {
            Reply::Answered(StatusCode::OK, v) if outcome == Outcome::Acked => {
                if via == Via::AtomicBulk {
                    v["items"][i]["update"]["_version"].as_u64()
                } else {
                    v["documents"].as_array().and_then(|docs| {
                        docs.iter()
                            .find(|d| d["id"] == acct.as_str())
                            .and_then(|d| d["_version"].as_u64())
                    })
                }
            }
            _ => None,
        })
        .collect();
    ctx.record(via, key, parts, tokens, outcome, r.summary());
}

/// `PATCH /v1/indices/{index}/docs/{id}` with the key as `op_id`.
async fn v1_patch(ctx: &Ctx, key: &str, rng: &mut StdRng) {
    let (acct, amount) = (ctx.account(rng), rng.gen_range(1..10));
    let url = ctx.api(&format!(
        "/v1/indices/{}/docs/{acct}?op_id={key}",
        ctx.index
    ));
    let body = json!({"credits": {key: amount}, "last": key}).to_string();
    let r = ctx.send(Method::PATCH, url, Some(body), &[]).await;
    let token = match &r {
        Reply::Answered(StatusCode::OK, v) => v["token"].as_u64(),
        _ => None,
    };
    ctx.record(
        Via::V1Patch,
        key,
        vec![(acct, amount)],
        vec![token],
        r.outcome(),
        r.summary(),
    );
}

/// `POST /v1/bulk` of two background updates, each with its key as `op_id`.
async fn v1_background(ctx: &Ctx, key: &str, rng: &mut StdRng) {
    let (a, b) = ctx.pair(rng);
    let lines: Vec<(String, String, i64)> = [a, b]
        .into_iter()
        .enumerate()
        .map(|(i, acct)| (format!("{key}l{i}"), acct, rng.gen_range(1..10)))
        .collect();
    let body: String = lines
        .iter()
        .map(|(k, acct, amount)| {
            json!({"action": "update", "index": ctx.index, "id": acct, "op_id": k,
                   "doc": {"credits": {k: amount}, "last": k}})
            .to_string()
                + "\n"
        })
        .collect();
    let r = ctx
        .send(Method::POST, ctx.api("/v1/bulk"), Some(body), &[])
        .await;
    let outcome = match &r {
        Reply::Answered(StatusCode::ACCEPTED, _) => Outcome::Acked,
        Reply::Answered(s, _) if s.is_success() => Outcome::Unknown,
        other => other.outcome(),
    };
    for (k, acct, amount) in lines {
        ctx.record(
            Via::V1Background,
            &k,
            vec![(acct, amount)],
            vec![None],
            outcome,
            r.summary(),
        );
    }
}

/// One depositor: random writes of every kind until told to stop.
async fn depositor(ctx: Arc<Ctx>, n: usize, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut i = 0;
    while !ctx.stop.load(Ordering::SeqCst) {
        i += 1;
        let via = Via::ALL[rng.gen_range(0..Via::ALL.len())];
        let key = format!("c{n}-{i}");
        match via {
            Via::GateUpdate => gate_update(&ctx, &key, &mut rng).await,
            Via::GateBulk => gate_bulk(&ctx, &key, &mut rng).await,
            Via::GateRmw => gate_rmw(&ctx, &key, &mut rng).await,
            Via::AtomicBulk | Via::V1Txn => transfer(&ctx, via, &key, &mut rng).await,
            Via::V1Patch => v1_patch(&ctx, &key, &mut rng).await,
            Via::V1Background => v1_background(&ctx, &key, &mut rng).await,
        }
    }
}

/// The service of the run: started again on the same journal and dead-letter file after
/// every kill, each start with a log of its own.
struct Services {
    env: Env,
    current: Option<Service>,
    starts: usize,
    /// The log file of every start, in order.
    logs: Vec<std::path::PathBuf>,
}

impl Services {
    /// Every other start's recovery waits 10 s instead of 2 s before it takes up a stopped
    /// transaction: the previous kill's transactions then meet the depositors' writes first
    /// (they wait only for the dead session's locks, 2 s), which must settle the marks they
    /// find before writing, and recovery comes after them. Issue 49's defect (a writer keeping
    /// a committed transaction's mark, recovery then rewriting the document over the
    /// acknowledged write) shows only in this race.
    fn start(&mut self, ctx: &Ctx) {
        self.starts += 1;
        let recovery_after = if self.starts % 2 == 0 {
            "10000"
        } else {
            "2000"
        };
        for (key, value) in &mut self.env.extra {
            if key == "ZKGUARD_TXN_RECOVERY_AFTER" {
                *value = recovery_after.to_string();
            }
        }
        let s = self.env.start(&format!("bank-{}", self.starts));
        self.logs.push(s.log.clone());
        *ctx.ends.write().unwrap() = Endpoints {
            api: s.base.clone(),
            gate: format!("http://{}", s.started["gateway"].as_str().unwrap()),
        };
        self.current = Some(s);
    }
}

/// The faults, one after another with a quiet gap before each, until the workload's end and
/// every kind was injected once; counted in `faults`.
async fn faults(
    ctx: &Ctx,
    services: &mut Services,
    zk: &ZkServer,
    plan: &BankPlan,
    faults: &mut std::collections::BTreeMap<&'static str, usize>,
    rng: &mut StdRng,
) {
    let end = Instant::now() + plan.workload;
    let mut round = 0;
    while Instant::now() < end || round < 3 {
        tokio::time::sleep(plan.quiet_gap).await;
        match round % 3 {
            0 => {
                // Kill it while a transaction is on its way, when one comes soon.
                let wait = Instant::now() + Duration::from_secs(3);
                while ctx.txns_in_flight.load(Ordering::SeqCst) == 0 && Instant::now() < wait {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                // At some point of its way: locking, logging, applying, committing, clearing.
                let point = rng.gen_range(0..80);
                tokio::time::sleep(Duration::from_millis(point)).await;
                let in_flight = ctx.txns_in_flight.load(Ordering::SeqCst);
                // Dropping the service SIGKILLs its process.
                drop(services.current.take().expect("a service runs"));
                *faults
                    .entry("zkguard serve SIGKILLed and started again")
                    .or_default() += 1;
                *faults
                    .entry("transactions in flight at a service kill")
                    .or_default() += in_flight;
                tokio::time::sleep(Duration::from_millis(rng.gen_range(100..800))).await;
                tokio::task::block_in_place(|| services.start(ctx));
            }
            1 => {
                tokio::task::block_in_place(|| zk.kill());
                *faults
                    .entry("ZooKeeper SIGKILLed and started again")
                    .or_default() += 1;
                tokio::time::sleep(Duration::from_millis(rng.gen_range(500..1500))).await;
                tokio::task::block_in_place(|| zk.start_again()).expect("start ZooKeeper again");
            }
            _ => {
                tokio::task::block_in_place(|| zk.pause());
                *faults
                    .entry("ZooKeeper paused (SIGSTOP) and continued")
                    .or_default() += 1;
                // Past the service's session timeout (2 s) half of the time.
                tokio::time::sleep(Duration::from_millis(rng.gen_range(1000..3500))).await;
                tokio::task::block_in_place(|| zk.resume());
            }
        }
        round += 1;
    }
}

/// The final status of every background operation, waited for (bounded).
async fn background_outcomes(ctx: &Ctx, keys: &[String]) -> HashMap<String, (String, Option<u64>)> {
    let mut out = HashMap::new();
    let end = Instant::now() + Duration::from_secs(120);
    for key in keys {
        let status = loop {
            let url = ctx.api(&format!("/v1/operations/{key}?wait=5s"));
            match ctx.send(Method::GET, url, None, &[]).await {
                Reply::Answered(StatusCode::OK, v) if v["status"] != "queued" => {
                    break (
                        v["status"].as_str().unwrap_or("?").to_string(),
                        v["token"].as_u64(),
                    )
                }
                Reply::Answered(StatusCode::NOT_FOUND, _) => break ("unknown".to_string(), None),
                _ if Instant::now() > end => break ("queued".to_string(), None),
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        out.insert(key.clone(), status);
    }
    out
}

/// The decision of every transaction, waited for while recovery has not decided it (bounded).
async fn decisions(ctx: &Ctx, ids: &[String]) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let end = Instant::now() + Duration::from_secs(90);
    for id in ids {
        let decision = loop {
            let r = ctx
                .send(
                    Method::GET,
                    ctx.api(&format!("/v1/transactions/{id}")),
                    None,
                    &[],
                )
                .await;
            match r {
                Reply::Answered(StatusCode::OK, v) => match v["state"].as_str() {
                    Some("committed" | "finished") => break "committed".to_string(),
                    Some("rolled-back") => break "rolled-back".to_string(),
                    _ if Instant::now() > end => break "undecided".to_string(),
                    _ => {}
                },
                Reply::Answered(StatusCode::NOT_FOUND, _) => break "unknown".to_string(),
                _ if Instant::now() > end => break "undecided".to_string(),
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        out.insert(id.clone(), decision);
    }
    out
}

/// The accounts' sources straight from the cluster, once no account carries a transaction's
/// mark (recovery clears them) or after a bounded wait.
async fn final_documents(ctx: &Ctx, es: &str) -> HashMap<String, Value> {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let mut docs = HashMap::new();
        for acct in &ctx.accounts {
            let url = format!("{es}/{}/_doc/{acct}", ctx.index);
            let doc: Value = ctx
                .http
                .get(url)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            docs.insert(acct.clone(), doc["_source"].clone());
        }
        let marked = docs.values().any(|d| d["zkguard"].get("txn").is_some());
        if !marked || Instant::now() > end {
            return docs;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// How often, by the service's logs, a writer found a stopped transaction's mark under its lock
/// and finished or undid it there, and the service's recovery decided a transaction; `files` are
/// the logs of its starts.
fn settlements(files: &[std::path::PathBuf]) -> String {
    let mut logs = String::new();
    for file in files {
        logs += &std::fs::read_to_string(file).unwrap_or_default();
    }
    let count = |what: &str| logs.lines().filter(|l| l.contains(what)).count();
    format!(
        "marks of stopped transactions finished by a later writer {}, undone by a later writer \
         {}; transactions decided by recovery {}",
        count("finishing a committed transaction's write found under the lock"),
        count("undoing another transaction's write found under the lock"),
        logs.lines()
            .filter(|l| l.contains("multi::recover") && l.contains(" recovered"))
            .count()
    )
}

/// Creates the index and the accounts, straight in the cluster.
async fn open_accounts(http: &Client, es: &str, index: &str, accounts: &[String]) {
    let stored = json!({"type": "object", "enabled": false});
    let mapping = json!({"mappings": {"properties": {
        "credits": stored, "rmw": stored, "zkguard": stored, "balance": {"type": "long"}}}});
    let r = http
        .put(format!("{es}/{index}"))
        .json(&mapping)
        .send()
        .await
        .unwrap();
    assert!(
        r.status().is_success(),
        "create {index}: {}",
        r.text().await.unwrap()
    );
    for acct in accounts {
        let doc = json!({"balance": INITIAL, "credits": {}, "rmw": {}});
        let r = http
            .put(format!("{es}/{index}/_doc/{acct}?refresh=true"))
            .json(&doc)
            .send()
            .await
            .unwrap();
        assert!(
            r.status().is_success(),
            "open {acct}: {}",
            r.text().await.unwrap()
        );
    }
}

/// Runs the bank against `zk` and the cluster at `es`; returns the checker's report.
pub async fn run_bank(plan: BankPlan, zk: &ZkServer, es: &str, seed: u64) -> BankReport {
    let mut rng = StdRng::seed_from_u64(seed);
    let tag = uuid_tag();
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let env = Env {
        zk: zk.connect_string(),
        es: es.to_string(),
        root: format!("/zkguard-bank/{tag}"),
        dir: dir.clone(),
        extra: [
            ("ZKGUARD_SERVER_GATEWAY_LISTEN", "127.0.0.1:0".to_string()),
            // A 2 s session, so that ZooKeeper's pauses of 1 to 3.5 s expire it (a fault).
            ("ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT", "2000".to_string()),
            ("ZKGUARD_TXN_RECOVERY_AFTER", "2000".to_string()),
            // Every 4th transaction's coordinator stops once its log says committed, as one
            // killed between the commit and clearing its marks (debug builds of zkguard): the
            // depositors' writes meet its marks and must finish it before writing.
            ("ZKGUARD_TEST_HOOK_TXN_STOP", "4@committed".to_string()),
            // For the counts of marks settled and transactions recovered (`settlements`).
            ("RUST_LOG", "warn,zkguard::txn::multi=info".to_string()),
            ("ZKGUARD_TXN_LOG_INDEX", format!("bank-txn-log-{tag}")),
            (
                "ZKGUARD_SERVER_JOURNAL_PATH",
                dir.path().join("bank.journal").display().to_string(),
            ),
            (
                "ZKGUARD_DEADLETTER_FILE_PATH",
                dir.path().join("bank.dlq").display().to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
        args: Vec::new(),
        open_files: None,
        file_size: None,
    };
    let http = Client::builder()
        .timeout(Duration::from_secs(45))
        .build()
        .unwrap();
    let accounts: Vec<String> = (0..plan.accounts).map(|i| format!("acct{i}")).collect();
    let index = format!("bank-{tag}");
    open_accounts(&http, es, &index, &accounts).await;
    let ctx = Arc::new(Ctx {
        http,
        ends: RwLock::new(Endpoints {
            api: String::new(),
            gate: String::new(),
        }),
        index,
        accounts,
        writes: Mutex::new(Vec::new()),
        txns_in_flight: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
    });
    let mut services = Services {
        env,
        current: None,
        starts: 0,
        logs: Vec::new(),
    };
    tokio::task::block_in_place(|| services.start(&ctx));
    let tasks: Vec<_> = (0..plan.depositors)
        .map(|n| tokio::spawn(depositor(ctx.clone(), n, rng.gen())))
        .collect();
    let mut history = BankHistory::default();
    faults(
        &ctx,
        &mut services,
        zk,
        &plan,
        &mut history.faults,
        &mut rng,
    )
    .await;
    ctx.stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    history.writes = std::mem::take(&mut *ctx.writes.lock().unwrap());
    let of = |pick: fn(Via) -> bool| -> Vec<String> {
        history
            .writes
            .iter()
            .filter(|w| pick(w.via))
            .map(|w| w.key.clone())
            .collect()
    };
    let (bg, txns) = (of(|v| v == Via::V1Background), of(Via::is_txn));
    for (key, (status, token)) in background_outcomes(&ctx, &bg).await {
        if let Some(t) = token {
            history.background_tokens.insert(key.clone(), t);
        }
        history.background.insert(key, status);
    }
    history.decisions = decisions(&ctx, &txns).await;
    let finals = final_documents(&ctx, es).await;
    let report = check_bank(&history, &finals);
    eprintln!(
        "[bank] seed {seed}, workload {:?}, faults injected:",
        plan.workload
    );
    for (kind, n) in &history.faults {
        eprintln!("  {kind}: {n}");
    }
    eprintln!("{report}");
    eprintln!("  from the service's logs: {}", settlements(&services.logs));
    if !report.violations.is_empty() {
        // Keep the service's logs, journal and dead letters for whoever reads the failure.
        let kept = dir.path().display().to_string();
        std::mem::forget(dir);
        eprintln!("[bank] the service's files are kept in {kept}");
    }
    report
}
