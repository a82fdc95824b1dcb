//! `resolve KEY --check` (docs/contract.md §8): an `indeterminate` key settled by asking its
//! sink's receiver, with the sink's check, instead of by an operator's word. *found* makes
//! it `succeeded` with the check's answer as its result (what a call would have stored);
//! *absent* makes it `failed` (the effect does not exist: repeats replay the failure, as
//! after `resolve --as failed`); *unknown* or an error leaves it as it is.
//!
//! The CLI on a stopped instance's store and the admin API on a running one run the same
//! three steps: [`in_doubt`] (the record and the command kept with it), [`ask`] (the check;
//! no store lock held meanwhile), [`settle`] (the record replaced only if it is still the
//! one the check was asked about).

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::json;

use crate::sinks::{CheckAnswer, Sink};
use crate::store::{Indeterminate, KeyStore, Record, Settlement, StoreError, record_json};

/// Why a key was not settled by its check.
#[derive(Debug, thiserror::Error)]
pub enum SettleError {
    /// The key has no record.
    #[error("key {0:?} has no record")]
    NotFound(String),
    /// Only `indeterminate` records are settled.
    #[error("key {key:?} is {state}, not indeterminate")]
    NotIndeterminate { key: String, state: &'static str },
    /// The record does not keep its command (written before records kept it).
    #[error("key {0:?} does not keep the command in doubt, so its receiver cannot be asked: use resolve --as")]
    NotHeld(String),
    /// The sink the command went to is not in the config, or has no check.
    #[error("key {key:?} went to sink `{sink}`, which {why}: use resolve --as")]
    NoCheck { key: String, sink: String, why: &'static str },
    /// The check did not tell; the key is left as it was.
    #[error(
        "the check of sink `{sink}` did not tell whether key {key:?}'s effect exists ({answer}: {why}); the key stays indeterminate"
    )]
    Unsettled { key: String, sink: String, answer: &'static str, why: String },
    /// The record changed while the check ran (another operator, an expiry).
    #[error("key {0:?} changed while its check ran: nothing was written; inspect it")]
    Changed(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A key in doubt: its record, and the sink its command went to.
pub struct InDoubt {
    key: String,
    record: Indeterminate,
    sink: Arc<Sink>,
}

/// Step 1: `key`'s `indeterminate` record, with the command it keeps and the sink (of
/// `sinks`) that can be asked about it.
pub fn in_doubt(store: &KeyStore, sinks: &HashMap<String, Arc<Sink>>, key: &str) -> Result<InDoubt, SettleError> {
    let record = match store.get(key)? {
        None => return Err(SettleError::NotFound(key.into())),
        Some(Record::Indeterminate(record)) => record,
        Some(other) => return Err(SettleError::NotIndeterminate { key: key.into(), state: other.state().as_str() }),
    };
    let Some(held) = &record.held else { return Err(SettleError::NotHeld(key.into())) };
    let no_check = |why| SettleError::NoCheck { key: key.into(), sink: held.sink.clone(), why };
    let sink = sinks.get(&held.sink).ok_or_else(|| no_check("is not in the config"))?;
    if sink.check_timing().is_none() {
        return Err(no_check("has no check ([sinks.NAME.check])"));
    }
    Ok(InDoubt { key: key.into(), record, sink: Arc::clone(sink) })
}

/// Step 2: asks the receiver, now (no `check.delay`: the call was made long ago).
pub async fn ask(doubt: &InDoubt) -> CheckAnswer {
    let Some(held) = &doubt.record.held else { return CheckAnswer::Error("no command kept".into()) };
    doubt.sink.check_held(&doubt.key, held, doubt.record.claimed_at_ms).await
}

/// Step 3: settles the key by the check's `answer`, if its record is still the one asked
/// about; returns what `resolve --check` prints: the answer and the new record.
pub fn settle(
    store: &KeyStore,
    doubt: &InDoubt,
    answer: CheckAnswer,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<serde_json::Value, SettleError> {
    let label = answer.label();
    let sink = doubt.sink.name().to_string();
    let settled = match answer {
        CheckAnswer::Found(result) => Settlement::found(&result),
        CheckAnswer::Absent => Settlement::absent(format!(
            "the check of sink `{sink}` found no effect: the call did not land and the command was not run again; was: {}",
            doubt.record.why
        )),
        CheckAnswer::Unknown(why) | CheckAnswer::Error(why) => {
            return Err(SettleError::Unsettled { key: doubt.key.clone(), sink, answer: label, why });
        }
    };
    let Some(record) = store.settle(&doubt.key, &doubt.record, settled, now_ms, ttl_ms)? else {
        return Err(SettleError::Changed(doubt.key.clone()));
    };
    tracing::info!(key = doubt.key, sink, answer = label, "indeterminate key settled by its check");
    Ok(json!({"key": doubt.key, "sink": sink, "check": label, "record": record_json(&doubt.key, &record, now_ms)}))
}
