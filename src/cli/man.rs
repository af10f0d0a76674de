//! `zkguard man`: the man page zkguard(1), one page for every command, with the sections a man
//! page reader looks for (EXIT STATUS, ENVIRONMENT, FILES); and the command tree as users see it
//! (hidden, test-only options left out), which the completion scripts are generated from too.

use std::fmt::Write as _;

use clap::Command;
use zkguard::config::{env_var_for, KEYS};

use super::{CliError, EX_SOFTWARE};
use crate::exit::EXIT_STATUSES;

/// The command tree without hidden commands and options (test hooks such as
/// `txn transfer --crash-after`): what completions offer and the man page describes.
pub fn visible(cmd: &Command) -> Command {
    let mut out = Command::new(cmd.get_name().to_string())
        .disable_help_subcommand(true)
        .args_conflicts_with_subcommands(cmd.is_args_conflicts_with_subcommands_set());
    if let Some(v) = cmd.get_version() {
        out = out.version(v.to_string());
    }
    if let Some(a) = cmd.get_about() {
        out = out.about(a.clone());
    }
    if let Some(a) = cmd.get_long_about() {
        out = out.long_about(a.clone());
    }
    if let Some(u) = cmd.get_overridden_usage() {
        out = out.override_usage(u.clone());
    }
    for a in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        out = out.arg(a.clone());
    }
    out = with_groups(out, cmd, |a| !a.is_hide_set());
    for s in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        out = out.subcommand(visible(s));
    }
    out
}

/// `out` with the groups of `cmd`, each holding only its arguments that `keep` accepts (a group
/// left empty is dropped): clap refuses a group that names an argument the command lacks.
fn with_groups(mut out: Command, cmd: &Command, keep: impl Fn(&clap::Arg) -> bool) -> Command {
    for g in cmd.get_groups() {
        let members: Vec<_> = g
            .get_args()
            .filter(|id| cmd.get_arguments().any(|a| a.get_id() == *id && keep(a)))
            .cloned()
            .collect();
        if !members.is_empty() {
            out = out.group(
                clap::ArgGroup::new(g.get_id().clone())
                    .args(members)
                    .required(g.is_required_set())
                    .multiple(g.clone().is_multiple()),
            );
        }
    }
    out
}

/// Writes `bytes` to stdout; a reader that went away (`| head`) is not an error.
pub fn write_stdout(bytes: &[u8]) -> Result<(), CliError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(CliError::new(
            EX_SOFTWARE,
            format!("cannot write to standard output: {e}"),
        )),
        _ => Ok(()),
    }
}

/// Writes the man page `zkguard(1)` (roff) of the command line `command` to stdout.
pub fn man(command: Command) -> Result<u8, CliError> {
    let page = render(command)
        .map_err(|e| CliError::new(EX_SOFTWARE, format!("cannot render the man page: {e}")))?;
    write_stdout(page.as_bytes())?;
    Ok(0)
}

fn render(command: Command) -> std::io::Result<String> {
    let mut root = visible(&command).bin_name("zkguard");
    root.build();
    let mut page = Vec::new();
    let man = clap_mangen::Man::new(root.clone());
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    man.render_options_section(&mut page)?;
    let mut page = String::from_utf8_lossy(&page).into_owned();
    page.push_str(".SH COMMANDS\n");
    let inherited: Vec<clap::Id> = root
        .get_arguments()
        .filter(|a| a.is_global_set())
        .map(|a| a.get_id().clone())
        .collect();
    for sub in root.get_subcommands() {
        commands(&mut page, sub, &inherited)?;
    }
    page.push_str(&sections());
    let mut version = Vec::new();
    man.render_version_section(&mut version)?;
    page.push_str(&String::from_utf8_lossy(&version));
    Ok(page)
}

/// One subsection per command, `zkguard dlq replay` and the like: usage, description, options.
fn commands(page: &mut String, cmd: &Command, inherited: &[clap::Id]) -> std::io::Result<()> {
    let name = cmd
        .get_bin_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_string();
    let _ = writeln!(page, ".SS \"{}\"", escape(&name));
    let mut own = Command::new(cmd.get_name().to_string())
        .bin_name(name.clone())
        .disable_help_flag(true)
        .disable_version_flag(true);
    if let Some(a) = cmd.get_about() {
        own = own.about(a.clone());
    }
    if let Some(a) = cmd.get_long_about() {
        own = own.long_about(a.clone());
    }
    // Options of this command: not those it inherits (the global ones of its parents, shown
    // there), nor help and version.
    let shown = |a: &clap::Arg| {
        !inherited.contains(a.get_id()) && a.get_id() != "help" && a.get_id() != "version"
    };
    for a in cmd.get_arguments().filter(|a| shown(a)) {
        own = own.arg(a.clone());
    }
    own = with_groups(own, cmd, shown);
    for s in cmd.get_subcommands() {
        own = own.subcommand(Command::new(s.get_name().to_string()));
    }
    let man = clap_mangen::Man::new(own);
    for part in [
        clap_mangen::Man::render_synopsis_section
            as fn(&clap_mangen::Man, &mut dyn std::io::Write) -> std::io::Result<()>,
        clap_mangen::Man::render_description_section,
        clap_mangen::Man::render_options_section,
    ] {
        let mut out = Vec::new();
        part(&man, &mut out)?;
        // The section headings become paragraphs of this command's subsection.
        for line in String::from_utf8_lossy(&out).lines() {
            if line.starts_with(".SH ") {
                page.push_str(".PP\n");
            } else {
                page.push_str(line);
                page.push('\n');
            }
        }
    }
    let mut inherited = inherited.to_vec();
    inherited.extend(
        cmd.get_arguments()
            .filter(|a| a.is_global_set())
            .map(|a| a.get_id().clone()),
    );
    for s in cmd.get_subcommands() {
        commands(page, s, &inherited)?;
    }
    Ok(())
}

/// Text for roff: backslashes and hyphens escaped, no line starting with a control character.
fn escape(text: &str) -> String {
    let t = text.replace('\\', "\\\\").replace('-', "\\-");
    if t.starts_with('.') || t.starts_with('\'') {
        format!("\\&{t}")
    } else {
        t
    }
}

fn entry(page: &mut String, tag: &str, text: &str) {
    let _ = writeln!(page, ".TP\n\\fB{}\\fR\n{}", escape(tag), escape(text));
}

/// EXIT STATUS, ENVIRONMENT, FILES and SEE ALSO.
fn sections() -> String {
    let mut p = String::from(".SH \"EXIT STATUS\"\n");
    for status in EXIT_STATUSES {
        let code = status
            .code
            .map_or_else(|| "other".to_string(), |c| c.to_string());
        entry(&mut p, &code, &status.meaning.replace('`', ""));
    }
    p.push_str(".SH ENVIRONMENT\n");
    entry(
        &mut p,
        "ZKGUARD_CONFIG",
        "the properties file to read, as --config FILE (which wins)",
    );
    entry(
        &mut p,
        "RUST_LOG",
        "log filter (for example zkguard=debug); overrides -v",
    );
    entry(
        &mut p,
        "XDG_STATE_HOME, HOME",
        "where state.dir defaults to: $XDG_STATE_HOME/zkguard, else $HOME/.local/state/zkguard, else /var/lib/zkguard",
    );
    entry(
        &mut p,
        "ZKGUARD_FENCING_TOKEN, ZKGUARD_MONITOR, ZKGUARD_LOCK_TYPE, ZKGUARD_EXEC_LOCK_BACKEND, ZKGUARD_EXEC_ELASTICSEARCH_URL",
        "set by zkguard exec for its command: the lock's fencing token (write it as the document's external version), monitor, lock type and backend, and the cluster's URL (the first of elasticsearch.url, without credentials or a trailing /)",
    );
    entry(
        &mut p,
        "ZKGUARD_LOCK_BACKEND",
        "the override of lock.backend; one that disagrees with the configuration file is refused (78). zkguard exec also sets it for its command, deprecated (read ZKGUARD_EXEC_LOCK_BACKEND): a zkguard run by the command without a lock.backend of its own uses the same backend, and one whose file names another backend keeps it when ZKGUARD_LOCK_BACKEND equals ZKGUARD_EXEC_LOCK_BACKEND",
    );
    p.push_str(".PP\nEvery configuration key can be set by a variable named after it, which overrides the file:\n");
    for (key, default, _) in KEYS {
        let default = if default.is_empty() {
            "empty".to_string()
        } else {
            format!("default {default}")
        };
        entry(&mut p, &env_var_for(key), &format!("{key} ({default})"));
    }
    p.push_str(".SH FILES\n");
    entry(
        &mut p,
        "FILE of --config or ZKGUARD_CONFIG",
        "Java properties file of settings; without one, the built-in defaults apply (zkguard config show prints the effective settings and where each comes from). The source's conf/zkguard.properties documents every key",
    );
    entry(
        &mut p,
        "$XDG_STATE_HOME/zkguard (state.dir)",
        "zkguard's own files when their paths are relative: zkguard-deadletters.jsonl (deadletter.file.path, the dead letters of deadletter.sink=file and the fallback of the Kafka sink) and zkguard-journal.jsonl (server.journal.path, the write-ahead journal of zkguard serve)",
    );
    p.push_str(".SH \"SEE ALSO\"\n.PP\nzkguard \\-\\-help and zkguard COMMAND \\-\\-help; zkguard completions SHELL; the README and the docs directory of the zkguard source, which explain the lock protocol, fencing, the HTTP service and the transactions.\n");
    p
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn roff_text_is_escaped() {
        assert_eq!(escape("--id"), "\\-\\-id");
        assert_eq!(escape(".hidden"), "\\&.hidden");
        assert_eq!(escape("a\\b"), "a\\\\b");
    }
}
