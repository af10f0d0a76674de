//! The state machine: every step of a transaction (`created → pending → committed → finished`,
//! or `→ terminating → rolled-back`) as a conditional write, so that any number of workers can
//! drive the same transaction and an amount is never applied twice.

use std::time::Duration;

use tracing::{debug, info, warn};

use super::accounts::AccountDoc;
use super::coordinator::{if_match, store_err};
use super::{
    now_rfc3339, Coordinator, HookPoint, Rejection, Step, Transaction, TxnError, TxnState,
};
use crate::backoff::Backoff;
use crate::es::{EsError, Refresh};

/// Conflicting writes tolerated on one document within one step before giving up (the transaction
/// then stays as stored, for recovery).
const MAX_CONFLICTS: u32 = 200;

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

impl Coordinator {
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
    pub(super) async fn start_rollback(
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
}
