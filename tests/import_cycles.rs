//! The source layout keeps every dependency pointing one way: no two files of `src/` (library
//! or binary) import each other, directly or through others. `scripts/import-cycles.py` does the
//! analysis (`make check` runs it too).

use std::path::Path;
use std::process::{Command, Output};

fn check(src: &Path) -> Output {
    Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/import-cycles.py"))
        .arg("--src")
        .arg(src)
        .output()
        .expect("run python3 scripts/import-cycles.py (python3 is installed with osmem-server)")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn no_import_cycle_between_the_source_files() {
    let out = check(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("no import cycle"), "{}", text(&out));
}

/// The check finds a cycle when there is one: through `use`, through an inline path, and
/// through a parent's re-export, which is followed to the file that defines the item.
#[test]
fn a_cycle_between_two_files_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod c;\n").unwrap();
    std::fs::write(
        src.join("a/mod.rs"),
        "mod b;\npub use b::Thing;\npub fn helper() {}\n",
    )
    .unwrap();
    // b uses its parent's helper, and c (which b uses) names b's item through a's re-export.
    std::fs::write(
        src.join("a/b.rs"),
        "pub struct Thing;\npub fn f() { super::helper(); crate::c::g(); }\n",
    )
    .unwrap();
    std::fs::write(
        src.join("c.rs"),
        "pub fn g() {}\npub fn h(_: crate::a::Thing) {}\n",
    )
    .unwrap();
    let out = check(src);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = text(&out);
    assert!(report.contains("import cycle"), "{report}");
    assert!(
        report.contains("a/b.rs") && report.contains("c.rs"),
        "{report}"
    );
    // a/mod.rs only declares and re-exports b: that is its facade, not a use, so it is not
    // part of the cycle even though b calls a function defined there.
    assert!(!report.contains("a/mod.rs"), "{report}");
}
