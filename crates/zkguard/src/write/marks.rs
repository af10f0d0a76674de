//! Marks of document transactions ([`crate::txn::multi`]) that a writer finds under its lock.
//!
//! A live transaction holds its documents' locks until it has cleared its marks, so a writer
//! that holds a document's lock and finds a mark there knows that transaction's coordinator is
//! gone. Before building on the document (a merge, an increment, a create's existence check),
//! it has the transaction decided for that document: a committed transaction is finished there
//! (its after-image written unmarked, a deleted document deleted), an undecided one's write is
//! undone. The writer's own write never carries the mark on: a mark left on a document (a
//! later writer's copy of it, or one of a transaction already final) is dropped by it, so that
//! no recovery takes the writer's document for the transaction's write. Whole-document writes
//! replace the marked write anyway.

use async_trait::async_trait;

use crate::es::{Doc, DocStore, EsError};
use crate::write::ops::Stamp;

/// Decides, for one document, a document transaction whose mark a writer found on it.
#[async_trait]
pub trait MarkResolver: Send + Sync + 'static {
    /// `doc` (`index/id`), read under a lock whose fencing token is `token`, carries the mark
    /// of transaction `txn`. Decide it for this document, writing with `token`; `Ok(true)` when
    /// the document was rewritten (read it again).
    ///
    /// # Errors
    /// [`EsError`] when the log or the document cannot be read or written.
    ///
    /// # Cancellation safety
    /// Safe in outcome: a dropped call leaves the transaction for its recovery.
    async fn resolve(
        &self,
        txn: &str,
        index: &str,
        id: &str,
        doc: &Doc,
        token: u64,
    ) -> Result<bool, EsError>;
}

/// The transaction whose mark `doc` carries, if any.
pub fn mark_of(doc: &Doc) -> Option<String> {
    Stamp::of(&doc.source).and_then(|s| s.txn)
}

/// `doc` as it is once the mark it carries (if any) is decided through `resolver`: read again
/// when the resolver rewrote it.
///
/// # Errors
/// The resolver's, and the read's.
pub(crate) async fn settled(
    resolver: Option<&dyn MarkResolver>,
    store: &dyn DocStore,
    index: &str,
    id: &str,
    doc: Option<Doc>,
    token: u64,
) -> Result<Option<Doc>, EsError> {
    let (Some(resolver), Some(found)) = (resolver, doc.as_ref()) else {
        return Ok(doc);
    };
    let Some(txn) = mark_of(found) else {
        return Ok(doc);
    };
    if resolver.resolve(&txn, index, id, found, token).await? {
        return store.get(index, id).await;
    }
    Ok(doc)
}
