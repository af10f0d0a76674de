//! `zkguard serve` under systemd: the unit in `deploy/systemd/` passes `systemd-analyze verify`,
//! and the service speaks `sd_notify` to a `NOTIFY_SOCKET` as `Type=notify` and `WatchdogSec=`
//! expect: `READY=1` once it listens (after the journal's replay), `WATCHDOG=1` at half the
//! watchdog interval, `STOPPING=1` when SIGTERM starts the shutdown.

use crate::serve_support;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serve_support::*;

/// The next notification, within `limit`.
fn next(socket: &UnixDatagram, limit: Duration) -> String {
    socket.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    let n = socket
        .recv(&mut buf)
        .unwrap_or_else(|e| panic!("no notification within {limit:?}: {e}"));
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn the_service_notifies_systemd_when_ready_alive_and_stopping() {
    let env = Env::new(&shared_zk().connect_string(), "systemd");
    let path = env.dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    let env = env
        .with("NOTIFY_SOCKET", path.to_str().unwrap())
        .with("WATCHDOG_USEC", "400000");
    let s = env.start("systemd");

    // Ready, once the start line is out (Env::start has read it).
    let ready = next(&socket, Duration::from_secs(5));
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready}");
    assert!(
        ready
            .lines()
            .any(|l| l == format!("MAINPID={}", s.child.id())),
        "{ready}"
    );
    assert!(ready.contains("STATUS=listening on 127.0.0.1:"), "{ready}");

    // The watchdog, every 200 ms (half of WATCHDOG_USEC): three pings well within a second.
    let started = Instant::now();
    for _ in 0..3 {
        assert_eq!(next(&socket, Duration::from_secs(2)), "WATCHDOG=1");
    }
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );

    // SIGTERM: stopping, then a clean exit.
    s.signal(Signal::SIGTERM);
    let stopping = loop {
        let m = next(&socket, Duration::from_secs(5));
        if m != "WATCHDOG=1" {
            break m;
        }
    };
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping}");
    let mut s = s;
    let status = s.child.wait().unwrap();
    assert!(status.success(), "{status}");
}

/// The unit as shipped, checked by systemd's own verifier (with the binary under test as its
/// `ExecStart`, since the verifier wants the executable to exist).
#[test]
fn the_systemd_unit_verifies() {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/systemd/zkguard.service"),
    )
    .unwrap();
    for wanted in [
        "Type=notify",
        "WatchdogSec=",
        "StateDirectory=zkguard",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
    ] {
        assert!(unit.contains(wanted), "the unit lacks {wanted}");
    }
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("zkguard.service");
    std::fs::write(
        &copy,
        unit.replace("/usr/local/bin/zkguard", env!("CARGO_BIN_EXE_zkguard")),
    )
    .unwrap();
    // The man page its Documentation= names, installed as the unit's comment says.
    let man1 = dir.path().join("man/man1");
    std::fs::create_dir_all(&man1).unwrap();
    let page = crate::cli::zkguard().arg("man").output().unwrap();
    assert!(page.status.success());
    std::fs::write(man1.join("zkguard.1"), page.stdout).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .env("SYSTEMD_LOG_LEVEL", "notice")
        .env("MANPATH", dir.path().join("man"))
        .output()
        .expect("systemd-analyze (Debian's systemd package)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "systemd-analyze verify: {said}");
    let about_unit: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("zkguard.service"))
        .collect();
    assert!(about_unit.is_empty(), "systemd-analyze verify: {said}");
}

/// The unit's secrets as systemd hands them over: each `LoadCredential=` file copied into a
/// credentials directory (`$CREDENTIALS_DIRECTORY`), each `Environment=` line with `%d` standing
/// for that directory. The service takes its bearer tokens from there: a request without a
/// token gets 401, one with the token 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_reads_its_tokens_from_the_credentials_the_unit_loads() {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/systemd/zkguard.service"),
    )
    .unwrap();
    let mut env = Env::new(&shared_zk().connect_string(), "credentials");
    let credentials = env.dir.path().join("credentials");
    std::fs::create_dir(&credentials).unwrap();
    let directory = credentials.to_str().unwrap().to_string();
    let token = "a-long-random-token-of-the-credentials-test";
    let mut loaded = Vec::new();
    for line in unit.lines() {
        if let Some(credential) = line.strip_prefix("LoadCredential=") {
            let (id, source) = credential.split_once(':').expect("ID:PATH");
            assert!(source.starts_with("/etc/zkguard/"), "{line}");
            std::fs::write(credentials.join(id), format!("{token}\n")).unwrap();
            loaded.push(id.to_string());
        } else if let Some(assignment) = line.strip_prefix("Environment=") {
            let (name, value) = assignment.split_once('=').expect("NAME=value");
            if value.contains("%d") {
                env = env.with(name, &value.replace("%d", &directory));
            }
        }
    }
    assert_eq!(loaded, ["tokens"]);
    let env = env.with("CREDENTIALS_DIRECTORY", &directory);
    let s = env.start("credentials");
    let c = client();
    let refused = c.get(s.url("/v1/locks")).send().await.unwrap();
    assert_eq!(refused.status(), reqwest::StatusCode::UNAUTHORIZED);
    let admitted = c
        .get(s.url("/v1/locks"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(admitted.status(), reqwest::StatusCode::OK);
}
