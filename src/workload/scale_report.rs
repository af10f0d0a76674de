//! The plan and the report of `zkguard bench --scale` (measured by
//! [`super::scale_bench`]): the levels of each dimension, the figures of each level, and how
//! they are shown (one flat JSON object, or one table per dimension with each figure's growth
//! from the first level).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

/// The default levels of `--scale-monitors`.
pub const DEFAULT_MONITORS: [u32; 3] = [1000, 10_000, 100_000];
/// The default levels of `--scale-clients`.
pub const DEFAULT_CLIENTS: [u32; 3] = [10, 100, 1000];
/// The default levels of `--scale-instances`.
pub const DEFAULT_INSTANCES: [u32; 2] = [1, 3];
/// Concurrent HTTP clients of every level of the instances dimension, spread over the
/// instances.
pub const INSTANCE_CLIENTS: u32 = 100;
/// The default total of writes per client level (`--scale-writes`).
pub const DEFAULT_WRITES: u32 = 2000;
/// Concurrent acquisitions per wave of the monitors' bulk job.
pub const WAVE: u32 = 500;
/// Monitors of each unmeasured warm-up job, by default.
pub const WARMUP_MONITORS: u32 = 5000;

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalePlan {
    /// Levels of the monitors dimension: distinct monitors of each bulk job.
    pub monitors: Vec<u32>,
    /// Levels of the clients dimension: concurrent HTTP clients.
    pub clients: Vec<u32>,
    /// Levels of the instances dimension: `zkguard serve` processes sharing
    /// [`INSTANCE_CLIENTS`] clients and the same writes.
    pub instances: Vec<u32>,
    /// Writes per client level (at least the level's clients, see [`ScalePlan::writes_at`]).
    pub writes: u32,
    /// Monitors of each unmeasured warm-up job ([`WARMUP_MONITORS`] by default; 0: none).
    pub warmup: u32,
    /// The ZooKeeper server's process id, when known: its CPU time is measured and the warm-up
    /// lasts until its JIT compilers are done.
    pub zk_pid: Option<u32>,
}

impl ScalePlan {
    /// Writes of the level of `clients` clients: [`ScalePlan::writes`], at least one per client.
    pub fn writes_at(&self, clients: u32) -> u32 {
        self.writes.max(clients)
    }
}

/// The figures of one level of the monitors dimension.
#[derive(Debug, Clone, Default)]
pub struct MonitorLevel {
    /// Distinct monitors, one lock cycle each.
    pub monitors: u32,
    /// From the first acquisition until the last release was answered.
    pub elapsed: Duration,
    /// ZooKeeper requests per operation, when `mntr` answered.
    pub zk_requests_per_op: Option<f64>,
    /// ZooKeeper server CPU ms per operation, with its process id.
    pub zk_cpu_ms_per_op: Option<f64>,
    /// This process's CPU ms per operation.
    pub client_cpu_ms_per_op: f64,
    /// Growth of this process's resident memory over the job, in KiB (Linux).
    pub rss_growth_kb: Option<i64>,
    /// `zk_znode_count` after the job less before it, when `mntr` answered.
    pub znodes_left: Option<i64>,
    /// Children of the level's lock root right after the job (its monitor containers).
    pub containers_left: Option<i64>,
}

impl MonitorLevel {
    /// Operations per second.
    pub fn ops_per_sec(&self) -> f64 {
        f64::from(self.monitors) / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// The figures of one level of the clients dimension.
#[derive(Debug, Clone, Default)]
pub struct ClientLevel {
    /// Concurrent clients.
    pub clients: u32,
    /// `zkguard serve` processes sharing them (client `c` writes to instance `c mod k`); the
    /// service figures are summed over them.
    pub instances: u32,
    /// Writes sent.
    pub writes: u32,
    /// Writes that succeeded.
    pub ok: u32,
    /// From the first write sent until the last answer.
    pub elapsed: Duration,
    /// Latency of the writes that succeeded, median.
    pub p50: Duration,
    /// Latency of the writes that succeeded, 99th percentile.
    pub p99: Duration,
    /// ZooKeeper requests per successful write, when `mntr` answered.
    pub zk_requests_per_write: Option<f64>,
    /// ZooKeeper server CPU ms per successful write, with its process id.
    pub zk_cpu_ms_per_write: Option<f64>,
    /// The service's CPU ms per successful write.
    pub service_cpu_ms_per_write: Option<f64>,
    /// The service's resident memory after the level, in KiB.
    pub service_rss_kb: Option<u64>,
    /// The service's open file descriptors after the level.
    pub service_fds: Option<u64>,
    /// Writes refused or failed, by `status error_code` (`503 overloaded`), or `connection`
    /// and what became of it (`connection reset`).
    pub failures: BTreeMap<String, u32>,
    /// Idle connections the service closed to make room at `server.max.connections`
    /// (`zkguard_http_connections_evicted` of its `/metrics`).
    pub connections_evicted: Option<u64>,
    /// Connections the service refused at `server.max.connections`, every one being busy.
    pub connections_refused: Option<u64>,
}

impl ClientLevel {
    /// Successful writes per second.
    pub fn writes_per_sec(&self) -> f64 {
        f64::from(self.ok) / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Writes that did not succeed.
    pub fn failed(&self) -> u32 {
        self.failures.values().sum()
    }

    /// The configuration keys whose limits refused writes, by what the service answered, and
    /// `server.max.connections` when the service closed or refused connections at its limit.
    pub fn limits(&self) -> Vec<&'static str> {
        let at_connections =
            self.connections_evicted.unwrap_or(0) + self.connections_refused.unwrap_or(0) > 0;
        let mut out: Vec<&'static str> = self
            .failures
            .keys()
            .filter_map(|k| limit_of(k))
            .chain(at_connections.then_some("server.max.connections"))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// The configuration key behind a refusal (`503 overloaded` and the like).
pub fn limit_of(failure: &str) -> Option<&'static str> {
    let code = failure.split_once(' ').map_or(failure, |(_, c)| c);
    match code {
        "overloaded" => Some("server.max.concurrent"),
        "too_many_connections" => Some("server.max.connections"),
        "request_timeout" => Some("server.request.timeout"),
        "queue_full" => Some("server.queue.max"),
        _ => None,
    }
}

/// The report.
#[derive(Debug, Clone)]
pub struct ScaleReport {
    /// The plan.
    pub plan: ScalePlan,
    /// One per level of [`ScalePlan::monitors`], in its order.
    pub monitors: Vec<MonitorLevel>,
    /// One per level of [`ScalePlan::clients`], in its order.
    pub clients: Vec<ClientLevel>,
    /// One per level of [`ScalePlan::instances`], in its order.
    pub instances: Vec<ClientLevel>,
    /// Unmeasured warm-up jobs.
    pub warmup_runs: u32,
    /// `server.max.concurrent` of the services started.
    pub max_concurrent: usize,
    /// `server.max.connections` of the services started.
    pub max_connections: usize,
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

fn ms(d: Duration) -> f64 {
    round2(d.as_secs_f64() * 1000.0)
}

fn mb(kb: f64) -> f64 {
    round2(kb / 1024.0)
}

fn build() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// `value / first`, when both are known and the first is not zero.
fn growth(first: Option<f64>, value: Option<f64>) -> Option<f64> {
    match (first, value) {
        (Some(f), Some(v)) if f.abs() > 1e-12 => Some(round2(v / f)),
        _ => None,
    }
}

/// A figure of every level of one dimension: its JSON name, its label, and its values.
struct Row {
    key: &'static str,
    label: &'static str,
    values: Vec<Option<f64>>,
    /// Decimals in the table.
    decimals: usize,
}

impl ScaleReport {
    fn monitor_rows(&self) -> Vec<Row> {
        let m = &self.monitors;
        let col = |f: &dyn Fn(&MonitorLevel) -> Option<f64>| m.iter().map(f).collect::<Vec<_>>();
        vec![
            Row {
                key: "seconds",
                label: "job time, s",
                values: col(&|l| Some(round2(l.elapsed.as_secs_f64()))),
                decimals: 2,
            },
            Row {
                key: "ops_per_sec",
                label: "operations per second",
                values: col(&|l| Some(round2(l.ops_per_sec()))),
                decimals: 0,
            },
            Row {
                key: "zk_requests_per_op",
                label: "ZooKeeper requests per op",
                values: col(&|l| l.zk_requests_per_op.map(round4)),
                decimals: 3,
            },
            Row {
                key: "zk_cpu_ms_per_op",
                label: "ZooKeeper CPU ms per op",
                values: col(&|l| l.zk_cpu_ms_per_op.map(round4)),
                decimals: 4,
            },
            Row {
                key: "client_cpu_ms_per_op",
                label: "client CPU ms per op",
                values: col(&|l| Some(round4(l.client_cpu_ms_per_op))),
                decimals: 4,
            },
            Row {
                key: "rss_growth_mb",
                label: "client RSS growth, MB",
                values: col(&|l| l.rss_growth_kb.map(|k| mb(k as f64))),
                decimals: 1,
            },
            Row {
                key: "znodes_left",
                label: "znodes left (zk_znode_count)",
                values: col(&|l| l.znodes_left.map(|n| n as f64)),
                decimals: 0,
            },
            Row {
                key: "containers_left",
                label: "monitor containers left",
                values: col(&|l| l.containers_left.map(|n| n as f64)),
                decimals: 0,
            },
        ]
    }

    fn client_rows(c: &[ClientLevel]) -> Vec<Row> {
        let col = |f: &dyn Fn(&ClientLevel) -> Option<f64>| c.iter().map(f).collect::<Vec<_>>();
        vec![
            Row {
                key: "writes",
                label: "writes sent",
                values: col(&|l| Some(f64::from(l.writes))),
                decimals: 0,
            },
            Row {
                key: "ok",
                label: "writes that succeeded",
                values: col(&|l| Some(f64::from(l.ok))),
                decimals: 0,
            },
            Row {
                key: "failed",
                label: "writes refused or failed",
                values: col(&|l| Some(f64::from(l.failed()))),
                decimals: 0,
            },
            Row {
                key: "p50_ms",
                label: "latency p50, ms",
                values: col(&|l| (l.ok > 0).then(|| ms(l.p50))),
                decimals: 2,
            },
            Row {
                key: "p99_ms",
                label: "latency p99, ms",
                values: col(&|l| (l.ok > 0).then(|| ms(l.p99))),
                decimals: 2,
            },
            Row {
                key: "writes_per_sec",
                label: "writes per second",
                values: col(&|l| Some(round2(l.writes_per_sec()))),
                decimals: 0,
            },
            Row {
                key: "zk_requests_per_write",
                label: "ZooKeeper requests per write",
                values: col(&|l| l.zk_requests_per_write.map(round4)),
                decimals: 3,
            },
            Row {
                key: "zk_cpu_ms_per_write",
                label: "ZooKeeper CPU ms per write",
                values: col(&|l| l.zk_cpu_ms_per_write.map(round4)),
                decimals: 4,
            },
            Row {
                key: "service_cpu_ms_per_write",
                label: "service CPU ms per write",
                values: col(&|l| l.service_cpu_ms_per_write.map(round4)),
                decimals: 4,
            },
            Row {
                key: "service_rss_mb",
                label: "service RSS after, MB",
                values: col(&|l| l.service_rss_kb.map(|k| mb(k as f64))),
                decimals: 1,
            },
            Row {
                key: "connections_evicted",
                label: "idle connections closed at limit",
                values: col(&|l| l.connections_evicted.map(|n| n as f64)),
                decimals: 0,
            },
            Row {
                key: "connections_refused",
                label: "connections refused at limit",
                values: col(&|l| l.connections_refused.map(|n| n as f64)),
                decimals: 0,
            },
            Row {
                key: "service_fds",
                label: "service open fds after",
                values: col(&|l| l.service_fds.map(|n| n as f64)),
                decimals: 0,
            },
        ]
    }

    /// One flat JSON object: `monitors_n{N}_{figure}` and `clients_n{C}_{figure}` for every
    /// level and figure (`null` when not measured), `..._growth` for every figure of the levels
    /// after the first (the value over the first level's), `clients_n{C}_failed_{status}_{code}`
    /// per kind of refusal and `clients_n{C}_limits` (the configuration keys that refused
    /// writes, comma-separated, empty when none).
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "monitor_levels": self.plan.monitors,
            "client_levels": self.plan.clients,
            "instance_levels": self.plan.instances,
            "instance_clients": INSTANCE_CLIENTS,
            "writes": self.plan.writes,
            "wave": WAVE,
            "warmup_runs": self.warmup_runs,
            "warmup_monitors": self.plan.warmup,
            "server_max_concurrent": self.max_concurrent,
            "server_max_connections": self.max_connections,
            "build": build(),
        });
        let Value::Object(all) = &mut v else {
            unreachable!("a JSON object")
        };
        let dims: [(&str, Vec<u32>, Vec<Row>); 3] = [
            (
                "monitors",
                self.monitors.iter().map(|l| l.monitors).collect(),
                self.monitor_rows(),
            ),
            (
                "clients",
                self.clients.iter().map(|l| l.clients).collect(),
                Self::client_rows(&self.clients),
            ),
            (
                "instances",
                self.instances.iter().map(|l| l.instances).collect(),
                Self::client_rows(&self.instances),
            ),
        ];
        for (dim, levels, rows) in dims {
            for row in rows {
                for (i, (n, value)) in levels.iter().zip(&row.values).enumerate() {
                    all.insert(format!("{dim}_n{n}_{}", row.key), json!(value));
                    if i > 0 {
                        all.insert(
                            format!("{dim}_n{n}_{}_growth", row.key),
                            json!(growth(row.values[0], *value)),
                        );
                    }
                }
            }
        }
        let levels = self
            .clients
            .iter()
            .map(|l| ("clients", l.clients, l))
            .chain(self.instances.iter().map(|l| ("instances", l.instances, l)));
        for (dim, n, l) in levels {
            for (kind, count) in &l.failures {
                let kind = kind.replace(' ', "_");
                all.insert(format!("{dim}_n{n}_failed_{kind}"), json!(count));
            }
            all.insert(format!("{dim}_n{n}_limits"), json!(l.limits().join(",")));
        }
        v
    }

    /// Tables for people: one per dimension, each figure's value per level and its growth from
    /// the first level.
    pub fn table(&self) -> String {
        let mut out = format!(
            "zkguard bench --scale, {} build; after {} unmeasured warm-up job(s) of {} monitors\n\n",
            build(),
            self.warmup_runs,
            self.plan.warmup
        );
        if !self.monitors.is_empty() {
            out.push_str(&format!(
                "monitors: one session's background bulk job over N new monitors, waves of {WAVE} \
                 concurrent acquisitions, each wave released in one release_all\n"
            ));
            let levels: Vec<String> = self
                .monitors
                .iter()
                .map(|l| l.monitors.to_string())
                .collect();
            out.push_str(&grid("N monitors", &levels, &self.monitor_rows()));
        }
        if !self.clients.is_empty() {
            out.push_str(&format!(
                "\nHTTP clients: C concurrent clients of one zkguard serve (server.max.concurrent {}, \
                 server.max.connections {}), foreground writes of distinct documents, {} in all \
                 (at least one per client), refused writes not retried\n",
                self.max_concurrent, self.max_connections, self.plan.writes
            ));
            let levels: Vec<String> = self.clients.iter().map(|l| l.clients.to_string()).collect();
            out.push_str(&grid(
                "C clients",
                &levels,
                &Self::client_rows(&self.clients),
            ));
        }
        if !self.instances.is_empty() {
            out.push_str(&format!(
                "\ninstances: K zkguard serve processes on one ZooKeeper sharing {INSTANCE_CLIENTS} \
                 concurrent clients (client c writes to instance c mod K) and {} writes; service \
                 figures summed over the instances\n",
                self.plan.writes_at(INSTANCE_CLIENTS)
            ));
            let levels: Vec<String> = self
                .instances
                .iter()
                .map(|l| l.instances.to_string())
                .collect();
            out.push_str(&grid(
                "K instances",
                &levels,
                &Self::client_rows(&self.instances),
            ));
        }
        let refused = self
            .clients
            .iter()
            .map(|l| ("C", l.clients, l))
            .chain(self.instances.iter().map(|l| ("K", l.instances, l)));
        for (what, n, l) in refused.filter(|(_, _, l)| l.failed() > 0) {
            let kinds: Vec<String> = l
                .failures
                .iter()
                .map(|(k, count)| match limit_of(k) {
                    Some(key) => format!("{count} x {k} ({key})"),
                    None => format!("{count} x {k}"),
                })
                .collect();
            out.push_str(&format!(
                "  {what}={n}: {} of {} writes refused or failed: {}\n",
                l.failed(),
                l.writes,
                kinds.join(", ")
            ));
        }
        out
    }
}

/// A table: one row per figure, one column per level (its value, and after the first its
/// growth from the first).
fn grid(what: &str, levels: &[String], rows: &[Row]) -> String {
    let label_width = rows
        .iter()
        .map(|r| r.label.len())
        .max()
        .unwrap_or(0)
        .max(what.len());
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            row.values
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let value =
                        v.map_or_else(|| "n/a".to_string(), |x| format!("{:.*}", row.decimals, x));
                    match growth(row.values[0], *v) {
                        Some(g) if i > 0 => format!("{value} ({g:.2}x)"),
                        None if i > 0 => format!("{value} (-)"),
                        _ => value,
                    }
                })
                .collect()
        })
        .collect();
    let width = cells
        .iter()
        .flatten()
        .chain(levels)
        .map(String::len)
        .max()
        .unwrap_or(0);
    let mut out = format!("{what:<label_width$}");
    for level in levels {
        out.push_str(&format!("  {level:>width$}"));
    }
    out.push('\n');
    out.push_str(&"-".repeat(label_width + levels.len() * (width + 2)));
    out.push('\n');
    for (row, cells) in rows.iter().zip(&cells) {
        out.push_str(&format!("{:<label_width$}", row.label));
        for cell in cells {
            out.push_str(&format!("  {cell:>width$}"));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> ScaleReport {
        let level = |n: u32, secs: u64, req: f64| MonitorLevel {
            monitors: n,
            elapsed: Duration::from_secs(secs),
            zk_requests_per_op: Some(req),
            zk_cpu_ms_per_op: Some(0.1),
            client_cpu_ms_per_op: 0.05,
            rss_growth_kb: Some(1024),
            znodes_left: Some(i64::from(n)),
            containers_left: None,
        };
        let mut refused = BTreeMap::new();
        refused.insert("503 overloaded".to_string(), 7);
        ScaleReport {
            plan: ScalePlan {
                monitors: vec![100, 1000],
                clients: vec![2, 20],
                instances: vec![],
                writes: 40,
                warmup: 0,
                zk_pid: None,
            },
            monitors: vec![level(100, 1, 1.0), level(1000, 5, 1.5)],
            clients: vec![
                ClientLevel {
                    clients: 2,
                    writes: 40,
                    ok: 40,
                    elapsed: Duration::from_secs(1),
                    p50: Duration::from_millis(2),
                    p99: Duration::from_millis(4),
                    ..ClientLevel::default()
                },
                ClientLevel {
                    clients: 20,
                    writes: 40,
                    ok: 33,
                    elapsed: Duration::from_secs(1),
                    p50: Duration::from_millis(3),
                    p99: Duration::from_millis(9),
                    failures: refused,
                    ..ClientLevel::default()
                },
            ],
            instances: vec![],
            warmup_runs: 1,
            max_concurrent: 256,
            max_connections: 1024,
        }
    }

    #[test]
    fn the_report_is_flat_with_growth_from_the_first_level() {
        let v = report().to_json();
        assert!(v.as_object().unwrap().values().all(|x| !x.is_object()));
        assert_eq!(v["monitors_n100_ops_per_sec"], 100.0);
        assert_eq!(v["monitors_n1000_ops_per_sec"], 200.0);
        assert_eq!(v["monitors_n1000_ops_per_sec_growth"], 2.0);
        assert_eq!(v["monitors_n1000_zk_requests_per_op_growth"], 1.5);
        assert_eq!(v["monitors_n100_containers_left"], Value::Null);
        assert!(v.get("monitors_n100_ops_per_sec_growth").is_none());
        assert_eq!(v["clients_n20_failed"], 7.0);
        assert_eq!(v["clients_n20_failed_503_overloaded"], 7);
        assert_eq!(v["clients_n20_limits"], "server.max.concurrent");
        assert_eq!(v["clients_n2_limits"], "");
        assert_eq!(v["clients_n20_p99_ms_growth"], 2.25);
        assert_eq!(v["clients_n2_zk_requests_per_write"], Value::Null);
    }

    #[test]
    fn the_table_shows_values_growth_and_limits() {
        let table = report().table();
        for needle in [
            "operations per second",
            "(2.00x)",
            "ZooKeeper requests per op",
            "znodes left",
            "writes refused or failed",
            "7 x 503 overloaded (server.max.concurrent)",
            "n/a",
        ] {
            assert!(table.contains(needle), "{needle} in\n{table}");
        }
    }

    #[test]
    fn refusals_name_their_limit() {
        assert_eq!(limit_of("503 overloaded"), Some("server.max.concurrent"));
        assert_eq!(
            limit_of("503 too_many_connections"),
            Some("server.max.connections")
        );
        assert_eq!(limit_of("connection reset"), None);
    }
}
