//! The `[retry]` section: how transient sink failures are retried.

use std::num::NonZeroU32;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::problems::Problems;

/// Retry settings for transient sink failures.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Attempts in all, the first included.
    pub max_attempts: NonZeroU32,
    /// Backoff before the second attempt; doubles each time, with jitter.
    #[serde(with = "humantime_serde")]
    pub initial_backoff: Duration,
    /// Upper bound on one backoff.
    #[serde(with = "humantime_serde")]
    pub max_backoff: Duration,
}

impl RetryConfig {
    /// `[retry]`'s values, keys under `problems`' `retry`.
    pub fn validate(&self, problems: &mut Problems) {
        if self.initial_backoff.is_zero() {
            // Doubling zero stays zero: every retry would follow its failure at once.
            problems.add("initial_backoff", "0s", "must be positive");
        }
        if self.max_backoff < self.initial_backoff {
            problems.add(
                "max_backoff",
                humantime::format_duration(self.max_backoff),
                "must be at least retry.initial_backoff",
            );
        }
    }
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_attempts: NonZeroU32::new(5).unwrap_or(NonZeroU32::MIN),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(30),
        }
    }
}
