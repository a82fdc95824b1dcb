//! The by-key hop (docs/decisions.md, "State on Kafka"; `store.changelog` without `kafka.copartitioned`): an input
//! partition's worker forwards each valid command to its key's partition of the by-key topic
//! (`"<kafka.group_id>.dedupd-by-key"`), in the transaction that commits the input offset,
//! and the by-key partition's worker decides it there, so every repeat of a key meets the
//! key's history whatever input partition it came on. A record that is not a command is
//! rejected before the hop.
//!
//! A forward is the input record itself, keyed by the idempotency key, with the input's
//! headers, value and timestamp, and four headers appended last, in this order:
//! `dedupd-source-topic`, `dedupd-source-partition`, `dedupd-source-offset` (decimal) and
//! `dedupd-source-key` (the input's own key; a null value when it had none), then
//! `dedupd-transaction`, the `transactional.id` of the instance that forwarded it
//! (`transactions`, invariant 8). [`original`] takes them off again, so that the decision, the result and any dead letter see and name
//! the input record, never the by-key topic.
//! - `purge`: what the group has committed on the by-key topic is deleted from it.

mod purge;

pub(crate) use purge::{Purger, purge_every};

use rdkafka::Timestamp;
use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::FutureRecord;

use crate::envelope::read_headers;
use crate::pipeline::transactions::WRITER_HEADER;

/// The headers a forward carries after the input's own, in this order.
const SOURCE_HEADERS: [&str; 4] =
    ["dedupd-source-topic", "dedupd-source-partition", "dedupd-source-offset", "dedupd-source-key"];

/// The forward of `input`, whose idempotency key is `key`, to partition `partition` of
/// `topic`, by the producer whose `transactional.id` is `writer`.
pub(crate) fn forward_record<'a>(
    (topic, partition): (&'a str, i32),
    key: &'a str,
    input: &'a OwnedMessage,
    writer: &str,
) -> FutureRecord<'a, [u8], [u8]> {
    let headers = input
        .headers()
        .cloned()
        .unwrap_or_default()
        .insert(Header { key: SOURCE_HEADERS[0], value: Some(input.topic()) })
        .insert(Header { key: SOURCE_HEADERS[1], value: Some(&input.partition().to_string()) })
        .insert(Header { key: SOURCE_HEADERS[2], value: Some(&input.offset().to_string()) })
        .insert(Header { key: SOURCE_HEADERS[3], value: input.key() })
        .insert(Header { key: WRITER_HEADER, value: Some(writer) });
    let mut record = FutureRecord::<[u8], [u8]>::to(topic).partition(partition).key(key.as_bytes()).headers(headers);
    if let Some(value) = input.payload() {
        record = record.payload(value);
    }
    if let Some(ms) = input.timestamp().to_millis() {
        record = record.timestamp(ms);
    }
    record
}

/// The bytes of `input`'s forward under the idempotency key `key` (to a topic named
/// `topic`, written by `writer`): its key, value and headers, dedupd's included.
pub(crate) fn forward_size(topic: &str, key: &str, input: &OwnedMessage, writer: &str) -> usize {
    let names: usize = SOURCE_HEADERS.iter().map(|n| n.len()).sum::<usize>() + WRITER_HEADER.len();
    let ours = names + input.topic().len() + 11 + 20 + input.key().map_or(0, <[u8]>::len) + writer.len();
    let theirs = input.headers().map_or(0, crate::envelope::header_bytes);
    topic.len() + key.len() + input.payload().map_or(0, <[u8]>::len) + theirs + ours
}

/// The input record a forward was made of: its topic, partition, offset, key and headers
/// back in place. A record of the by-key topic without them (not written by dedupd) is
/// taken as it is: an input record of that topic.
pub(crate) fn original(forward: OwnedMessage) -> OwnedMessage {
    let Some(headers) = forward.headers() else { return forward };
    let mut all = read_headers(headers).headers;
    // Forwards made before the writer was named (an upgrade under way) end at the source
    // headers.
    if all.last().is_some_and(|(name, _)| name == WRITER_HEADER) {
        all.pop();
    }
    let Some(at) = all.len().checked_sub(SOURCE_HEADERS.len()) else { return forward };
    let names_match = all[at..].iter().zip(SOURCE_HEADERS).all(|((name, _), expected)| name == expected);
    if !names_match {
        return forward;
    }
    let ours: Vec<Option<Vec<u8>>> = all.split_off(at).into_iter().map(|(_, v)| v).collect();
    let text = |i: usize| ours[i].as_deref().and_then(|v| std::str::from_utf8(v).ok());
    let (Some(topic), Some(Ok(partition)), Some(Ok(offset))) =
        (text(0), text(1).map(str::parse::<i32>), text(2).map(str::parse::<i64>))
    else {
        return forward;
    };
    let mut kept = OwnedHeaders::new_with_capacity(all.len());
    for (name, value) in &all {
        kept = kept.insert(Header { key: name, value: value.as_deref() });
    }
    let timestamp = forward.timestamp().to_millis().map_or(Timestamp::NotAvailable, Timestamp::CreateTime);
    OwnedMessage::new(
        forward.payload().map(<[u8]>::to_vec),
        ours[3].clone(),
        topic.to_string(),
        timestamp,
        partition,
        offset,
        (!all.is_empty()).then_some(kept),
    )
}

#[cfg(test)]
mod tests {
    use rdkafka::message::{Message, OwnedHeaders, OwnedMessage};

    use super::*;

    /// What the broker hands back for `record` at `offset` of partition 5.
    fn consumed(record: &FutureRecord<'_, [u8], [u8]>, offset: i64) -> OwnedMessage {
        OwnedMessage::new(
            record.payload.map(<[u8]>::to_vec),
            record.key.map(<[u8]>::to_vec),
            record.topic.to_string(),
            record.timestamp.map_or(Timestamp::NotAvailable, Timestamp::CreateTime),
            record.partition.unwrap_or(-1),
            offset,
            record.headers.clone(),
        )
    }

    fn input(key: Option<&[u8]>, headers: Option<OwnedHeaders>) -> OwnedMessage {
        OwnedMessage::new(
            Some(br#"{"type":"t"}"#.to_vec()),
            key.map(<[u8]>::to_vec),
            "commands".into(),
            Timestamp::CreateTime(1_700_000_000_000),
            2,
            41,
            headers,
        )
    }

    fn names_and_values(m: &OwnedMessage) -> Vec<(String, Option<Vec<u8>>)> {
        m.headers().map(|h| read_headers(h).headers).unwrap_or_default()
    }

    #[test]
    fn a_forward_is_keyed_and_placed_by_the_idempotency_key_and_reads_back_as_its_input() {
        let headers = OwnedHeaders::new()
            .insert(Header { key: "traceparent", value: Some("00-abc-def-01") })
            .insert(Header { key: "empty", value: None::<&[u8]> });
        let original_input = input(Some(b"producer-key"), Some(headers));
        let record = forward_record(("g.dedupd-by-key", 5), "order-17", &original_input, "dedupd-0123456789abcdef");
        assert_eq!((record.topic, record.partition, record.key), ("g.dedupd-by-key", Some(5), Some(&b"order-17"[..])));
        let forward = consumed(&record, 900);
        assert_eq!(forward.timestamp().to_millis(), Some(1_700_000_000_000), "the input's timestamp is kept");
        let last = names_and_values(&forward).pop();
        assert_eq!(
            last,
            Some((WRITER_HEADER.to_string(), Some(b"dedupd-0123456789abcdef".to_vec()))),
            "names its writer"
        );
        let back = original(forward);
        assert_eq!((back.topic(), back.partition(), back.offset()), ("commands", 2, 41));
        assert_eq!(back.key(), Some(&b"producer-key"[..]));
        assert_eq!(back.payload(), original_input.payload());
        assert_eq!(back.timestamp().to_millis(), Some(1_700_000_000_000));
        assert_eq!(names_and_values(&back), names_and_values(&original_input), "the input's headers, in order, only");
    }

    #[test]
    fn a_forwards_size_counts_what_goes_to_the_broker() {
        let headers = OwnedHeaders::new().insert(Header { key: "h", value: Some("0123456789") });
        let original_input = input(Some(b"producer-key"), Some(headers));
        let record = forward_record(("hop", 1), "order-17", &original_input, "dedupd-0123456789abcdef");
        let value = record.payload.map_or(0, <[u8]>::len);
        let headers = record.headers.as_ref().map_or(0, crate::envelope::header_bytes);
        let exact = record.key.map_or(0, <[u8]>::len) + value + headers;
        let counted = forward_size("hop", "order-17", &original_input, "dedupd-0123456789abcdef");
        assert!(counted >= exact, "{counted} < {exact}: a forward could be larger than counted");
        assert!(counted <= exact + 64, "{counted} counts far more than {exact}");
    }

    #[test]
    fn an_input_without_key_or_headers_comes_back_without_them() {
        let original_input = input(None, None);
        let back = original(consumed(&forward_record(("hop", 0), "k", &original_input, "dedupd-0123456789abcdef"), 3));
        assert_eq!(back.key(), None);
        assert!(back.headers().is_none());
        assert_eq!((back.topic(), back.partition(), back.offset()), ("commands", 2, 41));
    }

    #[test]
    fn a_forward_that_names_no_writer_reads_back_as_its_input_too() {
        let original_input = input(Some(b"producer-key"), None);
        let mut record = forward_record(("hop", 0), "k", &original_input, "dedupd-0123456789abcdef");
        // As forwarded before writers were named (an upgrade under way): the source headers last.
        let all = names_and_values(&consumed(&record, 3));
        let mut headers = OwnedHeaders::new();
        for (name, value) in &all[..all.len() - 1] {
            headers = headers.insert(Header { key: name, value: value.as_deref() });
        }
        record.headers = Some(headers);
        let back = original(consumed(&record, 3));
        assert_eq!((back.topic(), back.partition(), back.offset()), ("commands", 2, 41));
        assert_eq!(back.key(), Some(&b"producer-key"[..]));
        assert!(back.headers().is_none());
    }

    #[test]
    fn a_record_dedupd_did_not_forward_is_taken_as_it_is() {
        let headers = OwnedHeaders::new().insert(Header { key: "dedupd-source-topic", value: Some("x") });
        let stray = OwnedMessage::new(None, None, "hop".into(), Timestamp::NotAvailable, 1, 7, Some(headers));
        let back = original(stray);
        assert_eq!((back.topic(), back.partition(), back.offset()), ("hop", 1, 7));
        let bad_offset = OwnedHeaders::new()
            .insert(Header { key: "dedupd-source-topic", value: Some("commands") })
            .insert(Header { key: "dedupd-source-partition", value: Some("0") })
            .insert(Header { key: "dedupd-source-offset", value: Some("not a number") })
            .insert(Header { key: "dedupd-source-key", value: None::<&[u8]> });
        let stray = OwnedMessage::new(None, None, "hop".into(), Timestamp::NotAvailable, 1, 8, Some(bad_offset));
        assert_eq!(original(stray).topic(), "hop");
    }
}
