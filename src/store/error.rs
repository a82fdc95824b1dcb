//! What a store operation can fail with, and how a failure is classified for the operator:
//! a full disk is told apart from other I/O errors by the error's kind (`StorageFull`,
//! `QuotaExceeded`, raw `ENOSPC`), never by its message text.

use std::path::PathBuf;

use super::record;

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The backend reported an I/O or corruption error.
    #[error("{backend} store: {message}")]
    Backend { backend: &'static str, message: String },
    /// A stored value could not be decoded.
    #[error("key {key:?}: {source}")]
    Corrupt { key: String, source: record::DecodeError },
    /// Another process (or another open handle in this one) holds the store's lock: each
    /// backend reports it from its engine's error type, not from message text.
    #[error("{backend} store at {}: locked (held by another process or handle)", path.display())]
    Locked { backend: &'static str, path: PathBuf },
    /// The store directory holds another backend's store than `store.backend` names.
    #[error(
        "{} holds a {found} store, but store.backend is \"{configured}\": set backend = \"{found}\" (changing \
         the backend is no migration: export the store, then import it into a new path)",
        path.display()
    )]
    OtherBackend { configured: &'static str, found: &'static str, path: PathBuf },
    /// A completion found its claim gone or replaced (an operator forgot the key meanwhile).
    #[error("key {0:?}: the claim was replaced before completion")]
    ClaimLost(String),
    /// A write of a key whose state partition this store does not own (any more): the
    /// partition was let go in a rebalance (`ownership`). Nothing was written.
    #[error(
        "key {key:?} belongs to state partition {partition}, which this instance does not hold now (let go, or not yet restored): not written"
    )]
    NotOwned { key: String, partition: i32 },
    /// A write failed because the file system holding `path` is full (ENOSPC, or a quota).
    #[error("{backend} store: disk full: no space left on device for {} ({message})", path.display())]
    DiskFull { backend: &'static str, path: PathBuf, message: String },
    /// The claim journal refuses every append and sync since an fsync (or the directory
    /// sync of a rewrite) failed: the kernel may have dropped the dirty pages, so a later
    /// fsync could succeed without them. Only a restart, which recovers from the file and the
    /// backend, may take claims again.
    #[error("claim journal {}: refusing writes since an earlier failure ({cause}); restart to recover", path.display())]
    JournalPoisoned { path: PathBuf, cause: String },
    /// The claim journal holds a bad frame followed by valid ones: corruption, not the torn
    /// tail of a crash. The file is kept as it is (see the runbook, "Claim journal corrupt").
    #[error(
        "claim journal {}: bad frame at byte {offset} ({why}) followed by valid frames: corrupt, not a torn tail; \
         the file is kept as it is (see docs/runbook.md, \"Claim journal corrupt\")",
        path.display()
    )]
    JournalCorrupt { path: PathBuf, offset: u64, why: String },
}

/// The `kind` label of `dedupd_store_write_errors_total`.
pub const WRITE_ERROR_KINDS: [&str; 2] = ["disk_full", "io"];

impl StoreError {
    /// Whether the disk (or a quota) holding the store is full.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, StoreError::DiskFull { .. })
    }

    /// The kind of write error this is, for `dedupd_store_write_errors_total{kind}`:
    /// `disk_full`, `io` for any other failure of the engine or the journal, `None` for
    /// what is not a write failure (a lock held elsewhere, a lost claim, a bad record).
    pub fn write_error_kind(&self) -> Option<&'static str> {
        match self {
            StoreError::DiskFull { .. } => Some(WRITE_ERROR_KINDS[0]),
            StoreError::Backend { .. } | StoreError::JournalPoisoned { .. } => Some(WRITE_ERROR_KINDS[1]),
            StoreError::Corrupt { .. }
            | StoreError::Locked { .. }
            | StoreError::OtherBackend { .. }
            | StoreError::ClaimLost(_)
            | StoreError::NotOwned { .. }
            | StoreError::JournalCorrupt { .. } => None,
        }
    }
}
