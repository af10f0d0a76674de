//! `zkguard txn` (under construction).

use zkguard::config::Settings;

use super::CliError;

/// Arguments of `zkguard txn`.
#[derive(Debug, clap::Args)]
pub struct TxnArgs {}

/// Runs `zkguard txn`.
pub async fn run(_settings: Settings, _args: TxnArgs) -> Result<u8, CliError> {
    Err(CliError::new(super::EX_SOFTWARE, "`zkguard txn` is not available in this build yet"))
}
