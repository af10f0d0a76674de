//! The coordinator: its configuration and the plumbing every step shares (retries of
//! transient failures, hooks, the transaction lock, index creation, reads of transactions).
//! The other parts of the coordinator live beside it: `accounts.rs` (account documents),
//! `requests.rs` (submit, transfer, resume, rollback), `steps.rs` (the state machine),
//! `recovery.rs` and `audit.rs`.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;
use tracing::{debug, info, warn};

use super::{
    accounts_mappings, transactions_mappings, HookAction, HookPoint, RetryPolicy, StepHook,
    Transaction, TxnError,
};
use crate::config::TxnSettings;
use crate::es::{DocMeta, DocStore, EsError, WriteCondition};
use crate::lock::{Guard, LockError, LockRequest, LockService, LockType};

/// Runs transfers, rollbacks, recovery and audits against one accounts index and one transactions
/// index.
///
/// Cheap to share: wrap it in an `Arc` and call it from many tasks. Any number of coordinators, in
/// any number of processes, may work on the same indices and even on the same transaction at the
/// same time: each step is a conditional write, so an amount is never applied twice. An optional
/// [`LockService`] ([`Coordinator::with_lock_service`]) only keeps recovery from duplicating the
/// work of a live worker.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
///
/// use zkguard::config::Settings;
/// use zkguard::es::EsStore;
/// use zkguard::txn::{Coordinator, TransferRequest, TxnError};
///
/// let settings = Settings::load(None)?;
/// let store = Arc::new(EsStore::new(&settings.elasticsearch)?);
/// let txns = Coordinator::new(store, settings.txn.clone());
/// txns.create_account("A", 500).await?;
/// txns.create_account("B", 500).await?;
/// match txns.transfer(TransferRequest::new("A", "B", 100).with_id("order-42")).await {
///     Ok(done) => println!("{} is {}", done.id, done.state),
///     Err(TxnError::Rejected { reason, .. }) => println!("refused, nothing written: {reason}"),
///     Err(e) => println!("left for recovery: {e}"),
/// }
/// # Ok(()) }
/// ```
#[must_use]
pub struct Coordinator {
    pub(super) store: Arc<dyn DocStore>,
    pub(super) settings: TxnSettings,
    lock: Option<Arc<dyn LockService>>,
    hook: Option<Arc<dyn StepHook>>,
    retry: RetryPolicy,
    pub(super) recovery_lock_timeout: Duration,
    pub(super) recovery_batch: usize,
    pub(super) recovery_concurrency: usize,
    ready: OnceCell<()>,
}

impl fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Coordinator")
            .field("settings", &self.settings)
            .field("lock", &self.lock.as_ref().map(|l| l.backend_name()))
            .field("hook", &self.hook.is_some())
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

/// A failed store call as a transaction error, with what was being done.
pub(super) fn store_err(context: impl Into<String>, source: EsError) -> TxnError {
    TxnError::Store {
        context: context.into(),
        source,
    }
}

/// The condition "unchanged since read at `meta`".
pub(super) fn if_match(meta: DocMeta) -> WriteCondition {
    WriteCondition::IfMatch {
        seq_no: meta.seq_no,
        primary_term: meta.primary_term,
    }
}

impl Coordinator {
    /// A coordinator over `store` with the given index names and policies, no lock service, no
    /// hook and the default [`RetryPolicy`].
    pub fn new(store: Arc<dyn DocStore>, settings: TxnSettings) -> Self {
        Self {
            store,
            settings,
            lock: None,
            hook: None,
            retry: RetryPolicy::default(),
            recovery_lock_timeout: Duration::from_millis(100),
            recovery_batch: 100,
            recovery_concurrency: 4,
            ready: OnceCell::new(),
        }
    }

    /// Takes a lock from `service` on `txn:<id>` around every transfer, resume and rollback
    /// (foreground) and every recovery (background, short timeout): recovery then skips a
    /// transaction a live worker is still driving. Correctness does not depend on it.
    pub fn with_lock_service(mut self, service: Arc<dyn LockService>) -> Self {
        self.lock = Some(service);
        self
    }

    /// Installs a [`StepHook`] (crash injection for tests and demos).
    #[doc(hidden)]
    pub fn with_hook(mut self, hook: Arc<dyn StepHook>) -> Self {
        self.hook = Some(hook);
        self
    }

    /// Sets how transient Elasticsearch failures are retried within a step.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = RetryPolicy {
            attempts: retry.attempts.max(1),
            ..retry
        };
        self
    }

    /// Tunes recovery: how long it waits for a transaction's lock before skipping it (default
    /// 100 ms), how many transactions one search returns (default 100), and how many it drives at
    /// once (default 4).
    pub fn with_recovery_tuning(
        mut self,
        lock_timeout: Duration,
        batch: usize,
        concurrency: usize,
    ) -> Self {
        self.recovery_lock_timeout = lock_timeout;
        self.recovery_batch = batch.max(1);
        self.recovery_concurrency = concurrency.max(1);
        self
    }

    /// The index names and policies in use.
    pub fn settings(&self) -> &TxnSettings {
        &self.settings
    }

    /// Runs `op`, retrying transient failures (429, 5xx, transport) per the [`RetryPolicy`].
    pub(super) async fn retrying<T, F, Fut>(&self, op: F) -> Result<T, EsError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, EsError>>,
    {
        self.retry.run(op).await
    }

    pub(super) async fn hook(&self, txn: &str, point: HookPoint) -> Result<(), TxnError> {
        if let Some(hook) = &self.hook {
            if hook.at(txn, point).await == HookAction::Crash {
                info!(txn, ?point, "injected crash");
                return Err(TxnError::Interrupted {
                    id: txn.into(),
                    point,
                });
            }
        }
        Ok(())
    }

    /// Creates the accounts and transactions indices with their explicit mappings, unless they
    /// exist. Every other operation calls it once per coordinator, so an index is never created
    /// implicitly with dynamic mappings.
    ///
    /// # Errors
    /// [`TxnError::Store`] when Elasticsearch fails.
    ///
    /// # Cancellation safety
    /// Cancel-safe: creating an index is idempotent.
    pub async fn ensure_indices(&self) -> Result<(), TxnError> {
        self.ready
            .get_or_try_init(|| async {
                for (index, mappings) in [
                    (&self.settings.accounts_index, accounts_mappings()),
                    (&self.settings.transactions_index, transactions_mappings()),
                ] {
                    let mappings = crate::es::own_index_body(mappings);
                    self.retrying(|| self.store.ensure_index(index, &mappings))
                        .await
                        .map_err(|e| store_err(format!("creating index `{index}`"), e))?;
                }
                Ok::<(), TxnError>(())
            })
            .await
            .map(|_| ())
    }

    pub(super) async fn read_txn(&self, id: &str) -> Result<Option<Transaction>, TxnError> {
        let index = &self.settings.transactions_index;
        let doc = self
            .retrying(|| self.store.get(index, id))
            .await
            .map_err(|e| store_err(format!("reading transaction `{id}`"), e))?;
        doc.map(|d| Transaction::from_doc(index, d)).transpose()
    }

    pub(super) async fn must_read_txn(&self, id: &str) -> Result<Transaction, TxnError> {
        self.read_txn(id).await?.ok_or_else(|| TxnError::NotFound {
            id: id.into(),
            index: self.settings.transactions_index.clone(),
        })
    }

    pub(super) async fn lock(
        &self,
        id: &str,
        lock_type: LockType,
        timeout: Option<Duration>,
    ) -> Result<Option<Box<dyn Guard>>, TxnError> {
        let Some(service) = &self.lock else {
            return Ok(None);
        };
        let mut request =
            LockRequest::new(format!("txn:{id}"), "zkguard transaction").with_type(lock_type);
        if let Some(t) = timeout {
            request = request.with_timeout(t);
        }
        match service.acquire(request).await {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::Timeout { .. }) => Err(TxnError::Busy { id: id.into() }),
            Err(e) => {
                warn!(txn = id, error = %e, "cannot take the transaction lock; going on without it (conditional writes keep the transaction safe)");
                Ok(None)
            }
        }
    }

    pub(super) async fn unlock(&self, guard: Option<Box<dyn Guard>>) {
        if let Some(guard) = guard {
            if let Err(e) = guard.unlock().await {
                debug!(error = %e, "releasing a transaction lock failed; it expires with its session or lease");
            }
        }
    }
}
