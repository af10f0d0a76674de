//! Errors of the Kafka dead-letter sink, apart from the sink so that [`super::DeadLetterError`]
//! can carry them without depending on the sink.

use std::time::Duration;

/// Errors of the Kafka sink.
#[derive(Debug, thiserror::Error)]
pub enum KafkaSinkError {
    /// No broker answered.
    #[error("cannot reach the Kafka brokers {brokers} within {timeout:?}: {detail}; check deadletter.kafka.brokers and that a broker is running")]
    Unreachable {
        /// The configured brokers.
        brokers: String,
        /// How long zkguard waited.
        timeout: Duration,
        /// What went wrong.
        detail: String,
    },
    /// The topic does not exist and zkguard may not create it.
    #[error("Kafka topic `{topic}` does not exist and deadletter.kafka.auto.create=false; create it (zkguard uses `{main}` and `{main}-offsets`, the latter with one partition) or set deadletter.kafka.auto.create=true")]
    TopicMissing {
        /// The missing topic.
        topic: String,
        /// The dead-letter topic (`deadletter.kafka.topic`).
        main: String,
    },
    /// The broker refused or failed a request.
    #[error("Kafka topic `{topic}`: cannot {action}: {detail}")]
    Broker {
        /// The topic.
        topic: String,
        /// What was being done.
        action: &'static str,
        /// What went wrong.
        detail: String,
    },
}

impl KafkaSinkError {
    /// Whether the error is a configuration problem (exit 78) rather than an unavailable broker
    /// (exit 69).
    pub fn is_config(&self) -> bool {
        matches!(self, Self::TopicMissing { .. })
    }
}
