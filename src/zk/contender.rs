//! What a contender owns while it waits (cleaned up by the session's reaper if it goes away),
//! how one step of the contention ended, and waiting on the session's health.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;
use tracing::debug;

use super::names::Queue;
use super::reaper::Reap;
use super::session::{Health, Slot};
use crate::lock::LockError;

/// What a contender owns while it waits; cleaned up by the reaper if dropped while armed.
pub(super) struct Pending {
    pub(super) slot: Arc<Slot>,
    pub(super) node: Option<String>,
    pub(super) holds_mutex: bool,
    pub(super) mutex_path: String,
    pub(super) armed: bool,
    /// A create (queue node or mutex) was sent and its answer not yet handled.
    pub(super) in_flight: bool,
    pub(super) attempt: String,
    /// Took the lock on a monitor that had no other node (the fast path's multi recreated it):
    /// the release needs no hand-over mark (see `LockGuard::release`).
    pub(super) alone: bool,
}

impl Pending {
    pub(super) fn node_path(&self) -> Option<String> {
        let monitor = self.mutex_path.rsplit_once('/').map_or("", |(m, _)| m);
        self.node.as_ref().map(|n| format!("{monitor}/{n}"))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.armed && (self.node.is_some() || self.holds_mutex || self.in_flight) {
            debug!(node = ?self.node, holds_mutex = self.holds_mutex, in_flight = self.in_flight, "acquisition abandoned; removing its nodes");
            let monitor = self
                .mutex_path
                .rsplit_once('/')
                .map_or("", |(m, _)| m)
                .to_string();
            self.slot.reap(Reap {
                queue_node: self.node_path(),
                mutex: self.holds_mutex.then(|| self.mutex_path.clone()),
                search: self.in_flight.then(|| (monitor, self.attempt.clone())),
                attempt: self.attempt.clone(),
            });
        }
    }
}

/// How a contender step ended.
pub(super) enum Step {
    Acquired {
        token: u64,
        /// The monitor's data version the take left (see `LockGuard`), if it set it.
        version: Option<i32>,
    },
    Wait(Queue),
    /// First in line (seen in the queue just read, or proven without reading it) while the
    /// mutex is still held: wait for the mutex, then take it.
    FirstInLine,
    /// The mutex was held and the contender did not queue (try once).
    Busy,
}

pub(super) async fn abandon(pending: &mut Pending, err: LockError) -> LockError {
    // Session gone: its ephemeral nodes are gone too.
    pending.armed = false;
    err
}

/// Resolves when the session expires or closes.
pub(super) async fn health_failure(health: &mut watch::Receiver<Health>) -> LockError {
    loop {
        match *health.borrow_and_update() {
            Health::Expired => {
                return LockError::SessionExpired {
                    context: "waiting for the lock".into(),
                }
            }
            Health::Closed => {
                return LockError::Backend {
                    context: "waiting for the lock".into(),
                    detail: "session closed".into(),
                }
            }
            _ => {}
        }
        if health.changed().await.is_err() {
            return LockError::SessionExpired {
                context: "waiting for the lock".into(),
            };
        }
    }
}

/// Waits for the connection to come back (before `deadline`).
pub(super) async fn wait_connected(slot: &Slot, deadline: Instant) -> Result<(), LockError> {
    let mut health = slot.health_watch();
    loop {
        match *health.borrow_and_update() {
            Health::Connected => return Ok(()),
            Health::Expired => {
                return Err(LockError::SessionExpired {
                    context: "waiting to reconnect".into(),
                })
            }
            Health::Closed => {
                return Err(LockError::Backend {
                    context: "waiting to reconnect".into(),
                    detail: "session closed".into(),
                })
            }
            Health::Disconnected { .. } => {}
        }
        tokio::select! {
            r = health.changed() => if r.is_err() { return Err(LockError::SessionExpired { context: "waiting to reconnect".into() }) },
            _ = tokio::time::sleep_until(deadline.into()) => return Err(LockError::ConnectionLoss {
                context: "waiting for the lock".into(),
                detail: "still disconnected from ZooKeeper at the deadline; check that ZooKeeper is running and reachable".into(),
            }),
        }
    }
}
