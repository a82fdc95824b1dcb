//! An OTLP/HTTP trace receiver on 127.0.0.1, built on OpenTelemetry's own protobuf types
//! (opentelemetry-proto): `POST /v1/traces` with an `ExportTraceServiceRequest`, as the
//! OpenTelemetry Collector's `otlp` receiver takes it. It keeps every span it is sent.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use parking_lot::Mutex;
use prost::Message;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// One span as received, ids in lower-case hex (empty when absent).
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub trace_state: String,
    pub name: String,
    /// `opentelemetry_proto::tonic::trace::v1::span::SpanKind` as i32.
    pub kind: i32,
    /// Attribute values as text.
    pub attributes: HashMap<String, String>,
    /// `status::StatusCode` as i32 (0 unset, 1 ok, 2 error).
    pub status: i32,
    /// The resource's attributes (`service.name`, ...).
    pub resource: HashMap<String, String>,
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attributes(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter().map(|kv| (kv.key.clone(), text(kv.value.as_ref()))).collect()
}

async fn receive(State(spans): State<Arc<Mutex<Vec<ReceivedSpan>>>>, body: Bytes) -> impl IntoResponse {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "text/plain")],
            b"not an ExportTraceServiceRequest".to_vec(),
        );
    };
    let mut got = Vec::new();
    for resource_spans in &request.resource_spans {
        let resource = attributes(resource_spans.resource.as_ref().map_or(&[][..], |r| &r.attributes));
        for scope in &resource_spans.scope_spans {
            for span in &scope.spans {
                got.push(ReceivedSpan {
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    trace_state: span.trace_state.clone(),
                    name: span.name.clone(),
                    kind: span.kind,
                    attributes: attributes(&span.attributes),
                    status: span.status.as_ref().map_or(0, |s| s.code),
                    resource: resource.clone(),
                });
            }
        }
    }
    spans.lock().extend(got);
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

/// The receiver; stop it with [`OtlpReceiver::stop`].
pub struct OtlpReceiver {
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    stop: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

impl OtlpReceiver {
    pub async fn start() -> OtlpReceiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind OTLP receiver");
        let addr = listener.local_addr().expect("addr");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new().route("/v1/traces", axum::routing::post(receive)).with_state(Arc::clone(&spans));
        let stop = CancellationToken::new();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await })
        };
        OtlpReceiver { addr, spans, stop, task }
    }

    /// `OTEL_EXPORTER_OTLP_ENDPOINT` for it.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().clone()
    }

    pub async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), self.task).await;
    }
}
