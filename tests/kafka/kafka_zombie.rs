//! A zombie makes no effect (docs/contract.md §12, src/pipeline/transactions/mod.rs invariants 6 and 7): an
//! instance frozen after claiming, whose partitions move to another instance while it is
//! frozen, commits no claim and calls no sink for them when it wakes; it finds itself
//! fenced, counts it (`dedupd_fenced_total`) and starts its pipeline again in process.
//!
//! Two `dedupd run` processes share one group on the real broker, with the store on Kafka
//! (`store.changelog`, producers keying by the idempotency key) and one HTTP sink that does
//! not forward the key. Instance A starts alone and freezes itself with a real SIGSTOP
//! (a crash point with `return(stop)`) at one of two steps:
//! - `claim.synced`, its first claims written to its local store, not yet committed to the
//!   changelog. No transaction carries anything yet, so the commit that would carry them
//!   holds no offset of its own: without invariant 6 they commit (its producer is not
//!   fenced: nobody else has its `transactional.id`) and it calls the sink for keys B ran;
//! - `sink.admitted`, a call admitted after its claim committed: without invariant 7 the
//!   call goes out when A wakes.
//!
//! Instance B starts, takes every partition once A's session (6 s) expires, and settles
//! every input. Then A gets SIGCONT, with its consumer thread slowed in handling the lost
//! assignment (`rebalance.revoke`), so that librdkafka's own session timer does not stop
//! A's workers first and the broker's refusal is what is tested.
//! Run with `scripts/kafka/kafka.sh with cargo test --features failpoints --test kafka kafka_zombie::`.

#![cfg(feature = "failpoints")]

use crate::common;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::exposition::Exposition;
use common::kafka;
use common::pay_kills::{self, calls_per_key, results, wait_for_every_result};
use common::process::{
    DedupdProcess, KeptOnFailure, SlowReceiver, TopicTail, file_len, seed_from_env, tail_of_file, wait_for_http_addr,
    wait_for_line,
};
use dedupd::outcome::ResultRecord;
use dedupd::pipeline::state_partition;

const PARTITIONS: i32 = 6;
const KEYS: usize = 600;
const REPEATS: usize = 200;
/// Once woken, A's consumer thread takes 3 s to handle the revoke (the lost assignment),
/// so its workers go on meanwhile as if they still owned their partitions, and only what
/// the broker refuses stops them.
const SLOW_REVOKE: &str = "rebalance.revoke=1*sleep(3000)";
/// The group session: the broker's smallest by default, so that B takes over soon.
const SESSION_TIMEOUT_MS: u64 = 6_000;

/// Every key once, then `REPEATS` of them again, each on its key's partition.
fn commands() -> Vec<kafka::OutgoingTo> {
    let on_its_partition = |i: usize| pay_kills::command(i, state_partition(&pay_kills::key(i), PARTITIONS));
    (0..KEYS).map(on_its_partition).chain((0..REPEATS).map(|r| on_its_partition(r * KEYS / REPEATS))).collect()
}

/// The process state letter of `pid` (`T` while stopped), from /proc.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Waits until `p` has stopped itself (SIGSTOP); fails if it exits or a minute passes.
async fn wait_until_stopped(p: &mut DedupdProcess, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while process_state(p.pid) != Some('T') {
        let exited = p.exited();
        assert!(
            exited.is_none() && Instant::now() < deadline,
            "A did not stop at its first claims (exited: {exited:?}); log:\n{}",
            tail_of_file(log, 40)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn signal(pid: u32, signal: &str) {
    let sent = std::process::Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status();
    assert!(sent.as_ref().is_ok_and(|s| s.success()), "could not send SIG{signal} to {pid}: {sent:?}");
}

/// The config of one instance, with its own store.
fn config(
    bootstrap: &str,
    group: &str,
    topics: [&str; 3],
    store: &Path,
    sink_url: &str,
    max_in_flight: usize,
) -> String {
    let kafka_extra = format!(
        "transactional_results = true\ncopartitioned = true\n\n[kafka.consumer]\n\
         \"session.timeout.ms\" = \"{SESSION_TIMEOUT_MS}\"\n\"heartbeat.interval.ms\" = \"1000\"\n"
    );
    pay_kills::config_toml(
        bootstrap,
        group,
        topics,
        store,
        sink_url,
        &kafka_extra,
        &format!("max_in_flight = {max_in_flight}\nbatch_size = 8"),
    )
    .replace("[store]\n", "[store]\nchangelog = true\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_frozen_before_its_claims_commit_cannot_commit_them() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let woken = frozen_zombie(&bootstrap, "claim.synced").await;
    // Its claims never reached the changelog: B ran every key.
    assert_eq!(woken.indeterminate, 0, "no claim of A's was committed");
    assert_eq!(woken.succeeded, KEYS, "each key succeeded once, the repeats are duplicates");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_frozen_between_its_claims_and_their_calls_makes_no_call() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let woken = frozen_zombie(&bootstrap, "sink.admitted").await;
    // Its claims were committed, so B found them in progress and could not know whether
    // they ran: `indeterminate` (the sink does not forward the key), for an operator.
    assert!(woken.indeterminate > 0, "A froze with committed claims");
    assert_eq!(woken.succeeded + woken.indeterminate, KEYS, "every key succeeded or is indeterminate");
}

/// What the results say once both instances stopped.
struct Settled {
    succeeded: usize,
    indeterminate: usize,
}

/// A freezes at crash point `point` (its first time) and wakes after B settled everything;
/// checks that it made no call after waking, was fenced once and rejoined, that no key ran
/// twice and that each input has exactly one committed result.
async fn frozen_zombie(bootstrap: &str, point: &str) -> Settled {
    let (input, results_topic, dlq) =
        (kafka::unique("zombie-in"), kafka::unique("zombie-out"), kafka::unique("zombie-dlq"));
    kafka::create_topics(bootstrap, &[(&input, PARTITIONS), (&results_topic, 3), (&dlq, 1)]).await;
    let receiver = SlowReceiver::start((20, 80), seed_from_env("KAFKA_ZOMBIE_SEED")).await;
    let dir = KeptOnFailure::new();
    let group = kafka::unique("zombie-dedupd");
    let topics = [input.as_str(), results_topic.as_str(), dlq.as_str()];
    let (config_a, log_a) = (dir.path().join("a.toml"), dir.path().join("a.log"));
    let (config_b, log_b) = (dir.path().join("b.toml"), dir.path().join("b.log"));
    let url = receiver.url("/pay");
    // A makes one call at a time: when it freezes at a call admitted and not yet made, no
    // other call of its is under way (one that began before the freeze may end after it).
    let config_a_text = config(bootstrap, &group, topics, &dir.path().join("store-a"), &url, 1);
    std::fs::write(&config_a, config_a_text).expect("config");
    std::fs::write(&config_b, config(bootstrap, &group, topics, &dir.path().join("store-b"), &url, 16))
        .expect("config");
    let committed = TopicTail::start(bootstrap, &results_topic, 3);
    let inputs = kafka::produce_all_to(bootstrap, &input, commands()).await;

    // A takes every partition and freezes at `point`.
    let args_a = ["run", "-c", config_a.to_str().expect("utf-8 path")];
    let failpoints = format!("{point}=1*return(stop);{SLOW_REVOKE}");
    let mut a = DedupdProcess::spawn_with_env(&args_a, &[("FAILPOINTS", failpoints.as_str())], &log_a);
    let http_a = wait_for_http_addr(&log_a, &mut a, Duration::from_secs(60)).await;
    wait_until_stopped(&mut a, &log_a).await;

    // B takes over once A's session expires, and settles every input.
    let mut b = DedupdProcess::run(&config_b, &log_b);
    wait_for_every_result(&committed, &inputs, &mut b, &log_b).await;
    // Calls of A's that were under way when it froze have arrived by now.
    let calls_before_waking = receiver.count();

    // A wakes: fenced, it starts again and rejoins.
    signal(a.pid, "CONT");
    let give_up = Duration::from_secs(90);
    let fenced = wait_for_line(&log_a, 0, "fenced: starting the pipeline again", give_up, || false).await;
    assert!(fenced.is_some(), "A did not find itself fenced; log:\n{}", tail_of_file(&log_a, 40));
    // A fence is not a stop, and its log does not say it is (docs/runbook.md).
    let log = std::fs::read_to_string(&log_a).expect("A's log");
    for stop_line in ["fatal error: draining and stopping", "did not commit and was aborted; stopping"] {
        assert!(!log.contains(stop_line), "A's fence logged `{stop_line}`:\n{}", tail_of_file(&log_a, 40));
    }
    let restarted_at = file_len(&log_a);
    let rejoined = wait_for_line(&log_a, restarted_at, "partitions assigned", give_up, || false).await;
    assert!(rejoined.is_some(), "A did not rejoin the group; log:\n{}", tail_of_file(&log_a, 40));
    let metrics = reqwest::get(format!("http://{http_a}/metrics")).await.expect("GET A's /metrics");
    let metrics = Exposition::parse(&metrics.text().await.expect("body"));
    assert_eq!(metrics.value("dedupd_fenced_total", &[]), Some(1.0), "A's fences");
    for (name, p, log) in [("A", &mut a, &log_a), ("B", &mut b, &log_b)] {
        let status = p.terminate(Duration::from_secs(30));
        assert!(
            status.is_some_and(|s| s.success()),
            "{name} did not stop cleanly: {status:?}:\n{}",
            tail_of_file(log, 40)
        );
    }
    let after_waking: Vec<String> = receiver.seen()[calls_before_waking..]
        .iter()
        .map(|s| format!("{} (attempt {:?})", String::from_utf8_lossy(&s.body), s.attempt))
        .collect();
    assert!(
        after_waking.is_empty(),
        "A called the sink after waking: {after_waking:?}; log:\n{}",
        tail_of_file(&log_a, 60)
    );

    // No key ran twice.
    let calls = calls_per_key(&receiver);
    let twice: Vec<_> = calls.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(twice.is_empty(), "keys called twice (A's zombie claims ran): {twice:?}");

    // Exactly one committed result per input; each key succeeded (after a call) or is
    // indeterminate, once.
    let seen = results(&committed);
    let mut per_input: HashMap<(i32, i64), Vec<&ResultRecord>> = HashMap::new();
    for r in &seen {
        per_input.entry((r.source.partition, r.source.offset)).or_default().push(r);
    }
    assert_eq!(per_input.len(), inputs.len(), "a result for every input");
    assert_eq!(seen.len(), inputs.len(), "one committed result per input");
    let (succeeded, indeterminate) = pay_kills::succeeded_and_indeterminate(&seen, &calls);
    committed.stop();
    receiver.stop().await;
    Settled { succeeded: succeeded.len(), indeterminate: indeterminate.len() }
}
