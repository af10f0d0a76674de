//! Contenders of this process, and the fenced writes every contender sends to Elasticsearch.
//!
//! A worker takes the lock of a random monitor, foreground or background, writes the monitor's
//! document one to three times with its token as external version (checking, as a guarded
//! write does, that the lock is still held before each), and releases; now and then it goes
//! straight to the next lock with `release_and_lock`. Every call, grant, end of hold, release
//! and write goes into the history.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zkguard::{LockError, LockGuard, LockType, ZkBlockingWriteLock, ZkSession};

use super::faults::Observer;
use super::history::{Class, Ev, Outcome, Recorder};

/// The Elasticsearch API of an osmem-server: one index, one document per monitor.
#[derive(Clone)]
pub struct Es {
    http: reqwest::Client,
    pub url: String,
    pub index: String,
}

impl Es {
    pub fn new(url: &str, index: &str) -> Self {
        Es {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("http client"),
            url: url.trim_end_matches('/').to_string(),
            index: index.to_string(),
        }
    }

    /// Creates the index, so that no first write pays for it.
    pub async fn create_index(&self) {
        let r = self
            .http
            .put(format!("{}/{}", self.url, self.index))
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .expect("create the index");
        assert!(r.status().is_success(), "create the index: {}", r.status());
    }

    /// A fenced write of `doc` with `token` as its external version (`external_gte`), recorded
    /// with Elasticsearch's answer.
    pub async fn write(&self, rec: &Recorder, op: u64, doc: &str, token: u64, writer: &str) {
        let w = rec.id();
        let body = serde_json::json!({"monitor": doc, "token": token, "writer": writer, "w": w});
        rec.now(Ev::WriteSent {
            w,
            op,
            doc: doc.to_string(),
            token,
        });
        let answer = self
            .http
            .put(format!(
                "{}/{}/_doc/{doc}?version={token}&version_type=external_gte",
                self.url, self.index
            ))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await;
        let outcome = match answer.map(|r| r.status().as_u16()) {
            Ok(200 | 201) => Outcome::Accepted,
            Ok(409) => Outcome::Rejected,
            _ => Outcome::Unknown,
        };
        rec.now(Ev::WriteDone { w, outcome });
    }

    /// The document's `_version`, `None` when it does not exist.
    pub async fn version(&self, doc: &str) -> Option<u64> {
        let r = self
            .http
            .get(format!("{}/{}/_doc/{doc}", self.url, self.index))
            .send()
            .await
            .expect("read a document");
        if r.status().as_u16() == 404 {
            return None;
        }
        let v: serde_json::Value =
            serde_json::from_str(&r.text().await.expect("read the answer")).expect("JSON");
        if v["found"] == false {
            return None;
        }
        Some(v["_version"].as_u64().expect("_version"))
    }
}

/// What a worker shares with the run.
#[derive(Clone)]
pub struct WorkerCtx {
    pub rec: Recorder,
    pub es: Es,
    pub monitors: Arc<Vec<String>>,
    pub stop: Arc<AtomicBool>,
    pub foreground_timeout: Duration,
    pub background_timeout: Duration,
    /// Reads the queue node of each acquisition (for the priority check).
    pub observer: Arc<Observer>,
    pub lock_root: String,
}

/// One worker on `session` (named `client` in the history); `holding` counts the session's
/// workers that hold a lock right now (the faults aim at holders).
pub async fn worker(
    ctx: WorkerCtx,
    client: String,
    session: ZkSession,
    holding: Arc<AtomicUsize>,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    // A guard kept for `release_and_lock`: its op and the guard.
    let mut kept: Option<(u64, LockGuard)> = None;
    while !ctx.stop.load(Ordering::Acquire) {
        let monitor = ctx.monitors[rng.gen_range(0..ctx.monitors.len())].clone();
        let (class, lock_type, timeout) = if rng.gen_bool(0.5) {
            (
                Class::Foreground,
                LockType::Foreground,
                ctx.foreground_timeout,
            )
        } else {
            (
                Class::Background,
                LockType::Background,
                ctx.background_timeout,
            )
        };
        let lock = ZkBlockingWriteLock::new(format!("history {client}"), &session, &monitor)
            .expect("valid monitor")
            .with_type(lock_type)
            .with_timeout(timeout);
        let op = ctx.rec.id();
        let call = super::now();
        ctx.rec.at(
            call,
            Ev::Call {
                op,
                client: client.clone(),
                monitor: monitor.clone(),
                class,
                queued_by: Some(call),
            },
        );
        let result = match kept.take() {
            Some((previous, guard)) => {
                let (release, next) = lock.release_and_lock(guard).await;
                let released = release.await;
                ctx.rec.now(Ev::Released {
                    op: previous,
                    ok: released.is_ok(),
                });
                next
            }
            None => lock.lock_with_timeout().await,
        };
        match result {
            Ok(guard) => {
                ctx.rec.now(Ev::Acquired {
                    op,
                    token: guard.fencing_token(),
                });
                holding.fetch_add(1, Ordering::AcqRel);
                let token = guard.fencing_token();
                if let Some((node, queued)) = ctx
                    .observer
                    .queue_node_token(&ctx.lock_root, &monitor, token)
                    .await
                {
                    ctx.rec.now(Ev::Queued {
                        op,
                        node,
                        token: queued,
                    });
                }
                for _ in 0..rng.gen_range(1..=3) {
                    if !guard.is_held() {
                        break;
                    }
                    ctx.es
                        .write(&ctx.rec, op, &monitor, guard.fencing_token(), &client)
                        .await;
                    tokio::time::sleep(Duration::from_millis(rng.gen_range(5..40))).await;
                }
                ctx.rec.now(Ev::HoldEnd { op });
                holding.fetch_sub(1, Ordering::AcqRel);
                if rng.gen_bool(0.25) && !ctx.stop.load(Ordering::Acquire) {
                    kept = Some((op, guard));
                } else {
                    let released = guard.unlock().await;
                    ctx.rec.now(Ev::Released {
                        op,
                        ok: released.is_ok(),
                    });
                }
            }
            Err(e) => {
                let timeout = matches!(e, LockError::Timeout { .. });
                ctx.rec.now(Ev::Failed {
                    op,
                    timeout,
                    reason: e.to_string(),
                });
                if !timeout {
                    // ZooKeeper out of reach: back off a little before the next call.
                    tokio::time::sleep(Duration::from_millis(rng.gen_range(100..300))).await;
                }
            }
        }
        // Think time.
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..30))).await;
    }
    if let Some((op, guard)) = kept {
        let released = guard.unlock().await;
        ctx.rec.now(Ev::Released {
            op,
            ok: released.is_ok(),
        });
    }
}
