//! [`SinkRequest`]: what a sink gets for one call, built only from a durable claim; and
//! [`CallWatch`]: what the caller learns of the call (did the request leave, was it
//! answered), which [`CallAnswer`] names.

use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::store::DurableClaim;

/// What a sink gets. Outside unit tests the only way to build one is [`SinkRequest::new`],
/// which needs a [`DurableClaim`]: no sink can run before its claim reached the disk.
#[derive(Debug, Clone, Copy)]
pub struct SinkRequest<'a> {
    key: &'a str,
    kind: &'a str,
    payload: &'a Value,
    attempt: u32,
    traceparent: Option<&'a str>,
    tracestate: Option<&'a str>,
    watch: Option<&'a CallWatch>,
    /// The caller holds what the sink's limits ask for this call (see [`Sink::try_reserve`](super::Sink::try_reserve)).
    limits_taken: bool,
    /// When the key was first claimed (Unix ms), `None` without a claim (unit tests).
    claimed_at_ms: Option<i64>,
}

/// The caller's side of one sink call: its cancellation, which the call observes while it
/// waits for the sink's limits, and what the sink learnt of whether the request left and
/// was answered.
///
/// A sink that can tell its request certainly never reached the receiver (the connection
/// was refused, the name did not resolve, the caller gave up before the call began) says
/// so with [`SinkRequest::never_sent`]; one whose receiver answered the request says so
/// with [`SinkRequest::answered`]. Saying nothing means "it may have arrived, unanswered".
/// The engine releases a claim none of whose calls may have arrived unanswered, so a sink
/// must never say `never_sent` after any byte of the request may have gone out, nor
/// `answered` before the receiver's answer came.
#[derive(Debug, Default)]
pub struct CallWatch {
    cancel: CancellationToken,
    never_sent: AtomicBool,
    answered: AtomicBool,
}

impl CallWatch {
    /// A watch for one call made on behalf of a caller that gives up when `cancel` fires.
    pub fn new(cancel: &CancellationToken) -> CallWatch {
        CallWatch { cancel: cancel.clone(), never_sent: AtomicBool::new(false), answered: AtomicBool::new(false) }
    }

    /// Whether the sink said this call certainly never reached the receiver.
    pub fn never_sent(&self) -> bool {
        self.never_sent.load(Ordering::Acquire)
    }

    /// Whether the sink said the receiver answered this call.
    pub fn answered(&self) -> bool {
        self.answered.load(Ordering::Acquire)
    }

    /// How the call ended as far as the receiver is concerned, from what the sink said.
    pub fn answer(&self) -> CallAnswer {
        if self.answered() {
            CallAnswer::Answered
        } else if self.never_sent() {
            CallAnswer::NeverSent
        } else {
            CallAnswer::Maybe
        }
    }
}

/// How one sink call ended as far as its receiver is concerned (docs/contract.md §4, "Calls
/// without an answer"). Every call ends as exactly one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallAnswer {
    /// The receiver answered: success, a permanent failure, or a transient failure it
    /// answered (an HTTP 503, an SMTP 4xx, a program's exit code).
    Answered,
    /// Refused before the request left: the receiver never saw it (connection refused,
    /// connect timeout, DNS, TLS handshake, a program that could not start).
    NeverSent,
    /// Sent without an answer: the effect may exist (a timeout after the request was
    /// written, a reset while waiting, a program killed by its timeout, SMTP after DATA, a
    /// Kafka delivery whose outcome is unknown).
    Maybe,
}

impl CallAnswer {
    /// Every answer, for metrics initialisation.
    pub const ALL: [CallAnswer; 3] = [CallAnswer::Answered, CallAnswer::NeverSent, CallAnswer::Maybe];

    /// The `answer` label of `dedupd_sink_calls_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            CallAnswer::Answered => "answered",
            CallAnswer::NeverSent => "never_sent",
            CallAnswer::Maybe => "maybe",
        }
    }
}

impl<'a> SinkRequest<'a> {
    /// A request for a durable claim; the key is the claim's.
    pub fn new(
        claim: &'a DurableClaim,
        kind: &'a str,
        payload: &'a Value,
        attempt: u32,
        traceparent: Option<&'a str>,
    ) -> SinkRequest<'a> {
        SinkRequest::of(claim.key(), kind, payload, attempt, Some(claim.record().claimed_at_ms))
            .with_traceparent(traceparent)
    }

    /// The request's fields, no trace context, unwatched. Private to `sinks`: outside it a
    /// request for a call needs a durable claim ([`SinkRequest::new`]).
    pub(super) fn of(
        key: &'a str,
        kind: &'a str,
        payload: &'a Value,
        attempt: u32,
        claimed_at_ms: Option<i64>,
    ) -> SinkRequest<'a> {
        SinkRequest {
            key,
            kind,
            payload,
            attempt,
            traceparent: None,
            tracestate: None,
            watch: None,
            limits_taken: false,
            claimed_at_ms,
        }
    }

    /// The same request, passing on `traceparent`.
    fn with_traceparent(self, traceparent: Option<&'a str>) -> SinkRequest<'a> {
        SinkRequest { traceparent, ..self }
    }

    /// The same request, passing on `tracestate` with its `traceparent`.
    pub fn with_tracestate(self, tracestate: Option<&'a str>) -> SinkRequest<'a> {
        SinkRequest { tracestate, ..self }
    }

    /// The same request, watched by `watch` (see [`CallWatch`]).
    pub fn watched_by(self, watch: &'a CallWatch) -> SinkRequest<'a> {
        SinkRequest { watch: Some(watch), ..self }
    }

    /// The same request, for a call whose caller holds a [`Reservation`](super::Reservation) of the sink's
    /// limits: it does not wait for them again.
    pub fn with_limits_taken(self) -> SinkRequest<'a> {
        SinkRequest { limits_taken: true, ..self }
    }

    /// Whether the caller took the sink's limits for this call already.
    pub fn limits_taken(&self) -> bool {
        self.limits_taken
    }

    /// Resolves once the caller has given up on this call; never for an unwatched request.
    /// For waits before the call begins (limits): a call under way is left to end.
    pub async fn given_up(&self) {
        match self.watch {
            Some(watch) => watch.cancel.cancelled().await,
            None => std::future::pending().await,
        }
    }

    /// Tells the caller that this call certainly never reached the receiver.
    pub fn never_sent(&self) {
        if let Some(watch) = self.watch {
            watch.never_sent.store(true, Ordering::Release);
        }
    }

    /// Tells the caller that the receiver answered this call (whatever the answer): its
    /// outcome is known, so it is not one a cancel leaves in doubt.
    pub fn answered(&self) {
        if let Some(watch) = self.watch {
            watch.answered.store(true, Ordering::Release);
        }
    }

    /// How the call ended as far as the receiver is concerned, once the sink returned; `None`
    /// for an unwatched request.
    pub fn call_answer(&self) -> Option<CallAnswer> {
        self.watch.map(CallWatch::answer)
    }

    /// A request without a claim, for the sinks' unit tests (which have no store).
    #[cfg(test)]
    pub(crate) fn unclaimed(
        key: &'a str,
        kind: &'a str,
        payload: &'a Value,
        attempt: u32,
        traceparent: Option<&'a str>,
    ) -> SinkRequest<'a> {
        SinkRequest::of(key, kind, payload, attempt, None).with_traceparent(traceparent)
    }

    /// The idempotency key.
    pub fn key(&self) -> &'a str {
        self.key
    }

    /// The command type.
    pub fn kind(&self) -> &'a str {
        self.kind
    }

    /// The payload.
    pub fn payload(&self) -> &'a Value {
        self.payload
    }

    /// 1 for the first run of this claim; higher for retries and crash re-runs.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// W3C `traceparent` to pass on, if any: the input's, or with traces on the one naming
    /// this call's span.
    pub fn traceparent(&self) -> Option<&'a str> {
        self.traceparent
    }

    /// W3C `tracestate` to pass on with [`traceparent`](Self::traceparent), if any.
    pub fn tracestate(&self) -> Option<&'a str> {
        self.tracestate
    }

    /// When the key was first claimed, Unix ms (a re-run keeps its first claim's time): a
    /// check looks for the effect from then on. `None` for a request without a claim.
    pub fn claimed_at_ms(&self) -> Option<i64> {
        self.claimed_at_ms
    }
}
