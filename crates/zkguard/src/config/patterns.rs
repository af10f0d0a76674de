//! Index names and prefix patterns, as `elastic.stamp.off`, `server.gateway.indices` and
//! `server.gateway.background.indices` list them. A setting's value type, so it lives in
//! `config`; the write path re-exports it as `write::stamping::IndexPatterns`.

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
