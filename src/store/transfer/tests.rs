//! Export and import round trips and line errors.

use super::*;
use crate::fingerprint::Fingerprint;
use crate::store::record::{Completed, Completion, Held, InProgress, Indeterminate, Settled, SettledBy, SourcePos};
use crate::store::{Op, watermark_key};
use crate::store::{StoreBackend, SyncMode};

fn fp(b: u8) -> Fingerprint {
    Fingerprint([b; 32])
}

#[test]
fn watermark_keys_sort_inside_the_scan_bounds() {
    let k = watermark_key("orders.v1", 12);
    assert!(k.as_slice() >= b"wm/".as_slice() && k.as_slice() < b"wm0".as_slice());
    let _ = Op::Delete(Tree::Meta, k);
}

/// From every registered backend into every one (itself included).
#[test]
fn export_then_import_restores_records_and_watermarks_exactly() {
    for &from in StoreBackend::ALL {
        for &to in StoreBackend::ALL {
            eprintln!("export from {from}, import into {to}");
            export_then_import(from, to);
        }
    }
}

fn export_then_import(from: StoreBackend, to: StoreBackend) {
    let dir = tempfile::tempdir().unwrap();
    let a = KeyStore::open(from, &dir.path().join("a"), SyncMode::Batch).unwrap();
    let now = 1_000_000;
    let records = [
        (
            "done",
            Record::Completed(Completed {
                fingerprint: fp(1),
                outcome: Completion::Succeeded,
                result: br#"{"b":1, "a":[1.50,2]}"#.to_vec(),
                error: None,
                first_seen_at_ms: 10,
                completed_at_ms: 20,
                expires_at_ms: now + 5_000,
                attempts: 2,
                source: Some(SourcePos { topic: "t".into(), partition: 1, offset: 5 }),
                settled: Some(Settled::new(SettledBy::CheckFound, 15)),
            }),
        ),
        (
            "multi-line",
            Record::Completed(Completed {
                fingerprint: fp(2),
                outcome: Completion::Failed,
                result: b"{\n  \"status\": 400\n}".to_vec(),
                error: Some("HTTP 400".into()),
                first_seen_at_ms: 10,
                completed_at_ms: 20,
                expires_at_ms: now + 5_000,
                attempts: 1,
                source: None,
                settled: None,
            }),
        ),
        (
            "gone",
            Record::Completed(Completed {
                fingerprint: fp(3),
                outcome: Completion::Succeeded,
                result: b"{}".to_vec(),
                error: None,
                first_seen_at_ms: 1,
                completed_at_ms: 2,
                expires_at_ms: now - 1,
                attempts: 1,
                source: None,
                settled: None,
            }),
        ),
        (
            "unknown",
            Record::Indeterminate(Indeterminate {
                fingerprint: fp(4),
                claimed_at_ms: 7,
                attempts: 1,
                why: "crash".into(),
                held: None,
            }),
        ),
        (
            "unanswered",
            Record::Indeterminate(Indeterminate {
                fingerprint: fp(6),
                claimed_at_ms: 9,
                attempts: 1,
                why: "no answer".into(),
                held: Some(Box::new(Held {
                    sink: "pay".into(),
                    route: "payments".into(),
                    kind: "payment.create".into(),
                    payload: br#"{"cents":100,"ref":"r-1"}"#.to_vec(),
                    source: SourcePos { topic: "t".into(), partition: 0, offset: 3 },
                    intake_client: None,
                })),
            }),
        ),
        (
            "running",
            Record::InProgress(InProgress {
                fingerprint: fp(5),
                claimed_at_ms: 8,
                attempts: 1,
                source: SourcePos { topic: "t".into(), partition: 2, offset: 9 },
                held: None,
            }),
        ),
    ];
    for (k, r) in &records {
        a.compare_and_swap(k, None, Some(r)).unwrap().unwrap();
    }
    a.raise_watermarks(&[("t".into(), 2, 41), ("u.v".into(), 0, 7)]).unwrap();
    let mut buf = Vec::new();
    let counts = a.export_to(now, &mut buf).unwrap();
    assert_eq!(counts, ExportCounts { records: 6, watermarks: 2 });
    assert_eq!(validate(buf.as_slice(), |_| {}).unwrap(), counts);

    let b = KeyStore::open(to, &dir.path().join("b"), SyncMode::Batch).unwrap();
    let report =
        b.import_from(buf.as_slice(), ImportOptions { overwrite: false, force: false, now_ms: now }, |_| {}).unwrap();
    assert_eq!(
        report,
        ImportReport {
            imported: 5,
            unchanged: 0,
            kept_newer: 0,
            kept_in_progress: 0,
            expired: 1,
            watermarks_raised: 2
        }
    );
    for (k, r) in &records {
        let got = b.get(k).unwrap();
        if *k == "gone" { assert_eq!(got, None) } else { assert_eq!(got.as_ref(), Some(r), "{k}") }
    }
    assert_eq!(b.watermark("t", 2).unwrap(), Some(41));
    assert_eq!(b.watermark("u.v", 0).unwrap(), Some(7));
    assert_eq!(b.counts().completed, 2);

    // Again: nothing changes. A newer stored record is kept unless overwriting.
    let newer = Record::Indeterminate(Indeterminate {
        fingerprint: fp(4),
        claimed_at_ms: 99,
        attempts: 1,
        why: "x".into(),
        held: None,
    });
    let old = b.get("unknown").unwrap();
    b.compare_and_swap("unknown", old.as_ref(), Some(&newer)).unwrap().unwrap();
    let again =
        b.import_from(buf.as_slice(), ImportOptions { overwrite: false, force: false, now_ms: now }, |_| {}).unwrap();
    assert_eq!(
        again,
        ImportReport {
            imported: 0,
            unchanged: 4,
            kept_newer: 1,
            kept_in_progress: 0,
            expired: 1,
            watermarks_raised: 0
        }
    );
    assert_eq!(b.get("unknown").unwrap(), Some(newer));
    let forced =
        b.import_from(buf.as_slice(), ImportOptions { overwrite: true, force: false, now_ms: now }, |_| {}).unwrap();
    assert_eq!(forced.imported, 1);
    assert_eq!(b.get("unknown").unwrap().as_ref(), Some(&records[3].1));
}

#[test]
fn a_stored_in_progress_claim_is_replaced_only_with_force() {
    let dir = tempfile::tempdir().unwrap();
    let store = KeyStore::open(StoreBackend::Sled, &dir.path().join("s"), SyncMode::Batch).unwrap();
    let running = Record::InProgress(InProgress {
        fingerprint: fp(5),
        claimed_at_ms: 8,
        attempts: 1,
        source: SourcePos { topic: "t".into(), partition: 0, offset: 1 },
        held: None,
    });
    store.compare_and_swap("k", None, Some(&running)).unwrap().unwrap();
    // Newer, so `overwrite` alone would replace anything but a claim.
    let imported = Record::Completed(Completed {
        fingerprint: fp(5),
        outcome: Completion::Succeeded,
        result: b"{}".to_vec(),
        error: None,
        first_seen_at_ms: 8,
        completed_at_ms: 50,
        expires_at_ms: 10_000,
        attempts: 1,
        source: None,
        settled: None,
    });
    for overwrite in [false, true] {
        let options = ImportOptions { overwrite, force: false, now_ms: 100 };
        assert_eq!(store.import_record("k", &imported, options).unwrap(), Imported::KeptInProgress, "{overwrite}");
        assert_eq!(store.get("k").unwrap().as_ref(), Some(&running));
    }
    let forced = ImportOptions { overwrite: true, force: true, now_ms: 100 };
    assert_eq!(store.import_record("k", &imported, forced).unwrap(), Imported::Written);
    assert_eq!(store.get("k").unwrap().as_ref(), Some(&imported));
}

#[test]
fn bad_lines_are_named_by_number() {
    let good = format!("{}\n{}\n", header_line(1, "sled", 0), end_line(0, 0));
    assert_eq!(validate(good.as_bytes(), |_| {}).unwrap(), ExportCounts::default());
    let cases = [
        (
            format!("{}\n{{\"v\":1,\"type\":\"record\",\"state\":\"completed\"}}\n", header_line(1, "s", 0)),
            2,
            "missing field",
        ),
        (format!("{}\n{{\"v\":2,\"type\":\"end\"}}\n", header_line(1, "s", 0)), 2, "version 2"),
        (format!("{}\n", end_line(0, 0)), 1, "header"),
        (format!("{}\n{}\n", header_line(1, "s", 0), end_line(3, 0)), 2, "end line counts"),
        ("not json\n".to_string(), 1, "not a JSON object"),
    ];
    for (text, line, needle) in cases {
        match validate(text.as_bytes(), |_| {}) {
            Err(TransferError::Line { line: l, reason }) => {
                assert_eq!(l, line, "{text}: {reason}");
                assert!(reason.contains(needle), "{text}: {reason}");
            }
            other => panic!("{text}: {other:?}"),
        }
    }
    // Records of an unknown state or line type name what is known.
    let state = format!("{}\n{{\"v\":1,\"type\":\"record\",\"state\":\"complete\"}}\n", header_line(1, "s", 0));
    let err = validate(state.as_bytes(), |_| {}).unwrap_err().to_string();
    assert_eq!(err, "line 2: unknown record state \"complete\" (in_progress, completed or indeterminate)");
    // A stream that stops before its end line says where, an empty one that it is empty.
    let cut = format!("{}\n{}\n", header_line(1, "s", 0), watermark_line("t", 0, 1));
    let err = validate(cut.as_bytes(), |_| {}).unwrap_err().to_string();
    assert_eq!(err, "ends after line 2: the export is incomplete (no end line)");
    let err = validate("".as_bytes(), |_| {}).unwrap_err().to_string();
    assert_eq!(err, "empty: the export is incomplete (no end line)");
}

/// A line is read up to the bound and no further: longer is refused with its number (so
/// memory stays bounded however the stream goes on); at the bound, or ending in `\r\n`, or
/// last without a newline, it is read as ever.
#[test]
fn a_line_longer_than_the_bound_is_refused_with_its_number() {
    let header = header_line(1, "s", 0);
    let (end, max) = (end_line(0, 0), header.len() + 1);
    let count = |text: &str| each_entry_within(text.as_bytes(), max, |_| {}, |_| Ok(()));
    assert_eq!(
        count(&format!("{header}\r\n{end}")).unwrap(),
        ExportCounts::default(),
        "at the bound, CRLF, no final newline"
    );
    let long = format!("{header}\n{}\n{end}\n", "x".repeat(10 * max));
    match count(&long) {
        Err(TransferError::Line { line: 2, reason }) => {
            assert!(reason.contains(&format!("longer than {max} bytes")), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    let mut endless = header.clone().into_bytes();
    endless.push(b'\n');
    endless.extend(std::iter::repeat_n(b'{', 5 * max));
    let read = std::cell::Cell::new(0u64);
    let err = each_entry_within(endless.as_slice(), max, |n| read.set(read.get() + n), |_| Ok(())).unwrap_err();
    assert!(err.to_string().starts_with("line 2: longer than"), "{err}");
    assert!(read.get() <= 2 * max as u64 + 2, "read {} bytes for two lines of at most {max}", read.get());
    let not_utf8 = [header.as_bytes(), b"\n\xff\xfe\n"].concat();
    let err = each_entry_within(not_utf8.as_slice(), max, |_| {}, |_| Ok(())).unwrap_err().to_string();
    assert!(err.starts_with("line 2: not UTF-8"), "{err}");
}
