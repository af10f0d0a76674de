//! Where background work goes, per stage, for `zkguard bench --service`: lock acquisitions and
//! their waits, `_mget` and `_bulk` requests, journal `fsync`s, the time to accept a write. The
//! library's figures come from its executor's counters
//! ([`zkguard::write::background::ExecutorStats`]), the service's from its metrics.

use std::time::Duration;

use serde_json::{json, Value};

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0 * 100.0).round() / 100.0
}

/// Where background work went, per stage: from the executor's counters (library) or the
/// service's metrics over the background run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stages {
    /// Lock acquisitions of the monitors' lanes.
    pub acquisitions: u64,
    /// Their total wait.
    pub lock_wait: Duration,
    /// `_mget` requests, and their total time.
    pub reads: u64,
    /// Total time of the `_mget` requests.
    pub read_time: Duration,
    /// `_bulk` requests.
    pub writes: u64,
    /// Total time of the `_bulk` requests.
    pub write_time: Duration,
    /// Journal `fsync`s (service only), and their total time.
    pub fsyncs: u64,
    /// Total time of the `fsync`s.
    pub fsync_time: Duration,
    /// Median time to accept one background write (service only: the 202, journaled).
    pub accept_p50: Duration,
}

impl Stages {
    fn per(total: Duration, n: u64) -> f64 {
        if n == 0 {
            0.0
        } else {
            ms(total) / n as f64
        }
    }

    /// One line: per operation and per request.
    pub(super) fn line(&self, ops: usize) -> String {
        let ops = ops.max(1) as f64;
        format!(
            "{:.1} ops/lock, lock wait {:.2} ms/lock; _mget {:.3}/op at {:.2} ms; _bulk {:.3}/op at {:.2} ms; fsync {:.3}/op at {:.2} ms; accept p50 {:.2} ms",
            ops / self.acquisitions.max(1) as f64,
            Self::per(self.lock_wait, self.acquisitions),
            self.reads as f64 / ops,
            Self::per(self.read_time, self.reads),
            self.writes as f64 / ops,
            Self::per(self.write_time, self.writes),
            self.fsyncs as f64 / ops,
            Self::per(self.fsync_time, self.fsyncs),
            ms(self.accept_p50),
        )
    }

    pub(super) fn to_json(self, name: &str, ops: usize) -> Value {
        let ops = ops.max(1) as f64;
        let r = |x: f64| (x * 1000.0).round() / 1000.0;
        json!({
            format!("{name}_bg_ops_per_lock"): r(ops / self.acquisitions.max(1) as f64),
            format!("{name}_bg_lock_wait_ms_per_lock"): r(Self::per(self.lock_wait, self.acquisitions)),
            format!("{name}_bg_mget_per_op"): r(self.reads as f64 / ops),
            format!("{name}_bg_mget_ms"): r(Self::per(self.read_time, self.reads)),
            format!("{name}_bg_bulk_per_op"): r(self.writes as f64 / ops),
            format!("{name}_bg_bulk_ms"): r(Self::per(self.write_time, self.writes)),
            format!("{name}_bg_fsync_per_op"): r(self.fsyncs as f64 / ops),
            format!("{name}_bg_fsync_ms"): r(Self::per(self.fsync_time, self.fsyncs)),
            format!("{name}_bg_accept_p50_ms"): ms(self.accept_p50),
        })
    }

    /// The library's stages between two snapshots of its executor's counters.
    pub(super) fn between(
        before: &zkguard::write::background::ExecutorStats,
        after: &zkguard::write::background::ExecutorStats,
    ) -> Self {
        let us = |a: u64, b: u64| Duration::from_micros(b.saturating_sub(a));
        Self {
            acquisitions: after.lane_acquisitions - before.lane_acquisitions,
            lock_wait: us(before.lock_wait_us, after.lock_wait_us),
            reads: after.read_requests - before.read_requests,
            read_time: us(before.read_us, after.read_us),
            writes: after.write_requests - before.write_requests,
            write_time: us(before.write_us, after.write_us),
            ..Self::default()
        }
    }

    /// The service's stages between two scrapes of its metrics.
    pub(super) fn scraped(before: &str, after: &str) -> Self {
        let value = |text: &str, series: &str| -> f64 {
            text.lines()
                .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
                .and_then(|l| l.rsplit(' ').next()?.parse().ok())
                .unwrap_or(0.0)
        };
        let gained = |series: &str| (value(after, series) - value(before, series)).max(0.0);
        let secs = |series: &str| Duration::from_secs_f64(gained(series));
        let count = |series: &str| gained(series).round() as u64;
        let stage = |name: &str, what: &str| {
            format!("zkguard_background_stage_{what}_total{{stage=\"{name}\"}}")
        };
        Self {
            acquisitions: count(&stage("lock_wait", "requests")),
            lock_wait: secs(&stage("lock_wait", "seconds")),
            reads: count(&stage("read", "requests")),
            read_time: secs(&stage("read", "seconds")),
            writes: count(&stage("write", "requests")),
            write_time: secs(&stage("write", "seconds")),
            fsyncs: count("zkguard_journal_fsyncs_total"),
            fsync_time: secs("zkguard_journal_fsync_seconds_total"),
            accept_p50: Duration::ZERO,
        }
    }
}
