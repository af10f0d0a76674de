//! A held Elasticsearch lease: keep-alive, loss detection and conditional release.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::record::{LockRecord, LockState};
use super::state::{es_error, Inner, LiveGuard};
use crate::backoff::Backoff;
use crate::es::{DocMeta, EsError};
use crate::lock::{Guard, LockError, LockType, LossReason, LossSignal};

/// How often a conflicting write re-reads and retries while the document is still ours.
const MAX_ADOPT: usize = 8;

/// State shared by a guard and its keep-alive task.
pub(crate) struct GuardShared {
    pub(crate) svc: Arc<Inner>,
    /// The record as written by the acquisition (owner, token, info, type, acquired).
    pub(crate) record: LockRecord,
    /// When the winning write was sent: the lease cannot have started earlier.
    pub(crate) acquired_at: Instant,
    state: Mutex<GuardState>,
    /// Serializes renewals and the release of this guard.
    op: tokio::sync::Mutex<()>,
    pub(crate) loss: LossSignal,
}

#[derive(Debug, Clone, Copy)]
struct GuardState {
    meta: DocMeta,
    /// The holder's own end of the lease: `send time of the last confirmed write + ttl - skew`
    /// on the monotonic clock.
    valid_until: Instant,
    /// When the last confirmed write was sent.
    last_sent: Instant,
    /// `expires` as last written (holder's wall clock, ms).
    expires_ms: i64,
    released: bool,
}

pub(crate) enum RenewError {
    Lost(LossReason),
    Es(EsError),
}

pub(crate) enum ReleaseOutcome {
    Released,
    ReleasedAfterLoss(LossReason),
    NotOurs(String),
}

impl LiveGuard for GuardShared {
    fn retire(&self, reason: LossReason) {
        self.declare_lost(reason);
    }
}

impl GuardShared {
    pub(crate) fn new(svc: Arc<Inner>, record: LockRecord, meta: DocMeta, sent: Instant) -> Self {
        let valid_until = sent + svc.cfg.validity();
        let expires_ms = record.expires;
        Self {
            svc,
            record,
            acquired_at: sent,
            state: Mutex::new(GuardState {
                meta,
                valid_until,
                last_sent: sent,
                expires_ms,
                released: false,
            }),
            op: tokio::sync::Mutex::new(()),
            loss: LossSignal::new(),
        }
    }

    fn snapshot(&self) -> GuardState {
        *self.state.lock().expect("guard state lock")
    }

    /// Whether the lease is still ours: not released, not lost, and before our own deadline.
    /// Passing the deadline fires [`LossReason::LeaseExpired`], so the answer never flips back.
    pub(crate) fn check_held(&self) -> bool {
        let st = self.snapshot();
        if st.released || self.loss.get().is_some() {
            return false;
        }
        if Instant::now() >= st.valid_until {
            self.declare_lost(LossReason::LeaseExpired);
            return false;
        }
        true
    }

    pub(crate) fn declare_lost(&self, reason: LossReason) {
        if self.loss.fire(reason.clone()) {
            tracing::warn!(monitor = %self.record.monitor, owner = %self.record.owner,
                token = self.record.token, %reason, "Elasticsearch lease lost");
        }
    }

    fn is_ours(&self, rec: &LockRecord) -> bool {
        rec.state == LockState::Held
            && rec.owner == self.record.owner
            && rec.token == self.record.token
    }

    fn describe_holder(rec: &LockRecord) -> String {
        match rec.state {
            LockState::Held => rec.owner.clone(),
            LockState::Free => format!("nobody (freed after `{}`)", rec.owner),
        }
    }

    /// One conditional renewal (`if_seq_no`), re-reading and retrying while the document is
    /// still ours.
    pub(crate) async fn renew_once(&self) -> Result<(), RenewError> {
        let _op = self.op.lock().await;
        if !self.check_held() {
            return Err(RenewError::Lost(
                self.loss.get().unwrap_or(LossReason::Closed),
            ));
        }
        let svc = &self.svc;
        let mut meta = self.snapshot().meta;
        for _ in 0..MAX_ADOPT {
            let sent = Instant::now();
            let now = svc.now_ms();
            let mut rec = self.record.clone();
            rec.renewed = now;
            rec.expires = now + svc.cfg.ttl_ms();
            match svc.write_lock_at(&rec, meta).await {
                Ok(new_meta) => {
                    let mut st = self.state.lock().expect("guard state lock");
                    st.meta = new_meta;
                    if st.released || self.loss.get().is_some() || Instant::now() >= st.valid_until
                    {
                        drop(st);
                        // Too late: the holder already stopped counting on the lease.
                        self.declare_lost(LossReason::LeaseExpired);
                        return Err(RenewError::Lost(
                            self.loss.get().unwrap_or(LossReason::LeaseExpired),
                        ));
                    }
                    st.last_sent = sent;
                    st.valid_until = st.valid_until.max(sent + svc.cfg.validity());
                    st.expires_ms = rec.expires;
                    tracing::trace!(monitor = %rec.monitor, token = rec.token, expires = rec.expires, "lease renewed");
                    return Ok(());
                }
                Err(EsError::Conflict { .. }) | Err(EsError::NotFound { .. }) => {
                    match svc
                        .read_lock(&self.record.monitor)
                        .await
                        .map_err(RenewError::Es)?
                    {
                        Some((cur, cur_meta)) if self.is_ours(&cur) => {
                            // An earlier write of ours landed after all: adopt its version.
                            meta = cur_meta;
                            self.state.lock().expect("guard state lock").meta = cur_meta;
                        }
                        Some((cur, _)) => {
                            let reason = LossReason::TakenOver {
                                by: Self::describe_holder(&cur),
                            };
                            self.declare_lost(reason);
                            return Err(RenewError::Lost(
                                self.loss.get().unwrap_or(LossReason::LeaseExpired),
                            ));
                        }
                        None => {
                            let reason = LossReason::TakenOver {
                                by: "nobody (the lock document was deleted)".into(),
                            };
                            self.declare_lost(reason);
                            return Err(RenewError::Lost(
                                self.loss.get().unwrap_or(LossReason::LeaseExpired),
                            ));
                        }
                    }
                }
                Err(e) => return Err(RenewError::Es(e)),
            }
        }
        Err(RenewError::Es(EsError::Conflict {
            index: svc.cfg.index.clone(),
            id: self.record.monitor.clone(),
            reason: format!("the lock document kept changing during {MAX_ADOPT} renewal attempts"),
        }))
    }

    /// Marks the document free with a conditional write, if it is still ours. The guard stops
    /// counting on the lease before anything is sent.
    pub(crate) async fn release(&self) -> Result<ReleaseOutcome, EsError> {
        let _op = self.op.lock().await;
        let lost = if self.check_held() {
            None
        } else {
            self.loss.get()
        };
        let mut meta = {
            let mut st = self.state.lock().expect("guard state lock");
            st.released = true;
            st.meta
        };
        let svc = &self.svc;
        for _ in 0..MAX_ADOPT {
            match svc.write_lock_at(&svc.freed(&self.record), meta).await {
                Ok(_) => {
                    return Ok(match lost {
                        Some(reason) => ReleaseOutcome::ReleasedAfterLoss(reason),
                        None => ReleaseOutcome::Released,
                    })
                }
                Err(EsError::Conflict { .. }) | Err(EsError::NotFound { .. }) => {
                    match svc.read_lock(&self.record.monitor).await? {
                        Some((cur, cur_meta)) if self.is_ours(&cur) => meta = cur_meta,
                        Some((cur, _)) => {
                            let by = Self::describe_holder(&cur);
                            self.declare_lost(LossReason::TakenOver { by: by.clone() });
                            return Ok(ReleaseOutcome::NotOurs(format!(
                                "the lease was taken over by `{by}` (token {})",
                                cur.token
                            )));
                        }
                        None => {
                            self.declare_lost(LossReason::TakenOver {
                                by: "nobody (the lock document was deleted)".into(),
                            });
                            return Ok(ReleaseOutcome::NotOurs(
                                "the lock document was deleted".into(),
                            ));
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(EsError::Conflict {
            index: svc.cfg.index.clone(),
            id: self.record.monitor.clone(),
            reason: format!("the lock document kept changing during {MAX_ADOPT} release attempts"),
        })
    }
}

/// Renews the lease every third of its validity until released or lost, and fires
/// [`LossReason::LeaseExpired`] when the holder's deadline passes without a confirmed renewal.
/// With keep-alive off it only watches the deadline (renew by hand with [`EsLockGuard::renew`]).
async fn keep_alive(shared: Arc<GuardShared>, renew: bool) {
    let cfg = &shared.svc.cfg;
    let period = cfg.validity() / 3;
    let mut backoff = Backoff::new(cfg.poll_initial.min(period), period);
    let mut next = shared.acquired_at + period;
    loop {
        let st = shared.snapshot();
        if st.released || shared.loss.get().is_some() {
            return;
        }
        let wake = if renew {
            next.min(st.valid_until)
        } else {
            st.valid_until
        };
        tokio::time::sleep_until(wake.into()).await;
        if !shared.check_held() {
            return;
        }
        if !renew || Instant::now() < next {
            continue;
        }
        let deadline = shared.snapshot().valid_until;
        match tokio::time::timeout_at(deadline.into(), shared.renew_once()).await {
            Err(_elapsed) => {
                if Instant::now() >= shared.snapshot().valid_until {
                    shared.declare_lost(LossReason::LeaseExpired);
                    return;
                }
            }
            Ok(Ok(())) => {
                backoff.reset();
                next = shared.snapshot().last_sent + period;
            }
            Ok(Err(RenewError::Lost(_))) => return,
            Ok(Err(RenewError::Es(e))) => {
                let delay = backoff.next_delay();
                tracing::debug!(monitor = %shared.record.monitor, error = %e, ?delay, "lease renewal failed; retrying");
                next = Instant::now() + delay;
            }
        }
    }
}

/// A held Elasticsearch lease lock. Renewed in the background until released; see the
/// [module documentation](super) for the protocol.
///
/// Dropping a guard without [`Guard::unlock`], [`EsLockGuard::release`] or
/// [`EsLockGuard::must_release`] stops the keep-alive and releases the lock in the background
/// (when a Tokio runtime is available; otherwise the lease simply expires).
pub struct EsLockGuard {
    shared: Arc<GuardShared>,
    task: Option<JoinHandle<()>>,
    finished: bool,
}

impl fmt::Debug for EsLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EsLockGuard")
            .field("monitor", &self.shared.record.monitor)
            .field("owner", &self.shared.record.owner)
            .field("lock_type", &self.shared.record.lock_type)
            .field("token", &self.shared.record.token)
            .field("held", &self.shared.check_held())
            .finish()
    }
}

impl EsLockGuard {
    pub(crate) fn start(shared: Arc<GuardShared>, renew: bool) -> Self {
        let span = tracing::debug_span!("eslock.keep_alive", monitor = %shared.record.monitor,
            owner = %shared.record.owner, token = shared.record.token);
        let task = tokio::spawn(keep_alive(shared.clone(), renew).instrument(span));
        Self {
            shared,
            task: Some(task),
            finished: false,
        }
    }

    /// The owner id written into the lock document.
    pub fn owner(&self) -> &str {
        &self.shared.record.owner
    }

    /// The lock info ("Save Content").
    pub fn info(&self) -> &str {
        &self.shared.record.info
    }

    /// When the winning write was sent: the lease cannot have begun earlier.
    pub fn acquired_at(&self) -> Instant {
        self.shared.acquired_at
    }

    /// The holder's own end of the lease (monotonic clock): the send time of the last confirmed
    /// acquisition or renewal plus `ttl - clock_skew`. After it, [`Guard::is_held`] is false.
    pub fn valid_until(&self) -> Instant {
        self.shared.snapshot().valid_until
    }

    /// `expires` as last written into the lock document (this host's clock, ms since the epoch).
    pub fn expires_ms(&self) -> i64 {
        self.shared.snapshot().expires_ms
    }

    /// Renews the lease now (the keep-alive task does this on its own unless it was turned off
    /// with [`super::EsLockServiceBuilder::keep_alive`]).
    ///
    /// # Errors
    /// [`LockError::Lost`] when the lease was taken over or had already expired (the loss signal
    /// fires too); [`LockError::ConnectionLoss`] when Elasticsearch could not be reached (the lease
    /// is still valid until [`EsLockGuard::valid_until`]).
    ///
    /// # Cancellation safety
    /// Cancel-safe: a renewal that was sent but not confirmed only leaves the lease as it was or
    /// extends it; the next renewal or release adopts it.
    pub async fn renew(&self) -> Result<(), LockError> {
        let span = tracing::debug_span!("eslock.renew", monitor = %self.shared.record.monitor,
            owner = %self.shared.record.owner, token = self.shared.record.token);
        async {
            match self.shared.renew_once().await {
                Ok(()) => Ok(()),
                Err(RenewError::Lost(reason)) => Err(LockError::Lost {
                    monitor: self.shared.record.monitor.clone(),
                    reason,
                }),
                Err(RenewError::Es(e)) => Err(es_error("renewing the Elasticsearch lease", e)),
            }
        }
        .instrument(span)
        .await
    }

    async fn finish(&mut self) -> Result<ReleaseOutcome, LockError> {
        self.finished = true;
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
        let span = tracing::debug_span!("eslock.release", monitor = %self.shared.record.monitor,
            owner = %self.shared.record.owner, token = self.shared.record.token);
        let out = self.shared.release().instrument(span).await.map_err(|e| {
            es_error(
                "releasing the Elasticsearch lease (it will expire on its own)",
                e,
            )
        })?;
        if let ReleaseOutcome::Released = out {
            tracing::debug!(monitor = %self.shared.record.monitor, token = self.shared.record.token, "lease released");
        }
        Ok(out)
    }

    /// Releases the lock if it is still ours: marks the document free with a conditional write.
    /// Returns whether this call freed it (`false`: someone else had taken it over; nothing was
    /// changed).
    ///
    /// # Errors
    /// [`LockError::ConnectionLoss`] when Elasticsearch could not be reached: the lease then ends
    /// by expiry.
    ///
    /// # Cancellation safety
    /// Not cancel-safe in the sense that a dropped call may or may not have freed the lock; if it
    /// did not, the lease expires after at most the TTL.
    pub async fn release(mut self) -> Result<bool, LockError> {
        Ok(match self.finish().await? {
            ReleaseOutcome::Released | ReleaseOutcome::ReleasedAfterLoss(_) => true,
            ReleaseOutcome::NotOurs(_) => false,
        })
    }

    /// Releases the lock and fails when nothing was held.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] when the lock had been taken over (nothing was changed);
    /// [`LockError::Lost`] when the lease had lapsed before the release (the document was still
    /// ours and is now free, but the work done after the lapse was not protected);
    /// [`LockError::ConnectionLoss`] when Elasticsearch could not be reached.
    ///
    /// # Cancellation safety
    /// As [`EsLockGuard::release`].
    pub async fn must_release(mut self) -> Result<(), LockError> {
        let monitor = self.shared.record.monitor.clone();
        match self.finish().await? {
            ReleaseOutcome::Released => Ok(()),
            ReleaseOutcome::ReleasedAfterLoss(reason) => Err(LockError::Lost { monitor, reason }),
            ReleaseOutcome::NotOurs(_) => Err(LockError::NotHeld { monitor }),
        }
    }
}

impl Drop for EsLockGuard {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if self.finished {
            return;
        }
        self.finished = true;
        let shared = self.shared.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if let Err(e) = shared.release().await {
                        tracing::warn!(monitor = %shared.record.monitor, error = %e,
                            "releasing a dropped Elasticsearch lease failed; it will expire on its own");
                    }
                });
            }
            Err(_) => {
                shared.state.lock().expect("guard state lock").released = true;
            }
        }
    }
}

#[async_trait]
impl Guard for EsLockGuard {
    fn monitor(&self) -> &str {
        &self.shared.record.monitor
    }

    fn lock_type(&self) -> LockType {
        self.shared.record.lock_type
    }

    fn fencing_token(&self) -> u64 {
        self.shared.record.token
    }

    fn is_held(&self) -> bool {
        self.shared.check_held()
    }

    fn loss(&self) -> Option<LossReason> {
        self.shared.check_held();
        self.shared.loss.get()
    }

    async fn lost(&self) -> LossReason {
        self.shared.loss.wait().await
    }

    /// Releases the lock if it is still ours.
    ///
    /// # Errors
    /// [`LockError::NoNode`] when the lease had been taken over (nothing was changed);
    /// [`LockError::Lost`] when it had lapsed before the release (the document was freed);
    /// [`LockError::ConnectionLoss`] when Elasticsearch could not be reached.
    async fn unlock(mut self: Box<Self>) -> Result<(), LockError> {
        let monitor = self.shared.record.monitor.clone();
        match self.finish().await? {
            ReleaseOutcome::Released => Ok(()),
            ReleaseOutcome::ReleasedAfterLoss(reason) => Err(LockError::Lost { monitor, reason }),
            ReleaseOutcome::NotOurs(detail) => Err(LockError::NoNode { monitor, detail }),
        }
    }
}
