//! Operations that ride in a release's multi (`LockGuard::release_with`): the next
//! acquisition's first step (`release_and_acquire`), or a waiter's take handed the lock by a
//! holder of its session (`zk::successor`), and what became of them.

use zookeeper_client::{Error as ZkError, MultiWriteResult, MultiWriter};

/// Adds the next acquisition's operations to a release multi (`LockGuard::release_with`).
pub(in crate::zk) type NextOps =
    Box<dyn for<'a> FnOnce(&mut MultiWriter<'a>) -> Result<(), ZkError> + Send>;

/// What became of the next acquisition's operations in `LockGuard::release_with`.
pub(in crate::zk) enum Joined {
    /// Applied with the release: the results of the next acquisition's operations.
    Applied(Vec<MultiWriteResult>),
    /// Nothing was applied. When one of the next acquisition's operations failed: its index
    /// among them, its error, and the release waiting for other operations to carry; otherwise
    /// the release goes on its own.
    NotApplied {
        next_failed: Option<(usize, ZkError, Retry)>,
    },
    /// The answer was lost, or the request failed: the operations may have been applied.
    Lost(ZkError),
}

/// A release whose multi failed on the next acquisition's part, waiting for other operations
/// to carry ([`Retry::send`]); dropped, it goes on its own.
pub(in crate::zk) struct Retry(
    pub(in crate::zk) tokio::sync::oneshot::Sender<(NextOps, tokio::sync::oneshot::Sender<Joined>)>,
);

impl Retry {
    /// Has the release send `ops` with it in a new multi; the outcome comes through `joined`.
    /// The request goes out once the release's task runs, not before this returns.
    pub(in crate::zk) fn send(self, ops: NextOps, joined: tokio::sync::oneshot::Sender<Joined>) {
        if let Err((_, joined)) = self.0.send((ops, joined)) {
            // The release task is gone (the runtime is shutting down).
            let _ = joined.send(Joined::Lost(ZkError::ConnectionLoss));
        }
    }
}
