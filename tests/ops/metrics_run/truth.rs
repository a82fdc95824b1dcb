//! The ground truth of the run: every result and dead letter checked against the input it
//! came from, and what the receiver answered, counted the way the metrics must count them.

use std::collections::BTreeMap;

use dedupd::outcome::ResultRecord;
use rdkafka::message::Message;

use super::{DISTINCT, FLAKY_KEY, Input};
use crate::common::kafka;
use crate::common::scripted::ScriptedReceiver;

/// What the run did, from the ground truth (topics and receiver).
pub(super) struct Truth {
    pub(super) commands: BTreeMap<Vec<String>, f64>,
    pub(super) dead_letters: BTreeMap<Vec<String>, f64>,
    pub(super) sink_requests: BTreeMap<Vec<String>, f64>,
    pub(super) duplicates: BTreeMap<Vec<String>, f64>,
    pub(super) sink_calls: f64,
    pub(super) brief_completed: f64,
    pub(super) main_completed: f64,
}

fn count_into(m: &mut BTreeMap<Vec<String>, f64>, key: &[&str]) {
    *m.entry(key.iter().map(|s| s.to_string()).collect()).or_insert(0.0) += 1.0;
}

/// Checks every result and dead letter against the input it came from; returns the counts
/// the metrics must show.
pub(super) fn check_topics(
    inputs: &[Input],
    by_pos: &BTreeMap<(i32, i64), usize>,
    published: &[rdkafka::message::OwnedMessage],
    dead: &[rdkafka::message::OwnedMessage],
    receiver: &ScriptedReceiver,
) -> Truth {
    let mut truth = Truth {
        commands: BTreeMap::new(),
        dead_letters: BTreeMap::new(),
        sink_requests: BTreeMap::new(),
        duplicates: BTreeMap::new(),
        sink_calls: 0.0,
        brief_completed: 0.0,
        main_completed: 0.0,
    };
    let mut seen = vec![false; inputs.len()];
    for m in published {
        let r: ResultRecord = serde_json::from_slice(m.payload().expect("value")).expect("result record");
        let i = by_pos[&(r.source.partition, r.source.offset)];
        assert!(!std::mem::replace(&mut seen[i], true), "two results for input {i}");
        let route = r.route.as_deref().unwrap_or("-");
        assert_eq!((r.outcome.as_str(), route), (inputs[i].outcome, inputs[i].route), "input {i}: {r:?}");
        count_into(&mut truth.commands, &[r.outcome.as_str(), route]);
        if r.outcome.as_str() == "duplicate" {
            count_into(&mut truth.duplicates, &[route]);
        }
        if matches!(r.outcome.as_str(), "succeeded" | "failed") {
            *if route == "brief" { &mut truth.brief_completed } else { &mut truth.main_completed } += 1.0;
        }
        if r.key.as_deref() == Some(FLAKY_KEY) && !r.replay {
            assert_eq!(r.attempts, 2, "the flaky key took a retry: {r:?}");
        }
    }
    for m in dead {
        let reason = kafka::header(m, "dedupd-reason").expect("dedupd-reason");
        let source = kafka::header(m, "dedupd-source").expect("dedupd-source");
        let (rest, offset) = source.rsplit_once('/').expect("topic/partition/offset");
        let partition = rest.rsplit_once('/').expect("topic/partition").1;
        let i = by_pos[&(partition.parse().expect("partition"), offset.parse().expect("offset"))];
        assert_eq!(Some(reason.as_str()), inputs[i].reason, "dead letter of input {i}");
        count_into(&mut truth.dead_letters, &[&reason]);
    }
    assert_eq!(dead.len(), inputs.iter().filter(|r| r.reason.is_some()).count(), "dead letters read");
    for a in receiver.answered() {
        let status = match a.status {
            200..=299 => "ok",
            408 | 429 | 500..=599 => "transient",
            _ => "permanent",
        };
        count_into(&mut truth.sink_requests, &["receiver", status]);
        truth.sink_calls += 1.0;
    }
    // The plan, as a cross-check of the ground truth itself.
    let plan = |pairs: &[(&[&str], f64)]| -> BTreeMap<Vec<String>, f64> {
        pairs.iter().map(|(k, v)| (k.iter().map(|s| s.to_string()).collect(), *v)).collect()
    };
    let d = DISTINCT as f64;
    let expected_requests = plan(&[
        (&["receiver", "ok"], 2.0 * d - 1.0),
        (&["receiver", "permanent"], 1.0),
        (&["receiver", "transient"], 1.0),
    ]);
    assert_eq!(truth.sink_requests, expected_requests, "what the receiver answered");
    assert_eq!((truth.main_completed, truth.brief_completed), (d, d), "completed keys per route");
    truth
}
