//! The start against Elasticsearch. The service starts whether or not the cluster answers (a
//! cluster that is down is a state to wait out, not a reason to exit: under a supervisor that
//! restarts it, exiting is a crash loop). Until the cluster has answered once, `/readyz` answers
//! 503 naming it and why, requests that need it fail as they do when it goes down later (503
//! with `Retry-After`), and what the service does against it at start waits: the gate reads the
//! cluster's product header, and only then the journal replay and the transactions' recovery
//! (which creates their log) begin.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use zkguard::Backoff;

use super::gateway::Gateway;
use super::state::AppState;

/// The first wait between two attempts to reach Elasticsearch at start.
pub const FIRST_RETRY: Duration = Duration::from_millis(250);
/// The longest wait between two attempts to reach Elasticsearch at start.
pub const MAX_RETRY: Duration = Duration::from_secs(5);

/// Tries to reach Elasticsearch (and, with the gate, to read the cluster's product header),
/// with exponential backoff from [`FIRST_RETRY`] to [`MAX_RETRY`], until it succeeds; then
/// records it ([`AppState::mark_elasticsearch_reached`]) and returns `true`. A check made
/// meanwhile by the monitor or `/readyz` that finds the cluster answering cuts the wait short.
/// `false` when `stop` turned true first.
pub async fn reach_elasticsearch(
    state: Arc<AppState>,
    gate: Option<Arc<Gateway>>,
    mut stop: watch::Receiver<bool>,
) -> bool {
    if state.start_problem().is_none() {
        return true;
    }
    let mut backoff = Backoff::new(FIRST_RETRY, MAX_RETRY);
    let mut checks = state.watch_elasticsearch();
    loop {
        checks.borrow_and_update();
        tokio::select! {
            _ = tokio::time::sleep(backoff.next_delay()) => {}
            _ = answered(&mut checks) => {}
            _ = stop.wait_for(|s| *s) => return false,
        }
        match attempt(&state, gate.as_deref()).await {
            Ok(()) => {
                tracing::info!(
                    cluster = %state.store.urls(),
                    "Elasticsearch answers: the service is ready; the journal replay and the transactions' recovery begin"
                );
                return true;
            }
            Err(problem) => tracing::warn!(
                attempt = backoff.attempts() + 1,
                next_within_ms = backoff.ceiling().as_millis() as u64,
                %problem,
                "Elasticsearch does not answer yet: the service runs but is not ready (/readyz answers 503) and tries again; the journal replay and the transactions' recovery wait for it"
            ),
        }
    }
}

/// One attempt at the start against Elasticsearch: it answers, and the gate (if any) read the
/// cluster's product header; then records it ([`AppState::mark_elasticsearch_reached`]).
///
/// # Errors
/// Why the cluster cannot be used yet, naming it.
pub async fn attempt(state: &AppState, gate: Option<&Gateway>) -> Result<(), String> {
    state.ping_es().await?;
    if let Some(g) = gate {
        g.product().await.map_err(|e| e.reason)?;
    }
    state.mark_elasticsearch_reached();
    Ok(())
}

/// Returns when a later check of Elasticsearch finds it answering (never if the state is gone).
async fn answered(checks: &mut watch::Receiver<Result<(), String>>) {
    loop {
        if checks.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        if checks.borrow_and_update().is_ok() {
            return;
        }
    }
}
