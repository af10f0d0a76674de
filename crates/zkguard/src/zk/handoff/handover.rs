//! A held lock released by the next acquisition's first multi (`release_and_acquire`): the
//! release carries the acquisition's operations, and waits for other ones when the
//! acquisition's part failed (a multi is atomic).

use zookeeper_client::{Error as ZkError, MultiWriteError};

use super::carried::{Joined, NextOps, Retry};
use crate::lock::Release;
use crate::zk::driver::multi_reply;
use crate::zk::guard::LockGuard;
use crate::zk::protocol::{MultiError, Reply};

/// A lock of the same session that an acquisition releases in its first multi
/// (`LockGuard::release_with`), and where the release under way goes.
pub(in crate::zk) struct After<'r> {
    how: Carrier,
    release: &'r mut Option<Release>,
}

/// What carries the next operations: the held lock, or its release waiting after a multi whose
/// acquisition part failed.
enum Carrier {
    Held(LockGuard),
    Waiting(Retry),
}

impl<'r> After<'r> {
    /// `previous`, whose release goes to `release` once under way.
    pub(in crate::zk) fn new(previous: LockGuard, release: &'r mut Option<Release>) -> Self {
        Self {
            how: Carrier::Held(previous),
            release,
        }
    }

    /// Releases the lock on its own.
    pub(in crate::zk) fn release_alone(self) {
        match self.how {
            Carrier::Held(previous) => *self.release = Some(previous.release()),
            // Dropped, the waiting release goes on its own.
            Carrier::Waiting(retry) => drop(retry),
        }
    }

    /// Has the release send `ops` with it in one multi: before this returns for a held lock,
    /// once the release's task runs for a waiting one ([`Sent::now`]).
    pub(in crate::zk) fn send(self, ops: NextOps) -> Sent<'r> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let now = match self.how {
            Carrier::Held(previous) => {
                *self.release = Some(previous.release_with(ops, tx));
                true
            }
            Carrier::Waiting(retry) => {
                retry.send(ops, tx);
                false
            }
        };
        Sent {
            rx,
            release: self.release,
            now,
        }
    }
}

/// Operations on their way with a release ([`After::send`]).
pub(in crate::zk) struct Sent<'r> {
    rx: tokio::sync::oneshot::Receiver<Joined>,
    release: &'r mut Option<Release>,
    /// Whether the request went out before `send` returned (a request sent after it is ordered
    /// behind the multi).
    pub(in crate::zk) now: bool,
}

impl<'r> Sent<'r> {
    /// Answers as the core takes the operations' own multi: their results, the failure of one
    /// of them (nothing applied; then also the release, waiting for other operations), a lost
    /// answer, or `NotCarried` when the release's own part failed (nothing was applied, and
    /// the release went on its own).
    pub(in crate::zk) async fn answer(self) -> (Reply, Option<After<'r>>) {
        let (reply, retry) = settle(self.rx.await);
        let waiting = retry.map(|retry| After {
            how: Carrier::Waiting(retry),
            release: self.release,
        });
        (reply, waiting)
    }
}

/// The answer of a waiter's take that a holder of its session carried in its release multi
/// (`zk::successor`), as [`Sent::answer`] gives it; when one of the take's operations failed,
/// the release goes on its own.
pub(in crate::zk) async fn joined_reply(answer: tokio::sync::oneshot::Receiver<Joined>) -> Reply {
    settle(answer.await).0
}

/// What became of operations carried by a release, as the reply to their own multi, and the
/// release waiting for other operations when one of them failed.
fn settle(
    joined: Result<Joined, tokio::sync::oneshot::error::RecvError>,
) -> (Reply, Option<Retry>) {
    match joined {
        Ok(Joined::Applied(results)) => (multi_reply(Ok(results)), None),
        Ok(Joined::NotApplied {
            next_failed: Some((index, source, retry)),
        }) => (
            multi_reply(Err(MultiWriteError::OperationFailed { index, source })),
            Some(retry),
        ),
        Ok(Joined::NotApplied { next_failed: None }) => {
            (Reply::Multi(Err(MultiError::NotCarried)), None)
        }
        Ok(Joined::Lost(source)) => (
            multi_reply(Err(MultiWriteError::RequestFailed { source })),
            None,
        ),
        // The release task ended without a word (the runtime is shutting down).
        Err(_) => (
            multi_reply(Err(MultiWriteError::RequestFailed {
                source: ZkError::ConnectionLoss,
            })),
            None,
        ),
    }
}
