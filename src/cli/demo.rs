//! `zkguard demo` (under construction).

use zkguard::config::Settings;

use super::CliError;

/// Arguments of `zkguard demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {}

/// Runs `zkguard demo`.
pub async fn run(_settings: Settings, _args: DemoArgs) -> Result<u8, CliError> {
    Err(CliError::new(super::EX_SOFTWARE, "`zkguard demo` is not available in this build yet"))
}
