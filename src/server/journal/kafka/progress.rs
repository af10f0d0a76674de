//! The Kafka journal's documents in `server.journal.kafka.index`:
//!
//! - `progress-<topic>-<partition>`: the partition's committed offset (every record before it is
//!   applied), the acceptance time of the record before it (see [`Progress::accepted`]), and its
//!   owner. Written with the owner's fencing token as the external version
//!   (`version_type=external_gte`): once a new owner wrote it, a deposed owner's write is refused
//!   with 409 ([`ProgressError::Deposed`]).
//! - `outcomes-<uuid>`: the outcomes (the journal's [`Finished`] records) one instance recorded
//!   at once, under `outcomes`, their operations' ids under `ops` (the one field indexed for
//!   them), read by every instance with a `terms` query. One document per batch of outcomes
//!   instead of one per operation: the outcomes cost the cluster a few documents a second
//!   instead of as many as the operations' own writes.
//! - `op-<id>`: one operation's outcome, as earlier versions wrote them: still read.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use uuid::Uuid;
use zkguard::es::{DocStore, EsError, Refresh, WriteCondition};

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

/// The id of an outcome document of an earlier version (one per operation).
fn legacy_outcome_id(id: &Uuid) -> String {
    format!("op-{id}")
}

/// Outcomes looked up in one search at most: the `terms` query's values and the hits it may
/// answer stay far below Elasticsearch's limits (65,536 terms, 10,000 hits).
const LOOKUP_CHUNK: usize = 1000;

/// Creates the index unless it exists, then maps the outcomes' `ops` (an index created by an
/// earlier version does not have it). Only the progress' fields and `ops` are mapped and nothing
/// else is indexed (`dynamic: false`): the outcomes themselves cost the cluster their storage
/// and not the indexing of their fields.
///
/// # Errors
/// [`EsError`].
pub async fn ensure_index(store: &dyn DocStore, index: &str) -> Result<(), EsError> {
    let ops = json!({"ops": {"type": "keyword"}});
    let mut properties = json!({
        "offset": {"type": "long"},
        "accepted": {"type": "long"},
        "token": {"type": "long"},
        "owner": {"type": "keyword"},
        "status": {"type": "keyword"},
    });
    properties["ops"] = ops["ops"].clone();
    let mappings = json!({"dynamic": false, "properties": properties});
    store.ensure_index(index, &mappings).await?;
    store.put_mapping(index, &ops).await.map(|_| ())
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

/// Records outcomes: one document `outcomes-<uuid>` holding them all. An operation may be
/// recorded twice (a takeover while its previous owner was recording it: the new owner applies
/// it again and finds it applied); [`find_outcomes`] then answers the first application's.
///
/// # Errors
/// [`EsError`] when the write failed.
pub async fn write_outcomes(
    store: &dyn DocStore,
    index: &str,
    all: &[&Finished],
) -> Result<(), EsError> {
    if all.is_empty() {
        return Ok(());
    }
    let ops: Vec<String> = all.iter().map(|f| f.id.to_string()).collect();
    let source = json!({"ops": ops, "outcomes": all});
    let id = format!("outcomes-{}", Uuid::new_v4());
    store
        .index(index, &id, &source, WriteCondition::Create, Refresh::No)
        .await
        .map(|_| ())
}

/// Reads an operation's outcome, if one was recorded.
///
/// # Errors
/// [`EsError`].
pub async fn read_outcome(
    store: &dyn DocStore,
    index: &str,
    id: &Uuid,
) -> Result<Option<Finished>, EsError> {
    Ok(find_outcomes(store, index, std::slice::from_ref(id))
        .await?
        .remove(id))
}

/// The operations among `ids` whose outcome was recorded.
///
/// # Errors
/// [`EsError`].
pub async fn with_outcomes(
    store: &dyn DocStore,
    index: &str,
    ids: &[Uuid],
) -> Result<std::collections::HashSet<Uuid>, EsError> {
    Ok(find_outcomes(store, index, ids)
        .await?
        .into_keys()
        .collect())
}

/// The recorded outcomes of `ids` (those of earlier versions' `op-<id>` documents too), found by
/// searches. Elasticsearch's searches see what its last refresh made visible (every second by
/// default): an outcome recorded a moment ago on another instance may be found only then.
/// An operation recorded twice answers the outcome of the write that applied it (not
/// `already_applied`), else the one with a token; the same on every instance.
///
/// # Errors
/// [`EsError`].
pub async fn find_outcomes(
    store: &dyn DocStore,
    index: &str,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, Finished>, EsError> {
    let mut found: HashMap<Uuid, Finished> = HashMap::new();
    for chunk in ids.chunks(LOOKUP_CHUNK) {
        let wanted: HashSet<&Uuid> = chunk.iter().collect();
        let ops: Vec<String> = chunk.iter().map(Uuid::to_string).collect();
        let legacy: Vec<String> = chunk.iter().map(legacy_outcome_id).collect();
        let body = json!({
            "size": (2 * chunk.len() + 10).min(10_000),
            "query": {"bool": {"should": [
                {"terms": {"ops": ops}},
                {"ids": {"values": legacy}},
            ]}},
        });
        for doc in store.search(index, &body).await? {
            for f in outcomes_of(doc.source) {
                if wanted.contains(&f.id) {
                    match found.get(&f.id) {
                        Some(kept) if !first_application(&f, kept) => {}
                        _ => {
                            found.insert(f.id, f);
                        }
                    }
                }
            }
        }
    }
    Ok(found)
}

/// The outcomes of a document of the index: a batch's, or an earlier version's single one.
fn outcomes_of(source: Value) -> Vec<Finished> {
    match source.get("outcomes") {
        Some(all) => serde_json::from_value(all.clone()).unwrap_or_default(),
        None => serde_json::from_value(source).into_iter().collect(),
    }
}

/// Whether `f` rather than `kept` tells the operation's first application: the one that
/// applied it before the one that found it applied, then the one with a token, then the
/// smaller token, so that every instance answers the same whatever order the search gives.
fn first_application(f: &Finished, kept: &Finished) -> bool {
    let rank = |o: &Finished| (o.already_applied, o.token.is_none(), o.token);
    rank(f) < rank(kept)
}
