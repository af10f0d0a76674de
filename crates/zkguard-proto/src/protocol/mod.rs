//! The priority-lock recipe's decisions as a sans-IO core: pure state machines that take
//! ZooKeeper's answers and events and return the requests to send, in the manner of
//! `quinn-proto` (or Curator's `LockInternalsDriver`). The async code of `zk::acquire` and
//! `zk::release` performs what they ask; the model check (`crates/zkguard/tests/lock_model.rs`) runs the very
//! same machines against a model of ZooKeeper and explores their interleavings.
//!
//! - [`Acquisition`]: queue (the fast path, a plain create, a create carried by the release of
//!   the lock before), find what a lost create made, wait for the node ahead or the mutex, take
//!   the mutex (verifying the order where the class needs it), give it back, promote a starving
//!   background waiter, give up at the deadline; whether to carry the release of the lock
//!   before, and when to wake while waiting ([`Acquisition::poll_timeout`]), from the time the
//!   driver passes in.
//! - [`SessionKnowledge`]: what a session's acquisitions learned about it (its ACL's refusals,
//!   the monitors busy lately), which the next ones decide with.
//! - [`Removal`]: the release multi, the careful deletes once it is not certain what is ours,
//!   and the session reaper's search for what an abandoned create made.
//! - [`TOKEN_BASE`]: the token space, shared by both lock backends and the write path.

mod acquire;
mod learned;
mod remove;
mod token;
mod types;

pub use acquire::{Acquisition, Awaits, Leftovers, Outcome, Previous, Spec};
pub use learned::{Lessons, SessionKnowledge};
pub use remove::{child, is_ours, release_ops, Removal};
pub use token::from_zxid;
pub use token::{is_token, TOKEN_BASE};
pub use types::{
    Action, Code, Content, Fired, Input, Mode, MultiError, Op, OpResult, Read, Reply, Request,
    Send, Stat, Target,
};

/// A deliberate flaw in the core, for the model check to prove that it finds one: each makes
/// it report a counterexample. Production never sets one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flaw {
    /// A node counts as ours by its session alone, without the attempt id: a removal after a
    /// lost answer may delete the same session's next acquisition's node, and a recovery may
    /// adopt another attempt's node.
    OwnershipWithoutAttempt,
    /// A take of the mutex that finds it existing counts as a take.
    MutexExistsIgnored,
    /// A waiter of any class woken by the hand-over mark takes the mutex without verifying
    /// the order (only the first class may).
    MarkTrustedByAnyClass,
    /// A release deletes the mutex without checking that nobody took it since (the monitor's
    /// data version).
    ReleaseUnchecked,
    /// A waiter of any class may be handed the lock by a holder of its session (only the
    /// first class may: another contender may have queued ahead since its listing).
    HandOverToAnyClass,
    /// A queue node created in a release's multi trusts the node two sequence numbers before
    /// it as the node just ahead without checking that it was created before the released
    /// lock's take (another contender's node may sit between them).
    GuessUnordered,
    /// A waiter's next wake-up ([`Acquisition::poll_timeout`]) ignores a starving background
    /// waiter's promotion: it sleeps until its deadline or its watch.
    WakeOnlyAtDeadline,
}
