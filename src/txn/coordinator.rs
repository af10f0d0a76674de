//! The coordinator: creation, the core steps, rollback, and the conditional-write engine.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::sync::OnceCell;
use tracing::{debug, info, instrument, warn};

use super::{
    accounts_mappings, now_rfc3339, transactions_mappings, validate_id, Account, HookAction,
    HookPoint, Rejection, RetryPolicy, Step, StepHook, Transaction, TransferRequest, TxnError,
    TxnState,
};
use crate::backoff::Backoff;
use crate::config::TxnSettings;
use crate::es::{Doc, DocMeta, DocStore, EsError, Refresh, WriteCondition};
use crate::lock::{Guard, LockError, LockRequest, LockService, LockType};

/// Conflicting writes tolerated on one document within one step before giving up (the transaction
/// then stays as stored, for recovery).
const MAX_CONFLICTS: u32 = 200;

/// Runs transfers, rollbacks, recovery and audits against one accounts index and one transactions
/// index.
///
/// Cheap to share: wrap it in an `Arc` and call it from many tasks. Any number of coordinators, in
/// any number of processes, may work on the same indices and even on the same transaction at the
/// same time: each step is a conditional write, so an amount is never applied twice. An optional
/// [`LockService`] ([`Coordinator::with_lock_service`]) only keeps recovery from duplicating the
/// work of a live worker.
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

/// Which account of a transaction a step touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Source,
    Destination,
}

impl Side {
    fn account(self, txn: &Transaction) -> &str {
        match self {
            Self::Source => &txn.src_acct,
            Self::Destination => &txn.dest_acct,
        }
    }

    /// What applying the transaction adds to this account's balance.
    fn delta(self, amount: i64) -> i64 {
        match self {
            Self::Source => -amount,
            Self::Destination => amount,
        }
    }
}

/// The result of an apply step.
enum Applied {
    /// Applied now or before; carries the transaction as read during the step.
    Done(Transaction),
    /// The transaction is no longer `pending`: continue from its new state.
    StateChanged(Transaction),
    /// The account refuses the transaction: roll it back.
    Reject(Transaction, Rejection),
}

/// An account document with the fields zkguard does not own kept as they are.
struct AccountDoc {
    id: String,
    source: Map<String, Value>,
    balance: i64,
    pending: Vec<String>,
    meta: DocMeta,
}

impl AccountDoc {
    fn parse(index: &str, doc: Doc) -> Result<Self, TxnError> {
        let corrupt = |reason: &str| TxnError::Corrupt {
            index: index.into(),
            id: doc.id.clone(),
            reason: reason.into(),
        };
        let Value::Object(source) = doc.source.clone() else {
            return Err(corrupt("the source is not a JSON object"));
        };
        let balance = source
            .get("balance")
            .and_then(Value::as_i64)
            .ok_or_else(|| corrupt("field `balance` is missing or not an integer"))?;
        let pending = match source.get("pending_transactions") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| corrupt("`pending_transactions` holds something other than ids"))?,
            Some(_) => return Err(corrupt("`pending_transactions` is not a list of ids")),
        };
        Ok(Self {
            id: doc.id,
            source,
            balance,
            pending,
            meta: doc.meta,
        })
    }

    fn to_source(&self) -> Value {
        let mut m = self.source.clone();
        m.insert("balance".into(), Value::from(self.balance));
        m.insert(
            "pending_transactions".into(),
            Value::from(self.pending.clone()),
        );
        Value::Object(m)
    }

    fn account(&self) -> Account {
        Account {
            id: self.id.clone(),
            balance: self.balance,
            pending_transactions: self.pending.clone(),
        }
    }
}

/// Counts conflicts within one step and backs off when they pile up.
struct Conflicts {
    n: u32,
    backoff: Backoff,
}

impl Conflicts {
    fn new() -> Self {
        Self {
            n: 0,
            backoff: Backoff::new(Duration::from_millis(2), Duration::from_millis(100)),
        }
    }

    async fn record(
        &mut self,
        txn: &str,
        step: Step,
        index: &str,
        doc: &str,
    ) -> Result<(), TxnError> {
        self.n += 1;
        if self.n > MAX_CONFLICTS {
            return Err(TxnError::Contention {
                id: txn.into(),
                step,
                index: index.into(),
                doc: doc.into(),
            });
        }
        if self.n > 2 {
            tokio::time::sleep(self.backoff.next_delay()).await;
        }
        Ok(())
    }
}

fn store_err(context: impl Into<String>, source: EsError) -> TxnError {
    TxnError::Store {
        context: context.into(),
        source,
    }
}

fn if_match(meta: DocMeta) -> WriteCondition {
    WriteCondition::IfMatch {
        seq_no: meta.seq_no,
        primary_term: meta.primary_term,
    }
}

/// Checks that need no reads.
fn stateless_rejection(amount: i64, from: &str, to: &str) -> Option<Rejection> {
    if amount <= 0 {
        return Some(Rejection::NonPositiveAmount { amount });
    }
    if from == to {
        return Some(Rejection::SameAccount {
            account: from.into(),
        });
    }
    None
}

/// Turns a final transaction into the result of [`Coordinator::transfer`].
fn transfer_outcome(txn: Transaction) -> Result<Transaction, TxnError> {
    if txn.state == TxnState::RolledBack {
        Err(TxnError::RolledBack {
            transaction: Box::new(txn),
        })
    } else {
        Ok(txn)
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

    // ----------------------------------------------------------------------------------------
    // Plumbing

    /// Runs `op`, retrying transient failures (429, 5xx, transport) per the [`RetryPolicy`].
    pub(super) async fn retrying<T, F, Fut>(&self, mut op: F) -> Result<T, EsError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, EsError>>,
    {
        let mut backoff = Backoff::new(self.retry.initial, self.retry.max);
        let mut attempt = 1;
        loop {
            match op().await {
                Err(e) if e.is_transient() && attempt < self.retry.attempts => {
                    let delay = backoff.next_delay();
                    debug!(error = %e, attempt, ?delay, "transient Elasticsearch failure; retrying");
                    attempt += 1;
                    tokio::time::sleep(delay).await;
                }
                other => return other,
            }
        }
    }

    async fn hook(&self, txn: &str, point: HookPoint) -> Result<(), TxnError> {
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

    async fn must_read_txn(&self, id: &str) -> Result<Transaction, TxnError> {
        self.read_txn(id).await?.ok_or_else(|| TxnError::NotFound {
            id: id.into(),
            index: self.settings.transactions_index.clone(),
        })
    }

    /// Parses an account from a search hit.
    pub(super) fn account_from_doc(&self, doc: Doc) -> Result<Option<Account>, TxnError> {
        Ok(Some(
            AccountDoc::parse(&self.settings.accounts_index, doc)?.account(),
        ))
    }

    async fn read_account(&self, id: &str) -> Result<Option<AccountDoc>, TxnError> {
        if validate_id("account", id).is_err() {
            return Ok(None);
        }
        let index = &self.settings.accounts_index;
        let doc = self
            .retrying(|| self.store.get(index, id))
            .await
            .map_err(|e| store_err(format!("reading account `{id}`"), e))?;
        doc.map(|d| AccountDoc::parse(index, d)).transpose()
    }

    /// Writes an account conditionally on the version it was read at.
    async fn write_account(&self, acct: &AccountDoc) -> Result<DocMeta, EsError> {
        let index = &self.settings.accounts_index;
        let source = acct.to_source();
        self.retrying(|| {
            self.store
                .index(index, &acct.id, &source, if_match(acct.meta), Refresh::No)
        })
        .await
    }

    async fn lock(
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

    async fn unlock(&self, guard: Option<Box<dyn Guard>>) {
        if let Some(guard) = guard {
            if let Err(e) = guard.unlock().await {
                debug!(error = %e, "releasing a transaction lock failed; it expires with its session or lease");
            }
        }
    }

    // ----------------------------------------------------------------------------------------
    // Accounts and reads

    /// Creates an account with an initial balance. Never overwrites: if the account exists with
    /// the same balance and nothing pending it returns `Ok(false)`, otherwise
    /// [`TxnError::AccountExists`].
    ///
    /// # Errors
    /// [`TxnError::InvalidId`], [`TxnError::AccountExists`], [`TxnError::Store`].
    ///
    /// # Cancellation safety
    /// Cancel-safe: a repeated call is recognised.
    pub async fn create_account(&self, id: &str, balance: i64) -> Result<bool, TxnError> {
        validate_id("account", id)?;
        self.ensure_indices().await?;
        let index = &self.settings.accounts_index;
        let source = json!({ "balance": balance, "pending_transactions": [] });
        match self
            .retrying(|| {
                self.store
                    .index(index, id, &source, WriteCondition::Create, Refresh::No)
            })
            .await
        {
            Ok(_) => Ok(true),
            Err(EsError::Conflict { .. }) => {
                let existing = self.read_account(id).await?;
                match existing {
                    Some(a) if a.balance == balance && a.pending.is_empty() => Ok(false),
                    Some(a) => Err(TxnError::AccountExists {
                        id: id.into(),
                        balance: a.balance,
                        pending: a.pending.len(),
                    }),
                    None => Err(TxnError::AccountExists {
                        id: id.into(),
                        balance: 0,
                        pending: 0,
                    }),
                }
            }
            Err(e) => Err(store_err(format!("creating account `{id}`"), e)),
        }
    }

    /// Overwrites an account with `balance` and no pending transactions, whatever it held.
    /// Meant for demos and tests: doing it while transactions touch the account breaks the
    /// conservation of units.
    ///
    /// # Errors
    /// [`TxnError::InvalidId`], [`TxnError::Store`].
    ///
    /// # Cancellation safety
    /// Cancel-safe: the write is idempotent.
    pub async fn reset_account(&self, id: &str, balance: i64) -> Result<(), TxnError> {
        validate_id("account", id)?;
        self.ensure_indices().await?;
        let index = &self.settings.accounts_index;
        let source = json!({ "balance": balance, "pending_transactions": [] });
        self.retrying(|| {
            self.store
                .index(index, id, &source, WriteCondition::Always, Refresh::No)
        })
        .await
        .map(|_| ())
        .map_err(|e| store_err(format!("resetting account `{id}`"), e))
    }

    /// Reads an account (realtime).
    ///
    /// # Errors
    /// [`TxnError::Store`], [`TxnError::Corrupt`].
    ///
    /// # Cancellation safety
    /// Cancel-safe: read only.
    pub async fn account(&self, id: &str) -> Result<Option<Account>, TxnError> {
        Ok(self.read_account(id).await?.map(|a| a.account()))
    }

    /// Reads a transaction (realtime).
    ///
    /// # Errors
    /// [`TxnError::InvalidId`], [`TxnError::Store`], [`TxnError::Corrupt`].
    ///
    /// # Cancellation safety
    /// Cancel-safe: read only.
    pub async fn transaction(&self, id: &str) -> Result<Option<Transaction>, TxnError> {
        validate_id("transaction", id)?;
        self.read_txn(id).await
    }

    // ----------------------------------------------------------------------------------------
    // Creation

    /// Checks a transfer: the stateless checks, then that both accounts exist and (unless
    /// overdrafts are allowed) that the source holds the amount.
    async fn rejection(
        &self,
        amount: i64,
        from: &str,
        to: &str,
    ) -> Result<Option<Rejection>, TxnError> {
        if let Some(r) = stateless_rejection(amount, from, to) {
            return Ok(Some(r));
        }
        let Some(src) = self.read_account(from).await? else {
            return Ok(Some(Rejection::UnknownAccount {
                account: from.into(),
            }));
        };
        let Some(dst) = self.read_account(to).await? else {
            return Ok(Some(Rejection::UnknownAccount { account: to.into() }));
        };
        if !self.settings.allow_overdraft && src.balance < amount {
            return Ok(Some(Rejection::Overdraft {
                account: from.into(),
                balance: src.balance,
                amount,
            }));
        }
        if src.balance.checked_sub(amount).is_none() {
            return Ok(Some(Rejection::Overflow {
                account: from.into(),
            }));
        }
        if dst.balance.checked_add(amount).is_none() {
            return Ok(Some(Rejection::Overflow { account: to.into() }));
        }
        Ok(None)
    }

    fn validate_request(req: &TransferRequest) -> Result<(), TxnError> {
        validate_id("transaction", &req.id)?;
        validate_id("account", &req.from)?;
        validate_id("account", &req.to)?;
        if let Some(reason) = stateless_rejection(req.amount, &req.from, &req.to) {
            return Err(TxnError::Rejected {
                id: req.id.clone(),
                reason,
            });
        }
        Ok(())
    }

    /// The stored transaction if it is the same transfer as `req`, else [`TxnError::IdConflict`].
    fn same_transfer(
        existing: Transaction,
        req: &TransferRequest,
    ) -> Result<Transaction, TxnError> {
        if existing.amount == req.amount
            && existing.src_acct == req.from
            && existing.dest_acct == req.to
        {
            Ok(existing)
        } else {
            Err(TxnError::IdConflict {
                id: req.id.clone(),
                existing: existing.describe(),
                requested: req.describe(),
            })
        }
    }

    /// `_create` of the transaction document; a conflict is a replay (an earlier attempt whose
    /// reply was lost, or the same request sent twice), recognised by its content.
    async fn create(&self, req: &TransferRequest) -> Result<Transaction, TxnError> {
        let now = now_rfc3339();
        let mut txn = Transaction {
            id: req.id.clone(),
            amount: req.amount,
            src_acct: req.from.clone(),
            dest_acct: req.to.clone(),
            state: TxnState::Created,
            creation_time: now.clone(),
            modification_time: now,
            reason: None,
            meta: DocMeta {
                seq_no: -1,
                primary_term: -1,
                version: 0,
            },
        };
        let index = &self.settings.transactions_index;
        let source = txn.to_source();
        self.hook(&txn.id, HookPoint::BeforeWrite(Step::Create))
            .await?;
        match self
            .retrying(|| {
                self.store
                    .index(index, &txn.id, &source, WriteCondition::Create, Refresh::No)
            })
            .await
        {
            Ok(meta) => {
                txn.meta = meta;
                debug!(txn = %txn.id, "transaction created");
            }
            Err(EsError::Conflict { .. }) => {
                let existing = self.must_read_txn(&txn.id).await?;
                txn = Self::same_transfer(existing, req)?;
                debug!(txn = %txn.id, state = %txn.state, "transaction already created (replay)");
            }
            Err(e) => return Err(store_err(format!("creating transaction `{}`", txn.id), e)),
        }
        self.hook(&txn.id, HookPoint::After(Step::Create)).await?;
        Ok(txn)
    }

    /// Logs a transfer (state `created`) without running it, as the article's "respond at once,
    /// process in another thread" variant; [`Coordinator::resume`] or recovery runs it. Replays
    /// return the stored transaction.
    ///
    /// # Errors
    /// [`TxnError::Rejected`] (nothing written), [`TxnError::IdConflict`], [`TxnError::InvalidId`],
    /// [`TxnError::Store`].
    ///
    /// # Cancellation safety
    /// Cancel-safe: a create that may have been applied is recognised when the request is repeated.
    #[instrument(skip(self, req), fields(txn = %req.id))]
    pub async fn submit(&self, req: TransferRequest) -> Result<Transaction, TxnError> {
        Self::validate_request(&req)?;
        self.ensure_indices().await?;
        if let Some(existing) = self.read_txn(&req.id).await? {
            return Self::same_transfer(existing, &req);
        }
        if let Some(reason) = self.rejection(req.amount, &req.from, &req.to).await? {
            return Err(TxnError::Rejected { id: req.id, reason });
        }
        self.create(&req).await
    }

    /// Runs a transfer to its end: logs it (`_create` with the request's id), then drives it
    /// through the core steps.
    ///
    /// A request whose id is already logged is a replay: the same transfer is resumed from its
    /// stored state (never created twice, never applied twice), a different transfer under that
    /// id is refused.
    ///
    /// # Errors
    /// - [`TxnError::Rejected`]: bad input or a failed check, nothing was written;
    /// - [`TxnError::RolledBack`]: the transaction was logged and then rolled back (a check failed
    ///   at a later step, or someone rolled it back); the returned transaction has the reason;
    /// - [`TxnError::IdConflict`], [`TxnError::InvalidId`];
    /// - [`TxnError::Busy`]: another worker holds the transaction's lock;
    /// - [`TxnError::Store`], [`TxnError::Contention`], [`TxnError::Interrupted`]: the work
    ///   stopped; the logged transaction is resumed by recovery.
    ///
    /// # Cancellation safety
    /// Cancel-safe in the protocol's sense: dropping the future leaves the transaction in a stored
    /// state from which recovery (or a replay of the request) finishes or rolls it back.
    #[instrument(skip(self, req), fields(txn = %req.id))]
    pub async fn transfer(&self, req: TransferRequest) -> Result<Transaction, TxnError> {
        Self::validate_request(&req)?;
        self.ensure_indices().await?;
        let guard = self.lock(&req.id, LockType::Foreground, None).await?;
        let result = self.transfer_locked(&req).await;
        self.unlock(guard).await;
        transfer_outcome(result?)
    }

    async fn transfer_locked(&self, req: &TransferRequest) -> Result<Transaction, TxnError> {
        let txn = match self.read_txn(&req.id).await? {
            Some(existing) => Self::same_transfer(existing, req)?,
            None => {
                if let Some(reason) = self.rejection(req.amount, &req.from, &req.to).await? {
                    return Err(TxnError::Rejected {
                        id: req.id.clone(),
                        reason,
                    });
                }
                self.create(req).await?
            }
        };
        self.drive(txn).await
    }

    /// Drives a logged transaction from its stored state to `finished` or `rolled-back`.
    ///
    /// # Errors
    /// [`TxnError::NotFound`], [`TxnError::Busy`], [`TxnError::Store`], [`TxnError::Contention`],
    /// [`TxnError::Interrupted`], [`TxnError::Corrupt`]. A rollback is not an error here: check
    /// the returned state.
    ///
    /// # Cancellation safety
    /// Cancel-safe in the protocol's sense (see [`Coordinator::transfer`]).
    #[instrument(skip(self))]
    pub async fn resume(&self, id: &str) -> Result<Transaction, TxnError> {
        validate_id("transaction", id)?;
        self.ensure_indices().await?;
        let guard = self.lock(id, LockType::Foreground, None).await?;
        let result = async { self.drive(self.must_read_txn(id).await?).await }.await;
        self.unlock(guard).await;
        result
    }

    /// Rolls a transaction back: `created → rolled-back`, or `pending → terminating →
    /// rolled-back` with the amount given back wherever it is pending. `reason` is stored.
    /// Rolling back a rolled-back transaction returns it unchanged.
    ///
    /// # Errors
    /// [`TxnError::NotRollbackable`] for a committed or finished transaction (a committed one is
    /// driven to `finished` first: committed transactions always finish); [`TxnError::NotFound`],
    /// [`TxnError::Busy`], [`TxnError::Store`], [`TxnError::Contention`],
    /// [`TxnError::Interrupted`].
    ///
    /// # Cancellation safety
    /// Cancel-safe in the protocol's sense: once `terminating` is stored, recovery completes the
    /// rollback.
    #[instrument(skip(self))]
    pub async fn rollback(&self, id: &str, reason: &str) -> Result<Transaction, TxnError> {
        validate_id("transaction", id)?;
        self.ensure_indices().await?;
        let guard = self.lock(id, LockType::Foreground, None).await?;
        let result = self.rollback_locked(id, reason).await;
        self.unlock(guard).await;
        result
    }

    async fn rollback_locked(&self, id: &str, reason: &str) -> Result<Transaction, TxnError> {
        let reason = Rejection::Requested {
            reason: reason.to_string(),
        }
        .to_string();
        let mut txn = self.must_read_txn(id).await?;
        loop {
            txn = match txn.state {
                TxnState::Created | TxnState::Pending => self.start_rollback(&txn, &reason).await?,
                TxnState::Terminating => return self.drive(txn).await,
                TxnState::RolledBack => return Ok(txn),
                TxnState::Committed => {
                    let done = self.drive(txn).await?;
                    return Err(TxnError::NotRollbackable {
                        id: id.into(),
                        state: done.state,
                    });
                }
                TxnState::Finished => {
                    return Err(TxnError::NotRollbackable {
                        id: id.into(),
                        state: txn.state,
                    })
                }
            };
        }
    }

    // ----------------------------------------------------------------------------------------
    // The state machine

    /// Runs a transaction from its state until it is final.
    pub(super) async fn drive(&self, mut txn: Transaction) -> Result<Transaction, TxnError> {
        loop {
            txn = match txn.state {
                TxnState::Created => self.run_created(txn).await?,
                TxnState::Pending => self.run_pending(txn).await?,
                TxnState::Committed => self.run_committed(txn).await?,
                TxnState::Terminating => self.run_terminating(txn).await?,
                TxnState::Finished | TxnState::RolledBack => return Ok(txn),
            };
        }
    }

    /// `created`: check, then `pending` (or `rolled-back` with the reason).
    async fn run_created(&self, txn: Transaction) -> Result<Transaction, TxnError> {
        if let Some(reason) = self
            .rejection(txn.amount, &txn.src_acct, &txn.dest_acct)
            .await?
        {
            info!(txn = %txn.id, %reason, "rolling back a created transaction that fails its checks");
            return self.start_rollback(&txn, &reason.to_string()).await;
        }
        self.transition(&txn, TxnState::Pending, None, Step::MarkPending)
            .await
    }

    /// `pending`: apply to source and destination, then `committed` (or `terminating` when an
    /// account refuses the transaction).
    async fn run_pending(&self, txn: Transaction) -> Result<Transaction, TxnError> {
        let mut current = txn;
        for (side, step) in [
            (Side::Source, Step::ApplySource),
            (Side::Destination, Step::ApplyDestination),
        ] {
            current = match self.apply(&current, side, step).await? {
                Applied::Done(t) => t,
                Applied::StateChanged(t) => return Ok(t),
                Applied::Reject(t, reason) => {
                    info!(txn = %t.id, %reason, "rolling back a pending transaction an account refuses");
                    return self.start_rollback(&t, &reason.to_string()).await;
                }
            };
        }
        self.transition(&current, TxnState::Committed, None, Step::MarkCommitted)
            .await
    }

    /// `committed`: remove the id from source and destination, then `finished`.
    async fn run_committed(&self, txn: Transaction) -> Result<Transaction, TxnError> {
        self.settle(&txn, Side::Source, Step::RemoveSource, false)
            .await?;
        self.settle(&txn, Side::Destination, Step::RemoveDestination, false)
            .await?;
        self.transition(&txn, TxnState::Finished, None, Step::MarkFinished)
            .await
    }

    /// `terminating`: give the amount back wherever the id is pending, then `rolled-back`.
    async fn run_terminating(&self, txn: Transaction) -> Result<Transaction, TxnError> {
        self.settle(&txn, Side::Source, Step::UndoSource, true)
            .await?;
        self.settle(&txn, Side::Destination, Step::UndoDestination, true)
            .await?;
        self.transition(&txn, TxnState::RolledBack, None, Step::MarkRolledBack)
            .await
    }

    /// Starts rolling back a `created` transaction (to `rolled-back`: nothing was applied yet) or a
    /// `pending` one (to `terminating`, from where the amounts are given back), recording
    /// `reason`. A transaction in any other state is returned unchanged.
    async fn start_rollback(
        &self,
        txn: &Transaction,
        reason: &str,
    ) -> Result<Transaction, TxnError> {
        let (to, step) = match txn.state {
            TxnState::Created => (TxnState::RolledBack, Step::MarkRolledBack),
            TxnState::Pending => (TxnState::Terminating, Step::MarkTerminating),
            _ => return Ok(txn.clone()),
        };
        self.transition(txn, to, Some(reason), step).await
    }

    /// Moves the transaction from its state to `to`, conditionally on the version read. When the
    /// stored state is no longer the expected one (another worker moved it), returns the stored
    /// transaction unchanged: the caller continues from that state.
    async fn transition(
        &self,
        txn: &Transaction,
        to: TxnState,
        reason: Option<&str>,
        step: Step,
    ) -> Result<Transaction, TxnError> {
        let from = txn.state;
        let index = &self.settings.transactions_index;
        let mut current = txn.clone();
        let mut conflicts = Conflicts::new();
        loop {
            if current.state != from {
                debug!(txn = %current.id, expected = %from, found = %current.state, "state already moved on");
                if current.state == to {
                    self.hook(&current.id, HookPoint::After(step)).await?;
                }
                return Ok(current);
            }
            let mut next = current.clone();
            next.state = to;
            next.modification_time = now_rfc3339();
            if let Some(r) = reason {
                next.reason = Some(r.to_string());
            }
            let source = next.to_source();
            self.hook(&current.id, HookPoint::BeforeWrite(step)).await?;
            match self
                .retrying(|| {
                    self.store.index(
                        index,
                        &current.id,
                        &source,
                        if_match(current.meta),
                        Refresh::No,
                    )
                })
                .await
            {
                Ok(meta) => {
                    next.meta = meta;
                    debug!(txn = %next.id, %from, %to, "state changed");
                    self.hook(&next.id, HookPoint::After(step)).await?;
                    return Ok(next);
                }
                Err(EsError::Conflict { .. }) => {
                    conflicts
                        .record(&current.id, step, index, &current.id)
                        .await?;
                    current = self.must_read_txn(&current.id).await?;
                }
                Err(e) => {
                    return Err(store_err(
                        format!("step {step} of transaction `{}`", current.id),
                        e,
                    ))
                }
            }
        }
    }

    /// Applies a pending transaction to one account: balance changed and id added in one
    /// conditional write, skipped when the id is already there.
    ///
    /// The transaction is re-read *after* the account and must still be `pending`: together with
    /// the conditional write and with undo always writing the account, this keeps a stale worker
    /// from applying a transaction that was meanwhile settled or rolled back (see
    /// `docs/transactions.md`).
    async fn apply(&self, txn: &Transaction, side: Side, step: Step) -> Result<Applied, TxnError> {
        let account = side.account(txn);
        let delta = side.delta(txn.amount);
        let mut conflicts = Conflicts::new();
        loop {
            let acct = self.read_account(account).await?;
            let current = self.must_read_txn(&txn.id).await?;
            if current.state != TxnState::Pending {
                return Ok(Applied::StateChanged(current));
            }
            let Some(mut acct) = acct else {
                return Ok(Applied::Reject(
                    current,
                    Rejection::UnknownAccount {
                        account: account.into(),
                    },
                ));
            };
            if acct.pending.contains(&txn.id) {
                debug!(txn = %txn.id, account, "already applied");
                self.hook(&txn.id, HookPoint::After(step)).await?;
                return Ok(Applied::Done(current));
            }
            let Some(balance) = acct.balance.checked_add(delta) else {
                return Ok(Applied::Reject(
                    current,
                    Rejection::Overflow {
                        account: account.into(),
                    },
                ));
            };
            if side == Side::Source && balance < 0 && !self.settings.allow_overdraft {
                let reason = Rejection::Overdraft {
                    account: account.into(),
                    balance: acct.balance,
                    amount: txn.amount,
                };
                return Ok(Applied::Reject(current, reason));
            }
            acct.balance = balance;
            acct.pending.push(txn.id.clone());
            if self
                .write_account_step(&txn.id, step, &acct, &mut conflicts)
                .await?
            {
                debug!(txn = %txn.id, account, delta, "applied");
                self.hook(&txn.id, HookPoint::After(step)).await?;
                return Ok(Applied::Done(current));
            }
        }
    }

    /// Removes the id from one account (`undo == false`, after commit) or gives the amount back
    /// where the id is pending (`undo == true`, during rollback).
    ///
    /// An undo writes the account even when the id is not there (an unchanged copy, which still
    /// bumps `_seq_no`): an apply that read the account before the transaction left `pending` then
    /// fails its conditional write, re-reads, and sees `terminating`.
    async fn settle(
        &self,
        txn: &Transaction,
        side: Side,
        step: Step,
        undo: bool,
    ) -> Result<(), TxnError> {
        let account = side.account(txn);
        let mut conflicts = Conflicts::new();
        loop {
            let Some(mut acct) = self.read_account(account).await? else {
                warn!(txn = %txn.id, account, %step, "account does not exist; nothing to settle there");
                return self.hook(&txn.id, HookPoint::After(step)).await;
            };
            match acct.pending.iter().position(|p| *p == txn.id) {
                Some(pos) => {
                    acct.pending.remove(pos);
                    if undo {
                        acct.balance = acct.balance.saturating_sub(side.delta(txn.amount));
                    }
                }
                None if !undo => {
                    debug!(txn = %txn.id, account, "already removed");
                    return self.hook(&txn.id, HookPoint::After(step)).await;
                }
                None => {
                    debug!(txn = %txn.id, account, "not applied here; writing the account unchanged to fence stale applies")
                }
            }
            if self
                .write_account_step(&txn.id, step, &acct, &mut conflicts)
                .await?
            {
                return self.hook(&txn.id, HookPoint::After(step)).await;
            }
        }
    }

    /// Writes `acct` for `step` of transaction `txn_id`, after the step's `BeforeWrite` hook.
    /// `Ok(true)` once written; `Ok(false)` when the account changed since it was read (the
    /// conflict is counted in `conflicts`): read it again and retry.
    async fn write_account_step(
        &self,
        txn_id: &str,
        step: Step,
        acct: &AccountDoc,
        conflicts: &mut Conflicts,
    ) -> Result<bool, TxnError> {
        self.hook(txn_id, HookPoint::BeforeWrite(step)).await?;
        match self.write_account(acct).await {
            Ok(_) => Ok(true),
            Err(EsError::Conflict { .. }) => {
                conflicts
                    .record(txn_id, step, &self.settings.accounts_index, &acct.id)
                    .await?;
                Ok(false)
            }
            Err(e) => Err(store_err(
                format!("step {step} of transaction `{txn_id}`"),
                e,
            )),
        }
    }

    /// Locks `id` for recovery (background, short timeout) and drives it if it is still in
    /// flight and still older than `cutoff`.
    pub(super) async fn recover_locked(
        &self,
        id: &str,
        cutoff: std::time::SystemTime,
    ) -> Result<Option<Transaction>, TxnError> {
        let Some(txn) = self.read_txn(id).await? else {
            return Ok(None);
        };
        if txn.state.is_final() || txn.modified_at().is_some_and(|m| m > cutoff) {
            return Ok(None);
        }
        let guard = self
            .lock(id, LockType::Background, Some(self.recovery_lock_timeout))
            .await?;
        let result = async {
            let txn = self.must_read_txn(id).await?;
            if txn.state.is_final() {
                return Ok(None);
            }
            info!(txn = id, state = %txn.state, "recovering");
            self.drive(txn).await.map(Some)
        }
        .await;
        self.unlock(guard).await;
        result
    }
}
