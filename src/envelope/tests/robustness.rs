//! Robustness: arbitrary records (values, keys, headers, timestamps, envelope settings) never
//! panic and are either a well-formed command or a rejection; any valid key round-trips.

use proptest::prelude::*;

use super::*;

fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("idempotency-key".to_string()),
        Just("Idempotency-Key".to_string()),
        Just("ce_specversion".to_string()),
        Just("ce_id".to_string()),
        Just("ce_source".to_string()),
        Just("ce_type".to_string()),
        Just("ce_time".to_string()),
        Just("traceparent".to_string()),
        Just("x-key".to_string()),
        ".{0,12}",
    ]
}

fn header_value() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        Just(Some(b"1.0".to_vec())),
        Just(Some(b"com.example.x".to_vec())),
        Just(Some(b"2023-11-14T22:13:20Z".to_vec())),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)),
        proptest::option::of("\\PC{0,20}".prop_map(String::into_bytes)),
    ]
}

fn envelope_config() -> impl Strategy<Value = EnvelopeConfig> {
    let format = prop_oneof![
        Just(EnvelopeFormat::Auto),
        Just(EnvelopeFormat::Native),
        Just(EnvelopeFormat::ToolCall),
        Just(EnvelopeFormat::Cloudevents),
    ];
    let key = prop_oneof![
        Just(KeySource::Auto),
        Just(KeySource::RecordKey),
        Just(KeySource::Header("x-key".into())),
        Just(KeySource::JsonPointer("/payload/k".into())),
        Just(KeySource::JsonPointer("/".into())),
    ];
    (format, key, any::<bool>(), any::<bool>()).prop_map(|(format, key, stale_guard, created)| EnvelopeConfig {
        format,
        key,
        stale_guard,
        stale_by: if created { StaleBy::CreatedAt } else { StaleBy::KafkaTimestamp },
    })
}

/// Values that are mostly near-miss envelopes, plus raw bytes.
fn value() -> impl Strategy<Value = Option<Vec<u8>>> {
    let json_ish = proptest::collection::vec(
        prop_oneof![
            Just("{".to_string()),
            Just("}".to_string()),
            Just("\"id\":".to_string()),
            Just("\"type\":\"email.send\"".to_string()),
            Just("\"tool\":\"charge_card\"".to_string()),
            Just("\"arguments\":{\"idempotency_key\":\"k\"}".to_string()),
            Just("\"specversion\":\"1.0\"".to_string()),
            Just("\"payload\":".to_string()),
            Just("\"ttl\":\"1h\"".to_string()),
            Just("\"created_at\":\"2023-11-14T22:13:20Z\"".to_string()),
            Just(",".to_string()),
            Just("null".to_string()),
            Just("1e308".to_string()),
            "\"\\PC{0,8}\"",
        ],
        0..16,
    )
    .prop_map(|parts| Some(parts.concat().into_bytes()));
    prop_oneof![Just(None), proptest::option::of(proptest::collection::vec(any::<u8>(), 0..400)), json_ish,]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_records_never_panic(
        value in value(),
        key in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)),
        headers in proptest::collection::vec((header_name(), header_value()), 0..8),
        ts in proptest::option::of(any::<i64>()),
        envelope in envelope_config(),
        max in 1usize..500,
    ) {
        let r = Rec { value, key, headers, ts };
        match r.parse_with(&envelope, &limits(max)) {
            Ok(c) => {
                prop_assert!(!c.key.is_empty() && c.key.len() <= MAX_KEY_BYTES);
                prop_assert!(!c.key.chars().any(char::is_control));
                prop_assert!(!c.kind.is_empty());
                prop_assert!(c.route < router().routes().len());
                prop_assert!(!c.ttl.is_zero() && c.ttl <= router().max_ttl());
            }
            Err(e) => {
                prop_assert_ne!(e.reason, RejectReason::Stale);
                prop_assert!(!e.message.is_empty());
            }
        }
    }

    #[test]
    fn any_valid_key_round_trips(
        chars in proptest::collection::vec(any::<char>().prop_filter("control", |c| !c.is_control()), 1..60),
    ) {
        let key: String = chars.into_iter().collect();
        prop_assume!(key.len() <= MAX_KEY_BYTES);
        let c = rec(&native_with_key(&key)).ok();
        prop_assert_eq!(&c.key, &key);
        let h = rec(NATIVE).h("idempotency-key", &key).ok();
        prop_assert_eq!(h.key, key);
    }
}
