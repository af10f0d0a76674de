//! `zkguard locks` (under construction).

use zkguard::config::Settings;

use super::CliError;

/// Arguments of `zkguard locks`.
#[derive(Debug, clap::Args)]
pub struct LocksArgs {}

/// Runs `zkguard locks`.
pub async fn run(_settings: Settings, _args: LocksArgs) -> Result<u8, CliError> {
    Err(CliError::new(super::EX_SOFTWARE, "`zkguard locks` is not available in this build yet"))
}
