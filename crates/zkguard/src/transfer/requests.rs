//! What callers ask of the coordinator: submit, transfer, resume and roll back a transaction,
//! read one, and the checks a transfer must pass before it is logged.

use tracing::{debug, instrument};

use super::coordinator::store_err;
use super::{
    now_rfc3339, validate_id, Coordinator, HookPoint, Rejection, Step, Transaction,
    TransferRequest, TxnError, TxnState,
};
use crate::es::{DocMeta, EsError, Refresh, WriteCondition};
use crate::lock::LockType;

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

    /// Checks a transfer: the stateless checks, then that both accounts exist and (unless
    /// overdrafts are allowed) that the source holds the amount.
    pub(super) async fn rejection(
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
}
