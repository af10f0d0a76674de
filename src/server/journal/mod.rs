//! The write-ahead journal of background operations, and the status of every operation.
//!
//! One JSON object per line in `server.journal.path`:
//!
//! - `{"r":"accepted","ops":[...]}`: operations accepted in one request (one for a single
//!   background write, all of them for a bulk request). The line is written and `fsync`ed
//!   before the request is answered 202; being one line, a batch is accepted whole or not at
//!   all (a torn last line is ignored at the next start, and its request was never answered);
//! - `{"r":"finished","id":...,"status":"applied|rejected|parked",...}`: the executor's
//!   outcome, also `fsync`ed.
//!
//! At start the journal is read: every accepted operation without a finished record is queued
//! again. Running it again is safe: the guarded writer records operation ids in the documents,
//! so an operation whose write reached Elasticsearch before a crash is recognised and not
//! written twice. The file is then compacted (rewritten through a temporary file, `fsync`ed and
//! renamed), keeping the unfinished operations and the outcomes of the last [`KEEP_FINISHED`]
//! operations; it is compacted again while the service runs whenever it has grown by
//! [`COMPACT_EVERY`] lines, beside the table so that accepts go on meanwhile (see
//! [`compact`]).
//!
//! An exclusive advisory lock on `<path>.lock` keeps a second service off the same journal.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use uuid::Uuid;
use zkguard::write::ops::Operation;

/// How many finished operations keep their outcome (for `GET /v1/operations/{id}`).
pub const KEEP_FINISHED: usize = 10_000;
/// Lines appended after which the journal is compacted.
pub const COMPACT_EVERY: usize = 4_096;

/// Errors of the journal.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Another process holds the journal.
    #[error("the journal {} is in use by another zkguard serve (its lock file {} is held); give each instance its own server.journal.path", .path.display(), .lock.display())]
    InUse {
        /// Journal path.
        path: PathBuf,
        /// Lock file.
        lock: PathBuf,
    },
    /// A line before the last cannot be read: not a write cut short by a crash (only the last
    /// line can be), but damage. Nothing was changed; a copy of the file was kept.
    #[error("the journal {} is damaged: line {line} cannot be read, and only the last line can be cut short by a crash; a copy of the file is kept as {}. Look at the line (operations it held would be lost), then start once with server.journal.skip.corrupt=true to skip the lines that cannot be read", .path.display(), .copy.display())]
    Corrupt {
        /// Journal path.
        path: PathBuf,
        /// The first damaged line (from 1).
        line: usize,
        /// The copy of the journal as it was.
        copy: PathBuf,
    },
    /// Accepting the operations would go beyond a bound of the queue; nothing was accepted.
    #[error("{what}: the operations were not accepted; retry after the Retry-After delay (the queue drains as background operations are applied), or raise the bound")]
    Full {
        /// Which bound, and where the queue stands.
        what: String,
    },
    /// The Kafka journal's broker did not take the records (or cannot be reached): nothing was
    /// answered 202.
    #[error("the Kafka journal (topic {topic}) cannot take writes: {detail}; check server.journal.kafka.brokers and that the brokers run")]
    Broker {
        /// The journal topic.
        topic: String,
        /// What failed.
        detail: String,
    },
    /// The file could not be read or written.
    #[error("journal {}: {source}; check server.journal.path and the free space of its file system", .path.display())]
    Io {
        /// Journal path.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

/// Bounds of what the queue may hold, checked before anything is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Operations queued (`server.queue.max`).
    pub operations: usize,
    /// Bytes of queued operations, as journaled (`server.queue.max.bytes`).
    pub bytes: u64,
    /// Size of the journal file (`server.journal.max.bytes`).
    pub file_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            operations: usize::MAX,
            bytes: u64::MAX,
            file_bytes: u64::MAX,
        }
    }
}

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpState {
    /// Accepted and journaled, not finished yet.
    Queued,
    /// Written to Elasticsearch.
    Applied,
    /// Can never be applied (see the reason).
    Rejected,
    /// In the dead-letter sink.
    Parked,
}

impl OpState {
    /// The name used in answers and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Applied => "applied",
            Self::Rejected => "rejected",
            Self::Parked => "parked",
        }
    }
}

/// The outcome of one operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finished {
    /// Operation id.
    #[serde(with = "uuid_str")]
    pub id: Uuid,
    /// Applied, rejected or parked.
    pub status: OpState,
    /// Why it was rejected or parked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The fencing token of the write that applied it (not that of a later lock that found it
    /// applied): `None` for an operation found already applied in a document that no longer
    /// tells which write applied it (see [`Finished::already_applied`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// Whether the attempt that finished it found the operation already applied in its
    /// document (written before a crash or a takeover, its outcome not recorded then): nothing
    /// was written again. `token` is then the earlier write's, while the document names the
    /// operation as its last one, and absent once later operations were written over it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub already_applied: bool,
    /// Attempts made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// [`Operation::fingerprint`] of the operation: an operation id sent again for another
    /// operation is refused (see [`Journal::reuses_id`]). Filled in from the queued operation
    /// when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<u64>,
    /// The caller's idempotency key ([`Operation::key`]), kept with the outcome once the
    /// operation itself is dropped. Filled in from the queued operation when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "r", rename_all = "snake_case")]
enum Record {
    Accepted { ops: Vec<Operation> },
    Finished(Finished),
}

/// What the journal knows of one operation.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The operation, while it is queued.
    pub op: Option<Arc<Operation>>,
    /// Its outcome, once finished.
    pub finished: Option<Finished>,
}

impl Entry {
    /// Queued, applied, rejected or parked.
    pub fn state(&self) -> OpState {
        self.finished.as_ref().map_or(OpState::Queued, |f| f.status)
    }
}

struct Inner {
    /// Shared with the thread that `fsync`s it (group commit).
    file: Arc<File>,
    /// Lines written so far (the sequence number of the last one).
    written: u64,
    entries: HashMap<Uuid, Entry>,
    /// Queued operations in the order they were accepted, with when (finished ones are skipped
    /// lazily).
    queued_order: VecDeque<(Uuid, Instant)>,
    queued: usize,
    finished_order: FinishedOrder,
    appended: usize,
    /// Journaled bytes of each queued operation (its share of its line).
    sizes: HashMap<Uuid, u64>,
    /// Sum of `sizes`.
    queued_bytes: u64,
    /// Size of the journal file.
    file_bytes: u64,
    limits: Limits,
    /// The compaction running beside the table, if one is.
    compacting: Option<Running>,
    compaction_generation: u64,
}

/// A compaction running beside the table: its generation, and the lines appended since its
/// snapshot (they go to the new file before it replaces the old one).
#[derive(Debug)]
struct Running {
    generation: u64,
    tail: Vec<String>,
}

/// The journal and the table of operation states. Share it in an `Arc`.
pub struct Journal {
    path: PathBuf,
    inner: Mutex<Inner>,
    compact_every: usize,
    /// Group commit: how far the file is known durable.
    sync: Mutex<SyncState>,
    /// Why outcomes cannot be recorded now (`None`: they can). While set, nothing new is
    /// accepted and the service starts no background operation: an operation applied without a
    /// recorded outcome would run again at the next start.
    failing: tokio::sync::watch::Sender<Option<String>>,
    /// Counts the outcomes recorded: waiters of an operation wake on each
    /// ([`Journal::watch_outcomes`]).
    outcomes: tokio::sync::watch::Sender<u64>,
    /// A table without a file ([`Journal::in_memory`]): the Kafka journal's, whose records are
    /// in the topic. Nothing is written or `fsync`ed.
    memory: bool,
    /// Runs between a side compaction's snapshot and its end (tests).
    #[cfg(test)]
    compaction_hook: Mutex<Option<Box<dyn Fn() + Send>>>,
}

/// Group commit: one `fsync` makes every line written before it durable, so a caller whose
/// line an ended `fsync` covered needs none of its own.
#[derive(Debug, Default)]
struct SyncState {
    /// Lines up to this sequence number are durable.
    synced: u64,
    /// `fsync`s made.
    fsyncs: u64,
    /// Their time, in microseconds.
    fsync_us: u64,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("path", &self.path).finish()
    }
}

/// `path` with every symbolic link resolved: the file's own path if it exists, else its
/// directory's resolved path and its name.
fn resolve(path: &Path) -> std::io::Result<PathBuf> {
    match std::fs::canonicalize(path) {
        Ok(p) => Ok(p),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
            let dir = std::fs::canonicalize(dir.unwrap_or(Path::new(".")))?;
            Ok(dir.join(path.file_name().unwrap_or(path.as_os_str())))
        }
        Err(e) => Err(e),
    }
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> JournalError + '_ {
    move |source| JournalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Journal {
    /// Opens (or creates) the journal, takes its lock, reads it and compacts it. Returns the
    /// journal and the unfinished operations, oldest first, to run again. A last line that
    /// cannot be read (a write cut short by a crash) is skipped; with `skip_corrupt`, so are
    /// unreadable lines before it (with a warning naming them).
    ///
    /// # Errors
    /// [`JournalError::InUse`] when another process holds it; [`JournalError::Corrupt`] when a
    /// line before the last cannot be read (without `skip_corrupt`); [`JournalError::Io`].
    pub fn open(
        path: &Path,
        skip_corrupt: bool,
    ) -> Result<(Arc<Journal>, Vec<Operation>), JournalError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io(path))?;
        }
        // The file itself, through any symbolic link (of the file or of a directory): two
        // services naming one journal by different paths must meet at one lock file.
        let resolved = resolve(path).map_err(io(path))?;
        let path = resolved.as_path();
        let err = io(path);
        let mut lock_path = path.as_os_str().to_owned();
        lock_path.push(".lock");
        let lock_path = PathBuf::from(lock_path);
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(&err)?;
        // The lock lives as long as the process: the journal is opened once per service.
        let lock: &'static mut fd_lock::RwLock<File> =
            Box::leak(Box::new(fd_lock::RwLock::new(lock_file)));
        match lock.try_write() {
            Ok(guard) => std::mem::forget(guard),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(JournalError::InUse {
                    path: path.to_path_buf(),
                    lock: lock_path,
                })
            }
            Err(e) => return Err(err(e)),
        }

        let mut entries: HashMap<Uuid, Entry> = HashMap::new();
        // Lines carry no time: the operations replayed from the journal count as queued since
        // the start.
        let opened = Instant::now();
        let mut queued_order = VecDeque::new();
        let mut finished_order = FinishedOrder::default();
        // Lines that cannot be read: the last one may be a write cut short by a crash, any
        // other is damage.
        let mut unreadable: Vec<(usize, String)> = Vec::new();
        let mut last_line = 0;
        match File::open(path) {
            Ok(f) => {
                // Bytes, not text: a line cut short by a crash may end inside a character.
                for (n, line) in BufReader::new(f).split(b'\n').enumerate() {
                    let line = line.map_err(&err)?;
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    last_line = n + 1;
                    match serde_json::from_slice::<Record>(&line) {
                        Ok(Record::Accepted { ops }) => {
                            for op in ops {
                                if entries.contains_key(&op.id) {
                                    continue;
                                }
                                queued_order.push_back((op.id, opened));
                                entries.insert(
                                    op.id,
                                    Entry {
                                        op: Some(Arc::new(op)),
                                        finished: None,
                                    },
                                );
                            }
                        }
                        Ok(Record::Finished(f)) => {
                            finished_order.push_back(f.id);
                            entries.insert(
                                f.id,
                                Entry {
                                    op: None,
                                    finished: Some(f),
                                },
                            );
                        }
                        Err(e) => unreadable.push((n + 1, e.to_string())),
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(e)),
        }
        for (line, error) in &unreadable {
            if *line == last_line {
                tracing::warn!(journal = %path.display(), line, %error, "skipping a journal line that cannot be read (a write cut short by a crash)");
            } else if skip_corrupt {
                tracing::warn!(journal = %path.display(), line, %error, "skipping a damaged journal line (server.journal.skip.corrupt); the operations it held are lost");
            } else {
                let mut copy = path.as_os_str().to_owned();
                copy.push(format!(".damaged-{}", std::process::id()));
                let copy = PathBuf::from(copy);
                std::fs::copy(path, &copy).map_err(&err)?;
                return Err(JournalError::Corrupt {
                    path: path.to_path_buf(),
                    line: *line,
                    copy,
                });
            }
        }
        let pending: Vec<Operation> = queued_order
            .iter()
            .filter_map(|(id, _)| entries.get(id).and_then(|e| e.op.as_deref().cloned()))
            .filter(|op| entries.get(&op.id).is_some_and(|e| e.finished.is_none()))
            .collect();
        queued_order = pending.iter().map(|op| (op.id, opened)).collect();
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(&err)?;
        let journal = Journal {
            compact_every: COMPACT_EVERY,
            path: path.to_path_buf(),
            sync: Mutex::new(SyncState::default()),
            failing: tokio::sync::watch::channel(None).0,
            outcomes: tokio::sync::watch::channel(0).0,
            memory: false,
            #[cfg(test)]
            compaction_hook: Mutex::new(None),
            inner: Mutex::new(Inner {
                file: Arc::new(file),
                written: 0,
                entries,
                queued: pending.len(),
                queued_order,
                finished_order,
                appended: 0,
                sizes: HashMap::new(),
                queued_bytes: 0,
                file_bytes: 0,
                limits: Limits::default(),
                compacting: None,
                compaction_generation: 0,
            }),
        };
        {
            // The size each replayed operation takes in a line of its own, about what it took.
            let mut inner = journal.lock();
            for op in &pending {
                let size = serde_json::to_string(op).map_or(0, |l| l.len() as u64 + 1);
                inner.sizes.insert(op.id, size);
                inner.queued_bytes += size;
            }
        }
        {
            let mut inner = journal.lock();
            journal.trim(&mut inner);
            journal.compact(&mut inner)?;
        }
        Ok((Arc::new(journal), pending))
    }

    /// The journal's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the table half-updated in a way that
        // matters more than refusing every later request would.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The state of an operation, if known.
    pub fn get(&self, id: &Uuid) -> Option<Entry> {
        self.lock().entries.get(id).cloned()
    }

    /// Whether `op`'s id is known here for another operation (another monitor or write): then
    /// accepting `op` would acknowledge a write that is never applied, since the id is taken.
    pub fn reuses_id(&self, op: &Operation) -> bool {
        let inner = self.lock();
        let Some(entry) = inner.entries.get(&op.id) else {
            return false;
        };
        let known = match (&entry.op, &entry.finished) {
            (Some(queued), _) => Some(queued.fingerprint()),
            (None, Some(f)) => f.fingerprint,
            (None, None) => None,
        };
        known.is_some_and(|f| f != op.fingerprint())
    }

    /// How many operations are accepted and not finished.
    pub fn depth(&self) -> usize {
        self.lock().queued
    }

    /// How long the oldest operation accepted and not finished has been queued: since this
    /// process accepted it, or since the start for one replayed from the journal. `None` when
    /// none is queued.
    pub fn oldest_queued(&self) -> Option<Duration> {
        let inner = self.lock();
        // Finished operations leave the front at once (`trim`): this looks at one entry.
        inner
            .queued_order
            .iter()
            .find(|(id, _)| inner.entries.get(id).is_some_and(|e| e.finished.is_none()))
            .map(|(_, at)| at.elapsed())
    }

    /// Why outcomes cannot be recorded now, if they cannot (see [`Journal::outcomes_failed`]).
    pub fn problem(&self) -> Option<String> {
        self.failing.borrow().clone()
    }

    /// Wakes on every outcome recorded (in the table, as [`Journal::get`] reads it).
    pub fn watch_outcomes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.outcomes.subscribe()
    }

    /// Follows [`Journal::problem`].
    pub fn watch_problem(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.failing.subscribe()
    }

    /// Notes that outcomes could not be recorded (`e`): until [`Journal::checkpoint`] succeeds,
    /// [`Journal::accept`] refuses and the service starts no background operation.
    pub fn outcomes_failed(&self, e: &JournalError) {
        let why = format!("the journal cannot record outcomes ({e})");
        self.failing.send_if_modified(|f| {
            let changed = f.is_none();
            f.get_or_insert(why);
            changed
        });
    }

    /// Rewrites the journal with everything known in memory (the outcomes that could not be
    /// appended included); on success outcomes are recorded again.
    ///
    /// # Errors
    /// [`JournalError::Io`]: the journal still cannot be written.
    pub async fn checkpoint(self: &Arc<Self>) -> Result<(), JournalError> {
        let me = self.clone();
        let done = tokio::task::spawn_blocking(move || {
            let mut inner = me.lock();
            me.compact(&mut inner)
        })
        .await
        .unwrap_or_else(|e| {
            Err(JournalError::Io {
                path: self.path.clone(),
                source: std::io::Error::other(e.to_string()),
            })
        });
        if done.is_ok() {
            self.failing.send_replace(None);
        }
        done
    }

    /// Bounds the queue: beyond `limits`, [`Journal::accept`] refuses with
    /// [`JournalError::Full`].
    pub fn set_limits(&self, limits: Limits) {
        self.lock().limits = limits;
    }

    /// Bytes of queued operations, as journaled.
    pub fn queued_bytes(&self) -> u64 {
        self.lock().queued_bytes
    }

    /// Why `ops` more operations in a line of `size` bytes would go beyond a bound, if they
    /// would.
    fn beyond(inner: &Inner, ops: usize, size: u64) -> Option<String> {
        let l = inner.limits;
        if inner.queued + ops > l.operations {
            Some(format!(
                "{} operations are queued and {ops} more would pass server.queue.max ({})",
                inner.queued, l.operations
            ))
        } else if inner.queued_bytes + size > l.bytes {
            Some(format!(
                "{} bytes of operations are queued and {size} more would pass server.queue.max.bytes ({})",
                inner.queued_bytes, l.bytes
            ))
        } else if inner.file_bytes + size > l.file_bytes {
            Some(format!(
                "the journal holds {} bytes and {size} more would pass server.journal.max.bytes ({})",
                inner.file_bytes, l.file_bytes
            ))
        } else {
            None
        }
    }

    /// Journals a batch of operations (one line, fsynced). Operations whose id the journal
    /// already knows are left out (idempotency keys); returns the ones journaled.
    ///
    /// # Errors
    /// [`JournalError::Io`]: nothing was accepted.
    pub async fn accept(
        self: &Arc<Self>,
        ops: Vec<Operation>,
    ) -> Result<Vec<Operation>, JournalError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.accept_blocking(ops))
            .await
            .unwrap_or_else(|e| {
                Err(JournalError::Io {
                    path: self.path.clone(),
                    source: std::io::Error::other(e.to_string()),
                })
            })
    }

    fn accept_blocking(&self, ops: Vec<Operation>) -> Result<Vec<Operation>, JournalError> {
        if let Some(why) = self.problem() {
            return Err(JournalError::Io {
                path: self.path.clone(),
                source: std::io::Error::other(format!(
                    "{why}; nothing new is accepted until it can"
                )),
            });
        }
        let mut inner = self.lock();
        let mut seen = std::collections::HashSet::new();
        // Accepted now, in the journal's order: the time each one keeps (in its dead letter and
        // the document's stamp) so that replays apply one document's writes in this order.
        let fresh: Vec<Operation> = ops
            .into_iter()
            .filter(|op| !inner.entries.contains_key(&op.id) && seen.insert(op.id))
            .map(|op| op.with_accepted(zkguard::write::ops::acceptance_now()))
            .collect();
        if fresh.is_empty() {
            return Ok(fresh);
        }
        let line = serde_json::to_string(&Record::Accepted { ops: fresh.clone() })
            .map_err(|e| io(&self.path)(std::io::Error::other(e)))?;
        let size = line.len() as u64 + 1;
        let mut full = Self::beyond(&inner, fresh.len(), size);
        // The file may be full of lines that compaction drops (finished operations' batches).
        if full.is_some()
            && inner.file_bytes + size > inner.limits.file_bytes
            && (inner.appended > 0 || inner.compacting.is_some())
        {
            if let Err(e) = self.compact(&mut inner) {
                tracing::warn!(error = %e, "journal compaction failed");
            }
            full = Self::beyond(&inner, fresh.len(), size);
        }
        if let Some(what) = full {
            return Err(JournalError::Full { what });
        }
        let seq = self.append(&mut inner, &line)?;
        let share = size.div_ceil(fresh.len() as u64);
        let now = Instant::now();
        for op in &fresh {
            inner.sizes.insert(op.id, share);
            inner.queued_bytes += share;
            inner.queued_order.push_back((op.id, now));
            inner.entries.insert(
                op.id,
                Entry {
                    op: Some(Arc::new(op.clone())),
                    finished: None,
                },
            );
        }
        inner.queued += fresh.len();
        drop(inner);
        if let Err(e) = self.sync_through(seq) {
            // Not durable: the request is refused, so the operations are not queued either.
            let mut inner = self.lock();
            for op in &fresh {
                if inner
                    .entries
                    .get(&op.id)
                    .is_some_and(|e| e.finished.is_none())
                {
                    inner.entries.remove(&op.id);
                    inner.queued -= 1;
                    let share = inner.sizes.remove(&op.id).unwrap_or(0);
                    inner.queued_bytes -= share;
                }
            }
            self.trim(&mut inner);
            return Err(e);
        }
        Ok(fresh)
    }

    /// Records an outcome (fsynced), compacting the journal when it has grown enough.
    ///
    /// # Errors
    /// [`JournalError::Io`]: the outcome is known in memory; after a restart the operation runs
    /// again (and is recognised as applied, or parked again).
    pub async fn finish(self: &Arc<Self>, finished: Finished) -> Result<(), JournalError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.finish_blocking(finished, true))
            .await
            .unwrap_or_else(|e| {
                Err(JournalError::Io {
                    path: self.path.clone(),
                    source: std::io::Error::other(e.to_string()),
                })
            })
    }

    /// Records the outcome of a foreground operation in memory only (it was never journaled:
    /// its caller got the answer).
    pub fn note(&self, finished: Finished) {
        let _ = self.finish_blocking(finished, false);
    }

    fn finish_blocking(&self, finished: Finished, durable: bool) -> Result<(), JournalError> {
        let mut inner = self.lock();
        let result = self.record_finished(&mut inner, finished, durable);
        let due = durable && self.compaction_due(&inner);
        drop(inner);
        let result = match result {
            Ok(Some(seq)) => self.sync_through(seq),
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        if due {
            self.compact_beside();
        }
        result
    }

    /// Records outcomes (one `fsync` for all of them), compacting the journal when it has grown
    /// enough.
    ///
    /// # Errors
    /// As [`Journal::finish`]; every outcome is known in memory either way.
    pub async fn finish_all(self: &Arc<Self>, all: Vec<Finished>) -> Result<(), JournalError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut inner = me.lock();
            let mut last = None;
            let mut failed = None;
            for finished in all {
                match me.record_finished(&mut inner, finished, true) {
                    Ok(seq) => last = seq.or(last),
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
            }
            let due = me.compaction_due(&inner);
            drop(inner);
            let synced = last.map_or(Ok(()), |seq| me.sync_through(seq));
            if due {
                me.compact_beside();
            }
            synced?;
            failed.map_or(Ok(()), Err)
        })
        .await
        .unwrap_or_else(|e| {
            Err(JournalError::Io {
                path: self.path.clone(),
                source: std::io::Error::other(e.to_string()),
            })
        })
    }

    /// Records an outcome in the table and, if `durable`, writes its line; returns the line's
    /// sequence number (not yet durable: see [`Journal::sync_through`]).
    fn record_finished(
        &self,
        inner: &mut Inner,
        mut finished: Finished,
        durable: bool,
    ) -> Result<Option<u64>, JournalError> {
        let id = finished.id;
        if let Some(op) = inner.entries.get(&id).and_then(|e| e.op.as_ref()) {
            if finished.fingerprint.is_none() {
                finished.fingerprint = Some(op.fingerprint());
            }
            if finished.key.is_none() {
                finished.key.clone_from(&op.key);
            }
        }
        let was_queued = inner
            .entries
            .get(&id)
            .is_some_and(|e| e.finished.is_none() && e.op.is_some());
        let result = if durable {
            let line = serde_json::to_string(&Record::Finished(finished.clone()))
                .map_err(|e| io(&self.path)(std::io::Error::other(e)));
            line.and_then(|l| self.append(inner, &l)).map(Some)
        } else {
            Ok(None)
        };
        if was_queued {
            inner.queued -= 1;
            let share = inner.sizes.remove(&id).unwrap_or(0);
            inner.queued_bytes -= share;
        }
        inner.entries.insert(
            id,
            Entry {
                op: None,
                finished: Some(finished),
            },
        );
        inner.finished_order.push_back(id);
        self.trim(inner);
        self.outcomes.send_modify(|n| *n += 1);
        result
    }

    /// Writes one line (not yet durable: see [`Journal::sync_through`]); returns its sequence
    /// number.
    fn append(&self, inner: &mut Inner, line: &str) -> Result<u64, JournalError> {
        if self.memory {
            inner.written += 1;
            return Ok(inner.written);
        }
        let err = io(&self.path);
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        (&*inner.file).write_all(&bytes).map_err(&err)?;
        if let Some(running) = inner.compacting.as_mut() {
            running.tail.push(line.to_string());
        }
        inner.file_bytes += bytes.len() as u64;
        inner.appended += 1;
        inner.written += 1;
        Ok(inner.written)
    }

    fn sync_state(&self) -> std::sync::MutexGuard<'_, SyncState> {
        self.sync.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Returns once line `seq` is durable: at once when an `fsync` that started after it was
    /// written has ended, else after an `fsync` of its own, which covers every line written
    /// so far. Called without the journal's table lock, so that other requests write their
    /// lines meanwhile; `fsync`s of several callers run at the same time, and the kernel
    /// completes them with one commit of the file system's journal.
    fn sync_through(&self, seq: u64) -> Result<(), JournalError> {
        if self.memory || self.sync_state().synced >= seq {
            return Ok(());
        }
        // Every line written up to now is covered by this fsync.
        let (target, file) = {
            let inner = self.lock();
            (inner.written, inner.file.clone())
        };
        let started = Instant::now();
        let result = file.sync_data();
        let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let mut state = self.sync_state();
        state.fsyncs += 1;
        state.fsync_us = state.fsync_us.saturating_add(took);
        if result.is_ok() {
            state.synced = state.synced.max(target);
        }
        drop(state);
        result.map_err(io(&self.path))
    }

    /// How many `fsync`s of appended lines were made (compactions not counted).
    #[cfg(test)]
    fn fsyncs(&self) -> u64 {
        self.sync_state().fsyncs
    }

    /// The `fsync`s of appended lines made so far, and their time in microseconds.
    pub fn sync_stats(&self) -> (u64, u64) {
        let state = self.sync_state();
        (state.fsyncs, state.fsync_us)
    }

    /// Forgets the oldest outcomes beyond [`KEEP_FINISHED`].
    fn trim(&self, inner: &mut Inner) {
        while inner.finished_order.len() > KEEP_FINISHED {
            if let Some((old, last)) = inner.finished_order.pop_front() {
                if last
                    && inner
                        .entries
                        .get(&old)
                        .is_some_and(|e| e.finished.is_some())
                {
                    inner.entries.remove(&old);
                }
            }
        }
        while inner
            .queued_order
            .front()
            .is_some_and(|(id, _)| inner.entries.get(id).is_none_or(|e| e.finished.is_some()))
        {
            inner.queued_order.pop_front();
        }
    }
}

mod uuid_str {
    use serde::{Deserialize, Deserializer, Serializer};
    use uuid::Uuid;

    pub fn serialize<S: Serializer>(id: &Uuid, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(id)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Uuid, D::Error> {
        let s = String::deserialize(d)?;
        Uuid::parse_str(&s).map_err(serde::de::Error::custom)
    }
}

mod compact;
mod finished;
pub mod kafka;
mod memory;
use finished::FinishedOrder;
#[cfg(test)]
mod tests;
