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
//! - [`kafka::KafkaSink`] (`deadletter.sink=kafka`): one record per dead letter
//!   in `deadletter.kafka.topic`, with the file sink as fallback.
//!
//! [`replay`] re-runs parked operations and removes an entry only after its operation was
//! applied. Guarded writes record each operation's id in the target document (see
//! [`super::ops::Stamp`]), so a replay that crashed between applying an operation and removing
//! its entry does not apply it again the next time: the next replay finds the id in the
//! document and only removes the entry.

pub mod kafka;
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tracing::Instrument;
use uuid::Uuid;

use crate::config::{DeadLetterSinkKind, RetrySettings};
use crate::es::{DocStore, EsError, Refresh, WriteCondition};
use crate::write::guarded::{GuardedError, GuardedWriter};
use crate::write::ops::Operation;

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
    Kafka(#[from] kafka::KafkaSinkError),
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

/// The sink configured by `deadletter.sink`: a [`FileSink`] at `deadletter.file.path`, an
/// [`EsSink`] on `deadletter.index` (which needs `store`), or a
/// [`kafka::KafkaSink`] (which connects on first use).
///
/// # Errors
/// [`DeadLetterError::NoStore`] for the Elasticsearch sink without a store.
pub fn sink_from_settings(
    retry: &RetrySettings,
    store: Option<Arc<dyn DocStore>>,
) -> Result<Arc<dyn DeadLetterSink>, DeadLetterError> {
    match retry.sink {
        DeadLetterSinkKind::File => Ok(Arc::new(FileSink::new(&retry.file_path))),
        DeadLetterSinkKind::Elasticsearch => {
            let store = store.ok_or(DeadLetterError::NoStore)?;
            Ok(Arc::new(EsSink::new(store, retry.index.clone())))
        }
        DeadLetterSinkKind::Kafka => Ok(Arc::new(kafka::KafkaSink::new(
            &retry.kafka,
            &retry.file_path,
        ))),
    }
}

// ---------------------------------------------------------------------------------------------
// File sink

/// Dead letters as JSON lines in one file.
///
/// - `park` appends one line under an exclusive advisory lock (`flock`) on a companion lock file
///   (`<path>.lock`), then `fsync`s the file (and its directory when it was created);
/// - `remove` rewrites the file without the entry, under the same lock, through a temporary file
///   in the same directory that is fsynced and renamed over the original (atomic);
/// - `list` reads without locking: it sees the file before or after a rewrite, never a mix, and
///   skips a last line that is still being appended.
///
/// Several processes (executors, `zkguard dlq replay`) can share the file. Lines that cannot be
/// parsed are reported in the log and kept as they are by rewrites.
#[derive(Debug, Clone)]
pub struct FileSink {
    path: PathBuf,
    lock_path: PathBuf,
}

/// The id of a line, read without requiring the rest of the entry to parse.
#[derive(Deserialize)]
struct LineId {
    id: String,
}

impl FileSink {
    /// A sink writing to `path` (created with its parent directories on first park).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let mut lock = path.clone().into_os_string();
        lock.push(".lock");
        Self {
            path,
            lock_path: PathBuf::from(lock),
        }
    }

    /// The JSON-lines file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The companion file that `park` and `remove` lock with `flock`.
    pub fn lock_path(&self) -> &Path {
        &self.lock_path
    }

    fn io(&self, action: &'static str) -> impl FnOnce(io::Error) -> DeadLetterError + '_ {
        move |source| DeadLetterError::Io {
            action,
            path: self.path.clone(),
            source,
        }
    }

    fn with_lock<T>(
        &self,
        f: impl FnOnce() -> Result<T, DeadLetterError>,
    ) -> Result<T, DeadLetterError> {
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(self.io("create the directory of"))?;
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&self.lock_path)
            .map_err(|source| DeadLetterError::Io {
                action: "open the lock file of",
                path: self.path.clone(),
                source,
            })?;
        let mut lock = fd_lock::RwLock::new(file);
        let _held = lock.write().map_err(self.io("lock"))?;
        f()
    }

    fn park_blocking(&self, line: &[u8]) -> Result<(), DeadLetterError> {
        self.with_lock(|| {
            let existed = self.path.exists();
            let mut f = OpenOptions::new()
                .create(true)
                .append(true)
                .read(true)
                .open(&self.path)
                .map_err(self.io("open"))?;
            let len = f.metadata().map_err(self.io("inspect"))?.len();
            if len > 0 {
                // A crash may have left a torn last line: never glue a new entry onto it.
                let mut last = [0u8; 1];
                f.seek(SeekFrom::End(-1)).map_err(self.io("read"))?;
                f.read_exact(&mut last).map_err(self.io("read"))?;
                if last[0] != b'\n' {
                    f.write_all(b"\n").map_err(self.io("append to"))?;
                }
            }
            f.write_all(line).map_err(self.io("append to"))?;
            f.flush().map_err(self.io("flush"))?;
            f.sync_all().map_err(self.io("fsync"))?;
            if !existed {
                sync_dir(&self.path).map_err(self.io("fsync the directory of"))?;
            }
            Ok(())
        })
    }

    fn read_lines(&self) -> Result<(Vec<String>, bool), DeadLetterError> {
        let bytes = match fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), true)),
            Err(e) => return Err(self.io("read")(e)),
        };
        let complete = bytes.last().is_none_or(|b| *b == b'\n');
        let text = String::from_utf8_lossy(&bytes);
        Ok((text.lines().map(str::to_string).collect(), complete))
    }

    fn list_blocking(&self) -> Result<Vec<DeadLetter>, DeadLetterError> {
        let (mut lines, complete) = self.read_lines()?;
        if !complete {
            // Being appended right now (or torn by a crash): not an entry yet.
            lines.pop();
        }
        let mut order: Vec<Uuid> = Vec::new();
        let mut latest: HashMap<Uuid, DeadLetter> = HashMap::new();
        for (n, line) in lines.iter().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<DeadLetter>(line) {
                Ok(letter) => {
                    if !latest.contains_key(&letter.id) {
                        order.push(letter.id);
                    }
                    latest.insert(letter.id, letter);
                }
                Err(e) => tracing::warn!(
                    file = %self.path.display(),
                    line = n + 1,
                    error = %e,
                    "skipping a dead-letter line that cannot be parsed (kept in the file)"
                ),
            }
        }
        Ok(order
            .into_iter()
            .filter_map(|id| latest.remove(&id))
            .collect())
    }

    fn remove_blocking(&self, id: Uuid) -> Result<bool, DeadLetterError> {
        self.with_lock(|| {
            let (lines, _) = self.read_lines()?;
            let wanted = id.to_string();
            let before = lines.len();
            let kept: Vec<&String> = lines
                .iter()
                .filter(|l| !serde_json::from_str::<LineId>(l).is_ok_and(|p| p.id == wanted))
                .collect();
            if kept.len() == before {
                return Ok(false);
            }
            let name = self
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let tmp = self
                .path
                .with_file_name(format!(".{name}.{}.tmp", std::process::id()));
            let write = || -> io::Result<()> {
                let mut f = File::create(&tmp)?;
                for line in &kept {
                    f.write_all(line.as_bytes())?;
                    f.write_all(b"\n")?;
                }
                f.sync_all()?;
                fs::rename(&tmp, &self.path)?;
                sync_dir(&self.path)
            };
            if let Err(e) = write() {
                let _ = fs::remove_file(&tmp);
                return Err(self.io("rewrite")(e));
            }
            Ok(true)
        })
    }
}

fn sync_dir(file: &Path) -> io::Result<()> {
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DeadLetterError> + Send + 'static,
) -> Result<T, DeadLetterError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(DeadLetterError::Io {
            action: "finish writing",
            path: PathBuf::new(),
            source: io::Error::other(e),
        })
    })
}

#[async_trait]
impl DeadLetterSink for FileSink {
    async fn park(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        let mut line = serde_json::to_vec(letter).map_err(|source| DeadLetterError::Json {
            what: format!("{} (encoding)", letter.id),
            source,
        })?;
        line.push(b'\n');
        let me = self.clone();
        blocking(move || me.park_blocking(&line)).await?;
        tracing::info!(id = %letter.id, file = %self.path.display(), "operation parked");
        Ok(())
    }

    async fn list(&self) -> Result<Vec<DeadLetter>, DeadLetterError> {
        let me = self.clone();
        blocking(move || me.list_blocking()).await
    }

    async fn remove(&self, id: Uuid) -> Result<bool, DeadLetterError> {
        let me = self.clone();
        blocking(move || me.remove_blocking(id)).await
    }

    fn describe(&self) -> String {
        format!("file {}", self.path.display())
    }
}

// ---------------------------------------------------------------------------------------------
// Elasticsearch sink

/// Dead letters as documents (id = operation id) in an index created with explicit mappings.
///
/// The operation is stored as an object that is not indexed (`enabled: false`), so documents of
/// any shape can be parked without mapping conflicts. `park` and `remove` use
/// `refresh=wait_for`, so `list` sees them at once. Parking needs Elasticsearch to be up: when
/// the failures to park for are Elasticsearch outages, prefer the file sink.
#[derive(Clone)]
pub struct EsSink {
    store: Arc<dyn DocStore>,
    index: String,
    page: usize,
    ready: Arc<tokio::sync::OnceCell<()>>,
}

impl std::fmt::Debug for EsSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EsSink")
            .field("index", &self.index)
            .finish()
    }
}

impl EsSink {
    /// A sink on `index` (created on first use).
    pub fn new(store: Arc<dyn DocStore>, index: impl Into<String>) -> Self {
        Self {
            store,
            index: index.into(),
            page: ES_PAGE,
            ready: Arc::new(tokio::sync::OnceCell::new()),
        }
    }

    /// How many entries [`DeadLetterSink::list`] fetches per search request (default 500).
    #[must_use]
    pub fn with_page_size(mut self, page: usize) -> Self {
        self.page = page.max(1);
        self
    }

    /// The mappings the index is created with.
    pub fn mappings() -> Value {
        json!({
            "properties": {
                "id": {"type": "keyword"},
                "monitor": {"type": "keyword"},
                "attempts": {"type": "integer"},
                "reason": {"type": "keyword"},
                "error_kind": {"type": "keyword"},
                "last_error": {"type": "text"},
                "first_attempt": {"type": "date"},
                "last_attempt": {"type": "date"},
                "parked_at": {"type": "date"},
                "parked_at_us": {"type": "long"},
                "host": {"type": "keyword"},
                "operation": {"type": "object", "enabled": false}
            }
        })
    }

    fn err(&self, source: EsError) -> DeadLetterError {
        DeadLetterError::Store {
            index: self.index.clone(),
            source,
        }
    }

    async fn ensure(&self) -> Result<(), DeadLetterError> {
        self.ready
            .get_or_try_init(|| async {
                self.store
                    .ensure_index(&self.index, &Self::mappings())
                    .await
            })
            .await
            .map(|_| ())
            .map_err(|e| self.err(e))
    }
}

/// Page size of [`EsSink::list`].
const ES_PAGE: usize = 500;

#[async_trait]
impl DeadLetterSink for EsSink {
    async fn park(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        self.ensure().await?;
        let mut source = serde_json::to_value(letter).map_err(|source| DeadLetterError::Json {
            what: format!("{} (encoding)", letter.id),
            source,
        })?;
        // The sort key: parking order, to the microsecond.
        source["parked_at_us"] = json!(time_serde::micros(letter.parked_at));
        self.store
            .index(
                &self.index,
                &letter.id.to_string(),
                &source,
                WriteCondition::Always,
                Refresh::WaitFor,
            )
            .await
            .map_err(|e| self.err(e))?;
        tracing::info!(id = %letter.id, index = %self.index, "operation parked");
        Ok(())
    }

    async fn list(&self) -> Result<Vec<DeadLetter>, DeadLetterError> {
        let mut out = Vec::new();
        let mut after: Option<Value> = None;
        loop {
            let mut body = json!({
                "size": self.page,
                "query": {"match_all": {}},
                "sort": [{"parked_at_us": "asc"}, {"id": "asc"}],
            });
            if let Some(a) = &after {
                body["search_after"] = a.clone();
            }
            let hits = self
                .store
                .search(&self.index, &body)
                .await
                .map_err(|e| self.err(e))?;
            let n = hits.len();
            for hit in hits {
                let letter: DeadLetter =
                    serde_json::from_value(hit.source).map_err(|source| DeadLetterError::Json {
                        what: hit.id.clone(),
                        source,
                    })?;
                after = Some(json!([
                    time_serde::micros(letter.parked_at),
                    letter.id.to_string()
                ]));
                out.push(letter);
            }
            if n < self.page {
                return Ok(out);
            }
        }
    }

    async fn remove(&self, id: Uuid) -> Result<bool, DeadLetterError> {
        match self
            .store
            .delete(
                &self.index,
                &id.to_string(),
                WriteCondition::Always,
                Refresh::WaitFor,
            )
            .await
        {
            Ok(found) => Ok(found.is_some()),
            Err(EsError::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.err(e)),
        }
    }

    fn describe(&self) -> String {
        format!("index {}", self.index)
    }
}

// ---------------------------------------------------------------------------------------------
// Replay

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
pub struct ReplayEntry {
    /// The operation id.
    pub id: Uuid,
    /// The operation's summary.
    pub summary: String,
    /// The result.
    pub result: ReplayResult,
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
    let result = match writer.run(&letter.operation).await {
        Ok(written) => match sink.remove(letter.id).await {
            Ok(_) if written.already_applied => ReplayResult::AlreadyApplied,
            Ok(_) => ReplayResult::Applied,
            Err(e) => ReplayResult::NotRemoved {
                error: e.to_string(),
            },
        },
        Err(error) => {
            let mut updated = letter.clone();
            updated.attempts = letter.attempts.saturating_add(1);
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
    use crate::lock::LockError;
    use std::time::Duration;

    fn letter(op: &Operation) -> DeadLetter {
        let err = GuardedError::Lock(LockError::Timeout {
            monitor: op.monitor.clone(),
            lock_type: op.lock_type,
            waited: Duration::from_millis(5),
            blocked_by: None,
        });
        let t = SystemTime::now();
        DeadLetter::new(op, 3, &err, t, t)
    }

    #[tokio::test]
    async fn file_sink_parks_lists_replaces_and_removes() {
        let dir = tempfile::tempdir().unwrap();
        let sink = FileSink::new(dir.path().join("sub/dl.jsonl"));
        assert!(sink.list().await.unwrap().is_empty());
        let ops: Vec<Operation> = (0..3)
            .map(|i| Operation::increment("m", "i", i.to_string(), "n", 1))
            .collect();
        for op in &ops {
            sink.park(&letter(op)).await.unwrap();
        }
        let mut again = letter(&ops[0]);
        again.attempts = 4;
        sink.park(&again).await.unwrap();
        let listed = sink.list().await.unwrap();
        assert_eq!(
            listed.iter().map(|l| l.id).collect::<Vec<_>>(),
            ops.iter().map(|o| o.id).collect::<Vec<_>>()
        );
        assert_eq!(
            listed[0].attempts, 4,
            "a re-park replaces the entry in place"
        );
        assert_eq!(listed[1].reason, ParkReason::RetriesExhausted);
        assert_eq!(listed[1].error_kind, "lock_timeout");
        assert_eq!(listed[1].operation, ops[1]);
        assert!(sink.remove(ops[0].id).await.unwrap());
        assert!(!sink.remove(ops[0].id).await.unwrap());
        let left: Vec<Uuid> = sink.list().await.unwrap().iter().map(|l| l.id).collect();
        assert_eq!(left, vec![ops[1].id, ops[2].id]);
        let text = fs::read_to_string(sink.path()).unwrap();
        assert_eq!(text.lines().count(), 2);
    }

    #[tokio::test]
    async fn file_sink_survives_torn_and_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dl.jsonl");
        let sink = FileSink::new(&path);
        let a = Operation::delete("m", "i", "a");
        sink.park(&letter(&a)).await.unwrap();
        // A line from elsewhere that is not an entry, and a torn append.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"not json\n{\"id\":\"tor").unwrap();
        drop(f);
        assert_eq!(
            sink.list().await.unwrap().len(),
            1,
            "partial last line skipped"
        );
        let b = Operation::delete("m", "i", "b");
        sink.park(&letter(&b)).await.unwrap();
        let ids: Vec<Uuid> = sink.list().await.unwrap().iter().map(|l| l.id).collect();
        assert_eq!(
            ids,
            vec![a.id, b.id],
            "the new entry was not glued onto the torn line"
        );
        assert!(sink.remove(a.id).await.unwrap());
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("not json"),
            "unparsable lines are kept: {text}"
        );
        assert_eq!(sink.list().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn concurrent_parks_and_removes_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dl.jsonl");
        let ops: Vec<Operation> = (0..40)
            .map(|i| Operation::delete("m", "i", i.to_string()))
            .collect();
        let mut tasks = Vec::new();
        for chunk in ops.chunks(10) {
            let sink = FileSink::new(&path);
            let chunk = chunk.to_vec();
            tasks.push(tokio::spawn(async move {
                for op in chunk {
                    sink.park(&letter(&op)).await.unwrap();
                    if op.target_id().parse::<u32>().unwrap() % 2 == 0 {
                        assert!(sink.remove(op.id).await.unwrap());
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let left = FileSink::new(&path).list().await.unwrap();
        assert_eq!(left.len(), 20);
        assert!(left
            .iter()
            .all(|l| l.operation.target_id().parse::<u32>().unwrap() % 2 == 1));
    }
}
