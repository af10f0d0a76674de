//! The workloads the `zkguard` binary runs on top of the library: the demo behind `zkguard demo`
//! and the lock benchmark behind `zkguard bench`. They use the library's public API only (and
//! the test kit, to start local servers), like any other program built on zkguard.

pub mod bench;
mod chain;
// The demo is a crate of its own (crates/zkguard-demo), so that its tests use it as a library.
pub use zkguard_demo as demo;
pub mod gateway_bench;
pub(crate) mod measure;
pub mod scale_bench;
pub mod scale_report;
pub mod service_bench;
pub mod stages;
pub mod txn_bench;
