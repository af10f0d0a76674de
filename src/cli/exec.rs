//! `zkguard exec` (under construction).

use zkguard::config::Settings;

use super::CliError;

/// Arguments of `zkguard exec`.
#[derive(Debug, clap::Args)]
pub struct ExecArgs {}

/// Runs `zkguard exec`.
pub async fn run(_settings: Settings, _args: ExecArgs) -> Result<u8, CliError> {
    Err(CliError::new(super::EX_SOFTWARE, "`zkguard exec` is not available in this build yet"))
}
