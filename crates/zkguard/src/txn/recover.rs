//! Recovery of document transactions: a committed one is finished, an undecided one undone,
//! each under fresh locks whose tokens fence the coordinator that stopped.

use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde_json::json;
use tracing::{info, warn, Instrument};

use super::decide::{DocStep, Recovery, Rules, Settle};
use super::engine::{canonical, clear_action, if_match, is_marked, store_err, Held, Locking};
use super::plan::{after_image, op_id, rewritten, stamped};
use super::record::{user_source, without_mark, TxnRecord};
use super::{MultiError, MultiState, Transactions};
use crate::es::BulkAction;
use crate::lock::LockType;
use crate::txn::now_rfc3339;

/// What one recovery pass over document transactions did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MultiRecovery {
    /// Undecided transactions found (older than the age asked for).
    pub examined: usize,
    /// Committed ones driven to `finished`.
    pub finished: Vec<String>,
    /// Undecided ones undone (`rolled-back`).
    pub rolled_back: Vec<String>,
    /// Skipped: a lock of theirs is held (their coordinator may be alive); the next pass tries
    /// again.
    pub busy: Vec<String>,
    /// Left as they are because of an error (id, error); the next pass tries again.
    pub failed: Vec<(String, String)>,
}

impl Transactions {
    /// One recovery pass: every transaction of the log still `pending`, `committed` or
    /// `rolling-back` and unchanged for at least `min_age` is locked (background locks, waiting
    /// up to `lock_wait` for each) and then finished (committed) or undone (the others).
    ///
    /// # Errors
    /// [`MultiError::Store`] when the log cannot be searched; a transaction's own failure is
    /// reported in [`MultiRecovery::failed`].
    ///
    /// # Cancellation safety
    /// Safe in outcome: a pass dropped half-way leaves each transaction for the next pass.
    pub async fn recover_once(
        &self,
        min_age: Duration,
        lock_wait: Duration,
    ) -> Result<MultiRecovery, MultiError> {
        self.ensure_index().await?;
        let index = &self.settings.log_index;
        self.retrying(|| self.store.refresh(index))
            .await
            .map_err(|e| store_err("refreshing the transaction log", e))?;
        let cutoff = SystemTime::now()
            .checked_sub(min_age)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let body = json!({
            "size": 1000,
            "query": { "bool": { "filter": [
                { "terms": { "state": ["pending", "committed", "rolling-back"] } },
                { "range": { "modified": {
                    "lte": humantime::format_rfc3339_millis(cutoff).to_string()
                } } }
            ] } },
            "sort": [{ "modified": { "order": "asc" } }],
        });
        let hits = self
            .retrying(|| self.store.search(index, &body))
            .await
            .map_err(|e| store_err("searching transactions to recover", e))?;
        let mut report = MultiRecovery {
            examined: hits.len(),
            ..MultiRecovery::default()
        };
        for hit in hits {
            let id = hit.id.clone();
            match self.recover(&id, lock_wait).await {
                Ok(Some(MultiState::Finished)) => report.finished.push(id),
                Ok(Some(MultiState::RolledBack)) => report.rolled_back.push(id),
                Ok(_) => report.busy.push(id),
                Err(e) => report.failed.push((id, e.to_string())),
            }
        }
        Ok(report)
    }

    /// Recovers transaction `id`: locks its documents (background, waiting up to `lock_wait`
    /// each), then finishes it if committed or undoes it otherwise. Returns the final state, or
    /// `None` when a lock was not acquired in time (left for later); a final transaction is
    /// answered as it is.
    ///
    /// # Errors
    /// [`MultiError::NotFound`]; [`MultiError::Store`] and the others of the steps (the
    /// transaction is left for the next try).
    ///
    /// # Cancellation safety
    /// Safe in outcome: dropped half-way, the transaction is left for the next try.
    pub async fn recover(
        &self,
        id: &str,
        lock_wait: Duration,
    ) -> Result<Option<MultiState>, MultiError> {
        let span = tracing::info_span!("document_transaction_recovery", txn = %id);
        async move {
            let record = self.get(id).await?.ok_or_else(|| MultiError::NotFound {
                id: id.to_string(),
                index: self.settings.log_index.clone(),
            })?;
            if record.state.is_final() {
                return Ok(Some(record.state));
            }
            let held = match self
                .lock_all(
                    &record.operations,
                    LockType::Background,
                    Some(lock_wait),
                    id,
                )
                .await?
            {
                Locking::Held(h) => h,
                Locking::TimedOut(monitor, _) => {
                    info!(%monitor, "a lock of the transaction is held; left for later");
                    return Ok(None);
                }
            };
            // Read again under the locks: the state may have moved since the search.
            let result = match self.get(id).await {
                Ok(Some(mut record)) => match Rules::PRODUCT.recovery(record.state) {
                    Recovery::Finish => self.finish(&mut record, &held).await,
                    Recovery::RollBack { .. } => {
                        let reason = record.reason.clone().unwrap_or_else(|| {
                            format!("undone by recovery: its coordinator stopped before the commit (the log said {})", record.state)
                        });
                        self.roll_back(&mut record, &held, &reason, true).await
                    }
                    Recovery::Nothing => Ok(()),
                }
                .map(|()| Some(record.state)),
                Ok(None) => Err(MultiError::NotFound {
                    id: id.to_string(),
                    index: self.settings.log_index.clone(),
                }),
                Err(e) => Err(e),
            };
            held.release(self.locks.as_ref()).await;
            if let Ok(Some(state)) = &result {
                info!(%state, "recovered");
            }
            result
        }
        .instrument(span)
        .await
    }

    /// Undoes `record` under `held`: the log goes `rolling-back` first (so that a coordinator
    /// that stalled can no longer commit), then every document marked by it gets its
    /// before-image back (a document absent before is deleted), and with `fence_all` every other
    /// participant that exists is rewritten as it is, so that all of them carry a token newer
    /// than the stalled coordinator's; then the log says `rolled-back`.
    pub(super) async fn roll_back(
        &self,
        record: &mut TxnRecord,
        held: &Held,
        reason: &str,
        fence_all: bool,
    ) -> Result<(), MultiError> {
        let id = record.transaction_id.clone();
        if let Recovery::RollBack { move_log: true } = Rules::PRODUCT.recovery(record.state) {
            record.state = MultiState::RollingBack;
            record.reason = Some(reason.to_string());
            record.modified = now_rfc3339();
            record.meta = self.log_cas(record).await?;
        }
        let docs = self.read_all(&record.operations).await?;
        let mut writes = Vec::new();
        for i in canonical(&record.operations) {
            let op = &record.operations[i];
            let token = held.token(&op.monitor_name());
            let doc = docs[i].as_ref();
            let undo_id = op_id(&id, i, true);
            let part = &record.participants[i];
            let how = Settle::RollBack { fence_all };
            match Rules::PRODUCT.settle_doc(how, is_marked(doc, record), doc.is_some()) {
                DocStep::Before => writes.push(match &part.before {
                    Some(before) => BulkAction::Index {
                        index: op.index.clone(),
                        id: op.id.clone(),
                        source: stamped(
                            self.stamp_window,
                            Some(user_source(before)),
                            doc.map(|d| &d.source),
                            &undo_id,
                            token,
                            None,
                        ),
                        condition: crate::write::fence::condition(token),
                    },
                    None => BulkAction::Delete {
                        index: op.index.clone(),
                        id: op.id.clone(),
                        condition: crate::write::fence::condition(token),
                    },
                }),
                DocStep::Fence => {
                    let doc = doc.expect("only an existing document is fenced");
                    writes.push(BulkAction::Index {
                        index: op.index.clone(),
                        id: op.id.clone(),
                        // A copy of this transaction's mark on a later write loses it here, so
                        // that the rewrite (whose version matches its stamp) is never taken for
                        // the transaction's own write.
                        source: without_mark(rewritten(&doc.source, token), &id),
                        condition: crate::write::fence::condition(token),
                    });
                }
                DocStep::Leave | DocStep::After => {}
            }
        }
        self.write_all(&id, &writes, "undoing").await?;
        record.state = MultiState::RolledBack;
        record.modified = now_rfc3339();
        record.meta = self.log_cas(record).await?;
        info!(txn = %id, %reason, "rolled back");
        Ok(())
    }

    /// Finishes committed `record` under `held`: every document still marked by it gets its
    /// after-image unmarked (a delete's tombstone is deleted); the others were cleared already
    /// or written since by someone newer, and are left as they are. Then the log says
    /// `finished`.
    async fn finish(&self, record: &mut TxnRecord, held: &Held) -> Result<(), MultiError> {
        let id = record.transaction_id.clone();
        let docs = self.read_all(&record.operations).await?;
        let mut writes = Vec::new();
        for i in canonical(&record.operations) {
            let doc = docs[i].as_ref();
            let step =
                Rules::PRODUCT.settle_doc(Settle::Finish, is_marked(doc, record), doc.is_some());
            if step != DocStep::After {
                continue;
            }
            let op = &record.operations[i];
            let before = record.participants[i].before.as_ref();
            let after = after_image(op, before).map_err(|reason| MultiError::Corrupt {
                index: self.settings.log_index.clone(),
                id: id.clone(),
                reason: format!("a committed operation cannot be applied again: {reason}"),
            })?;
            writes.push(clear_action(
                self.stamp_window,
                record,
                i,
                &after,
                held.token(&op.monitor_name()),
            ));
        }
        self.write_all(&id, &writes, "finishing").await?;
        record.state = MultiState::Finished;
        record.modified = now_rfc3339();
        record.meta = self.log_cas(record).await?;
        Ok(())
    }

    pub(super) async fn write_all(
        &self,
        id: &str,
        writes: &[BulkAction],
        what: &str,
    ) -> Result<(), MultiError> {
        let items = self
            .bulk(writes)
            .await
            .map_err(|e| store_err(format!("{what} transaction `{id}`"), e))?;
        for (item, action) in items.into_iter().zip(writes) {
            if let Err(e) = item {
                let (BulkAction::Index { index, id: doc, .. }
                | BulkAction::Delete { index, id: doc, .. }) = action;
                warn!(txn = %id, %index, %doc, error = %e, "a write failed; the transaction is left for the next try");
                return Err(store_err(
                    format!("{what} transaction `{id}` at `{index}/{doc}`"),
                    e,
                ));
            }
        }
        Ok(())
    }

    /// Writes the log document if it is unchanged since `record.meta`. A conflict is read
    /// back: when the stored record is this one in the state asked for (a retried write whose
    /// first reply was lost), that is success; otherwise someone else moved the transaction
    /// (recovery, or a coordinator that stalled) and this writer is fenced.
    pub(super) async fn log_cas(
        &self,
        record: &TxnRecord,
    ) -> Result<crate::es::DocMeta, MultiError> {
        match self.log_write(record, if_match(record.meta)).await {
            Err(MultiError::Store {
                source: crate::es::EsError::Conflict { .. },
                ..
            }) => match self.get(&record.transaction_id).await? {
                Some(stored)
                    if stored.state == record.state
                        && stored.participants == record.participants
                        && stored.modified == record.modified =>
                {
                    Ok(stored.meta)
                }
                _ => Err(MultiError::Fenced {
                    id: record.transaction_id.clone(),
                    reason: "the log changed meanwhile (recovery or another coordinator moved the transaction)"
                        .into(),
                }),
            },
            other => other,
        }
    }
}
