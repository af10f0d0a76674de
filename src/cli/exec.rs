//! `zkguard exec`: acquire, run a command, release.
//!
//! The command never outlives the lock it runs under:
//!
//! - on Linux the command's process gets a parent-death signal (`PR_SET_PDEATHSIG`, SIGKILL)
//!   before it is executed, so the kernel kills it when zkguard dies, even by SIGKILL; a
//!   command whose zkguard died before the signal was set up is not executed at all;
//! - when standard input is not a terminal, the command runs in a process group of its own, and
//!   every signal zkguard sends (forwarded SIGTERM/SIGINT, SIGTERM when the lock is lost, SIGKILL
//!   after `--kill-after`) goes to the whole group; whatever is left of the group when the
//!   command exits is killed (SIGKILL) before the lock is released.
//!
//! On a terminal the command stays in zkguard's process group, so that it keeps the terminal
//! (job control, reading standard input); the terminal then signals the whole job itself.

use std::io::IsTerminal;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::signal::unix::{signal, SignalKind};
use zkguard::config::Settings;
use zkguard::{LockRequest, LockType};

use super::{CliError, EX_SOFTWARE, EX_UNAVAILABLE, EX_USAGE};

/// Arguments of `zkguard exec`.
#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// The monitor object to lock (e.g. an article id).
    #[arg(long, value_name = "ID")]
    pub monitor: String,
    /// Lock type.
    #[arg(
        long = "type",
        value_name = "foreground|background",
        default_value = "foreground"
    )]
    pub lock_type: LockType,
    /// How long to wait for the lock (e.g. 500ms, 2s, or milliseconds); 0 tries once; default
    /// from the configuration of the lock type.
    #[arg(long, value_name = "DURATION", value_parser = parse_cli_duration)]
    pub timeout: Option<Duration>,
    /// Short description of the work, stored in the lock nodes (at most 1024 bytes).
    #[arg(long, value_name = "TEXT", default_value = "zkguard exec")]
    pub info: String,
    /// How long CMD gets to exit after SIGTERM (lock lost or zkguard interrupted) before SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_cli_duration)]
    pub kill_after: Duration,
    /// Errors as `{"error", "message"}` and, when the command has run, a final JSON line on
    /// stderr: `{"monitor", "lock_type", "backend", "token", "wait_ms", "hold_ms", "status"}`
    /// (stderr, so that the command's own stdout stays as it wrote it).
    #[arg(long)]
    pub json: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// The variable that gives the command the cluster's URL (see [`command_es_url`]). Not
/// `ZKGUARD_ELASTICSEARCH_URL`: that one overrides `elasticsearch.url`, so a zkguard run by the
/// command would take it over its own configuration file's cluster.
const ES_URL_VAR: &str = "ZKGUARD_EXEC_ELASTICSEARCH_URL";

/// The cluster's URL for the command: the first of `elasticsearch.url`, without its user-info
/// (validation moved the credentials to basic authentication: zkguard hands no secret to the
/// command) and without a trailing `/`, so that `"$ZKGUARD_EXEC_ELASTICSEARCH_URL/articles"` is
/// a well-formed URL.
fn command_es_url(settings: &Settings) -> String {
    settings
        .elasticsearch
        .urls
        .first()
        .map(|url| {
            let mut url = url.clone();
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.as_str().trim_end_matches('/').to_string()
        })
        .unwrap_or_default()
}

/// Parses a CLI duration: milliseconds or a humantime string, at most
/// [`zkguard::config::MAX_DURATION`].
pub fn parse_cli_duration(s: &str) -> Result<Duration, String> {
    zkguard::config::parse_bounded_duration(s)
}

/// Runs `zkguard exec`.
///
/// It is awaited directly by the runtime's `block_on`, so the command is spawned from the main
/// thread: Linux delivers the parent-death signal when the thread that forked the child ends,
/// and the main thread ends only with the process.
pub async fn run(settings: Settings, args: ExecArgs) -> Result<u8, CliError> {
    zkguard::lock::validate_monitor(&args.monitor).map_err(|e| CliError::new(EX_USAGE, e))?;
    zkguard::lock::validate_info(&args.info)
        .map_err(|e| CliError::new(EX_USAGE, format!("--info: {e}")))?;
    // The timeout covers connecting too: with ZooKeeper down, exec fails by the timeout plus
    // `DEADLINE_OVERRUN`, as an acquisition does.
    let started = std::time::Instant::now();
    let wait = args
        .timeout
        .unwrap_or_else(|| settings.zookeeper.timeout(args.lock_type));
    let service = match started.checked_add(wait.saturating_add(zkguard::zk::DEADLINE_OVERRUN)) {
        Some(limit) => super::lock_service_by(&settings, limit, wait).await?,
        None => super::lock_service(&settings).await?,
    };
    let request = LockRequest::new(&args.monitor, &args.info)
        .with_type(args.lock_type)
        .with_timeout(wait.saturating_sub(started.elapsed()));
    let asked = std::time::Instant::now();
    let guard = match service.acquire(request).await {
        Ok(guard) => guard,
        Err(e) if args.timeout == Some(Duration::ZERO) => {
            let message = e.try_once_message().unwrap_or_else(|| e.to_string());
            let mut error = CliError::from(e);
            error.message = message;
            return Err(error);
        }
        Err(e) => return Err(e.into()),
    };
    let acquired = std::time::Instant::now();
    let token = guard.fencing_token();
    tracing::info!(monitor = %args.monitor, token, "running the command under the lock");

    let own_group = !std::io::stdin().is_terminal();
    let mut command = Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("ZKGUARD_FENCING_TOKEN", token.to_string())
        .env("ZKGUARD_MONITOR", &args.monitor)
        .env("ZKGUARD_LOCK_TYPE", args.lock_type.to_string())
        .env("ZKGUARD_EXEC_LOCK_BACKEND", service.backend_name())
        .env(ES_URL_VAR, command_es_url(&settings))
        // Deprecated (it is also the override of lock.backend): kept for one release.
        .env("ZKGUARD_LOCK_BACKEND", service.backend_name())
        .stdin(Stdio::inherit())
        .kill_on_drop(true);
    if own_group {
        command.process_group(0);
    }
    die_with_parent(&mut command);
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = guard.unlock().await;
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return Err(CliError::new(
                code,
                format!("cannot run `{}`: {e}", args.command[0]),
            ));
        }
    };
    let mut target = Target {
        pid: child.id().map(|p| Pid::from_raw(p as i32)),
        group: own_group,
    };
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| CliError::new(EX_SOFTWARE, e))?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| CliError::new(EX_SOFTWARE, e))?;

    let mut lost = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            reason = guard.lost(), if lost.is_none() => {
                let message = format!("lock on `{}` lost while the command ran: {reason}; sending SIGTERM to the command", args.monitor);
                if args.json {
                    eprintln!("{}", serde_json::json!({"warning": "lock_lost", "message": message}));
                } else {
                    eprintln!("zkguard: {message}");
                }
                lost = Some(reason);
                terminate(&target, &mut child, args.kill_after).await;
            }
            _ = sigterm.recv() => target.signal(Signal::SIGTERM),
            _ = sigint.recv() => target.signal(Signal::SIGINT),
        }
    };
    // Nothing the command started may run on once the lock is released.
    target.kill_leftovers();
    let release = guard.unlock().await;
    let held = acquired.elapsed();
    let report = |status: u8| {
        if args.json {
            eprintln!(
                "{}",
                serde_json::json!({
                    "monitor": args.monitor,
                    "lock_type": args.lock_type.to_string(),
                    "backend": service.backend_name(),
                    "token": token,
                    "wait_ms": millis(acquired - asked),
                    "hold_ms": millis(held),
                    "status": status,
                    "lock_lost": lost.is_some(),
                })
            );
        }
    };
    if lost.is_some() {
        report(EX_UNAVAILABLE);
        return Ok(EX_UNAVAILABLE);
    }
    if let Err(e) = release {
        if args.json {
            eprintln!(
                "{}",
                serde_json::json!({"warning": "release", "message": e.to_string()})
            );
        } else {
            eprintln!("zkguard: warning: {e}");
        }
    }
    let status =
        status.map_err(|e| CliError::new(EX_SOFTWARE, format!("waiting for the command: {e}")))?;
    use std::os::unix::process::ExitStatusExt;
    let code = match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
        _ => EX_SOFTWARE,
    };
    report(code);
    Ok(code)
}

/// Milliseconds with three decimals (microsecond resolution).
fn millis(d: Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

/// Makes the command die with zkguard: on Linux a parent-death signal (SIGKILL) set in the
/// child before it executes the command. SIGKILL rather than SIGTERM: a zkguard that died
/// cannot follow up with SIGKILL after `--kill-after`, and its lock passes on after the session
/// timeout, so the command must not be able to ignore it.
#[cfg(target_os = "linux")]
fn die_with_parent(command: &mut Command) {
    let parent = Pid::this();
    // SAFETY: the closure runs in the forked child before exec and only makes two system calls
    // (prctl, getppid), which are async-signal-safe; it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            // zkguard may have died between fork and prctl: the signal would never come.
            // Then the child has been re-parented and must not run the command.
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::other(
                    "zkguard exited before the command started",
                ));
            }
            Ok(())
        });
    }
}

/// Other Unix systems have no parent-death signal: a command whose zkguard is killed with
/// SIGKILL keeps running (see docs/exec.md).
#[cfg(not(target_os = "linux"))]
fn die_with_parent(_command: &mut Command) {}

/// Where zkguard's signals go: the command's process group when it has one of its own, its
/// process otherwise.
struct Target {
    pid: Option<Pid>,
    group: bool,
}

impl Target {
    fn signal(&self, sig: Signal) {
        let Some(pid) = self.pid else { return };
        // The group outlives its leader while members are left, and its id cannot be reused
        // while any member is alive; ESRCH means the whole group is gone.
        let _ = if self.group {
            killpg(pid, sig)
        } else {
            kill(pid, sig)
        };
    }

    /// After the command exited: SIGKILL whatever is left of its process group (background
    /// jobs it started), once.
    fn kill_leftovers(&mut self) {
        if self.group {
            self.signal(Signal::SIGKILL);
        }
        self.pid = None;
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        // zkguard returns early (an error after the spawn): the group goes with it.
        self.kill_leftovers();
    }
}

async fn terminate(target: &Target, child: &mut tokio::process::Child, kill_after: Duration) {
    target.signal(Signal::SIGTERM);
    if tokio::time::timeout(kill_after, child.wait())
        .await
        .is_err()
    {
        target.signal(Signal::SIGKILL);
        let _ = child.start_kill();
    }
}
