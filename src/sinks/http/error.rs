//! Why an `http` sink could not be built from its config (at start-up, after validation).

/// Why an `http` sink could not be built from its config.
#[derive(Debug, thiserror::Error)]
pub enum HttpSinkError {
    /// The URL does not parse, or is not `http://` / `https://`.
    #[error("sink `{sink}`: url `{url}` is not usable: {reason}")]
    InvalidUrl {
        /// The sink instance.
        sink: String,
        /// The configured URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `request_timeout` is zero.
    #[error("sink `{sink}`: request_timeout must be positive")]
    ZeroTimeout {
        /// The sink instance.
        sink: String,
    },
    /// An environment variable the config names is unset or empty.
    #[error("sink `{sink}`: environment variable {var} (for {purpose}) is not set")]
    MissingEnv {
        /// The sink instance.
        sink: String,
        /// The variable.
        var: String,
        /// What it was for (`header \`X-Api-Key\``, `auth.bearer_env`).
        purpose: String,
    },
    /// A header, auth or template setting is unusable.
    #[error("sink `{sink}`: {key}: {reason}")]
    Config {
        /// The sink instance.
        sink: String,
        /// The key under the sink's table.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// reqwest refused to build the client (e.g. the TLS backend failed to initialise).
    #[error("sink `{sink}`: cannot build the HTTP client: {source}")]
    Client {
        /// The sink instance.
        sink: String,
        /// The underlying error.
        #[source]
        source: reqwest::Error,
    },
}
