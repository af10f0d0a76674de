//! Compaction: the journal rewritten with the kept outcomes and the queued operations.
//!
//! While the service runs, the journal is compacted beside the table instead of under it: the
//! table lock is held only to take a snapshot (outcomes, and the queued operations as shared
//! pointers) and, at the end, to append the lines written meanwhile and rename the new file
//! into place. Accepts and outcomes go on meanwhile; their lines go to the old file, which stays
//! the durable one until the rename, and to the tail that the new file receives before it.
//! At start, for a checkpoint and for an accept that needs the room, the journal is compacted
//! under the lock as before.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use zkguard::write::ops::Operation;

use super::{io, Finished, Inner, Journal, JournalError, Running};

/// A journal line, borrowed: written straight from the table's data.
#[derive(Serialize)]
#[serde(tag = "r", rename_all = "snake_case")]
enum RecordRef<'a> {
    Accepted { ops: OpsRef<'a> },
    Finished(&'a Finished),
}

struct OpsRef<'a>(&'a [Arc<Operation>]);

impl Serialize for OpsRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|o| &**o))
    }
}

/// What a compaction writes: the kept outcomes, oldest first, and the queued operations.
pub(super) struct Snapshot {
    finished: Vec<Finished>,
    queued: Vec<Arc<Operation>>,
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

fn sync_dir(path: &Path) {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

impl Journal {
    pub(super) fn snapshot(inner: &Inner) -> Snapshot {
        let mut seen = std::collections::HashSet::new();
        let finished = inner
            .finished_order
            .iter()
            .filter_map(|id| inner.entries.get(id).and_then(|e| e.finished.as_ref()))
            .filter(|f| seen.insert(f.id))
            .cloned()
            .collect();
        let queued = inner
            .queued_order
            .iter()
            .filter_map(|(id, _)| inner.entries.get(id))
            .filter(|e| e.finished.is_none())
            .filter_map(|e| e.op.clone())
            .collect();
        Snapshot { finished, queued }
    }

    /// Writes `snapshot` to `tmp` (created), synced; returns the open file and its size.
    fn write_snapshot(&self, tmp: &Path, snapshot: &Snapshot) -> Result<(File, u64), JournalError> {
        let err = io(&self.path);
        let file = File::create(tmp).map_err(&err)?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        let mut bytes = 0u64;
        let mut line = Vec::new();
        let mut put = |w: &mut BufWriter<File>, record: &RecordRef<'_>| {
            line.clear();
            serde_json::to_writer(&mut line, record).map_err(|e| err(std::io::Error::other(e)))?;
            line.push(b'\n');
            bytes += line.len() as u64;
            w.write_all(&line).map_err(&err)
        };
        for f in &snapshot.finished {
            put(&mut w, &RecordRef::Finished(f))?;
        }
        if !snapshot.queued.is_empty() {
            put(
                &mut w,
                &RecordRef::Accepted {
                    ops: OpsRef(&snapshot.queued),
                },
            )?;
        }
        let file = w.into_inner().map_err(|e| err(e.into_error()))?;
        file.sync_all().map_err(&err)?;
        Ok((file, bytes))
    }

    /// Puts the written file `tmp` of `bytes` bytes in the journal's place, under the lock.
    fn install(&self, inner: &mut Inner, tmp: &Path, bytes: u64) -> Result<(), JournalError> {
        let err = io(&self.path);
        std::fs::rename(tmp, &self.path).map_err(&err)?;
        sync_dir(&self.path);
        inner.file = Arc::new(
            OpenOptions::new()
                .append(true)
                .open(&self.path)
                .map_err(&err)?,
        );
        inner.file_bytes = bytes;
        // The new file holds (durably) everything written so far.
        let mut state = self.sync_state();
        state.synced = state.synced.max(inner.written);
        Ok(())
    }

    /// Rewrites the journal under the table lock (at start, for a checkpoint, for an accept
    /// that needs the room). A compaction running beside the table is superseded: it finds
    /// itself so at its end and leaves the file alone.
    pub(super) fn compact(&self, inner: &mut Inner) -> Result<(), JournalError> {
        if self.memory {
            return Ok(());
        }
        inner.compacting = None;
        let tmp = sibling(&self.path, ".tmp");
        let (_, bytes) = self.write_snapshot(&tmp, &Self::snapshot(inner))?;
        self.install(inner, &tmp, bytes)?;
        inner.appended = 0;
        Ok(())
    }

    /// Whether the journal has grown enough for a compaction and none is running.
    pub(super) fn compaction_due(&self, inner: &Inner) -> bool {
        !self.memory && inner.appended >= self.compact_every && inner.compacting.is_none()
    }

    /// Compacts the journal beside the table (see the module's documentation), on the calling
    /// thread; failures are logged and the journal keeps growing until the next attempt.
    pub(super) fn compact_beside(&self) {
        let (generation, snapshot) = {
            let mut inner = self.lock();
            if inner.compacting.is_some() {
                return;
            }
            inner.compaction_generation += 1;
            let generation = inner.compaction_generation;
            inner.compacting = Some(Running {
                generation,
                tail: Vec::new(),
            });
            (generation, Self::snapshot(&inner))
        };
        let tmp = sibling(&self.path, ".compacting");
        let written = self.write_snapshot(&tmp, &snapshot);
        drop(snapshot);
        #[cfg(test)]
        if let Some(hook) = self.compaction_hook.lock().unwrap().as_ref() {
            hook();
        }
        let mut inner = self.lock();
        let mine = inner
            .compacting
            .as_ref()
            .is_some_and(|r| r.generation == generation);
        if !mine {
            drop(inner);
            let _ = std::fs::remove_file(&tmp);
            return;
        }
        let tail = inner.compacting.take().map(|r| r.tail).unwrap_or_default();
        let done = written.and_then(|(mut file, bytes)| {
            let err = io(&self.path);
            let mut extra = 0u64;
            for line in &tail {
                file.write_all(line.as_bytes()).map_err(&err)?;
                file.write_all(b"\n").map_err(&err)?;
                extra += line.len() as u64 + 1;
            }
            if !tail.is_empty() {
                file.sync_data().map_err(&err)?;
            }
            self.install(&mut inner, &tmp, bytes + extra)
        });
        match done {
            Ok(()) => inner.appended = tail.len(),
            Err(e) => {
                inner.appended = 0;
                drop(inner);
                let _ = std::fs::remove_file(&tmp);
                tracing::warn!(error = %e, "journal compaction failed; the journal keeps growing until the next attempt");
            }
        }
    }
}
