//! The model of document transactions: coordinators, recovery and concurrent single writers
//! deciding with zkguard's own rules (`zkguard::txn::multi::decide`, the functions the engine
//! calls) against a model of Elasticsearch documents (external versions, realtime reads,
//! `external_gte` writes, deleted documents' versions) and of the transaction log (conditional
//! writes on its sequence number), under per-document locks whose tokens grow.
//!
//! A document's content is the list of the writes it holds, oldest first (`0` the initial
//! content, `1 + t` transaction `t`, `10 + w` single writer `w`): an update appends its own, an
//! index replaces. The serial specification ([`expected`]) applies the acknowledged writes (a
//! single write once Elasticsearch took it, a transaction once committed) in the order of their
//! locks' tokens, the serial order docs/transactions.md promises; a reader's view of a document
//! resolves the mark it carries with the log, as docs/transactions.md tells readers to.

use stateright::{Model, Property};
use zkguard::txn::multi::decide::{DocStep, OnMark, Recovery, Rules, Settle};
use zkguard::txn::multi::MultiState;

/// Documents in the model.
pub const DOCS: usize = 2;

/// The writes a document holds, oldest first.
pub type Content = Vec<u8>;

/// What a transaction does to one of its documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// A partial update (its id appended); the document must exist.
    Update,
    /// A delete (a marked tombstone until the marks are cleared).
    Delete,
}

/// A single writer's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A guarded whole-document write (`/v1` PUT, the gate's index): no read, replaces.
    Index,
    /// A read-modify-write under the lock (the gate's `_update`, a `/v1` merge patch): it reads
    /// the document, has a mark found there decided first, then appends its id (404 on a
    /// missing document).
    Update,
    /// A client holding the lock (`zkguard exec`) that writes the document back as it read it,
    /// its `zkguard` object (and so a transaction's mark) copied, with its own token as the
    /// version; it writes only over a mark whose transaction the log says is decided committed.
    Copy,
}

/// A document as Elasticsearch stores it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EsDoc {
    pub content: Content,
    /// The external `_version`.
    pub version: u64,
    /// The token in zkguard's stamp.
    pub stamp_token: u64,
    /// The transaction mark in the stamp.
    pub mark: Option<u8>,
    pub tombstone: bool,
}

impl EsDoc {
    /// A document as a zkguard step writes it: the stamp's token is the version.
    fn written(content: Content, token: u64, mark: Option<u8>, tombstone: bool) -> Self {
        Self {
            content,
            version: token,
            stamp_token: token,
            mark,
            tombstone,
        }
    }
}

/// A transaction's log document.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Log {
    pub state: MultiState,
    /// Each participant's before-image (`None`: absent).
    pub before: [Option<Content>; DOCS],
    /// Changes with every write (`if_seq_no`).
    pub seq: u32,
}

/// Who acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Actor {
    Coord(usize),
    Writer(usize),
    Recovery,
}

/// A mark found under the lock, being decided (`resolve.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Settling {
    pub doc: usize,
    pub txn: u8,
    /// The document as read.
    pub read: EsDoc,
    pub pc: SettlePc,
    /// The log's sequence number as last read.
    pub seen: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SettlePc {
    ReadLog,
    /// The conditional move `pending → rolling-back`.
    Move,
    Write(OnMark),
}

/// How a settlement ended.
enum Settled {
    Running,
    /// Done; whether the document was written.
    Done(bool),
    /// A write or the log refused it: the actor stops.
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CoordPc {
    /// Taking the lock of its `k`-th participant (canonical order).
    Lock(usize),
    Read,
    /// Deciding the mark of another transaction found on its `k`-th participant.
    Resolve(usize, bool),
    /// Reading again after deciding a mark wrote a document; its marks are decided in turn.
    Reread,
    /// Checks, then logs `pending` (or `rolled-back` when an update finds no document).
    Log,
    Apply(usize),
    Commit,
    Clear(usize),
    Finish,
    /// Undoing its own transaction (`undo_own`), the program in `undo`.
    Undo,
    Release,
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Coord {
    pub pc: CoordPc,
    pub alive: bool,
    pub read: [Option<EsDoc>; DOCS],
    pub settling: Option<Settling>,
    /// The log's sequence number as this coordinator wrote it.
    pub seq: u32,
    /// Its locks' tokens.
    pub tokens: [u64; DOCS],
    /// Paused past its session: its locks went. It goes on with what needs no belief in its
    /// locks, and stops at the next check of them (before the apply `_bulk`, before the commit),
    /// but for the check it passed just before the pause (`passed`).
    pub stalled: bool,
    pub passed: bool,
    /// Undoing its own transaction after a write was refused.
    pub undo: Option<Rec>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriterPc {
    Lock,
    Read,
    Settle,
    Write,
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Writer {
    pub pc: WriterPc,
    pub read: Option<EsDoc>,
    pub settling: Option<Settling>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecPc {
    Idle,
    Lock(usize),
    ReadLog,
    MoveLog,
    ReadDocs,
    Write(usize),
    Close,
    Release,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rec {
    pub pc: RecPc,
    pub txn: u8,
    pub plan: Option<Settle>,
    pub seen: u32,
    pub read: [Option<EsDoc>; DOCS],
}

/// The whole world.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TxnWorld {
    pub docs: [Option<EsDoc>; DOCS],
    /// The version Elasticsearch remembers of a deleted document.
    pub deleted: [u64; DOCS],
    pub logs: Vec<Option<Log>>,
    pub locks: [Option<(Actor, u64)>; DOCS],
    pub next_token: u64,
    pub coords: Vec<Coord>,
    pub writers: Vec<Writer>,
    pub rec: Rec,
    pub crashes_left: u8,
    pub stalls_left: u8,
    /// The serial specification: each document as the acknowledged writes leave it.
    /// Per document, the acknowledged writes, by token.
    pub acked: [Vec<(u64, Effect)>; DOCS],
}

/// What an acknowledged write does to a document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Effect {
    /// Replaces it with this write.
    Index(u8),
    /// Appends this write (it must exist).
    Append(u8),
    Delete,
}

/// Content that no serial order gives: an update acknowledged on a document deleted before it.
const NO_SERIAL_ORDER: u8 = u8::MAX;

/// The serial specification of document `d`: its acknowledged writes applied in token order.
pub fn expected(w: &TxnWorld, d: usize) -> Option<Content> {
    let mut doc = Some(vec![0]);
    for &(_, effect) in &w.acked[d] {
        doc = match effect {
            Effect::Index(id) => Some(vec![id]),
            Effect::Append(id) => {
                let mut c = doc.unwrap_or_else(|| vec![NO_SERIAL_ORDER]);
                c.push(id);
                Some(c)
            }
            Effect::Delete => None,
        };
    }
    doc
}

fn ack(w: &mut TxnWorld, d: usize, token: u64, effect: Effect) {
    let at = w.acked[d].partition_point(|&(t, _)| t < token);
    w.acked[d].insert(at, (token, effect));
}

/// A move of the explorer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxnMove {
    Step(Actor),
    /// The actor's process dies: its locks go (its session ends).
    Crash(Actor),
    /// A recovery pass takes up transaction `t`.
    Recover(u8),
    /// A coordinator holding its locks pauses past its session: the locks go, and it goes on
    /// afterwards as if it held them (it checked them before the pause).
    Stall(usize),
}

/// A configuration to explore.
#[derive(Debug, Clone)]
pub struct TxnModel {
    /// Per transaction, its operation on each document (`None`: not a participant).
    pub txns: Vec<[Option<Op>; DOCS]>,
    /// The single writers: document and kind.
    pub writers: Vec<(usize, Kind)>,
    /// How many processes may die (coordinators, writers, recovery).
    pub crashes: u8,
    /// How many coordinators may stall past their sessions.
    pub stalls: u8,
    /// The decision rules (a flaw for the mutants).
    pub rules: Rules,
}

const UNIT: u8 = 1;
const WRITER: u8 = 10;

impl TxnModel {
    fn parts(&self, t: usize) -> Vec<usize> {
        (0..DOCS).filter(|&d| self.txns[t][d].is_some()).collect()
    }

    fn after(&self, t: usize, d: usize, before: Option<&Content>) -> Option<Content> {
        match self.txns[t][d] {
            Some(Op::Update) => before.map(|b| {
                let mut c = b.clone();
                c.push(UNIT + t as u8);
                c
            }),
            _ => None,
        }
    }
}

fn token_of(w: &TxnWorld, a: Actor, d: usize) -> u64 {
    match w.locks[d] {
        Some((holder, t)) if holder == a => t,
        _ => 0,
    }
}

fn lock(w: &mut TxnWorld, a: Actor, d: usize) -> bool {
    if w.locks[d].is_some() {
        return false;
    }
    w.next_token += 1;
    w.locks[d] = Some((a, w.next_token));
    true
}

fn release(w: &mut TxnWorld, a: Actor) {
    for l in &mut w.locks {
        if l.is_some_and(|(holder, _)| holder == a) {
            *l = None;
        }
    }
}

/// An `external_gte` write (a delete when `doc` is `None`): taken when `token` is at least the
/// stored or remembered version.
fn es_write(w: &mut TxnWorld, d: usize, doc: Option<EsDoc>, token: u64) -> bool {
    let current = w.docs[d].as_ref().map_or(w.deleted[d], |x| x.version);
    if token < current {
        return false;
    }
    if doc.is_none() {
        w.deleted[d] = token;
    }
    w.docs[d] = doc;
    true
}

fn own(rules: Rules, doc: &EsDoc) -> bool {
    rules.own_write(Some(doc.stamp_token), doc.version as i64)
}

/// The document as a reader that resolves a mark with the log sees it.
pub fn view(w: &TxnWorld, d: usize) -> Option<Content> {
    let doc = w.docs[d].as_ref()?;
    if let Some(t) = doc.mark.filter(|_| own(Rules::PRODUCT, doc)) {
        if let Some(log) = &w.logs[t as usize] {
            return match log.state {
                MultiState::Committed | MultiState::Finished => {
                    (!doc.tombstone).then(|| doc.content.clone())
                }
                _ => log.before[d].clone(),
            };
        }
    }
    (!doc.tombstone).then(|| doc.content.clone())
}

impl TxnModel {
    /// One step of deciding a found mark, for actor `a` holding the document's lock.
    fn settle(&self, w: &mut TxnWorld, token: u64, s: &mut Settling) -> Settled {
        let (d, t) = (s.doc, s.txn as usize);
        match s.pc {
            SettlePc::ReadLog => {
                let log = w.logs[t].as_ref();
                s.seen = log.map_or(0, |l| l.seq);
                match self
                    .rules
                    .on_mark(log.map(|l| l.state), own(self.rules, &s.read))
                {
                    OnMark::Leave => return Settled::Done(false),
                    OnMark::MoveThenRestore => s.pc = SettlePc::Move,
                    step => s.pc = SettlePc::Write(step),
                }
            }
            SettlePc::Move => match w.logs[t].as_mut() {
                Some(log) if log.seq == s.seen => {
                    log.state = MultiState::RollingBack;
                    log.seq += 1;
                    s.pc = SettlePc::Write(OnMark::Restore);
                }
                // Another settler moved it first: read it again, go on from its state.
                _ => s.pc = SettlePc::ReadLog,
            },
            SettlePc::Write(step) => {
                let Some(log) = w.logs[t].clone() else {
                    return Settled::Failed;
                };
                let image = match step {
                    OnMark::Finish => self.after(t, d, log.before[d].as_ref()),
                    _ => log.before[d].clone(),
                };
                let doc = image.map(|c| EsDoc::written(c, token, None, false));
                return if es_write(w, d, doc, token) {
                    Settled::Done(true)
                } else {
                    Settled::Failed
                };
            }
        }
        Settled::Running
    }

    fn coord_step(&self, w: &mut TxnWorld, t: usize) {
        let a = Actor::Coord(t);
        let parts = self.parts(t);
        let mut c = w.coords[t].clone();
        if c.stalled && matches!(c.pc, CoordPc::Apply(0) | CoordPc::Commit) {
            // The check of its locks before the apply `_bulk` and before the commit: after the
            // stall it fails (its session is gone), but for the one passed before the pause.
            if !c.passed {
                c.pc = CoordPc::Done;
                w.coords[t] = c;
                return;
            }
            c.passed = false;
        }
        match c.pc {
            CoordPc::Lock(k) => {
                if !lock(w, a, parts[k]) {
                    return;
                }
                c.tokens[parts[k]] = w.next_token;
                c.pc = if k + 1 < parts.len() {
                    CoordPc::Lock(k + 1)
                } else {
                    CoordPc::Read
                };
            }
            CoordPc::Read | CoordPc::Reread => {
                // Every read's marks are decided, the second's too: a stalled coordinator's
                // late write may have landed since the first (`resolve_marks`).
                for &d in &parts {
                    c.read[d] = w.docs[d].clone();
                }
                c.pc = CoordPc::Resolve(0, false);
            }
            CoordPc::Resolve(k, changed) => {
                if k == parts.len() {
                    c.pc = if changed {
                        CoordPc::Reread
                    } else {
                        CoordPc::Log
                    };
                } else {
                    let d = parts[k];
                    let other = c.read[d]
                        .clone()
                        .and_then(|doc| doc.mark.filter(|&m| m as usize != t).map(|m| (doc, m)));
                    match (c.settling.take(), other) {
                        (None, None) => c.pc = CoordPc::Resolve(k + 1, changed),
                        (None, Some((doc, m))) => {
                            c.settling = Some(Settling {
                                doc: d,
                                txn: m,
                                read: doc,
                                pc: SettlePc::ReadLog,
                                seen: 0,
                            });
                            // The log read is this same step's.
                            return self.coord_settle(w, t, c);
                        }
                        (Some(s), _) => {
                            c.settling = Some(s);
                            return self.coord_settle(w, t, c);
                        }
                    }
                }
            }
            CoordPc::Log => {
                let missing = parts
                    .iter()
                    .any(|&d| self.txns[t][d] == Some(Op::Update) && c.read[d].is_none());
                let before = std::array::from_fn(|d| {
                    c.read[d]
                        .as_ref()
                        .filter(|_| parts.contains(&d))
                        .map(|x| x.content.clone())
                });
                let state = if missing {
                    MultiState::RolledBack
                } else {
                    MultiState::Pending
                };
                w.logs[t] = Some(Log {
                    state,
                    before,
                    seq: 1,
                });
                c.seq = 1;
                c.pc = if missing {
                    CoordPc::Release
                } else {
                    CoordPc::Apply(0)
                };
            }
            CoordPc::Apply(k) => {
                let d = parts[k];
                let token = c.tokens[d];
                let before = w.logs[t].as_ref().and_then(|l| l.before[d].clone());
                let doc = match self.after(t, d, before.as_ref()) {
                    Some(after) => EsDoc::written(after, token, Some(t as u8), false),
                    None => EsDoc::written(Vec::new(), token, Some(t as u8), true),
                };
                c.pc = if !es_write(w, d, Some(doc), token) {
                    // Fenced: it undoes its own transaction (`undo_own`).
                    let move_log = matches!(
                        self.rules.recovery(MultiState::Pending),
                        Recovery::RollBack { move_log: true }
                    );
                    c.undo = Some(Rec {
                        pc: if move_log {
                            RecPc::MoveLog
                        } else {
                            RecPc::ReadDocs
                        },
                        txn: t as u8,
                        plan: Some(Settle::RollBack { fence_all: false }),
                        seen: c.seq,
                        read: std::array::from_fn(|_| None),
                    });
                    CoordPc::Undo
                } else if k + 1 < parts.len() {
                    CoordPc::Apply(k + 1)
                } else {
                    CoordPc::Commit
                };
            }
            CoordPc::Commit => {
                let log = w.logs[t].as_mut().expect("logged");
                if log.seq != c.seq {
                    // Fenced: the log moved; it stops.
                    c.pc = CoordPc::Release;
                } else {
                    log.state = MultiState::Committed;
                    log.seq += 1;
                    c.seq = log.seq;
                    for &d in &parts {
                        let effect = match self.txns[t][d] {
                            Some(Op::Delete) => Effect::Delete,
                            _ => Effect::Append(UNIT + t as u8),
                        };
                        ack(w, d, c.tokens[d], effect);
                    }
                    c.pc = CoordPc::Clear(0);
                }
            }
            CoordPc::Clear(k) => {
                let d = parts[k];
                let token = c.tokens[d];
                let before = w.logs[t].as_ref().and_then(|l| l.before[d].clone());
                let doc = self
                    .after(t, d, before.as_ref())
                    .map(|after| EsDoc::written(after, token, None, false));
                c.pc = if !es_write(w, d, doc, token) {
                    CoordPc::Release
                } else if k + 1 < parts.len() {
                    CoordPc::Clear(k + 1)
                } else {
                    CoordPc::Finish
                };
            }
            CoordPc::Finish => {
                let log = w.logs[t].as_mut().expect("logged");
                if log.seq == c.seq {
                    log.state = MultiState::Finished;
                    log.seq += 1;
                }
                c.pc = CoordPc::Release;
            }
            CoordPc::Undo => {
                let mut r = c.undo.take().expect("undoing");
                if r.pc == RecPc::Release {
                    c.pc = CoordPc::Release;
                } else {
                    self.program(w, &mut r, c.tokens);
                    c.undo = Some(r);
                }
            }
            CoordPc::Release => {
                release(w, a);
                c.pc = CoordPc::Done;
            }
            CoordPc::Done => {}
        }
        w.coords[t] = c;
    }

    fn coord_settle(&self, w: &mut TxnWorld, t: usize, mut c: Coord) {
        let CoordPc::Resolve(k, changed) = c.pc else {
            unreachable!()
        };
        let mut s = c.settling.take().expect("settling");
        match self.settle(w, c.tokens[s.doc], &mut s) {
            Settled::Running => c.settling = Some(s),
            Settled::Done(wrote) => c.pc = CoordPc::Resolve(k + 1, changed || wrote),
            Settled::Failed => c.pc = CoordPc::Release,
        }
        w.coords[t] = c;
    }

    fn writer_step(&self, w: &mut TxnWorld, i: usize) {
        let a = Actor::Writer(i);
        let (d, kind) = self.writers[i];
        let id = WRITER + i as u8;
        let mut wr = w.writers[i].clone();
        let token = token_of(w, a, d);
        match wr.pc {
            WriterPc::Lock => {
                if !lock(w, a, d) {
                    return;
                }
                wr.pc = if kind == Kind::Index {
                    WriterPc::Write
                } else {
                    WriterPc::Read
                };
            }
            WriterPc::Read => {
                wr.read = w.docs[d].clone();
                let mark = wr.read.as_ref().and_then(|x| x.mark.map(|m| (x, m)));
                wr.pc = match (kind, mark) {
                    (Kind::Update, Some((doc, m))) => {
                        wr.settling = Some(Settling {
                            doc: d,
                            txn: m,
                            read: doc.clone(),
                            pc: SettlePc::ReadLog,
                            seen: 0,
                        });
                        WriterPc::Settle
                    }
                    (Kind::Copy, Some((doc, m))) => {
                        let decided = w.logs[m as usize].as_ref().is_some_and(|l| {
                            matches!(l.state, MultiState::Committed | MultiState::Finished)
                        });
                        if decided && !doc.tombstone {
                            WriterPc::Write
                        } else {
                            release(w, a);
                            WriterPc::Done
                        }
                    }
                    _ => WriterPc::Write,
                };
            }
            WriterPc::Settle => {
                let mut s = wr.settling.take().expect("settling");
                match self.settle(w, token, &mut s) {
                    Settled::Running => wr.settling = Some(s),
                    Settled::Done(true) => wr.pc = WriterPc::Read,
                    Settled::Done(false) => wr.pc = WriterPc::Write,
                    Settled::Failed => {
                        release(w, a);
                        wr.pc = WriterPc::Done;
                    }
                }
            }
            WriterPc::Write => {
                let read = wr.read.as_ref().filter(|x| !x.tombstone);
                let doc = match (kind, read) {
                    (Kind::Index, _) => Some(EsDoc::written(vec![id], token, None, false)),
                    (Kind::Update, Some(r)) => {
                        let mut c = r.content.clone();
                        c.push(id);
                        Some(EsDoc::written(c, token, None, false))
                    }
                    (Kind::Copy, Some(r)) => {
                        let mut c = r.content.clone();
                        c.push(id);
                        Some(EsDoc {
                            content: c,
                            version: token,
                            ..r.clone()
                        })
                    }
                    // An update of a missing document: 404, nothing written.
                    _ => None,
                };
                if let Some(doc) = doc {
                    if es_write(w, d, Some(doc), token) {
                        let effect = match kind {
                            Kind::Index => Effect::Index(id),
                            _ => Effect::Append(id),
                        };
                        ack(w, d, token, effect);
                    }
                }
                release(w, a);
                wr.pc = WriterPc::Done;
            }
            WriterPc::Done => {}
        }
        w.writers[i] = wr;
    }

    fn rec_step(&self, w: &mut TxnWorld) {
        let a = Actor::Recovery;
        let mut r = w.rec.clone();
        let t = r.txn as usize;
        let parts = self.parts(t);
        match r.pc {
            RecPc::Idle => return,
            RecPc::Lock(k) => {
                if !lock(w, a, parts[k]) {
                    return;
                }
                r.pc = if k + 1 < parts.len() {
                    RecPc::Lock(k + 1)
                } else {
                    RecPc::ReadLog
                };
            }
            RecPc::Release => {
                release(w, a);
                r.pc = RecPc::Idle;
            }
            _ => {
                let tokens = std::array::from_fn(|d| token_of(w, a, d));
                self.program(w, &mut r, tokens);
            }
        }
        w.rec = r;
    }

    /// One step of settling transaction `r.txn` with `tokens`: recovery's, or a coordinator's
    /// undoing of its own transaction (`fence_all` off). It ends at `RecPc::Release`.
    fn program(&self, w: &mut TxnWorld, r: &mut Rec, tokens: [u64; DOCS]) {
        let t = r.txn as usize;
        let parts = self.parts(t);
        match r.pc {
            RecPc::ReadLog => {
                let log = w.logs[t].as_ref().expect("logged");
                r.seen = log.seq;
                (r.plan, r.pc) = match self.rules.recovery(log.state) {
                    Recovery::Nothing => (None, RecPc::Release),
                    Recovery::Finish => (Some(Settle::Finish), RecPc::ReadDocs),
                    Recovery::RollBack { move_log } => (
                        Some(Settle::RollBack { fence_all: true }),
                        if move_log {
                            RecPc::MoveLog
                        } else {
                            RecPc::ReadDocs
                        },
                    ),
                };
            }
            RecPc::MoveLog => {
                let log = w.logs[t].as_mut().expect("logged");
                if log.seq == r.seen {
                    log.state = MultiState::RollingBack;
                    log.seq += 1;
                    r.seen = log.seq;
                    r.pc = RecPc::ReadDocs;
                } else {
                    r.pc = RecPc::Release;
                }
            }
            RecPc::ReadDocs => {
                for &d in &parts {
                    r.read[d] = w.docs[d].clone();
                }
                r.pc = RecPc::Write(0);
            }
            RecPc::Write(k) => {
                let d = parts[k];
                let token = tokens[d];
                let doc = r.read[d].clone();
                let marked = doc
                    .as_ref()
                    .is_some_and(|x| x.mark == Some(t as u8) && own(self.rules, x));
                let plan = r.plan.expect("planned");
                let before = w.logs[t].as_ref().and_then(|l| l.before[d].clone());
                let write = match self.rules.settle_doc(plan, marked, doc.is_some()) {
                    DocStep::Leave => None,
                    DocStep::After => Some(
                        self.after(t, d, before.as_ref())
                            .map(|c| EsDoc::written(c, token, None, false)),
                    ),
                    DocStep::Before => Some(before.map(|c| EsDoc::written(c, token, None, false))),
                    DocStep::Fence => doc.map(|x| {
                        Some(EsDoc {
                            version: token,
                            stamp_token: token,
                            mark: x.mark.filter(|&m| m as usize != t),
                            ..x
                        })
                    }),
                };
                let ok = write.is_none_or(|doc| es_write(w, d, doc, token));
                r.pc = if !ok {
                    RecPc::Release
                } else if k + 1 < parts.len() {
                    RecPc::Write(k + 1)
                } else {
                    RecPc::Close
                };
            }
            RecPc::Close => {
                let log = w.logs[t].as_mut().expect("logged");
                if log.seq == r.seen {
                    log.state = match r.plan {
                        Some(Settle::Finish) => MultiState::Finished,
                        _ => MultiState::RolledBack,
                    };
                    log.seq += 1;
                }
                r.pc = RecPc::Release;
            }
            RecPc::Idle | RecPc::Lock(_) | RecPc::Release => {}
        }
    }

    fn busy(&self, w: &TxnWorld, a: Actor) -> bool {
        match a {
            Actor::Coord(t) => w.coords[t].alive && w.coords[t].pc != CoordPc::Done,
            Actor::Writer(i) => w.writers[i].pc != WriterPc::Done,
            Actor::Recovery => w.rec.pc != RecPc::Idle,
        }
    }

    fn unsettled(w: &TxnWorld, t: usize) -> bool {
        w.logs[t].as_ref().is_some_and(|l| !l.state.is_final())
    }
}

/// Whether transaction `t`'s write shows in document `d` (an update's id in its content, a
/// delete's absence).
fn shows(m: &TxnModel, w: &TxnWorld, t: usize, d: usize) -> bool {
    match m.txns[t][d] {
        Some(Op::Update) => view(w, d).is_some_and(|c| c.contains(&(UNIT + t as u8))),
        Some(Op::Delete) => view(w, d).is_none(),
        None => true,
    }
}

/// Whether an acknowledged write after transaction `t` (by token) replaced document `d`.
fn replaced(m: &TxnModel, w: &TxnWorld, t: usize, d: usize) -> bool {
    let token = w.coords[t].tokens[d];
    m.txns[t][d].is_some()
        && w.acked[d]
            .iter()
            .any(|&(at, e)| at > token && matches!(e, Effect::Index(_) | Effect::Delete))
}

impl Model for TxnModel {
    type State = TxnWorld;
    type Action = TxnMove;

    fn init_states(&self) -> Vec<TxnWorld> {
        let initial = || Some(EsDoc::written(vec![0], 1, None, false));
        vec![TxnWorld {
            docs: std::array::from_fn(|_| initial()),
            deleted: [0; DOCS],
            logs: vec![None; self.txns.len()],
            locks: [None; DOCS],
            next_token: 1,
            coords: (0..self.txns.len())
                .map(|_| Coord {
                    pc: CoordPc::Lock(0),
                    alive: true,
                    read: std::array::from_fn(|_| None),
                    settling: None,
                    seq: 0,
                    tokens: [0; DOCS],
                    stalled: false,
                    passed: false,
                    undo: None,
                })
                .collect(),
            writers: (0..self.writers.len())
                .map(|_| Writer {
                    pc: WriterPc::Lock,
                    read: None,
                    settling: None,
                })
                .collect(),
            rec: Rec {
                pc: RecPc::Idle,
                txn: 0,
                plan: None,
                seen: 0,
                read: std::array::from_fn(|_| None),
            },
            crashes_left: self.crashes,
            stalls_left: self.stalls,
            acked: std::array::from_fn(|_| Vec::new()),
        }]
    }

    fn actions(&self, w: &TxnWorld, moves: &mut Vec<TxnMove>) {
        let actors = (0..self.txns.len())
            .map(Actor::Coord)
            .chain((0..self.writers.len()).map(Actor::Writer))
            .chain(std::iter::once(Actor::Recovery));
        for a in actors {
            if !self.busy(w, a) {
                continue;
            }
            moves.push(TxnMove::Step(a));
            if w.crashes_left > 0 {
                moves.push(TxnMove::Crash(a));
            }
        }
        for (t, c) in w.coords.iter().enumerate() {
            let holding = !matches!(c.pc, CoordPc::Lock(_) | CoordPc::Release | CoordPc::Done);
            if w.stalls_left > 0 && c.alive && !c.stalled && holding {
                moves.push(TxnMove::Stall(t));
            }
        }
        if w.rec.pc == RecPc::Idle {
            for t in 0..self.txns.len() {
                if Self::unsettled(w, t) {
                    moves.push(TxnMove::Recover(t as u8));
                }
            }
        }
    }

    fn next_state(&self, last: &TxnWorld, m: TxnMove) -> Option<TxnWorld> {
        let mut w = last.clone();
        match m {
            TxnMove::Step(Actor::Coord(t)) => self.coord_step(&mut w, t),
            TxnMove::Step(Actor::Writer(i)) => self.writer_step(&mut w, i),
            TxnMove::Step(Actor::Recovery) => self.rec_step(&mut w),
            TxnMove::Crash(a) => {
                w.crashes_left -= 1;
                release(&mut w, a);
                match a {
                    Actor::Coord(t) => w.coords[t].alive = false,
                    Actor::Writer(i) => w.writers[i].pc = WriterPc::Done,
                    // A later pass starts over.
                    Actor::Recovery => w.rec.pc = RecPc::Idle,
                }
            }
            TxnMove::Stall(t) => {
                w.stalls_left -= 1;
                release(&mut w, Actor::Coord(t));
                let c = &mut w.coords[t];
                c.stalled = true;
                c.passed = matches!(c.pc, CoordPc::Apply(0) | CoordPc::Commit);
            }
            TxnMove::Recover(t) => {
                w.rec.txn = t;
                w.rec.pc = RecPc::Lock(0);
            }
        }
        (w != *last).then_some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "no acknowledged write is lost or reverted",
                |_, w: &TxnWorld| (0..DOCS).all(|d| view(w, d) == expected(w, d)),
            ),
            Property::always(
                "a settled transaction is all or nothing",
                |m: &TxnModel, w: &TxnWorld| {
                    (0..m.txns.len()).all(|t| match w.logs[t].as_ref().map(|l| l.state) {
                        Some(MultiState::Finished) => {
                            (0..DOCS).all(|d| replaced(m, w, t, d) || shows(m, w, t, d))
                        }
                        Some(MultiState::RolledBack) => (0..DOCS)
                            .all(|d| m.txns[t][d] != Some(Op::Update) || !shows(m, w, t, d)),
                        _ => true,
                    })
                },
            ),
            Property::always(
                "no document keeps the mark of a settled transaction",
                |_, w: &TxnWorld| {
                    w.docs.iter().flatten().all(|doc| {
                        doc.mark.is_none_or(|t| {
                            !own(Rules::PRODUCT, doc)
                                || !w.logs[t as usize]
                                    .as_ref()
                                    .is_some_and(|l| l.state.is_final())
                        })
                    })
                },
            ),
            Property::eventually(
                "every logged transaction settles",
                |m: &TxnModel, w: &TxnWorld| (0..m.txns.len()).all(|t| !TxnModel::unsettled(w, t)),
            ),
        ]
    }
}
