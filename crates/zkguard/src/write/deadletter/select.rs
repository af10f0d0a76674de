//! The sink `deadletter.sink` selects.

use std::sync::Arc;

use crate::config::{DeadLetterSinkKind, RetrySettings};
use crate::es::DocStore;

use super::{DeadLetterError, DeadLetterSink, EsSink, FileSink};

/// The sink configured by `deadletter.sink`: a [`FileSink`] at `deadletter.file.path`, an
/// [`EsSink`] on `deadletter.index` (which needs `store`), or a
/// [`KafkaSink`](super::kafka::KafkaSink) (which connects on first use).
///
/// # Errors
/// [`DeadLetterError::NoStore`] for the Elasticsearch sink without a store.
pub fn sink_from_settings(
    retry: &RetrySettings,
    store: Option<Arc<dyn DocStore>>,
) -> Result<Arc<dyn DeadLetterSink>, DeadLetterError> {
    match retry.sink {
        DeadLetterSinkKind::File => Ok(Arc::new(FileSink::new(&retry.file_path))),
        DeadLetterSinkKind::Elasticsearch => {
            let store = store.ok_or(DeadLetterError::NoStore)?;
            Ok(Arc::new(EsSink::new(store, retry.index.clone())))
        }
        DeadLetterSinkKind::Kafka => Ok(Arc::new(super::kafka::KafkaSink::new(
            &retry.kafka,
            &retry.file_path,
        ))),
    }
}
