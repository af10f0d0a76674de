//! `elastic.stamp.*`: the `zkguard` object in written documents (see
//! [`crate::write::stamping`]).

use crate::write::stamping::IndexPatterns;

use super::{ConfigError, Reader};

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
}

pub(super) fn read(r: &Reader<'_>) -> Result<StampSettings, ConfigError> {
    let window = r.int::<usize>("elastic.stamp.window", 1)?;
    if window > MAX_STAMP_WINDOW {
        return Err(r.err(
            "elastic.stamp.window",
            format!("a whole number from 1 to {MAX_STAMP_WINDOW} (each id costs about 38 bytes in every document)"),
        ));
    }
    let off = IndexPatterns::parse(&r.optional_string("elastic.stamp.off").unwrap_or_default())
        .map_err(|e| r.err("elastic.stamp.off", e))?;
    Ok(StampSettings { window, off })
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::super::Settings;

    fn load(text: &str) -> Result<Settings, String> {
        let f = tempfile::Builder::new()
            .suffix(".properties")
            .tempfile()
            .unwrap();
        std::fs::write(f.path(), text).unwrap();
        Settings::load_with_vars(Some(f.path()), std::iter::empty::<(OsString, OsString)>())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_window_is_bounded_and_the_opt_out_parsed() {
        let s = load("elastic.stamp.window=3\nelastic.stamp.off=logs-*,plain\n").unwrap();
        assert_eq!(s.stamp.window, 3);
        assert!(s.stamp.off.matches("logs-1") && s.stamp.off.matches("plain"));
        assert!(!s.stamp.off.matches("articles"));
        let d = Settings::default();
        assert_eq!(d.stamp.window, 100);
        assert!(d.stamp.off.is_empty());
        for bad in ["0", "1001", "many"] {
            let e = load(&format!("elastic.stamp.window={bad}\n")).unwrap_err();
            assert!(e.contains("elastic.stamp.window"), "{e}");
        }
        let e = load("elastic.stamp.off=lo*gs\n").unwrap_err();
        assert!(
            e.contains("elastic.stamp.off") && e.contains("`lo*gs`"),
            "{e}"
        );
    }
}
