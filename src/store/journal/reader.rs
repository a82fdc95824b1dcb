//! Decoding a journal file: frames `[u32 len][u32 crc32][entries]`, each entry `[u32 key
//! len][key][u32 record len][record]`, the last entry of a key winning.
//!
//! Telling a torn tail from corruption (invariant 6 of the journal): a crash mid-append can
//! only damage the *last* frame, since nothing is ever appended behind a failed write (it is
//! cut off, or the journal refuses further writes) and recovery starts a new file. So a bad
//! frame with nothing valid after it is a torn tail and is dropped; a bad frame followed by
//! a frame whose checksum holds is corruption, reported with its byte offset.

use std::collections::HashMap;

use super::super::InProgress;
use super::super::record::Record;

/// The frame header: body length, body checksum.
pub(super) const FRAME_HEADER: usize = 8;

/// The smallest body a writer produces: one entry with an empty key and record (a
/// tombstone's record is empty, its key is not). Zeroes (a file extended but never written,
/// as some file systems leave after a power loss) are not frames.
const MIN_BODY: usize = 8;

/// A frame that cannot be read although it is not a torn tail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::store) struct BadFrame {
    /// Where the frame starts in the file.
    pub offset: u64,
    /// What is wrong with it.
    pub why: String,
}

/// What a journal file holds.
#[derive(Debug)]
pub(super) struct Decoded {
    /// The last claim of every key, in file order (keys whose last entry is a tombstone left out).
    pub claims: Vec<(String, InProgress)>,
    /// Where a torn last frame starts, if the file ends in one.
    pub torn_at: Option<u64>,
}

fn take_u32(bytes: &[u8], at: &mut usize) -> Option<usize> {
    let v = u32::from_le_bytes(bytes.get(*at..*at + 4)?.try_into().ok()?);
    *at += 4;
    Some(v as usize)
}

fn take_slice<'a>(bytes: &'a [u8], at: &mut usize, len: usize) -> Option<&'a [u8]> {
    let v = bytes.get(*at..at.checked_add(len)?)?;
    *at += len;
    Some(v)
}

/// The body of a whole frame at `at` whose checksum holds, and where the next one starts.
fn frame_at(bytes: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let mut p = at;
    let len = take_u32(bytes, &mut p)?;
    let crc = take_u32(bytes, &mut p)? as u32;
    let body = take_slice(bytes, &mut p, len)?;
    (crc32fast::hash(body) == crc).then_some((body, p))
}

/// Whether a frame a writer could have written (checksum holds, not empty) starts anywhere
/// after `from`.
fn valid_frame_after(bytes: &[u8], from: usize) -> bool {
    (from + 1..bytes.len().saturating_sub(FRAME_HEADER - 1))
        .any(|p| frame_at(bytes, p).is_some_and(|(body, _)| body.len() >= MIN_BODY))
}

/// The entries of one frame's body, in order: (key, claim or `None` for a tombstone).
fn entries(body: &[u8], offset: usize) -> Result<Vec<(String, Option<InProgress>)>, BadFrame> {
    let bad = |why: &str| BadFrame { offset: offset as u64, why: why.to_string() };
    let mut out = Vec::new();
    let mut q = 0;
    while q < body.len() {
        let key = take_u32(body, &mut q).and_then(|n| take_slice(body, &mut q, n)).ok_or_else(|| bad("key"))?;
        let rec = take_u32(body, &mut q).and_then(|n| take_slice(body, &mut q, n)).ok_or_else(|| bad("record"))?;
        let key = std::str::from_utf8(key).map_err(|_| bad("key is not UTF-8"))?.to_string();
        // An empty record is a tombstone (see `ClaimJournal::forget`).
        let claim = match rec {
            [] => None,
            rec => match Record::decode(rec).map_err(|e| bad(&e.0))? {
                Record::InProgress(claim) => Some(claim),
                _ => return Err(bad("not an in_progress record")),
            },
        };
        out.push((key, claim));
    }
    Ok(out)
}

/// Decodes a journal file's bytes. A bad last frame is a torn tail (reported, not an
/// error); a bad frame followed by a valid one, or a frame whose checksum holds but whose
/// entries do not decode, is an error naming the frame's offset.
pub(super) fn decode_file(bytes: &[u8]) -> Result<Decoded, BadFrame> {
    let mut last: HashMap<String, usize> = HashMap::new();
    let mut claims: Vec<(String, Option<InProgress>)> = Vec::new();
    let mut torn_at = None;
    let mut at = 0;
    while at < bytes.len() {
        let Some((body, next)) = frame_at(bytes, at) else {
            if valid_frame_after(bytes, at) {
                return Err(BadFrame { offset: at as u64, why: "length or checksum does not hold".into() });
            }
            torn_at = Some(at as u64);
            break;
        };
        for (key, claim) in entries(body, at)? {
            match last.get(&key) {
                Some(&i) => claims[i].1 = claim,
                None => {
                    last.insert(key.clone(), claims.len());
                    claims.push((key, claim));
                }
            }
        }
        at = next;
    }
    let claims = claims.into_iter().filter_map(|(k, c)| Some((k, c?))).collect();
    Ok(Decoded { claims, torn_at })
}
