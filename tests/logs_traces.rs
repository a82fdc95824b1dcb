//! Logs and traces of `dedupd run` on a real broker (docs/contract.md §11):
//! - W3C `traceparent` goes from an input's headers to its result's headers and into the
//!   http sink request; a duplicate's result carries the duplicate's own trace context;
//! - with `log.format = "json"` every line is JSON, and every command has a `command` span
//!   with its key, topic, partition, offset and outcome; sink runs have a `sink_run` span.
//!
//! Run with `scripts/kafka/kafka.sh with cargo test --test logs_traces`.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::kafka;
use common::process::{DedupdProcess, KeptOnFailure, SlowReceiver, tail_of_file, wait_for_http_addr};
use serde_json::{Value, json};

fn traceparent(i: usize) -> String {
    format!("00-{:032x}-{:016x}-01", 0xabc0_0000 + i, 0x1000 + i)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traceparent_flows_through_and_every_command_has_a_span() {
    let Some(bootstrap) = kafka::bootstrap() else {
        return;
    };
    let (input, results, dlq) = (kafka::unique("lt-in"), kafka::unique("lt-results"), kafka::unique("lt-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, 2), (&results, 1), (&dlq, 1)]).await;
    let receiver = SlowReceiver::start((0, 0), 7).await;

    let dir = KeptOnFailure::new();
    let config_path = dir.path().join("dedupd.toml");
    let log_path = dir.path().join("dedupd.log");
    std::fs::write(
        &config_path,
        format!(
            r#"{kafka_table}
[store]
path = "{store}"

[sinks.hook]
kind = "http"
url = "{url}"

[[routes]]
name = "hooks"
types = ["*"]
sink = "hook"

[http]
listen = "127.0.0.1:0"

[log]
format = "json"
level = "info,dedupd=debug"
"#,
            kafka_table = kafka::kafka_table(&bootstrap, &kafka::unique("lt-group"), &input, &results, &dlq),
            store = dir.path().join("store").display(),
            url = receiver.url("/hook"),
        ),
    )
    .expect("write config");
    let mut dedupd = DedupdProcess::run(&config_path, &log_path);
    wait_for_http_addr(&log_path, &mut dedupd, Duration::from_secs(60)).await;

    // Three commands, each with its own trace context, then a repeat of the first with
    // another one, and a bad record.
    let command = |i: usize| {
        serde_json::to_vec(&json!({"id": format!("lt-{i}"), "type": "hook.fire", "payload": {"i": i}})).unwrap()
    };
    let mut records: Vec<kafka::Outgoing> =
        (0..3).map(|i| (format!("lt-{i}"), command(i), vec![("traceparent".to_string(), traceparent(i))])).collect();
    records.push(("lt-0".into(), command(0), vec![("traceparent".to_string(), traceparent(9))]));
    records.push(("bad".into(), b"{not json".to_vec(), vec![("traceparent".to_string(), traceparent(8))]));
    let positions = kafka::produce_all(&bootstrap, &input, records.clone()).await;

    let published = kafka::read_all(&bootstrap, &results, records.len(), Duration::from_secs(60)).await;
    assert_eq!(published.len(), records.len(), "results; dedupd log:\n{}", tail_of_file(&log_path, 40));
    // Each result carries the trace context of its own input.
    let by_source: HashMap<(i32, i64), Value> = published
        .iter()
        .map(|m| {
            let v: Value =
                serde_json::from_slice(rdkafka::Message::payload(m).unwrap_or_default()).expect("result JSON");
            ((v["source"]["partition"].as_i64().unwrap() as i32, v["source"]["offset"].as_i64().unwrap()), v)
        })
        .collect();
    let tp_of: HashMap<(i32, i64), Option<String>> = published
        .iter()
        .map(|m| {
            let v: Value = serde_json::from_slice(rdkafka::Message::payload(m).unwrap_or_default()).unwrap();
            (
                (v["source"]["partition"].as_i64().unwrap() as i32, v["source"]["offset"].as_i64().unwrap()),
                kafka::header(m, "traceparent"),
            )
        })
        .collect();
    for (n, (_, _, headers)) in records.iter().enumerate() {
        let pos = positions[n];
        assert!(by_source.contains_key(&pos), "no result for input {n} at {pos:?}");
        assert_eq!(tp_of[&pos].as_deref(), Some(headers[0].1.as_str()), "traceparent of the result of input {n}");
    }
    let outcome_of = |n: usize| by_source[&positions[n]]["outcome"].as_str().unwrap_or("").to_string();
    assert_eq!(
        (0..5).map(outcome_of).collect::<Vec<_>>(),
        ["succeeded", "succeeded", "succeeded", "duplicate", "rejected"]
    );

    // The sink saw each key once, with the trace context of the input that ran it.
    let mut seen = receiver.seen();
    seen.sort_by(|a, b| a.key.cmp(&b.key));
    let got: Vec<(Option<String>, Option<String>)> =
        seen.iter().map(|s| (s.key.clone(), s.traceparent.clone())).collect();
    let want: Vec<(Option<String>, Option<String>)> =
        (0..3).map(|i| (Some(format!("lt-{i}")), Some(traceparent(i)))).collect();
    assert_eq!(got, want, "what the http sink received");

    assert!(dedupd.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()), "dedupd did not stop cleanly");
    receiver.stop().await;

    // Every log line is JSON; each input has exactly one `command` span event with its
    // identity and outcome; the executed ones logged inside a `sink_run` span too.
    let text = std::fs::read_to_string(&log_path).expect("log");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("log line is not JSON ({e}): {l}")))
        .collect();
    for (n, pos) in positions.iter().enumerate() {
        let spans: Vec<&Value> = lines
            .iter()
            .filter(|v| v["fields"]["message"] == "command done")
            .map(|v| &v["span"])
            .filter(|s| {
                s["name"] == "command"
                    && s["partition"] == pos.0
                    && s["offset"] == pos.1
                    && s["topic"] == input.as_str()
            })
            .collect();
        assert_eq!(spans.len(), 1, "command span of input {n} at {pos:?}:\n{}", tail_of_file(&log_path, 30));
        assert_eq!(spans[0]["outcome"], outcome_of(n).as_str(), "outcome in the span of input {n}");
        let key = if n == 4 { "" } else { records[n].0.as_str() };
        assert_eq!(spans[0]["key"], key, "key in the span of input {n}");
    }
    // Each executed key logged its sink call inside a `sink_run` span naming it.
    for i in 0..3 {
        let key = format!("lt-{i}");
        let calls = lines
            .iter()
            .filter(|v| {
                v["fields"]["message"] == "sink call"
                    && v["span"]["name"] == "sink_run"
                    && v["span"]["key"] == key.as_str()
            })
            .count();
        assert_eq!(calls, 1, "sink call events of {key} in a sink_run span");
    }
}
