//! The workloads the `zkguard` binary runs on top of the library: the demo behind `zkguard demo`
//! and the lock benchmark behind `zkguard bench`. They use the library's public API only (and
//! the test kit, to start local servers), like any other program built on zkguard.

pub mod bench;
mod chain;
pub mod demo;
pub mod gateway_bench;
pub(crate) mod measure;
pub mod scale_bench;
pub mod scale_report;
pub mod service_bench;
pub mod stages;
pub mod txn_bench;
