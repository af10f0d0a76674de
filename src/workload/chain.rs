//! Same-session hand-offs, the `same_session.*` figures of `zkguard bench`: waiters of one
//! session queue behind its holder, each behind the one before (as foreground requests of one
//! `zkguard serve` on one document do); the holder lets go, and each waiter, once it holds the
//! lock, lets go at once. Every hand-off goes from a holder to a waiter of its own session, in
//! the one multi of `docs/zookeeper-lock.md`, "Hand-over within a session".
//!
//! Measured from the holder's release to the last waiter's release: hand-offs per second, and
//! the server's requests per hand-off (the last waiter's release, one request per chain that
//! hands nothing over, is not counted as a hand-off's), the client's and the server's CPU.

use std::time::{Duration, Instant};

use zkguard::{LockError, LockType, ZkBlockingWriteLock, ZkSession};

use super::measure::{PhaseMeter, RequestCounter, ServerCpu};

/// Waiters per chain: a queue this long is listed by each waiter as it queues.
const CHAIN: u32 = 50;

/// What [`same_session_handoffs`] measured.
pub(super) struct ChainRun {
    /// Hand-offs per second, from the first release to the last.
    pub(super) handoffs_per_sec: f64,
    /// The server's requests per hand-off, when they could be counted.
    pub(super) requests_per_handoff: Option<f64>,
    /// Client CPU time per hand-off, in milliseconds.
    pub(super) cpu_ms_per_handoff: f64,
    /// Server CPU time per hand-off, in milliseconds (with a server pid).
    pub(super) server_cpu_ms_per_handoff: Option<f64>,
}

/// Runs chains of [`CHAIN`] waiters on `monitor` through `session` until `handoffs` hand-offs
/// happened (at least one chain).
///
/// # Errors
/// A lock operation that failed, or a waiter that did not reach its hand-over point within
/// `timeout`.
pub(super) async fn same_session_handoffs(
    session: &ZkSession,
    monitor: &str,
    handoffs: u32,
    timeout: Duration,
    counter: &RequestCounter,
    server: &ServerCpu,
) -> Result<ChainRun, LockError> {
    let lock = ZkBlockingWriteLock::new("zkguard bench", session, monitor)?
        .with_type(LockType::Foreground)
        .with_timeout(timeout);
    let chains = handoffs.div_ceil(CHAIN).max(1);
    let (mut elapsed, mut requests, mut cpu_ms, mut server_ms) =
        (Duration::ZERO, Some(0.0), 0.0, Some(0.0));
    for _ in 0..chains {
        let holder = lock.lock_with_timeout().await?;
        let mut waiters = Vec::with_capacity(CHAIN as usize);
        for queued in 1..=CHAIN as usize {
            let lock = lock.clone();
            waiters.push(tokio::spawn(async move {
                lock.lock_with_timeout().await?.unlock().await
            }));
            // Each queues behind the one before, at its hand-over point, before the next.
            let deadline = Instant::now() + timeout;
            while session.waiting_for_hand_over() < queued {
                if Instant::now() >= deadline {
                    return Err(LockError::Backend {
                        context: "queueing the same-session waiters".into(),
                        detail: format!("waiter {queued} did not wait within {timeout:?}"),
                    });
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let meter = PhaseMeter::start(counter, server).await;
        let started = Instant::now();
        holder.unlock().await?;
        for waiter in waiters {
            waiter.await.map_err(|e| LockError::Backend {
                context: "a same-session waiter".into(),
                detail: e.to_string(),
            })??;
        }
        elapsed += started.elapsed();
        // Per chain: CHAIN hand-offs and the last waiter's release.
        let cost = meter.finish(CHAIN).await;
        requests = requests
            .zip(cost.requests)
            .map(|(sum, r)| sum + r * f64::from(CHAIN) - 1.0);
        cpu_ms += cost.cpu_ms * f64::from(CHAIN);
        server_ms = server_ms
            .zip(cost.server_cpu_ms)
            .map(|(sum, c)| sum + c * f64::from(CHAIN));
    }
    let total = f64::from(chains * CHAIN);
    Ok(ChainRun {
        handoffs_per_sec: total / elapsed.as_secs_f64(),
        requests_per_handoff: requests.map(|r| r / total),
        cpu_ms_per_handoff: cpu_ms / total,
        server_cpu_ms_per_handoff: server_ms.map(|c| c / total),
    })
}
