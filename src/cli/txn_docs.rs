//! `zkguard txn apply`: a document transaction from an NDJSON file, and the document side of
//! `zkguard txn show` and `zkguard txn recover`.

use std::io::{BufRead, Read};
use std::sync::Arc;
use std::time::Duration;

use zkguard::config::Settings;
use zkguard::es::{DocStore, EsStore};
use zkguard::txn::multi::{
    parse_ndjson, Decision, MultiError, MultiHook, MultiRecovery, Outcome, Point, Transactions,
    TxnRecord, TxnRequest,
};
use zkguard::txn::RetryPolicy;
use zkguard::LockType;

use super::{CliError, EX_DATAERR, EX_SOFTWARE, EX_TEMPFAIL, EX_UNAVAILABLE};

/// `zkguard txn apply`.
#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    /// The operations, one JSON object per line (`-` reads standard input):
    /// `{"action":"index"|"update"|"delete","index":...,"id":...,"doc":{...}}` with optional
    /// `upsert` (update), `monitor` and `expect` (`{"exists":true|false}` or
    /// `{"if_seq_no":N,"if_primary_term":M}`).
    #[arg(long, value_name = "OPS.ndjson")]
    pub file: String,
    /// Transaction id (default: a random UUID). Applying the same id and operations again
    /// answers the stored outcome; other operations under it are refused.
    #[arg(long)]
    pub id: Option<String>,
    /// The class of the locks: foreground (someone waits) or background.
    #[arg(long = "type", value_name = "TYPE", default_value = "foreground")]
    pub lock_type: LockType,
    /// Print the outcome as JSON: `{"transaction_id", "state": "committed"|"rolled-back",
    /// "reason"?, "failed"?, "blocked_by"?, "documents": [{"index", "id", "action", "result"?,
    /// "_version"?}]}`.
    #[arg(long)]
    pub json: bool,
    /// Stop at this point of the protocol (locked, logged, applied:N, committed, cleared,
    /// finished): print `paused after POINT` on standard error and wait until standard input
    /// closes or has a line, then go on. For tests and demos of recovery.
    #[arg(long, hide = true, value_name = "POINT")]
    pub pause_after: Option<Point>,
}

/// Waits at one point: the test that drives the process kills it, stops it or lets it go on.
struct PauseAt(Point);

#[async_trait::async_trait]
impl MultiHook for PauseAt {
    fn intervenes(&self, point: Point) -> bool {
        point == self.0
    }

    async fn stop_at(&self, _id: &str, point: Point) -> bool {
        if point != self.0 {
            return false;
        }
        eprintln!("paused after {point}");
        let _ = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line)
        })
        .await;
        false
    }
}

/// The exit status for a document-transaction error.
pub(super) fn cli_error(e: MultiError) -> CliError {
    let code = match &e {
        e if e.is_bad_input() => EX_DATAERR,
        MultiError::Corrupt { .. } => EX_DATAERR,
        MultiError::InProgress { .. }
        | MultiError::Fenced { .. }
        | MultiError::Interrupted { .. } => EX_TEMPFAIL,
        MultiError::Lock { .. } => EX_UNAVAILABLE,
        MultiError::Store { source, .. } if source.is_transient() => EX_UNAVAILABLE,
        _ => EX_SOFTWARE,
    };
    CliError::new(code, e)
}

pub(super) async fn transactions(settings: &Settings) -> Result<Transactions, CliError> {
    let store: Arc<dyn DocStore> = Arc::new(EsStore::new(&settings.elasticsearch)?);
    let locks = super::lock_service(settings).await?;
    Ok(Transactions::new(locks, store, settings.txn.clone())
        .with_retry(RetryPolicy::from_settings(&settings.retry))
        .with_stamp_settings(&settings.stamp))
}

/// Runs `zkguard txn apply`: 0 committed, 65 rolled back by an expectation or an operation
/// that cannot apply, 75 rolled back because a lock was not free in time.
pub async fn apply(settings: &Settings, args: ApplyArgs) -> Result<u8, CliError> {
    let text = if args.file == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| CliError::new(EX_DATAERR, format!("cannot read standard input: {e}")))?;
        s
    } else {
        std::fs::read_to_string(&args.file).map_err(|e| {
            CliError::new(
                EX_DATAERR,
                format!("cannot read the operations file `{}`: {e}", args.file),
            )
        })?
    };
    let ops = parse_ndjson(&text).map_err(cli_error)?;
    let mut request = TxnRequest::new(ops).with_type(args.lock_type);
    if let Some(id) = args.id {
        request = request.with_id(id);
    }
    let mut txns = transactions(settings).await?;
    if let Some(point) = args.pause_after {
        txns = txns.with_hook(Arc::new(PauseAt(point)));
    }
    let outcome = txns.apply(request).await.map_err(cli_error)?;
    print_outcome(&outcome, args.json)?;
    Ok(match (outcome.state, &outcome.blocked_by) {
        (Decision::Committed, _) => 0,
        (Decision::RolledBack, Some(_)) => EX_TEMPFAIL,
        (Decision::RolledBack, None) => EX_DATAERR,
    })
}

fn print_outcome(outcome: &Outcome, json: bool) -> Result<(), CliError> {
    if json {
        let text =
            serde_json::to_string_pretty(outcome).map_err(|e| CliError::new(EX_SOFTWARE, e))?;
        println!("{text}");
        return Ok(());
    }
    match outcome.state {
        Decision::Committed => println!(
            "transaction {}: committed ({} documents)",
            outcome.transaction_id,
            outcome.documents.len()
        ),
        Decision::RolledBack => println!(
            "transaction {}: rolled back: {}",
            outcome.transaction_id,
            outcome.reason.as_deref().unwrap_or("no reason recorded")
        ),
    }
    for d in &outcome.documents {
        if let Some(result) = &d.result {
            match d.version {
                Some(v) => println!("  {}/{}: {result}, version {v}", d.index, d.id),
                None => println!("  {}/{}: {result}", d.index, d.id),
            }
        }
    }
    Ok(())
}

/// `zkguard txn show` of a document transaction.
pub(super) fn print_record(record: &TxnRecord, json: bool) -> Result<(), CliError> {
    if json {
        let text =
            serde_json::to_string_pretty(record).map_err(|e| CliError::new(EX_SOFTWARE, e))?;
        println!("{text}");
        return Ok(());
    }
    println!("transaction:  {}", record.transaction_id);
    println!("state:        {}", record.state);
    println!("lock type:    {}", record.lock_type);
    println!("documents:    {}", record.operations.len());
    for op in &record.operations {
        println!("  {} {}/{}", op.action.as_str(), op.index, op.id);
    }
    println!("created:      {}", record.created);
    println!("modified:     {}", record.modified);
    if let Some(reason) = &record.reason {
        println!("reason:       {reason}");
    }
    Ok(())
}

/// One recovery pass over document transactions, printed (JSON: one line
/// `{"document_transactions": {...}}`) when it found any.
pub(super) async fn recover_pass(
    txns: &Transactions,
    min_age: Duration,
    lock_wait: Duration,
    json: bool,
) -> Result<MultiRecovery, MultiError> {
    let report = txns.recover_once(min_age, lock_wait).await?;
    if report.examined > 0 {
        if json {
            println!("{}", serde_json::json!({ "document_transactions": report }));
        } else {
            println!(
                "document transactions: {} examined, {} finished, {} rolled back, {} busy, {} failed",
                report.examined,
                report.finished.len(),
                report.rolled_back.len(),
                report.busy.len(),
                report.failed.len()
            );
            for (id, e) in &report.failed {
                println!("  {id}: {e}");
            }
        }
    }
    Ok(report)
}
