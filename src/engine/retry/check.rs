//! Asking the receiver ("check before writing", docs/contract.md §4): a call that may have
//! landed without an answer, or a claim a crash left in progress, is settled by the sink's
//! check. A sink that does not forward the key is never called again blind; one that does
//! is called again with the key unless the check found the effect.

use tokio_util::sync::CancellationToken;

use super::{sleep_unless_cancelled, still_owned};
use crate::engine::ChangeLog;
use crate::envelope::Command;
use crate::sinks::{CallWatch, CheckAnswer, Sink, SinkRequest};
use crate::store::{DurableClaim, Settled, SettledBy};
use crate::time::Clock;
use serde_json::Value;

/// What the receiver's check made of a command in doubt.
pub(super) enum Checked {
    /// The effect exists: this is what the receiver holds for it (and when it said so).
    Found(Value, Settled),
    /// The receiver said the effect is absent (when it said so): the command may be called.
    Absent(Settled),
    /// No check, or it did not tell, for this reason: the key becomes `indeterminate`, or,
    /// at a sink that forwards the key, is called again with it.
    Unsettled(String),
    /// Cancelled, or this instance no longer owns the key, before the check answered.
    Stopped,
}

/// A command in doubt at its sink, whose claim this run holds.
pub(super) struct Asking<'a> {
    pub(super) sink: &'a Sink,
    pub(super) claim: &'a DurableClaim,
    pub(super) command: &'a Command,
    pub(super) owner: Option<&'a dyn ChangeLog>,
    /// The attempt number the check's request carries (the last call's).
    pub(super) attempt: u32,
    /// When the check answered.
    pub(super) clock: &'a dyn Clock,
}

impl Asking<'_> {
    /// Asks the sink's receiver, with its check after `check.delay`, whether the effect of
    /// the command exists; without a check it stays in doubt. `doubt` says what is in
    /// doubt, for the key's `why` and the log.
    pub(super) async fn settle(self, doubt: String, cancel: &CancellationToken) -> Checked {
        let Asking { sink, claim, command, owner, attempt, clock } = self;
        let name = sink.name();
        let Some(timing) = sink.check_timing() else {
            tracing::warn!(
                key = claim.key(),
                sink = name,
                doubt,
                "the sink does not forward the key and has no check: the key is indeterminate"
            );
            return Checked::Unsettled(format!(
                "{doubt}; the sink does not forward the key and has no check, so it is not called again"
            ));
        };
        tracing::info!(key = claim.key(), sink = name, doubt, delay = %humantime::format_duration(timing.delay),
            "checking with the receiver before any other call");
        // The delay lets a request still being processed at the receiver land first; the
        // check then runs only while this instance still owns the key (fencing).
        if !sleep_unless_cancelled(timing.delay, cancel).await || !still_owned(owner, claim).await {
            return Checked::Stopped;
        }
        let watch = CallWatch::new(cancel);
        let request = SinkRequest::new(claim, &command.kind, &command.payload, attempt, command.traceparent.as_deref())
            .with_tracestate(command.tracestate.as_deref())
            .watched_by(&watch);
        match sink.check(request).await {
            CheckAnswer::Found(result) => {
                tracing::info!(key = claim.key(), sink = name, "check: the effect exists; the command succeeded");
                Checked::Found(result, Settled::new(SettledBy::CheckFound, clock.now_ms()))
            }
            CheckAnswer::Absent => {
                tracing::info!(key = claim.key(), sink = name, "check: the effect is absent; calling");
                Checked::Absent(Settled::new(SettledBy::CheckAbsent, clock.now_ms()))
            }
            CheckAnswer::Unknown(why) | CheckAnswer::Error(why) if cancel.is_cancelled() => {
                tracing::debug!(key = claim.key(), sink = name, why, "check given up");
                Checked::Stopped
            }
            CheckAnswer::Unknown(why) | CheckAnswer::Error(why) if sink.forwards_key() => {
                tracing::warn!(
                    key = claim.key(),
                    sink = name,
                    why,
                    "check did not tell whether the effect exists: calling again with the key"
                );
                Checked::Unsettled(why)
            }
            CheckAnswer::Unknown(why) | CheckAnswer::Error(why) => {
                tracing::warn!(
                    key = claim.key(),
                    sink = name,
                    why,
                    "check did not tell whether the effect exists: the key is indeterminate"
                );
                Checked::Unsettled(format!(
                    "{doubt}, and its check did not tell whether the effect exists ({why}); the sink does not forward the key, so it is not called again"
                ))
            }
        }
    }
}
