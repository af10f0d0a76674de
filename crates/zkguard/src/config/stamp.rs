//! `elastic.stamp.*`: the `zkguard` object in written documents (the write path's
//! `write::stamping` describes it).

use super::IndexPatterns;

/// The largest `elastic.stamp.window`: 1,000 ids are about 38 KB per document.
pub const MAX_STAMP_WINDOW: usize = 1000;

/// What zkguard keeps in the documents it writes (`elastic.stamp.window`,
/// `elastic.stamp.off`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StampSettings {
    /// How many operation ids each document remembers (1 to [`MAX_STAMP_WINDOW`]).
    pub window: usize,
    /// Indices whose documents carry no `zkguard` object.
    pub off: IndexPatterns,
    /// Whether zkguard maps the `zkguard` object as stored but not indexed before its first
    /// stamped write to an index (`elastic.stamp.mapping`: `auto`, or `off`).
    pub map: bool,
}

/// `elastic.stamp.window`, `elastic.stamp.off` and `elastic.stamp.mapping` from their values; an
/// error names the key and what it expects.
pub(super) fn parse(
    window: &str,
    off: &str,
    mapping: &str,
) -> Result<StampSettings, (&'static str, String)> {
    let expected = || {
        format!("a whole number from 1 to {MAX_STAMP_WINDOW} (each id costs about 38 bytes in every document)")
    };
    let window = match window.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_STAMP_WINDOW).contains(&n) => n,
        _ => return Err(("elastic.stamp.window", expected())),
    };
    let off = IndexPatterns::parse(off).map_err(|e| ("elastic.stamp.off", e))?;
    let map = match mapping.trim() {
        "auto" => true,
        "off" => false,
        other => {
            return Err((
                "elastic.stamp.mapping",
                format!("`auto` (zkguard maps its object as stored but not indexed) or `off` (you map it), not `{other}`"),
            ))
        }
    };
    Ok(StampSettings { window, off, map })
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn the_window_is_bounded_and_the_opt_out_parsed() {
        let s = parse("3", "logs-*,plain", "auto").unwrap();
        assert!(s.map);
        assert!(!parse("3", "", "off").unwrap().map);
        let (key, e) = parse("3", "", "manual").unwrap_err();
        assert_eq!(key, "elastic.stamp.mapping");
        assert!(e.contains("`manual`"), "{e}");
        assert_eq!(s.window, 3);
        assert!(s.off.matches("logs-1") && s.off.matches("plain"));
        assert!(!s.off.matches("articles"));
        let d = parse("100", "", "auto").unwrap();
        assert!(d.off.is_empty());
        for bad in ["0", "1001", "many"] {
            let (key, e) = parse(bad, "", "auto").unwrap_err();
            assert_eq!(key, "elastic.stamp.window");
            assert!(e.contains("1 to 1000"), "{e}");
        }
        let (key, e) = parse("1", "lo*gs", "auto").unwrap_err();
        assert_eq!(key, "elastic.stamp.off");
        assert!(e.contains("`lo*gs`"), "{e}");
    }
}
