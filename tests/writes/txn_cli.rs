//! `zkguard txn` end to end: the built binary against a real `osmem-server`.

use std::io::Write;

use zkguard::testkit::OsmemServer;

struct Cli {
    url: String,
    config: tempfile::NamedTempFile,
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Cli {
    fn new(url: &str) -> Self {
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let mut config = tempfile::Builder::new()
            .suffix(".properties")
            .tempfile()
            .unwrap();
        writeln!(
            config,
            "txn.accounts.index=cli-acc-{suffix}\ntxn.transactions.index=cli-txn-{suffix}\ntxn.recovery.after=0\n"
        )
        .unwrap();
        Self {
            url: url.to_string(),
            config,
        }
    }

    fn run_with_url(&self, url: &str, args: &[&str]) -> Run {
        let out = crate::cli::zkguard()
            .arg("--config")
            .arg(self.config.path())
            .arg("txn")
            .args(args)
            .env("ZKGUARD_ELASTICSEARCH_URL", url)
            .env_remove("RUST_LOG")
            .env_remove("ZKGUARD_CONFIG")
            .output()
            .expect("run zkguard");
        Run {
            code: out.status.code().expect("exit status"),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    fn run(&self, args: &[&str]) -> Run {
        self.run_with_url(&self.url, args)
    }

    /// Runs and checks the status; on a failure status, also that stderr is one clear line.
    fn expect(&self, args: &[&str], code: i32, needle: &str) -> Run {
        let r = self.run(args);
        let text = if code == 0 { &r.stdout } else { &r.stderr };
        assert_eq!(
            r.code, code,
            "zkguard txn {args:?}\nstdout: {}\nstderr: {}",
            r.stdout, r.stderr
        );
        assert!(
            text.contains(needle),
            "zkguard txn {args:?}: {needle:?} not in {text:?}"
        );
        if code != 0 && code != 64 {
            assert_eq!(
                r.stderr.lines().count(),
                1,
                "one line expected on stderr: {:?}",
                r.stderr
            );
        }
        r
    }
}

#[test]
fn init_transfer_recover_and_audit_through_the_binary() {
    let server = OsmemServer::start().expect("start osmem-server (run scripts/install-deps.sh)");
    let cli = Cli::new(server.url());

    cli.expect(
        &["init", "--accounts", "A=500,B=500"],
        0,
        "account B: created with 500",
    );
    cli.expect(
        &["init", "--accounts", "A=500"],
        0,
        "already exists with 500, unchanged",
    );
    cli.expect(
        &["init", "--accounts", "A=7"],
        65,
        "already exists with balance 500",
    );
    cli.expect(
        &[
            "transfer", "--from", "A", "--to", "B", "--amount", "100", "--id", "t1",
        ],
        0,
        "transaction t1: finished",
    );
    cli.expect(
        &[
            "transfer", "--from", "A", "--to", "B", "--amount", "100", "--id", "t1",
        ],
        0,
        "transaction t1: finished",
    );

    // Bad input: one line, status 65 (or 64 for what the parser refuses).
    cli.expect(
        &[
            "transfer", "--from", "A", "--to", "B", "--amount", "101", "--id", "t1",
        ],
        65,
        "already used",
    );
    cli.expect(
        &["transfer", "--from", "A", "--to", "B", "--amount", "0"],
        65,
        "must be positive",
    );
    cli.expect(
        &["transfer", "--from", "A", "--to", "B", "--amount", "-3"],
        65,
        "must be positive, got -3",
    );
    cli.expect(
        &["transfer", "--from", "A", "--to", "A", "--amount", "1"],
        65,
        "same account `A`",
    );
    cli.expect(
        &["transfer", "--from", "A", "--to", "Q", "--amount", "1"],
        65,
        "unknown account `Q`",
    );
    cli.expect(
        &["transfer", "--from", "A", "--to", "B", "--amount", "401"],
        65,
        "fewer than the 401",
    );
    cli.expect(
        &[
            "transfer", "--from", "A", "--to", "B", "--amount", "1", "--id", "a/b",
        ],
        65,
        "invalid transaction id",
    );
    cli.expect(
        &["transfer", "--from", "A", "--to", "B", "--amount", "lots"],
        64,
        "invalid value 'lots'",
    );
    cli.expect(&["init", "--accounts", "A500"], 64, "ID=BALANCE");
    cli.expect(&["show", "nope"], 65, "no transaction `nope`");
    cli.expect(&["rollback", "t1"], 65, "never rolled back");

    // A crash after the destination was applied, seen by the audit, finished by recovery.
    cli.expect(
        &[
            "transfer",
            "--from",
            "B",
            "--to",
            "A",
            "--amount",
            "30",
            "--id",
            "t2",
            "--crash-after",
            "apply-destination",
        ],
        75,
        "stopped after step apply-destination",
    );
    let audit = cli.expect(&["audit", "--json"], 0, "\"pending\"");
    let audit: serde_json::Value = serde_json::from_str(&audit.stdout).unwrap();
    assert_eq!(audit["transactions"]["pending"], 1);
    assert_eq!(audit["pending"]["A"], serde_json::json!(["t2"]));
    assert_eq!(audit["pending"]["B"], serde_json::json!(["t2"]));
    cli.expect(&["audit"], 0, "pending ids:\n  A: t2\n  B: t2");
    cli.expect(&["recover", "--once"], 0, "examined 1, finished 1");
    let shown = cli.expect(
        &["show", "t2", "--json"],
        0,
        "\"transaction_state\": \"finished\"",
    );
    let shown: serde_json::Value = serde_json::from_str(&shown.stdout).unwrap();
    assert_eq!(shown["amount"], 30);

    let audit = cli.expect(
        &["audit", "--json", "--expect-total", "1000"],
        0,
        "\"total_balance\": 1000",
    );
    let audit: serde_json::Value = serde_json::from_str(&audit.stdout).unwrap();
    assert_eq!(audit["transactions"]["finished"], 2);
    assert_eq!(audit["pending"], serde_json::json!({}));
    assert_eq!(audit["anomalies"], serde_json::json!([]));
    cli.expect(&["audit", "--expect-total", "999"], 1, "expected 999");
    cli.expect(&["show", "t1"], 0, "state:        finished");

    // Elasticsearch unreachable: 69.
    let r = cli.run_with_url("http://127.0.0.1:1", &["audit"]);
    assert_eq!(r.code, 69, "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("cannot reach Elasticsearch"),
        "{}",
        r.stderr
    );
}

/// `txn recover` (without `--once`) stops on SIGTERM as on Ctrl-C: exit 0, every transaction
/// left at a step boundary, so the audit finds nothing half-done.
#[test]
fn recover_stops_cleanly_on_sigterm() {
    use std::io::BufRead;
    use std::process::Stdio;

    let server = OsmemServer::start().expect("start osmem-server (run scripts/install-deps.sh)");
    let cli = Cli::new(server.url());
    cli.expect(&["init", "--accounts", "A=500,B=500"], 0, "created");
    for (i, step) in ["mark-pending", "apply-source", "mark-committed"]
        .iter()
        .enumerate()
    {
        let id = format!("s{i}");
        cli.expect(
            &[
                "transfer",
                "--from",
                "A",
                "--to",
                "B",
                "--amount",
                "10",
                "--id",
                &id,
                "--crash-after",
                step,
            ],
            75,
            "stopped after step",
        );
    }

    let mut child = crate::cli::zkguard()
        .arg("--config")
        .arg(cli.config.path())
        .args(["txn", "recover", "--interval", "1h"])
        .env("ZKGUARD_ELASTICSEARCH_URL", &cli.url)
        .env_remove("RUST_LOG")
        .env_remove("ZKGUARD_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run zkguard txn recover");
    // The first report is printed after the signal handlers are in place.
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.contains("recovery: examined 3"), "{line:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let audit = cli.expect(
        &["audit", "--json", "--expect-total", "1000"],
        0,
        "\"total_balance\": 1000",
    );
    let audit: serde_json::Value = serde_json::from_str(&audit.stdout).unwrap();
    assert_eq!(audit["pending"], serde_json::json!({}));
    assert_eq!(audit["anomalies"], serde_json::json!([]));
}

/// `txn init --json`: one JSON object naming the indices and each account's outcome; errors as
/// `{"error", "message"}` on stderr.
#[test]
fn init_reports_as_json() {
    let server = OsmemServer::start().expect("start osmem-server (run scripts/install-deps.sh)");
    let cli = Cli::new(server.url());
    let r = cli.expect(&["init", "--accounts", "A=5", "--json"], 0, "\"accounts\"");
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert!(v["accounts_index"]
        .as_str()
        .unwrap()
        .starts_with("cli-acc-"));
    assert!(v["transactions_index"]
        .as_str()
        .unwrap()
        .starts_with("cli-txn-"));
    assert_eq!(
        v["accounts"],
        serde_json::json!([{"id": "A", "balance": 5, "result": "created"}])
    );
    let r = cli.expect(
        &["init", "--accounts", "A=5,B=1", "--json"],
        0,
        "\"accounts\"",
    );
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(
        v["accounts"],
        serde_json::json!([
            {"id": "A", "balance": 5, "result": "unchanged"},
            {"id": "B", "balance": 1, "result": "created"}
        ])
    );
    let r = cli.expect(&["init", "--accounts", "A=7", "--json"], 65, "\"error\"");
    let e: serde_json::Value = serde_json::from_str(&r.stderr).unwrap();
    assert_eq!(e["error"], "data");
    assert!(e["message"].as_str().unwrap().contains("already exists"));
    let r = cli.run_with_url("http://127.0.0.1:1", &["audit", "--json"]);
    assert_eq!(r.code, 69);
    let e: serde_json::Value = serde_json::from_str(&r.stderr).unwrap();
    assert_eq!(e["error"], "unavailable");
}
