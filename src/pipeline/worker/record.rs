//! A record in, a command's end out: each consumed record parsed into an engine item (with
//! traces on, its command's span started), and each command logged, its span ended, once
//! its result is acknowledged.

use rdkafka::message::{Message, OwnedMessage};

use super::super::changelog::state_partition;
use super::PartitionWorker;
use crate::engine::Item;
use crate::envelope::{Command, InputRecord, ReadHeaders, RejectReason, Rejection, parse, read_headers};
use crate::outcome::{Outcome, Processed};
use crate::store::SourcePos;
use crate::telemetry::{CommandEnd, CommandSpan, Consumed, TraceHeaders};

impl PartitionWorker {
    /// `m` parsed as [`untraced_item`](Self::untraced_item) does, its command's span
    /// started (with traces on).
    pub(super) fn item(&self, m: &OwnedMessage, check_among: Option<i32>) -> Item {
        let mut item = self.untraced_item(m, check_among);
        item.span = self.command_span(m, &item);
        item
    }

    /// `m` parsed; with `check_among`, checked to be on its key's partition of that many
    /// (this worker's partition: under the hop `m` names its input's). No span yet: under
    /// the hop a command's span starts where it is decided, not where it is forwarded.
    pub(super) fn untraced_item(&self, m: &OwnedMessage, check_among: Option<i32>) -> Item {
        let ReadHeaders { headers, unreadable } = m.headers().map(read_headers).unwrap_or_default();
        if unreadable > 0 {
            // A name that is not UTF-8 is never one dedupd reads (names are ASCII): ignored.
            tracing::debug!(
                topic = m.topic(),
                partition = m.partition(),
                offset = m.offset(),
                unreadable,
                "ignored headers whose name is not UTF-8"
            );
        }
        let record = InputRecord {
            topic: m.topic(),
            partition: m.partition(),
            offset: m.offset(),
            timestamp_ms: m.timestamp().to_millis(),
            key: m.key(),
            value: m.payload(),
            headers: &headers,
        };
        let header = |name: &str| {
            headers
                .iter()
                .rev()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .and_then(|(_, v)| v.as_ref())
                .and_then(|v| String::from_utf8(v.clone()).ok())
        };
        let traceparent = header("traceparent");
        let tracestate = traceparent.as_ref().and_then(|_| header("tracestate"));
        let parsed = parse(&record, &self.shared.envelope, &self.shared.limits, self.shared.engine.router());
        let parsed = match (parsed, check_among) {
            (Ok(cmd), Some(n)) => copartitioned(cmd, self.partition, n),
            (parsed, _) => parsed,
        };
        Item {
            source: SourcePos { topic: m.topic().to_string(), partition: m.partition(), offset: m.offset() },
            parsed,
            traceparent,
            tracestate,
            span: None,
            checked_absent: None,
        }
    }

    /// With traces on, the span of what `m` became (`item`), started now: the child of the
    /// envelope's trace context (CloudEvents attributes included) when it is a command, of
    /// the raw headers' otherwise.
    pub(super) fn command_span(&self, m: &OwnedMessage, item: &Item) -> Option<CommandSpan> {
        let tracer = self.shared.tracer.as_ref()?;
        let incoming = match &item.parsed {
            Ok(cmd) => TraceHeaders { traceparent: cmd.traceparent.clone(), tracestate: cmd.tracestate.clone() },
            Err(_) => TraceHeaders { traceparent: item.traceparent.clone(), tracestate: item.tracestate.clone() },
        };
        let consumed =
            Consumed { topic: m.topic(), partition: m.partition(), offset: m.offset(), group: &self.shared.group };
        Some(tracer.command_span(&consumed, &incoming))
    }
}

/// With the log at debug (`log.level = "dedupd=debug"`), one span per command once its
/// result is acknowledged: key, topic, partition, offset and outcome (with traces on, also
/// its trace and span id), with a debug event in it that shows every command. With traces
/// on, the command's OpenTelemetry span ends here.
pub(super) fn log_command(m: &OwnedMessage, p: &Processed) {
    let r = &p.result;
    // The span is there for its debug event alone: made at `info` without it, a log layer
    // would format its fields for every command and show nothing.
    if tracing::enabled!(tracing::Level::DEBUG) {
        let span = tracing::info_span!(
            "command",
            key = r.key.as_deref().unwrap_or(""),
            topic = m.topic(),
            partition = m.partition(),
            offset = m.offset(),
            outcome = r.outcome.as_str(),
            trace_id = p.span.as_ref().map(CommandSpan::trace_id),
            span_id = p.span.as_ref().map(CommandSpan::span_id),
        );
        let _entered = span.enter();
        tracing::debug!(route = r.route.as_deref(), sink_called = p.sink_called, replay = r.replay, "command done");
    }
    if let Some(command) = &p.span {
        // A span's error status means the command did not do what was asked; a replay did.
        let succeeded = matches!(r.outcome, Outcome::Succeeded | Outcome::Duplicate);
        command.end(&CommandEnd {
            key: r.key.as_deref(),
            kind: r.kind.as_deref(),
            outcome: r.outcome.as_str(),
            route: r.route.as_deref(),
            error: (!succeeded).then(|| r.error.as_deref().unwrap_or(r.outcome.as_str())),
        });
    }
}

/// `cmd` read from input partition `partition`, or the rejection of a record that is not on
/// its key's state partition (one of `partitions`): its key's history is kept elsewhere, so
/// deciding it here could run it twice.
fn copartitioned(cmd: Command, partition: i32, partitions: i32) -> Result<Command, Rejection> {
    let expected = state_partition(&cmd.key, partitions);
    if expected == partition {
        return Ok(cmd);
    }
    Err(Rejection {
        reason: RejectReason::NotCopartitioned,
        message: format!(
            "key {:?} belongs to partition {expected} of {partitions} (Kafka's murmur2 of the key), not {partition}: kafka.copartitioned needs producers to key records by the idempotency key",
            cmd.key
        ),
        kind: Some(cmd.kind),
        key: Some(cmd.key),
    })
}
