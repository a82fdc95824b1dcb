//! The `http` sink: JSON POST with `Idempotency-Key`. Not written yet beyond its config.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Config of an `http` sink.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSinkConfig {
    /// Where to POST.
    pub url: String,
    /// Whether the receiver honours `Idempotency-Key` (then crash re-runs are safe).
    #[serde(default = "default_true")]
    pub forward_key: bool,
    /// TCP connect timeout.
    #[serde(default = "default_connect_timeout", with = "crate::config::duration_str")]
    pub connect_timeout: Duration,
    /// Whole-request timeout.
    #[serde(default = "default_request_timeout", with = "crate::config::duration_str")]
    pub request_timeout: Duration,
}

fn default_true() -> bool {
    true
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(2)
}
fn default_request_timeout() -> Duration {
    Duration::from_secs(10)
}

impl HttpSinkConfig {
    /// Checks the URL.
    pub fn validate(&self, at: &str) -> Result<(), (String, String, String)> {
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return Err((format!("{at}.url"), self.url.clone(), "must start with http:// or https://".into()));
        }
        if self.request_timeout.is_zero() {
            return Err((format!("{at}.request_timeout"), "0s".into(), "must be positive".into()));
        }
        Ok(())
    }
}
