//! Writes against real servers: guarded (fenced) writes, background work and dead letters, the
//! Elasticsearch store and its authentication, and transactions. One test binary: see
//! docs/testing.md.

#[path = "../support/common/certs.rs"]
mod certs;
#[path = "../support/cli.rs"]
mod cli;
#[path = "../support/guarded/mod.rs"]
mod guarded_support;
#[path = "../support/local_demo.rs"]
mod local_demo;
#[path = "../support/txn_docs/mod.rs"]
mod txn_docs_support;
#[path = "../support/txn/mod.rs"]
mod txn_support;
#[path = "../support/common/wait.rs"]
mod wait;

// The tests, one module per concern.
mod background;
mod batch_lock_loss;
mod dlq_cli;
mod dlq_kafka;
#[cfg(feature = "docker")]
mod docker_guarded;
mod es_auth;
mod es_store;
mod fencing_existing_docs;
mod guarded;
mod txn;
mod txn_cli;
mod txn_docs;
mod txn_lock;
