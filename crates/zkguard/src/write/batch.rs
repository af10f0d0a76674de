//! Background writes grouped by monitor object and sent to Elasticsearch in shared `_bulk`
//! requests (see [`super::background::BackgroundExecutorBuilder::batch_by_monitor`]).
//!
//! Every monitor with queued attempts has one *lane*: a task that takes the attempts queued for
//! that monitor (oldest first, at most `max_per_lock`, with those queued while the lock was
//! awaited), acquires the monitor's lock once, reads each target document once, computes every
//! write in order on top of the previous one (exactly what the same writes one after another
//! under the lock would send), and hands them to the *bulk writer*. The bulk writer sends
//! whatever the lanes handed it while its previous request was under way as one `_bulk` request
//! (group commit), so one request carries the writes of many monitors. The reads go the same way
//! through the *reader*, as shared `_mget` requests (realtime, as a GET). Each item carries its
//! own lock's fencing token as the external version and gets its own result; once its items are
//! answered, the lane takes the attempts queued meanwhile under a new acquisition, which
//! releases the lock in the same request (`LockService::release_and_acquire`), so foreground
//! contenders queued on the monitor go first; the lock of the last batch is released when the
//! lane's queue is empty.
//!
//! The guarantees are those of [`GuardedWriter::run`] for each attempt: the write is sent only
//! while the lock is held, it is fenced by the token, and the document records the operation id,
//! so a retry or a replay is recognised and not applied twice. Two attempts of one operation id
//! never go in one request: the second waits for the next acquisition, where it sees the first
//! one's stored result. A hard delete is the last write to its document in a request; the writes
//! after it wait for the next acquisition.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::FutureExt;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;
use uuid::Uuid;

use crate::es::{BulkAction, Doc, DocMeta, EsError};
use crate::lock::{Guard, LockRequest};
use crate::write::guarded::{fenced_or, GuardedError, GuardedWriter, Plan, Written};
use crate::write::ops::Operation;

/// How long a lock taken for a batch of fenced writes (a lane of
/// [`super::background::BackgroundExecutorBuilder::batch_by_monitor`], a batch of the gate's `_bulk`) is held
/// before its holder watches it for a forced unlock ([`crate::LockRequest::with_loss_watch_after`]).
/// Such a hold lasts a read and a shared `_bulk` request, often more than the
/// [`crate::zk::MUTEX_WATCH_AFTER`] after which a single write's lock is watched, and every write in it carries the lock's token, so a write
/// sent after an operator removed the lock is refused once the next holder has written. Watching
/// each of them would cost ZooKeeper a read, a watch and its event per lock: with
/// 1,024 operations in flight, about one request per document.
pub const BATCH_LOSS_WATCH_AFTER: Duration = Duration::from_secs(2);

/// Bytes of one shared `_bulk` request, at most, about (the sources as JSON and each item's
/// action line): at the start of Elasticsearch's advice for bulk requests (5 to 15 MB), far
/// below its `http.max_content_length` (100 MB). A request stops taking lanes' writes at this
/// size or at its count of items, whichever comes first; one lane's writes are never split, so a
/// lane whose writes are larger than this goes alone.
pub const BULK_MAX_BYTES: usize = 8 * 1024 * 1024;

/// What a failed release of a lane's lock means to the lane (logged at `warn`).
const RELEASE_FAILED: &str = "releasing the lock after a batch of writes failed";

/// The result of one attempt.
type Attempt = Result<Written, GuardedError>;

/// An attempt put in its monitor's lane ([`Batcher::enqueue`]): where its result will come, or
/// why it could not be queued.
pub(crate) type Enqueued = Result<oneshot::Receiver<Attempt>, GuardedError>;

/// One attempt waiting in its monitor's lane.
struct Queued {
    op: Operation,
    done: oneshot::Sender<Attempt>,
}

/// One lane's share of a grouped request (its writes for the bulk writer, its reads for the
/// reader), and where their results go, one per item, in order.
struct Job<T, R> {
    items: Vec<T>,
    /// About how many bytes the items take in a request (writes; zero for reads).
    bytes: usize,
    /// The lock the items are written under (writes only): checked again just before the
    /// request goes out. Dropped before `done` answers, so that the lane gets its lock back.
    held: Option<Arc<Box<dyn Guard>>>,
    done: oneshot::Sender<Result<Vec<R>, EsError>>,
}

/// How the bulk writer answers a lane whose lock was lost while its writes waited for the
/// request before theirs: not sent.
const NOT_SENT: &str =
    "not sent: the lock was lost while the writes waited for the previous _bulk request";

/// A target document: `(index, id)`.
type Target = (String, String);
type WriteJob = Job<BulkAction, Result<DocMeta, EsError>>;
type ReadJob = Job<Target, Result<Option<Doc>, EsError>>;

/// Where the lanes' time goes, cumulated (see [`super::background::ExecutorStats`]).
#[derive(Debug, Default)]
pub(crate) struct StageCounters {
    /// Lock acquisitions made by lanes.
    pub(crate) acquisitions: AtomicU64,
    /// Attempts applied under them.
    pub(crate) attempts: AtomicU64,
    /// Time spent waiting for those locks, in microseconds.
    pub(crate) lock_wait_us: AtomicU64,
    /// `_mget` requests sent, and their time in microseconds.
    pub(crate) reads: AtomicU64,
    pub(crate) read_us: AtomicU64,
    /// `_bulk` requests sent, their items, and their time in microseconds.
    pub(crate) writes: AtomicU64,
    pub(crate) written: AtomicU64,
    pub(crate) write_us: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The lanes and the bulk writer of one executor.
pub(crate) struct Batcher {
    writer: GuardedWriter,
    pub(crate) stages: Arc<StageCounters>,
    lanes: Mutex<HashMap<String, VecDeque<Queued>>>,
    bulk: OnceLock<mpsc::UnboundedSender<WriteJob>>,
    reads: OnceLock<mpsc::UnboundedSender<ReadJob>>,
    max_per_lock: usize,
    max_bulk: usize,
}

impl Batcher {
    /// Lanes over `writer` (its lock service, store, lock timeout and refresh): at most
    /// `max_per_lock` attempts under one acquisition, at most `max_bulk` writes in one request
    /// (a lane's writes are never split).
    pub(crate) fn new(writer: GuardedWriter, max_per_lock: usize, max_bulk: usize) -> Arc<Self> {
        Arc::new(Self {
            writer,
            stages: Arc::new(StageCounters::default()),
            lanes: Mutex::new(HashMap::new()),
            bulk: OnceLock::new(),
            reads: OnceLock::new(),
            max_per_lock: max_per_lock.max(1),
            max_bulk: max_bulk.max(1),
        })
    }

    fn lanes(&self) -> std::sync::MutexGuard<'_, HashMap<String, VecDeque<Queued>>> {
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One attempt of `op`, as [`GuardedWriter::run`] makes it, in its monitor's lane.
    ///
    /// # Errors
    /// Those of [`GuardedWriter::run`].
    pub(crate) async fn run(self: &Arc<Self>, op: Operation) -> Attempt {
        answer(self.enqueue(op)).await
    }

    /// Puts one attempt of `op` at the end of its monitor's lane now (starting the lane if it
    /// has none), and returns where its result will come: the attempts of one monitor are made
    /// in the order they were put in its lane.
    ///
    /// # Errors
    /// [`GuardedError::Invalid`] for an operation that cannot be applied.
    pub(crate) fn enqueue(self: &Arc<Self>, op: Operation) -> Enqueued {
        op.validate()?;
        let (done, rx) = oneshot::channel();
        let start = {
            let mut lanes = self.lanes();
            match lanes.get_mut(&op.monitor) {
                Some(queue) => {
                    queue.push_back(Queued { op, done });
                    None
                }
                None => {
                    let monitor = op.monitor.clone();
                    lanes.insert(monitor.clone(), VecDeque::from([Queued { op, done }]));
                    Some(monitor)
                }
            }
        };
        if let Some(monitor) = start {
            let me = self.clone();
            let span = tracing::info_span!("background_lane", monitor = %monitor);
            tokio::spawn(
                async move {
                    let lane = std::panic::AssertUnwindSafe(me.lane(&monitor)).catch_unwind();
                    if lane.await.is_err() {
                        // Dropping the queued attempts answers their callers with an error.
                        me.lanes().remove(&monitor);
                        tracing::error!("a background lane stopped unexpectedly; its queued attempts fail and are retried");
                    }
                }
                .instrument(span),
            );
        }
        Ok(rx)
    }

    /// Serves one monitor until its queue is empty. The lock of one batch is released by the
    /// acquisition of the next (`LockService::release_and_acquire`: on ZooKeeper, one request
    /// for both, and the contenders queued meanwhile go first), or once the queue is empty.
    async fn lane(&self, monitor: &str) {
        let mut held: Option<Box<dyn Guard>> = None;
        loop {
            let batch: Option<Vec<Queued>> = {
                let mut lanes = self.lanes();
                match lanes.get_mut(monitor).filter(|q| !q.is_empty()) {
                    Some(queue) => {
                        let n = queue.len().min(self.max_per_lock);
                        Some(queue.drain(..n).collect())
                    }
                    None => {
                        lanes.remove(monitor);
                        None
                    }
                }
            };
            let Some(batch) = batch else {
                if let Some(guard) = held {
                    guard.release().await.detach(RELEASE_FAILED);
                }
                return;
            };
            let (later, guard) = self.apply(monitor, batch, held.take()).await;
            held = guard;
            if !later.is_empty() {
                let mut lanes = self.lanes();
                let queue = lanes.entry(monitor.to_string()).or_default();
                for q in later.into_iter().rev() {
                    queue.push_front(q);
                }
            }
        }
    }

    /// Applies `batch` (all for `monitor`) under one acquisition, which releases `held`;
    /// returns the attempts that must wait for the next one, and the lock, still held.
    async fn apply(
        &self,
        monitor: &str,
        mut batch: Vec<Queued>,
        held: Option<Box<dyn Guard>>,
    ) -> (Vec<Queued>, Option<Box<dyn Guard>>) {
        // Attempts nobody waits for any more (their operation's task was stopped: the service
        // stops the operations of a journal partition it no longer owns) are not written.
        batch.retain(|q| !q.done.is_closed());
        if batch.is_empty() {
            return (Vec::new(), held);
        }
        let first = &batch[0].op;
        let mut request = LockRequest::new(monitor.to_string(), first.info.clone())
            .with_type(first.lock_type)
            .with_loss_watch_after(BATCH_LOSS_WATCH_AFTER);
        if let Some(t) = self.writer.lock_timeout() {
            request = request.with_timeout(t);
        }
        let started = Instant::now();
        let outcome = match held {
            Some(held) => {
                let (release, acquired) =
                    self.writer.locks().release_and_acquire(held, request).await;
                release.detach(RELEASE_FAILED);
                acquired
            }
            None => self.writer.locks().acquire(request).await,
        };
        let guard = match outcome {
            Ok(g) => g,
            Err(e) => {
                let e = GuardedError::Lock(e);
                for q in batch {
                    let _ = q.done.send(Err(e.clone()));
                }
                return (Vec::new(), None);
            }
        };
        let waited = started.elapsed();
        let acquired = Instant::now();
        let token = guard.fencing_token();
        // The attempts queued for this monitor while the lock was awaited join this acquisition.
        {
            let mut lanes = self.lanes();
            if let Some(queue) = lanes.get_mut(monitor) {
                let n = queue
                    .len()
                    .min(self.max_per_lock.saturating_sub(batch.len()));
                batch.extend(queue.drain(..n));
            }
        }
        batch.retain(|q| !q.done.is_closed());
        if batch.is_empty() {
            return (Vec::new(), Some(guard));
        }
        tracing::debug!(
            token,
            attempts = batch.len(),
            waited_ms = waited.as_millis() as u64,
            "lane lock acquired"
        );
        add(&self.stages.acquisitions, 1);
        add(&self.stages.attempts, batch.len() as u64);
        add(&self.stages.lock_wait_us, micros(waited));
        // Shared with the bulk writer while the writes wait there (see `Job::held`).
        let shared = Arc::new(guard);
        let (results, later) = self.write(&shared, batch).await;
        let held = acquired.elapsed();
        for (q, result) in results {
            let _ = q.done.send(result.map(|w| Written { waited, held, ..w }));
        }
        // The bulk writer has let go by now; if not (it stopped mid-way), the lock is released
        // as a dropped guard once it does.
        (later, Arc::try_unwrap(shared).ok())
    }

    /// Reads the target documents, plans every write in order and sends them in the bulk
    /// writer's next request. Returns each attempt with its result, and the attempts left for
    /// the next acquisition.
    async fn write(
        &self,
        shared: &Arc<Box<dyn Guard>>,
        batch: Vec<Queued>,
    ) -> (Vec<(Queued, Attempt)>, Vec<Queued>) {
        let guard: &dyn Guard = shared.as_ref().as_ref();
        let token = guard.fencing_token();
        let mut results: Vec<(Queued, Option<Attempt>)> = Vec::with_capacity(batch.len());
        let mut later = Vec::new();

        // Each target document, read once.
        let mut targets: Vec<Target> = Vec::new();
        let mut seen = HashSet::new();
        for q in &batch {
            let key = (
                q.op.target_index().to_string(),
                q.op.target_id().to_string(),
            );
            if seen.insert(key.clone()) {
                targets.push(key);
            }
        }
        if !guard.is_held() {
            let results = batch
                .into_iter()
                .map(|q| {
                    let e = self.lost(guard, &q.op);
                    (q, Err(e))
                })
                .collect();
            return (results, Vec::new());
        }
        let reads = match self.read(targets.clone()).await {
            Ok(reads) => reads,
            Err(e) => vec![Err(e); targets.len()],
        };
        let mut docs: HashMap<(String, String), DocState> = HashMap::new();
        for (key, read) in targets.into_iter().zip(reads) {
            let read = match read {
                Ok(doc) => self.writer.settled(&key.0, &key.1, doc, token).await,
                Err(e) => Err(e),
            };
            let state = match read {
                Ok(doc) => DocState {
                    meta: doc.as_ref().map(|d| d.meta),
                    source: doc.map(|d| d.source),
                    failed: None,
                    closed: false,
                },
                Err(e) => DocState {
                    source: None,
                    meta: None,
                    failed: Some(GuardedError::Store(e)),
                    closed: false,
                },
            };
            docs.insert(key, state);
        }

        // Every write, in order, on top of the previous ones.
        let mut actions = Vec::new();
        let mut sent: Vec<usize> = Vec::new();
        let mut ids: HashSet<Uuid> = HashSet::new();
        for q in batch {
            let key = (
                q.op.target_index().to_string(),
                q.op.target_id().to_string(),
            );
            let doc = docs.get_mut(&key).expect("every target was read");
            if doc.closed || ids.contains(&q.op.id) {
                later.push(q);
                continue;
            }
            if let Some(e) = &doc.failed {
                let e = e.clone();
                results.push((q, Some(Err(e))));
                continue;
            }
            let written = |meta| Written {
                op_id: q.op.id,
                token,
                applied_token: Some(token),
                meta,
                already_applied: false,
                waited: Duration::ZERO,
                held: Duration::ZERO,
            };
            match self.writer.plan(&q.op, token, doc.source.as_ref()) {
                Err(e) => results.push((q, Some(Err(e)))),
                Ok(Plan::AlreadyApplied { token: applied }) => {
                    tracing::info!(op = %q.op.id, applied_token = ?applied, "the document already records this operation; nothing to write");
                    let w = Written {
                        already_applied: true,
                        applied_token: applied,
                        ..written(doc.meta)
                    };
                    results.push((q, Some(Ok(w))));
                }
                Ok(Plan::Send(action)) => {
                    match &action {
                        BulkAction::Index { source, .. } => doc.source = Some(source.clone()),
                        BulkAction::Delete { .. } => {
                            doc.source = None;
                            doc.closed = true;
                        }
                    }
                    doc.meta = None;
                    ids.insert(q.op.id);
                    actions.push(action);
                    sent.push(results.len());
                    results.push((q, None));
                }
            }
        }

        if !actions.is_empty() {
            let targets: Vec<(String, String)> = actions
                .iter()
                .map(|a| match a {
                    BulkAction::Index { index, id, .. } | BulkAction::Delete { index, id, .. } => {
                        (index.clone(), id.clone())
                    }
                })
                .collect();
            let mut mapped: Vec<&str> = Vec::new();
            for a in &actions {
                if let BulkAction::Index { index, .. } = a {
                    if !mapped.contains(&index.as_str()) {
                        mapped.push(index);
                        self.writer.map_stamp(index).await;
                    }
                }
            }
            // A check before the writes are handed to the bulk writer; it checks again just
            // before its request goes out, since they may wait there behind another lane's.
            if !guard.is_held() {
                for i in &sent {
                    let e = self.lost(guard, &results[*i].0.op);
                    results[*i].1 = Some(Err(e));
                }
            } else {
                match self.send(actions, shared.clone()).await {
                    Ok(items) => {
                        for ((i, item), (index, id)) in sent.iter().zip(items).zip(&targets) {
                            let outcome = match item {
                                // Answered after the lock was lost: the next holder may have
                                // read the document before this write landed.
                                Ok(_) if !guard.is_held() => {
                                    Err(self.writer.lost_during_write(guard, &results[*i].0.op))
                                }
                                Ok(meta) => Ok(Written {
                                    op_id: results[*i].0.op.id,
                                    token,
                                    applied_token: Some(token),
                                    meta: Some(meta),
                                    already_applied: false,
                                    waited: Duration::ZERO,
                                    held: Duration::ZERO,
                                }),
                                Err(e) => Err(fenced_or(
                                    self.writer.store().as_ref(),
                                    e,
                                    index,
                                    id,
                                    token,
                                )
                                .await),
                            };
                            results[*i].1 = Some(outcome);
                        }
                    }
                    Err(EsError::Protocol(m)) if m == NOT_SENT => {
                        for i in &sent {
                            let e = self.lost(guard, &results[*i].0.op);
                            results[*i].1 = Some(Err(e));
                        }
                    }
                    Err(e) => {
                        for i in &sent {
                            results[*i].1 = Some(Err(GuardedError::Store(e.clone())));
                        }
                    }
                }
            }
        }
        (
            results
                .into_iter()
                .map(|(q, r)| (q, r.expect("every attempt has a result")))
                .collect(),
            later,
        )
    }

    /// The error of a write not sent because the lock is no longer held.
    fn lost(&self, guard: &dyn Guard, op: &Operation) -> GuardedError {
        match self.writer.ensure_held(guard, op) {
            Err(e) => e,
            Ok(()) => GuardedError::LockLost {
                monitor: op.monitor.clone(),
                index: op.target_index().to_string(),
                id: op.target_id().to_string(),
                reason: "released".into(),
            },
        }
    }

    /// Hands `actions`, written under `held`, to the bulk writer and waits for their results, in
    /// order (or for [`NOT_SENT`], when the lock was lost before the request went out).
    async fn send(
        &self,
        actions: Vec<BulkAction>,
        held: Arc<Box<dyn Guard>>,
    ) -> Result<Vec<Result<DocMeta, EsError>>, EsError> {
        let tx = self.bulk.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            let (store, refresh) = (self.writer.store().clone(), self.writer.refresh());
            let stages = self.stages.clone();
            tokio::spawn(group_commit(
                rx,
                (self.max_bulk, BULK_MAX_BYTES),
                "_bulk",
                move |actions| {
                    let (store, stages) = (store.clone(), stages.clone());
                    async move {
                        let started = Instant::now();
                        let answer = store.bulk(&actions, refresh).await;
                        add(&stages.writes, 1);
                        add(&stages.written, actions.len() as u64);
                        add(&stages.write_us, micros(started.elapsed()));
                        answer
                    }
                },
            ));
            tx
        });
        let bytes = actions.iter().map(request_bytes).sum();
        submit(tx, (actions, bytes), Some(held), "the bulk writer").await
    }

    /// Hands `targets` to the reader and waits for the documents, in order.
    async fn read(
        &self,
        targets: Vec<Target>,
    ) -> Result<Vec<Result<Option<Doc>, EsError>>, EsError> {
        let tx = self.reads.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            let store = self.writer.store().clone();
            let stages = self.stages.clone();
            tokio::spawn(group_commit(
                rx,
                (self.max_bulk, usize::MAX),
                "_mget",
                move |targets| {
                    let (store, stages) = (store.clone(), stages.clone());
                    async move {
                        let started = Instant::now();
                        let answer = store.mget(&targets).await;
                        add(&stages.reads, 1);
                        add(&stages.read_us, micros(started.elapsed()));
                        answer
                    }
                },
            ));
            tx
        });
        submit(tx, (targets, 0), None, "the reader").await
    }
}

/// The result of an attempt put in a lane ([`Batcher::enqueue`]).
pub(crate) async fn answer(queued: Result<oneshot::Receiver<Attempt>, GuardedError>) -> Attempt {
    queued?.await.unwrap_or_else(|_| {
        Err(GuardedError::Store(EsError::Protocol(
            "the background lane stopped before answering; the attempt is retried".into(),
        )))
    })
}

/// Hands `items` to a grouped sender and waits for their results: one per item, in order
/// ([`group_commit`] answers a job only from a request that answered every item).
async fn submit<T, R>(
    tx: &mpsc::UnboundedSender<Job<T, R>>,
    (items, bytes): (Vec<T>, usize),
    held: Option<Arc<Box<dyn Guard>>>,
    who: &str,
) -> Result<Vec<R>, EsError> {
    let (done, rx) = oneshot::channel();
    let gone = || EsError::Protocol(format!("{who} stopped before answering"));
    tx.send(Job {
        items,
        bytes,
        held,
        done,
    })
    .map_err(|_| gone())?;
    rx.await.map_err(|_| gone())?
}

/// A target document as the lane sees it: as read, then as its planned writes leave it.
struct DocState {
    source: Option<Value>,
    meta: Option<DocMeta>,
    /// The read failed: every write to it fails with this error.
    failed: Option<GuardedError>,
    /// A hard delete is planned: later writes wait for the next acquisition.
    closed: bool,
}

/// Sends the lanes' items (writes, or reads) in grouped requests: everything handed in while
/// the previous request was under way goes in the next one (up to `max`: items, and bytes of
/// writes; a job that would pass either waits for the next request), so one request
/// carries the items of many lanes; each lane gets its own items' results. Just before a
/// request goes out, the lock of each lane's writes is checked again: a lane whose lock was
/// lost while its writes waited is answered [`NOT_SENT`] and its writes stay out. Ends when the
/// executor is dropped.
async fn group_commit<T, R, F, Fut>(
    mut rx: mpsc::UnboundedReceiver<Job<T, R>>,
    (max, max_bytes): (usize, usize),
    what: &'static str,
    mut call: F,
) where
    F: FnMut(Vec<T>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<R>, EsError>>,
{
    let mut carried = None;
    loop {
        let first = match carried.take() {
            Some(job) => job,
            None => match rx.recv().await {
                Some(job) => job,
                None => break,
            },
        };
        let (mut count, mut bytes) = (first.items.len(), first.bytes);
        let mut jobs = vec![first];
        while count < max && bytes < max_bytes {
            match rx.try_recv() {
                Ok(job) if count + job.items.len() > max || bytes + job.bytes > max_bytes => {
                    carried = Some(job);
                    break;
                }
                Ok(job) => {
                    count += job.items.len();
                    bytes += job.bytes;
                    jobs.push(job);
                }
                Err(_) => break,
            }
        }
        let mut items = Vec::with_capacity(count);
        let mut answers = Vec::with_capacity(jobs.len());
        for Job {
            items: mine,
            held,
            done,
            ..
        } in jobs
        {
            if held.is_some_and(|g| !g.is_held()) {
                tracing::warn!("{NOT_SENT}");
                let _ = done.send(Err(EsError::Protocol(NOT_SENT.into())));
                continue;
            }
            answers.push((mine.len(), done));
            items.extend(mine);
        }
        if answers.is_empty() {
            continue;
        }
        tracing::debug!(items = items.len(), lanes = answers.len(), "{what} request");
        let asked = items.len();
        match call(items).await {
            Ok(results) if results.len() == asked => {
                let mut results = results.into_iter();
                for (n, done) in answers {
                    let _ = done.send(Ok(results.by_ref().take(n).collect()));
                }
            }
            Ok(results) => {
                let e = EsError::Protocol(format!(
                    "{what} answered {} items for {asked}",
                    results.len()
                ));
                for (_, done) in answers {
                    let _ = done.send(Err(e.clone()));
                }
            }
            Err(e) => {
                for (_, done) in answers {
                    let _ = done.send(Err(e.clone()));
                }
            }
        }
    }
}

/// About how many bytes `action` takes in a `_bulk` request: its source as JSON, its index, id
/// and the rest of its action line.
fn request_bytes(action: &BulkAction) -> usize {
    /// Counts what is written to it.
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    /// The action line's keys, version and punctuation, about.
    const ACTION_LINE: usize = 96;
    match action {
        BulkAction::Index {
            index, id, source, ..
        } => {
            let mut n = Count(0);
            // Writing to a counter cannot fail, and a `Value` always serializes.
            let _ = serde_json::to_writer(&mut n, source);
            ACTION_LINE + index.len() + id.len() + n.0 + 1
        }
        BulkAction::Delete { index, id, .. } => ACTION_LINE + index.len() + id.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Queues jobs of `(items, bytes)` and runs [`group_commit`] over them with `max`: the items
    /// of each request sent, and what each job was answered.
    async fn grouped(
        jobs: &[(Vec<u32>, usize)],
        max: (usize, usize),
    ) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut answers = Vec::new();
        for (items, bytes) in jobs {
            let (done, answer) = oneshot::channel();
            tx.send(Job {
                items: items.clone(),
                bytes: *bytes,
                held: None,
                done,
            })
            .unwrap();
            answers.push(answer);
        }
        drop(tx);
        let sent = Arc::new(Mutex::new(Vec::new()));
        let log = sent.clone();
        group_commit(rx, max, "test", move |items: Vec<u32>| {
            log.lock().unwrap().push(items.clone());
            async move { Ok::<_, EsError>(items) }
        })
        .await;
        let mut answered = Vec::new();
        for a in answers {
            answered.push(a.await.unwrap().unwrap());
        }
        let sent = sent.lock().unwrap().clone();
        (sent, answered)
    }

    #[tokio::test]
    async fn a_request_stops_taking_jobs_at_its_bytes_and_the_next_one_takes_them() {
        const MIB: usize = 1024 * 1024;
        let jobs = [
            (vec![1, 2], 5 * MIB),
            (vec![3, 4], 5 * MIB),
            (vec![5], 1024),
            (vec![6], 20 * MIB),
        ];
        let (sent, answered) = grouped(&jobs, (512, BULK_MAX_BYTES)).await;
        assert_eq!(sent, vec![vec![1, 2], vec![3, 4, 5], vec![6]]);
        assert_eq!(answered, vec![vec![1, 2], vec![3, 4], vec![5], vec![6]]);
    }

    #[tokio::test]
    async fn a_request_stops_taking_jobs_at_its_count_of_items() {
        let jobs = [(vec![1, 2], 0), (vec![3, 4], 0), (vec![5], 0)];
        let (sent, answered) = grouped(&jobs, (3, usize::MAX)).await;
        assert_eq!(sent, vec![vec![1, 2], vec![3, 4, 5]]);
        assert_eq!(answered, vec![vec![1, 2], vec![3, 4], vec![5]]);
    }

    #[test]
    fn a_writes_request_bytes_count_its_source() {
        let small = BulkAction::Delete {
            index: "i".into(),
            id: "1".into(),
            condition: crate::es::WriteCondition::Always,
        };
        let big = BulkAction::Index {
            index: "i".into(),
            id: "1".into(),
            source: serde_json::json!({ "text": "x".repeat(10_000) }),
            condition: crate::es::WriteCondition::Always,
        };
        assert!(request_bytes(&big) > 10_000 + request_bytes(&small));
    }
}
