//! `zkguard bench --txn`: what a document transaction of N documents costs, beside the same
//! writes without a transaction.
//!
//! For every size N of [`TxnPlan::sizes`], one client (one ZooKeeper session, one Elasticsearch
//! client) runs [`TxnPlan::iterations`] operations of each [`Way`], one after the other, each
//! waiting for the previous one, so that the latency is the cost and not contention:
//!
//! - **transaction**: [`Transactions::apply`] of N `index` operations on N distinct existing
//!   documents (locks taken one by one in canonical order, one `_mget`, the log created, one
//!   `_bulk` of the fenced and marked writes, the log marked committed, one `_bulk` clearing the
//!   marks, the log marked finished, the locks released in one multi);
//! - **guarded writes**: the same N writes through [`GuardedWriter::run`], one after the other
//!   (each locks its document, reads it, writes it fenced, releases);
//! - **plain `_bulk`**: the same N writes in one `_bulk` straight to Elasticsearch, without
//!   locks, fencing or stamps: the floor.
//!
//! Each way writes its own pool of `2 x max(sizes)` documents, created before the run; an
//! operation of N documents takes the next N of its pool, round the pool, so consecutive
//! operations write different documents and every write replaces an existing document. The
//! transaction and the guarded writes lock the same monitors a document's writes take
//! ([`zkguard::lock::document_monitor`]).
//!
//! Figures per size and way: latency per operation (p50, p99, nearest rank), Elasticsearch
//! requests per operation (every call of the client's store, counted by a [`StoreHook`]: each is
//! one HTTP request; also by call: `get`, `mget`, `index`, `bulk`) and ZooKeeper requests per
//! operation (the growth of the server's `zk_packets_received`, from the `mntr` four-letter word
//! of the first host of `zookeeper.servers`, over the series, less the `mntr` request itself
//! that the server counts as well, divided by its operations; `null`
//! when the server does not answer `mntr`, which must then be added to its
//! `4lw.commands.whitelist`).
//!
//! Before the measured series, warm-up runs of every series ([`TxnPlan::warmup`] operations
//! each) go unmeasured until ZooKeeper's JIT compilers are done (as `zkguard bench --service`
//! does; twice without the server's process id).
//!
//! The benchmark runs on a single-threaded Tokio runtime on a thread of its own, as
//! `zkguard bench` does for the lock: the client's I/O tasks and the operations share one
//! thread.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{json, Value};
use zkguard::config::Settings;
use zkguard::es::{
    BulkAction, DocStore, EsError, EsStore, HookedStore, Refresh, StoreCall, StoreHook,
    WriteCondition,
};
use zkguard::txn::multi::{Decision, Transactions, TxnOp, TxnRequest};
use zkguard::write::guarded::GuardedWriter;
use zkguard::write::ops::Operation;

use super::measure::first_zk_host;
use super::service_bench::{latencies, stamp_mapping, JitWatch, MAX_WARMUP_RUNS, SERVERS_WARM};

/// The default sizes of `--sizes`.
pub const DEFAULT_SIZES: [u32; 5] = [1, 2, 5, 10, 20];

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnPlan {
    /// Documents per operation, one series of each way per size.
    pub sizes: Vec<u32>,
    /// Measured operations per size and way.
    pub iterations: u32,
    /// Operations per size and way in each warm-up run.
    pub warmup: u32,
    /// The ZooKeeper server's process id, when known: the warm-up then lasts until its JIT
    /// compilers are done.
    pub zk_pid: Option<u32>,
}

impl TxnPlan {
    /// Documents in each way's pool: twice the largest size.
    pub fn pool(&self) -> u32 {
        2 * self.sizes.iter().copied().max().unwrap_or(1)
    }
}

/// How N documents are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// One document transaction.
    Transaction,
    /// N guarded writes, one after the other.
    Guarded,
    /// One plain `_bulk` straight to Elasticsearch, no locks.
    Bulk,
}

impl Way {
    /// Every way, in the order they run.
    pub const ALL: [Way; 3] = [Way::Transaction, Way::Guarded, Way::Bulk];

    /// The JSON keys' prefix.
    pub fn key(self) -> &'static str {
        match self {
            Self::Transaction => "txn",
            Self::Guarded => "guarded",
            Self::Bulk => "bulk",
        }
    }

    /// The table's label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Transaction => "transaction",
            Self::Guarded => "guarded writes, one by one",
            Self::Bulk => "plain _bulk, no locks",
        }
    }
}

/// The figures of one size and way.
#[derive(Debug, Clone)]
pub struct Series {
    /// Documents per operation.
    pub docs: u32,
    /// How they were written.
    pub way: Way,
    /// Operations measured.
    pub ops: u32,
    /// Latency per operation, median.
    pub p50: Duration,
    /// Latency per operation, 99th percentile.
    pub p99: Duration,
    /// Elasticsearch requests per operation, by store call (`get`, `mget`, `index`, `bulk`, ...).
    pub es_by_call: BTreeMap<&'static str, f64>,
    /// ZooKeeper requests per operation, when the server's counter could be read. The server's
    /// counter includes the session's pings, which the client sends after a silence (750 ms
    /// with the default session timeout of 5 s): at most one per such silence of the series.
    pub zk_requests: Option<f64>,
    /// How long the whole series took: what bounds the pings counted in `zk_requests`.
    pub elapsed: Duration,
}

impl Series {
    /// Elasticsearch requests per operation.
    pub fn es_requests(&self) -> f64 {
        self.es_by_call.values().sum()
    }

    fn by_call_text(&self) -> String {
        self.es_by_call
            .iter()
            .map(|(call, n)| format!("{call} {}", round2(*n)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The report.
#[derive(Debug, Clone)]
pub struct TxnReport {
    /// The plan.
    pub plan: TxnPlan,
    /// One series per size and way, sizes in the plan's order, ways in [`Way::ALL`]'s.
    pub series: Vec<Series>,
    /// Unmeasured warm-up runs.
    pub warmup_runs: u32,
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0 * 100.0).round() / 100.0
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn build() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

impl TxnReport {
    fn get(&self, docs: u32, way: Way) -> Option<&Series> {
        self.series.iter().find(|s| s.docs == docs && s.way == way)
    }

    /// The transaction's p50 over the guarded writes' for `docs` documents.
    pub fn txn_over_guarded_p50(&self, docs: u32) -> Option<f64> {
        let t = self.get(docs, Way::Transaction)?;
        let g = self.get(docs, Way::Guarded)?;
        Some(t.p50.as_secs_f64() / g.p50.as_secs_f64().max(1e-9))
    }

    /// One flat JSON object: `{way}_n{N}_p50_ms`, `_p99_ms`, `_es_requests`, `_es_{call}`,
    /// `_zk_requests` (null when not counted), `_secs` (the series' duration) for every way (`txn`, `guarded`, `bulk`) and size,
    /// and `txn_over_guarded_n{N}_p50`.
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "sizes": self.plan.sizes,
            "iterations": self.plan.iterations,
            "warmup_ops": self.plan.warmup,
            "warmup_runs": self.warmup_runs,
            "pool_docs": self.plan.pool(),
            "build": build(),
        });
        let Value::Object(all) = &mut v else {
            unreachable!("a JSON object")
        };
        for s in &self.series {
            let key = |figure: &str| format!("{}_n{}_{figure}", s.way.key(), s.docs);
            all.insert(key("ops"), json!(s.ops));
            all.insert(key("p50_ms"), json!(ms(s.p50)));
            all.insert(key("p99_ms"), json!(ms(s.p99)));
            all.insert(key("es_requests"), json!(round2(s.es_requests())));
            for (call, n) in &s.es_by_call {
                all.insert(key(&format!("es_{call}")), json!(round2(*n)));
            }
            all.insert(key("zk_requests"), json!(s.zk_requests.map(round2)));
            all.insert(key("secs"), json!(round2(s.elapsed.as_secs_f64())));
        }
        for &n in &self.plan.sizes {
            if let Some(r) = self.txn_over_guarded_p50(n) {
                all.insert(format!("txn_over_guarded_n{n}_p50"), json!(round2(r)));
            }
        }
        v
    }

    /// A table for people.
    pub fn table(&self) -> String {
        let p = &self.plan;
        let mut out = format!(
            "zkguard bench --txn: one client, {} operations per size and way, one at a time, {} build; \
             each way on its own {} existing documents; after {} unmeasured warm-up run(s)\n\
             ES requests are counted at the client, ZK requests from the server's zk_packets_received\n\n\
             {:>4}  {:<28} {:>9} {:>9} {:>9} {:>9}  {}\n",
            p.iterations,
            build(),
            p.pool(),
            self.warmup_runs,
            "docs",
            "way",
            "p50 ms",
            "p99 ms",
            "ES req",
            "ZK req",
            "ES requests by call",
        );
        let mut last = None;
        for s in &self.series {
            let docs = if last == Some(s.docs) {
                String::new()
            } else {
                s.docs.to_string()
            };
            last = Some(s.docs);
            let zk = s
                .zk_requests
                .map_or_else(|| "n/a".to_string(), |z| format!("{z:.2}"));
            out.push_str(&format!(
                "{docs:>4}  {:<28} {:>9.2} {:>9.2} {:>9.2} {:>9}  {}\n",
                s.way.label(),
                ms(s.p50),
                ms(s.p99),
                s.es_requests(),
                zk,
                s.by_call_text(),
            ));
        }
        out.push_str("\ntransaction p50 / guarded writes p50:");
        for &n in &p.sizes {
            if let Some(r) = self.txn_over_guarded_p50(n) {
                out.push_str(&format!("  N={n} {r:.2}x"));
            }
        }
        out.push('\n');
        out
    }
}

/// Counts the calls of a store by method; every call of [`EsStore`] is one HTTP request.
#[derive(Default)]
struct CountCalls {
    calls: Mutex<BTreeMap<&'static str, u64>>,
}

impl CountCalls {
    fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[async_trait]
impl StoreHook for CountCalls {
    async fn before(&self, call: &StoreCall<'_>) -> Result<(), EsError> {
        *self
            .calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(call.method())
            .or_default() += 1;
        Ok(())
    }
}

/// Runs the benchmark against `settings`' ZooKeeper and Elasticsearch, on a single-threaded
/// runtime on a thread of its own.
///
/// # Errors
/// A server is unreachable, a size is larger than `txn.max.operations`, or a write failed (the
/// message says which and why).
pub async fn run(settings: Settings, plan: TxnPlan) -> Result<TxnReport, String> {
    super::measure::on_own_thread("zkguard-bench-txn", move || measure(settings, plan)).await
}

/// The client: a counted store, a lock service, a guarded writer and a coordinator.
struct Bench {
    store: Arc<dyn DocStore>,
    counts: Arc<CountCalls>,
    writer: GuardedWriter,
    txns: Transactions,
    index: String,
    pool: u32,
    zk_host: String,
    /// Operations of each way so far: where its next one starts in its pool.
    next: [u32; 3],
    /// Whether `mntr` answered (warned once otherwise).
    mntr_warned: bool,
}

async fn measure(mut settings: Settings, plan: TxnPlan) -> Result<TxnReport, String> {
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    settings.zookeeper.lock_root = format!("/zkguard-bench-txn/{tag}");
    let mut txn_settings = settings.txn.clone();
    txn_settings.log_index = format!("bench-txn-log-{tag}");
    if let Some(&n) = plan
        .sizes
        .iter()
        .find(|&&n| n as usize > txn_settings.max_operations)
    {
        return Err(format!(
            "a transaction of {n} documents is larger than txn.max.operations ({})",
            txn_settings.max_operations
        ));
    }
    let es: Arc<dyn DocStore> = Arc::new(
        EsStore::new(&settings.elasticsearch).map_err(|e| format!("Elasticsearch client: {e}"))?,
    );
    let counts = Arc::new(CountCalls::default());
    let store: Arc<dyn DocStore> = Arc::new(HookedStore::new(es, counts.clone()));
    let session = zkguard::ZkSession::connect(&settings.zookeeper)
        .await
        .map_err(|e| format!("ZooKeeper at {}: {e}", settings.zookeeper.servers))?;
    let locks: Arc<dyn zkguard::LockService> =
        Arc::new(zkguard::ZkLockService::new(session.clone()));
    let mut bench = Bench {
        writer: GuardedWriter::new(locks.clone(), store.clone()),
        txns: Transactions::new(locks, store.clone(), txn_settings),
        store,
        counts,
        index: format!("bench-txn-{tag}"),
        pool: plan.pool(),
        zk_host: first_zk_host(&settings.zookeeper.servers),
        next: [0; 3],
        mntr_warned: false,
    };
    let result = bench.all(&plan).await;
    session.close();
    result
}

impl Bench {
    async fn all(&mut self, plan: &TxnPlan) -> Result<TxnReport, String> {
        self.store
            .ensure_index(&self.index, &stamp_mapping())
            .await
            .map_err(|e| format!("cannot create the benchmark's index {}: {e}", self.index))?;
        self.txns
            .ensure_index()
            .await
            .map_err(|e| format!("cannot create the transaction log index: {e}"))?;
        // Every document exists before the first measured write.
        let seed: Vec<BulkAction> = Way::ALL
            .iter()
            .flat_map(|&way| (0..self.pool).map(move |k| (way, k)))
            .map(|(way, k)| BulkAction::Index {
                index: self.index.clone(),
                id: doc_id(way, k),
                source: json!({"way": way.key(), "k": k, "n": 0}),
                condition: WriteCondition::Always,
            })
            .collect();
        check_bulk(self.store.bulk(&seed, Refresh::No).await)?;

        let mut warmup_runs = 0;
        for run in 1..=MAX_WARMUP_RUNS {
            warmup_runs = run;
            let jit = JitWatch::start(plan.zk_pid);
            for &n in &plan.sizes {
                for way in Way::ALL {
                    self.series(n, way, plan.warmup).await?;
                }
            }
            if jit.warm(run, SERVERS_WARM, 2, "warm-up run") {
                break;
            }
        }

        let mut series = Vec::new();
        for &n in &plan.sizes {
            for way in Way::ALL {
                series.push(self.series(n, way, plan.iterations).await?);
            }
        }
        Ok(TxnReport {
            plan: plan.clone(),
            series,
            warmup_runs,
        })
    }

    /// `ops` operations of `n` documents written `way`, one after the other.
    async fn series(&mut self, n: u32, way: Way, ops: u32) -> Result<Series, String> {
        let es_before = self.counts.snapshot();
        let started = Instant::now();
        let zk_before = self.packets().await;
        let mut samples = Vec::with_capacity(ops as usize);
        for _ in 0..ops {
            let slot = &mut self.next[way as usize];
            let first = *slot * n;
            *slot += 1;
            let ids: Vec<String> = (0..n)
                .map(|j| doc_id(way, (first + j) % self.pool))
                .collect();
            let t = Instant::now();
            self.once(way, &ids, first).await?;
            samples.push(t.elapsed());
        }
        let zk_after = self.packets().await;
        let elapsed = started.elapsed();
        let es_after = self.counts.snapshot();
        let per_op = |count: u64| count as f64 / f64::from(ops.max(1));
        let es_by_call = es_after
            .iter()
            .map(|(call, after)| {
                let before = es_before.get(call).copied().unwrap_or(0);
                (*call, per_op(after - before))
            })
            .filter(|(_, n)| *n > 0.0)
            .collect();
        // The server counts the `mntr` request of each reading too: one of the two falls
        // between them.
        let zk_requests = zk_before
            .zip(zk_after)
            .map(|(b, a)| per_op(a.saturating_sub(b).saturating_sub(1)));
        let (p50, p99) = latencies(samples);
        Ok(Series {
            docs: n,
            way,
            ops,
            p50,
            p99,
            es_by_call,
            zk_requests,
            elapsed,
        })
    }

    /// One operation: the documents `ids` written `way`, with `stamp` in their sources.
    async fn once(&self, way: Way, ids: &[String], stamp: u32) -> Result<(), String> {
        let doc = |id: &str| json!({"id": id, "n": stamp, "way": way.key()});
        match way {
            Way::Transaction => {
                let ops = ids
                    .iter()
                    .map(|id| TxnOp::index(&self.index, id, doc(id)))
                    .collect();
                let outcome = self
                    .txns
                    .apply(TxnRequest::new(ops))
                    .await
                    .map_err(|e| format!("a transaction failed: {e}"))?;
                if outcome.state != Decision::Committed {
                    return Err(format!(
                        "a transaction was rolled back: {}",
                        outcome.reason.unwrap_or_default()
                    ));
                }
            }
            Way::Guarded => {
                for id in ids {
                    let op = Operation::index(
                        zkguard::lock::document_monitor(&self.index, id),
                        &self.index,
                        id,
                        doc(id),
                    );
                    self.writer
                        .run(&op)
                        .await
                        .map_err(|e| format!("a guarded write failed: {e}"))?;
                }
            }
            Way::Bulk => {
                let actions: Vec<BulkAction> = ids
                    .iter()
                    .map(|id| BulkAction::Index {
                        index: self.index.clone(),
                        id: id.clone(),
                        source: doc(id),
                        condition: WriteCondition::Always,
                    })
                    .collect();
                check_bulk(self.store.bulk(&actions, Refresh::No).await)?;
            }
        }
        Ok(())
    }

    /// `zk_packets_received` of the first ZooKeeper host, if it answers `mntr`.
    async fn packets(&mut self) -> Option<u64> {
        let addr = self.zk_host.clone();
        let read =
            tokio::task::spawn_blocking(move || zkguard::testkit::packets_received_at(addr)).await;
        match read {
            Ok(Ok(n)) => Some(n),
            Ok(Err(e)) if !self.mntr_warned => {
                self.mntr_warned = true;
                tracing::warn!(error = %e, at = %self.zk_host, "cannot read zk_packets_received (four-letter word mntr; add it to 4lw.commands.whitelist); ZooKeeper requests not counted");
                None
            }
            _ => None,
        }
    }
}

/// The id of document `k` of `way`'s pool.
fn doc_id(way: Way, k: u32) -> String {
    format!("{}-{k}", way.key())
}

fn check_bulk(
    result: Result<Vec<Result<zkguard::es::DocMeta, EsError>>, EsError>,
) -> Result<(), String> {
    let items = result.map_err(|e| format!("a _bulk failed: {e}"))?;
    match items.into_iter().find_map(Result::err) {
        Some(e) => Err(format!("a _bulk item failed: {e}")),
        None => Ok(()),
    }
}

/// Counts as a number of calls, for tests.
#[cfg(test)]
fn counted(counts: &CountCalls) -> u64 {
    counts.snapshot().values().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(docs: u32, way: Way, p50_ms: u64, es: &[(&'static str, f64)]) -> Series {
        Series {
            docs,
            way,
            ops: 10,
            p50: Duration::from_millis(p50_ms),
            p99: Duration::from_millis(p50_ms * 2),
            es_by_call: es.iter().copied().collect(),
            zk_requests: (way != Way::Bulk).then_some(f64::from(docs) + 1.0),
            elapsed: Duration::from_millis(p50_ms * 10),
        }
    }

    #[test]
    fn the_report_has_flat_keys_per_size_and_way() {
        let report = TxnReport {
            plan: TxnPlan {
                sizes: vec![2],
                iterations: 10,
                warmup: 3,
                zk_pid: None,
            },
            series: vec![
                series(2, Way::Transaction, 6, &[("get", 1.0), ("bulk", 2.0)]),
                series(2, Way::Guarded, 4, &[("get", 2.0), ("index", 2.0)]),
                series(2, Way::Bulk, 1, &[("bulk", 1.0)]),
            ],
            warmup_runs: 2,
        };
        let v = report.to_json();
        assert!(v.as_object().unwrap().values().all(|x| !x.is_object()));
        assert_eq!(v["pool_docs"], 4);
        assert_eq!(v["txn_n2_es_requests"], 3.0);
        assert_eq!(v["guarded_n2_es_index"], 2.0);
        assert_eq!(v["bulk_n2_zk_requests"], Value::Null);
        assert_eq!(v["txn_n2_zk_requests"], 3.0);
        assert_eq!(v["txn_over_guarded_n2_p50"], 1.5);
        let table = report.table();
        for needle in [
            "transaction",
            "guarded writes",
            "plain _bulk",
            "N=2 1.50x",
            "n/a",
        ] {
            assert!(table.contains(needle), "{needle} in\n{table}");
        }
    }

    #[test]
    fn calls_are_counted_by_method() {
        let counts = CountCalls::default();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            counts
                .before(&StoreCall::Get {
                    index: "i",
                    id: "1",
                })
                .await
                .unwrap();
            counts
                .before(&StoreCall::Refresh { index: "i" })
                .await
                .unwrap();
            counts
                .before(&StoreCall::Get {
                    index: "i",
                    id: "2",
                })
                .await
                .unwrap();
        });
        assert_eq!(counted(&counts), 3);
        assert_eq!(counts.snapshot()["get"], 2);
    }

    #[test]
    fn the_pool_is_twice_the_largest_size() {
        let plan = TxnPlan {
            sizes: vec![1, 20, 5],
            iterations: 1,
            warmup: 1,
            zk_pid: None,
        };
        assert_eq!(plan.pool(), 40);
        assert_eq!(doc_id(Way::Guarded, 3), "guarded-3");
    }
}
