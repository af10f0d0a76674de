//! How a client runs its machines: it performs what they ask (requests pipelined on its one
//! connection, waits), hands them the server's answers, and carries a release in the next
//! acquisition's first multi as `LockModel::carry` asks (`release_and_acquire`).

use zkguard::zk::protocol::{
    release_ops, Acquisition, Action, Awaits, Code, Input, MultiError, Op, Outcome, Removal, Reply,
    Request, Target,
};
use zkguard::zk::QueueNode;

use super::{
    Carrier, Client, Held, LockModel, Via, Wait, Who, World, BACKGROUND, FOREGROUND, MONITOR,
};

impl LockModel {
    /// Performs what a machine asked, until it waits for the world.
    pub(super) fn run(&self, w: &mut World, c: usize, who: Who, mut action: Action) {
        loop {
            let input = match action {
                Action::Send(send) => {
                    if who == Who::Acq && !send.carry {
                        // A lock still to be released goes on its own first.
                        if let Some(carrier) = w.clients[c].carrier.take() {
                            self.release_alone(w, c, carrier.held);
                        }
                    }
                    let client = &mut w.clients[c];
                    if !client.alive {
                        Input::Replies(
                            send.requests
                                .iter()
                                .map(|r| fail(r, Code::Expired))
                                .collect(),
                        )
                    } else if !client.connected {
                        let lost = Code::Lost("disconnected".into());
                        Input::Replies(
                            send.requests
                                .iter()
                                .map(|r| fail(r, lost.clone()))
                                .collect(),
                        )
                    } else {
                        let attempt = match &client.acq {
                            Some((acq, _)) if who == Who::Acq => acq.attempt().to_string(),
                            _ => String::new(),
                        };
                        let expected = send.requests.len();
                        let carrier = client.carrier.clone().filter(|_| send.carry);
                        for (i, request) in send.requests.into_iter().enumerate() {
                            let entry = match (&carrier, i, request) {
                                (Some(carrier), 0, Request::Multi(ops)) => {
                                    let held = &carrier.held;
                                    let mut all =
                                        release_ops(&held.node, !held.alone, held.version);
                                    let own = all.len();
                                    all.extend(ops);
                                    (
                                        who,
                                        Via::Carried { own },
                                        attempt.clone(),
                                        Request::Multi(all),
                                    )
                                }
                                // Behind a release that waited, the reads are not sent.
                                (Some(carrier), _, request) if carrier.waiting => {
                                    (who, Via::Skip, attempt.clone(), request)
                                }
                                (_, _, request) => (who, Via::Plain, attempt.clone(), request),
                            };
                            client.outbox.push_back(entry);
                        }
                        self.set_wait(
                            w,
                            c,
                            who,
                            Wait::Batch {
                                expected,
                                got: Vec::new(),
                            },
                        );
                        return;
                    }
                }
                // A wait whose wake-up has come already ends at once, as the driver's sleep.
                Action::AwaitWatch if w.clients[c].alive && self.wake_due(w, c) => Input::Woke,
                Action::AwaitWatch if w.clients[c].alive => {
                    self.set_wait(w, c, who, Wait::Watch);
                    return;
                }
                Action::AwaitWatch => Input::Ended,
                Action::AwaitConnected if w.clients[c].connected => Input::Connected,
                Action::Backoff if w.clients[c].connected || !w.clients[c].alive => Input::Woke,
                Action::AwaitConnected if !w.clients[c].alive => {
                    // The driver's wait ends with the session: the acquisition fails; its
                    // nodes went with the session.
                    w.clients[c].acq = None;
                    self.end_acquisition(w, c);
                    return;
                }
                Action::AwaitConnected => {
                    self.set_wait(w, c, who, Wait::Connect);
                    return;
                }
                Action::Backoff => {
                    self.set_wait(w, c, who, Wait::Backoff);
                    return;
                }
                Action::Describe => Input::Described,
                Action::Done => {
                    self.finished(w, c, who);
                    return;
                }
            };
            match self.handle(w, c, who, input) {
                Some(next) => action = next,
                None => return,
            }
        }
    }

    /// Whether the client's acquisition asked to be woken by its clock's time.
    fn wake_due(&self, w: &World, c: usize) -> bool {
        let client = &w.clients[c];
        client
            .acq
            .as_ref()
            .is_some_and(|(acq, _)| acq.poll_timeout().is_some_and(|at| at <= client.clock))
    }

    /// Hands `input` to a machine; its next action. What an acquisition's step learnt of its
    /// session goes to the session's knowledge, as the driver's `Contender::learn`.
    pub(super) fn handle(&self, w: &mut World, c: usize, who: Who, input: Input) -> Option<Action> {
        let client = &mut w.clients[c];
        let clock = client.clock;
        match who {
            Who::Acq => client.acq.as_mut().map(|(a, _)| {
                let action = a.handle(input, clock);
                a.teach(&mut client.knowledge, MONITOR);
                action
            }),
            Who::Rel(slot) => client
                .rels
                .get_mut(slot)
                .and_then(Option::as_mut)
                .map(|(r, _)| r.handle(input)),
            Who::Gone => None,
        }
    }

    /// Hands `input` to a machine and runs it on.
    pub(super) fn feed(&self, w: &mut World, c: usize, who: Who, input: Input) {
        if let Some(action) = self.handle(w, c, who, input) {
            self.run(w, c, who, action);
        }
    }

    pub(super) fn wait_of(&self, w: &World, c: usize, who: Who) -> Option<Wait> {
        let client = &w.clients[c];
        match who {
            Who::Acq => client.acq.as_ref().map(|(_, wait)| wait.clone()),
            Who::Rel(slot) => client
                .rels
                .get(slot)?
                .as_ref()
                .map(|(_, wait)| wait.clone()),
            Who::Gone => None,
        }
    }

    fn set_wait(&self, w: &mut World, c: usize, who: Who, wait: Wait) {
        if let Some(slot) = wait_mut(&mut w.clients[c], who) {
            *slot = wait;
        }
    }

    /// A machine finished.
    fn finished(&self, w: &mut World, c: usize, who: Who) {
        if let Who::Rel(slot) = who {
            if let Some(entry) = w.clients[c].rels.get_mut(slot) {
                *entry = None;
            }
            return;
        }
        let Some((acq, _)) = w.clients[c].acq.take() else {
            return;
        };
        // The lock carried but not released with a multi goes on its own.
        if let Some(carrier) = w.clients[c].carrier.take() {
            self.release_alone(w, c, carrier.held);
        }
        match acq.outcome() {
            Some(Outcome::Acquired {
                zxid,
                version,
                alone,
                node,
                ..
            }) => {
                // A take whose mutex an operator deleted before its answer came is lost at
                // once: its holder's writes are fenced by the next holder's token.
                let lost = w.deleted_takes.iter().any(|a| a == acq.attempt());
                if !lost {
                    if *zxid <= w.last_take {
                        w.broken_order = true;
                    }
                    w.last_take = w.last_take.max(*zxid);
                }
                // A lock still held (queued while holding, and not handed over) goes first.
                if let Some(old) = w.clients[c].holding.take() {
                    self.release_alone(w, c, old);
                }
                let client = &mut w.clients[c];
                let overtaken = client.overtook.iter().any(|(target, czxid)| {
                    w.zk.nodes.get(target).is_some_and(|n| n.czxid == *czxid)
                });
                if acq.prefix() == BACKGROUND && overtaken {
                    w.broken_priority = true;
                }
                if client.ahead_at_take.iter().any(|(target, czxid)| {
                    w.zk.nodes.get(target).is_some_and(|n| n.czxid == *czxid)
                }) {
                    w.broken_queue_order = true;
                }
                client.holding = Some(Held {
                    zxid: *zxid,
                    node: node.clone(),
                    alone: *alone,
                    version: *version,
                    attempt: acq.attempt().to_string(),
                    lost,
                });
            }
            _ => {
                // Failed: what is left goes to the session's reaper.
                self.reap_leftovers(w, c, &acq);
                self.end_acquisition(w, c);
            }
        }
    }

    /// The end of one lock of a client (released, or not acquired).
    pub(super) fn end_acquisition(&self, w: &mut World, c: usize) {
        let client = &mut w.clients[c];
        client.cycles_left = client.cycles_left.saturating_sub(1);
        client.clock = Default::default();
        client.overtook.clear();
        client.ahead_at_take.clear();
    }

    /// The end of a held lock: the end of its acquisition, unless the client's next one is
    /// already under way (queued while it held).
    pub(super) fn end_hold(&self, w: &mut World, c: usize) {
        if w.clients[c].acq.is_some() {
            let client = &mut w.clients[c];
            client.cycles_left = client.cycles_left.saturating_sub(1);
        } else {
            self.end_acquisition(w, c);
        }
    }

    /// `LockGuard::release` where the client's own acquisition waits at a hand-over point for
    /// this lock (`zk::successor`): one multi of the release and the waiter's take, whose
    /// answer is the take's. `false` when no acquisition of the client waits there.
    pub(super) fn hand_over(&self, w: &mut World, c: usize, held: &Held) -> bool {
        let client = &mut w.clients[c];
        if !self.handover || !client.alive || !client.connected || held.version.is_none() {
            return false;
        }
        let Some((acq, Wait::Watch)) = &mut client.acq else {
            return false;
        };
        let Some((awaits, ops)) = acq.hand_over_point() else {
            return false;
        };
        if awaits != Awaits::Mutex && awaits != Awaits::Node(held.node.clone()) {
            return false;
        }
        acq.handed();
        let attempt = acq.attempt().to_string();
        // Claimed, the acquisition never reads its watch again (production keeps the watcher
        // only until it fires).
        w.zk.watches.remove(&client.session);
        w.zk.fired.remove(&client.session);
        let mut all = release_ops(&held.node, !held.alone, held.version);
        let own = all.len();
        all.extend(ops);
        client.carrier = Some(Carrier {
            held: held.clone(),
            waiting: false,
        });
        client
            .outbox
            .push_back((Who::Acq, Via::Carried { own }, attempt, Request::Multi(all)));
        self.set_wait(
            w,
            c,
            Who::Acq,
            Wait::Batch {
                expected: 1,
                got: Vec::new(),
            },
        );
        true
    }

    /// Starts a removal beside whatever else the client runs.
    pub(super) fn start_rel(&self, w: &mut World, c: usize, removal: Removal) {
        // The model's lock root is one node (`Root(0)`), as the acquisitions' `Spec::root_depth`.
        let mut removal = removal.with_lock_root(1).with_flaw(self.flaw);
        let action = removal.start();
        let rels = &mut w.clients[c].rels;
        let slot = match rels.iter().position(Option::is_none) {
            Some(slot) => slot,
            None => {
                rels.push(None);
                rels.len() - 1
            }
        };
        rels[slot] = Some((removal, Wait::Backoff));
        self.run(w, c, Who::Rel(slot), action);
    }

    /// What an acquisition that went away leaves goes to the session's reaper.
    pub(super) fn reap_leftovers(&self, w: &mut World, c: usize, acq: &Acquisition) {
        if let Some(left) = acq.leftovers() {
            let session = w.clients[c].session;
            let reap = Removal::reap(
                session,
                &left.attempt,
                left.node,
                left.holds_mutex,
                left.search,
            );
            self.start_rel(w, c, reap);
        }
    }

    /// `LockGuard::release` of a held lock.
    pub(super) fn release_alone(&self, w: &mut World, c: usize, held: Held) {
        let session = w.clients[c].session;
        let removal = Removal::release(
            session,
            &held.attempt,
            held.node,
            true,
            !held.alone,
            held.version,
        );
        self.start_rel(w, c, removal);
    }

    /// The release of a carried lock after its multi's answer was lost: careful deletes.
    fn release_carefully(&self, w: &mut World, c: usize, held: Held) {
        let session = w.clients[c].session;
        let removal = Removal::careful(session, &held.attempt, Some(held.node), true, false);
        self.start_rel(w, c, removal);
    }

    /// The first answer in the client's inbox reaches its machine.
    pub(super) fn receive(&self, w: &mut World, c: usize) {
        let Some((who, via, reply)) = w.clients[c].inbox.pop_front() else {
            return;
        };
        let reply = match via {
            Via::Plain => reply,
            Via::Skip => Reply::Skipped,
            Via::Carried { own } => self.carried_reply(w, c, own, reply),
        };
        self.deliver(w, c, who, reply);
    }

    /// What a multi carried by a release answers the acquisition, and what becomes of the
    /// release.
    fn carried_reply(&self, w: &mut World, c: usize, own: usize, reply: Reply) -> Reply {
        let Some(carrier) = w.clients[c].carrier.take() else {
            return reply;
        };
        match reply {
            Reply::Multi(Ok(mut results)) => {
                Reply::Multi(Ok(results.split_off(own.min(results.len()))))
            }
            Reply::Multi(Err(MultiError::Failed { index, code })) if index >= own => {
                // The release waits for other operations to carry.
                w.clients[c].carrier = Some(Carrier {
                    waiting: true,
                    ..carrier
                });
                Reply::Multi(Err(MultiError::Failed {
                    index: index - own,
                    code,
                }))
            }
            Reply::Multi(Err(MultiError::Failed { .. })) => {
                self.release_alone(w, c, carrier.held);
                Reply::Multi(Err(MultiError::NotCarried))
            }
            other => {
                self.release_carefully(w, c, carrier.held);
                other
            }
        }
    }

    pub(super) fn deliver(&self, w: &mut World, c: usize, who: Who, reply: Reply) {
        let Some(Wait::Batch { expected, got }) = wait_mut(&mut w.clients[c], who) else {
            return;
        };
        got.push(reply);
        if got.len() < *expected {
            return;
        }
        let replies = std::mem::take(got);
        self.feed(w, c, who, Input::Replies(replies));
    }

    /// The server applies the client's first request in flight.
    pub(super) fn apply(&self, w: &mut World, c: usize) {
        let Some((who, via, attempt, request)) = w.clients[c].outbox.pop_front() else {
            return;
        };
        if via == Via::Skip {
            w.clients[c].inbox.push_back((who, via, Reply::Skipped));
            return;
        }
        let session = w.clients[c].session;
        // A lagging server answers reads from its stale state; a write, a watch or a sync (one
        // that works) goes through the leader's order and leaves it caught up.
        let read = matches!(request, Request::GetChildren(_) | Request::GetData(_));
        let stays_behind = read || (matches!(request, Request::Sync(_)) && !self.sync_catches_up);
        if !stays_behind {
            w.clients[c].lagging = None;
        }
        if let (true, Some(stale)) = (read, &mut w.clients[c].lagging) {
            let reply = stale.apply(session, &attempt, &request);
            w.clients[c].inbox.push_back((who, via, reply));
            return;
        }
        let takes = matches!(&request, Request::Multi(ops) if ops.iter().any(is_mutex_create))
            || matches!(&request, Request::Single(op) if is_mutex_create(op));
        if takes && who == Who::Acq {
            // The foreground nodes queued when the take is applied: none of them may still be
            // there when the take becomes a hold (a background take verifies the queue).
            w.clients[c].ahead_at_take = waiters_ahead(w, c);
            w.clients[c].overtook = w
                .zk
                .nodes
                .iter()
                .filter(|(t, _)| matches!(t, Target::Node(name) if name.starts_with(FOREGROUND)))
                .map(|(t, n)| (t.clone(), n.czxid))
                .collect();
        }
        let reply = w.zk.apply(session, &attempt, &request);
        w.clients[c].inbox.push_back((who, via, reply));
    }

    /// The connection breaks: requests not applied are dropped, answers not received are lost;
    /// every machine with a batch open gets the rest of its answers as failures.
    pub(super) fn lose_connection(&self, w: &mut World, c: usize, code: Code) {
        let client = &mut w.clients[c];
        client.connected = false;
        let outbox = std::mem::take(&mut client.outbox);
        let inbox = std::mem::take(&mut client.inbox);
        let mut lost: Vec<(Who, Via, Reply)> = inbox
            .into_iter()
            .map(|(who, via, reply)| (who, via, fail_reply(&reply, code.clone())))
            .collect();
        lost.extend(
            outbox
                .into_iter()
                .map(|(who, via, _, r)| (who, via, fail(&r, code.clone()))),
        );
        for (who, via, reply) in lost {
            let reply = match via {
                Via::Skip => Reply::Skipped,
                Via::Carried { .. } => {
                    if let Some(carrier) = w.clients[c].carrier.take() {
                        self.release_carefully(w, c, carrier.held);
                    }
                    reply
                }
                Via::Plain => reply,
            };
            self.deliver(w, c, who, reply);
        }
    }
}

/// What a client's machine waits for.
fn wait_mut(client: &mut Client, who: Who) -> Option<&mut Wait> {
    match who {
        Who::Acq => client.acq.as_mut().map(|(_, wait)| wait),
        Who::Rel(slot) => client
            .rels
            .get_mut(slot)
            .and_then(Option::as_mut)
            .map(|(_, wait)| wait),
        Who::Gone => None,
    }
}

fn is_mutex_create(op: &Op) -> bool {
    matches!(
        op,
        Op::Create {
            target: Target::Mutex,
            ..
        }
    )
}

/// The failed answer to `request`.
fn fail(request: &Request, code: Code) -> Reply {
    match request {
        Request::Multi(_) => Reply::Multi(Err(MultiError::Request(code))),
        Request::Single(Op::Create { .. }) => Reply::Created(Err(code)),
        Request::Single(_) => Reply::Deleted(Err(code)),
        Request::GetChildren(_) => Reply::Children(Err(code)),
        Request::GetData(_) | Request::Watch(_) => Reply::Data(Err(code)),
        Request::Sync(_) => Reply::Synced(Err(code)),
    }
}

/// The failure of an answer of the same kind as `reply`.
fn fail_reply(reply: &Reply, code: Code) -> Reply {
    match reply {
        Reply::Multi(_) => Reply::Multi(Err(MultiError::Request(code))),
        Reply::Created(_) => Reply::Created(Err(code)),
        Reply::Deleted(_) => Reply::Deleted(Err(code)),
        Reply::Children(_) => Reply::Children(Err(code)),
        Reply::Data(_) => Reply::Data(Err(code)),
        Reply::Synced(_) | Reply::Skipped => Reply::Synced(Err(code)),
    }
}

/// The nodes of other acquisitions still waiting that sort before client `c`'s acquisition's
/// node (before any node of its class it is about to create, when it has none yet).
fn waiters_ahead(w: &World, c: usize) -> Vec<(Target, i64)> {
    let Some((acq, _)) = &w.clients[c].acq else {
        return Vec::new();
    };
    let mine = acq.node().and_then(QueueNode::parse);
    let waiting: Vec<&str> = w
        .clients
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != c)
        .filter_map(|(_, other)| other.acq.as_ref().and_then(|(a, _)| a.node()))
        .collect();
    w.zk.nodes
        .iter()
        .filter(|(target, _)| match target {
            Target::Node(name) if waiting.contains(&name.as_str()) => {
                match (QueueNode::parse(name), &mine) {
                    (Some(theirs), Some(mine)) => theirs.order(mine).is_lt(),
                    (Some(theirs), None) => theirs.prefix.as_str() <= acq.prefix(),
                    (None, _) => false,
                }
            }
            _ => false,
        })
        .map(|(target, node)| (target.clone(), node.czxid))
        .collect()
}
