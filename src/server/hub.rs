//! The hub of the service's lock events, which `GET /v1/events` streams: acquisitions, releases
//! and losses of explicit locks, and the outcomes of writes (applied, rejected, parked).
//!
//! Publishing never blocks and costs little while nobody listens (a counter, and a copy of the
//! event's few fields into the [`RECENT`] events the status page shows): an event is built,
//! numbered and kept for streams only while a stream is open, and for
//! [`RESUME_WINDOW`] after the last one closed, so that a client that reconnects with
//! `Last-Event-ID` gets what it missed from the last [`RING`] events. Streams read from a
//! broadcast channel; one that falls [`RING`] events behind is told how many it missed and goes
//! on, holding up no one.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::counter::Counter;
use serde::Serialize;
use tokio::sync::{broadcast, watch, OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;
use zkguard::write::background::Outcome;
use zkguard::write::guarded::GuardedError;
use zkguard::write::ops::Operation;
use zkguard::{LockError, LockType};

use super::metrics::{EventLabels, Metrics};

/// Events kept for resuming streams, and how far a stream may fall behind before it misses some.
pub const RING: usize = 1024;
/// How long after the last stream closed events are still kept for a resuming client.
pub const RESUME_WINDOW: Duration = Duration::from_secs(60);
/// The latest events kept always, for the status page (`GET /ui`).
pub const RECENT: usize = 50;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An explicit lock was acquired for a caller.
    Acquired,
    /// An explicit lock was released (by its holder, or at shutdown).
    Released,
    /// A lock ended without a release: its lease lapsed, or the backend lost it.
    Lost,
    /// A write was applied (foreground, background, or through the gate).
    Applied,
    /// A write was not applied: a background operation that never can be, or a foreground write
    /// answered with an error.
    Rejected,
    /// A background operation was parked in the dead-letter sink.
    Parked,
}

impl Kind {
    /// Every kind, in the order of [`Kind::index`].
    pub const ALL: [Kind; 6] = [
        Kind::Acquired,
        Kind::Released,
        Kind::Lost,
        Kind::Applied,
        Kind::Rejected,
        Kind::Parked,
    ];

    /// The event's name on the stream (`event:`) and in its `type` field.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Acquired => "acquired",
            Kind::Released => "released",
            Kind::Lost => "lost",
            Kind::Applied => "applied",
            Kind::Rejected => "rejected",
            Kind::Parked => "parked",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The kind named `name`.
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

/// What a publisher knows of an event; borrowed, so that building it costs nothing.
#[derive(Debug, Clone)]
pub struct Happened<'a> {
    kind: Kind,
    monitor: &'a str,
    lock_type: LockType,
    token: Option<u64>,
    /// The operation's id, and the caller's key when it named the operation with one.
    operation_id: Option<(Uuid, Option<&'a str>)>,
    lock_id: Option<Uuid>,
    index: Option<&'a str>,
    id: Option<&'a str>,
    reason: Option<Cow<'a, str>>,
    held_ms: Option<u64>,
}

impl<'a> Happened<'a> {
    /// An event of a lock of `lock_type` on `monitor`.
    pub fn lock(kind: Kind, monitor: &'a str, lock_type: LockType) -> Self {
        Self {
            kind,
            monitor,
            lock_type,
            token: None,
            operation_id: None,
            lock_id: None,
            index: None,
            id: None,
            reason: None,
            held_ms: None,
        }
    }

    /// An event of operation `op` (its monitor, lock type, id and target document).
    pub fn op(kind: Kind, op: &'a Operation) -> Self {
        Self {
            operation_id: Some((op.id, op.key.as_deref())),
            index: Some(op.target_index()),
            id: Some(op.target_id()),
            ..Self::lock(kind, &op.monitor, op.lock_type)
        }
    }

    /// A write through the gate to `index`/`id`.
    pub fn document(mut self, index: &'a str, id: &'a str) -> Self {
        self.index = Some(index);
        self.id = Some(id);
        self
    }

    /// The lock's fencing token.
    pub fn token(mut self, token: u64) -> Self {
        self.token = Some(token);
        self
    }

    /// The fencing token, when it is known.
    pub fn maybe_token(mut self, token: Option<u64>) -> Self {
        self.token = token;
        self
    }

    /// The explicit lock's id.
    pub fn lock_id(mut self, id: Uuid) -> Self {
        self.lock_id = Some(id);
        self
    }

    /// Why (a loss, a rejection, a park).
    pub fn reason(mut self, reason: impl Into<Cow<'a, str>>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// How long the lock was held.
    pub fn held(mut self, held: Duration) -> Self {
        self.held_ms = Some(held.as_millis() as u64);
        self
    }
}

/// An event as streams see it.
#[derive(Debug)]
pub struct Event {
    /// Its number in this run of the service (the stream's `id:`), from 1.
    pub seq: u64,
    /// What happened.
    pub kind: Kind,
    /// The monitor, for the streams' filters.
    pub monitor: String,
    /// The `data:` line: one JSON object.
    pub json: String,
}

/// The JSON of an event (documented in docs/serve.md, "Events").
#[derive(Serialize)]
struct Wire<'a> {
    seq: u64,
    #[serde(rename = "type")]
    kind: &'static str,
    at: u64,
    monitor: &'a str,
    lock_type: LockType,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<u64>,
    /// As the answers name the operation: the caller's key, or else its id.
    #[serde(skip_serializing_if = "Option::is_none")]
    operation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lock_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    held_ms: Option<u64>,
}

/// A recent event, as the status page shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Recent {
    /// When, in milliseconds since the Unix epoch.
    pub at: u64,
    /// What happened (the stream's event type).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The monitor.
    pub monitor: String,
    /// The lock's type.
    pub lock_type: LockType,
    /// The lock's fencing token.
    pub token: Option<u64>,
    /// The document written, `index/id`.
    pub document: Option<String>,
    /// Why (a loss, a rejection, a park).
    pub reason: Option<String>,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Why a stream was not opened.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// `server.events.max` streams are open.
    Full(usize),
    /// The service is shutting down.
    Closing,
}

/// How a resuming stream starts (`Last-Event-ID`).
#[derive(Debug)]
pub struct Subscription {
    /// The events to come.
    pub rx: broadcast::Receiver<Arc<Event>>,
    /// Kept events after the client's last one, oldest first.
    pub backlog: Vec<Arc<Event>>,
    /// How many events after the client's last one are not in the backlog: `Some(0)` when none,
    /// `None` when the id is not one of this run of the service (a restart, another instance).
    pub missed: Option<u64>,
    /// The number of the last event published when the stream started.
    pub last: u64,
}

/// The service's event hub.
#[derive(Debug)]
pub struct Hub {
    tx: broadcast::Sender<Arc<Event>>,
    ring: Mutex<VecDeque<Arc<Event>>>,
    recent: Mutex<VecDeque<Recent>>,
    seq: AtomicU64,
    counters: [Counter; 6],
    open: AtomicUsize,
    slots: Arc<Semaphore>,
    max: usize,
    started: Instant,
    /// Events are kept until this many ms after `started` (besides while a stream is open).
    keep_until: AtomicU64,
    closing: watch::Sender<bool>,
    metrics: Arc<Metrics>,
}

/// A stream's place among the `server.events.max`; freed when the stream ends.
#[derive(Debug)]
pub struct Slot {
    hub: Arc<Hub>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let hub = &self.hub;
        let until = (hub.started.elapsed() + RESUME_WINDOW).as_millis() as u64;
        hub.keep_until.fetch_max(until, Ordering::Relaxed);
        hub.open.fetch_sub(1, Ordering::Relaxed);
        hub.metrics.event_streams.dec();
        tracing::debug!("event stream closed");
    }
}

impl Hub {
    /// A hub for at most `max` streams, counting in `metrics`.
    pub fn new(max: usize, metrics: Arc<Metrics>) -> Self {
        let counters = Kind::ALL.map(|k| {
            metrics
                .events
                .get_or_create(&EventLabels { r#type: k.as_str() })
                .clone()
        });
        Self {
            tx: broadcast::channel(RING).0,
            ring: Mutex::new(VecDeque::with_capacity(RING)),
            recent: Mutex::new(VecDeque::with_capacity(RECENT)),
            seq: AtomicU64::new(0),
            counters,
            open: AtomicUsize::new(0),
            slots: Arc::new(Semaphore::new(max)),
            max,
            started: Instant::now(),
            keep_until: AtomicU64::new(0),
            closing: watch::channel(false).0,
            metrics,
        }
    }

    /// Whether events are numbered into the ring and sent to streams now.
    fn recording(&self) -> bool {
        self.open.load(Ordering::Relaxed) > 0
            || (self.started.elapsed().as_millis() as u64) < self.keep_until.load(Ordering::Relaxed)
    }

    /// Publishes an event: counted always, sent to the streams and kept for resuming ones while
    /// any may want it. Never blocks on a stream.
    pub fn publish(&self, h: Happened<'_>) {
        self.counters[h.kind.index()].inc();
        self.keep_recent(&h);
        if !self.recording() {
            self.seq.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let at = now_ms();
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        // Numbered under the ring's lock: the ring and every stream see increasing numbers.
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let json = serde_json::to_string(&Wire {
            seq,
            kind: h.kind.as_str(),
            at,
            monitor: h.monitor,
            lock_type: h.lock_type,
            token: h.token,
            operation_id: h
                .operation_id
                .map(|(id, key)| key.map_or_else(|| id.to_string(), str::to_string)),
            lock_id: h.lock_id,
            index: h.index,
            id: h.id,
            reason: h.reason.as_deref(),
            held_ms: h.held_ms,
        })
        .unwrap_or_default();
        let event = Arc::new(Event {
            seq,
            kind: h.kind,
            monitor: h.monitor.to_string(),
            json,
        });
        if ring.len() >= RING {
            ring.pop_front();
        }
        ring.push_back(event.clone());
        // No receiver: nothing to do (the event is kept in the ring).
        let _ = self.tx.send(event);
    }

    fn keep_recent(&self, h: &Happened<'_>) {
        let event = Recent {
            at: now_ms(),
            kind: h.kind.as_str(),
            monitor: h.monitor.to_string(),
            lock_type: h.lock_type,
            token: h.token,
            document: h.index.zip(h.id).map(|(index, id)| format!("{index}/{id}")),
            reason: h.reason.as_deref().map(str::to_string),
        };
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if recent.len() >= RECENT {
            recent.pop_front();
        }
        recent.push_back(event);
    }

    /// The latest [`RECENT`] events, newest first.
    pub fn recent(&self) -> Vec<Recent> {
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.iter().rev().cloned().collect()
    }

    /// Publishes that foreground operation `op` was applied by a write with `token` (`None`:
    /// found applied by an earlier write whose token its document no longer tells).
    pub fn applied(&self, op: &Operation, token: Option<u64>) {
        self.publish(Happened::op(Kind::Applied, op).maybe_token(token));
    }

    /// Publishes that foreground operation `op` failed with `e` (`rejected`, its reason the
    /// answer's error kind; after `lost` when the lock was lost).
    pub fn failed(&self, op: &Operation, e: &GuardedError) {
        if let GuardedError::LockLost { .. }
        | GuardedError::LostDuringWrite { .. }
        | GuardedError::Lock(LockError::Lost { .. }) = e
        {
            self.publish(Happened::op(Kind::Lost, op).reason("lost"));
        }
        self.publish(Happened::op(Kind::Rejected, op).reason(e.kind()));
    }

    /// Publishes the outcome of background operation `op`.
    pub fn outcome(&self, op: &Operation, outcome: &Outcome) {
        self.publish(match outcome {
            Outcome::Applied { written, .. } => {
                Happened::op(Kind::Applied, op).maybe_token(written.applied_token)
            }
            Outcome::Rejected { reason, .. } => {
                Happened::op(Kind::Rejected, op).reason(reason.as_str())
            }
            Outcome::Parked { reason, error, .. } => {
                Happened::op(Kind::Parked, op).reason(format!("{reason}: {error}"))
            }
        });
    }

    /// Takes one of the `server.events.max` places for a new stream.
    ///
    /// # Errors
    /// [`Refused::Full`] when every place is taken, [`Refused::Closing`] while shutting down.
    pub fn open(self: &Arc<Self>) -> Result<Slot, Refused> {
        if *self.closing.borrow() {
            return Err(Refused::Closing);
        }
        let permit = self.slots.clone().try_acquire_owned().map_err(|_| {
            self.metrics.event_streams_refused.inc();
            Refused::Full(self.max)
        })?;
        self.open.fetch_add(1, Ordering::Relaxed);
        self.metrics.event_streams.inc();
        Ok(Slot {
            hub: self.clone(),
            _permit: permit,
        })
    }

    /// Subscribes a stream to the events after `after` (its `Last-Event-ID`), or to those to
    /// come.
    pub fn subscribe(&self, after: Option<u64>) -> Subscription {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        // Under the ring's lock: every event is either in the backlog or comes through `rx`.
        let rx = self.tx.subscribe();
        let last = self.seq.load(Ordering::Relaxed);
        let (backlog, missed) = match after {
            None => (Vec::new(), Some(0)),
            Some(n) if n > last => (Vec::new(), None),
            Some(n) => {
                let backlog: Vec<Arc<Event>> = ring.iter().filter(|e| e.seq > n).cloned().collect();
                let missed = last - n - backlog.len() as u64;
                (backlog, Some(missed))
            }
        };
        Subscription {
            rx,
            backlog,
            missed,
            last,
        }
    }

    /// The metrics it counts in.
    #[cfg(test)]
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Counts events a slow stream missed.
    pub fn missed(&self, n: u64) {
        self.metrics.events_missed.inc_by(n);
    }

    /// Resolves when the service starts shutting down (streams end then).
    pub fn closing(&self) -> watch::Receiver<bool> {
        self.closing.subscribe()
    }

    /// Ends every stream (SIGTERM), and refuses new ones.
    pub fn close(&self) {
        self.closing.send_replace(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub(max: usize) -> Arc<Hub> {
        Arc::new(Hub::new(max, Arc::new(Metrics::new())))
    }

    fn lock_event(hub: &Hub, monitor: &str) {
        hub.publish(Happened::lock(Kind::Acquired, monitor, LockType::Foreground).token(7));
    }

    #[test]
    fn nothing_is_kept_while_nobody_listens() {
        let hub = hub(2);
        lock_event(&hub, "a");
        assert!(hub.ring.lock().unwrap().is_empty());
        // The status page's few recent events are kept all the same.
        let recent = hub.recent();
        assert_eq!(recent.len(), 1);
        assert_eq!(
            (recent[0].kind, recent[0].monitor.as_str()),
            ("acquired", "a")
        );
        assert_eq!(recent[0].token, Some(7));
        let counted = hub.metrics.encode(&[]);
        assert!(
            counted.contains(r#"zkguard_events_total{type="acquired"} 1"#),
            "{counted}"
        );
    }

    #[tokio::test]
    async fn streams_get_numbered_json_events_and_resume_after_their_last() {
        let hub = hub(2);
        let slot = hub.open().unwrap();
        let mut sub = hub.subscribe(None);
        lock_event(&hub, "a");
        let e = sub.rx.recv().await.unwrap();
        let v: serde_json::Value = serde_json::from_str(&e.json).unwrap();
        assert_eq!(v["seq"], 1);
        assert_eq!(v["type"], "acquired");
        assert_eq!(v["monitor"], "a");
        assert_eq!(v["lock_type"], "foreground");
        assert_eq!(v["token"], 7);
        assert!(v.get("lock_id").is_none(), "{v}");
        lock_event(&hub, "b");
        lock_event(&hub, "c");
        drop(sub);
        drop(slot);
        // Within the resume window events are still kept.
        lock_event(&hub, "d");
        let resumed = hub.subscribe(Some(1));
        let monitors: Vec<&str> = resumed.backlog.iter().map(|e| e.monitor.as_str()).collect();
        assert_eq!(monitors, ["b", "c", "d"]);
        assert_eq!(resumed.missed, Some(0));
        assert_eq!(hub.subscribe(Some(99)).missed, None, "an id of another run");
    }

    #[test]
    fn a_stream_beyond_the_limit_is_refused_and_closing_refuses_all() {
        let hub = hub(1);
        let slot = hub.open().unwrap();
        assert_eq!(hub.open().unwrap_err(), Refused::Full(1));
        drop(slot);
        let again = hub.open().unwrap();
        hub.close();
        assert_eq!(hub.open().unwrap_err(), Refused::Closing);
        drop(again);
    }

    #[test]
    fn events_beyond_the_ring_are_counted_as_missed_on_resume() {
        let hub = hub(1);
        let _slot = hub.open().unwrap();
        for _ in 0..RING + 10 {
            lock_event(&hub, "a");
        }
        let resumed = hub.subscribe(Some(0));
        assert_eq!(hub.recent().len(), RECENT);
        assert_eq!(resumed.backlog.len(), RING);
        assert_eq!(resumed.missed, Some(10));
        assert_eq!(resumed.backlog[0].seq, 11);
    }
}
