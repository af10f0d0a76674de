//! Explicit locks: callers that write to Elasticsearch themselves take a lock through the service,
//! keep it alive, and release it. A lock whose lease lapses without a keep-alive is released by
//! the service; its fencing token still fences the late writer, since every later holder's token
//! is greater.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use uuid::Uuid;
use zkguard::{Guard, LockType};

use super::hub::{Happened, Hub, Kind};

/// Why an explicit lock ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Released by its holder (`DELETE`) or by the service's shutdown.
    Released,
    /// Its lease lapsed without a keep-alive.
    Lapsed,
    /// The lock backend lost it (session expired, lease taken over).
    Lost,
    /// An operator force-released it (`POST /v1/locks/{monitor}/{lock_id}/force-release`).
    Forced,
}

/// The guard of an explicit lock, shared by its task (which releases it) and the writes made
/// under it (`?lock_id=`): a write holds it for reading, so the release waits for the writes in
/// flight, and a write that comes after the release finds it empty.
pub type SharedGuard = Arc<tokio::sync::RwLock<Option<Box<dyn Guard>>>>;

/// One lock held for a caller.
#[derive(Debug)]
struct Held {
    monitor: String,
    guard: SharedGuard,
    token: u64,
    lock_type: LockType,
    info: String,
    ttl: Duration,
    /// Set (to the event's reason) before an operator's force release drops `deadline`.
    forced: Arc<OnceLock<String>>,
    /// The lease's end; dropping the sender asks the lock's task to release it.
    deadline: watch::Sender<Instant>,
    expires_ms: u64,
    task: JoinHandle<Ended>,
}

/// What a caller learns about its lock.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LockView {
    /// The lock's id in this service.
    pub lock_id: String,
    /// The monitor object.
    pub monitor: String,
    /// The fencing token: send it as the external version of every write made under the lock.
    pub token: u64,
    /// `foreground` or `background`.
    pub lock_type: LockType,
    /// End of the lease, in milliseconds since the Unix epoch.
    pub expires: u64,
    /// The lease, in milliseconds: each keep-alive extends it by this much from now.
    pub ttl_ms: u64,
}

/// An explicit lock as the status page lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HeldView {
    /// The lock's id in this service.
    pub lock_id: String,
    /// The monitor object.
    pub monitor: String,
    /// The fencing token.
    pub token: u64,
    /// `foreground` or `background`.
    pub lock_type: LockType,
    /// The holder's description (`info`).
    pub info: String,
    /// The lease, in milliseconds.
    pub ttl_ms: u64,
    /// End of the lease, in milliseconds since the Unix epoch.
    pub expires: u64,
}

/// A lock an operator force-released: what its holder hears on its next call with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forced {
    /// The monitor it guarded.
    pub monitor: String,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Who asked (the client's address and credential).
    pub by: String,
    /// Why, as the operator said.
    pub reason: Option<String>,
}

/// How many force releases are remembered for their holders' next calls.
const FORCED_KEPT: usize = 1024;

/// Why an explicit-lock request was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// `server.lock.max` locks are held already.
    Full(usize),
    /// No such lock (released, lapsed or lost), or it belongs to another monitor.
    Unknown,
}

/// The explicit locks this service holds for its callers.
#[derive(Debug)]
pub struct ExplicitLocks {
    held: Arc<Mutex<HashMap<Uuid, Held>>>,
    max: usize,
    events: Arc<Hub>,
    /// The latest force releases, oldest first, at most [`FORCED_KEPT`].
    forced: Mutex<VecDeque<(Uuid, Forced)>>,
}

fn epoch_ms_after(d: Duration) -> u64 {
    (SystemTime::now() + d)
        .duration_since(UNIX_EPOCH)
        .map_or(0, |t| t.as_millis() as u64)
}

impl ExplicitLocks {
    /// At most `max` locks at once; their acquisitions, releases and losses are published to
    /// `events`.
    pub fn new(max: usize, events: Arc<Hub>) -> Self {
        Self {
            held: Arc::new(Mutex::new(HashMap::new())),
            max,
            events,
            forced: Mutex::new(VecDeque::new()),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether another lock may be taken now (checked before waiting for it).
    pub fn has_room(&self) -> Result<(), Refused> {
        if self.table().len() >= self.max {
            return Err(Refused::Full(self.max));
        }
        Ok(())
    }

    /// Number of locks held.
    pub fn len(&self) -> usize {
        self.table().len()
    }

    /// Takes charge of an acquired lock (described by `info`) for `ttl`: a task releases it
    /// when the lease lapses, when the holder (or an operator) releases it, or notes its loss.
    /// `on_end` is called once with the reason.
    pub fn insert(
        &self,
        guard: Box<dyn Guard>,
        info: String,
        ttl: Duration,
        on_end: impl FnOnce(Ended) + Send + 'static,
    ) -> Result<LockView, (Refused, Box<dyn Guard>)> {
        let mut table = self.table();
        if table.len() >= self.max {
            return Err((Refused::Full(self.max), guard));
        }
        let id = Uuid::new_v4();
        let (deadline, mut rx) = watch::channel(Instant::now() + ttl);
        let held_table = self.held.clone();
        let monitor = guard.monitor().to_string();
        let token = guard.fencing_token();
        let lock_type = guard.lock_type();
        let task_monitor = monitor.clone();
        let shared: SharedGuard = Arc::new(tokio::sync::RwLock::new(Some(guard)));
        let slot = shared.clone();
        let forced = Arc::new(OnceLock::new());
        let forced_reason = forced.clone();
        // Published before the task starts, so that its end comes after it on every stream.
        let held_since = Instant::now();
        self.events.publish(
            Happened::lock(Kind::Acquired, &monitor, lock_type)
                .token(token)
                .lock_id(id),
        );
        let events = self.events.clone();
        let task = tokio::spawn(async move {
            let reading = slot.read().await;
            let guard = reading
                .as_ref()
                .expect("the guard is there until the task ends");
            let ended = loop {
                let until = *rx.borrow_and_update();
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => {
                        // Decided under the table's lock, so that a keep-alive either lands
                        // before (and the lease goes on) or finds the lock gone.
                        let mut table = held_table.lock().unwrap_or_else(|p| p.into_inner());
                        if *rx.borrow_and_update() <= Instant::now() {
                            table.remove(&id);
                            break Ended::Lapsed;
                        }
                    }
                    changed = rx.changed() => if changed.is_err() {
                        break if forced_reason.get().is_some() { Ended::Forced } else { Ended::Released };
                    },
                    _ = guard.lost() => {
                        held_table.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                        break Ended::Lost;
                    }
                }
            };
            match ended {
                Ended::Lapsed => {
                    tracing::warn!(lock = %id, monitor = %task_monitor, token, "explicit lock's lease lapsed without keep-alive; releasing it")
                }
                Ended::Lost => {
                    tracing::warn!(lock = %id, monitor = %task_monitor, token, "explicit lock lost by the lock backend")
                }
                Ended::Released | Ended::Forced => {
                    tracing::debug!(lock = %id, monitor = %task_monitor, "explicit lock released")
                }
            }
            drop(reading);
            // Waits for the writes in flight under the lock.
            let guard = slot.write().await.take();
            if let Some(guard) = guard {
                if let Err(e) = guard.unlock().await {
                    tracing::debug!(lock = %id, error = %e, "releasing an explicit lock");
                }
            }
            let event = match ended {
                Ended::Released => Happened::lock(Kind::Released, &task_monitor, lock_type),
                Ended::Lapsed => {
                    Happened::lock(Kind::Lost, &task_monitor, lock_type).reason("lapsed")
                }
                Ended::Lost => Happened::lock(Kind::Lost, &task_monitor, lock_type).reason("lost"),
                Ended::Forced => Happened::lock(Kind::Lost, &task_monitor, lock_type)
                    .reason(forced_reason.get().cloned().unwrap_or_default()),
            };
            events.publish(event.token(token).lock_id(id).held(held_since.elapsed()));
            on_end(ended);
            ended
        });
        let expires_ms = epoch_ms_after(ttl);
        table.insert(
            id,
            Held {
                monitor: monitor.clone(),
                guard: shared,
                token,
                lock_type,
                info,
                ttl,
                forced,
                deadline,
                expires_ms,
                task,
            },
        );
        Ok(LockView {
            lock_id: id.to_string(),
            monitor,
            token,
            lock_type,
            expires: expires_ms,
            ttl_ms: ttl.as_millis() as u64,
        })
    }

    /// Extends the lease of lock `id` on `monitor` by `ttl` (or its own lease) from now.
    pub fn keep_alive(
        &self,
        monitor: &str,
        id: &Uuid,
        ttl: Option<Duration>,
    ) -> Result<LockView, Refused> {
        let mut table = self.table();
        let held = table
            .get_mut(id)
            .filter(|h| h.monitor == monitor)
            .ok_or(Refused::Unknown)?;
        if let Some(t) = ttl {
            held.ttl = t;
        }
        held.deadline.send_replace(Instant::now() + held.ttl);
        held.expires_ms = epoch_ms_after(held.ttl);
        Ok(LockView {
            lock_id: id.to_string(),
            monitor: held.monitor.clone(),
            token: held.token,
            lock_type: held.lock_type,
            expires: held.expires_ms,
            ttl_ms: held.ttl.as_millis() as u64,
        })
    }

    /// The monitor and guard of lock `id`, for a write under it.
    pub fn guard(&self, id: &Uuid) -> Result<(String, SharedGuard), Refused> {
        self.table()
            .get(id)
            .map(|h| (h.monitor.clone(), h.guard.clone()))
            .ok_or(Refused::Unknown)
    }

    /// Releases lock `id` on `monitor` and waits until the backend has released it.
    pub async fn release(&self, monitor: &str, id: &Uuid) -> Result<u64, Refused> {
        let held = self.take(monitor, id)?;
        let token = held.token;
        drop(held.deadline);
        let _ = held.task.await;
        Ok(token)
    }

    /// An operator's release of lock `id` on `monitor`, by `by` for `reason`: released as by its
    /// holder (waiting for the writes in flight under it), logged, published as a loss, and
    /// remembered so that the holder's next call with the lock is told why it is gone.
    pub async fn force_release(
        &self,
        monitor: &str,
        id: &Uuid,
        by: String,
        reason: Option<String>,
    ) -> Result<u64, Refused> {
        let held = self.take(monitor, id)?;
        let token = held.token;
        let event_reason = match &reason {
            Some(r) => format!("force-released: {r}"),
            None => "force-released".to_string(),
        };
        let _ = held.forced.set(event_reason);
        tracing::warn!(
            lock = %id, monitor, token, holder_info = %held.info, by = %by,
            reason = reason.as_deref().unwrap_or("none given"),
            "explicit lock force-released by an operator; the holder's next call with it is refused"
        );
        let forced = Forced {
            monitor: monitor.to_string(),
            at_ms: super::hub::now_ms(),
            by,
            reason,
        };
        {
            let mut kept = self.forced.lock().unwrap_or_else(|p| p.into_inner());
            if kept.len() >= FORCED_KEPT {
                kept.pop_front();
            }
            kept.push_back((*id, forced));
        }
        drop(held.deadline);
        let _ = held.task.await;
        Ok(token)
    }

    /// The force release of lock `id`, if an operator released it lately.
    pub fn forced(&self, id: &Uuid) -> Option<Forced> {
        let kept = self.forced.lock().unwrap_or_else(|p| p.into_inner());
        kept.iter()
            .rev()
            .find(|(k, _)| k == id)
            .map(|(_, f)| f.clone())
    }

    /// Every lock held, by monitor then id.
    pub fn list(&self) -> Vec<HeldView> {
        let mut all: Vec<HeldView> = self
            .table()
            .iter()
            .map(|(id, h)| HeldView {
                lock_id: id.to_string(),
                monitor: h.monitor.clone(),
                token: h.token,
                lock_type: h.lock_type,
                info: h.info.clone(),
                ttl_ms: h.ttl.as_millis() as u64,
                expires: h.expires_ms,
            })
            .collect();
        all.sort_by(|a, b| (&a.monitor, &a.lock_id).cmp(&(&b.monitor, &b.lock_id)));
        all
    }

    /// Removes lock `id` on `monitor` from the table.
    fn take(&self, monitor: &str, id: &Uuid) -> Result<Held, Refused> {
        let mut table = self.table();
        match table.get(id) {
            Some(h) if h.monitor == monitor => table.remove(id),
            _ => None,
        }
        .ok_or(Refused::Unknown)
    }

    /// Releases every lock (shutdown) and waits up to `limit` for the backend.
    pub async fn release_all(&self, limit: Duration) -> usize {
        let all: Vec<Held> = self.table().drain().map(|(_, h)| h).collect();
        let n = all.len();
        let tasks: Vec<JoinHandle<Ended>> = all
            .into_iter()
            .map(|h| {
                drop(h.deadline);
                h.task
            })
            .collect();
        let _ = tokio::time::timeout(limit, futures::future::join_all(tasks)).await;
        n
    }
}
