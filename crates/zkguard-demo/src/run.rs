//! The run: seed the articles, start the foreground writers, the background jobs and the slow
//! editor, wait for them, replay what was parked and reconcile.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::sync::Notify;

use zkguard::config::{LockBackendKind, Settings};
use zkguard::lock::{LockRequest, LockType};
use zkguard::write::background::BackgroundExecutor;
use zkguard::write::deadletter::{ReplayResult, ReplaySelection};
use zkguard::write::guarded::{GuardedError, GuardedWriter};
use zkguard::write::ops::Operation;

use super::observe::ObservedLocks;
use super::plan::{DemoEnv, DemoError, DemoPlan, DemoProgress};
use super::reconcile::reconcile;
use super::report::{
    rejected, status_of, tally, ClassReport, DemoReport, OpRecord, OpStatus, Percentiles,
};
use super::stalled::stalled_writer;

/// The mappings of the articles' index.
pub fn article_mappings() -> Value {
    json!({"properties": {
        "title": {"type": "text"},
        "saves": {"type": "long"},
        "propagations": {"type": "long"},
        "last_saved_by": {"type": "keyword"}
    }})
}

pub(super) struct Shared {
    records: Mutex<Vec<OpRecord>>,
}

impl Shared {
    pub(super) fn push(&self, r: OpRecord) {
        self.records.lock().expect("records lock").push(r);
    }
}

/// Runs the demo in `env` and returns its report (check [`DemoReport::is_consistent`]).
///
/// # Errors
/// [`DemoError`] when a setup step fails (the index cannot be created, an article cannot be
/// seeded, the dead-letter sink cannot be read). Failures of single operations are part of the
/// report, not errors.
///
/// # Cancellation safety
/// Not cancel-safe: a dropped run leaves operations running in tasks and the articles in an
/// intermediate state (every written operation is still recorded in its article).
pub async fn run(
    env: &DemoEnv,
    plan: &DemoPlan,
    progress: &Arc<DemoProgress>,
) -> Result<DemoReport, DemoError> {
    let ids = plan.article_ids();
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let index = plan.index.clone();

    // Seed the articles through the plain lock service, so that only the workload is measured.
    progress.set_phase(format!("seeding {} articles", ids.len()));
    let ops_window = plan.planned_operations() + ids.len() + 16;
    seed(env, plan, &index, &ids, ops_window).await?;
    let observed = ObservedLocks::new(env.locks.clone());
    let writer = GuardedWriter::new(Arc::new(observed.clone()), env.store.clone())
        .with_ops_window(ops_window);
    let executor = BackgroundExecutor::builder(writer.clone(), env.sink.clone())
        .retry(&env.settings.retry)
        .lock_timeout(plan.background_lock_timeout)
        .concurrency(plan.background_concurrency)
        .build();
    let shared = Arc::new(Shared {
        records: Mutex::new(Vec::new()),
    });

    // The slow editor holds the first article; foreground writers leave it alone, so only the
    // background operations on it wait (and end parked).
    let slow_article = ids[0].clone();
    let stalled_article = ids[1].clone();
    let fg_articles: Vec<String> = ids[1..].to_vec();
    // The hot articles (never the slow editor's, whose lock is held for a long time).
    let hot: Vec<String> = fg_articles
        .iter()
        .take(plan.hot_articles.clamp(1, fg_articles.len()))
        .cloned()
        .collect();
    let budget = retry_budget(&env.settings, plan.background_lock_timeout);
    let slow_hold = (budget * 2 + Duration::from_millis(500)).min(Duration::from_secs(20));

    progress.set_phase("running foreground writers and background jobs".to_string());
    progress.foreground_planned.store(
        plan.writers * plan.saves_per_writer
            + usize::from(plan.slow_editor)
            + 2 * usize::from(plan.stalled_writer),
        Ordering::Relaxed,
    );
    let job_size = plan.articles_per_job.min(ids.len());
    progress
        .background_planned
        .store(plan.jobs * job_size, Ordering::Relaxed);

    let cast = Cast {
        writer: writer.clone(),
        executor: executor.clone(),
        shared: shared.clone(),
        index: index.clone(),
        plan: plan.clone(),
        progress: progress.clone(),
    };
    let mut tasks: Vec<tokio::task::JoinHandle<String>> = Vec::new();
    if plan.slow_editor {
        // Its lock is taken before the jobs start.
        let ready = Arc::new(Notify::new());
        tasks.push(cast.slow_editor(slow_article.clone(), slow_hold, ready.clone()));
        ready.notified().await;
    }
    tasks.extend(cast.writers(&mut rng, &hot, &fg_articles));
    tasks.extend(cast.jobs(&mut rng, &ids, &hot, &slow_article, job_size));
    let stalled = run_stalled_writer(env, &cast, &observed, &stalled_article, ops_window).await;

    let mut slow = if plan.slow_editor {
        String::new()
    } else {
        "not run (disabled)".to_string()
    };
    for t in tasks {
        let s = t.await.map_err(|e| DemoError::Task(e.to_string()))?;
        if !s.is_empty() {
            slow = s;
        }
    }

    // Replay this run's dead letters (the slow editor is gone, so they apply now).
    let mut records = std::mem::take(&mut *shared.records.lock().expect("records lock"));
    let dead_letters = records
        .iter()
        .filter(|r| matches!(r.status, OpStatus::Parked { .. }))
        .count();
    let replayed = if plan.replay && dead_letters > 0 {
        progress.set_phase(format!("replaying {dead_letters} dead letters"));
        replay_parked(env, &writer, &mut records).await
    } else {
        0
    };
    progress.set_phase("reconciling with Elasticsearch".to_string());
    let reconciliation =
        reconcile(env.store.as_ref(), &index, &mut records, env.sink.as_ref()).await;
    let stats = executor.stats();
    let class_report = |class: LockType| ClassReport {
        lock_wait: Percentiles::of(&observed.wait_times(class)),
        lock_hold: Percentiles::of(&observed.hold_times(class)),
        lock_timeouts: observed.timeouts(class),
        ..tally(&records, Some(class))
    };
    let fenced = records
        .iter()
        .filter(|r| matches!(&r.status, OpStatus::Rejected { kind, .. } if kind == "fenced"))
        .count();
    progress.set_phase("done".to_string());
    Ok(DemoReport {
        backend: env.locks.backend_name().to_string(),
        sink: env.sink.describe(),
        index,
        articles: ids.len(),
        elapsed_ms: started.elapsed().as_millis() as u64,
        foreground: class_report(LockType::Foreground),
        background: class_report(LockType::Background),
        overtakes: observed.overtakes(),
        retries: stats.retried,
        dead_letters,
        replayed,
        fenced,
        stalled_writer: stalled,
        slow_editor: slow,
        reconciliation,
        operations: records,
    })
}

/// Creates the articles' index and seeds the articles through the plain lock service, so that
/// only the workload is measured.
async fn seed(
    env: &DemoEnv,
    plan: &DemoPlan,
    index: &str,
    ids: &[String],
    ops_window: usize,
) -> Result<(), DemoError> {
    env.store
        .ensure_index(index, &article_mappings())
        .await
        .map_err(|source| DemoError::Store {
            context: format!("creating index {index}"),
            source,
        })?;
    let seeder =
        GuardedWriter::new(env.locks.clone(), env.store.clone()).with_ops_window(ops_window);
    for id in ids {
        let doc = json!({"title": format!("Article {id}"), "saves": 0, "propagations": 0, "last_saved_by": "seed"});
        seeder.on(plan.monitor(id)).info("Seed").index(index, id, doc).await.map_err(|source| {
            let hint = if matches!(source, GuardedError::Fenced { .. }) {
                "; the index holds versions written under another ZooKeeper (larger fencing tokens): choose another index with --index"
            } else {
                ""
            };
            DemoError::Seed { id: id.clone(), source, hint }
        })?;
    }
    Ok(())
}
/// The actors' shared means: the writer and the executor they write with, the records and the
/// progress they report to.
struct Cast {
    writer: GuardedWriter,
    executor: BackgroundExecutor,
    shared: Arc<Shared>,
    index: String,
    plan: DemoPlan,
    progress: Arc<DemoProgress>,
}

impl Cast {
    /// The slow editor: takes the lock of `article` (and says so on `ready`), holds it past
    /// the background operations' retry budget (`slow_hold`), then saves. Its task answers what
    /// it did.
    fn slow_editor(
        &self,
        article: String,
        slow_hold: Duration,
        ready: Arc<Notify>,
    ) -> tokio::task::JoinHandle<String> {
        let (writer, shared, index) =
            (self.writer.clone(), self.shared.clone(), self.index.clone());
        let monitor = self.plan.monitor(&article);
        let progress_ptr = self.progress.clone();
        tokio::spawn(async move {
            let op = Operation::increment(&monitor, &index, &article, "saves", 1)
                .with_info("Save Content (slow editor)");
            let mut record = OpRecord {
                id: op.id,
                class: LockType::Foreground,
                article: article.clone(),
                field: "saves",
                actor: "slow editor".into(),
                status: OpStatus::Applied { attempts: 1 },
                recorded: None,
            };
            let request = LockRequest::new(&monitor, "Save Content (slow editor)");
            let summary = match writer.locks().acquire(request).await {
                Ok(guard) => {
                    ready.notify_one();
                    tokio::time::sleep(slow_hold).await;
                    let result = writer.write_under(guard.as_ref(), &op).await;
                    let _ = guard.unlock().await;
                    match result {
                        Ok(_) => format!(
                            "held {article} for {} ms, then saved it",
                            slow_hold.as_millis()
                        ),
                        Err(e) => {
                            record.status = rejected(&e);
                            format!(
                                "held {article} for {} ms; its save failed: {e}",
                                slow_hold.as_millis()
                            )
                        }
                    }
                }
                Err(e) => {
                    ready.notify_one();
                    record.status = rejected(&GuardedError::Lock(e));
                    format!("could not lock {article}")
                }
            };
            shared.push(record);
            progress_ptr.foreground_done.fetch_add(1, Ordering::Relaxed);
            summary
        })
    }

    /// The foreground writers: each saves random articles (mostly hot ones), pausing for up
    /// to the think time between saves.
    fn writers(
        &self,
        rng: &mut StdRng,
        hot: &[String],
        fg_articles: &[String],
    ) -> Vec<tokio::task::JoinHandle<String>> {
        let mut tasks = Vec::new();
        for w in 0..self.plan.writers {
            let (executor, shared) = (self.executor.clone(), self.shared.clone());
            let mut rng = StdRng::seed_from_u64(rng.gen());
            let picks: Vec<String> = (0..self.plan.saves_per_writer)
                .map(|_| {
                    let from = if rng.gen_bool(0.7) { hot } else { fg_articles };
                    from.choose(&mut rng).expect("articles").clone()
                })
                .collect();
            let pauses: Vec<Duration> = (0..self.plan.saves_per_writer)
                .map(|_| self.plan.think_time.mul_f64(rng.gen_range(0.0..1.0)))
                .collect();
            let (index, plan2) = (self.index.clone(), self.plan.clone());
            let progress_ptr = self.progress.clone();
            tasks.push(tokio::spawn(async move {
                for (article, pause) in picks.into_iter().zip(pauses) {
                    tokio::time::sleep(pause).await;
                    let actor = format!("writer {}", w + 1);
                    let op =
                        Operation::increment(plan2.monitor(&article), &index, &article, "saves", 1)
                            .with_info(format!("Save Content ({actor})"));
                    let status = match executor.run_foreground(op.clone()).await {
                        Ok(_) => OpStatus::Applied { attempts: 1 },
                        Err(e) => rejected(&e),
                    };
                    shared.push(OpRecord {
                        id: op.id,
                        class: LockType::Foreground,
                        article,
                        field: "saves",
                        actor,
                        status,
                        recorded: None,
                    });
                    progress_ptr.foreground_done.fetch_add(1, Ordering::Relaxed);
                }
                String::new()
            }));
        }
        tasks
    }

    /// The background jobs: each propagates to a random set of articles (the hot ones first);
    /// the first job starts with the slow editor's article.
    fn jobs(
        &self,
        rng: &mut StdRng,
        ids: &[String],
        hot: &[String],
        slow_article: &str,
        job_size: usize,
    ) -> Vec<tokio::task::JoinHandle<String>> {
        let mut tasks = Vec::new();
        for j in 0..self.plan.jobs {
            // The hot articles, then random others, in random order.
            let mut chosen: Vec<String> = hot.iter().take(job_size).cloned().collect();
            let others: Vec<&String> = ids.iter().filter(|a| !chosen.contains(a)).collect();
            chosen.extend(
                others
                    .choose_multiple(rng, job_size - chosen.len())
                    .map(|a| (*a).clone()),
            );
            chosen.shuffle(rng);
            if j == 0 && self.plan.slow_editor && !chosen.iter().any(|a| a == slow_article) {
                chosen[0] = slow_article.to_string();
            }
            if j == 0 {
                if let Some(pos) = chosen.iter().position(|a| a == slow_article) {
                    chosen.swap(0, pos);
                }
            }
            let (executor, shared, index, plan2) = (
                self.executor.clone(),
                self.shared.clone(),
                self.index.clone(),
                self.plan.clone(),
            );
            let progress_ptr = self.progress.clone();
            tasks.push(tokio::spawn(async move {
                let actor = format!("job {}", j + 1);
                let mut handles = Vec::new();
                for article in chosen {
                    let op = Operation::increment(
                        plan2.monitor(&article),
                        &index,
                        &article,
                        "propagations",
                        1,
                    )
                    .with_info(format!("Bulk Propagation ({actor})"));
                    let id = op.id;
                    handles.push((id, article, executor.submit(op).await));
                }
                for (id, article, handle) in handles {
                    let status = match handle.await {
                        Ok(outcome) => status_of(&outcome),
                        Err(e) => OpStatus::Rejected {
                            kind: "task".into(),
                            reason: e.to_string(),
                            ambiguous: true,
                        },
                    };
                    let p = &progress_ptr;
                    match status {
                        OpStatus::Parked { .. } => p.parked.fetch_add(1, Ordering::Relaxed),
                        OpStatus::Lost { .. } => p.lost.fetch_add(1, Ordering::Relaxed),
                        _ => 0,
                    };
                    shared.push(OpRecord {
                        id,
                        class: LockType::Background,
                        article,
                        field: "propagations",
                        actor: actor.clone(),
                        status,
                        recorded: None,
                    });
                    p.background_done.fetch_add(1, Ordering::Relaxed);
                }
                String::new()
            }));
        }
        tasks
    }
}

/// The stalled writer (ZooKeeper only: it needs a session of its own to expire), run to its
/// end; what it did.
async fn run_stalled_writer(
    env: &DemoEnv,
    cast: &Cast,
    observed: &ObservedLocks,
    stalled_article: &str,
    ops_window: usize,
) -> String {
    let (plan, progress) = (&cast.plan, &cast.progress);
    if plan.stalled_writer && env.settings.backend == LockBackendKind::ZooKeeper {
        let result = stalled_writer(
            env,
            plan,
            &cast.writer,
            observed,
            stalled_article,
            ops_window,
        )
        .await;
        match result {
            Ok((records, summary)) => {
                for r in records {
                    if matches!(&r.status, OpStatus::Rejected { kind, .. } if kind == "fenced") {
                        progress.fenced.fetch_add(1, Ordering::Relaxed);
                    }
                    cast.shared.push(r);
                    progress.foreground_done.fetch_add(1, Ordering::Relaxed);
                }
                summary
            }
            Err(summary) => {
                progress.foreground_done.fetch_add(2, Ordering::Relaxed);
                summary
            }
        }
    } else if plan.stalled_writer {
        progress.foreground_done.fetch_add(2, Ordering::Relaxed);
        "not run: it needs lock.backend=zookeeper (a ZooKeeper session to expire)".to_string()
    } else {
        "not run (disabled)".to_string()
    }
}

/// Replays this run's dead letters (the slow editor is gone, so they apply now), one by one,
/// and notes in `records` what became of each; how many were replayed.
async fn replay_parked(env: &DemoEnv, writer: &GuardedWriter, records: &mut [OpRecord]) -> usize {
    let mut replayed = 0;
    let parked: Vec<uuid::Uuid> = records
        .iter()
        .filter(|r| matches!(r.status, OpStatus::Parked { .. }))
        .map(|r| r.id)
        .collect();
    for id in parked {
        // A replay of an earlier entry may have run this one already (the older entries of
        // a document go first).
        if !records
            .iter()
            .any(|r| r.id == id && matches!(r.status, OpStatus::Parked { .. }))
        {
            continue;
        }
        let entries =
            zkguard::write::deadletter::replay(writer, env.sink.as_ref(), ReplaySelection::Id(id))
                .await;
        match entries {
            Ok(entries) => {
                for entry in entries {
                    let Some(r) = records.iter_mut().find(|r| r.id == entry.id) else {
                        continue;
                    };
                    match entry.result {
                        ReplayResult::Applied
                        | ReplayResult::AlreadyApplied
                        | ReplayResult::NotRemoved { .. } => {
                            r.status = OpStatus::Replayed;
                            replayed += 1;
                        }
                        ReplayResult::Superseded { error, .. } => {
                            r.status = OpStatus::Rejected {
                                kind: "superseded".to_string(),
                                reason: format!("replay: {error}"),
                                ambiguous: false,
                            };
                        }
                        ReplayResult::StillParked { error, .. } => {
                            r.status = OpStatus::Parked {
                                reason: format!("replay failed: {error}"),
                            };
                        }
                    }
                }
            }
            // The entry could not be read back: it stays parked, as far as this run knows.
            Err(e) => {
                if let Some(r) = records.iter_mut().find(|r| r.id == id) {
                    r.status = OpStatus::Parked {
                        reason: format!("replay failed: {e}"),
                    }
                }
            }
        }
    }
    replayed
}

/// The longest a background operation can keep retrying: every attempt waits the lock timeout,
/// and the delays between attempts are at most the backoff ceilings.
pub(super) fn retry_budget(settings: &Settings, lock_timeout: Duration) -> Duration {
    let attempts = settings.retry.retry_count.max(1);
    let mut backoff =
        zkguard::Backoff::new(settings.retry.backoff_initial, settings.retry.backoff_max);
    let mut total = lock_timeout * attempts;
    for _ in 1..attempts {
        total += backoff.ceiling();
        let _ = backoff.next_delay();
    }
    total
}
