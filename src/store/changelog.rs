//! The store as the cache of a changelog (`store.changelog = true`, docs/decisions.md "State
//! on Kafka"). The pipeline owns the topic; the store keeps these invariants:
//! 1. Every change to a record (claim, completion, put-back, operator write, expiry) is
//!    captured in the order it was made, under the key's stripe lock, so one key's changes
//!    are taken in the order they happened ([`KeyStore::take_changes`]).
//! 2. Records read back from the changelog are applied without being captured
//!    ([`KeyStore::restore_batch`]); an expired completion or a tombstone removes the key.
//! 3. A partition's checkpoint (the next changelog offset to read) is written after the
//!    records it covers, never before, so replaying from it can only repeat records, which
//!    applying again leaves as they are.
//! 4. The store may hold changes whose transaction never committed only until the process
//!    stops: a clean stop marks the store ([`KeyStore::mark_clean`]); a store opened
//!    without the mark (a crash) empties what may hold them, keeping its identity, to be
//!    rebuilt from the changelog ([`KeyStore::open_as_cache`]), as Kafka Streams does with
//!    its stores under exactly-once: the partitions it owned (`writing`).

use std::collections::HashSet;
use std::path::Path;

use super::writing::{CacheOf, WritingFile};
use super::{KeyStore, Op, StoreConfig, StoreError, Tree};

/// The file a clean stop leaves in the store directory (invariant 4).
const CLEAN_FILE: &str = "changelog.clean";

/// One change to a record, for the changelog: the key and its encoded record, or `None`
/// when the key was removed (a tombstone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The idempotency key.
    pub key: String,
    /// The encoded [`Record`], or `None` for a removal.
    pub value: Option<Vec<u8>>,
}

/// How [`KeyStore::open_as_cache`] found the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheOpened {
    /// Stopped cleanly: its checkpoints hold.
    Clean,
    /// Left by a crash: the partitions it owned emptied (`emptied`, with `records`
    /// removed), the others kept as their checkpoints say (`writing`, invariant 10).
    AfterCrash {
        /// The partitions emptied.
        emptied: Vec<i32>,
        /// The records removed.
        records: u64,
    },
    /// New, or left by a crash with no word of what it owned: emptied whole.
    Emptied,
}

pub(super) fn checkpoint_key(topic: &str, partition: i32) -> Vec<u8> {
    format!("changelog/{topic}/{partition}").into_bytes()
}

fn io_error(path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Backend { backend: "store", message: format!("{}: {e}", path.display()) }
}

impl KeyStore {
    /// Opens the store `config` names as the cache of `of`'s changelog, capturing its
    /// changes (invariant 1): as it was after a clean stop, else without what a crash may
    /// have left uncommitted (invariants 4 and 10).
    pub fn open_as_cache(config: &StoreConfig, of: CacheOf) -> Result<(KeyStore, CacheOpened), StoreError> {
        let marker = config.path.join(CLEAN_FILE);
        let (store, opened) = if marker.exists() {
            let store = KeyStore::open_configured(config)?;
            // Gone before any change is made: a crash from here on finds no mark.
            std::fs::remove_file(&marker).map_err(|e| io_error(&marker, e))?;
            sync_dir(&config.path)?;
            (store, CacheOpened::Clean)
        } else if let Some(written) = WritingFile::read(&config.path, &of) {
            let store = KeyStore::open_configured(config)?;
            let records = store.empty_partitions(&written, &of)?;
            (store, CacheOpened::AfterCrash { emptied: written.into_iter().collect(), records })
        } else {
            (Self::open_emptied(config)?, CacheOpened::Emptied)
        };
        // No partition owned yet: none being written (invariant 9).
        let writing = WritingFile::create(&config.path, &of)?;
        let mut store = store;
        store.changes.turn_on();
        store.owned_by_partition(of, writing);
        Ok((store, opened))
    }

    /// Empties the store's directory and opens it, with the identity it had.
    fn open_emptied(config: &StoreConfig) -> Result<KeyStore, StoreError> {
        let identity = match config.path.exists() {
            true => Some(KeyStore::open_configured(config)?.identity()?),
            false => None,
        };
        empty_dir(&config.path)?;
        let store = KeyStore::open_configured(config)?;
        if let Some(id) = identity {
            // The same transactional.id and group.instance.id as before the crash, so the new
            // producer fences the old one's open transaction at once.
            store.set_identity(&id)?;
        }
        Ok(store)
    }

    /// Invariant 1: records a change; called under the key's stripe lock.
    pub(super) fn capture(&self, key: &str, value: Option<Vec<u8>>) {
        if self.changes.is_on() {
            self.changes.lock().push(Change { key: key.to_string(), value });
        }
    }

    /// Invariant 1: records the tombstones of expired `keys`, if their partitions' expiries
    /// are this store's (`expiries`, invariant 5); called under the exclusive gate.
    pub(super) fn capture_expiries<'a>(&self, keys: impl IntoIterator<Item = &'a str>) {
        if self.changes.is_on() {
            let mut changes = self.changes.lock();
            for key in keys {
                changes.push_expiry(key);
            }
        }
    }

    /// Records the record writes among `ops` (invariant 1).
    pub(super) fn capture_ops(&self, ops: &[Op]) {
        if !self.changes.is_on() {
            return;
        }
        let mut changes = self.changes.lock();
        for op in ops {
            match op {
                Op::Put(Tree::Records(_), k, v) => {
                    changes.push(Change { key: String::from_utf8_lossy(k).into_owned(), value: Some(v.clone()) });
                }
                Op::Delete(Tree::Records(_), k) => {
                    changes.push(Change { key: String::from_utf8_lossy(k).into_owned(), value: None });
                }
                _ => {}
            }
        }
    }

    /// The changes made since the last call, oldest first (invariant 1).
    pub fn take_changes(&self) -> Vec<Change> {
        self.changes.lock().take()
    }

    /// Applies records read from the changelog partition `partition` of `topic`, in their
    /// order, then sets its checkpoint to `next_offset` (invariants 2 and 3). A completion
    /// expired at `now_ms` is not kept: its key is added to `expired`, and any other record
    /// takes its key out again (`expiries`, invariant 7). Returns how many records it
    /// applied.
    pub fn restore_batch(
        &self,
        (topic, partition): (&str, i32),
        changes: Vec<Change>,
        next_offset: i64,
        now_ms: i64,
        expired: &mut HashSet<String>,
    ) -> Result<usize, StoreError> {
        let applied = self.apply_read(changes, now_ms, expired)?;
        let checkpoint = Op::Put(Tree::Meta, checkpoint_key(topic, partition), next_offset.to_le_bytes().to_vec());
        self.backend.apply(vec![checkpoint])?;
        // Handed to the OS: a process crash keeps the records and their checkpoint, and the
        // next restore goes on from there (`writing`, invariant 10).
        self.backend.write_out()?;
        Ok(applied)
    }

    /// The next offset of `partition` of the changelog `topic` to restore from, if the
    /// store has one (invariant 3).
    pub fn checkpoint(&self, topic: &str, partition: i32) -> Result<Option<i64>, StoreError> {
        let Some(v) = self.backend.get(Tree::Meta, &checkpoint_key(topic, partition))? else {
            return Ok(None);
        };
        let bytes: [u8; 8] = v.as_slice().try_into().map_err(|_| StoreError::Corrupt {
            key: format!("changelog checkpoint {topic}/{partition}"),
            source: super::record::DecodeError("not 8 bytes".into()),
        })?;
        Ok(Some(i64::from_le_bytes(bytes)))
    }

    /// Sets checkpoints `(topic, partition, next offset)` of partitions whose every change
    /// up to there this store holds (invariant 3).
    pub fn set_checkpoints(&self, checkpoints: &[(String, i32, i64)]) -> Result<(), StoreError> {
        let ops = checkpoints
            .iter()
            .map(|(topic, p, next)| Op::Put(Tree::Meta, checkpoint_key(topic, *p), next.to_le_bytes().to_vec()))
            .collect::<Vec<_>>();
        if ops.is_empty() { Ok(()) } else { self.backend.apply(ops) }
    }

    /// Sets the checkpoints of a clean stop (every change sent is committed and applied
    /// here), makes everything durable, and marks the store clean (invariant 4).
    pub fn mark_clean(&self, path: &Path, checkpoints: &[(String, i32, i64)]) -> Result<(), StoreError> {
        self.set_checkpoints(checkpoints)?;
        self.flush_always()?;
        let marker = path.join(CLEAN_FILE);
        let file = std::fs::File::create(&marker).map_err(|e| io_error(&marker, e))?;
        file.sync_all().map_err(|e| io_error(&marker, e))?;
        sync_dir(path)
    }
}

fn sync_dir(path: &Path) -> Result<(), StoreError> {
    std::fs::File::open(path).and_then(|d| d.sync_all()).map_err(|e| io_error(path, e))
}

/// Removes what `path` holds (not `path` itself, which may be a mount point).
fn empty_dir(path: &Path) -> Result<(), StoreError> {
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error(path, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| io_error(path, e))?;
        let at = entry.path();
        let removed = match entry.file_type().map_err(|e| io_error(&at, e))?.is_dir() {
            true => std::fs::remove_dir_all(&at),
            false => std::fs::remove_file(&at),
        };
        removed.map_err(|e| io_error(&at, e))?;
    }
    sync_dir(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;
    use crate::store::tests::two_partitions;
    use crate::store::{InProgress, Record, SourcePos, StoreBackend};

    /// An expiry far ahead (year 2096).
    const FAR: i64 = 4_000_000_000_000;

    fn config(dir: &Path, backend: StoreBackend) -> StoreConfig {
        StoreConfig { backend, path: dir.to_path_buf(), ..StoreConfig::default() }
    }

    fn claim() -> InProgress {
        InProgress {
            fingerprint: Fingerprint([1; 32]),
            claimed_at_ms: 5,
            attempts: 1,
            source: SourcePos::default(),
            held: None,
        }
    }

    fn completed(expires_at_ms: i64) -> Record {
        Record::Completed(crate::store::tests::completed(1, expires_at_ms))
    }

    #[test]
    fn every_change_is_captured_in_order_and_a_restore_is_not() {
        for &backend in StoreBackend::ALL {
            let dir = tempfile::tempdir().expect("tempdir");
            let (store, opened) =
                KeyStore::open_as_cache(&config(dir.path(), backend), two_partitions()).expect("open");
            assert_eq!(opened, CacheOpened::Emptied, "{backend}: a new store has no clean mark");
            store.own_partitions(&[0]).expect("own");
            let pending = store.claim("a", None, claim()).expect("claim").expect("won");
            let durable = store.flush_claims(vec![pending]).expect("flush").pop().expect("one");
            let done = completed(FAR);
            let Record::Completed(c) = done.clone() else { unreachable!() };
            store.complete(durable, c).expect("complete");
            store.forget("a").expect("forget");
            let changes = store.take_changes();
            let values: Vec<Option<Record>> =
                changes.iter().map(|c| c.value.as_ref().map(|v| Record::decode(v).expect("decodes"))).collect();
            assert_eq!(values, vec![Some(Record::InProgress(claim())), Some(done.clone()), None], "{backend}");
            assert!(changes.iter().all(|c| c.key == "a"), "{backend}");
            assert!(store.take_changes().is_empty(), "{backend}: taken once");

            let restored = vec![
                Change { key: "b".into(), value: Some(done.encode()) },
                Change { key: "old".into(), value: Some(completed(1).encode()) },
                Change { key: "gone".into(), value: Some(done.encode()) },
                Change { key: "gone".into(), value: None },
            ];
            let mut expired = HashSet::from(["gone".to_string()]);
            assert_eq!(store.restore_batch(("log", 3), restored, 42, 100, &mut expired).expect("restore"), 4);
            assert_eq!(expired, HashSet::from(["old".to_string()]), "{backend}: the keys last read expired");
            assert!(store.take_changes().is_empty(), "{backend}: a restore is not captured");
            assert_eq!(store.get("b").expect("get"), Some(done.clone()), "{backend}");
            assert_eq!(store.get("old").expect("get"), None, "{backend}: expired at restore");
            assert_eq!(store.get("gone").expect("get"), None, "{backend}: its tombstone was read");
            assert_eq!(store.checkpoint("log", 3).expect("checkpoint"), Some(42), "{backend}");
            assert_eq!(store.checkpoint("log", 4).expect("checkpoint"), None, "{backend}");
            assert_eq!(store.counts().completed, 1, "{backend}");
        }
    }

    #[test]
    fn expiry_writes_a_tombstone_for_the_changelog() {
        for &backend in StoreBackend::ALL {
            let dir = tempfile::tempdir().expect("tempdir");
            let (store, _) = KeyStore::open_as_cache(&config(dir.path(), backend), two_partitions()).expect("open");
            store.own_partitions(&[0]).expect("own");
            store.compare_and_swap("short", None, Some(&completed(50))).expect("cas").expect("swapped");
            store.compare_and_swap("long", None, Some(&completed(FAR))).expect("cas").expect("swapped");
            store.take_changes();
            assert_eq!(store.compact_expired(100, 10).expect("compact"), 1, "{backend}");
            assert_eq!(store.take_changes(), vec![Change { key: "short".into(), value: None }], "{backend}");
        }
    }

    fn put(store: &KeyStore, key: &str) {
        store.compare_and_swap(key, None, Some(&completed(FAR))).expect("cas").expect("swapped");
    }

    /// Restores `key` into partition 1 of `log` (not owned), up to offset `next`.
    fn restore_p1(store: &KeyStore, key: &str, next: i64) {
        let read = vec![Change { key: key.into(), value: Some(completed(FAR).encode()) }];
        store.restore_batch(("log", 1), read, next, 100, &mut HashSet::new()).expect("restore");
    }

    #[test]
    fn a_clean_stop_keeps_the_store() {
        for &backend in StoreBackend::ALL {
            let dir = tempfile::tempdir().expect("tempdir");
            let cfg = config(dir.path(), backend);
            {
                let (store, _) = KeyStore::open_as_cache(&cfg, two_partitions()).expect("open");
                store.own_partitions(&[0]).expect("own");
                put(&store, "k");
                store.mark_clean(dir.path(), &[("log".into(), 0, 7)]).expect("mark");
            }
            let (store, opened) = KeyStore::open_as_cache(&cfg, two_partitions()).expect("reopen");
            assert_eq!(opened, CacheOpened::Clean, "{backend}");
            assert_eq!(store.get("k").expect("get"), Some(completed(FAR)), "{backend}");
            assert_eq!(store.checkpoint("log", 0).expect("checkpoint"), Some(7), "{backend}");
        }
    }

    #[test]
    fn a_crash_empties_the_partitions_owned_and_keeps_those_restored_or_written_out() {
        for &backend in StoreBackend::ALL {
            let dir = tempfile::tempdir().expect("tempdir");
            let cfg = config(dir.path(), backend);
            let id = {
                let (store, _) = KeyStore::open_as_cache(&cfg, two_partitions()).expect("open");
                store.own_partitions(&[0]).expect("own");
                put(&store, "k");
                store.restore_batch(("log", 0), Vec::new(), 5, 100, &mut HashSet::new()).expect("checkpoint 0");
                // Partition 1 restored part of the way, not owned yet.
                restore_p1(&store, "p1-restored", 9);
                store.identity().expect("identity")
            };
            let (store, opened) = KeyStore::open_as_cache(&cfg, two_partitions()).expect("reopen after a crash");
            assert_eq!(opened, CacheOpened::AfterCrash { emptied: vec![0], records: 1 }, "{backend}");
            assert_eq!(store.get("k").expect("get"), None, "{backend}: its partition was owned: emptied");
            assert_eq!(store.checkpoint("log", 0).expect("checkpoint"), None, "{backend}");
            assert_eq!(store.get("p1-restored").expect("get"), Some(completed(FAR)), "{backend}: kept");
            assert_eq!(store.checkpoint("log", 1).expect("checkpoint"), Some(9), "{backend}: the restore goes on");
            assert_eq!(store.identity().expect("identity"), id, "{backend}: identity kept");
            assert_eq!(store.counts().completed, 1, "{backend}");

            // Owned, then let go with every change written out: a crash keeps it.
            store.own_partitions(&[1]).expect("own");
            put(&store, "p1-written");
            store.let_go_partitions(&[1]);
            store.written_out(&[1]).expect("written out");
            drop(store);
            let (store, opened) = KeyStore::open_as_cache(&cfg, two_partitions()).expect("reopen after a crash");
            assert_eq!(opened, CacheOpened::AfterCrash { emptied: vec![], records: 0 }, "{backend}");
            assert_eq!(store.get("p1-written").expect("get"), Some(completed(FAR)), "{backend}: kept");
        }
    }

    #[test]
    fn a_crash_with_no_word_of_what_was_owned_empties_the_whole_store_keeping_its_identity() {
        for &backend in StoreBackend::ALL {
            let dir = tempfile::tempdir().expect("tempdir");
            let cfg = config(dir.path(), backend);
            let id = {
                let (store, _) = KeyStore::open_as_cache(&cfg, two_partitions()).expect("open");
                restore_p1(&store, "p1-restored", 9);
                store.identity().expect("identity")
            };
            // Another number of partitions: what the file says is about another changelog.
            let mut three = two_partitions();
            three.partitions = 3;
            let (store, opened) = KeyStore::open_as_cache(&cfg, three).expect("reopen");
            assert_eq!(opened, CacheOpened::Emptied, "{backend}");
            assert_eq!(store.get("p1-restored").expect("get"), None, "{backend}: emptied");
            assert_eq!(store.checkpoint("log", 1).expect("checkpoint"), None, "{backend}");
            assert_eq!(store.identity().expect("identity"), id, "{backend}: identity kept");
            restore_p1(&store, "p1-restored", 9);
            drop(store);
            // No file at all (a store written before it).
            std::fs::remove_file(dir.path().join("changelog.writing")).expect("remove");
            let (store, opened) = KeyStore::open_as_cache(&cfg, two_partitions()).expect("reopen");
            assert_eq!(opened, CacheOpened::Emptied, "{backend}");
            assert_eq!(store.get("p1-restored").expect("get"), None, "{backend}: emptied");
        }
    }
}
