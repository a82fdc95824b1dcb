//! How a key whose effect was in doubt came to be completed (docs/contract.md §3): by its
//! sink's check, which found the effect or found none, or by an operator. Kept with the
//! completion as the extension section [`SETTLED_TAG`], so that `inspect` and `keys` can
//! say when and how; a completion that was never in doubt has none.
//!
//! Section body: `[how: 1 = check found, 2 = check absent, 3 = operator][at: i64 LE]`.

use super::DecodeError;

/// The tag of the section (see the module doc of `record`).
pub(super) const SETTLED_TAG: u8 = 0x80;

/// What settled a key in doubt, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settled {
    /// Who or what settled it.
    pub by: SettledBy,
    /// When, Unix ms.
    pub at_ms: i64,
}

/// Who or what settled a key in doubt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SettledBy {
    /// The sink's check found the effect: the record's result is the check's answer.
    CheckFound,
    /// The sink's check found no effect: the command was then run (the record is that
    /// run's), or, its TTL over, completed `failed` without running.
    CheckAbsent,
    /// An operator's `resolve --as`.
    Operator,
}

impl SettledBy {
    /// `check` or `operator`: what `inspect` shows as `settled_by`.
    pub fn who(self) -> &'static str {
        match self {
            SettledBy::CheckFound | SettledBy::CheckAbsent => "check",
            SettledBy::Operator => "operator",
        }
    }

    /// The check's answer, `found` or `absent`, when a check settled it.
    pub fn check_answer(self) -> Option<&'static str> {
        match self {
            SettledBy::CheckFound => Some("found"),
            SettledBy::CheckAbsent => Some("absent"),
            SettledBy::Operator => None,
        }
    }
}

impl Settled {
    /// Settled by `by`, now (`at_ms`).
    pub fn new(by: SettledBy, at_ms: i64) -> Settled {
        Settled { by, at_ms }
    }

    /// The section's body.
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        out.push(match self.by {
            SettledBy::CheckFound => 1,
            SettledBy::CheckAbsent => 2,
            SettledBy::Operator => 3,
        });
        out.extend_from_slice(&self.at_ms.to_le_bytes());
    }

    /// Reads a section's body.
    pub(super) fn decode(body: &[u8]) -> Result<Settled, DecodeError> {
        let [how, at @ ..] = body else { return Err(DecodeError("empty settlement section".into())) };
        let by = match how {
            1 => SettledBy::CheckFound,
            2 => SettledBy::CheckAbsent,
            3 => SettledBy::Operator,
            other => return Err(DecodeError(format!("unknown settlement {other}"))),
        };
        let at: [u8; 8] =
            at.try_into().map_err(|_| DecodeError(format!("settlement section of {} bytes, not 9", body.len())))?;
        Ok(Settled { by, at_ms: i64::from_le_bytes(at) })
    }

    /// The section's body length.
    pub(super) const LEN: usize = 9;
}
