//! The Elasticsearch lease lock: zkguard's lock service for deployments without ZooKeeper.
//!
//! [`EsLockService`] implements [`LockService`] with documents in one index
//! (`elasticsearch.lock.index`, default `zkguard-locks`). `docs/eslock.md` describes the protocol
//! in full; in short:
//!
//! - **One lock document per monitor** (`_id` = monitor): `state` (`held`/`free`), `owner`,
//!   `info`, `lock_type`, `token`, `acquired`, `expires`, `renewed`. It is never deleted: release
//!   marks it free, so its versions and tokens only grow.
//! - **Acquire**: `op_type=create` when there is no document; otherwise, when it is free or
//!   expired, a takeover conditioned on `if_seq_no`/`if_primary_term`, so that of many racing
//!   contenders exactly one wins. A held, unexpired lock is polled with backoff and jitter until
//!   the lock type's timeout (`zookeeper.foreground.task.timeout` /
//!   `zookeeper.background.task.timeout`, shared with the ZooKeeper backend).
//! - **Clocks**: a contender counts a lease as expired only when its own clock is past
//!   `expires + clock_skew`; the holder counts on it only until `ttl - clock_skew` after it sent
//!   the write that granted or renewed it. As long as clocks differ by at most
//!   `elasticsearch.lock.clock.skew`, the holder has stopped before anyone can take over.
//! - **Keep-alive**: every guard renews its lease (conditional write) three times per validity
//!   period; if the holder's deadline passes without a confirmed renewal, or a renewal finds
//!   another owner, the guard's loss signal fires ([`LossReason::LeaseExpired`],
//!   [`LossReason::TakenOver`]).
//! - **Fencing token**: every acquisition writes `token = max(previous + 1, now in µs)` with the
//!   same conditional write that grants the lock, so tokens strictly increase per monitor and
//!   exceed any internal `_version` a data document can reach.
//! - **Priority**: foreground waiters register in a `<monitor>/waiters` document with a short,
//!   refreshed expiry; a background contender neither takes a free or expired lock while a live
//!   registration exists, nor keeps one it took if a registration turns up right after its
//!   takeover.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use zkguard::{config::Settings, es::EsStore, eslock::EsLockService, Guard, LockRequest};
//!
//! let settings = Settings::load(None)?;
//! let store = Arc::new(EsStore::new(&settings.elasticsearch)?);
//! let locks = EsLockService::from_settings(&settings, store)?;
//! let guard = locks.lock(LockRequest::new("article-42", "Save Content")).await?;
//! // ... write article-42 with guard.fencing_token() as its external version ...
//! guard.must_release().await?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use tokio::sync::OnceCell;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::config::Settings;
use crate::es::{DocMeta, DocStore, EsError, Refresh, WriteCondition};
use crate::lock::{
    validate_monitor, Blocker, Guard, LockError, LockRequest, LockService, LockType, LossReason,
};

mod guard;
mod record;
mod waiters;

pub use guard::EsLockGuard;
pub use record::{EsLockStatus, LockRecord, LockState, WaiterRecord};

use guard::GuardShared;
use record::KIND_LOCK;

/// The longest explicit owner id, in bytes.
pub const MAX_OWNER_LEN: usize = 256;

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

fn config_error(detail: String) -> LockError {
    LockError::Backend {
        context: "configuring the Elasticsearch lease lock".into(),
        detail,
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

    fn timeout(&self, lock_type: LockType) -> Duration {
        match lock_type {
            LockType::Foreground => self.foreground_timeout,
            LockType::Background => self.background_timeout,
        }
    }
}

/// Builds an [`EsLockService`]. Start from [`EsLockService::builder`].
#[must_use]
pub struct EsLockServiceBuilder {
    store: Arc<dyn DocStore>,
    cfg: Config,
    waiter_ttl: Option<Duration>,
}

impl std::fmt::Debug for EsLockServiceBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EsLockServiceBuilder")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl EsLockServiceBuilder {
    /// The lock index (`elasticsearch.lock.index`). Use an index of its own.
    pub fn index(mut self, index: impl Into<String>) -> Self {
        self.cfg.index = index.into();
        self
    }

    /// The lease length (`elasticsearch.lock.ttl`).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.cfg.ttl = ttl;
        self
    }

    /// The largest clock difference assumed between any two contenders
    /// (`elasticsearch.lock.clock.skew`); must be less than half the TTL.
    pub fn clock_skew(mut self, skew: Duration) -> Self {
        self.cfg.skew = skew;
        self
    }

    /// How long foreground and background contenders wait by default.
    pub fn timeouts(mut self, foreground: Duration, background: Duration) -> Self {
        self.cfg.foreground_timeout = foreground;
        self.cfg.background_timeout = background;
        self
    }

    /// Anti-starvation: a background contender that has waited this long registers and competes
    /// as a foreground one (`zookeeper.background.max.wait`). `None` (the default) turns it off.
    pub fn background_max_wait(mut self, max_wait: Option<Duration>) -> Self {
        self.cfg.background_max_wait = max_wait;
        self
    }

    /// The polling backoff of waiting contenders (default 10 ms doubling up to 250 ms, with
    /// jitter).
    pub fn poll(mut self, initial: Duration, max: Duration) -> Self {
        self.cfg.poll_initial = initial;
        self.cfg.poll_max = max;
        self
    }

    /// Whether guards renew their lease in the background (default `true`). With `false` the
    /// holder renews with [`EsLockGuard::renew`]; the guard still reports the loss when its
    /// lease runs out.
    pub fn keep_alive(mut self, on: bool) -> Self {
        self.cfg.keep_alive = on;
        self
    }

    /// How long a foreground waiter's registration lasts without a refresh (default: the TTL).
    /// A crashed foreground waiter holds background contenders back at most this long plus the
    /// clock skew.
    pub fn waiter_ttl(mut self, ttl: Duration) -> Self {
        self.waiter_ttl = Some(ttl);
        self
    }

    /// Adds a fixed offset to this service's wall clock, as if its host's clock were that far
    /// ahead (positive) or behind (negative). For exercising the clock-skew assumption in tests;
    /// leave it at 0 in production.
    pub fn clock_offset(mut self, offset_ms: i64) -> Self {
        self.cfg.clock_offset_ms = offset_ms;
        self
    }

    /// Checks the settings and builds the service (no request is sent yet: the index is created
    /// on first use).
    ///
    /// # Errors
    /// [`LockError::Backend`] naming the setting that is out of range.
    pub fn build(mut self) -> Result<EsLockService, LockError> {
        let c = &mut self.cfg;
        let index_ok = !c.index.is_empty()
            && c.index.len() <= 255
            && !c.index.starts_with(['-', '_', '+'])
            && c.index
                .chars()
                .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || "-_.".contains(ch));
        if !index_ok {
            return Err(config_error(format!(
                "elasticsearch.lock.index `{}` is not a valid index name: use lowercase letters, digits, - _ .",
                c.index
            )));
        }
        if c.ttl < Duration::from_millis(100) {
            return Err(config_error(format!(
                "elasticsearch.lock.ttl is {}ms; use at least 100ms",
                c.ttl.as_millis()
            )));
        }
        if c.skew * 2 >= c.ttl {
            return Err(config_error(format!(
                "elasticsearch.lock.clock.skew ({}ms) must be less than half of elasticsearch.lock.ttl ({}ms): \
                 raise the TTL or lower the skew",
                c.skew.as_millis(),
                c.ttl.as_millis()
            )));
        }
        if c.poll_initial.is_zero() || c.poll_max < c.poll_initial {
            return Err(config_error(
                "the poll backoff needs 0 < initial <= max".into(),
            ));
        }
        c.waiter_ttl = self.waiter_ttl.unwrap_or(c.ttl);
        if c.waiter_ttl < Duration::from_millis(30) {
            return Err(config_error(
                "the waiter registration TTL must be at least 30ms".into(),
            ));
        }
        let owner_prefix = format!(
            "{}:{}:{}",
            host_name(),
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        Ok(EsLockService {
            inner: Arc::new(Inner {
                store: self.store,
                cfg: self.cfg,
                owner_prefix,
                counter: AtomicU64::new(0),
                index_ready: OnceCell::new(),
                live: Mutex::new(HashMap::new()),
            }),
        })
    }
}

fn host_name() -> String {
    hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown-host".into())
}

/// The Elasticsearch lease lock service. Cheap to clone; clones share the owner prefix.
#[derive(Clone)]
pub struct EsLockService {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EsLockService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EsLockService")
            .field("index", &self.inner.cfg.index)
            .field("ttl", &self.inner.cfg.ttl)
            .field("clock_skew", &self.inner.cfg.skew)
            .field("owner_prefix", &self.inner.owner_prefix)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn DocStore>,
    pub(crate) cfg: Config,
    owner_prefix: String,
    counter: AtomicU64,
    index_ready: OnceCell<()>,
    /// Guards acquired with an explicit owner, so that a re-acquisition by the same owner in this
    /// process retires the older guard before it takes the lock over.
    live: Mutex<HashMap<(String, String), Weak<GuardShared>>>,
}

impl Inner {
    /// This host's wall clock in ms since the epoch (plus the configured test offset).
    pub(crate) fn now_ms(&self) -> i64 {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        d.as_millis() as i64 + self.cfg.clock_offset_ms
    }

    fn now_micros(&self) -> u64 {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        (d.as_micros() as i64 + self.cfg.clock_offset_ms * 1000).max(0) as u64
    }

    /// The token of the next acquisition after `previous`.
    fn next_token(&self, previous: u64) -> u64 {
        previous.saturating_add(1).max(self.now_micros())
    }

    async fn ensure_index(&self) -> Result<(), EsError> {
        self.index_ready
            .get_or_try_init(|| async {
                self.store
                    .ensure_index(&self.cfg.index, &record::mappings())
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
    async fn free_at(&self, rec: &LockRecord, meta: DocMeta) -> Result<bool, EsError> {
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
    async fn free_if_ours(&self, monitor: &str, owner: &str, token: u64) -> Result<bool, EsError> {
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
    fn supersede_local(&self, monitor: &str, owner: &str) {
        let old = self
            .live
            .lock()
            .expect("live guards lock")
            .remove(&(monitor.to_string(), owner.to_string()));
        if let Some(g) = old.and_then(|w| w.upgrade()) {
            g.declare_lost(LossReason::TakenOver {
                by: format!("{owner} (a newer acquisition by the same owner)"),
            });
        }
    }

    fn register_local(&self, shared: &Arc<GuardShared>) {
        let mut live = self.live.lock().expect("live guards lock");
        live.retain(|_, w| w.strong_count() > 0);
        live.insert(
            (shared.record.monitor.clone(), shared.record.owner.clone()),
            Arc::downgrade(shared),
        );
    }
}

/// Outcome of one acquisition attempt.
enum Step {
    Acquired(EsLockGuard),
    /// Held by someone else (or held back by a foreground waiter): wait and poll. Says what
    /// was in the way, when known.
    Busy(Option<Blocker>),
    /// A conditional write lost a race: re-read at once.
    Retry,
}

/// One acquisition in progress; undoes its traces (waiter registration, a takeover whose answer
/// was lost) when it ends without a guard, in the background if it is dropped.
struct Acquisition {
    inner: Arc<Inner>,
    monitor: String,
    owner: String,
    explicit_owner: bool,
    info: String,
    lock_type: LockType,
    waiter: Option<WaiterRecord>,
    /// Tokens of takeover writes whose outcome is unknown (they may have landed).
    pending: Vec<u64>,
    done: bool,
}

impl Acquisition {
    async fn register(&mut self) -> Result<(), EsError> {
        let inner = &self.inner;
        let now = inner.now_ms();
        let entry = match self.waiter.take() {
            Some(mut w) => {
                w.expires = now + inner.cfg.waiter_ttl.as_millis() as i64;
                w
            }
            None => WaiterRecord {
                id: uuid::Uuid::new_v4().simple().to_string(),
                owner: self.owner.clone(),
                info: self.info.clone(),
                registered: now,
                expires: now + inner.cfg.waiter_ttl.as_millis() as i64,
            },
        };
        // Remember it before writing, so that cleanup removes it even if the answer is lost.
        self.waiter = Some(entry.clone());
        inner.upsert_waiter(&self.monitor, &entry).await
    }

    /// Whether a live foreground registration exists (`Some` with what it means for the
    /// contender); an unreadable registry counts as yes, with nothing known about it.
    async fn foreground_waiting(&self) -> Option<Option<Blocker>> {
        match self.inner.live_waiters(&self.monitor).await {
            Ok(list) if list.is_empty() => None,
            Ok(list) => Some(Some(Blocker::ForegroundWaiters { count: list.len() })),
            Err(e) => {
                tracing::debug!(monitor = %self.monitor, error = %e, "cannot read the foreground waiters; backing off");
                Some(None)
            }
        }
    }

    async fn attempt(&mut self, foreground: bool) -> Result<Step, EsError> {
        let inner = self.inner.clone();
        inner.ensure_index().await?;
        let now = inner.now_ms();
        let skew = inner.cfg.skew_ms();
        let (previous, cond) = match inner.read_lock(&self.monitor).await? {
            None => (0, WriteCondition::Create),
            Some((rec, meta)) => {
                let held_by_me = rec.state == LockState::Held && rec.owner == self.owner;
                let landed = held_by_me && self.pending.contains(&rec.token);
                if landed && !foreground {
                    if let Some(waiting) = self.foreground_waiting().await {
                        // An earlier takeover of ours landed after all, but a foreground waiter
                        // came.
                        if inner.free_at(&rec, meta).await? {
                            self.pending.clear();
                        }
                        return Ok(Step::Busy(waiting));
                    }
                }
                let own = held_by_me && self.explicit_owner;
                if !landed && !own && !rec.is_takeable(now, skew) {
                    return Ok(Step::Busy(Some(Blocker::Holder {
                        owner: Some(rec.owner.clone()),
                        info: Some(rec.info.clone()),
                        node: None,
                    })));
                }
                if own && !landed {
                    inner.supersede_local(&self.monitor, &self.owner);
                }
                (
                    rec.token,
                    WriteCondition::IfMatch {
                        seq_no: meta.seq_no,
                        primary_term: meta.primary_term,
                    },
                )
            }
        };
        if !foreground {
            if let Some(waiting) = self.foreground_waiting().await {
                return Ok(Step::Busy(waiting));
            }
        }
        let token = inner.next_token(previous);
        let sent = Instant::now();
        let wall = inner.now_ms();
        let rec = LockRecord {
            kind: KIND_LOCK.into(),
            monitor: self.monitor.clone(),
            state: LockState::Held,
            owner: self.owner.clone(),
            info: self.info.clone(),
            lock_type: self.lock_type,
            token,
            acquired: wall,
            expires: wall + inner.cfg.ttl_ms(),
            renewed: wall,
            released: None,
            host: host_name(),
            pid: std::process::id(),
        };
        self.pending.push(token);
        let meta = match inner
            .store
            .index(
                &inner.cfg.index,
                &self.monitor,
                &rec.to_json(),
                cond,
                Refresh::No,
            )
            .await
        {
            Ok(meta) => meta,
            Err(EsError::Conflict { .. }) => {
                self.pending.retain(|t| *t != token);
                return Ok(Step::Retry);
            }
            Err(e) => return Err(e),
        };
        if !foreground {
            if let Some(waiting) = self.foreground_waiting().await {
                // A foreground waiter registered while the takeover was in flight: hand it back.
                tracing::debug!(monitor = %self.monitor, token, "foreground waiter appeared; giving the lock back");
                if inner.free_at(&rec, meta).await? {
                    self.pending.clear();
                }
                return Ok(Step::Busy(waiting));
            }
        }
        if Instant::now() >= sent + inner.cfg.validity() {
            // The answer came so late that the lease is already over for us: give it back.
            tracing::debug!(monitor = %self.monitor, token, "the grant arrived after the lease's validity; giving it back");
            if inner.free_at(&rec, meta).await? {
                self.pending.clear();
            }
            return Ok(Step::Busy(None));
        }
        self.pending.clear();
        let shared = Arc::new(GuardShared::new(inner.clone(), rec, meta, sent));
        if self.explicit_owner {
            inner.register_local(&shared);
        }
        Ok(Step::Acquired(EsLockGuard::start(
            shared,
            inner.cfg.keep_alive,
        )))
    }

    /// What holds the lock now, read from its document (`None` when it cannot be read).
    async fn describe(&self) -> Option<Blocker> {
        match self.inner.read_lock(&self.monitor).await {
            Ok(Some((rec, _)))
                if !rec.is_takeable(self.inner.now_ms(), self.inner.cfg.skew_ms()) =>
            {
                Some(Blocker::Holder {
                    owner: Some(rec.owner),
                    info: Some(rec.info),
                    node: None,
                })
            }
            Ok(_) => Some(Blocker::Released),
            Err(_) => None,
        }
    }

    async fn cleanup(
        inner: Arc<Inner>,
        monitor: String,
        owner: String,
        waiter: Option<String>,
        pending: Vec<u64>,
    ) {
        if let Some(id) = waiter {
            if let Err(e) = inner.remove_waiter(&monitor, &id).await {
                tracing::debug!(%monitor, error = %e, "cannot remove the foreground registration; it will lapse");
            }
        }
        for token in pending {
            if let Err(e) = inner.free_if_ours(&monitor, &owner, token).await {
                tracing::debug!(%monitor, token, error = %e, "cannot free an unconfirmed takeover; it will expire");
            }
        }
    }

    /// Cleans up inline; if this is cancelled half-way, `Drop` repeats it in the background
    /// (both steps are idempotent).
    async fn finish(&mut self) {
        let waiter = self.waiter.as_ref().map(|w| w.id.clone());
        let pending = self.pending.clone();
        Self::cleanup(
            self.inner.clone(),
            self.monitor.clone(),
            self.owner.clone(),
            waiter,
            pending,
        )
        .await;
        self.waiter = None;
        self.pending.clear();
        self.done = true;
    }
}

impl Drop for Acquisition {
    fn drop(&mut self) {
        if self.done || (self.waiter.is_none() && self.pending.is_empty()) {
            return;
        }
        let waiter = self.waiter.take().map(|w| w.id);
        let pending = std::mem::take(&mut self.pending);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(Self::cleanup(
                self.inner.clone(),
                self.monitor.clone(),
                self.owner.clone(),
                waiter,
                pending,
            ));
        }
    }
}

impl EsLockService {
    /// A builder with the defaults of [`Settings::default`].
    pub fn builder(store: Arc<dyn DocStore>) -> EsLockServiceBuilder {
        let s = Settings::default();
        EsLockServiceBuilder {
            store,
            cfg: Config {
                index: s.es_lock.index,
                ttl: s.es_lock.ttl,
                skew: s.es_lock.clock_skew,
                foreground_timeout: s.zookeeper.foreground_timeout,
                background_timeout: s.zookeeper.background_timeout,
                background_max_wait: s.zookeeper.background_max_wait,
                poll_initial: Duration::from_millis(10),
                poll_max: Duration::from_millis(250),
                keep_alive: true,
                clock_offset_ms: 0,
                waiter_ttl: s.es_lock.ttl,
            },
            waiter_ttl: None,
        }
    }

    /// The service configured by `settings`: `elasticsearch.lock.index`, `elasticsearch.lock.ttl`,
    /// `elasticsearch.lock.clock.skew`, and the wait timeouts `zookeeper.foreground.task.timeout` /
    /// `zookeeper.background.task.timeout` and `zookeeper.background.max.wait`, which apply to
    /// both backends.
    ///
    /// # Errors
    /// [`LockError::Backend`] when the settings are out of range (see
    /// [`EsLockServiceBuilder::build`]).
    pub fn from_settings(settings: &Settings, store: Arc<dyn DocStore>) -> Result<Self, LockError> {
        Self::builder(store)
            .index(settings.es_lock.index.clone())
            .ttl(settings.es_lock.ttl)
            .clock_skew(settings.es_lock.clock_skew)
            .timeouts(
                settings.zookeeper.foreground_timeout,
                settings.zookeeper.background_timeout,
            )
            .background_max_wait(settings.zookeeper.background_max_wait)
            .build()
    }

    /// The lock index.
    pub fn index(&self) -> &str {
        &self.inner.cfg.index
    }

    /// The lease length.
    pub fn ttl(&self) -> Duration {
        self.inner.cfg.ttl
    }

    /// The assumed maximum clock skew.
    pub fn clock_skew(&self) -> Duration {
        self.inner.cfg.skew
    }

    /// The prefix of the owner ids this service generates (`host:pid:random`).
    pub fn owner_prefix(&self) -> &str {
        &self.inner.owner_prefix
    }

    /// Acquires the lock with a fresh owner id, waiting up to the request's timeout (a zero
    /// timeout tries once, see [`EsLockService::try_lock`]).
    ///
    /// # Errors
    /// [`LockError::InvalidMonitor`] for a bad name; [`LockError::Timeout`] when another holder
    /// kept the lock (or, for a background request, foreground waiters kept coming) until the
    /// timeout; [`LockError::ConnectionLoss`] when Elasticsearch was unreachable at the end of
    /// the wait; [`LockError::Backend`] when the lock index holds foreign documents or rejects
    /// requests.
    ///
    /// # Cancellation safety
    /// Cancel-safe: a dropped acquisition removes its foreground registration and frees a
    /// takeover whose answer it did not see, in the background.
    pub async fn lock(&self, request: LockRequest) -> Result<EsLockGuard, LockError> {
        let owner = format!(
            "{}:{}",
            self.inner.owner_prefix,
            self.inner.counter.fetch_add(1, Ordering::Relaxed) + 1
        );
        self.acquire_inner(request, owner, false).await
    }

    /// Tries once with a fresh owner id: takes the lock if it is free (or its lease expired)
    /// right now, and, for a background request, no foreground contender is registered as
    /// waiting; otherwise fails at once. The same as [`EsLockService::lock`] with a request
    /// whose timeout is [`Duration::ZERO`]. A failed try leaves no waiter registration behind.
    ///
    /// # Errors
    /// [`LockError::Timeout`] naming the holder (owner and lock info from the lock document) or
    /// the foreground waiters; otherwise as [`EsLockService::lock`].
    ///
    /// # Cancellation safety
    /// As [`EsLockService::lock`].
    pub async fn try_lock(&self, request: LockRequest) -> Result<EsLockGuard, LockError> {
        self.lock(request.with_timeout(Duration::ZERO)).await
    }

    /// Acquires the lock for an explicit, caller-chosen owner id. A lock already held by the
    /// same owner is taken over at once (and a live guard of that owner in this process loses
    /// it first): "re-acquiring one's own lock extends it", with a new fencing token.
    ///
    /// An owner id names one party: never let two processes use the same one, or they will
    /// both believe they hold the lock. [`EsLockService::lock`] generates unique ids.
    ///
    /// # Errors
    /// As [`EsLockService::lock`]; [`LockError::Backend`] for an empty, over-long
    /// ([`MAX_OWNER_LEN`]) or control-character owner id.
    ///
    /// # Cancellation safety
    /// As [`EsLockService::lock`].
    pub async fn lock_as(
        &self,
        owner: &str,
        request: LockRequest,
    ) -> Result<EsLockGuard, LockError> {
        check_owner(owner)?;
        self.acquire_inner(request, owner.to_string(), true).await
    }

    async fn acquire_inner(
        &self,
        request: LockRequest,
        owner: String,
        explicit_owner: bool,
    ) -> Result<EsLockGuard, LockError> {
        validate_monitor(&request.monitor)?;
        let timeout = request
            .timeout
            .unwrap_or_else(|| self.inner.cfg.timeout(request.lock_type));
        let span = tracing::info_span!("eslock.acquire", monitor = %request.monitor, lock_type = %request.lock_type,
            info = %request.info, %owner, timeout_ms = timeout.as_millis() as u64, token = tracing::field::Empty);
        self.acquire_loop(request, owner, explicit_owner, timeout)
            .instrument(span)
            .await
    }

    async fn acquire_loop(
        &self,
        request: LockRequest,
        owner: String,
        explicit_owner: bool,
        timeout: Duration,
    ) -> Result<EsLockGuard, LockError> {
        let inner = &self.inner;
        let start = Instant::now();
        let deadline = start + timeout;
        let mut cx = Acquisition {
            inner: inner.clone(),
            monitor: request.monitor.clone(),
            owner,
            explicit_owner,
            info: request.info.clone(),
            lock_type: request.lock_type,
            waiter: None,
            pending: Vec::new(),
            done: false,
        };
        let mut foreground = request.lock_type == LockType::Foreground;
        let refresh_every = inner.cfg.waiter_ttl / 3;
        // Foreground contenders register once their first attempt failed, then refresh.
        let mut next_refresh: Option<Instant> = None;
        let mut backoff = Backoff::new(inner.cfg.poll_initial, inner.cfg.poll_max);
        let mut last_error: Option<EsError>;
        let mut blocked_by: Option<Blocker>;
        loop {
            if !foreground
                && inner
                    .cfg
                    .background_max_wait
                    .is_some_and(|max| start.elapsed() >= max)
            {
                tracing::debug!("background contender waited past zookeeper.background.max.wait; competing as foreground");
                foreground = true;
            }
            let step = cx.attempt(foreground).await;
            match step {
                Ok(Step::Acquired(guard)) => {
                    cx.finish().await;
                    tracing::Span::current().record("token", guard.fencing_token());
                    tracing::debug!(
                        waited_ms = start.elapsed().as_millis() as u64,
                        "Elasticsearch lock acquired"
                    );
                    return Ok(guard);
                }
                Ok(Step::Retry) if Instant::now() < deadline => continue,
                Ok(Step::Retry) => {
                    // Lost a race for the lock at the deadline: see who won.
                    last_error = None;
                    blocked_by = cx.describe().await;
                }
                Ok(Step::Busy(blocker)) => {
                    last_error = None;
                    blocked_by = blocker;
                }
                Err(e) if e.is_transient() => {
                    tracing::debug!(error = %e, "lock attempt failed; retrying");
                    last_error = Some(e);
                    blocked_by = None;
                }
                Err(e) => {
                    cx.finish().await;
                    return Err(es_error("acquiring the Elasticsearch lock", e));
                }
            }
            let now = Instant::now();
            if now >= deadline {
                cx.finish().await;
                return Err(match last_error {
                    Some(e) => es_error("acquiring the Elasticsearch lock", e),
                    None => LockError::Timeout {
                        monitor: request.monitor,
                        lock_type: request.lock_type,
                        waited: now - start,
                        blocked_by: blocked_by.map(Box::new),
                    },
                });
            }
            if foreground && next_refresh.is_none_or(|due| now >= due) {
                let registered = match inner.ensure_index().await {
                    Ok(()) => cx.register().await,
                    Err(e) => Err(e),
                };
                let now = Instant::now();
                next_refresh = Some(match registered {
                    Ok(()) => now + refresh_every,
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot register as a foreground waiter; retrying");
                        now + inner.cfg.poll_max.min(refresh_every)
                    }
                });
            }
            let mut wake = Instant::now() + backoff.next_delay();
            if let (true, Some(due)) = (foreground, next_refresh) {
                wake = wake.min(due);
            }
            tokio::time::sleep_until(wake.min(deadline).into()).await;
        }
    }

    /// Frees the lock of `monitor` if `owner` holds it; returns whether it did. A release by
    /// anyone else changes nothing. A live guard of that owner in this process loses the lock.
    ///
    /// # Errors
    /// [`LockError::InvalidMonitor`]; [`LockError::ConnectionLoss`] / [`LockError::Backend`] for
    /// Elasticsearch failures.
    ///
    /// # Cancellation safety
    /// A dropped call may or may not have freed the lock.
    pub async fn release_as(&self, monitor: &str, owner: &str) -> Result<bool, LockError> {
        validate_monitor(monitor)?;
        let span = tracing::info_span!("eslock.release_as", %monitor, %owner);
        async {
            let inner = &self.inner;
            for _ in 0..8 {
                match inner
                    .read_lock(monitor)
                    .await
                    .map_err(|e| es_error("reading the lock", e))?
                {
                    Some((rec, meta)) if rec.state == LockState::Held && rec.owner == owner => {
                        inner.supersede_local(monitor, owner);
                        if inner
                            .free_at(&rec, meta)
                            .await
                            .map_err(|e| es_error("releasing the lock", e))?
                        {
                            return Ok(true);
                        }
                    }
                    _ => return Ok(false),
                }
            }
            Ok(false)
        }
        .instrument(span)
        .await
    }

    /// Like [`EsLockService::release_as`], failing when `owner` held nothing.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] when `owner` did not hold the lock (nothing was changed); others as
    /// [`EsLockService::release_as`].
    ///
    /// # Cancellation safety
    /// As [`EsLockService::release_as`].
    pub async fn must_release_as(&self, monitor: &str, owner: &str) -> Result<(), LockError> {
        if self.release_as(monitor, owner).await? {
            Ok(())
        } else {
            Err(LockError::NotHeld {
                monitor: monitor.to_string(),
            })
        }
    }

    /// The lock document of `monitor` (realtime), if any.
    ///
    /// # Errors
    /// [`LockError::InvalidMonitor`]; Elasticsearch failures.
    ///
    /// # Cancellation safety
    /// Cancel-safe (read-only).
    pub async fn status(&self, monitor: &str) -> Result<Option<EsLockStatus>, LockError> {
        validate_monitor(monitor)?;
        let now = self.inner.now_ms();
        let skew = self.inner.cfg.skew_ms();
        Ok(self
            .inner
            .read_lock(monitor)
            .await
            .map_err(|e| es_error("reading the lock", e))?
            .map(|(record, meta)| {
                let takeable = record.is_takeable(now, skew);
                EsLockStatus {
                    record,
                    meta,
                    takeable,
                }
            }))
    }

    /// The foreground registrations of `monitor` that are still live on this service's clock.
    ///
    /// # Errors
    /// [`LockError::InvalidMonitor`]; Elasticsearch failures.
    ///
    /// # Cancellation safety
    /// Cancel-safe (read-only).
    pub async fn foreground_waiters(&self, monitor: &str) -> Result<Vec<WaiterRecord>, LockError> {
        validate_monitor(monitor)?;
        self.inner
            .live_waiters(monitor)
            .await
            .map_err(|e| es_error("reading the foreground waiters", e))
    }

    /// Every lock document (refreshes the index first, then searches; at most 10 000), sorted
    /// by monitor.
    ///
    /// # Errors
    /// Elasticsearch failures.
    ///
    /// # Cancellation safety
    /// Cancel-safe (read-only).
    pub async fn list(&self) -> Result<Vec<EsLockStatus>, LockError> {
        let inner = &self.inner;
        let ctx = "listing the Elasticsearch locks";
        match inner.store.refresh(&inner.cfg.index).await {
            Ok(()) | Err(EsError::NotFound { .. }) => {}
            Err(e) => return Err(es_error(ctx, e)),
        }
        let body = serde_json::json!({
            "query": { "term": { "kind": KIND_LOCK } },
            "sort": [ { "monitor": "asc" } ],
            "size": 10_000,
            "seq_no_primary_term": true
        });
        let now = inner.now_ms();
        let skew = inner.cfg.skew_ms();
        let docs = inner
            .store
            .search(&inner.cfg.index, &body)
            .await
            .map_err(|e| es_error(ctx, e))?;
        docs.into_iter()
            .map(|doc| {
                let record: LockRecord = serde_json::from_value(doc.source).map_err(|e| {
                    es_error(ctx, EsError::Protocol(format!("document {}: {e}", doc.id)))
                })?;
                let takeable = record.is_takeable(now, skew);
                Ok(EsLockStatus {
                    record,
                    meta: doc.meta,
                    takeable,
                })
            })
            .collect()
    }
}

fn check_owner(owner: &str) -> Result<(), LockError> {
    let bad = |why: &str| {
        Err(LockError::Backend {
            context: "checking the lock owner id".into(),
            detail: format!("owner id {owner:?} {why}"),
        })
    };
    if owner.is_empty() {
        return bad("is empty; pass a stable, unique name such as the pod name");
    }
    if owner.len() > MAX_OWNER_LEN {
        return bad(&format!(
            "is {} bytes long; the limit is {MAX_OWNER_LEN}",
            owner.len()
        ));
    }
    if owner.chars().any(char::is_control) {
        return bad("contains control characters");
    }
    Ok(())
}

#[async_trait]
impl LockService for EsLockService {
    async fn acquire(&self, request: LockRequest) -> Result<Box<dyn Guard>, LockError> {
        Ok(Box::new(self.lock(request).await?))
    }

    fn backend_name(&self) -> &'static str {
        "elasticsearch"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takeable_only_past_expiry_plus_skew() {
        let rec = LockRecord {
            kind: KIND_LOCK.into(),
            monitor: "m".into(),
            state: LockState::Held,
            owner: "o".into(),
            info: String::new(),
            lock_type: LockType::Foreground,
            token: 1,
            acquired: 0,
            expires: 1_000,
            renewed: 0,
            released: None,
            host: String::new(),
            pid: 0,
        };
        assert!(!rec.is_takeable(1_000, 100));
        assert!(!rec.is_takeable(1_100, 100));
        assert!(rec.is_takeable(1_101, 100));
        let free = LockRecord {
            state: LockState::Free,
            ..rec
        };
        assert!(free.is_takeable(0, 100));
    }

    #[test]
    fn waiter_live_until_expiry_plus_skew() {
        let w = WaiterRecord {
            id: "w".into(),
            owner: "o".into(),
            info: String::new(),
            registered: 0,
            expires: 500,
        };
        assert!(w.is_live(600, 100));
        assert!(!w.is_live(601, 100));
    }
}
