//! Hand-overs within one session: a holder whose next in line is a waiter of its own session
//! passes the lock on in one transaction, the release multi carrying the waiter's take of the
//! mutex (see `docs/zookeeper-lock.md`, "Hand-over within a session").
//!
//! A waiter at a hand-over point ([`Acquisition::hand_over_point`]) registers here while it
//! waits; a holder releasing the lock looks for a waiter of its monitor that waits for its node
//! or for the mutex and claims it, under the waiter's lock, while it sends the multi: the waiter
//! then takes the answer of that multi as the answer of its own take, whatever woke it, and
//! never acts on the watch event the multi fires. A waiter that stops waiting first closes its
//! registration, and the holder releases as usual.
//!
//! [`Acquisition::hand_over_point`]: super::protocol::Acquisition::hand_over_point

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};

use tokio::sync::{oneshot, Notify};

use super::carried::{Joined, NextOps};
use crate::zk::driver::add_ops;
use crate::zk::node::Paths;
use crate::zk::protocol::{Awaits, Op};

/// The waiters of one session that a holder of the same session may hand its lock to, by
/// monitor path.
#[derive(Default)]
pub(crate) struct Successors {
    waiting: StdMutex<HashMap<String, Vec<Arc<Waiter>>>>,
}

/// A waiter at a hand-over point.
pub(in crate::zk) struct Waiter {
    paths: Paths,
    awaits: Awaits,
    /// Its take of the mutex, and the bytes of the nodes it creates.
    ops: Vec<Op>,
    bytes: Vec<Vec<u8>>,
    state: StdMutex<State>,
    claimed: Notify,
}

enum State {
    Open,
    /// A holder sent the waiter's take in its release: the answer comes here.
    Claimed(oneshot::Receiver<Joined>),
    Closed,
}

impl Successors {
    /// Registers a waiter of `paths`' monitor that waits for `awaits`, whose take is `ops`.
    pub(in crate::zk) fn register(
        &self,
        paths: &Paths,
        awaits: Awaits,
        ops: Vec<Op>,
        bytes: Vec<Vec<u8>>,
    ) -> Arc<Waiter> {
        let waiter = Arc::new(Waiter {
            paths: paths.clone(),
            awaits,
            ops,
            bytes,
            state: StdMutex::new(State::Open),
            claimed: Notify::new(),
        });
        self.waiting
            .lock()
            .expect("successors")
            .entry(paths.monitor.clone())
            .or_default()
            .push(waiter.clone());
        waiter
    }

    /// Ends a registration: the answer of the take a holder sent for the waiter, if one did.
    pub(in crate::zk) fn close(&self, waiter: &Arc<Waiter>) -> Option<oneshot::Receiver<Joined>> {
        {
            let mut map = self.waiting.lock().expect("successors");
            if let Some(list) = map.get_mut(&waiter.paths.monitor) {
                list.retain(|w| !Arc::ptr_eq(w, waiter));
                if list.is_empty() {
                    map.remove(&waiter.paths.monitor);
                }
            }
        }
        let mut state = waiter.state.lock().expect("waiter");
        match std::mem::replace(&mut *state, State::Closed) {
            State::Claimed(answer) => Some(answer),
            State::Open | State::Closed => None,
        }
    }

    /// How many waiters are registered.
    pub(in crate::zk) fn len(&self) -> usize {
        self.waiting
            .lock()
            .expect("successors")
            .values()
            .map(Vec::len)
            .sum()
    }

    /// Whether a waiter of `monitor` would take a hand-over from the holder of queue node `node`.
    pub(in crate::zk) fn awaits(&self, monitor: &str, node: &str) -> bool {
        self.find(monitor, node).is_some()
    }

    fn find(&self, monitor: &str, node: &str) -> Option<Arc<Waiter>> {
        let map = self.waiting.lock().expect("successors");
        map.get(monitor)?
            .iter()
            .find(|w| match &w.awaits {
                Awaits::Node(ahead) => ahead == node,
                Awaits::Mutex => true,
            })
            .cloned()
    }

    /// Hands the lock of the holder of queue node `node` on `monitor` to a waiter of this
    /// session, if one waits for it: `release(held, ops, joined)` sends the holder's release
    /// multi carrying the waiter's take `ops` (before it returns) and tells the outcome through
    /// `joined`. `Err(held)` when no waiter is there to take it.
    pub(in crate::zk) fn hand_over<T, R>(
        &self,
        monitor: &str,
        node: &str,
        held: T,
        release: impl FnOnce(T, NextOps, oneshot::Sender<Joined>) -> R,
    ) -> Result<R, T> {
        let Some(waiter) = self.find(monitor, node) else {
            return Err(held);
        };
        let mut state = waiter.state.lock().expect("waiter");
        if !matches!(*state, State::Open) {
            return Err(held);
        }
        let (paths, ops, bytes) = (
            waiter.paths.clone(),
            waiter.ops.clone(),
            waiter.bytes.clone(),
        );
        let next: NextOps = Box::new(move |multi| add_ops(multi, &paths, &ops, &bytes));
        let (tx, rx) = oneshot::channel();
        // Sent while the waiter's lock is held: a waiter that stops waiting now finds it
        // claimed, and whatever it sends afterwards goes behind the multi.
        let sent = release(held, next, tx);
        *state = State::Claimed(rx);
        drop(state);
        waiter.claimed.notify_one();
        Ok(sent)
    }
}

impl Waiter {
    /// Resolves once a holder claimed this waiter (at once if one did already).
    pub(in crate::zk) async fn claimed(&self) {
        self.claimed.notified().await;
    }
}
