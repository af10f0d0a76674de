//! The lock against real servers: the ZooKeeper priority lock (scenarios, faults, sessions,
//! ensembles, authentication) and the Elasticsearch lock backend. One test binary: see
//! docs/testing.md.

#[path = "../support/common/certs.rs"]
mod certs;
#[path = "../support/cli.rs"]
mod cli;
#[path = "../support/common/mod.rs"]
mod common;
#[path = "../support/common/logs.rs"]
mod logs;
#[path = "../support/common/queue.rs"]
mod queue;

// The tests, one module per concern.
mod eslock;
mod servers;
mod zk_auth;
mod zk_connection_state;
mod zk_ensemble;
mod zk_lock;
mod zk_lock_faults;
mod zk_session_confirm;
