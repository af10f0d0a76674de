//! Monitor names: what a lock's name may hold, and the monitor of a document.

use super::LockError;

/// The longest monitor name, in bytes.
pub const MAX_MONITOR_LEN: usize = 200;

/// Checks a monitor object name.
///
/// Allowed: 1 to [`MAX_MONITOR_LEN`] bytes of UTF-8 without `/`, control characters or the
/// code points ZooKeeper refuses in node names (U+E000–U+F8FF, U+FFF0–U+FFFF, and every character
/// outside the Basic Multilingual Plane such as emoji, which ZooKeeper sees as surrogate pairs);
/// not `.`, `..`, `zookeeper` or `privateLock`. The rules are the same for both backends, so a
/// name that works on one works on the other when `lock.backend` changes. Names are used as they are (no encoding), so `zkguard locks`
/// shows them as given. Typical ids (`article-42`, `P1`, UUIDs, `tenant:7/…` with the slash
/// replaced) fit.
///
/// # Errors
/// [`LockError::InvalidMonitor`] saying what is wrong.
pub fn validate_monitor(name: &str) -> Result<(), LockError> {
    let bad = |reason: &str| {
        Err(LockError::InvalidMonitor {
            name: name.to_string(),
            reason: reason.to_string(),
        })
    };
    if name.is_empty() {
        return bad("it is empty; pass the id of the object to lock, e.g. article-42");
    }
    if name.len() > MAX_MONITOR_LEN {
        return bad(&format!(
            "it is {} bytes long; the limit is {MAX_MONITOR_LEN}",
            name.len()
        ));
    }
    if name == "." || name == ".." {
        return bad("`.` and `..` are not allowed as names");
    }
    if name == "zookeeper" || name == "privateLock" {
        return bad("this name is reserved");
    }
    if name.contains('/') {
        return bad("it contains `/`; replace it (e.g. with `:`) since each monitor is one znode");
    }
    if let Some(c) = name.chars().find(|c| !znode_char(*c)) {
        if c > '\u{ffff}' {
            return bad(&format!(
                "it contains the character U+{:04X} ({c}), outside the Basic Multilingual Plane, which ZooKeeper cannot store in a node name; use characters up to U+FFFF",
                c as u32
            ));
        }
        return bad(&format!(
            "it contains the character U+{:04X}, which is not allowed",
            c as u32
        ));
    }
    Ok(())
}

/// Whether ZooKeeper accepts `c` in a node name: not a control character, not in U+D800–U+F8FF
/// or U+FFF0–U+FFFF, and inside the Basic Multilingual Plane (the server sees a character beyond
/// it as two surrogates, which it refuses).
pub(crate) fn znode_char(c: char) -> bool {
    !(c.is_control()
        || ('\u{e000}'..='\u{f8ff}').contains(&c)
        || ('\u{fff0}'..='\u{ffff}').contains(&c)
        || c > '\u{ffff}')
}

/// The monitor that guards writes of document `id` of `index` when the caller names none:
/// `{index}:{id}`, made a valid monitor name whatever the id holds.
///
/// A name that [`validate_monitor`] accepts is used as it is, so `zkguard locks` shows it as
/// given and every release of zkguard derives the same one. Otherwise, each character a node name
/// cannot hold (`/`, control characters, U+E000–U+F8FF, U+FFF0–U+FFFF, characters outside the
/// Basic Multilingual Plane) is replaced by the `%XX` escapes of its UTF-8 bytes; and a name
/// still longer than [`MAX_MONITOR_LEN`] bytes keeps its first 180 bytes followed by `~` and 16
/// hexadecimal digits of a 64-bit FNV-1a hash of the whole `{index}:{id}`. Two documents may then
/// share a monitor (`a/b` and `a%2Fb`, or two long ids with a hash collision): they are locked
/// together, which costs waiting, never exclusion.
///
/// ```
/// use zkguard::lock::document_monitor;
///
/// assert_eq!(document_monitor("articles", "42"), "articles:42");
/// assert_eq!(document_monitor("files", "docs/a.txt"), "files:docs%2Fa.txt");
/// assert_eq!(document_monitor("tags", "🦀"), "tags:%F0%9F%A6%80");
/// let long = document_monitor("logs", &"x".repeat(512));
/// assert!(long.len() <= zkguard::lock::MAX_MONITOR_LEN && long.starts_with("logs:xxx"));
/// assert!(zkguard::lock::validate_monitor(&long).is_ok());
/// ```
pub fn document_monitor(index: &str, id: &str) -> String {
    let plain = format!("{index}:{id}");
    if validate_monitor(&plain).is_ok() {
        return plain;
    }
    let mut escaped = String::with_capacity(plain.len());
    for c in plain.chars() {
        if c != '/' && znode_char(c) {
            escaped.push(c);
        } else {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                escaped.push_str(&format!("%{b:02X}"));
            }
        }
    }
    if escaped.len() <= MAX_MONITOR_LEN {
        return escaped;
    }
    let mut cut = 180;
    while !escaped.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}~{:016x}", &escaped[..cut], fnv1a64(plain.as_bytes()))
}

/// 64-bit FNV-1a: small, fixed forever (every zkguard release must derive the same monitor).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_document_id_gives_a_valid_monitor() {
        for id in [
            "42",
            "a/b/c",
            "tab\there",
            "\u{e000}private",
            "emoji 🦀",
            "..",
            &"é".repeat(256),
            &"/".repeat(512),
        ] {
            let m = document_monitor("idx", id);
            assert!(validate_monitor(&m).is_ok(), "{id:?} -> {m:?}");
            assert_eq!(m, document_monitor("idx", id), "deterministic");
        }
        assert_eq!(document_monitor("idx", ".."), "idx:..");
        assert_ne!(
            document_monitor("idx", &"a".repeat(300)),
            document_monitor("idx", &format!("{}b", "a".repeat(299)))
        );
        // The hash is fixed: a change here would split the locks of running clusters.
        assert_eq!(fnv1a64(b"idx:a"), 0x0d35_813b_82a6_e835);
    }
}
