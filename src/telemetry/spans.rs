//! The spans of one command: a consumer span from the moment its record is read until its
//! result is acknowledged, the child of the input's trace context; and a client span per
//! sink call, the child of the command's, whose context is what the call passes on.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracer;

/// W3C trace context as headers: `traceparent`, and `tracestate` when there is one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TraceHeaders {
    /// `version-traceid-parentid-flags`.
    pub traceparent: Option<String>,
    /// Vendors' entries, passed on as they came (W3C: a participant that does not change
    /// them passes them on unchanged).
    pub tracestate: Option<String>,
}

impl Extractor for TraceHeaders {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => self.traceparent.as_deref(),
            "tracestate" => self.tracestate.as_deref(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

impl Injector for TraceHeaders {
    fn set(&mut self, key: &str, value: String) {
        match key {
            "traceparent" => self.traceparent = Some(value),
            "tracestate" => self.tracestate = Some(value).filter(|v| !v.is_empty()),
            _ => {}
        }
    }
}

/// The headers that name the span of `cx` as the parent.
fn headers_of(cx: &Context) -> TraceHeaders {
    let mut headers = TraceHeaders::default();
    TraceContextPropagator::new().inject_context(cx, &mut headers);
    headers
}

/// Where a command was read: its span's messaging attributes (OpenTelemetry's semantic
/// conventions for Kafka consumers).
#[derive(Debug, Clone, Copy)]
pub struct Consumed<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    /// The consumer group.
    pub group: &'a str,
}

/// Makes the spans of commands; cheap to clone.
#[derive(Debug, Clone)]
pub struct CommandTracer {
    tracer: SdkTracer,
}

impl CommandTracer {
    pub(super) fn new(tracer: SdkTracer) -> CommandTracer {
        CommandTracer { tracer }
    }

    /// Starts the span of the command read at `consumed`: the child of `incoming` (the
    /// input's trace context) when that is valid, else the root of a new trace.
    pub fn command_span(&self, consumed: &Consumed<'_>, incoming: &TraceHeaders) -> CommandSpan {
        let parent = TraceContextPropagator::new().extract(incoming);
        let span = self
            .tracer
            .span_builder(format!("process {}", consumed.topic))
            .with_kind(SpanKind::Consumer)
            .with_attributes([
                KeyValue::new("messaging.system", "kafka"),
                KeyValue::new("messaging.operation.type", "process"),
                KeyValue::new("messaging.operation.name", "process"),
                KeyValue::new("messaging.destination.name", consumed.topic.to_string()),
                KeyValue::new("messaging.destination.partition.id", consumed.partition.to_string()),
                KeyValue::new("messaging.kafka.offset", consumed.offset),
                KeyValue::new("messaging.consumer.group.name", consumed.group.to_string()),
            ])
            .start_with_context(&self.tracer, &parent);
        CommandSpan { cx: parent.with_span(span), tracer: self.tracer.clone() }
    }
}

/// What became of a command, for the end of its span.
#[derive(Debug, Clone, Copy)]
pub struct CommandEnd<'a> {
    /// The idempotency key, if the record had one.
    pub key: Option<&'a str>,
    /// The command type, if known.
    pub kind: Option<&'a str>,
    /// The outcome (`succeeded`, `duplicate`, ...).
    pub outcome: &'a str,
    /// The route, if one matched.
    pub route: Option<&'a str>,
    /// Why the command did not succeed, when it did not: the span's error status.
    pub error: Option<&'a str>,
}

/// The span of one command. Clones are the same span; it ends at [`CommandSpan::end`], or
/// when the last clone is dropped (a record let go before its result was published).
#[derive(Debug, Clone)]
pub struct CommandSpan {
    cx: Context,
    tracer: SdkTracer,
}

impl PartialEq for CommandSpan {
    fn eq(&self, other: &CommandSpan) -> bool {
        self.cx.span().span_context() == other.cx.span().span_context()
    }
}

impl CommandSpan {
    /// The trace id, 32 hex digits (for logs).
    pub fn trace_id(&self) -> String {
        self.cx.span().span_context().trace_id().to_string()
    }

    /// This span's id, 16 hex digits (for logs).
    pub fn span_id(&self) -> String {
        self.cx.span().span_context().span_id().to_string()
    }

    /// The trace context that names this span as the parent: what the command's result
    /// record carries.
    pub fn headers(&self) -> TraceHeaders {
        headers_of(&self.cx)
    }

    /// Starts the span of one call of sink `sink` for this command (`attempt` as the sink
    /// sees it).
    pub fn sink_call(&self, sink: &str, attempt: u32) -> SinkCallSpan {
        let span = self
            .tracer
            .span_builder(format!("sink {sink}"))
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("dedupd.sink", sink.to_string()),
                KeyValue::new("dedupd.attempt", i64::from(attempt)),
            ])
            .start_with_context(&self.tracer, &self.cx);
        SinkCallSpan { cx: self.cx.with_span(span) }
    }

    /// Ends the span with what became of the command.
    pub fn end(&self, end: &CommandEnd<'_>) {
        let span = self.cx.span();
        let optional = [("dedupd.key", end.key), ("dedupd.command.type", end.kind), ("dedupd.route", end.route)];
        for (name, value) in optional {
            if let Some(value) = value {
                span.set_attribute(KeyValue::new(name, value.to_string()));
            }
        }
        span.set_attribute(KeyValue::new("dedupd.outcome", end.outcome.to_string()));
        if let Some(error) = end.error {
            span.set_status(Status::error(error.to_string()));
        }
        span.end();
    }
}

/// The span of one sink call; it ends at [`SinkCallSpan::end`] or when dropped.
#[derive(Debug)]
pub struct SinkCallSpan {
    cx: Context,
}

impl SinkCallSpan {
    /// The trace context the call passes on: this span as the parent, the input's
    /// `tracestate`.
    pub fn headers(&self) -> TraceHeaders {
        headers_of(&self.cx)
    }

    /// Ends the span; `error` is why the call failed, when it did.
    pub fn end(self, error: Option<&str>) {
        let span = self.cx.span();
        if let Some(error) = error {
            span.set_status(Status::error(error.to_string()));
        }
        span.end();
    }
}
