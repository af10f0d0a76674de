//! The partitions of the Kafka journal owned by this instance, and which partition each
//! operation they loaded came from: what the dispatcher asks before starting an operation and
//! before recording its outcome (see [`super::owner`]).
//!
//! Outcomes are recorded in each monitor's order ([`Owned::ready`]): an operation's outcome
//! waits until those of the operations of its monitor read before it are recorded. A record a
//! new owner finds applied in its document with no outcome (the previous owner stopped before
//! recording it) gets the token of the write that applied it, as its document tells it (none
//! once later operations were written over it), never the new owner's; in order, no operation of
//! the monitor after it can carry an older owner's token, so in a document's order of operations
//! the outcomes' tokens never decrease.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;
use uuid::Uuid;
use zkguard::Guard;

use super::progress::Progress;
use crate::server::journal::Finished;

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
    /// The monitor of each unfinished operation.
    pub(super) monitors: HashMap<Uuid, String>,
    /// Outcomes known and not recorded yet: they wait for those of their monitor read before.
    pub(super) ready: HashMap<Uuid, Finished>,
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
    /// When this applier last wrote the progress successfully (fenced by its token): no newer
    /// owner had claimed the partition then. `None` until its first write after the claim.
    pub(super) written_at: Option<Instant>,
}

/// The operations of `ready` whose outcome may be recorded now: walking the unfinished
/// records in partition order, an operation is taken when its outcome is known and no record of
/// its monitor before it is waiting (one not known, or known and held back itself).
fn in_monitor_order(
    inflight: &BTreeMap<i64, Uuid>,
    monitors: &HashMap<Uuid, String>,
    ready: &HashMap<Uuid, Finished>,
) -> Vec<Uuid> {
    let mut waiting: HashSet<&str> = HashSet::new();
    let mut taken: HashSet<Uuid> = HashSet::new();
    let mut out = Vec::new();
    for id in inflight.values() {
        let monitor = monitors.get(id).map_or("", String::as_str);
        if ready.contains_key(id) && !waiting.contains(monitor) {
            if taken.insert(*id) {
                out.push(*id);
            }
        } else if !taken.contains(id) {
            waiting.insert(monitor);
        }
    }
    out
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

    /// Takes the outcomes of `all` read from partitions still owned here, and returns those
    /// that may be recorded now, in each monitor's order: every record of the same monitor read
    /// before is finished (recorded now or before). The others wait in their partition for the
    /// outcomes before them (a later call returns them); the outcomes of operations read from
    /// partitions no longer owned here are dropped (their new owner records them).
    pub fn ready(&self, all: &[Finished]) -> Vec<Finished> {
        let mut touched: Vec<Arc<Part>> = Vec::new();
        for f in all {
            let Some((part, generation)) = self.part_of(&f.id) else {
                continue;
            };
            if part.generation != generation || !part.guard.is_held() {
                continue;
            }
            lock(&part.state).ready.insert(f.id, f.clone());
            if !touched.iter().any(|t| Arc::ptr_eq(t, &part)) {
                touched.push(part);
            }
        }
        let mut now = Vec::new();
        for part in touched {
            let mut st = lock(&part.state);
            for id in in_monitor_order(&st.inflight, &st.monitors, &st.ready) {
                now.extend(st.ready.remove(&id));
            }
        }
        now
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
        st.monitors.remove(id);
        st.ready.remove(id);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::journal::OpState;

    fn applied(id: Uuid) -> Finished {
        Finished {
            id,
            status: OpState::Applied,
            reason: None,
            token: Some(1),
            already_applied: false,
            attempts: Some(1),
            fingerprint: None,
            key: None,
        }
    }

    /// Records 0 and 2 are operations of monitor `m`, record 1 of `n`: the outcome of record 2
    /// known first waits for record 0's, while record 1's (another monitor) does not.
    #[test]
    fn an_outcome_waits_for_those_of_its_monitor_read_before_it() {
        let ids: Vec<Uuid> = (0..3).map(|_| Uuid::new_v4()).collect();
        let inflight: BTreeMap<i64, Uuid> = ids
            .iter()
            .enumerate()
            .map(|(o, id)| (o as i64, *id))
            .collect();
        let monitors: HashMap<Uuid, String> = [(ids[0], "m"), (ids[1], "n"), (ids[2], "m")]
            .into_iter()
            .map(|(id, m)| (id, m.to_string()))
            .collect();
        let mut ready: HashMap<Uuid, Finished> = [ids[1], ids[2]]
            .into_iter()
            .map(|id| (id, applied(id)))
            .collect();
        assert_eq!(in_monitor_order(&inflight, &monitors, &ready), vec![ids[1]]);
        ready.insert(ids[0], applied(ids[0]));
        assert_eq!(
            in_monitor_order(&inflight, &monitors, &ready),
            vec![ids[0], ids[1], ids[2]]
        );
        // A record produced twice: the operation's outcome is taken once, at its first record.
        let mut twice = inflight.clone();
        twice.insert(3, ids[0]);
        assert_eq!(
            in_monitor_order(&twice, &monitors, &ready),
            vec![ids[0], ids[1], ids[2]]
        );
    }
}
