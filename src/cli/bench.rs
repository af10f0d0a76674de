//! `zkguard bench` (under construction).

use zkguard::config::Settings;

use super::CliError;

/// Arguments of `zkguard bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {}

/// Runs `zkguard bench`.
pub async fn run(_settings: Settings, _args: BenchArgs) -> Result<u8, CliError> {
    Err(CliError::new(super::EX_SOFTWARE, "`zkguard bench` is not available in this build yet"))
}
