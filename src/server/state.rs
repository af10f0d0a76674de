//! The service's shared state, its readiness, and the dispatcher that feeds journaled background
//! operations to the executor.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::AbortHandle;
use uuid::Uuid;
use zkguard::config::ServerSettings;
use zkguard::es::EsStore;
use zkguard::write::background::{BackgroundExecutor, Outcome};
use zkguard::write::guarded::GuardedWriter;
use zkguard::write::ops::Operation;
use zkguard::ZkSession;

use super::hub::Hub;
use super::journal::kafka::{JournalStatus, KafkaJournal, PartitionStatus};
use super::journal::{Finished, Journal, OpState};
use super::locks::ExplicitLocks;
use super::metrics::Metrics;

/// The lock backend, as far as readiness is concerned.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The ZooKeeper priority lock, over one session.
    ZooKeeper(ZkSession),
    /// The Elasticsearch lease lock: usable when Elasticsearch answers.
    Elasticsearch(zkguard::eslock::EsLockService),
}

/// Everything the handlers share.
#[derive(Debug)]
pub struct AppState {
    /// Foreground writes (one attempt, the configured or requested lock timeout).
    pub writer: GuardedWriter,
    /// Background writes (retries, dead letters).
    pub executor: BackgroundExecutor,
    /// The write-ahead journal and the table of operation states.
    pub journal: Arc<Journal>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The lock backend.
    pub backend: Backend,
    /// The Elasticsearch client.
    pub store: Arc<EsStore>,
    /// `server.*` settings.
    pub settings: ServerSettings,
    /// Lock wait of a foreground request without `timeout`: the configured foreground timeout
    /// ([`AppState::lock_wait`] keeps every wait within [`lock_wait_cap`]).
    pub fg_timeout: Duration,
    /// The configured background lock timeout (the gate's background writes wait this long,
    /// within [`lock_wait_cap`]).
    pub bg_timeout: Duration,
    /// Set when SIGTERM (or SIGINT) arrived: no new work is started.
    pub draining: AtomicBool,
    /// Concurrency limit of API requests.
    pub permits: Arc<Semaphore>,
    /// Requests waiting for an operation's outcome (`server.wait.max`), instead of a permit.
    pub waiters: Arc<Semaphore>,
    /// Two-phase-commit transfers (with the service's lock on each transaction).
    pub coordinator: zkguard::txn::Coordinator,
    /// Document transactions (`/v1/transactions`, the gate's atomic `_bulk`).
    pub transactions: Arc<zkguard::txn::multi::Transactions>,
    /// Locks held for callers that write themselves.
    pub explicit: ExplicitLocks,
    /// The lock events that `GET /v1/events` streams.
    pub events: Arc<Hub>,
    /// What the status page (`GET /ui`) shares between its viewers.
    pub ui: super::ui_cache::UiCache,
    /// The Kafka journal (`server.journal.backend=kafka`), set once at start; `journal` is then
    /// its in-memory table of operation states.
    fleet: std::sync::OnceLock<Arc<KafkaJournal>>,
    queue: mpsc::UnboundedSender<Operation>,
    waiting: AtomicUsize,
    es_ok: watch::Sender<Result<(), String>>,
    /// Whether Elasticsearch has answered since the start and what the service does against it
    /// at start (the gate's cluster) is done: the journal replay and the transactions' recovery
    /// wait for it ([`AppState::elasticsearch_reached`]).
    es_reached: watch::Sender<bool>,
    /// Whether the lock backend is usable, as [`monitor`] last saw it; it notifies on every
    /// change and on every check while the backend is down.
    backend_up: watch::Sender<bool>,
    /// Background operations running, by id; watched so that shutdown can wait until none is.
    running: watch::Sender<HashMap<Uuid, AbortHandle>>,
    /// Tokens of the latest background acquisitions counted in the lock metrics: operations
    /// applied under one acquisition share its token, and the acquisition counts once.
    counted_tokens: std::sync::Mutex<std::collections::VecDeque<u64>>,
}

/// How many recent background tokens are remembered (far more than acquisitions in flight).
const COUNTED_TOKENS: usize = 4096;

/// Receives the operations the dispatcher feeds to the executor.
pub type QueueReceiver = mpsc::UnboundedReceiver<Operation>;

/// What a request keeps of `server.request.timeout` beyond its lock wait: an acquisition gives
/// up in order within [`zkguard::zk::DEADLINE_OVERRUN`] of its deadline, whatever ZooKeeper
/// does, and then the answer is written.
const LOCK_WAIT_MARGIN: Duration =
    zkguard::zk::DEADLINE_OVERRUN.saturating_add(Duration::from_millis(250));

/// The longest lock wait of a request: `server.request.timeout` less [`LOCK_WAIT_MARGIN`]
/// (1.25 s; half the timeout when that is shorter than 2.5 s), so that a lock that stays taken
/// is answered 423 `lock_timeout`, or a silent ZooKeeper 503 `lock_unavailable` (both: nothing
/// written, safe to retry), rather than 503 `request_timeout` (outcome unknown).
pub fn lock_wait_cap(request_timeout: Duration) -> Duration {
    request_timeout.saturating_sub(LOCK_WAIT_MARGIN.min(request_timeout / 2))
}

impl AppState {
    /// The lock wait of a request that asked for `asked` (none: the configured foreground
    /// timeout), within [`lock_wait_cap`].
    pub fn lock_wait(&self, asked: Option<Duration>) -> Duration {
        asked
            .unwrap_or(self.fg_timeout)
            .min(lock_wait_cap(self.settings.request_timeout))
    }

    /// The state, and the receiving end of the background queue (for [`dispatch`]).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        writer: GuardedWriter,
        executor: BackgroundExecutor,
        journal: Arc<Journal>,
        backend: Backend,
        store: Arc<EsStore>,
        settings: ServerSettings,
        fg_timeout: Duration,
        bg_timeout: Duration,
        coordinator: zkguard::txn::Coordinator,
        transactions: Arc<zkguard::txn::multi::Transactions>,
    ) -> (Arc<Self>, QueueReceiver) {
        let (queue, rx) = mpsc::unbounded_channel();
        let permits = Arc::new(Semaphore::new(settings.max_concurrent));
        let waiters = Arc::new(Semaphore::new(settings.wait_max));
        let metrics = Arc::new(Metrics::new());
        let events = Arc::new(Hub::new(settings.events_max, metrics.clone()));
        let explicit = ExplicitLocks::new(settings.lock_max, events.clone());
        let state = Self {
            writer,
            executor,
            journal,
            metrics,
            events,
            ui: super::ui_cache::UiCache::default(),
            fleet: std::sync::OnceLock::new(),
            backend,
            store,
            fg_timeout,
            bg_timeout,
            settings,
            draining: AtomicBool::new(false),
            permits,
            waiters,
            explicit,
            coordinator,
            transactions,
            queue,
            waiting: AtomicUsize::new(0),
            es_ok: watch::channel(Ok(())).0,
            es_reached: watch::channel(false).0,
            backend_up: watch::channel(true).0,
            running: watch::channel(HashMap::new()).0,
            counted_tokens: std::sync::Mutex::new(std::collections::VecDeque::new()),
        };
        (Arc::new(state), rx)
    }

    /// Sets the Kafka journal (once, at start).
    pub fn set_fleet(&self, fleet: Arc<KafkaJournal>) {
        let _ = self.fleet.set(fleet);
    }

    /// The Kafka journal, when `server.journal.backend=kafka`.
    pub fn fleet(&self) -> Option<&Arc<KafkaJournal>> {
        self.fleet.get()
    }

    /// The Kafka journal's status: each partition's owner, committed and end offsets, lag and
    /// oldest unapplied operation (refreshed every second). `None` with the file journal.
    pub fn journal_status(&self) -> Option<JournalStatus> {
        self.fleet().map(|f| f.status())
    }

    /// The partitions of this instance's journal, as the status page and `/metrics` show them
    /// (none with the file journal).
    pub fn partition_views(&self) -> Vec<PartitionStatus> {
        self.journal_status()
            .map(|status| status.partitions)
            .unwrap_or_default()
    }

    /// Why the journal cannot take or record operations now, if it cannot: the file journal
    /// cannot record outcomes, or the Kafka journal's broker does not take writes.
    pub fn journal_problem(&self) -> Option<String> {
        self.journal
            .problem()
            .or_else(|| self.fleet().and_then(|f| f.problem()))
    }

    /// Stops the background operations `ids` if they are running (their partition went to
    /// another instance).
    pub fn abort_ops(&self, ids: &[Uuid]) {
        let running = self.running.borrow();
        for id in ids {
            if let Some(handle) = running.get(id) {
                handle.abort();
            }
        }
    }

    /// Why the lock backend cannot be used now, if it cannot. Instant (no request).
    pub fn lock_problem(&self) -> Option<String> {
        match &self.backend {
            Backend::ZooKeeper(s) if !s.is_connected() => Some(format!(
                "the ZooKeeper session is not connected (zookeeper.servers = {})",
                s.settings().servers
            )),
            Backend::ZooKeeper(_) => None,
            Backend::Elasticsearch(_) => self.es_ok.borrow().clone().err(),
        }
    }

    /// Why Elasticsearch did not answer at its last check (every second, and at each
    /// `/readyz`), if it did not. Instant (no request).
    pub fn es_problem(&self) -> Option<String> {
        self.es_ok.borrow().clone().err()
    }

    /// Why the service is still starting, if it is: Elasticsearch has not answered since the
    /// start (with the last reason), so its work against the cluster waits. Instant.
    pub fn start_problem(&self) -> Option<String> {
        if *self.es_reached.borrow() {
            return None;
        }
        Some(match self.es_problem() {
            Some(p) => format!("starting: waiting for Elasticsearch ({p})"),
            None => format!(
                "starting: Elasticsearch at {} answers, the start against it is not finished",
                self.store.urls()
            ),
        })
    }

    /// Records that Elasticsearch answered and the start against it is done: what waits in
    /// [`AppState::elasticsearch_reached`] goes on.
    pub fn mark_elasticsearch_reached(&self) {
        self.es_reached.send_replace(true);
    }

    /// Waits until Elasticsearch has answered since the start ([`mark_elasticsearch_reached`]);
    /// `false` when `stop` turned true first.
    ///
    /// [`mark_elasticsearch_reached`]: AppState::mark_elasticsearch_reached
    pub async fn elasticsearch_reached(&self, stop: &mut watch::Receiver<bool>) -> bool {
        let mut reached = self.es_reached.subscribe();
        tokio::select! {
            r = reached.wait_for(|r| *r) => r.is_ok(),
            _ = stop.wait_for(|s| *s) => false,
        }
    }

    /// Notified at every Elasticsearch check ([`AppState::ping_es`]).
    pub fn watch_elasticsearch(&self) -> watch::Receiver<Result<(), String>> {
        self.es_ok.subscribe()
    }

    /// Asks Elasticsearch whether it answers (`HEAD /`, at most 2 s).
    pub async fn ping_es(&self) -> Result<(), String> {
        let ping = self.store.client().ping().send();
        let result = match tokio::time::timeout(Duration::from_secs(2), ping).await {
            Err(_) => Err("Elasticsearch did not answer within 2s".to_string()),
            Ok(Err(e)) => Err(format!(
                "cannot reach Elasticsearch at {}: {e}",
                self.store.urls()
            )),
            Ok(Ok(r)) if r.status_code().is_success() => Ok(()),
            Ok(Ok(r)) => Err(format!(
                "Elasticsearch at {} answered {}",
                self.store.urls(),
                r.status_code()
            )),
        };
        let _ = self.es_ok.send_replace(result.clone());
        result
    }

    /// Queues journaled operations for the executor.
    pub fn enqueue(&self, ops: Vec<Operation>) {
        for op in ops {
            self.waiting.fetch_add(1, Ordering::Relaxed);
            if self.queue.send(op).is_err() {
                // The dispatcher has stopped (shutting down): the operation stays in the
                // journal for the next start.
                self.waiting.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Updates the depth gauges and the executor counters (before each scrape).
    pub fn refresh_gauges(&self) {
        let m = &self.metrics;
        m.journal_depth.set(self.journal.depth() as i64);
        m.journal_oldest.set(
            self.journal
                .oldest_queued()
                .map_or(0.0, |age| age.as_secs_f64()),
        );
        m.journal_bytes.set(self.journal.queued_bytes() as i64);
        m.explicit_locks.set(self.explicit.len() as i64);
        m.queue_depth
            .set(self.waiting.load(Ordering::Relaxed) as i64);
        let stats = self.executor.stats();
        m.sync_executor(&stats);
        let (fsyncs, fsync_us) = self.journal.sync_stats();
        m.sync_stages(&stats, fsyncs, fsync_us);
    }

    /// Whether the background acquisition of `token` is seen here for the first time.
    fn first_use_of(&self, token: u64) -> bool {
        let mut seen = self
            .counted_tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if seen.contains(&token) {
            return false;
        }
        if seen.len() >= COUNTED_TOKENS {
            seen.pop_front();
        }
        seen.push_back(token);
        true
    }

    /// Stops every background operation still running (they stay in the journal) and waits up
    /// to `limit` until they are gone (their guards dropped). Returns how many were stopped.
    pub async fn stop_running(&self, limit: Duration) -> usize {
        let stopped = {
            let running = self.running.borrow();
            for handle in running.values() {
                handle.abort();
            }
            running.len()
        };
        let mut running = self.running.subscribe();
        let _ = tokio::time::timeout(limit, running.wait_for(HashMap::is_empty)).await;
        stopped
    }
}

impl super::journal::kafka::owner::Dispatch for AppState {
    fn enqueue(&self, ops: Vec<Operation>) {
        AppState::enqueue(self, ops);
    }

    fn abort_ops(&self, ids: &[Uuid]) {
        AppState::abort_ops(self, ids);
    }
}

/// How often [`monitor`] checks the lock backend.
const MONITOR_EVERY: Duration = Duration::from_millis(250);

/// Watches the lock backend and Elasticsearch: reconnects an expired ZooKeeper session, keeps
/// the readiness gauge and the reconnect counter. Runs until `stop` turns true.
pub async fn monitor(state: Arc<AppState>, mut stop: watch::Receiver<bool>) {
    let mut was_up = true;
    let mut tick = 0u32;
    loop {
        if tick % 4 == 0 {
            let _ = state.ping_es().await;
        }
        tick = tick.wrapping_add(1);
        if let Backend::ZooKeeper(session) = &state.backend {
            if !session.is_connected() {
                // Connects a new session after an expiry; no-op while the old one may recover.
                if let Err(e) = session.ensure_session().await {
                    tracing::debug!(error = %e, "ZooKeeper still unreachable");
                }
            }
        }
        let up = state.lock_problem().is_none();
        // Wakes the dispatcher on a change, and at every check while the backend is down.
        state.backend_up.send_if_modified(|seen| {
            let notify = *seen != up || !up;
            *seen = up;
            notify
        });
        state.metrics.zk_connected.set(i64::from(up));
        if up && !was_up {
            state.metrics.zk_reconnects.inc();
            tracing::info!("lock backend available again");
        } else if !up && was_up {
            tracing::warn!(problem = ?state.lock_problem(), "lock backend unavailable");
        }
        was_up = up;
        tokio::select! {
            _ = tokio::time::sleep(MONITOR_EVERY) => {}
            _ = stop.changed() => return,
        }
    }
}

/// How long an operation that the dead-letter sink refused waits before it is queued again.
const SINK_RETRY: Duration = Duration::from_secs(30);

/// Feeds queued operations to the executor, oldest first, holding them while the lock backend
/// is unavailable (so that an outage does not burn their retries), and records each outcome in
/// the journal. Runs until `stop` turns true.
pub async fn dispatch(
    state: Arc<AppState>,
    mut rx: QueueReceiver,
    mut stop: watch::Receiver<bool>,
) {
    // The operations replayed from the journal (and those accepted meanwhile) start once
    // Elasticsearch has answered since the start, instead of spending their retries on it.
    if !state.elasticsearch_reached(&mut stop).await {
        return;
    }
    let mut backend_up = state.backend_up.subscribe();
    let mut journal_problem = state.journal.watch_problem();
    // Outcomes are journaled by one task, all those that arrived during its previous write in
    // one batch (one fsync), instead of one blocking task per operation.
    let (outcomes, mut recorded) = mpsc::unbounded_channel::<Finished>();
    let journal = state.journal.clone();
    let fleet_state = state.clone();
    tokio::spawn(async move {
        while let Some(first) = recorded.recv().await {
            let mut all = vec![first];
            while let Ok(more) = recorded.try_recv() {
                all.push(more);
            }
            // With the Kafka journal, the outcomes are in its index (for every instance)
            // before this instance answers them; those it holds back (in their monitor's
            // order) or drops (their partition went to another instance) are not recorded
            // here either: a later owner here must not take them for finished.
            if let Some(fleet) = fleet_state.fleet() {
                all = fleet.finished(&all).await;
                if all.is_empty() {
                    continue;
                }
            }
            if let Err(e) = journal.finish_all(all).await {
                tracing::error!(error = %e, "cannot record outcomes in the journal: no background operation starts and nothing new is accepted until they are recorded");
                journal.outcomes_failed(&e);
                // Until the file can be rewritten with every outcome known in memory (space
                // freed): one attempt a second.
                while let Err(e) = journal.checkpoint().await {
                    tracing::debug!(error = %e, "the journal still cannot be written");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                tracing::info!("the journal records outcomes again; background operations resume");
            }
        }
    });
    loop {
        let op = tokio::select! {
            op = rx.recv() => match op { Some(op) => op, None => return },
            _ = stop.changed() => return,
        };
        if !until_backend_up(
            || state.lock_problem().is_none(),
            &mut backend_up,
            &mut stop,
        )
        .await
        {
            return;
        }
        // An operation applied while outcomes cannot be recorded would run again at the next
        // start, possibly over newer writes: none starts until they can.
        while journal_problem.borrow_and_update().is_some() {
            tokio::select! {
                changed = journal_problem.changed() => if changed.is_err() { return },
                _ = stop.changed() => return,
            }
        }
        // An operation of a Kafka journal partition no longer owned here: the new owner
        // applies it.
        if state.fleet().is_some_and(|f| !f.may_start(&op)) {
            state.waiting.fetch_sub(1, Ordering::Relaxed);
            continue;
        }
        let handle = tokio::select! {
            h = state.executor.submit(op.clone()) => h,
            _ = stop.changed() => return,
        };
        state.waiting.fetch_sub(1, Ordering::Relaxed);
        state.running.send_modify(|r| {
            r.insert(op.id, handle.abort_handle());
        });
        let st = state.clone();
        let mut task_stop = stop.clone();
        let outcomes = outcomes.clone();
        tokio::spawn(async move {
            let outcome = handle.await;
            st.running.send_modify(|r| {
                r.remove(&op.id);
            });
            match outcome {
                Ok(Ok(outcome)) => {
                    st.events.outcome(&op, &outcome);
                    let _ = outcomes.send(record(&st, outcome));
                }
                // Neither applied nor parked: the dead-letter sink refused it. It is still in
                // the journal, unfinished; queue it again after a pause, so that it ends applied
                // or parked once the sink takes writes again (or at the next start).
                Ok(Err(lost)) => {
                    st.metrics.outcome("background", "unparked");
                    tracing::error!(op = %op.id, error = %lost, "the dead-letter sink refused an operation; it stays in the journal and is queued again in {SINK_RETRY:?}");
                    tokio::select! {
                        _ = tokio::time::sleep(SINK_RETRY) => st.enqueue(vec![op]),
                        _ = task_stop.changed() => {}
                    }
                }
                Err(_) => {
                    tracing::debug!(op = %op.id, "background operation stopped by shutdown; it stays in the journal")
                }
            }
        });
    }
}

/// Waits until the lock backend is usable (`usable()`), looking again at each notification of
/// `backend_up` ([`monitor`]'s view) and at least every [`MONITOR_EVERY`]; `false` when `stop`
/// turned true first.
///
/// The monitor notifies only the changes it sees: a session that expired and was connected
/// again between two of its checks (a process paused past its session, whose monitor connects
/// the new session before it looks) is no change to it, while the dispatcher may have seen the
/// backend down meanwhile. Waiting for a notification alone left the dispatcher, and every
/// background operation of the instance, waiting for ever.
async fn until_backend_up(
    usable: impl Fn() -> bool,
    backend_up: &mut watch::Receiver<bool>,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    backend_up.mark_unchanged();
    while !usable() {
        tokio::select! {
            changed = backend_up.changed() => if changed.is_err() { return false },
            _ = tokio::time::sleep(MONITOR_EVERY) => {}
            _ = stop.changed() => return false,
        }
    }
    true
}

/// Counts an outcome; returns its journal record.
fn record(state: &AppState, outcome: Outcome) -> Finished {
    let m = &state.metrics;
    let finished = match outcome {
        Outcome::Applied {
            op_id,
            attempts,
            written,
        } => {
            if state.first_use_of(written.token) {
                m.lock_used("background", written.waited, written.held);
            }
            m.outcome("background", "applied");
            Finished {
                id: op_id,
                status: OpState::Applied,
                reason: None,
                token: written.applied_token,
                already_applied: written.already_applied,
                attempts: Some(attempts),
                fingerprint: None,
                key: None,
            }
        }
        Outcome::Parked {
            op_id,
            attempts,
            reason,
            error,
        } => {
            m.outcome("background", "parked");
            m.parked.inc();
            Finished {
                id: op_id,
                status: OpState::Parked,
                reason: Some(format!("{reason}: {error}")),
                token: None,
                already_applied: false,
                attempts: Some(attempts),
                fingerprint: None,
                key: None,
            }
        }
        Outcome::Rejected { op_id, reason } => {
            m.outcome("background", "rejected");
            Finished {
                id: op_id,
                status: OpState::Rejected,
                reason: Some(reason),
                token: None,
                already_applied: false,
                attempts: None,
                fingerprint: None,
                key: None,
            }
        }
    };
    finished
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session that expired and was connected again between two checks of [`monitor`] (a
    /// process paused past its session: the monitor's next check connects the new session
    /// before it looks) is no change of `backend_up`; the dispatcher that saw the backend down
    /// meanwhile must still go on once it is usable again.
    #[tokio::test]
    async fn the_dispatcher_goes_on_when_the_backend_came_back_without_the_monitor_seeing_it_down()
    {
        let (_up, mut backend_up) = watch::channel(true);
        let (_stop, mut stop) = watch::channel(false);
        let checks = AtomicUsize::new(0);
        // Down at the dispatcher's first look, usable from then on; the monitor's value stays
        // `true` throughout and never notifies.
        let usable = || checks.fetch_add(1, Ordering::Relaxed) > 0;
        let waited = tokio::time::timeout(
            Duration::from_secs(10),
            until_backend_up(usable, &mut backend_up, &mut stop),
        )
        .await;
        assert_eq!(
            waited,
            Ok(true),
            "the dispatcher still waits for a change of the backend's state 10 s after the backend came back"
        );
    }
}
