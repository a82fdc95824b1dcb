//! Operator actions (docs/contract.md §3, §8): `resolve` an indeterminate key as succeeded or failed,
//! `forget` a key (refusing an `in_progress` one unless forced), and the stats document.
//! The CLI on a stopped store and the admin API on a running one both call these, so the
//! two paths behave alike.

use super::{Completed, Completion, Held, Indeterminate, KeyStore, Record, Settled, SettledBy, StoreError};

/// What an operator resolving an `in_progress` key needs to know: a claim left by a crash is
/// found (and made `indeterminate`, or run again) only when its key comes again to a running
/// instance.
const IN_PROGRESS_HINT: &str = ": a claim left by a crash turns indeterminate (or runs again, for a key-forwarding \
     sink) when its key comes again to a running instance; to drop it now, `forget --force`";

/// Why a resolve did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The key has no record.
    #[error("key {0:?} has no record")]
    NotFound(String),
    /// Only `indeterminate` records can be resolved.
    #[error("key {key:?} is {state}, not indeterminate{}", if *state == "in_progress" { IN_PROGRESS_HINT } else { "" })]
    NotIndeterminate { key: String, state: &'static str },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a forget did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ForgetError {
    /// The key has no record.
    #[error("key {0:?} has no record")]
    NotFound(String),
    /// The key is claimed; forgetting a claim that an instance is executing makes that
    /// instance's completion fail, so it takes `force`.
    #[error(
        "key {0:?} is in_progress (being executed, or orphaned by a crash); forget it only when no \
         instance is executing it, with force"
    )]
    InProgress(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl KeyStore {
    /// Removes `key`; an `in_progress` record only with `force`. Returns what was there.
    /// Flushed before returning.
    pub fn forget_checked(&self, key: &str, force: bool) -> Result<Record, ForgetError> {
        loop {
            let current = match self.get(key)? {
                None => return Err(ForgetError::NotFound(key.to_string())),
                Some(Record::InProgress(_)) if !force => return Err(ForgetError::InProgress(key.to_string())),
                Some(r) => r,
            };
            if self.compare_and_swap(key, Some(&current), None)?.is_ok() {
                self.flush_always()?;
                return Ok(current);
            }
        }
    }

    /// What `stats` shows: backend, records per state, disk bytes, next expiry, watermarks.
    pub fn stats_json(&self) -> Result<serde_json::Value, StoreError> {
        Ok(serde_json::json!({
            "backend": self.backend_name(),
            "records": self.counts(),
            "disk_bytes": self.disk_bytes()?,
            "next_expiry": self.next_expiry()?.map(crate::time::rfc3339_ms),
            "watermarks": self.watermarks()?.len(),
        }))
    }

    /// Turns an `indeterminate` record into a `completed` one with `outcome`, expiring
    /// `ttl_ms` after `now_ms`; repeats then replay it. Flushed before returning.
    pub fn resolve(&self, key: &str, outcome: Completion, now_ms: i64, ttl_ms: i64) -> Result<Record, ResolveError> {
        loop {
            let current = self.get(key)?;
            let ind = match &current {
                None => return Err(ResolveError::NotFound(key.to_string())),
                Some(Record::Indeterminate(ind)) => ind,
                Some(other) => {
                    return Err(ResolveError::NotIndeterminate { key: key.to_string(), state: other.state().as_str() });
                }
            };
            let settled = Settlement {
                outcome,
                result: br#"{"resolved_by":"operator"}"#.to_vec(),
                error: match outcome {
                    Completion::Succeeded => None,
                    Completion::Failed => Some(format!("resolved as failed by an operator; was: {}", ind.why)),
                },
                by: SettledBy::Operator,
            };
            let new = settled.record(ind, now_ms, ttl_ms);
            if self.compare_and_swap(key, current.as_ref(), Some(&new))?.is_ok() {
                self.flush_always()?;
                return Ok(new);
            }
        }
    }

    /// Completes `key`'s `indeterminate` record `was` as `settled` says, if it is still
    /// `was` (`None` when it changed meanwhile), expiring `ttl_ms` after `now_ms`. Flushed
    /// before returning.
    pub fn settle(
        &self,
        key: &str,
        was: &Indeterminate,
        settled: Settlement,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<Option<Record>, StoreError> {
        let new = settled.record(was, now_ms, ttl_ms);
        let expected = Record::Indeterminate(was.clone());
        if self.compare_and_swap(key, Some(&expected), Some(&new))?.is_err() {
            return Ok(None);
        }
        self.flush_always()?;
        Ok(Some(new))
    }
}

/// How an `indeterminate` key is settled: the outcome repeats replay, with its result and
/// error, and what settled it (kept with the record, [`Settled`]).
#[derive(Debug, Clone)]
pub struct Settlement {
    /// The outcome.
    pub outcome: Completion,
    /// The result, JSON text.
    pub result: Vec<u8>,
    /// The error of a failure.
    pub error: Option<String>,
    /// Who or what settled it.
    pub by: SettledBy,
}

impl Settlement {
    /// `succeeded`, with what a check found at the receiver as the result.
    pub fn found(answer: &serde_json::Value) -> Settlement {
        Settlement {
            outcome: Completion::Succeeded,
            result: answer.to_string().into_bytes(),
            error: None,
            by: SettledBy::CheckFound,
        }
    }

    /// `failed` without running the command again, a check having found no effect:
    /// `error` says why it was not run.
    pub fn absent(error: String) -> Settlement {
        Settlement {
            outcome: Completion::Failed,
            result: b"{}".to_vec(),
            error: Some(error),
            by: SettledBy::CheckAbsent,
        }
    }

    /// The completed record replacing `ind`.
    fn record(self, ind: &Indeterminate, now_ms: i64, ttl_ms: i64) -> Record {
        Record::Completed(Completed {
            fingerprint: ind.fingerprint,
            outcome: self.outcome,
            result: self.result,
            error: self.error,
            first_seen_at_ms: ind.claimed_at_ms,
            completed_at_ms: now_ms,
            expires_at_ms: now_ms.saturating_add(ttl_ms),
            attempts: ind.attempts,
            // The claim's source is kept with the command in doubt, when it was.
            source: ind.held.as_ref().map(|h| h.source.clone()),
            settled: Some(Settled::new(self.by, now_ms)),
        })
    }
}

/// A record as JSON for people (`inspect`, `resolve`), read at `now_ms`: a completed record
/// says whether it has expired.
pub fn record_json(key: &str, record: &Record, now_ms: i64) -> serde_json::Value {
    use crate::time::rfc3339_ms;
    use serde_json::json;
    match record {
        Record::InProgress(r) => {
            let mut json = json!({
                "key": key, "state": "in_progress", "fingerprint": r.fingerprint.to_string(),
                "claimed_at": rfc3339_ms(r.claimed_at_ms), "attempts": r.attempts,
                "source": {"topic": r.source.topic, "partition": r.source.partition, "offset": r.source.offset},
            });
            // The reconciler's run of a key in doubt keeps the command it runs.
            if let Some(held) = &r.held {
                held_json(&mut json, held);
            }
            json
        }
        Record::Completed(r) => {
            let mut json = json!({
                "key": key, "state": "completed", "fingerprint": r.fingerprint.to_string(),
                "outcome": r.outcome.as_str(),
                "result": serde_json::from_slice::<serde_json::Value>(&r.result)
                    .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&r.result).into_owned())),
                "error": r.error, "first_seen_at": rfc3339_ms(r.first_seen_at_ms),
                "completed_at": rfc3339_ms(r.completed_at_ms), "expires_at": rfc3339_ms(r.expires_at_ms),
                "attempts": r.attempts, "source": r.source,
                // Past `expires_at` the record is as good as absent (the decision table reads
                // it so) until compaction removes it: the key's next command runs again.
                "expired": record.is_expired(now_ms),
            });
            // How a key that was in doubt was settled: by its check (and what it found) or
            // by an operator, and when.
            if let Some(settled) = &r.settled {
                json["settled_by"] = json!(settled.by.who());
                json["settled_at"] = json!(rfc3339_ms(settled.at_ms));
                if let Some(answer) = settled.by.check_answer() {
                    json["check_answer"] = json!(answer);
                }
            }
            json
        }
        Record::Indeterminate(r) => {
            let mut json = json!({
                "key": key, "state": "indeterminate", "fingerprint": r.fingerprint.to_string(),
                "claimed_at": rfc3339_ms(r.claimed_at_ms), "attempts": r.attempts, "why": r.why,
            });
            // The command in doubt, for the operator who asks its receiver (and for a check).
            if let Some(held) = &r.held {
                held_json(&mut json, held);
            }
            json
        }
    }
}

/// Adds the command a record keeps to its JSON.
fn held_json(json: &mut serde_json::Value, held: &Held) {
    json["sink"] = serde_json::json!(held.sink);
    json["route"] = serde_json::json!(held.route);
    json["type"] = serde_json::json!(held.kind);
    json["payload"] = serde_json::from_slice(&held.payload)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&held.payload).into_owned()));
    json["source"] = serde_json::json!(held.source);
    if let Some(client) = &held.intake_client {
        json["source"]["intake"] = serde_json::json!({ "client": client });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completed_record_says_whether_it_has_expired() {
        let record = Record::Completed(crate::store::tests::completed(7, 10_000));
        // Expired from `expires_at` on, as the decision table reads it (`Record::is_expired`).
        for (now, expired) in [(9_999, false), (10_000, true), (20_000, true)] {
            let json = record_json("k", &record, now);
            assert_eq!(json["expired"], expired, "at {now}");
            assert_eq!(json["expires_at"], "1970-01-01T00:00:10.000Z");
        }
    }

    #[test]
    fn a_completed_record_says_what_settled_it_when_it_was_in_doubt() {
        let plain = crate::store::tests::completed(7, 10_000);
        let json = record_json("k", &Record::Completed(plain.clone()), 0);
        for field in ["settled_by", "settled_at", "check_answer"] {
            assert!(json.get(field).is_none(), "never in doubt: no {field}");
        }
        for (by, who, answer) in [
            (SettledBy::CheckFound, "check", Some("found")),
            (SettledBy::CheckAbsent, "check", Some("absent")),
            (SettledBy::Operator, "operator", None),
        ] {
            let settled = Completed { settled: Some(Settled::new(by, 1_500)), ..plain.clone() };
            let json = record_json("k", &Record::Completed(settled), 0);
            assert_eq!((json["settled_by"].as_str(), json["check_answer"].as_str()), (Some(who), answer), "{by:?}");
            assert_eq!(json["settled_at"], "1970-01-01T00:00:01.500Z");
        }
    }

    #[test]
    fn resolving_an_in_progress_key_says_when_it_can_be() {
        let busy = ResolveError::NotIndeterminate { key: "k".into(), state: "in_progress" }.to_string();
        assert!(busy.contains("comes again to a running instance") && busy.contains("forget --force"), "{busy}");
        let done = ResolveError::NotIndeterminate { key: "k".into(), state: "completed" }.to_string();
        assert_eq!(done, "key \"k\" is completed, not indeterminate");
    }
}
