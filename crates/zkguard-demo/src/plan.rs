//! What a run is given: the plan (sizes, durations, faults to stage), the environment (servers,
//! stores, sink) and the live progress counters; and the setup errors that stop it.

use std::fmt;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use zkguard::config::Settings;
use zkguard::es::{DocStore, EsError};
use zkguard::lock::LockService;
use zkguard::write::deadletter::DeadLetterSink;
use zkguard::write::guarded::GuardedError;

/// Errors that stop the demo before it can report (a setup step failed).
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// Elasticsearch failed while preparing or checking the articles.
    #[error("demo: Elasticsearch failed while {context}: {source}")]
    Store {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: EsError,
    },
    /// Seeding an article failed.
    #[error("demo: cannot seed {id}: {source}{hint}")]
    Seed {
        /// The article.
        id: String,
        /// The error.
        #[source]
        source: GuardedError,
        /// What to do.
        hint: &'static str,
    },
    /// A demo task panicked or was cancelled.
    #[error("demo: a worker task failed: {0}")]
    Task(String),
}

/// The shape of a demo run.
#[derive(Debug, Clone)]
#[must_use]
pub struct DemoPlan {
    /// Index of the articles.
    pub index: String,
    /// Number of articles (at least 3).
    pub articles: usize,
    /// Foreground writers.
    pub writers: usize,
    /// Saves per foreground writer.
    pub saves_per_writer: usize,
    /// Background jobs.
    pub jobs: usize,
    /// Articles per background job.
    pub articles_per_job: usize,
    /// How many articles are "hot": most saves and every background job touch them, so
    /// foreground and background contenders meet in their lock queues.
    pub hot_articles: usize,
    /// How many background operations run at once.
    pub background_concurrency: usize,
    /// The background lock wait (shorter than the configured one, so that the slow editor's
    /// article produces dead letters quickly).
    pub background_lock_timeout: Duration,
    /// Largest pause of a foreground writer between two saves (a person typing).
    pub think_time: Duration,
    /// Whether the slow editor runs.
    pub slow_editor: bool,
    /// Whether the stalled writer runs (ZooKeeper backend only).
    pub stalled_writer: bool,
    /// Whether the run's parked operations are replayed at the end.
    pub replay: bool,
    /// Random seed (article choice and pauses).
    pub seed: u64,
}

impl Default for DemoPlan {
    fn default() -> Self {
        Self {
            index: "zkguard-demo-articles".into(),
            articles: 12,
            writers: 4,
            saves_per_writer: 15,
            jobs: 6,
            articles_per_job: 8,
            hot_articles: 3,
            background_concurrency: 8,
            background_lock_timeout: Duration::from_millis(300),
            think_time: Duration::from_millis(20),
            slow_editor: true,
            stalled_writer: true,
            replay: true,
            seed: rand::random(),
        }
    }
}

impl DemoPlan {
    /// A smaller run (for tests and slow machines).
    pub fn small() -> Self {
        Self {
            articles: 6,
            writers: 3,
            saves_per_writer: 6,
            jobs: 3,
            articles_per_job: 4,
            ..Self::default()
        }
    }

    /// The article ids (`article-1` ...).
    pub fn article_ids(&self) -> Vec<String> {
        (1..=self.articles.max(3))
            .map(|n| format!("article-{n}"))
            .collect()
    }

    /// The monitor object (lock name) of an article.
    pub fn monitor(&self, article: &str) -> String {
        format!("zkguard-demo:{article}")
    }

    /// Operations the workload starts (without the seeding).
    pub fn planned_operations(&self) -> usize {
        self.writers * self.saves_per_writer
            + self.jobs * self.articles_per_job.min(self.articles.max(3))
            + usize::from(self.slow_editor)
            + 2 * usize::from(self.stalled_writer)
    }
}

/// What the demo needs: a store, a lock service, a dead-letter sink and the settings (retry
/// count and backoff; the ZooKeeper servers for the stalled writer).
#[derive(Clone)]
pub struct DemoEnv {
    /// The document store.
    pub store: Arc<dyn DocStore>,
    /// The lock service of `lock.backend`.
    pub locks: Arc<dyn LockService>,
    /// The dead-letter sink.
    pub sink: Arc<dyn DeadLetterSink>,
    /// The settings.
    pub settings: Settings,
}

impl fmt::Debug for DemoEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DemoEnv")
            .field("locks", &self.locks.backend_name())
            .field("sink", &self.sink.describe())
            .finish_non_exhaustive()
    }
}

/// Live counters of a run, for progress displays (all monotonic).
#[derive(Debug, Default)]
pub struct DemoProgress {
    /// Foreground operations planned.
    pub foreground_planned: AtomicUsize,
    /// Foreground operations finished (any outcome).
    pub foreground_done: AtomicUsize,
    /// Background operations planned.
    pub background_planned: AtomicUsize,
    /// Background operations finished (any outcome).
    pub background_done: AtomicUsize,
    /// Operations parked so far.
    pub parked: AtomicUsize,
    /// Operations lost so far (neither applied nor parked).
    pub lost: AtomicUsize,
    /// Writes rejected by fencing so far.
    pub fenced: AtomicUsize,
    phase: Mutex<String>,
}

impl DemoProgress {
    /// What the demo is doing now.
    pub fn phase(&self) -> String {
        self.phase.lock().expect("phase lock").clone()
    }

    pub(super) fn set_phase(&self, phase: impl Into<String>) {
        *self.phase.lock().expect("phase lock") = phase.into();
    }
}
