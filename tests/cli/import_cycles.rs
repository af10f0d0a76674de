//! The source layout keeps every dependency pointing one way: no two files of `src/` (library
//! or binary) import each other, directly or through others; every import runs in a direction
//! `docs/architecture.md`'s dependency table allows; every module has a row there and every file
//! is named there. `scripts/import-cycles.py` does the analysis (`make check` runs it too).

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

/// A crate in `dir/src` with the given files, and `dir/docs/architecture.md` holding `doc`.
fn project(files: &[(&str, &str)], doc: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let path = dir.path().join("src").join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    std::fs::create_dir(dir.path().join("docs")).unwrap();
    std::fs::write(dir.path().join("docs/architecture.md"), doc).unwrap();
    dir
}

/// The architecture of the small crates below: `config` at the bottom, `write` above it.
const LAYERS: &str = "# Architecture\n\n| module | may use | for |\n| --- | --- | --- |\n\
| `lib` | nothing | the root |\n| `config` | nothing | settings |\n\
| `write` | `config` | the write path |\n\n\
```text\nconfig.rs   settings\nwrite/      mod.rs, stamping.rs\n```\n";

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

/// The zkguard tree itself keeps the documented directions, has a row for every module and
/// names every file (the run above checks it; this names what it reports).
#[test]
fn the_source_tree_keeps_the_documented_directions() {
    let out = check(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(
        text(&out).contains("every import in a direction"),
        "{}",
        text(&out)
    );
}

/// An import against the table's direction fails the check, naming both files and the rule:
/// `config` using `write::stamping`, as `config/stamp.rs` and `config/gateway.rs` once did.
#[test]
fn an_import_against_the_documented_direction_is_reported() {
    let files = [
        ("lib.rs", "pub mod config;\npub mod write;\n"),
        (
            "config.rs",
            "use crate::write::stamping::Patterns;\npub struct S(Patterns);\n",
        ),
        ("write/mod.rs", "pub mod stamping;\n"),
        (
            "write/stamping.rs",
            "pub struct Patterns;\npub fn f(_: crate::config::S) {}\n",
        ),
    ];
    let dir = project(&files, LAYERS);
    let out = check(&dir.path().join("src"));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = text(&out);
    assert!(
        report.contains("config.rs uses")
            && report.contains("write/stamping.rs: `config` may not use `write`"),
        "{report}"
    );
    // write -> config is the documented direction: only the one line.
    assert_eq!(report.matches("may not use").count(), 1, "{report}");

    // The same crate with the import going down passes.
    let files = [
        files[0],
        ("config.rs", "pub struct S;\n"),
        files[2],
        files[3],
    ];
    let dir = project(&files, LAYERS);
    let out = check(&dir.path().join("src"));
    assert!(out.status.success(), "{}", text(&out));
}

/// A module with no row in the table, and a file the document does not name, fail the check.
#[test]
fn a_module_missing_from_the_architecture_is_reported() {
    let files = [
        ("lib.rs", "pub mod config;\npub mod write;\npub mod txn;\n"),
        ("config.rs", "pub struct S;\n"),
        ("write/mod.rs", "pub mod stamping;\npub mod guarded;\n"),
        ("write/stamping.rs", "pub struct Patterns;\n"),
        ("write/guarded.rs", "pub fn g(_: crate::config::S) {}\n"),
        (
            "txn.rs",
            "pub fn t() { crate::write::guarded::g(crate::config::S) }\n",
        ),
    ];
    let dir = project(&files, LAYERS);
    let out = check(&dir.path().join("src"));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = text(&out);
    assert!(
        report.contains("module `txn`") && report.contains("in no row"),
        "{report}"
    );
    assert!(
        report.contains("write/guarded.rs is not named in the architecture document"),
        "{report}"
    );
    assert!(!report.contains("stamping.rs is not named"), "{report}");
}

/// No function of the lock's driver, the gate, the service's start-up, the demo's run or the
/// configuration's validation is longer than 150 lines (`scripts/function-length.py`, which
/// `make check` runs too); and the check names one that is, with its length.
#[test]
fn no_function_over_150_lines_where_decisions_hid() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/function-length.py");
    let run = |args: &[&std::ffi::OsStr]| {
        Command::new("python3")
            .arg(&script)
            .args(args)
            .output()
            .expect("run python3 scripts/function-length.py")
    };
    let out = run(&[]);
    assert!(out.status.success(), "{}", text(&out));

    let dir = tempfile::tempdir().unwrap();
    let long = dir.path().join("src/zk/long.rs");
    std::fs::create_dir_all(long.parent().unwrap()).unwrap();
    let body: String = (0..150)
        .map(|i| format!("    let _x{i} = \"{{\";\n"))
        .collect();
    std::fs::write(
        &long,
        format!("/// Short.\nfn short() {{}}\n\nfn long() {{\n{body}}}\n"),
    )
    .unwrap();
    let out = run(&["--root".as_ref(), dir.path().as_os_str()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = text(&out);
    assert!(
        report.contains("src/zk/long.rs:4: fn long is 152 lines (at most 150)"),
        "{report}"
    );
    assert!(!report.contains("fn short"), "{report}");
}
