//! Unit tests of the `kafka` sink's config and of what it does without a broker
//! (tests/sinks/kafka_sink.rs and tests/sinks/kafka_sink_check.rs have a real one).

use super::*;

fn config() -> KafkaSinkConfig {
    toml::from_str("bootstrap_servers = \"127.0.0.1:1\"\ntopic = \"out\"").unwrap()
}

#[test]
fn defaults_and_brokers_alias() {
    let c: KafkaSinkConfig = toml::from_str("brokers = \"b:9092\"\ntopic = \"t\"").unwrap();
    assert_eq!(c.bootstrap_servers.as_deref(), Some("b:9092"));
    assert_eq!(c.delivery_timeout, Duration::from_secs(30));
    assert!(c.limits.is_unlimited());
    assert!(toml::from_str::<KafkaSinkConfig>("brokers = \"b\"\ntopic = \"t\"\nacks = \"1\"").is_err());
}

#[test]
fn validate_names_the_key() {
    let mut c = config();
    c.producer.insert("acks".into(), "1".into());
    assert_eq!(c.problems("sinks.k")[0].key, "sinks.k.producer.\"acks\"");
    let mut c = config();
    c.topic = " ".into();
    assert_eq!(c.problems("sinks.k")[0].key, "sinks.k.topic");
    let mut c = config();
    c.template = Some(json!({"x": "{broken"}));
    assert_eq!(c.problems("sinks.k")[0].key, "sinks.k.template");
    assert!(config().problems("sinks.k").is_empty());
    // Every problem, in the order they are checked, not only the first.
    c.topic = " ".into();
    c.producer.insert("acks".into(), "1".into());
    let keys: Vec<String> = c.problems("sinks.k").into_iter().map(|p| p.key).collect();
    assert_eq!(keys, ["sinks.k.topic", "sinks.k.producer.\"acks\"", "sinks.k.template"]);
}

#[tokio::test]
async fn a_missing_template_field_is_permanent_and_named() {
    let mut c = config();
    c.template = Some(json!({"to": "{/customer/email}"}));
    let sink = KafkaSink::new("k", &c).unwrap();
    let payload = json!({"customer": {}});
    let watch = super::super::CallWatch::default();
    let request = SinkRequest::unclaimed("k1", "t", &payload, 1, None).watched_by(&watch);
    match sink.execute(request).await {
        Err(SinkError::Permanent { message, .. }) => {
            assert!(message.contains("/customer/email"), "{message}")
        }
        other => panic!("expected a permanent failure, got {other:?}"),
    }
    assert_eq!(watch.answer(), CallAnswer::NeverSent, "nothing was handed to the producer");
}

#[test]
fn a_check_table_gives_the_check_timing_and_its_problems_their_keys() {
    assert_eq!(config().check_timing(), None, "no [check], no check");
    let c: KafkaSinkConfig =
        toml::from_str("brokers = \"b\"\ntopic = \"t\"\ndelivery_timeout = \"10s\"\n[check]\nmax_records = 5").unwrap();
    let timing = c.check_timing().expect("a check");
    assert_eq!(timing.delay, Duration::from_secs(20), "twice delivery_timeout");
    assert_eq!(c.check.as_ref().map(|c| c.max_records), Some(5));
    assert!(c.problems("sinks.k").is_empty());
    let bad: KafkaSinkConfig =
        toml::from_str("brokers = \"b\"\ntopic = \"t\"\n[check]\nmax_records = 0\ndelay = \"25h\"").unwrap();
    let keys: Vec<String> = bad.problems("sinks.k").into_iter().map(|p| p.key).collect();
    assert_eq!(keys, ["sinks.k.check.delay", "sinks.k.check.max_records"]);
    assert!(toml::from_str::<KafkaSinkConfig>("brokers = \"b\"\ntopic = \"t\"\n[check]\nwhere = 1").is_err());
}

#[tokio::test]
async fn a_check_without_a_claim_time_or_a_check_table_says_why_it_cannot_tell() {
    let payload = json!({});
    let request = SinkRequest::unclaimed("k1", "t", &payload, 1, None);
    let without = KafkaSink::new("k", &config()).unwrap();
    assert!(matches!(without.check(request).await, CheckAnswer::Error(why) if why.contains("[sinks.k.check]")));
    let mut c = config();
    c.check = Some(toml::from_str("").unwrap());
    let with = KafkaSink::new("k", &c).unwrap();
    assert!(matches!(with.check(request).await, CheckAnswer::Error(why) if why.contains("claim time")));
}
