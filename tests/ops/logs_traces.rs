//! Logs and traces of `dedupd run` on a real broker (docs/contract.md §11):
//! - W3C `traceparent` goes from an input's headers to its result's headers and into the
//!   http sink request; a duplicate's result carries the duplicate's own trace context;
//! - with `log.format = "json"` every line is JSON, and every command has a `command` span
//!   with its key, topic, partition, offset and outcome; sink runs have a `sink_run` span.
//!
//! - with traces on, spans reach a real OTLP/HTTP receiver (tests/common/otlp.rs) linked
//!   input → command → sink call, and the request, the result and the log lines name them.
//!
//! Run with `scripts/kafka/kafka.sh with cargo test --test ops logs_traces::`.

use crate::common;
use crate::common::otlp;

use std::collections::HashMap;
use std::time::Duration;

use common::kafka;
use common::process::{DedupdProcess, KeptOnFailure, SlowReceiver, tail_of_file, wait_for_http_addr};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use otlp::{OtlpReceiver, ReceivedSpan};
use rdkafka::message::OwnedMessage;
use serde_json::{Value, json};

fn traceparent(i: usize) -> String {
    format!("00-{:032x}-{:016x}-01", 0xabc0_0000 + i, 0x1000 + i)
}

/// A config with one http sink at `url` for every type, JSON logs at debug, and `extra`;
/// `store_extra` goes into `[store]`.
fn write_config(
    path: &std::path::Path,
    (kafka_table, store_extra): (&str, &str),
    store: &std::path::Path,
    url: &str,
    extra: &str,
) {
    let text = format!(
        r#"{kafka_table}
[store]
path = "{store}"
{store_extra}

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
{extra}"#,
        store = store.display(),
    );
    std::fs::write(path, text).expect("write config");
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
    let kafka_table = kafka::kafka_table(&bootstrap, &kafka::unique("lt-group"), &input, &results, &dlq);
    write_config(&config_path, (&kafka_table, ""), &dir.path().join("store"), &receiver.url("/hook"), "");
    let mut dedupd = DedupdProcess::run(&config_path, &log_path);
    wait_for_http_addr(&log_path, &mut dedupd, Duration::from_secs(60)).await;

    // Three commands, each with its own trace context, then a repeat of the first with
    // another one, and a bad record.
    let command = |i: usize| {
        serde_json::to_vec(&json!({"id": format!("lt-{i}"), "type": "hook.fire", "payload": {"i": i}})).unwrap()
    };
    let mut records: Vec<kafka::Outgoing> =
        (0..3).map(|i| (format!("lt-{i}"), command(i), vec![("traceparent".to_string(), traceparent(i))])).collect();
    records[0].2.push(("tracestate".to_string(), "vendor=abc".to_string()));
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
    // The tracestate that came with a traceparent goes on with it, unchanged.
    let first = published.iter().find(|m| result_source(m) == positions[0]).expect("result of input 0");
    assert_eq!(kafka::header(first, "tracestate").as_deref(), Some("vendor=abc"));
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
    let states: Vec<Option<&str>> = seen.iter().map(|s| s.tracestate.as_deref()).collect();
    assert_eq!(states, [Some("vendor=abc"), None, None], "tracestate passed on with the traceparent");

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

/// One test's `dedupd run` with traces on: its topics, an http sink receiver, the OTLP
/// receiver it exports to (every 100 ms), and the process, serving.
struct Traced {
    input: String,
    results: String,
    group: String,
    receiver: SlowReceiver,
    otlp: OtlpReceiver,
    dedupd: DedupdProcess,
    log_path: std::path::PathBuf,
    _dir: KeptOnFailure,
}

impl Traced {
    /// Topics named after `name` (the input with `partitions`), the config's `[kafka]` with
    /// `kafka_extra` and its `[store]` with `store_extra`.
    async fn start(bootstrap: &str, name: &str, partitions: i32, kafka_extra: &str, store_extra: &str) -> Traced {
        let unique = |what: &str| kafka::unique(&format!("{name}-{what}"));
        let (input, results, dlq, group) = (unique("in"), unique("results"), unique("dlq"), unique("group"));
        kafka::create_topics(bootstrap, &[(&input, partitions), (&results, 1), (&dlq, 1)]).await;
        let receiver = SlowReceiver::start((0, 0), 7).await;
        let otlp = OtlpReceiver::start().await;
        let dir = KeptOnFailure::new();
        let (config_path, log_path) = (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"));
        let kafka_table = kafka::kafka_table(bootstrap, &group, &input, &results, &dlq) + kafka_extra;
        let telemetry = "\n[telemetry]\ntraces = \"otlp\"\n";
        let sink_url = receiver.url("/hook");
        write_config(&config_path, (&kafka_table, store_extra), &dir.path().join("store"), &sink_url, telemetry);
        let endpoint = otlp.endpoint();
        let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()), ("OTEL_BSP_SCHEDULE_DELAY", "100")];
        let mut dedupd = DedupdProcess::spawn_with_env(&["run", "-c", config_path.to_str().unwrap()], &env, &log_path);
        wait_for_http_addr(&log_path, &mut dedupd, Duration::from_secs(60)).await;
        Traced { input, results, group, receiver, otlp, dedupd, log_path, _dir: dir }
    }

    /// Waits for the `results` results, stops dedupd cleanly, and returns the results and
    /// the spans received once there are `spans` of them (or after a bound).
    async fn stop_after(
        &mut self,
        bootstrap: &str,
        results: usize,
        spans: usize,
    ) -> (Vec<OwnedMessage>, Vec<ReceivedSpan>) {
        let published = kafka::read_all(bootstrap, &self.results, results, Duration::from_secs(60)).await;
        assert_eq!(published.len(), results, "results; dedupd log:\n{}", tail_of_file(&self.log_path, 40));
        let stopped = self.dedupd.terminate(Duration::from_secs(30));
        assert!(stopped.is_some_and(|s| s.success()), "dedupd did not stop cleanly");
        (published, spans_after_stop(&self.otlp, spans).await)
    }

    async fn stop_receivers(self) {
        self.receiver.stop().await;
        self.otlp.stop().await;
    }
}

/// The spans `otlp` holds once it has `n` of them (a clean stop exports what is left), or
/// after a bound: what it holds then.
async fn spans_after_stop(otlp: &OtlpReceiver, n: usize) -> Vec<ReceivedSpan> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while otlp.spans().len() < n && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    otlp.spans()
}

/// The trace id and parent span id of `traceparent(i)`.
fn ids_of(i: usize) -> (String, String) {
    (format!("{:032x}", 0xabc0_0000 + i), format!("{:016x}", 0x1000 + i))
}

/// `traceparent` naming `span_id` of `trace_id`, sampled.
fn naming(trace_id: &str, span_id: &str) -> String {
    format!("00-{trace_id}-{span_id}-01")
}

/// With `[telemetry] traces = "otlp"`, to a real OTLP/HTTP receiver on loopback: each input
/// has a consumer span, the child of its own trace context, with Kafka's messaging
/// attributes; each sink call a client span, the child of its command's, whose context is
/// the request's `traceparent` (with the input's `tracestate`); the result names the
/// command's span; the JSON log lines of a traced command carry its `trace_id`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_traces_on_spans_link_input_command_sink_call_and_result() {
    let Some(bootstrap) = kafka::bootstrap() else {
        return;
    };
    let mut run = Traced::start(&bootstrap, "ot", 1, "", "").await;
    let (input, group) = (run.input.clone(), run.group.clone());

    // 0: a command with trace context and tracestate; 1: its repeat, in another trace;
    // 2: a command without trace context; 3: a record that is not a command.
    let command = |i: usize| {
        serde_json::to_vec(&json!({"id": format!("ot-{i}"), "type": "hook.fire", "payload": {"i": i}})).unwrap()
    };
    let context = |i: usize| vec![("traceparent".to_string(), traceparent(i))];
    let mut first = context(0);
    first.push(("tracestate".to_string(), "vendor=abc".to_string()));
    let records: Vec<kafka::Outgoing> = vec![
        ("ot-0".into(), command(0), first),
        ("ot-0".into(), command(0), context(1)),
        ("ot-2".into(), command(2), Vec::new()),
        ("bad".into(), b"{not json".to_vec(), context(3)),
    ];
    let positions = kafka::produce_all(&bootstrap, &input, records.clone()).await;
    let (published, spans) = run.stop_after(&bootstrap, records.len(), 6).await;
    let consumer: HashMap<i64, &ReceivedSpan> = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Consumer as i32)
        .map(|s| (s.attributes["messaging.kafka.offset"].parse().unwrap(), s))
        .collect();
    let clients: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.kind == SpanKind::Client as i32).collect();
    assert_eq!((consumer.len(), clients.len(), spans.len()), (4, 2, 6), "spans received: {spans:#?}");

    // A consumer span per input, with the messaging attributes, the child of its input's
    // trace context (a new trace without one).
    let command_span = |n: usize| consumer[&positions[n].1];
    for (n, pos) in positions.iter().enumerate() {
        let s = command_span(n);
        assert_eq!(s.name, format!("process {input}"));
        let attr = |k: &str| s.attributes.get(k).map(String::as_str);
        assert_eq!(attr("messaging.system"), Some("kafka"));
        assert_eq!(attr("messaging.destination.name"), Some(input.as_str()));
        assert_eq!(attr("messaging.destination.partition.id"), Some(pos.0.to_string().as_str()));
        assert_eq!(attr("messaging.consumer.group.name"), Some(group.as_str()));
        assert_eq!(s.resource.get("service.name").map(String::as_str), Some("dedupd"));
    }
    for n in [0, 1, 3] {
        let (trace, parent) = ids_of(n);
        assert_eq!((&command_span(n).trace_id, &command_span(n).parent_span_id), (&trace, &parent), "input {n}");
    }
    assert_eq!(command_span(0).trace_state, "vendor=abc");
    assert_eq!(command_span(2).parent_span_id, "", "no trace context: the command's span starts a trace");
    assert_eq!(command_span(1).attributes["dedupd.outcome"], "duplicate");
    assert_eq!(command_span(3).status, 2, "a rejected record's span has an error status");
    assert_eq!(command_span(0).status, 0);

    // A client span per sink call, the child of its command's span, named in the request.
    let mut seen = run.receiver.seen();
    seen.sort_by(|a, b| a.key.cmp(&b.key));
    assert_eq!(seen.len(), 2, "the sink ran ot-0 and ot-2 once each: {seen:?}");
    for (request, n) in seen.iter().zip([0, 2]) {
        let parent = command_span(n);
        let call = clients.iter().find(|c| c.parent_span_id == parent.span_id).expect("the sink call's span");
        assert_eq!(call.trace_id, parent.trace_id);
        assert_eq!(call.attributes["dedupd.sink"], "hook");
        assert_eq!(request.traceparent.as_deref(), Some(naming(&call.trace_id, &call.span_id).as_str()), "input {n}");
        let state = (n == 0).then_some("vendor=abc");
        assert_eq!(request.tracestate.as_deref(), state, "tracestate of input {n} passed on");
    }

    // Each result names its command's span.
    for (n, pos) in positions.iter().enumerate() {
        let m = published.iter().find(|m| result_source(m) == *pos).expect("result of the input");
        let s = command_span(n);
        assert_eq!(kafka::header(m, "traceparent"), Some(naming(&s.trace_id, &s.span_id)), "result of input {n}");
        assert_eq!(kafka::header(m, "tracestate").as_deref(), (n == 0).then_some("vendor=abc"));
    }

    // JSON log lines about a traced command carry its trace and span id at the top level.
    let text = std::fs::read_to_string(&run.log_path).expect("log");
    let lines: Vec<Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    for (n, message) in [(0, "sink call"), (1, "command done"), (3, "command done")] {
        let s = command_span(n);
        let found = lines.iter().any(|v| {
            v["fields"]["message"] == message
                && v["trace_id"] == s.trace_id.as_str()
                && v["span_id"] == s.span_id.as_str()
        });
        assert!(
            found,
            "a {message:?} line of input {n} with trace_id {}:\n{}",
            s.trace_id,
            tail_of_file(&run.log_path, 30)
        );
    }
    run.stop_receivers().await;
}

/// Under the by-key hop (`store.changelog`, not copartitioned) a command's span is made
/// where it is decided, once, naming its input record: the forwarding partition makes
/// none of its own, and a record rejected before the hop has its span there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_by_key_hop_each_input_has_one_span_linked_to_its_context() {
    let Some(bootstrap) = kafka::bootstrap() else {
        return;
    };
    let mut run = Traced::start(&bootstrap, "oh", 2, "transactional_results = true\n", "changelog = true\n").await;
    let input = run.input.clone();

    // A command on partition 0, its repeat on partition 1 (both decided where the key's
    // state is), and a bad record on partition 1 (rejected before the hop).
    let command = serde_json::to_vec(&json!({"id": "oh-0", "type": "hook.fire", "payload": {}})).unwrap();
    let context = |i: usize| vec![("traceparent".to_string(), traceparent(i))];
    let records: Vec<kafka::OutgoingTo> = vec![
        ("oh-0".into(), command.clone(), context(0), Some(0)),
        ("oh-0".into(), command, context(1), Some(1)),
        ("bad".into(), b"{not json".to_vec(), context(2), Some(1)),
    ];
    let positions = kafka::produce_all_to(&bootstrap, &input, records).await;
    let (_, spans) = run.stop_after(&bootstrap, 3, 4).await;
    let consumer: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.kind == SpanKind::Consumer as i32).collect();
    assert_eq!(consumer.len(), 3, "one span per input, none for a forward: {consumer:#?}");
    let span_of = |n: usize| {
        let (partition, offset) = positions[n];
        let of_input = |s: &&&ReceivedSpan| {
            s.attributes["messaging.destination.partition.id"] == partition.to_string()
                && s.attributes["messaging.kafka.offset"] == offset.to_string()
        };
        *consumer.iter().find(of_input).unwrap_or_else(|| panic!("no span for input {n}: {consumer:#?}"))
    };
    for n in 0..3 {
        let s = span_of(n);
        assert_eq!(s.attributes["messaging.destination.name"], input, "the span names the input topic");
        assert_eq!(
            (s.trace_id.clone(), s.parent_span_id.clone()),
            ids_of(n),
            "input {n}'s span is its context's child"
        );
    }
    // The two partitions' forwards reach the key's partition in either order: one runs.
    let mut outcomes = [0, 1].map(|n| span_of(n).attributes["dedupd.outcome"].clone());
    let ran = if outcomes[0] == "succeeded" { 0 } else { 1 };
    outcomes.sort();
    assert_eq!(outcomes, ["duplicate", "succeeded"]);
    assert_eq!(span_of(2).status, 2, "the rejected record's span has an error status");

    let clients: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.kind == SpanKind::Client as i32).collect();
    let seen = run.receiver.seen();
    assert_eq!((clients.len(), seen.len()), (1, 1), "one sink call: {clients:#?}");
    assert_eq!(clients[0].parent_span_id, span_of(ran).span_id, "the call is the child of the span that ran");
    assert_eq!(seen[0].traceparent.as_deref(), Some(naming(&clients[0].trace_id, &clients[0].span_id).as_str()));
    run.stop_receivers().await;
}

/// The input position a result record names.
fn result_source(m: &OwnedMessage) -> (i32, i64) {
    let v: Value = serde_json::from_slice(rdkafka::Message::payload(m).unwrap_or_default()).expect("result JSON");
    (v["source"]["partition"].as_i64().unwrap() as i32, v["source"]["offset"].as_i64().unwrap())
}
