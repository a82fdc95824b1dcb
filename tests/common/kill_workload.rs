//! The workload of the crash suite (tests/kafka/kafka_kill.rs): ~2,940 commands over 2,040 keys
//! and seven sinks, with repeats in the same batch, late and through another partition; the
//! config of each incarnation; and compaction fodder: commands of a route with a TTL of
//! one second, whose records expire and are compacted while the suite runs, so that a
//! crash can land in compaction.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::effects::{self, Downstreams, SinkKind};
use super::kafka;
use super::kill_check::Plan;

/// The TTL of the fodder route. Fodder read more than this after it was produced (its
/// incarnation died first) is `stale`, dead-lettered and never stored; what is stored
/// expires while later incarnations run, so that random kills can land in compaction too.
pub const FODDER_TTL: Duration = Duration::from_secs(2);

/// A fodder command: its own key, never repeated on purpose (a redelivery after its record
/// expired runs it again, at the `log` sink: no effect to check).
pub fn fodder_command(n: usize) -> (String, Vec<u8>) {
    let key = format!("fodder-{n}");
    let value = json!({"id": key, "type": "fodder.apply", "payload": {"n": n}});
    (key, serde_json::to_vec(&value).expect("json"))
}

/// The incarnations' `pipeline.max_in_flight`: small, so that a chunk takes a few hundred
/// ms and kills land mid-work; also the most claims one round of a batch makes.
pub const MAX_IN_FLIGHT: usize = 8;

/// How long records planted for compaction live ([`plant_expiring`]).
pub const PLANTED_TTL: Duration = Duration::from_secs(2);
/// Records planted for each incarnation meant to die in compaction.
const PLANTED: usize = 2;

/// Plants [`PLANTED`] completed records expiring [`PLANTED_TTL`] from now into the store of
/// a stopped incarnation (`dedupd import -c CONFIG`, through `file`), for the next one to
/// compact: an incarnation meant to die at `compaction.chunk` then meets the point however
/// far behind its input is (stream fodder read after its TTL is `stale`, dead-lettered and
/// never stored, which a backlog on a loaded machine made common). `Err` when the import
/// fails or imports fewer.
pub fn plant_expiring(config: &Path, file: &Path, incarnation: usize) -> Result<(), String> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_err(|e| e.to_string())?.as_millis()
        as i64;
    let expires_at = now + PLANTED_TTL.as_millis() as i64;
    let mut lines =
        vec![json!({"v": 1, "type": "header", "exported_at_ms": now, "backend": "any", "records_estimate": PLANTED})];
    lines.extend((0..PLANTED).map(|n| {
        json!({
            "v": 1, "type": "record", "key": format!("planted-{incarnation}-{n}"), "state": "completed",
            "fingerprint": format!("sha256:{}", "0".repeat(64)), "outcome": "succeeded", "result": {"planted": true},
            "error": null, "first_seen_at_ms": now, "completed_at_ms": now, "expires_at_ms": expires_at, "attempts": 1,
            "source": {"topic": "planted", "partition": 0, "offset": n},
        })
    }));
    lines.push(json!({"v": 1, "type": "end", "records": PLANTED, "watermarks": 0}));
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(file, text).map_err(|e| format!("write {}: {e}", file.display()))?;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dedupd"))
        .args(["import", path_str(file)?, "-c", path_str(config)?])
        .output()
        .map_err(|e| format!("run dedupd import: {e}"))?;
    let counts: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    match counts["imported"].as_u64() {
        Some(n) if out.status.success() && n == PLANTED as u64 => Ok(()),
        _ => Err(format!(
            "planting records to compact: dedupd import {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

fn path_str(p: &Path) -> Result<&str, String> {
    p.to_str().ok_or_else(|| format!("not UTF-8: {}", p.display()))
}

pub const PARTITIONS: i32 = 6;
pub const RESULT_PARTITIONS: i32 = 3;
pub const SINK_TOPIC_PARTITIONS: i32 = 3;
/// Distinct keys; with the repeats this makes ~2,940 input records.
pub const DISTINCT: usize = 2_040;
/// A late repeat of key `i` follows the original of key `i + LATE_GAP`.
pub const LATE_GAP: usize = 150;
/// The sinks (name, kind, forwards the key), one route each; key `i` goes to
/// `SINKS[i % SINKS.len()]` through command type `NAME.apply`.
pub const SINKS: [(&str, SinkKind, bool); 7] = [
    ("http-once", SinkKind::Http, false),
    ("http-fwd", SinkKind::Http, true),
    ("kafka", SinkKind::Kafka, true),
    ("smtp-once", SinkKind::Smtp, false),
    ("smtp-fwd", SinkKind::Smtp, true),
    ("exec-once", SinkKind::Exec, false),
    ("exec-fwd", SinkKind::Exec, true),
];

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Original,
    SameBatch,
    Late,
    OtherPartition,
}

#[derive(Debug, Clone)]
pub struct Input {
    pub i: usize,
    pub kind: Kind,
    pub kafka_key: String,
    pub value: Vec<u8>,
    pub partition: i32,
}

pub fn id(i: usize) -> String {
    format!("cmd-{i}")
}

pub fn sink_of(i: usize) -> (&'static str, SinkKind, bool) {
    SINKS[i % SINKS.len()]
}

pub fn payload(i: usize) -> Value {
    match sink_of(i).1 {
        SinkKind::Smtp => {
            json!({"to": format!("u{i}@example.org"), "subject": format!("order {i}"), "text": format!("n={i}")})
        }
        _ => json!({"n": i, "customer": format!("c{}", i % 97), "amount": 100 + i}),
    }
}

pub fn command(i: usize) -> Vec<u8> {
    let kind = format!("{}.apply", sink_of(i).0);
    serde_json::to_vec(&json!({"id": id(i), "type": kind, "payload": payload(i)})).expect("json")
}

/// What the checks expect of key `i`.
pub fn plans() -> Vec<Plan> {
    (0..DISTINCT)
        .map(|i| {
            let (sink, kind, forwarding) = sink_of(i);
            Plan { key: id(i), sink, kind, forwarding, seen: effects::seen_as(kind, &payload(i)) }
        })
        .collect()
}

pub fn workload() -> Vec<Input> {
    let mut out = Vec::new();
    let mut late: BTreeMap<usize, Vec<Input>> = BTreeMap::new();
    for i in 0..DISTINCT {
        let p = (i % PARTITIONS as usize) as i32;
        let rec = |kind, kafka_key: String, partition| Input { i, kind, kafka_key, value: command(i), partition };
        out.push(rec(Kind::Original, format!("k-{i}"), p));
        match i % 34 {
            0..5 => out.push(rec(Kind::SameBatch, format!("k-{i}"), p)),
            5..10 => late.entry(i + LATE_GAP).or_default().push(rec(Kind::Late, format!("k-{i}"), p)),
            10..15 => out.push(rec(Kind::OtherPartition, format!("x-{i}"), (p + 3) % PARTITIONS)),
            _ => {}
        }
        if let Some(due) = late.remove(&i) {
            out.extend(due);
        }
    }
    out.extend(late.into_values().flatten());
    out
}

/// The `[sinks.NAME]` table of every sink (reaching `d`) and its route.
pub fn sinks_toml(d: &Downstreams<'_>) -> String {
    let mut out = String::new();
    for (name, kind, forwarding) in SINKS {
        let table = d.sink_table(name, kind, forwarding);
        out.push_str(&format!(
            "[sinks.{name}]\n{table}\n\n[[routes]]\nname = \"{name}\"\ntypes = [\"{name}.*\"]\nsink = \"{name}\"\n\n"
        ));
    }
    out
}

pub fn config_toml(
    bootstrap: &str,
    group: &str,
    topics: [&str; 3],
    backend: &str,
    store: &Path,
    sinks: &str,
) -> String {
    let store = store.to_str().expect("utf-8 path");
    let [input, results, dlq] = topics;
    format!(
        r#"{kafka_table}
[store]
backend = "{backend}"
path = {store:?}
# Fodder for compaction (see FODDER_TTL): expired records every few hundred ms, one per chunk.
compaction_interval = "200ms"
compaction_chunk = 1

[pipeline]
# Small, so that a chunk takes a few hundred ms and kills land mid-work.
max_in_flight = {MAX_IN_FLIGHT}
batch_size = 50
batch_linger = "5ms"

[http]
listen = "127.0.0.1:0"

[log]
format = "json"
level = "info"

{sinks}
[sinks.fodder]
kind = "log"

[[routes]]
name = "fodder"
types = ["fodder.apply"]
sink = "fodder"
ttl = "{fodder_ttl}"
"#,
        fodder_ttl = humantime::format_duration(FODDER_TTL),
        kafka_table = kafka::kafka_table(bootstrap, group, input, results, dlq)
    )
}
