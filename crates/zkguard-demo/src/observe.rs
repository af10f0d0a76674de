//! Lock observation: a wrapper around the lock service that measures wait and hold times and
//! counts overtakes.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use zkguard::lock::{Guard, LockError, LockRequest, LockService, LockType, LossReason, Release};

#[derive(Default)]
pub(super) struct LockStats {
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, (String, LockType, Instant)>>,
    wait: Mutex<HashMap<LockType, Vec<Duration>>>,
    hold: Mutex<HashMap<LockType, Vec<Duration>>>,
    timeouts: Mutex<HashMap<LockType, usize>>,
    overtakes: AtomicU64,
}

/// A [`LockService`] that measures lock wait and hold times per class and counts
/// foreground-over-background overtakes.
#[derive(Clone)]
pub struct ObservedLocks {
    inner: Arc<dyn LockService>,
    stats: Arc<LockStats>,
}

impl fmt::Debug for ObservedLocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObservedLocks")
            .field("backend", &self.inner.backend_name())
            .finish_non_exhaustive()
    }
}

impl ObservedLocks {
    /// Observes `inner`.
    pub fn new(inner: Arc<dyn LockService>) -> Self {
        Self {
            inner,
            stats: Arc::new(LockStats::default()),
        }
    }

    /// Observes another service into the same figures.
    pub fn sharing_stats(&self, inner: Arc<dyn LockService>) -> Self {
        Self {
            inner,
            stats: self.stats.clone(),
        }
    }

    /// Foreground contenders that got a lock while a background contender that asked for the
    /// same lock earlier was still waiting.
    pub fn overtakes(&self) -> u64 {
        self.stats.overtakes.load(Ordering::Relaxed)
    }

    /// Wait times of successful acquisitions of a class.
    pub fn wait_times(&self, class: LockType) -> Vec<Duration> {
        self.stats
            .wait
            .lock()
            .expect("stats lock")
            .get(&class)
            .cloned()
            .unwrap_or_default()
    }

    /// Hold times of a class.
    pub fn hold_times(&self, class: LockType) -> Vec<Duration> {
        self.stats
            .hold
            .lock()
            .expect("stats lock")
            .get(&class)
            .cloned()
            .unwrap_or_default()
    }

    /// Acquisitions of a class that timed out.
    pub fn timeouts(&self, class: LockType) -> usize {
        self.stats
            .timeouts
            .lock()
            .expect("stats lock")
            .get(&class)
            .copied()
            .unwrap_or(0)
    }
}

/// Removes a waiter's entry however its acquisition ends (also when it is cancelled).
pub(super) struct Waiting<'a> {
    stats: &'a LockStats,
    key: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.stats
            .waiting
            .lock()
            .expect("stats lock")
            .remove(&self.key);
    }
}

#[async_trait]
impl LockService for ObservedLocks {
    async fn acquire(&self, request: LockRequest) -> Result<Box<dyn Guard>, LockError> {
        let stats = &*self.stats;
        let class = request.lock_type;
        let monitor = request.monitor.clone();
        let key = stats.next.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        stats
            .waiting
            .lock()
            .expect("stats lock")
            .insert(key, (monitor.clone(), class, started));
        let waiting = Waiting { stats, key };
        let result = self.inner.acquire(request).await;
        if class == LockType::Foreground && result.is_ok() {
            let overtaken = stats
                .waiting
                .lock()
                .expect("stats lock")
                .values()
                .filter(|(m, c, t)| *m == monitor && *c == LockType::Background && *t < started)
                .count();
            stats
                .overtakes
                .fetch_add(overtaken as u64, Ordering::Relaxed);
        }
        drop(waiting);
        match result {
            Ok(guard) => {
                stats
                    .wait
                    .lock()
                    .expect("stats lock")
                    .entry(class)
                    .or_default()
                    .push(started.elapsed());
                Ok(Box::new(ObservedGuard {
                    inner: Some(guard),
                    stats: self.stats.clone(),
                    acquired: Instant::now(),
                }))
            }
            Err(e) => {
                if matches!(e, LockError::Timeout { .. }) {
                    *stats
                        .timeouts
                        .lock()
                        .expect("stats lock")
                        .entry(class)
                        .or_default() += 1;
                }
                Err(e)
            }
        }
    }

    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
}

#[derive(Debug)]
pub(super) struct ObservedGuard {
    inner: Option<Box<dyn Guard>>,
    stats: Arc<LockStats>,
    acquired: Instant,
}

impl fmt::Debug for LockStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LockStats")
    }
}

impl ObservedGuard {
    fn guard(&self) -> &dyn Guard {
        self.inner
            .as_deref()
            .expect("the guard is present until released")
    }

    fn record(&mut self) -> Option<Box<dyn Guard>> {
        let guard = self.inner.take()?;
        self.stats
            .hold
            .lock()
            .expect("stats lock")
            .entry(guard.lock_type())
            .or_default()
            .push(self.acquired.elapsed());
        Some(guard)
    }
}

impl Drop for ObservedGuard {
    fn drop(&mut self) {
        // Dropped without unlock: the inner guard releases in the background.
        let _ = self.record();
    }
}

#[async_trait]
impl Guard for ObservedGuard {
    fn monitor(&self) -> &str {
        self.guard().monitor()
    }
    fn lock_type(&self) -> LockType {
        self.guard().lock_type()
    }
    fn fencing_token(&self) -> u64 {
        self.guard().fencing_token()
    }
    fn is_held(&self) -> bool {
        self.guard().is_held()
    }
    fn loss(&self) -> Option<LossReason> {
        self.guard().loss()
    }
    async fn lost(&self) -> LossReason {
        self.guard().lost().await
    }
    async fn unlock(mut self: Box<Self>) -> Result<(), LockError> {
        match self.record() {
            Some(guard) => guard.unlock().await,
            None => Ok(()),
        }
    }
    async fn release(mut self: Box<Self>) -> Release {
        match self.record() {
            Some(guard) => guard.release().await,
            None => Release::done(Ok(())),
        }
    }
}
