//! Why a transaction did not commit, and which of those are fences (invariant 6).

use std::time::Duration;

use rdkafka::error::KafkaError;

/// Why a transaction did not commit. Every one of them stops the process (invariant 4).
#[derive(Debug, thiserror::Error)]
pub(crate) enum TransactionError {
    /// A worker held the gate too long (the producer's queue stayed full).
    #[error("results could not be queued within {0:?}")]
    GateTimeout(Duration),
    /// Offsets to commit, but no group generation to commit them for.
    #[error("no consumer group metadata to commit offsets with")]
    NoGroup,
    /// Kafka refused or failed the transaction; it was aborted when it could be.
    #[error("transaction failed: {0}")]
    Kafka(#[from] KafkaError),
    /// An earlier transaction failed; nothing goes out any more.
    #[error("an earlier transaction failed")]
    Failed,
}

impl TransactionError {
    /// Whether the broker refused the commit because this member's group generation is
    /// gone (it was paused past its session, or its partitions moved): an abortable error
    /// for librdkafka, a fence for dedupd (invariant 6).
    pub(super) fn is_fence(&self) -> bool {
        use rdkafka::types::RDKafkaErrorCode as C;
        let code = match self {
            TransactionError::Kafka(KafkaError::Transaction(e)) => e.code(),
            TransactionError::Kafka(e) => match e.rdkafka_error_code() {
                Some(code) => code,
                None => return false,
            },
            _ => return false,
        };
        // `ProducerFenced`/`Fenced`: another holder of the `transactional.id` fenced it, as a
        // survivor does to a transaction that stalls its partitions (invariant 8).
        matches!(code, C::IllegalGeneration | C::UnknownMemberId | C::FencedInstanceId | C::ProducerFenced | C::Fenced)
    }
}
