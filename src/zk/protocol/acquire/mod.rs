//! The acquisition as a state machine: every decision of the priority-lock recipe (queue with
//! the fast path or a plain create, find what a lost create made, who is ahead, what to watch,
//! when to take the mutex and whether to verify, give it back, promote a starving waiter, give
//! up), with no I/O. [`Acquisition::start`] and [`Acquisition::handle`] return the next
//! [`Action`]; the driver (`zk::acquire` in production, the model check in the tests) performs
//! it and answers with an [`Input`].
//!
//! See `docs/zookeeper-lock.md` for the recipe and its arguments.

mod guess;
mod queue;
mod recover;
mod take;

pub use take::Awaits;

use super::remove::Removal;
use super::types::{
    Action, Code, Content, Fired, Input, Mode, MultiError, Now, Op, Reply, Request, Send, Target,
};
use super::Flaw;
use crate::zk::names::Queue;

/// What an acquisition is, and what its session knows.
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
    /// The monitor met contention lately: queue with a plain create, skipping the fast path.
    pub contended_before: bool,
    /// A lock of this session is to be released in this acquisition's first multi.
    pub carry: bool,
    /// The zxid that created the `privateLock` of the lock released in this acquisition's
    /// first multi, when it is a lock of the same monitor and that zxid is exactly its mutex's
    /// creation (a take that set the monitor's data, or read the mutex's `czxid`). The new
    /// queue node then finds the node just ahead of it without reading the queue (see
    /// `docs/zookeeper-lock.md`, "The node ahead without a listing"). `None` otherwise.
    pub carried_take: Option<i64>,
    /// How many nodes the lock root has, from the top (`/zkguard/locks`: 2).
    pub root_depth: usize,
    /// The session may delete and recreate monitor nodes (the fast path's multi).
    pub recreate: bool,
    /// The session may write monitor nodes (takes set its data; releases check it).
    pub versioned: bool,
    /// A deliberate flaw, to show that the model check finds one. `None` in production.
    pub flaw: Option<Flaw>,
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

/// Which queueing loop a create belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Mode2 {
    /// The first: fast path, carried release, deadline checked.
    First,
    /// After the contender's node disappeared while its session lives.
    Again,
    /// Re-queueing a starving background waiter as foreground.
    Promote {
        old: Option<String>,
        old_attempt: String,
    },
}

/// Where to go once the mutex was given back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Yielded {
    /// Continue with the step; a failure fails the acquisition.
    Step(Step),
    /// The fast path for sessions that may not recreate monitors: a failure is the queueing's.
    Listed(Step),
    /// Recovery after a lost create: a failure is the recovery's.
    Recovered(Mode2),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum St {
    Start,
    FastPath {
        carried: bool,
    },
    Listed,
    Plain(Mode2),
    After,
    /// Creating the monitor node (`root == None`) or the lock root's `root`-th node.
    Ensure {
        mode: Mode2,
        root: Option<usize>,
        again: bool,
    },
    RecConnect(Mode2),
    RecList(Mode2),
    RecRead {
        mode: Mode2,
        names: Vec<String>,
        next: usize,
    },
    RecMutex(Mode2),
    Reading,
    ReadConnect,
    WatchingAhead {
        was_second: bool,
        ahead: String,
    },
    /// Watching the node that the sequence numbers say is just ahead, if it was created
    /// before `before` (the zxid of the take of the lock released in the same multi).
    WatchingGuess {
        ahead: String,
        before: i64,
    },
    AwaitAhead {
        was_second: bool,
        ahead: String,
    },
    WatchingMutex,
    AwaitMutex,
    LookAgainConnect,
    Taking {
        verify: bool,
    },
    TakeConnect,
    TakeCheck,
    TakeVerify {
        zxid: i64,
    },
    Yielding {
        removal: Removal,
        then: Yielded,
    },
    Unqueueing {
        removal: Removal,
        step: Step,
    },
    Describing,
    GivingUp {
        removal: Removal,
    },
    Done,
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
    recreate: bool,
    versioned: bool,
    now: Now,
    st: St,
    outcome: Option<Outcome>,
}

impl Acquisition {
    /// A new acquisition.
    pub fn new(spec: Spec) -> Self {
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
            carrier: spec.carry,
            recreate: spec.recreate,
            versioned: spec.versioned,
            now: Now::default(),
            st: St::Start,
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
        matches!(self.st, St::FastPath { carried: false })
    }

    /// How it ended, once [`Action::Done`] was returned.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// What the session's reaper must remove if the acquisition goes away now.
    pub fn leftovers(&self) -> Option<Leftovers> {
        if let St::GivingUp { removal } = &self.st {
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
        if let St::Unqueueing { removal, .. } = &self.st {
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

    /// The first action.
    pub fn start(&mut self, now: Now) -> Action {
        self.now = now;
        self.queue_step()
    }

    /// Takes the driver's answer to the last action.
    pub fn handle(&mut self, input: Input, now: Now) -> Action {
        self.now = now;
        let st = std::mem::replace(&mut self.st, St::Done);
        match (st, input) {
            (St::FastPath { carried }, Input::Replies(r)) => self.on_fast_path(carried, r),
            (St::Listed, Input::Replies(r)) => self.on_listed(r),
            (St::Plain(mode), Input::Replies(r)) => self.on_plain(mode, r),
            (St::After, Input::Replies(r)) => self.on_after(r),
            (St::Ensure { mode, root, again }, Input::Replies(r)) => {
                self.on_ensure(mode, root, again, first(r))
            }
            (St::RecConnect(mode), Input::Connected) => self.recover(mode),
            (St::RecList(mode), Input::Replies(r)) => self.on_rec_list(mode, r),
            (St::RecRead { mode, names, next }, Input::Replies(r)) => {
                self.on_rec_read(mode, names, next, first(r))
            }
            (St::RecMutex(mode), Input::Replies(r)) => self.on_rec_mutex(mode, first(r)),
            (St::Reading, Input::Replies(r)) => match first(r) {
                Reply::Children(Ok((children, _))) => {
                    self.on_queue(Queue::from_children(&children))
                }
                Reply::Children(Err(Code::NoNode)) => self.on_queue(Queue::default()),
                Reply::Children(Err(code)) if code.is_lost() => {
                    self.await_connected(St::ReadConnect)
                }
                other => self.fail(code_of(other), "reading the queue"),
            },
            (St::ReadConnect, Input::Connected) => self.read_queue(),
            (St::WatchingAhead { was_second, ahead }, Input::Replies(r)) => match first(r) {
                Reply::Data(Ok(_)) => {
                    self.st = St::AwaitAhead { was_second, ahead };
                    Action::AwaitWatch
                }
                // Gone before it could be watched: as if woken by its deletion.
                Reply::Data(Err(Code::NoNode)) if was_second => {
                    let verify = !self.sorts_first();
                    self.take(verify)
                }
                Reply::Data(Err(Code::NoNode)) => self.step(Step::Wait(Queue::default())),
                Reply::Data(Err(code)) if code.is_lost() => {
                    self.await_connected(St::LookAgainConnect)
                }
                other => self.fail(code_of(other), "watching the node ahead"),
            },
            (St::WatchingGuess { ahead, before }, Input::Replies(r)) => {
                self.on_guess(ahead, before, first(r))
            }
            (St::AwaitAhead { was_second, .. }, Input::Fired(fired)) => {
                // The node just ahead left. If it left as the holder (the hand-over mark), or
                // it was the head at our listing, every node that was ahead of us is gone. A
                // first-class node is then certainly first; any other verifies.
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
            (St::AwaitAhead { .. } | St::AwaitMutex, Input::Woke) => {
                self.step(Step::Wait(Queue::default()))
            }
            (St::AwaitAhead { .. } | St::AwaitMutex, Input::Ended) => {
                // Session gone: its ephemeral nodes are gone too.
                self.armed = false;
                self.finish(Outcome::Ended)
            }
            (St::WatchingMutex, Input::Replies(r)) => match first(r) {
                Reply::Data(Ok(_)) => {
                    self.st = St::AwaitMutex;
                    Action::AwaitWatch
                }
                Reply::Data(Err(Code::NoNode)) => {
                    let verify = !self.sorts_first();
                    self.take(verify)
                }
                Reply::Data(Err(code)) if code.is_lost() => {
                    self.await_connected(St::LookAgainConnect)
                }
                other => self.fail(code_of(other), "watching the mutex node"),
            },
            // The end of the session: the next request says how.
            (St::AwaitMutex, Input::Fired(Fired::Session)) => {
                self.step(Step::Wait(Queue::default()))
            }
            (St::AwaitMutex, Input::Fired(_)) => {
                let verify = !self.sorts_first();
                self.take(verify)
            }
            (St::LookAgainConnect, Input::Connected) => self.step(Step::Wait(Queue::default())),
            (St::Taking { verify }, Input::Replies(r)) => self.on_take(verify, r),
            (St::TakeConnect, Input::Connected) => {
                self.st = St::TakeCheck;
                // A lagging follower may not have applied our create yet: read after a sync.
                // The monitor is read first: its data version, should the mutex be ours, is the
                // one our take left (read after the mutex, it may be a later take's).
                send(vec![
                    Request::Sync(Target::Monitor),
                    Request::GetData(Target::Monitor),
                    Request::GetData(Target::Mutex),
                ])
            }
            (St::TakeCheck, Input::Replies(r)) => self.on_take_check(r),
            (St::TakeVerify { zxid }, Input::Replies(r)) => self.on_take_verify(zxid, r),
            (St::Yielding { mut removal, then }, input) => match removal.handle(input) {
                Action::Done => self.yielded(removal, then),
                action => {
                    self.st = St::Yielding { removal, then };
                    action
                }
            },
            (St::Unqueueing { mut removal, step }, input) => match removal.handle(input) {
                // Its outcome does not matter: the session's end removes a node left behind.
                Action::Done => self.step(step),
                action => {
                    self.st = St::Unqueueing { removal, step };
                    action
                }
            },
            (St::Describing, Input::Described) => {
                let mut removal = Removal::delete(
                    self.spec.me,
                    &self.attempt,
                    self.node.take(),
                    self.holds_mutex,
                )
                .with_flaw(self.spec.flaw);
                self.holds_mutex = false;
                match removal.start() {
                    Action::Done => self.finish(Outcome::TimedOut),
                    action => {
                        self.st = St::GivingUp { removal };
                        action
                    }
                }
            }
            (St::GivingUp { mut removal }, input) => match removal.handle(input) {
                Action::Done => self.finish(Outcome::TimedOut),
                action => {
                    self.st = St::GivingUp { removal };
                    action
                }
            },
            (st, input) => {
                self.st = st;
                self.fail(
                    Code::Other(format!("unexpected input {input:?}")),
                    "driving the acquisition",
                )
            }
        }
    }

    /// Whether a node of the current prefix sorts before every node another contender can
    /// create: once first in line (or once the node ahead, the head, went), it stays first.
    fn sorts_first(&self) -> bool {
        self.prefix <= self.spec.foreground && self.prefix <= self.spec.background
    }

    fn finish(&mut self, outcome: Outcome) -> Action {
        self.st = St::Done;
        self.outcome = Some(outcome);
        Action::Done
    }

    fn fail(&mut self, code: Code, context: &'static str) -> Action {
        self.finish(Outcome::Failed { code, context })
    }

    fn await_connected(&mut self, next: St) -> Action {
        self.st = next;
        Action::AwaitConnected
    }

    fn send_carried(&mut self, st: St, requests: Vec<Request>, carry: bool) -> Action {
        self.st = st;
        // A lock waiting to be released goes on its own before an uncarried request.
        self.carrier = carry;
        Action::Send(Send { requests, carry })
    }

    fn send(&mut self, st: St, requests: Vec<Request>) -> Action {
        self.send_carried(st, requests, false)
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
            Step::FirstInLine => self.send(St::WatchingMutex, vec![Request::Watch(Target::Mutex)]),
            Step::Wait(queue) if queue.nodes.is_empty() => self.read_queue(),
            Step::Wait(queue) => self.on_queue(queue),
        }
    }

    fn read_queue(&mut self) -> Action {
        self.send(St::Reading, vec![Request::GetChildren(Target::Monitor)])
    }

    fn on_queue(&mut self, queue: Queue) -> Action {
        self.others_seen |= queue.nodes.len() > 1 || queue.mutex_present;
        let node = self.node.clone().expect("waiting with a node");
        let Some(pos) = queue.position(&node) else {
            // Our node is gone while our session lives: someone deleted it. Queue again.
            self.node = None;
            return self.plain_create(Mode2::Again);
        };
        if self.now.past_deadline {
            return self.give_up();
        }
        if self.now.promote_due && self.prefix != self.spec.foreground {
            // A starving background waiter: a foreground node first, then the old one goes.
            let old = self.node.clone();
            let old_attempt = self.attempt.clone();
            // Until the new node exists, the old one (of the old attempt) is the contender's.
            self.flight_attempt = Some(self.spec.promoted_attempt.clone());
            self.promoted = true;
            let prefix = std::mem::replace(&mut self.prefix, self.spec.foreground.clone());
            let action = self.plain_create(Mode2::Promote { old, old_attempt });
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
            St::WatchingAhead {
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
        self.st = St::Describing;
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
            contended_before: false,
            carry: false,
            carried_take: None,
            root_depth: 2,
            recreate: true,
            versioned: true,
            flaw: None,
        }
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
            let mut acq = Acquisition::new(Spec {
                try_once: !in_doubt,
                ..spec()
            });
            assert!(matches!(acq.start(Now::default()), Action::Send(_)));
            acq.handle(
                Input::Replies(vec![Reply::Multi(Err(error))]),
                Now::default(),
            );
            let search = acq.leftovers().and_then(|l| l.search);
            assert_eq!(search.is_some(), in_doubt, "{search:?}");
        }
    }

    /// The fast path is one request, and its success is the hold: the token is the multi's zxid.
    #[test]
    fn the_fast_path_takes_a_quiet_lock_in_one_request() {
        let mut acq = Acquisition::new(spec());
        let Action::Send(send) = acq.start(Now::default()) else {
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
        let reply = Reply::Multi(Ok(vec![
            OpResult::Delete,
            created("monitor"),
            created("A-0000000000"),
            created("privateLock"),
            set,
        ]));
        assert_eq!(
            acq.handle(Input::Replies(vec![reply]), Now::default()),
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
}
