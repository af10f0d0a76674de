//! `zkguard config`: check a configuration and show the effective settings, without connecting.

use zkguard::config::{EffectiveValue, Settings};

use super::{CliError, EX_SOFTWARE};

/// Arguments of `zkguard config`.
#[derive(Debug, clap::Args)]
pub struct ConfigArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ConfigCommand,
}

/// `zkguard config` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ConfigCommand {
    /// Check the configuration (file and ZKGUARD_* variables) without connecting: exit 0 when
    /// it is valid, 78 naming the first problem otherwise.
    Check(CheckArgs),
    /// Print every setting's effective value and its source (default, file, environment
    /// variable); secrets are shown as `***`.
    Show(ShowArgs),
}

/// `zkguard config check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Print the result as one JSON object (`{"valid", "file", "warnings"}`).
    #[arg(long)]
    pub json: bool,
}

/// `zkguard config show`.
#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// Print a JSON array of `{"key", "value", "source", "origin"}`.
    #[arg(long)]
    pub json: bool,
}

/// Runs `zkguard config`; loads the configuration itself (the other commands get it loaded).
pub fn run(path: Option<&std::path::Path>, args: &ConfigArgs) -> Result<u8, CliError> {
    match &args.command {
        ConfigCommand::Check(a) => {
            let settings = Settings::load(path)?;
            let file = path.map(|p| p.display().to_string());
            if a.json {
                print_json(&serde_json::json!({
                    "valid": true,
                    "file": file,
                    "warnings": settings.warnings,
                }))?;
            } else {
                for w in &settings.warnings {
                    eprintln!("zkguard: warning: {w}");
                }
                match &file {
                    Some(f) => println!("configuration valid: {f} and the environment"),
                    None => println!("configuration valid: defaults and the environment"),
                }
            }
            Ok(0)
        }
        ConfigCommand::Show(a) => {
            // Valid first: `show` prints nothing for a configuration zkguard would refuse.
            for w in &Settings::load(path)?.warnings {
                if a.json {
                    eprintln!("{}", serde_json::json!({"warning": "config", "message": w}));
                } else {
                    eprintln!("zkguard: warning: {w}");
                }
            }
            let values = Settings::effective_values(path, |var| std::env::var(var).ok())?;
            if a.json {
                let list: Vec<_> = values.iter().map(json_entry).collect();
                print_json(&serde_json::Value::Array(list))?;
            } else {
                let width = values.iter().map(|v| v.key.len()).max().unwrap_or(0);
                let mut text = String::new();
                for v in &values {
                    text.push_str(&format!("{:width$}  {}  ({})\n", v.key, v.value, v.source));
                }
                super::man::write_stdout(text.as_bytes())?;
            }
            Ok(0)
        }
    }
}

fn json_entry(v: &EffectiveValue) -> serde_json::Value {
    use zkguard::config::ValueSource;
    let origin = match &v.source {
        ValueSource::Default => serde_json::Value::Null,
        ValueSource::File(p) => p.display().to_string().into(),
        ValueSource::Environment(var) => var.clone().into(),
        _ => v.source.to_string().into(),
    };
    serde_json::json!({
        "key": v.key,
        "value": v.value,
        "source": v.source.kind(),
        "origin": origin,
    })
}

fn print_json(value: &serde_json::Value) -> Result<(), CliError> {
    let mut text =
        serde_json::to_string_pretty(value).map_err(|e| CliError::new(EX_SOFTWARE, e))?;
    text.push('\n');
    super::man::write_stdout(text.as_bytes())
}
