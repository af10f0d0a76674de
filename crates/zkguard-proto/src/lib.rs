//! # zkguard-proto
//!
//! The sans-IO core of zkguard's ZooKeeper priority lock: the recipe's decisions as pure state
//! machines, the queue-node names and their order, and the fencing-token space. No I/O, no clock,
//! no async runtime and no ZooKeeper client: the caller performs the requests the machines ask
//! for and feeds back the answers and events, in the manner of `quinn-proto`.
//!
//! - [`protocol`]: [`protocol::Acquisition`] (queue, wait, take the mutex, give up) and
//!   [`protocol::Removal`] (the release multi, careful deletes, the reaper's search);
//! - [`names`]: `A-`/`B-` queue nodes, their order, the mutex node's name;
//! - [`TOKEN_BASE`] and [`is_token`]: the token space both lock backends and the write path share.
//!
//! The `zkguard` library runs these machines against ZooKeeper (`zkguard::zk`, which re-exports
//! this crate as `zkguard::zk::protocol` and `zkguard::zk::TOKEN_BASE`); its model check
//! (`crates/zkguard/tests/lock_model.rs`) runs the very same machines against a model of
//! ZooKeeper and explores their interleavings. `docs/zookeeper-lock.md` describes the recipe.
#![deny(missing_docs)]

pub mod names;
pub mod protocol;

pub use protocol::{is_token, TOKEN_BASE};

/// The library's path of the queue names (`crate::zk::names`), which the core's files name: they
/// were written inside the library's `zk` module and keep its paths.
mod zk {
    pub(crate) use crate::names;
}
