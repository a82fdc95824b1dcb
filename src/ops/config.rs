//! The `[http]` section: the one listener for metrics, health and the admin API.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::problems::Problems;

/// HTTP listener settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address of the one listener (`/metrics`, `/healthz`, `/readyz`, `/v1/keys`).
    pub listen: SocketAddr,
    /// Bearer token for the admin API under `/v1` (docs/admin.md); the admin API is off
    /// (404) when unset.
    pub admin_token: Option<String>,
}

impl HttpConfig {
    /// `[http]`'s values, keys under `problems`' `http`.
    pub fn validate(&self, problems: &mut Problems) {
        if let Some(token) = &self.admin_token
            && token.len() < 16
        {
            problems.add("admin_token", "(hidden)", "must be at least 16 characters");
        }
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self { listen: SocketAddr::from(([127, 0, 0, 1], 9464)), admin_token: None }
    }
}
