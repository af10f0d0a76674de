//! The mutex: taking it (verifying the order where the class needs it), finding out whether
//! a take whose answer was lost happened, giving it back.

use super::super::remove::{is_ours, Removal};
use super::super::types::{
    Action, Code, Content, MultiError, Op, OpResult, Reply, Request, Target,
};
use super::super::Flaw;
use super::{code_of_opt, Acquisition, Awaiting, OnceGivenBack, Step};
use crate::zk::names::Queue;

/// What a waiter waits for when a holder of its own session may hand it the lock
/// ([`Acquisition::hand_over_point`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Awaits {
    /// The release of the holder whose queue node this is (the head at the waiter's listing).
    Node(String),
    /// The mutex, the waiter being first in line.
    Mutex,
}

impl Acquisition {
    // ---------------------------------------------------------------- the hand-over

    /// Whether a holder of this session may hand the lock to this waiter in the transaction
    /// that releases it, and with what: the waiter's own take of the mutex (its create and
    /// the monitor's `setData`), carried by the holder's release multi. Only while waiting
    /// (after [`Action::AwaitWatch`]), for a waiter of the first class that is next for
    /// certain once the holder goes: one whose node ahead at its listing is the holder's (a
    /// node ahead of a first-class node is of the first class, and a first-class holder is the
    /// head), or one first in line waiting for the mutex. Every node created since that listing
    /// sorts after it (see `docs/zookeeper-lock.md`, "Handoff"), and the release multi applies
    /// only while the holder still holds the mutex (the check of the monitor's version), so
    /// priority across sessions holds without a read. `None` for any other waiter, which the
    /// usual release wakes.
    pub fn hand_over_point(&self) -> Option<(Awaits, Vec<Op>)> {
        let any_class = self.spec.flaw == Some(Flaw::HandOverToAnyClass);
        if self.spec.try_once || !self.versioned || !(self.sorts_first() || any_class) {
            return None;
        }
        let node = self.node.clone()?;
        let awaits = match &self.awaiting {
            Awaiting::AheadToGo { ahead, .. } => Awaits::Node(ahead.clone()),
            Awaiting::MutexToGo => Awaits::Mutex,
            _ => return None,
        };
        let ops = vec![
            self.mutex_create(Content::Mutex { node }),
            Op::SetData {
                target: Target::Monitor,
            },
        ];
        Some((awaits, ops))
    }

    /// The take of [`Acquisition::hand_over_point`] was sent in a holder's release multi:
    /// the acquisition waits for its answer as for its own take (a multi reply; `NotCarried`
    /// when the release's own part failed and nothing was applied). `false`, and nothing
    /// changes, when it is not at a hand-over point.
    pub fn handed(&mut self) -> bool {
        if self.hand_over_point().is_none() {
            return false;
        }
        self.in_flight = true;
        self.awaiting = Awaiting::TakeAnswer { verify: false };
        true
    }

    // ---------------------------------------------------------------- the mutex

    /// Creates the mutex, in a multi that also sets the monitor's data where the session may
    /// (its version then names the take; its mzxid is the token); with `verify`, the queue read
    /// in the same round trip, and the mutex given back if someone else is first.
    pub(super) fn take(&mut self, verify: bool) -> Action {
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
        self.send(Awaiting::TakeAnswer { verify }, requests)
    }

    pub(super) fn on_take(&mut self, verify: bool, replies: Vec<Reply>) -> Action {
        if let [Reply::Multi(Err(MultiError::NotCarried))] = replies.as_slice() {
            // A hand-over whose release could not be applied: nothing was, not even the take.
            self.in_flight = false;
            return self.step(Step::Wait(Queue::default()));
        }
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
                self.take_version = version;
                let acquired = Step::Acquired { zxid, version };
                match children {
                    None if !verify => self.step(acquired),
                    Some(Reply::Children(Ok((children, _)))) => {
                        let queue = Queue::from_children(&children);
                        if queue.position(self.node.as_deref().unwrap_or_default()) == Some(0) {
                            self.step(acquired)
                        } else {
                            // Someone of higher priority is first: give the mutex back.
                            self.yield_mutex(OnceGivenBack::Continue(Step::Wait(queue)))
                        }
                    }
                    _ => self.yield_mutex(OnceGivenBack::Continue(Step::Wait(Queue::default()))),
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
                // Did our create happen? Read the mutex and compare the attempt id once
                // connected. Still disconnected at the deadline, the acquisition gives up with
                // the take in doubt (`in_flight`): the reaper searches for it by attempt id.
                self.await_connected(Awaiting::ReconnectionToCheckTake)
            }
            Err(code) => self.fail(code, "taking the mutex"),
        }
    }

    pub(super) fn on_take_check(&mut self, replies: Vec<Reply>) -> Action {
        let mut replies = replies.into_iter();
        let synced = replies.next();
        let monitor = match replies.next() {
            Some(Reply::Data(Ok(read))) => Some(read.stat.version),
            _ => None,
        };
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
                // Verify the order as usual. The monitor's data version read before the mutex
                // is the one our take left (nobody else can take the mutex while ours is
                // there); one read later may be a later take's, should an operator delete our
                // mutex and the next in line take it meanwhile.
                self.take_version = if self.versioned { monitor } else { None };
                self.send(
                    Awaiting::TakeVerifyAnswer {
                        zxid: read.stat.czxid,
                    },
                    vec![Request::GetChildren(Target::Monitor)],
                )
            }
            _ => self.step(Step::Wait(Queue::default())),
        }
    }

    pub(super) fn on_take_verify(&mut self, zxid: i64, replies: Vec<Reply>) -> Action {
        let mut replies = replies.into_iter();
        let children = match replies.next() {
            Some(Reply::Children(Ok((children, _)))) => children,
            other => return self.fail(code_of_opt(other), "reading the queue"),
        };
        let queue = Queue::from_children(&children);
        if queue.position(self.node.as_deref().unwrap_or_default()) == Some(0) {
            let version = self.take_version;
            return self.step(Step::Acquired { zxid, version });
        }
        self.yield_mutex(OnceGivenBack::Continue(Step::Wait(Queue::default())))
    }

    /// Gives the mutex back (only if it is still this attempt's, once that is in doubt).
    pub(super) fn yield_mutex(&mut self, then: OnceGivenBack) -> Action {
        // Checked against the monitor's data version the take left, as a release is: should
        // someone have deleted the mutex meanwhile and the next in line taken it, the blind
        // delete would remove the new holder's mutex.
        // Without that version (a take found again after a lost answer, or a session that may
        // not write monitor nodes), the careful deletes read the monitor's with the mutex.
        let removal = match self.take_version.take() {
            Some(version) => Removal::give_back(self.spec.me, &self.attempt, Some(version)),
            None => Removal::careful(self.spec.me, &self.attempt, None, true, false),
        };
        let mut removal = self.own(removal);
        match removal.start() {
            Action::Done => self.yielded(removal, then),
            action => {
                self.awaiting = Awaiting::MutexGivenBack { removal, then };
                action
            }
        }
    }

    pub(super) fn yielded(&mut self, removal: Removal, then: OnceGivenBack) -> Action {
        match removal.outcome().cloned().unwrap_or(Ok(())) {
            Ok(()) | Err(Code::NoNode) => {
                self.holds_mutex = false;
                match then {
                    OnceGivenBack::Continue(step) | OnceGivenBack::ListedFastPath(step) => {
                        self.step(step)
                    }
                    OnceGivenBack::Recovery(mode) => self.recovered(mode),
                }
            }
            Err(code) => match then {
                OnceGivenBack::Continue(_) => self.fail(code, "giving the mutex back"),
                OnceGivenBack::ListedFastPath(_) => self.queue_error(code),
                OnceGivenBack::Recovery(mode) => {
                    self.recovery_failed(mode, code, "giving the mutex back")
                }
            },
        }
    }
}
