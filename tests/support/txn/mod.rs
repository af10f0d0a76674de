//! Shared helpers of the transaction tests: one `osmem-server` per test binary, fresh indices per
//! test, crash/pause hooks and a store that loses replies.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use tokio::sync::Notify;
use zkguard::config::{Settings, TxnSettings};
use zkguard::es::{DocStore, EsError, EsStore, HookedStore, StoreCall, StoreHook, WriteCondition};
use zkguard::testkit::OsmemServer;
use zkguard::txn::{Coordinator, HookAction, HookPoint, StepHook, TxnState};

/// The test binary's `osmem-server`.
pub fn server() -> &'static OsmemServer {
    static SERVER: OnceLock<OsmemServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        OsmemServer::start().expect("start osmem-server (run scripts/install-deps.sh)")
    })
}

pub fn store() -> Arc<dyn DocStore> {
    Arc::new(EsStore::from_url(server().url()).expect("client"))
}

/// Settings with indices of their own (`tag` + random suffix) and immediate recovery.
pub fn settings(tag: &str) -> TxnSettings {
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let mut s = Settings::default().txn;
    s.accounts_index = format!("t-{tag}-acc-{suffix}");
    s.transactions_index = format!("t-{tag}-txn-{suffix}");
    s.recovery_after = Duration::ZERO;
    s
}

/// A coordinator over `store` for `settings`.
pub fn coordinator(store: Arc<dyn DocStore>, settings: &TxnSettings) -> Coordinator {
    Coordinator::new(store, settings.clone())
}

/// Creates accounts `names` with `balance` each.
pub async fn open_accounts(c: &Coordinator, names: &[&str], balance: i64) {
    for n in names {
        assert!(c.create_account(n, balance).await.expect("create account"));
    }
}

pub async fn balance(c: &Coordinator, account: &str) -> i64 {
    c.account(account)
        .await
        .unwrap()
        .expect("account exists")
        .balance
}

pub async fn balances(c: &Coordinator, accounts: &[String]) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for a in accounts {
        out.insert(a.clone(), balance(c, a).await);
    }
    out
}

/// Every transaction of the index with its state, amount, source and destination.
pub async fn all_transactions(
    store: &Arc<dyn DocStore>,
    s: &TxnSettings,
) -> Vec<(String, TxnState, i64, String, String)> {
    store.refresh(&s.transactions_index).await.unwrap();
    let hits = store
        .search(
            &s.transactions_index,
            &json!({ "size": 10000, "query": { "match_all": {} } }),
        )
        .await
        .unwrap();
    hits.into_iter()
        .map(|d| {
            let src = &d.source;
            (
                d.id.clone(),
                src["transaction_state"].as_str().unwrap().parse().unwrap(),
                src["amount"].as_i64().unwrap(),
                src["src_acct"].as_str().unwrap().to_string(),
                src["dest_acct"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Recovers until nothing is in flight (bounded).
pub async fn recover_all(c: &Coordinator) {
    for _ in 0..20 {
        let report = c.recover_once().await.expect("recovery pass");
        assert!(
            report.failed.is_empty(),
            "recovery failures: {:?}",
            report.failed
        );
        if report.examined == 0 {
            return;
        }
    }
    panic!("transactions still in flight after 20 recovery passes");
}

/// Asserts the books: nothing in flight, no pending id, no anomaly, the expected total, and every
/// balance equal to its initial value moved by exactly the finished transactions.
pub async fn assert_books(
    store: &Arc<dyn DocStore>,
    c: &Coordinator,
    s: &TxnSettings,
    initial: &BTreeMap<String, i64>,
) {
    let audit = c.audit().await.unwrap();
    assert!(audit.is_settled(), "audit not settled: {audit:#?}");
    assert_eq!(
        audit.total_balance,
        initial.values().sum::<i64>(),
        "sum of balances changed: {audit:#?}"
    );
    let mut expected = initial.clone();
    for (id, state, amount, from, to) in all_transactions(store, s).await {
        assert!(state.is_final(), "transaction {id} is {state}");
        if state == TxnState::Finished {
            *expected.get_mut(&from).unwrap() -= amount;
            *expected.get_mut(&to).unwrap() += amount;
        }
    }
    let accounts: Vec<String> = initial.keys().cloned().collect();
    assert_eq!(
        balances(c, &accounts).await,
        expected,
        "balances differ from the finished transactions"
    );
}

/// Crashes at one point, once (optionally for one transaction only).
pub struct CrashAt {
    pub point: HookPoint,
    pub txn: Option<String>,
    pub fired: AtomicBool,
}

impl CrashAt {
    pub fn new(point: HookPoint) -> Arc<Self> {
        Arc::new(Self {
            point,
            txn: None,
            fired: AtomicBool::new(false),
        })
    }
    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl StepHook for CrashAt {
    async fn at(&self, txn: &str, point: HookPoint) -> HookAction {
        if point == self.point
            && !matches!(&self.txn, Some(t) if t != txn)
            && !self.fired.swap(true, Ordering::SeqCst)
        {
            HookAction::Crash
        } else {
            HookAction::Continue
        }
    }
}

/// Pauses the first time `point` is reached until released.
pub struct PauseAt {
    pub point: HookPoint,
    pub reached: Notify,
    pub release: Notify,
    fired: AtomicBool,
}

impl PauseAt {
    pub fn new(point: HookPoint) -> Arc<Self> {
        Arc::new(Self {
            point,
            reached: Notify::new(),
            release: Notify::new(),
            fired: AtomicBool::new(false),
        })
    }
}

#[async_trait]
impl StepHook for PauseAt {
    async fn at(&self, _txn: &str, point: HookPoint) -> HookAction {
        if point == self.point && !self.fired.swap(true, Ordering::SeqCst) {
            self.reached.notify_one();
            self.release.notified().await;
        }
        HookAction::Continue
    }
}

/// Crashes at random points with probability `1/every`, and yields at every point to vary the
/// interleavings.
pub struct RandomCrashes {
    pub every: u32,
    pub crashes: AtomicU64,
}

#[async_trait]
impl StepHook for RandomCrashes {
    async fn at(&self, _txn: &str, _point: HookPoint) -> HookAction {
        use rand::Rng;
        let (crash, pause) = {
            let mut rng = rand::thread_rng();
            (rng.gen_range(0..self.every) == 0, rng.gen_range(0..4u64))
        };
        if pause == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        } else {
            tokio::task::yield_now().await;
        }
        if crash {
            self.crashes.fetch_add(1, Ordering::Relaxed);
            HookAction::Crash
        } else {
            HookAction::Continue
        }
    }
}

/// Decides from (write number, index, condition) whether a write's reply is lost.
pub type LosePolicy = Box<dyn Fn(u64, &str, WriteCondition) -> bool + Send + Sync>;

/// A hook that lets writes happen and then loses the reply: the `n`-th `index` call (1-based,
/// counted per store) for which `lose(n, index, condition)` holds is applied and answered with a
/// transport error, as when a connection drops after the server acted.
pub struct LoseReplies {
    pub writes: AtomicU64,
    pub lost: AtomicU64,
    pub lose: LosePolicy,
}

#[async_trait]
impl StoreHook for LoseReplies {
    async fn after(&self, call: &StoreCall<'_>, outcome: Result<(), &EsError>) -> Option<EsError> {
        let StoreCall::Index {
            index, condition, ..
        } = *call
        else {
            return None;
        };
        let n = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        if outcome.is_ok() && (self.lose)(n, index, condition) {
            self.lost.fetch_add(1, Ordering::SeqCst);
            return Some(EsError::Transport {
                url: "lossy".into(),
                reason: "reply lost (injected)".into(),
            });
        }
        None
    }
}

/// A store that performs writes and then loses the reply (see [`LoseReplies`]).
pub type LossyStore = HookedStore<LoseReplies>;

/// `inner` with its replies lost as `lose` decides (see [`LoseReplies`]).
pub fn lossy_store(
    inner: Arc<dyn DocStore>,
    lose: impl Fn(u64, &str, WriteCondition) -> bool + Send + Sync + 'static,
) -> Arc<LossyStore> {
    let hook = LoseReplies {
        writes: AtomicU64::new(0),
        lost: AtomicU64::new(0),
        lose: Box::new(lose),
    };
    Arc::new(HookedStore::new(inner, hook))
}
