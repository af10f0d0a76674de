//! The monitoring files' checks shared by the service's and the fleet's tests: a file of the
//! repository, and Prometheus' `promtool` run on the rules and their unit tests.

use std::path::Path;
use std::process::Command;

/// A file of the repository (`path` relative to its root), as text.
pub fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Runs promtool in the repository and returns what it printed; fails when it fails.
pub fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}): run `make deps` (Debian's prometheus package)")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool {} failed:\n{text}",
        args.join(" ")
    );
    text
}
