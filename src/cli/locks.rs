//! `zkguard locks`: holder and queue per monitor.

use zkguard::config::Settings;
use zkguard::zk::{clear_stray, list_locks, MonitorState, StrayOutcome};
use zkguard::ZkSession;

use super::{CliError, EX_TEMPFAIL};

/// Arguments of `zkguard locks`.
#[derive(Debug, clap::Args)]
pub struct LocksArgs {
    /// Only this monitor object.
    #[arg(long, value_name = "ID")]
    pub monitor: Option<String>,
    /// Print JSON (an array of monitors) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Remove the monitor's `privateLock` if it is stray (not held by any zkguard contender);
    /// a live holder's is never touched. Needs --monitor.
    #[arg(long, requires = "monitor", conflicts_with = "json")]
    pub clear_stray: bool,
}

/// Runs `zkguard locks`.
pub async fn run(settings: Settings, args: LocksArgs) -> Result<u8, CliError> {
    if settings.backend == zkguard::config::LockBackendKind::Elasticsearch {
        return run_es(&settings, &args).await;
    }
    if args.clear_stray && args.monitor.is_some() {
        zkguard::lock::validate_monitor(args.monitor.as_deref().unwrap_or_default())
            .map_err(CliError::usage)?;
    }
    let session = ZkSession::connect(&settings.zookeeper).await?;
    if let (true, Some(monitor)) = (args.clear_stray, args.monitor.as_deref()) {
        return match clear_stray(&session, monitor).await? {
            StrayOutcome::Removed { session } => {
                println!(
                    "{monitor}: removed the stray mutex node ({})",
                    session.map_or("persistent".to_string(), |s| format!(
                        "ephemeral of session {s}"
                    ))
                );
                Ok(0)
            }
            StrayOutcome::NoMutex => {
                println!("{monitor}: no mutex node; nothing to clear");
                Ok(0)
            }
            StrayOutcome::LiveHolder { owner, node } => Err(CliError::new(
                EX_TEMPFAIL,
                format!(
                    "the mutex of `{monitor}` belongs to a live holder ({}, node {}); it was left alone: wait for the holder to release",
                    owner.as_deref().unwrap_or("owner unknown"),
                    node.as_deref().unwrap_or("unknown")
                ),
            )),
        };
    }
    let states = list_locks(&session, args.monitor.as_deref()).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&states).expect("serializable")
        );
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
        if s.stray {
            println!(
                "  STRAY mutex node privateLock ({}) blocks every contender; remove it with `zkguard locks --monitor {} --clear-stray`",
                match s.stray_session.as_deref() {
                    None | Some("0x0") => "persistent, not a zkguard holder's".to_string(),
                    Some(sid) => format!("ephemeral of session {sid}, which holds no queue node"),
                },
                s.monitor
            );
        }
        println!(
            "  {:<3} {:<14} {:>6} {:>9}  {:<36} INFO",
            "POS", "NODE", "CLASS", "AGE", "OWNER"
        );
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

/// `zkguard locks` with `lock.backend=elasticsearch`: the lease documents.
async fn run_es(settings: &Settings, args: &LocksArgs) -> Result<u8, CliError> {
    use zkguard::eslock::EsLockService;
    if args.clear_stray {
        return Err(CliError::usage(
            "--clear-stray applies to the ZooKeeper lock (lock.backend=zookeeper); the Elasticsearch lease lock has no mutex node",
        ));
    }
    let store = zkguard::es::EsStore::new(&settings.elasticsearch)?;
    let service = EsLockService::from_settings(settings, std::sync::Arc::new(store))?;
    let rows = crate::lock_rows::es_rows(&service, args.monitor.as_deref()).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).expect("serializable")
        );
    } else if rows.is_empty() {
        println!("no locks held or queued");
    } else {
        println!(
            "{:<24} {:<6} {:<11} {:>18} {:>8}  {:<32} INFO",
            "MONITOR", "STATE", "TYPE", "TOKEN", "WAITING", "OWNER"
        );
        for r in &rows {
            let text = |k: &str| r[k].as_str().unwrap_or("").to_string();
            println!(
                "{:<24} {:<6} {:<11} {:>18} {:>8}  {:<32} {}{}",
                text("monitor"),
                text("state"),
                text("lock_type"),
                r["token"],
                r["foreground_waiters"],
                text("owner"),
                text("info"),
                if r["takeable"].as_bool() == Some(true) {
                    "  [takeable]"
                } else {
                    ""
                }
            );
        }
    }
    Ok(0)
}
