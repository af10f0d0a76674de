//! The Elasticsearch lease lock: zkguard's lock service for deployments without ZooKeeper.
//!
//! [`EsLockService`] implements [`LockService`](crate::LockService) with documents in one index
//! (`elasticsearch.lock.index`, default `zkguard-locks`). `docs/eslock.md` describes the protocol
//! in full; in short:
//!
//! - **One lock document per monitor** (`_id` = monitor): `state` (`held`/`free`), `owner`,
//!   `info`, `lock_type`, `token`, `acquired`, `expires`, `renewed`. It is never deleted: release
//!   marks it free, so its versions and tokens only grow.
//! - **Acquire**: `op_type=create` when there is no document; otherwise, when it is free or
//!   expired, a takeover conditioned on `if_seq_no`/`if_primary_term`, so that of many racing
//!   contenders exactly one wins. A held, unexpired lock is polled with backoff and jitter until
//!   the lock type's timeout (`zookeeper.foreground.task.timeout` /
//!   `zookeeper.background.task.timeout`, shared with the ZooKeeper backend).
//! - **Clocks**: a contender counts a lease as expired only when its own clock is past
//!   `expires + clock_skew`; the holder counts on it only until `ttl - clock_skew` after it sent
//!   the write that granted or renewed it. As long as clocks differ by at most
//!   `elasticsearch.lock.clock.skew`, the holder has stopped before anyone can take over.
//! - **Keep-alive**: every guard renews its lease (conditional write) three times per validity
//!   period; if the holder's deadline passes without a confirmed renewal, or a renewal finds
//!   another owner, the guard's loss signal fires
//!   ([`LossReason::LeaseExpired`](crate::LossReason::LeaseExpired),
//!   [`LossReason::TakenOver`](crate::LossReason::TakenOver)).
//! - **Fencing token**: every acquisition writes `token = max(previous + 1, 2^52 + now in µs)` with the
//!   same conditional write that grants the lock, so tokens strictly increase per monitor and
//!   exceed any internal `_version` a data document can reach.
//! - **Priority**: foreground waiters register in a `<monitor>/waiters` document with a short,
//!   refreshed expiry; a background contender neither takes a free or expired lock while a live
//!   registration exists, nor keeps one it took if a registration turns up right after its
//!   takeover.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use zkguard::{config::Settings, es::EsStore, eslock::EsLockService, Guard, LockRequest};
//!
//! let settings = Settings::load(None)?;
//! let store = Arc::new(EsStore::new(&settings.elasticsearch)?);
//! let locks = EsLockService::from_settings(&settings, store)?;
//! let guard = locks.lock(LockRequest::new("article-42", "Save Content")).await?;
//! // ... write article-42 with guard.fencing_token() as its external version ...
//! guard.must_release().await?;
//! # Ok(()) }
//! ```

mod acquire;
mod guard;
mod record;
mod service;
mod state;
mod waiters;

pub use guard::EsLockGuard;
pub use record::{EsLockStatus, LockRecord, LockState, WaiterRecord};
pub use service::{EsLockService, EsLockServiceBuilder, MAX_OWNER_LEN};
