//! `--traces`: what OpenTelemetry traces cost a backlog drain (BENCHMARKS.md, "Traces: what
//! they cost a drain"). Drains alternate, traces off then on, over the same backlog; with
//! traces on, spans go over OTLP/HTTP (dedupd's default protocol, the SDK's batch
//! processor with its default settings) to a receiver in this process that decodes each
//! request, as a Collector would, and counts the spans, so the table also says whether
//! any were dropped (two per command: the command's and its sink call's).

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use dedupd::pipeline::RunOptions;
use dedupd::store::StoreBackend;
use dedupd::telemetry::{TelemetryConfig, Traces, TracesExporter};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use prost::Message;

/// Drains of each kind, alternated.
const PAIRS: usize = 3;

/// Binds the receiver's socket and points `OTEL_EXPORTER_OTLP_ENDPOINT` at it. Call it
/// before any thread starts: the SDK reads the variable from the process environment.
pub fn bind_receiver() -> TcpListener {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the OTLP receiver");
    let addr = listener.local_addr().expect("addr");
    // SAFETY: called from `main` before the runtime or any other thread exists.
    unsafe { std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}")) };
    listener
}

async fn receive(State(spans): State<Arc<AtomicU64>>, body: Bytes) -> (StatusCode, Vec<u8>) {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, Vec::new());
    };
    let n: usize = request.resource_spans.iter().flat_map(|r| &r.scope_spans).map(|s| s.spans.len()).sum();
    spans.fetch_add(n as u64, Ordering::Relaxed);
    (StatusCode::OK, ExportTraceServiceResponse::default().encode_to_vec())
}

/// Waits until `spans` reaches `expected` or has not grown for longer than the batch
/// processor's export delay (5 s); returns what it holds then.
async fn settled(spans: &AtomicU64, expected: u64) -> u64 {
    let mut last = (spans.load(Ordering::Relaxed), Instant::now());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = spans.load(Ordering::Relaxed);
        if now >= expected || last.1.elapsed() > Duration::from_secs(7) || Instant::now() > deadline {
            return now;
        }
        if now != last.0 {
            last = (now, Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Drains `input`'s `n` commands `PAIRS` times each way, printing a table.
pub async fn measure(bootstrap: &str, input: &str, backend: StoreBackend, n: usize, listener: TcpListener) {
    listener.set_nonblocking(true).expect("nonblocking");
    let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
    let spans = Arc::new(AtomicU64::new(0));
    let app = axum::Router::new().route("/v1/traces", axum::routing::post(receive)).with_state(Arc::clone(&spans));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let config = TelemetryConfig { traces: TracesExporter::Otlp };
    let traces = Traces::start(&config, &|var| std::env::var(var).ok()).expect("traces").expect("traces are on");
    println!("\n| pair | traces off, commands/s | traces on, commands/s | on / off | spans received / expected |");
    println!("|---|---:|---:|---:|---:|");
    let mut ratios = Vec::with_capacity(PAIRS);
    for pair in 1..=PAIRS {
        let off =
            super::measure_drain_with(super::Mode::Embedded, bootstrap, input, backend, n, RunOptions::default()).await;
        let before = spans.load(Ordering::Relaxed);
        let options = RunOptions { tracer: Some(traces.tracer()), ..RunOptions::default() };
        let on = super::measure_drain_with(super::Mode::Embedded, bootstrap, input, backend, n, options).await;
        let expected = 2 * n as u64;
        let received = settled(&spans, before + expected).await - before;
        ratios.push(on / off);
        println!("| {pair} | {off:.0} | {on:.0} | {:.2} | {received} / {expected} |", on / off);
    }
    ratios.sort_by(f64::total_cmp);
    println!("median on / off: {:.2}", ratios[ratios.len() / 2]);
    let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    server.abort();
}
