//! The model check's world: clients that run the lock's own sans-IO core
//! (`zkguard::zk::protocol`) against the model of ZooKeeper in [`zk`], one connection and one
//! session each, with the faults the explorer may inject.

pub mod zk;

use std::collections::VecDeque;

use stateright::{Model, Property};
use zk::Zk;
use zkguard::zk::protocol::{
    Acquisition, Action, Code, Fired, Flaw, Input, Now, Outcome, Removal, Reply, Request, Spec,
    Target,
};

/// Which of a client's two machines a request belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Who {
    /// Its acquisition.
    Acq,
    /// The release of its last lock, or the reaper's clean-up after a cancelled acquisition:
    /// they run beside its next acquisition, on the same session, as in production.
    Rel,
    /// A cancelled acquisition's: applied by the server, its answer goes nowhere.
    Gone,
}

/// What a machine waits for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Wait {
    /// The replies to its batch of `expected` requests, gathered in order.
    Batch {
        expected: usize,
        got: Vec<Reply>,
    },
    Watch,
    Connect,
    Backoff,
}

/// One client process.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Client {
    pub foreground: bool,
    pub session: i64,
    pub incarnation: i64,
    pub alive: bool,
    pub connected: bool,
    /// Requests sent and not applied yet, with their machine and attempt id.
    pub outbox: VecDeque<(Who, String, Request)>,
    /// Answers applied by the server and not received yet.
    pub inbox: VecDeque<(Who, Reply)>,
    pub acq: Option<(Acquisition, Wait)>,
    pub rel: Option<(Removal, Wait)>,
    /// Clean-ups waiting for the one under way (the session's reaper takes one at a time).
    pub reaps: VecDeque<Removal>,
    /// Held: the take's zxid.
    pub holding: Option<Held>,
    pub cycles_left: u8,
    pub now: Now,
    /// The zxid of the newest state this client has seen (answers and watch events).
    pub seen: i64,
    /// The foreground nodes (and their creation zxids) it had seen queued when its current take
    /// of the mutex was applied: none may still exist when the take becomes a hold.
    pub overtook: Vec<(Target, i64)>,
    pub has_deadline: bool,
}

/// A held lock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Held {
    pub zxid: i64,
    pub node: String,
    pub alone: bool,
    pub version: Option<i32>,
    pub attempt: String,
}

/// The whole world.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct World {
    pub zk: Zk,
    pub clients: Vec<Client>,
    /// The zxid of the last take that became a hold.
    pub last_take: i64,
    pub faults_left: u8,
    /// Properties broken by a transition (checked by `always` properties).
    pub broken_order: bool,
    pub broken_priority: bool,
}

/// A move of the explorer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Move {
    Start(usize),
    /// The server applies the client's first request in flight; its answer comes back.
    Apply(usize),
    /// The server applies the first `k` requests in flight, and the connection breaks before
    /// their answers come back (the rest is not applied).
    Lose(usize, usize),
    Fire(usize),
    Release(usize),
    Deadline(usize),
    Promote(usize),
    Reconnect(usize),
    Expire(usize),
    Cancel(usize),
    ReapMonitor,
}

/// A configuration to explore.
#[derive(Debug, Clone)]
pub struct LockModel {
    /// Per client: foreground, whether it has a deadline (may time out), how many locks it
    /// takes one after the other.
    pub clients: Vec<(bool, bool, u8)>,
    /// How many faults (connection losses, expiries, cancellations) a run may have.
    pub faults: u8,
    /// Whether background clients may be promoted (anti-starvation).
    pub promotion: bool,
    pub flaw: Option<Flaw>,
}

const FOREGROUND: &str = "A";
const BACKGROUND: &str = "B";

impl LockModel {
    fn spec(&self, client: &Client, i: usize) -> Spec {
        let cycle = self.clients[i].2 - client.cycles_left;
        Spec {
            me: client.session,
            attempt: format!("c{i}.{cycle}"),
            promoted_attempt: format!("c{i}.{cycle}p"),
            prefix: if client.foreground {
                FOREGROUND
            } else {
                BACKGROUND
            }
            .into(),
            foreground: FOREGROUND.into(),
            background: BACKGROUND.into(),
            try_once: false,
            contended_before: false,
            carry: false,
            root_depth: 1,
            recreate: true,
            versioned: true,
            flaw: self.flaw,
        }
    }

    /// Performs what a machine asked, until it waits for the world.
    fn run(&self, w: &mut World, c: usize, who: Who, mut action: Action) {
        loop {
            let client = &mut w.clients[c];
            let input = match action {
                Action::Send(send) => {
                    if !client.alive {
                        Input::Replies(
                            send.requests
                                .iter()
                                .map(|r| fail(r, Code::Expired))
                                .collect(),
                        )
                    } else if !client.connected {
                        Input::Replies(
                            send.requests
                                .iter()
                                .map(|r| fail(r, Code::Lost("disconnected".into())))
                                .collect(),
                        )
                    } else {
                        let attempt = match &client.acq {
                            Some((acq, _)) if who == Who::Acq => acq.attempt().to_string(),
                            _ => String::new(),
                        };
                        let expected = send.requests.len();
                        for request in send.requests {
                            client.outbox.push_back((who, attempt.clone(), request));
                        }
                        self.set_wait(
                            client,
                            who,
                            Wait::Batch {
                                expected,
                                got: Vec::new(),
                            },
                        );
                        return;
                    }
                }
                Action::AwaitWatch => {
                    if !client.alive {
                        Input::Ended
                    } else {
                        self.set_wait(client, who, Wait::Watch);
                        return;
                    }
                }
                Action::AwaitConnected { .. } | Action::Backoff if client.connected => {
                    if matches!(action, Action::Backoff) {
                        Input::Woke
                    } else {
                        Input::Connected
                    }
                }
                Action::AwaitConnected { .. } if !client.alive => {
                    // The driver's wait ends with the session: the acquisition fails; its
                    // nodes went with the session.
                    client.acq = None;
                    self.next_cycle(w, c);
                    return;
                }
                Action::AwaitConnected { .. } => {
                    self.set_wait(client, who, Wait::Connect);
                    return;
                }
                Action::Backoff if !client.alive => Input::Woke,
                Action::Backoff => {
                    self.set_wait(client, who, Wait::Backoff);
                    return;
                }
                Action::Describe => Input::Described,
                Action::Done => {
                    self.finished(w, c, who);
                    return;
                }
            };
            let now = w.clients[c].now;
            action = match who {
                Who::Acq => match &mut w.clients[c].acq {
                    Some((acq, _)) => acq.handle(input, now),
                    None => return,
                },
                Who::Rel => match &mut w.clients[c].rel {
                    Some((rel, _)) => rel.handle(input),
                    None => return,
                },
                Who::Gone => return,
            };
        }
    }

    fn set_wait(&self, client: &mut Client, who: Who, wait: Wait) {
        match who {
            Who::Acq => {
                if let Some((_, w)) = &mut client.acq {
                    *w = wait;
                }
            }
            Who::Rel => {
                if let Some((_, w)) = &mut client.rel {
                    *w = wait;
                }
            }
            Who::Gone => {}
        }
    }

    /// A machine finished.
    fn finished(&self, w: &mut World, c: usize, who: Who) {
        if who != Who::Acq {
            w.clients[c].rel = None;
            if let Some(next) = w.clients[c].reaps.pop_front() {
                self.start_rel(w, c, next);
            }
            return;
        }
        let Some((acq, _)) = w.clients[c].acq.take() else {
            return;
        };
        match acq.outcome() {
            Some(Outcome::Acquired {
                zxid,
                version,
                alone,
                node,
                ..
            }) => {
                if *zxid <= w.last_take {
                    w.broken_order = true;
                }
                w.last_take = w.last_take.max(*zxid);
                let client = &mut w.clients[c];
                let overtaken = client.overtook.iter().any(|(target, czxid)| {
                    w.zk.nodes.get(target).is_some_and(|n| n.czxid == *czxid)
                });
                if acq.prefix() == BACKGROUND && overtaken {
                    w.broken_priority = true;
                }
                client.holding = Some(Held {
                    zxid: *zxid,
                    node: node.clone(),
                    alone: *alone,
                    version: *version,
                    attempt: acq.attempt().to_string(),
                });
            }
            _ => {
                // Failed: what is left goes to the session's reaper.
                if let Some(left) = acq.leftovers() {
                    self.start_rel(
                        w,
                        c,
                        Removal::reap(
                            w.clients[c].session,
                            &left.attempt,
                            left.node,
                            left.holds_mutex,
                            left.search,
                        ),
                    );
                }
                self.next_cycle(w, c);
            }
        }
    }

    fn next_cycle(&self, w: &mut World, c: usize) {
        let client = &mut w.clients[c];
        client.cycles_left = client.cycles_left.saturating_sub(1);
        client.now = Now::default();
        client.overtook.clear();
    }

    fn start_rel(&self, w: &mut World, c: usize, removal: Removal) {
        let removal = removal.with_flaw(self.flaw);
        if w.clients[c].rel.is_some() {
            w.clients[c].reaps.push_back(removal);
            return;
        }
        w.clients[c].rel = Some((removal, Wait::Backoff));
        let action = w.clients[c]
            .rel
            .as_mut()
            .map(|(r, _)| r.start())
            .unwrap_or(Action::Done);
        self.run(w, c, Who::Rel, action);
    }

    /// The first answer in the client's inbox reaches its machine.
    fn receive(&self, w: &mut World, c: usize) {
        let Some((who, reply)) = w.clients[c].inbox.pop_front() else {
            return;
        };
        self.deliver(w, c, who, reply);
    }

    fn deliver(&self, w: &mut World, c: usize, who: Who, reply: Reply) {
        let client = &mut w.clients[c];
        let slot = match who {
            Who::Acq => client.acq.as_mut().map(|(_, wait)| wait),
            Who::Rel => client.rel.as_mut().map(|(_, wait)| wait),
            Who::Gone => None,
        };
        let Some(Wait::Batch { expected, got }) = slot else {
            return;
        };
        got.push(reply);
        if got.len() < *expected {
            return;
        }
        let replies = std::mem::take(got);
        let now = client.now;
        let action = match who {
            Who::Acq => client
                .acq
                .as_mut()
                .map(|(a, _)| a.handle(Input::Replies(replies), now)),
            Who::Rel => client
                .rel
                .as_mut()
                .map(|(r, _)| r.handle(Input::Replies(replies))),
            Who::Gone => None,
        };
        if let Some(action) = action {
            self.run(w, c, who, action);
        }
    }

    /// The server applies the client's first request in flight.
    fn apply(&self, w: &mut World, c: usize) {
        let Some((who, attempt, request)) = w.clients[c].outbox.pop_front() else {
            return;
        };
        let session = w.clients[c].session;
        let takes = matches!(&request, Request::Multi(ops) if ops.iter().any(is_mutex_create))
            || matches!(&request, Request::Single(op) if is_mutex_create(op));
        if takes && who == Who::Acq {
            // The foreground nodes this client had seen queued when it decided to take.
            let seen = w.clients[c].seen;
            let fg: Vec<(Target, i64)> =
                w.zk.nodes
                    .iter()
                    .filter(|(t, n)| {
                        matches!(t, Target::Node(name) if name.starts_with(FOREGROUND))
                            && n.czxid <= seen
                    })
                    .map(|(t, n)| (t.clone(), n.czxid))
                    .collect();
            w.clients[c].overtook = fg;
        }
        let reply = w.zk.apply(session, &attempt, &request);
        if who == Who::Acq {
            w.clients[c].seen = w.zk.zxid;
        }
        w.clients[c].inbox.push_back((who, reply));
    }

    fn lose_connection(&self, w: &mut World, c: usize, code: Code) {
        let client = &mut w.clients[c];
        client.connected = false;
        // Requests not applied are dropped, answers not received are lost: every machine with
        // a batch open gets the rest of its answers as failures.
        let outbox = std::mem::take(&mut client.outbox);
        let inbox = std::mem::take(&mut client.inbox);
        let mut lost: Vec<(Who, Reply)> = inbox
            .into_iter()
            .map(|(who, reply)| (who, fail_reply(&reply, code.clone())))
            .collect();
        lost.extend(
            outbox
                .into_iter()
                .map(|(who, _, r)| (who, fail(&r, code.clone()))),
        );
        for (who, reply) in lost {
            self.deliver(w, c, who, reply);
        }
    }
}

fn is_mutex_create(op: &zkguard::zk::protocol::Op) -> bool {
    matches!(
        op,
        zkguard::zk::protocol::Op::Create {
            target: Target::Mutex,
            ..
        }
    )
}

/// The failed answer to `request`.
fn fail(request: &Request, code: Code) -> Reply {
    match request {
        Request::Multi(_) => Reply::Multi(Err(zkguard::zk::protocol::MultiError::Request(code))),
        Request::Single(zkguard::zk::protocol::Op::Create { .. }) => Reply::Created(Err(code)),
        Request::Single(_) => Reply::Deleted(Err(code)),
        Request::GetChildren(_) => Reply::Children(Err(code)),
        Request::GetData(_) | Request::Watch(_) => Reply::Data(Err(code)),
        Request::Sync(_) => Reply::Synced(Err(code)),
    }
}

/// The failure of an answer of the same kind as `reply`.
fn fail_reply(reply: &Reply, code: Code) -> Reply {
    match reply {
        Reply::Multi(_) => Reply::Multi(Err(zkguard::zk::protocol::MultiError::Request(code))),
        Reply::Created(_) => Reply::Created(Err(code)),
        Reply::Deleted(_) => Reply::Deleted(Err(code)),
        Reply::Children(_) => Reply::Children(Err(code)),
        Reply::Data(_) => Reply::Data(Err(code)),
        Reply::Synced(_) | Reply::Skipped => Reply::Synced(Err(code)),
    }
}

impl Model for LockModel {
    type State = World;
    type Action = Move;

    fn init_states(&self) -> Vec<World> {
        vec![World {
            zk: Zk::new(),
            clients: self
                .clients
                .iter()
                .enumerate()
                .map(|(i, &(foreground, has_deadline, cycles))| Client {
                    foreground,
                    session: (i as i64 + 1) * 100,
                    incarnation: 0,
                    alive: true,
                    connected: true,
                    outbox: VecDeque::new(),
                    inbox: VecDeque::new(),
                    acq: None,
                    rel: None,
                    reaps: VecDeque::new(),
                    holding: None,
                    cycles_left: cycles,
                    now: Now::default(),
                    seen: 0,
                    overtook: Vec::new(),
                    has_deadline,
                })
                .collect(),
            last_take: 0,
            faults_left: self.faults,
            broken_order: false,
            broken_priority: false,
        }]
    }

    fn actions(&self, w: &World, moves: &mut Vec<Move>) {
        for (i, c) in w.clients.iter().enumerate() {
            if c.acq.is_none() && c.holding.is_none() && c.cycles_left > 0 {
                moves.push(Move::Start(i));
            }
            if c.connected && !c.outbox.is_empty() {
                moves.push(Move::Apply(i));
            }
            let acq_wait = c.acq.as_ref().map(|(_, wait)| wait);
            if acq_wait == Some(&Wait::Watch) && w.zk.fired.contains_key(&c.session) {
                moves.push(Move::Fire(i));
            }
            if c.holding.is_some() && c.rel.is_none() {
                moves.push(Move::Release(i));
            }
            if c.has_deadline && c.acq.is_some() && !c.now.past_deadline {
                moves.push(Move::Deadline(i));
            }
            if self.promotion && !c.foreground && c.acq.is_some() && !c.now.promote_due {
                moves.push(Move::Promote(i));
            }
            let connect_wait = |m: Option<&Wait>| matches!(m, Some(Wait::Connect | Wait::Backoff));
            if !c.connected
                && c.alive
                && (connect_wait(acq_wait) || connect_wait(c.rel.as_ref().map(|(_, w)| w)))
            {
                moves.push(Move::Reconnect(i));
            }
            if w.faults_left > 0 && c.alive {
                if c.connected && !c.outbox.is_empty() {
                    for k in 0..=c.outbox.len() {
                        moves.push(Move::Lose(i, k));
                    }
                }
                if c.acq.is_some() || c.holding.is_some() {
                    moves.push(Move::Expire(i));
                }
                if c.acq.is_some() {
                    moves.push(Move::Cancel(i));
                }
            }
        }
        if w.zk.monitor_reapable() {
            moves.push(Move::ReapMonitor);
        }
    }

    fn next_state(&self, last: &World, m: Move) -> Option<World> {
        let mut w = last.clone();
        match m {
            Move::Start(c) => {
                let spec = self.spec(&w.clients[c], c);
                let mut acq = Acquisition::new(spec);
                let action = acq.start(w.clients[c].now);
                w.clients[c].acq = Some((acq, Wait::Backoff));
                self.run(&mut w, c, Who::Acq, action);
            }
            Move::Apply(c) => {
                self.apply(&mut w, c);
                self.receive(&mut w, c);
            }
            Move::Lose(c, k) => {
                w.faults_left -= 1;
                for _ in 0..k {
                    self.apply(&mut w, c);
                }
                self.lose_connection(&mut w, c, Code::Lost("connection loss".into()));
            }
            Move::Fire(c) => {
                let session = w.clients[c].session;
                let fired = w.zk.fired.remove(&session).unwrap_or(Fired::Session);
                w.clients[c].seen = w.zk.zxid;
                let now = w.clients[c].now;
                let action = w.clients[c]
                    .acq
                    .as_mut()
                    .map(|(a, _)| a.handle(Input::Fired(fired), now));
                if let Some(action) = action {
                    self.run(&mut w, c, Who::Acq, action);
                }
            }
            Move::Release(c) => {
                let held = w.clients[c].holding.take()?;
                let session = w.clients[c].session;
                let removal = Removal::release(
                    session,
                    &held.attempt,
                    held.node,
                    true,
                    !held.alone,
                    held.version,
                );
                self.next_cycle(&mut w, c);
                self.start_rel(&mut w, c, removal);
            }
            Move::Deadline(c) => {
                w.clients[c].now.past_deadline = true;
                self.woke(&mut w, c);
            }
            Move::Promote(c) => {
                w.clients[c].now.promote_due = true;
                self.woke(&mut w, c);
            }
            Move::Reconnect(c) => {
                w.clients[c].connected = true;
                for who in [Who::Acq, Who::Rel] {
                    let waiting = match who {
                        Who::Acq => w.clients[c].acq.as_ref().map(|(_, wait)| wait.clone()),
                        _ => w.clients[c].rel.as_ref().map(|(_, wait)| wait.clone()),
                    };
                    let input = match waiting {
                        Some(Wait::Connect) => Input::Connected,
                        Some(Wait::Backoff) => Input::Woke,
                        _ => continue,
                    };
                    let now = w.clients[c].now;
                    let action = match who {
                        Who::Acq => w.clients[c].acq.as_mut().map(|(a, _)| a.handle(input, now)),
                        _ => w.clients[c].rel.as_mut().map(|(r, _)| r.handle(input)),
                    };
                    if let Some(action) = action {
                        self.run(&mut w, c, who, action);
                    }
                }
            }
            Move::Expire(c) => {
                w.faults_left -= 1;
                let session = w.clients[c].session;
                w.zk.close_session(session);
                w.clients[c].alive = false;
                self.lose_connection(&mut w, c, Code::Expired);
                // A holder of the expired session has lost its lock.
                if w.clients[c].holding.take().is_some() {
                    self.next_cycle(&mut w, c);
                }
                let now = w.clients[c].now;
                match w.clients[c].acq.as_ref().map(|(_, wait)| wait.clone()) {
                    Some(Wait::Watch) => {
                        let action = w.clients[c]
                            .acq
                            .as_mut()
                            .map(|(a, _)| a.handle(Input::Ended, now));
                        if let Some(action) = action {
                            self.run(&mut w, c, Who::Acq, action);
                        }
                    }
                    // Waiting to reconnect: the driver's wait ends with the session.
                    Some(Wait::Connect) => {
                        w.clients[c].acq = None;
                        self.next_cycle(&mut w, c);
                    }
                    _ => {}
                }
                // Clean-ups under way end with the session, which removed their nodes.
                w.clients[c].rel = None;
                w.clients[c].reaps.clear();
                if w.clients[c].acq.is_none() {
                    self.renew(&mut w, c);
                }
            }
            Move::Cancel(c) => {
                w.faults_left -= 1;
                let (acq, _) = w.clients[c].acq.take()?;
                // Its requests in flight still reach the server; their answers go nowhere.
                let client = &mut w.clients[c];
                for (who, _, _) in client.outbox.iter_mut() {
                    if *who == Who::Acq {
                        *who = Who::Gone;
                    }
                }
                for (who, _) in client.inbox.iter_mut() {
                    if *who == Who::Acq {
                        *who = Who::Gone;
                    }
                }
                if let Some(left) = acq.leftovers() {
                    let session = w.clients[c].session;
                    self.next_cycle(&mut w, c);
                    self.start_rel(
                        &mut w,
                        c,
                        Removal::reap(
                            session,
                            &left.attempt,
                            left.node,
                            left.holds_mutex,
                            left.search,
                        ),
                    );
                } else {
                    self.next_cycle(&mut w, c);
                }
            }
            Move::ReapMonitor => w.zk.reap_monitor(),
        }
        if !w.clients.iter().all(|c| c.alive) {
            for c in 0..w.clients.len() {
                if !w.clients[c].alive && w.clients[c].acq.is_none() && w.clients[c].rel.is_none() {
                    self.renew(&mut w, c);
                }
            }
        }
        Some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("at most one holder", |_, w: &World| {
                w.clients
                    .iter()
                    .filter(|c| c.alive && c.holding.is_some())
                    .count()
                    <= 1
            }),
            Property::always("tokens increase in holding order", |_, w: &World| {
                !w.broken_order
            }),
            Property::always(
                "foreground is not overtaken by background",
                |_, w: &World| !w.broken_priority,
            ),
            Property::always("a live holder is never stray", |_, w: &World| {
                w.clients.iter().all(|c| match &c.holding {
                    Some(held) if c.alive => {
                        let mutex = w.zk.nodes.get(&Target::Mutex);
                        let node = w.zk.nodes.get(&Target::Node(held.node.clone()));
                        mutex.is_some_and(|m| m.owner == c.session && m.czxid == held.zxid)
                            && node.is_some_and(|n| n.owner == c.session)
                    }
                    _ => true,
                })
            }),
            Property::always(
                "nothing is left once every client finished",
                |_, w: &World| !all_finished(w) || w.zk.children(&Target::Monitor).is_empty(),
            ),
            Property::eventually("every client finishes", |_, w: &World| all_finished(w)),
        ]
    }
}

impl LockModel {
    /// A waiting acquisition looks again (the deadline or the time to promote came).
    fn woke(&self, w: &mut World, c: usize) {
        if let Some((_, Wait::Watch)) = &w.clients[c].acq {
            let now = w.clients[c].now;
            let action = w.clients[c]
                .acq
                .as_mut()
                .map(|(a, _)| a.handle(Input::Woke, now));
            if let Some(action) = action {
                self.run(w, c, Who::Acq, action);
            }
        }
    }

    /// A new session for a client whose session expired.
    fn renew(&self, w: &mut World, c: usize) {
        let client = &mut w.clients[c];
        if client.alive {
            return;
        }
        client.incarnation += 1;
        client.session = (c as i64 + 1) * 100 + client.incarnation;
        client.alive = true;
        client.connected = true;
        client.outbox.clear();
        client.inbox.clear();
    }
}

/// Every client is done: no cycle left, nothing under way, nothing held, nothing in flight.
pub fn all_finished(w: &World) -> bool {
    w.clients.iter().all(|c| {
        c.cycles_left == 0
            && c.acq.is_none()
            && c.rel.is_none()
            && c.holding.is_none()
            && c.outbox.is_empty()
            && c.inbox.is_empty()
    })
}
