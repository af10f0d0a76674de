//! What a contender waits on besides its watch: the session's health.

use std::time::Instant;

use tokio::sync::watch;

use super::session::{Health, Slot};
use crate::lock::LockError;

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
