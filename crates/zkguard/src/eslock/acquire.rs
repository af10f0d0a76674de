//! One acquisition: registering a foreground waiter, the conditional takeover attempts, and
//! undoing its traces when it ends without a guard.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::guard::{EsLockGuard, GuardShared};
use super::record::{LockRecord, LockState, WaiterRecord, KIND_LOCK};
use super::state::{es_error, host_name, Inner, LiveGuard};
use crate::backoff::Backoff;
use crate::es::{EsError, Refresh, WriteCondition};
use crate::lock::{Blocker, Guard, LockError, LockRequest, LockType};

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
            let weak: Weak<GuardShared> = Arc::downgrade(&shared);
            let live: Weak<dyn LiveGuard> = weak;
            inner.register_local(&shared.record.monitor, &shared.record.owner, live);
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

/// Waits for the lock: attempts, polls with backoff while it is held, gives up at the deadline.
pub(super) async fn acquire_loop(
    inner: &Arc<Inner>,
    request: LockRequest,
    owner: String,
    explicit_owner: bool,
    timeout: Duration,
) -> Result<EsLockGuard, LockError> {
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
