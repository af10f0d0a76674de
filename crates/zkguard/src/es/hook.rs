//! Intercepting the calls of a [`DocStore`]: [`StoreHook`], [`HookedStore`] and [`IndexGate`].

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use tokio::sync::Notify;

use super::{BulkAction, Doc, DocMeta, DocStore, EsError, Refresh, WriteCondition};

/// One call of a [`DocStore`], with its arguments: what a [`StoreHook`] sees.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum StoreCall<'a> {
    /// [`DocStore::get`].
    Get {
        /// Index.
        index: &'a str,
        /// Document id.
        id: &'a str,
    },
    /// [`DocStore::mget`].
    Mget {
        /// `(index, id)` of each document.
        docs: &'a [(String, String)],
    },
    /// [`DocStore::index`].
    Index {
        /// Index.
        index: &'a str,
        /// Document id.
        id: &'a str,
        /// The document.
        source: &'a Value,
        /// Precondition.
        condition: WriteCondition,
        /// Refresh policy.
        refresh: Refresh,
    },
    /// [`DocStore::delete`].
    Delete {
        /// Index.
        index: &'a str,
        /// Document id.
        id: &'a str,
        /// Precondition.
        condition: WriteCondition,
        /// Refresh policy.
        refresh: Refresh,
    },
    /// [`DocStore::search`].
    Search {
        /// Index.
        index: &'a str,
        /// Request body.
        body: &'a Value,
    },
    /// [`DocStore::bulk`].
    Bulk {
        /// The actions.
        actions: &'a [BulkAction],
        /// Refresh policy.
        refresh: Refresh,
    },
    /// [`DocStore::ensure_index`].
    EnsureIndex {
        /// Index.
        index: &'a str,
        /// Mappings.
        mappings: &'a Value,
    },
    /// [`DocStore::refresh`].
    Refresh {
        /// Index.
        index: &'a str,
    },
    /// [`DocStore::put_mapping`].
    PutMapping {
        /// Index.
        index: &'a str,
        /// The properties added.
        properties: &'a Value,
    },
}

impl StoreCall<'_> {
    /// The name of the [`DocStore`] method: `get`, `mget`, `index`, `delete`, `search`, `bulk`,
    /// `ensure_index`, `refresh` or `put_mapping` (a label for metrics and logs).
    pub fn method(&self) -> &'static str {
        match self {
            Self::Get { .. } => "get",
            Self::Mget { .. } => "mget",
            Self::Index { .. } => "index",
            Self::Delete { .. } => "delete",
            Self::Search { .. } => "search",
            Self::Bulk { .. } => "bulk",
            Self::EnsureIndex { .. } => "ensure_index",
            Self::Refresh { .. } => "refresh",
            Self::PutMapping { .. } => "put_mapping",
        }
    }
}

/// Code run around every call of a [`HookedStore`]: metrics, logging, fault injection, or
/// holding a call back to stage a race in a test. Both methods default to doing nothing, so a
/// hook implements only what it needs.
#[async_trait]
pub trait StoreHook: Send + Sync + 'static {
    /// Runs before `call` is forwarded to the inner store.
    ///
    /// # Errors
    /// An error is answered to the caller instead, and the inner store is not called (an
    /// injected failure that never reached the server).
    ///
    /// # Cancellation safety
    /// When the caller drops the call's future, this future is dropped at its current await
    /// point and the inner store is not called.
    async fn before(&self, _call: &StoreCall<'_>) -> Result<(), EsError> {
        Ok(())
    }

    /// Runs after the inner store answered `call`: `outcome` is `Ok(())` when the call
    /// succeeded (for [`DocStore::bulk`], when the request as a whole did) and its error
    /// otherwise. Returning `Some(error)` answers the caller with `error` instead, whatever the
    /// call did on the server (for example a reply lost after the write was applied).
    ///
    /// # Cancellation safety
    /// When the caller drops the call's future, this future is dropped at its current await
    /// point; the inner store's call has completed by then.
    async fn after(
        &self,
        _call: &StoreCall<'_>,
        _outcome: Result<(), &EsError>,
    ) -> Option<EsError> {
        None
    }
}

#[async_trait]
impl<H: StoreHook + ?Sized> StoreHook for Arc<H> {
    async fn before(&self, call: &StoreCall<'_>) -> Result<(), EsError> {
        (**self).before(call).await
    }
    async fn after(&self, call: &StoreCall<'_>, outcome: Result<(), &EsError>) -> Option<EsError> {
        (**self).after(call, outcome).await
    }
}

/// A [`DocStore`] that runs a [`StoreHook`] around every call of an inner store: first
/// [`StoreHook::before`], then the inner store's call, then [`StoreHook::after`].
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
///
/// use async_trait::async_trait;
/// use zkguard::es::{
///     DocStore, EsError, EsStore, HookedStore, Refresh, StoreCall, StoreHook, WriteCondition,
/// };
///
/// /// Counts the calls and refuses every delete.
/// #[derive(Default)]
/// struct NoDeletes {
///     calls: AtomicU64,
/// }
///
/// #[async_trait]
/// impl StoreHook for NoDeletes {
///     async fn before(&self, call: &StoreCall<'_>) -> Result<(), EsError> {
///         self.calls.fetch_add(1, Ordering::Relaxed);
///         match call {
///             StoreCall::Delete { index, id, .. } => Err(EsError::BadRequest {
///                 status: 0,
///                 reason: format!("deleting {index}/{id}: deletes are switched off here"),
///             }),
///             _ => Ok(()),
///         }
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), EsError> {
/// let es: Arc<dyn DocStore> = Arc::new(EsStore::from_url("http://127.0.0.1:9200")?);
/// let store = HookedStore::new(es, NoDeletes::default());
/// // The hook answers at once: no request is sent.
/// let refused = store
///     .delete("articles", "7", WriteCondition::Always, Refresh::No)
///     .await;
/// assert!(matches!(refused, Err(EsError::BadRequest { status: 0, .. })));
/// assert_eq!(store.hook().calls.load(Ordering::Relaxed), 1);
/// # Ok(())
/// # }
/// ```
///
/// Hand `Arc::new(store)` to anything that takes an `Arc<dyn DocStore>` (a
/// [`GuardedWriter`](crate::write::guarded::GuardedWriter), a transaction coordinator, the
/// Elasticsearch lease lock).
pub struct HookedStore<H> {
    inner: Arc<dyn DocStore>,
    hook: H,
}

impl<H: StoreHook> HookedStore<H> {
    /// Runs `hook` around every call of `inner`.
    #[must_use]
    pub fn new(inner: Arc<dyn DocStore>, hook: H) -> Self {
        Self { inner, hook }
    }

    /// The hook.
    pub fn hook(&self) -> &H {
        &self.hook
    }

    /// The inner store.
    pub fn inner(&self) -> &Arc<dyn DocStore> {
        &self.inner
    }

    async fn around<T>(
        &self,
        call: StoreCall<'_>,
        forward: impl Future<Output = Result<T, EsError>>,
    ) -> Result<T, EsError> {
        self.hook.before(&call).await?;
        let result = forward.await;
        match self.hook.after(&call, result.as_ref().map(|_| ())).await {
            Some(error) => Err(error),
            None => result,
        }
    }
}

#[async_trait]
impl<H: StoreHook> DocStore for HookedStore<H> {
    async fn get(&self, index: &str, id: &str) -> Result<Option<Doc>, EsError> {
        let call = StoreCall::Get { index, id };
        self.around(call, self.inner.get(index, id)).await
    }
    async fn mget(
        &self,
        docs: &[(String, String)],
    ) -> Result<Vec<Result<Option<Doc>, EsError>>, EsError> {
        let call = StoreCall::Mget { docs };
        self.around(call, self.inner.mget(docs)).await
    }
    async fn index(
        &self,
        index: &str,
        id: &str,
        source: &Value,
        condition: WriteCondition,
        refresh: Refresh,
    ) -> Result<DocMeta, EsError> {
        let call = StoreCall::Index {
            index,
            id,
            source,
            condition,
            refresh,
        };
        let forward = self.inner.index(index, id, source, condition, refresh);
        self.around(call, forward).await
    }
    async fn delete(
        &self,
        index: &str,
        id: &str,
        condition: WriteCondition,
        refresh: Refresh,
    ) -> Result<Option<DocMeta>, EsError> {
        let call = StoreCall::Delete {
            index,
            id,
            condition,
            refresh,
        };
        let forward = self.inner.delete(index, id, condition, refresh);
        self.around(call, forward).await
    }
    async fn search(&self, index: &str, body: &Value) -> Result<Vec<Doc>, EsError> {
        let call = StoreCall::Search { index, body };
        self.around(call, self.inner.search(index, body)).await
    }
    async fn bulk(
        &self,
        actions: &[BulkAction],
        refresh: Refresh,
    ) -> Result<Vec<Result<DocMeta, EsError>>, EsError> {
        let call = StoreCall::Bulk { actions, refresh };
        self.around(call, self.inner.bulk(actions, refresh)).await
    }
    async fn ensure_index(&self, index: &str, mappings: &Value) -> Result<(), EsError> {
        let call = StoreCall::EnsureIndex { index, mappings };
        self.around(call, self.inner.ensure_index(index, mappings))
            .await
    }
    async fn refresh(&self, index: &str) -> Result<(), EsError> {
        let call = StoreCall::Refresh { index };
        self.around(call, self.inner.refresh(index)).await
    }
    async fn put_mapping(&self, index: &str, properties: &Value) -> Result<bool, EsError> {
        let call = StoreCall::PutMapping { index, properties };
        self.around(call, self.inner.put_mapping(index, properties))
            .await
    }
}

/// A [`StoreHook`] that holds back every [`DocStore::index`] call until it is let through:
/// it stages the pause of a writer between its last lock check and its request reaching
/// Elasticsearch (a GC pause, a stalled thread), to show that fencing rejects the late write.
/// Other calls pass at once.
///
/// Each held call first signals [`reached`](Self::reached), then waits for one
/// [`let_through`](Self::let_through). Both signals are kept when nobody waits yet (at most one
/// of each), so their order does not matter.
///
/// ```no_run
/// # async fn demo(es: std::sync::Arc<dyn zkguard::es::DocStore>) {
/// use std::sync::Arc;
/// use zkguard::es::{HookedStore, IndexGate};
///
/// let stalled = Arc::new(HookedStore::new(es, IndexGate::new()));
/// // ... start a guarded write through `stalled` ...
/// stalled.hook().reached().await;
/// // ... the writer is now held just before its request: expire its lock, write newer data ...
/// stalled.hook().let_through();
/// # }
/// ```
#[derive(Debug, Default)]
pub struct IndexGate {
    reached: Notify,
    open: Notify,
}

impl IndexGate {
    /// A closed gate.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Waits until an `index` call reached the gate.
    ///
    /// # Cancellation safety
    /// Cancel-safe: a signal is consumed only when this future completes.
    pub async fn reached(&self) {
        self.reached.notified().await;
    }

    /// Lets one held `index` call through (or the next one, when none waits).
    pub fn let_through(&self) {
        self.open.notify_one();
    }
}

#[async_trait]
impl StoreHook for IndexGate {
    async fn before(&self, call: &StoreCall<'_>) -> Result<(), EsError> {
        if let StoreCall::Index { .. } = call {
            self.reached.notify_one();
            self.open.notified().await;
        }
        Ok(())
    }
}
