//! The record encoding round-trips, and refuses what is not a record.

use super::*;
use proptest::prelude::*;

fn fp(b: u8) -> Fingerprint {
    Fingerprint([b; 32])
}

/// A command kept in doubt.
fn held() -> Box<Held> {
    Box::new(Held {
        sink: "pay".into(),
        route: "payments".into(),
        kind: "payment.create".into(),
        payload: br#"{"ref":"r-1"}"#.to_vec(),
        source: SourcePos { topic: "commands".into(), partition: 2, offset: 77 },
        intake_client: None,
    })
}

/// A record of each state, with and without its optional sections.
fn every_shape() -> [Record; 9] {
    [
        Record::InProgress(InProgress {
            fingerprint: fp(1),
            claimed_at_ms: 1_700_000_000_000,
            attempts: 1,
            source: SourcePos { topic: "commands".into(), partition: 3, offset: 1042 },
            held: None,
        }),
        Record::InProgress(InProgress {
            fingerprint: fp(8),
            claimed_at_ms: 1_700_000_000_000,
            attempts: 2,
            source: SourcePos { topic: "commands".into(), partition: 2, offset: 77 },
            held: Some(held()),
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
            settled: None,
        }),
        Record::Completed(Completed {
            fingerprint: fp(4),
            source: Some(SourcePos { topic: "commands".into(), partition: 3, offset: 1042 }),
            ..completed_plain()
        }),
        Record::Completed(Completed {
            fingerprint: fp(5),
            outcome: Completion::Succeeded,
            result: br#"{"status":200,"body":{"id":"p-1"}}"#.to_vec(),
            error: None,
            first_seen_at_ms: 1,
            completed_at_ms: 2,
            expires_at_ms: 3,
            attempts: 2,
            source: Some(SourcePos { topic: "commands".into(), partition: 1, offset: 9 }),
            settled: Some(Settled::new(SettledBy::CheckFound, 1_700_000_000_123)),
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
            held: Some(held()),
        }),
        Record::Indeterminate(Indeterminate {
            fingerprint: fp(4),
            claimed_at_ms: 5,
            attempts: 1,
            why: "no answer".into(),
            held: Some(held_from_intake()),
        }),
        Record::InProgress(InProgress {
            fingerprint: fp(9),
            claimed_at_ms: 1_700_000_000_000,
            attempts: 2,
            source: SourcePos { topic: "commands".into(), partition: 2, offset: 77 },
            held: Some(held_from_intake()),
        }),
    ]
}

/// A command kept in doubt that an intake client posted.
fn held_from_intake() -> Box<Held> {
    Box::new(Held { intake_client: Some("agent".into()), ..*held() })
}

#[test]
fn the_intake_client_is_a_section_a_version_without_it_reads_past() {
    for held in [held(), held_from_intake()] {
        let with = Record::Indeterminate(Indeterminate {
            fingerprint: fp(5),
            claimed_at_ms: 5,
            attempts: 1,
            why: "no answer".into(),
            held: Some(held),
        });
        let bytes = with.encode();
        let mut bare = with.clone();
        if let Record::Indeterminate(Indeterminate { held: Some(h), .. }) = &mut bare {
            h.intake_client = None;
        }
        let mut section = bare.encode();
        if let Some(client) = with.held().and_then(|h| h.intake_client.as_deref()) {
            section.push(INTAKE_CLIENT_TAG);
            put_bytes(&mut section, client.as_bytes());
        }
        assert_eq!(bytes, section, "the record without the client, then its section");
        assert_eq!(Record::decode(&bytes).unwrap(), with);
    }
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
        for (tag, body) in [(INTAKE_CLIENT_TAG + 1, &b"said by a later version"[..]), (0xff, &[][..])] {
            bytes.push(tag);
            put_bytes(&mut bytes, body);
        }
        assert_eq!(Record::decode(&bytes).unwrap(), r, "the record as this version knows it");
    }
}

#[test]
fn every_settlement_round_trips_and_only_a_completion_keeps_one() {
    let completed = |settled| Completed {
        fingerprint: fp(6),
        outcome: Completion::Failed,
        result: b"{}".to_vec(),
        error: Some("found no effect".into()),
        first_seen_at_ms: 10,
        completed_at_ms: 20,
        expires_at_ms: 30,
        attempts: 1,
        source: None,
        settled,
    };
    for by in [SettledBy::CheckFound, SettledBy::CheckAbsent, SettledBy::Operator] {
        let r = Record::Completed(completed(Some(Settled::new(by, -7))));
        assert_eq!(Record::decode(&r.encode()).unwrap(), r, "{by:?}");
        let bare = Record::Completed(completed(None)).encode();
        assert_eq!(r.encode().len(), bare.len() + 2 + Settled::LEN, "the section costs its tag, length and body");
    }
    // A settlement section on a record of another state is read past, as an unknown one.
    let [claim, ..] = every_shape();
    let mut bytes = claim.encode();
    bytes.push(SETTLED_TAG);
    put_bytes(&mut bytes, &[1, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(Record::decode(&bytes).unwrap(), claim);
}

#[test]
fn a_claims_command_section_that_does_not_read_whole_is_an_error() {
    let [claim, ..] = every_shape();
    let mut section = Vec::new();
    Held {
        sink: "s".into(),
        route: "r".into(),
        kind: "t".into(),
        payload: b"{}".to_vec(),
        source: SourcePos::default(),
        intake_client: None,
    }
    .encode(&mut section);
    for body in [&section[..section.len() - 1], &[section.as_slice(), &[0]].concat()] {
        let mut bytes = claim.encode();
        bytes.push(HELD_TAG);
        put_bytes(&mut bytes, body);
        assert!(Record::decode(&bytes).is_err(), "{body:?}");
    }
}

#[test]
fn a_settlement_section_this_version_cannot_read_is_an_error() {
    let bare = Record::Completed(completed_plain()).encode();
    for body in [&[][..], &[4, 0, 0, 0, 0, 0, 0, 0, 0], &[1, 0, 0], &[1, 0, 0, 0, 0, 0, 0, 0, 0, 0]] {
        let mut bytes = bare.clone();
        bytes.push(SETTLED_TAG);
        put_bytes(&mut bytes, body);
        assert!(Record::decode(&bytes).is_err(), "{body:?}");
    }
}

fn completed_plain() -> Completed {
    Completed {
        fingerprint: fp(2),
        outcome: Completion::Succeeded,
        result: b"{}".to_vec(),
        error: None,
        first_seen_at_ms: 1,
        completed_at_ms: 2,
        expires_at_ms: 3,
        attempts: 1,
        source: None,
        settled: None,
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
    let r = Record::Completed(completed_plain());
    assert!(r.encode().len() <= 64, "{}", r.encode().len());
}

proptest! {
    #[test]
    fn every_truncation_is_an_error_not_a_panic(cut in 0usize..80, attempts in 0u32..u32::MAX) {
        let r = Record::InProgress(InProgress {
            fingerprint: fp(9), claimed_at_ms: 7, attempts,
            source: SourcePos { topic: "t".into(), partition: 0, offset: 1 },
            held: None,
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
