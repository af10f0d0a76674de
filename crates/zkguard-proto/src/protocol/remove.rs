//! Removing a contender's own nodes, as a state machine: the release multi, the careful
//! deletes once it is no longer certain what is ours, and the reaper's search for what an
//! abandoned create made.
//!
//! Every node goes only if it is still an ephemeral node of this session carrying this
//! acquisition's attempt id: by the time a removal runs, a path may name another node (the next
//! holder's mutex, the same session's next acquisition's queue node of the same name).

use super::types::{Action, Code, Input, MultiError, Op, Read, Reply, Request, Send, Target};
use super::Flaw;

/// Whether a node read shows it as this session's, of attempt `attempt`.
pub fn is_ours(read: &Read, me: i64, attempt: &str, flaw: Option<Flaw>) -> bool {
    if flaw == Some(Flaw::OwnershipWithoutAttempt) {
        return read.stat.owner == me;
    }
    read.stat.owner == me && read.attempt.as_deref() == Some(attempt)
}

/// The target of a monitor's child named `name`.
pub fn child(name: &str) -> Target {
    if name == crate::zk::names::MUTEX_NODE {
        Target::Mutex
    } else {
        Target::Node(name.to_string())
    }
}

/// The operations that release a held lock in one multi: with `version`, a check that the
/// monitor's data version is still the one the take of the mutex left (every take sets the
/// monitor's data in its own transaction, so the version moves exactly when the mutex changes
/// hands); the delete of the mutex; with `mark`, the hand-over mark (the queue node emptied
/// right before its delete: the waiter behind it learns that it left as the holder); the
/// delete of the queue node.
pub fn release_ops(node: &str, mark: bool, version: Option<i32>) -> Vec<Op> {
    let mut ops = Vec::with_capacity(4);
    if let Some(version) = version {
        ops.push(Op::Check {
            target: Target::Monitor,
            version,
        });
    }
    ops.push(Op::Delete {
        target: Target::Mutex,
        version: None,
    });
    if mark {
        ops.push(Op::SetData {
            target: Target::Node(node.to_string()),
        });
    }
    ops.push(Op::Delete {
        target: Target::Node(node.to_string()),
        version: None,
    });
    ops
}

/// Removes a queue node and/or the mutex of one attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Removal {
    me: i64,
    attempt: String,
    node: Option<String>,
    mutex: bool,
    version: Option<i32>,
    /// The lock root (the monitors' parent), whose data version the careful deletes of the
    /// mutex check ([`Removal::with_lock_root`]).
    root: Option<Target>,
    /// The careful delete under way checks the lock root's version first (its operation 0).
    root_checked: bool,
    flaw: Option<Flaw>,
    st: St,
    /// Search the monitor for what this attempt made once the careful deletes are done.
    then_search: Option<String>,
    /// The release was refused the hand-over mark (`NoAuth`): later releases of the session
    /// go without it.
    pub mark_refused: bool,
    outcome: Option<Result<(), Code>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum St {
    /// The first try, blind: the caller knows the nodes are its own.
    First {
        mark: bool,
    },
    /// Reading (`Read`) or deleting (`Delete`) the mutex (`on_mutex`) or the queue node.
    Careful {
        gone_before: bool,
        on_mutex: bool,
        deleting: bool,
    },
    /// Waiting to try the careful deletes again after a lost answer.
    CarefulBackoff {
        gone_before: bool,
    },
    /// Listing the monitor (after a sync) to find the attempt's nodes.
    SearchList,
    /// Reading (or deleting) the children of the search, from `next`.
    SearchRead {
        children: Vec<String>,
        next: usize,
        deleting: bool,
    },
    SearchBackoff,
    Done,
}

impl Removal {
    fn new(me: i64, attempt: &str, node: Option<String>, mutex: bool, st: St) -> Self {
        Self {
            me,
            attempt: attempt.to_string(),
            node,
            mutex,
            version: None,
            root: None,
            root_checked: false,
            flaw: None,
            st,
            then_search: None,
            mark_refused: false,
            outcome: None,
        }
    }

    /// Deletes a queue node and/or the mutex: blindly first (one multi when both), carefully
    /// once one was gone or an answer was lost. Ends `Err(NoNode)` when one was already gone.
    pub fn delete(me: i64, attempt: &str, node: Option<String>, mutex: bool) -> Self {
        Self::new(me, attempt, node, mutex, St::First { mark: false })
    }

    /// Gives back a mutex just taken (someone else is first): with `version` (the monitor's data
    /// version the take left), in a multi that checks it, so that a mutex deleted by someone
    /// else meanwhile and taken by the next in line stays; careful deletes once in doubt.
    pub fn give_back(me: i64, attempt: &str, version: Option<i32>) -> Self {
        let mut removal = Self::new(me, attempt, None, true, St::First { mark: false });
        removal.version = version;
        removal
    }

    /// Releases a held lock: the release multi ([`release_ops`]), with the hand-over mark if
    /// `mark` (again without it if refused), checked against the monitor's data version if
    /// given; careful deletes when that is no longer certain. Without `mutex` (deleted by
    /// someone else) only the queue node goes.
    pub fn release(
        me: i64,
        attempt: &str,
        node: String,
        mutex: bool,
        mark: bool,
        version: Option<i32>,
    ) -> Self {
        let mut removal = Self::new(
            me,
            attempt,
            Some(node),
            mutex,
            St::First {
                mark: mark && mutex,
            },
        );
        removal.version = version;
        removal
    }

    /// The careful deletes from the start (after a request whose answer was lost); ends
    /// `Err(NoNode)` if `gone_before`.
    pub fn careful(
        me: i64,
        attempt: &str,
        node: Option<String>,
        mutex: bool,
        gone_before: bool,
    ) -> Self {
        let mut removal = Self::new(me, attempt, node, mutex, St::Done);
        removal.st = removal.careful_state(gone_before);
        removal
    }

    /// The session's reaper at work for an abandoned acquisition: the careful deletes of what
    /// it is known to own (nodes of `attempt`), then, with `search` (the attempt id of a create
    /// whose answer was never handled), a search of the monitor for nodes of this session and
    /// that attempt.
    pub fn reap(
        me: i64,
        attempt: &str,
        node: Option<String>,
        mutex: bool,
        search: Option<String>,
    ) -> Self {
        let mut removal = Self::careful(me, attempt, node, mutex, false);
        removal.then_search = search;
        removal
    }

    /// Its careful deletes of the mutex check the data version of the lock root as well (the
    /// monitors' parent, `root_depth` nodes from the top: the last node of the lock root), read
    /// before the monitor's. Every creation of a monitor moves that version in its own
    /// transaction (the fast path's multi, the monitor's create when missing), and the lock root
    /// is never created again while it has monitors: a check of it passes only if no monitor was
    /// created since the read, so the monitor checked is the one read, whose data version
    /// names the take of the mutex (a monitor reaped once empty and created again starts its
    /// version over, and a check of the monitor alone could pass on the next holder's take). A
    /// check failing because some other monitor was created meanwhile reads again. `0` (monitors
    /// at ZooKeeper's root): no such check.
    #[must_use]
    pub fn with_lock_root(mut self, root_depth: usize) -> Self {
        self.root = root_depth.checked_sub(1).map(Target::Root);
        self
    }

    /// With a deliberate flaw (for the model check's proof that it can fail).
    #[must_use]
    pub fn with_flaw(mut self, flaw: Option<Flaw>) -> Self {
        self.flaw = flaw;
        if flaw == Some(Flaw::ReleaseUnchecked) {
            self.version = None;
        }
        self
    }

    /// What it deletes: the queue node (its name), and whether the mutex.
    pub fn targets(&self) -> (Option<&str>, bool) {
        (self.node.as_deref(), self.mutex)
    }

    /// The attempt id of the nodes it deletes now (the searched attempt's once it searches).
    pub fn attempt(&self) -> &str {
        &self.attempt
    }

    /// The outcome, once [`Action::Done`] was returned.
    pub fn outcome(&self) -> Option<&Result<(), Code>> {
        self.outcome.as_ref()
    }

    fn careful_state(&self, gone_before: bool) -> St {
        St::Careful {
            gone_before,
            on_mutex: self.mutex,
            deleting: false,
        }
    }

    /// The first request.
    pub fn start(&mut self) -> Action {
        match self.st.clone() {
            St::First { mark } => {
                let request = match (&self.node, self.mutex) {
                    (Some(node), true) => Request::Multi(release_ops(node, mark, self.version)),
                    (Some(node), false) => Request::Single(Op::Delete {
                        target: Target::Node(node.clone()),
                        version: None,
                    }),
                    (None, true) => match self.version {
                        Some(version) => Request::Multi(vec![
                            Op::Check {
                                target: Target::Monitor,
                                version,
                            },
                            Op::Delete {
                                target: Target::Mutex,
                                version: None,
                            },
                        ]),
                        None => Request::Single(Op::Delete {
                            target: Target::Mutex,
                            version: None,
                        }),
                    },
                    (None, false) => return self.finish(Ok(())),
                };
                send(vec![request])
            }
            St::Careful { gone_before, .. } => self.careful_step(gone_before),
            St::SearchList => search_list(),
            _ => Action::Done,
        }
    }

    /// Takes the driver's answer to the last action.
    pub fn handle(&mut self, input: Input) -> Action {
        let st = std::mem::replace(&mut self.st, St::Done);
        match (st, input) {
            (St::First { mark }, Input::Replies(replies)) => self.on_first(mark, replies),
            (
                St::Careful {
                    gone_before,
                    on_mutex,
                    deleting,
                },
                Input::Replies(replies),
            ) => self.on_careful(gone_before, on_mutex, deleting, replies),
            (St::CarefulBackoff { gone_before }, _) => {
                self.st = self.careful_state(gone_before);
                self.careful_step(gone_before)
            }
            (St::SearchList, Input::Replies(replies)) => match replies.get(1) {
                Some(Reply::Children(Ok((children, _)))) => {
                    let children = children.clone();
                    self.search_from(children, 0)
                }
                Some(Reply::Children(Err(Code::Lost(_)))) => {
                    self.st = St::SearchBackoff;
                    Action::Backoff
                }
                _ => self.finish(Ok(())),
            },
            (
                St::SearchRead {
                    children,
                    next,
                    deleting,
                },
                Input::Replies(replies),
            ) => self.on_search_read(children, next, deleting, replies),
            (St::SearchBackoff, _) => {
                self.st = St::SearchList;
                search_list()
            }
            (st, _) => {
                self.st = st;
                Action::Done
            }
        }
    }

    /// The answer to the first attempt: the release multi (or the plain delete).
    fn on_first(&mut self, mark: bool, replies: Vec<Reply>) -> Action {
        let result = match replies.into_iter().next() {
            Some(Reply::Multi(Ok(_))) | Some(Reply::Deleted(Ok(()))) => Ok(()),
            Some(Reply::Multi(Err(
                MultiError::Failed { code, .. } | MultiError::Request(code),
            )))
            | Some(Reply::Deleted(Err(code))) => Err(code),
            _ => Err(Code::Other("a removal answered out of shape".into())),
        };
        match result {
            Ok(()) => self.finish(Ok(())),
            Err(Code::NoAuth) if mark => {
                self.mark_refused = true;
                self.st = St::First { mark: false };
                self.start()
            }
            Err(Code::NoNode | Code::BadVersion) => {
                self.st = self.careful_state(true);
                self.careful_step(true)
            }
            Err(Code::Lost(_)) => {
                self.st = self.careful_state(false);
                self.careful_step(false)
            }
            Err(code) => self.finish(Err(code)),
        }
    }

    /// The answer to a careful read (is the node ours?) or to its delete.
    fn on_careful(
        &mut self,
        gone_before: bool,
        on_mutex: bool,
        deleting: bool,
        replies: Vec<Reply>,
    ) -> Action {
        // The read of the mutex comes with the lock root's and the monitor's (behind the pass's
        // sync).
        let versions = if !deleting && on_mutex {
            self.versions_read(&replies)
        } else {
            Versions::default()
        };
        if deleting && self.root_moved(&replies) {
            // Some monitor was created since the read: read again.
            return self.careful_step(gone_before);
        }
        // The read or the delete: the last answer.
        let reply = replies.into_iter().last();
        let result: Result<Option<i32>, Code> = match (deleting, reply) {
            // Read: ours (delete it, of that version), or not (leave it).
            (false, Some(Reply::Data(Ok(read)))) => {
                Ok(is_ours(&read, self.me, &self.attempt, self.flaw).then_some(read.stat.version))
            }
            (false, Some(Reply::Data(Err(Code::NoNode)))) => Ok(None),
            (true, Some(Reply::Deleted(Ok(()) | Err(Code::NoNode | Code::BadVersion)))) => Ok(None),
            // The mutex's delete with the monitor's check: gone, or taken since.
            (true, Some(Reply::Multi(Ok(_)))) => Ok(None),
            (
                true,
                Some(Reply::Multi(Err(
                    MultiError::Failed { code, .. } | MultiError::Request(code),
                ))),
            ) => match code {
                Code::NoNode | Code::BadVersion => Ok(None),
                code => Err(code),
            },
            (_, Some(Reply::Data(Err(code)) | Reply::Deleted(Err(code)))) => Err(code),
            _ => Err(Code::Other("a careful delete answered out of shape".into())),
        };
        match result {
            Ok(Some(version)) => {
                self.st = St::Careful {
                    gone_before,
                    on_mutex,
                    deleting: true,
                };
                let delete = self.careful_delete(on_mutex, version, versions);
                send(vec![delete])
            }
            Ok(None) if on_mutex && self.node.is_some() => {
                self.st = St::Careful {
                    gone_before,
                    on_mutex: false,
                    deleting: false,
                };
                send(vec![Request::GetData(self.careful_target(false))])
            }
            Ok(None) => self.careful_done(gone_before),
            Err(Code::Lost(_)) => {
                self.st = St::CarefulBackoff { gone_before };
                Action::Backoff
            }
            Err(code) => self.finish(Err(code)),
        }
    }

    /// The answer to the reaper's search reading (or deleting) the `next` of `children`.
    fn on_search_read(
        &mut self,
        children: Vec<String>,
        next: usize,
        deleting: bool,
        replies: Vec<Reply>,
    ) -> Action {
        let target = child(&children[next]);
        let on_mutex = target == Target::Mutex;
        // The mutex's read comes after the lock root's and the monitor's, as in the careful
        // deletes.
        let versions = if !deleting && on_mutex {
            self.versions_read(&replies)
        } else {
            Versions::default()
        };
        if deleting && self.root_moved(&replies) {
            // Some monitor was created since the read: read this child again.
            return self.search_from(children, next);
        }
        match (deleting, replies.into_iter().last()) {
            (false, Some(Reply::Data(Ok(read))))
                if is_ours(&read, self.me, &self.attempt, self.flaw) =>
            {
                self.st = St::SearchRead {
                    children,
                    next,
                    deleting: true,
                };
                let delete = self.careful_delete_of(target, read.stat.version, versions);
                send(vec![delete])
            }
            (
                _,
                Some(
                    Reply::Data(Err(Code::Lost(_)))
                    | Reply::Deleted(Err(Code::Lost(_)))
                    | Reply::Multi(Err(
                        MultiError::Failed {
                            code: Code::Lost(_),
                            ..
                        }
                        | MultiError::Request(Code::Lost(_)),
                    )),
                ),
            ) => {
                self.st = St::SearchBackoff;
                Action::Backoff
            }
            _ => self.search_from(children, next + 1),
        }
    }

    /// The careful delete of a node read as ours at `version`. The mutex's goes in a multi that
    /// checks the monitor's data version read right before it, and the lock root's read before
    /// that (`versions`): the version of a node names no node (every new mutex is version 0),
    /// so between the read and the delete an operator may delete this mutex and the next in
    /// line take a new one that the delete would remove; every take moves the monitor's
    /// version in its own transaction, and the check fails instead. The monitor itself may be
    /// emptied, reaped and created again meanwhile, its version starting over: every creation
    /// of a monitor moves the lock root's version, which is checked first
    /// ([`Removal::with_lock_root`]). (A take by a session that may not write monitor nodes
    /// does not move the monitor's version: see `zookeeper-lock.md`, "Release".)
    fn careful_delete(&mut self, on_mutex: bool, version: i32, versions: Versions) -> Request {
        self.careful_delete_of(self.careful_target(on_mutex), version, versions)
    }

    /// [`Removal::careful_delete`] of `target` (the mutex or a queue node).
    fn careful_delete_of(&mut self, target: Target, version: i32, versions: Versions) -> Request {
        let on_mutex = target == Target::Mutex;
        let delete = Op::Delete {
            target,
            version: Some(version),
        };
        self.root_checked = false;
        match (on_mutex, versions.monitor) {
            (true, Some(monitor)) if self.flaw != Some(Flaw::ReleaseUnchecked) => {
                let mut ops = Vec::with_capacity(3);
                if let (Some(root), Some(version)) = (&self.root, versions.root) {
                    self.root_checked = true;
                    ops.push(Op::Check {
                        target: root.clone(),
                        version,
                    });
                }
                ops.push(Op::Check {
                    target: Target::Monitor,
                    version: monitor,
                });
                ops.push(delete);
                Request::Multi(ops)
            }
            _ => Request::Single(delete),
        }
    }

    /// The data versions of the lock root and the monitor read before the mutex: the answers
    /// right before the last (the mutex's) of `replies`.
    fn versions_read(&self, replies: &[Reply]) -> Versions {
        let version = |back: usize| match replies.len().checked_sub(back).map(|i| &replies[i]) {
            Some(Reply::Data(Ok(read))) => Some(read.stat.version),
            _ => None,
        };
        Versions {
            root: self.root.as_ref().and_then(|_| version(3)),
            monitor: version(2),
        }
    }

    /// Whether the answer to a careful delete of the mutex says that the lock root's version
    /// moved since it was read (some monitor was created): nothing was applied.
    fn root_moved(&self, replies: &[Reply]) -> bool {
        self.root_checked
            && matches!(
                replies.last(),
                Some(Reply::Multi(Err(MultiError::Failed {
                    index: 0,
                    code: Code::BadVersion,
                })))
            )
    }

    fn careful_target(&self, on_mutex: bool) -> Target {
        match (&self.node, on_mutex) {
            (Some(node), false) => Target::Node(node.clone()),
            _ => Target::Mutex,
        }
    }

    fn careful_step(&mut self, gone_before: bool) -> Action {
        if !self.mutex && self.node.is_none() {
            return self.careful_done(gone_before);
        }
        self.st = self.careful_state(gone_before);
        // Behind a sync: after a lost answer the session may have reconnected to a server that
        // has not applied the lost request yet. Its read would show the node as still ours,
        // and the conditional delete, applied by the leader, would remove whoever's node has
        // that path and version by then (the next holder's mutex is version 0 again).
        // The mutex's read comes with the lock root's and the monitor's, read first in that
        // order: their data versions, checked by the delete ([`Removal::careful_delete`]).
        let mut requests = vec![Request::Sync(Target::Monitor)];
        if self.mutex {
            requests.extend(self.root.clone().map(Request::GetData));
            requests.push(Request::GetData(Target::Monitor));
        }
        requests.push(Request::GetData(self.careful_target(self.mutex)));
        send(requests)
    }

    fn careful_done(&mut self, gone_before: bool) -> Action {
        if let Some(attempt) = self.then_search.take() {
            self.attempt = attempt;
            self.st = St::SearchList;
            return search_list();
        }
        self.finish(if gone_before {
            Err(Code::NoNode)
        } else {
            Ok(())
        })
    }

    fn search_from(&mut self, children: Vec<String>, next: usize) -> Action {
        if next >= children.len() {
            return self.finish(Ok(()));
        }
        let target = child(&children[next]);
        self.st = St::SearchRead {
            children,
            next,
            deleting: false,
        };
        let mut requests = Vec::with_capacity(3);
        if target == Target::Mutex {
            requests.extend(self.root.clone().map(Request::GetData));
            requests.push(Request::GetData(Target::Monitor));
        }
        requests.push(Request::GetData(target));
        send(requests)
    }

    fn finish(&mut self, outcome: Result<(), Code>) -> Action {
        self.st = St::Done;
        self.outcome = Some(outcome);
        Action::Done
    }
}

/// The data versions read before a careful delete of the mutex.
#[derive(Debug, Clone, Copy, Default)]
struct Versions {
    /// The lock root's, if read.
    root: Option<i32>,
    /// The monitor's, if read.
    monitor: Option<i32>,
}

fn send(requests: Vec<Request>) -> Action {
    Action::Send(Send {
        requests,
        carry: false,
    })
}

/// The search's listing: behind a sync, so that a lagging server has applied the create whose
/// answer was lost.
fn search_list() -> Action {
    send(vec![
        Request::Sync(Target::Monitor),
        Request::GetChildren(Target::Monitor),
    ])
}

#[cfg(test)]
mod tests {
    use super::super::types::{Read, Stat};
    use super::*;

    fn read(attempt: Option<&str>, owner: i64, version: i32) -> Reply {
        Reply::Data(Ok(Read {
            attempt: attempt.map(str::to_string),
            stat: Stat {
                owner,
                version,
                valid: true,
                ..Stat::default()
            },
        }))
    }

    /// The careful delete of the mutex reads the lock root, the monitor and the mutex behind a
    /// sync, and checks the first two in its multi. A failed check of the lock root (a monitor
    /// was created since the read) reads again; a failed check of the monitor (the mutex
    /// changed hands) leaves the mutex.
    #[test]
    fn a_careful_delete_of_the_mutex_checks_the_lock_root_and_reads_again_when_it_moved() {
        let mut removal = Removal::careful(7, "a1", None, true, false).with_lock_root(2);
        let reads = Action::Send(Send {
            requests: vec![
                Request::Sync(Target::Monitor),
                Request::GetData(Target::Root(1)),
                Request::GetData(Target::Monitor),
                Request::GetData(Target::Mutex),
            ],
            carry: false,
        });
        assert_eq!(removal.start(), reads);
        let answers = |root: i32| {
            Input::Replies(vec![
                Reply::Synced(Ok(())),
                read(None, 0, root),
                read(None, 0, 1),
                read(Some("a1"), 7, 0),
            ])
        };
        let delete = |root: i32| {
            Action::Send(Send {
                requests: vec![Request::Multi(vec![
                    Op::Check {
                        target: Target::Root(1),
                        version: root,
                    },
                    Op::Check {
                        target: Target::Monitor,
                        version: 1,
                    },
                    Op::Delete {
                        target: Target::Mutex,
                        version: Some(0),
                    },
                ])],
                carry: false,
            })
        };
        assert_eq!(removal.handle(answers(5)), delete(5));
        let failed = |index| {
            Input::Replies(vec![Reply::Multi(Err(MultiError::Failed {
                index,
                code: Code::BadVersion,
            }))])
        };
        assert_eq!(removal.handle(failed(0)), reads);
        assert_eq!(removal.handle(answers(6)), delete(6));
        assert_eq!(removal.handle(failed(1)), Action::Done);
        assert_eq!(removal.outcome(), Some(&Ok(())));
        // Without a lock root (monitors at ZooKeeper's root): the monitor's check alone.
        let mut removal = Removal::careful(7, "a1", None, true, false).with_lock_root(0);
        let Action::Send(send) = removal.start() else {
            panic!("reads first");
        };
        assert_eq!(send.requests.len(), 3);
    }
}
