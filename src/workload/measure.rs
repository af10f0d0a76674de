//! What the benchmarks measure besides time: requests (ZooKeeper's packet counter, or the calls
//! of a document store), CPU time (this process's, a server's from `/proc`), and nearest-rank
//! percentiles. Shared by `bench`, `service_bench`, `gateway_bench` and `txn_bench`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tracing::warn;

use zkguard::config::Settings;
use zkguard::es::{EsError, StoreCall, StoreHook};

/// A [`StoreHook`] that counts the calls of a store: every call of [`EsStore`] sends one HTTP
/// request (a retry on another node happens only when the connection was refused, so the
/// server never saw the first attempt).
pub(super) struct CountCalls(pub(super) Arc<AtomicU64>);

#[async_trait]
impl StoreHook for CountCalls {
    async fn before(&self, _call: &StoreCall<'_>) -> Result<(), EsError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// How the requests of the uncontended cycles are counted.
pub(super) enum RequestCounter {
    /// `zk_packets_received` of this `host:port`.
    Mntr(String),
    /// Calls of these clients' document stores.
    Store(Vec<Arc<AtomicU64>>),
}

impl RequestCounter {
    /// Counts `store_calls` when every client has its store's counter, else ZooKeeper's
    /// packets at the first server of `settings`.
    pub(super) fn new(settings: &Settings, store_calls: Option<Vec<Arc<AtomicU64>>>) -> Self {
        match store_calls {
            Some(calls) => Self::Store(calls),
            None => Self::Mntr(first_zk_host(&settings.zookeeper.servers)),
        }
    }

    /// Requests per cycle between two readings. The server counts the `mntr` request of each
    /// reading too: that of the second one falls between them and is not the cycles'.
    pub(super) fn per_cycle(
        &self,
        before: Option<u64>,
        after: Option<u64>,
        cycles: u32,
    ) -> Option<f64> {
        let own = match self {
            Self::Mntr(_) => 1,
            Self::Store(_) => 0,
        };
        match (before, after) {
            (Some(b), Some(a)) => {
                Some(a.saturating_sub(b).saturating_sub(own) as f64 / f64::from(cycles))
            }
            _ => None,
        }
    }

    pub(super) async fn read(&self) -> Option<u64> {
        match self {
            Self::Mntr(addr) => {
                let addr = addr.clone();
                let result = tokio::task::spawn_blocking(move || {
                    zkguard::testkit::packets_received_at(addr.as_str())
                })
                .await;
                match result {
                    Ok(Ok(n)) => Some(n),
                    Ok(Err(e)) => {
                        warn!(error = %e, "cannot read zk_packets_received (four-letter word mntr); requests per cycle not counted");
                        None
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot read zk_packets_received");
                        None
                    }
                }
            }
            Self::Store(calls) => Some(calls.iter().map(|c| c.load(Ordering::Relaxed)).sum()),
        }
    }
}

/// The first `host:port` of a ZooKeeper connect string (`h1:2181,h2:2181/chroot`); the port
/// defaults to 2181.
pub fn first_zk_host(connect: &str) -> String {
    let first = connect.split(',').next().unwrap_or("").trim();
    let first = first.split('/').next().unwrap_or("");
    match first.rfind(':') {
        // `[v6]:port` or `host:port`.
        Some(i)
            if (first.starts_with('[') && first[..i].ends_with(']'))
                || !first[..i].contains(':') =>
        {
            first.to_string()
        }
        // A bare IPv6 address.
        Some(_) => format!("[{first}]:2181"),
        None => format!("{first}:2181"),
    }
}

/// User + system CPU time of this process so far (all threads), from `getrusage(RUSAGE_SELF)`.
pub(super) fn cpu_time() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(usage) => {
            let micros = |t: nix::sys::time::TimeVal| {
                Duration::from_secs(t.tv_sec().max(0) as u64)
                    + Duration::from_micros(t.tv_usec().max(0) as u64)
            };
            micros(usage.user_time()) + micros(usage.system_time())
        }
        // getrusage(RUSAGE_SELF) fails only for an invalid `who`.
        Err(_) => Duration::ZERO,
    }
}

/// CPU milliseconds per cycle between two [`cpu_time`] readings.
pub(super) fn cpu_ms_per(before: Duration, after: Duration, cycles: u32) -> f64 {
    after.saturating_sub(before).as_secs_f64() * 1e3 / f64::from(cycles)
}

/// User + system CPU time of process `pid` (all threads), from `/proc/PID/stat`: `None` when it
/// cannot be read (another system, a process that is gone).
pub fn process_cpu_time(pid: u32) -> Option<Duration> {
    stat_cpu_time(std::path::Path::new(&format!("/proc/{pid}/stat")))
}

/// User + system CPU time from a `/proc` `stat` file (of a process, or of one of its threads
/// under `/proc/PID/task/TID/stat`).
pub fn stat_cpu_time(path: &std::path::Path) -> Option<Duration> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The command name (field 2) may hold spaces: count from the parenthesis that closes it.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime), the 12th and 13th after the name, in clock ticks.
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let per_sec = unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) };
    let per_sec = u64::try_from(per_sec).ok().filter(|&t| t > 0)?;
    Some(Duration::from_secs_f64(ticks as f64 / per_sec as f64))
}

/// The server's CPU time, read at the edges of each measured phase.
pub(super) struct ServerCpu(pub(super) Option<u32>);

impl ServerCpu {
    pub(super) fn read(&self) -> Option<Duration> {
        self.0.and_then(process_cpu_time)
    }

    /// Milliseconds per cycle between two readings.
    pub(super) fn per(
        before: Option<Duration>,
        after: Option<Duration>,
        cycles: u32,
    ) -> Option<f64> {
        Some(cpu_ms_per(before?, after?, cycles))
    }
}

/// Nearest-rank percentile of sorted values (rank `ceil(q * n)`, clamped), as the peers.
pub fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.saturating_sub(1).min(sorted.len() - 1)]
}

/// The readings at the start of a measured phase: requests, client CPU, server CPU.
pub(super) struct PhaseMeter<'a> {
    counter: &'a RequestCounter,
    server: &'a ServerCpu,
    requests: Option<u64>,
    cpu: Duration,
    server_cpu: Option<Duration>,
}

impl<'a> PhaseMeter<'a> {
    pub(super) async fn start(counter: &'a RequestCounter, server: &'a ServerCpu) -> Self {
        let requests = counter.read().await;
        Self {
            counter,
            server,
            requests,
            cpu: cpu_time(),
            server_cpu: server.read(),
        }
    }

    /// What the phase's `cycles` cost, per cycle. The CPU times are read before the request
    /// counter, whose reading is itself a request.
    pub(super) async fn finish(self, cycles: u32) -> PhaseCost {
        let cpu_ms = cpu_ms_per(self.cpu, cpu_time(), cycles);
        let server_cpu_ms = ServerCpu::per(self.server_cpu, self.server.read(), cycles);
        let after = self.counter.read().await;
        let requests = self.counter.per_cycle(self.requests, after, cycles);
        PhaseCost {
            cpu_ms,
            server_cpu_ms,
            requests,
        }
    }
}

/// What the measured cycles of one phase cost, per cycle.
pub(super) struct PhaseCost {
    /// Client CPU milliseconds.
    pub(super) cpu_ms: f64,
    /// Server CPU milliseconds, with a server pid.
    pub(super) server_cpu_ms: Option<f64>,
    /// Requests, when counted.
    pub(super) requests: Option<f64>,
}

/// Runs `work` on a single-threaded runtime on a thread of its own named `name` (so that the
/// benchmark's own scheduling does not share the caller's runtime), and returns its result.
///
/// # Errors
/// `work`'s, or why the thread or its runtime could not run it.
pub(super) async fn on_own_thread<T, Fut>(
    name: &str,
    work: impl FnOnce() -> Fut + Send + 'static,
) -> Result<T, String>
where
    T: Send + 'static,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start the benchmark runtime: {e}"))
                .and_then(|rt| rt.block_on(work()));
            let _ = tx.send(result);
        })
        .map_err(|e| format!("cannot start the benchmark thread: {e}"))?;
    rx.await
        .map_err(|_| "the benchmark thread ended without a result".to_string())?
}

/// The latencies the clients' tasks `tasks` measured, in the tasks' order; the first error
/// of a task (or its panic) otherwise.
pub(super) async fn joined(
    tasks: Vec<tokio::task::JoinHandle<Result<Vec<Duration>, String>>>,
) -> Result<Vec<Duration>, String> {
    let mut samples = Vec::new();
    for t in tasks {
        samples.extend(t.await.map_err(|e| e.to_string())??);
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles_match_the_peers() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 0.50), Duration::from_millis(50));
        assert_eq!(percentile(&v, 0.99), Duration::from_millis(99));
        let v: Vec<Duration> = (1..=50).map(Duration::from_millis).collect();
        // ceil(0.99 * 50) = 50 -> the largest; ceil(0.5 * 50) = 25.
        assert_eq!(percentile(&v, 0.99), Duration::from_millis(50));
        assert_eq!(percentile(&v, 0.50), Duration::from_millis(25));
        assert_eq!(percentile(&v[..1], 0.5), Duration::from_millis(1));
    }

    #[test]
    fn first_host_of_a_connect_string() {
        assert_eq!(
            first_zk_host("127.0.0.1:2182,b:2183/chroot"),
            "127.0.0.1:2182"
        );
        assert_eq!(first_zk_host("zk1/chroot"), "zk1:2181");
        assert_eq!(first_zk_host("[::1]:2190"), "[::1]:2190");
        assert_eq!(first_zk_host("localhost"), "localhost:2181");
        assert_eq!(first_zk_host("::1"), "[::1]:2181");
    }

    #[test]
    fn cpu_time_of_a_process_is_read_from_proc() {
        let own = process_cpu_time(std::process::id()).expect("this process's own stat");
        // Burn CPU until the reading grows (the clock ticks by 10 ms).
        let t0 = std::time::Instant::now();
        let mut x = 0u64;
        loop {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            let later = process_cpu_time(std::process::id()).expect("read again");
            if later > own {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the CPU time read from /proc did not grow: {later:?}"
            );
        }
        assert_eq!(process_cpu_time(u32::MAX), None);
    }
}
