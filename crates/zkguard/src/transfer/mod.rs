//! The account-transfer recipe: a two-phase commit with a transaction log between account
//! documents (its items are also at their former paths under `zkguard::txn`).
//!
//! Elasticsearch updates one document atomically, never several. A [`Coordinator`] moves units
//! (money, stock, quota) from one account document to another so that the movement happens
//! completely or not at all, even when the process dies between two writes:
//!
//! - the **transactions index** is the log: one document per transfer (`amount`, `src_acct`,
//!   `dest_acct`, `transaction_state`, `creation_time`, `modification_time`, `reason`);
//! - the **accounts index** holds `balance` and `pending_transactions`, the ids of the transactions
//!   applied to the account but not yet settled.
//!
//! A transfer goes `created → pending → committed → finished`; between `pending` and `committed`
//! it is applied to the source and the destination (balance changed and id added to
//! `pending_transactions` in one write), between `committed` and `finished` the id is removed from
//! both. A rollback goes `created → rolled-back`, or `pending → terminating → rolled-back` with the
//! amount given back wherever the id is still pending. Committed transactions always finish.
//!
//! Every step is a whole-document write conditional on `if_seq_no`/`if_primary_term`, re-read and
//! re-decided on a conflict; no painless script and no ingest pipeline is used, so the protocol runs
//! on Elasticsearch, OpenSearch and servers without scripting. Running a step twice, or two workers
//! on the same transaction, never applies an amount twice; `docs/transactions.md` gives the
//! argument. [`Coordinator::recover_once`] resumes transactions left behind by a crash.
//!
//! ```no_run
//! # async fn demo(store: std::sync::Arc<dyn zkguard::es::DocStore>) -> Result<(), zkguard::txn::TxnError> {
//! use zkguard::config::Settings;
//! use zkguard::txn::{Coordinator, TransferRequest};
//!
//! let coordinator = Coordinator::new(store, Settings::default().txn);
//! coordinator.create_account("A", 500).await?;
//! coordinator.create_account("B", 500).await?;
//! let done = coordinator.transfer(TransferRequest::new("A", "B", 100).with_id("order-42")).await?;
//! assert_eq!(done.state, zkguard::txn::TxnState::Finished);
//! # Ok(()) }
//! ```

use std::fmt;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use serde::Serialize;
use serde_json::{json, Value};

use crate::es::{Doc, DocMeta, EsError};

mod accounts;
mod audit;
mod coordinator;
mod recovery;
mod requests;
mod steps;

pub use audit::{Audit, AUDIT_LIMIT};
pub use coordinator::Coordinator;
pub use recovery::RecoveryReport;

/// The longest transaction or account id, in bytes (a transaction id becomes part of a lock
/// monitor name, `txn:<id>`, which is limited to 200 bytes).
pub const MAX_ID_LEN: usize = 190;

/// The state of a transaction, as stored in `transaction_state`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum TxnState {
    /// Logged, nothing applied yet.
    Created,
    /// Being applied to the source and destination accounts.
    Pending,
    /// Applied to both accounts; the pending ids are being removed. Never rolled back.
    Committed,
    /// Done (final).
    Finished,
    /// Being rolled back: the amount is given back wherever the id is pending.
    Terminating,
    /// Rolled back (final); `reason` says why.
    RolledBack,
}

impl TxnState {
    /// Every state, in protocol order.
    pub const ALL: [TxnState; 6] = [
        Self::Created,
        Self::Pending,
        Self::Committed,
        Self::Finished,
        Self::Terminating,
        Self::RolledBack,
    ];

    /// The states recovery resumes.
    pub const IN_FLIGHT: [TxnState; 4] = [
        Self::Created,
        Self::Pending,
        Self::Committed,
        Self::Terminating,
    ];

    /// The stored name (`rolled-back`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Pending => "pending",
            Self::Committed => "committed",
            Self::Finished => "finished",
            Self::Terminating => "terminating",
            Self::RolledBack => "rolled-back",
        }
    }

    /// Whether no step follows (`finished` or `rolled-back`).
    pub fn is_final(self) -> bool {
        matches!(self, Self::Finished | Self::RolledBack)
    }
}

impl fmt::Display for TxnState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TxnState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_name(Self::ALL, Self::as_str, s, "transaction state")
    }
}

/// The item of `all` whose `name` is `s`; the error names the `what` that was not understood and
/// every accepted name.
fn parse_name<T: Copy, const N: usize>(
    all: [T; N],
    name: fn(T) -> &'static str,
    s: &str,
    what: &str,
) -> Result<T, String> {
    all.into_iter().find(|x| name(*x) == s).ok_or_else(|| {
        format!(
            "unknown {what} `{s}`: expected one of {}",
            all.map(name).join(", ")
        )
    })
}

/// One step of the protocol; [`StepHook`]s are called around each of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Step {
    /// `_create` of the transaction document (state `created`).
    Create,
    /// `created → pending`.
    MarkPending,
    /// Source: balance -= amount, id added to `pending_transactions`.
    ApplySource,
    /// Destination: balance += amount, id added to `pending_transactions`.
    ApplyDestination,
    /// `pending → committed`.
    MarkCommitted,
    /// Id removed from the source's `pending_transactions`.
    RemoveSource,
    /// Id removed from the destination's `pending_transactions`.
    RemoveDestination,
    /// `committed → finished`.
    MarkFinished,
    /// `pending → terminating` (rollback of a pending transaction).
    MarkTerminating,
    /// Source: amount given back if the id is pending there.
    UndoSource,
    /// Destination: amount taken back if the id is pending there.
    UndoDestination,
    /// `created → rolled-back` or `terminating → rolled-back`.
    MarkRolledBack,
}

impl Step {
    /// Every step: the core steps, then the rollback steps.
    pub const ALL: [Step; 12] = [
        Self::Create,
        Self::MarkPending,
        Self::ApplySource,
        Self::ApplyDestination,
        Self::MarkCommitted,
        Self::RemoveSource,
        Self::RemoveDestination,
        Self::MarkFinished,
        Self::MarkTerminating,
        Self::UndoSource,
        Self::UndoDestination,
        Self::MarkRolledBack,
    ];

    /// The kebab-case name (`apply-source`, ...), as accepted by `zkguard txn transfer --crash-after`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::MarkPending => "mark-pending",
            Self::ApplySource => "apply-source",
            Self::ApplyDestination => "apply-destination",
            Self::MarkCommitted => "mark-committed",
            Self::RemoveSource => "remove-source",
            Self::RemoveDestination => "remove-destination",
            Self::MarkFinished => "mark-finished",
            Self::MarkTerminating => "mark-terminating",
            Self::UndoSource => "undo-source",
            Self::UndoDestination => "undo-destination",
            Self::MarkRolledBack => "mark-rolled-back",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Step {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_name(Self::ALL, Self::as_str, s, "step")
    }
}

/// Where a [`StepHook`] is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[doc(hidden)] // fault injection for zkguard's own tests and `zkguard txn`
pub enum HookPoint {
    /// After the step's reads and decision, just before its conditional write (not called when the
    /// step finds nothing to write).
    BeforeWrite(Step),
    /// After the step completed (it wrote, or found its work already done).
    After(Step),
}

impl fmt::Display for HookPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BeforeWrite(step) => write!(f, "before the write of step {step}"),
            Self::After(step) => write!(f, "after step {step}"),
        }
    }
}

/// What the coordinator does after a [`StepHook`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[doc(hidden)] // fault injection for zkguard's own tests and `zkguard txn`
pub enum HookAction {
    /// Go on.
    Continue,
    /// Stop working on this transaction at once, as if the process had died there: the call
    /// returns [`TxnError::Interrupted`] and the transaction stays as stored, for recovery.
    Crash,
}

/// An injectable hook around every step: the crash-injection mechanism of zkguard's tests and of
/// `zkguard txn transfer --crash-after STEP`. It works in every build (no cargo feature, no global
/// registry), so concurrent tests can crash one worker or one transaction without touching others.
///
/// Closures `Fn(&str, HookPoint) -> HookAction` implement it.
#[async_trait]
#[doc(hidden)] // fault injection for zkguard's own tests and `zkguard txn`
pub trait StepHook: Send + Sync + 'static {
    /// Called with the transaction id at each [`HookPoint`]. May wait (tests use this to force an
    /// interleaving between workers).
    async fn at(&self, txn_id: &str, point: HookPoint) -> HookAction;
}

#[async_trait]
impl<F> StepHook for F
where
    F: Fn(&str, HookPoint) -> HookAction + Send + Sync + 'static,
{
    async fn at(&self, txn_id: &str, point: HookPoint) -> HookAction {
        self(txn_id, point)
    }
}

/// Why a transfer cannot happen. Stored as the `reason` of a rolled-back transaction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The amount is zero or negative.
    #[error("the amount must be positive, got {amount}; transfer a positive number of units")]
    NonPositiveAmount {
        /// The amount.
        amount: i64,
    },
    /// Source and destination are the same account.
    #[error("the source and the destination are the same account `{account}`; choose two different accounts")]
    SameAccount {
        /// The account.
        account: String,
    },
    /// An account does not exist.
    #[error("unknown account `{account}`; create it first (e.g. `zkguard txn init --accounts {account}=0`)")]
    UnknownAccount {
        /// The account.
        account: String,
    },
    /// The source has fewer units than the amount and overdrafts are not allowed.
    #[error("account `{account}` has {balance} units, fewer than the {amount} to transfer (txn.allow.overdraft is false)")]
    Overdraft {
        /// The source account.
        account: String,
        /// Its balance when checked.
        balance: i64,
        /// The amount.
        amount: i64,
    },
    /// A balance would leave the range of a 64-bit integer.
    #[error("the balance of account `{account}` would overflow")]
    Overflow {
        /// The account.
        account: String,
    },
    /// Rolled back on request ([`Coordinator::rollback`]).
    #[error("rolled back on request: {reason}")]
    Requested {
        /// The requester's reason.
        reason: String,
    },
}

/// Errors of the transaction layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TxnError {
    /// The transfer was refused before anything was written.
    #[error("transfer `{id}` rejected: {reason}")]
    Rejected {
        /// The transaction id.
        id: String,
        /// Why.
        reason: Rejection,
    },
    /// The transaction was created and then rolled back; `transaction.reason` says why.
    #[error("transaction `{}` was rolled back: {}", .transaction.id, .transaction.reason.as_deref().unwrap_or("no reason recorded"))]
    RolledBack {
        /// The transaction, in state `rolled-back`.
        transaction: Box<Transaction>,
    },
    /// A transaction with this id exists with different content.
    #[error("transaction id `{id}` is already used by a different transfer ({existing}), not {requested}; use a new id")]
    IdConflict {
        /// The id.
        id: String,
        /// The stored transfer.
        existing: String,
        /// The requested transfer.
        requested: String,
    },
    /// No transaction with this id.
    #[error(
        "no transaction `{id}` in index `{index}`; check the id (zkguard txn audit lists states)"
    )]
    NotFound {
        /// The id.
        id: String,
        /// The transactions index.
        index: String,
    },
    /// A rollback of a transaction that is committed or finished.
    #[error("transaction `{id}` is {state}: committed transactions are never rolled back; transfer the amount back with a new transaction")]
    NotRollbackable {
        /// The id.
        id: String,
        /// Its state now.
        state: TxnState,
    },
    /// Another worker holds the transaction's lock.
    #[error("transaction `{id}` is being processed by another worker (its lock is held); check it later with `zkguard txn show {id}`")]
    Busy {
        /// The id.
        id: String,
    },
    /// A [`StepHook`] stopped the work (injected crash).
    #[error("work on transaction `{id}` stopped {point} (injected crash); `zkguard txn recover` resumes it")]
    Interrupted {
        /// The id.
        id: String,
        /// Where.
        point: HookPoint,
    },
    /// `create_account` found the account with another balance.
    #[error("account `{id}` already exists with balance {balance} and {pending} pending transaction(s); accounts are never overwritten (use --reset to force)")]
    AccountExists {
        /// The account.
        id: String,
        /// Its balance.
        balance: i64,
        /// Number of pending transaction ids.
        pending: usize,
    },
    /// An id that cannot be used.
    #[error("invalid {kind} id {id:?}: {reason}")]
    InvalidId {
        /// `transaction` or `account`.
        kind: &'static str,
        /// The id.
        id: String,
        /// What is wrong.
        reason: String,
    },
    /// Writers kept changing a document; the transaction is left for recovery.
    #[error("too many conflicting writes on `{index}/{doc}` during step {step} of transaction `{id}`; recovery will resume it")]
    Contention {
        /// The transaction.
        id: String,
        /// The step.
        step: Step,
        /// The index.
        index: String,
        /// The document.
        doc: String,
    },
    /// A stored document is not what zkguard wrote.
    #[error("document `{index}/{id}` is malformed: {reason}; fix or delete it by hand")]
    Corrupt {
        /// Index.
        index: String,
        /// Document id.
        id: String,
        /// What is wrong.
        reason: String,
    },
    /// Elasticsearch failed (after retries for transient failures). A transaction already logged
    /// keeps its state and is resumed by recovery.
    #[error("Elasticsearch failed while {context}: {source}")]
    Store {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: EsError,
    },
}

impl TxnError {
    /// Whether the request itself was wrong (bad input), as opposed to a failure of the servers.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            Self::Rejected { .. }
                | Self::RolledBack { .. }
                | Self::IdConflict { .. }
                | Self::NotFound { .. }
                | Self::NotRollbackable { .. }
                | Self::AccountExists { .. }
                | Self::InvalidId { .. }
        )
    }
}

/// A transaction as stored in the transactions index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Transaction {
    /// The application-generated id (`_id`).
    pub id: String,
    /// Units moved.
    pub amount: i64,
    /// Source account id.
    pub src_acct: String,
    /// Destination account id.
    pub dest_acct: String,
    /// State.
    #[serde(rename = "transaction_state")]
    pub state: TxnState,
    /// When it was created (RFC 3339, UTC, written by zkguard).
    pub creation_time: String,
    /// When its state last changed (RFC 3339, UTC, written by zkguard).
    pub modification_time: String,
    /// Why it was rolled back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip)]
    meta: DocMeta,
}

impl Transaction {
    /// Concurrency metadata of the stored document this value was read from or written as.
    pub fn meta(&self) -> DocMeta {
        self.meta
    }

    /// `amount from src to dest`, for messages.
    pub fn describe(&self) -> String {
        format!(
            "{} from `{}` to `{}`",
            self.amount, self.src_acct, self.dest_acct
        )
    }

    /// The document source (everything but the id).
    pub(crate) fn to_source(&self) -> Value {
        let mut v = json!({
            "amount": self.amount,
            "src_acct": self.src_acct,
            "dest_acct": self.dest_acct,
            "transaction_state": self.state.as_str(),
            "creation_time": self.creation_time,
            "modification_time": self.modification_time,
        });
        if let Some(r) = &self.reason {
            v["reason"] = Value::String(r.clone());
        }
        v
    }

    pub(crate) fn from_doc(index: &str, doc: Doc) -> Result<Self, TxnError> {
        let corrupt = |reason: String| TxnError::Corrupt {
            index: index.to_string(),
            id: doc.id.clone(),
            reason,
        };
        let src = doc
            .source
            .as_object()
            .ok_or_else(|| corrupt("the source is not a JSON object".into()))?;
        let text = |field: &str| -> Result<String, TxnError> {
            src.get(field)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| corrupt(format!("field `{field}` is missing or not a string")))
        };
        let amount = src
            .get("amount")
            .and_then(Value::as_i64)
            .ok_or_else(|| corrupt("field `amount` is missing or not an integer".into()))?;
        let state = text("transaction_state")?
            .parse::<TxnState>()
            .map_err(corrupt)?;
        Ok(Self {
            amount,
            src_acct: text("src_acct")?,
            dest_acct: text("dest_acct")?,
            state,
            creation_time: text("creation_time")?,
            modification_time: text("modification_time")?,
            reason: src
                .get("reason")
                .and_then(Value::as_str)
                .map(str::to_string),
            meta: doc.meta,
            id: doc.id,
        })
    }

    /// When the state last changed, if `modification_time` parses.
    pub fn modified_at(&self) -> Option<SystemTime> {
        humantime::parse_rfc3339_weak(&self.modification_time).ok()
    }
}

/// An account as stored in the accounts index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Account {
    /// `_id`.
    pub id: String,
    /// Units.
    pub balance: i64,
    /// Transactions applied to this account and not yet settled.
    pub pending_transactions: Vec<String>,
}

/// A transfer to run: application id, source, destination, amount.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct TransferRequest {
    /// Transaction id; a random UUID unless set with [`TransferRequest::with_id`].
    pub id: String,
    /// Source account.
    pub from: String,
    /// Destination account.
    pub to: String,
    /// Units to move.
    pub amount: i64,
}

impl TransferRequest {
    /// A transfer with a fresh random id.
    pub fn new(from: impl Into<String>, to: impl Into<String>, amount: i64) -> Self {
        Self {
            id: uuid::Uuid::new_v4().to_string(),
            from: from.into(),
            to: to.into(),
            amount,
        }
    }

    /// Sets the application-generated id. Re-submitting the same id never creates a second
    /// transaction: the stored one is resumed instead.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    fn describe(&self) -> String {
        format!("{} from `{}` to `{}`", self.amount, self.from, self.to)
    }
}

/// How transient Elasticsearch failures (429, 5xx, transport) are retried inside one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct RetryPolicy {
    /// Attempts per request (at least 1).
    pub attempts: u32,
    /// First delay.
    pub initial: Duration,
    /// Largest delay.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 5,
            initial: Duration::from_millis(50),
            max: Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// From the background-retry settings (`elastic.request.retry.count`,
    /// `elastic.retry.backoff.initial`, `elastic.retry.backoff.max`).
    pub fn from_settings(s: &crate::config::RetrySettings) -> Self {
        Self {
            attempts: s.retry_count.max(1),
            initial: s.backoff_initial,
            max: s.backoff_max,
        }
    }
}

impl RetryPolicy {
    /// Runs `op`, retrying transient failures (429, 5xx, transport) with backoff.
    pub(crate) async fn run<T, F, Fut>(&self, mut op: F) -> Result<T, EsError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, EsError>>,
    {
        let mut backoff = crate::Backoff::new(self.initial, self.max);
        let mut attempt = 1;
        loop {
            match op().await {
                Err(e) if e.is_transient() && attempt < self.attempts => {
                    let delay = backoff.next_delay();
                    tracing::debug!(error = %e, attempt, ?delay, "transient Elasticsearch failure; retrying");
                    attempt += 1;
                    tokio::time::sleep(delay).await;
                }
                other => return other,
            }
        }
    }
}

/// Mappings of the accounts index.
pub(crate) fn accounts_mappings() -> Value {
    json!({
        "properties": {
            "balance": { "type": "long" },
            "pending_transactions": { "type": "keyword" }
        }
    })
}

/// Mappings of the transactions index.
pub(crate) fn transactions_mappings() -> Value {
    json!({
        "properties": {
            "amount": { "type": "long" },
            "src_acct": { "type": "keyword" },
            "dest_acct": { "type": "keyword" },
            "transaction_state": { "type": "keyword" },
            "creation_time": { "type": "date" },
            "modification_time": { "type": "date" },
            "reason": { "type": "text" }
        }
    })
}

/// Checks a transaction or account id: 1 to [`MAX_ID_LEN`] bytes, no `/`, whitespace or control
/// characters, not starting with `_`, not `.` or `..`.
///
/// # Errors
/// [`TxnError::InvalidId`] saying what is wrong.
pub(crate) fn validate_id(kind: &'static str, id: &str) -> Result<(), TxnError> {
    let bad = |reason: String| {
        Err(TxnError::InvalidId {
            kind,
            id: id.to_string(),
            reason,
        })
    };
    if id.is_empty() {
        return bad("it is empty".into());
    }
    if id.len() > MAX_ID_LEN {
        return bad(format!(
            "it is {} bytes long; the limit is {MAX_ID_LEN}",
            id.len()
        ));
    }
    if id == "." || id == ".." {
        return bad("`.` and `..` are not allowed".into());
    }
    if id.starts_with('_') {
        return bad("it starts with `_`, which Elasticsearch reserves".into());
    }
    if let Some(c) = id
        .chars()
        .find(|c| *c == '/' || c.is_whitespace() || c.is_control())
    {
        return bad(format!(
            "it contains {c:?}; use letters, digits and punctuation other than `/`"
        ));
    }
    Ok(())
}

/// The current time as zkguard writes it: RFC 3339, UTC, milliseconds.
pub(crate) fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in TxnState::ALL {
            assert_eq!(s.as_str().parse::<TxnState>().unwrap(), s);
            assert_eq!(
                serde_json::to_value(s).unwrap(),
                Value::String(s.as_str().into())
            );
        }
        for s in Step::ALL {
            assert_eq!(s.as_str().parse::<Step>().unwrap(), s);
        }
        assert!("rolledback"
            .parse::<TxnState>()
            .unwrap_err()
            .contains("rolled-back"));
    }

    #[test]
    fn ids() {
        for ok in ["A", "order-42", "3f2b:7", "ü"] {
            validate_id("account", ok).unwrap();
        }
        for (bad, needle) in [
            ("", "empty"),
            ("_x", "`_`"),
            ("a/b", "'/'"),
            ("a b", "' '"),
            ("..", "`.`"),
        ] {
            let e = validate_id("account", bad).unwrap_err().to_string();
            assert!(e.contains(needle), "{bad:?}: {e}");
        }
        assert!(validate_id("transaction", &"x".repeat(191)).is_err());
    }

    #[test]
    fn transaction_source_round_trip() {
        let t = Transaction {
            id: "t1".into(),
            amount: 7,
            src_acct: "A".into(),
            dest_acct: "B".into(),
            state: TxnState::RolledBack,
            creation_time: now_rfc3339(),
            modification_time: now_rfc3339(),
            reason: Some("why".into()),
            meta: DocMeta {
                seq_no: 3,
                primary_term: 1,
                version: 4,
            },
        };
        let doc = Doc {
            id: "t1".into(),
            source: t.to_source(),
            meta: t.meta,
        };
        assert_eq!(Transaction::from_doc("tx", doc).unwrap(), t);
        assert!(t.modified_at().is_some());
        let bad = Doc {
            id: "t2".into(),
            source: json!({"amount": "x"}),
            meta: t.meta,
        };
        assert!(Transaction::from_doc("tx", bad)
            .unwrap_err()
            .to_string()
            .contains("amount"));
    }
}
