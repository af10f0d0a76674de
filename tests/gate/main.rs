//! The Elasticsearch-compatible gate of `zkguard serve` with official and generated clients,
//! and transactions through it. One test binary: see docs/testing.md.

#[path = "../support/cli.rs"]
mod cli;
#[path = "../support/common/mod.rs"]
mod common;
#[path = "../support/gateway/mod.rs"]
mod gateway_support;
#[allow(dead_code)] // gateway.rs only holds an answer; the lock and history binaries cut too
#[path = "../support/common/proxy.rs"]
mod proxy;
#[path = "../support/common/queue.rs"]
mod queue;
#[allow(dead_code)] // the gate's tests stop no service; the service binary uses all of it
#[path = "../support/serve/mod.rs"]
mod serve_support;

// The tests, one module per concern.
mod clients;
mod gateway;
mod serve_txn;
