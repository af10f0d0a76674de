//! The table of operation states without a file: the Kafka journal's ([`super::kafka`]), whose
//! accepted operations are records of its topic. Its appliers load the operations they read
//! ([`Journal::load`]) and the dispatcher records outcomes as with the file journal.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use uuid::Uuid;
use zkguard::write::ops::Operation;

use super::finished::FinishedOrder;
use super::{Entry, Inner, Journal, Limits, SyncState, COMPACT_EVERY};

impl Journal {
    /// A table that writes nothing: [`Journal::accept`] is not used with it (the Kafka journal
    /// produces instead), [`Journal::load`] queues what an applier read, outcomes are kept in
    /// memory (the last [`super::KEEP_FINISHED`]).
    pub fn in_memory(name: &Path) -> Arc<Journal> {
        let file = std::fs::File::open("/dev/null")
            .or_else(|_| tempfile_like())
            .expect("an empty file to stand for the journal");
        Arc::new(Journal {
            compact_every: COMPACT_EVERY,
            path: name.to_path_buf(),
            sync: Mutex::new(SyncState::default()),
            failing: tokio::sync::watch::channel(None).0,
            outcomes: tokio::sync::watch::channel(0).0,
            memory: true,
            #[cfg(test)]
            compaction_hook: Mutex::new(None),
            inner: Mutex::new(Inner {
                file: Arc::new(file),
                written: 0,
                entries: HashMap::new(),
                queued: 0,
                queued_order: VecDeque::new(),
                finished_order: FinishedOrder::default(),
                appended: 0,
                sizes: HashMap::new(),
                queued_bytes: 0,
                file_bytes: 0,
                limits: Limits::default(),
                compacting: None,
                compaction_generation: 0,
            }),
        })
    }

    /// Queues operations an applier read (no bound is checked: the applier reads ahead only so
    /// far). Returns whether `op` is new here; an operation known already (queued, or finished
    /// with its outcome kept) is left as it is.
    pub fn load(&self, op: &Operation, size: u64) -> bool {
        let mut inner = self.lock();
        if inner.entries.contains_key(&op.id) {
            return false;
        }
        inner.entries.insert(
            op.id,
            Entry {
                op: Some(Arc::new(op.clone())),
                finished: None,
            },
        );
        inner.sizes.insert(op.id, size);
        inner.queued_bytes += size;
        inner.queued += 1;
        inner.queued_order.push_back((op.id, Instant::now()));
        true
    }

    /// Forgets queued operations this instance no longer applies (their partition went to
    /// another instance): their outcome will be the new owner's.
    pub fn forget(&self, ids: &[Uuid]) {
        let mut inner = self.lock();
        for id in ids {
            if inner
                .entries
                .get(id)
                .is_some_and(|e| e.finished.is_none() && e.op.is_some())
            {
                inner.entries.remove(id);
                inner.queued -= 1;
                let share = inner.sizes.remove(id).unwrap_or(0);
                inner.queued_bytes -= share;
            }
        }
        self.trim(&mut inner);
    }
}

/// A file that stands for the journal where `/dev/null` cannot be opened (never written).
fn tempfile_like() -> std::io::Result<std::fs::File> {
    let path = std::env::temp_dir().join(format!("zkguard-journal-table-{}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .read(true)
        .open(&path)?;
    let _ = std::fs::remove_file(&path);
    Ok(file)
}
