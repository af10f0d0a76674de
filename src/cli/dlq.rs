//! `zkguard dlq` (under construction).

use zkguard::config::Settings;

use super::CliError;

/// Arguments of `zkguard dlq`.
#[derive(Debug, clap::Args)]
pub struct DlqArgs {}

/// Runs `zkguard dlq`.
pub async fn run(_settings: Settings, _args: DlqArgs) -> Result<u8, CliError> {
    Err(CliError::new(super::EX_SOFTWARE, "`zkguard dlq` is not available in this build yet"))
}
