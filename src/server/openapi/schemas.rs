//! The JSON bodies of the API as schemas: what the handlers answer and accept, field by field.
//! The handlers build their answers with `serde_json`; the contract test (`tests/service/openapi.rs`)
//! and the fuzzer check that the answers conform to these.

use utoipa::ToSchema;

/// An error answer: a stable, machine-readable kind and a message that says what was wrong
/// and what to do.
#[derive(ToSchema)]
#[schema(example = json!({"error": "lock_timeout", "message": "the lock of `articles:42` was not acquired within 2000ms; retry later"}))]
pub struct Error {
    /// The kind (`bad_parameter`, `fenced`, `lock_timeout`, ...): each route lists its own.
    pub error: String,
    /// What was wrong and what to do.
    pub message: String,
}

/// A foreground write, applied.
#[derive(ToSchema)]
#[schema(example = json!({"operation_id": "5f0c2d6e-8a1b-4c3d-9e7f-0a1b2c3d4e5f", "token": 4503599627370517_u64, "result": "written", "version": 4503599627370517_u64}))]
pub struct Written {
    /// The operation's id: the `op_id` given, or one generated.
    pub operation_id: String,
    /// The fencing token of the write that applied the operation (the document's external
    /// version after it): this request's lock's, or, for `already_applied`, the earlier
    /// write's; for `already_applied` in a document that no longer tells which write applied
    /// it (later operations were written over it), this request's lock's.
    pub token: u64,
    /// `written`, `deleted`, `not_found` (a hard delete found nothing) or `already_applied`
    /// (a retry of an operation applied before: nothing was written again).
    pub result: WriteResult,
    /// The document's version after the write; null when nothing was written.
    pub version: Option<u64>,
}

/// What a foreground write did.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum WriteResult {
    /// The document was written.
    Written,
    /// The document was deleted.
    Deleted,
    /// A hard delete found no document.
    NotFound,
    /// The operation was applied before: nothing was written again.
    AlreadyApplied,
}

/// A background operation, journaled.
#[derive(ToSchema)]
#[schema(example = json!({"operation_id": "5f0c2d6e-8a1b-4c3d-9e7f-0a1b2c3d4e5f", "status": "queued"}))]
pub struct Accepted {
    /// The operation's id: the `op_id` given, or one generated.
    pub operation_id: String,
    /// `queued`, or the state of the operation already known under this id.
    pub status: OpStatus,
}

/// Where an operation stands.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum OpStatus {
    /// Accepted, not applied yet.
    Queued,
    /// Applied: its write is in the document.
    Applied,
    /// It can never be applied (a discarded dead letter, say).
    Rejected,
    /// Parked in the dead-letter sink (`GET /v1/deadletters`).
    Parked,
}

/// An operation's state.
#[derive(ToSchema)]
#[schema(example = json!({"operation_id": "5f0c2d6e-8a1b-4c3d-9e7f-0a1b2c3d4e5f", "status": "applied", "token": 4503599627370517_u64, "attempts": 1, "monitor": "articles:42", "index": "articles", "id": "42"}))]
pub struct Operation {
    /// The operation's id.
    pub operation_id: String,
    /// Where it stands.
    pub status: OpStatus,
    /// Why it was rejected or parked.
    pub reason: Option<String>,
    /// The fencing token of the write that applied it; absent for one found already applied
    /// (`already_applied`) in a document that no longer tells which write applied it.
    pub token: Option<u64>,
    /// `true` when the attempt that finished it found it already applied in its document (a
    /// write before a crash or takeover whose outcome was not recorded): nothing was written
    /// again. Absent otherwise.
    pub already_applied: Option<bool>,
    /// Attempts made.
    pub attempts: Option<u32>,
    /// The monitor whose lock guards it (background operations).
    pub monitor: Option<String>,
    /// The index it writes (background operations).
    pub index: Option<String>,
    /// The document it writes (background operations).
    pub id: Option<String>,
}

/// A bulk request, journaled.
#[derive(ToSchema)]
pub struct BulkAccepted {
    /// Operations in the request.
    pub count: usize,
    /// One per line, in order.
    pub operations: Vec<Accepted>,
}

/// An explicit lock held for the caller.
#[derive(ToSchema)]
#[schema(example = json!({"lock_id": "0b5c1a9e-7d2f-4e61-9c3a-8f4d2e6b1a70", "monitor": "articles:42", "token": 4503599627370517_u64, "lock_type": "foreground", "expires": 1795000000000_u64, "ttl_ms": 30000}))]
pub struct Lock {
    /// The lock's id in this service (keep-alive and release name it).
    pub lock_id: String,
    /// The monitor object.
    pub monitor: String,
    /// The fencing token: send it as the external version of every write made under the lock.
    pub token: u64,
    /// `foreground` or `background`.
    pub lock_type: LockTypeName,
    /// End of the lease, in milliseconds since the Unix epoch.
    pub expires: u64,
    /// The lease, in milliseconds: each keep-alive extends it by this much from now.
    pub ttl_ms: u64,
}

/// A lock's class: foreground locks go before background ones.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum LockTypeName {
    /// Someone waits for the answer.
    Foreground,
    /// Bulk and propagation work.
    Background,
}

/// A released explicit lock.
#[derive(ToSchema)]
pub struct Released {
    /// The lock's id.
    pub lock_id: String,
    /// The monitor object.
    pub monitor: String,
    /// The token it held.
    pub token: u64,
    /// Always `true` in a 200.
    pub released: bool,
}

/// An explicit lock an operator force-released.
#[derive(ToSchema)]
pub struct ForceReleased {
    /// The lock's id.
    pub lock_id: String,
    /// The monitor object.
    pub monitor: String,
    /// The token it held.
    pub token: u64,
    /// Always `true` in a 200.
    pub released: bool,
    /// Always `true`: an operator released it, not its holder.
    pub forced: bool,
    /// The reason given, if any.
    pub reason: Option<String>,
}

/// What clearing a monitor's stray mutex did.
#[derive(ToSchema)]
pub struct StrayCleared {
    /// The monitor object.
    pub monitor: String,
    /// `removed` (the stray `privateLock` is gone) or `no_mutex` (there was none: nothing to
    /// clear).
    #[schema(example = "removed")]
    pub outcome: String,
    /// The session that owned the removed node (`None`: it was persistent).
    pub session: Option<String>,
}

/// The holder and queue of one monitor (ZooKeeper backend; with `lock.backend=elasticsearch`
/// the lease documents, as `zkguard locks --json` prints them).
#[derive(ToSchema)]
pub struct MonitorState {
    /// The monitor object.
    pub monitor: String,
    /// The holder, when the mutex is held.
    pub holder: Option<Contender>,
    /// The holder's fencing token.
    pub token: Option<u64>,
    /// Everyone queued, in lock order (the holder included).
    pub queue: Vec<Contender>,
    /// A `privateLock` that is not zkguard's blocks the monitor (`zkguard locks --clear-stray`).
    pub stray: bool,
    /// The session owning a stray `privateLock`.
    pub stray_session: Option<String>,
}

/// One contender of a monitor.
#[derive(ToSchema)]
pub struct Contender {
    /// Queue-node name, e.g. `A-0000000012`.
    pub node: String,
    /// Class prefix (`A` foreground, `B` background).
    pub class: String,
    /// Sequence number.
    pub sequence: u64,
    /// Owner id (`host:pid:random`).
    pub owner: Option<String>,
    /// Lock info.
    pub info: Option<String>,
    /// Lock type.
    pub lock_type: Option<String>,
    /// Milliseconds since the node was created.
    pub age_ms: u64,
    /// The ZooKeeper session that owns the node.
    pub session: String,
    /// Whether this contender holds the mutex.
    pub holder: bool,
}

/// A parked operation, as `zkguard dlq list --json` prints it.
#[derive(ToSchema)]
pub struct DeadLetter {
    /// The operation's id (the entry's id).
    pub id: String,
    /// The monitor object.
    pub monitor: String,
    /// Attempts made (failed replays included).
    pub attempts: u32,
    /// `retries_exhausted` or `not_retryable`.
    pub reason: String,
    /// Short class of the last error (`lock_timeout`, `fenced`, ...).
    pub error_kind: String,
    /// The last error's message.
    pub last_error: String,
    /// When the first attempt started (RFC 3339).
    pub first_attempt: String,
    /// When the last attempt ended (RFC 3339).
    pub last_attempt: String,
    /// When it was first parked (RFC 3339).
    pub parked_at: String,
    /// The host that parked it.
    pub host: String,
    /// The operation, complete, for replay.
    #[schema(value_type = std::collections::HashMap<String, serde_json::Value>)]
    pub operation: serde_json::Value,
}

/// What to replay: one entry or all.
#[derive(ToSchema)]
#[schema(example = json!({"id": "5f0c2d6e-8a1b-4c3d-9e7f-0a1b2c3d4e5f"}))]
pub struct ReplayRequest {
    /// The entry to replay: its id, or the caller's idempotency key that named the operation.
    pub id: Option<String>,
    /// `true`: every entry.
    pub all: Option<bool>,
}

/// A replay's outcome, as `zkguard dlq replay --json` prints it.
#[derive(ToSchema)]
pub struct ReplayReport {
    /// Entries replayed.
    pub replayed: usize,
    /// Applied by this replay.
    pub applied: usize,
    /// Found in their documents already.
    pub already_applied: usize,
    /// Still parked.
    pub still_parked: usize,
    /// In their documents, but their entries could not be removed.
    pub not_removed: usize,
    /// Not applied: their documents have writes accepted after them.
    pub superseded: usize,
    /// One per entry, one document's in the order they were accepted.
    pub results: Vec<ReplayResult>,
}

/// One replayed entry.
#[derive(ToSchema)]
pub struct ReplayResult {
    /// The entry's id.
    pub id: String,
    /// The operation, in a few words.
    pub summary: String,
    /// `applied`, `already_applied`, `still_parked`, `not_removed` or `superseded`.
    pub result: String,
    /// Attempts of this replay.
    pub attempts: u32,
    /// The replay's fencing token, when the operation is in its document.
    pub token: Option<u64>,
    /// Why it is not, or why its entry stays.
    pub error: Option<String>,
    /// For a replay of one entry: on each older entry of its document, replayed before it,
    /// the id asked for.
    pub replayed_before: Option<String>,
}

/// A discarded entry.
#[derive(ToSchema)]
pub struct Discarded {
    /// The entry's id.
    pub id: String,
    /// The operation, in a few words.
    pub summary: String,
    /// The reason given.
    pub reason: String,
    /// The whole entry, as `GET /v1/deadletters` showed it.
    pub entry: DeadLetter,
}

/// A two-phase-commit transfer to run.
#[derive(ToSchema)]
#[schema(example = json!({"from": "alice", "to": "bob", "amount": 100, "id": "order-42"}))]
pub struct TransferRequest {
    /// The source account.
    pub from: String,
    /// The destination account.
    pub to: String,
    /// Units moved (more than 0).
    pub amount: i64,
    /// The transaction's id; sending it again resumes or reports it. Generated when absent.
    pub id: Option<String>,
}

/// A transaction, as `zkguard txn show --json` prints it.
#[derive(ToSchema)]
pub struct Transaction {
    /// Its id.
    pub id: String,
    /// Units moved.
    pub amount: i64,
    /// Source account.
    pub src_acct: String,
    /// Destination account.
    pub dest_acct: String,
    /// `created`, `pending`, `committed`, `finished`, `terminating` or `rolled-back`.
    pub transaction_state: String,
    /// When it was created (RFC 3339).
    pub creation_time: String,
    /// When its state last changed (RFC 3339).
    pub modification_time: String,
    /// Why it was rolled back.
    pub reason: Option<String>,
}

/// A transfer that conflicts: rolled back (with the transaction), or an id taken by another.
#[derive(ToSchema)]
pub struct RolledBack {
    /// `rolled_back`.
    pub error: String,
    /// Why.
    pub message: String,
    /// The transaction as it ended (`rolled_back` only).
    pub transaction: Option<Transaction>,
}

/// The answer of `/healthz` and `/readyz`.
#[derive(ToSchema)]
pub struct Status {
    /// `alive` (`/healthz`) or `ready` (`/readyz`).
    pub status: String,
}
