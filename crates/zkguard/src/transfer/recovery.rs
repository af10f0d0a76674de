//! Recovery: resuming transactions left in flight by a crash.

use std::collections::HashSet;
use std::future::Future;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use serde::Serialize;
use serde_json::json;
use tracing::{info, instrument, warn};

use super::{Coordinator, Transaction, TxnError, TxnState};
use crate::lock::LockType;

/// What one recovery pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RecoveryReport {
    /// Transactions the search returned (in flight and older than `txn.recovery.after`).
    pub examined: usize,
    /// Driven to `finished`.
    pub finished: Vec<String>,
    /// Driven to `rolled-back`.
    pub rolled_back: Vec<String>,
    /// Skipped because another worker holds their lock (a live worker is on them).
    pub busy: Vec<String>,
    /// Skipped because they moved on (final, or modified again) since the search.
    pub skipped: Vec<String>,
    /// Left as they are because of an error (id, error); the next pass tries again.
    pub failed: Vec<(String, String)>,
}

impl Coordinator {
    /// One recovery pass: refreshes the transactions index, searches the transactions in
    /// `created`, `pending`, `committed` or `terminating` whose `modification_time` is older than
    /// `txn.recovery.after` (oldest first, page after page), and resumes each from its state:
    /// `created` from the checks and `pending`, `pending` from the apply steps, `committed` from
    /// the removal of the pending ids, `terminating` from the undo steps.
    ///
    /// With a lock service, each transaction is locked first (background, short timeout); one
    /// whose lock is held is reported as busy and left to its worker.
    ///
    /// # Errors
    /// [`TxnError::Store`] when the search itself fails; failures of single transactions are
    /// listed in [`RecoveryReport::failed`].
    ///
    /// # Cancellation safety
    /// Cancel-safe in the protocol's sense: every transaction is left in a stored state the next
    /// pass resumes.
    #[instrument(skip(self))]
    pub async fn recover_once(&self) -> Result<RecoveryReport, TxnError> {
        self.ensure_indices().await?;
        let index = &self.settings.transactions_index;
        let mut report = RecoveryReport::default();
        let mut seen: HashSet<String> = HashSet::new();
        loop {
            let cutoff = SystemTime::now()
                .checked_sub(self.settings.recovery_after)
                .unwrap_or(SystemTime::UNIX_EPOCH);
            self.retrying(|| self.store.refresh(index))
                .await
                .map_err(|e| TxnError::Store {
                    context: format!("refreshing `{index}`"),
                    source: e,
                })?;
            let mut filter = json!({
                "bool": {
                    "filter": [
                        { "terms": { "transaction_state": TxnState::IN_FLIGHT.map(TxnState::as_str) } },
                        { "range": { "modification_time": {
                            "lte": humantime::format_rfc3339_millis(cutoff).to_string()
                        } } }
                    ]
                }
            });
            if !seen.is_empty() {
                let ids: Vec<&String> = seen.iter().collect();
                filter["bool"]["must_not"] = json!([{ "ids": { "values": ids } }]);
            }
            let body = json!({
                "size": self.recovery_batch,
                "query": filter,
                "sort": [{ "modification_time": { "order": "asc" } }],
            });
            let hits = self
                .retrying(|| self.store.search(index, &body))
                .await
                .map_err(|e| TxnError::Store {
                    context: "searching transactions to recover".into(),
                    source: e,
                })?;
            let page = hits.len();
            let ids: Vec<String> = hits
                .into_iter()
                .map(|d| d.id)
                .filter(|id| seen.insert(id.clone()))
                .collect();
            if ids.is_empty() {
                break;
            }
            report.examined += ids.len();
            let results: Vec<(String, Result<Option<TxnState>, TxnError>)> =
                futures::stream::iter(ids)
                    .map(|id| async move {
                        let r = self
                            .recover_locked(&id, cutoff)
                            .await
                            .map(|t| t.map(|t| t.state));
                        (id, r)
                    })
                    .buffer_unordered(self.recovery_concurrency)
                    .collect()
                    .await;
            for (id, result) in results {
                match result {
                    Ok(Some(TxnState::Finished)) => report.finished.push(id),
                    Ok(Some(TxnState::RolledBack)) => report.rolled_back.push(id),
                    Ok(_) => report.skipped.push(id),
                    Err(TxnError::Busy { .. }) => report.busy.push(id),
                    Err(e) => {
                        warn!(txn = %id, error = %e, "recovery of this transaction failed; the next pass retries");
                        report.failed.push((id, e.to_string()));
                    }
                }
            }
            if page < self.recovery_batch {
                break;
            }
        }
        for list in [
            &mut report.finished,
            &mut report.rolled_back,
            &mut report.busy,
            &mut report.skipped,
        ] {
            list.sort();
        }
        report.failed.sort();
        if report.examined > 0 {
            info!(
                examined = report.examined,
                finished = report.finished.len(),
                rolled_back = report.rolled_back.len(),
                busy = report.busy.len(),
                failed = report.failed.len(),
                "recovery pass"
            );
        }
        Ok(report)
    }

    /// The recovery loop: a pass every `interval` until `shutdown` completes. A failed pass is
    /// logged and the loop goes on. Choose `interval` no shorter than the time a live worker
    /// needs for one transaction (retries included) when no lock service is configured, so that
    /// recovery rarely duplicates a live worker's work (duplicated work is harmless, only wasted).
    ///
    /// # Cancellation safety
    /// Cancel-safe in the protocol's sense, like [`Coordinator::recover_once`]; `shutdown` also
    /// interrupts a pass in progress.
    pub async fn run_recovery(&self, interval: Duration, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                result = self.recover_once() => {
                    if let Err(e) = result {
                        warn!(error = %e, "recovery pass failed; retrying after the interval");
                    }
                }
            }
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }
}

impl Coordinator {
    /// Locks `id` for recovery (background, short timeout) and drives it if it is still in
    /// flight and still older than `cutoff`.
    async fn recover_locked(
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
