//! The HTTP listener: `/healthz`, `/readyz` (not ready until the consumer joined, and
//! naming refused partitions), `/metrics` in Prometheus text format; and a `dedupd run`
//! listens from its start.

use crate::common;

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

/// A `dedupd run` still starting (its cluster does not answer; `kafka.connect_timeout` is
/// long) already listens: alive, not ready, saying why. A port another process holds is
/// refused at once, before the store or the cluster is touched.
#[tokio::test]
async fn a_starting_instance_answers_alive_and_not_ready_and_a_taken_port_is_refused_first() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let write_config = |listen: &str, store: &str| {
        let path = dir.path().join(format!("{store}.toml"));
        let text = format!(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:9\"\ninput_topics = [\"in\"]\nconnect_timeout = \"10m\"\n\n\
             [http]\nlisten = \"{listen}\"\n\n[store]\npath = {:?}\n\n\
             [sinks.log]\nkind = \"log\"\n\n[[routes]]\ntypes = [\"*\"]\nsink = \"log\"\n",
            dir.path().join(store)
        );
        std::fs::write(&path, text).unwrap();
        path
    };
    let config = write_config(&format!("127.0.0.1:{port}"), "store");
    let mut starting =
        common::process::DedupdProcess::spawn(&["run", "-c", config.to_str().unwrap()], &dir.path().join("run.log"));
    let get = |path: &'static str| async move {
        let r = reqwest::get(format!("http://127.0.0.1:{port}{path}")).await?;
        Ok::<_, reqwest::Error>((r.status().as_u16(), r.text().await.unwrap_or_default()))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let (status, body) = loop {
        if let Ok(answer) = get("/readyz").await {
            break answer;
        }
        assert!(starting.exited().is_none(), "dedupd exited while starting");
        assert!(std::time::Instant::now() < deadline, "nothing listened within 30 s");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("starting"), "{body}");
    assert_eq!(get("/healthz").await.unwrap().0, 200, "alive while starting");

    // Another instance on the same port: refused at once, naming it, nothing created.
    let taken = write_config(&format!("127.0.0.1:{port}"), "second");
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_dedupd")).args(["run", "-c"]).arg(&taken).output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains(&format!("cannot listen on 127.0.0.1:{port}")), "{text}");
    assert!(!dir.path().join("second").exists(), "the store is not created before the port is found taken");
}
