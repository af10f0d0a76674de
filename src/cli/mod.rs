//! The subcommands, one module each, and the setup they share; the exit-status contract lives in
//! `crate::exit` (shared with the server) and is re-exported here.

#[cfg(feature = "workload")]
pub mod bench;
pub mod config;
#[cfg(feature = "workload")]
pub mod demo;
pub mod dlq;
pub mod exec;
pub mod locks;
pub mod man;
pub mod meta;
pub mod reference;
mod setup;
pub mod txn;
pub mod txn_docs;
pub mod usage;

pub use crate::exit::{
    print_error_json, CliError, EX_CONFIG, EX_DATAERR, EX_SOFTWARE, EX_TEMPFAIL, EX_UNAVAILABLE,
    EX_USAGE,
};
pub use setup::{init_tracing, lock_service, lock_service_by};
