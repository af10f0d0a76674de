//! The file sink: dead letters as JSON lines in one file, shared safely by several processes.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use serde::Deserialize;
use uuid::Uuid;

use super::{DeadLetter, DeadLetterError, DeadLetterSink};

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
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use zkguard::write::deadletter::{DeadLetterSink, FileSink};
///
/// let dir = tempfile::tempdir()?;
/// let sink = FileSink::new(dir.path().join("deadletters.jsonl"));
/// // Nothing parked yet (a missing file is an empty sink).
/// assert!(sink.list().await?.is_empty());
/// # Ok(()) }
/// ```
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::LockError;
    use crate::write::deadletter::ParkReason;
    use crate::write::guarded::GuardedError;
    use crate::write::ops::Operation;
    use std::time::{Duration, SystemTime};

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
