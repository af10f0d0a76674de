//! Records the git commit the `zkguard` binary is built from, for `zkguard_build_info` on its
//! `/metrics` page: `ZKGUARD_BUILD_COMMIT` when set (a build without the repository's history,
//! such as the container image's, passes it in), else `git rev-parse --short=12 HEAD` of the
//! source tree, else `unknown`.
//!
//! Cargo reruns a build script whose watched files change, and then recompiles every target of
//! the package. Release-like profiles (`release`, `dist`) watch git's `HEAD` and the branch it
//! points to, so a shipped binary names its commit. The development and test profiles do not:
//! a commit does not recompile `make test`'s build; their commit is the one of the target
//! directory's first build (docs/install.md says so).

use std::path::Path;
use std::process::Command;

const OVERRIDE: &str = "ZKGUARD_BUILD_COMMIT";
/// The variable the commit is compiled in from. Not a `ZKGUARD_` name: `cargo run` and `cargo
/// test` also set it for the programs they start, and a zkguard started so would warn of an
/// unknown `ZKGUARD_` variable.
const COMPILED_AS: &str = "BUILT_FROM_COMMIT";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed={OVERRIDE}");
    let commit = std::env::var(OVERRIDE)
        .ok()
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env={COMPILED_AS}={commit}");
    if std::env::var("PROFILE").as_deref() == Ok("release") {
        watch_head();
    }
}

/// Watches git's `HEAD`, the branch it names and the packed refs (only files that exist: Cargo
/// reruns a build script on every build while a watched file is missing).
fn watch_head() {
    let mut files = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        files.push(git(&["rev-parse", "--git-path", &branch]));
    }
    files.push(git(&["rev-parse", "--git-path", "packed-refs"]));
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    for file in files.into_iter().flatten() {
        let path = Path::new(&root).join(file);
        if path.is_file() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}

/// What `git args` printed in the package's directory, when it ran and succeeded.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(std::env::var("CARGO_MANIFEST_DIR").ok()?)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}
