//! `zkguard txn`: multi-document transactions (two-phase commit) from the command line.

use std::sync::Arc;
use std::time::Duration;

use zkguard::config::Settings;
use zkguard::es::{DocStore, EsStore};
use zkguard::txn::{
    Audit, Coordinator, HookAction, HookPoint, RecoveryReport, RetryPolicy, Step, Transaction,
    TransferRequest, TxnError, TxnState,
};

use super::{CliError, EX_SOFTWARE, EX_TEMPFAIL, EX_UNAVAILABLE};

pub use crate::exit::EX_DATAERR;
/// `zkguard txn audit` found an inconsistency or a total other than `--expect-total`.
pub const EX_AUDIT_FAILED: u8 = 1;

/// Arguments of `zkguard txn`.
#[derive(Debug, clap::Args)]
pub struct TxnArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: TxnCommand,
    /// Take a lock from the configured lock service (`lock.backend`) on each transaction while
    /// working on it, so that recovery skips transactions a live worker is on. Optional: the
    /// conditional writes keep transactions correct without it.
    #[arg(long, global = true)]
    pub lock: bool,
}

/// `zkguard txn` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum TxnCommand {
    /// Create the accounts and transactions indices (explicit mappings) and the given accounts.
    Init(InitArgs),
    /// Move units from one account to another, all or nothing.
    Transfer(TransferArgs),
    /// Apply several document writes (index, update, delete, in any indices) all or nothing.
    Apply(super::txn_docs::ApplyArgs),
    /// Show one transaction (a transfer, or a document transaction of `txn apply`).
    Show(ShowArgs),
    /// Roll a transaction back (created or pending ones; committed ones always finish).
    Rollback(RollbackArgs),
    /// Resume transactions (transfers and document transactions) left in flight longer than
    /// txn.recovery.after.
    Recover(RecoverArgs),
    /// Sum of balances, transactions per state, accounts with pending ids, anomalies.
    Audit(AuditArgs),
}

/// `zkguard txn init`.
#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// Accounts and initial balances, e.g. `A=500,B=500` (may be repeated).
    #[arg(long, value_name = "ID=BALANCE,...", value_parser = parse_accounts, action = clap::ArgAction::Append)]
    pub accounts: Vec<Vec<(String, i64)>>,
    /// Overwrite existing accounts (balance set, pending ids cleared). Breaks the conservation of
    /// units if transactions touch them: for demos only.
    #[arg(long)]
    pub reset: bool,
    /// Print the outcome as one JSON object: `{"accounts_index", "transactions_index",
    /// "accounts": [{"id", "balance", "result": "created"|"unchanged"|"reset"}]}`.
    #[arg(long)]
    pub json: bool,
}

/// `zkguard txn transfer`.
#[derive(Debug, clap::Args)]
pub struct TransferArgs {
    /// Source account.
    #[arg(long)]
    pub from: String,
    /// Destination account.
    #[arg(long)]
    pub to: String,
    /// Units to move (a positive whole number).
    #[arg(long, allow_hyphen_values = true)]
    pub amount: i64,
    /// Transaction id (default: a random UUID). Re-running with the same id resumes that
    /// transaction instead of creating another.
    #[arg(long)]
    pub id: Option<String>,
    /// Print the transaction as JSON.
    #[arg(long)]
    pub json: bool,
    /// Stop right after this step, as if the process died there (for demos of recovery).
    #[arg(long, hide = true, value_name = "STEP")]
    pub crash_after: Option<Step>,
}

/// `zkguard txn show`.
#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// Transaction id.
    pub id: String,
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `zkguard txn rollback`.
#[derive(Debug, clap::Args)]
pub struct RollbackArgs {
    /// Transaction id.
    pub id: String,
    /// Reason stored with the transaction.
    #[arg(long, default_value = "requested with zkguard txn rollback")]
    pub reason: String,
    /// Print the transaction as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `zkguard txn recover`.
#[derive(Debug, clap::Args)]
pub struct RecoverArgs {
    /// One pass, then exit (status 75 if some transaction could not be recovered).
    #[arg(long)]
    pub once: bool,
    /// Time between passes (default: half of txn.recovery.after, at least 1s).
    #[arg(long, value_parser = parse_duration)]
    pub interval: Option<Duration>,
    /// Print reports as JSON lines.
    #[arg(long)]
    pub json: bool,
    /// How long to wait for each lock of a document transaction before leaving it for the next
    /// pass (its coordinator may still hold them; a dead one's go with its session).
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub lock_wait: Duration,
}

/// `zkguard txn audit`.
#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
    /// Exit with status 1 unless the sum of the balances is this.
    #[arg(long, allow_hyphen_values = true, value_name = "UNITS")]
    pub expect_total: Option<i64>,
}

fn parse_accounts(text: &str) -> Result<Vec<(String, i64)>, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, balance) = part
            .split_once('=')
            .ok_or_else(|| format!("`{part}` is not ID=BALANCE; write e.g. A=500,B=500"))?;
        let balance = balance
            .trim()
            .parse::<i64>()
            .map_err(|_| format!("balance `{balance}` of account `{id}` is not a whole number"))?;
        out.push((id.trim().to_string(), balance));
    }
    if out.is_empty() {
        return Err("no account given; write e.g. A=500,B=500".into());
    }
    Ok(out)
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    match zkguard::config::parse_bounded_duration(text) {
        Ok(d) if d.is_zero() => Err(format!(
            "`{text}` is not a positive duration; write e.g. 5s or 500ms"
        )),
        other => other,
    }
}

/// The exit status for a transaction error.
fn cli_error(e: TxnError) -> CliError {
    let code = match &e {
        e if e.is_bad_input() => EX_DATAERR,
        TxnError::Corrupt { .. } => EX_DATAERR,
        TxnError::Busy { .. } | TxnError::Interrupted { .. } | TxnError::Contention { .. } => {
            EX_TEMPFAIL
        }
        TxnError::Store { source, .. } if source.is_transient() => EX_UNAVAILABLE,
        _ => EX_SOFTWARE,
    };
    CliError::new(code, e)
}

fn print_json(value: &impl serde::Serialize) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| CliError::new(EX_SOFTWARE, e))?;
    println!("{text}");
    Ok(())
}

fn print_transaction(txn: &Transaction, json: bool) -> Result<(), CliError> {
    if json {
        return print_json(txn);
    }
    println!("transaction:  {}", txn.id);
    println!("state:        {}", txn.state);
    println!("amount:       {}", txn.amount);
    println!("from:         {}", txn.src_acct);
    println!("to:           {}", txn.dest_acct);
    println!("created:      {}", txn.creation_time);
    println!("modified:     {}", txn.modification_time);
    if let Some(reason) = &txn.reason {
        println!("reason:       {reason}");
    }
    Ok(())
}

async fn coordinator(settings: &Settings, lock: bool) -> Result<Coordinator, CliError> {
    let store: Arc<dyn DocStore> = Arc::new(EsStore::new(&settings.elasticsearch)?);
    let mut coordinator = Coordinator::new(store, settings.txn.clone())
        .with_retry(RetryPolicy::from_settings(&settings.retry));
    if lock {
        coordinator = coordinator.with_lock_service(super::lock_service(settings).await?);
    }
    Ok(coordinator)
}

/// Runs `zkguard txn`.
pub async fn run(settings: Settings, args: TxnArgs) -> Result<u8, CliError> {
    if let TxnCommand::Apply(a) = args.command {
        return super::txn_docs::apply(&settings, a).await;
    }
    let coordinator = coordinator(&settings, args.lock).await?;
    match args.command {
        TxnCommand::Apply(_) => unreachable!("handled above"),
        TxnCommand::Init(a) => init(&coordinator, a).await,
        TxnCommand::Transfer(a) => transfer(coordinator, a).await,
        TxnCommand::Show(a) => {
            let txn = coordinator.transaction(&a.id).await.map_err(cli_error)?;
            if txn.is_none() {
                let store = EsStore::new(&settings.elasticsearch)?;
                let found =
                    zkguard::txn::multi::read_record(&store, &settings.txn.log_index, &a.id)
                        .await
                        .map_err(super::txn_docs::cli_error)?;
                if let Some(record) = found {
                    super::txn_docs::print_record(&record, a.json)?;
                    return Ok(0);
                }
            }
            let txn = txn.ok_or_else(|| {
                cli_error(TxnError::NotFound {
                    id: a.id.clone(),
                    index: settings.txn.transactions_index.clone(),
                })
            })?;
            print_transaction(&txn, a.json)?;
            Ok(0)
        }
        TxnCommand::Rollback(a) => {
            let txn = coordinator
                .rollback(&a.id, &a.reason)
                .await
                .map_err(cli_error)?;
            if a.json {
                print_json(&txn)?;
            } else {
                println!(
                    "transaction {}: {} ({})",
                    txn.id,
                    txn.state,
                    txn.reason.as_deref().unwrap_or("no reason recorded")
                );
            }
            Ok(0)
        }
        TxnCommand::Recover(a) => recover(&coordinator, &settings, a).await,
        TxnCommand::Audit(a) => audit(&coordinator, a).await,
    }
}

async fn init(coordinator: &Coordinator, args: InitArgs) -> Result<u8, CliError> {
    coordinator.ensure_indices().await.map_err(cli_error)?;
    let s = coordinator.settings();
    if !args.json {
        println!(
            "indices ready: accounts `{}`, transactions `{}`",
            s.accounts_index, s.transactions_index
        );
    }
    let mut accounts = Vec::new();
    for (id, balance) in args.accounts.into_iter().flatten() {
        let result = if args.reset {
            coordinator
                .reset_account(&id, balance)
                .await
                .map_err(cli_error)?;
            "reset"
        } else if coordinator
            .create_account(&id, balance)
            .await
            .map_err(cli_error)?
        {
            "created"
        } else {
            "unchanged"
        };
        if !args.json {
            match result {
                "reset" => println!("account {id}: reset to {balance}"),
                "created" => println!("account {id}: created with {balance}"),
                _ => println!("account {id}: already exists with {balance}, unchanged"),
            }
        }
        accounts.push(serde_json::json!({"id": id, "balance": balance, "result": result}));
    }
    if args.json {
        print_json(&serde_json::json!({
            "accounts_index": s.accounts_index,
            "transactions_index": s.transactions_index,
            "accounts": accounts,
        }))?;
    }
    Ok(0)
}

async fn transfer(coordinator: Coordinator, args: TransferArgs) -> Result<u8, CliError> {
    let mut request = TransferRequest::new(args.from, args.to, args.amount);
    if let Some(id) = args.id {
        request = request.with_id(id);
    }
    let coordinator = match args.crash_after {
        Some(step) => coordinator.with_hook(Arc::new(move |_: &str, point: HookPoint| {
            if point == HookPoint::After(step) {
                HookAction::Crash
            } else {
                HookAction::Continue
            }
        })),
        None => coordinator,
    };
    match coordinator.transfer(request).await {
        Ok(txn) => {
            if args.json {
                print_json(&txn)?;
            } else {
                println!("transaction {}: {} ({})", txn.id, txn.state, txn.describe());
            }
            Ok(0)
        }
        Err(TxnError::RolledBack { transaction }) => {
            if args.json {
                print_json(&transaction)?;
            }
            Err(cli_error(TxnError::RolledBack { transaction }))
        }
        Err(e) => Err(cli_error(e)),
    }
}

fn print_report(report: &RecoveryReport, json: bool) -> Result<(), CliError> {
    if json {
        let text = serde_json::to_string(report).map_err(|e| CliError::new(EX_SOFTWARE, e))?;
        println!("{text}");
        return Ok(());
    }
    println!(
        "recovery: examined {}, finished {}, rolled back {}, busy {}, skipped {}, failed {}",
        report.examined,
        report.finished.len(),
        report.rolled_back.len(),
        report.busy.len(),
        report.skipped.len(),
        report.failed.len()
    );
    for (id, error) in &report.failed {
        println!("  {id}: {error}");
    }
    Ok(())
}

async fn recover(
    coordinator: &Coordinator,
    settings: &Settings,
    args: RecoverArgs,
) -> Result<u8, CliError> {
    let mut documents = DocumentRecovery::new(settings, args.lock_wait, args.json);
    if args.once {
        let report = coordinator.recover_once().await.map_err(cli_error)?;
        print_report(&report, args.json)?;
        let docs_ok = documents.pass().await?;
        return Ok(if report.failed.is_empty() && docs_ok {
            0
        } else {
            EX_TEMPFAIL
        });
    }
    let interval = args
        .interval
        .unwrap_or_else(|| (settings.txn.recovery_after / 2).max(Duration::from_secs(1)));
    // Installed before the first pass, so a stop request that comes at any time after start is
    // seen. A pass that has begun runs to its end (each transaction left at a step boundary,
    // never half-way through one), then the command exits 0.
    let mut stop = StopSignal::install()?;
    loop {
        match coordinator.recover_once().await {
            Ok(report) if report.examined > 0 => print_report(&report, args.json)?,
            Ok(_) => {}
            Err(e) => eprintln!(
                "zkguard: recovery pass failed (retrying in {}): {e}",
                humantime::format_duration(interval)
            ),
        }
        if let Err(e) = documents.pass().await {
            eprintln!(
                "zkguard: recovery pass over document transactions failed (retrying in {}): {}",
                humantime::format_duration(interval),
                e.message
            );
        }
        if stop.requested() {
            return Ok(0);
        }
        tokio::select! {
            _ = stop.wait() => return Ok(0),
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// The document side of `zkguard txn recover`: it connects to the lock service only once the
/// log holds a transaction in flight (transfers alone need none).
struct DocumentRecovery<'a> {
    settings: &'a Settings,
    lock_wait: Duration,
    json: bool,
    txns: Option<zkguard::txn::multi::Transactions>,
}

impl<'a> DocumentRecovery<'a> {
    fn new(settings: &'a Settings, lock_wait: Duration, json: bool) -> Self {
        Self {
            settings,
            lock_wait,
            json,
            txns: None,
        }
    }

    /// One pass; `Ok(false)` when some transaction could not be recovered.
    async fn pass(&mut self) -> Result<bool, CliError> {
        if self.txns.is_none() {
            let store = EsStore::new(&self.settings.elasticsearch)?;
            let probe = serde_json::json!({
                "size": 1,
                "query": { "terms": { "state": ["pending", "committed", "rolling-back"] } },
            });
            let in_flight = store
                .search(&self.settings.txn.log_index, &probe)
                .await
                .map_err(|e| CliError::new(EX_UNAVAILABLE, e))?;
            if in_flight.is_empty() {
                return Ok(true);
            }
            self.txns = Some(super::txn_docs::transactions(self.settings).await?);
        }
        let txns = self.txns.as_ref().expect("set above");
        let report = super::txn_docs::recover_pass(
            txns,
            self.settings.txn.recovery_after,
            self.lock_wait,
            self.json,
        )
        .await
        .map_err(super::txn_docs::cli_error)?;
        Ok(report.failed.is_empty() && report.busy.is_empty())
    }
}

/// Ctrl-C (SIGINT) or SIGTERM, the signal service managers (systemd, Kubernetes) stop with.
struct StopSignal {
    requested: Arc<std::sync::atomic::AtomicBool>,
    notify: Arc<tokio::sync::Notify>,
}

impl StopSignal {
    fn install() -> Result<Self, CliError> {
        use tokio::signal::unix::{signal, SignalKind};
        let requested = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let notify = Arc::new(tokio::sync::Notify::new());
        let mut signals = Vec::new();
        for kind in [SignalKind::interrupt(), SignalKind::terminate()] {
            signals.push(signal(kind).map_err(|e| {
                CliError::new(EX_SOFTWARE, format!("cannot watch for stop signals: {e}"))
            })?);
        }
        for mut s in signals {
            let requested = requested.clone();
            let notify = notify.clone();
            tokio::spawn(async move {
                if s.recv().await.is_some() {
                    requested.store(true, std::sync::atomic::Ordering::SeqCst);
                    notify.notify_one();
                }
            });
        }
        Ok(Self { requested, notify })
    }

    fn requested(&self) -> bool {
        self.requested.load(std::sync::atomic::Ordering::SeqCst)
    }

    async fn wait(&mut self) {
        while !self.requested() {
            self.notify.notified().await;
        }
    }
}

fn print_audit(audit: &Audit) {
    println!("accounts:       {}", audit.accounts);
    println!("total balance:  {}", audit.total_balance);
    let states: Vec<String> = TxnState::ALL
        .iter()
        .map(|s| format!("{s} {}", audit.transactions.get(s).copied().unwrap_or(0)))
        .collect();
    println!("transactions:   {}", states.join(", "));
    if audit.pending.is_empty() {
        println!("pending ids:    none");
    } else {
        println!("pending ids:");
        for (account, ids) in &audit.pending {
            println!("  {account}: {}", ids.join(", "));
        }
    }
    if !audit.negative.is_empty() {
        let list: Vec<String> = audit
            .negative
            .iter()
            .map(|(a, b)| format!("{a} {b}"))
            .collect();
        println!("negative:       {}", list.join(", "));
    }
    if audit.truncated {
        println!(
            "note:           more than {} documents; counts are lower bounds",
            zkguard::txn::AUDIT_LIMIT
        );
    }
    if audit.anomalies.is_empty() {
        println!("anomalies:      none");
    } else {
        println!("anomalies:");
        for a in &audit.anomalies {
            println!("  {a}");
        }
    }
}

async fn audit(coordinator: &Coordinator, args: AuditArgs) -> Result<u8, CliError> {
    let audit = coordinator.audit().await.map_err(cli_error)?;
    if args.json {
        print_json(&audit)?;
    } else {
        print_audit(&audit);
    }
    let mut status = 0;
    if !audit.anomalies.is_empty() {
        eprintln!(
            "zkguard: the audit found {} anomal(ies)",
            audit.anomalies.len()
        );
        status = EX_AUDIT_FAILED;
    }
    if let Some(expected) = args.expect_total {
        if expected != audit.total_balance {
            eprintln!(
                "zkguard: the sum of the balances is {}, expected {expected}",
                audit.total_balance
            );
            status = EX_AUDIT_FAILED;
        }
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_syntax() {
        assert_eq!(
            parse_accounts("A=500, B=-3").unwrap(),
            vec![("A".into(), 500), ("B".into(), -3)]
        );
        assert!(parse_accounts("A500").unwrap_err().contains("ID=BALANCE"));
        assert!(parse_accounts("A=x")
            .unwrap_err()
            .contains("not a whole number"));
        assert!(parse_accounts(",").unwrap_err().contains("no account"));
    }
}
