//! The service's shared state: its settings, its clock and token source, the reads and
//! conditional writes of lock documents, and the registry of the guards this process holds.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::OnceCell;

use super::record::{self, LockRecord, LockState};
use crate::es::{DocMeta, DocStore, EsError, Refresh, WriteCondition};
use crate::lock::{LockError, LockType, LossReason};

/// Maps a store error to the lock layer: transient failures become
/// [`LockError::ConnectionLoss`], the rest [`LockError::Backend`].
pub(crate) fn es_error(context: &str, e: EsError) -> LockError {
    if e.is_transient() {
        LockError::ConnectionLoss {
            context: context.to_string(),
            detail: e.to_string(),
        }
    } else {
        LockError::Backend {
            context: context.to_string(),
            detail: e.to_string(),
        }
    }
}

/// Settings of one service (validated by [`EsLockServiceBuilder::build`]).
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) index: String,
    pub(crate) ttl: Duration,
    pub(crate) skew: Duration,
    pub(crate) foreground_timeout: Duration,
    pub(crate) background_timeout: Duration,
    pub(crate) background_max_wait: Option<Duration>,
    pub(crate) poll_initial: Duration,
    pub(crate) poll_max: Duration,
    pub(crate) keep_alive: bool,
    pub(crate) clock_offset_ms: i64,
    pub(crate) waiter_ttl: Duration,
}

impl Config {
    pub(crate) fn ttl_ms(&self) -> i64 {
        self.ttl.as_millis() as i64
    }

    pub(crate) fn skew_ms(&self) -> i64 {
        self.skew.as_millis() as i64
    }

    /// How long after sending a granting write the holder counts on its lease.
    pub(crate) fn validity(&self) -> Duration {
        self.ttl - self.skew
    }

    pub(super) fn timeout(&self, lock_type: LockType) -> Duration {
        match lock_type {
            LockType::Foreground => self.foreground_timeout,
            LockType::Background => self.background_timeout,
        }
    }
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn DocStore>,
    pub(crate) cfg: Config,
    pub(super) owner_prefix: String,
    pub(super) counter: AtomicU64,
    pub(super) index_ready: OnceCell<()>,
    /// Guards acquired with an explicit owner, so that a re-acquisition by the same owner in this
    /// process retires the older guard before it takes the lock over.
    pub(super) live: Mutex<HashMap<(String, String), Weak<dyn LiveGuard>>>,
}

impl Inner {
    /// This host's wall clock in ms since the epoch (plus the configured test offset).
    pub(crate) fn now_ms(&self) -> i64 {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        d.as_millis() as i64 + self.cfg.clock_offset_ms
    }

    pub(super) fn now_micros(&self) -> u64 {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        (d.as_micros() as i64 + self.cfg.clock_offset_ms * 1000).max(0) as u64
    }

    /// The token of the next acquisition after `previous`.
    pub(super) fn next_token(&self, previous: u64) -> u64 {
        // Above the ZooKeeper lock's tokens (2^52 plus a transaction id, far below a clock in
        // microseconds), so a deployment can move from ZooKeeper to this backend.
        previous
            .saturating_add(1)
            .max(crate::zk::protocol::TOKEN_BASE.saturating_add(self.now_micros()))
    }

    pub(super) async fn ensure_index(&self) -> Result<(), EsError> {
        self.index_ready
            .get_or_try_init(|| async {
                self.store
                    .ensure_index(
                        &self.cfg.index,
                        &crate::es::own_index_body(record::mappings()),
                    )
                    .await
            })
            .await
            .map(|_| ())
    }

    /// Realtime read of the lock document of `monitor`.
    pub(crate) async fn read_lock(
        &self,
        monitor: &str,
    ) -> Result<Option<(LockRecord, DocMeta)>, EsError> {
        match self.store.get(&self.cfg.index, monitor).await? {
            None => Ok(None),
            Some(doc) => {
                let rec: LockRecord = serde_json::from_value(doc.source).map_err(|e| {
                    EsError::Protocol(format!(
                        "document {}/{monitor} is not a zkguard lock document ({e}); use an index of its own \
                         for elasticsearch.lock.index",
                        self.cfg.index
                    ))
                })?;
                Ok(Some((rec, doc.meta)))
            }
        }
    }

    /// Marks `rec` free if the document is still at `meta`. `Ok(false)` when it changed.
    pub(super) async fn free_at(&self, rec: &LockRecord, meta: DocMeta) -> Result<bool, EsError> {
        match self.write_lock_at(&self.freed(rec), meta).await {
            Ok(_) => Ok(true),
            Err(EsError::Conflict { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// A copy of `rec` marked free (released and expired) now.
    pub(crate) fn freed(&self, rec: &LockRecord) -> LockRecord {
        let now = self.now_ms();
        let mut free = rec.clone();
        free.state = LockState::Free;
        free.expires = now;
        free.renewed = now;
        free.released = Some(now);
        free
    }

    /// Writes `rec` as its lock document if the document is still at `meta`; returns the new
    /// version.
    pub(crate) async fn write_lock_at(
        &self,
        rec: &LockRecord,
        meta: DocMeta,
    ) -> Result<DocMeta, EsError> {
        let cond = WriteCondition::IfMatch {
            seq_no: meta.seq_no,
            primary_term: meta.primary_term,
        };
        self.store
            .index(
                &self.cfg.index,
                &rec.monitor,
                &rec.to_json(),
                cond,
                Refresh::No,
            )
            .await
    }

    /// Frees the lock of `monitor` if it is held by `owner` with `token`.
    pub(super) async fn free_if_ours(
        &self,
        monitor: &str,
        owner: &str,
        token: u64,
    ) -> Result<bool, EsError> {
        for _ in 0..8 {
            match self.read_lock(monitor).await? {
                Some((rec, meta))
                    if rec.state == LockState::Held && rec.owner == owner && rec.token == token =>
                {
                    if self.free_at(&rec, meta).await? {
                        return Ok(true);
                    }
                }
                _ => return Ok(false),
            }
        }
        Ok(false)
    }

    /// Retires a live guard of (`monitor`, `owner`) in this process: its loss signal fires.
    pub(super) fn supersede_local(&self, monitor: &str, owner: &str) {
        let old = self
            .live
            .lock()
            .expect("live guards lock")
            .remove(&(monitor.to_string(), owner.to_string()));
        if let Some(g) = old.and_then(|w| w.upgrade()) {
            g.retire(LossReason::TakenOver {
                by: format!("{owner} (a newer acquisition by the same owner)"),
            });
        }
    }

    /// Records a guard acquired with an explicit owner, so that a later acquisition by the same
    /// owner in this process can retire it.
    pub(super) fn register_local(&self, monitor: &str, owner: &str, guard: Weak<dyn LiveGuard>) {
        let mut live = self.live.lock().expect("live guards lock");
        live.retain(|_, w| w.strong_count() > 0);
        live.insert((monitor.to_string(), owner.to_string()), guard);
    }
}

/// A guard held in this process, as the registry of live guards sees it: something that can be
/// declared lost when the same owner takes the lock over again.
pub(super) trait LiveGuard: Send + Sync {
    /// Fires the guard's loss signal with `reason`.
    fn retire(&self, reason: LossReason);
}

/// This host's name, recorded in the lock documents.
pub(super) fn host_name() -> String {
    hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown-host".into())
}
