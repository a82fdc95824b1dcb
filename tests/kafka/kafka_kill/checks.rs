//! After a lane's kills: the report of how its incarnations died, and the checks from the
//! outside once the final run has a result for every input (downstreams, results and
//! dead-letter topics, the store opened directly; tests/common/kill_check.rs holds the rules).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use dedupd::outcome::ResultRecord;
use dedupd::store::{KeyStore, SyncMode};
use rdkafka::message::Message;

use super::schedule::Ending;
use super::{Kill, Lane, RESULTS_BOUND};
use crate::common::effects;
use crate::common::kafka;
use crate::common::kill_check::{self, Outside};
use crate::common::kill_workload::{self as workload, Input, SINKS};
use crate::common::process::{DedupdProcess, TopicTail};

pub(super) fn report_kills(backend: &str, kills: &[Kill], started: Instant) {
    let mut at: BTreeMap<&str, (usize, Duration)> = BTreeMap::new();
    let (mut random, mut mid_request, mut random_lived) = (0, 0, Duration::ZERO);
    for k in kills {
        match k.ending {
            Ending::At { point, .. } => {
                let e = at.entry(point).or_default();
                e.0 += 1;
                e.1 += k.lived;
            }
            Ending::Random { .. } => {
                random += 1;
                mid_request += usize::from(k.in_flight > 0);
                random_lived += k.lived;
            }
        }
    }
    println!("[{backend}] {} kills in {:.1} s:", kills.len(), started.elapsed().as_secs_f64());
    for (point, (count, lived)) in at {
        println!(
            "[{backend}]   at {point:<20} {count:>3} (lived {:>4} ms on average)",
            (lived / count.max(1) as u32).as_millis()
        );
    }
    println!(
        "[{backend}]   at random            {random:>3} (lived {:>4} ms on average), {mid_request} while the HTTP receiver was answering",
        (random_lived / random.max(1) as u32).as_millis()
    );
}

/// Waits until `tail` has read all `published` records of its topic (bounded).
async fn caught_up(tail: &TopicTail, published: usize) -> Vec<rdkafka::message::OwnedMessage> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while tail.len() < published && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tail.since(0)
}

/// Runs the last incarnation until every input (and every fodder command) has a result,
/// stops it with SIGTERM, and checks what the run left; every violation goes to `failures`.
pub(super) async fn check_after_final_run(
    lane: &mut Lane,
    inputs: &[Input],
    positions: &[(i32, i64)],
    fodder: &[(i32, i64)],
    last: &mut DedupdProcess,
    failures: &mut Vec<String>,
) {
    let (backend, n) = (lane.backend, inputs.len());
    assert_eq!(positions.len(), n, "every input produced");
    let by_pos: HashMap<(i32, i64), usize> = positions.iter().enumerate().map(|(seq, pos)| (*pos, seq)).collect();
    assert_eq!(by_pos.len(), n, "every input has its own position");
    for (seq, r) in inputs.iter().enumerate() {
        assert_eq!(positions[seq].0, r.partition, "input {seq} went to the partition asked for");
    }
    let wanted: HashSet<(i32, i64)> = positions.iter().chain(fodder).copied().collect();
    let t = Instant::now();
    let mut covered: HashSet<(i32, i64)> = HashSet::new();
    let mut read = 0usize;
    while covered.len() < wanted.len() && t.elapsed() < RESULTS_BOUND {
        for m in lane.tail.since(read) {
            read += 1;
            if let Ok(r) = serde_json::from_slice::<ResultRecord>(m.payload().unwrap_or_default())
                && wanted.contains(&(r.source.partition, r.source.offset))
            {
                covered.insert((r.source.partition, r.source.offset));
            }
        }
        if let Some(status) = last.exited() {
            failures.push(format!("final dedupd exited by itself ({status})"));
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "[{backend}] final run: {}/{} inputs with a result after {:.1} s",
        covered.len(),
        wanted.len(),
        t.elapsed().as_secs_f64()
    );
    match last.terminate(Duration::from_secs(60)) {
        Some(s) if s.success() => {}
        other => failures.push(format!("final dedupd did not exit cleanly on SIGTERM within 60 s: {other:?}")),
    }
    if let Some(missing) = fodder.iter().find(|f| !covered.contains(f)) {
        failures.push(format!("fodder command at {missing:?} has no result"));
    }

    let published = kafka::count_records(&lane.bootstrap, &lane.results_topic).await as usize;
    let all = caught_up(&lane.tail, published).await;
    if all.len() != published {
        failures.push(format!("read {} result records, the topic holds {published}", all.len()));
    }
    // Fodder is the compaction's, not the checks': its records expire and may run again.
    let fodder_pos: HashSet<(i32, i64)> = fodder.iter().copied().collect();
    let results: Vec<_> = all
        .into_iter()
        .filter(|m| {
            serde_json::from_slice::<ResultRecord>(m.payload().unwrap_or_default())
                .map_or(true, |r| !fodder_pos.contains(&(r.source.partition, r.source.offset)))
        })
        .collect();
    // A fodder command redelivered after a kill, more than its TTL after it was produced,
    // is `stale` (dead-lettered, not run): the only dead letters there may be.
    let dead_letters = kafka::count_records(&lane.bootstrap, &lane.dlq_topic).await as usize;
    let letters = kafka::read_all(&lane.bootstrap, &lane.dlq_topic, dead_letters, Duration::from_secs(60)).await;
    let not_stale_fodder = letters
        .iter()
        .filter(|m| {
            !(m.key().is_some_and(|k| k.starts_with(b"fodder-"))
                && kafka::header(m, "dedupd-reason").as_deref() == Some("stale"))
        })
        .count();
    if letters.len() != dead_letters || not_stale_fodder > 0 {
        failures.push(format!(
            "{not_stale_fodder} of {dead_letters} dead letter(s) ({} read) are not stale fodder, but every other input is a valid command",
            letters.len()
        ));
    }
    let sink_published = kafka::count_records(&lane.bootstrap, &lane.sink_topic).await as usize;
    let sunk = caught_up(&lane.sink_tail, sink_published).await;
    if sunk.len() != sink_published {
        failures.push(format!("read {} records of the kafka sink's topic, it holds {sink_published}", sunk.len()));
    }
    // Every downstream's effects, in the order each received them.
    let mut received = effects::from_http(&lane.receiver.seen());
    received.extend(effects::from_kafka("kafka", &sunk, failures));
    received.extend(effects::from_smtp(&lane.smtp.received_numbered()));
    received.extend(effects::from_exec(&lane.exec_effects, failures));
    let store =
        KeyStore::open(lane.kind, &lane.store_path, SyncMode::Batch).expect("open the store after the final run");
    let plans = workload::plans();
    let input_keys: Vec<usize> = inputs.iter().map(|r| r.i).collect();
    let outside = Outside {
        input_topic: &lane.input_topic,
        inputs: &input_keys,
        by_pos: &by_pos,
        results: &results,
        effects: &received,
        store: &store,
    };
    let coverage = kill_check::check(backend, &plans, &outside, failures);
    // Every sink must have seen a kill between an effect and its completion (the
    // `sink.returned` point makes sure of it), or the run proves nothing about that row.
    for (name, _, forwards) in SINKS {
        let c = &coverage[name];
        let (exercised, what) = if forwards {
            (c.reran, "key re-run")
        } else {
            (c.received_indeterminate, "key received but never completed")
        };
        if exercised == 0 {
            failures.push(format!("coverage: sink {name}: no {what}; the kills missed its crash row"));
        }
    }
}
