//! The Elasticsearch sink: one document per dead letter in `deadletter.index`.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::es::{DocStore, EsError, Refresh, WriteCondition};

use super::{time_serde, DeadLetter, DeadLetterError, DeadLetterSink};

///
/// The operation is stored as an object that is not indexed (`enabled: false`), so documents of
/// any shape can be parked without mapping conflicts. `park` and `remove` use
/// `refresh=wait_for`, so `list` sees them at once. Parking needs Elasticsearch to be up: when
/// the failures to park for are Elasticsearch outages, prefer the file sink.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use zkguard::es::EsStore;
/// use zkguard::write::deadletter::{DeadLetterSink, EsSink};
///
/// let store = Arc::new(EsStore::from_url("http://localhost:9200")?);
/// let sink = EsSink::new(store, "zkguard-deadletters");
/// for letter in sink.list().await? {
///     let (id, attempts) = (letter.id, letter.attempts);
///     println!("{id} parked after {attempts} attempt(s): {}", letter.last_error);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EsSink {
    store: Arc<dyn DocStore>,
    index: String,
    page: usize,
    ready: Arc<tokio::sync::OnceCell<()>>,
}

impl std::fmt::Debug for EsSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EsSink")
            .field("index", &self.index)
            .finish()
    }
}

impl EsSink {
    /// A sink on `index` (created on first use).
    pub fn new(store: Arc<dyn DocStore>, index: impl Into<String>) -> Self {
        Self {
            store,
            index: index.into(),
            page: ES_PAGE,
            ready: Arc::new(tokio::sync::OnceCell::new()),
        }
    }

    /// How many entries [`DeadLetterSink::list`] fetches per search request (default 500).
    #[must_use]
    pub fn with_page_size(mut self, page: usize) -> Self {
        self.page = page.max(1);
        self
    }

    /// The mappings the index is created with.
    pub fn mappings() -> Value {
        json!({
            "properties": {
                "id": {"type": "keyword"},
                "monitor": {"type": "keyword"},
                "attempts": {"type": "integer"},
                "reason": {"type": "keyword"},
                "error_kind": {"type": "keyword"},
                "last_error": {"type": "text"},
                "first_attempt": {"type": "date"},
                "last_attempt": {"type": "date"},
                "parked_at": {"type": "date"},
                "parked_at_us": {"type": "long"},
                "host": {"type": "keyword"},
                "operation": {"type": "object", "enabled": false}
            }
        })
    }

    fn err(&self, source: EsError) -> DeadLetterError {
        DeadLetterError::Store {
            index: self.index.clone(),
            source,
        }
    }

    async fn ensure(&self) -> Result<(), DeadLetterError> {
        self.ready
            .get_or_try_init(|| async {
                self.store
                    .ensure_index(&self.index, &crate::es::own_index_body(Self::mappings()))
                    .await
            })
            .await
            .map(|_| ())
            .map_err(|e| self.err(e))
    }
}

/// Page size of [`EsSink::list`].
const ES_PAGE: usize = 500;

#[async_trait]
impl DeadLetterSink for EsSink {
    async fn park(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        self.ensure().await?;
        let mut source = serde_json::to_value(letter).map_err(|source| DeadLetterError::Json {
            what: format!("{} (encoding)", letter.id),
            source,
        })?;
        // The sort key: parking order, to the microsecond.
        source["parked_at_us"] = json!(time_serde::micros(letter.parked_at));
        self.store
            .index(
                &self.index,
                &letter.id.to_string(),
                &source,
                WriteCondition::Always,
                Refresh::WaitFor,
            )
            .await
            .map_err(|e| self.err(e))?;
        tracing::info!(id = %letter.id, index = %self.index, "operation parked");
        Ok(())
    }

    async fn list(&self) -> Result<Vec<DeadLetter>, DeadLetterError> {
        let mut out = Vec::new();
        let mut after: Option<Value> = None;
        loop {
            let mut body = json!({
                "size": self.page,
                "query": {"match_all": {}},
                "sort": [{"parked_at_us": "asc"}, {"id": "asc"}],
            });
            if let Some(a) = &after {
                body["search_after"] = a.clone();
            }
            let hits = self
                .store
                .search(&self.index, &body)
                .await
                .map_err(|e| self.err(e))?;
            let n = hits.len();
            for hit in hits {
                let letter: DeadLetter =
                    serde_json::from_value(hit.source).map_err(|source| DeadLetterError::Json {
                        what: hit.id.clone(),
                        source,
                    })?;
                after = Some(json!([
                    time_serde::micros(letter.parked_at),
                    letter.id.to_string()
                ]));
                out.push(letter);
            }
            if n < self.page {
                return Ok(out);
            }
        }
    }

    async fn remove(&self, id: Uuid) -> Result<bool, DeadLetterError> {
        match self
            .store
            .delete(
                &self.index,
                &id.to_string(),
                WriteCondition::Always,
                Refresh::WaitFor,
            )
            .await
        {
            Ok(found) => Ok(found.is_some()),
            Err(EsError::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.err(e)),
        }
    }

    fn describe(&self) -> String {
        format!("index {}", self.index)
    }
}
