//! I/O failures of the store: telling a full disk from other errors, and the failpoints
//! that inject either (feature `failpoints`, tests only).

use std::error::Error;
use std::io;
use std::path::Path;

use super::StoreError;

/// Linux's `ENOSPC`, for an error that carries the raw code but not the kind.
const ENOSPC: i32 = 28;

/// Whether `e` says the file system (or a quota on it) is full.
pub(crate) fn io_is_disk_full(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded) || e.raw_os_error() == Some(ENOSPC)
}

/// Whether `e`, or any error it wraps, is an [`io::Error`] saying the disk is full.
pub(crate) fn is_disk_full(e: &(dyn Error + 'static)) -> bool {
    let mut next = Some(e);
    // Bounded: an error chain is finite, but a buggy `source` could loop.
    for _ in 0..32 {
        let Some(e) = next else { return false };
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if io_is_disk_full(io) {
                return true;
            }
            // A wrapped error's `source` skips the wrapped error itself.
            if let Some(inner) = io.get_ref()
                && is_disk_full(inner)
            {
                return true;
            }
        }
        next = e.source();
    }
    false
}

/// An I/O error at `path` of `backend` (the claim journal, an engine's own files), as a
/// [`StoreError::DiskFull`] when it is one.
pub(super) fn io_error(backend: &'static str, path: &Path, e: io::Error) -> StoreError {
    if io_is_disk_full(&e) {
        StoreError::DiskFull { backend, path: path.to_path_buf(), message: e.to_string() }
    } else {
        StoreError::Backend { backend, message: format!("{}: {e}", path.display()) }
    }
}

/// A write error of a storage engine whose files are under `path`, classified by the I/O
/// error it wraps.
pub(super) fn engine_write_error(backend: &'static str, path: &Path, e: &(dyn Error + 'static)) -> StoreError {
    if is_disk_full(e) {
        StoreError::DiskFull { backend, path: path.to_path_buf(), message: e.to_string() }
    } else {
        StoreError::Backend { backend, message: e.to_string() }
    }
}

/// The failpoint `name` at an I/O boundary: with the `failpoints` feature, configured
/// `return(enospc)` it fails as a full disk, `return` (or any other argument) as an
/// I/O error; otherwise (and in every release build) it does nothing.
#[cfg_attr(not(feature = "failpoints"), allow(unused_variables))]
pub(super) fn failpoint(name: &str) -> io::Result<()> {
    fail::fail_point!(name, |arg: Option<String>| Err(match arg.as_deref() {
        Some("enospc") => io::Error::from_raw_os_error(ENOSPC),
        _ => io::Error::other(format!("injected I/O error at failpoint {name}")),
    }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_told_by_its_kind_not_its_text() {
        assert!(io_is_disk_full(&io::Error::from_raw_os_error(ENOSPC)));
        assert!(io_is_disk_full(&io::Error::from(io::ErrorKind::StorageFull)));
        assert!(!io_is_disk_full(&io::Error::other("No space left on device")), "the message is not trusted");
        let wrapped = io::Error::other(io::Error::from_raw_os_error(ENOSPC));
        assert!(is_disk_full(&wrapped), "an I/O error wrapping ENOSPC");
        let e = io_error("claim journal", Path::new("/x/j"), io::Error::from_raw_os_error(ENOSPC));
        assert!(e.is_disk_full() && e.to_string().contains("/x/j") && e.to_string().contains("no space left"), "{e}");
        assert_eq!(e.write_error_kind(), Some("disk_full"));
        let e = io_error("claim journal", Path::new("/x/j"), io::Error::from_raw_os_error(5));
        assert_eq!(e.write_error_kind(), Some("io"));
    }
}
