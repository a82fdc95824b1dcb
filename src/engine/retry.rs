//! Running one durable claim through its sink: transient failures are retried with
//! exponential backoff and jitter, reusing the same key; permanent ones end it.

mod check;
mod config;
pub use config::RetryConfig;

use check::{Asking, Checked};

use std::time::Duration;

use serde_json::Value;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_util::sync::CancellationToken;

use super::ChangeLog;
use super::ticket::Ticket;
use crate::envelope::Command;
use crate::sinks::circuit::{Admission, Verdict};
use crate::sinks::limit::LimitPermit;
use crate::sinks::{CallAnswer, CallWatch, Sink, SinkError, SinkOutput, SinkRequest};
use crate::store::{DurableClaim, InProgress, Settled};
use crate::telemetry::{CommandSpan, SinkCallSpan};
use crate::time::Clock;

/// How a sink run ended.
#[derive(Debug)]
pub(super) enum RunEnd {
    /// The sink succeeded on attempt `attempts`, or its check found the effect (`settled`).
    Succeeded { result: Value, attempts: u32, settled: Option<Settled> },
    /// Permanent failure, or transient failures until `retry.max_attempts`.
    Failed { result: Value, error: String, attempts: u32, settled: Option<Settled> },
    /// Cancelled, and no call can have reached the sink without an answer: none was made,
    /// every one was refused before its request left, or the receiver answered it with a
    /// failure the run would have retried (see [`crate::sinks::CallWatch`]). The claim can be
    /// released: the next owner's run is the retry this one would have made.
    Releasable,
    /// Cancelled after at least one call that may have reached the sink, without an answer.
    Interrupted { attempts: u32 },
    /// A call that may have landed without an answer, for a sink that does not forward the
    /// key, and no check said the effect is absent: never called again blind
    /// (docs/contract.md §4). The key becomes `indeterminate`, `why` saying so.
    Indeterminate { why: String, attempts: u32 },
}

/// The wait before attempt `next` (2, 3, ...): `initial * 2^(next-2)`, capped, with the
/// upper half jittered so that retries of many keys spread out.
pub(super) fn backoff(retry: &RetryConfig, next: u32, retry_after: Option<Duration>) -> Duration {
    let exp = next.saturating_sub(2).min(30);
    let base = retry.initial_backoff.saturating_mul(1u32 << exp).min(retry.max_backoff);
    let half = base / 2;
    let jitter = if half.is_zero() { Duration::ZERO } else { half.mul_f64(rand::random_range(0.0..1.0)) };
    (half + jitter).max(retry_after.unwrap_or(Duration::ZERO).min(retry.max_backoff))
}

/// The calls of one run so far.
#[derive(Debug, Default)]
struct Tally {
    /// Sink calls made.
    calls: u32,
    /// Those that count toward `retry.max_attempts`.
    counted: u32,
    /// Those that may have reached the sink without an answer (neither certainly refused
    /// before sending nor answered).
    unanswered: u32,
    /// The last check that settled a doubt of this run (found, or absent and so called):
    /// kept with the completion, as how the key in doubt was settled.
    settled: Option<Settled>,
}

impl Tally {
    /// Counts a call that ended with `outcome`. Success or a permanent failure ends the run
    /// (`Err`, the circuit told the call was answered); a transient failure gives its
    /// message, the wait the receiver asked for, and the circuit's verdict on it.
    fn count(
        &mut self,
        watch: &CallWatch,
        outcome: Result<SinkOutput, SinkError>,
        admission: Option<Admission<'_>>,
    ) -> Result<(String, Option<Duration>, Option<Verdict>), RunEnd> {
        self.calls += 1;
        if !watch.never_sent() && !watch.answered() {
            self.unanswered += 1;
        }
        match outcome {
            Ok(result) => {
                if let Some(a) = admission {
                    a.answered();
                }
                Err(RunEnd::Succeeded { result, attempts: self.calls, settled: self.settled })
            }
            Err(SinkError::Permanent { message, result }) => {
                if let Some(a) = admission {
                    a.answered();
                }
                Err(RunEnd::Failed { result, error: message, attempts: self.calls, settled: self.settled })
            }
            Err(SinkError::Transient { message, retry_after }) => {
                Ok((message, retry_after, admission.map(Admission::failed_transiently)))
            }
        }
    }

    /// How the run ends when cancelled now.
    fn stopped(&self) -> RunEnd {
        if self.unanswered == 0 { RunEnd::Releasable } else { RunEnd::Interrupted { attempts: self.calls } }
    }
}

/// One durable claim to run through its sink.
pub(super) struct SinkRun<'a> {
    pub(super) sink: &'a Sink,
    pub(super) claim: &'a DurableClaim,
    pub(super) command: &'a Command,
    /// What the first call needs to start, taken before the claim (see `ticket`).
    pub(super) ticket: Option<Ticket<'a>>,
    /// With a changelog: asked before every call whether this instance still owns the
    /// key's state partition ([`ChangeLog::prove_owned`]).
    pub(super) owner: Option<&'a dyn ChangeLog>,
    /// With traces on: the command's span, the parent of each call's.
    pub(super) span: Option<&'a CommandSpan>,
    /// The claim a crash left in progress that this run took over, if it took one over.
    pub(super) orphan: Option<&'a InProgress>,
    /// When a check answered, for the record of how a key in doubt was settled.
    pub(super) clock: &'a dyn Clock,
}

/// Calls `sink` for `claim` until it succeeds, fails permanently, runs out of attempts, or
/// `cancel` fires: no call starts after that, also not one already waiting for a
/// `max_in_flight` permit, the sink's circuit or the sink's limits.
///
/// The first call goes on the ticket taken before the claim (`ticket`); each later call
/// waits for its own turn. With a circuit breaker on the sink ([`Sink::circuit`]), every
/// call first waits for the circuit; a transient failure while the circuit is open (or
/// that opens it) does not count toward `retry.max_attempts` (the sink is down, not this command, so the command waits for
/// the sink instead of being completed as `failed`), unless the circuit says this command
/// alone keeps it open ([`Verdict::Counted`] for a repeated failed probe). While waiting it
/// gives its `max_in_flight` permit back, so commands for healthy sinks keep going.
pub(super) async fn run_with_retry<'a>(
    run: SinkRun<'a>,
    retry: &RetryConfig,
    limiter: &'a Semaphore,
    cancel: &CancellationToken,
) -> RunEnd {
    let SinkRun { sink, claim, command, mut ticket, owner, span, orphan, clock } = run;
    let max = retry.max_attempts.get();
    // Calls an earlier run of this claim made before a crash count too: `retry.max_attempts`
    // bounds a command's calls in all (docs/contract.md §4), not each run's.
    let made_before = claim.record().attempts.saturating_sub(1);
    let mut tally = Tally::default();
    let mut permit = None;
    if let Some(orphan) = orphan.filter(|_| asks_first(sink)) {
        let asking = Asking { sink, claim, command, owner, attempt: made_before, clock };
        // Boxed, as every rarely taken wait here: a round holds thousands of runs.
        let turn = (&mut ticket, &mut permit);
        if let Some(end) = Box::pin(settle_orphan(asking, orphan, turn, &mut tally, cancel)).await {
            return end;
        }
    }
    loop {
        if cancel.is_cancelled() {
            return tally.stopped();
        }
        let Some((admission, limits)) = next_turn(&mut ticket, sink, claim, limiter, &mut permit, cancel).await else {
            return tally.stopped();
        };
        crate::crash::point("sink.admitted");
        if !still_owned(owner, claim).await {
            return tally.stopped();
        }
        let watch = CallWatch::new(cancel);
        let attempt = made_before + tally.calls + 1;
        let probe = admission.as_ref().is_some_and(Admission::is_probe);
        tracing::debug!(sink = sink.name(), attempt, probe, "sink call");
        let call = OneCall { sink, claim, command, attempt, span, watch: &watch, limits_taken: limits.is_some() };
        let outcome = call.run().await;
        // The sink's concurrency permit (if taken ahead) is held for the call only.
        drop(limits);
        if watch.never_sent() && cancel.is_cancelled() {
            // Given up before the call began (waiting for the sink's limits): no call, and
            // nothing for the circuit to learn.
            return tally.stopped();
        }
        let (message, retry_after, verdict) = match tally.count(&watch, outcome, admission) {
            Ok(transient) => transient,
            Err(end) => return end,
        };
        if watch.answer() == CallAnswer::Maybe && asks_first(sink) {
            // The request may have landed: ask the receiver before calling again, or stop.
            let asking = Asking { sink, claim, command, owner, attempt, clock };
            if let Some(end) = Box::pin(settle_maybe(asking, &message, &mut tally, cancel)).await {
                return end;
            }
        }
        if verdict == Some(Verdict::SinkDown) {
            tracing::warn!(key = claim.key(), attempt, error = %message,
                "transient sink failure with the sink's circuit open; waiting for the sink, not spending a retry");
            continue;
        }
        tally.counted += 1;
        let counted = made_before + tally.counted;
        if counted >= max {
            return RunEnd::Failed {
                result: Value::Object(Default::default()),
                error: format!("gave up after {counted} attempts: {message}"),
                attempts: tally.calls,
                settled: tally.settled,
            };
        }
        tracing::warn!(key = claim.key(), attempt, error = %message, "transient sink failure, retrying");
        let wait = backoff(retry, counted + 1, retry_after);
        // Boxed, as the turn of a retry is (`next_turn`): a round holds thousands of runs,
        // most of which never retry, and each would otherwise carry this wait's state.
        if !Box::pin(sleep_unless_cancelled(wait, cancel)).await {
            return tally.stopped();
        }
    }
}

/// Asks the receiver about the claim a crash left in progress, before any call: `Some` ends
/// the run, `None` lets it call (absent; or unsettled at a sink that forwards the key).
async fn settle_orphan<'a>(
    asking: Asking<'_>,
    orphan: &InProgress,
    (ticket, permit): (&mut Option<Ticket<'a>>, &mut Option<SemaphorePermit<'a>>),
    tally: &mut Tally,
    cancel: &CancellationToken,
) -> Option<RunEnd> {
    // The check waits for the sink's limits itself, so the ticket's are given back (its
    // `max_in_flight` permit is kept); the first call then takes its own turn.
    if let Some(Ticket { permit: taken, reservation }) = ticket.take() {
        *permit = Some(taken);
        drop(reservation);
    }
    let sink = asking.sink;
    match asking.settle(orphan_doubt(orphan, sink), cancel).await {
        Checked::Found(result, settled) => Some(RunEnd::Succeeded { result, attempts: 0, settled: Some(settled) }),
        Checked::Unsettled(why) if !sink.forwards_key() => Some(RunEnd::Indeterminate { why, attempts: 0 }),
        Checked::Absent(settled) => {
            tally.settled = Some(settled);
            None
        }
        Checked::Unsettled(_) => None,
        Checked::Stopped => Some(RunEnd::Releasable),
    }
}

/// Asks the receiver about a call that may have landed without an answer: `Some` ends the
/// run, `None` lets it call again (absent; or unsettled at a sink that forwards the key, the
/// next call carrying the key as it would without a check).
async fn settle_maybe(
    asking: Asking<'_>,
    message: &str,
    tally: &mut Tally,
    cancel: &CancellationToken,
) -> Option<RunEnd> {
    // Cancelled (a revoke, a shutdown): the claim stays `in_progress` for the crash rules,
    // settled by the partition's next owner (docs/contract.md §4).
    if cancel.is_cancelled() {
        return Some(tally.stopped());
    }
    let sink = asking.sink;
    let doubt = format!("the call may have reached sink `{}` without an answer ({message})", sink.name());
    match asking.settle(doubt, cancel).await {
        Checked::Found(result, settled) => {
            Some(RunEnd::Succeeded { result, attempts: tally.calls, settled: Some(settled) })
        }
        Checked::Absent(settled) => {
            tally.unanswered -= 1;
            tally.settled = Some(settled);
            None
        }
        Checked::Unsettled(why) if !sink.forwards_key() => Some(RunEnd::Indeterminate { why, attempts: tally.calls }),
        Checked::Unsettled(_) => None,
        Checked::Stopped => Some(tally.stopped()),
    }
}

/// Whether a command in doubt at `sink` (a call that may have landed, a claim a crash left)
/// is checked before any other call: always when the sink does not forward the key (with no
/// check it is then left `indeterminate`); when it does, only if it has a check, a record
/// found sparing the receiver a second copy it would have to drop by the key.
fn asks_first(sink: &Sink) -> bool {
    !sink.forwards_key() || sink.check_timing().is_some()
}

/// What is in doubt about a claim a crash left at `sink`, for the key's `why` and the log.
fn orphan_doubt(orphan: &InProgress, sink: &Sink) -> String {
    format!(
        "a call left in progress by a crash (claimed at {} by {}/{}/{}) may have reached sink `{}`",
        crate::time::rfc3339_ms(orphan.claimed_at_ms),
        orphan.source.topic,
        orphan.source.partition,
        orphan.source.offset,
        sink.name()
    )
}

/// Sleeps for `wait`; `false` when `cancel` fires first.
async fn sleep_unless_cancelled(wait: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        () = tokio::time::sleep(wait) => true,
        () = cancel.cancelled() => false,
    }
}

/// One call of a sink for a claim.
struct OneCall<'a> {
    sink: &'a Sink,
    claim: &'a DurableClaim,
    command: &'a Command,
    /// As the sink sees it (crash re-runs counted).
    attempt: u32,
    /// With traces on: the command's span.
    span: Option<&'a CommandSpan>,
    watch: &'a CallWatch,
    /// The caller holds the sink's limits for it.
    limits_taken: bool,
}

impl OneCall<'_> {
    /// Makes the call; with traces on in a span of its own, whose context the call passes
    /// on (else the input's).
    async fn run(self) -> Result<SinkOutput, SinkError> {
        let OneCall { sink, claim, command, attempt, span, watch, limits_taken } = self;
        let call_span = span.map(|s| s.sink_call(sink.name(), attempt));
        let call_trace = call_span.as_ref().map(SinkCallSpan::headers);
        let (traceparent, tracestate) = match &call_trace {
            Some(t) => (t.traceparent.as_deref(), t.tracestate.as_deref()),
            None => (command.traceparent.as_deref(), command.tracestate.as_deref()),
        };
        let mut request = SinkRequest::new(claim, &command.kind, &command.payload, attempt, traceparent)
            .with_tracestate(tracestate)
            .watched_by(watch);
        if limits_taken {
            request = request.with_limits_taken();
        }
        let outcome = sink.execute(request).await;
        if let Some(call) = call_span {
            call.end(outcome.as_ref().err().map(ToString::to_string).as_deref());
        }
        outcome
    }
}

/// Whether this instance may call the sink for `claim`: always without a changelog; with
/// one, once it has proved it still owns the key's state partition.
async fn still_owned(owner: Option<&dyn ChangeLog>, claim: &DurableClaim) -> bool {
    let Some(owner) = owner else { return true };
    match owner.prove_owned().await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(key = claim.key(), error = %e, "no sink call: this instance could not prove it still owns the key's state partition");
            false
        }
    }
}

/// What the next call goes on: the ticket taken before the claim for the first call, its
/// own turn for a retry (see [`take_turn`]). `None` when `cancel` fired.
async fn next_turn<'a>(
    ticket: &mut Option<Ticket<'a>>,
    sink: &'a Sink,
    claim: &DurableClaim,
    limiter: &'a Semaphore,
    permit: &mut Option<SemaphorePermit<'a>>,
    cancel: &CancellationToken,
) -> Option<(Option<Admission<'a>>, Option<LimitPermit<'a>>)> {
    match ticket.take() {
        Some(Ticket { permit: taken, reservation }) => {
            *permit = Some(taken);
            Some((reservation.admission, reservation.limits))
        }
        // Boxed: only a retry waits for its turn here, and the wait's state (the circuit's,
        // the permit's) would otherwise make every run's future about twice as large.
        None => match Box::pin(take_turn(sink, claim, limiter, permit, cancel)).await {
            Turn::Go(admission) if !cancel.is_cancelled() => Some((admission, None)),
            _ => None,
        },
    }
}

/// Whether a call may go.
enum Turn<'c> {
    /// It may, admitted by the sink's circuit when it has one.
    Go(Option<Admission<'c>>),
    /// `cancel` fired while waiting.
    Cancelled,
}

/// Waits for the sink's circuit (when it has one) and then for a `max_in_flight` permit.
/// While the circuit is not closed the permit is given back, so that commands for healthy
/// sinks keep going.
async fn take_turn<'c, 'l>(
    sink: &'c Sink,
    claim: &DurableClaim,
    limiter: &'l Semaphore,
    permit: &mut Option<SemaphorePermit<'l>>,
    cancel: &CancellationToken,
) -> Turn<'c> {
    let admission = match sink.circuit() {
        None => None,
        Some(c) => {
            if !c.is_closed() {
                *permit = None;
                tracing::debug!(key = claim.key(), sink = sink.name(), "waiting for the sink's circuit");
            }
            tokio::select! {
                biased;
                () = cancel.cancelled() => return Turn::Cancelled,
                a = c.admit(claim.key()) => Some(a),
            }
        }
    };
    if permit.is_none() {
        *permit = tokio::select! {
            biased;
            () = cancel.cancelled() => return Turn::Cancelled,
            p = limiter.acquire() => p.ok(),
        };
    }
    Turn::Go(admission)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;

    #[test]
    fn backoff_doubles_within_jitter_and_is_capped() {
        let r = RetryConfig {
            max_attempts: NonZeroU32::new(10).unwrap(),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
        };
        for _ in 0..100 {
            let b2 = backoff(&r, 2, None);
            assert!(b2 >= Duration::from_millis(50) && b2 <= Duration::from_millis(100), "{b2:?}");
            let b3 = backoff(&r, 3, None);
            assert!(b3 >= Duration::from_millis(100) && b3 <= Duration::from_millis(200), "{b3:?}");
            let b20 = backoff(&r, 20, None);
            assert!(b20 >= Duration::from_millis(500) && b20 <= Duration::from_secs(1), "{b20:?}");
        }
        assert!(backoff(&r, 2, Some(Duration::from_millis(700))) >= Duration::from_millis(700));
        assert!(backoff(&r, 2, Some(Duration::from_secs(60))) <= Duration::from_secs(1));
    }
}
