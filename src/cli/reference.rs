//! `zkguard reference cli|config|exit-status|http`: the references under `docs/reference/`,
//! generated from their definitions (the command-line definition, the configuration keys, the
//! exit statuses, the OpenAPI document). `make reference` rewrites the committed files and
//! `tests/cli/reference.rs` fails while they differ from what this prints.

use std::fmt::Write as _;

use clap::{Arg, Command};
use zkguard::config::{env_var_for, is_secret_key, KEYS};

use super::man::write_stdout;
use super::CliError;
use crate::exit::EXIT_STATUSES;

/// Arguments of `zkguard reference`.
#[derive(Debug, clap::Args)]
pub struct ReferenceArgs {
    /// Which reference to print (Markdown).
    #[arg(value_enum)]
    pub which: Which,
}

/// The generated references.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Which {
    /// Every command and option (`docs/reference/cli.md`).
    Cli,
    /// Every configuration key (`docs/reference/config.md`).
    Config,
    /// Every exit status (`docs/reference/exit-status.md`).
    ExitStatus,
    /// Every route of `zkguard serve` (`docs/reference/http.md`).
    Http,
}

/// Prints the reference `args.which`; `command` is the command line, `openapi` the service's
/// OpenAPI document.
pub fn run(args: &ReferenceArgs, command: Command, openapi: &str) -> Result<u8, CliError> {
    let text = match args.which {
        Which::Cli => cli(command),
        Which::Config => config(),
        Which::ExitStatus => exit_status(),
        Which::Http => http(openapi).map_err(|e| {
            CliError::new(
                super::EX_SOFTWARE,
                format!("cannot read the OpenAPI document: {e}"),
            )
        })?,
    };
    write_stdout(text.as_bytes())?;
    Ok(0)
}

fn generated(what: &str, command: &str) -> String {
    format!(
        "<!-- Generated from {what} by `zkguard reference {command}`: do not edit. `make reference` rewrites this file; tests/cli/reference.rs fails while it differs. -->\n\n"
    )
}

/// Text for a Markdown table cell: one line, `|` escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// The command-line reference: every command with its usage and options (hidden ones, such as
/// `man` and the test hooks, marked).
pub fn cli(command: Command) -> String {
    let mut root = command.bin_name("zkguard");
    root.build();
    let mut out = generated("the command-line definition", "cli");
    out.push_str("# Command-line reference\n\n");
    out.push_str(
        "Every command of `zkguard` and every option it takes, as `zkguard COMMAND --help` prints them. \
         Durations are milliseconds or carry a unit (`500ms`, `2s`, `5m`), at most `7d`. \
         The options of `zkguard` itself are global: they go before or after the command. \
         What each command prints and how it ends: the [exit statuses](exit-status.md); \
         the settings every command reads: the [configuration reference](config.md).\n\n",
    );
    out.push_str("Commands:\n\n");
    let mut index = String::new();
    toc(&mut index, &root, 0);
    out.push_str(&index);
    out.push('\n');
    command_section(&mut out, &mut root, &[]);
    out
}

fn path_of(cmd: &Command) -> String {
    cmd.get_bin_name().unwrap_or(cmd.get_name()).to_string()
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn about(cmd: &Command) -> String {
    cmd.get_long_about()
        .or(cmd.get_about())
        .map(|a| a.to_string())
        .unwrap_or_default()
}

fn toc(out: &mut String, cmd: &Command, depth: usize) {
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let path = path_of(sub);
        let _ = writeln!(
            out,
            "{}- [`{path}`](#{}): {}",
            "  ".repeat(depth),
            anchor(&path),
            cell(&first_line(&about(sub)))
        );
        toc(out, sub, depth + 1);
    }
}

fn first_line(text: &str) -> String {
    text.split("\n\n").next().unwrap_or_default().to_string()
}

/// Options listed: all but help and version; hidden ones (test hooks) are marked as such.
fn shown(a: &Arg) -> bool {
    a.get_id() != "help" && a.get_id() != "version"
}

/// How an option is written: `--timeout <DURATION>`, `-v, --verbose`, `<CMD>...`.
fn spelling(a: &Arg) -> String {
    let values = a
        .get_value_names()
        .map(|v| v.iter().map(|n| format!("<{n}>")).collect::<Vec<_>>())
        .unwrap_or_else(|| vec![format!("<{}>", a.get_id().as_str().to_uppercase())]);
    if a.is_positional() {
        let mut s = values.join(" ");
        if a.get_num_args().is_some_and(|n| n.max_values() > 1) || a.is_last_set() {
            s.push_str("...");
        }
        if a.is_last_set() {
            s = format!("-- {s}");
        }
        return s;
    }
    let mut names = Vec::new();
    if let Some(s) = a.get_short() {
        names.push(format!("-{s}"));
    }
    if let Some(l) = a.get_long() {
        names.push(format!("--{l}"));
    }
    let mut s = names.join(", ");
    if a.get_action().takes_values() {
        s.push(' ');
        s.push_str(&values.join(" "));
    }
    s
}

/// The details of an option: its help, its values, default and variable.
fn details(a: &Arg) -> String {
    let mut text = a
        .get_long_help()
        .or(a.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    let mut extra = Vec::new();
    let possible: Vec<String> = a
        .get_possible_values()
        .iter()
        .filter(|p| !p.is_hide_set())
        .map(|p| format!("`{}`", p.get_name()))
        .collect();
    if !possible.is_empty() && a.get_action().takes_values() {
        extra.push(format!("one of {}", possible.join(", ")));
    }
    let defaults: Vec<String> = a
        .get_default_values()
        .iter()
        .map(|d| format!("`{}`", d.to_string_lossy()))
        .collect();
    if !defaults.is_empty() && a.get_action().takes_values() {
        extra.push(format!("default {}", defaults.join(", ")));
    }
    if let Some(env) = a.get_env() {
        extra.push(format!("variable `{}`", env.to_string_lossy()));
    }
    if a.is_required_set() {
        extra.push("required".into());
    }
    if a.is_hide_set() {
        extra.push("hidden: for tests and demonstrations, not in the help, the man page or the completions".into());
    }
    if !extra.is_empty() {
        let _ = write!(text, " ({})", extra.join("; "));
    }
    cell(&text)
}

fn command_section(out: &mut String, cmd: &mut Command, inherited: &[(String, String)]) {
    let path = path_of(cmd);
    let _ = writeln!(out, "## {path}\n");
    let text = about(cmd);
    if !text.is_empty() {
        let _ = writeln!(out, "{}\n", text.trim());
    }
    let usage = cmd.render_usage().to_string();
    let usage = usage.trim_start_matches("Usage:").trim();
    let _ = writeln!(out, "```text\n{usage}\n```\n");
    let globals: Vec<String> = inherited.iter().map(|(_, id)| id.clone()).collect();
    let own: Vec<&Arg> = cmd
        .get_arguments()
        .filter(|a| shown(a) && !(a.is_global_set() && globals.contains(&a.get_id().to_string())))
        .collect();
    if !own.is_empty() {
        out.push_str("| option | description |\n| --- | --- |\n");
        for a in &own {
            let _ = writeln!(out, "| `{}` | {} |", cell(&spelling(a)), details(a));
        }
        out.push('\n');
    }
    if !inherited.is_empty() {
        let list: Vec<String> = inherited.iter().map(|(s, _)| format!("`{s}`")).collect();
        let _ = writeln!(out, "Global options: {}.\n", list.join(", "));
    }
    let mut inherited = inherited.to_vec();
    for a in own.iter().filter(|a| a.is_global_set()) {
        inherited.push((spelling(a), a.get_id().to_string()));
    }
    for sub in cmd.get_subcommands_mut().filter(|s| s.get_name() != "help") {
        command_section(out, sub, &inherited);
    }
}

/// What the configuration reference says of a secret.
fn secret(key: &str) -> &'static str {
    if key.ends_with(".tls.key") {
        "the path of a private key; `config show` prints `***`"
    } else if is_secret_key(key) {
        "yes: `config show` prints `***`"
    } else if key == "elasticsearch.url" {
        "user-info in URLs is shown as `***`"
    } else if key
        .strip_suffix(".file")
        .is_some_and(|base| is_secret_key(base) || base.ends_with("tokens"))
    {
        "the path of a file holding secrets"
    } else {
        ""
    }
}

/// The configuration reference: every key with its default, description, variable and whether
/// it is a secret, grouped by namespace.
pub fn config() -> String {
    let mut out = generated("the configuration keys", "config");
    out.push_str("# Configuration reference\n\n");
    out.push_str(
        "zkguard reads Java `.properties` files (`--config FILE`, or the variable `ZKGUARD_CONFIG`); \
         [conf/zkguard.properties](../../conf/zkguard.properties) lists every key with its default and a comment. \
         Any key is overridden by the environment variable named `ZKGUARD_` + the key in upper case with dots replaced by underscores \
         (`zookeeper.session.timeout`: `ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT`), which wins over the file.\n\n\
         - Durations are milliseconds (`2000`) or carry a unit (`2s`), at most `7d`.\n\
         - A wrong value stops zkguard at start (exit 78) naming the key, the value and the file or variable; \
         an unknown key in a zkguard namespace is an error with a \"did you mean\" hint, and a `ZKGUARD_` variable that names no key draws a warning with the same hint \
         (zkguard's own variables excepted: `ZKGUARD_CONFIG`, those `zkguard exec` gives its command, the test kit's).\n\
         - Secrets: `zkguard config show` prints `***` for the value of any key whose name ends in `password`, `secret`, `token`, `key` or `credentials`, \
         and for the user-info of URLs; a file that holds a secret and that every user may read draws a warning. \
         Each inline secret has a `.file` key naming a file that holds it instead (see [security](../security.md)).\n\
         - `zkguard config check` validates a configuration without connecting to anything; `zkguard config show` prints every key's effective value and where it came from.\n\n",
    );
    let mut groups: Vec<(&str, Vec<&Key>)> = Vec::new();
    for entry in KEYS {
        let ns = namespace(entry.0);
        match groups.iter_mut().find(|(n, _)| *n == ns) {
            Some((_, keys)) => keys.push(entry),
            None => groups.push((ns, vec![entry])),
        }
    }
    for (ns, _) in &groups {
        let _ = writeln!(out, "- [`{ns}.*`](#{})", anchor(ns));
    }
    out.push('\n');
    for (ns, keys) in groups {
        let _ = writeln!(out, "## {ns}.*\n");
        out.push_str("| key | default | description | variable | secret |\n| --- | --- | --- | --- | --- |\n");
        for (key, default, description) in keys {
            let default = if default.is_empty() {
                "(empty)".to_string()
            } else {
                format!("`{default}`")
            };
            let mut description = description.to_string();
            if let Some((_, note)) = NOTES.iter().find(|(k, _)| k == key) {
                let _ = write!(description, "; {note}");
            }
            let _ = writeln!(
                out,
                "| `{key}` | {default} | {} | `{}` | {} |",
                cell(&description),
                env_var_for(key),
                secret(key)
            );
        }
        out.push('\n');
    }
    out
}

/// The heading a key is listed under: its first part (`zookeeper`, `server`, ...).
fn namespace(key: &str) -> &str {
    key.split('.').next().unwrap_or(key)
}

/// A configuration key: name, default, description.
type Key = (&'static str, &'static str, &'static str);

/// What the reference adds to a key's description in `KEYS`: consequences and links.
const NOTES: &[(&str, &str)] = &[
    ("zookeeper.servers", "checked at load (ports 1 to 65535, non-empty hosts, a valid path); the chroot must exist on the server (exit 78, saying how to create it)"),
    ("zookeeper.session.timeout", "a crashed holder's lock passes on after about this long"),
    ("zookeeper.lock.loss.grace", "the bound: 3/4 of the session timeout less the client's longest silence between pings less 1/20 of it (half the session timeout without TLS); see [the lock design](../zookeeper-lock.md)"),
    ("zookeeper.auth.scheme", "see [security](../security.md)"),
    ("zookeeper.sasl.mechanism", "any other mechanism is refused (exit 78)"),
    ("zookeeper.acl", "a lock root with another ACL is refused (exit 78); see [security](../security.md)"),
    ("elastic.stamp.window", "see [fencing](../fencing.md#the-zkguard-field-operation-ids-and-retries-without-double-application)"),
    ("elasticsearch.url", "`http://user:password@host` credentials are used as basic authentication unless `elasticsearch.username` and `elasticsearch.password` are set (both is an error), and never shown in messages"),
    ("elasticsearch.api.key", "not with basic authentication (exit 78)"),
    ("elasticsearch.tls.cert", "both or neither"),
    ("deadletter.sink", "see [dead letters](../dead-letters.md)"),
    ("deadletter.kafka.brokers", "`deadletter.sink=kafka` without brokers is an error (exit 78); see [dead letters in Kafka](../dead-letters.md#dead-letters-in-kafka)"),
    ("deadletter.kafka.topic", "replay offsets go to `<topic>-offsets`"),
    ("deadletter.kafka.auto.create", "false: a missing topic is an error (exit 78)"),
    ("deadletter.kafka.delivery.timeout", "also how long `zkguard dlq` waits for a broker"),
    ("lock.backend", "for `zkguard exec`, guarded writes, background operations, the service and the demo; see [the lease lock](../eslock.md)"),
    ("elasticsearch.lock.clock.skew", "less than half the lease"),
    ("txn.log.index", "see [transactions](../transactions.md)"),
    ("server.journal.skip.corrupt", "refusing to start exits 65"),
    ("server.body.timeout", "the answer is 408 `body_timeout`"),
    ("server.auth.tokens.file", "`/v1` requests then need `Authorization: Bearer <token>`; without tokens keep the service on loopback"),
    ("server.ui.enabled", "see [the status page](../operations.md#the-status-page)"),
    ("server.gateway.listen", "see [the gate](../gateway.md)"),
];

/// The exit-status reference.
pub fn exit_status() -> String {
    let mut out = generated("the exit statuses", "exit-status");
    out.push_str("# Exit statuses\n\n");
    out.push_str(
        "Every zkguard command ends with one of these statuses (the [sysexits](https://man.freebsd.org/cgi/man.cgi?query=sysexits) values where one fits). \
         An error is one line on stderr starting with `zkguard:`; with `--json` it is `{\"error\": KIND, \"message\": TEXT}`, \
         KIND following the status as below, and warnings are `{\"warning\": KIND, \"message\": TEXT}` lines.\n\n",
    );
    out.push_str("| status | name | `--json` error | meaning |\n| --- | --- | --- | --- |\n");
    for s in EXIT_STATUSES {
        let code = s
            .code
            .map_or_else(|| "other".to_string(), |c| c.to_string());
        let name = if s.name.is_empty() {
            String::new()
        } else {
            format!("`{}`", s.name)
        };
        let kind = s.kind.map(|k| format!("`{k}`")).unwrap_or_default();
        let _ = writeln!(out, "| {code} | {name} | {kind} | {} |", cell(s.meaning));
    }
    out
}

/// The HTTP reference: every route of the OpenAPI document, then the service's other routes.
pub fn http(openapi: &str) -> Result<String, serde_json::Error> {
    let doc: serde_json::Value = serde_json::from_str(openapi)?;
    let mut out = generated("the OpenAPI document", "http");
    out.push_str("# HTTP reference\n\n");
    out.push_str(
        "The routes of `zkguard serve`. The API's contract is its OpenAPI 3.1 document, \
         [openapi.json](../openapi.json) (also served at `GET /openapi.json` and printed by `zkguard openapi`): \
         every parameter, body and answer. [The service's guide](../serve.md) explains each route, status and guarantee; \
         [the gate](../gateway.md) describes the Elasticsearch-compatible API that `server.gateway.listen` adds.\n\n",
    );
    out.push_str("| method | path | what it does |\n| --- | --- | --- |\n");
    let methods = ["get", "put", "post", "patch", "delete"];
    if let Some(paths) = doc["paths"].as_object() {
        for (path, item) in paths {
            for method in methods {
                if let Some(op) = item.get(method) {
                    let summary = op["summary"].as_str().unwrap_or_default();
                    let _ = writeln!(
                        out,
                        "| `{}` | `{path}` | {} |",
                        method.to_uppercase(),
                        cell(summary)
                    );
                }
            }
        }
    }
    out.push_str(
        "\nBesides the API:\n\n\
         | method | path | what it does |\n| --- | --- | --- |\n\
         | `GET` | `/openapi.json` | the OpenAPI document above (no token needed) |\n\
         | `GET` | `/docs` | the API's documentation, rendered by Redoc served by the service itself (no token needed) |\n\
         | `GET` | `/ui` | the status page for operators ([operations](../operations.md#the-status-page)); `server.ui.enabled=false` removes it |\n\
         | `GET` | `/ui/status` | the status page's data |\n\
         | any | `server.gateway.listen` | the [Elasticsearch-compatible gate](../gateway.md) |\n",
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_follow_github() {
        assert_eq!(anchor("zkguard dlq replay"), "zkguard-dlq-replay");
        assert_eq!(anchor("server.*"), "server");
    }

    #[test]
    fn notes_name_existing_keys() {
        for (key, _) in NOTES {
            assert!(KEYS.iter().any(|(k, _, _)| k == key), "{key} is no key");
        }
    }
}
