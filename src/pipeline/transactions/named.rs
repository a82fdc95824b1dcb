//! Invariant 8 of `transactions`: every transaction names its writer on dedupd's own topics,
//! so that a transaction left open there says whose it is (`changelog::stalled`).
//!
//! Forwards name their writer each, and the changelog writer the first record of each
//! partition in each transaction; they tell [`Naming`] so. A transaction that carries
//! something but no such record (results and offsets only, or only offsets: a commit that
//! proves ownership) gets one at its commit: a tombstone on the changelog keyed
//! [`WRITER_KEY_PREFIX`] and the writer, which no idempotency key can be (they hold no
//! control character) and which restores skip. Otherwise such a transaction, left open,
//! would hold no partition another instance watches, and yet stop every read of the
//! group's committed offsets (which waits for pending transactional offsets) until the
//! coordinator's timeout.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;

/// The header naming the `transactional.id` that wrote a record.
pub(crate) const WRITER_HEADER: &str = "dedupd-transaction";

/// How the key of a changelog record that only names its writer begins.
pub(crate) const WRITER_KEY_PREFIX: &str = "\u{0}dedupd-writer/";

/// The headers naming `id` as a record's writer.
pub(crate) fn writer_headers(id: &str) -> OwnedHeaders {
    OwnedHeaders::new().insert(Header { key: WRITER_HEADER, value: Some(id) })
}

/// Which transaction named its writer last, and where one that did not names it.
#[derive(Default)]
pub(super) struct Naming {
    /// The number of the last commit known to carry a record naming the writer.
    named_in: AtomicU64,
    /// Under `store.changelog`: the changelog topic, its partition for the writer's
    /// record, and that record's key.
    on: OnceLock<(String, i32, String)>,
}

impl Naming {
    /// Commit `number` carries a record naming the writer.
    pub(super) fn named(&self, number: u64) {
        self.named_in.fetch_max(number, Ordering::AcqRel);
    }

    /// Where a commit that names nothing else names the writer: partition `partition` of
    /// the changelog `topic`, under `key`. Set once.
    pub(super) fn name_on(&self, topic: &str, partition: i32, key: String) {
        let _ = self.on.set((topic.to_string(), partition, key));
    }

    /// The record commit `number` needs to name its writer (`headers`), if it needs one.
    pub(super) fn record_for(&self, number: u64, headers: OwnedHeaders) -> Option<FutureRecord<'_, str, [u8]>> {
        if self.named_in.load(Ordering::Acquire) >= number {
            return None;
        }
        let (topic, partition, key) = self.on.get()?;
        Some(FutureRecord::to(topic).partition(*partition).key(key.as_str()).headers(headers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_names_its_writer_once_unless_a_record_of_it_did() {
        let naming = Naming::default();
        assert!(naming.record_for(1, writer_headers("dedupd-a")).is_none(), "no changelog: nothing to name it on");
        naming.name_on("g.dedupd-state", 4, format!("{WRITER_KEY_PREFIX}dedupd-a"));
        let record = naming.record_for(1, writer_headers("dedupd-a")).expect("commit 1 names nothing");
        assert_eq!(
            (record.topic, record.partition, record.key),
            ("g.dedupd-state", Some(4), Some("\u{0}dedupd-writer/dedupd-a"))
        );
        assert!(record.payload.is_none(), "a tombstone");
        naming.named(2);
        assert!(naming.record_for(2, writer_headers("dedupd-a")).is_none(), "a forward named it");
        assert!(naming.record_for(3, writer_headers("dedupd-a")).is_some());
    }
}
