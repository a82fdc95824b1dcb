//! The HTTP listener: `/healthz`, `/readyz` (not ready until the consumer joined, and
//! naming refused partitions), `/metrics` in Prometheus text format.

use std::sync::Arc;

use dedupd::ops::{Health, Metrics, serve};
use dedupd::outcome::Outcome;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn health_readiness_and_metrics() {
    let metrics = Arc::new(Metrics::new().unwrap());
    let health = Arc::new(Health::default());
    let stop = CancellationToken::new();
    let (addr, server) =
        serve("127.0.0.1:0".parse().unwrap(), metrics.clone(), health.clone(), stop.clone().cancelled_owned())
            .await
            .unwrap();
    let task = tokio::spawn(server);
    let get = |path: &'static str| async move {
        let r = reqwest::get(format!("http://{addr}{path}")).await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };

    assert_eq!(get("/healthz").await.0, 200);
    let (status, body) = get("/readyz").await;
    assert_eq!(status, 503, "not ready before the consumer joined: {body}");
    health.set_joined(true);
    assert_eq!(get("/readyz").await.0, 200);
    health.set_refused("commands/3", true);
    let (status, body) = get("/readyz").await;
    assert_eq!(status, 503);
    assert!(body.contains("commands/3"), "{body}");
    health.set_refused("commands/3", false);
    assert_eq!(get("/readyz").await.0, 200);

    metrics.command(Outcome::Duplicate, Some("mail"));
    metrics.command(Outcome::Duplicate, Some("mail"));
    let (status, text) = get("/metrics").await;
    assert_eq!(status, 200);
    assert!(text.contains("dedupd_commands_total{outcome=\"duplicate\",route=\"mail\"} 2"), "{text}");
    assert!(text.contains("dedupd_store_records{state=\"indeterminate\"} 0"), "{text}");

    stop.cancel();
    task.await.unwrap().unwrap();
}
