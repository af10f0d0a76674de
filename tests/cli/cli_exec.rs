//! `zkguard exec` and `zkguard locks` as users script them: exit statuses, environment,
//! mutual exclusion between processes, killed and stopped holders.

use crate::common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::process::alive;
use common::*;
use zkguard::testkit::ZkServer;

fn shared() -> &'static ZkServer {
    static SERVER: OnceLock<ZkServer> = OnceLock::new();
    SERVER.get_or_init(zk_server)
}

/// A `zkguard` command configured for `servers` and a lock root of its own.
fn zkguard(servers: &str, root: &str) -> Command {
    let mut c = crate::cli::zkguard();
    c.env("ZKGUARD_ZOOKEEPER_SERVERS", servers)
        .env("ZKGUARD_ZOOKEEPER_LOCK_ROOT", root)
        .env("ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT", "2000")
        .env("ZKGUARD_ZOOKEEPER_CONNECTION_RETRY", "2")
        .env("ZKGUARD_ZOOKEEPER_CONNECTION_DELAY", "100")
        .env("ZKGUARD_ZOOKEEPER_FOREGROUND_TASK_TIMEOUT", "30000")
        .env_remove("ZKGUARD_CONFIG")
        .env_remove("RUST_LOG")
        // Not a terminal, whoever runs the tests: the command gets a process group of its own.
        .stdin(Stdio::null());
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

/// The pid written to `path` by a command.
fn read_pid(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

async fn wait_until_dead(pid: i32, what: &str) {
    eventually(
        Duration::from_secs(10),
        &format!("{what} (pid {pid}) gone"),
        || async { !alive(pid) },
    )
    .await;
}

/// Kills, when dropped (also when an assertion failed), the processes a test may leave behind.
#[derive(Default)]
struct Reap(Vec<i32>);

impl Drop for Reap {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
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

/// The command gets the cluster's URL as `ZKGUARD_EXEC_ELASTICSEARCH_URL`: the first of
/// `elasticsearch.url`, ready for `"$ZKGUARD_EXEC_ELASTICSEARCH_URL/index/_doc/id"` (no trailing
/// `/`), and without the credentials the URL carried.
#[test]
fn the_command_gets_the_clusters_url_without_credentials() {
    let zk = shared();
    let r = root("es-url");
    let o = zkguard(&zk.connect_string(), &r)
        .env(
            "ZKGUARD_ELASTICSEARCH_URL",
            "http://writer:s3cret@127.0.0.1:1/es/,http://127.0.0.1:2",
        )
        .args(["exec", "--monitor", "m1", "--", "sh", "-c"])
        .arg(r#"printf '%s' "$ZKGUARD_EXEC_ELASTICSEARCH_URL""#)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "http://127.0.0.1:1/es");
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
    // A lock info over 1024 bytes: usage error naming the option and the limit; 1024 is taken.
    let long = "i".repeat(1025);
    let o = zkguard(&zk.connect_string(), &r)
        .args(["exec", "--monitor", "m", "--info", &long, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("--info") && err.contains("1025 bytes") && err.contains("1024"),
        "{err}"
    );
    let o = zkguard(&zk.connect_string(), &r)
        .args(["exec", "--monitor", "m", "--info", &long[1..], "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // A wrong value in the properties file names key, value and file.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.properties");
    std::fs::write(&file, "zookeeper.session.timeout=abc\n").unwrap();
    let o = crate::cli::zkguard()
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

/// `--timeout` bounds connecting too: with ZooKeeper down, `exec --timeout 1s` fails by the
/// timeout plus `DEADLINE_OVERRUN` (exit 69, naming the servers), however many connection
/// attempts `zookeeper.connection.retry` allows.
#[test]
fn unreachable_zookeeper_fails_by_the_timeout() {
    let port = zkguard::testkit::free_port().unwrap();
    let started = std::time::Instant::now();
    let o = zkguard(&format!("127.0.0.1:{port}"), "/x")
        .env("ZKGUARD_ZOOKEEPER_CONNECTION_RETRY", "30")
        .env("ZKGUARD_ZOOKEEPER_CONNECTION_DELAY", "1000")
        .args(["exec", "--monitor", "m", "--timeout", "1s", "--", "true"])
        .output()
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(o.status.code(), Some(69), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("127.0.0.1:{port}")),
        "{}",
        stderr(&o)
    );
    let bound = Duration::from_secs(1) + zkguard::zk::DEADLINE_OVERRUN;
    assert!(
        waited < bound + Duration::from_secs(2),
        "failed after {waited:?}, past the timeout and its overrun ({bound:?}): {}",
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
    let (held, pidfile) = (dir.path().join("held"), dir.path().join("pid"));
    let mut holder = zkguard(&zk.connect_string(), &r)
        .args(["exec", "--monitor", "m", "--", "sh", "-c"])
        .arg(format!(
            "echo $$ > {}; touch {}; exec sleep 30",
            pidfile.display(),
            held.display(),
        ))
        .spawn()
        .unwrap();
    wait_for_file(&held, Duration::from_secs(10)).await;
    let command = read_pid(&pidfile);
    let _reap = Reap(vec![command]);
    holder.kill().unwrap(); // SIGKILL: no release, the session must expire
    holder.wait().unwrap();
    // The command died with its zkguard: it cannot run beside the next holder's command.
    wait_until_dead(command, "the killed holder's command").await;
    // Session timeout 2 s; the next holder must get the lock within it plus a margin.
    let o = zkguard(&zk.connect_string(), &r)
        .args(["exec", "--monitor", "m", "--timeout", "5s", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// `zkguard exec` killed with SIGKILL takes its command along (Linux parent-death signal), also
/// when the command is a shell waiting for a child of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_dies_with_a_killed_zkguard() {
    let zk = shared();
    let dir = tempfile::tempdir().unwrap();
    for (name, script) in [
        ("exec", "echo $$ > {pid}; exec sleep 1000"),
        (
            "shell",
            "sleep 1000 > /dev/null 2>&1 & echo $! > {child}; echo $$ > {pid}; wait",
        ),
    ] {
        let (pidfile, childfile) = (
            dir.path().join(format!("{name}.pid")),
            dir.path().join(format!("{name}.child")),
        );
        let script = script
            .replace("{pid}", &pidfile.display().to_string())
            .replace("{child}", &childfile.display().to_string());
        let mut holder = zkguard(&zk.connect_string(), &root("pdeath"))
            .args(["exec", "--monitor", "m", "--", "sh", "-c", &script])
            .spawn()
            .unwrap();
        wait_for_file(&pidfile, Duration::from_secs(10)).await;
        eventually(Duration::from_secs(10), "the pid is written", || async {
            std::fs::read_to_string(&pidfile).is_ok_and(|t| t.ends_with('\n'))
        })
        .await;
        let command = read_pid(&pidfile);
        let mut reap = Reap(vec![command]);
        // A process the command started is not covered by the parent-death signal (see the
        // README): the test cleans it up.
        if childfile.exists() {
            reap.0.push(read_pid(&childfile));
        }
        assert!(alive(command));
        holder.kill().unwrap();
        holder.wait().unwrap();
        wait_until_dead(command, &format!("{name}: the command")).await;
    }
}

/// Signals zkguard passes on reach the command's whole process group: a shell's background
/// child gets SIGTERM too and does not outlive zkguard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_sigterm_reaches_the_commands_children() {
    let zk = shared();
    let dir = tempfile::tempdir().unwrap();
    let (pidfile, childfile) = (dir.path().join("pid"), dir.path().join("child"));
    let holder = zkguard(&zk.connect_string(), &root("group"))
        .args(["exec", "--monitor", "m", "--", "sh", "-c"])
        .arg(format!(
            "sleep 1000 > /dev/null 2>&1 & echo $! > {c}; echo $$ > {p}.tmp; mv {p}.tmp {p}; wait",
            c = childfile.display(),
            p = pidfile.display()
        ))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_file(&pidfile, Duration::from_secs(10)).await;
    let (command, child) = (read_pid(&pidfile), read_pid(&childfile));
    let _reap = Reap(vec![command, child]);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(holder.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = holder.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(128 + 15),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!alive(command), "the shell got SIGTERM");
    wait_until_dead(child, "the shell's background child").await;
}

/// A background job the command leaves behind when it exits is killed before the lock is
/// released: nothing started under the lock runs on without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_jobs_left_by_the_command_are_killed_before_release() {
    let zk = shared();
    let dir = tempfile::tempdir().unwrap();
    let childfile = dir.path().join("child");
    let o = zkguard(&zk.connect_string(), &root("leftover"))
        .args(["exec", "--monitor", "m", "--", "sh", "-c"])
        .arg(format!(
            "sleep 1000 > /dev/null 2>&1 & echo $! > {}; exit 3",
            childfile.display()
        ))
        .output()
        .unwrap();
    let child = read_pid(&childfile);
    let _reap = Reap(vec![child]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    wait_until_dead(child, "the command's background job").await;
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

#[tokio::test]
async fn a_panic_in_a_spawned_task_stops_zkguard_with_exit_70() {
    let zk = shared();
    let servers = zk.connect_string();
    let r = root("panic");
    // A debug-build test hook makes a spawned task panic while `exec` takes the lock and runs
    // its command; the runtime would swallow it and exit 0 after the command.
    let o = zkguard(&servers, &r)
        .env("ZKGUARD_TEST_HOOK_PANIC_IN_TASK", "1")
        .args(["exec", "--monitor", "m1", "--", "sleep", "5"])
        .output()
        .unwrap();
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(70), "{e}");
    assert!(
        e.contains("zkguard: internal error: panic")
            && e.contains("ZKGUARD_TEST_HOOK_PANIC_IN_TASK"),
        "{e}"
    );
    // It closed its session before exiting: nothing of it is left in the lock tree.
    assert_eq!(
        children(&servers, &format!("{r}/m1")).await,
        Vec::<String>::new()
    );
    // A panic of the command's own task ends the same way (not with Rust's 101).
    let o = zkguard(&servers, &r)
        .env("ZKGUARD_TEST_HOOK_PANIC_IN_MAIN", "1")
        .args(["exec", "--monitor", "m1", "--", "true"])
        .output()
        .unwrap();
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(70), "{e}");
    assert!(e.contains("ZKGUARD_TEST_HOOK_PANIC_IN_MAIN"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_zero_tries_once() {
    let zk = shared();
    let servers = zk.connect_string();
    let r = root("tryonce");
    // Free: the command runs under the lock and its status comes back.
    let o = zkguard(&servers, &r)
        .args([
            "exec",
            "--monitor",
            "t1",
            "--timeout",
            "0",
            "--",
            "sh",
            "-c",
        ])
        .arg(r#"test -n "$ZKGUARD_FENCING_TOKEN" && exit 3"#)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    // Held: exit 75 at once, naming the holder; nothing of the try is left queued.
    let mut settings = zk_settings(&servers, "unused");
    settings.lock_root = r.clone();
    let holder = session(&settings).await;
    let g = zkguard::ZkBlockingWriteLock::new("Save Content", &holder, "t1")
        .unwrap()
        .lock_with_timeout()
        .await
        .unwrap();
    for lock_type in ["foreground", "background"] {
        let o = zkguard(&servers, &r)
            .args([
                "exec",
                "--monitor",
                "t1",
                "--type",
                lock_type,
                "--timeout",
                "0",
                "--",
                "true",
            ])
            .output()
            .unwrap();
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(75), "{e}");
        assert!(
            e.contains(&format!("held by {}", holder.owner_id())) && e.contains("Save Content"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
        // A deliberate try-once is not told to wait longer.
        assert!(e.contains("tried once") && !e.contains("raise"), "{e}");
        assert_eq!(children(&servers, &format!("{r}/t1")).await.len(), 2);
    }
    g.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_reports_a_stray_mutex_and_clears_it_on_request() {
    let zk = shared();
    let servers = zk.connect_string();
    let r = root("stray");
    let admin = zookeeper_client::Client::connect(&servers).await.unwrap();
    let mut path = String::new();
    for seg in format!("{r}/s1/privateLock")
        .trim_start_matches('/')
        .split('/')
    {
        path.push('/');
        path.push_str(seg);
        let mode = zookeeper_client::CreateMode::Persistent
            .with_acls(zookeeper_client::Acls::anyone_all());
        match admin.create(&path, &[], &mode).await {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
            Err(e) => panic!("create {path}: {e}"),
        }
    }
    let o = zkguard(&servers, &r)
        .args(["locks", "--json"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["monitor"], "s1");
    assert_eq!(v[0]["stray"], true);
    assert_eq!(v[0]["stray_session"], "0x0");
    assert!(v[0]["holder"].is_null() && v[0]["queue"].as_array().unwrap().is_empty());
    let o = zkguard(&servers, &r).args(["locks"]).output().unwrap();
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("STRAY") && table.contains("--clear-stray"),
        "{table}"
    );
    // Every contender is blocked, and told why.
    let o = zkguard(&servers, &r)
        .args([
            "exec",
            "--monitor",
            "s1",
            "--timeout",
            "100ms",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    assert!(stderr(&o).contains("stray mutex node"), "{}", stderr(&o));
    // Cleared on request; then the lock works.
    let o = zkguard(&servers, &r)
        .args(["locks", "--monitor", "s1", "--clear-stray"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("removed the stray mutex node"));
    let o = zkguard(&servers, &r)
        .args(["exec", "--monitor", "s1", "--timeout", "0", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // A live holder's mutex is refused.
    let dir = tempfile::tempdir().unwrap();
    let inside = dir.path().join("inside");
    let mut holder = zkguard(&servers, &r)
        .args(["exec", "--monitor", "s1", "--", "sh", "-c"])
        .arg(format!("touch {}; sleep 30", inside.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_file(&inside, Duration::from_secs(10)).await;
    let o = zkguard(&servers, &r)
        .args(["locks", "--monitor", "s1", "--clear-stray"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    assert!(stderr(&o).contains("live holder"), "{}", stderr(&o));
    assert!(children(&servers, &format!("{r}/s1"))
        .await
        .contains(&"privateLock".to_string()));
    // SIGTERM: zkguard passes it on to its command and releases.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(holder.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    holder.wait().unwrap();
}

/// `exec --json`: the command's stdout untouched, a final JSON line on stderr with token, wait
/// and hold times and the status; errors of zkguard itself as `{"error", "message"}`.
#[test]
fn json_reports_token_wait_and_hold_times() {
    let zk = shared();
    let r = root("json");
    let o = zkguard(&zk.connect_string(), &r)
        .args(["exec", "--json", "--monitor", "mj", "--", "sh", "-c"])
        .arg(r#"echo "out $ZKGUARD_FENCING_TOKEN"; exit 3"#)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let err = stderr(&o);
    let last: serde_json::Value =
        serde_json::from_str(err.lines().last().expect("a final line")).expect("JSON");
    let token = last["token"].as_u64().expect("a token");
    assert!(token > 0, "{last}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), format!("out {token}\n"));
    assert_eq!(last["monitor"], "mj");
    assert_eq!(last["lock_type"], "foreground");
    assert_eq!(last["backend"], "zookeeper");
    assert_eq!(last["status"], 3);
    assert_eq!(last["lock_lost"], false);
    assert!(last["wait_ms"].as_f64().unwrap() >= 0.0, "{last}");
    assert!(last["hold_ms"].as_f64().unwrap() > 0.0, "{last}");

    // Without --json: no such line.
    let o = zkguard(&zk.connect_string(), &r)
        .args(["exec", "--monitor", "mj", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stderr(&o), "");

    // zkguard's own errors: one JSON object on stderr.
    for (args, code, kind) in [
        (
            vec!["exec", "--json", "--monitor", "a/b", "--", "true"],
            64,
            "usage",
        ),
        (vec!["exec", "--json", "--", "true"], 64, "usage"),
        (
            vec!["exec", "--json", "--monitor", "m", "--", "/no/such/cmd"],
            127,
            "not_found",
        ),
    ] {
        let o = zkguard(&zk.connect_string(), &r)
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(code), "{args:?}: {}", stderr(&o));
        let e: serde_json::Value = serde_json::from_str(stderr(&o).trim())
            .unwrap_or_else(|_| panic!("{args:?}: not one JSON object: {}", stderr(&o)));
        assert_eq!(e["error"], kind, "{args:?}");
        if args.len() == 4 {
            // A missing option is named.
            assert!(e["message"].as_str().unwrap().contains("--monitor"), "{e}");
        }
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let closed = format!("127.0.0.1:{}", zkguard::testkit::free_port().unwrap());
    let o = zkguard(&closed, &r)
        .args(["exec", "--json", "--monitor", "m", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(69), "{}", stderr(&o));
    // The connection attempts are logged as JSON lines too; the error comes last.
    let lines: Vec<serde_json::Value> = stderr(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .collect();
    let e = lines.last().expect("an error line");
    assert_eq!(e["error"], "unavailable");
    assert!(e["message"].as_str().unwrap().contains("zookeeper.servers"));
}

/// A zkguard run by the command with a configuration of its own that names the other backend
/// is not refused: `exec` exports the held lock's backend as `ZKGUARD_EXEC_LOCK_BACKEND`, and
/// the deprecated `ZKGUARD_LOCK_BACKEND` it still exports does not override that file's
/// `lock.backend`.
#[test]
fn a_nested_zkguard_keeps_its_own_configuration() {
    let zk = shared();
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other.properties");
    std::fs::write(
        &other,
        "lock.backend=elasticsearch\nelasticsearch.url=http://127.0.0.1:9\n",
    )
    .unwrap();
    let zkguard_bin = env!("CARGO_BIN_EXE_zkguard");
    let o = zkguard(&zk.connect_string(), &root("nested"))
        .args(["exec", "--monitor", "outer", "--", "sh", "-c"])
        .arg(
            r#"test "$ZKGUARD_EXEC_LOCK_BACKEND" = zookeeper && test "$ZKGUARD_LOCK_BACKEND" = zookeeper || exit 9
               "$0" --config "$1" config check && "$0" --config "$1" config show --json"#,
        )
        .arg(zkguard_bin)
        .arg(&other)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let json = &stdout[stdout.find('[').expect("config show --json")..];
    let shown: Vec<serde_json::Value> = serde_json::from_str(json).unwrap();
    let backend = shown.iter().find(|v| v["key"] == "lock.backend").unwrap();
    assert_eq!(
        (&backend["value"], &backend["source"]),
        (&"elasticsearch".into(), &"file".into()),
        "{backend}"
    );
}
