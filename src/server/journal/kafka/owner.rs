//! Partition ownership and the appliers of the Kafka journal.
//!
//! Every second, [`run`] registers this instance as a member of the fleet
//! (`<zookeeper.lock.root>-members/journal-<topic>/<instance>`, ephemeral), lists the members,
//! and balances: partition `p` is preferred by member `p % n` of the sorted list, each member's
//! fair share is `ceil(partitions / n)`. An instance tries the lock of each partition it prefers,
//! and of any other while it owns fewer than its share (a try that never waits); it releases
//! partitions it does not prefer while it owns more than its share (after applying what it
//! read). A dead instance's locks go with its ZooKeeper session: the others take its partitions
//! at their next round, within the session timeout and a second.
//!
//! An applier ([`apply`]) claims its partition's progress with its token, reads records from
//! the committed offset, queues their operations for the dispatcher in partition order, and
//! commits the offset before the first operation not finished, fenced by its token. Its lock
//! lost or its progress written by a newer owner, it stops at once: the dispatcher starts none
//! of its operations any more ([`Owned::may_start`]), those running are stopped, and their
//! outcomes are not recorded ([`Owned::still_ours`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rskafka::client::error::{Error as RsError, ProtocolError};
use rskafka::client::partition::OffsetAt;
use tokio::sync::{watch, Notify};
use uuid::Uuid;
use zkguard::write::ops::Operation;
use zkguard::{Guard, LockError, LockRequest, LockType};

use super::parts::{lock, Part, PartState};
use super::progress::{self, Progress, ProgressError};
use super::{end_offset, KafkaJournal, PartitionStatus};

/// Most operations of one partition read and not finished yet.
const READ_AHEAD: usize = 4096;
/// Most bytes one fetch asks for.
const FETCH_BYTES: i32 = 4 * 1024 * 1024;
/// How long a fetch waits for records that are not there yet.
const FETCH_WAIT_MS: i32 = 100;
/// Least time between two commits of a partition's progress.
const COMMIT_EVERY: Duration = Duration::from_millis(200);
/// How long a partition given up to another instance may take to finish what it read.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);
/// How often ownership is balanced and the status refreshed.
const ROUND: Duration = Duration::from_secs(1);

/// What the appliers need of the service: queueing operations for the dispatcher, and
/// stopping those running (implemented by the service's state).
pub trait Dispatch: Send + Sync + 'static {
    /// Queues operations for the executor, in order.
    fn enqueue(&self, ops: Vec<Operation>);
    /// Stops the operations `ids` if they are running.
    fn abort_ops(&self, ids: &[Uuid]);
}

/// The ZooKeeper group of the fleet's members on `topic` (`ZkSession::members`).
pub fn members_group(topic: &str) -> String {
    format!("journal-{topic}")
}

fn monitor_of(topic: &str, partition: i32) -> String {
    format!("zkguard-journal-{topic}-{partition}")
}

/// Balances ownership and refreshes the status every second until `stop` turns true, then
/// gives every partition up (their progress committed). Started once Elasticsearch answered.
pub async fn run(
    fleet: Arc<KafkaJournal>,
    state: Arc<dyn Dispatch>,
    mut stop: watch::Receiver<bool>,
) {
    if let Err(e) = progress::ensure_index(fleet.store.as_ref(), &fleet.settings.index).await {
        tracing::warn!(index = %fleet.settings.index, error = %e, "cannot create the journal's index; the partitions' progress cannot be committed until it can");
    }
    let group = members_group(&fleet.settings.topic);
    loop {
        if let Err(e) = fleet.session.join_members(&group, &fleet.instance).await {
            tracing::debug!(error = %e, "cannot register as a member of the fleet yet");
        }
        match fleet.session.members(&group).await {
            Ok(members) => {
                balance(&fleet, &state, &members, &stop).await;
                lock(&fleet.status).members = members;
            }
            Err(e) => tracing::debug!(error = %e, "cannot list the fleet's members"),
        }
        refresh_status(&fleet).await;
        tokio::select! {
            _ = tokio::time::sleep(ROUND) => {}
            _ = stop.changed() => break,
        }
    }
    // The appliers see the stop and commit what finished; wait for them a little.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !lock(&fleet.owned.parts).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One round of balancing (see the module documentation).
async fn balance(
    fleet: &Arc<KafkaJournal>,
    state: &Arc<dyn Dispatch>,
    members: &[String],
    stop: &watch::Receiver<bool>,
) {
    let me = fleet.instance.as_str();
    let mut members: Vec<&str> = members.iter().map(String::as_str).collect();
    if !members.contains(&me) {
        members.push(me);
        members.sort_unstable();
    }
    let n = members.len();
    let count = fleet.partitions.len();
    let share = count.div_ceil(n);
    if lock(&fleet.status)
        .members
        .iter()
        .map(String::as_str)
        .ne(members.iter().copied())
    {
        tracing::info!(?members, share, "the fleet's members changed");
    }
    let preferred = |p: i32| members[p as usize % n] == me;
    let owned = fleet.owned.owned();
    let mut keeping: Vec<i32> = owned.iter().filter(|(_, d)| !d).map(|(p, _)| *p).collect();
    if keeping.len() > share {
        let mut extra: Vec<i32> = keeping.iter().copied().filter(|p| !preferred(*p)).collect();
        extra.truncate(keeping.len() - share);
        for p in &extra {
            if let Some(part) = lock(&fleet.owned.parts).get(p) {
                tracing::info!(
                    partition = p,
                    "giving a journal partition up to another instance"
                );
                part.draining.store(true, Ordering::Relaxed);
                part.wake.notify_one();
            }
        }
        keeping.retain(|p| !extra.contains(p));
    }
    for p in 0..count as i32 {
        if owned.iter().any(|(o, _)| *o == p) {
            continue;
        }
        if !preferred(p) && keeping.len() >= share {
            continue;
        }
        if try_own(fleet, state, p, stop).await {
            keeping.push(p);
        }
    }
}

/// Tries partition `p`'s lock once; on success claims its progress and starts its applier.
async fn try_own(
    fleet: &Arc<KafkaJournal>,
    state: &Arc<dyn Dispatch>,
    p: i32,
    stop: &watch::Receiver<bool>,
) -> bool {
    let topic = &fleet.settings.topic;
    let request = LockRequest::new(monitor_of(topic, p), "Journal Partition")
        .with_type(LockType::Background)
        .with_timeout(Duration::ZERO);
    let guard: Arc<dyn Guard> = match fleet.locks.acquire(request).await {
        Ok(g) => Arc::from(g),
        Err(e @ LockError::Timeout { .. }) => {
            tracing::trace!(partition = p, error = %e, "a journal partition's lock is not free");
            return false;
        }
        Err(e) => {
            tracing::debug!(partition = p, error = %e, "cannot try a journal partition's lock");
            return false;
        }
    };
    let token = guard.fencing_token();
    let store = fleet.store.as_ref();
    let index = &fleet.settings.index;
    let claimed = match progress::read(store, index, topic, p).await {
        Ok(found) => {
            let claim = Progress {
                owner: Some(fleet.instance.clone()),
                token,
                ..found
            };
            progress::write(store, index, topic, p, &claim)
                .await
                .map(|()| claim)
        }
        Err(e) => Err(e),
    };
    let claim = match claimed {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(partition = p, error = %e, "cannot claim a journal partition's progress; its lock is released");
            return false;
        }
    };
    let replay_end = end_offset(&fleet.partitions[p as usize], fleet.settings.timeout)
        .await
        .unwrap_or(i64::MAX);
    // Records to read again: the outcomes the previous owner recorded up to its deposition
    // (this claim) are made visible to the searches that look them up (`applied_before`).
    if replay_end > claim.offset {
        if let Err(e) = fleet.store.refresh(index).await {
            tracing::debug!(partition = p, error = %e, "cannot refresh the journal's index before looking up outcomes");
        }
    }
    tracing::info!(
        partition = p,
        token,
        offset = claim.offset,
        "applying a journal partition"
    );
    let generation = fleet.owned.generation.fetch_add(1, Ordering::Relaxed) + 1;
    let part = Arc::new(Part {
        partition: p,
        generation,
        guard,
        state: Mutex::new(PartState {
            next: claim.offset,
            last_accepted: claim.accepted,
            replay_end,
            committed: claim,
            ..PartState::default()
        }),
        wake: Notify::new(),
        draining: AtomicBool::new(false),
    });
    lock(&fleet.owned.parts).insert(p, part.clone());
    tokio::spawn(apply(fleet.clone(), state.clone(), part, stop.clone()));
    true
}

/// Why an applier ended.
#[derive(Debug)]
enum End {
    Lost,
    Deposed,
    GivenUp,
    Shutdown,
}

/// Applies one owned partition until its lock is lost, it is given up, or the service stops.
async fn apply(
    fleet: Arc<KafkaJournal>,
    state: Arc<dyn Dispatch>,
    part: Arc<Part>,
    mut stop: watch::Receiver<bool>,
) {
    let p = part.partition;
    let mut last_commit = Instant::now();
    let mut drain_since: Option<Instant> = None;
    // The first offset missing from the answers, and since when (see `without_hole`).
    let mut hole: Option<(i64, Instant)> = None;
    let end = loop {
        if *stop.borrow() {
            let _ = commit(&fleet, &part, false).await;
            break End::Shutdown;
        }
        if !part.guard.is_held() {
            break End::Lost;
        }
        let draining = part.draining.load(Ordering::Relaxed);
        let waiting = lock(&part.state).inflight.len();
        if draining {
            let since = *drain_since.get_or_insert_with(Instant::now);
            if waiting == 0 || since.elapsed() > DRAIN_LIMIT {
                if let Err(ProgressError::Deposed { .. }) = commit(&fleet, &part, false).await {
                    break End::Deposed;
                }
                break End::GivenUp;
            }
        }
        if !draining && waiting < READ_AHEAD {
            let next = lock(&part.state).next;
            let pc = fleet.partitions[p as usize].clone();
            tokio::select! {
                fetched = fetch(&pc, next, fleet.settings.timeout) => {
                    let fetched = fetched.map(|(records, _)| without_hole(records, next, p, &mut hole));
                    match fetched {
                        Ok(records) if records.is_empty() => {
                            if hole.is_some() {
                                tokio::time::sleep(HOLE_RETRY).await;
                            }
                        }
                        // Nothing read is queued unless this applier is still the owner
                        // (see `still_owner`): once a newer owner claimed the partition, this
                        // one applies nothing.
                        Ok(records) => match still_owner(&fleet, &part).await {
                            Ok(()) => {
                                let known = applied_before(&fleet, &part, &records).await;
                                // The lock still held at this instant: no newer owner exists
                                // (the queueing below does not wait).
                                if !part.guard.is_held() {
                                    break End::Lost;
                                }
                                load(&fleet, state.as_ref(), &part, records, &known);
                            }
                            Err(ProgressError::Deposed { .. }) => break End::Deposed,
                            Err(e) => {
                                tracing::warn!(partition = p, error = %e, "cannot check a journal partition's progress; reading again");
                                tokio::time::sleep(COMMIT_EVERY).await;
                            }
                        },
                        Err(e) => fetch_failed(&fleet, &part, e).await,
                    }
                }
                _ = part.guard.lost() => break End::Lost,
                _ = stop.changed() => continue,
            }
        } else {
            tokio::select! {
                _ = part.wake.notified() => {}
                _ = tokio::time::sleep(COMMIT_EVERY) => {}
                _ = part.guard.lost() => break End::Lost,
                _ = stop.changed() => continue,
            }
        }
        if last_commit.elapsed() >= COMMIT_EVERY {
            last_commit = Instant::now();
            match commit(&fleet, &part, false).await {
                Err(ProgressError::Deposed { .. }) => break End::Deposed,
                Err(e) => {
                    tracing::warn!(partition = p, error = %e, "cannot commit a journal partition's progress; trying again")
                }
                Ok(()) => {}
            }
        }
    };
    finish(&fleet, state.as_ref(), &part, end);
}

/// How long an applier waits for records missing before those a fetch answered (see
/// [`without_hole`]) before it goes on without them.
const HOLE_WAIT: Duration = Duration::from_secs(10);
/// How often it asks again meanwhile.
const HOLE_RETRY: Duration = Duration::from_millis(20);

/// The records of a fetch from `next` on that follow one another from `next`, without a hole.
///
/// A broker may make concurrent appends readable out of order: tansu 0.6 answered a fetch with
/// the records at offsets 630 and 632 and not the one at 631, produced at the same time by
/// another instance and readable a moment later. Taking the answer as it was moved the
/// applier, and the progress it commits, past 631: an acknowledged operation never applied. The
/// records after a hole are left for the next fetch, which starts at the hole; a hole still
/// there after [`HOLE_WAIT`] is taken for records the broker lost (an error names the offsets)
/// and the records after it are taken. Answers with no record from `next` on meanwhile do not
/// start the wait again.
fn without_hole(
    records: Vec<rskafka::record::RecordAndOffset>,
    next: i64,
    p: i32,
    hole: &mut Option<(i64, Instant)>,
) -> Vec<rskafka::record::RecordAndOffset> {
    let mut expected = next;
    let mut taken = Vec::with_capacity(records.len());
    let mut rest = records.into_iter().filter(|r| r.offset >= next).peekable();
    while let Some(r) = rest.next_if(|r| r.offset == expected) {
        expected += 1;
        taken.push(r);
    }
    let Some(after) = rest.peek().map(|r| r.offset) else {
        // A hole is filled once a record at its offset is taken. An answer with nothing from
        // `next` on (empty, timed out, or only the rest of a batch before `next`) says nothing
        // of it: the wait goes on, or a hole some fetches answer so would never be passed.
        if !taken.is_empty() {
            *hole = None;
        }
        return taken;
    };
    tracing::debug!(partition = p, missing = expected, answered = after, "a journal fetch answered records beyond some not readable yet; reading them again from the first missing one");
    if !taken.is_empty() {
        *hole = None;
        return taken;
    }
    let since = match *hole {
        Some((at, since)) if at == expected => since,
        _ => {
            *hole = Some((expected, Instant::now()));
            return Vec::new();
        }
    };
    if since.elapsed() < HOLE_WAIT {
        return Vec::new();
    }
    tracing::error!(partition = p, from = expected, to = after, "journal records missing from the partition for {HOLE_WAIT:?}: taken for records the broker lost; the records after them are applied");
    *hole = None;
    rest.collect()
}

/// Fetches records from `offset`; when there are none, returns after [`FETCH_WAIT_MS`] even if
/// the broker answered at once (not every broker waits as asked). A fetch the broker does not
/// answer within `limit` (`server.journal.kafka.timeout`) reads nothing: the applier asks
/// again instead of waiting on it for ever.
async fn fetch(
    pc: &rskafka::client::partition::PartitionClient,
    offset: i64,
    limit: Duration,
) -> Result<(Vec<rskafka::record::RecordAndOffset>, i64), RsError> {
    let started = Instant::now();
    let asked = pc.fetch_records(offset, 1..FETCH_BYTES, FETCH_WAIT_MS);
    let fetched = match tokio::time::timeout(limit, asked).await {
        Ok(fetched) => fetched?,
        Err(_) => {
            tracing::debug!(
                offset,
                "a journal fetch was not answered in time; asking again"
            );
            (Vec::new(), offset)
        }
    };
    if fetched.0.is_empty() {
        let wait = Duration::from_millis(FETCH_WAIT_MS as u64);
        tokio::time::sleep(wait.saturating_sub(started.elapsed())).await;
    }
    Ok(fetched)
}

/// The operations of `records` read again after a takeover whose outcome the previous owner
/// recorded: not applied again, so that their outcome keeps the token that applied them. The
/// claim refreshed the index ([`try_own`]), so that the search sees every outcome recorded
/// before it.
async fn applied_before(
    fleet: &KafkaJournal,
    part: &Part,
    records: &[rskafka::record::RecordAndOffset],
) -> std::collections::HashSet<Uuid> {
    let replay_end = lock(&part.state).replay_end;
    let ids: Vec<Uuid> = records
        .iter()
        .filter(|r| r.offset < replay_end)
        .filter_map(|r| serde_json::from_slice::<Operation>(r.record.value.as_deref()?).ok())
        .map(|op| op.id)
        .collect();
    if ids.is_empty() {
        return Default::default();
    }
    let s = &fleet.settings;
    progress::with_outcomes(fleet.store.as_ref(), &s.index, &ids)
        .await
        .unwrap_or_else(|e| {
            tracing::debug!(error = %e, "cannot look up outcomes; the operations are applied again (each is recognised in its document)");
            Default::default()
        })
}

/// Loads fetched records: gives each its acceptance time in partition order, queues the
/// operations not known yet.
fn load(
    fleet: &KafkaJournal,
    state: &dyn Dispatch,
    part: &Part,
    records: Vec<rskafka::record::RecordAndOffset>,
    known: &std::collections::HashSet<Uuid>,
) {
    let p = part.partition;
    let mut fresh: Vec<Operation> = Vec::new();
    let mut st = lock(&part.state);
    for r in records {
        if r.offset < st.next {
            continue;
        }
        st.next = r.offset + 1;
        let Some(value) = r.record.value.as_deref() else {
            continue;
        };
        let mut op: Operation = match serde_json::from_slice(value) {
            Ok(op) => op,
            Err(e) => {
                tracing::warn!(partition = p, offset = r.offset, error = %e, "skipping a journal record that is not a zkguard operation");
                continue;
            }
        };
        let at = op.accepted.unwrap_or(0).max(st.last_accepted + 1);
        op.accepted = Some(at);
        st.last_accepted = at;
        st.accepted.insert(r.offset, at);
        if known.contains(&op.id) {
            continue;
        }
        match fleet.table.get(&op.id) {
            Some(e) if e.finished.is_some() => continue,
            // Known and unfinished, but not queued by this applier (an earlier owner here read
            // it): queued again, under this applier, so that it cannot hold the progress back.
            Some(_) => {
                let mut ids = lock(&fleet.owned.ids);
                if ids.get(&op.id) != Some(&(p, part.generation)) {
                    ids.insert(op.id, (p, part.generation));
                    fresh.push(op.clone());
                }
            }
            None => {
                fleet.table.load(&op, value.len() as u64);
                lock(&fleet.owned.ids).insert(op.id, (p, part.generation));
                fresh.push(op.clone());
            }
        }
        st.inflight.insert(r.offset, op.id);
        st.offsets.entry(op.id).or_default().push(r.offset);
        st.monitors.insert(op.id, op.monitor.clone());
    }
    drop(st);
    state.enqueue(fresh);
}

/// A fetch failed: an offset gone from the topic (retention) moves to the earliest one, with
/// an error naming the loss; anything else waits a moment.
async fn fetch_failed(fleet: &KafkaJournal, part: &Part, e: RsError) {
    let p = part.partition;
    if let RsError::ServerError {
        protocol_error: ProtocolError::OffsetOutOfRange,
        ..
    } = e
    {
        let pc = &fleet.partitions[p as usize];
        let earliest = pc.get_offset(OffsetAt::Earliest).await;
        let latest = end_offset(pc, fleet.settings.timeout).await;
        let moved = {
            let mut st = lock(&part.state);
            match (earliest, latest) {
                (Ok(earliest), _) if st.next < earliest => {
                    tracing::error!(partition = p, from = st.next, to = earliest, "journal records were deleted by the topic's retention before they were applied: their operations are lost; raise the topic's retention.ms");
                    st.next = earliest;
                    true
                }
                // Records from the end on were lost by the broker, and the records it appends
                // from now on get those offsets: they are read from the end (those applied
                // already are recognised by their outcomes and documents), the progress goes
                // back to the end, and nothing waits for offsets that may never come.
                (_, Ok(latest)) if st.next > latest => {
                    tracing::error!(partition = p, read_up_to = st.next, end = latest, "the journal partition ends before the offset read up to: the broker lost records (a topic deleted and created again, or storage that does not survive a restart); reading again from its end");
                    st.replay_end = st.replay_end.max(st.next);
                    st.next = latest;
                    st.committed.offset = st.committed.offset.min(latest);
                    true
                }
                _ => false,
            }
        };
        if moved {
            if let Err(e) = commit(fleet, part, true).await {
                tracing::warn!(partition = p, error = %e, "cannot commit a journal partition's progress; trying again");
            }
        } else {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        return;
    }
    tracing::debug!(partition = p, error = %e, "cannot fetch journal records yet");
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// Most time since this applier last wrote its partition's progress (fenced by its token)
/// after which [`still_owner`] writes it again before records are queued.
const CHECK_EVERY: Duration = Duration::from_millis(500);

/// Whether this applier may queue the records it read: no newer owner claimed the partition.
///
/// A newer owner claims the progress (writes it with its greater token) only once it holds the
/// partition's lock, that is once this applier's lock has ended: while
/// [`Guard::is_held`](zkguard::Guard::is_held) answers true (the quorum confirmed the session
/// within the grace, so that it cannot have expired), no newer owner can exist, and the caller
/// asks it again right before it queues. The progress document is the second, independent
/// proof: it is written again (fenced) when the last successful write is older than
/// [`CHECK_EVERY`] (a 409 is [`ProgressError::Deposed`]); under load the commits every
/// [`COMMIT_EVERY`] keep it fresh, so that a batch read costs no Elasticsearch request. A
/// process paused longer than that (SIGSTOP) finds its lock lost (the grace ran out while it
/// was stopped) and its last write too old: it checks, and queues nothing.
async fn still_owner(fleet: &KafkaJournal, part: &Part) -> Result<(), ProgressError> {
    let recent = lock(&part.state)
        .written_at
        .is_some_and(|at| at.elapsed() < CHECK_EVERY);
    if recent && part.guard.is_held() {
        return Ok(());
    }
    commit(fleet, part, true).await
}

/// Commits the offset before the first unfinished record (if it moved, or always with
/// `check`: then the write checks the token against the progress), fenced by the token.
async fn commit(fleet: &KafkaJournal, part: &Part, check: bool) -> Result<(), ProgressError> {
    let progress = {
        let st = lock(&part.state);
        let offset = st.inflight.keys().next().copied().unwrap_or(st.next);
        let offset = offset.max(st.committed.offset);
        if offset == st.committed.offset && !check {
            return Ok(());
        }
        let accepted = st
            .accepted
            .range(..offset)
            .next_back()
            .map_or(st.committed.accepted, |(_, a)| *a);
        Progress {
            offset,
            accepted,
            owner: Some(fleet.instance.clone()),
            token: part.guard.fencing_token(),
        }
    };
    if !part.guard.is_held() {
        return if check {
            Err(ProgressError::Deposed {
                partition: part.partition,
                token: part.guard.fencing_token(),
            })
        } else {
            Ok(())
        };
    }
    let s = &fleet.settings;
    // Taken before the request: the write proves no newer owner had claimed by then.
    let written_at = Instant::now();
    progress::write(
        fleet.store.as_ref(),
        &s.index,
        &s.topic,
        part.partition,
        &progress,
    )
    .await?;
    let mut st = lock(&part.state);
    let head = st.inflight.iter().next();
    tracing::debug!(
        partition = part.partition,
        offset = progress.offset,
        next = st.next,
        inflight = st.inflight.len(),
        ?head,
        "committed a journal partition's progress"
    );
    let keep_from = progress.offset - 1;
    st.accepted = st.accepted.split_off(&keep_from);
    st.committed = progress;
    st.written_at = Some(written_at);
    Ok(())
}

/// An applier ended: its partition is no longer owned here; the operations it read and did not
/// finish are forgotten (the next owner applies them) and those running are stopped.
fn finish(fleet: &KafkaJournal, state: &dyn Dispatch, part: &Part, end: End) {
    let p = part.partition;
    {
        let mut parts = lock(&fleet.owned.parts);
        if parts
            .get(&p)
            .is_some_and(|o| o.generation == part.generation)
        {
            parts.remove(&p);
        }
    }
    // Operations queued again by a newer applier of the partition here are its own.
    let ids: Vec<Uuid> = {
        let mine = lock(&part.state)
            .offsets
            .keys()
            .copied()
            .collect::<Vec<_>>();
        let mut all = lock(&fleet.owned.ids);
        mine.into_iter()
            .filter(|id| match all.get(id) {
                Some(&(q, g)) if (q, g) == (p, part.generation) => {
                    all.remove(id);
                    true
                }
                Some(_) => false,
                None => true,
            })
            .collect()
    };
    fleet.table.forget(&ids);
    state.abort_ops(&ids);
    match end {
        End::Lost | End::Deposed => {
            tracing::warn!(partition = p, reason = ?end, unfinished = ids.len(), "a journal partition is no longer owned here: its applier stopped (another instance applies it)")
        }
        End::GivenUp | End::Shutdown => {
            tracing::info!(partition = p, reason = ?end, unfinished = ids.len(), "released a journal partition")
        }
    }
    // The guard goes with the part: its lock is released in the background.
}

/// Refreshes the status: each partition's end, committed offset, owner, lag and oldest
/// unapplied operation; the broker's problem, if it does not answer.
async fn refresh_status(fleet: &KafkaJournal) {
    let s = &fleet.settings;
    let store = fleet.store.as_ref();
    let ids: Vec<(String, String)> = (0..fleet.partitions.len() as i32)
        .map(|p| (s.index.clone(), progress::progress_id(&s.topic, p)))
        .collect();
    let before: Vec<PartitionStatus> = lock(&fleet.status).partitions.clone();
    let progress: Vec<Option<Progress>> = match store.mget(&ids).await {
        Ok(items) => items
            .into_iter()
            .map(|r| {
                r.ok()
                    .flatten()
                    .and_then(|d| serde_json::from_value(d.source).ok())
            })
            .collect(),
        // Elasticsearch does not answer: the last committed offsets seen stand.
        Err(_) => before
            .iter()
            .map(|b| {
                Some(Progress {
                    offset: b.committed_offset,
                    owner: b.owner.clone(),
                    token: b.token.unwrap_or(0),
                    ..Progress::default()
                })
            })
            .chain(std::iter::repeat(None))
            .take(ids.len())
            .collect(),
    };
    let ends =
        futures::future::join_all(fleet.partitions.iter().map(|pc| end_offset(pc, s.timeout)))
            .await;
    let mut problem = None;
    let mut total = 0i64;
    let mut rows = Vec::with_capacity(ends.len());
    for (p, (end, prog)) in ends.into_iter().zip(progress).enumerate() {
        let p = p as i32;
        let end = match end {
            Ok(e) => e,
            Err(e) => {
                problem.get_or_insert(format!("partition {p}'s end offset: {e}"));
                -1
            }
        };
        let here = lock(&fleet.owned.parts).get(&p).cloned();
        let committed = match &here {
            Some(part) => lock(&part.state).committed.offset,
            None => prog.as_ref().map_or(0, |g| g.offset),
        };
        let lag = if end >= 0 {
            (end - committed).max(0)
        } else {
            0
        };
        total += lag;
        let oldest = match &here {
            Some(part) => oldest_here(fleet, part),
            None if lag > 0 => oldest_elsewhere(fleet, p, committed).await,
            None => None,
        };
        let token = match &here {
            Some(part) => Some(part.guard.fencing_token()),
            None => prog.as_ref().map(|g| g.token).filter(|&t| t > 0),
        };
        rows.push(PartitionStatus {
            partition: p,
            owner: match &here {
                Some(_) => Some(fleet.instance.clone()),
                None => prog.and_then(|g| g.owner),
            },
            owned_here: here.is_some(),
            token,
            committed_offset: committed,
            end_offset: end.max(0),
            lag,
            oldest_unapplied_age: oldest,
        });
    }
    fleet.lag.store(total, Ordering::Relaxed);
    fleet.set_problem(problem.map(|p| format!("the broker does not answer ({p})")));
    lock(&fleet.status).partitions = rows;
}

fn age_of(accepted_micros: u64) -> Duration {
    let now = zkguard::write::ops::acceptance_now();
    Duration::from_micros(now.saturating_sub(accepted_micros))
}

fn oldest_here(fleet: &KafkaJournal, part: &Part) -> Option<Duration> {
    let id = {
        let st = lock(&part.state);
        *st.inflight.values().next()?
    };
    let op = fleet.table.get(&id)?.op?;
    op.accepted.map(age_of)
}

async fn oldest_elsewhere(fleet: &KafkaJournal, p: i32, committed: i64) -> Option<Duration> {
    oldest_at(
        &fleet.partitions[p as usize],
        committed,
        fleet.settings.timeout,
    )
    .await
}

/// How long ago the operation at offset `committed` of a partition (the oldest not applied yet)
/// was accepted, read from the broker within `timeout`; `None` when it cannot be read. The
/// service's status and `zkguard journal` both measure the age this way.
pub async fn oldest_at(
    pc: &rskafka::client::partition::PartitionClient,
    committed: i64,
    timeout: Duration,
) -> Option<Duration> {
    let fetched = tokio::time::timeout(
        timeout,
        // Not 0: tansu answers a fetch that may not wait with no partition at all.
        pc.fetch_records(committed, 1..FETCH_BYTES, 1),
    )
    .await
    .ok()?
    .ok()?;
    let first = fetched.0.into_iter().find(|r| r.offset >= committed)?;
    let op: Operation = serde_json::from_slice(first.record.value.as_deref()?).ok()?;
    op.accepted.map(age_of)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rskafka::record::{Record, RecordAndOffset};

    fn at(offsets: &[i64]) -> Vec<RecordAndOffset> {
        offsets
            .iter()
            .map(|&offset| RecordAndOffset {
                record: Record {
                    key: None,
                    value: Some(Vec::new()),
                    headers: Default::default(),
                    timestamp: chrono::Utc::now(),
                },
                offset,
            })
            .collect()
    }

    fn offsets(records: &[RecordAndOffset]) -> Vec<i64> {
        records.iter().map(|r| r.offset).collect()
    }

    /// A fetch from 628 answered 628 to 630 and 632 (631 produced at the same time and not
    /// readable yet, as tansu answered in a fleet run): 628 to 630 are taken and 632 waits for
    /// the next fetch, from 631. A fetch from 631 answering 632 alone takes nothing until 631
    /// is there; records before `next` (the rest of a batch) are left out.
    #[test]
    fn records_beyond_a_hole_wait_until_it_fills() {
        let mut hole = None;
        let taken = without_hole(at(&[628, 629, 630, 632]), 628, 0, &mut hole);
        assert_eq!(offsets(&taken), vec![628, 629, 630]);
        assert!(without_hole(at(&[632, 633]), 631, 0, &mut hole).is_empty());
        assert_eq!(hole.map(|(o, _)| o), Some(631));
        let taken = without_hole(at(&[630, 631, 632, 633]), 631, 0, &mut hole);
        assert_eq!(offsets(&taken), vec![631, 632, 633]);
        assert_eq!(hole, None);
    }

    /// A hole whose fetches answer now the records after it, now nothing from `next` on (an
    /// empty answer, a fetch timed out, or only the rest of a batch before `next`), as tansu on
    /// S3 answered for offsets a produce conflict took without a record in a fleet run: the
    /// answers without records do not start the wait again, and the hole is passed once it
    /// stayed [`HOLE_WAIT`]. (Before, they did, and the partition was never applied past it.)
    #[test]
    fn a_hole_is_passed_after_a_while_even_when_some_fetches_answer_nothing() {
        let mut hole = Some((1, Instant::now() - HOLE_WAIT - Duration::from_secs(1)));
        assert!(without_hole(at(&[]), 1, 0, &mut hole).is_empty());
        assert!(without_hole(at(&[0]), 1, 0, &mut hole).is_empty());
        assert_eq!(hole.map(|(o, _)| o), Some(1));
        let taken = without_hole(at(&[3, 4]), 1, 0, &mut hole);
        assert_eq!(offsets(&taken), vec![3, 4]);
        assert_eq!(hole, None);
    }

    /// A hole that stays longer than [`HOLE_WAIT`] is taken for records the broker lost: the
    /// records after it are taken.
    #[test]
    fn a_hole_that_does_not_fill_is_passed_after_a_while() {
        let mut hole = Some((10, Instant::now() - HOLE_WAIT - Duration::from_secs(1)));
        let taken = without_hole(at(&[12, 13]), 10, 0, &mut hole);
        assert_eq!(offsets(&taken), vec![12, 13]);
        assert_eq!(hole, None);
    }
}
