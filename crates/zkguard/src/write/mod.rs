//! The write path: what a guarded write is, how it is applied, retried and, when it cannot be
//! applied, parked.
//!
//! - [`ops`]: an [`Operation`](ops::Operation) is a write as plain data (index, update or delete
//!   of one document, the monitor object to lock, the lock type), so it can be retried, parked
//!   and replayed by another process exactly as it was submitted;
//! - [`guarded`]: the [`GuardedWriter`](guarded::GuardedWriter) takes the lock of an operation's
//!   monitor through any [`LockService`](crate::LockService), writes with the guard's fencing token
//!   as the document's external version and releases the lock;
//! - [`background`]: the [`BackgroundExecutor`](background::BackgroundExecutor) runs operations
//!   as background work, with retries and backoff, and ends each in exactly one
//!   [`Outcome`](background::Outcome);
//! - [`deadletter`]: the [`DeadLetterSink`](deadletter::DeadLetterSink)s (a JSON-lines file,
//!   an Elasticsearch index) that keep what could not be applied, and
//!   [`replay`](deadletter::replay);
//! - [`marks`]: what a writer does with a document transaction's mark found under its lock;
//! - [`stamping`]: the `zkguard` object written documents carry, its size, and the indices
//!   that opt out of it; the object's mapping (`stamp_mapping`) is put before the first
//!   stamped write to an index.
//!
//! `docs/architecture.md` shows how a guarded write flows through these and the lock and
//! document-store layers; `docs/fencing.md` explains the fencing.

pub mod background;
mod batch;
pub mod deadletter;
pub mod fence;
pub mod guarded;
pub mod marks;
pub mod ops;
pub(crate) mod stamp_mapping;
pub mod stamping;
