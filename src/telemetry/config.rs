//! The `[telemetry]` section, and which exporter the standard `OTEL_*` variables choose
//! on top of it.

use serde::{Deserialize, Serialize};

/// What becomes of the spans dedupd makes.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum TracesExporter {
    /// No spans (the default): trace context is still passed on from each input unchanged.
    #[default]
    Off,
    /// A span per command and per sink call, exported over OTLP/HTTP.
    Otlp,
}

/// `[telemetry]`: OpenTelemetry traces. Where they go and how is set by the standard
/// variables (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`,
/// ...), which the OpenTelemetry SDK reads itself.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// `off` or `otlp`; `OTEL_TRACES_EXPORTER` (`otlp` or `none`) and
    /// `OTEL_SDK_DISABLED=true` win over it.
    pub traces: TracesExporter,
}

/// An OTLP wire format dedupd speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// `http/protobuf`, the default.
    HttpProtobuf,
    /// `http/json`.
    HttpJson,
}

/// A telemetry setting that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TelemetryError {
    /// A standard variable has a value dedupd does not support.
    #[error("environment variable {var}={value:?}: {reason}")]
    Env { var: &'static str, value: String, reason: &'static str },
    /// The exporter could not be built.
    #[error("OpenTelemetry OTLP exporter: {0}")]
    Exporter(String),
}

/// The exporter `config` and the standard variables (read through `env`) choose: `None`
/// for no spans, else the OTLP protocol. A variable's value dedupd cannot honour is an
/// error naming it, never silently something else.
pub fn chosen(
    config: &TelemetryConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<OtlpProtocol>, TelemetryError> {
    let var =
        |name: &'static str| env(name).map(|v| (name, v.trim().to_ascii_lowercase())).filter(|(_, v)| !v.is_empty());
    if let Some((_, disabled)) = var("OTEL_SDK_DISABLED")
        && disabled == "true"
    {
        return Ok(None);
    }
    let exporter = match var("OTEL_TRACES_EXPORTER") {
        None => config.traces,
        Some((_, v)) if v == "otlp" => TracesExporter::Otlp,
        Some((_, v)) if v == "none" => TracesExporter::Off,
        Some((name, value)) => {
            return Err(TelemetryError::Env { var: name, value, reason: "dedupd exports traces with otlp or none" });
        }
    };
    if exporter == TracesExporter::Off {
        return Ok(None);
    }
    // The signal's own variable wins over the general one, as in every OpenTelemetry SDK.
    match var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL")) {
        None => Ok(Some(OtlpProtocol::HttpProtobuf)),
        Some((_, v)) if v == "http/protobuf" => Ok(Some(OtlpProtocol::HttpProtobuf)),
        Some((_, v)) if v == "http/json" => Ok(Some(OtlpProtocol::HttpJson)),
        Some((name, value)) => Err(TelemetryError::Env {
            var: name,
            value,
            reason: "dedupd speaks OTLP over HTTP only: http/protobuf (port 4318) or http/json",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(config: TracesExporter, vars: &[(&str, &str)]) -> Result<Option<OtlpProtocol>, TelemetryError> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let env = move |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        chosen(&TelemetryConfig { traces: config }, &env)
    }

    #[test]
    fn off_unless_the_config_or_the_standard_variable_says_otlp() {
        assert_eq!(with(TracesExporter::Off, &[]), Ok(None));
        assert_eq!(with(TracesExporter::Otlp, &[]), Ok(Some(OtlpProtocol::HttpProtobuf)));
        assert_eq!(
            with(TracesExporter::Off, &[("OTEL_TRACES_EXPORTER", "otlp")]),
            Ok(Some(OtlpProtocol::HttpProtobuf))
        );
        assert_eq!(with(TracesExporter::Otlp, &[("OTEL_TRACES_EXPORTER", "none")]), Ok(None));
        assert_eq!(with(TracesExporter::Otlp, &[("OTEL_SDK_DISABLED", "TRUE")]), Ok(None));
        assert_eq!(with(TracesExporter::Otlp, &[("OTEL_SDK_DISABLED", "false")]), Ok(Some(OtlpProtocol::HttpProtobuf)));
    }

    #[test]
    fn the_signal_protocol_wins_over_the_general_one() {
        let vars = [("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"), ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")];
        assert_eq!(with(TracesExporter::Otlp, &vars), Ok(Some(OtlpProtocol::HttpJson)));
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_naming_the_variable() {
        let grpc = with(TracesExporter::Otlp, &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap_err();
        assert!(grpc.to_string().starts_with("environment variable OTEL_EXPORTER_OTLP_PROTOCOL=\"grpc\""), "{grpc}");
        let zipkin = with(TracesExporter::Off, &[("OTEL_TRACES_EXPORTER", "zipkin")]).unwrap_err();
        assert!(zipkin.to_string().contains("OTEL_TRACES_EXPORTER"), "{zipkin}");
        // Off: the protocol is not looked at.
        assert_eq!(with(TracesExporter::Off, &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]), Ok(None));
    }
}
