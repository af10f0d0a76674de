//! Bulk acquisition: the fast paths of a session's concurrent acquisitions go to ZooKeeper
//! together, in one multi.
//!
//! The fast path takes a quiet monitor in one multi of six operations (see
//! `protocol::acquire::queue`). A background job over many objects (the gate's `_bulk`, the
//! service's lanes, a library user's tasks) starts many acquisitions at once; sent one by one,
//! each is one ZooKeeper transaction, and the job is bounded by ZooKeeper's write rate. Here the
//! fast paths that a session's acquisitions ask for while [`MAX_SENDERS`] multis are on their
//! way wait for one to end and then go out together, as one multi: one transaction for up to
//! [`MAX_GROUPS`] monitors. A few concurrent acquisitions wait for nothing.
//!
//! Before a multi of several fast paths, the monitors this session did not see lately are
//! read in one multi of reads (not a transaction): a monitor with nodes is busy, and its
//! acquisition is told so at once, as if its multi had failed, and queues; a monitor that does
//! not exist goes in the multi created fresh (the fast path without its delete: the monitor
//! node, the queue node, the mutex, the monitor's data, the lock root's), which is what the
//! acquisition would do anyway (create the monitor, then its fast path) with nothing in
//! between; an empty one goes
//! with its fast path as is. A guess proved wrong by the multi (the monitor was made, filled or
//! reaped meanwhile) is corrected once and that fast path goes again, after the other monitors
//! of the multi are read again. Without the reads, a multi of fast paths on monitors never
//! used before, or reaped since, would fail on each one in turn.
//!
//! A multi is all or nothing. When one monitor's part fails (the monitor is held or has
//! contenders queued: its delete finds it not empty), ZooKeeper names the failed operation:
//! that acquisition gets its own failure, exactly as if it had sent its fast path alone, and
//! queues as usual; the others go again in the next multi. A lost answer is every
//! acquisition's: each recovers on its own, searching its monitor for its attempt id. Two
//! acquisitions of one monitor never share a multi (the second would fail on the first's
//! nodes), so every acquisition sees exactly what its own fast path would have seen alone.
//!
//! A multi holds fast paths up to `zookeeper.max.request.bytes` of operations (`zk::request_size`):
//! ZooKeeper closes the connection of a request beyond its `jute.maxbuffer`, and every request
//! in flight on it would be lost. A fast path too large to go alone is refused, not sent (an
//! acquisition checks that its own requests fit before it sends any).
//!
//! The locks taken by one multi share its zxid, hence their fencing token: tokens are unique
//! per monitor and grow with the order of its holds, which is what fencing needs (see
//! `docs/zookeeper-lock.md`, "Bulk acquisition").

use std::collections::HashSet;
use std::sync::{Arc, Mutex as StdMutex};

use tokio::sync::{mpsc, oneshot};
use tracing::debug;
use zookeeper_client::{Client, MultiReadResult};

use super::driver::{add_ops, code, multi_reply};
use super::node::Paths;
use super::protocol::{Code, MultiError, Op, OpResult, Reply, Target};
use super::reaper::Reap;
use super::request_size::Limit;

/// The most acquisitions whose fast paths share one multi (six operations each, two of them
/// creates carrying the contender's data); fewer when their bytes reach the session's
/// [`Limit`].
pub(super) const MAX_GROUPS: usize = 128;

/// One acquisition's fast path, waiting to go.
struct Group {
    paths: Paths,
    ops: Vec<Op>,
    bytes: Vec<Vec<u8>>,
    attempt: String,
    reply: oneshot::Sender<Reply>,
    /// The bytes of its operations in a multi (with the monitor's delete: sent fresh, it takes
    /// fewer).
    size: usize,
    /// Sent without its first operation, the monitor's delete: the monitor is believed absent,
    /// and the multi creates it.
    fresh: bool,
    /// Guesses about the monitor proved wrong so far.
    corrected: u8,
}

impl Group {
    /// A fast path that starts with the monitor's delete, which a fresh monitor goes without.
    fn can_go_fresh(&self) -> bool {
        matches!(
            self.ops.first(),
            Some(Op::Delete {
                target: Target::Monitor,
                ..
            })
        ) && self.ops.len() > 1
    }

    /// The operations sent, and their data.
    fn sent(&self) -> (&[Op], &[Vec<u8>]) {
        let skip = usize::from(self.fresh);
        (&self.ops[skip..], &self.bytes[skip.min(self.bytes.len())..])
    }

    /// Corrects a guess about the monitor that the multi's failure `code` at the group's
    /// operation `index` (of those sent) proved wrong; false when it proves nothing of the kind
    /// (or a guess was corrected already): the failure is the acquisition's.
    fn correct(&mut self, index: usize, code: &Code) -> bool {
        let wrong = index == 0
            && self.corrected == 0
            && self.can_go_fresh()
            && match code {
                // Created meanwhile: it goes with its delete.
                Code::NodeExists => self.fresh,
                // Gone: created fresh.
                Code::NoNode => !self.fresh,
                _ => false,
            };
        if wrong {
            self.fresh = !self.fresh;
            self.corrected += 1;
        }
        wrong
    }

    /// The acquisition's reply for the results of the operations sent.
    fn applied(&self, results: Vec<OpResult>) -> Reply {
        let mut mine = Vec::with_capacity(self.ops.len());
        if self.fresh {
            // The monitor did not exist: as if emptied and recreated in the same transaction.
            mine.push(OpResult::Delete);
        }
        mine.extend(results);
        Reply::Multi(Ok(mine))
    }

    /// The acquisition's reply for a failure at operation `index` of those sent, in the terms
    /// of the fast path it asked for.
    fn failed(&self, index: usize, code: Code) -> Reply {
        let (index, code) = match (self.fresh, index, code) {
            (false, index, code) => (index, code),
            // The monitor could not be created, its parent is missing: as if its delete found
            // nothing, so that the acquisition creates what is missing.
            (true, 0, Code::NoNode) => (0, Code::NoNode),
            // Made meanwhile, twice proved wrong: as if its delete found it not empty, so that
            // the acquisition queues (always safe).
            (true, 0, Code::NodeExists) => (0, Code::NotEmpty),
            (true, index, code) => (index + 1, code),
        };
        Reply::Multi(Err(MultiError::Failed { index, code }))
    }
}

#[derive(Default)]
struct State {
    pending: Vec<Group>,
    /// Tasks sending batches, at most [`MAX_SENDERS`]: beyond, new groups wait for one.
    senders: usize,
    /// Monitors this session saw existing lately (a fast path of theirs was applied, or a read
    /// found them): they go in a multi without being read first. One that is gone since (the
    /// container reaper removes empty monitors) is created fresh once the multi says so.
    known: HashSet<String>,
}

/// The most multis of fast paths a session has on their way at once. An acquisition asked for
/// while fewer are on their way goes at once, as without batching (ZooKeeper group-commits the
/// transactions it is sent together to its log anyway): a few concurrent acquisitions, such as
/// foreground writes, wait for nothing. Those asked for while four are on their way wait for
/// one to be answered, and then go together: a burst (a bulk job) is sent in a few large
/// multis. (`zkguard bench --gateway`: with two, the gate's foreground p50 was 1.34-1.51x a
/// write straight to the cluster; with four, 1.35-1.50x; bulk throughput alike.)
const MAX_SENDERS: usize = 4;

/// The most monitors remembered as existing; beyond, the memory starts again.
const MAX_KNOWN: usize = 100_000;

/// The fast paths of one session waiting for the multi they go in.
pub(crate) struct FastPaths {
    state: StdMutex<State>,
    client: Client,
    /// The session's reaper (`zk::reaper`).
    reaper: mpsc::UnboundedSender<Reap>,
    /// The size limit of the session's requests.
    limit: Limit,
}

impl FastPaths {
    /// The fast paths of the session of `client`, whose reaper takes `reaper`'s jobs, in
    /// multis within `limit`.
    pub(super) fn new(
        client: Client,
        reaper: mpsc::UnboundedSender<Reap>,
        limit: Limit,
    ) -> Arc<Self> {
        Arc::new(Self {
            state: StdMutex::new(State::default()),
            client,
            reaper,
            limit,
        })
    }

    fn reap(&self, reap: Reap) {
        if self.reaper.send(reap).is_err() {
            debug!("reaper gone; the session's end removes the nodes");
        }
    }

    fn known(&self, monitor: &str) -> bool {
        self.state
            .lock()
            .expect("fast paths lock")
            .known
            .contains(monitor)
    }

    fn remember(&self, monitors: impl IntoIterator<Item = String>, exist: bool) {
        let mut state = self.state.lock().expect("fast paths lock");
        for monitor in monitors {
            if !exist {
                state.known.remove(&monitor);
                continue;
            }
            if state.known.len() >= MAX_KNOWN {
                state.known.clear();
            }
            state.known.insert(monitor);
        }
    }

    /// Sends the fast path `ops` of the acquisition of `paths` (attempt `attempt`, data
    /// `bytes` per operation) with the others asked for meanwhile, and returns its reply as if
    /// it had gone alone. One that does not fit a request of its own (see [`Limit`]) is
    /// refused, not sent.
    ///
    /// # Cancellation safety
    /// Cancel-safe: a fast path whose acquisition went away before its answer came is searched
    /// for by the session's reaper once the answer is in, so that nothing it made outlives it
    /// (the acquisition's own clean-up may have run before the multi was applied).
    pub(super) async fn send(
        self: &Arc<Self>,
        paths: &Paths,
        ops: Vec<Op>,
        bytes: Vec<Vec<u8>>,
        attempt: &str,
    ) -> Reply {
        let size = self.limit.ops(paths, &ops, &bytes);
        if !self.limit.fits(size) {
            let detail = self.limit.too_large("the acquisition's fast path", size);
            return Reply::Multi(Err(MultiError::Request(Code::Other(detail))));
        }
        let (tx, rx) = oneshot::channel();
        let group = Group {
            paths: paths.clone(),
            ops,
            bytes,
            attempt: attempt.to_string(),
            reply: tx,
            size,
            fresh: false,
            corrected: 0,
        };
        let start = {
            let mut state = self.state.lock().expect("fast paths lock");
            state.pending.push(group);
            let start = state.senders < MAX_SENDERS;
            if start {
                state.senders += 1;
            }
            start
        };
        if start {
            let fast_paths = self.clone();
            tokio::spawn(async move { drain(&fast_paths).await });
        }
        rx.await.unwrap_or_else(|_| {
            Reply::Multi(Err(MultiError::Request(Code::Other(
                "the session's fast-path sender stopped".into(),
            ))))
        })
    }
}

/// Sends what is pending, batch after batch, until nothing is.
async fn drain(fp: &Arc<FastPaths>) {
    loop {
        let batch = {
            let mut state = fp.state.lock().expect("fast paths lock");
            let batch = take_batch(&mut state.pending, fp.limit.budget());
            if batch.is_empty() {
                state.senders -= 1;
                return;
            }
            batch
        };
        send_batch(fp, batch).await;
    }
}

/// Up to [`MAX_GROUPS`] pending groups of `budget` bytes in all, at most one per monitor, in
/// the order they came.
fn take_batch(pending: &mut Vec<Group>, budget: usize) -> Vec<Group> {
    take_per_monitor(pending, MAX_GROUPS, budget, |g| (&g.paths.monitor, g.size))
}

/// Up to `max` of `pending` whose sizes add up to at most `budget` bytes (the first one taken
/// whatever its size), at most one per monitor (`part_of` gives a group's monitor and size), in
/// the order they came; the rest stay pending (shared with `zk::release_batch`).
pub(super) fn take_per_monitor<G>(
    pending: &mut Vec<G>,
    max: usize,
    budget: usize,
    part_of: impl Fn(&G) -> (&String, usize),
) -> Vec<G> {
    let mut monitors = HashSet::new();
    let mut batch = Vec::new();
    let mut rest = Vec::new();
    let mut used = 0;
    for group in pending.drain(..) {
        let (monitor, size) = part_of(&group);
        let fits = batch.is_empty() || used + size <= budget;
        if batch.len() < max && fits && monitors.insert(monitor.clone()) {
            used += size;
            batch.push(group);
        } else {
            rest.push(group);
        }
    }
    *pending = rest;
    batch
}

/// Which part of a multi made of parts of `lens` operations, in order, holds operation `index`
/// (the one ZooKeeper names as failed), and the index of that part's first operation; `None`
/// past the end (shared with `zk::release_batch`).
pub(super) fn failed_part(
    lens: impl IntoIterator<Item = usize>,
    index: usize,
) -> Option<(usize, usize)> {
    let mut offset = 0;
    for (at, len) in lens.into_iter().enumerate() {
        if index < offset + len {
            return Some((at, offset));
        }
        offset += len;
    }
    None
}

/// Sends `batch` as one multi; a group whose own part failed gets that failure and leaves, the
/// others go again, until the multi is applied or fails as a whole.
async fn send_batch(fp: &Arc<FastPaths>, mut batch: Vec<Group>) {
    if batch.len() > 1 {
        survey(fp, &mut batch, false).await;
    }
    while !batch.is_empty() {
        // Groups whose acquisition went away before they were sent are not sent.
        batch.retain(|g| !g.reply.is_closed());
        if batch.is_empty() {
            return;
        }
        let result = {
            let mut multi = fp.client.new_multi_writer();
            let added = batch.iter().try_for_each(|g| {
                let (ops, bytes) = g.sent();
                add_ops(&mut multi, &g.paths, ops, bytes)
            });
            match added {
                Ok(()) => multi_reply(multi.commit().await),
                Err(e) => Reply::Multi(Err(MultiError::Request(code(&e)))),
            }
        };
        let sent = batch.len();
        match result {
            Reply::Multi(Ok(results)) => {
                if sent > 1 {
                    debug!(acquisitions = sent, "fast paths taken in one multi");
                }
                fp.remember(batch.iter().map(|g| g.paths.monitor.clone()), true);
                let mut results = results.into_iter();
                for group in batch.drain(..) {
                    let mine: Vec<OpResult> = results.by_ref().take(group.sent().0.len()).collect();
                    let reply = group.applied(mine);
                    deliver(fp, group, reply);
                }
            }
            Reply::Multi(Err(MultiError::Failed { index, code })) => {
                // The failed operation's group: its guess about the monitor corrected, or its
                // failure, at its own index.
                let Some((at, offset)) = failed_part(batch.iter().map(|g| g.sent().0.len()), index)
                else {
                    let detail = format!(
                        "a multi of {sent} fast paths failed at operation {index}, past its end"
                    );
                    fail_all(fp, batch, &detail);
                    return;
                };
                if code == Code::NoNode && index == offset {
                    fp.remember([batch[at].paths.monitor.clone()], false);
                }
                if !batch[at].correct(index - offset, &code) {
                    let group = batch.remove(at);
                    let reply = group.failed(index - offset, code);
                    deliver(fp, group, reply);
                }
                // A monitor was not as believed: others may not be either (the container
                // reaper removes empty monitors; contenders come and go). Read them all before
                // the next multi, rather than find them one failed multi at a time.
                if batch.len() > 1 {
                    survey(fp, &mut batch, true).await;
                }
            }
            other => {
                // Lost or refused as a whole: any of them may have been applied (all or none).
                for group in batch.drain(..) {
                    deliver(fp, group, other.clone());
                }
            }
        }
    }
}

/// Reads the monitors of `batch` (`all`, or those this session did not see lately), in one request:
/// a busy one's acquisition is told at once (it queues), an absent one goes fresh (the multi
/// creates it), an empty one with its fast path as asked.
async fn survey(fp: &FastPaths, batch: &mut Vec<Group>, all: bool) {
    let read: Vec<usize> = (0..batch.len())
        .filter(|&i| all || !fp.known(&batch[i].paths.monitor))
        .collect();
    if read.is_empty() {
        return;
    }
    // One request for all of them (a multi of reads, ZooKeeper 3.6+: each read answers on its
    // own, a missing monitor with its own NoNode), not one per monitor. It is smaller than the
    // multi of their fast paths, which fits the session's limit: each fast path has several
    // operations on its monitor's path, each larger than a read of it.
    let listed: Vec<Result<Vec<String>, zookeeper_client::Error>> = {
        let mut reader = fp.client.new_multi_reader();
        let added = read
            .iter()
            .try_for_each(|&i| reader.add_get_children(&batch[i].paths.monitor));
        let answer = match added {
            Ok(()) => reader.commit().await,
            Err(e) => Err(e),
        };
        match answer {
            Ok(results) if results.len() == read.len() => results
                .into_iter()
                .map(|r| match r {
                    MultiReadResult::Children { children } => Ok(children),
                    MultiReadResult::Error { err } => Err(err),
                    _ => Err(zookeeper_client::Error::UnexpectedError(
                        "a read of children answered with something else".into(),
                    )),
                })
                .collect(),
            // Not answered, or answered for other reads: every monitor unknown, as it is.
            answer => {
                let error =
                    answer.map_or_else(|e| e.to_string(), |r| format!("{} answers", r.len()));
                debug!(%error, monitors = read.len(), "reading the monitors of a batch failed; they go as they are");
                return;
            }
        }
    };
    let mut busy = Vec::new();
    let mut existing = Vec::new();
    let mut absent = Vec::new();
    for (&i, children) in read.iter().zip(listed).rev() {
        let group = &mut batch[i];
        match children {
            Ok(children) if !children.is_empty() => {
                existing.push(group.paths.monitor.clone());
                busy.push(batch.remove(i));
            }
            Ok(_) => {
                existing.push(group.paths.monitor.clone());
                group.fresh = false;
            }
            Err(zookeeper_client::Error::NoNode) if group.can_go_fresh() => {
                absent.push(group.paths.monitor.clone());
                group.fresh = true;
            }
            // Unknown: as it is (the multi says).
            _ => {}
        }
    }
    fp.remember(existing, true);
    fp.remember(absent, false);
    for group in busy {
        // As the fast path would have found it: its delete refused, the monitor not empty.
        let reply = Reply::Multi(Err(MultiError::Failed {
            index: 0,
            code: Code::NotEmpty,
        }));
        deliver(fp, group, reply);
    }
}

fn fail_all(fp: &FastPaths, batch: Vec<Group>, detail: &str) {
    for group in batch {
        let reply = Reply::Multi(Err(MultiError::Request(Code::Other(detail.to_string()))));
        deliver(fp, group, reply);
    }
}

/// Hands `reply` to the group's acquisition; one that went away has the reaper search its
/// monitor for what the multi may have made.
fn deliver(fp: &FastPaths, group: Group, reply: Reply) {
    let applied_or_unknown = !matches!(reply, Reply::Multi(Err(MultiError::Failed { .. })));
    if group.reply.send(reply).is_err() && applied_or_unknown {
        debug!(monitor = %group.paths.monitor, "acquisition gone before its fast path's answer; reaping what it made");
        fp.reap(Reap {
            queue_node: None,
            mutex: None,
            search: Some((group.paths.monitor.clone(), group.attempt.clone())),
            attempt: group.attempt,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::take_per_monitor;

    #[test]
    fn a_batch_takes_parts_up_to_the_budget_one_per_monitor_in_order() {
        let mut pending: Vec<(String, usize)> = [
            ("a", 40),
            ("b", 40),
            ("a", 10),
            ("c", 30),
            ("d", 20),
            ("e", 300),
        ]
        .into_iter()
        .map(|(m, size)| (m.to_string(), size))
        .collect();
        let mut take = |max| {
            take_per_monitor(&mut pending, max, 100, |g| (&g.0, g.1))
                .into_iter()
                .map(|(m, _)| m)
                .collect::<Vec<_>>()
        };
        // `a` again waits for the next batch, as `c`, which would pass the budget, and `e`.
        assert_eq!(take(128), ["a", "b", "d"]);
        assert_eq!(take(1), ["a"]);
        assert_eq!(take(128), ["c"]);
        // A part larger than the budget goes alone (one that could not fit a request of its
        // own was refused before it was queued).
        assert_eq!(take(128), ["e"]);
        assert!(take(128).is_empty());
    }
}
