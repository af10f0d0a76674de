//! The document-store layer: one small trait over Elasticsearch, shared by guarded writes, the
//! dead-letter index, the Elasticsearch lease lock and multi-document transactions.
//!
//! [`EsStore`] implements it with the official `elasticsearch` crate. Every call is a plain
//! document API call (no painless scripts, no ingest pipelines), so it runs on Elasticsearch,
//! OpenSearch and compatible servers alike.
//!
//! With the `testkit` feature, `HookedStore` wraps any store to run a `StoreHook` around its
//! calls (counting, fault injection, staged races in tests) and `IndexGate` is a ready hook that
//! holds back `index` calls.

use async_trait::async_trait;
use serde_json::Value;

mod answer;
mod client;
#[cfg(feature = "testkit")]
mod hook;
mod merge;
mod params;
pub use client::{error_chain, EsStore};
#[cfg(feature = "testkit")]
pub use hook::{HookedStore, IndexGate, StoreCall, StoreHook};
pub use merge::merge_partial;
pub(crate) use params::condition_fields;

/// The body [`DocStore::ensure_index`] creates one of zkguard's own indices with (the lease
/// lock's, the dead letters', the transactions' accounts and log, the document transactions'
/// log): `mappings` and `auto_expand_replicas: 0-1`, so that the index has a replica wherever a
/// second data node can hold one and none on a single node, which would otherwise stay yellow
/// with an unassigned replica. `number_of_replicas: 0` is the count the index starts with;
/// Elasticsearch raises it to 1 as soon as a second data node is there.
pub(crate) fn own_index_body(mappings: Value) -> Value {
    serde_json::json!({
        "settings": {"index": {"number_of_replicas": 0, "auto_expand_replicas": "0-1"}},
        "mappings": mappings,
    })
}

/// Errors of the document-store layer. Each HTTP failure class maps to its own variant.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum EsError {
    /// 409: a version conflict (a conditional write lost, `op_type=create` found a document, or an
    /// external version was not newer).
    #[error("version conflict on {index}/{id}: {reason}")]
    Conflict {
        /// Index.
        index: String,
        /// Document id.
        id: String,
        /// Server's reason.
        reason: String,
    },
    /// 404: the index or document does not exist.
    #[error("not found: {what}")]
    NotFound {
        /// What was missing.
        what: String,
    },
    /// 429: the cluster is overloaded; retry later.
    #[error("Elasticsearch is overloaded (429): {reason}; retry later")]
    TooManyRequests {
        /// Server's reason.
        reason: String,
    },
    /// 5xx: a server-side failure.
    #[error("Elasticsearch server error {status}: {reason}")]
    Server {
        /// HTTP status.
        status: u16,
        /// Server's reason.
        reason: String,
    },
    /// Another 4xx: the request was wrong (mapping, bad id, ...). `status` is 0 when zkguard
    /// refused to send the request at all (for example a delete with [`WriteCondition::Create`]).
    #[error("Elasticsearch rejected the request ({status}): {reason}")]
    BadRequest {
        /// HTTP status.
        status: u16,
        /// Server's reason.
        reason: String,
    },
    /// The server could not be reached or did not answer in time.
    #[error("cannot reach Elasticsearch at {url}: {reason}; {}", transport_advice(.reason))]
    Transport {
        /// URL(s) tried.
        url: String,
        /// Underlying error.
        reason: String,
    },
    /// The answer could not be understood.
    #[error("unexpected answer from Elasticsearch: {0}")]
    Protocol(String),
}

impl EsError {
    /// Whether a retry later may succeed (429, 5xx, transport errors).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::TooManyRequests { .. } | Self::Server { .. } | Self::Transport { .. }
        )
    }
}

/// The advice that fits a transport failure: the TLS settings when the TLS layer failed.
fn transport_advice(reason: &str) -> &'static str {
    let lower = reason.to_ascii_lowercase();
    if lower.contains("certificate") || lower.contains("tls") || lower.contains("handshake") {
        "check elasticsearch.tls.ca (the CA that signs the server's certificate), and elasticsearch.tls.cert/key when the server requires a client certificate"
    } else {
        "check elasticsearch.url and that the server runs"
    }
}

/// Concurrency metadata of a stored document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DocMeta {
    /// `_seq_no`.
    pub seq_no: i64,
    /// `_primary_term`.
    pub primary_term: i64,
    /// `_version`.
    pub version: i64,
}

/// A document read by id or found by a search.
#[derive(Debug, Clone, PartialEq)]
pub struct Doc {
    /// `_id`.
    pub id: String,
    /// `_source`.
    pub source: Value,
    /// Concurrency metadata (`seq_no`/`primary_term` may be -1 in search hits if not requested).
    pub meta: DocMeta,
}

/// The precondition of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteCondition {
    /// Unconditional.
    Always,
    /// `op_type=create`: fails with [`EsError::Conflict`] if the document exists.
    Create,
    /// `if_seq_no` + `if_primary_term`: fails with [`EsError::Conflict`] if the document changed.
    IfMatch {
        /// Expected `_seq_no`.
        seq_no: i64,
        /// Expected `_primary_term`.
        primary_term: i64,
    },
    /// `version=N&version_type=external_gte`: fails with [`EsError::Conflict`] if the stored
    /// version is greater than N. This is how fencing tokens are enforced.
    ExternalGte(u64),
    /// `version=N&version_type=external`: fails if the stored version is not smaller than N.
    External(u64),
}

/// When written documents become visible to searches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Refresh {
    /// Default: visible after the next refresh (GET by id is realtime anyway).
    #[default]
    No,
    /// `refresh=true`.
    Now,
    /// `refresh=wait_for`.
    WaitFor,
}

/// One action of a `_bulk` request.
#[derive(Debug, Clone, PartialEq)]
pub enum BulkAction {
    /// Index (create or replace) a document.
    Index {
        /// Index.
        index: String,
        /// Id.
        id: String,
        /// Source.
        source: Value,
        /// Precondition.
        condition: WriteCondition,
    },
    /// Delete a document.
    Delete {
        /// Index.
        index: String,
        /// Id.
        id: String,
        /// Precondition.
        condition: WriteCondition,
    },
}

/// A store of JSON documents: the part of Elasticsearch zkguard uses.
///
/// # Cancellation safety
/// Dropping the future of a call before it completes leaves the request's effect unknown: the
/// server may have applied it or not (an HTTP request cannot be recalled). Writes that must not be
/// applied twice therefore carry a [`WriteCondition`]: repeating a [`WriteCondition::Create`] or
/// [`WriteCondition::IfMatch`] write after a cancellation reports [`EsError::Conflict`] if the first
/// attempt landed, and repeating a [`WriteCondition::ExternalGte`] write with the same token
/// rewrites the same document at the same version.
#[async_trait]
pub trait DocStore: Send + Sync + 'static {
    /// Realtime GET by id; `None` when the document (or the index) does not exist.
    ///
    /// # Errors
    /// [`EsError`] for transport and server failures.
    async fn get(&self, index: &str, id: &str) -> Result<Option<Doc>, EsError>;

    /// Realtime GET of several documents, `(index, id)` each, in one request (`_mget`): one
    /// result per document, in order, `None` for a document (or index) that does not exist.
    /// The default makes one [`DocStore::get`] per document.
    ///
    /// # Errors
    /// [`EsError`] when the request as a whole failed; a document's own failure is its item's.
    async fn mget(
        &self,
        docs: &[(String, String)],
    ) -> Result<Vec<Result<Option<Doc>, EsError>>, EsError> {
        Ok(futures::future::join_all(docs.iter().map(|(index, id)| self.get(index, id))).await)
    }

    /// Indexes (creates or replaces) a whole document under a precondition.
    ///
    /// # Errors
    /// [`EsError::Conflict`] when the precondition fails; others as named.
    async fn index(
        &self,
        index: &str,
        id: &str,
        source: &Value,
        condition: WriteCondition,
        refresh: Refresh,
    ) -> Result<DocMeta, EsError>;

    /// Deletes a document under a precondition; `Ok(None)` when it did not exist.
    ///
    /// # Errors
    /// [`EsError::Conflict`] when the precondition fails; others as named.
    async fn delete(
        &self,
        index: &str,
        id: &str,
        condition: WriteCondition,
        refresh: Refresh,
    ) -> Result<Option<DocMeta>, EsError>;

    /// `_search` with a full request body (`query`, `sort`, `size`, ...); hits carry
    /// `seq_no`/`primary_term`. A missing index gives an empty result.
    ///
    /// # Errors
    /// [`EsError`] for transport and server failures.
    async fn search(&self, index: &str, body: &Value) -> Result<Vec<Doc>, EsError>;

    /// `_bulk`: one result per action, in order, so a 200 answer with failed items is handled
    /// item by item.
    ///
    /// # Errors
    /// [`EsError`] only when the request as a whole failed.
    async fn bulk(
        &self,
        actions: &[BulkAction],
        refresh: Refresh,
    ) -> Result<Vec<Result<DocMeta, EsError>>, EsError>;

    /// Creates an index with explicit mappings unless it exists.
    ///
    /// # Errors
    /// [`EsError`] for transport and server failures.
    async fn ensure_index(&self, index: &str, mappings: &Value) -> Result<(), EsError>;

    /// Adds `properties` to the mappings of an existing index (`PUT {index}/_mapping`);
    /// `Ok(false)` when the index does not exist. Putting a mapping the index has already is a
    /// success; one it has in another form is an error.
    ///
    /// # Errors
    /// [`EsError`] for transport and server failures, and for a mapping Elasticsearch refuses
    /// (a field mapped otherwise already).
    async fn put_mapping(&self, index: &str, properties: &Value) -> Result<bool, EsError>;

    /// Makes recent writes visible to search.
    ///
    /// # Errors
    /// [`EsError`] for transport and server failures.
    async fn refresh(&self, index: &str) -> Result<(), EsError>;
}
