//! What a run reports: one record per operation, its status (and how a write's outcome maps to
//! one), the per-class counts taken from the records, the reconciliation, the printed report.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Serialize;
use uuid::Uuid;

use zkguard::es::EsError;
use zkguard::lock::LockType;
use zkguard::write::background::{BackgroundError, Outcome};
use zkguard::write::guarded::GuardedError;

/// How one operation of the run ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum OpStatus {
    /// Written.
    Applied {
        /// Attempts (1 for foreground).
        attempts: u32,
    },
    /// Parked, then written by the replay at the end of the run.
    Replayed,
    /// Not written, with the reason (foreground failures, fenced writes, malformed operations).
    Rejected {
        /// Error class (`lock_timeout`, `fenced`, ...).
        kind: String,
        /// The error.
        reason: String,
        /// Whether the write may have been sent anyway (the answer was lost), so only the
        /// document can tell whether it was applied.
        ambiguous: bool,
    },
    /// In the dead-letter sink.
    Parked {
        /// Why.
        reason: String,
    },
    /// Neither applied nor parked: it failed and the dead-letter sink refused it (its dead
    /// letter went to standard error).
    Lost {
        /// Why.
        reason: String,
    },
}

/// One operation of the run.
#[derive(Debug, Clone, Serialize)]
pub struct OpRecord {
    /// The operation id (recorded in the article when applied).
    pub id: Uuid,
    /// Foreground or background.
    pub class: LockType,
    /// The article.
    pub article: String,
    /// The counter it increments (`saves` or `propagations`).
    pub field: &'static str,
    /// Who did it (`writer 2`, `job 4`, `slow editor`, ...).
    pub actor: String,
    /// The outcome.
    pub status: OpStatus,
    /// Whether its document records it, as read by the reconciliation; `None` when the
    /// document was not read. It settles an uncertain rejection.
    pub recorded: Option<bool>,
}

/// Lock timing of one class.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    /// Samples.
    pub count: usize,
    /// Median (ms).
    pub p50_ms: f64,
    /// 90th percentile (ms).
    pub p90_ms: f64,
    /// 99th percentile (ms).
    pub p99_ms: f64,
    /// Largest (ms).
    pub max_ms: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `samples`.
    pub fn of(samples: &[Duration]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        let mut s: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        s.sort_by(f64::total_cmp);
        let at = |p: f64| s[((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1];
        Self {
            count: s.len(),
            p50_ms: at(0.50),
            p90_ms: at(0.90),
            p99_ms: at(0.99),
            max_ms: s[s.len() - 1],
        }
    }
}

/// Figures of one class (foreground or background).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClassReport {
    /// Operations started.
    pub operations: usize,
    /// Applied at the first attempt or after retries.
    pub applied: usize,
    /// Parked, then applied by the replay.
    pub replayed: usize,
    /// Rejected with a reason (an uncertain failure that its document records counts as
    /// applied).
    pub rejected: usize,
    /// Of the rejected, those whose write may have been applied anyway and whose document could
    /// not be read to tell.
    pub uncertain: usize,
    /// Still parked.
    pub parked: usize,
    /// Neither applied nor parked.
    pub lost: usize,
    /// Rejections by error class.
    pub rejected_by_kind: BTreeMap<String, usize>,
    /// Lock acquisitions that timed out.
    pub lock_timeouts: usize,
    /// Time from asking for a lock to holding it.
    pub lock_wait: Percentiles,
    /// Time from holding a lock to releasing it.
    pub lock_hold: Percentiles,
}

/// The reconciliation of every operation with Elasticsearch. Its counts are those of the
/// operations' records (the same as the report's table); what it adds is the check of each
/// record against its document and the dead-letter sink.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Reconciliation {
    /// Operations checked against their document.
    pub checked: usize,
    /// Applied (at once, after retries, or by the replay).
    pub applied: usize,
    /// Rejected with a reason.
    pub rejected: usize,
    /// Parked.
    pub parked: usize,
    /// Neither applied nor parked.
    pub lost: usize,
    /// Failures whose write may have been sent, settled by reading the document.
    pub ambiguous_resolved: usize,
    /// Failures whose write may have been sent, not settled (their document was not read).
    pub uncertain: usize,
    /// Articles.
    pub articles: usize,
    /// Every difference found; empty when everything adds up.
    pub mismatches: Vec<String>,
    /// What could not be checked, and why; empty when everything was checked.
    pub unchecked: Vec<String>,
}

impl Reconciliation {
    /// Whether no difference was found (see also [`Reconciliation::is_complete`]).
    pub fn is_consistent(&self) -> bool {
        self.mismatches.is_empty()
    }

    /// Whether every operation and the dead-letter sink could be checked.
    pub fn is_complete(&self) -> bool {
        self.unchecked.is_empty()
    }
}

/// The report of a run.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    /// The lock backend.
    pub backend: String,
    /// The dead-letter sink.
    pub sink: String,
    /// The articles' index.
    pub index: String,
    /// Articles.
    pub articles: usize,
    /// Wall time of the workload and the replay.
    pub elapsed_ms: u64,
    /// Foreground figures.
    pub foreground: ClassReport,
    /// Background figures.
    pub background: ClassReport,
    /// Foreground contenders that got a lock while an earlier background contender still waited.
    pub overtakes: u64,
    /// Background retries (attempts after the first).
    pub retries: u64,
    /// Operations parked during the run (before the replay).
    pub dead_letters: usize,
    /// Parked operations applied by the replay.
    pub replayed: usize,
    /// Writes rejected by Elasticsearch through the fencing token.
    pub fenced: usize,
    /// What the stalled-writer episode showed, or why it did not run.
    pub stalled_writer: String,
    /// What the slow-editor episode did, or why it did not run.
    pub slow_editor: String,
    /// The reconciliation.
    pub reconciliation: Reconciliation,
    /// Every operation.
    pub operations: Vec<OpRecord>,
}

impl DemoReport {
    /// Whether the reconciliation found no mismatch.
    pub fn is_consistent(&self) -> bool {
        self.reconciliation.is_consistent()
    }

    /// The operations that were neither applied nor parked.
    pub fn lost(&self) -> Vec<&OpRecord> {
        self.operations
            .iter()
            .filter(|o| matches!(o.status, OpStatus::Lost { .. }))
            .collect()
    }
}

impl fmt::Display for DemoReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "zkguard demo report")?;
        writeln!(
            f,
            "  {} articles in index {}, lock backend {}, dead letters in {}, {:.1} s",
            self.articles,
            self.index,
            self.backend,
            self.sink,
            self.elapsed_ms as f64 / 1000.0
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "  operations      {:>10} {:>10}",
            "foreground", "background"
        )?;
        let row = |f: &mut fmt::Formatter<'_>, name: &str, a: usize, b: usize| {
            writeln!(f, "  {name:<15} {a:>10} {b:>10}")
        };
        let (fg, bg) = (&self.foreground, &self.background);
        row(f, "started", fg.operations, bg.operations)?;
        row(f, "applied", fg.applied, bg.applied)?;
        row(f, "replayed", fg.replayed, bg.replayed)?;
        row(f, "rejected", fg.rejected, bg.rejected)?;
        row(f, "still parked", fg.parked, bg.parked)?;
        row(f, "lost", fg.lost, bg.lost)?;
        row(f, "lock timeouts", fg.lock_timeouts, bg.lock_timeouts)?;
        for (kind, n) in fg.rejected_by_kind.iter().chain(bg.rejected_by_kind.iter()) {
            writeln!(f, "    rejected as {kind}: {n}")?;
        }
        if fg.uncertain + bg.uncertain > 0 {
            writeln!(
                f,
                "    of the rejected, {} may have been applied (their documents were not read)",
                fg.uncertain + bg.uncertain
            )?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "  lock times (ms)    count      p50      p90      p99      max"
        )?;
        for (name, p) in [
            ("foreground wait", &fg.lock_wait),
            ("foreground hold", &fg.lock_hold),
            ("background wait", &bg.lock_wait),
            ("background hold", &bg.lock_hold),
        ] {
            writeln!(
                f,
                "  {name:<16} {:>7} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
                p.count, p.p50_ms, p.p90_ms, p.p99_ms, p.max_ms
            )?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "  foreground-over-background overtakes  {}",
            self.overtakes
        )?;
        writeln!(
            f,
            "  background retries                    {}",
            self.retries
        )?;
        writeln!(
            f,
            "  dead letters (parked)                 {}",
            self.dead_letters
        )?;
        writeln!(
            f,
            "  replayed from the dead letters        {}",
            self.replayed
        )?;
        writeln!(f, "  fenced rejections                     {}", self.fenced)?;
        writeln!(f, "  slow editor:    {}", self.slow_editor)?;
        writeln!(f, "  stalled writer: {}", self.stalled_writer)?;
        writeln!(f)?;
        let r = &self.reconciliation;
        writeln!(
            f,
            "  reconciliation: {} of {} operations on {} articles checked against Elasticsearch:",
            r.checked,
            self.operations.len(),
            r.articles
        )?;
        writeln!(
            f,
            "    {} applied, {} rejected with a reason, {} parked, {} lost{}",
            r.applied,
            r.rejected,
            r.parked,
            r.lost,
            if r.ambiguous_resolved > 0 {
                format!(
                    " ({} uncertain failures resolved by reading the documents)",
                    r.ambiguous_resolved
                )
            } else {
                String::new()
            }
        )?;
        for note in &r.unchecked {
            writeln!(f, "    NOT CHECKED: {note}")?;
        }
        for op in self.lost() {
            let reason = match &op.status {
                OpStatus::Lost { reason } => reason.as_str(),
                _ => "",
            };
            writeln!(
                f,
                "    LOST: {} {} ({}, {} +1 on {}): {reason}",
                op.class, op.id, op.actor, op.field, op.article
            )?;
        }
        if !r.mismatches.is_empty() {
            writeln!(f, "    MISMATCH: {} problems", r.mismatches.len())?;
            for m in &r.mismatches {
                writeln!(f, "    - {m}")?;
            }
            return Ok(());
        }
        match (r.lost, r.is_complete()) {
            (0, true) => write!(
                f,
                "    OK: every operation is accounted for, nothing lost, nothing applied twice"
            ),
            (0, false) => write!(
                f,
                "    INCOMPLETE: no difference found in what could be checked"
            ),
            (n, _) => write!(
                f,
                "    LOST: {n} operations were neither applied nor parked (their dead letters went to standard error)"
            ),
        }
    }
}

pub(super) fn rejected(e: &GuardedError) -> OpStatus {
    // Store failures other than a refusal may hide a write that went through (a lost answer).
    let ambiguous = matches!(
        e,
        GuardedError::Store(EsError::Transport { .. } | EsError::Server { .. })
    );
    OpStatus::Rejected {
        kind: e.kind().to_string(),
        reason: e.to_string(),
        ambiguous,
    }
}

pub(super) fn status_of(result: &Result<Outcome, BackgroundError>) -> OpStatus {
    match result {
        Ok(Outcome::Applied { attempts, .. }) => OpStatus::Applied {
            attempts: *attempts,
        },
        Ok(Outcome::Parked { reason, error, .. }) => OpStatus::Parked {
            reason: format!("{reason}: {error}"),
        },
        Ok(Outcome::Rejected { reason, .. }) => OpStatus::Rejected {
            kind: "rejected".into(),
            reason: reason.clone(),
            ambiguous: false,
        },
        Err(BackgroundError::Lost {
            error,
            sink,
            tries,
            park_error,
            ..
        }) => OpStatus::Lost {
            reason: format!(
                "not applied ({error}), and the dead-letter {sink} refused it {tries} times: {park_error}"
            ),
        },
        Err(other) => OpStatus::Rejected {
            kind: "error".into(),
            reason: other.to_string(),
            ambiguous: false,
        },
    }
}

/// Counts of records (of one class, or all), the one source of every count in the report.
pub(super) fn tally<'a>(
    records: impl IntoIterator<Item = &'a OpRecord>,
    class: Option<LockType>,
) -> ClassReport {
    let mut c = ClassReport::default();
    for r in records
        .into_iter()
        .filter(|r| class.is_none_or(|k| r.class == k))
    {
        c.operations += 1;
        match &r.status {
            OpStatus::Applied { .. } => c.applied += 1,
            OpStatus::Replayed => c.replayed += 1,
            OpStatus::Parked { .. } => c.parked += 1,
            OpStatus::Lost { .. } => c.lost += 1,
            // The document settles an uncertain failure: it was applied after all.
            OpStatus::Rejected {
                ambiguous: true, ..
            } if r.recorded == Some(true) => c.applied += 1,
            OpStatus::Rejected {
                kind, ambiguous, ..
            } => {
                c.rejected += 1;
                if *ambiguous && r.recorded.is_none() {
                    c.uncertain += 1;
                }
                *c.rejected_by_kind
                    .entry(format!("{} {kind}", r.class))
                    .or_default() += 1;
            }
        }
    }
    c
}
