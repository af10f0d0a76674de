//! The Kafka journal's documents in `server.journal.kafka.index`:
//!
//! - `progress-<topic>-<partition>`: the partition's committed offset (every record before it is
//!   applied), the acceptance time of the record before it (see [`Progress::accepted`]), and its
//!   owner. Written with the owner's fencing token as the external version
//!   (`version_type=external_gte`): once a new owner wrote it, a deposed owner's write is refused
//!   with 409 ([`ProgressError::Deposed`]).
//! - `op-<id>`: an operation's outcome (the journal's [`Finished`] record), read by every
//!   instance.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use uuid::Uuid;
use zkguard::es::{BulkAction, DocStore, EsError, Refresh, WriteCondition};

use super::super::Finished;

/// A partition's progress.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Every record before this offset is applied.
    pub offset: i64,
    /// The acceptance time given to the record before `offset`: the appliers give each record
    /// `max(its own acceptance time, the previous record's + 1)`, so that the times of one
    /// partition grow in its order whichever instance accepted the records (their clocks may
    /// differ) and a replay gives every record the time it had.
    #[serde(default)]
    pub accepted: u64,
    /// The owner's instance name.
    #[serde(default)]
    pub owner: Option<String>,
    /// The owner's fencing token.
    #[serde(default)]
    pub token: u64,
}

/// Why progress could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ProgressError {
    /// A newer owner wrote the progress (its token is greater): this owner is deposed.
    #[error("partition {partition}'s progress was written by a newer owner (token greater than {token}): this instance no longer owns it")]
    Deposed {
        /// The partition.
        partition: i32,
        /// This owner's token.
        token: u64,
    },
    /// Elasticsearch failed.
    #[error("the journal's progress in Elasticsearch: {0}")]
    Es(#[from] EsError),
}

/// The id of a partition's progress document.
pub fn progress_id(topic: &str, partition: i32) -> String {
    format!("progress-{topic}-{partition}")
}

fn outcome_id(id: &Uuid) -> String {
    format!("op-{id}")
}

/// Creates the index unless it exists. Its documents (progress, outcomes) are only ever read by
/// id, so only the progress' fields are mapped and nothing else is indexed (`dynamic: false`):
/// an outcome, written once per operation, costs the cluster its storage and not the indexing of
/// its fields (half the time of a `_bulk` of outcomes on osmem-server).
///
/// # Errors
/// [`EsError`].
pub async fn ensure_index(store: &dyn DocStore, index: &str) -> Result<(), EsError> {
    let mappings = json!({
        "dynamic": false,
        "properties": {
            "offset": {"type": "long"},
            "accepted": {"type": "long"},
            "token": {"type": "long"},
            "owner": {"type": "keyword"},
            "status": {"type": "keyword"},
        }
    });
    store.ensure_index(index, &mappings).await
}

/// Reads a partition's progress (the default, offset 0, when none was written).
///
/// # Errors
/// [`ProgressError::Es`].
pub async fn read(
    store: &dyn DocStore,
    index: &str,
    topic: &str,
    partition: i32,
) -> Result<Progress, ProgressError> {
    let doc = store.get(index, &progress_id(topic, partition)).await?;
    Ok(doc
        .and_then(|d| serde_json::from_value(d.source).ok())
        .unwrap_or_default())
}

/// Writes a partition's progress, fenced by `progress.token`.
///
/// # Errors
/// [`ProgressError::Deposed`] when a newer owner wrote it; [`ProgressError::Es`].
pub async fn write(
    store: &dyn DocStore,
    index: &str,
    topic: &str,
    partition: i32,
    progress: &Progress,
) -> Result<(), ProgressError> {
    let source = serde_json::to_value(progress).unwrap_or(Value::Null);
    match store
        .index(
            index,
            &progress_id(topic, partition),
            &source,
            WriteCondition::ExternalGte(progress.token),
            Refresh::No,
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(EsError::Conflict { .. }) => Err(ProgressError::Deposed {
            partition,
            token: progress.token,
        }),
        Err(e) => Err(e.into()),
    }
}

/// Writes outcomes (one `_bulk`), each only if none was written for its operation: the first
/// outcome stays (an operation applied again after a takeover is found applied, under the new
/// owner's token; the outcome keeps the token of the write that applied it).
///
/// # Errors
/// [`EsError`] when the request failed, or the first item that failed (an outcome already
/// there is no failure).
pub async fn write_outcomes(
    store: &dyn DocStore,
    index: &str,
    all: &[&Finished],
) -> Result<(), EsError> {
    let actions: Vec<BulkAction> = all
        .iter()
        .map(|f| BulkAction::Index {
            index: index.to_string(),
            id: outcome_id(&f.id),
            source: serde_json::to_value(f).unwrap_or(Value::Null),
            condition: WriteCondition::Create,
        })
        .collect();
    for r in store.bulk(&actions, Refresh::No).await? {
        match r {
            Ok(_) | Err(EsError::Conflict { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads an operation's outcome, if one was written.
///
/// # Errors
/// [`EsError`].
pub async fn read_outcome(
    store: &dyn DocStore,
    index: &str,
    id: &Uuid,
) -> Result<Option<Finished>, EsError> {
    Ok(store
        .get(index, &outcome_id(id))
        .await?
        .and_then(|d| serde_json::from_value(d.source).ok()))
}

/// The operations among `ids` whose outcome was written.
///
/// # Errors
/// [`EsError`].
pub async fn with_outcomes(
    store: &dyn DocStore,
    index: &str,
    ids: &[Uuid],
) -> Result<std::collections::HashSet<Uuid>, EsError> {
    let docs: Vec<(String, String)> = ids
        .iter()
        .map(|id| (index.to_string(), outcome_id(id)))
        .collect();
    let found = store.mget(&docs).await?;
    Ok(ids
        .iter()
        .zip(found)
        .filter(|(_, r)| matches!(r, Ok(Some(_))))
        .map(|(id, _)| *id)
        .collect())
}
