//! [`EsLockService`] and its builder: configuration, the public acquire and release calls,
//! status and listing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::OnceCell;
use tracing::Instrument;

use super::acquire::acquire_loop;
use super::guard::EsLockGuard;
use super::record::{EsLockStatus, LockRecord, LockState, WaiterRecord, KIND_LOCK};
use super::state::{es_error, host_name, Config, Inner};
use crate::config::Settings;
use crate::es::{DocStore, EsError};
use crate::lock::{validate_info, validate_monitor, Guard, LockError, LockRequest, LockService};

/// The longest explicit owner id, in bytes.
pub const MAX_OWNER_LEN: usize = 256;

fn config_error(detail: String) -> LockError {
    LockError::Backend {
        context: "configuring the Elasticsearch lease lock".into(),
        detail,
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

/// The Elasticsearch lease lock service. Cheap to clone; clones share the owner prefix.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use zkguard::{config::Settings, es::EsStore, eslock::EsLockService, LockRequest, LockType};
///
/// let settings = Settings::load(None)?;
/// let store = Arc::new(EsStore::new(&settings.elasticsearch)?);
/// let locks = EsLockService::builder(store)
///     .ttl(Duration::from_secs(30))
///     .clock_skew(Duration::from_secs(2))
///     .build()?;
/// let request = LockRequest::new("article-42", "Bulk Propagation").with_type(LockType::Background);
/// let guard = locks.lock(request).await?;
/// // ... write article-42 with guard.fencing_token() as its external version ...
/// guard.must_release().await?;
/// # Ok(()) }
/// ```
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
    /// [`LockError::InvalidMonitor`] for a bad name, [`LockError::InfoTooLong`] for a lock info
    /// over [`crate::lock::MAX_INFO_LEN`]; [`LockError::Timeout`] when another holder
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
        validate_info(&request.info)?;
        let timeout = request
            .timeout
            .unwrap_or_else(|| self.inner.cfg.timeout(request.lock_type));
        let span = tracing::info_span!("eslock.acquire", monitor = %request.monitor, lock_type = %request.lock_type,
            info = %request.info, %owner, timeout_ms = timeout.as_millis() as u64, token = tracing::field::Empty);
        acquire_loop(&self.inner, request, owner, explicit_owner, timeout)
            .instrument(span)
            .await
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
