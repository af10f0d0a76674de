//! The model check's world: clients that run the lock's own sans-IO core
//! (`zkguard::zk::protocol`) against the model of ZooKeeper in [`zk`], one connection and one
//! session each, with the faults the explorer may inject.

mod client;
pub mod txn;
pub mod zk;

use std::collections::VecDeque;
use std::time::Duration;

use stateright::{Model, Property};
use zk::Zk;
use zkguard::zk::protocol::{
    Acquisition, Code, Fired, Flaw, Input, Previous, Removal, Reply, Request, SessionKnowledge,
    Spec, Target,
};

pub(crate) const FOREGROUND: &str = "A";
pub(crate) const BACKGROUND: &str = "B";
/// The one monitor's key in a session's knowledge (its contention).
pub(crate) const MONITOR: &str = "m";
/// When a background waiter is due to be promoted (`LockModel::promotion`).
pub(crate) const PROMOTE_AFTER: Duration = Duration::from_secs(1);
/// When a client with a deadline gives up.
pub(crate) const DEADLINE: Duration = Duration::from_secs(2);

/// Which of a client's machines a request belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Who {
    /// Its acquisition.
    Acq,
    /// A removal: the release of a lock, or the reaper's clean-up after an abandoned
    /// acquisition; they run beside its next acquisition, on the same session, as in production.
    Rel(usize),
    /// A cancelled acquisition's: applied by the server, its answer goes nowhere.
    Gone,
}

/// How a request travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Via {
    Plain,
    /// A multi that starts with the release of the carried lock (`own` operations).
    Carried {
        own: usize,
    },
    /// A read pipelined behind a multi that a waiting release sends: not sent at all.
    Skip,
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

/// A held lock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Held {
    pub zxid: i64,
    pub node: String,
    pub alone: bool,
    pub version: Option<i32>,
    pub attempt: String,
    /// Its mutex was deleted by someone else (unseen by the holder, at worst).
    pub lost: bool,
}

/// A lock released by the next acquisition's first multi.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Carrier {
    pub held: Held,
    /// The acquisition's part of a carried multi failed: the release waits for other
    /// operations.
    pub waiting: bool,
}

/// One client process.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Client {
    pub foreground: bool,
    pub session: i64,
    pub incarnation: i64,
    pub alive: bool,
    pub connected: bool,
    /// Requests sent and not applied yet: machine, route, attempt id of its creates, request.
    pub outbox: VecDeque<(Who, Via, String, Request)>,
    /// Answers applied by the server and not received yet.
    pub inbox: VecDeque<(Who, Via, Reply)>,
    pub acq: Option<(Acquisition, Wait)>,
    /// Removals under way.
    pub rels: Vec<Option<(Removal, Wait)>>,
    pub holding: Option<Held>,
    /// A lock the acquisition under way releases in its first multi.
    pub carrier: Option<Carrier>,
    pub cycles_left: u8,
    /// How long its acquisition under way has run: the time the explorer lets pass
    /// ([`Move::Elapse`]), which its core decides with.
    pub clock: Duration,
    /// What its session's acquisitions learned about it (reset with a new session).
    pub knowledge: SessionKnowledge,
    /// The foreground nodes (and their creation zxids) queued when its current take of the
    /// mutex was applied: none may still exist when the take becomes a hold.
    pub overtook: Vec<(Target, i64)>,
    /// The waiters' nodes (and their creation zxids) that sorted before its node when its
    /// current take was applied: none may still exist when the take becomes a hold.
    pub ahead_at_take: Vec<(Target, i64)>,
    pub has_deadline: bool,
    /// After a lost answer, the server the client reconnected to may lag behind the leader:
    /// its reads show this state (as of before the lost requests) until a `sync` or a write
    /// of the client's goes through it.
    pub lagging: Option<Box<Zk>>,
}

/// The whole world.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct World {
    pub zk: Zk,
    pub clients: Vec<Client>,
    /// The zxid of the last take that became a hold.
    pub last_take: i64,
    pub faults_left: u8,
    /// The attempt ids of the mutexes an operator deleted.
    pub deleted_takes: Vec<String>,
    /// Properties broken by a transition (checked by `always` properties).
    pub broken_order: bool,
    pub broken_priority: bool,
    pub broken_queue_order: bool,
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
    /// `release_and_acquire`: the next acquisition's first multi carries the release.
    ReleaseAndAcquire(usize),
    /// The client's next acquisition queues while it still holds its lock: a waiter of the
    /// holder's own session, which the release may hand the lock to.
    QueueWhileHolding(usize),
    /// Time passes for a client's acquisition, to one of the moments it must act on (a
    /// background waiter's promotion, its deadline); its driver wakes it if its core asked to
    /// be woken by then ([`Acquisition::poll_timeout`]).
    Elapse(usize, Duration),
    Reconnect(usize),
    Expire(usize),
    Cancel(usize),
    /// An operator deletes `privateLock`.
    DeleteMutex,
    ReapMonitor,
}

/// A configuration to explore.
#[derive(Debug, Clone)]
pub struct LockModel {
    /// Per client: foreground, whether it has a deadline (may time out), how many locks it
    /// takes one after the other.
    pub clients: Vec<(bool, bool, u8)>,
    /// How many faults (connection losses, expiries, cancellations, deletions) a run may have.
    pub faults: u8,
    /// Whether background clients may be promoted (anti-starvation).
    pub promotion: bool,
    /// Sessions whose `zookeeper.acl` lets them neither recreate nor write monitor nodes: the
    /// fast path reads the queue, takes and releases go without the monitor's version.
    pub acl_fallback: bool,
    /// Whether clients may go from lock to lock with `release_and_acquire`.
    pub carry: bool,
    /// Whether a client's next acquisition may queue while it holds, and the release hand the
    /// lock to it in one multi where the acquisition waits at a hand-over point
    /// (`zk::successor`).
    pub handover: bool,
    /// Whether an operator may delete the mutex (a fault).
    pub operator: bool,
    /// Whether a `sync` lets a lagging server catch up (`false`: a broken variant that reads
    /// as if no sync was sent).
    pub sync_catches_up: bool,
    pub flaw: Option<Flaw>,
    /// Moves taken from the initial state before the exploration starts (each must be
    /// offered): a fixed path into a corner that a larger scope found, explored exhaustively
    /// from there.
    pub prefix: Vec<Move>,
}

impl LockModel {
    fn spec(&self, client: &Client, i: usize, previous: Option<&Held>) -> Spec {
        // An acquisition queued while the client holds is of the next cycle: attempt ids are
        // unique, as production's random ones are.
        let cycle = self.clients[i].2 - client.cycles_left + u8::from(client.holding.is_some());
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
            deadline: self.clients[i].1.then_some(DEADLINE),
            promote_after: self.promotion.then_some(PROMOTE_AFTER),
            // Carried only while held (the move is offered so), never awaited by a waiter of
            // the client (it has no other acquisition under way).
            previous: previous.map(|h| Previous {
                held_here: true,
                awaited: false,
                // As `LockGuard::take_zxid_on`: a take that set the monitor's data.
                take_here: h.version.is_some().then_some(h.zxid),
            }),
            root_depth: 1,
            flaw: self.flaw,
        }
    }

    /// Starts the client's next acquisition, which releases `previous` (`release_and_acquire`)
    /// in its first multi where its core carries it, else on its own first.
    fn start(&self, w: &mut World, c: usize, previous: Option<Held>) {
        let spec = self.spec(&w.clients[c], c, previous.as_ref());
        let client = &mut w.clients[c];
        client.clock = Duration::ZERO;
        let mut acq = Acquisition::new(spec, &client.knowledge, MONITOR);
        match previous {
            Some(held) if acq.carrying() => {
                client.carrier = Some(Carrier {
                    held,
                    waiting: false,
                });
            }
            Some(held) => self.release_alone(w, c, held),
            None => {}
        }
        let action = acq.start(Duration::ZERO);
        w.clients[c].acq = Some((acq, Wait::Backoff));
        self.run(w, c, Who::Acq, action);
    }

    /// Time passes for the client's acquisition: a waiting one looks again if its core asked
    /// to be woken by now.
    fn woke(&self, w: &mut World, c: usize) {
        let client = &w.clients[c];
        let due = |acq: &Acquisition| acq.poll_timeout().is_some_and(|at| at <= client.clock);
        if matches!(&client.acq, Some((acq, Wait::Watch)) if due(acq)) {
            self.feed(w, c, Who::Acq, Input::Woke);
        }
    }

    /// The moments the client's acquisition must act on, as the model sees them: its
    /// promotion (a background client's, with promotion on) and its deadline.
    fn moments(&self, c: &Client) -> impl Iterator<Item = Duration> {
        let promotion = (self.promotion && !c.foreground).then_some(PROMOTE_AFTER);
        promotion
            .into_iter()
            .chain(c.has_deadline.then_some(DEADLINE))
    }

    /// A waiting acquisition asleep past a moment it must act on: a background waiter past its
    /// promotion, any waiter past its deadline.
    fn overslept(&self, c: &Client) -> bool {
        let Some((acq, Wait::Watch)) = &c.acq else {
            return false;
        };
        let promote = self.promotion && acq.prefix() == BACKGROUND && c.clock >= PROMOTE_AFTER;
        promote || (c.has_deadline && c.clock >= DEADLINE)
    }

    /// A new session's knowledge: with the ACL fallback, a session that learned already that
    /// it may not write monitor nodes.
    fn new_knowledge(&self) -> SessionKnowledge {
        if self.acl_fallback {
            SessionKnowledge::without_monitor_writes()
        } else {
            SessionKnowledge::new()
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
        client.lagging = None;
        client.knowledge = self.new_knowledge();
    }
}

/// Every client is done: no lock left to take, nothing under way, held, or in flight.
pub fn all_finished(w: &World) -> bool {
    w.clients.iter().all(|c| {
        c.cycles_left == 0
            && c.acq.is_none()
            && c.rels.iter().all(Option::is_none)
            && c.holding.is_none()
            && c.carrier.is_none()
            && c.outbox.is_empty()
            && c.inbox.is_empty()
    })
}

/// The holders that count: a live session, and a mutex nobody deleted under them.
fn holders(w: &World) -> impl Iterator<Item = (&Client, &Held)> {
    w.clients
        .iter()
        .filter(|c| c.alive)
        .filter_map(|c| c.holding.as_ref().filter(|h| !h.lost).map(|h| (c, h)))
}

impl Model for LockModel {
    type State = World;
    type Action = Move;

    fn init_states(&self) -> Vec<World> {
        let clients = self
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
                rels: Vec::new(),
                holding: None,
                carrier: None,
                cycles_left: cycles,
                clock: Duration::ZERO,
                knowledge: self.new_knowledge(),
                overtook: Vec::new(),
                ahead_at_take: Vec::new(),
                has_deadline,
                lagging: None,
            })
            .collect();
        let mut world = World {
            zk: Zk::new(),
            clients,
            last_take: 0,
            faults_left: self.faults,
            deleted_takes: Vec::new(),
            broken_order: false,
            broken_priority: false,
            broken_queue_order: false,
        };
        for (i, m) in self.prefix.iter().enumerate() {
            let mut offered = Vec::new();
            self.actions(&world, &mut offered);
            assert!(
                offered.contains(m),
                "move {i} of the prefix, {m:?}, is not offered: {offered:?}"
            );
            world = self
                .next_state(&world, m.clone())
                .expect("a move of the prefix leads somewhere");
        }
        vec![world]
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
            if let Some(held) = &c.holding {
                moves.push(Move::Release(i));
                // The lock carried only while held: a lost one is released first.
                if self.carry && c.cycles_left > 1 && !held.lost && c.acq.is_none() {
                    moves.push(Move::ReleaseAndAcquire(i));
                }
                if self.handover && c.cycles_left > 1 && !held.lost && c.acq.is_none() {
                    moves.push(Move::QueueWhileHolding(i));
                }
            }
            if c.acq.is_some() {
                for at in self.moments(c).filter(|&at| at > c.clock) {
                    moves.push(Move::Elapse(i, at));
                }
            }
            let reconnecting =
                |wait: Option<&Wait>| matches!(wait, Some(Wait::Connect | Wait::Backoff));
            if !c.connected
                && c.alive
                && (reconnecting(acq_wait)
                    || c.rels
                        .iter()
                        .flatten()
                        .any(|(_, wait)| reconnecting(Some(wait))))
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
        if self.operator && w.faults_left > 0 && w.zk.nodes.contains_key(&Target::Mutex) {
            moves.push(Move::DeleteMutex);
        }
        if w.zk.monitor_reapable() {
            moves.push(Move::ReapMonitor);
        }
    }

    fn next_state(&self, last: &World, m: Move) -> Option<World> {
        let mut w = last.clone();
        match m {
            Move::Start(c) => self.start(&mut w, c, None),
            Move::Apply(c) => {
                self.apply(&mut w, c);
                self.receive(&mut w, c);
            }
            Move::Lose(c, k) => {
                w.faults_left -= 1;
                let before = w.zk.clone();
                for _ in 0..k {
                    self.apply(&mut w, c);
                }
                if k > 0 {
                    // Reconnected to a follower that has not applied the lost requests yet.
                    w.clients[c].lagging = Some(Box::new(before));
                }
                self.lose_connection(&mut w, c, Code::Lost("connection loss".into()));
            }
            Move::Fire(c) => {
                let session = w.clients[c].session;
                let fired = w.zk.fired.remove(&session).unwrap_or(Fired::Session);
                self.feed(&mut w, c, Who::Acq, Input::Fired(fired));
            }
            Move::Release(c) => {
                let held = w.clients[c].holding.take()?;
                self.end_hold(&mut w, c);
                if !self.hand_over(&mut w, c, &held) {
                    self.release_alone(&mut w, c, held);
                }
            }
            Move::QueueWhileHolding(c) => self.start(&mut w, c, None),
            Move::ReleaseAndAcquire(c) => {
                let held = w.clients[c].holding.take()?;
                self.end_acquisition(&mut w, c);
                self.start(&mut w, c, Some(held));
            }
            Move::Elapse(c, at) => {
                w.clients[c].clock = at;
                self.woke(&mut w, c);
            }
            Move::Reconnect(c) => {
                w.clients[c].connected = true;
                let slots = w.clients[c].rels.len();
                for who in std::iter::once(Who::Acq).chain((0..slots).map(Who::Rel)) {
                    let input = match self.wait_of(&w, c, who) {
                        Some(Wait::Connect) => Input::Connected,
                        Some(Wait::Backoff) => Input::Woke,
                        _ => continue,
                    };
                    self.feed(&mut w, c, who, input);
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
                    self.end_acquisition(&mut w, c);
                }
                w.clients[c].carrier = None;
                match self.wait_of(&w, c, Who::Acq) {
                    Some(Wait::Watch) => self.feed(&mut w, c, Who::Acq, Input::Ended),
                    // Backing off: the pause ends as in production, and what it sends next
                    // fails with the session (a giving-up acquisition's deletes included).
                    Some(Wait::Backoff) => self.feed(&mut w, c, Who::Acq, Input::Woke),
                    // Waiting to reconnect: the driver's wait ends with the session.
                    Some(Wait::Connect) => {
                        w.clients[c].acq = None;
                        self.end_acquisition(&mut w, c);
                    }
                    _ => {}
                }
                // Clean-ups under way end with the session, which removed their nodes.
                w.clients[c].rels.clear();
                if w.clients[c].acq.is_none() {
                    self.renew(&mut w, c);
                }
            }
            Move::Cancel(c) => {
                w.faults_left -= 1;
                let (acq, _) = w.clients[c].acq.take()?;
                // Its requests in flight still reach the server; their answers go nowhere.
                let client = &mut w.clients[c];
                for (who, ..) in client.outbox.iter_mut() {
                    if *who == Who::Acq {
                        *who = Who::Gone;
                    }
                }
                for (who, ..) in client.inbox.iter_mut() {
                    if *who == Who::Acq {
                        *who = Who::Gone;
                    }
                }
                self.end_acquisition(&mut w, c);
                // A lock it was to release goes as a dropped guard's.
                if let Some(carrier) = w.clients[c].carrier.take() {
                    self.release_alone(&mut w, c, carrier.held);
                }
                self.reap_leftovers(&mut w, c, &acq);
            }
            Move::DeleteMutex => {
                w.faults_left -= 1;
                let mutex = w.zk.nodes.get(&Target::Mutex)?;
                let czxid = mutex.czxid;
                w.deleted_takes.extend(mutex.attempt.clone());
                w.zk.delete_as_operator(&Target::Mutex);
                for client in &mut w.clients {
                    for held in client
                        .holding
                        .iter_mut()
                        .chain(client.carrier.iter_mut().map(|c| &mut c.held))
                    {
                        if held.zxid == czxid {
                            held.lost = true;
                        }
                    }
                }
            }
            Move::ReapMonitor => w.zk.reap_monitor(),
        }
        for c in 0..w.clients.len() {
            if !w.clients[c].alive && w.clients[c].acq.is_none() {
                self.renew(&mut w, c);
            }
        }
        Some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("at most one holder", |_, w: &World| holders(w).count() <= 1),
            Property::always("tokens increase in holding order", |_, w: &World| {
                !w.broken_order
            }),
            Property::always(
                "foreground is not overtaken by background",
                |_, w: &World| !w.broken_priority,
            ),
            Property::always(
                "no waiter is overtaken by a contender queued behind it",
                |_, w: &World| !w.broken_queue_order,
            ),
            Property::always("a live holder is never stray", |_, w: &World| {
                holders(w).all(|(c, held)| {
                    let mutex = w.zk.nodes.get(&Target::Mutex);
                    let node = w.zk.nodes.get(&Target::Node(held.node.clone()));
                    // The mutex of this very acquisition (its attempt id): a take's token is
                    // not always the mutex's czxid (the ACL fallback on 3.8.0 reads pzxid).
                    mutex.is_some_and(|m| {
                        m.owner == c.session && m.attempt.as_deref() == Some(held.attempt.as_str())
                    }) && node.is_some_and(|n| n.owner == c.session)
                })
            }),
            Property::always(
                "no waiter sleeps past a moment it must act on",
                |model: &LockModel, w: &World| !w.clients.iter().any(|c| model.overslept(c)),
            ),
            Property::always(
                "nothing is left once every client finished",
                |_, w: &World| !all_finished(w) || w.zk.children(&Target::Monitor).is_empty(),
            ),
            Property::eventually("every client finishes", |_, w: &World| all_finished(w)),
        ]
    }
}
