//! The foreground-waiter registry: one `<monitor>/waiters` document per monitor, changed only by
//! read-modify-write with `if_seq_no`, read by realtime GET.

use crate::es::{DocMeta, EsError, Refresh, WriteCondition};

use super::record::{waiters_id, WaiterRecord, WaitersDoc, KIND_WAITERS};
use super::state::Inner;

/// Attempts of one read-modify-write before giving up (each conflict means another waiter's
/// update went through, so this bounds work, not progress).
const MAX_ATTEMPTS: usize = 32;

impl Inner {
    /// Reads the waiters document of `monitor`.
    pub(crate) async fn read_waiters(
        &self,
        monitor: &str,
    ) -> Result<Option<(WaitersDoc, DocMeta)>, EsError> {
        let id = waiters_id(monitor);
        match self.store.get(&self.cfg.index, &id).await? {
            None => Ok(None),
            Some(doc) => {
                let parsed: WaitersDoc = serde_json::from_value(doc.source).map_err(|e| {
                    EsError::Protocol(format!(
                        "document {}/{id} is not a zkguard waiters document ({e}); use an index of its own for \
                         elasticsearch.lock.index",
                        self.cfg.index
                    ))
                })?;
                Ok(Some((parsed, doc.meta)))
            }
        }
    }

    /// The foreground registrations that a reader with this service's clock must still honour.
    pub(crate) async fn live_waiters(&self, monitor: &str) -> Result<Vec<WaiterRecord>, EsError> {
        let now = self.now_ms();
        let skew = self.cfg.skew_ms();
        Ok(self
            .read_waiters(monitor)
            .await?
            .map(|(doc, _)| {
                doc.waiters
                    .into_iter()
                    .filter(|w| w.is_live(now, skew))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Adds or refreshes a registration (and drops registrations that lapsed for everyone).
    pub(crate) async fn upsert_waiter(
        &self,
        monitor: &str,
        entry: &WaiterRecord,
    ) -> Result<(), EsError> {
        self.modify_waiters(monitor, |list| {
            list.retain(|w| w.id != entry.id);
            list.push(entry.clone());
            true
        })
        .await
    }

    /// Removes a registration (and drops lapsed ones).
    pub(crate) async fn remove_waiter(&self, monitor: &str, id: &str) -> Result<(), EsError> {
        self.modify_waiters(monitor, |list| {
            let before = list.len();
            list.retain(|w| w.id != id);
            list.len() != before
        })
        .await
    }

    async fn modify_waiters(
        &self,
        monitor: &str,
        change: impl Fn(&mut Vec<WaiterRecord>) -> bool,
    ) -> Result<(), EsError> {
        let id = waiters_id(monitor);
        let skew = self.cfg.skew_ms();
        for _ in 0..MAX_ATTEMPTS {
            let now = self.now_ms();
            let (mut doc, cond) = match self.read_waiters(monitor).await? {
                Some((doc, meta)) => (
                    doc,
                    WriteCondition::IfMatch {
                        seq_no: meta.seq_no,
                        primary_term: meta.primary_term,
                    },
                ),
                None => (
                    WaitersDoc {
                        kind: KIND_WAITERS.into(),
                        monitor: monitor.into(),
                        waiters: Vec::new(),
                    },
                    WriteCondition::Create,
                ),
            };
            let before = doc.waiters.len();
            // A registration older than its expiry plus the skew has lapsed for every reader.
            doc.waiters
                .retain(|w| now <= w.expires.saturating_add(skew));
            let pruned = doc.waiters.len() != before;
            let changed = change(&mut doc.waiters);
            if !changed && !pruned {
                return Ok(());
            }
            match self
                .store
                .index(&self.cfg.index, &id, &doc.to_json(), cond, Refresh::No)
                .await
            {
                Ok(_) => return Ok(()),
                Err(EsError::Conflict { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(EsError::Conflict {
            index: self.cfg.index.clone(),
            id,
            reason: format!("the waiters document kept changing during {MAX_ATTEMPTS} attempts"),
        })
    }
}
