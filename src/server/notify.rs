//! systemd's service notifications (`sd_notify(3)`), for `Type=notify` units
//! (`deploy/systemd/zkguard.service`): `READY=1` once the journal is replayed and the listeners
//! are bound (the start line is printed), `STOPPING=1` when a shutdown begins, and `WATCHDOG=1`
//! at half the unit's `WatchdogSec=` while the runtime runs. Each is one datagram to
//! `$NOTIFY_SOCKET` (a path, or an abstract name after `@`); without it, nothing is sent. No
//! library is needed for that.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// Where notifications go, when systemd asked for them.
#[derive(Debug, Default, Clone)]
pub struct Notifier {
    target: Option<String>,
}

impl Notifier {
    /// The notifier `$NOTIFY_SOCKET` names (none without it).
    pub fn from_env() -> Self {
        Self {
            target: std::env::var("NOTIFY_SOCKET")
                .ok()
                .filter(|s| !s.is_empty()),
        }
    }

    /// Sends `message` (`KEY=VALUE` lines); a failure is logged, never fatal: systemd then
    /// sees the start time out, or the watchdog fire, and says so itself.
    pub fn send(&self, message: &str) {
        let Some(target) = &self.target else {
            return;
        };
        let sent = UnixDatagram::unbound().and_then(|socket| match target.strip_prefix('@') {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
                socket.send_to_addr(message.as_bytes(), &addr)
            }
            None => socket.send_to(message.as_bytes(), target),
        });
        if let Err(e) = sent {
            tracing::warn!(socket = %target, error = %e, message, "cannot notify systemd (NOTIFY_SOCKET)");
        }
    }

    /// Whether systemd asked for notifications.
    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }
}

/// How often to ping the watchdog: half of `$WATCHDOG_USEC`, when it is set for this process
/// (`$WATCHDOG_PID` absent or ours).
pub fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.parse::<u32>().ok() != Some(std::process::id()) {
            return None;
        }
    }
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}
