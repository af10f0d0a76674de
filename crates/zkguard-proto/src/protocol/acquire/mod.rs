//! The acquisition as a state machine: every decision of the priority-lock recipe (queue with
//! the fast path or a plain create, find what a lost create made, who is ahead, what to watch,
//! when to take the mutex and whether to verify, give it back, promote a starving waiter, give
//! up, whether to carry the release of the lock before, when to wake), with no I/O and no
//! clock of its own. [`Acquisition::start`] and [`Acquisition::handle`] take the time the
//! acquisition has run and return the next [`Action`]; the driver (`zk::acquire` in
//! production, the model check in the tests) performs it and answers with an [`Input`]. While
//! it waits, [`Acquisition::poll_timeout`] says when the core next needs to look again without
//! any event (as `quinn-proto`'s `poll_timeout`).
//!
//! See `docs/zookeeper-lock.md` for the recipe and its arguments.

mod guess;
mod queue;
mod recover;
mod take;

pub use take::Awaits;

use super::remove::Removal;
use std::time::Duration;

use super::learned::{Lessons, SessionKnowledge};
use super::types::{
    Action, Code, Content, Fired, Input, Mode, MultiError, Op, Reply, Request, Send, Target,
};
use super::Flaw;
use crate::zk::names::Queue;

/// What an acquisition is. What its session learned comes with it to [`Acquisition::new`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Spec {
    /// This session's id (the owner of its ephemeral nodes).
    pub me: i64,
    /// This acquisition's attempt id, in the data of every node it creates.
    pub attempt: String,
    /// The attempt id of its node should a starving background waiter be re-queued.
    pub promoted_attempt: String,
    /// Its class prefix (`A` foreground, `B` background by default).
    pub prefix: String,
    /// The foreground prefix.
    pub foreground: String,
    /// The background prefix.
    pub background: String,
    /// A zero timeout: one fast-path round trip, never queued.
    pub try_once: bool,
    /// How long after its start the acquisition gives up (`None`: never).
    pub deadline: Option<Duration>,
    /// How long a waiter of a class other than the foreground one waits before it is
    /// re-queued as foreground (`zookeeper.background.max.wait`; `None`: never).
    pub promote_after: Option<Duration>,
    /// The lock `release_and_acquire` releases, if any.
    pub previous: Option<Previous>,
    /// How many nodes the lock root has, from the top (`/zkguard/locks`: 2).
    pub root_depth: usize,
    /// A deliberate flaw, to show that the model check finds one. `None` in production.
    pub flaw: Option<Flaw>,
}

/// The lock that an acquisition releases (`release_and_acquire`), as far as the choice of
/// carrying its release in the acquisition's first multi needs it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Previous {
    /// It is held through the acquisition's own session (a lock of another session, or one
    /// lost, is released on its own first).
    pub held_here: bool,
    /// A waiter of this session waits at a hand-over point for it: its release hands it to
    /// that waiter, on its own.
    pub awaited: bool,
    /// The zxid that created its `privateLock`, when it is a lock of the same monitor and that
    /// zxid is exactly its mutex's creation (a take that set the monitor's data, or read the
    /// mutex's `czxid`). A queue node created in its release's multi then finds the node just
    /// ahead of it without reading the queue (see `docs/zookeeper-lock.md`, "The node ahead
    /// without a listing"). `None` otherwise.
    pub take_here: Option<i64>,
}

/// How an acquisition ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Held.
    Acquired {
        /// The zxid of the take (the token is derived from it).
        zxid: i64,
        /// The monitor's data version the take left, if it set it.
        version: Option<i32>,
        /// Taken on a monitor with no other node (its release needs no hand-over mark).
        alone: bool,
        /// Its queue node.
        node: String,
        /// Other contenders were seen.
        others_seen: bool,
    },
    /// Not acquired by the deadline (or, trying once, busy); its nodes were removed.
    TimedOut,
    /// ZooKeeper refused or failed a request; what is left goes to the session's reaper.
    Failed {
        /// What went wrong.
        code: Code,
        /// While doing what.
        context: &'static str,
    },
    /// The session ended while waiting (its nodes went with it).
    Ended,
}

/// What an unfinished acquisition owns, for the session's reaper.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Leftovers {
    /// Its queue node.
    pub node: Option<String>,
    /// It holds the mutex.
    pub holds_mutex: bool,
    /// A create's answer was not handled: search for what it made by this attempt id.
    pub search: Option<String>,
    /// The attempt id its node and mutex carry.
    pub attempt: String,
}

/// How a contender step ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Step {
    Acquired {
        zxid: i64,
        version: Option<i32>,
    },
    /// Wait; an empty queue means "not read yet".
    Wait(Queue),
    /// First in line while the mutex is held: wait for it, then take it.
    FirstInLine,
    /// The mutex is held and the contender did not queue (try once).
    Busy,
}

/// Which queueing round a create belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum QueueRound {
    /// The first: fast path, carried release, deadline checked.
    FirstTry,
    /// After the contender's node disappeared while its session lives.
    AfterNodeLost,
    /// Re-queueing a starving background waiter as foreground; its old node (of the old
    /// attempt id) goes once the new one exists.
    Promotion {
        old: Option<String>,
        old_attempt: String,
    },
}

/// Where to go once the mutex was given back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum OnceGivenBack {
    /// Continue with the step; a failure fails the acquisition.
    Continue(Step),
    /// The fast path for sessions that may not recreate monitors: a failure is the queueing's.
    ListedFastPath(Step),
    /// Recovery after a lost create: a failure is the recovery's.
    Recovery(QueueRound),
}

/// What the acquisition waits for: the answer to the requests it sent, an event (a watch, a
/// reconnection, the wake-up of [`Acquisition::poll_timeout`]) or a removal it runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Awaiting {
    /// Nothing sent yet.
    NotStarted,
    /// The fast path's multi (carried by the release of the lock before, or not).
    FastPathAnswer { carried: bool },
    /// The multi of the fast path of a session that may not recreate monitors.
    ListedFastPathAnswer,
    /// A plain create of the queue node.
    CreateAnswer(QueueRound),
    /// The create of the queue node carried by the release of the lock before, and the reads
    /// behind it.
    CarriedCreateAnswer,
    /// The create of the monitor node (`root == None`) or of the lock root's `root`-th node.
    ParentCreateAnswer {
        mode: QueueRound,
        root: Option<usize>,
        again: bool,
    },
    /// The reconnection, to search for what a create whose answer was lost made.
    ReconnectionToRecover(QueueRound),
    /// The queue's listing of that search.
    RecoveryListing(QueueRound),
    /// The reads of the search's candidate nodes, `names[next]` on.
    RecoveryReads {
        mode: QueueRound,
        names: Vec<String>,
        next: usize,
    },
    /// The read of the mutex in that search.
    RecoveryMutexRead(QueueRound),
    /// The queue's listing.
    QueueListing,
    /// The reconnection, to list the queue.
    ReconnectionToList,
    /// The watch on the node ahead to be set.
    WatchOnAheadSet { was_second: bool, ahead: String },
    /// The watch to be set on the node that the sequence numbers say is just ahead, if it was
    /// created before `before` (the zxid of the take of the lock released in the same multi).
    WatchOnGuessSet { ahead: String, before: i64 },
    /// The node ahead to go (its watch to fire).
    AheadToGo { was_second: bool, ahead: String },
    /// The watch on the mutex to be set.
    WatchOnMutexSet,
    /// The mutex to go (its watch to fire).
    MutexToGo,
    /// The reconnection, to look at the queue again.
    ReconnectionToLookAgain,
    /// The take of the mutex (verifying the order in the same round trip, or not).
    TakeAnswer { verify: bool },
    /// The reconnection, to find out whether a take whose answer was lost went through.
    ReconnectionToCheckTake,
    /// The read of the mutex behind a sync, after that reconnection.
    TakeCheckAnswer,
    /// The listing that verifies the order after a take (made by `zxid`).
    TakeVerifyAnswer { zxid: i64 },
    /// The removal that gives the mutex back, then goes on as `then` says.
    MutexGivenBack {
        removal: Removal,
        then: OnceGivenBack,
    },
    /// The removal of a promoted waiter's old node, then `step`.
    OldNodeRemoved { removal: Removal, step: Step },
    /// The driver's description of what stands in the way, before giving up.
    BlockerDescribed,
    /// The removal of its nodes, giving up.
    NodesRemoved { removal: Removal },
    /// Nothing more: finished.
    Nothing,
}

/// One acquisition of one monitor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Acquisition {
    spec: Spec,
    prefix: String,
    attempt: String,
    promoted: bool,
    node: Option<String>,
    holds_mutex: bool,
    /// The monitor's data version that its take of the mutex left, while it holds it.
    take_version: Option<i32>,
    in_flight: bool,
    /// The attempt id of a promotion's create (its node is not `node` yet, which carries
    /// `attempt`).
    flight_attempt: Option<String>,
    alone: bool,
    armed: bool,
    others_seen: bool,
    tried: bool,
    /// A lock of this session waits to be released with this acquisition's next multi.
    carrier: bool,
    /// The zxid of the carried lock's take on this monitor (see [`Previous::take_here`]), when
    /// its release is carried.
    carried_take: Option<i64>,
    /// The monitor met contention lately: queue with a plain create, skipping the fast path.
    contended_before: bool,
    /// The session may delete and recreate monitor nodes (refused once: never again).
    recreate: bool,
    /// The session may write monitor nodes (takes set its data; releases check it).
    versioned: bool,
    /// How long the acquisition has run, as of the last call.
    elapsed: Duration,
    awaiting: Awaiting,
    outcome: Option<Outcome>,
}

impl Acquisition {
    /// A new acquisition of `monitor` (the key of its contention in `session`, the knowledge
    /// of the session it runs on). It carries the release of the lock before
    /// ([`Spec::previous`]) when that lock is held here, nobody of the session awaits it and
    /// the acquisition may queue: see [`Acquisition::carrying`].
    pub fn new(spec: Spec, session: &SessionKnowledge, monitor: &str) -> Self {
        let carry = spec
            .previous
            .as_ref()
            .is_some_and(|p| !spec.try_once && p.held_here && !p.awaited);
        let carried_take = spec
            .previous
            .as_ref()
            .filter(|_| carry)
            .and_then(|p| p.take_here);
        Self {
            prefix: spec.prefix.clone(),
            attempt: spec.attempt.clone(),
            promoted: false,
            node: None,
            holds_mutex: false,
            take_version: None,
            in_flight: false,
            flight_attempt: None,
            alone: false,
            armed: true,
            others_seen: false,
            tried: false,
            carrier: carry,
            carried_take,
            // Fast path: one multi that recreates the monitor node, empty, with our queue node
            // and the mutex in it; skipped on a monitor that was busy lately.
            contended_before: session.contended(monitor) && !spec.try_once,
            recreate: session.recreate(),
            versioned: session.versioned(),
            elapsed: Duration::ZERO,
            awaiting: Awaiting::NotStarted,
            outcome: None,
            spec,
        }
    }

    /// The current class prefix (foreground once a starving background waiter was promoted).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Its queue node, if it has one.
    pub fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    /// The attempt id of the nodes it creates now (a starving waiter's new node has its own).
    pub fn attempt(&self) -> &str {
        self.flight_attempt.as_deref().unwrap_or(&self.attempt)
    }

    /// Whether its node says it was promoted.
    pub fn promoted(&self) -> bool {
        self.promoted
    }

    /// Whether a lock waits to be released with this acquisition's next multi. Right after
    /// [`Acquisition::new`], `false` while [`Spec::previous`] is set means that the driver
    /// releases that lock on its own, at once.
    pub fn carrying(&self) -> bool {
        self.carrier
    }

    /// When (how long after its start) the acquisition next needs to look again if nothing
    /// happens: its deadline, or, for a waiter of a class other than the foreground one, its
    /// promotion; `None` when neither comes. The driver wakes it then
    /// with [`Input::Woke`] while it waits for a watch.
    pub fn poll_timeout(&self) -> Option<Duration> {
        let promotion = self
            .spec
            .promote_after
            .filter(|_| self.may_be_promoted() && self.spec.flaw != Some(Flaw::WakeOnlyAtDeadline));
        match (self.spec.deadline, promotion) {
            (Some(deadline), Some(promotion)) => Some(deadline.min(promotion)),
            (deadline, promotion) => deadline.or(promotion),
        }
    }

    /// A waiter of a class other than the foreground one (its node not re-queued as
    /// foreground yet).
    fn may_be_promoted(&self) -> bool {
        self.prefix != self.spec.foreground
    }

    /// Whether its deadline has passed.
    fn past_deadline(&self) -> bool {
        self.spec.deadline.is_some_and(|d| self.elapsed >= d)
    }

    /// Whether a starving background waiter is due to be re-queued as foreground.
    fn promote_due(&self) -> bool {
        self.may_be_promoted() && self.spec.promote_after.is_some_and(|d| self.elapsed >= d)
    }

    /// Teaches `session` (the knowledge of the session it runs on, which it was started with)
    /// what its last step learnt of it: a refusal of the session's ACL at once, and, once it
    /// acquired `monitor`, whether it met others. Call it once after every step
    /// ([`Acquisition::handle`]), so that concurrent acquisitions of the session benefit at
    /// once; the step that acquires is the last, so its contention counts once.
    pub fn teach(&self, session: &mut SessionKnowledge, monitor: &str) -> Lessons {
        let others = match &self.outcome {
            Some(Outcome::Acquired { others_seen, .. }) => Some(*others_seen),
            _ => None,
        };
        session.learn(monitor, self.recreate, self.versioned, others)
    }

    /// Whether the session may still recreate monitor nodes (refused once: never again).
    pub fn recreate(&self) -> bool {
        self.recreate
    }

    /// Whether the session may still write monitor nodes.
    pub fn versioned(&self) -> bool {
        self.versioned
    }

    /// Whether the last action sent is the fast path's multi alone (no release carried), which
    /// the driver may send in one multi with other acquisitions' fast paths (`zk::batch`).
    pub fn sending_fast_path(&self) -> bool {
        matches!(self.awaiting, Awaiting::FastPathAnswer { carried: false })
    }

    /// How it ended, once [`Action::Done`] was returned.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// What the session's reaper must remove if the acquisition goes away now.
    pub fn leftovers(&self) -> Option<Leftovers> {
        if let Awaiting::NodesRemoved { removal } = &self.awaiting {
            // Giving up: what the removal under way deletes is the acquisition's until it is
            // done (an acquisition abandoned at its deadline's overrun may be here).
            let (node, mutex) = removal.targets();
            return (node.is_some() || mutex).then(|| Leftovers {
                node: node.map(str::to_string),
                holds_mutex: mutex,
                search: None,
                attempt: self.attempt.clone(),
            });
        }
        if let Awaiting::OldNodeRemoved { removal, .. } = &self.awaiting {
            // A promoted waiter deleting its old node (of the old attempt id) behind its new
            // one: the old node is the removal's until it is done, and the new node (of the
            // new attempt id) is found by the reaper's search.
            if let (Some(old), _) = removal.targets() {
                return Some(Leftovers {
                    node: Some(old.to_string()),
                    holds_mutex: false,
                    search: Some(self.attempt.clone()),
                    attempt: removal.attempt().to_string(),
                });
            }
        }
        (self.armed && (self.node.is_some() || self.holds_mutex || self.in_flight)).then(|| {
            Leftovers {
                node: self.node.clone(),
                holds_mutex: self.holds_mutex,
                search: self.in_flight.then(|| {
                    self.flight_attempt
                        .clone()
                        .unwrap_or_else(|| self.attempt.clone())
                }),
                attempt: self.attempt.clone(),
            }
        })
    }

    /// The first action; `elapsed` is how long the acquisition has run (zero, or nearly).
    pub fn start(&mut self, elapsed: Duration) -> Action {
        self.elapsed = elapsed;
        self.queue_step()
    }

    /// Takes the driver's answer to the last action, `elapsed` after the acquisition's start.
    pub fn handle(&mut self, input: Input, elapsed: Duration) -> Action {
        self.elapsed = self.elapsed.max(elapsed);
        let awaiting = std::mem::replace(&mut self.awaiting, Awaiting::Nothing);
        match (awaiting, input) {
            (Awaiting::FastPathAnswer { carried }, Input::Replies(r)) => {
                self.on_fast_path(carried, r)
            }
            (Awaiting::ListedFastPathAnswer, Input::Replies(r)) => self.on_listed(r),
            (Awaiting::CreateAnswer(mode), Input::Replies(r)) => self.on_plain(mode, r),
            (Awaiting::CarriedCreateAnswer, Input::Replies(r)) => self.on_after(r),
            (Awaiting::ParentCreateAnswer { mode, root, again }, Input::Replies(r)) => {
                self.on_ensure(mode, root, again, first(r))
            }
            (Awaiting::ReconnectionToRecover(mode), Input::Connected) => self.recover(mode),
            (Awaiting::RecoveryListing(mode), Input::Replies(r)) => self.on_rec_list(mode, r),
            (Awaiting::RecoveryReads { mode, names, next }, Input::Replies(r)) => {
                self.on_rec_read(mode, names, next, first(r))
            }
            (Awaiting::RecoveryMutexRead(mode), Input::Replies(r)) => {
                self.on_rec_mutex(mode, first(r))
            }
            (Awaiting::QueueListing, Input::Replies(r)) => self.on_listing(first(r)),
            (Awaiting::ReconnectionToList, Input::Connected) => self.read_queue(),
            (Awaiting::WatchOnAheadSet { was_second, ahead }, Input::Replies(r)) => {
                self.on_ahead_watched(was_second, ahead, first(r))
            }
            (Awaiting::WatchOnGuessSet { ahead, before }, Input::Replies(r)) => {
                self.on_guess(ahead, before, first(r))
            }
            (Awaiting::AheadToGo { was_second, .. }, Input::Fired(fired)) => {
                self.on_ahead_gone(was_second, fired)
            }
            (Awaiting::AheadToGo { .. } | Awaiting::MutexToGo, Input::Woke) => {
                self.step(Step::Wait(Queue::default()))
            }
            (Awaiting::AheadToGo { .. } | Awaiting::MutexToGo, Input::Ended) => {
                // Session gone: its ephemeral nodes are gone too.
                self.armed = false;
                self.finish(Outcome::Ended)
            }
            (Awaiting::WatchOnMutexSet, Input::Replies(r)) => self.on_mutex_watched(first(r)),
            // The end of the session: the next request says how.
            (Awaiting::MutexToGo, Input::Fired(Fired::Session)) => {
                self.step(Step::Wait(Queue::default()))
            }
            (Awaiting::MutexToGo, Input::Fired(_)) => {
                let verify = !self.sorts_first();
                self.take(verify)
            }
            (Awaiting::ReconnectionToLookAgain, Input::Connected) => {
                self.step(Step::Wait(Queue::default()))
            }
            (Awaiting::TakeAnswer { verify }, Input::Replies(r)) => self.on_take(verify, r),
            (Awaiting::ReconnectionToCheckTake, Input::Connected) => {
                self.awaiting = Awaiting::TakeCheckAnswer;
                // A lagging follower may not have applied our create yet: read after a sync.
                // The monitor is read first: its data version, should the mutex be ours, is the
                // one our take left (read after the mutex, it may be a later take's).
                send(vec![
                    Request::Sync(Target::Monitor),
                    Request::GetData(Target::Monitor),
                    Request::GetData(Target::Mutex),
                ])
            }
            (Awaiting::TakeCheckAnswer, Input::Replies(r)) => self.on_take_check(r),
            (Awaiting::TakeVerifyAnswer { zxid }, Input::Replies(r)) => {
                self.on_take_verify(zxid, r)
            }
            (Awaiting::MutexGivenBack { mut removal, then }, input) => {
                match removal.handle(input) {
                    Action::Done => self.yielded(removal, then),
                    action => {
                        self.awaiting = Awaiting::MutexGivenBack { removal, then };
                        action
                    }
                }
            }
            (Awaiting::OldNodeRemoved { mut removal, step }, input) => {
                match removal.handle(input) {
                    // Its outcome does not matter: the session's end removes a node left behind.
                    Action::Done => self.step(step),
                    action => {
                        self.awaiting = Awaiting::OldNodeRemoved { removal, step };
                        action
                    }
                }
            }
            (Awaiting::BlockerDescribed, Input::Described) => self.remove_nodes(),
            (Awaiting::NodesRemoved { mut removal }, input) => match removal.handle(input) {
                Action::Done => self.finish(Outcome::TimedOut),
                action => {
                    self.awaiting = Awaiting::NodesRemoved { removal };
                    action
                }
            },
            (awaiting, input) => {
                self.awaiting = awaiting;
                self.fail(
                    Code::Other(format!("unexpected input {input:?}")),
                    "driving the acquisition",
                )
            }
        }
    }

    /// The queue's listing came.
    fn on_listing(&mut self, reply: Reply) -> Action {
        match reply {
            Reply::Children(Ok((children, _))) => self.on_queue(Queue::from_children(&children)),
            Reply::Children(Err(Code::NoNode)) => self.on_queue(Queue::default()),
            Reply::Children(Err(code)) if code.is_lost() => {
                self.await_connected(Awaiting::ReconnectionToList)
            }
            other => self.fail(code_of(other), "reading the queue"),
        }
    }

    /// The watch on the node ahead was set (or the node was gone already).
    fn on_ahead_watched(&mut self, was_second: bool, ahead: String, reply: Reply) -> Action {
        match reply {
            Reply::Data(Ok(_)) => {
                self.awaiting = Awaiting::AheadToGo { was_second, ahead };
                Action::AwaitWatch
            }
            // Gone before it could be watched: as if woken by its deletion.
            Reply::Data(Err(Code::NoNode)) if was_second => {
                let verify = !self.sorts_first();
                self.take(verify)
            }
            Reply::Data(Err(Code::NoNode)) => self.step(Step::Wait(Queue::default())),
            Reply::Data(Err(code)) if code.is_lost() => {
                self.await_connected(Awaiting::ReconnectionToLookAgain)
            }
            other => self.fail(code_of(other), "watching the node ahead"),
        }
    }

    /// The node just ahead left. If it left as the holder (the hand-over mark), or it was the
    /// head at our listing, every node that was ahead of us is gone. A first-class node is then
    /// certainly first; any other verifies.
    fn on_ahead_gone(&mut self, was_second: bool, fired: Fired) -> Action {
        let handed_over = fired == Fired::DataChanged;
        let deleted = fired == Fired::Deleted;
        if handed_over || was_second {
            let first_class = self.sorts_first()
                || (handed_over && self.spec.flaw == Some(Flaw::MarkTrustedByAnyClass));
            let verify = !((handed_over || deleted) && first_class);
            self.take(verify)
        } else {
            self.step(Step::Wait(Queue::default()))
        }
    }

    /// The watch on the mutex was set (or the mutex was gone already).
    fn on_mutex_watched(&mut self, reply: Reply) -> Action {
        match reply {
            Reply::Data(Ok(_)) => {
                self.awaiting = Awaiting::MutexToGo;
                Action::AwaitWatch
            }
            Reply::Data(Err(Code::NoNode)) => {
                let verify = !self.sorts_first();
                self.take(verify)
            }
            Reply::Data(Err(code)) if code.is_lost() => {
                self.await_connected(Awaiting::ReconnectionToLookAgain)
            }
            other => self.fail(code_of(other), "watching the mutex node"),
        }
    }

    /// Giving up, once what stood in the way was described: remove its nodes.
    fn remove_nodes(&mut self) -> Action {
        let node = self.node.take();
        let removal = Removal::delete(self.spec.me, &self.attempt, node, self.holds_mutex);
        let mut removal = self.own(removal);
        self.holds_mutex = false;
        match removal.start() {
            Action::Done => self.finish(Outcome::TimedOut),
            action => {
                self.awaiting = Awaiting::NodesRemoved { removal };
                action
            }
        }
    }

    /// Whether a node of the current prefix sorts before every node another contender can
    /// create: once first in line (or once the node ahead, the head, went), it stays first.
    fn sorts_first(&self) -> bool {
        self.prefix <= self.spec.foreground && self.prefix <= self.spec.background
    }

    fn finish(&mut self, outcome: Outcome) -> Action {
        self.awaiting = Awaiting::Nothing;
        self.outcome = Some(outcome);
        Action::Done
    }

    fn fail(&mut self, code: Code, context: &'static str) -> Action {
        self.finish(Outcome::Failed { code, context })
    }

    fn await_connected(&mut self, next: Awaiting) -> Action {
        self.awaiting = next;
        Action::AwaitConnected
    }

    fn send_carried(&mut self, awaiting: Awaiting, requests: Vec<Request>, carry: bool) -> Action {
        self.awaiting = awaiting;
        // A lock waiting to be released goes on its own before an uncarried request.
        self.carrier = carry;
        Action::Send(Send { requests, carry })
    }

    fn send(&mut self, awaiting: Awaiting, requests: Vec<Request>) -> Action {
        self.send_carried(awaiting, requests, false)
    }

    /// A removal of this acquisition's: its careful deletes check the lock root's version
    /// ([`Removal::with_lock_root`]); with the core's flaw, if any.
    fn own(&self, removal: Removal) -> Removal {
        removal
            .with_lock_root(self.spec.root_depth)
            .with_flaw(self.spec.flaw)
    }

    /// The `setData` of the lock root that goes with every creation of a monitor, in the same
    /// transaction: its data version names the monitors' creations ([`Removal::with_lock_root`]).
    /// `None` for monitors at ZooKeeper's root.
    fn root_bump(&self) -> Option<Op> {
        let target = Target::Root(self.spec.root_depth.checked_sub(1)?);
        Some(Op::SetData { target })
    }

    fn new_node(&self) -> Op {
        Op::Create {
            target: Target::Node(self.prefix.clone()),
            content: Content::Contender,
            mode: Mode::EphemeralSequential,
        }
    }

    fn mutex_create(&self, content: Content) -> Op {
        Op::Create {
            target: Target::Mutex,
            content,
            mode: Mode::Ephemeral,
        }
    }

    // ---------------------------------------------------------------- waiting

    /// The main loop: what a step leads to.
    fn step(&mut self, step: Step) -> Action {
        match step {
            Step::Acquired { zxid, version } => {
                self.armed = false;
                let node = self.node.clone().expect("acquired with a node");
                self.finish(Outcome::Acquired {
                    zxid,
                    version,
                    alone: self.alone,
                    node,
                    others_seen: self.others_seen,
                })
            }
            Step::Busy => self.give_up(),
            Step::Wait(_) | Step::FirstInLine if self.spec.try_once => self.give_up(),
            // Our turn came while the mutex is still held: wait for it (a data watch, which
            // leaves nothing on the server when the node is already gone).
            Step::FirstInLine => self.send(
                Awaiting::WatchOnMutexSet,
                vec![Request::Watch(Target::Mutex)],
            ),
            Step::Wait(queue) if queue.nodes.is_empty() => self.read_queue(),
            Step::Wait(queue) => self.on_queue(queue),
        }
    }

    fn read_queue(&mut self) -> Action {
        self.send(
            Awaiting::QueueListing,
            vec![Request::GetChildren(Target::Monitor)],
        )
    }

    fn on_queue(&mut self, queue: Queue) -> Action {
        self.others_seen |= queue.nodes.len() > 1 || queue.mutex_present;
        let node = self.node.clone().expect("waiting with a node");
        let Some(pos) = queue.position(&node) else {
            // Our node is gone while our session lives: someone deleted it. Queue again.
            self.node = None;
            return self.plain_create(QueueRound::AfterNodeLost);
        };
        if self.past_deadline() {
            return self.give_up();
        }
        if self.promote_due() {
            // A starving background waiter: a foreground node first, then the old one goes.
            let old = self.node.clone();
            let old_attempt = self.attempt.clone();
            // Until the new node exists, the old one (of the old attempt) is the contender's.
            self.flight_attempt = Some(self.spec.promoted_attempt.clone());
            self.promoted = true;
            let prefix = std::mem::replace(&mut self.prefix, self.spec.foreground.clone());
            let action = self.plain_create(QueueRound::Promotion { old, old_attempt });
            // The new node is of the foreground class; `prefix` changes once it exists.
            self.prefix = prefix;
            if let Action::Send(mut send) = action {
                send.requests[0] = Request::Single(Op::Create {
                    target: Target::Node(self.spec.foreground.clone()),
                    content: Content::Contender,
                    mode: Mode::EphemeralSequential,
                });
                return Action::Send(send);
            }
            return action;
        }
        if pos == 0 {
            // First (we just read the queue): take the mutex if free, else wait for it. A node
            // of another class than the first verifies in the same round trip: a first-class
            // contender queued since the read sorts ahead of it.
            return if queue.mutex_present {
                self.step(Step::FirstInLine)
            } else {
                let verify = !self.sorts_first();
                self.take(verify)
            };
        }
        let pred = queue
            .predecessor(&node)
            .map_or_else(String::new, |p| p.name.clone());
        self.send(
            Awaiting::WatchOnAheadSet {
                was_second: pos == 1,
                ahead: pred.clone(),
            },
            vec![Request::Watch(Target::Node(pred))],
        )
    }

    // ---------------------------------------------------------------- giving up

    /// Timeout (or busy, trying once): find out what stands in the way, remove our nodes
    /// (retrying on connection loss), then report.
    fn give_up(&mut self) -> Action {
        self.awaiting = Awaiting::BlockerDescribed;
        Action::Describe
    }
}

fn first(replies: Vec<Reply>) -> Reply {
    replies.into_iter().next().unwrap_or(Reply::Skipped)
}

/// The error in a reply that is not the one expected.
fn code_of(reply: Reply) -> Code {
    match reply {
        Reply::Created(Err(code))
        | Reply::Deleted(Err(code))
        | Reply::Children(Err(code))
        | Reply::Data(Err(code))
        | Reply::Synced(Err(code))
        | Reply::Multi(Err(MultiError::Failed { code, .. } | MultiError::Request(code))) => code,
        other => Code::Other(format!("an answer out of shape: {other:?}")),
    }
}

fn code_of_opt(reply: Option<Reply>) -> Code {
    reply.map_or_else(|| Code::Other("no answer".into()), code_of)
}

fn send(requests: Vec<Request>) -> Action {
    Action::Send(Send {
        requests,
        carry: false,
    })
}

#[cfg(test)]
mod tests {
    use super::super::types::{OpResult, Stat};
    use super::*;

    fn spec() -> Spec {
        Spec {
            me: 7,
            attempt: "a1".into(),
            promoted_attempt: "a1p".into(),
            prefix: "A".into(),
            foreground: "A".into(),
            background: "B".into(),
            try_once: false,
            deadline: Some(Duration::from_secs(10)),
            promote_after: None,
            previous: None,
            root_depth: 2,
            flaw: None,
        }
    }

    fn new(spec: Spec) -> Acquisition {
        Acquisition::new(spec, &SessionKnowledge::new(), "m")
    }

    /// A create whose answer cannot be read, for whatever reason, may have been applied: the
    /// attempt stays in doubt, so that a caller that gives up has the reaper search for what it
    /// made (an applied `privateLock` would otherwise stay for the session's lifetime). A
    /// refused one applied nothing.
    #[test]
    fn a_create_whose_answer_cannot_be_read_stays_in_doubt() {
        // A refused multi is seen by a try-once contender, which then gives up: nothing of it
        // is left to search for.
        for (error, in_doubt) in [
            (
                MultiError::Request(Code::Lost("connection loss".into())),
                true,
            ),
            (
                MultiError::Request(Code::Other("answered out of shape".into())),
                true,
            ),
            (
                MultiError::Failed {
                    index: 0,
                    code: Code::NotEmpty,
                },
                false,
            ),
        ] {
            let mut acq = new(Spec {
                try_once: !in_doubt,
                ..spec()
            });
            assert!(matches!(acq.start(Duration::ZERO), Action::Send(_)));
            acq.handle(
                Input::Replies(vec![Reply::Multi(Err(error))]),
                Duration::ZERO,
            );
            let search = acq.leftovers().and_then(|l| l.search);
            assert_eq!(search.is_some(), in_doubt, "{search:?}");
        }
    }

    /// The fast path is one request, and its success is the hold: the token is the multi's zxid.
    #[test]
    fn the_fast_path_takes_a_quiet_lock_in_one_request() {
        let mut acq = new(spec());
        let Action::Send(send) = acq.start(Duration::ZERO) else {
            panic!("the fast path sends first");
        };
        assert_eq!(send.requests.len(), 1);
        let created = |name: &str| OpResult::Create {
            name: name.into(),
            stat: Stat::default(),
        };
        let set = OpResult::SetData {
            stat: Stat {
                mzxid: 42,
                version: 3,
                ..Stat::default()
            },
        };
        // The lock root's `setData` last: every creation of a monitor moves its version.
        let Request::Multi(ops) = &send.requests[0] else {
            panic!("the fast path is a multi");
        };
        assert_eq!(
            ops.last(),
            Some(&Op::SetData {
                target: Target::Root(1)
            })
        );
        let root = OpResult::SetData {
            stat: Stat {
                mzxid: 42,
                version: 17,
                ..Stat::default()
            },
        };
        let reply = Reply::Multi(Ok(vec![
            OpResult::Delete,
            created("monitor"),
            created("A-0000000000"),
            created("privateLock"),
            set,
            root,
        ]));
        assert_eq!(
            acq.handle(Input::Replies(vec![reply]), Duration::ZERO),
            Action::Done
        );
        assert_eq!(
            acq.outcome(),
            Some(&Outcome::Acquired {
                zxid: 42,
                version: Some(3),
                alone: true,
                node: "A-0000000000".into(),
                others_seen: false,
            })
        );
        assert!(acq.leftovers().is_none());
    }

    /// The release of the lock before rides in the first multi only when that lock is held
    /// through this session, no waiter of the session awaits it, and the acquisition queues;
    /// the zxid of its take on the same monitor comes along only then.
    #[test]
    fn the_release_before_is_carried_only_where_it_can_be() {
        let previous = Previous {
            held_here: true,
            awaited: false,
            take_here: Some(5),
        };
        for (previous, try_once, carried) in [
            (previous.clone(), false, true),
            (previous.clone(), true, false),
            (
                Previous {
                    held_here: false,
                    ..previous.clone()
                },
                false,
                false,
            ),
            (
                Previous {
                    awaited: true,
                    ..previous.clone()
                },
                false,
                false,
            ),
        ] {
            let acq = new(Spec {
                previous: Some(previous.clone()),
                try_once,
                ..spec()
            });
            assert_eq!(acq.carrying(), carried, "{previous:?}, try once {try_once}");
            assert_eq!(acq.carried_take, carried.then_some(5));
        }
        assert!(!new(spec()).carrying());
    }

    /// The core says when it next needs to look again: at its deadline, or sooner at a
    /// background waiter's promotion; a foreground waiter is never promoted.
    #[test]
    fn it_wakes_at_its_deadline_or_its_promotion() {
        let promote = Some(Duration::from_secs(3));
        let background = new(Spec {
            prefix: "B".into(),
            promote_after: promote,
            ..spec()
        });
        assert_eq!(background.poll_timeout(), promote);
        let foreground = new(Spec {
            promote_after: promote,
            ..spec()
        });
        assert_eq!(foreground.poll_timeout(), Some(Duration::from_secs(10)));
        let endless = new(Spec {
            deadline: None,
            ..spec()
        });
        assert_eq!(endless.poll_timeout(), None);
    }

    /// A session learns its ACL's refusals at once and a monitor's contention from two
    /// contended acquisitions; then the next acquisition of that monitor skips the fast path.
    #[test]
    fn a_session_learns_from_its_acquisitions() {
        let mut session = SessionKnowledge::new();
        for round in 0..2 {
            let mut acq = Acquisition::new(spec(), &session, "m");
            assert!(!acq.contended_before, "round {round}");
            acq.start(Duration::ZERO);
            acq.outcome = Some(Outcome::Acquired {
                zxid: 1,
                version: None,
                alone: false,
                node: "A-0000000001".into(),
                others_seen: true,
            });
            assert_eq!(acq.teach(&mut session, "m"), Lessons::default());
        }
        assert!(session.contended("m") && !session.contended("n"));
        assert!(Acquisition::new(spec(), &session, "m").contended_before);
        let mut refused = Acquisition::new(spec(), &session, "n");
        refused.recreate = false;
        let lessons = refused.teach(&mut session, "n");
        assert!(lessons.no_recreate && !lessons.no_versioned_takes);
        assert!(!session.recreate() && session.versioned());
        assert_eq!(refused.teach(&mut session, "n"), Lessons::default());
    }
}
