//! `keys`: the records matching a filter, as JSON lines (docs/contract.md §8): how an
//! operator finds what waits for them (`--state indeterminate --sink payments`) without
//! knowing the keys. The CLI on a stopped store and the admin API on a running one both
//! call [`KeyStore::list_keys`].

use std::io::Write;

use serde::{Deserialize, Serialize};

use super::{KeyStore, Record, State, StoreError, TransferError, record_json};

/// Which records `keys` lists: every condition given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyFilter {
    /// The record's state.
    pub state: Option<State>,
    /// The route that claimed the key. Only records of keys in doubt keep it (with the
    /// command in doubt: `indeterminate` ones, and the reconciler's claims); any other
    /// record never matches a route.
    pub route: Option<String>,
    /// The sink of that route, known as the route is.
    pub sink: Option<String>,
    /// The record took its state at or after this instant (Unix ms): claimed (`in_progress`,
    /// `indeterminate`) or completed (`completed`).
    pub since_ms: Option<i64>,
    /// ... and before this one.
    pub until_ms: Option<i64>,
}

/// A [`KeyFilter`] in words, as `dedupd keys` takes it and `GET /v1/keys` reads it from
/// its query: a state's name, instants in RFC 3339.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeysQuery {
    /// `in_progress`, `completed` or `indeterminate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// The route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// The sink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink: Option<String>,
    /// RFC 3339, e.g. `2026-12-07T10:00:00Z`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
}

impl KeysQuery {
    /// Its fields' names, as a query string and `--where` spell them.
    pub const FIELDS: [&str; 5] = ["state", "route", "sink", "since", "until"];

    /// The query of `FIELD=VALUE` pairs (an admin API query string, `--where`s), or what is
    /// wrong with them: an unknown field. The values are checked by [`KeysQuery::filter`].
    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, String)>) -> Result<KeysQuery, String> {
        let map: serde_json::Map<String, serde_json::Value> = pairs.into_iter().map(|(k, v)| (k, v.into())).collect();
        serde_json::from_value(map.into()).map_err(|e| e.to_string())
    }

    /// The fields given, as `(name, value)` pairs.
    pub fn pairs(&self) -> impl Iterator<Item = (&'static str, &str)> {
        let KeysQuery { state, route, sink, since, until } = self;
        Self::FIELDS.into_iter().zip([state, route, sink, since, until]).filter_map(|(n, v)| Some((n, v.as_deref()?)))
    }

    /// The filter it says, or what is wrong with it, naming the field.
    pub fn filter(&self) -> Result<KeyFilter, String> {
        Ok(KeyFilter {
            state: self.state.as_deref().map(parse_state).transpose().map_err(|e| format!("state: {e}"))?,
            route: self.route.clone(),
            sink: self.sink.clone(),
            since_ms: instant("since", self.since.as_deref())?,
            until_ms: instant("until", self.until.as_deref())?,
        })
    }
}

/// The instant `text` says (Unix ms), or why not, naming the field.
fn instant(field: &str, text: Option<&str>) -> Result<Option<i64>, String> {
    text.map(|t| {
        chrono::DateTime::parse_from_rfc3339(t)
            .map(|t| t.timestamp_millis())
            .map_err(|e| format!("{field}: {t:?} is not an RFC 3339 instant such as 2026-12-07T10:00:00Z ({e})"))
    })
    .transpose()
}

/// A state by its name, or why not.
fn parse_state(name: &str) -> Result<State, String> {
    State::ALL.into_iter().find(|s| s.as_str() == name).ok_or_else(|| {
        let names: Vec<&str> = State::ALL.iter().map(|s| s.as_str()).collect();
        format!("no state {name:?}: one of {}", names.join(", "))
    })
}

impl KeyFilter {
    /// Whether `record` matches.
    pub fn matches(&self, record: &Record) -> bool {
        let held = match record {
            Record::Indeterminate(i) => i.held.as_deref(),
            Record::InProgress(p) => p.held.as_deref(),
            Record::Completed(_) => None,
        };
        let at = record.changed_at_ms();
        self.state.is_none_or(|s| s == record.state())
            && self.route.as_ref().is_none_or(|r| held.is_some_and(|h| &h.route == r))
            && self.sink.as_ref().is_none_or(|s| held.is_some_and(|h| &h.sink == s))
            && self.since_ms.is_none_or(|since| at >= since)
            && self.until_ms.is_none_or(|until| at < until)
    }
}

/// Records read per page by an operator's listing: what a running instance's writes may wait
/// for at a time (as an export's).
const PAGE: usize = 1000;

impl KeyStore {
    /// Writes the records matching `filter` to `out`, one [`record_json`] per line, in key
    /// order, a page at a time; returns how many. Not a snapshot, as an export is not.
    pub fn list_keys(&self, filter: &KeyFilter, now_ms: i64, out: &mut dyn Write) -> Result<u64, TransferError> {
        let mut listed = 0;
        self.for_each_record_page(PAGE, |page| {
            for (key, record) in page.iter().filter(|(_, r)| filter.matches(r)) {
                serde_json::to_writer(&mut *out, &record_json(key, record, now_ms)).map_err(std::io::Error::from)?;
                out.write_all(b"\n")?;
                listed += 1;
            }
            Ok::<_, TransferError>(())
        })?;
        out.flush()?;
        Ok(listed)
    }

    /// The keys whose records match `filter`, in key order (for an operator's action on
    /// each: `resolve --where`, `forget --where`).
    pub fn matching_keys(&self, filter: &KeyFilter) -> Result<Vec<String>, StoreError> {
        let mut keys = Vec::new();
        self.for_each_record_page(PAGE, |page| {
            keys.extend(page.into_iter().filter(|(_, r)| filter.matches(r)).map(|(k, _)| k));
            Ok::<_, StoreError>(())
        })?;
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Held, Indeterminate, SourcePos};

    fn indeterminate(claimed_at_ms: i64, route: &str, sink: &str) -> Record {
        Record::Indeterminate(Indeterminate {
            fingerprint: crate::fingerprint::Fingerprint([1; 32]),
            claimed_at_ms,
            attempts: 1,
            why: "w".into(),
            held: Some(Box::new(Held {
                sink: sink.into(),
                route: route.into(),
                kind: "t".into(),
                payload: b"{}".to_vec(),
                source: SourcePos { topic: "in".into(), partition: 0, offset: 1 },
                intake_client: None,
            })),
        })
    }

    fn filter(json: &str) -> Result<KeyFilter, String> {
        serde_json::from_str::<KeysQuery>(json).map_err(|e| e.to_string())?.filter()
    }

    #[test]
    fn every_condition_given_must_hold() {
        let r = indeterminate(5_000, "payments", "pay-api");
        for (query, matches) in [
            ("{}", true),
            (r#"{"state": "indeterminate"}"#, true),
            (r#"{"state": "completed"}"#, false),
            (r#"{"route": "payments", "sink": "pay-api"}"#, true),
            (r#"{"route": "payments", "sink": "mail"}"#, false),
            (r#"{"route": "emails"}"#, false),
            (r#"{"since": "1970-01-01T00:00:05Z", "until": "1970-01-01T00:00:05.001Z"}"#, true),
            (r#"{"since": "1970-01-01T00:00:05.001Z"}"#, false),
            (r#"{"until": "1970-01-01T01:00:05+01:00"}"#, false),
        ] {
            assert_eq!(filter(query).unwrap().matches(&r), matches, "{query}");
        }
        // A completed record keeps no route: it never matches one.
        let done = Record::Completed(crate::store::tests::completed(7, 10_000));
        assert!(!filter(r#"{"route": "payments"}"#).unwrap().matches(&done));
        assert!(filter(r#"{"state": "completed"}"#).unwrap().matches(&done));
    }

    #[test]
    fn a_bad_filter_names_its_cause() {
        let e = filter(r#"{"state": "done"}"#).unwrap_err();
        assert_eq!(e, "state: no state \"done\": one of in_progress, completed, indeterminate");
        let e = filter(r#"{"since": "yesterday"}"#).unwrap_err();
        assert!(e.starts_with("since: \"yesterday\" is not an RFC 3339 instant"), "{e}");
        assert!(filter(r#"{"sinks": "x"}"#).is_err(), "unknown fields are refused");
    }
}
