//! What a producer error means: for the command (transient or permanent, [`classify`]) and
//! for the call once its message was enqueued (answered or maybe, [`delivery_answer`]; a
//! message librdkafka refused to enqueue was never sent).
//!
//! librdkafka knows whether a failed message may have been written
//! (`rd_kafka_message_status()`: not persisted, possibly persisted, persisted), but the
//! rdkafka crate does not expose it, and calling the C function needs `unsafe`, which the
//! crate forbids (src/lib.rs). So the call's answer is read from where the error came from
//! and its code, erring towards "maybe": a sink must never say "never sent" after a byte may
//! have left, nor "answered" before the broker answered.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::sinks::CallAnswer;

/// What a delivery error means for the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// Retry with the same key.
    Transient,
    /// Retrying cannot help.
    Permanent,
}

/// The single place that says which producer errors are transient.
///
/// Transient: the delivery timed out or the local queue was full (`MessageTimedOut`,
/// `QueueFull`), the cluster was unreachable or changing leaders (`BrokerTransportFailure`,
/// `AllBrokersDown`, `Resolve`, `NetworkException`, `RequestTimedOut`,
/// `LeaderNotAvailable`, `NotLeaderForPartition`, `PreferredLeaderNotAvailable`,
/// `FencedLeaderEpoch`, `KafkaStorageError`, `NotEnoughReplicas`,
/// `NotEnoughReplicasAfterAppend`), the message was purged because the producer shut down
/// (`PurgeQueue`, and a cancelled delivery future), and an idempotence sequence error the
/// producer recovers from (`OutOfOrderSequenceNumber`).
///
/// Permanent: everything else, notably `MessageSizeTooLarge`, `InvalidMessage`,
/// `InvalidRecord`, `TopicAuthorizationFailed`, `ClusterAuthorizationFailed`, and
/// `UnknownTopic` / `UnknownTopicOrPartition` (the topic does not exist and is not
/// auto-created: a config mistake that retries cannot fix).
pub(crate) fn classify(err: &KafkaError) -> Class {
    use RDKafkaErrorCode as C;
    let transient = |code: &RDKafkaErrorCode| {
        matches!(
            code,
            C::MessageTimedOut
                | C::QueueFull
                | C::BrokerTransportFailure
                | C::AllBrokersDown
                | C::Resolve
                | C::NetworkException
                | C::RequestTimedOut
                | C::LeaderNotAvailable
                | C::NotLeaderForPartition
                | C::PreferredLeaderNotAvailable
                | C::FencedLeaderEpoch
                | C::KafkaStorageError
                | C::NotEnoughReplicas
                | C::NotEnoughReplicasAfterAppend
                | C::PurgeQueue
                | C::OutOfOrderSequenceNumber
        )
    };
    match err {
        KafkaError::Canceled => Class::Transient,
        KafkaError::MessageProduction(code) if transient(code) => Class::Transient,
        _ => Class::Permanent,
    }
}

/// The answer of a call whose enqueued message's delivery report came back with `err`.
///
/// Answered: a definite refusal by the cluster that librdkafka does not retry, of a
/// message no attempt of which can have been written: too large for the topic
/// (`MessageSizeTooLarge`, `MessageBatchTooLarge`, `InvalidMessageSize`), refused as invalid
/// (`InvalidMessage`, `InvalidRecord`, `InvalidTimestamp`, `UnsupportedForMessageFormat`,
/// `UnsupportedCompressionType`, `InvalidRequiredAcks`, `PolicyViolation`), not
/// authorised (`TopicAuthorizationFailed`, `ClusterAuthorizationFailed`), or for a topic
/// or partition the cluster says does not exist (`UnknownTopicOrPartition`, `InvalidTopic`,
/// and librdkafka's `UnknownTopic`, `UnknownPartition` from the cluster's metadata).
///
/// Maybe: everything else, notably `MessageTimedOut` (librdkafka gives up on a message
/// after `message.timeout.ms` whether or not a produce request carrying it reached the
/// broker), transport failures, purges, the idempotent producer's fatal errors, and the
/// retriable refusals (`NotEnoughReplicas`, `NotLeaderForPartition`, ...): librdkafka
/// reports those only after retrying, and an earlier attempt may have been written.
pub(crate) fn delivery_answer(err: &KafkaError) -> CallAnswer {
    use RDKafkaErrorCode as C;
    match err {
        KafkaError::MessageProduction(
            C::MessageSizeTooLarge
            | C::MessageBatchTooLarge
            | C::InvalidMessageSize
            | C::InvalidMessage
            | C::InvalidRecord
            | C::InvalidTimestamp
            | C::UnsupportedForMessageFormat
            | C::UnsupportedCompressionType
            | C::InvalidRequiredAcks
            | C::PolicyViolation
            | C::TopicAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::UnknownTopicOrPartition
            | C::InvalidTopic
            | C::UnknownTopic
            | C::UnknownPartition,
        ) => CallAnswer::Answered,
        _ => CallAnswer::Maybe,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retriable_errors_are_transient_others_permanent() {
        for code in [
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::QueueFull,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::NotEnoughReplicas,
        ] {
            assert_eq!(classify(&KafkaError::MessageProduction(code)), Class::Transient, "{code:?}");
        }
        assert_eq!(classify(&KafkaError::Canceled), Class::Transient);
        for code in [
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::UnknownTopicOrPartition,
            RDKafkaErrorCode::InvalidRecord,
        ] {
            assert_eq!(classify(&KafkaError::MessageProduction(code)), Class::Permanent, "{code:?}");
        }
    }

    #[test]
    fn a_definite_refusal_is_answered_a_timeout_or_a_retried_refusal_maybe() {
        let answer = |code| delivery_answer(&KafkaError::MessageProduction(code));
        for code in [
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::UnknownTopicOrPartition,
            RDKafkaErrorCode::UnknownTopic,
            RDKafkaErrorCode::InvalidRecord,
        ] {
            assert_eq!(answer(code), CallAnswer::Answered, "{code:?}");
        }
        for code in [
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::RequestTimedOut,
            RDKafkaErrorCode::NotEnoughReplicas,
            RDKafkaErrorCode::NotEnoughReplicasAfterAppend,
            RDKafkaErrorCode::PurgeQueue,
            RDKafkaErrorCode::PurgeInflight,
            RDKafkaErrorCode::Fatal,
            RDKafkaErrorCode::BrokerTransportFailure,
        ] {
            assert_eq!(answer(code), CallAnswer::Maybe, "{code:?}");
        }
        assert_eq!(delivery_answer(&KafkaError::Canceled), CallAnswer::Maybe);
    }
}
