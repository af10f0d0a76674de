//! The fleet run's checker: pure functions over what the clients were answered, what the
//! documents hold at the end, the operations' outcomes and the partitions' owners as the
//! instances reported them. Its own tests (`checker_tests`) feed it histories it must reject.
//!
//! Rules:
//!
//! - every operation answered 202 is in its document's record of applied operations exactly
//!   once, and its outcome (read from any instance) is `applied`; an operation whose answer was
//!   lost (unknown outcome) is there at most once, and so is one refused with 503
//!   `journal_unavailable` (not acknowledged, not counted as lost, yet its record may have been
//!   appended: a produce the instance stopped waiting for while the broker was down); one
//!   refused otherwise (4xx, another 503, never sent) is not there at all, nor is any operation
//!   no client sent;
//! - in each document's record (oldest first) the operations keep their acceptance order: an
//!   operation acknowledged before another was sent comes before it, and the lines of one bulk
//!   request come in line order;
//! - each document holds the payload of the last operation of its record (so the last
//!   accepted write, as no later one may follow it), and the fencing tokens of its operations,
//!   in the order applied, never decrease: a deposed owner that applied an operation after its
//!   successor would show as a decrease, or as an operation applied twice or out of order;
//! - each partition of a killed or paused instance is taken over within the limit after the
//!   fault: an instance reports owning it under a lock newer than the faulted instance's and
//!   its committed offset moved (see [`takeovers`]; the faulted instance itself counts once it
//!   took the partition back under a lock taken after the fault, a new session);
//! - once the run drained (after the broker restarts too), each partition's committed offset is
//!   at or above its end offset, every end at or above the highest offset ever committed (the
//!   broker kept its records), and the ends together count at least one record per operation
//!   applied.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use serde_json::Value;

/// One operation a client sent, with its answer.
#[derive(Debug, Clone)]
pub struct Sent {
    /// The operation id (the `op_id` the client chose).
    pub id: String,
    /// The document it writes (`index/id`).
    pub doc: String,
    /// The document body it writes.
    pub payload: Value,
    /// The instance it was sent to.
    pub via: usize,
    /// The request it was part of (unique per run) and its line in it (0 for a single write).
    pub request: u64,
    pub line: usize,
    /// When the request left, since the run's start.
    pub sent: Duration,
    /// What the answer said.
    pub answer: Answer,
}

/// How an operation was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// 202, at this time since the run's start: it must be applied exactly once.
    Accepted(Duration),
    /// Refused (4xx, a 503 other than `journal_unavailable`) or never sent: it must not be
    /// applied.
    Refused,
    /// Refused with 503 `journal_unavailable` (the broker did not acknowledge its record in
    /// time, or was known down): not acknowledged, so not lost when missing; its record may
    /// have been appended all the same, so applied at most once.
    Unavailable,
    /// No answer came back (a killed or paused instance): applied at most once.
    Unknown,
}

impl Sent {
    fn acked(&self) -> Option<Duration> {
        match self.answer {
            Answer::Accepted(at) => Some(at),
            _ => None,
        }
    }
}

/// A document as Elasticsearch holds it at the end.
#[derive(Debug, Clone)]
pub struct FinalDoc {
    /// `index/id`.
    pub doc: String,
    /// The source without the `zkguard` object; `None` when the document does not exist.
    pub body: Option<Value>,
    /// The ids in the document's `zkguard.ops`, oldest first.
    pub applied: Vec<String>,
}

/// An operation's outcome as `GET /v1/operations/{id}` answered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// `applied`, `queued`, `parked`, `rejected`, or `unknown (404)`.
    pub status: String,
    /// The fencing token it was applied with.
    pub token: Option<u64>,
    /// The instance that answered.
    pub asked: usize,
}

/// What an instance reported of one partition at one moment (its `/metrics`).
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub at: Duration,
    pub instance: usize,
    pub partition: u32,
    /// The instance said it owns the partition.
    pub owned_here: bool,
    /// The partition's committed (applied) offset as the instance knows it.
    pub committed: i64,
    /// The owner's fencing token as the instance reports it: its own lock's when `owned_here`,
    /// else the one the partition's progress names; `None` when not reported. A lock taken
    /// later has a greater token.
    pub token: Option<u64>,
}

/// An instance taken out: SIGKILLed or SIGSTOPped at `at`.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub instance: usize,
    pub at: Duration,
    pub kind: &'static str,
}

/// How long one partition of a faulted instance took to be taken over.
#[derive(Debug, Clone, PartialEq)]
pub struct Takeover {
    pub fault: Fault,
    pub partition: u32,
    /// The instance that took it and how long after the fault; `None` when none did.
    pub by: Option<(usize, Duration)>,
}

/// A broken rule.
#[derive(Debug, Clone, PartialEq)]
pub enum Violation {
    /// A 202 operation missing from its document.
    Lost { op: String, doc: String },
    /// An operation recorded more than once in its document.
    Doubled {
        op: String,
        doc: String,
        times: usize,
    },
    /// A refused operation, or one nobody sent to this document, in the document.
    Foreign { op: String, doc: String },
    /// `later` was acknowledged before `earlier` was sent, or comes after it in one bulk
    /// request, yet was applied after it.
    OutOfOrder {
        doc: String,
        earlier: String,
        later: String,
    },
    /// The document does not hold the payload of its last applied operation.
    WrongBody {
        doc: String,
        last: Option<String>,
        found: Option<Value>,
    },
    /// Tokens decrease in the document's order of operations.
    TokenDecrease {
        doc: String,
        op: String,
        token: u64,
        after: u64,
    },
    /// A 202 operation whose outcome is not `applied`.
    NotApplied { op: String, status: String },
    /// A document got more operations than its record keeps: exactly-once cannot be judged.
    WindowExceeded { doc: String, sent: usize },
    /// A partition's committed offset below its end once the run drained: records not applied
    /// (an applier stuck, for instance after the broker came back).
    NotDrained {
        partition: u32,
        committed: i64,
        end: i64,
    },
    /// A partition's end below an offset committed earlier in the run: the broker lost records.
    EndBelowCommitted {
        partition: u32,
        end: i64,
        committed: i64,
    },
    /// The partitions' ends together count fewer records than operations were applied.
    TooFewRecords { records: i64, applied: usize },
    /// A faulted instance's partition taken over too late, or never.
    SlowTakeover {
        partition: u32,
        instance: usize,
        took: Option<Duration>,
        limit: Duration,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// The verdict and the counts behind it.
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<Violation>,
    pub accepted: usize,
    pub refused: usize,
    /// Refused with 503 `journal_unavailable`, and how many of those were applied all the same.
    pub unavailable: usize,
    pub unavailable_applied: usize,
    pub unknown: usize,
    pub unknown_applied: usize,
    pub documents: usize,
    pub takeovers: Vec<Takeover>,
}

/// Checks the documents and outcomes against what was sent. `window` is the size of the
/// documents' record of operations (`elastic.stamp.window`).
pub fn check_documents(
    sent: &[Sent],
    docs: &[FinalDoc],
    outcomes: &HashMap<String, Outcome>,
    window: usize,
) -> Report {
    let mut report = Report::default();
    for s in sent {
        match s.answer {
            Answer::Accepted(_) => report.accepted += 1,
            Answer::Refused => report.refused += 1,
            Answer::Unavailable => report.unavailable += 1,
            Answer::Unknown => report.unknown += 1,
        }
    }
    let mut by_doc: HashMap<&str, Vec<&Sent>> = HashMap::new();
    for s in sent {
        by_doc.entry(s.doc.as_str()).or_default().push(s);
    }
    let finals: HashMap<&str, &FinalDoc> = docs.iter().map(|d| (d.doc.as_str(), d)).collect();
    let empty = FinalDoc {
        doc: String::new(),
        body: None,
        applied: Vec::new(),
    };
    let mut names: Vec<&str> = by_doc.keys().copied().collect();
    names.extend(finals.keys().filter(|d| !by_doc.contains_key(*d)));
    names.sort_unstable();
    for doc in names {
        let ops = by_doc.get(doc).cloned().unwrap_or_default();
        let fin = finals.get(doc).copied().unwrap_or(&empty);
        report.documents += 1;
        let v = check_document(doc, &ops, fin, outcomes, window);
        let applied_as = |answer| {
            ops.iter()
                .filter(|s| s.answer == answer && fin.applied.contains(&s.id))
                .count()
        };
        report.unknown_applied += applied_as(Answer::Unknown);
        report.unavailable_applied += applied_as(Answer::Unavailable);
        report.violations.extend(v);
    }
    for s in sent.iter().filter(|s| s.acked().is_some()) {
        match outcomes.get(&s.id) {
            Some(o) if o.status == "applied" => {}
            other => report.violations.push(Violation::NotApplied {
                op: s.id.clone(),
                status: other.map_or_else(|| "not asked".into(), |o| o.status.clone()),
            }),
        }
    }
    report
}

/// The rules of one document.
fn check_document(
    doc: &str,
    ops: &[&Sent],
    fin: &FinalDoc,
    outcomes: &HashMap<String, Outcome>,
    window: usize,
) -> Vec<Violation> {
    let mut out = Vec::new();
    if ops.len() > window {
        out.push(Violation::WindowExceeded {
            doc: doc.into(),
            sent: ops.len(),
        });
        return out;
    }
    let mine: HashMap<&str, &Sent> = ops.iter().map(|s| (s.id.as_str(), *s)).collect();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for id in &fin.applied {
        *counts.entry(id.as_str()).or_default() += 1;
    }
    for (id, &n) in &counts {
        match mine.get(id) {
            Some(s) if s.answer != Answer::Refused => {}
            _ => out.push(Violation::Foreign {
                op: (*id).into(),
                doc: doc.into(),
            }),
        }
        if n > 1 {
            out.push(Violation::Doubled {
                op: (*id).into(),
                doc: doc.into(),
                times: n,
            });
        }
    }
    for s in ops.iter().filter(|s| s.acked().is_some()) {
        if !counts.contains_key(s.id.as_str()) {
            out.push(Violation::Lost {
                op: s.id.clone(),
                doc: doc.into(),
            });
        }
    }
    let applied: Vec<&Sent> = fin
        .applied
        .iter()
        .filter_map(|id| mine.get(id.as_str()).copied())
        .collect();
    out.extend(order_violations(doc, &applied));
    out.extend(token_violations(doc, &applied, outcomes));
    let last = fin.applied.last();
    let expected = last
        .and_then(|id| mine.get(id.as_str()))
        .map(|s| &s.payload);
    if expected != fin.body.as_ref() {
        out.push(Violation::WrongBody {
            doc: doc.into(),
            last: last.cloned(),
            found: fin.body.clone(),
        });
    }
    out
}

/// Acceptance order in the order applied: no operation acknowledged before an earlier-applied
/// one was sent, and one bulk request's lines in line order.
fn order_violations(doc: &str, applied: &[&Sent]) -> Vec<Violation> {
    let mut out = Vec::new();
    // The operation sent last among those applied so far.
    let mut latest: Option<&Sent> = None;
    let mut lines: HashMap<u64, &Sent> = HashMap::new();
    for s in applied {
        if let (Some(prev), Some(acked)) = (latest, s.acked()) {
            if prev.sent > acked {
                out.push(Violation::OutOfOrder {
                    doc: doc.into(),
                    earlier: s.id.clone(),
                    later: prev.id.clone(),
                });
            }
        }
        if let Some(prev) = lines.get(&s.request) {
            if prev.line > s.line {
                out.push(Violation::OutOfOrder {
                    doc: doc.into(),
                    earlier: s.id.clone(),
                    later: prev.id.clone(),
                });
            }
        }
        lines.insert(s.request, s);
        if latest.is_none_or(|p| s.sent > p.sent) {
            latest = Some(s);
        }
    }
    out
}

/// The tokens of the applied operations (from their outcomes) never decrease.
fn token_violations(
    doc: &str,
    applied: &[&Sent],
    outcomes: &HashMap<String, Outcome>,
) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut highest = 0;
    for s in applied {
        let Some(token) = outcomes.get(&s.id).and_then(|o| o.token) else {
            continue;
        };
        if token < highest {
            out.push(Violation::TokenDecrease {
                doc: doc.into(),
                op: s.id.clone(),
                token,
                after: highest,
            });
        }
        highest = highest.max(token);
    }
    out
}

/// For each fault, each partition the instance owned when it was taken out, and the first
/// moment after the fault that an instance reported owning it under a lock other than the one
/// the faulted instance held, with a committed offset beyond the highest seen before the fault
/// (something applied under that lock). Tokens tell the locks apart (a lock taken later has a
/// greater token):
///
/// - the faulted instance itself (woken from a pause, or started again after a kill) counts
///   once its token is greater than every token seen for the partition at or before the fault:
///   a lock taken after the fault, a new session. Its old lock does not count, nor does an
///   unknown token: a paused instance that wakes reports its old lock, and may even commit
///   under it, until it sees its session expired;
/// - another instance counts when its token is greater than the faulted instance's (its lock
///   came after it), or when either token is unknown. Not "greater than every token seen
///   before the fault": when the faulted instance had already given the partition up (its
///   status a second old), its successor's lock may predate the fault, and the partition is
///   applied all the same; an older token is a deposed owner that has not noticed yet.
pub fn takeovers(seen: &[Seen], faults: &[Fault]) -> Vec<Takeover> {
    let mut out = Vec::new();
    for fault in faults {
        let before = before_fault(seen, fault);
        for (partition, floor) in before {
            let counts = |s: &Seen| {
                let newer =
                    |than: Option<u64>| matches!((s.token, than), (Some(t), Some(b)) if t > b);
                if s.instance == fault.instance {
                    newer(floor.highest)
                } else {
                    floor.held.is_none() || s.token.is_none() || newer(floor.held)
                }
            };
            let by = seen
                .iter()
                .filter(|s| {
                    s.at > fault.at
                        && s.partition == partition
                        && s.owned_here
                        && s.committed > floor.committed
                        && counts(s)
                })
                .min_by_key(|s| s.at)
                .map(|s| (s.instance, s.at - fault.at));
            out.push(Takeover {
                fault: fault.clone(),
                partition,
                by,
            });
        }
    }
    out
}

/// What was seen of a partition up to a fault.
#[derive(Debug, Default)]
struct Floor {
    /// The highest committed offset any instance reported.
    committed: i64,
    /// The highest token any instance reported.
    highest: Option<u64>,
    /// The token of the faulted instance's lock, from its last report.
    held: Option<u64>,
}

/// The partitions the faulted instance owned by its last report at or before the fault, in
/// order, each with what was seen of it up to then.
fn before_fault(seen: &[Seen], fault: &Fault) -> Vec<(u32, Floor)> {
    let mut floors: HashMap<u32, Floor> = HashMap::new();
    let mut last: HashMap<u32, &Seen> = HashMap::new();
    for s in seen.iter().filter(|s| s.at <= fault.at) {
        let f = floors.entry(s.partition).or_insert_with(|| Floor {
            committed: s.committed,
            ..Floor::default()
        });
        f.committed = f.committed.max(s.committed);
        f.highest = f.highest.max(s.token);
        if s.instance == fault.instance && last.get(&s.partition).is_none_or(|l| s.at >= l.at) {
            last.insert(s.partition, s);
        }
    }
    let mut owned: Vec<(u32, Floor)> = last
        .into_iter()
        .filter(|(_, s)| s.owned_here)
        .map(|(p, s)| {
            let mut floor = floors.remove(&p).unwrap_or_default();
            floor.held = s.token;
            (p, floor)
        })
        .collect();
    owned.sort_unstable_by_key(|(p, _)| *p);
    owned
}

/// The takeovers slower than `limit`, or that never happened.
pub fn slow_takeovers(takeovers: &[Takeover], limit: Duration) -> Vec<Violation> {
    takeovers
        .iter()
        .filter(|t| t.by.is_none_or(|(_, took)| took > limit))
        .map(|t| Violation::SlowTakeover {
            partition: t.partition,
            instance: t.fault.instance,
            took: t.by.map(|(_, d)| d),
            limit,
        })
        .collect()
}

/// One partition of the journal as `zkguard journal --json` lists it once the run drained.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionEnd {
    pub partition: u32,
    pub committed: i64,
    pub end: i64,
}

/// The journal once the run drained: every partition applied to its end (`committed >= end`),
/// no end below the highest offset committed during the run (`seen`: the broker kept every
/// record it acknowledged, across its restarts), and at least one record per operation applied
/// (`applied`: those answered 202 and those of the others found in the documents).
pub fn journal_violations(parts: &[PartitionEnd], seen: &[Seen], applied: usize) -> Vec<Violation> {
    let mut out = Vec::new();
    for p in parts {
        if p.committed < p.end {
            out.push(Violation::NotDrained {
                partition: p.partition,
                committed: p.committed,
                end: p.end,
            });
        }
        let highest = seen
            .iter()
            .filter(|s| s.partition == p.partition)
            .map(|s| s.committed)
            .max()
            .unwrap_or(0);
        if p.end < highest {
            out.push(Violation::EndBelowCommitted {
                partition: p.partition,
                end: p.end,
                committed: highest,
            });
        }
    }
    let records: i64 = parts.iter().map(|p| p.end).sum();
    if records < applied as i64 {
        out.push(Violation::TooFewRecords { records, applied });
    }
    out
}
