//! The intake on two instances sharing their state on Kafka (`store.changelog`,
//! `kafka.copartitioned`, transactional results), against the real broker and a slow HTTP
//! sink that does not forward the key (docs/decisions.md, "The intake produces into the
//! pipeline"). Requests may reach either instance:
//! - the same keys posted to both at once: each key's sink call is made once, and every
//!   answer is the first, a replay or 409;
//! - one instance SIGKILLed while its requests' calls are under way: their repeats, sent to
//!   the survivor once it holds every partition, get the crash rules' answers (a replay, a
//!   run of a call never started, or `indeterminate` for a call that may have landed), and
//!   no key's call is made twice.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::intake::{Door, problem_type};
use common::kafka;
use common::process::{DedupdProcess, wait_until};
use common::state_group::StateGroup;
use reqwest::StatusCode;
use serde_json::{Value, json};

const API_KEY: &str = "agent-key-0123456789abcdef";
const PARTITIONS: i32 = 4;
/// The sink answers this long after a request arrives, so that the kill lands in calls.
const SINK_MS: u64 = 1_500;

/// `[intake]` for an instance: a long wait, so that a repeat after the failover is
/// answered with its result rather than 202.
fn with_intake(toml: String) -> String {
    format!(
        "{toml}\n[intake]\nlisten = \"127.0.0.1:0\"\nwait = \"60s\"\n\n[intake.clients.agent]\napi_key = \"{API_KEY}\"\n"
    )
}

fn payload(key: &str) -> Value {
    json!({"key": key, "amount": 10})
}

/// Sink calls made per idempotency key (the payload carries it: the sink does not forward it).
fn calls_by_key(group: &StateGroup) -> HashMap<String, usize> {
    let mut calls = HashMap::new();
    for seen in group.receiver.seen() {
        let body: Value = serde_json::from_slice(&seen.body).expect("sink body");
        *calls.entry(body["key"].as_str().unwrap_or("").to_string()).or_default() += 1;
    }
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_run_each_key_once_across_concurrency_and_a_kill() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let group = StateGroup::new(&bootstrap, "intake-two", PARTITIONS, (SINK_MS, SINK_MS)).await;
    kafka::create_changelog(&bootstrap, &group.changelog(), PARTITIONS).await;
    let (config_a, config_b) = (group.config("a", "", "", with_intake), group.config("b", "", "", with_intake));
    let (log_a, log_b) = (group.log("a"), group.log("b"));
    let mut a = DedupdProcess::run(&config_a, &log_a);
    let mut b = DedupdProcess::run(&config_b, &log_b);
    let (door_a, door_b) = (Door::when_ready(&log_a, &mut a).await, Door::when_ready(&log_b, &mut b).await);

    // Each key posted five times to each instance, all at once.
    let keys: Vec<String> = (0..12).map(|i| format!("both-{i}")).collect();
    let doors = [&door_a, &door_b];
    let requests: Vec<(&String, &Door)> = keys.iter().flat_map(|k| (0..10).map(move |n| (k, doors[n % 2]))).collect();
    let answers = futures::future::join_all(
        requests.into_iter().map(|(k, door)| door.send(API_KEY, "card.charge", k, payload(k))),
    )
    .await;
    for (status, replayed, body) in &answers {
        let first = *status == StatusCode::OK && replayed.is_none();
        let replay = *status == StatusCode::OK && replayed.as_deref() == Some("true");
        let in_flight = *status == StatusCode::CONFLICT && problem_type(body) == "in-flight";
        assert!(first || replay || in_flight, "{status} {replayed:?} {body}");
    }
    let calls = calls_by_key(&group);
    for k in &keys {
        assert_eq!(calls.get(k.as_str()).copied(), Some(1), "{k}: {calls:?}");
    }
    each_key_is_read_at_its_owner(&keys, [&door_a, &door_b]).await;

    // Requests to `a`, whose calls are under way at either instance when `a` is killed.
    let doomed: Vec<String> = (0..12).map(|i| format!("kill-{i}")).collect();
    let before = group.receiver.count();
    let in_flight: Vec<_> = doomed
        .iter()
        .map(|k| {
            let request = door_a.post(API_KEY, "card.charge", Some(k)).body(payload(k).to_string());
            tokio::spawn(async move { request.send().await })
        })
        .collect();
    assert!(wait_until(Duration::from_secs(30), || group.receiver.count() > before).await, "no call started");
    a.kill();
    for request in in_flight {
        let _ = request.await;
    }
    // The survivor takes `a`'s partitions once its session (6 s) is over, restores their
    // state and reads their uncommitted input again; each repeat is then answered.
    let repeats =
        futures::future::join_all(doomed.iter().map(|k| door_b.send(API_KEY, "card.charge", k, payload(k)))).await;
    for ((status, _, body), k) in repeats.iter().zip(&doomed) {
        let settled = *status == StatusCode::OK
            || (*status == StatusCode::BAD_GATEWAY && problem_type(body) == "indeterminate")
            || (*status == StatusCode::CONFLICT && problem_type(body) == "in-flight");
        assert!(settled, "{k}: {status} {body}");
    }
    let summary: Vec<String> = repeats.iter().map(|(s, r, b)| format!("{s} {r:?} {}", problem_type(b))).collect();
    println!("repeats after the kill: {summary:?}");
    let calls = calls_by_key(&group);
    for k in &doomed {
        assert!(calls.get(k.as_str()).copied().unwrap_or(0) <= 1, "{k} was called twice: {calls:?}");
    }
    assert!(b.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()));
}

/// `GET /v1/commands/{key}`: the instance holding the key's state partition answers with its
/// record; the other, which holds none of it, answers 421 `not-owner` (every key is held by
/// exactly one of the two: the group is settled, nobody joins or leaves meanwhile).
async fn each_key_is_read_at_its_owner(keys: &[String], doors: [&Door; 2]) {
    let mut owners = [0, 0];
    for k in keys {
        let path = format!("/v1/commands/{k}");
        let (a, b) = (doors[0].get(API_KEY, &path).await, doors[1].get(API_KEY, &path).await);
        let read = |(status, body): &(StatusCode, Value)| *status == StatusCode::OK && body["state"] == "completed";
        let misdirected = |(status, body): &(StatusCode, Value)| {
            *status == StatusCode::MISDIRECTED_REQUEST && problem_type(body) == "not-owner"
        };
        match (read(&a), read(&b)) {
            (true, false) => assert!(misdirected(&b), "{k} at b: {b:?}"),
            (false, true) => assert!(misdirected(&a), "{k} at a: {a:?}"),
            _ => panic!("{k} is read at exactly one instance: a {a:?}, b {b:?}"),
        }
        owners[usize::from(read(&b))] += 1;
    }
    assert!(owners[0] > 0 && owners[1] > 0, "each instance owns some of the keys: {owners:?}");
}
