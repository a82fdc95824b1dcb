//! Per-partition watermarks: the highest input offset the store has recorded for each
//! partition, kept in the backend's meta tree; a raise is durable with the backend's next
//! flush.

use super::{KeyStore, Op, StoreError, Tree, record};

/// The meta-tree key of `topic`/`partition`'s watermark.
pub(crate) fn watermark_key(topic: &str, partition: i32) -> Vec<u8> {
    format!("wm/{topic}/{partition}").into_bytes()
}

impl KeyStore {
    /// The highest input offset recorded for a partition.
    pub fn watermark(&self, topic: &str, partition: i32) -> Result<Option<i64>, StoreError> {
        match self.backend.get(Tree::Meta, &watermark_key(topic, partition))? {
            None => Ok(None),
            Some(v) => {
                let arr: [u8; 8] = v.as_slice().try_into().map_err(|_| StoreError::Corrupt {
                    key: format!("watermark {topic}/{partition}"),
                    source: record::DecodeError("not 8 bytes".into()),
                })?;
                Ok(Some(i64::from_le_bytes(arr)))
            }
        }
    }

    /// Raises the watermarks of the given partitions (never lowers one). Durable with the
    /// next flush.
    pub fn raise_watermarks(&self, offsets: &[(String, i32, i64)]) -> Result<(), StoreError> {
        let _gate = self.locks.shared();
        let mut ops = Vec::new();
        for (topic, partition, offset) in offsets {
            let current = self.watermark(topic, *partition)?;
            if current.is_none_or(|c| c < *offset) {
                ops.push(Op::Put(Tree::Meta, watermark_key(topic, *partition), offset.to_le_bytes().to_vec()));
            }
        }
        if ops.is_empty() { Ok(()) } else { self.backend.apply(ops) }
    }
}
