//! The checker: plain functions over a recorded history ([`super::history::Event`]s with
//! monotonic instants). [`check`] folds the events into operations, writes and fault windows and
//! returns every violation it finds, with the counts of what it looked at.
//!
//! # Holds
//!
//! A hold is recorded from the instant the contender knew it had the lock (at or after the
//! grant) to the instant it stopped using it (at or before its release was sent): a part of the
//! time the lock really was its own. Two recorded holds that overlap therefore held the lock at
//! the same time.
//!
//! # Fault windows
//!
//! A fault is injected at `start` and healed at `heal` (the connection cut happened, the
//! partition was healed once the server had expired the session, the process was gone, the
//! server served again). It affects one client (a session of this process, or a `zkguard exec`
//! process) or all of them (a ZooKeeper server killed, a leader killed, a follower isolated).
//! Its **window for an affected client** runs from `start` to the later of `heal` and the end
//! of every operation of that client that was under way at some instant of `[start, heal]`: a
//! hold lasts until its holder stopped (its guard reported the loss and it released, or the
//! process was gone), a wait until it was granted or failed. A session that expired is in the
//! window until its holder noticed; a paused process until it exited.
//!
//! # What is checked
//!
//! - **Exclusion**: two holds of one monitor do not overlap, unless the one with the lower
//!   token (the stale holder) was inside a window of a fault that started no later than the
//!   overlap. Then the stale holder must have been fenced: no write of it that was sent after a
//!   newer holder's write to the same document had been accepted was accepted.
//! - **Tokens**: every token is unique on its monitor (locks of several monitors taken by one
//!   multi share it), and a hold acquired before another contender even called has the lower
//!   token (tokens grow in ZooKeeper's order, across restarts and
//!   elections).
//! - **Elasticsearch**: on each document no write was accepted with a token lower than one
//!   accepted before it was sent; every 409 had a higher token stored or on its way; the
//!   document's final `_version` is the highest accepted token (or the token of a write whose
//!   answer was lost); a write of a hold that no fault touched was accepted.
//! - **Priority** (only where no fault was active on either contender): a background
//!   contender does not take the lock ahead of a foreground contender that had queued before
//!   it took the lock and was still waiting (it got the lock later: its token is higher).
//!   - In ZooKeeper's order, where the foreground contender's queue node is known (contenders
//!     of this process read it right after the grant): the background take's zxid (its token)
//!     is above the creation zxid of that node. Exact; no clock involved.
//!   - By time otherwise (`zkguard exec` processes, and grants the node of which could not be
//!     read): the foreground contender had queued at least [`PRIORITY_MARGIN`] before the
//!     background one can have taken the lock. "Can have taken it" is bounded from below by the
//!     background contender's call and by the end of every earlier hold of the monitor that was
//!     released normally (the mutex was deleted by that release, sent after the hold ended, so
//!     the next take came after). The margin covers the time from a contender's call to its
//!     queue node being in place: a round trip or two to ZooKeeper (milliseconds), with room
//!     for a loaded machine; a foreground contender whose node was not in place yet when the
//!     background one took the mutex is rightly behind it.
//! - **Nothing left**: once every client stopped, no queue node or `privateLock` of a live
//!   session of this process remains, and once every session closed (or expired) none at all.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::history::{Class, Ev, Event, FaultKind, Ns, Outcome, Target};
use super::ms;

/// How long before a background contender can have taken the lock a foreground contender must
/// have queued for the priority check to apply (see the module documentation).
pub const PRIORITY_MARGIN: Ns = ms(250);

/// "Not ended within the history."
const OPEN: Ns = Ns::MAX;

/// One call for a lock and what became of it.
#[derive(Clone, Debug)]
pub struct Op {
    pub id: u64,
    pub client: String,
    pub monitor: String,
    pub class: Class,
    pub call: Ns,
    pub queued_by: Option<Ns>,
    /// The zxid (as a token) of the creation of the queue node that got it the lock.
    pub queued_token: Option<u64>,
    /// When the grant was known, and the token.
    pub acquired: Option<(Ns, u64)>,
    /// When it failed, and whether by timing out.
    pub failed: Option<(Ns, bool)>,
    pub hold_end: Option<Ns>,
    pub released_ok: Option<bool>,
}

impl Op {
    /// The hold, `[granted, stopped]`.
    pub fn hold(&self) -> Option<(Ns, Ns)> {
        self.acquired
            .map(|(at, _)| (at, self.hold_end.unwrap_or(OPEN)))
    }

    pub fn token(&self) -> Option<u64> {
        self.acquired.map(|(_, t)| t)
    }

    /// From the call to the end of the hold, or to the failure.
    fn active(&self) -> (Ns, Ns) {
        let end = match (self.acquired, self.failed) {
            (Some(_), _) => self.hold_end.unwrap_or(OPEN),
            (None, Some((at, _))) => at,
            (None, None) => OPEN,
        };
        (self.call, end)
    }
}

/// One fenced write.
#[derive(Clone, Debug)]
pub struct Write {
    pub id: u64,
    pub op: u64,
    pub doc: String,
    pub token: u64,
    pub sent: Ns,
    pub done: Option<Ns>,
    pub outcome: Outcome,
}

/// One injected fault.
#[derive(Clone, Debug)]
pub struct Window {
    pub kind: FaultKind,
    pub target: Target,
    pub start: Ns,
    pub heal: Ns,
    pub injected: bool,
}

/// A fault's window for one client (see the module documentation).
#[derive(Clone, Copy, Debug)]
pub struct Effective {
    pub kind: FaultKind,
    pub start: Ns,
    pub end: Ns,
}

/// The history, folded.
#[derive(Default)]
pub struct Folded {
    pub ops: Vec<Op>,
    pub writes: Vec<Write>,
    pub windows: Vec<Window>,
    pub leftovers: Vec<(String, Vec<String>)>,
    pub finals: Vec<(String, Option<u64>)>,
    /// Every client's fault windows.
    effective: HashMap<String, Vec<Effective>>,
    op_index: HashMap<u64, usize>,
}

/// Folds the events into operations, writes and windows.
pub fn fold(events: &[Event]) -> Folded {
    let mut f = Folded::default();
    let mut ops: HashMap<u64, usize> = HashMap::new();
    let mut writes: HashMap<u64, usize> = HashMap::new();
    let mut windows: HashMap<u64, usize> = HashMap::new();
    let mut events: Vec<&Event> = events.iter().collect();
    // Calls first: a child's call is recorded once the child is done.
    events.sort_by_key(|e| {
        (
            !matches!(e.ev, Ev::Call { .. } | Ev::WriteSent { .. }),
            e.at,
        )
    });
    for e in events {
        match &e.ev {
            Ev::Call {
                op,
                client,
                monitor,
                class,
                queued_by,
            } => {
                ops.insert(*op, f.ops.len());
                f.ops.push(Op {
                    id: *op,
                    client: client.clone(),
                    monitor: monitor.clone(),
                    class: *class,
                    call: e.at,
                    queued_by: *queued_by,
                    queued_token: None,
                    acquired: None,
                    failed: None,
                    hold_end: None,
                    released_ok: None,
                });
            }
            Ev::Acquired { op, token } => {
                if let Some(&i) = ops.get(op) {
                    f.ops[i].acquired = Some((e.at, *token));
                }
            }
            Ev::Queued { op, token, .. } => {
                if let Some(&i) = ops.get(op) {
                    f.ops[i].queued_token = Some(*token);
                }
            }
            Ev::Failed { op, timeout, .. } => {
                if let Some(&i) = ops.get(op) {
                    f.ops[i].failed = Some((e.at, *timeout));
                }
            }
            Ev::HoldEnd { op } => {
                if let Some(&i) = ops.get(op) {
                    f.ops[i].hold_end = Some(e.at);
                }
            }
            Ev::Released { op, ok } => {
                if let Some(&i) = ops.get(op) {
                    f.ops[i].released_ok = Some(*ok);
                }
            }
            Ev::WriteSent { w, op, doc, token } => {
                writes.insert(*w, f.writes.len());
                f.writes.push(Write {
                    id: *w,
                    op: *op,
                    doc: doc.clone(),
                    token: *token,
                    sent: e.at,
                    done: None,
                    outcome: Outcome::Unknown,
                });
            }
            Ev::WriteDone { w, outcome } => {
                if let Some(&i) = writes.get(w) {
                    f.writes[i].done = Some(e.at);
                    f.writes[i].outcome = *outcome;
                }
            }
            Ev::FaultStart {
                fault,
                kind,
                target,
            } => {
                windows.insert(*fault, f.windows.len());
                f.windows.push(Window {
                    kind: *kind,
                    target: target.clone(),
                    start: e.at,
                    heal: OPEN,
                    injected: true,
                });
            }
            Ev::FaultEnd { fault, injected } => {
                if let Some(&i) = windows.get(fault) {
                    f.windows[i].heal = e.at;
                    f.windows[i].injected = *injected;
                }
            }
            Ev::Leftovers { stage, nodes } => f.leftovers.push((stage.clone(), nodes.clone())),
            Ev::FinalVersion { doc, version } => f.finals.push((doc.clone(), *version)),
        }
    }
    f.effective = effective_windows(&f.ops, &f.windows);
    f.op_index = ops;
    f
}

fn effective_windows(ops: &[Op], windows: &[Window]) -> HashMap<String, Vec<Effective>> {
    let mut by_client: HashMap<&str, Vec<&Op>> = HashMap::new();
    for op in ops {
        by_client.entry(op.client.as_str()).or_default().push(op);
    }
    let mut out: HashMap<String, Vec<Effective>> = HashMap::new();
    for w in windows {
        for (client, ops) in &by_client {
            if let Target::Client(c) = &w.target {
                if c != client {
                    continue;
                }
            }
            let mut end = w.heal;
            for op in ops {
                let (a, b) = op.active();
                if a <= w.heal && b >= w.start {
                    end = end.max(b);
                }
            }
            out.entry(client.to_string()).or_default().push(Effective {
                kind: w.kind,
                start: w.start,
                end,
            });
        }
    }
    out
}

impl Folded {
    /// The fault windows of `client` that meet `[a, b]`.
    pub fn faults_during(&self, client: &str, a: Ns, b: Ns) -> impl Iterator<Item = &Effective> {
        self.effective
            .get(client)
            .into_iter()
            .flatten()
            .filter(move |w| w.start <= b && w.end >= a)
    }

    fn faulted(&self, client: &str, a: Ns, b: Ns) -> bool {
        self.faults_during(client, a, b).next().is_some()
    }

    fn op(&self, id: u64) -> Option<&Op> {
        self.op_index.get(&id).map(|&i| &self.ops[i])
    }
}

/// What the checker looked at, and the run's counts.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    pub calls: usize,
    pub acquisitions_foreground: usize,
    pub acquisitions_background: usize,
    pub releases_ok: usize,
    pub releases_not_ok: usize,
    pub timeouts: usize,
    pub errors: usize,
    pub writes_accepted: usize,
    pub writes_rejected: usize,
    pub writes_unknown: usize,
    pub faults: BTreeMap<FaultKind, usize>,
    /// Overlapping holds, each under a fault of the stale holder.
    pub overlaps_under_faults: usize,
    /// Writes of stale holders refused by Elasticsearch after a newer holder's write.
    pub stale_writes_fenced: usize,
    /// Foreground contenders granted the lock, in a quiet window, ahead of a background one
    /// that had called before them and was still waiting.
    pub priority_kept: usize,
    /// Pairs where the background contender took the lock first but may have done so before
    /// the foreground one's node was in place (within the margin): not judged.
    pub priority_undecided: usize,
}

impl Counts {
    /// The counts as printed after a run.
    pub fn render(&self, title: &str) -> String {
        let mut s = format!("== {title}\n");
        let mut line = |k: &str, v: usize| s.push_str(&format!("  {k:<58} {v:>8}\n"));
        line("lock calls", self.calls);
        line("acquisitions, foreground", self.acquisitions_foreground);
        line("acquisitions, background", self.acquisitions_background);
        line("releases that deleted their own nodes", self.releases_ok);
        line("releases of a lock already lost", self.releases_not_ok);
        line("timeouts", self.timeouts);
        line("other lock errors (connection, session)", self.errors);
        line("writes accepted by Elasticsearch", self.writes_accepted);
        line(
            "writes rejected by Elasticsearch (409)",
            self.writes_rejected,
        );
        line("writes without an answer", self.writes_unknown);
        line(
            "overlapping holds, each under a fault",
            self.overlaps_under_faults,
        );
        line("stale holders' writes fenced", self.stale_writes_fenced);
        line(
            "foreground granted ahead of an earlier background",
            self.priority_kept,
        );
        line(
            "foreground/background pairs within the margin",
            self.priority_undecided,
        );
        let total: usize = self.faults.values().sum();
        line("faults injected", total);
        for (k, n) in &self.faults {
            line(&format!("  {}", k.name()), *n);
        }
        s
    }
}

/// The checker's verdict.
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<String>,
    /// What passed but deserves a look.
    pub notes: Vec<String>,
    pub counts: Counts,
}

/// Checks a whole history.
pub fn check(events: &[Event]) -> Report {
    let f = fold(events);
    let mut r = Report {
        counts: count(&f),
        ..Report::default()
    };
    check_exclusion(&f, &mut r);
    check_tokens(&f, &mut r);
    check_elasticsearch(&f, &mut r);
    check_priority(&f, &mut r);
    check_leftovers(&f, &mut r);
    r
}

fn count(f: &Folded) -> Counts {
    let mut c = Counts {
        calls: f.ops.len(),
        ..Counts::default()
    };
    for op in &f.ops {
        match (op.acquired, op.class) {
            (Some(_), Class::Foreground) => c.acquisitions_foreground += 1,
            (Some(_), Class::Background) => c.acquisitions_background += 1,
            _ => {}
        }
        match op.failed {
            Some((_, true)) => c.timeouts += 1,
            Some((_, false)) => c.errors += 1,
            None => {}
        }
        match op.released_ok {
            Some(true) => c.releases_ok += 1,
            Some(false) => c.releases_not_ok += 1,
            None => {}
        }
    }
    for w in &f.writes {
        match w.outcome {
            Outcome::Accepted => c.writes_accepted += 1,
            Outcome::Rejected => c.writes_rejected += 1,
            Outcome::Unknown => c.writes_unknown += 1,
        }
    }
    for w in f.windows.iter().filter(|w| w.injected) {
        *c.faults.entry(w.kind).or_default() += 1;
    }
    c
}

fn ms_of(ns: Ns) -> String {
    if ns == OPEN {
        "end".into()
    } else {
        format!("{:.1}ms", ns as f64 / 1e6)
    }
}

fn describe(op: &Op) -> String {
    format!(
        "op {} ({} {:?}, token {})",
        op.id,
        op.client,
        op.class,
        op.token().map_or("-".into(), |t| t.to_string())
    )
}

/// Holds of one monitor do not overlap outside the stale holder's fault windows; stale holders
/// under a fault were fenced.
pub fn check_exclusion(f: &Folded, r: &mut Report) {
    let mut by_monitor: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in f.ops.iter().filter(|o| o.acquired.is_some()) {
        by_monitor.entry(&op.monitor).or_default().push(op);
    }
    let mut fenced = HashSet::new();
    for (monitor, mut holds) in by_monitor {
        holds.sort_by_key(|o| o.hold().unwrap().0);
        for (i, a) in holds.iter().enumerate() {
            let (a_start, a_end) = a.hold().unwrap();
            for b in &holds[i + 1..] {
                let (b_start, b_end) = b.hold().unwrap();
                if b_start >= a_end {
                    break;
                }
                let (old, new) = if a.token() < b.token() {
                    (a, b)
                } else {
                    (b, a)
                };
                let overlap_start = a_start.max(b_start);
                let overlap_end = a_end.min(b_end);
                let covered = f
                    .faults_during(&old.client, overlap_start, overlap_start)
                    .find(|w| w.start <= overlap_start);
                let Some(fault) = covered else {
                    r.violations.push(format!(
                        "exclusion: holds of `{monitor}` overlap from {} to {} with no fault active on the stale holder: {} and {}",
                        ms_of(overlap_start),
                        ms_of(overlap_end),
                        describe(old),
                        describe(new)
                    ));
                    continue;
                };
                r.counts.overlaps_under_faults += 1;
                // Fenced: after a newer holder's write to a document was accepted, none of
                // the stale holder's writes to it was.
                for w in f.writes.iter().filter(|w| w.op == old.id) {
                    if w.outcome == Outcome::Rejected {
                        fenced.insert(w.id);
                    }
                    let newer_before = f.writes.iter().any(|n| {
                        n.doc == w.doc
                            && n.token > w.token
                            && n.outcome == Outcome::Accepted
                            && n.done.is_some_and(|d| d < w.sent)
                    });
                    if !newer_before {
                        continue;
                    }
                    match w.outcome {
                        Outcome::Accepted => r.violations.push(format!(
                            "exclusion: the stale holder {} (under the fault `{}`) had its write {} to `{}` accepted after a newer holder's write",
                            describe(old),
                            fault.kind.name(),
                            w.id,
                            w.doc
                        )),
                        Outcome::Rejected | Outcome::Unknown => {}
                    }
                }
            }
        }
    }
    r.counts.stale_writes_fenced = fenced.len();
}

/// Tokens are unique per monitor and grow in the order of acquisitions. (Locks of several
/// monitors taken by one multi, a bulk acquisition, share its zxid and so their token.)
pub fn check_tokens(f: &Folded, r: &mut Report) {
    let mut seen = HashMap::new();
    for op in &f.ops {
        if let Some(t) = op.token() {
            if let Some(other) = seen.insert((op.monitor.as_str(), t), op.id) {
                r.violations.push(format!(
                    "tokens: token {t} was issued twice on {} (ops {other} and {})",
                    op.monitor, op.id
                ));
            }
        }
    }
    let mut holds: Vec<&Op> = f.ops.iter().filter(|o| o.acquired.is_some()).collect();
    holds.sort_by_key(|o| o.hold().unwrap().0);
    let mut prefix_max: Vec<(u64, u64)> = Vec::with_capacity(holds.len());
    let mut best = (0u64, 0u64);
    for h in &holds {
        if h.token().unwrap() > best.0 {
            best = (h.token().unwrap(), h.id);
        }
        prefix_max.push(best);
    }
    for b in &holds {
        let before = holds.partition_point(|h| h.hold().unwrap().0 < b.call);
        if before == 0 {
            continue;
        }
        let (max, by) = prefix_max[before - 1];
        if max > b.token().unwrap() {
            r.violations.push(format!(
                "tokens: {} called at {} after op {by} had been granted token {max}, yet got a lower token",
                describe(b),
                ms_of(b.call)
            ));
        }
    }
}

/// Elasticsearch's answers, against the tokens.
pub fn check_elasticsearch(f: &Folded, r: &mut Report) {
    let mut by_doc: BTreeMap<&str, Vec<&Write>> = BTreeMap::new();
    for w in &f.writes {
        by_doc.entry(&w.doc).or_default().push(w);
    }
    let finals: HashMap<&str, Option<u64>> =
        f.finals.iter().map(|(d, v)| (d.as_str(), *v)).collect();
    for (doc, writes) in &by_doc {
        let mut accepted: Vec<&Write> = writes
            .iter()
            .copied()
            .filter(|w| w.outcome == Outcome::Accepted)
            .collect();
        accepted.sort_by_key(|w| w.done.unwrap_or(OPEN));
        let mut prefix_max = Vec::with_capacity(accepted.len());
        let mut best = 0u64;
        for a in &accepted {
            best = best.max(a.token);
            prefix_max.push(best);
        }
        for w in &accepted {
            let before = accepted.partition_point(|a| a.done.unwrap_or(OPEN) < w.sent);
            if before > 0 && prefix_max[before - 1] > w.token {
                r.violations.push(format!(
                    "elasticsearch: `{doc}` accepted write {} with token {} sent at {}, after token {} had been accepted",
                    w.id,
                    w.token,
                    ms_of(w.sent),
                    prefix_max[before - 1]
                ));
            }
        }
        for w in writes.iter().filter(|w| w.outcome == Outcome::Rejected) {
            let done = w.done.unwrap_or(OPEN);
            let reason = writes
                .iter()
                .any(|x| x.outcome != Outcome::Rejected && x.token > w.token && x.sent < done);
            if !reason {
                r.violations.push(format!(
                    "elasticsearch: `{doc}` rejected write {} with token {} while no higher token had been sent",
                    w.id, w.token
                ));
            }
            if let Some(op) = f.op(w.op) {
                if let Some((a, b)) = op.hold() {
                    if !f.faulted(&op.client, a, b) {
                        r.violations.push(format!(
                            "elasticsearch: write {} of {} to `{doc}` was rejected although no fault touched its hold",
                            w.id,
                            describe(op)
                        ));
                    }
                }
            }
        }
        let max_accepted = accepted.iter().map(|w| w.token).max();
        match finals.get(doc) {
            None => r
                .violations
                .push(format!("elasticsearch: `{doc}` was not read after the run")),
            Some(v) if *v == max_accepted => {}
            Some(Some(v))
                if max_accepted.is_none_or(|m| *v > m)
                    && writes
                        .iter()
                        .any(|w| w.outcome == Outcome::Unknown && w.token == *v) => {}
            Some(v) => r.violations.push(format!(
                "elasticsearch: `{doc}` ends with _version {v:?}, the highest accepted token is {max_accepted:?}"
            )),
        }
    }
}

/// Foreground before background wherever no fault was active.
pub fn check_priority(f: &Folded, r: &mut Report) {
    let mut by_monitor: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in f.ops.iter().filter(|o| o.acquired.is_some()) {
        by_monitor.entry(&op.monitor).or_default().push(op);
    }
    for (monitor, holds) in by_monitor {
        // By token: the latest end of a normally released hold with a lower token.
        let mut by_token = holds.clone();
        by_token.sort_by_key(|o| o.token());
        let mut released_before = Vec::with_capacity(by_token.len());
        let mut latest = 0;
        for h in &by_token {
            released_before.push(latest);
            if h.released_ok == Some(true) {
                latest = latest.max(h.hold_end.unwrap_or(0));
            }
        }
        let take_lower_bound = |b: &Op| {
            let i = by_token.partition_point(|h| h.token() < b.token());
            b.call.max(released_before[i])
        };
        let mut bgs: Vec<&Op> = holds
            .iter()
            .copied()
            .filter(|o| o.class == Class::Background)
            .collect();
        bgs.sort_by_key(|o| o.token());
        let fgs = holds.iter().filter(|o| o.class == Class::Foreground);
        for fg in fgs {
            let (fg_acq, fg_token) = fg.acquired.unwrap();
            let quiet = |bg: &Op, until: Ns| {
                let from = fg.call.min(bg.call);
                !f.faulted(&fg.client, from, until) && !f.faulted(&bg.client, from, until)
            };
            // The background holds granted before this foreground one, latest first.
            let before = &bgs[..bgs.partition_point(|b| b.token() < Some(fg_token))];
            for bg in before.iter().rev() {
                let bg_token = bg.token().unwrap();
                if let Some(queued) = fg.queued_token {
                    // Exact: the foreground node existed when the background one took the
                    // mutex (a later zxid), yet the background one kept it.
                    if bg_token < queued {
                        break;
                    }
                    if !quiet(bg, fg_acq) {
                        continue;
                    }
                    let message = format!(
                        "priority: on `{monitor}`, {} took the lock after the queue node of {} was created (zxid token {queued}), with no fault active",
                        describe(bg),
                        describe(fg),
                    );
                    r.violations.push(message);
                    continue;
                }
                // By time, for contenders whose queue node is not known: the background one
                // cannot have taken the lock before `lower`.
                let Some(queued) = fg.queued_by else { break };
                let (bg_acq, _) = bg.acquired.unwrap();
                if bg_acq.saturating_add(ms(60_000)) < queued {
                    break;
                }
                if bg_acq < queued.saturating_add(PRIORITY_MARGIN) || !quiet(bg, fg_acq) {
                    continue;
                }
                let lower = take_lower_bound(bg);
                if lower >= queued.saturating_add(PRIORITY_MARGIN) {
                    r.violations.push(format!(
                        "priority: on `{monitor}`, {} took the lock (not before {}) ahead of {} that had queued by {} and got it only at {}, with no fault active",
                        describe(bg),
                        ms_of(lower),
                        describe(fg),
                        ms_of(queued),
                        ms_of(fg_acq)
                    ));
                } else {
                    r.counts.priority_undecided += 1;
                }
            }
            // Overtakes: background contenders that called before this foreground one and
            // got the lock after it.
            let after = &bgs[bgs.partition_point(|b| b.token() < Some(fg_token))..];
            for bg in after
                .iter()
                .take_while(|b| b.hold().unwrap().0 <= fg_acq.saturating_add(ms(30_000)))
            {
                if bg.call <= fg.call && quiet(bg, fg_acq) {
                    r.counts.priority_kept += 1;
                }
            }
        }
    }
}

/// Nothing left in ZooKeeper.
pub fn check_leftovers(f: &Folded, r: &mut Report) {
    if f.leftovers.is_empty() {
        r.violations
            .push("leftovers: the lock root was not listed after the run".into());
    }
    for (stage, nodes) in &f.leftovers {
        if !nodes.is_empty() {
            r.violations.push(format!(
                "leftovers: {} node(s) left {stage}: {}",
                nodes.len(),
                nodes.join(", ")
            ));
        }
    }
}
