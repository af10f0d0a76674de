//! A document found under its lock with another transaction's mark: that transaction's
//! coordinator is gone (a live one holds the document's lock until its marks are cleared), so the
//! transaction is decided before the document is used: a committed one is finished on this
//! document (its after-image written unmarked), an undecided one is rolled back on this document
//! at once (its other documents are left to its own recovery). A mark that is not the
//! transaction's own write (a later writer copied the `zkguard` object along with the document:
//! see [`super::record::is_own_write`]) decides nothing: the writer drops it. What to do is
//! [`super::decide::Rules::on_mark`]'s decision.

use tracing::info;

use super::decide::{OnMark, Rules};
use super::engine::{clear_action, store_err, Held};
use super::plan::{after_image, op_id, rewritten, stamped};
use super::record::{is_own_write, user_source, TxnRecord};
use super::{MultiError, MultiState, Transactions, TxnOp};
use crate::es::Doc;
use crate::txn::now_rfc3339;
use crate::write::ops::Stamp;

/// How many times a writer that lost the race to move another transaction's log record reads
/// it again before it gives up (each loss means the record moved on: a handful is plenty).
const SETTLE_TRIES: u32 = 8;

impl Transactions {
    /// Decides every other transaction whose mark a document of `ops` carries (read as
    /// `docs`, under `held`); returns the documents as they are afterwards.
    ///
    /// # Errors
    /// [`MultiError::Store`]; [`MultiError::Fenced`] when the other transaction's log moved
    /// meanwhile in a way that cannot be decided here (the caller stops; recovery resolves it).
    pub(super) async fn resolve_marks(
        &self,
        own: &str,
        ops: &[TxnOp],
        mut docs: Vec<Option<Doc>>,
        held: &Held,
    ) -> Result<Vec<Option<Doc>>, MultiError> {
        // Until a read shows no mark to decide: a stalled coordinator's marked write, sent with
        // its older token before its session ended, may land after one read and before the
        // next (found by the model check: the second read's marked tombstone was taken for a
        // before-image). Each round writes with this coordinator's newer tokens, which fence
        // every such write from then on, so a late write shows up in at most one more read.
        loop {
            let mut changed = false;
            for (op, doc) in ops.iter().zip(&docs) {
                let Some(doc) = doc else { continue };
                let Some(other) = Stamp::of(&doc.source).and_then(|s| s.txn) else {
                    continue;
                };
                if other == own {
                    continue;
                }
                let token = held.token(&op.monitor_name());
                changed |= self
                    .undo_if_undecided(&other, op, doc, token)
                    .await
                    .map_err(|e| deciding_err(&other, op, e))?;
            }
            if !changed {
                return Ok(docs);
            }
            docs = self.read_all(ops).await?;
        }
    }

    /// Decides transaction `other` on `doc` (of `op`), which carries its mark: finishes it there
    /// when it is committed, rolls it back there when it is not; `true` when the document was
    /// written. Nothing is done for a mark that is not the transaction's own write, or whose
    /// transaction is unknown (or was rolled back before anything was logged): the caller
    /// writes the document without it. The own write of a final transaction is settled again
    /// as its log says ([`Rules::on_mark`]).
    async fn undo_if_undecided(
        &self,
        other: &str,
        op: &TxnOp,
        doc: &Doc,
        token: u64,
    ) -> Result<bool, MultiError> {
        let mut record = self.get(other).await?;
        let own = is_own_write(doc);
        if record.is_some() && !own {
            info!(txn = %other, index = %op.index, id = %op.id, "a copy of a transaction's mark on a later write; it is dropped by this write");
        }
        // Another settler (a writer of another of its documents, or recovery) may move the
        // record between the read and the CAS: the loser reads it again and goes on from the
        // state the other left. Each lost CAS means the record moved on, and it moves at most
        // through pending, rolling-back/committed and a final state, so this ends.
        for attempt in 0.. {
            match Rules::PRODUCT.on_mark(record.as_ref().map(|r| r.state), own) {
                OnMark::Leave => return Ok(false),
                OnMark::Finish => {
                    let record = record.as_ref().expect("a committed record was read");
                    return self.finish_one(record, op, token).await;
                }
                OnMark::Restore => break,
                OnMark::MoveThenRestore => {
                    let mut moved = record.clone().expect("an undecided record was read");
                    moved.state = MultiState::RollingBack;
                    moved.reason = Some(format!(
                        "undone: its coordinator stopped before the commit, and a later writer of `{}/{}` found its mark",
                        op.index, op.id
                    ));
                    moved.modified = now_rfc3339();
                    match self.log_cas(&moved).await {
                        Ok(meta) => {
                            moved.meta = meta;
                            record = Some(moved);
                            break;
                        }
                        Err(MultiError::Fenced { .. }) if attempt < SETTLE_TRIES => {
                            info!(txn = %other, index = %op.index, id = %op.id, "another writer moved the transaction's log first; going on from its state");
                            record = Some(self.get(other).await?.ok_or_else(|| {
                                MultiError::NotFound {
                                    id: other.to_string(),
                                    index: self.settings.log_index.clone(),
                                }
                            })?);
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        let record = record.expect("an undecided record was read");
        if record.participants.is_empty() {
            // Rolled back before anything was logged: it wrote nothing to restore.
            return Ok(false);
        }
        let Some(i) = record
            .operations
            .iter()
            .position(|o| o.index == op.index && o.id == op.id)
        else {
            // Marked by a transaction that does not list the document: only re-stamp it.
            self.write_one(op, rewritten(&doc.source, token), token)
                .await?;
            return Ok(true);
        };
        info!(txn = %other, index = %op.index, id = %op.id, "undoing another transaction's write found under the lock");
        match record.participants.get(i).and_then(|p| p.before.as_ref()) {
            Some(before) => {
                let source = stamped(
                    self.stamp_window,
                    Some(user_source(before)),
                    Some(&doc.source),
                    &op_id(other, i, true),
                    token,
                    None,
                );
                self.write_one(op, source, token).await?;
            }
            None => {
                let (index, id) = (&op.index, &op.id);
                self.retrying(|| {
                    self.store.delete(
                        index,
                        id,
                        crate::write::fence::condition(token),
                        self.refresh,
                    )
                })
                .await
                .map_err(|e| store_err(format!("undoing `{index}/{id}`"), e))?;
            }
        }
        Ok(true)
    }

    /// Finishes committed `record` on the document of `op`: its after-image, unmarked, written
    /// with `token` (a delete's tombstone is deleted); `false` when the record does not list
    /// the document (nothing to finish: the caller writes it without the mark).
    async fn finish_one(
        &self,
        record: &TxnRecord,
        op: &TxnOp,
        token: u64,
    ) -> Result<bool, MultiError> {
        let id = &record.transaction_id;
        let Some(i) = record
            .operations
            .iter()
            .position(|o| o.index == op.index && o.id == op.id)
        else {
            return Ok(false);
        };
        let before = record.participants.get(i).and_then(|p| p.before.as_ref());
        let after =
            after_image(&record.operations[i], before).map_err(|reason| MultiError::Corrupt {
                index: self.settings.log_index.clone(),
                id: id.clone(),
                reason: format!("a committed operation cannot be applied again: {reason}"),
            })?;
        info!(txn = %id, index = %op.index, id = %op.id, "finishing a committed transaction's write found under the lock");
        let action = clear_action(self.stamp_window, record, i, &after, token);
        self.write_all(id, &[action], "finishing").await?;
        Ok(true)
    }

    async fn write_one(
        &self,
        op: &TxnOp,
        source: serde_json::Value,
        token: u64,
    ) -> Result<(), MultiError> {
        let (index, id) = (&op.index, &op.id);
        self.retrying(|| {
            self.store.index(
                index,
                id,
                &source,
                crate::write::fence::condition(token),
                self.refresh,
            )
        })
        .await
        .map(|_| ())
        .map_err(|e| store_err(format!("undoing `{index}/{id}`"), e))
    }
}

/// An error met deciding transaction `other` (whose mark the document of `op` carries), as an
/// error of the writer that found the mark: it names `other` as the transaction found, never
/// as the writer's own (which was not logged yet).
fn deciding_err(other: &str, op: &TxnOp, e: MultiError) -> MultiError {
    let context = format!(
        "deciding transaction `{other}`, whose mark `{}/{}` carries",
        op.index, op.id
    );
    match e {
        MultiError::Store {
            context: inner,
            source,
        } => MultiError::Store {
            context: format!("{context} ({inner})"),
            source,
        },
        other_err => MultiError::Store {
            context,
            source: crate::es::EsError::Protocol(other_err.to_string()),
        },
    }
}

#[async_trait::async_trait]
impl crate::write::marks::MarkResolver for Transactions {
    /// Decides transaction `txn` on `index/id`: when it is committed the document gets its
    /// after-image unmarked (a deleted one is deleted); otherwise the transaction is moved to
    /// `rolling-back` and the document gets its logged before-image back. A mark that is a
    /// later writer's copy, or of an unknown transaction, is left to the caller, which writes
    /// without it.
    async fn resolve(
        &self,
        txn: &str,
        index: &str,
        id: &str,
        doc: &Doc,
        token: u64,
    ) -> Result<bool, crate::es::EsError> {
        self.undo_if_undecided(txn, &TxnOp::delete(index, id), doc, token)
            .await
            .map_err(|e| match e {
                MultiError::Store { source, .. } => source,
                other => crate::es::EsError::Protocol(format!(
                    "deciding transaction `{txn}`, whose mark `{index}/{id}` carries: {other}"
                )),
            })
    }
}
