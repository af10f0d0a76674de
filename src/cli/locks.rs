//! `zkguard locks`: holder and queue per monitor.

use zkguard::config::Settings;
use zkguard::zk::{list_locks, MonitorState};
use zkguard::ZkSession;

use super::CliError;

/// Arguments of `zkguard locks`.
#[derive(Debug, clap::Args)]
pub struct LocksArgs {
    /// Only this monitor object.
    #[arg(long, value_name = "ID")]
    pub monitor: Option<String>,
    /// Print JSON (an array of monitors) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `zkguard locks`.
pub async fn run(settings: Settings, args: LocksArgs) -> Result<u8, CliError> {
    let session = ZkSession::connect(&settings.zookeeper).await?;
    let states = list_locks(&session, args.monitor.as_deref()).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&states).expect("serializable"));
    } else {
        print_table(&states);
    }
    Ok(0)
}

fn print_table(states: &[MonitorState]) {
    if states.is_empty() {
        println!("no locks held or queued");
        return;
    }
    for s in states {
        let holder = s.holder.as_ref().map_or("none".to_string(), |h| {
            format!("{} ({})", h.node, h.owner.as_deref().unwrap_or("?"))
        });
        let token = s.token.map_or(String::new(), |t| format!(", token {t}"));
        println!("{}: holder {holder}{token}", s.monitor);
        println!("  {:<3} {:<14} {:>6} {:>9}  {:<36} INFO", "POS", "NODE", "CLASS", "AGE", "OWNER");
        for (i, c) in s.queue.iter().enumerate() {
            println!(
                "  {:<3} {:<14} {:>6} {:>8.1}s  {:<36} {}{}",
                i,
                c.node,
                c.class,
                c.age_ms as f64 / 1000.0,
                c.owner.as_deref().unwrap_or("?"),
                c.info.as_deref().unwrap_or(""),
                if c.holder { "  [holder]" } else { "" }
            );
        }
    }
}
