//! Helper for `tests/store/store_crash.rs`: writes to a store until it is SIGKILLed.
//!
//! Usage: `store-crash-child <backend> <path> <run> <batch>` (a registered backend name)
//!
//! Loops over batches of `batch` fresh keys `r{run:04}-{i:07}` (i counting from 0):
//! claims the batch, `flush_claims`, prints `DURABLE <first> <last>` (indices, inclusive);
//! completes the keys in groups of up to 7 with `complete_batch` (every fourth batch with an expiry already in the past), raises the
//! watermark of `crash/0` to the batch's last global offset, flushes, prints
//! `COMPLETED <first> <last>`; then runs one compaction chunk. Around each batch of expired
//! completions the store turns its slices on a clock that moves an hour per turn, so that
//! a slice holds that batch alone and is dropped once compaction removed it: kills land
//! while slices open and drop too. Each turn prints `SLICES <dropped> <opened (0 or 1)>`. A line is printed (and
//! stdout flushed) only after the flush it reports has returned. Any store error exits 1.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use dedupd::fingerprint::Fingerprint;
use dedupd::store::{Completed, Completion, DurableClaim, InProgress, KeyStore, SLICE_SPAN_MS, SourcePos};
use dedupd::store::{StoreBackend, SyncMode};

/// Keys of one run are numbered from 0; the global offset orders runs too.
const RUN_STRIDE: i64 = 10_000_000;
/// Expiry of completions that must survive: far in the future.
const FAR: i64 = 4_000_000_000_000;

/// The fingerprint the child claims `key` with (the project's own, of a fixed command).
fn fingerprint_of(key: &str) -> Fingerprint {
    dedupd::fingerprint::fingerprint("crash-test", &serde_json::Value::String(key.to_string()), &[])
        .unwrap_or(Fingerprint([0; 32]))
}

/// Each durable claim of the batch starting at key `first` with its completion, expiring
/// at once when `expired`, else far in the future.
fn completions(first: i64, durable: Vec<DurableClaim>, expired: bool) -> Vec<(DurableClaim, Completed)> {
    let mut items = Vec::with_capacity(durable.len());
    for (n, claim) in durable.into_iter().enumerate() {
        let i = first + n as i64;
        let done = Completed {
            fingerprint: claim.record().fingerprint,
            outcome: Completion::Succeeded,
            result: format!("{{\"n\":{i}}}").into_bytes(),
            error: None,
            first_seen_at_ms: claim.record().claimed_at_ms,
            completed_at_ms: 2_000 + i,
            expires_at_ms: if expired { 1 } else { FAR },
            attempts: 1,
            source: None,
            settled: None,
        };
        items.push((claim, done));
    }
    items
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("store-crash-child: {e}");
            ExitCode::from(1)
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        return Err("usage: store-crash-child <backend> <path> <run> <batch>".into());
    }
    let kind: StoreBackend = args[1].parse()?;
    let path = PathBuf::from(&args[2]);
    let run: i64 = args[3].parse()?;
    let batch: i64 = args[4].parse()?;
    if batch < 1 || run < 0 {
        return Err("batch must be >= 1, run >= 0".into());
    }

    let store = KeyStore::open(kind, &path, SyncMode::Batch)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "OPEN")?;
    out.flush()?;

    let mut next: i64 = 0;
    // Bounded so a child that is never killed still ends.
    while next < RUN_STRIDE - batch {
        let (first, last) = (next, next + batch - 1);
        let batch_no = first / batch;
        let expired = batch_no % 4 == 3;
        if batch_no % 4 == 3 || batch_no % 4 == 0 {
            // Later on each turn, across runs too.
            let turned = store.turn_slices((run * RUN_STRIDE + batch_no + 1) * SLICE_SPAN_MS)?;
            writeln!(out, "SLICES {} {}", turned.dropped.len(), u8::from(turned.opened.is_some()))?;
            out.flush()?;
        }

        let mut pending = Vec::with_capacity(batch as usize);
        for i in first..=last {
            let key = format!("r{run:04}-{i:07}");
            let claim = InProgress {
                fingerprint: fingerprint_of(&key),
                claimed_at_ms: 1_000 + i,
                attempts: 1,
                source: SourcePos { topic: "crash".into(), partition: 0, offset: run * RUN_STRIDE + i },
                held: None,
            };
            match store.claim(&key, None, claim)? {
                Ok(p) => pending.push(p),
                Err(current) => return Err(format!("fresh key {key} was taken: {current:?}").into()),
            }
        }
        let durable = store.flush_claims(pending)?;
        writeln!(out, "DURABLE {first} {last}")?;
        out.flush()?;

        let mut items = completions(first, durable, expired);
        // In groups of up to 7, each one write with shared expiry-index entries.
        while !items.is_empty() {
            let rest = items.split_off(items.len().min(7));
            store.complete_batch(items)?;
            items = rest;
        }
        store.raise_watermarks(&[("crash".to_string(), 0, run * RUN_STRIDE + last)])?;
        store.flush()?;
        writeln!(out, "COMPLETED {first} {last}")?;
        out.flush()?;

        // Removes (some of) the already-expired completions, so that kills also land
        // inside compaction chunks.
        store.compact_chunk(1_000, 37)?;
        next = last + 1;
    }
    Ok(())
}
