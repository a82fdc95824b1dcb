//! Running one durable claim through its sink: transient failures are retried with
//! exponential backoff and jitter, reusing the same key; permanent ones end it.

use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::config::RetryConfig;
use crate::envelope::Command;
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
pub(super) async fn run_with_retry(
    sink: &dyn Sink,
    claim: &DurableClaim,
    command: &Command,
    retry: &RetryConfig,
    cancel: &CancellationToken,
) -> RunEnd {
    let max = retry.max_attempts.get();
    let mut attempt = 1u32;
    loop {
        if cancel.is_cancelled() {
            return if attempt == 1 { RunEnd::NeverRan } else { RunEnd::Interrupted { attempts: attempt - 1 } };
        }
        let request = SinkRequest::new(
            claim,
            &command.kind,
            &command.payload,
            claim.record().attempts.saturating_sub(1) + attempt,
            command.traceparent.as_deref(),
        );
        match sink.execute(request).await {
            Ok(result) => return RunEnd::Succeeded { result, attempts: attempt },
            Err(SinkError::Permanent { message, result }) => {
                return RunEnd::Failed { result, error: message, attempts: attempt };
            }
            Err(SinkError::Transient { message, retry_after }) => {
                if attempt >= max {
                    return RunEnd::Failed {
                        result: Value::Object(Default::default()),
                        error: format!("gave up after {attempt} attempts: {message}"),
                        attempts: attempt,
                    };
                }
                tracing::warn!(key = claim.key(), attempt, error = %message, "transient sink failure, retrying");
                attempt += 1;
                let wait = backoff(retry, attempt, retry_after);
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = cancel.cancelled() => return RunEnd::Interrupted { attempts: attempt - 1 },
                }
            }
        }
    }
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
