//! Waiting for a condition in tests, shared by the test binaries.

use std::future::Future;
use std::time::{Duration, Instant};

/// Waits until `cond` holds, polling every 10 ms; panics with `what` after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = Instant::now() + limit;
    loop {
        if cond().await {
            return;
        }
        assert!(
            Instant::now() < end,
            "condition not reached within {limit:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
