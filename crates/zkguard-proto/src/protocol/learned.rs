//! What the acquisitions of one session learned about it, which the next ones decide with:
//! whether its ACL lets it recreate and write monitor nodes (a refusal, once met, holds for
//! the session's lifetime) and which monitors met contention lately (their acquisitions skip
//! the fast path, whose multi would only fail). The driver keeps one per session and hands it
//! to each acquisition it starts (`Acquisition::new`), which teaches it what each step learnt
//! (`Acquisition::teach`); the model check keeps one per session as well.

use std::collections::BTreeMap;

/// How many contended monitors one session remembers (see [`SessionKnowledge::contended`]).
const CONTENTION_CAPACITY: usize = 4096;
/// The highest contention score of a monitor.
const CONTENTION_MAX: u8 = 3;
/// The contention score from which a monitor's acquisitions skip the fast path.
const CONTENTION_SKIP_FAST_PATH: u8 = 2;

/// What one session's acquisitions learned about it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKnowledge {
    /// The session may delete and recreate monitor nodes (the fast path's multi).
    recreate: bool,
    /// The session may write monitor nodes (takes set the monitor's data; releases check it).
    versioned: bool,
    /// Per monitor (a key the driver chooses: the mutex's path), how contended this session's
    /// recent acquisitions were. Only monitors that met contention are kept.
    contention: BTreeMap<String, u8>,
}

/// What an acquisition's step taught its session that it did not know: the driver says so in
/// its log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lessons {
    /// `zookeeper.acl` does not let this session recreate and write monitor nodes: the fast
    /// path reads the queue from now on.
    pub no_recreate: bool,
    /// `zookeeper.acl` does not let this session write monitor nodes: takes no longer set the
    /// monitor's data, releases go without the check of its version.
    pub no_versioned_takes: bool,
}

impl Default for SessionKnowledge {
    fn default() -> Self {
        Self::new()
    }
}

impl SessionKnowledge {
    /// A new session's: it may do everything until refused, and no monitor met contention.
    pub fn new() -> Self {
        Self {
            recreate: true,
            versioned: true,
            contention: BTreeMap::new(),
        }
    }

    /// A session that learned already that its ACL lets it neither recreate nor write monitor
    /// nodes.
    pub fn without_monitor_writes() -> Self {
        Self {
            recreate: false,
            versioned: false,
            ..Self::new()
        }
    }

    /// Whether the session may (still) recreate monitor nodes.
    pub fn recreate(&self) -> bool {
        self.recreate
    }

    /// Whether the session may (still) write monitor nodes.
    pub fn versioned(&self) -> bool {
        self.versioned
    }

    /// Whether this session's recent acquisitions of `monitor` met other contenders: then the
    /// next one queues without trying the fast path, whose multi would only fail (a wasted
    /// write: ZooKeeper logs a failed transaction too). A saturating score: each acquisition
    /// that met others raises it (up to `CONTENTION_MAX`), each that did not lowers it; the
    /// fast path is skipped from `CONTENTION_SKIP_FAST_PATH` on. One contended acquisition
    /// among quiet ones keeps the fast path, which costs less than queueing unless the monitor
    /// is usually busy.
    pub fn contended(&self, monitor: &str) -> bool {
        self.contention
            .get(monitor)
            .is_some_and(|&score| score >= CONTENTION_SKIP_FAST_PATH)
    }

    /// Takes in what an acquisition of `monitor` learned by its last step: whether the
    /// session may still recreate and write monitor nodes (a refusal counts at once), and,
    /// when that step acquired, whether it met others (`acquired_with_others`).
    pub(super) fn learn(
        &mut self,
        monitor: &str,
        recreate: bool,
        versioned: bool,
        acquired_with_others: Option<bool>,
    ) -> Lessons {
        let lessons = Lessons {
            no_recreate: self.recreate && !recreate,
            no_versioned_takes: self.versioned && !versioned,
        };
        self.recreate &= recreate;
        self.versioned &= versioned;
        if let Some(others) = acquired_with_others {
            self.met_contention(monitor, others);
        }
        lessons
    }

    /// Records what an acquisition of `monitor` met (see [`SessionKnowledge::contended`]).
    fn met_contention(&mut self, monitor: &str, contended: bool) {
        let map = &mut self.contention;
        match (map.get_mut(monitor), contended) {
            (Some(score), true) => *score = (*score + 1).min(CONTENTION_MAX),
            (Some(score), false) if *score > 1 => *score -= 1,
            (Some(_), false) => {
                map.remove(monitor);
            }
            (None, true) => {
                if map.len() >= CONTENTION_CAPACITY {
                    // Forget the quieter half; only the choice of the first request depends on it.
                    map.retain(|_, score| *score >= CONTENTION_SKIP_FAST_PATH);
                    if map.len() >= CONTENTION_CAPACITY {
                        map.clear();
                    }
                }
                map.insert(monitor.to_string(), 1);
            }
            (None, false) => {}
        }
    }
}
