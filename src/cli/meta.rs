//! `zkguard completions SHELL` and `zkguard man`: shell completion scripts and the man page,
//! generated from the command-line definition.

use clap::CommandFactory;

use super::{CliError, EX_SOFTWARE};
use crate::Cli;

/// Arguments of `zkguard completions`.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to write the completion script for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Writes the completion script for `args.shell` to stdout.
pub fn completions(args: &CompletionsArgs) -> Result<u8, CliError> {
    let mut command = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "zkguard", &mut script);
    write_stdout(&script)?;
    Ok(0)
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

/// Writes the man page `zkguard(1)` (roff) to stdout.
pub fn man() -> Result<u8, CliError> {
    let command = Cli::command();
    let mut page = Vec::new();
    clap_mangen::Man::new(command)
        .render(&mut page)
        .map_err(|e| CliError::new(EX_SOFTWARE, format!("cannot render the man page: {e}")))?;
    write_stdout(&page)?;
    Ok(0)
}
