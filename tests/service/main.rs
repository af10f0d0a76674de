//! `zkguard serve` through HTTP against real servers: /v1, the journal, limits, events, the
//! status page, systemd and monitoring files, and the OpenAPI contract. One test binary: see
//! docs/testing.md.

#[path = "../support/common/certs.rs"]
mod certs;
#[path = "../support/cli.rs"]
mod cli;
#[path = "../support/common/mod.rs"]
mod common;
#[path = "../support/deploy/promtool.rs"]
mod promtool;
#[path = "../support/common/queue.rs"]
mod queue;
#[path = "../support/serve/controls.rs"]
mod serve_controls;
#[path = "../support/serve/mod.rs"]
mod serve_support;

// The tests, one module per concern.
mod deploy_monitoring;
mod openapi;
mod serve;
mod serve_connections;
mod serve_discard;
mod serve_document_locks;
mod serve_events;
mod serve_idempotency;
mod serve_input;
mod serve_journal_full;
mod serve_keys;
mod serve_op_ids;
mod serve_patch;
mod serve_queue_bounds;
mod serve_stamp;
mod serve_systemd;
mod serve_ui;

/// Waits until `attempt` yields a value, polling every 10 ms; panics after `limit`.
pub async fn eventually_value<T, F, Fut>(limit: std::time::Duration, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = std::time::Instant::now() + limit;
    loop {
        if let Some(v) = attempt().await {
            return v;
        }
        assert!(std::time::Instant::now() < end, "no value within {limit:?}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
