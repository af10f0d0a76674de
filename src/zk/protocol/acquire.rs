//! The acquisition as a state machine: every decision of the priority-lock recipe (queue with
//! the fast path or a plain create, find what a lost create made, who is ahead, what to watch,
//! when to take the mutex and whether to verify, give it back, promote a starving waiter, give
//! up), with no I/O. [`Acquisition::start`] and [`Acquisition::handle`] return the next
//! [`Action`]; the driver (`zk::acquire` in production, the model check in the tests) performs
//! it and answers with an [`Input`].
//!
//! See `docs/zookeeper-lock.md` for the recipe and its arguments.

use super::remove::{is_ours, Removal};
use super::types::{
    Action, Code, Content, Fired, Input, Mode, MultiError, Now, Op, OpResult, Reply, Request, Send,
    Stat, Target,
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
    /// A create's answer was not handled: search by attempt id.
    pub in_flight: bool,
    /// The attempt id its nodes carry.
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
    },
    AwaitAhead {
        was_second: bool,
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
    in_flight: bool,
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
            in_flight: false,
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

    /// The attempt id of the nodes it creates now.
    pub fn attempt(&self) -> &str {
        &self.attempt
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

    /// How it ended, once [`Action::Done`] was returned.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// What the session's reaper must remove if the acquisition goes away now.
    pub fn leftovers(&self) -> Option<Leftovers> {
        (self.armed && (self.node.is_some() || self.holds_mutex || self.in_flight)).then(|| {
            Leftovers {
                node: self.node.clone(),
                holds_mutex: self.holds_mutex,
                in_flight: self.in_flight,
                attempt: self.attempt.clone(),
            }
        })
    }

    /// The removal under way while giving the mutex back, re-queueing or giving up.
    pub fn removal(&self) -> Option<&Removal> {
        match &self.st {
            St::Yielding { removal, .. }
            | St::Unqueueing { removal, .. }
            | St::GivingUp { removal } => Some(removal),
            _ => None,
        }
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
                    self.await_connected(St::ReadConnect, true)
                }
                other => self.fail(code_of(other), "reading the queue"),
            },
            (St::ReadConnect, Input::Connected) => self.read_queue(),
            (St::WatchingAhead { was_second }, Input::Replies(r)) => match first(r) {
                Reply::Data(Ok(_)) => {
                    self.st = St::AwaitAhead { was_second };
                    Action::AwaitWatch
                }
                // Gone before it could be watched: as if woken by its deletion.
                Reply::Data(Err(Code::NoNode)) if was_second => {
                    let verify = !self.sorts_first();
                    self.take(verify)
                }
                Reply::Data(Err(Code::NoNode)) => self.step(Step::Wait(Queue::default())),
                Reply::Data(Err(code)) if code.is_lost() => {
                    self.await_connected(St::LookAgainConnect, true)
                }
                other => self.fail(code_of(other), "watching the node ahead"),
            },
            (St::AwaitAhead { was_second }, Input::Fired(fired)) => {
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
                    self.await_connected(St::LookAgainConnect, true)
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
                send(vec![
                    Request::Sync(Target::Monitor),
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

    fn await_connected(&mut self, next: St, until_deadline: bool) -> Action {
        self.st = next;
        Action::AwaitConnected { until_deadline }
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

    // ---------------------------------------------------------------- queueing

    /// The first queueing loop's top: give up past the deadline once tried, else the fast path
    /// (one multi that recreates the monitor node, empty, with our queue node and the mutex in
    /// it), or, on a monitor busy lately, a plain create (in the multi of the lock released
    /// before, if any).
    fn queue_step(&mut self) -> Action {
        if self.tried && self.now.past_deadline && self.node.is_none() {
            return self.give_up();
        }
        self.tried = true;
        // A try-once contender always tries the fast path, without queueing when held.
        if self.spec.contended_before && !self.spec.try_once {
            if self.carrier {
                self.in_flight = true;
                let requests = vec![
                    Request::Multi(vec![self.new_node()]),
                    Request::GetChildren(Target::Monitor),
                ];
                return self.send_carried(St::After, requests, true);
            }
            return self.plain_create(Mode2::First);
        }
        if !self.recreate {
            return self.listed();
        }
        let carried = self.carrier;
        self.fast_path(carried)
    }

    fn fast_path(&mut self, carried: bool) -> Action {
        self.in_flight = true;
        let ops = vec![
            Op::Delete {
                target: Target::Monitor,
                version: None,
            },
            Op::Create {
                target: Target::Monitor,
                content: Content::Empty,
                mode: Mode::Container,
            },
            self.new_node(),
            // The mutex names its holder's node, not known yet: owner and attempt suffice.
            self.mutex_create(Content::Contender),
            Op::SetData {
                target: Target::Monitor,
            },
        ];
        self.send_carried(St::FastPath { carried }, vec![Request::Multi(ops)], carried)
    }

    fn on_fast_path(&mut self, carried: bool, replies: Vec<Reply>) -> Action {
        let result = match first(replies) {
            Reply::Multi(result) => result,
            other => Err(MultiError::Request(code_of(other))),
        };
        match result {
            // The release's own part failed: it went alone, and so does this.
            Err(MultiError::NotCarried) => self.fast_path(false),
            Ok(results) => {
                let [_, _, OpResult::Create { name, .. }, _, OpResult::SetData { stat }] =
                    results.as_slice()
                else {
                    // Applied, but what it made is unknown: the reaper searches by attempt id.
                    self.in_flight = true;
                    return self.queue_error(Code::Other(
                        "the fast path's multi answered with other results than a delete, three creates and a setData".into(),
                    ));
                };
                self.in_flight = false;
                self.node = Some(name.clone());
                self.holds_mutex = true;
                self.alone = true;
                // The multi's zxid: it created the mutex and last modified the monitor.
                let step = Step::Acquired {
                    zxid: stat.mzxid,
                    version: Some(stat.version),
                };
                self.step(step)
            }
            Err(MultiError::Failed {
                index: 0,
                code: Code::NotEmpty,
            }) => {
                // Held, or contenders queued: nothing was done.
                self.in_flight = false;
                if self.spec.try_once {
                    return self.step(Step::Busy);
                }
                if carried {
                    // The queue node goes with the release still waiting.
                    self.in_flight = true;
                    let requests = vec![
                        Request::Multi(vec![self.new_node()]),
                        Request::GetChildren(Target::Monitor),
                    ];
                    return self.send_carried(St::After, requests, true);
                }
                self.plain_create(Mode2::First)
            }
            Err(MultiError::Failed {
                code: Code::NoAuth, ..
            }) => {
                // zookeeper.acl does not let this session recreate and write monitor nodes.
                self.in_flight = false;
                self.recreate = false;
                self.listed()
            }
            Err(MultiError::Failed { code, .. }) => {
                self.in_flight = false;
                self.queue_error(code)
            }
            Err(MultiError::Request(code)) => {
                self.in_flight = true;
                self.queue_error(code)
            }
        }
    }

    /// The fast path of a session that may not recreate monitor nodes: a multi creates the
    /// queue node and the mutex (and sets the monitor's data where the session may), the queue
    /// read pipelined behind it; the mutex goes back at once if someone is ahead.
    fn listed(&mut self) -> Action {
        let mut ops = vec![self.new_node(), self.mutex_create(Content::Contender)];
        if self.versioned {
            ops.push(Op::SetData {
                target: Target::Monitor,
            });
        }
        self.in_flight = true;
        self.send(
            St::Listed,
            vec![Request::Multi(ops), Request::GetChildren(Target::Monitor)],
        )
    }

    fn on_listed(&mut self, replies: Vec<Reply>) -> Action {
        let mut replies = replies.into_iter();
        let committed = match replies.next() {
            Some(Reply::Multi(result)) => result,
            other => Err(MultiError::Request(code_of_opt(other))),
        };
        let children = replies.next();
        match committed {
            Ok(results) => {
                let mut created = results.into_iter();
                let Some(OpResult::Create { name, .. }) = created.next() else {
                    self.in_flight = true;
                    return self.queue_error(Code::Other("multi returned no create result".into()));
                };
                let Some(OpResult::Create {
                    stat: mutex_stat, ..
                }) = created.next()
                else {
                    self.in_flight = true;
                    return self.queue_error(Code::Other("multi returned no mutex result".into()));
                };
                let set = match created.next() {
                    Some(OpResult::SetData { stat }) => Some(stat),
                    _ => None,
                };
                self.in_flight = false;
                self.node = Some(name.clone());
                self.holds_mutex = true;
                let (children, parent) = match children {
                    Some(Reply::Children(Ok(c))) => c,
                    // Holds the mutex but could not verify the order: give it back and wait.
                    _ => return self.yield_mutex(Yielded::Listed(Step::Wait(Queue::default()))),
                };
                let queue = Queue::from_children(&children);
                if queue.position(&name) == Some(0) {
                    // The monitor's mzxid when the multi set it; else the mutex's czxid when
                    // the server returned a valid stat (3.8.2+, ZOOKEEPER-4026); else the
                    // monitor's pzxid, read right after the multi in the session's order.
                    let zxid = match &set {
                        Some(set) => set.mzxid,
                        None if !mutex_stat.valid => parent.pzxid,
                        None => mutex_stat.czxid,
                    };
                    self.step(Step::Acquired {
                        zxid,
                        version: set.map(|s| s.version),
                    })
                } else {
                    self.yield_mutex(Yielded::Listed(Step::Wait(queue)))
                }
            }
            Err(MultiError::Failed {
                index: 1,
                code: Code::NodeExists,
            }) => {
                self.in_flight = false;
                if self.spec.try_once {
                    self.step(Step::Busy)
                } else {
                    self.plain_create(Mode2::First)
                }
            }
            Err(MultiError::Failed {
                index: 2,
                code: Code::NoAuth,
            }) if self.versioned => {
                // The session may not write monitor nodes: releases go without the check.
                self.in_flight = false;
                self.versioned = false;
                self.listed()
            }
            Err(MultiError::Failed { code, .. }) => {
                self.in_flight = false;
                self.queue_error(code)
            }
            Err(MultiError::Request(code)) => {
                self.in_flight = true;
                self.queue_error(code)
            }
            Err(MultiError::NotCarried) => self.listed(),
        }
    }

    /// Creates the queue node alone, the queue read pipelined.
    fn plain_create(&mut self, mode: Mode2) -> Action {
        self.in_flight = true;
        let requests = vec![
            Request::Single(self.new_node()),
            Request::GetChildren(Target::Monitor),
        ];
        self.send(St::Plain(mode), requests)
    }

    fn on_plain(&mut self, mode: Mode2, replies: Vec<Reply>) -> Action {
        let mut replies = replies.into_iter();
        let created = match replies.next() {
            Some(Reply::Created(result)) => result,
            other => Err(code_of_opt(other)),
        };
        let queue = match replies.next() {
            Some(Reply::Children(Ok((children, _)))) => Queue::from_children(&children),
            _ => Queue::default(),
        };
        match created {
            Ok((name, _)) => {
                self.in_flight = false;
                self.node = Some(name);
                let step = Step::Wait(queue);
                match mode {
                    Mode2::Promote { old, old_attempt } => {
                        // The new node first, then the old one goes: never out of the queue.
                        self.prefix = self.spec.foreground.clone();
                        let mut removal = Removal::delete(self.spec.me, &old_attempt, old, false)
                            .with_flaw(self.spec.flaw);
                        match removal.start() {
                            Action::Done => self.step(step),
                            action => {
                                self.st = St::Unqueueing { removal, step };
                                action
                            }
                        }
                    }
                    _ => self.step(step),
                }
            }
            Err(code) => {
                self.in_flight = code.is_lost();
                match mode {
                    Mode2::First => self.queue_error(code),
                    Mode2::Again => match code {
                        Code::NoNode => self.ensure(Mode2::Again),
                        code if code.is_lost() => {
                            self.await_connected(St::RecConnect(Mode2::Again), true)
                        }
                        code => self.fail(code, "queueing for the lock again"),
                    },
                    Mode2::Promote { old, .. } => {
                        self.node = old;
                        self.fail(code, "re-queueing a starving background waiter")
                    }
                }
            }
        }
    }

    fn on_after(&mut self, replies: Vec<Reply>) -> Action {
        let mut replies = replies.into_iter();
        let committed = match replies.next() {
            Some(Reply::Multi(result)) => result,
            other => Err(MultiError::Request(code_of_opt(other))),
        };
        match committed {
            Ok(results) => {
                let Some(OpResult::Create { name, .. }) = results.first() else {
                    // Still in flight: the reaper searches by attempt id.
                    return self.queue_error(Code::Other(
                        "the release multi answered without the queue node's create".into(),
                    ));
                };
                self.in_flight = false;
                self.node = Some(name.clone());
                let queue = match replies.next() {
                    Some(Reply::Children(Ok((children, _)))) => Queue::from_children(&children),
                    _ => Queue::default(),
                };
                self.step(Step::Wait(queue))
            }
            // Nothing was created. `NoNode`: the monitor node is gone.
            Err(MultiError::Failed { code, .. }) => {
                self.in_flight = false;
                self.queue_error(code)
            }
            Err(MultiError::Request(code)) => self.queue_error(code),
            Err(MultiError::NotCarried) => {
                self.in_flight = false;
                self.plain_create(Mode2::First)
            }
        }
    }

    /// The first queueing loop's failures: the monitor node is missing (create it and queue
    /// again), the answer was lost (find what the create made), or anything else.
    fn queue_error(&mut self, code: Code) -> Action {
        match code {
            Code::NoNode => self.ensure(Mode2::First),
            code if code.is_lost() => self.await_connected(St::RecConnect(Mode2::First), true),
            code => self.fail(code, "queueing for the lock"),
        }
    }

    /// Creates the monitor node (a container), and the lock root first if missing.
    fn ensure(&mut self, mode: Mode2) -> Action {
        self.ensure_create(mode, None, false)
    }

    fn ensure_create(&mut self, mode: Mode2, root: Option<usize>, again: bool) -> Action {
        let op = match root {
            Some(i) => Op::Create {
                target: Target::Root(i),
                content: Content::Empty,
                mode: Mode::Persistent,
            },
            None => Op::Create {
                target: Target::Monitor,
                content: Content::Empty,
                mode: Mode::Container,
            },
        };
        self.send(St::Ensure { mode, root, again }, vec![Request::Single(op)])
    }

    fn on_ensure(&mut self, mode: Mode2, root: Option<usize>, again: bool, reply: Reply) -> Action {
        let result = match reply {
            Reply::Created(Ok(_)) => Ok(()),
            Reply::Created(Err(code)) => Err(code),
            other => Err(code_of(other)),
        };
        match (root, result) {
            (None, Ok(()) | Err(Code::NodeExists)) => self.ensured(mode),
            (None, Err(Code::NoNode)) if !again && self.spec.root_depth > 0 => {
                self.ensure_create(mode, Some(0), false)
            }
            (None, Err(code)) => self.fail(code, "creating the monitor node"),
            (Some(i), Ok(()) | Err(Code::NodeExists)) if i + 1 < self.spec.root_depth => {
                self.ensure_create(mode, Some(i + 1), false)
            }
            (Some(_), Ok(()) | Err(Code::NodeExists)) => self.ensure_create(mode, None, true),
            (Some(_), Err(code)) => self.fail(code, "creating the lock root"),
        }
    }

    fn ensured(&mut self, mode: Mode2) -> Action {
        match mode {
            Mode2::First => {
                // Creating the monitor node first is not a try.
                self.tried = false;
                self.queue_step()
            }
            mode => self.plain_create(mode),
        }
    }

    // ---------------------------------------------------------------- recovery

    /// After a connection loss during a create: find our queue node (and mutex) by session and
    /// attempt id, once the server caught up (a sync before the listing).
    fn recover(&mut self, mode: Mode2) -> Action {
        self.send(
            St::RecList(mode),
            vec![
                Request::Sync(Target::Monitor),
                Request::GetChildren(Target::Monitor),
            ],
        )
    }

    fn on_rec_list(&mut self, mode: Mode2, replies: Vec<Reply>) -> Action {
        let mut replies = replies.into_iter();
        let synced = replies.next();
        let listed = replies.next();
        let children = match (synced, listed) {
            (Some(Reply::Synced(Ok(()) | Err(Code::NoNode))), Some(Reply::Children(c))) => c,
            (Some(Reply::Synced(Err(code))), _) => Err(code),
            (_, other) => Err(code_of_opt(other)),
        };
        match children {
            Ok((children, _)) => {
                let names: Vec<String> = Queue::from_children(&children)
                    .nodes
                    .into_iter()
                    .map(|n| n.name)
                    .collect();
                self.rec_read_from(mode, names, 0)
            }
            Err(Code::NoNode) => self.recovered(mode),
            Err(code) => self.recovery_failed(mode, code, "looking for our queue node"),
        }
    }

    fn rec_read_from(&mut self, mode: Mode2, names: Vec<String>, next: usize) -> Action {
        match names.get(next) {
            Some(name) => {
                let target = Target::Node(name.clone());
                self.send(
                    St::RecRead { mode, names, next },
                    vec![Request::GetData(target)],
                )
            }
            None => self.send(St::RecMutex(mode), vec![Request::GetData(Target::Mutex)]),
        }
    }

    fn on_rec_read(
        &mut self,
        mode: Mode2,
        names: Vec<String>,
        next: usize,
        reply: Reply,
    ) -> Action {
        match reply {
            Reply::Data(Ok(read)) => {
                if is_ours(&read, self.spec.me, &self.attempt, self.spec.flaw) {
                    self.node = Some(names[next].clone());
                }
            }
            Reply::Data(Err(Code::NoNode)) => {}
            other => {
                return self.recovery_failed(mode, code_of(other), "looking for our queue node")
            }
        }
        self.rec_read_from(mode, names, next + 1)
    }

    fn on_rec_mutex(&mut self, mode: Mode2, reply: Reply) -> Action {
        match reply {
            Reply::Data(Ok(read))
                if is_ours(&read, self.spec.me, &self.attempt, self.spec.flaw) =>
            {
                // Ours: give it back and verify the order on the next step (or, without a
                // queue node, it is stray).
                self.holds_mutex = true;
                self.yield_mutex(Yielded::Recovered(mode))
            }
            Reply::Data(Ok(_) | Err(Code::NoNode)) => self.recovered(mode),
            other => self.recovery_failed(mode, code_of(other), "reading the mutex"),
        }
    }

    fn recovered(&mut self, mode: Mode2) -> Action {
        self.in_flight = false;
        if self.node.is_some() {
            return self.step(Step::Wait(Queue::default()));
        }
        match mode {
            Mode2::First => self.queue_step(),
            mode => self.plain_create(mode),
        }
    }

    /// In the first queueing loop, a connection lost during the recovery means waiting for it
    /// and looking again; otherwise the acquisition fails.
    fn recovery_failed(&mut self, mode: Mode2, code: Code, context: &'static str) -> Action {
        if mode == Mode2::First && code.is_lost() {
            return self.await_connected(St::RecConnect(mode), true);
        }
        self.fail(code, context)
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
            let old_attempt =
                std::mem::replace(&mut self.attempt, self.spec.promoted_attempt.clone());
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
            // First (we just read the queue): take the mutex if free, else wait for it.
            return if queue.mutex_present {
                self.step(Step::FirstInLine)
            } else {
                self.take(false)
            };
        }
        let pred = queue
            .predecessor(&node)
            .map_or_else(String::new, |p| p.name.clone());
        self.send(
            St::WatchingAhead {
                was_second: pos == 1,
            },
            vec![Request::Watch(Target::Node(pred))],
        )
    }

    // ---------------------------------------------------------------- the mutex

    /// Creates the mutex, in a multi that also sets the monitor's data where the session may
    /// (its version then names the take; its mzxid is the token); with `verify`, the queue read
    /// in the same round trip, and the mutex given back if someone else is first.
    fn take(&mut self, verify: bool) -> Action {
        let node = self.node.clone().expect("taking with a node");
        let create = self.mutex_create(Content::Mutex { node });
        let mut requests = vec![if self.versioned {
            Request::Multi(vec![
                create,
                Op::SetData {
                    target: Target::Monitor,
                },
            ])
        } else {
            Request::Single(create)
        }];
        if verify {
            requests.push(Request::GetChildren(Target::Monitor));
        }
        self.in_flight = true;
        self.send(St::Taking { verify }, requests)
    }

    fn on_take(&mut self, verify: bool, replies: Vec<Reply>) -> Action {
        let mut replies = replies.into_iter();
        // The zxid and version of the take, or the error (`None`: refused because the session
        // may not write monitor nodes).
        let created: Result<(i64, Option<i32>), Option<Code>> = match replies.next() {
            Some(Reply::Multi(Ok(results))) => match results.as_slice() {
                [_, OpResult::SetData { stat }] => Ok((stat.mzxid, Some(stat.version))),
                // Applied, but what it made is not known: in doubt, as after a lost answer.
                _ => Err(Some(Code::Other(
                    "a take of the mutex answered with other results than a create and a setData"
                        .into(),
                ))),
            },
            Some(Reply::Multi(Err(MultiError::Failed {
                index: 1,
                code: Code::NoAuth,
            }))) => Err(None),
            Some(Reply::Multi(Err(
                MultiError::Failed { code, .. } | MultiError::Request(code),
            ))) => Err(Some(code)),
            Some(Reply::Created(Ok((_, stat)))) => Ok((stat.czxid, None)),
            Some(Reply::Created(Err(code))) => Err(Some(code)),
            other => Err(Some(code_of_opt(other))),
        };
        let children = if verify { replies.next() } else { None };
        let created = match created {
            Ok(taken) => Ok(taken),
            Err(Some(code)) => Err(code),
            Err(None) => {
                self.in_flight = false;
                self.versioned = false;
                return self.take(verify);
            }
        };
        self.in_flight = matches!(created, Err(Code::Lost(_) | Code::Other(_)));
        match created {
            Ok((zxid, version)) => {
                self.holds_mutex = true;
                let acquired = Step::Acquired { zxid, version };
                match children {
                    None if !verify => self.step(acquired),
                    Some(Reply::Children(Ok((children, _)))) => {
                        let queue = Queue::from_children(&children);
                        if queue.position(self.node.as_deref().unwrap_or_default()) == Some(0) {
                            self.step(acquired)
                        } else {
                            // Someone of higher priority is first: give the mutex back.
                            self.yield_mutex(Yielded::Step(Step::Wait(queue)))
                        }
                    }
                    _ => self.yield_mutex(Yielded::Step(Step::Wait(Queue::default()))),
                }
            }
            Err(Code::NodeExists) if self.spec.flaw == Some(Flaw::MutexExistsIgnored) => {
                self.holds_mutex = true;
                self.step(Step::Acquired {
                    zxid: 0,
                    version: None,
                })
            }
            Err(Code::NodeExists) => match children {
                None => self.step(Step::FirstInLine),
                Some(Reply::Children(Ok((children, _)))) => {
                    self.step(Step::Wait(Queue::from_children(&children)))
                }
                Some(_) => self.step(Step::Wait(Queue::default())),
            },
            Err(code) if code.is_lost() => {
                // Did our create happen? Read the mutex and compare the attempt id.
                self.await_connected(St::TakeConnect, false)
            }
            Err(code) => self.fail(code, "taking the mutex"),
        }
    }

    fn on_take_check(&mut self, replies: Vec<Reply>) -> Action {
        let mut replies = replies.into_iter();
        let synced = replies.next();
        let read = match (synced, replies.next()) {
            (Some(Reply::Synced(Ok(()) | Err(Code::NoNode))), Some(Reply::Data(read))) => read,
            (Some(Reply::Synced(Err(code))), _) => Err(code),
            (_, other) => Err(code_of_opt(other)),
        };
        let read = match read {
            Ok(read) => Some(read),
            Err(Code::NoNode) => None,
            Err(code) => return self.fail(code, "reading the mutex"),
        };
        self.in_flight = false;
        match read {
            Some(read) if is_ours(&read, self.spec.me, &self.attempt, self.spec.flaw) => {
                self.holds_mutex = true;
                // Verify the order as usual; the monitor's data version is still the one our
                // take left, since nobody else took the mutex since.
                self.send(
                    St::TakeVerify {
                        zxid: read.stat.czxid,
                    },
                    vec![
                        Request::GetChildren(Target::Monitor),
                        Request::GetData(Target::Monitor),
                    ],
                )
            }
            _ => self.step(Step::Wait(Queue::default())),
        }
    }

    fn on_take_verify(&mut self, zxid: i64, replies: Vec<Reply>) -> Action {
        let mut replies = replies.into_iter();
        let children = match replies.next() {
            Some(Reply::Children(Ok((children, _)))) => children,
            other => return self.fail(code_of_opt(other), "reading the queue"),
        };
        let monitor: Stat = match replies.next() {
            Some(Reply::Data(Ok(read))) => read.stat,
            other => return self.fail(code_of_opt(other), "reading the monitor"),
        };
        let queue = Queue::from_children(&children);
        if queue.position(self.node.as_deref().unwrap_or_default()) == Some(0) {
            let version = self.versioned.then_some(monitor.version);
            return self.step(Step::Acquired { zxid, version });
        }
        self.yield_mutex(Yielded::Step(Step::Wait(Queue::default())))
    }

    /// Gives the mutex back (only if it is still this attempt's, once that is in doubt).
    fn yield_mutex(&mut self, then: Yielded) -> Action {
        let mut removal =
            Removal::delete(self.spec.me, &self.attempt, None, true).with_flaw(self.spec.flaw);
        match removal.start() {
            Action::Done => self.yielded(removal, then),
            action => {
                self.st = St::Yielding { removal, then };
                action
            }
        }
    }

    fn yielded(&mut self, removal: Removal, then: Yielded) -> Action {
        match removal.outcome().cloned().unwrap_or(Ok(())) {
            Ok(()) | Err(Code::NoNode) => {
                self.holds_mutex = false;
                match then {
                    Yielded::Step(step) | Yielded::Listed(step) => self.step(step),
                    Yielded::Recovered(mode) => self.recovered(mode),
                }
            }
            Err(code) => match then {
                Yielded::Step(_) => self.fail(code, "giving the mutex back"),
                Yielded::Listed(_) => self.queue_error(code),
                Yielded::Recovered(mode) => {
                    self.recovery_failed(mode, code, "giving the mutex back")
                }
            },
        }
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
