//! The stored record of one key (docs/contract.md §3) and its compact binary encoding.
//!
//! Layout: `[version=1][state][fingerprint 32B][state fields...]`, integers little-endian,
//! strings and blobs as LEB128 length + bytes. Decoding checks every length against the
//! buffer, so a torn or foreign value is an error, never a panic. A completed record's
//! `source` comes last and only when known (`[1][topic][partition][offset]`), so records
//! written before it existed read as they were, with none; an indeterminate record's held
//! command likewise (`[1][sink][route][type][payload][topic][partition][offset]`).
//!
//! Extensions: after those, any record may carry sections `[tag >= 0x80][length][bytes]`,
//! which a reader that does not know a tag skips, so that a later version can add to what a
//! record says while instances of both read each other's records (a rolling update with
//! `store.changelog`). Three so far: a completed record's [`Settled`] (tag 0x80), how a key
//! in doubt was settled; the command an `in_progress` claim of the reconciler keeps
//! (tag 0x81, [`Held`]); and the intake client of a kept command (tag 0x82).

mod held;
mod settled;
pub use held::Held;
use held::{HELD_TAG, INTAKE_CLIENT_TAG};
use settled::SETTLED_TAG;
pub use settled::{Settled, SettledBy};

use crate::fingerprint::Fingerprint;

/// The most bytes of a sink's answer a record keeps as a result, and of a command it keeps
/// in doubt (`http`'s `max_response_bytes`, `exec`'s `max_output_bytes` and
/// `limits.max_command_bytes` are at most this, 8 MiB): a record is bounded by it, and so is
/// the longest line an export writes and an import reads (`transfer::MAX_LINE_BYTES`).
pub const MAX_RESULT_BYTES: usize = 8 * 1024 * 1024;

const VERSION: u8 = 1;
const STATE_IN_PROGRESS: u8 = 1;
const STATE_COMPLETED: u8 = 2;
const STATE_INDETERMINATE: u8 = 3;
/// The lowest tag of an extension section: below it, the flags of the optional sections.
const FIRST_EXTENSION_TAG: u8 = 0x80;

/// How a completed command ended at its sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Completion {
    /// The sink did it.
    Succeeded,
    /// The sink refused it permanently (or retries ran out); repeats replay this failure.
    Failed,
}

impl Completion {
    /// `succeeded` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Completion::Succeeded => "succeeded",
            Completion::Failed => "failed",
        }
    }
}

/// Where the claiming record came from.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct SourcePos {
    /// Input topic.
    pub topic: String,
    /// Input partition.
    pub partition: i32,
    /// Input offset.
    pub offset: i64,
}

/// A claim that is (or was) being executed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InProgress {
    /// Fingerprint of the claiming command.
    pub fingerprint: Fingerprint,
    /// When the key was first claimed, Unix ms.
    pub claimed_at_ms: i64,
    /// Sink runs started so far under this claim (1 on the first claim).
    pub attempts: u32,
    /// The record that claimed it.
    pub source: SourcePos,
    /// The command, kept when the claim is the reconciler's run of a key in doubt (decide's
    /// `RunChecked`): its input was committed long ago, so if this claim is left in
    /// progress (a crash, a stop during its call) the command does not come again, and the
    /// reconciler takes the claim up from what it keeps. `None` for every other claim.
    pub held: Option<Box<Held>>,
}

/// A finished command whose result is replayed to repeats until `expires_at_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    /// Fingerprint of the command.
    pub fingerprint: Fingerprint,
    /// Succeeded or failed.
    pub outcome: Completion,
    /// The sink's result as JSON text (`{}` when it had none).
    pub result: Vec<u8>,
    /// The sink's error sentence when failed.
    pub error: Option<String>,
    /// When the key was first claimed, Unix ms.
    pub first_seen_at_ms: i64,
    /// When the sink returned, Unix ms.
    pub completed_at_ms: i64,
    /// When this record may be removed, Unix ms.
    pub expires_at_ms: i64,
    /// Sink runs it took.
    pub attempts: u32,
    /// The input record that claimed the key and whose sink run this is, when known: when
    /// that same record is read again (after a crash), its result is published again as it
    /// was, not as a replay (`decide`).
    pub source: Option<SourcePos>,
    /// How the key came to be completed when its effect was in doubt (a call without an
    /// answer, a crash): by its sink's check or an operator. `None` when it never was.
    pub settled: Option<Settled>,
}

/// A claim whose effect is unknown: a call of a sink that does not forward the key may
/// have landed without an answer (or a crash left the claim), and no check settled it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Indeterminate {
    /// Fingerprint of the command.
    pub fingerprint: Fingerprint,
    /// When the key was first claimed, Unix ms.
    pub claimed_at_ms: i64,
    /// Sink runs started before the effect became unknown.
    pub attempts: u32,
    /// Why it is indeterminate.
    pub why: String,
    /// The command in doubt and where it ran, when known (records written before dedupd
    /// kept it have none): what a later check needs to ask the receiver about it.
    pub held: Option<Box<Held>>,
}

/// What the store holds for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// Claimed, sink not yet returned (or crashed).
    InProgress(InProgress),
    /// Done; replayed until it expires.
    Completed(Completed),
    /// Unknown effect; waits for an operator.
    Indeterminate(Indeterminate),
}

/// The three states, for metrics and stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// `in_progress`.
    InProgress,
    /// `completed`.
    Completed,
    /// `indeterminate`.
    Indeterminate,
}

impl State {
    /// Every state.
    pub const ALL: [State; 3] = [State::InProgress, State::Completed, State::Indeterminate];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            State::InProgress => "in_progress",
            State::Completed => "completed",
            State::Indeterminate => "indeterminate",
        }
    }
}

impl Record {
    /// The fingerprint the record was claimed with.
    pub fn fingerprint(&self) -> &Fingerprint {
        match self {
            Record::InProgress(r) => &r.fingerprint,
            Record::Completed(r) => &r.fingerprint,
            Record::Indeterminate(r) => &r.fingerprint,
        }
    }

    /// Its state.
    pub fn state(&self) -> State {
        match self {
            Record::InProgress(_) => State::InProgress,
            Record::Completed(_) => State::Completed,
            Record::Indeterminate(_) => State::Indeterminate,
        }
    }

    /// When it last changed: its completion, else its claim.
    pub fn changed_at_ms(&self) -> i64 {
        match self {
            Record::Completed(c) => c.completed_at_ms,
            Record::InProgress(p) => p.claimed_at_ms,
            Record::Indeterminate(i) => i.claimed_at_ms,
        }
    }

    /// When it expires: only completed records do.
    pub fn expires_at_ms(&self) -> Option<i64> {
        match self {
            Record::Completed(c) => Some(c.expires_at_ms),
            _ => None,
        }
    }

    /// True for a completed record whose expiry is at or before `now_ms`.
    pub fn is_expired(&self, now_ms: i64) -> bool {
        self.expires_at_ms().is_some_and(|at| at <= now_ms)
    }

    /// The compact binary form.
    pub fn encode(&self) -> Vec<u8> {
        // Fixed fields take at most 124 bytes (varints, a settlement section and a claim's
        // section header included): sized once, no regrowth.
        let variable = match self {
            Record::InProgress(r) => r.source.topic.len() + r.held.as_deref().map_or(0, Held::encoded_len),
            Record::Completed(r) => {
                r.result.len()
                    + r.error.as_ref().map_or(0, String::len)
                    + r.source.as_ref().map_or(0, |s| s.topic.len())
            }
            Record::Indeterminate(r) => r.why.len() + r.held.as_deref().map_or(0, Held::encoded_len),
        };
        let mut out = Vec::with_capacity(124 + variable);
        out.push(VERSION);
        match self {
            Record::InProgress(r) => {
                out.push(STATE_IN_PROGRESS);
                out.extend_from_slice(&r.fingerprint.0);
                out.extend_from_slice(&r.claimed_at_ms.to_le_bytes());
                put_varint(&mut out, u64::from(r.attempts));
                put_bytes(&mut out, r.source.topic.as_bytes());
                out.extend_from_slice(&r.source.partition.to_le_bytes());
                out.extend_from_slice(&r.source.offset.to_le_bytes());
                if let Some(held) = &r.held {
                    let mut body = Vec::with_capacity(held.encoded_len());
                    held.encode(&mut body);
                    out.push(HELD_TAG);
                    put_bytes(&mut out, &body);
                }
            }
            Record::Completed(r) => {
                out.push(STATE_COMPLETED);
                out.extend_from_slice(&r.fingerprint.0);
                out.push(match r.outcome {
                    Completion::Succeeded => 0,
                    Completion::Failed => 1,
                });
                out.extend_from_slice(&r.first_seen_at_ms.to_le_bytes());
                out.extend_from_slice(&r.completed_at_ms.to_le_bytes());
                out.extend_from_slice(&r.expires_at_ms.to_le_bytes());
                put_varint(&mut out, u64::from(r.attempts));
                put_bytes(&mut out, &r.result);
                match &r.error {
                    None => out.push(0),
                    Some(e) => {
                        out.push(1);
                        put_bytes(&mut out, e.as_bytes());
                    }
                }
                if let Some(source) = &r.source {
                    out.push(1);
                    put_bytes(&mut out, source.topic.as_bytes());
                    out.extend_from_slice(&source.partition.to_le_bytes());
                    out.extend_from_slice(&source.offset.to_le_bytes());
                }
                if let Some(settled) = &r.settled {
                    out.push(SETTLED_TAG);
                    put_varint(&mut out, Settled::LEN as u64);
                    settled.encode(&mut out);
                }
            }
            Record::Indeterminate(r) => {
                out.push(STATE_INDETERMINATE);
                out.extend_from_slice(&r.fingerprint.0);
                out.extend_from_slice(&r.claimed_at_ms.to_le_bytes());
                put_varint(&mut out, u64::from(r.attempts));
                put_bytes(&mut out, r.why.as_bytes());
                if let Some(held) = &r.held {
                    out.push(1);
                    held.encode(&mut out);
                }
            }
        }
        if let Some(client) = self.held().and_then(|held| held.intake_client.as_deref()) {
            out.push(INTAKE_CLIENT_TAG);
            put_bytes(&mut out, client.as_bytes());
        }
        out
    }

    /// The command the record keeps: an `indeterminate` record's, or the reconciler's claim's.
    fn held(&self) -> Option<&Held> {
        match self {
            Record::InProgress(r) => r.held.as_deref(),
            Record::Indeterminate(r) => r.held.as_deref(),
            Record::Completed(_) => None,
        }
    }

    /// The state of an encoded record, read from its two header bytes alone: what the
    /// open's scan counts (`scan::open`), where decoding every record of a large
    /// store cost a sixth of the scan. The rest of a record is checked when it is read.
    pub fn state_of(bytes: &[u8]) -> Result<State, DecodeError> {
        match bytes {
            [VERSION, STATE_IN_PROGRESS, ..] => Ok(State::InProgress),
            [VERSION, STATE_COMPLETED, ..] => Ok(State::Completed),
            [VERSION, STATE_INDETERMINATE, ..] => Ok(State::Indeterminate),
            [VERSION, other, ..] => Err(DecodeError(format!("unknown state {other}"))),
            [version, ..] if *version != VERSION => Err(DecodeError(format!("unknown record version {version}"))),
            _ => Err(DecodeError(format!("{} bytes, shorter than a record's header", bytes.len()))),
        }
    }

    /// Reads the compact binary form; any inconsistency is an error.
    pub fn decode(bytes: &[u8]) -> Result<Record, DecodeError> {
        let mut r = Reader { buf: bytes };
        let version = r.u8()?;
        if version != VERSION {
            return Err(DecodeError(format!("unknown record version {version}")));
        }
        let state = r.u8()?;
        let fingerprint = Fingerprint(r.array::<32>()?);
        let mut record = match state {
            STATE_IN_PROGRESS => Record::InProgress(InProgress {
                fingerprint,
                claimed_at_ms: r.i64()?,
                attempts: r.u32_varint()?,
                source: SourcePos { topic: r.string()?, partition: r.i32()?, offset: r.i64()? },
                held: None,
            }),
            STATE_COMPLETED => {
                let outcome = match r.u8()? {
                    0 => Completion::Succeeded,
                    1 => Completion::Failed,
                    other => return Err(DecodeError(format!("unknown outcome {other}"))),
                };
                Record::Completed(Completed {
                    fingerprint,
                    outcome,
                    first_seen_at_ms: r.i64()?,
                    completed_at_ms: r.i64()?,
                    expires_at_ms: r.i64()?,
                    attempts: r.u32_varint()?,
                    result: r.bytes()?.to_vec(),
                    error: match r.u8()? {
                        0 => None,
                        1 => Some(r.string()?),
                        other => return Err(DecodeError(format!("bad error flag {other}"))),
                    },
                    source: match r.buf.first() {
                        None => None,
                        Some(&tag) if tag >= FIRST_EXTENSION_TAG => None,
                        Some(1) => {
                            r.u8()?;
                            Some(SourcePos { topic: r.string()?, partition: r.i32()?, offset: r.i64()? })
                        }
                        Some(other) => return Err(DecodeError(format!("bad source flag {other}"))),
                    },
                    settled: None,
                })
            }
            STATE_INDETERMINATE => Record::Indeterminate(Indeterminate {
                fingerprint,
                claimed_at_ms: r.i64()?,
                attempts: r.u32_varint()?,
                why: r.string()?,
                held: match r.buf.first() {
                    None => None,
                    Some(&tag) if tag >= FIRST_EXTENSION_TAG => None,
                    Some(1) => {
                        r.u8()?;
                        Some(Box::new(Held::decode(&mut r)?))
                    }
                    Some(other) => return Err(DecodeError(format!("bad held-command flag {other}"))),
                },
            }),
            other => return Err(DecodeError(format!("unknown state {other}"))),
        };
        read_extensions(&mut r, &mut record)?;
        Ok(record)
    }
}

/// Reads the extension sections that end a record (see the module doc) into `record`.
fn read_extensions(r: &mut Reader<'_>, record: &mut Record) -> Result<(), DecodeError> {
    while let Some((tag, body)) = r.extension()? {
        // Sections of tags this version does not know are read past.
        match (tag, &mut *record) {
            (SETTLED_TAG, Record::Completed(completed)) => completed.settled = Some(Settled::decode(body)?),
            (HELD_TAG, Record::InProgress(claim)) => {
                let mut section = Reader { buf: body };
                claim.held = Some(Box::new(Held::decode(&mut section)?));
                if !section.buf.is_empty() {
                    return Err(DecodeError(format!("{} bytes after a claim's command", section.buf.len())));
                }
            }
            (INTAKE_CLIENT_TAG, _) => {
                let client = String::from_utf8(body.to_vec())
                    .map_err(|_| DecodeError("an intake client that is not UTF-8".into()))?;
                if let Record::InProgress(InProgress { held: Some(held), .. })
                | Record::Indeterminate(Indeterminate { held: Some(held), .. }) = record
                {
                    held.intake_client = Some(client);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// A stored value that is not a valid record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("undecodable record: {0}")]
pub struct DecodeError(pub String);

pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

pub(super) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

pub(super) struct Reader<'a> {
    pub(super) buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError(format!("truncated: wanted {n} bytes, {} left", self.buf.len())));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    pub(super) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    pub(super) fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.array()?))
    }
    pub(super) fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_le_bytes(self.array()?))
    }
    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError("varint longer than 10 bytes".into()))
    }
    fn u32_varint(&mut self) -> Result<u32, DecodeError> {
        u32::try_from(self.varint()?).map_err(|_| DecodeError("attempts out of range".into()))
    }
    /// The next of the extension sections that end a record (see the module doc), its tag
    /// and body; `None` at the end. Anything else left is an error.
    fn extension(&mut self) -> Result<Option<(u8, &'a [u8])>, DecodeError> {
        let Some(&tag) = self.buf.first() else { return Ok(None) };
        if tag < FIRST_EXTENSION_TAG {
            return Err(DecodeError(format!("{} trailing bytes", self.buf.len())));
        }
        self.u8()?;
        let body = self.bytes().map_err(|e| DecodeError(format!("extension {tag:#x}: {}", e.0)))?;
        Ok(Some((tag, body)))
    }

    pub(super) fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = usize::try_from(self.varint()?).map_err(|_| DecodeError("length out of range".into()))?;
        self.take(len)
    }
    pub(super) fn string(&mut self) -> Result<String, DecodeError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| DecodeError("string is not UTF-8".into()))
    }
}

#[cfg(test)]
mod tests;
