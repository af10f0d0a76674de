//! The Elasticsearch-compatible gate of `zkguard serve` with official and generated clients,
//! and transactions through it. One test binary: see docs/testing.md.

#[path = "../support/cli.rs"]
mod cli;
#[path = "../support/common/mod.rs"]
mod common;
#[path = "../support/gateway/mod.rs"]
mod gateway_support;
#[path = "../support/common/queue.rs"]
mod queue;
#[path = "../support/serve/mod.rs"]
mod serve_support;

// The tests, one module per concern.
mod clients;
mod gateway;
mod serve_txn;
