//! Where a request's answer comes from: the results topic. A request enters its key in
//! [`Waiters`] before its command is produced, then waits for the result record whose
//! `source` is the record it produced (every input gets exactly one, docs/contract.md §5).
//! One reader per intake reads every partition of the results topic from where they ended
//! when it started, and hands each record of a waited-for key to that key's waiters.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::outcome::SourceRef;

/// The keys requests are waiting on, each with the results seen for it since.
#[derive(Default)]
pub struct Waiters {
    keys: Mutex<HashMap<String, Arc<Pending>>>,
}

/// The results of one key seen while a request waits on it.
#[derive(Default)]
struct Pending {
    arrived: Mutex<Vec<(SourceRef, Value)>>,
    notify: Notify,
}

/// A request's hold on its key: while it lives, another request with the key is told the
/// first is in flight. Dropping it lets the key go.
pub struct Ticket {
    waiters: Arc<Waiters>,
    key: String,
    pending: Arc<Pending>,
}

impl Waiters {
    /// Holds `key` for one request, or `None` when another request holds it.
    pub fn enter(self: &Arc<Self>, key: &str) -> Option<Ticket> {
        let mut keys = self.keys.lock();
        if keys.contains_key(key) {
            return None;
        }
        let pending = Arc::new(Pending::default());
        keys.insert(key.to_string(), Arc::clone(&pending));
        Some(Ticket { waiters: Arc::clone(self), key: key.to_string(), pending })
    }

    /// Hands a result record of `key` to its waiters, if any.
    fn deliver(&self, key: &str, value: &[u8]) {
        let Some(pending) = self.keys.lock().get(key).cloned() else { return };
        let Ok(value) = serde_json::from_slice::<Value>(value) else { return };
        let Some(source) = value.get("source").and_then(|s| serde_json::from_value::<SourceRef>(s.clone()).ok()) else {
            return;
        };
        pending.arrived.lock().push((source, value));
        pending.notify.notify_waiters();
    }

    /// Whether a request holds `key` now.
    pub fn holds(&self, key: &str) -> bool {
        self.keys.lock().contains_key(key)
    }
}

impl Ticket {
    /// The result record of the input at `source`, once the reader has seen it.
    pub async fn result_of(&self, source: &SourceRef) -> Value {
        loop {
            // Registered before looking, so that a result delivered in between wakes it.
            let notified = self.pending.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some((_, value)) = self.pending.arrived.lock().iter().find(|(s, _)| s.same_record(source)) {
                return value.clone();
            }
            notified.await;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.waiters.keys.lock().remove(&self.key);
    }
}

/// Why the reader could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReaderError {
    #[error("intake: cannot read the results topic {topic}: {source}")]
    Kafka { topic: String, source: rdkafka::error::KafkaError },
    #[error("intake: the results topic {0} has no partitions")]
    NoPartitions(String),
}

/// How long the reader keeps asking for the results topic's partitions and their ends: a
/// topic just created has no leaders for a moment (the broker answers
/// `NotLeaderForPartition`), and `run` should not stop for that.
const FIND_ENDS_FOR: Duration = Duration::from_secs(30);

/// Starts reading `topic` at its current end with `consumer` (no group: it is assigned
/// every partition), handing records to `waiters` until `stop`. Returns once assigned, so
/// that every result of a command produced afterwards is read.
pub fn start_reader(
    consumer: BaseConsumer,
    topic: &str,
    waiters: Arc<Waiters>,
    stop: CancellationToken,
) -> Result<std::thread::JoinHandle<()>, ReaderError> {
    let kafka = |source| ReaderError::Kafka { topic: topic.to_string(), source };
    let deadline = std::time::Instant::now() + FIND_ENDS_FOR;
    let assignment = loop {
        match ends(&consumer, topic) {
            Ok(assignment) => break assignment,
            Err(ReaderError::Kafka { source, .. }) if std::time::Instant::now() < deadline && !stop.is_cancelled() => {
                tracing::info!(topic, error = %source, "intake: the results topic's partitions are not ready; asking again");
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => return Err(e),
        }
    };
    consumer.assign(&assignment).map_err(kafka)?;
    let topic = topic.to_string();
    Ok(std::thread::spawn(move || read_until(&consumer, &topic, &waiters, &stop)))
}

/// Every partition of `topic` at its end offset.
fn ends(consumer: &BaseConsumer, topic: &str) -> Result<TopicPartitionList, ReaderError> {
    let kafka = |source| ReaderError::Kafka { topic: topic.to_string(), source };
    let timeout = Duration::from_secs(10);
    let metadata = consumer.fetch_metadata(Some(topic), timeout).map_err(kafka)?;
    let partitions: Vec<i32> = metadata.topics().iter().flat_map(|t| t.partitions().iter().map(|p| p.id())).collect();
    if partitions.is_empty() {
        return Err(ReaderError::NoPartitions(topic.to_string()));
    }
    let mut assignment = TopicPartitionList::new();
    for partition in partitions {
        let (_, end) = consumer.fetch_watermarks(topic, partition, timeout).map_err(kafka)?;
        assignment.add_partition_offset(topic, partition, Offset::Offset(end)).map_err(kafka)?;
    }
    Ok(assignment)
}

fn read_until(consumer: &BaseConsumer, topic: &str, waiters: &Waiters, stop: &CancellationToken) {
    while !stop.is_cancelled() {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(record)) => {
                if let (Some(key), Some(value)) = (record.key(), record.payload())
                    && let Ok(key) = std::str::from_utf8(key)
                {
                    waiters.deliver(key, value);
                }
            }
            Some(Err(e)) => tracing::warn!(topic, error = %e, "intake: reading results"),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(partition: i32, offset: i64) -> Vec<u8> {
        serde_json::json!({"outcome": "succeeded", "source": {"topic": "t", "partition": partition, "offset": offset}})
            .to_string()
            .into_bytes()
    }

    #[tokio::test]
    async fn a_key_is_held_by_one_request_at_a_time() {
        let waiters = Arc::new(Waiters::default());
        let ticket = waiters.enter("alice/k").expect("first");
        assert!(waiters.enter("alice/k").is_none());
        assert!(waiters.enter("bob/k").is_some());
        drop(ticket);
        assert!(waiters.enter("alice/k").is_some());
    }

    #[tokio::test]
    async fn a_request_gets_the_result_of_its_own_record_delivered_before_or_after_it_waits() {
        let waiters = Arc::new(Waiters::default());
        let ticket = waiters.enter("alice/k").expect("held");
        let mine = SourceRef::at("t", 1, 7);
        waiters.deliver("alice/k", &result(1, 6));
        waiters.deliver("alice/k", &result(1, 7));
        assert_eq!(ticket.result_of(&mine).await["source"]["offset"], 7);

        let later = SourceRef::at("t", 1, 9);
        let deliver = {
            let waiters = Arc::clone(&waiters);
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                waiters.deliver("alice/k", &result(1, 9));
            })
        };
        let got = tokio::time::timeout(Duration::from_secs(5), ticket.result_of(&later)).await.expect("delivered");
        assert_eq!(got["source"]["offset"], 9);
        deliver.await.expect("task");
    }

    #[test]
    fn records_of_keys_no_one_waits_for_are_ignored() {
        let waiters = Arc::new(Waiters::default());
        waiters.deliver("nobody/k", &result(0, 1));
        assert!(!waiters.holds("nobody/k"));
        assert!(waiters.keys.lock().is_empty());
    }
}
