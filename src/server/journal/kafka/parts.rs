//! The partitions of the Kafka journal owned by this instance, and which partition each
//! operation they loaded came from: what the dispatcher asks before starting an operation and
//! before recording its outcome (see [`super::owner`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use uuid::Uuid;
use zkguard::Guard;

use super::progress::Progress;

/// The partitions owned here, and which partition each loaded operation came from.
#[derive(Default)]
pub struct Owned {
    pub(super) parts: Mutex<HashMap<i32, Arc<Part>>>,
    pub(super) ids: Mutex<HashMap<Uuid, (i32, u64)>>,
    pub(super) generation: AtomicU64,
}

/// One owned partition.
pub(super) struct Part {
    pub(super) partition: i32,
    pub(super) generation: u64,
    pub(super) guard: Arc<dyn Guard>,
    pub(super) state: Mutex<PartState>,
    pub(super) wake: Notify,
    /// Given up to another instance: finish what was read, then release.
    pub(super) draining: AtomicBool,
}

#[derive(Default)]
pub(super) struct PartState {
    /// Records read and not finished: offset → operation id.
    pub(super) inflight: BTreeMap<i64, Uuid>,
    /// The offsets of each unfinished operation (a record produced twice has two).
    pub(super) offsets: HashMap<Uuid, Vec<i64>>,
    /// Acceptance time given to each record from the last committed one on.
    pub(super) accepted: BTreeMap<i64, u64>,
    /// The next offset to read.
    pub(super) next: i64,
    /// The acceptance time given to the last record read.
    pub(super) last_accepted: u64,
    /// The partition's end when it was claimed: records before it may have been applied by
    /// the previous owner, whose outcomes are looked up before they are queued again.
    pub(super) replay_end: i64,
    /// What was committed last.
    pub(super) committed: Progress,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Owned {
    fn part_of(&self, id: &Uuid) -> Option<(Arc<Part>, u64)> {
        let (p, generation) = *lock(&self.ids).get(id)?;
        lock(&self.parts)
            .get(&p)
            .cloned()
            .map(|part| (part, generation))
    }

    /// Whether the outcome of `id` may be recorded here: it was read from a partition this
    /// instance still owns, under the same lock.
    pub fn still_ours(&self, id: &Uuid) -> bool {
        match self.part_of(id) {
            Some((part, generation)) => part.generation == generation && part.guard.is_held(),
            // Every background operation of the Kafka journal is read from a partition: one
            // no longer listed belonged to a partition given up or lost.
            None => false,
        }
    }

    /// Whether the dispatcher may start `id` (see [`Owned::still_ours`]).
    pub fn may_start(&self, id: &Uuid) -> bool {
        self.still_ours(id)
    }

    /// Notes that `id` finished: its records no longer hold back its partition's progress.
    pub fn done(&self, id: &Uuid, _finished: bool) {
        let Some((p, generation)) = lock(&self.ids).remove(id) else {
            return;
        };
        let Some(part) = lock(&self.parts).get(&p).cloned() else {
            return;
        };
        if part.generation != generation {
            return;
        }
        let mut st = lock(&part.state);
        for offset in st.offsets.remove(id).unwrap_or_default() {
            st.inflight.remove(&offset);
        }
        drop(st);
        part.wake.notify_one();
    }

    pub(super) fn owned(&self) -> Vec<(i32, bool)> {
        lock(&self.parts)
            .values()
            .map(|p| (p.partition, p.draining.load(Ordering::Relaxed)))
            .collect()
    }
}
