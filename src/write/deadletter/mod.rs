//! Dead letters: operations that could not be applied, parked so that nothing is lost.
//!
//! A [`DeadLetter`] holds the whole [`Operation`] (so it can be replayed exactly), its monitor,
//! how many attempts were made, the last error and the times of the first and last attempts
//! and of parking. Sinks are pluggable behind [`DeadLetterSink`]:
//!
//! - [`FileSink`] (the default, `deadletter.sink=file`): JSON lines at `deadletter.file.path`,
//!   flushed and fsynced before [`DeadLetterSink::park`] returns, safe for several processes;
//! - [`EsSink`] (`deadletter.sink=elasticsearch`): one document per dead letter in
//!   `deadletter.index`;
//! - [`kafka::KafkaSink`] (`deadletter.sink=kafka`): one record per dead letter in
//!   `deadletter.kafka.topic`, with the file sink as fallback.
//!
//! [`replay`] re-runs parked operations and removes an entry only after its operation was
//! applied. Guarded writes record each operation's id in the target document (see
//! [`super::ops::Stamp`]), so a replay that crashed between applying an operation and removing
//! its entry does not apply it again the next time: the next replay finds the id in the
//! document and only removes the entry.
//!
//! One file per sink: `file.rs`, `es.rs`, `kafka.rs`; `select.rs` builds the one `deadletter.sink` names.

use std::io;
use std::path::PathBuf;
use std::time::SystemTime;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use uuid::Uuid;

use crate::es::EsError;
use crate::write::guarded::{GuardedError, GuardedWriter};
use crate::write::ops::Operation;

mod es;
mod file;
pub mod kafka;
mod kafka_error;
mod select;

pub use es::EsSink;
pub use file::FileSink;
pub use select::sink_from_settings;

/// Errors of dead-letter sinks.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeadLetterError {
    /// The dead-letter file could not be read or written.
    #[error("cannot {action} dead-letter file {}: {source}; check that its directory exists and is writable (deadletter.file.path)", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The dead-letter index could not be used.
    #[error("dead-letter index `{index}`: {source}")]
    Store {
        /// The index.
        index: String,
        /// The store error.
        #[source]
        source: EsError,
    },
    /// A stored dead letter could not be encoded or decoded.
    #[error("dead letter {what}: {source}")]
    Json {
        /// Which one.
        what: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// No parked operation has this id.
    #[error("no parked operation has id {id}; run `zkguard dlq list` to see the ids")]
    NoSuchEntry {
        /// The id asked for.
        id: Uuid,
    },
    /// The Kafka sink could not reach or use its broker or topic.
    #[error(transparent)]
    Kafka(#[from] kafka_error::KafkaSinkError),
    /// `deadletter.sink=elasticsearch` without a document store.
    #[error("deadletter.sink=elasticsearch needs an Elasticsearch client; configure elasticsearch.url or use deadletter.sink=file")]
    NoStore,
}

/// Why an operation was parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParkReason {
    /// Every attempt failed transiently (lock timeouts, Elasticsearch unavailable).
    RetriesExhausted,
    /// The failure cannot go away by retrying the same way (fenced, missing document, a value
    /// that cannot be incremented): parked for a person to look at and replay or drop.
    NotRetryable,
}

impl std::fmt::Display for ParkReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::RetriesExhausted => "retries exhausted",
            Self::NotRetryable => "not retryable",
        })
    }
}

/// A parked operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The operation id (the entry's id).
    #[serde(with = "crate::write::ops::uuid_serde")]
    pub id: Uuid,
    /// The monitor object.
    pub monitor: String,
    /// Attempts made so far (including failed replays).
    pub attempts: u32,
    /// Why it was parked.
    pub reason: ParkReason,
    /// Short class of the last error (`lock_timeout`, `fenced`, `es_unavailable`, ...).
    pub error_kind: String,
    /// The last error's message.
    pub last_error: String,
    /// When the first attempt started.
    #[serde(with = "time_serde")]
    pub first_attempt: SystemTime,
    /// When the last attempt ended.
    #[serde(with = "time_serde")]
    pub last_attempt: SystemTime,
    /// When the operation was first parked.
    #[serde(with = "time_serde")]
    pub parked_at: SystemTime,
    /// The host that parked it.
    pub host: String,
    /// The operation, complete, for replay.
    pub operation: Operation,
}

impl DeadLetter {
    /// A dead letter for `op` after `attempts` attempts that ended with `error`.
    pub fn new(
        op: &Operation,
        attempts: u32,
        error: &GuardedError,
        first_attempt: SystemTime,
        last_attempt: SystemTime,
    ) -> Self {
        Self {
            id: op.id,
            monitor: op.monitor.clone(),
            attempts,
            reason: if error.is_transient() {
                ParkReason::RetriesExhausted
            } else {
                ParkReason::NotRetryable
            },
            error_kind: error.kind().to_string(),
            last_error: error.to_string(),
            first_attempt: time_serde::truncate(first_attempt),
            last_attempt: time_serde::truncate(last_attempt),
            parked_at: time_serde::truncate(SystemTime::now()),
            host: hostname::get()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default(),
            operation: op.clone(),
        }
    }
}

/// Where dead letters go. Implementations must make a parked entry durable before
/// [`DeadLetterSink::park`] returns.
#[async_trait]
pub trait DeadLetterSink: Send + Sync + 'static {
    /// Stores `letter`; an entry with the same id is replaced (a failed replay updates attempts
    /// and error this way).
    ///
    /// # Errors
    /// [`DeadLetterError`] when the entry could not be made durable.
    ///
    /// # Cancellation safety
    /// Not cancel-safe: a dropped call may or may not have stored the entry.
    async fn park(&self, letter: &DeadLetter) -> Result<(), DeadLetterError>;

    /// All parked entries, oldest first.
    ///
    /// # Errors
    /// [`DeadLetterError`] when the sink cannot be read.
    ///
    /// # Cancellation safety
    /// Cancel-safe: it only reads.
    async fn list(&self) -> Result<Vec<DeadLetter>, DeadLetterError>;

    /// Removes the entry `id`; `Ok(false)` when there was none.
    ///
    /// # Errors
    /// [`DeadLetterError`] when the sink cannot be changed.
    ///
    /// # Cancellation safety
    /// Not cancel-safe: a dropped call may or may not have removed the entry (removal is atomic).
    async fn remove(&self, id: Uuid) -> Result<bool, DeadLetterError>;

    /// Where the entries are (`file /var/lib/zkguard/dl.jsonl`, `index zkguard-deadletters`).
    fn describe(&self) -> String;
}

impl std::fmt::Debug for dyn DeadLetterSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Which parked operations to replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplaySelection {
    /// Every entry, oldest first.
    All,
    /// One entry.
    Id(Uuid),
}

/// What happened to one replayed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayResult {
    /// Applied now, and the entry was removed.
    Applied,
    /// The document already recorded the operation (an earlier replay or attempt applied it);
    /// nothing was written and the entry was removed.
    AlreadyApplied,
    /// Applied (or found applied) but the entry could not be removed; a later replay removes it
    /// without applying the operation again.
    NotRemoved {
        /// Why the removal failed.
        error: String,
    },
    /// Failed again; the entry stays parked with the attempt counted (or, when the sink
    /// refused the update, as it was).
    StillParked {
        /// The error.
        error: String,
        /// Whether a later replay may succeed without changes.
        transient: bool,
        /// Why the failed attempt could not be recorded in the entry, if the sink refused it.
        not_recorded: Option<String>,
    },
}

/// One replayed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayEntry {
    /// The operation id.
    pub id: Uuid,
    /// The operation's summary.
    pub summary: String,
    /// The result.
    pub result: ReplayResult,
    /// The fencing token of the replay's write (applied or found applied).
    pub token: Option<u64>,
    /// Attempts made so far, this replay included.
    pub attempts: u32,
}

/// The outcome of a replay as one JSON object, the shape both `zkguard dlq replay --json` and
/// `POST /v1/deadletters/replay` answer: `{"replayed", "applied", "already_applied",
/// "still_parked", "not_removed", "results": [{"id", "summary", "result", "attempts", "token",
/// "error"}]}`. `result` is `applied`, `already_applied`, `still_parked` or `not_removed`;
/// `token` (the replay's fencing token) is there when the operation is in its document, `error`
/// when it is not or its entry stays.
pub fn replay_report(results: &[ReplayEntry]) -> serde_json::Value {
    let mut counts = [0usize; 4];
    let list: Vec<serde_json::Value> = results
        .iter()
        .map(|r| {
            let (kind, error) = match &r.result {
                ReplayResult::Applied => (0, None),
                ReplayResult::AlreadyApplied => (1, None),
                ReplayResult::StillParked {
                    error,
                    not_recorded,
                    ..
                } => (
                    2,
                    Some(match not_recorded {
                        None => error.clone(),
                        Some(e) => format!(
                            "{error} (the entry stays as it was: recording this attempt failed: {e})"
                        ),
                    }),
                ),
                ReplayResult::NotRemoved { error } => (3, Some(error.clone())),
            };
            counts[kind] += 1;
            let result = ["applied", "already_applied", "still_parked", "not_removed"][kind];
            let mut entry = serde_json::json!({
                "id": r.id.to_string(),
                "summary": r.summary,
                "result": result,
                "attempts": r.attempts,
            });
            if let Some(t) = r.token {
                entry["token"] = serde_json::json!(t);
            }
            if let Some(e) = error {
                entry["error"] = serde_json::json!(e);
            }
            entry
        })
        .collect();
    serde_json::json!({
        "replayed": results.len(),
        "applied": counts[0],
        "already_applied": counts[1],
        "still_parked": counts[2],
        "not_removed": counts[3],
        "results": list,
    })
}

/// What a discard removed, as `zkguard dlq discard --json` prints it and
/// `DELETE /v1/deadletters/{id}` answers: `{"id", "summary", "reason", "entry"}`, `entry` being
/// the whole parked entry as `zkguard dlq list --json` shows it.
pub fn discard_report(letter: &DeadLetter, reason: &str) -> serde_json::Value {
    serde_json::json!({
        "id": letter.id.to_string(),
        "summary": letter.operation.summary(),
        "reason": reason,
        "entry": letter,
    })
}

/// Removes the parked entry `id` for good, without running its operation: for an operation that
/// can never apply (a mapping rejects it, its index is gone) and that its owner gave up. The
/// whole entry, operation included, and `reason` go to the log at warn level before the entry
/// is removed, and are returned, so that nothing leaves without a trace.
///
/// # Errors
/// [`DeadLetterError::NoSuchEntry`] when no entry has the id; sink errors.
///
/// # Cancellation safety
/// Not cancel-safe: a dropped call may or may not have removed the entry (it was logged first).
pub async fn discard(
    sink: &dyn DeadLetterSink,
    id: Uuid,
    reason: &str,
) -> Result<DeadLetter, DeadLetterError> {
    let letter = sink
        .list()
        .await?
        .into_iter()
        .find(|l| l.id == id)
        .ok_or(DeadLetterError::NoSuchEntry { id })?;
    let entry = serde_json::to_string(&letter).map_err(|e| DeadLetterError::Json {
        what: format!("entry {id}, for the log"),
        source: e,
    })?;
    tracing::warn!(op = %id, monitor = %letter.monitor, %reason, %entry,
        sink = %sink.describe(), "dead letter discarded");
    if !sink.remove(id).await? {
        return Err(DeadLetterError::NoSuchEntry { id });
    }
    Ok(letter)
}

/// Replays parked operations through `writer`, in parking order, one at a time.
///
/// For each entry: run the operation (its own monitor, lock type and id); if it was applied, or
/// the target document already records it, remove the entry; otherwise update the entry (one
/// more attempt, the new error) and go on. An entry is removed only after its operation is in
/// the document, and a document never applies the same operation id twice (within the writer's
/// ops window), so a replay that is killed at any point and run again loses nothing and applies
/// nothing twice. Hard deletes are idempotent by nature.
///
/// # Errors
/// [`DeadLetterError::NoSuchEntry`] when `selection` names an unknown id; sink errors while
/// listing. Failures of single operations are reported in the entries, not as errors.
///
/// # Cancellation safety
/// Cancel-safe in the sense above: a dropped replay leaves each entry either parked or removed
/// after being applied.
pub async fn replay(
    writer: &GuardedWriter,
    sink: &dyn DeadLetterSink,
    selection: ReplaySelection,
) -> Result<Vec<ReplayEntry>, DeadLetterError> {
    let mut letters = sink.list().await?;
    if let ReplaySelection::Id(id) = selection {
        letters.retain(|l| l.id == id);
        if letters.is_empty() {
            return Err(DeadLetterError::NoSuchEntry { id });
        }
    }
    let mut out = Vec::with_capacity(letters.len());
    for letter in letters {
        let span = tracing::info_span!("dlq_replay", op = %letter.id, monitor = %letter.monitor);
        let entry = replay_one(writer, sink, letter).instrument(span).await;
        out.push(entry);
    }
    Ok(out)
}

async fn replay_one(
    writer: &GuardedWriter,
    sink: &dyn DeadLetterSink,
    letter: DeadLetter,
) -> ReplayEntry {
    let summary = letter.operation.summary();
    let attempts = letter.attempts.saturating_add(1);
    let mut token = None;
    let result = match writer.run(&letter.operation).await {
        Ok(written) => {
            token = Some(written.token);
            let removed = sink.remove(letter.id).await;
            match removed {
                Ok(_) if written.already_applied => ReplayResult::AlreadyApplied,
                Ok(_) => ReplayResult::Applied,
                Err(e) => ReplayResult::NotRemoved {
                    error: e.to_string(),
                },
            }
        }
        Err(error) => {
            let mut updated = letter.clone();
            updated.attempts = attempts;
            updated.error_kind = error.kind().to_string();
            updated.last_error = error.to_string();
            updated.reason = if error.is_transient() {
                ParkReason::RetriesExhausted
            } else {
                ParkReason::NotRetryable
            };
            updated.last_attempt = time_serde::truncate(SystemTime::now());
            let not_recorded = match sink.park(&updated).await {
                Ok(()) => None,
                Err(e) => {
                    tracing::warn!(error = %e, "could not record the failed replay; the entry stays as it was");
                    Some(e.to_string())
                }
            };
            ReplayResult::StillParked {
                error: error.to_string(),
                transient: error.is_transient(),
                not_recorded,
            }
        }
    };
    tracing::info!(?result, "replayed");
    ReplayEntry {
        id: letter.id,
        summary,
        result,
        token,
        attempts,
    }
}

/// Serde support for [`SystemTime`] as RFC 3339 with microseconds (UTC).
pub(crate) mod time_serde {
    use std::time::{SystemTime, UNIX_EPOCH};

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_rfc3339_micros(*t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_rfc3339_weak(&text).map_err(serde::de::Error::custom)
    }

    /// `t` to the microsecond, as it is stored (so that stored entries compare equal).
    pub fn truncate(t: SystemTime) -> SystemTime {
        UNIX_EPOCH + std::time::Duration::from_micros(micros(t))
    }

    /// Microseconds since the epoch (the sort key of the Elasticsearch sink).
    pub fn micros(t: SystemTime) -> u64 {
        t.duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
    }
}
