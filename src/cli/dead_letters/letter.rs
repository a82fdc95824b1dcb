//! What one record of the dead-letter topic is (docs/contract.md §5): a dead-letter copy (the
//! input's key, value and headers, then dedupd's `dedupd-reason`, `dedupd-error` and
//! `dedupd-source`), a stand-in (those three and `dedupd-original-size`, no key, no value),
//! a replay's mark (`dedupd-replayed-of`), or something dedupd did not write.

use std::fmt;

use rdkafka::Message;
use rdkafka::message::BorrowedMessage;

use crate::envelope::{HeaderList, read_headers};

/// The dead-letter copy's reason (docs/contract.md §1).
pub(super) const REASON: &str = "dedupd-reason";
/// The sentence saying what was wrong.
const ERROR: &str = "dedupd-error";
/// Where the input was: `topic/partition/offset`.
const SOURCE: &str = "dedupd-source";
/// On a stand-in only: the size of the value it stands in for.
const ORIGINAL_SIZE: &str = "dedupd-original-size";
/// On a replayed record: the dead letter it is a replay of (`topic/partition/offset`).
pub(super) const REPLAY_OF: &str = "dedupd-replay-of";
/// On a mark in the dead-letter topic: the dead letter it says was replayed.
pub(super) const REPLAYED_OF: &str = "dedupd-replayed-of";
/// On a mark: where the replay went.
pub(super) const REPLAYED_TO: &str = "dedupd-replayed-to";
/// The key of every mark: one that no command's Kafka key is likely to be, so a reader of
/// the dead-letter topic tells marks apart by key as well as by header.
pub(super) const MARK_KEY: &str = "dedupd-replayed";

/// A record's place: `topic/partition/offset`, as `dedupd-source` writes it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Position {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl Position {
    /// Parses `topic/partition/offset`. Split from the right: a topic name cannot hold a
    /// `/` in Kafka, but the two numbers are surely last.
    pub fn parse(text: &str) -> Option<Position> {
        let mut parts = text.rsplitn(3, '/');
        let offset = parts.next()?.parse().ok()?;
        let partition = parts.next()?.parse().ok()?;
        let topic = parts.next().filter(|t| !t.is_empty())?.to_string();
        Some(Position { topic, partition, offset })
    }

    /// The place of `message`.
    pub fn of(message: &BorrowedMessage<'_>) -> Position {
        Position { topic: message.topic().to_string(), partition: message.partition(), offset: message.offset() }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.topic, self.partition, self.offset)
    }
}

/// A dead-letter copy: what to re-produce, and what to select it by.
#[derive(Debug, Clone)]
pub(super) struct Letter {
    /// Its place in the dead-letter topic.
    pub at: Position,
    /// Its `dedupd-reason`.
    pub reason: String,
    /// Its `dedupd-source`, when it has a readable one.
    pub source: Option<Position>,
    /// Its timestamp (when it was dead-lettered), in milliseconds since the epoch.
    pub timestamp_ms: Option<i64>,
    /// The input's key.
    pub key: Option<Vec<u8>>,
    /// The input's value.
    pub value: Option<Vec<u8>>,
    /// The input's own headers, without dedupd's.
    pub headers: HeaderList,
    /// Headers of the copy whose name rdkafka cannot hand out (not UTF-8): the copy cannot
    /// be re-produced as it was.
    pub unreadable_headers: usize,
}

/// One record of the dead-letter topic.
#[derive(Debug)]
pub(super) enum Record {
    /// A dead-letter copy.
    Letter(Letter),
    /// A stand-in for a copy too large to publish: nothing to re-produce.
    StandIn { at: Position, reason: String, source: Option<String>, original_size: String, timestamp_ms: Option<i64> },
    /// A replay's mark: `of` was replayed.
    Mark { of: Position },
    /// Not written by dedupd as a dead letter (or a mark naming nothing readable).
    Other,
}

/// The last value of header `name` in `headers`, as text.
fn last(headers: &HeaderList, name: &str) -> Option<String> {
    headers
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.as_deref())
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// Reads one record of the dead-letter topic.
pub(super) fn classify(message: &BorrowedMessage<'_>) -> Record {
    let read = message.headers().map(read_headers).unwrap_or_default();
    let mut headers = read.headers;
    if let Some(of) = last(&headers, REPLAYED_OF) {
        return Position::parse(&of).map_or(Record::Other, |of| Record::Mark { of });
    }
    let Some(reason) = last(&headers, REASON) else { return Record::Other };
    let at = Position::of(message);
    let source_text = last(&headers, SOURCE);
    if let Some(original_size) = last(&headers, ORIGINAL_SIZE)
        && message.payload().is_none()
    {
        let timestamp_ms = message.timestamp().to_millis();
        return Record::StandIn { at, reason, source: source_text, original_size, timestamp_ms };
    }
    strip_reason_headers(&mut headers);
    Record::Letter(Letter {
        at,
        reason,
        source: source_text.as_deref().and_then(Position::parse),
        timestamp_ms: message.timestamp().to_millis(),
        key: message.key().map(<[u8]>::to_vec),
        value: message.payload().map(<[u8]>::to_vec),
        headers,
        unreadable_headers: read.unreadable,
    })
}

/// Takes dedupd's reason headers off a copy's headers: publish.rs appends exactly these
/// three, in this order, after the input's own; only that tail is removed, so an input
/// header of the same name (a record dead-lettered twice) stays as the input had it.
pub(super) fn strip_reason_headers(headers: &mut HeaderList) {
    const ADDED: [&str; 3] = [REASON, ERROR, SOURCE];
    let n = headers.len();
    if n >= ADDED.len() && headers[n - ADDED.len()..].iter().zip(ADDED).all(|((k, _), want)| k == want) {
        headers.truncate(n - ADDED.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(names: &[&str]) -> HeaderList {
        names.iter().map(|n| (n.to_string(), Some(b"v".to_vec()))).collect()
    }

    #[test]
    fn positions_parse_from_the_right_and_print_back() {
        let p = Position::parse("orders.v1/3/1042").unwrap();
        assert_eq!(p, Position { topic: "orders.v1".into(), partition: 3, offset: 1042 });
        assert_eq!(p.to_string(), "orders.v1/3/1042");
        for bad in ["", "t/1", "/1/2", "t/x/2", "t/1/y", "t/1/2/"] {
            assert_eq!(Position::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn only_the_reason_headers_publish_appends_are_stripped() {
        let mut copy = h(&["traceparent", "x", REASON, ERROR, SOURCE]);
        strip_reason_headers(&mut copy);
        assert_eq!(copy, h(&["traceparent", "x"]));
        // Dead-lettered twice: the first copy's headers are the input's now.
        let mut twice = h(&[REASON, ERROR, SOURCE, REPLAY_OF, REASON, ERROR, SOURCE]);
        strip_reason_headers(&mut twice);
        assert_eq!(twice, h(&[REASON, ERROR, SOURCE, REPLAY_OF]));
        // Not in publish.rs's order: not dedupd's tail, left alone.
        let mut other = h(&["a", SOURCE, ERROR, REASON]);
        strip_reason_headers(&mut other);
        assert_eq!(other, h(&["a", SOURCE, ERROR, REASON]));
    }
}
