//! Under KIP-848 (`"group.protocol" = "consumer"`) the group session is the broker's, not the
//! client's `session.timeout.ms`, and dedupd's call lease and stalled-transaction wait follow
//! it (src/pipeline/session.rs): on the real broker, `dedupd run` reads the group's
//! (the broker's `group.consumer.session.timeout.ms`); once it has a setting of its own (which
//! rdkafka 0.39 cannot read back), it takes the broker's least,
//! `group.consumer.min.session.timeout.ms`, never a longer one.
//!
//! Run with `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --test kafka kafka_group_session::`.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::kafka;
use common::pay_kills;
use common::process::{DedupdProcess, KeptOnFailure, tail_of_file, wait_for_line};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;

const LINE: &str = "group session enforced by the broker";

/// Runs dedupd until it logs the session it uses, then stops it; returns that line.
async fn session_line(config: &Path, log: &Path) -> String {
    let mut dedupd = DedupdProcess::run(config, log);
    let seen = wait_for_line(log, dedupd.log_start, LINE, Duration::from_secs(60), || false).await;
    let text = tail_of_file(log, 80);
    assert!(seen.is_some(), "no `{LINE}` line:\n{text}");
    assert!(
        dedupd.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()),
        "dedupd did not stop cleanly:\n{text}"
    );
    text.lines().rfind(|l| l.contains(LINE)).unwrap_or_default().to_string()
}

/// The broker's setting `key`, in seconds.
async fn broker_seconds(admin: &AdminClient<DefaultClientContext>, key: &str) -> u64 {
    let metadata = admin.inner().fetch_metadata(None, Duration::from_secs(10)).expect("metadata");
    let id = metadata.brokers().first().expect("a broker").id();
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(30)));
    let described = admin.describe_configs([&ResourceSpecifier::Broker(id)], &opts).await.expect("describe");
    let config = described.into_iter().next().expect("an answer").expect("the broker's settings");
    let ms: u64 = config.get(key).and_then(|e| e.value.clone()).expect(key).parse().expect("a number");
    ms / 1000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_kip848_the_session_is_the_one_the_broker_enforces() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let (input, results, dlq, group) =
        (kafka::unique("gs-in"), kafka::unique("gs-out"), kafka::unique("gs-dlq"), kafka::unique("gs-group"));
    kafka::create_topics(&bootstrap, &[(&input, 1), (&results, 1), (&dlq, 1)]).await;
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", &bootstrap).create().expect("admin client");
    let dir = KeptOnFailure::new();
    let kafka_extra = "transactional_results = true\n\n[kafka.consumer]\n\"group.protocol\" = \"consumer\"\n";
    let toml = pay_kills::config_toml(
        &bootstrap,
        &group,
        [&input, &results, &dlq],
        &dir.path().join("store"),
        "http://127.0.0.1:9/pay",
        kafka_extra,
        "",
    );
    let (config, log) = (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"));
    std::fs::write(&config, toml).expect("config");

    // The group has no setting of its own: the broker's (which the group's reads as).
    let default = broker_seconds(&admin, "group.consumer.session.timeout.ms").await;
    let line = session_line(&config, &log).await;
    assert!(line.contains(&format!("\"session\":\"{default}s\"")), "{line}");

    // Given one (longer than the broker's least), it cannot be read back: the least.
    let least = broker_seconds(&admin, "group.consumer.min.session.timeout.ms").await;
    let own = ((least + 5) * 1000).to_string();
    let set = AlterConfig::new(ResourceSpecifier::Group(&group)).set("consumer.session.timeout.ms", &own);
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(30)));
    let altered = admin.alter_configs([&set], &opts).await.expect("alter_configs");
    assert!(altered.iter().all(Result::is_ok), "the broker took the group's session: {altered:?}");
    let line = session_line(&config, &log).await;
    assert!(
        line.contains(&format!("\"session\":\"{least}s\"")) && line.contains("\"from\":\"broker_minimum\""),
        "{line}"
    );
}
