//! # zkguard
//!
//! Priority locks that coordinate writes to Elasticsearch.
//!
//! Elasticsearch has no locks and no multi-document transactions. Teams that have both
//! *foreground* writers (a person waiting on "Save Content") and *background* writers (bulk
//! propagation, searchable updates, KPI jobs) on the same objects need: at most one writer per
//! object at a time, foreground before background, background work that is retried and finally
//! parked in a dead-letter sink instead of lost, and a guarantee that a writer that lost its lock
//! cannot overwrite newer data. zkguard provides:
//!
//! - [`ZkBlockingWriteLock`]: the ZooKeeper priority lock (`A-`/`B-` queue nodes, a `privateLock`
//!   mutex node, fencing tokens, loss detection), in [`zk`];
//! - [`config::Settings`]: properties-file configuration with environment overrides;
//! - [`write`](mod@write): guarded, fenced Elasticsearch writes, background retries and dead letters, over
//!   the document-store layer [`es`];
//! - [`eslock`]: an Elasticsearch-native lease lock behind the same [`LockService`] trait
//!   ([`lock`]);
//! - [`txn`]: multi-document transactions (document transactions, formerly `txn::multi`);
//! - [`transfer`]: the account-transfer recipe, a two-phase commit between account documents
//!   (its items are also at their former paths, `zkguard::txn::Coordinator` and so on).
//!
//! The lock's sans-IO core is the `zkguard-proto` crate, re-exported as [`zk::protocol`],
//! [`zk::names`] and [`zk::TOKEN_BASE`]. With the `testkit` feature, `zkguard::testkit` (the
//! `zkguard-testkit` crate) starts local ZooKeeper and `osmem-server` processes for tests.
//! `docs/architecture.md` shows how the crates and modules fit together.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use zkguard::{config::Settings, LockType, ZkBlockingWriteLock, ZkSession};
//!
//! let settings = Settings::load(Some("conf/zkguard.properties".as_ref()))?;
//! let zk = ZkSession::connect(&settings.zookeeper).await?;
//! let guard = ZkBlockingWriteLock::new("Save Content", &zk, "article-42")?
//!     .with_type(LockType::Foreground)
//!     .lock_with_timeout()
//!     .await?;
//! // ... write article-42, passing guard.fencing_token() as the external version ...
//! guard.unlock().await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod backoff;
pub mod config;
pub mod es;
pub mod eslock;
pub mod lock;
/// Local ZooKeeper, osmem-server and tansu processes for tests, benchmarks and the demo: the
/// zkguard-testkit crate, with the `testkit` feature.
#[cfg(feature = "testkit")]
pub use zkguard_testkit as testkit;
pub mod transfer;
pub mod txn;
pub mod write;
pub mod zk;

#[doc(hidden)] // for the zkguard binary (the demo's retry budget)
pub use backoff::Backoff;
pub use lock::{
    Blocker, Guard, LockError, LockRequest, LockService, LockType, LossReason, Release,
};
pub use zk::{LockGuard, ZkBlockingWriteLock, ZkLockService, ZkSession};
