//! Run the sinks: every durable claim of the round through its sink at the same time
//! (bounded by `max_in_flight` inside [`run_with_retry`]), each run in a span that carries
//! the command's identity (with traces on, also its trace and span id, for the logs).

use futures::{FutureExt, StreamExt, stream::FuturesUnordered};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::claim::Claimed;
use super::retry::{RunEnd, SinkRun, run_with_retry};
use super::ticket::Ticket;
use super::{Engine, Item};
use crate::store::Record;
use crate::telemetry::CommandSpan;

/// A claim whose sink run ended.
pub(super) struct Ran<'a> {
    /// The claim.
    pub(super) claimed: Claimed<'a>,
    /// How the run ended.
    pub(super) end: RunEnd,
    /// When it ended, Unix ms: for a run that got an answer, when its sink answered (the
    /// result's `completed_at`, docs/contract.md §5), not when the round's last run did.
    pub(super) ended_at_ms: i64,
}

impl Engine {
    /// Runs the sink of each claim in `claimed` until it answers, gives up or `cancel`
    /// fires; returns them in the same order (made as they are taken: a round's claims are
    /// hundreds of KiB, not worth copying once more).
    pub(super) async fn run_sinks<'a>(
        &self,
        items: &'a [Item],
        mut claimed: Vec<Claimed<'a>>,
        cancel: &CancellationToken,
    ) -> impl ExactSizeIterator<Item = Ran<'a>> + use<'a> {
        // Each run borrows its claim and yields only its end and position: a round runs
        // thousands of them at once, and moving each claim through its future and back (or
        // gathering ends in input order as `join_all` does) cost more than the runs of a
        // sink that answers at once (docs/performance-notes.md, "The engine's own CPU per command").
        let mut ends = Vec::with_capacity(claimed.len());
        let mut runs: FuturesUnordered<_> = claimed
            .iter_mut()
            .enumerate()
            .map(|(at, claimed)| {
                let ticket = claimed.ticket.take();
                self.run_one(&items[claimed.head.index], &*claimed, ticket, cancel).map(move |end| (at, end))
            })
            .collect();
        while let Some((at, end)) = runs.next().await {
            ends.push((at, end, self.clock.now_ms()));
        }
        drop(runs);
        ends.sort_unstable_by_key(|&(at, _, _)| at);
        claimed.into_iter().zip(ends).map(|(claimed, (_, end, ended_at_ms))| Ran { claimed, end, ended_at_ms })
    }

    /// Runs the sink of one claim (its first call on `ticket`), in a span that carries the
    /// command's identity: everything the run logs (retries, the sink's own events) has it.
    fn run_one<'r>(
        &'r self,
        item: &'r Item,
        claimed: &'r Claimed<'_>,
        ticket: Option<Ticket<'r>>,
        cancel: &'r CancellationToken,
    ) -> impl Future<Output = RunEnd> + 'r {
        let cmd = claimed.head.command;
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
        let run = SinkRun {
            sink: self.route_sinks[cmd.route].as_ref(),
            claim: &claimed.claim,
            command: cmd,
            ticket,
            owner: self.changelog.as_deref(),
            span: command_span,
            orphan: match &claimed.previous {
                Some(Record::InProgress(orphan)) => Some(orphan),
                _ => None,
            },
            clock: self.clock.as_ref(),
        };
        run_with_retry(run, &self.retry, &self.limiter, cancel).instrument(span)
    }
}
