//! A single instance killed with SIGKILL and restarted on the same store gets its
//! partitions back at once: it rejoins the group as the same static member
//! (`group.instance.id` from the store's identity), so the broker hands its partitions
//! back instead of waiting out the dead member's session.
//!
//! The session timeout is set to 60 s here, so that a result within 30 s of the restart can
//! only come from the rejoin, never from the session expiring. How long it takes is measured
//! by repeating this test (BENCHMARKS.md, "Restart after kill -9"), not asserted here.
//!
//! Run with `scripts/kafka/kafka.sh with cargo test --test kafka kafka_restart:: -- --nocapture`.

use crate::common;

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use common::kafka::{self, Receiver};
use common::process::{DedupdProcess, KeptOnFailure, TopicTail, file_len, tail_of_file, wait_for_line};
use dedupd::outcome::ResultRecord;
use rdkafka::message::Message;

const PARTITIONS: i32 = 3;
/// Far longer than a rejoin takes, so that the test tells a rejoin from an expiry.
const SESSION_TIMEOUT: Duration = Duration::from_secs(60);
/// Half the session: a first result after a restart sooner than this came from the rejoin.
const BACK_BOUND: Duration = Duration::from_secs(30);

/// What dedupd logs when it joins the group as a static member.
const JOINED: &str = "joining the consumer group as a static member";

/// The `group_instance_id` of every join logged in `log`, in order.
fn member_ids(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).expect("read log");
    text.lines()
        .filter(|l| l.contains(JOINED))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("json log line {l:?}: {e}"));
            v["fields"]["group_instance_id"]
                .as_str()
                .unwrap_or_else(|| panic!("no group_instance_id in {l}"))
                .to_string()
        })
        .collect()
}

fn config_toml(bootstrap: &str, group: &str, topics: [&str; 3], store: &Path, receiver: &str) -> String {
    let [input, results, dlq] = topics;
    format!(
        r#"{kafka_table}[kafka.consumer]
"session.timeout.ms" = "{session_ms}"

[store]
path = {store:?}

[http]
listen = "127.0.0.1:0"

[log]
format = "json"

[sinks.effects]
kind = "http"
url = "{receiver}"

[[routes]]
name = "all"
types = ["*"]
sink = "effects"
"#,
        kafka_table = kafka::kafka_table(bootstrap, group, input, results, dlq),
        session_ms = SESSION_TIMEOUT.as_millis(),
        store = store.to_str().expect("utf-8 path"),
    )
}

fn commands(range: std::ops::Range<usize>) -> Vec<kafka::OutgoingTo> {
    range
        .map(|i| {
            let value = serde_json::json!({"id": format!("restart-{i}"), "type": "effect.apply", "payload": {"n": i}});
            (format!("k{i}"), value.to_string().into_bytes(), Vec::new(), Some(i as i32 % PARTITIONS))
        })
        .collect()
}

/// The input positions the results in `tail` name.
fn positions_in(tail: &TopicTail) -> HashSet<(i32, i64)> {
    tail.since(0)
        .iter()
        .filter_map(|m| serde_json::from_slice::<ResultRecord>(m.payload()?).ok())
        .map(|r| (r.source.partition, r.source.offset))
        .collect()
}

/// Waits until `tail` holds a result for each of `inputs`, or fails with the log (at once
/// if dedupd exited). Returns when the first of them and the last arrived.
async fn wait_for_results(
    tail: &TopicTail,
    inputs: &[(i32, i64)],
    bound: Duration,
    p: &mut DedupdProcess,
    log: &Path,
) -> (Instant, Instant) {
    let deadline = Instant::now() + bound;
    let mut first = None;
    loop {
        let seen = positions_in(tail);
        let done = inputs.iter().filter(|i| seen.contains(i)).count();
        if done > 0 {
            first.get_or_insert_with(Instant::now);
        }
        if done == inputs.len() {
            return (first.unwrap_or_else(Instant::now), Instant::now());
        }
        let exited = p.exited();
        assert!(
            Instant::now() < deadline && exited.is_none(),
            "{done} of {} results within {bound:?} (exited: {exited:?}); log:\n{}",
            inputs.len(),
            tail_of_file(log, 40)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instance_is_back_before_its_old_session_would_expire() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let (input, results, dlq) =
        (kafka::unique("restart-in"), kafka::unique("restart-out"), kafka::unique("restart-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, PARTITIONS), (&results, 1), (&dlq, 1)]).await;
    let receiver = Receiver::start().await;
    let dir = KeptOnFailure::new();
    let (config, log) = (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"));
    let group = kafka::unique("restart-dedupd");
    let toml = config_toml(&bootstrap, &group, [&input, &results, &dlq], &dir.path().join("store"), &receiver.url());
    std::fs::write(&config, toml).expect("write config");
    let tail = TopicTail::start(&bootstrap, &results, 1);

    let mut first = DedupdProcess::run(&config, &log);
    let before = kafka::produce_all_to(&bootstrap, &input, commands(0..10)).await;
    wait_for_results(&tail, &before, Duration::from_secs(90), &mut first, &log).await;
    first.kill();

    let log_from = file_len(&log);
    let mut second = DedupdProcess::run(&config, &log);
    let after = kafka::produce_all_to(&bootstrap, &input, commands(10..20)).await;
    let (back, all) = wait_for_results(&tail, &after, BACK_BOUND, &mut second, &log).await;
    println!("restart to the first new result: {:?}, to all 10: {:?}", back - second.spawned, all - second.spawned);
    wait_for_line(&log, log_from, JOINED, Duration::from_secs(5), || false).await.expect("rejoined as a static member");
    let members = member_ids(&log);
    assert_eq!(members.len(), 2, "{members:?}");
    assert_eq!(members[0], members[1], "the same store, the same member");
    assert!(second.exited().is_none(), "the second incarnation is still running");
    second.terminate(Duration::from_secs(30));

    // Results of the first ten may come twice (a kill before their offsets were committed
    // publishes them again); every input has one.
    let seen = positions_in(&tail);
    tail.stop();
    assert!(before.iter().chain(&after).all(|i| seen.contains(i)), "a result for every input");
    let counts = receiver.counts();
    assert_eq!(counts.len(), 20, "every command reached the sink: {counts:?}");
    assert!(counts.values().all(|&c| c == 1), "no command ran twice: {counts:?}");
    receiver.stop().await;
}

/// Two processes given the same `group.instance.id` (a copied store, a misconfigured
/// StatefulSet): the broker fences the older member, librdkafka makes that fatal, and the
/// fenced process stops with a non-zero exit naming the cause instead of polling a dead
/// consumer with its partitions silently stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_fenced_by_another_with_its_member_id_stops_non_zero() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let (input, results, dlq) = (kafka::unique("fence-in"), kafka::unique("fence-out"), kafka::unique("fence-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, PARTITIONS), (&results, 1), (&dlq, 1)]).await;
    let receiver = Receiver::start().await;
    let dir = KeptOnFailure::new();
    let group = kafka::unique("fence-dedupd");
    let config = |n: usize| {
        let store = dir.path().join(format!("store-{n}"));
        let toml = config_toml(&bootstrap, &group, [&input, &results, &dlq], &store, &receiver.url())
            .replace("\"session.timeout.ms\"", "\"group.instance.id\" = \"the-same-member\"\n\"session.timeout.ms\"");
        let path = dir.path().join(format!("dedupd-{n}.toml"));
        std::fs::write(&path, toml).expect("write config");
        path
    };
    let (first_config, second_config) = (config(1), config(2));
    let (first_log, second_log) = (dir.path().join("first.log"), dir.path().join("second.log"));
    let mut first = DedupdProcess::run(&first_config, &first_log);
    wait_for_line(&first_log, 0, "partitions assigned", Duration::from_secs(30), || first.exited().is_some())
        .await
        .unwrap_or_else(|| panic!("the first process got no partitions; log:\n{}", tail_of_file(&first_log, 30)));
    let mut second = DedupdProcess::run(&second_config, &second_log);
    let deadline = Instant::now() + Duration::from_secs(60);
    while first.exited().is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = first.exited();
    assert!(
        status.is_some_and(|s| !s.success()),
        "the fenced process stops non-zero (got {status:?}); log:\n{}",
        tail_of_file(&first_log, 30)
    );
    let log = std::fs::read_to_string(&first_log).expect("read log");
    assert!(log.contains("the Kafka consumer failed for good"), "the log names why:\n{}", tail_of_file(&first_log, 30));
    assert!(second.exited().is_none(), "the newer member goes on");
    second.terminate(Duration::from_secs(30));
    receiver.stop().await;
}
