//! What the store occupies on disk: the blocks the file system allocated to its files, not
//! their lengths. fjall's journal files are sparse (64 MiB long from their first byte), so
//! their lengths overstate a small store by far, and would make the volume look full.

use std::io::ErrorKind;
use std::path::Path;

/// Bytes allocated to the files under `dir`, its subdirectories included. A file or
/// directory removed while it is walked (a compaction's) counts nothing, and so does one
/// dedupd may not read: a volume's root holds `lost+found`, which only root may list, and
/// the store is often a volume's root.
pub(super) fn allocated_bytes(dir: &Path) -> std::io::Result<u64> {
    let entries = match std::fs::read_dir(dir) {
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::PermissionDenied) => return Ok(0),
        other => other?,
    };
    let mut total = 0u64;
    for entry in entries {
        let entry = entry?;
        // Not followed through symbolic links: what is in the directory itself.
        let meta = match entry.metadata() {
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::PermissionDenied) => continue,
            other => other?,
        };
        let bytes = if meta.is_dir() { allocated_bytes(&entry.path())? } else { allocated(&meta) };
        total = total.saturating_add(bytes);
    }
    Ok(total)
}

#[cfg(unix)]
fn allocated(meta: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    // st_blocks counts 512-byte units whatever the file system's block size.
    meta.blocks().saturating_mul(512)
}

#[cfg(not(unix))]
fn allocated(meta: &std::fs::Metadata) -> u64 {
    meta.len()
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn a_sparse_file_counts_what_is_written_not_its_length() {
        let dir = tempfile::tempdir().unwrap();
        let sparse = std::fs::File::create(dir.path().join("0.jnl")).unwrap();
        sparse.set_len(64 << 20).unwrap();
        std::fs::create_dir(dir.path().join("tables")).unwrap();
        let mut written = std::fs::File::create(dir.path().join("tables/1.sst")).unwrap();
        written.write_all(&[7u8; 256 << 10]).unwrap();
        written.sync_all().unwrap();
        let bytes = allocated_bytes(dir.path()).unwrap();
        assert!((256 << 10..8 << 20).contains(&bytes), "{bytes} bytes: the written 256 KiB, not the sparse 64 MiB");
        assert_eq!(allocated_bytes(&dir.path().join("gone")).unwrap(), 0);
    }
}
