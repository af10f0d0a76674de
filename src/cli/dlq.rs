//! `zkguard dlq`: list, replay and discard parked (dead-letter) operations.
//!
//! The sink is the configured one (`deadletter.sink`, `deadletter.file.path`,
//! `deadletter.index`, `deadletter.kafka.*`). `list` needs only the sink; `replay` also connects
//! to the lock service and Elasticsearch, runs each selected operation under its lock (its own
//! monitor, lock type and id), one document's in the order they were accepted, and removes the
//! entry only once the operation is in the document (or superseded by a newer write of it).
//! An interrupted replay can be run again: operations already applied are recognised by their id
//! in the document and only their entries are removed.
//!
//! With `deadletter.sink=kafka`, `list` shows the topic's records after the replay group's
//! committed offsets plus the fallback file; `replay --all` replays the topic's and the file's
//! entries together, marks each record done (in the companion topic `<topic>-offsets`) only
//! after its operation was applied, superseded or re-parked, then commits the offsets.

use std::sync::Arc;

use clap::{ArgGroup, Args, Subcommand};
use uuid::Uuid;
use zkguard::config::{DeadLetterSinkKind, Settings};
use zkguard::es::{DocStore, EsStore};
use zkguard::write::deadletter::kafka::KafkaSink;
use zkguard::write::deadletter::{
    self, DeadLetter, DeadLetterError, DeadLetterSink, ReplayResult, ReplaySelection,
};
use zkguard::write::guarded::GuardedWriter;
use zkguard::write::ops::Operation;

use super::{CliError, EX_CONFIG, EX_SOFTWARE, EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE};

/// Arguments of `zkguard dlq`.
#[derive(Debug, Args)]
pub struct DlqArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: DlqCommand,
}

/// `zkguard dlq` subcommands.
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Show parked operations, oldest first.
    List {
        /// Print a JSON array of the entries (operation, monitor, attempts, last error, times).
        #[arg(long)]
        json: bool,
    },
    /// Re-run parked operations; an entry is removed only after its operation was applied.
    ///
    /// Each operation runs under its own lock with a new fencing token, one document's in the
    /// order they were accepted. Operations that an earlier, interrupted replay already applied
    /// are recognised by their id in the document: their entries are removed and nothing is
    /// written again. An operation older than a write its document already has is not applied
    /// over it: it is reported superseded and its entry removed. Exits 0 when every selected
    /// entry was applied (or superseded), 75 when some stay parked (the attempt and the error
    /// are recorded in them).
    Replay(ReplayArgs),
    /// Remove one parked operation for good, without running it.
    ///
    /// For an operation that can never apply (a mapping rejects it, its index is gone) and that
    /// its owner gave up. The whole entry and the reason are written to the log (warn level)
    /// before the entry is removed, and printed. Exits 0 once removed, 64 when no entry has the
    /// id (or idempotency key).
    Discard(DiscardArgs),
}

/// Arguments of `zkguard dlq discard`.
#[derive(Debug, Args)]
pub struct DiscardArgs {
    /// The entry to remove: its id, or the caller's idempotency key (both shown by
    /// `zkguard dlq list`).
    #[arg(long, value_name = "ID")]
    pub id: String,
    /// Why it is discarded, for the log (default: "discarded with zkguard dlq discard").
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// Print the removed entry as one JSON object: `{"id", "summary", "reason", "entry"}`.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `zkguard dlq replay`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").required(true).args(["id", "all"])))]
pub struct ReplayArgs {
    /// Replay the entry with this id, or with this idempotency key of the caller (both shown
    /// by `zkguard dlq list`), after the entries of its document accepted before it.
    #[arg(long, value_name = "ID")]
    pub id: Option<String>,
    /// Replay every entry: one document's in the order they were accepted.
    #[arg(long)]
    pub all: bool,
    /// Print the outcome as one JSON object: `{"replayed", "applied", "already_applied",
    /// "still_parked", "not_removed", "superseded", "results": [{"id", "summary", "result",
    /// "attempts", "token", "error", "replayed_before"}]}`, as `POST /v1/deadletters/replay`
    /// answers.
    #[arg(long)]
    pub json: bool,
}

fn dlq_error(e: DeadLetterError) -> CliError {
    let code = match &e {
        DeadLetterError::NoSuchEntry { .. } => EX_USAGE,
        DeadLetterError::NoStore => EX_CONFIG,
        DeadLetterError::Json { .. } => EX_SOFTWARE,
        DeadLetterError::Kafka(k) if k.is_config() => EX_CONFIG,
        DeadLetterError::Io { .. } | DeadLetterError::Store { .. } | DeadLetterError::Kafka(_) => {
            EX_UNAVAILABLE
        }
        _ => EX_SOFTWARE,
    };
    CliError::new(code, e)
}

/// The entry `--id` names: its id, or the caller's idempotency key, which names the id
/// [`Operation::key_id`] derives from it (a key that is a UUID is the id itself).
fn entry_id(given: &str) -> Result<Uuid, CliError> {
    let given = given.trim();
    if given.is_empty() {
        return Err(CliError::usage(
            "--id is empty; give an entry's id or its idempotency key (`zkguard dlq list` shows both)",
        ));
    }
    Ok(Operation::key_id(given))
}

/// [`dlq_error`], with an unknown entry named as the user gave it (`given`: an id or a key).
fn named_error(e: DeadLetterError, given: Option<&str>) -> CliError {
    match (&e, given) {
        (DeadLetterError::NoSuchEntry { .. }, Some(given)) => CliError::new(
            EX_USAGE,
            format!(
                "no parked operation has id or idempotency key {:?}; run `zkguard dlq list` to see both",
                given.trim()
            ),
        ),
        _ => dlq_error(e),
    }
}

/// The configured sink, and the Elasticsearch client it uses (if it is the index sink).
type SinkAndStore = (Arc<dyn DeadLetterSink>, Option<Arc<dyn DocStore>>);

async fn open_sink(settings: &Settings) -> Result<SinkAndStore, CliError> {
    let store: Option<Arc<dyn DocStore>> = match settings.retry.sink {
        DeadLetterSinkKind::Elasticsearch => Some(Arc::new(EsStore::new(&settings.elasticsearch)?)),
        DeadLetterSinkKind::File | DeadLetterSinkKind::Kafka => None,
    };
    if settings.retry.sink == DeadLetterSinkKind::Kafka {
        let kafka = Arc::new(KafkaSink::new(
            &settings.retry.kafka,
            &settings.retry.file_path,
        ));
        // Unreachable brokers and a missing topic are reported before anything else.
        kafka
            .connect()
            .await
            .map_err(|e| dlq_error(DeadLetterError::Kafka(e)))?;
        return Ok((kafka, store));
    }
    let sink = deadletter::sink_from_settings(&settings.retry, store.clone()).map_err(dlq_error)?;
    Ok((sink, store))
}

/// Runs `zkguard dlq`.
pub async fn run(settings: Settings, args: DlqArgs) -> Result<u8, CliError> {
    match args.command {
        DlqCommand::List { json } => list(&settings, json).await,
        DlqCommand::Replay(replay_args) => replay(&settings, replay_args).await,
        DlqCommand::Discard(discard_args) => discard(&settings, discard_args).await,
    }
}

async fn list(settings: &Settings, json: bool) -> Result<u8, CliError> {
    let (sink, _) = open_sink(settings).await?;
    let letters = sink.list().await.map_err(dlq_error)?;
    if json {
        let text = serde_json::to_string_pretty(&letters).map_err(|e| {
            CliError::new(
                EX_SOFTWARE,
                format!("cannot encode the entries as JSON: {e}"),
            )
        })?;
        println!("{text}");
        return Ok(0);
    }
    if letters.is_empty() {
        println!("no parked operations in {}", sink.describe());
        return Ok(0);
    }
    println!(
        "{:<36}  {:<20}  {:<24}  {:>8}  {:<20}  {:<40}  LAST ERROR",
        "ID", "KEY", "PARKED", "ATTEMPTS", "MONITOR", "OPERATION"
    );
    for l in &letters {
        println!("{}", line(l));
    }
    println!(
        "{} parked operation(s) in {}",
        letters.len(),
        sink.describe()
    );
    Ok(0)
}

/// One entry as a row of the table: its id, then the caller's idempotency key (`-` for none).
fn line(l: &DeadLetter) -> String {
    format!(
        "{:<36}  {:<20}  {:<24}  {:>8}  {:<20}  {:<40}  [{}] {}",
        l.id,
        l.operation.key.as_deref().unwrap_or("-"),
        humantime::format_rfc3339_millis(l.parked_at).to_string(),
        l.attempts,
        l.monitor,
        l.operation.summary(),
        l.error_kind,
        l.last_error
    )
}

async fn replay(settings: &Settings, args: ReplayArgs) -> Result<u8, CliError> {
    let selection = match (&args.id, args.all) {
        (Some(id), _) => ReplaySelection::Id(entry_id(id)?),
        (None, true) => ReplaySelection::All,
        (None, false) => {
            return Err(CliError::usage(
                "say which entries to replay: --id ID or --all",
            ))
        }
    };
    let (sink, store) = open_sink(settings).await?;
    if selection == ReplaySelection::All && sink.list().await.map_err(dlq_error)?.is_empty() {
        if args.json {
            print_replay_json(&[])?;
        } else {
            println!("no parked operations in {}", sink.describe());
        }
        return Ok(0);
    }
    let store = match store {
        Some(s) => s,
        None => Arc::new(EsStore::new(&settings.elasticsearch)?),
    };
    let locks = super::lock_service(settings).await?;
    let writer = GuardedWriter::new(locks, store).with_stamp_settings(&settings.stamp);
    // The sink's own replay (a Kafka topic's records marked done, its offsets committed), as
    // `POST /v1/deadletters/replay` runs it.
    let results = sink
        .replay(&writer, selection)
        .await
        .map_err(|e| named_error(e, args.id.as_deref()))?;
    if args.json {
        let (parked, unremoved) = print_replay_json(&results)?;
        return Ok(if parked + unremoved > 0 {
            EX_TEMPFAIL
        } else {
            0
        });
    }
    let (mut applied, mut already, mut parked, mut unremoved, mut superseded) = (0, 0, 0, 0, 0);
    for r in &results {
        if let Some(asked) = r.replayed_before {
            println!(
                "older entry      {}  of the same document as {asked}: replayed before it",
                r.id
            );
        }
        match &r.result {
            ReplayResult::Applied => {
                applied += 1;
                println!("applied          {}  {}", r.id, r.summary);
            }
            ReplayResult::AlreadyApplied => {
                already += 1;
                println!(
                    "already applied  {}  {} (entry removed, nothing written)",
                    r.id, r.summary
                );
            }
            ReplayResult::NotRemoved { error } => {
                unremoved += 1;
                println!(
                    "not removed      {}  {}: applied, but the entry stays: {error}",
                    r.id, r.summary
                );
            }
            ReplayResult::Superseded { error, not_removed } => {
                superseded += 1;
                match not_removed {
                    None => println!(
                        "superseded       {}  {}: {error} (entry removed, nothing written)",
                        r.id, r.summary
                    ),
                    Some(e) => {
                        unremoved += 1;
                        println!(
                            "superseded       {}  {}: {error} (nothing written, but the entry stays: {e})",
                            r.id, r.summary
                        )
                    }
                }
            }
            ReplayResult::StillParked {
                error,
                not_recorded,
                ..
            } => {
                parked += 1;
                match not_recorded {
                    None => println!("still parked     {}  {}: {error}", r.id, r.summary),
                    Some(e) => println!(
                        "still parked     {}  {}: {error} (the entry stays as it was: recording this attempt failed: {e})",
                        r.id, r.summary
                    ),
                }
            }
        }
    }
    let superseded = if superseded > 0 {
        format!(", {superseded} superseded")
    } else {
        String::new()
    };
    println!(
        "replayed {}: {applied} applied, {already} already applied, {parked} still parked, {unremoved} not removed{superseded}",
        results.len()
    );
    Ok(if parked + unremoved > 0 {
        EX_TEMPFAIL
    } else {
        0
    })
}

/// Prints the outcome of a replay as one JSON object ([`deadletter::replay_report`]); returns
/// the counts of entries still parked and of entries applied but not removed.
fn print_replay_json(results: &[deadletter::ReplayEntry]) -> Result<(usize, usize), CliError> {
    let value = deadletter::replay_report(results);
    println!("{value}");
    let count = |k: &str| value[k].as_u64().unwrap_or(0) as usize;
    let superseded_kept = results
        .iter()
        .filter(|r| {
            matches!(
                r.result,
                ReplayResult::Superseded {
                    not_removed: Some(_),
                    ..
                }
            )
        })
        .count();
    Ok((
        count("still_parked"),
        count("not_removed") + superseded_kept,
    ))
}

async fn discard(settings: &Settings, args: DiscardArgs) -> Result<u8, CliError> {
    let id = entry_id(&args.id)?;
    let reason = args
        .reason
        .as_deref()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .unwrap_or("discarded with zkguard dlq discard");
    let (sink, _) = open_sink(settings).await?;
    let letter = deadletter::discard(sink.as_ref(), id, reason)
        .await
        .map_err(|e| named_error(e, Some(&args.id)))?;
    if args.json {
        println!("{}", deadletter::discard_report(&letter, reason));
    } else {
        println!(
            "discarded {}  {} (parked after {} attempts: {}); reason: {reason}",
            letter.id,
            letter.operation.summary(),
            letter.attempts,
            letter.error_kind
        );
    }
    Ok(0)
}
