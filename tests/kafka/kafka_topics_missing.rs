//! `dedupd run` with its results or dead-letter topic missing, on a real broker that
//! auto-creates topics (scripts/kafka/kafka.sh sets `auto.create.topics.enable=true`, the
//! broker's default): it exits 2 naming the key and the topic before it publishes anything,
//! and the topic is still missing afterwards (no auto-created one-partition stand-in
//! receives results).
//!
//! Run with `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --test kafka kafka_topics_missing::`.

use crate::common;

use std::time::{Duration, Instant};

use common::kafka;
use common::process::{DedupdProcess, KeptOnFailure, tail_of_file};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

/// Whether the broker knows `topic` (a metadata request for all topics, which creates none).
fn topic_exists(bootstrap: &str, topic: &str) -> bool {
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("consumer");
    let metadata = consumer.fetch_metadata(None, Duration::from_secs(10)).expect("metadata");
    metadata.topics().iter().any(|t| t.name() == topic)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_results_or_dead_letter_topic_stops_run_before_anything_is_published() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    for missing in ["kafka.results_topic", "kafka.dead_letter_topic"] {
        let (input, results, dlq) = (kafka::unique("mt-in"), kafka::unique("mt-results"), kafka::unique("mt-dlq"));
        let absent = if missing == "kafka.results_topic" { &results } else { &dlq };
        let present: Vec<(&str, i32)> = [(&input, 1), (&results, 1), (&dlq, 1)]
            .into_iter()
            .filter(|(t, _)| *t != absent)
            .map(|(t, p)| (t.as_str(), p))
            .collect();
        kafka::create_topics(&bootstrap, &present).await;
        let value = serde_json::json!({"id": "k1", "type": "t.op", "payload": {}});
        kafka::produce_all(&bootstrap, &input, vec![("k1".into(), serde_json::to_vec(&value).expect("json"), vec![])])
            .await;

        let dir = KeptOnFailure::new();
        let (config_path, log) = (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"));
        let text = format!(
            "{}\n[store]\npath = {:?}\n\n[sinks.audit]\nkind = \"log\"\n\n[[routes]]\ntypes = [\"*\"]\nsink = \"audit\"\n\n\
             [http]\nlisten = \"127.0.0.1:0\"\n\n[log]\nformat = \"json\"\n",
            kafka::kafka_table(&bootstrap, &kafka::unique("mt-group"), &input, &results, &dlq),
            dir.path().join("store"),
        );
        std::fs::write(&config_path, text).expect("config");
        let mut dedupd = DedupdProcess::run(&config_path, &log);
        let deadline = Instant::now() + Duration::from_secs(90);
        let status = loop {
            if let Some(status) = dedupd.exited() {
                break status;
            }
            assert!(Instant::now() < deadline, "{missing}: still running:\n{}", tail_of_file(&log, 30));
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        assert_eq!(status.code(), Some(2), "{missing}: {status:?}:\n{}", tail_of_file(&log, 30));
        assert!(said.contains(&format!("{missing}: topic {absent} does not exist")), "{}", tail_of_file(&log, 30));
        assert!(!topic_exists(&bootstrap, absent), "{missing}: the broker created {absent}");
    }
}
