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
//! applied. It applies one document's entries in the order their operations were accepted
//! ([`DeadLetter::accepted`]), whatever order they were parked in, and never applies one over a
//! write of the document accepted after it: such an entry is reported
//! [`ReplayResult::Superseded`] and removed. Guarded writes record each operation's id in the target document (see
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
    /// When the operation was accepted, the order a replay applies one document's entries in:
    /// its [`Operation::accepted`] (microseconds since the Unix epoch), or, for an entry parked
    /// before zkguard recorded that, the start of its first attempt.
    pub fn accepted(&self) -> u64 {
        self.operation
            .accepted
            .unwrap_or_else(|| time_serde::micros(self.first_attempt))
    }

    /// The document the operation writes (`index`, `id`).
    fn document(&self) -> (String, String) {
        (
            self.operation.target_index().to_string(),
            self.operation.target_id().to_string(),
        )
    }

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

    /// Replays parked operations through `writer`: the one replay every caller runs
    /// (`zkguard dlq replay`, `POST /v1/deadletters/replay`, the demo), whatever the sink. The
    /// default lists the entries and settles each with [`DeadLetterSink::remove`] or
    /// [`DeadLetterSink::park`] (see [`replay`] for the order and the guarantees); a sink that
    /// keeps its entries another way (the Kafka topic's records and offsets) overrides it.
    ///
    /// # Errors
    /// [`DeadLetterError::NoSuchEntry`] when `selection` names an unknown id; sink errors while
    /// listing.
    ///
    /// # Cancellation safety
    /// As [`replay`]: a dropped replay leaves each entry either parked or removed after being
    /// applied.
    async fn replay(
        &self,
        writer: &GuardedWriter,
        selection: ReplaySelection,
    ) -> Result<Vec<ReplayEntry>, DeadLetterError> {
        replay_listed(writer, self, selection).await
    }
}

impl std::fmt::Debug for dyn DeadLetterSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Which parked operations to replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplaySelection {
    /// Every entry: one document's in the order they were accepted.
    All,
    /// One entry, after the entries of its document accepted before it.
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
    /// Not applied: the document has a write accepted after the operation
    /// ([`crate::write::guarded::GuardedError::Superseded`]), which
    /// applying it would undo. The entry was logged whole (warn) and removed.
    Superseded {
        /// What the document has.
        error: String,
        /// Why the entry could not be removed, if the sink refused (it stays; a later replay
        /// finds it superseded again).
        not_removed: Option<String>,
    },
    /// Failed again; the entry stays parked with the attempt counted (or, when the sink
    /// refused the update, as it was). Also an entry that was not run because an older entry
    /// of its document stays parked (its attempts unchanged): applying it first would apply
    /// the document's writes out of order.
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
    /// The fencing token of the write that applied the operation
    /// ([`crate::write::guarded::Written::applied_token`]): the replay's when it wrote it; when
    /// the document already recorded it, the earlier write's, or `None` when the document no
    /// longer tells it. What the operation's outcome reports.
    pub applied_token: Option<u64>,
    /// Whether the document already recorded the operation (nothing was written), whether or
    /// not the entry could be removed.
    pub already_applied: bool,
    /// Attempts made so far, this replay included.
    pub attempts: u32,
    /// For a replay of one entry ([`ReplaySelection::Id`]): set on each older entry of its
    /// document, replayed before it, to the id asked for.
    pub replayed_before: Option<Uuid>,
}

/// The outcome of a replay as one JSON object, the shape both `zkguard dlq replay --json` and
/// `POST /v1/deadletters/replay` answer: `{"replayed", "applied", "already_applied",
/// "still_parked", "not_removed", "superseded", "results": [{"id", "summary", "result",
/// "attempts", "token", "error", "replayed_before"}]}`. `result` is `applied`,
/// `already_applied`, `still_parked`, `not_removed` or `superseded`; `token` (the replay's
/// fencing token) is there when the operation is in its document, `error` when it is not or
/// its entry stays, `replayed_before` (the id asked for) on the older entries of its document
/// that a replay of one entry ran first.
pub fn replay_report(results: &[ReplayEntry]) -> serde_json::Value {
    let mut counts = [0usize; 5];
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
                ReplayResult::Superseded { error, not_removed } => (
                    4,
                    Some(match not_removed {
                        None => error.clone(),
                        Some(e) => format!("{error} (the entry could not be removed: {e})"),
                    }),
                ),
            };
            counts[kind] += 1;
            let result = [
                "applied",
                "already_applied",
                "still_parked",
                "not_removed",
                "superseded",
            ][kind];
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
            if let Some(asked) = r.replayed_before {
                entry["replayed_before"] = serde_json::json!(asked.to_string());
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
        "superseded": counts[4],
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

/// Replays parked operations through `writer`, one at a time, one document's in the order they
/// were accepted ([`DeadLetter::accepted`]; entries accepted at the same time in listing order).
///
/// For each entry: run the operation (its own monitor, lock type and id) with the writer in
/// acceptance order ([`GuardedWriter::in_acceptance_order`]); if it was applied, or the target
/// document already records it, remove the entry; if the document has a write accepted after
/// it, report it [`ReplayResult::Superseded`] and remove it (logged whole first); otherwise
/// update the entry (one more attempt, the new error) and go on. Once an entry of a document
/// stays parked, the document's later entries are not run (they stay as they are, reported
/// still parked): they would be applied before it. An entry is removed only after its
/// operation is in the document (or superseded), and a document never applies the same
/// operation id twice (within the writer's ops window), so a replay that is killed at any
/// point and run again loses nothing and applies nothing twice. Hard deletes are idempotent by
/// nature.
///
/// [`ReplaySelection::Id`] replays the entries of the same document accepted before the one
/// asked for first (each marked [`ReplayEntry::replayed_before`]), then that one.
///
/// # Errors
/// [`DeadLetterError::NoSuchEntry`] when `selection` names an unknown id; sink errors while
/// listing. Failures of single operations are reported in the entries, not as errors.
///
/// This runs the sink's own [`DeadLetterSink::replay`], so every caller replays a sink the same
/// way (a Kafka topic's records are marked done and its offsets committed).
///
/// # Cancellation safety
/// Cancel-safe in the sense above: a dropped replay leaves each entry either parked or removed
/// after being applied.
pub async fn replay(
    writer: &GuardedWriter,
    sink: &dyn DeadLetterSink,
    selection: ReplaySelection,
) -> Result<Vec<ReplayEntry>, DeadLetterError> {
    sink.replay(writer, selection).await
}

/// The replay of a sink that lists its entries and settles them with `remove` and `park`:
/// [`DeadLetterSink::replay`]'s default.
pub(crate) async fn replay_listed<S: DeadLetterSink + ?Sized>(
    writer: &GuardedWriter,
    sink: &S,
    selection: ReplaySelection,
) -> Result<Vec<ReplayEntry>, DeadLetterError> {
    let letters = sink.list().await?;
    let asked = match selection {
        ReplaySelection::All => None,
        ReplaySelection::Id(id) => Some(id),
    };
    let letters = select(letters, selection)?;
    let items = letters.into_iter().map(|letter| Item { letter, at: None });
    Ok(replay_items(writer, items.collect(), &SinkSettle(sink), asked).await)
}

/// The entries `selection` replays, in listing order: all, or the one asked for and the
/// entries of its document accepted before it.
fn select(
    letters: Vec<DeadLetter>,
    selection: ReplaySelection,
) -> Result<Vec<DeadLetter>, DeadLetterError> {
    let ReplaySelection::Id(id) = selection else {
        return Ok(letters);
    };
    let (pos, target) = letters
        .iter()
        .enumerate()
        .find(|(_, l)| l.id == id)
        .ok_or(DeadLetterError::NoSuchEntry { id })?;
    let (doc, key) = (target.document(), (target.accepted(), pos));
    Ok(letters
        .iter()
        .enumerate()
        .filter(|(i, l)| l.id == id || (l.document() == doc && (l.accepted(), *i) < key))
        .map(|(_, l)| l.clone())
        .collect())
}

/// One entry to replay, and where it is (a Kafka record's partition and offset).
#[derive(Debug, Clone)]
pub(crate) struct Item {
    pub(crate) letter: DeadLetter,
    pub(crate) at: Option<(i32, i64)>,
}

/// How a replay settles an entry in its sink.
#[async_trait]
pub(crate) trait Settle: Send + Sync {
    /// The operation is in its document, or superseded: the entry goes.
    async fn done(&self, item: &Item) -> Result<(), String>;
    /// The operation failed again: the entry stays as `updated`; why not, if the sink refused.
    async fn repark(&self, item: &Item, updated: &DeadLetter) -> Option<String>;
}

/// Settles entries in a [`DeadLetterSink`]: removes them, or parks the update.
struct SinkSettle<'a, S: ?Sized>(&'a S);

#[async_trait]
impl<S: DeadLetterSink + ?Sized> Settle for SinkSettle<'_, S> {
    async fn done(&self, item: &Item) -> Result<(), String> {
        self.0
            .remove(item.letter.id)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn repark(&self, _item: &Item, updated: &DeadLetter) -> Option<String> {
        self.0.park(updated).await.err().map(|e| {
            tracing::warn!(error = %e, "could not record the failed replay; the entry stays as it was");
            e.to_string()
        })
    }
}

/// Replays `items` in acceptance order (see [`replay`]); `asked` is the id of a replay of one
/// entry.
pub(crate) async fn replay_items(
    writer: &GuardedWriter,
    mut items: Vec<Item>,
    settle: &dyn Settle,
    asked: Option<Uuid>,
) -> Vec<ReplayEntry> {
    let writer = writer.clone().in_acceptance_order();
    // Stable: entries accepted at the same time keep their listing order.
    items.sort_by_key(|i| i.letter.accepted());
    let mut parked: std::collections::HashMap<(String, String), Uuid> = Default::default();
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let doc = item.letter.document();
        let mut entry = match parked.get(&doc) {
            Some(older) => blocked(&item.letter, *older, &doc),
            None => {
                let span = tracing::info_span!("dlq_replay", op = %item.letter.id,
                    monitor = %item.letter.monitor, accepted = item.letter.accepted());
                replay_one(&writer, settle, &item).instrument(span).await
            }
        };
        if let ReplayResult::StillParked { .. } = entry.result {
            parked.entry(doc).or_insert(item.letter.id);
        }
        entry.replayed_before = asked.filter(|a| *a != item.letter.id);
        out.push(entry);
    }
    out
}

/// The result of an entry not run because the older entry `older` of its document stays parked.
fn blocked(letter: &DeadLetter, older: Uuid, doc: &(String, String)) -> ReplayEntry {
    tracing::info!(op = %letter.id, %older, "not replayed: an older entry of its document stays parked");
    ReplayEntry {
        id: letter.id,
        summary: letter.operation.summary(),
        result: ReplayResult::StillParked {
            error: format!(
                "not replayed: entry {older}, accepted before it for {}/{}, stays parked; replay that one first (or discard it)",
                doc.0, doc.1
            ),
            transient: true,
            not_recorded: None,
        },
        token: None,
        applied_token: None,
        already_applied: false,
        attempts: letter.attempts,
        replayed_before: None,
    }
}

async fn replay_one(writer: &GuardedWriter, settle: &dyn Settle, item: &Item) -> ReplayEntry {
    let letter = &item.letter;
    let summary = letter.operation.summary();
    let attempts = letter.attempts.saturating_add(1);
    let mut token = None;
    let mut applied_token = None;
    let mut already_applied = false;
    let result = match writer.run(&letter.operation).await {
        Ok(written) => {
            token = Some(written.token);
            applied_token = written.applied_token;
            already_applied = written.already_applied;
            match settle.done(item).await {
                Ok(()) if written.already_applied => ReplayResult::AlreadyApplied,
                Ok(()) => ReplayResult::Applied,
                Err(error) => ReplayResult::NotRemoved { error },
            }
        }
        Err(error @ GuardedError::Superseded { .. }) => {
            let entry = serde_json::to_string(letter).unwrap_or_default();
            tracing::warn!(op = %letter.id, monitor = %letter.monitor, %error, %entry,
                "dead letter superseded by a newer write of its document; removing it");
            ReplayResult::Superseded {
                error: error.to_string(),
                not_removed: settle.done(item).await.err(),
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
            ReplayResult::StillParked {
                error: error.to_string(),
                transient: error.is_transient(),
                not_recorded: settle.repark(item, &updated).await,
            }
        }
    };
    tracing::info!(?result, "replayed");
    ReplayEntry {
        id: letter.id,
        summary,
        result,
        token,
        applied_token,
        already_applied,
        attempts,
        replayed_before: None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::{LockError, LockType};
    use std::time::{Duration, UNIX_EPOCH};

    fn letter(op: &Operation, first: u64) -> DeadLetter {
        let error = GuardedError::Lock(LockError::Timeout {
            monitor: op.monitor.clone(),
            lock_type: LockType::Background,
            waited: Duration::from_millis(1),
            blocked_by: None,
        });
        let t = UNIX_EPOCH + Duration::from_micros(first);
        DeadLetter::new(op, 1, &error, t, t)
    }

    #[test]
    fn entries_parked_without_an_acceptance_time_are_ordered_by_their_first_attempt() {
        let op = Operation::index("m", "i", "1", serde_json::json!({}));
        let legacy = letter(&op, 1_000);
        let mut json = serde_json::to_value(&legacy).unwrap();
        assert!(json["operation"].get("accepted").is_none());
        json["operation"]
            .as_object_mut()
            .unwrap()
            .remove("accepted");
        let back: DeadLetter = serde_json::from_value(json).unwrap();
        assert_eq!(back.accepted(), 1_000);
        assert_eq!(letter(&op.clone().with_accepted(7), 1_000).accepted(), 7);
    }

    #[test]
    fn one_entry_is_selected_with_the_older_entries_of_its_document() {
        let doc = |n: u64, id: &str| {
            letter(
                &Operation::index("m", "i", id, serde_json::json!({})).with_accepted(n),
                n,
            )
        };
        let letters = vec![
            doc(30, "1"),
            doc(10, "1"),
            doc(20, "2"),
            doc(20, "1"),
            doc(40, "1"),
        ];
        let asked = letters[3].id;
        let picked: Vec<Uuid> = select(letters.clone(), ReplaySelection::Id(asked))
            .unwrap()
            .iter()
            .map(|l| l.id)
            .collect();
        assert_eq!(picked, vec![letters[1].id, letters[3].id]);
        assert!(matches!(
            select(letters, ReplaySelection::Id(Uuid::new_v4())),
            Err(DeadLetterError::NoSuchEntry { .. })
        ));
    }
}
