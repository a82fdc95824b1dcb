//! Sink calls as metrics: every configured sink is wrapped so that each call counts in
//! `sink_requests_total{sink,status}`, `sink_calls_total{sink,answer}` and
//! `sink_duration_seconds{sink}`, and each check in `checks_total{sink,answer}`, whatever
//! its kind.

use std::sync::Arc;
use std::time::Instant;

use crate::ops::Metrics;
use crate::ops::metrics::SINK_STATUSES;
use crate::sinks::{CheckAnswer, Sink, SinkEffect, SinkError, SinkOutput, SinkRequest};

/// A sink's effect that reports each call to the metrics.
pub struct MeteredEffect {
    sink: String,
    inner: Arc<dyn SinkEffect>,
    metrics: Arc<Metrics>,
}

impl MeteredEffect {
    /// `sink` with every call reported (the time spent waiting for its limits included).
    pub fn wrap(sink: Sink, metrics: Arc<Metrics>) -> Sink {
        let name = sink.name().to_string();
        sink.wrap_effect(|inner| Arc::new(MeteredEffect { sink: name, inner, metrics }))
    }
}

#[async_trait::async_trait]
impl SinkEffect for MeteredEffect {
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        let started = Instant::now();
        crate::crash::point("sink.call");
        let result = self.inner.execute(request).await;
        crate::crash::point("sink.returned");
        let [ok, transient, permanent] = SINK_STATUSES;
        let status = match &result {
            Ok(_) => ok,
            Err(SinkError::Transient { .. }) => transient,
            Err(SinkError::Permanent { .. }) => permanent,
        };
        self.metrics.sink_request(&self.sink, status, started.elapsed().as_secs_f64());
        if let Some(answer) = request.call_answer() {
            self.metrics.sink_call(&self.sink, answer);
        }
        result
    }

    async fn check(&self, request: SinkRequest<'_>) -> CheckAnswer {
        let answer = self.inner.check(request).await;
        self.metrics.check(&self.sink, answer.label());
        answer
    }
}
