use std::collections::HashMap;
use std::time::Instant;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::{Offset, Timestamp, TopicPartitionList};
use serde_json::Value;

use super::*;
use crate::outcome::{DeadLetter as DeadLetterOf, Outcome, ResultRecord, SourceRef};

#[test]
fn missing_topics_refusals_and_oversize_results_are_permanent_the_rest_retried() {
    for code in [
        RDKafkaErrorCode::UnknownTopicOrPartition,
        RDKafkaErrorCode::TopicAuthorizationFailed,
        RDKafkaErrorCode::MessageSizeTooLarge,
    ] {
        assert!(is_permanent(&KafkaError::MessageProduction(code)), "{code:?}");
    }
    for code in [
        RDKafkaErrorCode::MessageTimedOut,
        RDKafkaErrorCode::QueueFull,
        RDKafkaErrorCode::NotEnoughReplicas,
        RDKafkaErrorCode::AllBrokersDown,
    ] {
        assert!(!is_permanent(&KafkaError::MessageProduction(code)), "{code:?}");
    }
}

/// Input `i` of a batch: a command keyed `key-i`; every third one also dead-lettered.
fn input(i: usize) -> (OwnedMessage, Processed) {
    let message = OwnedMessage::new(
        Some(format!("{{\"n\":{i}}}").into_bytes()),
        Some(format!("key-{i}").into_bytes()),
        "commands".into(),
        Timestamp::NotAvailable,
        0,
        i as i64,
        None,
    );
    let processed = Processed {
        result: ResultRecord {
            key: Some(format!("key-{i}")),
            kind: Some("t".into()),
            outcome: Outcome::Succeeded,
            replay: false,
            route: None,
            sink: None,
            result: Value::Object(Default::default()),
            error: None,
            attempts: 1,
            fingerprint: None,
            first_seen_at: None,
            completed_at: None,
            source: SourceRef::at("commands", 0, i as i64),
            settled_by: None,
        },
        dead_letter: i.is_multiple_of(3).then(|| DeadLetterOf { reason: "invalid_envelope", error: "test".into() }),
        duplicate_age_ms: None,
        traceparent: None,
        tracestate: None,
        span: None,
        sink_called: true,
    };
    (message, processed)
}

/// Every record of `topic`'s `partitions` on the mock cluster, as (key or "", count).
fn records_by_key(bootstrap: &str, topic: &str, partitions: i32, expected: usize) -> HashMap<String, usize> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "publish-test-reader")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning).expect("partition");
    }
    consumer.assign(&tpl).expect("assign");
    let (mut seen, mut total) = (HashMap::new(), 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    // Read until `expected` arrived and then a further second, so that extra copies show.
    let mut quiet_until: Option<Instant> = None;
    while Instant::now() < deadline && quiet_until.is_none_or(|q| Instant::now() < q) {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            let key = m.key().map(|k| String::from_utf8_lossy(k).into_owned()).unwrap_or_default();
            *seen.entry(key).or_insert(0) += 1;
            total += 1;
            if total >= expected && quiet_until.is_none() {
                quiet_until = Some(Instant::now() + Duration::from_secs(1));
            }
        }
    }
    seen
}

/// A batch whose results go to two partitions led by two brokers, one of them down: the
/// records Kafka did not take are named, sent again once it is back, and every record ends
/// up in its topic exactly once (sending the whole batch again would publish the
/// acknowledged half twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_what_kafka_did_not_take_is_sent_again() {
    let cluster = MockCluster::new(2).expect("mock cluster");
    cluster.create_topic("results", 2, 1).expect("results topic");
    cluster.create_topic("dead", 1, 1).expect("dead-letter topic");
    cluster.partition_leader("results", 0, Some(1)).expect("leader 0");
    cluster.partition_leader("results", 1, Some(2)).expect("leader 1");
    cluster.partition_leader("dead", 0, Some(1)).expect("leader dead");
    let bootstrap = cluster.bootstrap_servers();
    let mut kafka = KafkaConfig {
        bootstrap_servers: bootstrap.clone(),
        results_topic: "results".into(),
        dead_letter_topic: "dead".into(),
        ..KafkaConfig::default()
    };
    kafka.producer.insert("message.timeout.ms".into(), "2000".into());
    let publisher = Publisher::new(&kafka).expect("publisher");

    let batch: Vec<(OwnedMessage, Processed)> = (0..12).map(input).collect();
    let refs: Vec<(&OwnedMessage, &Processed)> = batch.iter().map(|(m, p)| (m, p)).collect();
    let parts = all_parts(&refs);
    assert_eq!(parts.len(), 16, "12 results and 4 dead letters");

    cluster.broker_down(2).expect("broker 2 down");
    let Queued { mut acks, rest } = publisher.send(&refs, &parts).await;
    assert!(rest.is_none(), "everything was queued");
    let not_taken = acks.acknowledged().await.expect_err("partition 1's leader is down");
    let failed: Vec<(usize, Part)> = not_taken.parts.clone();
    assert!(!failed.is_empty() && failed.len() < 12, "some results went to each partition: {failed:?}");
    assert!(failed.iter().all(|(_, part)| *part == Part::Result), "the dead letters' leader is up: {failed:?}");

    cluster.broker_up(2).expect("broker 2 up");
    let Queued { mut acks, rest } = publisher.send(&refs, &not_taken.parts).await;
    assert!(rest.is_none());
    acks.acknowledged().await.expect("acknowledged once broker 2 is back");

    let results = tokio::task::spawn_blocking({
        let bootstrap = bootstrap.clone();
        move || records_by_key(&bootstrap, "results", 2, 12)
    })
    .await
    .expect("reader");
    let expected: HashMap<String, usize> = (0..12).map(|i| (format!("key-{i}"), 1)).collect();
    assert_eq!(results, expected, "one result per input, none published twice");
    let dead = tokio::task::spawn_blocking(move || records_by_key(&bootstrap, "dead", 1, 4)).await.expect("reader");
    let expected: HashMap<String, usize> = [0, 3, 6, 9].iter().map(|i| (format!("key-{i}"), 1)).collect();
    assert_eq!(dead, expected, "one dead letter per dead-lettered input");
}

#[test]
fn the_transactional_producer_times_out_and_backs_off_as_dedupd_chose_unless_configured() {
    let kafka = KafkaConfig::default();
    let c = producer_config_with(&kafka, Some("dedupd-x")).expect("config");
    assert_eq!(c.get("transaction.timeout.ms"), Some("10000"));
    assert_eq!(c.get("message.timeout.ms"), Some("10000"), "within the transaction's timeout");
    assert_eq!(c.get("retry.backoff.ms"), Some("10"));
    let plain = producer_config_with(&kafka, None).expect("config");
    assert_eq!(plain.get("transaction.timeout.ms"), None, "only the transactional producer");
    assert_eq!(plain.get("message.timeout.ms"), Some("60000"));

    let mut kafka = KafkaConfig::default();
    kafka.producer.insert("transaction.timeout.ms".into(), "30000".into());
    kafka.producer.insert("retry.backoff.ms".into(), "50".into());
    let c = producer_config_with(&kafka, Some("dedupd-x")).expect("config");
    assert_eq!(c.get("transaction.timeout.ms"), Some("30000"));
    assert_eq!(c.get("message.timeout.ms"), Some("30000"));
    assert_eq!(c.get("retry.backoff.ms"), Some("50"));
}
