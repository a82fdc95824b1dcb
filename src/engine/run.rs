//! Run the sinks: every durable claim of the round through its sink at the same time
//! (bounded by `max_in_flight` inside [`run_with_retry`]), each run in a span that carries
//! the command's identity (with traces on, also its trace and span id, for the logs).

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::claim::Claimed;
use super::retry::{RunEnd, SinkRun, run_with_retry};
use super::{Engine, Item};
use crate::telemetry::CommandSpan;

/// A claim whose sink run ended.
pub(super) struct Ran<'a> {
    /// The claim.
    pub(super) claimed: Claimed<'a>,
    /// How the run ended.
    pub(super) end: RunEnd,
}

impl Engine {
    /// Runs the sink of each claim in `claimed` until it answers, gives up or `cancel`
    /// fires; returns them in the same order.
    pub(super) async fn run_sinks<'a>(
        &self,
        items: &'a [Item],
        claimed: Vec<Claimed<'a>>,
        cancel: &CancellationToken,
    ) -> Vec<Ran<'a>> {
        let runs = claimed.into_iter().map(|mut claimed| {
            let cmd = claimed.head.command;
            // Everything the sink run logs (retries, the sink's own events) carries the
            // command's identity.
            let item = &items[claimed.head.index];
            let source = &item.source;
            let command_span = item.span.as_ref();
            let span = tracing::info_span!(
                "sink_run",
                key = %cmd.key,
                r#type = %cmd.kind,
                topic = %source.topic,
                partition = source.partition,
                offset = source.offset,
                trace_id = command_span.map(CommandSpan::trace_id),
                span_id = command_span.map(CommandSpan::span_id),
            );
            let ticket = claimed.ticket.take();
            async move {
                let sink = &self.route_sinks[cmd.route];
                let owner = self.changelog.as_deref();
                let run = SinkRun {
                    sink: sink.as_ref(),
                    claim: &claimed.claim,
                    command: cmd,
                    ticket,
                    owner,
                    span: command_span,
                };
                let end = run_with_retry(run, &self.retry, &self.limiter, cancel).await;
                Ran { claimed, end }
            }
            .instrument(span)
        });
        futures::future::join_all(runs).await
    }
}
