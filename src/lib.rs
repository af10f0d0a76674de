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
//!   mutex node, fencing tokens, loss detection);
//! - [`config::Settings`]: properties-file configuration with environment overrides;
//! - guarded, fenced Elasticsearch writes, background retries and dead letters;
//! - an Elasticsearch-native lease lock behind the same [`LockService`] trait;
//! - two-phase-commit multi-document transactions.
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

pub mod background;
pub mod backoff;
pub mod bench;
pub mod config;
pub mod deadletter;
pub mod deadletter_kafka;
pub mod demo;
pub mod es;
pub mod eslock;
pub mod guarded;
pub mod lock;
pub mod ops;
pub mod servers;
pub mod txn;
pub mod zk;

pub use backoff::Backoff;
pub use lock::{Guard, LockError, LockRequest, LockService, LockType, LossReason};
pub use zk::{LockGuard, ZkBlockingWriteLock, ZkLockService, ZkSession};
