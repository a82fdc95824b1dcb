//! JSON log lines that name the trace they belong to: an event inside a span that carries
//! `trace_id` (and `span_id`) fields, such as a command's `sink_run` span with traces on,
//! gets them as top-level keys, where log stores look to link a line to its trace.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber, span};
use tracing_subscriber::fmt::format::{Format, Json, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// The `trace_id` and `span_id` fields a span was given, kept in its extensions.
#[derive(Debug, Default)]
struct TraceIds {
    trace_id: Option<String>,
    span_id: Option<String>,
}

impl Visit for TraceIds {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "trace_id" => self.trace_id = Some(value.to_string()),
            "span_id" => self.span_id = Some(value.to_string()),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if matches!(field.name(), "trace_id" | "span_id") {
            self.record_str(field, &format!("{value:?}"));
        }
    }
}

/// Keeps the `trace_id`/`span_id` fields of every span that declares them (recorded at
/// its start or later).
pub(super) struct TraceIdLayer;

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for TraceIdLayer {
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        if attrs.metadata().fields().field("trace_id").is_none() {
            return;
        }
        let mut ids = TraceIds::default();
        attrs.record(&mut ids);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(ids);
        }
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(ids) = span.extensions_mut().get_mut::<TraceIds>()
        {
            values.record(ids);
        }
    }
}

/// tracing-subscriber's JSON lines, with `trace_id` and `span_id` first when the event is
/// inside a span that has them (the innermost such span).
pub(super) struct JsonWithTraceIds(pub(super) Format<Json>);

impl<S, N> FormatEvent<S, N> for JsonWithTraceIds
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let ids = ctx.event_scope().and_then(|mut scope| {
            scope.find_map(|span| {
                let extensions = span.extensions();
                let ids = extensions.get::<TraceIds>()?;
                Some((ids.trace_id.clone()?, ids.span_id.clone()))
            })
        });
        let Some((trace_id, span_id)) = ids else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        let Some(rest) = line.strip_prefix('{') else { return writer.write_str(&line) };
        // Quoted by serde_json: the fields' values are whatever a span was given.
        write!(writer, "{{\"trace_id\":{},", quoted(&trace_id))?;
        if let Some(span_id) = span_id {
            write!(writer, "\"span_id\":{},", quoted(&span_id))?;
        }
        writer.write_str(rest)
    }
}

fn quoted(text: &str) -> String {
    serde_json::Value::String(text.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn events_inside_a_traced_span_carry_its_ids_at_the_top_level() {
        let lines = Lines::default();
        let writer = lines.clone();
        let fmt = tracing_subscriber::fmt::layer()
            .json()
            .event_format(JsonWithTraceIds(tracing_subscriber::fmt::format().json()))
            .with_writer(move || writer.clone());
        let subscriber = tracing_subscriber::registry().with(TraceIdLayer).with(fmt);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("outside");
            let span = tracing::info_span!(
                "sink_run",
                key = "k",
                trace_id = tracing::field::Empty,
                span_id = tracing::field::Empty
            );
            span.record("trace_id", "0af7651916cd43dd8448eb211c80319c");
            span.record("span_id", "b7ad6b7169203331");
            let _in = span.enter();
            tracing::info_span!("inner").in_scope(|| tracing::info!("inside"));
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].get("trace_id").is_none(), "{text}");
        assert_eq!(lines[1]["trace_id"], "0af7651916cd43dd8448eb211c80319c", "{text}");
        assert_eq!(lines[1]["span_id"], "b7ad6b7169203331");
        assert_eq!(lines[1]["fields"]["message"], "inside");
        assert_eq!(lines[1]["span"]["name"], "inner");
    }
}
