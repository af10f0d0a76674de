//! The history: every call for a lock, acquisition (with its token), end of a hold, release,
//! fenced write (with Elasticsearch's answer) and fault, each with its instant on the
//! monotonic clock ([`super::now`]). Contenders of this process record as they go; child
//! processes' events are read from the files their writer appends to.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::now;

/// Instants: nanoseconds of `CLOCK_MONOTONIC`.
pub type Ns = u64;

/// The lock type of a contender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Foreground,
    Background,
}

/// The kinds of fault the runs inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// A session's connection cut when it sends a chosen request, before the server got it.
    CutBeforeApplied,
    /// A session's connection cut right after the server answered a chosen request.
    CutAfterApplied,
    /// A session cut off from ZooKeeper until the server expired it.
    SessionExpiry,
    /// A `zkguard exec` holder stopped (SIGSTOP, alone or with its command) until its session
    /// expired and another contender took its lock, then continued.
    PausedProcess,
    /// A `zkguard exec` holder killed (SIGKILL) and another process started in its place.
    KilledProcess,
    /// The standalone ZooKeeper killed (SIGKILL) and started again on the same data directory.
    RestartedZooKeeper,
    /// The leader of the ensemble killed and started again.
    KilledLeader,
    /// A follower cut off from the other members (its client port open) past the session
    /// timeout, then let back.
    IsolatedFollower,
}

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::CutBeforeApplied => "connection cut before a request was applied",
            FaultKind::CutAfterApplied => "connection cut after a request was applied",
            FaultKind::SessionExpiry => "session expired (cut off past its timeout)",
            FaultKind::PausedProcess => "holder process paused (SIGSTOP) past its session",
            FaultKind::KilledProcess => "holder process killed (SIGKILL) and replaced",
            FaultKind::RestartedZooKeeper => "ZooKeeper killed and restarted (same data)",
            FaultKind::KilledLeader => "ensemble leader killed and restarted",
            FaultKind::IsolatedFollower => "follower isolated from its peers",
        }
    }
}

/// Whom a fault affects: one client (a session of this process, or a child process), or all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Client(String),
    All,
}

/// Elasticsearch's answer to a fenced write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// 200/201: stored, the token is now the document's version.
    Accepted,
    /// 409: the document's version was above the token.
    Rejected,
    /// No answer (the writer died, a transport error): it may or may not have been applied.
    Unknown,
}

/// One thing that happened.
#[derive(Clone, Debug, PartialEq)]
pub enum Ev {
    /// A contender asks for the lock of `monitor`. `queued_by`: an instant by which its
    /// queueing request had been sent (`None` when unknown; such a contender takes no part in
    /// the priority check as the one overtaken).
    Call {
        op: u64,
        client: String,
        monitor: String,
        class: Class,
        queued_by: Option<Ns>,
    },
    /// The lock was granted with `token` (recorded once the grant was known: at or after it).
    Acquired { op: u64, token: u64 },
    /// The queue node that got the contender the lock was created in the transaction that
    /// `token` stands for (`TOKEN_BASE` + its zxid), read from ZooKeeper while the lock was held.
    Queued { op: u64, node: String, token: u64 },
    /// The acquisition failed: timed out, or a ZooKeeper error.
    Failed {
        op: u64,
        timeout: bool,
        reason: String,
    },
    /// The holder stops using the lock: no write of this hold is sent after this instant, and
    /// its release is sent after it.
    HoldEnd { op: u64 },
    /// The outcome of the release (`ok`: the release deleted the lock's own nodes).
    Released { op: u64, ok: bool },
    /// A fenced write sent: `PUT <doc>?version=<token>&version_type=external_gte`.
    WriteSent {
        w: u64,
        op: u64,
        doc: String,
        token: u64,
    },
    /// Elasticsearch's answer to write `w`.
    WriteDone { w: u64, outcome: Outcome },
    /// A fault starts.
    FaultStart {
        fault: u64,
        kind: FaultKind,
        target: Target,
    },
    /// The fault is healed (or given up: `injected` false when it never took effect).
    FaultEnd { fault: u64, injected: bool },
    /// After the run: the queue nodes and `privateLock` nodes left under the lock root at
    /// `stage` (only those of live sessions of this process at the first stage).
    Leftovers { stage: String, nodes: Vec<String> },
    /// After the run: a document's `_version` (`None`: no such document).
    FinalVersion { doc: String, version: Option<u64> },
}

/// An event and its instant.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub at: Ns,
    pub ev: Ev,
}

/// Collects the events of a run; cheap to clone and share between tasks.
#[derive(Clone, Default)]
pub struct Recorder {
    events: Arc<Mutex<Vec<Event>>>,
    ids: Arc<AtomicU64>,
}

impl Recorder {
    /// A new id for an operation, a write or a fault.
    pub fn id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Records `ev` as happening now.
    pub fn now(&self, ev: Ev) -> Ns {
        let at = now();
        self.at(at, ev);
        at
    }

    /// Records `ev` as happening at `at`.
    pub fn at(&self, at: Ns, ev: Ev) {
        self.events.lock().unwrap().push(Event { at, ev });
    }

    /// A copy of the events so far, in instant order.
    pub fn events(&self) -> Vec<Event> {
        let mut events = self.events.lock().unwrap().clone();
        events.sort_by_key(|e| e.at);
        events
    }

    /// `f` over the events recorded so far (in the order recorded), without copying them.
    pub fn scan<R>(&self, f: impl FnOnce(&[Event]) -> R) -> R {
        f(&self.events.lock().unwrap())
    }
}
