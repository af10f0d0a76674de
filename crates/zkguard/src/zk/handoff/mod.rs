//! The hand-off: a held lock passed to the next acquisition without a round trip of its own.
//!
//! - `carried.rs`: operations that ride in a release's multi, and what became of them;
//! - `handover.rs`: a held lock released in the next acquisition's first multi
//!   (`release_and_acquire`);
//! - `successor.rs`: hand-over within a session: waiters at a hand-over point, claimed by the
//!   holder's release, whose multi carries their take.

pub(super) mod carried;
pub(super) mod handover;
pub(super) mod successor;
