//! Queueing: the fast path (one multi that recreates the monitor with our node and the mutex
//! in it, and moves the lock root's version), the fast path of a session that may not recreate monitors, a plain create, a create
//! carried by the release of the lock before, the monitor node created when missing.

use super::super::remove::Removal;
use super::super::types::{
    Action, Code, Content, Mode, MultiError, Op, OpResult, Reply, Request, Target,
};
use super::{code_of, code_of_opt, first, Acquisition, Awaiting, OnceGivenBack, QueueRound, Step};
use crate::zk::names::Queue;

impl Acquisition {
    // ---------------------------------------------------------------- queueing

    /// The first queueing loop's top: give up past the deadline once tried, else the fast path
    /// (one multi that recreates the monitor node, empty, with our queue node and the mutex in
    /// it, and sets the monitor's data and the lock root's), or, on a monitor busy lately, a plain create (in the multi of the lock released
    /// before, if any).
    pub(super) fn queue_step(&mut self) -> Action {
        if self.tried && self.past_deadline() && self.node.is_none() {
            return self.give_up();
        }
        self.tried = true;
        // A try-once contender always tries the fast path, without queueing when held.
        if self.contended_before {
            if self.carrier {
                self.in_flight = true;
                let requests = self.carried_create();
                return self.send_carried(Awaiting::CarriedCreateAnswer, requests, true);
            }
            return self.plain_create(QueueRound::FirstTry);
        }
        if !self.recreate {
            return self.listed();
        }
        let carried = self.carrier;
        self.fast_path(carried)
    }

    pub(super) fn fast_path(&mut self, carried: bool) -> Action {
        self.in_flight = true;
        let mut ops = vec![
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
        // A monitor created: the lock root's version moves (see `Removal::with_lock_root`).
        ops.extend(self.root_bump());
        self.send_carried(
            Awaiting::FastPathAnswer { carried },
            vec![Request::Multi(ops)],
            carried,
        )
    }

    pub(super) fn on_fast_path(&mut self, carried: bool, replies: Vec<Reply>) -> Action {
        let result = match first(replies) {
            Reply::Multi(result) => result,
            other => Err(MultiError::Request(code_of(other))),
        };
        match result {
            // The release's own part failed: it went alone, and so does this.
            Err(MultiError::NotCarried) => self.fast_path(false),
            Ok(results) => {
                let [_, _, OpResult::Create { name, .. }, _, OpResult::SetData { stat }, ..] =
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
                    let requests = self.carried_create();
                    return self.send_carried(Awaiting::CarriedCreateAnswer, requests, true);
                }
                self.plain_create(QueueRound::FirstTry)
            }
            Err(MultiError::Failed {
                code: Code::NoAuth, ..
            }) => {
                // zookeeper.acl does not let this session recreate and write monitor nodes.
                self.in_flight = false;
                self.recreate = false;
                self.listed()
            }
            Err(e @ (MultiError::Failed { .. } | MultiError::Request(_))) => self.multi_failed(e),
        }
    }

    /// The fast path of a session that may not recreate monitor nodes: a multi creates the
    /// queue node and the mutex (and sets the monitor's data where the session may), the queue
    /// read pipelined behind it; the mutex goes back at once if someone is ahead.
    pub(super) fn listed(&mut self) -> Action {
        let mut ops = vec![self.new_node(), self.mutex_create(Content::Contender)];
        if self.versioned {
            ops.push(Op::SetData {
                target: Target::Monitor,
            });
        }
        self.in_flight = true;
        self.send(
            Awaiting::ListedFastPathAnswer,
            vec![Request::Multi(ops), Request::GetChildren(Target::Monitor)],
        )
    }

    pub(super) fn on_listed(&mut self, replies: Vec<Reply>) -> Action {
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
                self.take_version = set.map(|s| s.version);
                let (children, parent) = match children {
                    Some(Reply::Children(Ok(c))) => c,
                    // Holds the mutex but could not verify the order: give it back and wait.
                    _ => {
                        return self.yield_mutex(OnceGivenBack::ListedFastPath(Step::Wait(
                            Queue::default(),
                        )))
                    }
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
                    self.yield_mutex(OnceGivenBack::ListedFastPath(Step::Wait(queue)))
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
                    self.plain_create(QueueRound::FirstTry)
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
            Err(e @ (MultiError::Failed { .. } | MultiError::Request(_))) => self.multi_failed(e),
            Err(MultiError::NotCarried) => self.listed(),
        }
    }

    /// Creates the queue node alone, the queue read pipelined.
    pub(super) fn plain_create(&mut self, mode: QueueRound) -> Action {
        self.in_flight = true;
        let requests = vec![
            Request::Single(self.new_node()),
            Request::GetChildren(Target::Monitor),
        ];
        self.send(Awaiting::CreateAnswer(mode), requests)
    }

    pub(super) fn on_plain(&mut self, mode: QueueRound, replies: Vec<Reply>) -> Action {
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
                    QueueRound::Promotion { old, old_attempt } => {
                        // The new node first, then the old one goes: never out of the queue.
                        self.prefix = self.spec.foreground.clone();
                        if let Some(new) = self.flight_attempt.take() {
                            self.attempt = new;
                        }
                        let mut removal =
                            self.own(Removal::delete(self.spec.me, &old_attempt, old, false));
                        match removal.start() {
                            Action::Done => self.step(step),
                            action => {
                                self.awaiting = Awaiting::OldNodeRemoved { removal, step };
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
                    QueueRound::FirstTry => self.queue_error(code),
                    QueueRound::AfterNodeLost => match code {
                        Code::NoNode => self.ensure(QueueRound::AfterNodeLost),
                        code if code.is_lost() => self.await_connected(
                            Awaiting::ReconnectionToRecover(QueueRound::AfterNodeLost),
                        ),
                        code => self.fail(code, "queueing for the lock again"),
                    },
                    QueueRound::Promotion { old, .. } => {
                        // Still queued with the old node, of the old attempt; the new one may
                        // exist if the answer was lost: the reaper searches for its attempt.
                        self.node = old;
                        self.promoted = false;
                        self.fail(code, "re-queueing a starving background waiter")
                    }
                }
            }
        }
    }

    pub(super) fn on_after(&mut self, replies: Vec<Reply>) -> Action {
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
                let name = name.clone();
                self.node = Some(name.clone());
                match replies.next() {
                    Some(Reply::Children(Ok((children, _)))) => {
                        self.step(Step::Wait(Queue::from_children(&children)))
                    }
                    Some(_) => self.step(Step::Wait(Queue::default())),
                    // No read was sent behind the multi: the node ahead is found without one.
                    None => self.guess_ahead(&name),
                }
            }
            // Nothing was created. `NoNode`: the monitor node is gone.
            Err(MultiError::Failed { code, .. }) => {
                self.in_flight = false;
                self.queue_error(code)
            }
            Err(MultiError::Request(code)) => self.queue_error(code),
            Err(MultiError::NotCarried) => {
                self.in_flight = false;
                self.plain_create(QueueRound::FirstTry)
            }
        }
    }

    /// The first queueing loop's failures: the monitor node is missing (create it and queue
    /// again), the answer was lost (find what the create made), or anything else.
    pub(super) fn queue_error(&mut self, code: Code) -> Action {
        match code {
            Code::NoNode => self.ensure(QueueRound::FirstTry),
            code if code.is_lost() => {
                self.await_connected(Awaiting::ReconnectionToRecover(QueueRound::FirstTry))
            }
            code => self.fail(code, "queueing for the lock"),
        }
    }

    /// Creates the monitor node (a container), and the lock root first if missing. The monitor's
    /// create goes in a multi with the lock root's `setData`, as in the fast path, where the
    /// session may write monitor nodes (the lock root carries the same ACL).
    pub(super) fn ensure(&mut self, mode: QueueRound) -> Action {
        self.ensure_create(mode, None, false)
    }

    pub(super) fn ensure_create(
        &mut self,
        mode: QueueRound,
        root: Option<usize>,
        again: bool,
    ) -> Action {
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
        // A monitor created moves the lock root's version in the same transaction (see
        // `Removal::with_lock_root`), where the session may write it.
        let request = match self
            .root_bump()
            .filter(|_| root.is_none() && self.versioned)
        {
            Some(bump) => Request::Multi(vec![op, bump]),
            None => Request::Single(op),
        };
        self.send(
            Awaiting::ParentCreateAnswer { mode, root, again },
            vec![request],
        )
    }

    pub(super) fn on_ensure(
        &mut self,
        mode: QueueRound,
        root: Option<usize>,
        again: bool,
        reply: Reply,
    ) -> Action {
        let result = match reply {
            Reply::Created(Ok(_)) | Reply::Multi(Ok(_)) => Ok(()),
            Reply::Multi(Err(MultiError::Failed {
                index: 1,
                code: Code::NoAuth,
            })) => {
                // The session may not write the lock root, nor (with the same ACL) monitor
                // nodes: takes go without setting the monitor's data from now on.
                self.versioned = false;
                return self.ensure_create(mode, root, again);
            }
            Reply::Created(Err(code))
            | Reply::Multi(Err(MultiError::Failed { code, .. } | MultiError::Request(code))) => {
                Err(code)
            }
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

    pub(super) fn ensured(&mut self, mode: QueueRound) -> Action {
        match mode {
            QueueRound::FirstTry => {
                // Creating the monitor node first is not a try.
                self.tried = false;
                self.queue_step()
            }
            mode => self.plain_create(mode),
        }
    }

    /// A first multi refused (nothing applied) or without an answer (in doubt): the queueing
    /// loop's failure.
    fn multi_failed(&mut self, e: MultiError) -> Action {
        let code = match e {
            MultiError::Failed { code, .. } => {
                self.in_flight = false;
                code
            }
            MultiError::Request(code) => {
                self.in_flight = true;
                code
            }
            MultiError::NotCarried => {
                self.in_flight = false;
                Code::Other("a multi not carried by a release it had none".into())
            }
        };
        self.queue_error(code)
    }
}
