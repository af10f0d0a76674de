//! Contenders in processes of their own: `zkguard exec --json -- python3 writer.py`. The writer
//! runs under the lock with `ZKGUARD_FENCING_TOKEN`, appends one JSON line per event to a file
//! of its own (granted, each write sent and answered, done) with instants of the same monotonic
//! clock as this process, and sends its fenced writes to Elasticsearch itself. Once the
//! process is gone its lines, and what `zkguard exec` reported, go into the history.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use super::history::{Class, Ev, Ns, Outcome, Recorder};
use super::now;

/// The writer that `zkguard exec` runs.
const WRITER: &str = r#"
import json, os, time, urllib.error, urllib.request
granted = time.monotonic_ns()
out = open(os.environ["HISTORY_FILE"], "a", buffering=1)
def rec(**kw):
    out.write(json.dumps(kw) + "\n")
    out.flush()
token = int(os.environ["ZKGUARD_FENCING_TOKEN"])
doc = os.environ["ZKGUARD_MONITOR"]
rec(ev="held", pid=os.getpid(), token=token, at=granted)
url = "%s/%s/_doc/%s?version=%d&version_type=external_gte" % (
    os.environ["ES_URL"], os.environ["ES_INDEX"], doc, token)
writes = int(os.environ["WRITES"])
pause = int(os.environ["HOLD_MS"]) / 1000.0 / max(writes, 1)
for i in range(writes):
    body = json.dumps({"monitor": doc, "token": token, "writer": os.environ["WRITER"], "seq": i})
    req = urllib.request.Request(url, data=body.encode(), method="PUT",
                                 headers={"Content-Type": "application/json"})
    rec(ev="send", w=i, at=time.monotonic_ns())
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    except Exception:
        status = -1
    rec(ev="done", w=i, status=status, at=time.monotonic_ns())
    time.sleep(pause)
rec(ev="end", at=time.monotonic_ns())
"#;

/// The Python interpreter itself (not a version manager's shim, which costs a shell per run).
fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = std::process::Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 (run scripts/install-deps.sh)");
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// What every child of a run shares.
pub struct ChildEnv {
    dir: PathBuf,
    config: PathBuf,
    script: PathBuf,
    es_url: String,
    es_index: String,
}

/// One child to start.
#[derive(Clone, Debug)]
pub struct ChildSpec {
    pub monitor: String,
    pub class: Class,
    pub hold_ms: u64,
    pub writes: u32,
    pub timeout: Duration,
}

/// The writer's first line: it holds the lock.
#[derive(Clone, Copy, Debug)]
pub struct Held {
    pub pid: i32,
    pub token: u64,
}

/// A child under way.
pub struct Running {
    pub op: u64,
    pub client: String,
    pub spec: ChildSpec,
    pub pid: i32,
    child: tokio::process::Child,
    file: PathBuf,
    spawned: Ns,
}

impl ChildEnv {
    /// Writes the configuration (`zkguard.properties`) and the writer into `dir`.
    pub fn new(
        dir: &Path,
        servers: &str,
        lock_root: &str,
        session_timeout: Duration,
        es_url: &str,
        es_index: &str,
    ) -> Self {
        let config = dir.join("zkguard.properties");
        std::fs::write(
            &config,
            format!(
                "zookeeper.servers={servers}\nzookeeper.lock.root={lock_root}\n\
                 zookeeper.session.timeout={}\nzookeeper.connection.retry=3\n\
                 zookeeper.connection.delay=200\n",
                session_timeout.as_millis()
            ),
        )
        .expect("write the configuration");
        let script = dir.join("writer.py");
        std::fs::write(&script, WRITER).expect("write the writer");
        ChildEnv {
            dir: dir.to_path_buf(),
            config,
            script,
            es_url: es_url.to_string(),
            es_index: es_index.to_string(),
        }
    }

    /// Starts `zkguard exec` for `spec`.
    pub fn spawn(&self, rec: &Recorder, spec: ChildSpec) -> Running {
        let op = rec.id();
        let client = format!("c{op}");
        let file = self.dir.join(format!("{client}.jsonl"));
        let kind = match spec.class {
            Class::Foreground => "foreground",
            Class::Background => "background",
        };
        let spawned = now();
        let child = tokio::process::Command::from(crate::cli::zkguard())
            .arg("--config")
            .arg(&self.config)
            .args(["exec", "--json", "--monitor", &spec.monitor, "--type", kind])
            .arg("--timeout")
            .arg(format!("{}ms", spec.timeout.as_millis()))
            .arg("--info")
            .arg(format!("history {client}"))
            .arg("--")
            .arg(python())
            .arg(&self.script)
            .env_remove("ZKGUARD_CONFIG")
            .env_remove("RUST_LOG")
            .env("HISTORY_FILE", &file)
            .env("ES_URL", &self.es_url)
            .env("ES_INDEX", &self.es_index)
            .env("WRITES", spec.writes.to_string())
            .env("HOLD_MS", spec.hold_ms.to_string())
            .env("WRITER", &client)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start zkguard exec");
        Running {
            op,
            client,
            spec,
            pid: child.id().expect("pid") as i32,
            child,
            file,
            spawned,
        }
    }
}

#[derive(serde::Deserialize)]
struct Line {
    ev: String,
    at: u64,
    #[serde(default)]
    pid: i32,
    #[serde(default)]
    token: u64,
    #[serde(default)]
    w: u64,
    #[serde(default)]
    status: i64,
}

fn lines(file: &Path) -> Vec<Line> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        // A line cut short by a kill is not JSON: skipped.
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

pub use crate::process::alive;

/// Sends `signal` to `pid` (it may be gone already).
pub fn signal(pid: i32, signal: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
}

impl Running {
    /// The writer's first line, once written.
    pub fn held(&self) -> Option<Held> {
        lines(&self.file)
            .into_iter()
            .find(|l| l.ev == "held")
            .map(|l| Held {
                pid: l.pid,
                token: l.token,
            })
    }

    /// Waits until the writer holds the lock (`Some`) or the process has exited (`None`).
    pub async fn wait_held(&mut self, limit: Duration) -> Option<Held> {
        let end = tokio::time::Instant::now() + limit;
        loop {
            if let Some(h) = self.held() {
                return Some(h);
            }
            if matches!(self.child.try_wait(), Ok(Some(_))) || tokio::time::Instant::now() > end {
                return self.held();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until the process and its command are gone and records what the child did.
    /// Returns the instant both were seen gone.
    pub async fn finish(self, rec: &Recorder) -> Ns {
        let Running {
            op,
            client,
            spec,
            pid: _,
            child,
            file,
            spawned,
        } = self;
        let output = child
            .wait_with_output()
            .await
            .expect("wait for zkguard exec");
        let events = lines(&file);
        // The command gets SIGKILL when zkguard dies (parent-death signal): wait until it is
        // gone too, so that none of its writes can come later.
        if let Some(held) = events.iter().find(|l| l.ev == "held") {
            let end = tokio::time::Instant::now() + Duration::from_secs(10);
            while alive(held.pid) && tokio::time::Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert!(!alive(held.pid), "the command of {client} outlived zkguard");
        }
        let gone = now();
        let events = if events.is_empty() {
            events
        } else {
            // Lines written after the first read (none: the command is gone), in order.
            lines(&file)
        };
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        let report: Option<serde_json::Value> = stderr
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v.get("wait_ms").is_some());
        let release_warning = stderr.contains("\"warning\":\"release\"");
        let held = events.iter().find(|l| l.ev == "held");
        let queued_by = match (held, &report) {
            (Some(h), Some(r)) => r["wait_ms"]
                .as_f64()
                .map(|w| h.at.saturating_sub((w * 1e6) as u64)),
            _ => None,
        };
        rec.at(
            spawned,
            Ev::Call {
                op,
                client: client.clone(),
                monitor: spec.monitor.clone(),
                class: spec.class,
                queued_by,
            },
        );
        let Some(held) = held else {
            let code = output.status.code();
            rec.at(
                gone,
                Ev::Failed {
                    op,
                    timeout: code == Some(75),
                    reason: format!("exit {code:?}: {}", stderr.trim()),
                },
            );
            return gone;
        };
        rec.at(
            held.at,
            Ev::Acquired {
                op,
                token: held.token,
            },
        );
        let mut ids = std::collections::HashMap::new();
        let mut end = None;
        for l in &events {
            match l.ev.as_str() {
                "send" => {
                    let w = rec.id();
                    ids.insert(l.w, w);
                    rec.at(
                        l.at,
                        Ev::WriteSent {
                            w,
                            op,
                            doc: spec.monitor.clone(),
                            token: held.token,
                        },
                    );
                }
                "done" => {
                    let outcome = match l.status {
                        200 | 201 => Outcome::Accepted,
                        409 => Outcome::Rejected,
                        _ => Outcome::Unknown,
                    };
                    rec.at(
                        l.at,
                        Ev::WriteDone {
                            w: ids[&l.w],
                            outcome,
                        },
                    );
                }
                "end" => end = Some(l.at),
                _ => {}
            }
        }
        rec.at(end.unwrap_or(gone), Ev::HoldEnd { op });
        if report.is_some() || output.status.code().is_some() {
            let lost = report
                .as_ref()
                .is_some_and(|r| r["lock_lost"] == serde_json::Value::Bool(true));
            let ok = end.is_some() && output.status.code() == Some(0) && !lost && !release_warning;
            rec.at(gone, Ev::Released { op, ok });
        }
        gone
    }
}
