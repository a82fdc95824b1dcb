//! The `--restore N` phase: how fast `dedupd run` restores the store from the changelog
//! (`store.changelog`), cold (N keys into an empty store) and after a clean stop (a tail
//! of 10,000 keys beyond the checkpoint).
//!
//! The changelog is written directly, one completed record per key on the key's murmur2
//! partition, by a plain producer, so only the restore is measured. `dedupd run` (fjall)
//! then starts; the time is from the first moment its health names a restoring partition
//! to the moment none is (polled every millisecond): the restore alone, without the start
//! or the group join.

use std::time::{Duration, Instant};

use dedupd::config::Config;
use dedupd::fingerprint::Fingerprint;
use dedupd::pipeline::state_partition;
use dedupd::store::{Completed, Completion, Record, StoreBackend};
use rdkafka::producer::FutureRecord;

use super::topics::{create_changelog_topic, create_topic, producer, unique};
use super::{Mode, config_in, start_pipeline};

/// The input's partitions, so the changelog's (the by-key topic's under the hop).
pub(super) const PARTITIONS: i32 = 6;
const TAIL: usize = 10_000;

/// Prints the cold and the tail restore rates.
pub async fn measure(bootstrap: &str, keys: usize) {
    let (input, results) = (unique("bench-restore-in"), unique("bench-restore-out"));
    create_topic(bootstrap, &input, PARTITIONS).await;
    create_topic(bootstrap, &results, PARTITIONS).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config_in(Mode::Changelog, bootstrap, &input, &results, StoreBackend::Fjall, dir.path());
    let changelog = format!("{}.dedupd-state", config.kafka.group_id);
    create_changelog_topic(bootstrap, &changelog, PARTITIONS).await;
    let written = Instant::now();
    write_changelog(bootstrap, &changelog, 0..keys).await;
    println!("wrote {keys} keys to the changelog in {:.1} s", written.elapsed().as_secs_f64());
    let floor = read_floor(bootstrap, &changelog, keys);
    println!(
        "read floor: a plain consumer read the {keys} records (read_committed, keys and values copied) in {} ms: {:.0} keys/s",
        floor.as_millis(),
        keys as f64 / floor.as_secs_f64()
    );
    let cold = restore_time(config.clone()).await;
    println!(
        "restore, cold: {keys} keys into an empty store in {} ms: {:.0} keys/s ({:.2}x the read floor's time)",
        cold.as_millis(),
        keys as f64 / cold.as_secs_f64(),
        cold.as_secs_f64() / floor.as_secs_f64()
    );
    write_changelog(bootstrap, &changelog, keys..keys + TAIL).await;
    let tail = restore_time(config).await;
    println!(
        "restore, tail: {TAIL} keys after a clean stop in {} ms: {:.0} keys/s",
        tail.as_millis(),
        TAIL as f64 / tail.as_secs_f64()
    );
}

/// The floor of a restore: a plain consumer configured as dedupd's restore consumer
/// (`read_committed`, assigned by hand) reads the changelog's `keys` records from the start,
/// copying each key and value as a restore does, and stores nothing. Blocking.
fn read_floor(bootstrap: &str, topic: &str, keys: usize) -> Duration {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", unique("bench-read-floor"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "10")
        .create()
        .expect("consumer");
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning).expect("partition");
    }
    consumer.assign(&tpl).expect("assign");
    let began = Instant::now();
    let (mut read, mut bytes) = (0usize, 0usize);
    while read < keys {
        assert!(began.elapsed() < Duration::from_secs(600), "the read floor did not end");
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let (key, value) = (m.key().unwrap_or_default().to_vec(), m.payload().map(<[u8]>::to_vec));
            bytes += key.len() + value.map_or(0, |v| v.len());
            read += 1;
        }
    }
    assert!(bytes > 0);
    began.elapsed()
}

/// A completed record of a key, as dedupd writes one.
fn completed(i: usize) -> Vec<u8> {
    Record::Completed(Completed {
        fingerprint: Fingerprint([(i % 251) as u8; 32]),
        outcome: Completion::Succeeded,
        result: format!("{{\"status\":200,\"i\":{i}}}").into_bytes(),
        error: None,
        first_seen_at_ms: 1_700_000_000_000,
        completed_at_ms: 1_700_000_000_100,
        expires_at_ms: 4_000_000_000_000,
        attempts: 1,
        source: None,
        settled: None,
    })
    .encode()
}

/// Writes a completed record of each of `keys` to the changelog `topic`, a million at a
/// time (the delivery futures of a hundred million would not fit in memory).
pub(super) async fn write_changelog(bootstrap: &str, topic: &str, keys: std::ops::Range<usize>) {
    let p = producer(bootstrap);
    let mut from = keys.start;
    while from < keys.end {
        let to = (from + 1_000_000).min(keys.end);
        write_some(&p, topic, from..to).await;
        from = to;
    }
}

async fn write_some(p: &rdkafka::producer::FutureProducer, topic: &str, keys: std::ops::Range<usize>) {
    let mut acks = Vec::with_capacity(keys.len());
    for i in keys {
        let key = format!("bench-{i}");
        let value = completed(i);
        let partition = state_partition(&key, PARTITIONS);
        loop {
            match p.send_result(FutureRecord::to(topic).partition(partition).key(&key).payload(&value)) {
                Ok(f) => {
                    acks.push(f);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }
    for a in futures::future::join_all(acks).await {
        a.expect("ack").expect("delivered");
    }
}

/// Starts `dedupd run` on `config`, times its restore, and stops it cleanly.
async fn restore_time(config: Config) -> Duration {
    let (stop, task, health) = start_pipeline(config).await;
    let restoring = || health.down().iter().any(|(_, why)| why.starts_with("restoring"));
    let bound = Instant::now() + Duration::from_secs(600);
    // Joined (ready) only once its restore is over: ready without a restore seen means it
    // took less than a poll.
    while !restoring() && !health.is_ready() {
        assert!(Instant::now() < bound, "no restore began");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let began = Instant::now();
    while restoring() {
        assert!(Instant::now() < bound, "the restore did not end");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = began.elapsed();
    stop.cancel();
    let _ = task.await;
    took
}
