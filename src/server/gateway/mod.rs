//! The Elasticsearch-compatible write gate of `zkguard serve` (`server.gateway.listen`).
//!
//! Applications point their Elasticsearch or OpenSearch client at the gate instead of the
//! cluster. On guarded indices (`server.gateway.indices`) every document write (index, create,
//! update with a partial document, delete, and each item of a `_bulk`) is made under the lock
//! of its document (`{index}:{id}`, or the `X-Zkguard-Monitor` header) and carries the lock's
//! fencing token as its external version (`version=<token>&version_type=external_gte`).
//! Writes that cannot carry a token (scripts, writes by query, client-supplied versions) are
//! refused with an Elasticsearch-shaped error; everything else passes through to the cluster
//! unchanged. A `_bulk` with `X-Zkguard-Atomic: true` is applied as one document transaction,
//! all or nothing. `docs/gateway.md` describes the routes and the trust model.

mod atomic;
mod backend;
mod body;
mod bulk;
mod bulk_parse;
mod current;
mod dot_id;
mod gate;
mod handler;
mod merge;
mod meta;
mod own;
mod params;
mod reply;
mod route;
mod single;

pub use gate::Gateway;
pub use handler::router;
