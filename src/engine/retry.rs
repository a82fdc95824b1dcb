//! Running one durable claim through its sink: transient failures are retried with
//! exponential backoff and jitter, reusing the same key; permanent ones end it.

mod config;
pub use config::RetryConfig;

use std::time::Duration;

use serde_json::Value;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_util::sync::CancellationToken;

use crate::envelope::Command;
use crate::sinks::circuit::{Admission, Verdict};
use crate::sinks::{Sink, SinkError, SinkRequest};
use crate::store::DurableClaim;

/// How a sink run ended.
#[derive(Debug)]
pub(super) enum RunEnd {
    /// The sink succeeded on attempt `attempts`.
    Succeeded { result: Value, attempts: u32 },
    /// Permanent failure, or transient failures until `retry.max_attempts`.
    Failed { result: Value, error: String, attempts: u32 },
    /// Cancelled before the first call: the sink never ran.
    NeverRan,
    /// Cancelled after at least one call without a definite answer.
    Interrupted { attempts: u32 },
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

/// Calls `sink` for `claim` until it succeeds, fails permanently, runs out of attempts, or
/// `cancel` fires (no call starts after that).
///
/// With a circuit breaker on the sink ([`Sink::circuit`]), every call first waits for the
/// circuit; a transient failure while the circuit is open (or that opens it) does not count
/// toward `retry.max_attempts`: the sink is down, not this command, so the command waits for
/// the sink instead of being completed as `failed`. While waiting it gives its
/// `max_in_flight` permit back, so commands for healthy sinks keep going.
pub(super) async fn run_with_retry(
    sink: &Sink,
    claim: &DurableClaim,
    command: &Command,
    retry: &RetryConfig,
    limiter: &Semaphore,
    cancel: &CancellationToken,
) -> RunEnd {
    let max = retry.max_attempts.get();
    // Sink calls made, and those of them that count toward `max`.
    let mut calls = 0u32;
    let mut counted = 0u32;
    let stopped = |calls: u32| if calls == 0 { RunEnd::NeverRan } else { RunEnd::Interrupted { attempts: calls } };
    // The semaphore is never closed; if it were, going on unlimited beats stalling.
    let mut permit = limiter.acquire().await.ok();
    loop {
        if cancel.is_cancelled() {
            return stopped(calls);
        }
        let Turn::Go(admission) = take_turn(sink, claim, limiter, &mut permit, cancel).await else {
            return stopped(calls);
        };
        calls += 1;
        let request = SinkRequest::new(
            claim,
            &command.kind,
            &command.payload,
            claim.record().attempts.saturating_sub(1) + calls,
            command.traceparent.as_deref(),
        );
        tracing::debug!(
            sink = sink.name(),
            attempt = calls,
            probe = admission.as_ref().is_some_and(|a| a.is_probe()),
            "sink call"
        );
        let (message, retry_after) = match sink.execute(request).await {
            Ok(result) => {
                if let Some(a) = admission {
                    a.answered();
                }
                return RunEnd::Succeeded { result, attempts: calls };
            }
            Err(SinkError::Permanent { message, result }) => {
                if let Some(a) = admission {
                    a.answered();
                }
                return RunEnd::Failed { result, error: message, attempts: calls };
            }
            Err(SinkError::Transient { message, retry_after }) => (message, retry_after),
        };
        if admission.map(Admission::failed_transiently) == Some(Verdict::SinkDown) {
            tracing::warn!(key = claim.key(), attempt = calls, error = %message,
                "transient sink failure with the sink's circuit open; waiting for the sink, not spending a retry");
            continue;
        }
        counted += 1;
        if counted >= max {
            return RunEnd::Failed {
                result: Value::Object(Default::default()),
                error: format!("gave up after {counted} attempts: {message}"),
                attempts: calls,
            };
        }
        tracing::warn!(key = claim.key(), attempt = calls, error = %message, "transient sink failure, retrying");
        let wait = backoff(retry, counted + 1, retry_after);
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = cancel.cancelled() => return RunEnd::Interrupted { attempts: calls },
        }
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
                a = c.admit() => Some(a),
                () = cancel.cancelled() => return Turn::Cancelled,
            }
        }
    };
    if permit.is_none() {
        *permit = tokio::select! {
            p = limiter.acquire() => p.ok(),
            () = cancel.cancelled() => return Turn::Cancelled,
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
