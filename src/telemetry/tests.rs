use opentelemetry::trace::{SpanKind, Status};
use opentelemetry_sdk::trace::InMemorySpanExporter;

use super::*;

const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

fn consumed() -> Consumed<'static> {
    Consumed { topic: "commands", partition: 3, offset: 42, group: "dedupd" }
}

fn incoming(traceparent: Option<&str>, tracestate: Option<&str>) -> TraceHeaders {
    TraceHeaders { traceparent: traceparent.map(str::to_string), tracestate: tracestate.map(str::to_string) }
}

#[test]
fn the_command_span_is_the_child_of_the_input_and_the_sink_call_the_child_of_the_command() {
    let exporter = InMemorySpanExporter::default();
    let traces = Traces::with_exporter(exporter.clone());
    let command = traces.tracer().command_span(&consumed(), &incoming(Some(PARENT), Some("vendor=abc,other=1")));
    let call = command.sink_call("hooks", 2);
    let passed_on = call.headers();
    call.end(Some("HTTP 503"));
    command.end(&CommandEnd {
        key: Some("k1"),
        kind: Some("t"),
        outcome: "failed",
        route: Some("r"),
        error: Some("gave up"),
    });
    let result_headers = command.headers();

    let spans = exporter.get_finished_spans().unwrap();
    assert_eq!(spans.len(), 2);
    let (sink, cmd) = (&spans[0], &spans[1]);
    assert_eq!(cmd.span_context.trace_id().to_string(), "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(cmd.parent_span_id.to_string(), "b7ad6b7169203331");
    assert_eq!(cmd.span_kind, SpanKind::Consumer);
    assert_eq!(cmd.name, "process commands");
    assert_eq!(cmd.status, Status::error("gave up"));
    let attr = |name: &str| cmd.attributes.iter().find(|kv| kv.key.as_str() == name).map(|kv| kv.value.to_string());
    assert_eq!(attr("messaging.system").as_deref(), Some("kafka"));
    assert_eq!(attr("messaging.destination.partition.id").as_deref(), Some("3"));
    assert_eq!(attr("messaging.kafka.offset").as_deref(), Some("42"));
    assert_eq!(attr("messaging.consumer.group.name").as_deref(), Some("dedupd"));
    assert_eq!(attr("dedupd.outcome").as_deref(), Some("failed"));

    assert_eq!(sink.span_kind, SpanKind::Client);
    assert_eq!(sink.parent_span_id, cmd.span_context.span_id());
    assert_eq!(sink.span_context.trace_id(), cmd.span_context.trace_id());
    assert_eq!(sink.status, Status::error("HTTP 503"));
    // What the call passed on names the call's span, with the input's tracestate.
    let want = format!("00-0af7651916cd43dd8448eb211c80319c-{}-01", sink.span_context.span_id());
    assert_eq!(passed_on, incoming(Some(&want), Some("vendor=abc,other=1")));
    // The result record names the command's span.
    let want = format!("00-0af7651916cd43dd8448eb211c80319c-{}-01", cmd.span_context.span_id());
    assert_eq!(result_headers, incoming(Some(&want), Some("vendor=abc,other=1")));
    assert_eq!(command.trace_id(), "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(command.span_id(), cmd.span_context.span_id().to_string());
}

#[test]
fn without_a_valid_parent_the_command_starts_a_trace() {
    let exporter = InMemorySpanExporter::default();
    let traces = Traces::with_exporter(exporter.clone());
    for bad in [None, Some("00-zz-not-a-context"), Some("00-00000000000000000000000000000000-b7ad6b7169203331-01")] {
        let command = traces.tracer().command_span(&consumed(), &incoming(bad, Some("vendor=abc")));
        command.end(&CommandEnd { key: None, kind: None, outcome: "rejected", route: None, error: None });
        let spans = exporter.get_finished_spans().unwrap();
        let span = spans.last().unwrap();
        assert_eq!(span.parent_span_id, opentelemetry::trace::SpanId::INVALID, "{bad:?}");
        assert!(span.span_context.is_valid());
        // A tracestate without a valid traceparent is not passed on (W3C).
        assert_eq!(command.headers().tracestate, None, "{bad:?}");
    }
}

#[test]
fn a_command_span_ends_when_its_last_clone_is_dropped() {
    let exporter = InMemorySpanExporter::default();
    let traces = Traces::with_exporter(exporter.clone());
    let command = traces.tracer().command_span(&consumed(), &TraceHeaders::default());
    let clone = command.clone();
    assert_eq!(clone, command);
    drop(command);
    assert!(exporter.get_finished_spans().unwrap().is_empty());
    drop(clone);
    assert_eq!(exporter.get_finished_spans().unwrap().len(), 1);
}
