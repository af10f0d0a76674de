//! What zkguard keeps in the documents it writes: the [`Stamp`](super::ops::Stamp) (the
//! `zkguard` object), how many operation ids it remembers, and the indices whose documents get
//! none.
//!
//! The stamp is what recognises a retried or replayed operation as applied (its id is in the
//! document) and tells a fence by a newer zkguard holder from a version set outside zkguard.
//! An index listed in [`IndexPatterns`] opts out: its documents are still written under the
//! lock with the token as their version (fenced), but they carry no `zkguard` object, so a
//! retry or a replay of an operation that was applied already is applied again (the service
//! still recognises the ids its journal remembers), tombstone deletes are refused, and a fence
//! can only tell a zkguard token (at least 2^52) from a smaller outside version.

pub use crate::config::IndexPatterns;
