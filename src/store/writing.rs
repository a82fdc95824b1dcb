//! Which state partitions a changelog's cache may hold uncommitted changes of, so that a
//! crash empties those and keeps the rest. Continuing the invariants of `changelog`,
//! `expiries` and `ownership` (this refines invariant 4):
//! 9. A partition is named in the store's `changelog.writing` file, made durable, before
//!    the store owns it ([`KeyStore::own_partitions`]), so before any write of its keys;
//!    it leaves the file only once the store no longer owns it and every change made for
//!    it is committed, applied here and flushed ([`KeyStore::written_out`]).
//! 10. A store opened without the clean mark (a crash) empties the partitions its file
//!    names, their records and checkpoints (`bulk`), before the
//!    file forgets them. Every other partition holds only records read back from the
//!    changelog (a restore or a standby, `read_committed`) up to its checkpoint, or what
//!    was committed by the time it was let go, and is kept: a restore cut short by a crash
//!    goes on from its checkpoint, as one cut short by a revoke does. A file that is
//!    missing (a store written before it) or names another changelog or number of
//!    partitions empties the whole store.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{KeyStore, StoreError};

/// The file in the store directory (invariant 9).
const FILE_NAME: &str = "changelog.writing";

/// The changelog a store caches: its topic, its number of partitions, and the partition
/// each key is on.
pub struct CacheOf {
    /// The changelog topic (its checkpoints are named after it).
    pub topic: String,
    /// Its number of partitions.
    pub partitions: i32,
    /// The state partition of a key.
    pub partition_of: Box<dyn Fn(&str) -> i32 + Send + Sync>,
}

/// What the file says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Contents {
    topic: String,
    partitions: i32,
    writing: BTreeSet<i32>,
}

/// The file and what it says now (kept in the ownership scope, under its lock).
pub(super) struct WritingFile {
    path: PathBuf,
    contents: Contents,
}

impl WritingFile {
    /// The partitions the file at `dir` says were being written, when it is about `of`'s
    /// changelog; `None` when there is no such file or it is about another (invariant 10).
    pub(super) fn read(dir: &Path, of: &CacheOf) -> Option<BTreeSet<i32>> {
        let text = std::fs::read(dir.join(FILE_NAME)).ok()?;
        let contents: Contents = serde_json::from_slice(&text).ok()?;
        (contents.topic == of.topic && contents.partitions == of.partitions).then_some(contents.writing)
    }

    /// Writes the file at `dir` for `of`'s changelog with no partition being written.
    pub(super) fn create(dir: &Path, of: &CacheOf) -> Result<WritingFile, StoreError> {
        let contents = Contents { topic: of.topic.clone(), partitions: of.partitions, writing: BTreeSet::new() };
        let file = WritingFile { path: dir.join(FILE_NAME), contents };
        file.save()?;
        Ok(file)
    }

    /// Whether the file names partition `p`.
    pub(super) fn names(&self, p: i32) -> bool {
        self.contents.writing.contains(&p)
    }

    /// Adds `partitions`, durably before it returns (invariant 9).
    pub(super) fn add(&mut self, partitions: &[i32]) -> Result<(), StoreError> {
        self.change(|writing| writing.extend(partitions))
    }

    /// Takes `partitions` out, durably before it returns (invariant 9).
    pub(super) fn remove(&mut self, partitions: &[i32]) -> Result<(), StoreError> {
        self.change(|writing| writing.retain(|p| !partitions.contains(p)))
    }

    fn change(&mut self, f: impl FnOnce(&mut BTreeSet<i32>)) -> Result<(), StoreError> {
        let mut changed = self.contents.clone();
        f(&mut changed.writing);
        if changed == self.contents {
            return Ok(());
        }
        let before = std::mem::replace(&mut self.contents, changed);
        self.save().inspect_err(|_| self.contents = before)
    }

    /// Replaces the file whole (a new file, synced, renamed over it, the directory synced):
    /// a crash leaves the old contents or the new, never a mix.
    fn save(&self) -> Result<(), StoreError> {
        let io = |e: std::io::Error| StoreError::Backend {
            backend: "store",
            message: format!("{}: {e}", self.path.display()),
        };
        let json = serde_json::to_vec(&self.contents).map_err(|e| io(std::io::Error::other(e)))?;
        let new = self.path.with_extension("writing.new");
        {
            let mut file = std::fs::File::create(&new).map_err(io)?;
            std::io::Write::write_all(&mut file, &json).map_err(io)?;
            file.sync_all().map_err(io)?;
        }
        std::fs::rename(&new, &self.path).map_err(io)?;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)
    }
}

impl KeyStore {
    /// Every change made for `partitions`, which the store no longer owns, is committed to
    /// the changelog and applied here: flushes the store, then takes them out of the file,
    /// so that a crash from here on keeps them (invariant 9). One owned again meanwhile
    /// stays in it.
    pub fn written_out(&self, partitions: &[i32]) -> Result<(), StoreError> {
        // No flush when the file would not change (none named, or all still owned: a clean
        // stop, whose mark flushes anyway).
        let changes = self
            .changes
            .lock()
            .scope
            .as_ref()
            .is_some_and(|scope| partitions.iter().any(|p| scope.writing.names(*p) && !scope.owned.contains(p)));
        if !changes {
            return Ok(());
        }
        self.flush_always()?;
        let mut captured = self.changes.lock();
        let Some(scope) = &mut captured.scope else { return Ok(()) };
        let let_go: Vec<i32> = partitions.iter().copied().filter(|p| !scope.owned.contains(p)).collect();
        scope.writing.remove(&let_go)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(topic: &str, partitions: i32) -> CacheOf {
        CacheOf { topic: topic.into(), partitions, partition_of: Box::new(|_| 0) }
    }

    #[test]
    fn the_file_says_what_was_last_saved_and_only_about_its_changelog() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(WritingFile::read(dir.path(), &of("log", 4)), None, "no file");
        let mut file = WritingFile::create(dir.path(), &of("log", 4)).expect("create");
        assert_eq!(WritingFile::read(dir.path(), &of("log", 4)), Some(BTreeSet::new()));
        file.add(&[3, 1]).expect("add");
        file.add(&[1]).expect("add again");
        assert_eq!(WritingFile::read(dir.path(), &of("log", 4)), Some(BTreeSet::from([1, 3])));
        file.remove(&[3, 2]).expect("remove");
        assert_eq!(WritingFile::read(dir.path(), &of("log", 4)), Some(BTreeSet::from([1])));
        assert_eq!(WritingFile::read(dir.path(), &of("other", 4)), None, "another topic");
        assert_eq!(WritingFile::read(dir.path(), &of("log", 6)), None, "another number of partitions");
        std::fs::write(dir.path().join(FILE_NAME), b"{not json").expect("write");
        assert_eq!(WritingFile::read(dir.path(), &of("log", 4)), None, "unreadable: as if missing");
    }
}
