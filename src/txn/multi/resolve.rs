//! A document found under its lock with another transaction's mark: that transaction's
//! coordinator is gone (a live one holds the document's lock until its marks are cleared), so the
//! transaction is decided before the document is used: a committed one's write stands, an
//! undecided one is rolled back on this document at once (its other documents are left to its
//! own recovery).

use tracing::info;

use super::engine::{store_err, Held};
use super::plan::{op_id, rewritten, stamped};
use super::record::user_source;
use super::{MultiError, MultiState, Transactions, TxnOp};
use crate::es::{Doc, WriteCondition};
use crate::txn::now_rfc3339;
use crate::write::ops::Stamp;

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
        docs: Vec<Option<Doc>>,
        held: &Held,
    ) -> Result<Vec<Option<Doc>>, MultiError> {
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
            changed |= self.undo_if_undecided(&other, op, doc, token).await?;
        }
        if changed {
            return self.read_all(ops).await;
        }
        Ok(docs)
    }

    /// Rolls transaction `other` back on `doc` (of `op`) when it is not committed; `true` when
    /// the document was written.
    async fn undo_if_undecided(
        &self,
        other: &str,
        op: &TxnOp,
        doc: &Doc,
        token: u64,
    ) -> Result<bool, MultiError> {
        let Some(mut record) = self.get(other).await? else {
            // No record: the mark cannot be told apart from data; leave it.
            return Ok(false);
        };
        match record.state {
            MultiState::Committed | MultiState::Finished => return Ok(false),
            MultiState::Pending => {
                record.state = MultiState::RollingBack;
                record.reason = Some(format!(
                    "undone: its coordinator stopped before the commit, and a later writer of `{}/{}` found its mark",
                    op.index, op.id
                ));
                record.modified = now_rfc3339();
                record.meta = self.log_cas(&record).await?;
            }
            MultiState::RollingBack | MultiState::RolledBack => {}
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
                    self.store
                        .delete(index, id, WriteCondition::ExternalGte(token), self.refresh)
                })
                .await
                .map_err(|e| store_err(format!("undoing `{index}/{id}`"), e))?;
            }
        }
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
                WriteCondition::ExternalGte(token),
                self.refresh,
            )
        })
        .await
        .map(|_| ())
        .map_err(|e| store_err(format!("undoing `{index}/{id}`"), e))
    }
}

#[async_trait::async_trait]
impl crate::write::marks::MarkResolver for Transactions {
    /// Decides transaction `txn` on `index/id`: nothing to do when it is committed; otherwise
    /// it is moved to `rolling-back` and the document gets its logged before-image back.
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
