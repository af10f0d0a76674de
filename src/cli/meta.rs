//! `zkguard completions SHELL` and `zkguard man`: shell completion scripts and the man page,
//! generated from the command-line definition.

use super::{CliError, EX_SOFTWARE};

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
