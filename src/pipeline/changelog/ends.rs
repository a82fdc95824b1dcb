//! A partition's end offsets (low and high watermark, or last stable offset for a
//! `read_committed` client), read again while the client's metadata does not know the
//! partition yet.
//!
//! A topic dedupd has just created (`topic`) is known to the broker before every client's
//! metadata cache has it: librdkafka then answers `UnknownPartition` at once instead of
//! refreshing and waiting. A restore that took that for an answer stopped the process on its
//! first assignment (found by tests/kafka/kafka_chaos.rs in a clean-clone run). A leader that is
//! moving passes too. Everything else is an answer.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// The pause between two reads of a partition the metadata does not know yet.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Whether `error`, from reading a partition's offsets, says the client's metadata is behind
/// the cluster's (the partition is new, or its leader is moving) rather than anything about
/// the partition.
fn metadata_behind(error: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    let code = match error {
        KafkaError::MetadataFetch(code) => Some(*code),
        other => other.rdkafka_error_code(),
    };
    matches!(
        code,
        Some(
            C::UnknownPartition
                | C::UnknownTopic
                | C::UnknownTopicOrPartition
                | C::LeaderNotAvailable
                | C::NotLeaderForPartition
                | C::FencedLeaderEpoch
        )
    )
}

/// Calls `read` until it answers, or until `timeout` has passed while it still says the
/// metadata is behind (`metadata_behind`); then returns the last error. Blocking.
fn read_until_known<T>(
    timeout: Duration,
    pause: Duration,
    mut read: impl FnMut(Duration) -> Result<T, KafkaError>,
) -> Result<T, KafkaError> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match read(left) {
            Err(e) if metadata_behind(&e) && left > pause => std::thread::sleep(pause),
            answer => return answer,
        }
    }
}

/// `topic`/`partition`'s (low, high) offsets as `consumer` sees them (`read_committed`: the
/// high one is the last stable offset), waiting up to `timeout` for its metadata to know
/// the partition. Blocking.
pub(super) fn end_offsets<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> Result<(i64, i64), KafkaError> {
    read_until_known(timeout, RETRY_PAUSE, |left| consumer.fetch_watermarks(topic, partition, left))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNKNOWN: KafkaError = KafkaError::MetadataFetch(RDKafkaErrorCode::UnknownPartition);

    #[test]
    fn a_partition_the_metadata_learns_late_is_read_once_it_is_known() {
        let mut calls = 0;
        let read = read_until_known(Duration::from_secs(10), Duration::from_millis(1), |_| {
            calls += 1;
            if calls < 4 { Err(UNKNOWN) } else { Ok((0, 7)) }
        });
        assert_eq!(read.ok(), Some((0, 7)));
        assert_eq!(calls, 4);
    }

    #[test]
    fn any_other_error_is_the_answer() {
        let mut calls = 0;
        let read: Result<(i64, i64), _> = read_until_known(Duration::from_secs(10), Duration::from_millis(1), |_| {
            calls += 1;
            Err(KafkaError::MetadataFetch(RDKafkaErrorCode::TopicAuthorizationFailed))
        });
        assert!(matches!(read, Err(KafkaError::MetadataFetch(RDKafkaErrorCode::TopicAuthorizationFailed))));
        assert_eq!(calls, 1);
    }

    #[test]
    fn a_partition_never_known_is_an_error_after_the_timeout() {
        let mut calls = 0;
        let read: Result<(i64, i64), _> = read_until_known(Duration::from_millis(30), Duration::from_millis(5), |_| {
            calls += 1;
            Err(UNKNOWN)
        });
        assert!(matches!(read, Err(KafkaError::MetadataFetch(RDKafkaErrorCode::UnknownPartition))));
        assert!(calls >= 2, "read again before giving up: {calls} reads");
    }

    #[test]
    fn what_says_the_metadata_is_behind() {
        assert!(metadata_behind(&UNKNOWN));
        assert!(metadata_behind(&KafkaError::MetadataFetch(RDKafkaErrorCode::LeaderNotAvailable)));
        assert!(!metadata_behind(&KafkaError::MetadataFetch(RDKafkaErrorCode::OperationTimedOut)));
        assert!(!metadata_behind(&KafkaError::MetadataFetch(RDKafkaErrorCode::TopicAuthorizationFailed)));
    }
}
