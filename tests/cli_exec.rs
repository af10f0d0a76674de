//! `zkguard exec` and `zkguard locks` as users script them: exit statuses, environment,
//! mutual exclusion between processes, killed and stopped holders.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use common::*;
use zkguard::testkit::ZkServer;

fn shared() -> &'static ZkServer {
    static SERVER: OnceLock<ZkServer> = OnceLock::new();
    SERVER.get_or_init(zk_server)
}

/// A `zkguard` command configured for `servers` and a lock root of its own.
fn zkguard(servers: &str, root: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_zkguard"));
    c.env("ZKGUARD_ZOOKEEPER_SERVERS", servers)
        .env("ZKGUARD_ZOOKEEPER_LOCK_ROOT", root)
        .env("ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT", "2000")
        .env("ZKGUARD_ZOOKEEPER_CONNECTION_RETRY", "2")
        .env("ZKGUARD_ZOOKEEPER_CONNECTION_DELAY", "100")
        .env("ZKGUARD_ZOOKEEPER_FOREGROUND_TASK_TIMEOUT", "30000")
        .env_remove("ZKGUARD_CONFIG")
        .env_remove("RUST_LOG");
    c
}

fn root(tag: &str) -> String {
    format!("/zkguard-cli/{tag}-{}", uuid_tag())
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

async fn wait_for_file(path: &Path, limit: Duration) {
    eventually(limit, &format!("{} exists", path.display()), || async {
        path.exists()
    })
    .await;
}

#[test]
fn exit_status_and_environment_are_passed_through() {
    let zk = shared();
    let r = root("env");
    let o = zkguard(&zk.connect_string(), &r)
        .args(["exec", "--monitor", "m1", "--type", "background", "--", "sh", "-c"])
        .arg(r#"test -n "$ZKGUARD_FENCING_TOKEN" && test "$ZKGUARD_MONITOR" = m1 && test "$ZKGUARD_LOCK_TYPE" = background && exit 7"#)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(7), "{}", stderr(&o));
}

#[test]
fn bad_usage_bad_monitor_bad_config() {
    let zk = shared();
    let r = root("bad");
    // Missing --monitor: usage error.
    let o = zkguard(&zk.connect_string(), &r)
        .args(["exec", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    // Invalid monitor name.
    let o = zkguard(&zk.connect_string(), &r)
        .args(["exec", "--monitor", "a/b", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("invalid monitor object name"),
        "{}",
        stderr(&o)
    );
    // A wrong value in the properties file names key, value and file.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.properties");
    std::fs::write(&file, "zookeeper.session.timeout=abc\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_zkguard"))
        .arg("--config")
        .arg(&file)
        .args(["exec", "--monitor", "m", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(78));
    let err = stderr(&o);
    assert!(
        err.contains("zookeeper.session.timeout")
            && err.contains("abc")
            && err.contains("bad.properties"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    // A wrong value in the environment names the variable.
    let o = zkguard(&zk.connect_string(), &r)
        .env("ZKGUARD_ZOOKEEPER_CONNECTION_RETRY", "many")
        .args(["exec", "--monitor", "m", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(78));
    assert!(
        stderr(&o).contains("ZKGUARD_ZOOKEEPER_CONNECTION_RETRY"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn unreachable_zookeeper_exits_69() {
    let port = zkguard::testkit::free_port().unwrap();
    let o = zkguard(&format!("127.0.0.1:{port}"), "/x")
        .args(["exec", "--monitor", "m", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(69), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("127.0.0.1:{port}")),
        "{}",
        stderr(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_timeout_exits_75_and_locks_shows_holder_and_queue() {
    let zk = shared();
    let r = root("timeout");
    let mut settings = zk_settings(&zk.connect_string(), "unused");
    settings.lock_root = r.clone();
    let s = session(&settings).await;
    let g = zkguard::ZkBlockingWriteLock::new("Save Content", &s, "article-1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();

    // A queued background waiter, visible in `zkguard locks`.
    let mut waiter = zkguard(&zk.connect_string(), &r)
        .args([
            "exec",
            "--monitor",
            "article-1",
            "--type",
            "background",
            "--info",
            "Bulk Propagation",
            "--timeout",
            "20s",
            "--",
            "true",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let servers = zk.connect_string();
    eventually(Duration::from_secs(10), "waiter queued", || async {
        children(&servers, &format!("{r}/article-1"))
            .await
            .iter()
            .any(|c| c.starts_with("B-"))
    })
    .await;
    let o = zkguard(&servers, &r)
        .args(["locks", "--json"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let m = &v[0];
    assert_eq!(m["monitor"], "article-1");
    assert_eq!(m["holder"]["info"], "Save Content");
    assert_eq!(m["token"].as_u64(), Some(g.fencing_token()));
    assert_eq!(m["queue"][0]["class"], "A");
    assert_eq!(m["queue"][1]["class"], "B");
    assert_eq!(m["queue"][1]["info"], "Bulk Propagation");
    let table = zkguard(&servers, &r).args(["locks"]).output().unwrap();
    assert!(String::from_utf8_lossy(&table.stdout).contains("[holder]"));

    let o = zkguard(&servers, &r)
        .args([
            "exec",
            "--monitor",
            "article-1",
            "--timeout",
            "300ms",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    assert!(stderr(&o).contains("not acquired within"), "{}", stderr(&o));

    g.unlock().await.unwrap();
    assert!(waiter.wait().unwrap().success());
}

#[test]
fn processes_exclude_each_other_and_tokens_increase() {
    let zk = shared();
    let r = root("mutex");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    // The critical section checks exclusion itself: mkdir fails if someone else is inside.
    let script = format!(
        r#"mkdir {d}/inside || exit 99; echo "$ZKGUARD_FENCING_TOKEN" >> {d}/tokens; sleep 0.02; rmdir {d}/inside"#
    );
    let servers = zk.connect_string();
    let workers: Vec<_> = (0..6)
        .map(|i| {
            let (servers, r, script) = (servers.clone(), r.clone(), script.clone());
            std::thread::spawn(move || {
                for _ in 0..3 {
                    let kind = if i % 2 == 0 {
                        "foreground"
                    } else {
                        "background"
                    };
                    let o = zkguard(&servers, &r)
                        .env("ZKGUARD_ZOOKEEPER_BACKGROUND_TASK_TIMEOUT", "30000")
                        .args([
                            "exec",
                            "--monitor",
                            "shared",
                            "--type",
                            kind,
                            "--",
                            "sh",
                            "-c",
                            &script,
                        ])
                        .output()
                        .unwrap();
                    assert_eq!(o.status.code(), Some(0), "worker {i}: {}", stderr(&o));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let tokens: Vec<u64> = std::fs::read_to_string(dir.path().join("tokens"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(tokens.len(), 18);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens in critical-section order: {tokens:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_is_replaced_within_the_session_timeout() {
    let zk = shared();
    let r = root("sigkill");
    let dir = tempfile::tempdir().unwrap();
    let held = dir.path().join("held");
    let mut holder = zkguard(&zk.connect_string(), &r)
        .args(["exec", "--monitor", "m", "--", "sh", "-c"])
        .arg(format!(
            "echo $$ > {d}/pid; touch {}; exec sleep 30",
            held.display(),
            d = dir.path().display()
        ))
        .spawn()
        .unwrap();
    wait_for_file(&held, Duration::from_secs(10)).await;
    holder.kill().unwrap(); // SIGKILL: no release, the session must expire
    holder.wait().unwrap();
    // Session timeout 2 s; the next holder must get the lock within it plus a margin.
    let o = zkguard(&zk.connect_string(), &r)
        .args(["exec", "--monitor", "m", "--timeout", "5s", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The orphaned command (its zkguard was killed) is ours to stop.
    let pid: i32 = std::fs::read_to_string(dir.path().join("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_holder_loses_the_lock_and_its_command_is_terminated() {
    let zk = shared();
    let r = root("sigstop");
    let dir = tempfile::tempdir().unwrap();
    let (held, term) = (dir.path().join("held"), dir.path().join("term"));
    let script = format!(
        r#"trap 'touch {t}; exit 143' TERM; touch {h}; while true; do sleep 0.05; done"#,
        t = term.display(),
        h = held.display()
    );
    let holder = zkguard(&zk.connect_string(), &r)
        .args([
            "exec",
            "--monitor",
            "m",
            "--kill-after",
            "5s",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_file(&held, Duration::from_secs(10)).await;
    let pid = nix::unistd::Pid::from_raw(holder.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // While it is stopped its session expires and someone else gets the lock.
    let o = zkguard(&zk.connect_string(), &r)
        .args(["exec", "--monitor", "m", "--timeout", "10s", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let out = holder.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(err.contains("lost"), "{err}");
    assert!(term.exists(), "the command got SIGTERM");
}
