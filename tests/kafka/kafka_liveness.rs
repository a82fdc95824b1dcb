//! `/healthz` on a real broker: ok while the consumer loop polls; 503, naming why, once the
//! loop has not polled within the consumer's `max.poll.interval.ms`; ok again when it polls
//! again. A liveness probe on it restarts a process whose loop is wedged, where every
//! partition would otherwise stop silently. The loop is wedged on purpose: crash point
//! `consumer.turn` delayed with the `fail` crate's `sleep` (src/crash.rs).
//!
//! Run with `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --features failpoints --test kafka kafka_liveness::`.
#![cfg(feature = "failpoints")]

use crate::common;

use std::time::{Duration, Instant};

use common::kafka;
use common::process::{DedupdProcess, KeptOnFailure, tail_of_file, wait_for_http_addr};

/// The consumer's `max.poll.interval.ms` (and session: librdkafka wants the session within
/// it, and the broker takes no session under 6 s).
const MAX_POLL_INTERVAL_MS: u64 = 6_000;
/// How long the loop is wedged: past the bound, then it polls again.
const WEDGED_MS: u64 = 14_000;
/// Loop turns before it is wedged (one per ≤ 100 ms poll): after the join.
const TURNS_BEFORE: u32 = 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_fails_while_the_consumer_loop_is_wedged_and_recovers_after() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let (input, results, dlq) = (kafka::unique("live-in"), kafka::unique("live-out"), kafka::unique("live-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, 1), (&results, 1), (&dlq, 1)]).await;
    let dir = KeptOnFailure::new();
    let (config, log) = (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"));
    let toml = format!(
        "{kafka}\n[kafka.consumer]\n\"max.poll.interval.ms\" = \"{MAX_POLL_INTERVAL_MS}\"\n\
         \"session.timeout.ms\" = \"{MAX_POLL_INTERVAL_MS}\"\n\n[store]\npath = {store:?}\n\n\
         [http]\nlisten = \"127.0.0.1:0\"\n\n[log]\nformat = \"json\"\n\n\
         [sinks.audit]\nkind = \"log\"\n\n[[routes]]\nname = \"all\"\ntypes = [\"*\"]\nsink = \"audit\"\n",
        kafka = kafka::kafka_table(&bootstrap, &kafka::unique("live-dedupd"), &input, &results, &dlq),
        store = dir.path().join("store").to_str().expect("utf-8 path"),
    );
    std::fs::write(&config, toml).expect("config");
    let failpoints = format!("consumer.turn={TURNS_BEFORE}*off->1*sleep({WEDGED_MS})->off");
    let args = ["run", "-c", config.to_str().expect("utf-8 path")];
    let mut p = DedupdProcess::spawn_with_env(&args, &[("FAILPOINTS", failpoints.as_str())], &log);
    let http = wait_for_http_addr(&log, &mut p, Duration::from_secs(60)).await;
    let client = reqwest::Client::new();
    let healthz = || async {
        let r = client.get(format!("http://{http}/healthz")).send().await.expect("GET /healthz");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    };

    // Ok while it polls, then 503 once wedged past the bound, then ok again: each within a
    // bound of its own, in this order.
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    for want in [200, 503, 200] {
        loop {
            let (status, body) = healthz().await;
            if status == want {
                seen.push((status, body));
                break;
            }
            assert!(
                Instant::now() < deadline && p.exited().is_none(),
                "/healthz did not answer {want} (seen so far: {seen:?}; now {status} {body}); log:\n{}",
                tail_of_file(&log, 30)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let wedged = &seen[1].1;
    assert!(wedged.contains("has not polled for") && wedged.contains("bound: 6 s"), "the 503 says why: {wedged}");
    assert_eq!(seen[2].1, "ok\n");
    assert!(p.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()), "clean stop after SIGTERM");
}
