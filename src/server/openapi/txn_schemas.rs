//! Schemas of the document transactions' routes (`/v1/transactions`).

use utoipa::ToSchema;

/// A document transaction to apply.
#[derive(ToSchema)]
#[schema(example = json!({
    "id": "type-switch-42",
    "type": "foreground",
    "operations": [
        {"action": "index", "index": "products", "id": "p1", "doc": {"name": "Lamp"}, "expect": {"exists": false}},
        {"action": "update", "index": "counters", "id": "lighting", "doc": {"products": 41}},
        {"action": "delete", "index": "drafts", "id": "p1"}
    ]
}))]
pub struct TxnBody {
    /// The transaction's id (else the `Idempotency-Key` header, else a new UUID). Sending it
    /// again with the same operations answers the stored decision.
    pub id: Option<String>,
    /// `foreground` (the default) or `background`: the class of every lock it takes.
    pub r#type: Option<String>,
    /// At most one per document, at most txn.max.operations of them.
    pub operations: Vec<TxnOperation>,
}

/// One operation, in the shape of a `/v1/bulk` line.
#[derive(ToSchema)]
pub struct TxnOperation {
    /// `index` (a whole source), `update` (a partial document, merged as Elasticsearch merges
    /// it) or `delete`.
    pub action: String,
    /// The document's index.
    pub index: String,
    /// The document's id.
    pub id: String,
    /// The source (`index`) or partial document (`update`); not with `delete`.
    #[schema(value_type = Option<std::collections::HashMap<String, serde_json::Value>>)]
    pub doc: Option<serde_json::Value>,
    /// `update` of a missing document creates it from `doc`.
    pub upsert: Option<bool>,
    /// The lock's monitor object (default: the document's own).
    pub monitor: Option<String>,
    /// `{"exists": true|false}` or `{"if_seq_no": N, "if_primary_term": M}`, checked under the
    /// lock.
    #[schema(value_type = Option<std::collections::HashMap<String, serde_json::Value>>)]
    pub expect: Option<serde_json::Value>,
}

/// A document of a transaction, and what became of it.
#[derive(ToSchema)]
pub struct TxnDocument {
    /// Index.
    pub index: String,
    /// Id.
    pub id: String,
    /// `index`, `update` or `delete`.
    pub action: String,
    /// `created`, `updated`, `deleted` or `not_found`, once committed.
    pub result: Option<String>,
    /// Its version after the transaction (its lock's fencing token), once committed.
    #[schema(rename = "_version")]
    pub version: Option<u64>,
}

/// The decision on a transaction.
#[derive(ToSchema)]
#[schema(example = json!({
    "transaction_id": "type-switch-42",
    "state": "rolled-back",
    "reason": "expectation failed on `products/p1`: expected the document does not exist, but it exists at _seq_no 3 and _primary_term 1",
    "failed": "products/p1",
    "documents": [{"index": "products", "id": "p1", "action": "index"}]
}))]
pub struct TxnOutcome {
    /// The id.
    pub transaction_id: String,
    /// `committed` or `rolled-back`.
    pub state: String,
    /// Why it was rolled back.
    pub reason: Option<String>,
    /// The document whose expectation failed or whose lock was not free (`index/id`).
    pub failed: Option<String>,
    /// The monitor whose lock was not free in time.
    pub blocked_by: Option<String>,
    /// Every document, in the order of the request.
    pub documents: Vec<TxnDocument>,
}

/// A logged transaction.
#[derive(ToSchema)]
pub struct TxnStatus {
    /// The id.
    pub transaction_id: String,
    /// `pending`, `committed`, `finished`, `rolling-back` or `rolled-back`.
    pub state: String,
    /// `committed` or `rolled-back` once decided, else null.
    pub decision: Option<String>,
    /// `foreground` or `background`.
    pub lock_type: String,
    /// Why it was rolled back.
    pub reason: Option<String>,
    /// The document whose expectation failed or whose lock was not free (`index/id`).
    pub failed: Option<String>,
    /// The monitor whose lock was not free in time.
    pub blocked_by: Option<String>,
    /// Its documents.
    pub documents: Vec<TxnDocument>,
    /// When it was logged (RFC 3339).
    pub created: String,
    /// When its state last changed (RFC 3339).
    pub modified: String,
}
