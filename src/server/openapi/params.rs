//! The path and query parameters of the API, for the document. The handlers parse their
//! queries themselves (to name an unknown or repeated parameter in the refusal); these say
//! what they take.

use utoipa::IntoParams;

/// A document: its index and id.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct DocPath {
    /// The index (lowercase, 1 to 255 bytes, as Elasticsearch names indices).
    #[param(example = "articles")]
    pub index: String,
    /// The document's id (1 to 512 bytes; not `.` or `..`).
    #[param(example = "42")]
    pub id: String,
}

/// The parameters of every document write.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WriteQuery {
    /// The monitor whose lock guards the write; default `{index}:{id}` (escaped where the id
    /// holds what a ZooKeeper node name cannot).
    pub monitor: Option<String>,
    /// `foreground` (answered when done) or `background` (answered 202 when journaled).
    #[param(rename = "type", inline)]
    pub lock_type: Option<super::LockTypeName>,
    /// The foreground lock wait (`500ms`, `2s`, or milliseconds); at most
    /// `server.request.timeout`. Default `zookeeper.foreground.task.timeout`.
    #[param(example = "2s")]
    pub timeout: Option<String>,
    /// The operation's idempotency key: any printable text of 1 to 200 bytes (a UUID, a request
    /// id, `order-42-save-3`); a retry with the same key is applied once, the same key for
    /// another write is a 409. A UUID is generated when absent. Or send it as `Idempotency-Key`.
    #[param(min_length = 1, max_length = 200, example = "order-42-save-3")]
    pub op_id: Option<String>,
    /// Write at once under this explicit lock of yours (`POST /v1/locks`), with its token.
    #[param(format = Uuid)]
    pub lock_id: Option<String>,
}

/// The idempotency key as a header.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IdempotencyHeader {
    /// The operation's idempotency key, as `op_id` takes it (both given, they must agree). On
    /// `POST /v1/bulk`, the request's: a line without `op_id` is named `{key}#{line}`.
    #[param(rename = "Idempotency-Key", value_type = String, required = false, min_length = 1, max_length = 200, example = "order-42-save-3")]
    pub key: Option<String>,
}

/// What `PATCH` takes beside the common parameters.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PatchQuery {
    /// `true`: a missing document is created from the patch; `false` (default): 404.
    pub upsert: Option<bool>,
}

/// What `DELETE` takes beside the common parameters.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// `hard` (default: a delete carrying the token) or `tombstone` (a document that keeps
    /// fencing stale writers).
    #[param(inline)]
    pub mode: Option<DeleteModeName>,
}

/// How a document is deleted.
#[derive(utoipa::ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum DeleteModeName {
    /// A delete carrying the token.
    Hard,
    /// A tombstone document.
    Tombstone,
}

/// An operation's id.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct OperationPath {
    /// The operation's id or idempotency key (`operation_id` of the write's answer).
    #[param(min_length = 1, max_length = 200)]
    pub id: String,
}

/// A blocking read.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WaitQuery {
    /// Wait up to this long (`10s`, `500ms`, or milliseconds; a little less than
    /// `server.request.timeout` at most) for a change instead of answering at once.
    #[param(example = "10s")]
    pub wait: Option<String>,
}

/// A monitor.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct MonitorPath {
    /// The monitor object (a ZooKeeper node name: no `/`, at most 200 bytes).
    #[param(example = "articles:42")]
    pub monitor: String,
}

/// An explicit lock.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct LockPath {
    /// The monitor object.
    #[param(example = "articles:42")]
    pub monitor: String,
    /// The lock's id, as taking it answered.
    #[param(format = Uuid)]
    pub lock_id: String,
}

/// A blocking query on a monitor.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MonitorQuery {
    /// With `index`: wait up to this long for the monitor's holder or queue to change.
    #[param(example = "10s")]
    pub wait: Option<String>,
    /// The `X-Zkguard-Index` of an earlier answer: the wait ends once the index differs.
    pub index: Option<i64>,
}

/// How to take a lock.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LockQuery {
    /// `foreground` (default) or `background`.
    #[param(rename = "type", inline)]
    pub lock_type: Option<super::LockTypeName>,
    /// The lock wait (`500ms`, `2s`, or milliseconds); at most `server.request.timeout`.
    pub timeout: Option<String>,
    /// The lease (default `server.lock.ttl`, at most `server.lock.ttl.max`).
    #[param(example = "30s")]
    pub ttl: Option<String>,
    /// Shown by `zkguard locks`; at most 1024 bytes (UTF-8), longer is refused (400 `bad_parameter`).
    pub info: Option<String>,
}

/// The document whose lock to take.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DocLockQuery {
    /// The document's index.
    #[param(example = "articles")]
    pub index: String,
    /// The document's id.
    #[param(example = "42")]
    pub id: String,
}

/// A keep-alive.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TtlQuery {
    /// The new lease, from now (default: the lock's own).
    #[param(example = "30s")]
    pub ttl: Option<String>,
}

/// A dead letter.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct DeadLetterPath {
    /// The entry's id (the operation's id), or the caller's idempotency key that named the
    /// operation (both in `GET /v1/deadletters`).
    pub id: String,
}

/// Why an entry is discarded.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DiscardQuery {
    /// Why the entry is given up (logged with it).
    pub reason: Option<String>,
}

/// Why an operator force-releases a lock.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ForceReleaseQuery {
    /// Why (logged with the release, and told to the holder on its next call with the lock; at
    /// most 1024 bytes).
    #[param(example = "holder hung since 02:00")]
    pub reason: Option<String>,
}

/// A transaction.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TransferPath {
    /// The transaction's id.
    pub id: String,
}

/// Which events a stream carries (all, without filters; `monitor` and `prefix` combine as
/// "either").
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Only this monitor's events; repeat the parameter for several.
    #[param(style = Form, explode)]
    pub monitor: Option<Vec<String>>,
    /// Only the events of monitors starting with this; repeat for several.
    #[param(style = Form, explode)]
    pub prefix: Option<Vec<String>>,
    /// Only these types, comma-separated: `acquired`, `released`, `lost`, `applied`,
    /// `rejected`, `parked` (`lagged` is always sent).
    #[param(example = "released,lost")]
    pub types: Option<String>,
}

/// Where a stream resumes.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct ResumeHeader {
    /// The `id` of the last event received: the stream resends the later events the service
    /// still keeps (a `lagged` event first says how many it no longer has).
    #[param(rename = "Last-Event-ID", value_type = String, required = false)]
    pub last: Option<String>,
}
