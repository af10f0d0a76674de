//! What zkguard keeps in the documents it writes: the [`Stamp`](super::ops::Stamp) (the
//! `zkguard` object), how many operation ids it remembers, and the indices whose documents get
//! none.
//!
//! The stamp is what recognises a retried or replayed operation as applied (its id is in the
//! document) and tells a fence by a newer zkguard holder from a version set outside zkguard.
//! An index listed in [`IndexPatterns`] opts out: its documents are still written under the
//! lock with the token as their version (fenced), but they carry no `zkguard` object, so a
//! retry or a replay of an operation that was applied already is applied again (the service
//! still recognises the ids its journal remembers), tombstone deletes are refused, and a fence
//! can only tell a zkguard token (at least 2^52) from a smaller outside version.

/// Index names and prefix patterns (`logs-*`), as `elastic.stamp.off` lists them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexPatterns(Vec<String>);

impl IndexPatterns {
    /// Parses a comma-separated list of index names, each optionally ending with `*` (a prefix
    /// pattern; `*` alone matches every index). Blank entries are ignored.
    ///
    /// # Errors
    /// A message naming the entry that has a `*` anywhere but at its end, or a character no
    /// index name can hold.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut patterns = Vec::new();
        for p in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let stem = p.strip_suffix('*').unwrap_or(p);
            if stem.contains('*') {
                return Err(format!(
                    "`{p}` has a `*` before its end; a pattern is an index name or a prefix followed by one `*` (logs-*)"
                ));
            }
            if let Some(c) = stem
                .chars()
                .find(|c| c.is_whitespace() || "\\/?\"<>|,#".contains(*c) || c.is_ascii_uppercase())
            {
                return Err(format!(
                    "`{p}` holds {c:?}, which no index name can hold; name lower-case indices, comma-separated"
                ));
            }
            patterns.push(p.to_string());
        }
        Ok(Self(patterns))
    }

    /// Whether `index` matches one of the patterns.
    pub fn matches(&self, index: &str) -> bool {
        self.0.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => index.starts_with(prefix),
            None => index == p,
        })
    }

    /// Whether there is no pattern.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The patterns, as given.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_prefixes_match() {
        let p = IndexPatterns::parse(" logs-* , metrics ,, ").unwrap();
        assert!(p.matches("logs-2026"));
        assert!(p.matches("metrics"));
        assert!(!p.matches("metrics-1"));
        assert!(!p.matches("articles"));
        assert!(IndexPatterns::parse("*").unwrap().matches("anything"));
        assert!(IndexPatterns::parse("").unwrap().is_empty());
    }

    #[test]
    fn bad_entries_are_named() {
        let e = IndexPatterns::parse("a*b").unwrap_err();
        assert!(e.contains("`a*b`"), "{e}");
        let e = IndexPatterns::parse("ok,Bad").unwrap_err();
        assert!(e.contains("`Bad`"), "{e}");
    }
}
