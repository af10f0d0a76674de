//! Usage errors as one line: clap's error (`error: ...`, an indented list, tips, a usage block,
//! a hint) folded into the sentence every other error of zkguard is, with a suggestion for an
//! unknown command that a synonym names (`deadletters` for `dlq`).

/// Words people type for a command, and the command they mean: `(command path, word, meant)`.
/// Only words that are not commands themselves and that clap's own edit-distance suggestion
/// does not reach; they only suggest, they never run anything.
const SYNONYMS: &[(&str, &str, &str)] = &[
    ("zkguard", "deadletters", "dlq"),
    ("zkguard", "deadletter", "dlq"),
    ("zkguard", "dead-letters", "dlq"),
    ("zkguard", "dead-letter", "dlq"),
    ("zkguard", "dead-letter-queue", "dlq"),
    ("zkguard", "parked", "dlq"),
    ("zkguard", "transactions", "txn"),
    ("zkguard", "transaction", "txn"),
    ("zkguard", "transfer", "txn transfer"),
    ("zkguard", "tx", "txn"),
    ("zkguard", "lock", "exec"),
    ("zkguard", "run", "exec"),
    ("zkguard", "with-lock", "exec"),
    ("zkguard", "status", "locks"),
    ("zkguard", "list", "locks"),
    ("zkguard", "queue", "locks"),
    ("zkguard", "holders", "locks"),
    ("zkguard", "benchmark", "bench"),
    ("zkguard", "server", "serve"),
    ("zkguard", "service", "serve"),
    ("zkguard", "daemon", "serve"),
    ("zkguard", "start", "serve"),
    ("zkguard", "configuration", "config"),
    ("zkguard", "conf", "config"),
    ("zkguard", "settings", "config show"),
    ("zkguard", "check", "config check"),
    ("zkguard", "validate", "config check"),
    ("zkguard", "api", "openapi"),
    ("zkguard", "swagger", "openapi"),
    ("zkguard", "spec", "openapi"),
    ("zkguard", "completion", "completions"),
    ("zkguard dlq", "ls", "list"),
    ("zkguard dlq", "show", "list"),
    ("zkguard dlq", "retry", "replay"),
    ("zkguard dlq", "requeue", "replay"),
    ("zkguard dlq", "delete", "discard"),
    ("zkguard dlq", "remove", "discard"),
    ("zkguard dlq", "drop", "discard"),
    ("zkguard dlq", "purge", "discard"),
    ("zkguard txn", "status", "show"),
    ("zkguard txn", "get", "show"),
    ("zkguard txn", "abort", "rollback"),
    ("zkguard txn", "undo", "rollback"),
    ("zkguard txn", "resume", "recover"),
    ("zkguard txn", "check", "audit"),
    ("zkguard config", "validate", "check"),
    ("zkguard config", "print", "show"),
    ("zkguard config", "get", "show"),
];

/// The command meant by `word` typed where a subcommand of `path` (`zkguard`, `zkguard dlq`)
/// was expected, from [`SYNONYMS`] (case-insensitive).
pub fn synonym(path: &str, word: &str) -> Option<String> {
    let word = word.to_ascii_lowercase();
    SYNONYMS
        .iter()
        .find(|(p, w, _)| *p == path && *w == word)
        .map(|(p, _, meant)| format!("{p} {meant}"))
}

/// clap's usage error as the one line every other error of zkguard is: the message (a list that
/// clap indents under a line ending in `:` joined into it), the tips, a suggestion for an unknown
/// command typed as a synonym (`invalid_subcommand`, when clap suggested nothing), the usage,
/// and where the help is.
pub fn one_line(full: &str, invalid_subcommand: Option<&str>) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut usage = None;
    let mut listing = false;
    for raw in full.lines().filter(|l| !l.trim().is_empty()) {
        let line = raw.trim();
        if let Some(u) = line.strip_prefix("Usage:") {
            usage = Some(u.trim().to_string());
            listing = false;
        } else if line.starts_with("For more information") {
            listing = false;
        } else if listing && raw.starts_with(char::is_whitespace) && !line.starts_with("tip:") {
            // An item of the list the previous line announced: `...: a, b`.
            let last = parts.last_mut().expect("a list follows its heading");
            last.push_str(if last.ends_with(':') { " " } else { ", " });
            last.push_str(line);
        } else {
            let line = line.trim_start_matches("error: ").to_string();
            listing = line.ends_with(':');
            parts.push(line);
        }
    }
    let path = usage.as_deref().map_or_else(
        || "zkguard".to_string(),
        |u| {
            // The command's path is the usage's words up to its first option or argument.
            u.split_whitespace()
                .take_while(|w| !w.starts_with(['[', '<', '-']))
                .collect::<Vec<_>>()
                .join(" ")
        },
    );
    let clap_suggested = parts.iter().any(|p| p.contains("similar subcommand"));
    if let Some(meant) = invalid_subcommand
        .filter(|_| !clap_suggested)
        .and_then(|w| synonym(&path, w))
    {
        parts.push(format!("did you mean `{meant}`?"));
    }
    parts.push(match usage {
        Some(usage) => format!("usage: {usage} (see `{path} --help`)"),
        None => "see `zkguard --help`".to_string(),
    });
    join(&parts)
}

/// The parts of a message as one sentence: `; ` between them, a space after a question.
fn join(parts: &[String]) -> String {
    let mut text = String::new();
    for part in parts {
        if !text.is_empty() {
            text.push_str(if text.ends_with('?') { " " } else { "; " });
        }
        text.push_str(part);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_of_missing_arguments_joins_its_heading() {
        let clap = "error: the following required arguments were not provided:\n  --monitor <ID>\n  <CMD>...\n\nUsage: zkguard exec --monitor <ID> -- <CMD>...\n\nFor more information, try '--help'.\n";
        assert_eq!(
            one_line(clap, None),
            "the following required arguments were not provided: --monitor <ID>, <CMD>...; usage: zkguard exec --monitor <ID> -- <CMD>... (see `zkguard exec --help`)"
        );
    }

    #[test]
    fn a_synonym_suggests_its_command_and_a_clap_tip_wins() {
        let clap = "error: unrecognized subcommand 'deadletters'\n\nUsage: zkguard [OPTIONS] <COMMAND>\n\nFor more information, try '--help'.\n";
        assert_eq!(
            one_line(clap, Some("deadletters")),
            "unrecognized subcommand 'deadletters'; did you mean `zkguard dlq`? usage: zkguard [OPTIONS] <COMMAND> (see `zkguard --help`)"
        );
        let typo = "error: unrecognized subcommand 'dql'\n\n  tip: a similar subcommand exists: 'dlq'\n\nUsage: zkguard [OPTIONS] <COMMAND>\n";
        let line = one_line(typo, Some("dql"));
        assert!(
            line.contains("tip: a similar subcommand exists: 'dlq'; usage:"),
            "{line}"
        );
        assert_eq!(
            synonym("zkguard dlq", "Delete").as_deref(),
            Some("zkguard dlq discard")
        );
        assert_eq!(synonym("zkguard", "nothing-like-it"), None);
    }
}
