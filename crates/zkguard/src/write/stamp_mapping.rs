//! The mapping of the `zkguard` object (`elastic.stamp.mapping`): before its first stamped
//! write to an index, a writer maps the object as stored but not indexed, once per index and
//! process.
//!
//! Left to dynamic mapping, the object's operation ids (up to `elastic.stamp.window` of them,
//! 100 by default) are indexed in every written document as `text` and `keyword` fields: work
//! for the cluster on every write, and fields in every search, for bookkeeping nobody searches.
//! Mapped `{"type": "object", "enabled": false}`, the object is kept in `_source` (where zkguard
//! reads it) and costs no indexing; it also lets an index with `"dynamic": "strict"` take it.
//!
//! The mapping is `PUT {index}/_mapping`, which adds the object to an index's mappings and
//! changes nothing else; an index that does not exist yet is created with that mapping (index
//! templates apply as they would to the index the write would create). An index that maps the
//! object otherwise already (written before, dynamically) keeps its mapping: Elasticsearch
//! cannot change `enabled` afterwards. That, and any other refusal, is logged once at `warn`
//! and the writes go on as before; a transport failure is tried again at the next write.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::sync::OnceCell;

use crate::es::{DocStore, EsError};
use tracing::Instrument;

use crate::write::ops::META_FIELD;

/// What became of the mapping of one index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mapped {
    /// The index maps the object as stored but not indexed (put now, or found so).
    Stored,
    /// The index keeps another mapping of the object, or refused the request: logged once.
    Refused,
}

/// The indices whose mapping was settled, shared by the clones of one writer.
#[derive(Debug, Default)]
pub(crate) struct StampMapping {
    off: bool,
    indices: Mutex<HashMap<String, Arc<OnceCell<Mapped>>>>,
}

/// The properties put: the `zkguard` object, stored but not indexed.
fn properties() -> Value {
    json!({ META_FIELD: { "type": "object", "enabled": false } })
}

impl StampMapping {
    /// Maps the object before the first stamped write to each index (`true`), or never.
    pub(crate) fn new(on: bool) -> Self {
        Self {
            off: !on,
            indices: Mutex::new(HashMap::new()),
        }
    }

    /// Whether mappings are put at all.
    pub(crate) fn is_on(&self) -> bool {
        !self.off
    }

    /// Settles the mapping of `index` unless it is settled already; concurrent callers for one
    /// index wait for the same request. `None` when it is off, or when the request failed in a
    /// way a later write may overcome (the next one tries again).
    ///
    /// # Cancellation safety
    /// Dropping the future leaves the index unsettled unless the request had completed; the
    /// next write tries again (putting the same mapping twice is harmless).
    pub(crate) async fn ensure(&self, store: &dyn DocStore, index: &str) -> Option<Mapped> {
        if self.off {
            return None;
        }
        let cell = {
            let mut indices = self.indices.lock().unwrap_or_else(|p| p.into_inner());
            match indices.get(index) {
                Some(cell) => cell.clone(),
                None => indices.entry(index.to_string()).or_default().clone(),
            }
        };
        if let Some(done) = cell.get() {
            return Some(*done);
        }
        let span = tracing::debug_span!("stamp_mapping", index);
        match cell
            .get_or_try_init(|| put(store, index).instrument(span))
            .await
        {
            Ok(done) => Some(*done),
            Err(e) => {
                tracing::debug!(index, error = %e, "the zkguard object's mapping is tried again at the next write");
                None
            }
        }
    }
}

/// One attempt: `PUT {index}/_mapping`, or the index created with it when it does not exist.
/// `Err` only for what a later attempt may overcome.
async fn put(store: &dyn DocStore, index: &str) -> Result<Mapped, EsError> {
    let props = properties();
    let refused = |e: EsError| {
        tracing::warn!(
            index,
            error = %e,
            "the zkguard object of this index stays indexed (Elasticsearch refused to map it as stored only); writes go on as before. See docs/fencing.md, \"What it costs your index\""
        );
        Ok(Mapped::Refused)
    };
    let retry_later = |e: &EsError| {
        matches!(
            e,
            EsError::Transport { .. } | EsError::TooManyRequests { .. }
        )
    };
    match store.put_mapping(index, &props).await {
        Ok(true) => return Ok(Mapped::Stored),
        Ok(false) => {}
        Err(e) if retry_later(&e) => return Err(e),
        Err(e) => return refused(e),
    }
    // No such index yet: create it with the mapping. A writer that created it meanwhile (an
    // `already_exists` answer is a success) may have mapped the object dynamically: put the
    // mapping again to learn which.
    let created = store
        .ensure_index(index, &json!({ "properties": props }))
        .await;
    match created {
        Err(e) if retry_later(&e) => return Err(e),
        Err(e) => return refused(e),
        Ok(()) => {}
    }
    match store.put_mapping(index, &props).await {
        Ok(true) => Ok(Mapped::Stored),
        Ok(false) => Err(EsError::NotFound {
            what: format!("index {index}, created a moment ago"),
        }),
        Err(e) if retry_later(&e) => Err(e),
        Err(e) => refused(e),
    }
}
