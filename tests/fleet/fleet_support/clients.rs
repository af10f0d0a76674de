//! The clients: each sends background writes (`PUT ...?type=background`) and `/v1/bulk`
//! requests of 2 to 5 lines on shared documents, one request after another, turning through
//! the three instances, and records every operation with its answer. A 503 is followed by the
//! pause its `Retry-After` asks for (at most a second), as a client should.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

use super::checker::{Answer, Sent};
use super::cluster::{CLIENT_TIMEOUT, PARTITIONS, WINDOW};

/// The index every client writes.
pub const INDEX: &str = "fleet";
/// Documents written at one time; a document that got `WINDOW - 50` operations is retired and
/// a new one takes its place, so that every document's record holds all its operations.
const LIVE_DOCS: usize = 16;

/// The journal partition of document `doc` of [`INDEX`] (that of its monitor).
fn partition_of(doc: &str) -> usize {
    let monitor = zkguard::lock::document_monitor(INDEX, doc);
    zkguard::write::deadletter::kafka::partition_for(monitor.as_bytes(), PARTITIONS as usize)
}

/// The documents in use and how many operations each got.
#[derive(Default)]
pub struct Docs {
    live: Vec<String>,
    counts: HashMap<String, usize>,
    next: usize,
}

impl Docs {
    /// Fills the live documents up to [`LIVE_DOCS`], each new one in the partition with the
    /// fewest live documents: every partition keeps receiving operations, so that the takeover
    /// of each is seen by its new owner's progress. (Taken in name order, `d48` to `d63` are
    /// all in partitions 2 to 5: while they were the live documents, partitions 0 and 1 got
    /// nothing to apply, and their takeovers were seen only once later documents came.)
    fn refill(&mut self) {
        let mut per_partition = vec![0usize; PARTITIONS as usize];
        for doc in &self.live {
            per_partition[partition_of(doc)] += 1;
        }
        while self.live.len() < LIVE_DOCS {
            let least = (0..per_partition.len())
                .min_by_key(|p| per_partition[*p])
                .unwrap_or(0);
            let doc = loop {
                let doc = format!("d{}", self.next);
                self.next += 1;
                if partition_of(&doc) == least {
                    break doc;
                }
            };
            per_partition[least] += 1;
            self.live.push(doc);
        }
    }

    /// A live document, counting one more operation on it.
    fn pick(&mut self, rng: &mut StdRng) -> String {
        self.refill();
        let i = rng.gen_range(0..self.live.len());
        let doc = self.live[i].clone();
        let n = self.counts.entry(doc.clone()).or_default();
        *n += 1;
        if *n >= WINDOW - 50 {
            self.live.swap_remove(i);
        }
        doc
    }

    /// Every document ever written.
    pub fn all(&self) -> Vec<String> {
        let mut all: Vec<String> = self.counts.keys().cloned().collect();
        all.sort();
        all
    }
}

/// What the clients share.
pub struct Shared {
    pub bases: Arc<RwLock<Vec<String>>>,
    pub start: Instant,
    pub sent: Mutex<Vec<Sent>>,
    pub docs: Mutex<Docs>,
    pub stop: AtomicBool,
    /// Answers that break the service's own contract (a 503 without `Retry-After`).
    pub odd: Mutex<Vec<String>>,
    requests: AtomicU64,
}

impl Shared {
    pub fn new(bases: Arc<RwLock<Vec<String>>>, start: Instant) -> Self {
        Shared {
            bases,
            start,
            sent: Mutex::new(Vec::new()),
            docs: Mutex::new(Docs::default()),
            stop: AtomicBool::new(false),
            odd: Mutex::new(Vec::new()),
            requests: AtomicU64::new(0),
        }
    }
}

/// An answer: its status, its body and its `Retry-After` (seconds), if any.
type Answered = Result<(StatusCode, Value, Option<u64>), reqwest::Error>;

/// How an answer counts: 202 accepted; 503 `journal_unavailable` (the broker did not
/// acknowledge the records: maybe appended all the same) unavailable; a refusal that says
/// nothing was queued (4xx, another 503 but a request timeout, 429) or a connection refused:
/// refused; anything else unknown.
fn answer(result: &Answered, at: Duration) -> Answer {
    match result {
        Ok((StatusCode::ACCEPTED, _, _)) => Answer::Accepted(at),
        Ok((s, _, _)) if s.is_client_error() => Answer::Refused,
        Ok((StatusCode::SERVICE_UNAVAILABLE, v, _)) if v["error"] == "journal_unavailable" => {
            Answer::Unavailable
        }
        Ok((StatusCode::SERVICE_UNAVAILABLE, v, _)) if v["error"] != "request_timeout" => {
            Answer::Refused
        }
        Err(e) if e.is_connect() => Answer::Refused,
        _ => Answer::Unknown,
    }
}

/// One client's loop until `shared.stop`.
pub async fn client(shared: Arc<Shared>, id: usize, seed: u64) {
    let http = Client::builder().timeout(CLIENT_TIMEOUT).build().unwrap();
    let mut rng = StdRng::seed_from_u64(seed ^ id as u64);
    let mut seq = 0u64;
    let mut turn = id;
    while !shared.stop.load(Ordering::Relaxed) {
        turn += 1;
        let via = turn % 3;
        let base = shared.bases.read().unwrap()[via].clone();
        let request = shared.requests.fetch_add(1, Ordering::Relaxed);
        let lines = if rng.gen_bool(0.3) {
            rng.gen_range(2..=5)
        } else {
            1
        };
        let mut ops = Vec::with_capacity(lines);
        for line in 0..lines {
            seq += 1;
            let doc = shared.docs.lock().unwrap().pick(&mut rng);
            let op = uuid::Uuid::new_v4().to_string();
            let payload = json!({"client": id, "seq": seq, "op": op});
            ops.push(Sent {
                id: op,
                doc: format!("{INDEX}/{doc}"),
                payload,
                via,
                request,
                line,
                sent: shared.start.elapsed(),
                answer: Answer::Unknown,
            });
        }
        let result = send(&http, &base, &ops).await;
        let verdict = answer(&result, shared.start.elapsed());
        match &result {
            Ok((StatusCode::SERVICE_UNAVAILABLE, v, after)) => {
                if after.is_none() {
                    shared
                        .odd
                        .lock()
                        .unwrap()
                        .push(format!("503 without Retry-After from {base}: {v}"));
                }
                let secs = after.unwrap_or(1).min(1);
                tokio::time::sleep(Duration::from_secs(secs)).await;
            }
            // Another refusal (an instance down, a full queue): a short pause before the next.
            _ if verdict == Answer::Refused => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            _ => {}
        }
        let mut sent = shared.sent.lock().unwrap();
        for mut op in ops {
            op.answer = verdict;
            sent.push(op);
        }
    }
}

/// Sends `ops` as one background write (one operation) or one `/v1/bulk` request.
async fn send(http: &Client, base: &str, ops: &[Sent]) -> Answered {
    let id_of = |s: &Sent| s.doc.split_once('/').unwrap().1.to_string();
    let req = if let [op] = ops {
        http.put(format!(
            "{base}/v1/indices/{INDEX}/docs/{}?type=background&op_id={}",
            id_of(op),
            op.id
        ))
        .header("content-type", "application/json")
        .body(op.payload.to_string())
    } else {
        let body: String = ops
            .iter()
            .map(|op| {
                let line = json!({"action": "index", "index": INDEX, "id": id_of(op),
                    "doc": op.payload, "op_id": op.id});
                format!("{line}\n")
            })
            .collect();
        http.post(format!("{base}/v1/bulk"))
            .header("content-type", "application/x-ndjson")
            .body(body)
    };
    let resp = req.send().await?;
    let status = resp.status();
    let retry_after = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.trim().parse().ok());
    let bytes = resp.bytes().await?;
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        retry_after,
    ))
}

/// Whatever documents are retired, every partition of the journal always has live documents
/// (a partition without any gets nothing to apply, and its takeover cannot be seen).
#[test]
fn every_partition_always_has_live_documents() {
    let mut docs = Docs::default();
    let mut rng = StdRng::seed_from_u64(51);
    for picked in 0..100 * WINDOW {
        docs.pick(&mut rng);
        docs.refill();
        let mut covered = vec![false; PARTITIONS as usize];
        for doc in &docs.live {
            covered[partition_of(doc)] = true;
        }
        assert!(
            covered.iter().all(|c| *c),
            "after {picked} operations, the live documents {:?} leave partitions {:?} without operations",
            docs.live,
            (0..covered.len()).filter(|p| !covered[*p]).collect::<Vec<_>>()
        );
    }
}
