//! `store.changelog = true` on the real broker: every key's record is on the compacted
//! changelog topic, a lost store is rebuilt from it before any record is processed (every
//! repeat still recognised, no second sink call), an aborted transaction on the changelog is
//! never restored, a clean restart restores nothing it already holds, and a record on a
//! partition that is not its key's is dead-lettered (`not_copartitioned`); and a restore is
//! seen in `/readyz` (503, naming the partition) and `dedupd_state_restoring` until it ends;
//! expiry writes tombstones, and a store rebuilt from them holds no expired key; a restore
//! waits for a transaction still open on the changelog at assignment.
//!
//! `dedupd run` as a process, one non-forwarding HTTP sink that logs every call. Run with
//! `scripts/kafka/kafka.sh with cargo test --test kafka kafka_changelog:: -- --nocapture`.

use crate::common;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use common::kafka;
use common::pay_kills::{self, calls_per_key, results, wait_for_every_result};
use common::process::{DedupdProcess, KeptOnFailure, SlowReceiver, TopicTail, tail_of_file};
use dedupd::outcome::{Outcome, ResultRecord};
use dedupd::pipeline::state_partition;
use dedupd::store::Record;
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

const PARTITIONS: i32 = 3;
const KEYS: usize = 300;
/// Commands whose record is on another partition than their key's.
const MISPLACED: usize = 5;
/// A key whose only changelog record is in an aborted transaction.
const GHOST: usize = 2_000;

/// Command `i` on its key's partition (the producer keyed it by the idempotency key).
fn placed(i: usize) -> kafka::OutgoingTo {
    pay_kills::command(i, state_partition(&pay_kills::key(i), PARTITIONS))
}

/// Command `i` on the partition after its key's.
fn misplaced(i: usize) -> kafka::OutgoingTo {
    pay_kills::command(i, (state_partition(&pay_kills::key(i), PARTITIONS) + 1) % PARTITIONS)
}

/// Records applied by restores, from the JSON log's "state partition restored" lines.
fn restored_records(log: &Path) -> u64 {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "state partition restored")
        .map(|v| v["fields"]["records"].as_u64().expect("records in the restore line"))
        .sum()
}

/// Writes, in a transaction it then aborts, a completion of `GHOST` and a tombstone of
/// key 0 to the changelog: restoring either would be wrong (a replay of a run that never
/// happened, a second run of key 0).
async fn abort_a_transaction_on(bootstrap: &str, changelog: &str) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", kafka::unique("aborter"))
        .create()
        .expect("transactional producer");
    producer.init_transactions(Duration::from_secs(30)).expect("init transactions");
    producer.begin_transaction().expect("begin");
    let ghost = pay_kills::key(GHOST);
    let completed = common::state_group::completed_record(GHOST);
    let key0 = pay_kills::key(0);
    let ghost_record = FutureRecord::to(changelog)
        .partition(state_partition(&ghost, PARTITIONS))
        .key(ghost.as_bytes())
        .payload(completed.as_slice());
    let tombstone =
        FutureRecord::<[u8], [u8]>::to(changelog).partition(state_partition(&key0, PARTITIONS)).key(key0.as_bytes());
    for record in [ghost_record, tombstone] {
        producer.send(record, Duration::from_secs(10)).await.expect("sent in the transaction");
    }
    producer.abort_transaction(Duration::from_secs(30)).expect("abort");
}

/// The last record of each key on the changelog, as a `read_committed` reader sees it now
/// (records that only name their writer left out).
async fn changelog_records(bootstrap: &str, changelog: &str) -> HashMap<String, Option<Record>> {
    common::state_group::changelog(bootstrap, changelog)
        .await
        .into_iter()
        .map(|(_, key, record)| (key, record))
        .collect()
}

async fn run_until_every_result(config: &Path, log: &Path, tail: &TopicTail, inputs: &[(i32, i64)]) {
    let mut p = DedupdProcess::run(config, log);
    wait_for_every_result(tail, inputs, &mut p, log).await;
    let status = p.terminate(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "not stopped cleanly: {status:?}\n{}", tail_of_file(log, 40));
}

fn of_inputs<'a>(seen: &'a [ResultRecord], inputs: &[(i32, i64)]) -> Vec<&'a ResultRecord> {
    seen.iter().filter(|r| inputs.contains(&(r.source.partition, r.source.offset))).collect()
}

/// One test's `dedupd run` with the store on Kafka: its topics (created), group, changelog
/// topic name and directory.
struct OnKafka {
    input: String,
    results: String,
    dlq: String,
    group: String,
    changelog: String,
    dir: KeptOnFailure,
    store: std::path::PathBuf,
}

impl OnKafka {
    /// Names after `name`; the input (`PARTITIONS`), results and dead-letter topics created.
    async fn new(bootstrap: &str, name: &str) -> OnKafka {
        let unique = |what: &str| kafka::unique(&format!("{name}-{what}"));
        let (input, results, dlq, group) = (unique("in"), unique("out"), unique("dlq"), unique("dedupd"));
        kafka::create_topics(bootstrap, &[(&input, PARTITIONS), (&results, 1), (&dlq, 1)]).await;
        let dir = KeptOnFailure::new();
        let store = dir.path().join("store");
        OnKafka { changelog: format!("{group}.dedupd-state"), input, results, dlq, group, dir, store }
    }

    /// Writes the config (`store.changelog`, transactional results, `kafka.copartitioned`,
    /// the pay sink at `sink_url`), its text passed through `edit`; returns its path.
    fn write_config(&self, bootstrap: &str, sink_url: &str, edit: impl FnOnce(String) -> String) -> std::path::PathBuf {
        let toml = pay_kills::config_toml(
            bootstrap,
            &self.group,
            [&self.input, &self.results, &self.dlq],
            &self.store,
            sink_url,
            "transactional_results = true\ncopartitioned = true\n",
            "",
        )
        .replace("[store]\n", "[store]\nchangelog = true\n");
        let config = self.dir.path().join("dedupd.toml");
        std::fs::write(&config, edit(toml)).expect("write config");
        config
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_store_is_rebuilt_from_the_changelog_and_every_repeat_is_recognised() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let run = OnKafka::new(&bootstrap, "cl").await;
    let OnKafka { input, results: results_topic, dlq, changelog, dir, store, .. } = &run;
    let receiver = SlowReceiver::start((1, 5), 7).await;
    let config = run.write_config(&bootstrap, &receiver.url("/pay"), |toml| toml);
    let tail = TopicTail::start(&bootstrap, results_topic, 1);

    // First run: every key once, and a few records on the wrong partition.
    let firsts = kafka::produce_all_to(&bootstrap, input, (0..KEYS).map(placed).collect()).await;
    let wrong = kafka::produce_all_to(&bootstrap, input, (KEYS..KEYS + MISPLACED).map(misplaced).collect()).await;
    let first_log = dir.path().join("first.log");
    run_until_every_result(&config, &first_log, &tail, &[firsts.clone(), wrong.clone()].concat()).await;
    let seen = results(&tail);
    assert!(of_inputs(&seen, &firsts).iter().all(|r| r.outcome == Outcome::Succeeded), "every key ran");
    assert!(of_inputs(&seen, &wrong).iter().all(|r| r.outcome == Outcome::Rejected), "misplaced records rejected");
    let letters = kafka::read_all(&bootstrap, dlq, MISPLACED, Duration::from_secs(30)).await;
    let reasons: Vec<Option<String>> = letters.iter().map(|m| kafka::header(m, "dedupd-reason")).collect();
    assert_eq!(reasons, vec![Some("not_copartitioned".to_string()); MISPLACED], "dead-lettered with the reason");
    assert_eq!(calls_per_key(&receiver).len(), KEYS, "one call per key, none for a misplaced record");

    // The changelog holds every key's completion (a claim and a completion each).
    let logged = changelog_records(&bootstrap, changelog).await;
    let completed =
        (0..KEYS).filter(|&i| matches!(logged.get(&pay_kills::key(i)), Some(Some(Record::Completed(_))))).count();
    assert_eq!(completed, KEYS, "every key's last changelog record is its completion");

    // The store is lost; an aborted transaction sits on the changelog.
    abort_a_transaction_on(&bootstrap, changelog).await;
    std::fs::remove_dir_all(store).expect("remove the store");

    // Every repeat is recognised from the restored history; the ghost key runs.
    let repeats = kafka::produce_all_to(&bootstrap, input, (0..KEYS).chain([GHOST]).map(placed).collect()).await;
    let second_log = dir.path().join("second.log");
    run_until_every_result(&config, &second_log, &tail, &repeats).await;
    let restored = restored_records(&second_log);
    assert!(restored >= 2 * KEYS as u64, "the lost store was rebuilt: {restored} records restored");
    let seen = results(&tail);
    let second = of_inputs(&seen, &repeats);
    let ghost = pay_kills::key(GHOST);
    let not_replayed: Vec<_> = second
        .iter()
        .filter(|r| r.key.as_deref() != Some(ghost.as_str()) && !(r.outcome == Outcome::Duplicate && r.replay))
        .take(5)
        .collect();
    assert!(not_replayed.is_empty(), "repeats not recognised after the rebuild: {not_replayed:?}");
    let ghost_result = second.iter().find(|r| r.key.as_deref() == Some(ghost.as_str())).expect("the ghost's result");
    assert_eq!(ghost_result.outcome, Outcome::Succeeded, "an aborted completion is never restored");
    let calls = calls_per_key(&receiver);
    let twice: Vec<_> = calls.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "a key called twice (an aborted tombstone restored?): {twice:?}");
    assert_eq!(calls.len(), KEYS + 1, "the ghost called once, nothing else again");

    // A clean restart restores nothing the store already holds.
    let third_log = dir.path().join("third.log");
    let mut p = DedupdProcess::run(&config, &third_log);
    common::process::wait_for_http_addr(&third_log, &mut p, Duration::from_secs(60)).await;
    wait_for_restore_lines(&third_log, &mut p).await;
    let status = p.terminate(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "third run: {status:?}");
    assert_eq!(restored_records(&third_log), 0, "after a clean stop only the tail is read, and it is empty");
    tail.stop();
    receiver.stop().await;
}

/// Waits until the log has a restore line for every partition (assignment is done).
async fn wait_for_restore_lines(log: &Path, p: &mut DedupdProcess) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.matches("state partition restored").count() >= PARTITIONS as usize {
            return;
        }
        assert!(p.exited().is_none() && std::time::Instant::now() < deadline, "no restore:\n{}", tail_of_file(log, 40));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Keys written straight to the changelog for the restore-progress test.
const RESTORED_KEYS: usize = 100_000;

/// The value of the metric sample `line_start` (name and labels) in a scrape, if present.
fn sample(scrape: &str, line_start: &str) -> Option<f64> {
    scrape.lines().find_map(|l| l.strip_prefix(line_start)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_shows_in_readyz_and_the_metrics_until_it_ends() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let run = OnKafka::new(&bootstrap, "clr").await;
    let changelog = &run.changelog;
    kafka::create_changelog(&bootstrap, changelog, PARTITIONS).await;
    let producer = kafka::idempotent_producer(&bootstrap);
    let records: Vec<kafka::OutgoingTo> = (0..RESTORED_KEYS)
        .map(|i| {
            let key = format!("r-{i}");
            let partition = state_partition(&key, PARTITIONS);
            (key, common::state_group::completed_record(i), Vec::new(), Some(partition))
        })
        .collect();
    kafka::produce_all_with(&producer, changelog, records).await;
    let config = run.write_config(&bootstrap, "http://127.0.0.1:9/unused", |toml| toml);
    let log = run.dir.path().join("dedupd.log");

    let mut p = DedupdProcess::run(&config, &log);
    let addr = common::process::wait_for_http_addr(&log, &mut p, Duration::from_secs(60)).await;
    let (mut saw_503, mut saw_gauge) = (false, false);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let scrape = loop {
        let ready = reqwest::get(format!("http://{addr}/readyz")).await.expect("readyz");
        let (status, body) = (ready.status().as_u16(), ready.text().await.unwrap_or_default());
        let metrics = reqwest::get(format!("http://{addr}/metrics")).await.expect("metrics");
        let scrape = metrics.text().await.unwrap_or_default();
        saw_503 |= status == 503 && body.contains("restoring its state from the changelog");
        saw_gauge |= scrape.lines().any(|l| l.starts_with("dedupd_state_restoring{") && l.ends_with(" 1"));
        if status == 200 {
            break scrape;
        }
        assert!(std::time::Instant::now() < deadline, "never ready: {status} {body}\n{}", tail_of_file(&log, 20));
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let status = p.terminate(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "not stopped cleanly: {status:?}");
    assert!(saw_503, "/readyz never named a restoring partition");
    assert!(saw_gauge, "dedupd_state_restoring never showed a partition at 1");
    assert_eq!(
        sample(&scrape, "dedupd_state_restore_records_total"),
        Some(RESTORED_KEYS as f64),
        "every record applied"
    );
    let still: Vec<&str> =
        scrape.lines().filter(|l| l.starts_with("dedupd_state_restoring{") && !l.ends_with(" 0")).collect();
    assert!(still.is_empty(), "partitions still restoring once ready: {still:?}");
    assert_eq!(restored_records(&log), RESTORED_KEYS as u64, "the log's restore lines agree");
}

/// A key whose completion sits in a transaction still open on the changelog at assignment.
const PENDING: usize = 3_000;

/// A restore reads up to the changelog's end at assignment, past a transaction still open
/// there: the previous owner's last one, committed on the broker with its markers not yet
/// written, may hold a completion whose sink ran. The test leaves one open (a completion of
/// `PENDING`), starts dedupd with `PENDING`'s command waiting, sees the restore wait
/// (`/readyz` 503), commits it, and checks that the command was decided from it: no call.
/// A restore that stopped at the last stable offset called the sink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_waits_for_a_transaction_open_at_assignment_and_sees_what_it_commits() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let run = OnKafka::new(&bootstrap, "clw").await;
    let changelog = &run.changelog;
    kafka::create_changelog(&bootstrap, changelog, PARTITIONS).await;
    let receiver = SlowReceiver::start((1, 2), 13).await;
    let config = run.write_config(&bootstrap, &receiver.url("/pay"), |toml| toml);
    let log = run.dir.path().join("dedupd.log");
    let tail = TopicTail::start(&bootstrap, &run.results, 1);

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("transactional.id", kafka::unique("previous-owner"))
        .create()
        .expect("transactional producer");
    producer.init_transactions(Duration::from_secs(30)).expect("init transactions");
    producer.begin_transaction().expect("begin");
    let key = pay_kills::key(PENDING);
    let completed = common::state_group::completed_record(PENDING);
    let record = FutureRecord::to(changelog)
        .partition(state_partition(&key, PARTITIONS))
        .key(key.as_bytes())
        .payload(&completed);
    producer.send(record, Duration::from_secs(10)).await.expect("sent in the transaction");
    let inputs = kafka::produce_all_to(&bootstrap, &run.input, vec![placed(PENDING)]).await;

    let mut p = DedupdProcess::run(&config, &log);
    let addr = common::process::wait_for_http_addr(&log, &mut p, Duration::from_secs(60)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ready = reqwest::get(format!("http://{addr}/readyz")).await.expect("readyz");
        let (status, body) = (ready.status().as_u16(), ready.text().await.unwrap_or_default());
        assert_ne!(status, 200, "ready with a transaction still open on the changelog");
        if body.contains("restoring its state from the changelog") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no restore began: {status} {body}\n{}", tail_of_file(&log, 20));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(receiver.count(), 0, "a call while the restore waits");
    producer.commit_transaction(Duration::from_secs(30)).expect("commit");

    wait_for_every_result(&tail, &inputs, &mut p, &log).await;
    let status = p.terminate(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "not stopped cleanly: {status:?}");
    let seen = results(&tail);
    assert_eq!(seen.len(), 1, "one result: {seen:?}");
    // The stored completion has another fingerprint than the command: a conflict, no call.
    assert_eq!(seen[0].outcome, Outcome::Conflict, "decided from the completion the transaction committed");
    assert_eq!(receiver.count(), 0, "the sink called for a key the restore should have known");
    tail.stop();
    receiver.stop().await;
}

/// Keys of the expiry test, and their TTL.
const EXPIRING_KEYS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_writes_tombstones_and_a_rebuilt_store_holds_no_expired_key() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let run = OnKafka::new(&bootstrap, "clt").await;
    let OnKafka { input, results: results_topic, changelog, dir, store, .. } = &run;
    let receiver = SlowReceiver::start((1, 2), 11).await;
    let config = run.write_config(&bootstrap, &receiver.url("/pay"), |toml| {
        toml.replace("[store]\n", "[store]\ncompaction_interval = \"500ms\"\n")
            .replace("sink = \"pay\"\n", "sink = \"pay\"\nttl = \"1s\"\n")
            // A command older than its TTL would be `stale`, never run: not what this test is about.
            + "\n[envelope]\nstale_guard = false\n"
    });
    let tail = TopicTail::start(&bootstrap, results_topic, 1);
    let keys: Vec<String> = (0..EXPIRING_KEYS).map(pay_kills::key).collect();

    // Run every key, then wait until the changelog's last record of each is a tombstone.
    let log = dir.path().join("first.log");
    let firsts = kafka::produce_all_to(&bootstrap, input, (0..EXPIRING_KEYS).map(placed).collect()).await;
    let mut p = DedupdProcess::run(&config, &log);
    wait_for_every_result(&tail, &firsts, &mut p, &log).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        // A claim and a completion per key, then its tombstone.
        let logged = changelog_records(&bootstrap, changelog).await;
        if keys.iter().all(|k| matches!(logged.get(k), Some(None))) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no tombstone for every key: {logged:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let status = p.terminate(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "not stopped cleanly: {status:?}");

    // A store rebuilt from the changelog holds none of them: each runs again.
    std::fs::remove_dir_all(store).expect("remove the store");
    let again = kafka::produce_all_to(&bootstrap, input, (0..EXPIRING_KEYS).map(placed).collect()).await;
    let second_log = dir.path().join("second.log");
    run_until_every_result(&config, &second_log, &tail, &again).await;
    assert!(restored_records(&second_log) >= 3 * EXPIRING_KEYS as u64, "the tombstones were read");
    let seen = results(&tail);
    let ran: Vec<_> = of_inputs(&seen, &again).iter().map(|r| r.outcome).collect();
    assert_eq!(ran, vec![Outcome::Succeeded; EXPIRING_KEYS], "expired keys run again");
    let calls = calls_per_key(&receiver);
    assert!(keys.iter().all(|k| calls.get(k) == Some(&2)), "each key called once per life: {calls:?}");
    tail.stop();
    receiver.stop().await;
}

/// Keys of the by-key hop test; each comes on every input partition.
const HOP_KEYS: usize = 100;
/// The key of its command too large to forward.
const OVERSIZE: usize = 5_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_on_different_input_partitions_meet_through_the_by_key_topic() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let run = OnKafka::new(&bootstrap, "hop").await;
    let OnKafka { input, results: results_topic, dlq, group, dir, store, .. } = &run;
    let by_key = format!("{group}.dedupd-by-key");
    let receiver = SlowReceiver::start((1, 5), 13).await;
    // Forwards of up to about 12,000 bytes: a command with more headers than that is too
    // large to forward, though its value is within `limits.max_command_bytes`.
    let config = run.write_config(&bootstrap, &receiver.url("/pay"), |toml| {
        toml.replace("copartitioned = true", "copartitioned = false")
            + "\n[limits]\nmax_command_bytes = 10000\n\n[kafka.producer]\n\"message.max.bytes\" = \"12000\"\n"
    });
    let tail = TopicTail::start(&bootstrap, results_topic, 1);

    // Every key on every input partition (its producer keyed it by something else), a
    // record that is not a command, and a command whose headers make it too large to forward.
    let on_every_partition = |i: usize| (0..PARTITIONS).map(move |p| pay_kills::command(i, p));
    let mut inputs =
        kafka::produce_all_to(&bootstrap, input, (0..HOP_KEYS).flat_map(on_every_partition).collect()).await;
    let not_json =
        kafka::produce_all_to(&bootstrap, input, vec![("x".into(), b"{not json".to_vec(), Vec::new(), Some(1))]).await;
    let (key, value, _, _) = pay_kills::command(OVERSIZE, 0);
    let headers = vec![("padding".to_string(), "x".repeat(12_000))];
    let oversize = kafka::produce_all_to(&bootstrap, input, vec![(key, value, headers, Some(2))]).await;
    inputs.extend(&not_json);
    inputs.extend(&oversize);
    let log = dir.path().join("first.log");
    run_until_every_result(&config, &log, &tail, &inputs).await;

    // One call per key; one result per input, naming the input; each key's first run and
    // its repeats replayed.
    let calls = calls_per_key(&receiver);
    assert_eq!(calls.len(), HOP_KEYS, "every key ran, but the one too large to forward");
    assert!(calls.values().all(|&n| n == 1), "a key ran more than once: {calls:?}");
    let seen = results(&tail);
    assert_eq!(seen.len(), inputs.len(), "exactly one result per input (read_committed)");
    assert!(seen.iter().all(|r| r.source.topic == *input), "a result names another topic than the input");
    let mut per_key: HashMap<String, Vec<Outcome>> = HashMap::new();
    for r in of_inputs(&seen, &inputs) {
        per_key.entry(r.key.clone().unwrap_or_default()).or_default().push(r.outcome);
    }
    for i in 0..HOP_KEYS {
        let mut outcomes = per_key.remove(&pay_kills::key(i)).unwrap_or_default();
        outcomes.sort_by_key(|o| o.as_str());
        assert_eq!(outcomes, vec![Outcome::Duplicate, Outcome::Duplicate, Outcome::Succeeded], "key {i}");
    }
    let rejected = of_inputs(&seen, &not_json);
    assert_eq!(rejected.iter().map(|r| r.outcome).collect::<Vec<_>>(), vec![Outcome::Rejected]);
    let too_large = of_inputs(&seen, &oversize);
    assert_eq!(too_large.iter().map(|r| r.outcome).collect::<Vec<_>>(), vec![Outcome::Rejected]);
    let mut letters: Vec<(Option<String>, Option<String>)> =
        kafka::read_all(&bootstrap, dlq, 2, Duration::from_secs(30))
            .await
            .iter()
            .map(|m| (kafka::header(m, "dedupd-source"), kafka::header(m, "dedupd-reason")))
            .collect();
    letters.sort();
    let source = |(p, o): (i32, i64)| Some(format!("{input}/{p}/{o}"));
    let mut want = vec![
        (source(not_json[0]), Some("invalid_json".to_string())),
        (source(oversize[0]), Some("too_large".to_string())),
    ];
    want.sort();
    assert_eq!(letters, want, "dead-lettered once each, naming the input");

    // After the clean stop the by-key topic holds nothing the group committed: it was
    // purged up to the committed offsets (only a transaction's commit marker may follow).
    let marks = kafka::watermarks(&bootstrap, &by_key).await;
    assert_eq!(marks.len(), PARTITIONS as usize, "the by-key topic has a partition per state partition");
    assert!(marks.iter().map(|(low, _)| low).sum::<i64>() >= 3 * HOP_KEYS as i64, "purged: {marks:?}");
    assert!(marks.iter().all(|(low, high)| high - low <= 1), "records left after the purge: {marks:?}");

    // A lost store is rebuilt from the changelog's by-key partitions: more repeats, each on
    // a partition other than its key's, are all replays.
    std::fs::remove_dir_all(store).expect("remove the store");
    let misplaced_repeats = kafka::produce_all_to(&bootstrap, input, (0..HOP_KEYS).map(misplaced).collect()).await;
    run_until_every_result(&config, &dir.path().join("second.log"), &tail, &misplaced_repeats).await;
    let seen = results(&tail);
    let second = of_inputs(&seen, &misplaced_repeats);
    assert_eq!(second.len(), HOP_KEYS);
    assert!(second.iter().all(|r| r.outcome == Outcome::Duplicate && r.replay), "a repeat not recognised");
    assert!(calls_per_key(&receiver).values().all(|&n| n == 1), "a key ran again after the rebuild");
    tail.stop();
    receiver.stop().await;
}
