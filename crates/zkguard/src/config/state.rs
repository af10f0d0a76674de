//! The state directory: where zkguard keeps its own files (the dead-letter file, the journal of
//! `zkguard serve`) when their paths are not absolute, so that every command finds them from
//! any working directory.

use std::path::{Path, PathBuf};

/// The state directory: `state.dir` when set (a relative one taken from the current
/// directory), else `$XDG_STATE_HOME/zkguard`, else `$HOME/.local/state/zkguard`, else
/// `/var/lib/zkguard`.
pub(crate) fn dir(configured: Option<&str>, env: impl Fn(&str) -> Option<String>) -> PathBuf {
    let set = |v: Option<String>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    match configured.filter(|c| !c.is_empty()) {
        Some(c) => absolute(Path::new(c)),
        None => set(env("XDG_STATE_HOME"))
            .filter(|p| p.is_absolute())
            .map(|p| p.join("zkguard"))
            .or_else(|| set(env("HOME")).map(|h| h.join(".local/state/zkguard")))
            .unwrap_or_else(|| PathBuf::from("/var/lib/zkguard")),
    }
}

/// `path` as zkguard uses it: as given when absolute, else inside the state directory `dir`.
pub(crate) fn resolve(dir: &Path, path: &str) -> PathBuf {
    let path = Path::new(path);
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        dir.join(path)
    }
}

fn absolute(path: &Path) -> PathBuf {
    if path.is_absolute() {
        return path.to_path_buf();
    }
    std::env::current_dir()
        .map(|cwd| cwd.join(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_directory_follows_xdg_then_home_then_var_lib() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            dir(None, env(&[("XDG_STATE_HOME", "/s"), ("HOME", "/h")])),
            PathBuf::from("/s/zkguard")
        );
        assert_eq!(
            dir(None, env(&[("XDG_STATE_HOME", "rel"), ("HOME", "/h")])),
            PathBuf::from("/h/.local/state/zkguard"),
            "a relative XDG_STATE_HOME is ignored, as the XDG specification says"
        );
        assert_eq!(dir(None, env(&[])), PathBuf::from("/var/lib/zkguard"));
        assert_eq!(dir(Some("/srv/zk"), env(&[])), PathBuf::from("/srv/zk"));
        assert!(dir(Some("here"), env(&[])).is_absolute());
        assert_eq!(
            resolve(Path::new("/d"), "dl.jsonl"),
            PathBuf::from("/d/dl.jsonl")
        );
        assert_eq!(
            resolve(Path::new("/d"), "/x/dl.jsonl"),
            PathBuf::from("/x/dl.jsonl")
        );
    }
}
