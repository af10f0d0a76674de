//! [`DocStore`](super::DocStore) over the official `elasticsearch` crate (under construction).

/// The Elasticsearch-backed document store.
#[derive(Debug, Clone)]
pub struct EsStore {}
