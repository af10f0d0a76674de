//! `zkguard bench` as users and `make bench` script it: the JSON contract for both backends
//! against servers the command starts itself (`--local`), the table, and the exit statuses of
//! bad usage and unreachable servers. Speed is never asserted here: only that every figure is
//! a positive number, and that an uncontended ZooKeeper cycle costs about two requests.

use std::process::Output;

use serde_json::Value;

const FIGURES: &[&str] = &[
    "uncontended.p50_ms",
    "uncontended.p99_ms",
    "uncontended.requests_per_cycle",
    "uncontended.cpu_ms_per_cycle",
    "contended.handoffs_per_sec",
    "contended.owner_changes_per_sec",
    "contended.requests_per_handoff",
    "contended.cpu_ms_per_handoff",
    "throughput.ops_per_sec",
    "throughput.requests_per_op",
    "throughput.cpu_ms_per_op",
];

/// The server's CPU time per cycle: measured on the ZooKeeper server `--local` starts (a
/// number, possibly 0 over a short run: the JVM's clock ticks by 10 ms), `null` on
/// Elasticsearch.
const SERVER_FIGURES: &[&str] = &[
    "uncontended.server_cpu_ms_per_cycle",
    "contended.server_cpu_ms_per_handoff",
    "throughput.server_cpu_ms_per_op",
];

fn zkguard(args: &[&str]) -> Output {
    crate::cli::zkguard()
        .arg("bench")
        .args(args)
        .env_remove("ZKGUARD_CONFIG")
        .env_remove("RUST_LOG")
        .env("ZKGUARD_ZOOKEEPER_CONNECTION_RETRY", "1")
        .env("ZKGUARD_ZOOKEEPER_CONNECTION_DELAY", "100")
        .output()
        .expect("run zkguard")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs a small local benchmark with `--json` and returns the object after checking the keys
/// every backend shares.
fn local_json(backend: &str) -> serde_json::Map<String, Value> {
    let out = zkguard(&[
        "--backend",
        backend,
        "--local",
        "--json",
        "--iterations",
        "50",
        "--contenders",
        "2",
        "--monitors",
        "2",
    ]);
    assert!(
        out.status.success(),
        "exit {:?}; stderr:\n{}",
        out.status,
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "--json prints exactly one line on stdout, got:\n{stdout}"
    );
    let value: Value =
        serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
    let obj = value.as_object().expect("a JSON object").clone();
    assert!(
        obj.values().all(|v| !v.is_object()),
        "keys are flat: {obj:?}"
    );
    assert_eq!(obj["backend"], backend);
    assert_eq!(obj["iterations"], 50);
    assert_eq!(obj["contenders"], 2);
    assert_eq!(obj["monitors"], 2);
    assert!(
        ["release_and_acquire", "separate"].contains(&obj["release"].as_str().unwrap_or_default()),
        "release = {}",
        obj["release"]
    );
    for key in FIGURES {
        let v = obj
            .get(*key)
            .unwrap_or_else(|| panic!("missing key {key} in {obj:?}"));
        let n = v
            .as_f64()
            .unwrap_or_else(|| panic!("{key} is not a number: {v}"));
        assert!(
            n > 0.0 && n.is_finite(),
            "{key} = {n} is not a positive number"
        );
    }
    for key in SERVER_FIGURES {
        let v = obj
            .get(*key)
            .unwrap_or_else(|| panic!("missing key {key} in {obj:?}"));
        if backend == "zookeeper" {
            let n = v
                .as_f64()
                .unwrap_or_else(|| panic!("{key} is not a number: {v}"));
            assert!(n >= 0.0 && n.is_finite(), "{key} = {n}");
        } else {
            assert!(v.is_null(), "{key} = {v}: there is no ZooKeeper server");
        }
    }
    let p50 = obj["uncontended.p50_ms"].as_f64().unwrap();
    let p99 = obj["uncontended.p99_ms"].as_f64().unwrap();
    assert!(p50 <= p99, "p50 {p50} > p99 {p99}");
    let handoffs = obj["contended.handoffs_per_sec"].as_f64().unwrap();
    let changes = obj["contended.owner_changes_per_sec"].as_f64().unwrap();
    assert!(
        changes <= handoffs * 1.001,
        "owner changes {changes} > hand-offs {handoffs}"
    );
    obj
}

#[test]
fn zookeeper_json_has_every_figure_and_two_requests_per_cycle() {
    let obj = local_json("zookeeper");
    let requests = obj["uncontended.requests_per_cycle"].as_f64().unwrap();
    assert!(
        (1.5..=2.5).contains(&requests),
        "requests per uncontended cycle: {requests}, expected about 2"
    );
    // A hand-off costs at least the successor's create and the holder's release.
    let per_handoff = obj["contended.requests_per_handoff"].as_f64().unwrap();
    assert!(
        per_handoff >= 2.0,
        "requests per hand-off: {per_handoff}, expected at least 2"
    );
    // A throughput cycle costs at least one request: the next acquisition's multi, which also
    // releases the lock held (release_and_acquire).
    assert_eq!(obj["release"], "release_and_acquire");
    let per_op = obj["throughput.requests_per_op"].as_f64().unwrap();
    assert!(
        per_op >= 1.0,
        "requests per throughput cycle: {per_op}, expected at least 1"
    );
    // Hand-offs within one session: one multi each (the holder's release carrying the next
    // holder's take), a little more for pings over a short run.
    let same = obj["same_session.requests_per_handoff"].as_f64().unwrap();
    assert!(
        (0.9..=1.2).contains(&same),
        "requests per same-session hand-off: {same}, expected about 1"
    );
    assert!(obj["same_session.handoffs_per_sec"].as_f64().unwrap() > 0.0);
}

#[test]
fn server_pid_must_name_a_readable_process() {
    let out = zkguard(&[
        "--backend",
        "zookeeper",
        "--zk",
        "127.0.0.1:1",
        "--server-pid",
        "4294967295",
    ]);
    assert_eq!(
        out.status.code(),
        Some(64),
        "stderr:\n{}",
        text(&out.stderr)
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("--server-pid 4294967295") && stderr.contains("/proc/4294967295/stat"),
        "stderr:\n{stderr}"
    );
}

#[test]
fn elasticsearch_json_has_every_figure() {
    let obj = local_json("elasticsearch");
    // Every store call is one HTTP request: at least the grant and the release.
    let requests = obj["uncontended.requests_per_cycle"].as_f64().unwrap();
    assert!(
        requests >= 2.0,
        "requests per uncontended cycle: {requests}"
    );
    // The lease lock has no sessions to hand a lock over within.
    assert!(obj["same_session.handoffs_per_sec"].is_null());
}

#[test]
fn table_names_every_figure() {
    let out = zkguard(&[
        "--backend",
        "elasticsearch",
        "--local",
        "--iterations",
        "20",
        "--warmup",
        "5",
        "--contenders",
        "2",
        "--monitors",
        "2",
    ]);
    assert!(out.status.success(), "stderr:\n{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for needle in [
        "Elasticsearch lock at http://127.0.0.1:",
        "clients release each lock in their next acquisition (release_and_acquire)",
        "uncontended acquire+release p50",
        "uncontended acquire+release p99",
        "requests per uncontended cycle",
        "contended hand-offs (2 sessions, 1 monitor)",
        "of which to another session",
        "requests per hand-off",
        "client CPU per uncontended cycle",
        "client CPU per hand-off",
        "throughput (2 sessions, 2 monitors)",
        "client CPU per cycle",
    ] {
        assert!(stdout.contains(needle), "missing {needle:?} in:\n{stdout}");
    }
    // Not a terminal: plain progress lines, no bars.
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("zkguard bench: uncontended: 20 done"),
        "stderr:\n{stderr}"
    );
}

fn closed_port() -> u16 {
    // Bound, then closed: nothing listens there any more.
    zkguard::testkit::free_port().expect("a free port")
}

fn assert_one_line_error(out: &Output, code: i32, needle: &str) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stderr:\n{}",
        text(&out.stderr)
    );
    assert!(
        out.stdout.is_empty(),
        "nothing on stdout, got {}",
        text(&out.stdout)
    );
    let stderr = text(&out.stderr);
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("zkguard: "))
        .collect();
    assert_eq!(errors.len(), 1, "one error line, got:\n{stderr}");
    assert!(
        errors[0].contains(needle),
        "{needle:?} not in {:?}",
        errors[0]
    );
}

#[test]
fn unreachable_zookeeper_exits_69() {
    let zk = format!("127.0.0.1:{}", closed_port());
    let out = zkguard(&["--zk", &zk, "--iterations", "5"]);
    assert_one_line_error(&out, 69, &zk);
    // With --json, the error is a JSON line on stderr, the last one.
    let out = zkguard(&["--json", "--zk", &zk, "--iterations", "5"]);
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    let last: serde_json::Value =
        serde_json::from_str(stderr.lines().last().unwrap()).expect("a JSON error line");
    assert_eq!(last["error"], "unavailable", "{stderr}");
    assert!(last["message"].as_str().unwrap().contains(&zk), "{stderr}");
}

#[test]
fn unreachable_elasticsearch_exits_69() {
    let es = format!("http://127.0.0.1:{}", closed_port());
    let out = zkguard(&[
        "--backend",
        "elasticsearch",
        "--es",
        &es,
        "--iterations",
        "5",
    ]);
    assert_one_line_error(&out, 69, "Elasticsearch is unreachable");
}

#[test]
fn bad_arguments_exit_64() {
    for args in [
        &["--iterations", "0"][..],
        &["--contenders", "x"],
        &["--backend", "redis"],
        &["--local", "--zk", "127.0.0.1:2181"],
        &["--es", "ftp://example.org"],
        &["--zk", ""],
    ] {
        let out = zkguard(args);
        assert_eq!(
            out.status.code(),
            Some(64),
            "{args:?}: stderr:\n{}",
            text(&out.stderr)
        );
        assert!(
            out.stdout.is_empty(),
            "{args:?}: stdout {}",
            text(&out.stdout)
        );
    }
}

/// `zkguard bench --service --local --json`: the three paths' figures are positive numbers,
/// every write was made (as many on the library's and the service's path), and the report names the build and the exec
/// concurrency.
#[test]
fn service_benchmark_reports_the_three_paths() {
    let out = zkguard(&[
        "--service",
        "--local",
        "--json",
        "--iterations",
        "8",
        "--contenders",
        "2",
        "--monitors",
        "3",
    ]);
    assert!(
        out.status.success(),
        "exit {:?}; stderr:\n{}",
        out.status,
        text(&out.stderr)
    );
    let report: Value = serde_json::from_str(text(&out.stdout).trim()).expect("one JSON object");
    // The library and the service apply 5 background operations per save (so that the phase
    // lasts seconds at full size), `zkguard exec` one.
    assert_eq!(report["background_ops"], 40, "{report}");
    for (path, bg) in [("library", 40), ("service", 40), ("exec", 8)] {
        assert_eq!(report[format!("{path}_fg_saves")], 8, "{report}");
        assert_eq!(report[format!("{path}_bg_ops")], bg, "{report}");
        for figure in ["fg_p50_ms", "fg_p99_ms", "bg_ops_per_sec"] {
            let v = report[format!("{path}_{figure}")].as_f64().unwrap_or(-1.0);
            assert!(v > 0.0, "{path}_{figure} = {v}: {report}");
        }
    }
    for ratio in [
        "service_over_library_fg_p50",
        "service_over_exec_bg_throughput",
    ] {
        assert!(
            report[ratio].as_f64().unwrap_or(-1.0) > 0.0,
            "{ratio}: {report}"
        );
    }
    // It says what it measured: the build, and how many exec processes ran the background
    // operations (4 per client).
    assert_eq!(report["exec_background_clients"], 8, "{report}");
    // The servers were warmed up, unmeasured, first (until ZooKeeper's JIT compilers were done,
    // at most 10 runs of the workload).
    let warm = report["warmup_runs"].as_u64().unwrap_or(0);
    assert!((1..=10).contains(&warm), "warmup_runs = {warm}: {report}");
    // So was each service instance, with its own workload, before its measured one.
    for path in ["service", "service_kafka"] {
        if path == "service" || report.get("service_kafka_fg_saves").is_some() {
            let warm = report[format!("{path}_warmup_runs")].as_u64().unwrap_or(0);
            assert!(
                (1..=10).contains(&warm),
                "{path}_warmup_runs = {warm}: {report}"
            );
            // And what ZooKeeper (started here, its process known) still compiled during the
            // measured foreground phase is reported.
            let jit = report[format!("{path}_fg_zk_jit_ms")].as_f64();
            assert!(
                jit.is_some_and(|ms| ms >= 0.0),
                "{path}_fg_zk_jit_ms: {report}"
            );
        }
    }
    assert!(
        ["debug", "release"].contains(&report["build"].as_str().unwrap_or_default()),
        "{report}"
    );
    // Usage: fewer saves than clients is refused.
    let bad = zkguard(&["--service", "--iterations", "1", "--contenders", "2"]);
    assert_eq!(bad.status.code(), Some(64), "{}", text(&bad.stderr));
}

/// `zkguard bench --txn --local --json`: every size and way is measured, and the requests are
/// counted: a transaction of N documents makes the same 7 Elasticsearch requests whatever N
/// (the id check, one `_mget`, the log's create, commit and finish, two `_bulk`s) and 2
/// ZooKeeper requests on quiet documents (the locks' fast paths in one multi, one release of
/// all), N guarded writes 2N
/// of each (a read and a write; an acquisition and a release each), a plain `_bulk` one
/// Elasticsearch request and none to ZooKeeper.
#[test]
fn txn_benchmark_counts_the_requests_of_each_way() {
    let out = zkguard(&[
        "--txn",
        "--local",
        "--json",
        "--iterations",
        "10",
        "--warmup",
        "2",
        "--sizes",
        "3,1",
    ]);
    assert!(
        out.status.success(),
        "exit {:?}; stderr:\n{}",
        out.status,
        text(&out.stderr)
    );
    let report: Value = serde_json::from_str(text(&out.stdout).trim()).expect("one JSON object");
    let obj = report.as_object().expect("an object");
    assert!(obj.values().all(|v| !v.is_object()), "flat: {report}");
    assert_eq!(report["sizes"], serde_json::json!([1, 3]), "{report}");
    assert_eq!(report["iterations"], 10, "{report}");
    let num = |key: String| {
        report[&key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} is not a number: {report}"))
    };
    for n in [1_u32, 3] {
        let nf = f64::from(n);
        for way in ["txn", "guarded", "bulk"] {
            let key = |figure: &str| format!("{way}_n{n}_{figure}");
            assert_eq!(num(key("ops")), 10.0, "{report}");
            let (p50, p99) = (num(key("p50_ms")), num(key("p99_ms")));
            assert!(0.0 < p50 && p50 <= p99, "{way} n={n}: p50 {p50}, p99 {p99}");
        }
        assert_eq!(num(format!("txn_n{n}_es_requests")), 7.0, "{report}");
        assert_eq!(num(format!("txn_n{n}_es_mget")), 1.0, "{report}");
        assert_eq!(num(format!("txn_n{n}_es_bulk")), 2.0, "{report}");
        assert_eq!(
            num(format!("guarded_n{n}_es_requests")),
            2.0 * nf,
            "{report}"
        );
        assert_eq!(num(format!("bulk_n{n}_es_requests")), 1.0, "{report}");
        // ZooKeeper's counter also counts the session's pings, sent after 750 ms without a
        // request (the default session timeout of 5 s): what the protocol sends, plus at most
        // one ping per 750 ms of the series (a busy machine stretches the series). A release
        // is answered after its operation returned: the last one of a series may be counted
        // in the next (one request of ten operations either way). A lock held longer than
        // 100 ms (a slow transaction on a busy machine) also reads its mutex once, to watch it
        // (`MUTEX_WATCH_AFTER`): at most one more request per operation that holds a lock.
        let zk = |way: &str, want: f64| {
            let got = num(format!("{way}_n{n}_zk_requests"));
            let pings = (num(format!("{way}_n{n}_secs")) / 0.75).floor() + 1.0;
            let watches = if want > 0.0 { 1.0 } else { 0.0 };
            let (least, most) = (want - 0.11, want + 0.11 + pings / 10.0 + watches);
            assert!(
                least <= got && got <= most,
                "{way}_n{n}_zk_requests = {got}, expected {want} plus at most {pings} pings \
                 and {watches} mutex read per operation, over 10 operations: {report}"
            );
        };
        zk("txn", 2.0);
        zk("guarded", 2.0 * nf);
        zk("bulk", 0.0);
        assert!(num(format!("txn_over_guarded_n{n}_p50")) > 0.0, "{report}");
    }
    // A size above txn.max.operations is refused before any server is started.
    let bad = crate::cli::zkguard()
        .args(["bench", "--txn", "--sizes", "2,5"])
        .env_remove("ZKGUARD_CONFIG")
        .env("ZKGUARD_TXN_MAX_OPERATIONS", "4")
        .output()
        .expect("run zkguard");
    assert_eq!(bad.status.code(), Some(64), "{}", text(&bad.stderr));
    assert!(
        text(&bad.stderr).contains("txn.max.operations"),
        "{}",
        text(&bad.stderr)
    );
}

/// `zkguard bench --scale --local --json` with tiny levels: every figure of every level is
/// there, a bulk job's operation and a write cost ZooKeeper requests, each new monitor leaves
/// about one empty container behind, and bad levels are refused with 64 before any server
/// starts.
#[test]
fn scale_benchmark_reports_every_level() {
    let out = zkguard(&[
        "--scale",
        "--local",
        "--json",
        "--scale-monitors",
        "500,50",
        "--scale-clients",
        "2,8",
        "--scale-instances",
        "2,1",
        "--scale-writes",
        "40",
        "--warmup",
        "0",
    ]);
    assert!(
        out.status.success(),
        "exit {:?}; stderr:\n{}",
        out.status,
        text(&out.stderr)
    );
    let report: Value = serde_json::from_str(text(&out.stdout).trim()).expect("one JSON object");
    let obj = report.as_object().expect("an object");
    assert!(obj.values().all(|v| !v.is_object()), "flat: {report}");
    assert_eq!(
        report["monitor_levels"],
        serde_json::json!([50, 500]),
        "{report}"
    );
    assert_eq!(
        report["client_levels"],
        serde_json::json!([2, 8]),
        "{report}"
    );
    assert_eq!(report["warmup_runs"], 0, "{report}");
    let num = |key: &str| {
        report[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} is not a number: {report}"))
    };
    for n in [50, 500] {
        let key = |figure: &str| format!("monitors_n{n}_{figure}");
        for figure in [
            "seconds",
            "ops_per_sec",
            "zk_requests_per_op",
            "zk_cpu_ms_per_op",
            "client_cpu_ms_per_op",
            "rss_growth_mb",
            "znodes_left",
            "containers_left",
        ] {
            num(&key(figure));
        }
        assert!(num(&key("ops_per_sec")) > 0.0, "{report}");
        let requests = num(&key("zk_requests_per_op"));
        assert!(
            requests > 0.0 && requests < 5.0,
            "{n}: {requests}: {report}"
        );
        // One empty monitor container per new monitor, until the container reaper runs.
        let left = num(&key("znodes_left"));
        let n = f64::from(n);
        assert!(
            (0.9 * n..=1.1 * n + 2.0).contains(&left),
            "znodes left {left} for {n} monitors: {report}"
        );
        assert_eq!(num(&key("containers_left")), n, "{report}");
    }
    assert!(num("monitors_n500_ops_per_sec_growth") > 0.0, "{report}");
    for c in [2, 8] {
        let key = |figure: &str| format!("clients_n{c}_{figure}");
        assert_eq!(num(&key("writes")), 40.0, "{report}");
        assert_eq!(num(&key("ok")), 40.0, "{report}");
        assert_eq!(num(&key("failed")), 0.0, "{report}");
        assert_eq!(report[key("limits")], "", "{report}");
        let (p50, p99) = (num(&key("p50_ms")), num(&key("p99_ms")));
        assert!(0.0 < p50 && p50 <= p99, "{c}: p50 {p50}, p99 {p99}");
        for figure in [
            "writes_per_sec",
            "zk_requests_per_write",
            "service_rss_mb",
            "service_fds",
        ] {
            assert!(num(&key(figure)) > 0.0, "{c} {figure}: {report}");
        }
        num(&key("zk_cpu_ms_per_write"));
        num(&key("service_cpu_ms_per_write"));
    }
    assert!(num("clients_n8_p50_ms_growth") > 0.0, "{report}");
    // The instances dimension: 100 clients over 1 and 2 services, at least one write each.
    assert_eq!(
        report["instance_levels"],
        serde_json::json!([1, 2]),
        "{report}"
    );
    for k in [1, 2] {
        let key = |figure: &str| format!("instances_n{k}_{figure}");
        assert_eq!(num(&key("writes")), 100.0, "{report}");
        assert_eq!(num(&key("ok")), 100.0, "{report}");
        for figure in ["zk_requests_per_write", "service_rss_mb", "service_fds"] {
            assert!(num(&key(figure)) > 0.0, "{k} {figure}: {report}");
        }
    }
    for args in [
        &["--scale", "--scale-monitors", "0"][..],
        &["--scale", "--scale-clients", "10,0"],
        &["--scale", "--scale-clients", "100000"],
        &["--scale", "--scale-monitors", "x"],
        &["--scale", "--scale-writes", "0"],
        &["--scale", "--scale-instances", "17"],
        &["--scale-monitors", "10"],
        &["--scale", "--txn"],
    ] {
        let bad = zkguard(args);
        assert_eq!(
            bad.status.code(),
            Some(64),
            "{args:?}: {}",
            text(&bad.stderr)
        );
        assert!(bad.stdout.is_empty(), "{args:?}");
    }
}
