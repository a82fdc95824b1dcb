//! Sink calls as metrics: every configured sink is wrapped so that each call counts in
//! `sink_requests_total{sink,status}` and `sink_duration_seconds{sink}`, whatever its kind.

use std::sync::Arc;
use std::time::Instant;

use crate::ops::Metrics;
use crate::ops::metrics::SINK_STATUSES;
use crate::sinks::circuit::Circuit;
use crate::sinks::{Sink, SinkError, SinkOutput, SinkRequest};

/// A sink that reports each call to the metrics.
pub struct MeteredSink {
    inner: Arc<dyn Sink>,
    metrics: Arc<Metrics>,
}

impl MeteredSink {
    /// Wraps `inner`.
    pub fn wrap(inner: Arc<dyn Sink>, metrics: Arc<Metrics>) -> Arc<dyn Sink> {
        Arc::new(MeteredSink { inner, metrics })
    }
}

#[async_trait::async_trait]
impl Sink for MeteredSink {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn forwards_key(&self) -> bool {
        self.inner.forwards_key()
    }

    fn circuit(&self) -> Option<&Circuit> {
        self.inner.circuit()
    }

    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        let started = Instant::now();
        let result = self.inner.execute(request).await;
        let [ok, transient, permanent] = SINK_STATUSES;
        let status = match &result {
            Ok(_) => ok,
            Err(SinkError::Transient { .. }) => transient,
            Err(SinkError::Permanent { .. }) => permanent,
        };
        self.metrics.sink_request(self.inner.name(), status, started.elapsed().as_secs_f64());
        result
    }
}
