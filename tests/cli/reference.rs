//! The references under `docs/reference/` are what the code generates (`zkguard reference ...`),
//! and the README and the docs name no command, option or configuration key that does not exist.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use zkguard::config::KEYS;

const REFERENCES: [(&str, &str); 4] = [
    ("cli", "docs/reference/cli.md"),
    ("config", "docs/reference/config.md"),
    ("exit-status", "docs/reference/exit-status.md"),
    ("http", "docs/reference/http.md"),
];

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn committed_references_are_what_the_code_generates() {
    for (which, file) in REFERENCES {
        let out = crate::cli::zkguard()
            .args(["reference", which])
            .env_remove("ZKGUARD_CONFIG")
            .output()
            .expect("run zkguard reference");
        assert!(
            out.status.success(),
            "zkguard reference {which}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let generated = String::from_utf8(out.stdout).unwrap();
        let committed = read(&repo().join(file));
        if generated != committed {
            let line = generated
                .lines()
                .zip(committed.lines())
                .position(|(g, c)| g != c)
                .unwrap_or_else(|| generated.lines().count().min(committed.lines().count()));
            panic!(
                "{file} differs from `zkguard reference {which}` (first at line {}: generated {:?}, committed {:?}): run `make reference` and commit the result",
                line + 1,
                generated.lines().nth(line).unwrap_or("(end)"),
                committed.lines().nth(line).unwrap_or("(end)"),
            );
        }
    }
}

/// README.md and every Markdown file under docs/.
fn documents() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![repo().join("README.md")];
    walk(&repo().join("docs"), &mut out);
    out.sort();
    out
}

/// Every command of the CLI reference (`zkguard dlq replay`) with the options it takes, its
/// global ones included.
fn commands() -> BTreeMap<String, BTreeSet<String>> {
    let text = read(&repo().join("docs/reference/cli.md"));
    let mut commands: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current = None;
    for line in text.lines() {
        if let Some(path) = line.strip_prefix("## ") {
            current = Some(path.trim().to_string());
            commands.entry(path.trim().to_string()).or_default();
            continue;
        }
        let Some(current) = &current else { continue };
        let names = if let Some(row) = line.strip_prefix("| `") {
            row.split('|').next().unwrap_or_default().to_string()
        } else if let Some(globals) = line.strip_prefix("Global options: ") {
            globals.to_string()
        } else {
            continue;
        };
        let flags = commands.get_mut(current).unwrap();
        for word in names.split(|c: char| c.is_whitespace() || c == ',' || c == '`') {
            if word.starts_with('-') && word.len() > 1 && word != "--" {
                flags.insert(word.to_string());
            }
        }
    }
    for flags in commands.values_mut() {
        flags.extend(["--help", "-h", "--version", "-V"].map(String::from));
    }
    assert!(commands.len() > 10 && commands["zkguard exec"].contains("--monitor"));
    commands
}

/// The code of a Markdown file, line by line: the lines of fenced blocks, and the inline code
/// spans of the others.
fn code_segments(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            out.push((i + 1, line.to_string()));
        } else {
            let parts: Vec<&str> = line.split('`').collect();
            for span in parts.iter().skip(1).step_by(2) {
                out.push((i + 1, span.to_string()));
            }
        }
    }
    out
}

/// The flag named by `token` (`[--type` → `--type`, `--timeout=2s` → `--timeout`).
fn flag(token: &str) -> Option<String> {
    let t = token.trim_start_matches(['[', '(', '"', '\'']);
    let name: String = if let Some(long) = t.strip_prefix("--") {
        let n: String = long
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if n.is_empty() {
            return None;
        }
        format!("--{n}")
    } else if let Some(short) = t.strip_prefix('-') {
        let n: String = short
            .chars()
            .take_while(|c| c.is_ascii_alphabetic())
            .collect();
        if n.is_empty() {
            return None;
        }
        format!("-{n}")
    } else {
        return None;
    };
    // `-vv` is `-v` twice.
    if name.len() > 2 && !name.starts_with("--") && name[1..].chars().all(|c| c == 'v') {
        return Some("-v".into());
    }
    Some(name)
}

/// Where `zkguard` starts a command in `code`: at a word start, followed by a space.
fn invocations(code: &str) -> Vec<(bool, Vec<&str>)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("zkguard") {
        let start = from + at;
        let end = start + "zkguard".len();
        from = end;
        let before = code[..start].chars().next_back();
        let after = code[end..].chars().next();
        if before.is_some_and(|c| !(c.is_whitespace() || c == '/' || c == '(' || c == '$'))
            || after.is_none_or(|c| c != ' ')
        {
            continue;
        }
        // A command line when only variable assignments (or a path) come before it.
        let head = code[..start].trim();
        let leading = head.is_empty()
            || head.ends_with('/')
            || head
                .split_whitespace()
                .all(|w| w.contains('=') && !w.starts_with('-'));
        let tokens = code[end..]
            .split_whitespace()
            .take_while(|t| !matches!(*t, "|" | "||" | "&&" | ";" | "--" | ">" | "2>" | ")"))
            .take_while(|t| !t.starts_with('#'))
            .collect();
        out.push((leading, tokens));
    }
    out
}

#[test]
fn the_docs_use_only_existing_commands_and_options() {
    let commands = commands();
    let mut problems = Vec::new();
    for doc in documents() {
        let name = doc.strip_prefix(repo()).unwrap().display().to_string();
        for (line, code) in code_segments(&read(&doc)) {
            for (leading, tokens) in invocations(&code) {
                let mut rest = tokens.as_slice();
                // Global options before the command.
                while let Some(t) = rest.first() {
                    match flag(t).as_deref() {
                        Some("--config") if !t.contains('=') => rest = rest.get(2..).unwrap_or(&[]),
                        Some("--config" | "-v" | "--verbose") => rest = &rest[1..],
                        _ => break,
                    }
                }
                let mut path = "zkguard".to_string();
                while let Some(word) = rest.first() {
                    let longer = format!("{path} {word}");
                    if commands.contains_key(&longer) {
                        path = longer;
                        rest = &rest[1..];
                    } else {
                        break;
                    }
                }
                if path == "zkguard" {
                    if let Some(word) = rest.first() {
                        let word_like = word.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                            && !word.starts_with('-');
                        if leading && word_like {
                            problems.push(format!("{name}:{line}: no command `zkguard {word}`"));
                        }
                    }
                }
                let known = &commands[&path];
                for t in rest {
                    if let Some(f) = flag(t) {
                        if !known.contains(&f) {
                            problems.push(format!("{name}:{line}: `{path}` has no option {f}"));
                        }
                    }
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "options or commands that do not exist (docs/reference/cli.md lists those that do):\n{}",
        problems.join("\n")
    );
}

/// Last parts that make a word a file name rather than a key (`server.rs`, `txn.md`).
const EXTENSIONS: [&str; 20] = [
    "rs",
    "md",
    "json",
    "jsonl",
    "yaml",
    "yml",
    "toml",
    "py",
    "js",
    "mts",
    "ts",
    "properties",
    "service",
    "css",
    "html",
    "sh",
    "txt",
    "pem",
    "cfg",
    "log",
];

/// Words of `text` that look like configuration keys: a key's first part (`zookeeper`,
/// `server`, ...), a dot, more parts; not part of a path, a Rust path or a method call.
fn key_like(text: &str, prefixes: &BTreeSet<&str>) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let boundary = i == 0 || {
            let p = bytes[i - 1];
            !(p.is_ascii_alphanumeric() || b"_./-:$@{".contains(&p))
        };
        if !(boundary && c.is_ascii_lowercase()) {
            i += 1;
            continue;
        }
        let end = i + bytes[i..]
            .iter()
            .take_while(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || **b == b'.' || **b == b'*'
            })
            .count();
        let word = &text[i..end];
        i = end.max(i + 1);
        let next = bytes.get(end).copied();
        if next.is_some_and(|n| n.is_ascii_alphanumeric() || b"_(-".contains(&n)) {
            continue;
        }
        let word = word.trim_end_matches(['.', '*']);
        let mut parts = word.split('.');
        let first = parts.next().unwrap_or_default();
        let rest: Vec<&str> = parts.collect();
        if !prefixes.contains(first)
            || rest.is_empty()
            || rest
                .iter()
                .any(|p| p.is_empty() || p.chars().all(|c| c.is_ascii_digit()))
            || EXTENSIONS.contains(rest.last().unwrap())
        {
            continue;
        }
        out.push(word.to_string());
    }
    out
}

#[test]
fn the_docs_use_only_existing_configuration_keys() {
    let keys: BTreeSet<&str> = KEYS.iter().map(|(k, _, _)| *k).collect();
    let prefixes: BTreeSet<&str> = keys.iter().map(|k| k.split('.').next().unwrap()).collect();
    // A key, or the namespace of some (`server.gateway` for `server.gateway.*`).
    // `*` stands for any one part (`zookeeper.*.task.timeout`).
    let exists = |word: &str| {
        let parts: Vec<&str> = word.split('.').collect();
        keys.iter().any(|k| {
            let key: Vec<&str> = k.split('.').collect();
            key.len() >= parts.len() && parts.iter().zip(&key).all(|(p, k)| *p == "*" || p == k)
        })
    };
    let mut problems = Vec::new();
    for doc in documents() {
        let name = doc.strip_prefix(repo()).unwrap().display().to_string();
        for (i, line) in read(&doc).lines().enumerate() {
            for word in key_like(line, &prefixes) {
                if !exists(&word) {
                    problems.push(format!("{name}:{}: no key `{word}`", i + 1));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "configuration keys that do not exist (docs/reference/config.md lists those that do):\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_checks_catch_what_they_look_for() {
    let prefixes: BTreeSet<&str> = ["server", "lock", "zookeeper"].into();
    assert_eq!(
        key_like("set `server.listn=1` and lock.backend.", &prefixes),
        ["server.listn", "lock.backend"]
    );
    assert!(key_like(
        "see src/server.rs, zkguard::lock::x, lock.unlock(), server.1=a, self.lock.x",
        &prefixes
    )
    .is_empty());
    let found = invocations("ZKGUARD_X=1 zkguard --config f dlq replay --al | jq --raw");
    assert_eq!(found.len(), 1);
    assert!(found[0].0);
    assert_eq!(found[0].1, ["--config", "f", "dlq", "replay", "--al"]);
    assert_eq!(flag("[--type").as_deref(), Some("--type"));
    assert_eq!(flag("--timeout=2s").as_deref(), Some("--timeout"));
    assert_eq!(flag("-vv").as_deref(), Some("-v"));
    assert_eq!(flag("ID"), None);
}
