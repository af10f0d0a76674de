//! The subcommands, one module each, the exit-status contract and the setup they share.

pub mod bench;
pub mod config;
pub mod demo;
pub mod dlq;
pub mod exec;
pub mod locks;
pub mod man;
pub mod meta;
pub mod reference;
mod setup;
mod status;
pub mod txn;
pub mod txn_docs;

pub use setup::{init_tracing, lock_service};
pub use status::{
    print_error_json, CliError, EX_CONFIG, EX_DATAERR, EX_SOFTWARE, EX_TEMPFAIL, EX_UNAVAILABLE,
    EX_USAGE,
};
