//! OpenTelemetry traces (`[telemetry]`, off by default; docs/telemetry.md).
//!
//! With traces on, every command read gets a consumer span, the child of its input's W3C
//! trace context, that lasts until its result is acknowledged; every sink call gets a
//! client span, the child of the command's, whose context the call passes on
//! (`traceparent`, and the input's `tracestate`); the result record names the command's
//! span. Spans go out over OTLP/HTTP from the SDK's batch processor, on its own thread, to
//! where the standard `OTEL_EXPORTER_OTLP_*` variables say. With traces off nothing here
//! runs: each input's trace context is passed on unchanged (docs/contract.md §11).
//!
//! - `config`: the section, and the exporter the standard variables choose on top of it;
//! - `spans`: the command and sink call spans, and the headers they pass on.

pub mod config;
mod spans;

pub use config::{TelemetryConfig, TelemetryError, TracesExporter};
pub use spans::{CommandEnd, CommandSpan, CommandTracer, Consumed, SinkCallSpan, TraceHeaders};

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

use config::OtlpProtocol;

/// How long a stopping process waits for its last spans to be exported.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// The tracer provider of a process with traces on.
#[derive(Debug)]
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Starts exporting when `config` and the standard variables (read through `env`) turn
    /// traces on; `None` when they are off. A variable dedupd cannot honour is an error
    /// naming it.
    pub fn start(
        config: &TelemetryConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Traces>, TelemetryError> {
        let Some(protocol) = config::chosen(config, env)? else { return Ok(None) };
        let protocol = match protocol {
            OtlpProtocol::HttpProtobuf => Protocol::HttpBinary,
            OtlpProtocol::HttpJson => Protocol::HttpJson,
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(protocol)
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource()).build();
        Ok(Some(Traces { provider }))
    }

    /// A provider exporting to `exporter` as each span ends (unit tests).
    #[cfg(test)]
    pub(crate) fn with_exporter(exporter: impl opentelemetry_sdk::trace::SpanExporter + 'static) -> Traces {
        Traces { provider: SdkTracerProvider::builder().with_simple_exporter(exporter).build() }
    }

    /// What makes the spans of commands.
    pub fn tracer(&self) -> CommandTracer {
        CommandTracer::new(self.provider.tracer("dedupd"))
    }

    /// Exports what is left and stops; blocks up to a few seconds (call it off the async
    /// runtime). A failure is logged: spans are not worth failing a clean stop for.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
            tracing::warn!(error = %e, "OpenTelemetry: the last spans may not have been exported");
        }
    }
}

/// The SDK's resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, ...), named `dedupd`
/// unless those name it.
fn resource() -> Resource {
    let detected = Resource::builder().build();
    let named = detected
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    let builder =
        Resource::builder().with_attribute(opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    if named { builder.build() } else { builder.with_service_name("dedupd").build() }
}

#[cfg(test)]
mod tests;
