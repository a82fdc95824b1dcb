//! The record encoding round-trips, and refuses what is not a record.

use super::*;
use proptest::prelude::*;

fn fp(b: u8) -> Fingerprint {
    Fingerprint([b; 32])
}

/// A record of each state, with and without its optional section.
fn every_shape() -> [Record; 5] {
    [
        Record::InProgress(InProgress {
            fingerprint: fp(1),
            claimed_at_ms: 1_700_000_000_000,
            attempts: 1,
            source: SourcePos { topic: "commands".into(), partition: 3, offset: 1042 },
        }),
        Record::Completed(Completed {
            fingerprint: fp(2),
            outcome: Completion::Failed,
            result: br#"{"status":400}"#.to_vec(),
            error: Some("HTTP 400".into()),
            first_seen_at_ms: 1,
            completed_at_ms: 2,
            expires_at_ms: 3,
            attempts: 300,
            source: None,
        }),
        Record::Completed(Completed {
            fingerprint: fp(4),
            outcome: Completion::Succeeded,
            result: b"{}".to_vec(),
            error: None,
            first_seen_at_ms: 1,
            completed_at_ms: 2,
            expires_at_ms: 3,
            attempts: 1,
            source: Some(SourcePos { topic: "commands".into(), partition: 3, offset: 1042 }),
        }),
        Record::Indeterminate(Indeterminate {
            fingerprint: fp(3),
            claimed_at_ms: -5,
            attempts: 2,
            why: "crash".into(),
            held: None,
        }),
        Record::Indeterminate(Indeterminate {
            fingerprint: fp(3),
            claimed_at_ms: 5,
            attempts: 1,
            why: "no answer".into(),
            held: Some(Box::new(Held {
                sink: "pay".into(),
                route: "payments".into(),
                kind: "payment.create".into(),
                payload: br#"{"ref":"r-1"}"#.to_vec(),
                source: SourcePos { topic: "commands".into(), partition: 2, offset: 77 },
            })),
        }),
    ]
}

#[test]
fn each_state_round_trips() {
    for r in every_shape() {
        assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        assert_eq!(Record::state_of(&r.encode()).unwrap(), r.state(), "the header says the state");
    }
}

#[test]
fn extension_sections_a_later_version_appends_are_read_past() {
    for r in every_shape() {
        let mut bytes = r.encode();
        for (tag, body) in [(FIRST_EXTENSION_TAG, &b"settled by check"[..]), (0xff, &[][..])] {
            bytes.push(tag);
            put_bytes(&mut bytes, body);
        }
        assert_eq!(Record::decode(&bytes).unwrap(), r, "the record as this version knows it");
    }
}

#[test]
fn what_follows_a_record_that_is_not_an_extension_is_an_error() {
    for r in every_shape() {
        let mut below = r.encode();
        below.extend_from_slice(&[0x7f, 0]);
        assert!(Record::decode(&below).is_err(), "a tag below the extensions' {r:?}");
        let mut short = r.encode();
        short.extend_from_slice(&[FIRST_EXTENSION_TAG, 5, 1, 2]);
        assert!(Record::decode(&short).is_err(), "an extension shorter than its length {r:?}");
    }
}

#[test]
fn a_header_that_is_not_a_record_is_an_error() {
    for bad in [&[][..], &[VERSION], &[VERSION, 0], &[VERSION, 4, 0], &[VERSION + 1, STATE_COMPLETED]] {
        assert!(Record::state_of(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn completed_record_is_compact() {
    let r = Record::Completed(Completed {
        fingerprint: fp(2),
        outcome: Completion::Succeeded,
        result: b"{}".to_vec(),
        error: None,
        first_seen_at_ms: 1,
        completed_at_ms: 2,
        expires_at_ms: 3,
        attempts: 1,
        source: None,
    });
    assert!(r.encode().len() <= 64, "{}", r.encode().len());
}

proptest! {
    #[test]
    fn every_truncation_is_an_error_not_a_panic(cut in 0usize..80, attempts in 0u32..u32::MAX) {
        let r = Record::InProgress(InProgress {
            fingerprint: fp(9), claimed_at_ms: 7, attempts,
            source: SourcePos { topic: "t".into(), partition: 0, offset: 1 },
        });
        let bytes = r.encode();
        if cut < bytes.len() {
            prop_assert!(Record::decode(&bytes[..cut]).is_err());
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = Record::decode(&bytes);
        // Whatever decodes has the state its header says.
        if let Ok(r) = Record::decode(&bytes) {
            prop_assert_eq!(Record::state_of(&bytes).unwrap(), r.state());
        }
    }
}
