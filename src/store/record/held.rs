//! The command a record keeps for a key in doubt: an `indeterminate` record's (in its fixed
//! layout, flag 1), and that of the reconciler's claim running such a key again (section
//! [`HELD_TAG`], so that a version reading past sections reads the claim without it).
//!
//! Layout: `[sink][route][type][payload][topic][partition i32][offset i64]`. The intake
//! client a command came from, when it did, is a section of the record (tag
//! [`INTAKE_CLIENT_TAG`]), so that a version without it reads the rest.

use super::{DecodeError, Reader, SourcePos, put_bytes};

/// The tag of a claim's section (see the module doc of `record`).
pub(super) const HELD_TAG: u8 = 0x81;
/// The tag of the section naming the intake client of a record's held command.
pub(super) const INTAKE_CLIENT_TAG: u8 = 0x82;

/// The command of a key in doubt, kept with its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The sink instance that was called (`[sinks.NAME]`).
    pub sink: String,
    /// The route that chose it.
    pub route: String,
    /// The command type.
    pub kind: String,
    /// The payload, as JSON text.
    pub payload: Vec<u8>,
    /// The input record that claimed the key.
    pub source: SourcePos,
    /// The intake client that posted the command (docs/contract.md §9), named by the result
    /// a settlement publishes.
    pub intake_client: Option<String>,
}

impl Held {
    /// Its variable bytes, for sizing a buffer (lengths and fixed fields: at most 42 more).
    pub(super) fn encoded_len(&self) -> usize {
        let client = self.intake_client.as_ref().map_or(0, |c| c.len() + 12);
        self.sink.len()
            + self.route.len()
            + self.kind.len()
            + self.payload.len()
            + self.source.topic.len()
            + client
            + 42
    }

    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        for text in [&self.sink, &self.route, &self.kind] {
            put_bytes(out, text.as_bytes());
        }
        put_bytes(out, &self.payload);
        put_bytes(out, self.source.topic.as_bytes());
        out.extend_from_slice(&self.source.partition.to_le_bytes());
        out.extend_from_slice(&self.source.offset.to_le_bytes());
    }

    pub(super) fn decode(r: &mut Reader<'_>) -> Result<Held, DecodeError> {
        Ok(Held {
            sink: r.string()?,
            route: r.string()?,
            kind: r.string()?,
            payload: r.bytes()?.to_vec(),
            source: SourcePos { topic: r.string()?, partition: r.i32()?, offset: r.i64()? },
            intake_client: None,
        })
    }
}
