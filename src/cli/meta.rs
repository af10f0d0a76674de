//! `zkguard completions SHELL` and `zkguard man`: shell completion scripts and the man page,
//! generated from the command-line definition.

use super::man::write_stdout;
use super::CliError;

/// Arguments of `zkguard completions`.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to write the completion script for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Writes the completion script for `args.shell` to stdout, for the command line `command`.
pub fn completions(command: clap::Command, args: &CompletionsArgs) -> Result<u8, CliError> {
    let mut script = Vec::new();
    let mut command = super::man::visible(&command);
    clap_complete::generate(args.shell, &mut command, "zkguard", &mut script);
    write_stdout(&script)?;
    Ok(0)
}
