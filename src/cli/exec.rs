//! `zkguard exec`: acquire, run a command, release.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::signal::unix::{signal, SignalKind};
use zkguard::config::{parse_duration, Settings};
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
    /// Short description of the work, stored in the lock nodes.
    #[arg(long, value_name = "TEXT", default_value = "zkguard exec")]
    pub info: String,
    /// How long CMD gets to exit after SIGTERM (lock lost or zkguard interrupted) before SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_cli_duration)]
    pub kill_after: Duration,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Parses a CLI duration: milliseconds or a humantime string.
pub fn parse_cli_duration(s: &str) -> Result<Duration, String> {
    parse_duration(s).ok_or_else(|| {
        format!("`{s}` is not a duration: use milliseconds (500) or a unit (500ms, 2s)")
    })
}

/// Runs `zkguard exec`.
pub async fn run(settings: Settings, args: ExecArgs) -> Result<u8, CliError> {
    zkguard::lock::validate_monitor(&args.monitor).map_err(|e| CliError::new(EX_USAGE, e))?;
    let service = super::lock_service(&settings).await?;
    let mut request = LockRequest::new(&args.monitor, &args.info).with_type(args.lock_type);
    if let Some(t) = args.timeout {
        request = request.with_timeout(t);
    }
    let guard = service.acquire(request).await?;
    let token = guard.fencing_token();
    tracing::info!(monitor = %args.monitor, token, "running the command under the lock");

    let mut child = match Command::new(&args.command[0])
        .args(&args.command[1..])
        .env("ZKGUARD_FENCING_TOKEN", token.to_string())
        .env("ZKGUARD_MONITOR", &args.monitor)
        .env("ZKGUARD_LOCK_TYPE", args.lock_type.to_string())
        .env("ZKGUARD_LOCK_BACKEND", service.backend_name())
        .stdin(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
    {
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
    let pid = child.id().map(|p| Pid::from_raw(p as i32));
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| CliError::new(EX_SOFTWARE, e))?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| CliError::new(EX_SOFTWARE, e))?;

    let mut lost = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            reason = guard.lost(), if lost.is_none() => {
                eprintln!("zkguard: lock on `{}` lost while the command ran: {reason}; sending SIGTERM to the command", args.monitor);
                lost = Some(reason);
                terminate(pid, &mut child, args.kill_after).await;
            }
            _ = sigterm.recv() => forward(pid, Signal::SIGTERM),
            _ = sigint.recv() => forward(pid, Signal::SIGINT),
        }
    };
    let release = guard.unlock().await;
    if lost.is_some() {
        return Ok(EX_UNAVAILABLE);
    }
    if let Err(e) = release {
        eprintln!("zkguard: warning: {e}");
    }
    let status =
        status.map_err(|e| CliError::new(EX_SOFTWARE, format!("waiting for the command: {e}")))?;
    use std::os::unix::process::ExitStatusExt;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
        _ => EX_SOFTWARE,
    })
}

fn forward(pid: Option<Pid>, sig: Signal) {
    if let Some(pid) = pid {
        let _ = kill(pid, sig);
    }
}

async fn terminate(pid: Option<Pid>, child: &mut tokio::process::Child, kill_after: Duration) {
    forward(pid, Signal::SIGTERM);
    if tokio::time::timeout(kill_after, child.wait())
        .await
        .is_err()
    {
        let _ = child.start_kill();
    }
}
