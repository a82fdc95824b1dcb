//! Fuzzes `dedupd::envelope::parse` (docs/contract.md §1): any record must become a `Command` that keeps
//! the key rules, or a `Rejection`; never a panic, never a `stale` (that needs the clock).
//!
//! Input scheme (simple, so seeds can be written by hand; see docs/fuzzing.md):
//!
//! ```text
//! CONTROL VALUE [0xFF RECORD_KEY [0xFF NAME[=VALUE]]...]
//! ```
//!
//! CONTROL bits: 0-1 envelope.format (auto, native, tool_call, cloudevents); 2-3
//! envelope.key (auto, header:x-key, json:/payload/k, record-key); 4 stale_by = created_at;
//! 5 limits.max_command_bytes = 64 (else 1 MiB); 6 no Kafka timestamp; 7 no value at all.
//! A header part without `=` is a header with a null value. 0xFF never occurs in UTF-8, so
//! it cannot clash with a JSON value, while every other invalid byte still can.

#![no_main]

use std::num::NonZeroUsize;
use std::sync::OnceLock;
use std::time::Duration;

use dedupd::config::{EnvelopeConfig, EnvelopeFormat, LimitsConfig, RouteConfig, StaleBy};
use dedupd::envelope::{InputRecord, KeySource, MAX_KEY_BYTES, RejectReason, parse};
use dedupd::fingerprint::fingerprint;
use dedupd::routes::Router;
use libfuzzer_sys::fuzz_target;

const SEP: u8 = 0xFF;

fn router() -> &'static Router {
    static ROUTER: OnceLock<Router> = OnceLock::new();
    ROUTER.get_or_init(|| {
        let route = |name: &str, types: &[&str], ttl: Option<u64>, exclude: &[&str]| RouteConfig {
            name: Some(name.to_string()),
            types: types.iter().map(|s| s.to_string()).collect(),
            sink: name.to_string(),
            ttl: ttl.map(Duration::from_secs),
            fingerprint_exclude: exclude.iter().map(|s| s.to_string()).collect(),
        };
        Router::new(
            &[
                route("mail", &["email.*"], Some(3600), &["/payload/request_id", "/payload/a/0"]),
                route("tools", &["charge_card", "tool_?"], Some(30 * 24 * 3600), &[]),
                route("events", &["com.example.*"], None, &["/type"]),
            ],
            Duration::from_secs(24 * 3600),
            Duration::from_secs(7 * 24 * 3600),
        )
        .expect("static routes compile")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, rest)) = data.split_first() else { return };
    let mut parts = rest.split(|b| *b == SEP);
    let value = parts.next().filter(|_| control & 0x80 == 0);
    let key = parts.next();
    let headers: Vec<(String, Option<Vec<u8>>)> = parts
        .take(16)
        .map(|h| match h.iter().position(|b| *b == b'=') {
            Some(eq) => (String::from_utf8_lossy(&h[..eq]).into_owned(), Some(h[eq + 1..].to_vec())),
            None => (String::from_utf8_lossy(h).into_owned(), None),
        })
        .collect();

    let envelope = EnvelopeConfig {
        format: match control & 0b11 {
            0 => EnvelopeFormat::Auto,
            1 => EnvelopeFormat::Native,
            2 => EnvelopeFormat::ToolCall,
            _ => EnvelopeFormat::Cloudevents,
        },
        key: match (control >> 2) & 0b11 {
            0 => KeySource::Auto,
            1 => KeySource::Header("x-key".to_string()),
            2 => KeySource::JsonPointer("/payload/k".to_string()),
            _ => KeySource::RecordKey,
        },
        stale_guard: true,
        stale_by: if control & 0x10 != 0 { StaleBy::CreatedAt } else { StaleBy::KafkaTimestamp },
    };
    let max = if control & 0x20 != 0 { 64 } else { 1024 * 1024 };
    let limits = LimitsConfig { max_command_bytes: NonZeroUsize::new(max).expect("non-zero") };
    let record = InputRecord {
        topic: "commands",
        partition: 0,
        offset: 0,
        timestamp_ms: if control & 0x40 != 0 { None } else { Some(1_700_000_000_000) },
        key,
        value,
        headers: &headers,
    };

    let router = router();
    let first = parse(&record, &envelope, &limits, router);
    // Pure: the same record gives the same answer.
    assert_eq!(first, parse(&record, &envelope, &limits, router));
    match first {
        Ok(c) => {
            assert!(!c.key.is_empty() && c.key.len() <= MAX_KEY_BYTES, "key length {}", c.key.len());
            assert!(!c.key.chars().any(char::is_control), "control character in {:?}", c.key);
            assert!(!c.kind.is_empty());
            let route = &router.routes()[c.route];
            assert_eq!(router.route(&c.kind).map(|r| &r.name), Some(&route.name));
            assert!(!c.ttl.is_zero() && c.ttl <= router.max_ttl());
            assert_eq!(c.fingerprint, fingerprint(&c.kind, &c.payload, &route.fingerprint_exclude).expect("fingerprint"));
            // The payload survives a round trip through its JSON text with the same fingerprint.
            let text = serde_json::to_string(&c.payload).expect("serialise");
            let back: serde_json::Value = serde_json::from_str(&text).expect("reparse");
            assert_eq!(c.fingerprint, fingerprint(&c.kind, &back, &route.fingerprint_exclude).expect("fingerprint"));
            if let Some(v) = value {
                assert!(v.len() <= max);
            }
        }
        Err(r) => {
            assert_ne!(r.reason, RejectReason::Stale);
            assert!(!r.message.is_empty());
            let _ = r.to_string();
            if let Some(k) = &r.key {
                assert!(!k.is_empty() && k.len() <= MAX_KEY_BYTES && !k.chars().any(char::is_control));
            }
        }
    }
});
