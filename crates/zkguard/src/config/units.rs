//! Values in their units: durations (milliseconds or humantime, capped at [`MAX_DURATION`]) and
//! ZooKeeper connect strings with their chroot.

use std::time::Duration;

use crate::lock::znode_char;

/// The longest duration any duration setting or option accepts: 7 days.
#[doc(hidden)] // for the zkguard binary
pub const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Parses a duration like [`parse_duration`] and checks it against [`MAX_DURATION`]; the error
/// says which (for command-line options and configuration keys alike).
///
/// # Errors
/// A one-line reason when `text` is not a duration or is longer than [`MAX_DURATION`].
#[doc(hidden)] // for the zkguard binary
pub fn parse_bounded_duration(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text).ok_or_else(|| {
        format!(
            "`{}` is not a duration: use milliseconds (500) or a unit (500ms, 2s)",
            text.trim()
        )
    })?;
    if d > MAX_DURATION {
        return Err(format!(
            "`{}` is longer than the maximum of 7d ({} ms)",
            text.trim(),
            MAX_DURATION.as_millis()
        ));
    }
    Ok(d)
}

/// Parses `2000` (milliseconds) or a humantime duration such as `2s`.
#[doc(hidden)] // for the zkguard binary
pub fn parse_duration(text: &str) -> Option<Duration> {
    let t = text.trim();
    if let Ok(ms) = t.parse::<u64>() {
        return Some(Duration::from_millis(ms));
    }
    humantime::parse_duration(t).ok()
}

/// Checks a ZooKeeper connect string (`host:port,...[/chroot]`, as the client parses it) and
/// returns it with blanks around the commas removed.
///
/// # Errors
/// What is wrong with it, in a few words.
pub(crate) fn check_zk_servers(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("it is empty".into());
    }
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    let mut entries = Vec::new();
    let mut chroot = None;
    for (i, part) in parts.iter().enumerate() {
        if part.is_empty() {
            return Err("it has an empty entry (a stray comma?)".into());
        }
        let (scheme, address) = match part.strip_prefix("tcp://") {
            Some(a) => ("tcp://", a),
            None if part.contains("://") => {
                return Err(format!(
                    "`{part}` has a scheme zkguard cannot use (only tcp://, or none)"
                ))
            }
            None => ("", *part),
        };
        let address = match address.find('/') {
            Some(at) if i + 1 == parts.len() => {
                chroot = Some(&address[at..]);
                &address[..at]
            }
            Some(_) => {
                return Err(format!(
                    "`{part}` has a `/`: the chroot goes after the last host only"
                ))
            }
            None => address,
        };
        let (host, port) = if let Some(rest) = address.strip_prefix('[') {
            let Some((host, after)) = rest.split_once(']') else {
                return Err(format!("`{part}` opens `[` without closing it"));
            };
            match after.strip_prefix(':') {
                Some(p) => (host, Some(p)),
                None if after.is_empty() => (host, None),
                None => return Err(format!("`{part}` has text after `]` that is not `:port`")),
            }
        } else {
            match address.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (address, None),
            }
        };
        if host.is_empty() {
            return Err(format!("`{part}` has an empty host"));
        }
        if host.chars().any(char::is_whitespace) {
            return Err(format!("`{part}` has a blank inside the host"));
        }
        if let Some(port) = port {
            match port.parse::<u16>() {
                Ok(p) if p > 0 => {}
                _ => {
                    return Err(format!(
                        "`{part}` has the port `{port}`, which is not a number from 1 to 65535"
                    ))
                }
            }
        }
        entries.push(format!("{scheme}{address}"));
    }
    if let Some(chroot) = chroot {
        check_chroot(chroot)?;
    }
    Ok(format!("{}{}", entries.join(","), chroot.unwrap_or("")))
}

/// Splits a connect string into its hosts and its chroot (after the last host), if any.
pub(crate) fn split_zk_chroot(servers: &str) -> (&str, Option<&str>) {
    let last_start = servers.rfind(',').map_or(0, |i| i + 1);
    let last = &servers[last_start..];
    let skip = if last.trim_start().starts_with("tcp://") {
        last.find("tcp://").map_or(0, |i| i + "tcp://".len())
    } else {
        0
    };
    match last[skip..].find('/') {
        Some(i) => {
            let at = last_start + skip + i;
            (&servers[..at], Some(&servers[at..]))
        }
        None => (servers, None),
    }
}

/// Checks a chroot as ZooKeeper does for any node path.
fn check_chroot(chroot: &str) -> Result<(), String> {
    if chroot == "/" {
        return Ok(());
    }
    let bad = |why: &str| Err(format!("the chroot `{chroot}` {why}"));
    if chroot.ends_with('/') {
        return bad("ends with `/`");
    }
    for segment in chroot[1..].split('/') {
        if segment.is_empty() {
            return bad("has an empty segment (`//`)");
        }
        if segment == "." || segment == ".." {
            return bad("has a `.` or `..` segment");
        }
        if let Some(c) = segment.chars().find(|c| !znode_char(*c)) {
            return Err(format!(
                "the chroot `{chroot}` contains the character U+{:04X}, which ZooKeeper does not allow in paths",
                c as u32
            ));
        }
    }
    Ok(())
}
