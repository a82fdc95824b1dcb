//! The presence filter and the counts saved at a clean stop, so that the next open reads
//! them back instead of scanning every record: the scan grows with the store (4.5–5.4 s
//! at 9M records on two cores, 11.5–13.1 s at 29M), where the open that reads the saved
//! filter took 0.58 s at 29M, most of it fjall's own recovery (docs/performance-notes.md,
//! "Reopening a store"). No record is read then, so a damaged one is found when
//! it is read, not at open.
//!
//! The file, [`FILE_NAME`] in the store directory: a header (format, the save's id,
//! stripes, the backend's write sequence number, the counts per state, the keys of the
//! `indeterminate` records per sink), then each stripe's fingerprints and those held by
//! more than one key, then a CRC-32 of all of it. Written to a temporary file, synced and
//! renamed over the last one, so a crash while saving leaves the old file or the new one.
//!
//! The keys in doubt are saved, not only their number per sink, because the reconciler of
//! indeterminate keys whose sink has a check lists them by sink (`doubts`): without them
//! the open would have to scan every record to find the few in doubt, which is what the
//! saved filter spares it. Each name and key is length-prefixed; when read back, every
//! length must fit in what is left of the file before anything is allocated for it.
//!
//! The open uses it only when all of these hold, and scans otherwise (a bad or stale file
//! is never an error):
//! 1. The backend's write sequence number is the one saved ([`Backend::write_seqno`]):
//!    nothing at all was written since: no write after the save, no claim a crash left in
//!    the journal written by its recovery, no `forget` or `import` by an operator, no
//!    other version of dedupd. And the save's random id, written to `meta` by the save,
//!    is the one the store holds: the file is this store's, saved at this state of it, not
//!    one left beside a backup restored or copied in from elsewhere, which could happen
//!    to have reached the same number. So the records are exactly those the filter was
//!    taken from.
//! 2. It was taken under the exclusive gate, right after a marker written to `meta` and a
//!    flush: no write was under way, and every write it reflects was durable. So a crash
//!    after the save cannot take the store back behind what the filter holds: at most it
//!    loses writes made after, whose sequence numbers were never saved. The marker, never
//!    deleted, is the newest entry at the save: fjall's recovery takes the number from the
//!    newest entry it finds, and the deletes of a compaction chunk, if they were the newest,
//!    can be dropped by the engine's background compaction after the save, which would move
//!    the number back with nothing written. (A write after the save whose entries were all
//!    dropped too, a put and its delete, leaves the number and the key's absence as saved.)
//! 3. Its CRC, its shape (the stripes, each stripe's fingerprints distinct) and its format
//!    check out.
//!
//! A backend without a write sequence number (sled) always scans. A file found stale is
//! removed, so that it does not take disk space until the next clean stop.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use super::super::doubts::KeysBySink;
use super::super::presence::Presence;
use super::super::{KeyStore, Op, STRIPES, StoreError, Tree};

/// The saved filter's name in the store directory.
pub(in crate::store) const FILE_NAME: &str = "dedupd-presence.saved";

/// The `meta` key written last before the filter is saved (see `save_presence`).
const SAVED_MARK: &[u8] = b"presence-saved";

/// What the file starts with: the format's name and version (4: the keys of the
/// `indeterminate` records per sink follow the counts; 3: their number per sink; 2: each
/// entry names the slice holding its key). A file of another format is not read: the open
/// scans, and removes it as it does a stale one.
const MAGIC: &[u8; 16] = b"dedupd-presence4";

/// What the open read back: each stripe's filter, the counts per state, and the keys of
/// the `indeterminate` records per sink.
struct Saved {
    stripes: Vec<Presence>,
    counts: [i64; 3],
    doubts: KeysBySink,
}

impl KeyStore {
    /// Where the presence filter is saved: in the store's directory.
    fn saved_filter_path(&self) -> Option<std::path::PathBuf> {
        self.dir.as_ref().map(|dir| dir.join(FILE_NAME))
    }

    /// Saves the presence filter and the counts for the next open (see the module doc), at
    /// a clean stop, once nothing more will be written. Returns whether it saved: not for a
    /// store without a directory (a bare backend) or over a backend without a write
    /// sequence number. Writes after it only make the saved filter stale.
    pub fn save_presence(&self) -> Result<bool, StoreError> {
        let (Some(path), Some(_)) = (&self.saved_filter_path(), self.backend.write_seqno()) else {
            return Ok(false);
        };
        // Invariant 2: no write under way, and all of them durable, for the whole save.
        let _gate = self.locks.exclusive();
        // The newest write a marker that is never deleted: the engine's recovery sets its
        // number from the newest entry it finds, and background compaction can drop the
        // newest ones if they are deletes, which would make a store nobody wrote to look
        // written to.
        // Its value, a random id the file holds too, ties the file to this store and this
        // save (invariant 1): a file left beside a store restored from a backup, or copied
        // into another store, finds another id there, whatever the sequence numbers.
        let id: [u8; 16] = rand::random();
        self.backend.apply(vec![Op::Put(Tree::Meta, SAVED_MARK.to_vec(), id.to_vec())])?;
        self.backend.flush()?;
        let seqno = self.backend.write_seqno().unwrap_or_default();
        let counts = self.counts();
        let counts = [counts.in_progress, counts.completed, counts.indeterminate];
        let temporary = path.with_extension("saving");
        let written = self.write_saved(&temporary, &id, seqno, counts).and_then(|()| {
            std::fs::rename(&temporary, path)?;
            sync_directory(path)
        });
        if let Err(e) = written {
            // Best effort: a partial file is never read (its name is not the filter's).
            let _ = std::fs::remove_file(&temporary);
            return Err(StoreError::Backend {
                backend: "presence filter",
                message: format!("saving {}: {e}", path.display()),
            });
        }
        Ok(true)
    }

    /// Writes and syncs the file at `temporary`: the header, every stripe, the CRC.
    fn write_saved(&self, temporary: &Path, id: &[u8; 16], seqno: u64, counts: [i64; 3]) -> std::io::Result<()> {
        let file = File::create(temporary)?;
        let mut out = Checksummed { inner: BufWriter::with_capacity(1 << 20, file), crc: crc32fast::Hasher::new() };
        out.write_all(MAGIC)?;
        out.write_all(id)?;
        out.write_all(&(STRIPES as u32).to_le_bytes())?;
        out.write_all(&seqno.to_le_bytes())?;
        for count in counts {
            out.write_all(&count.to_le_bytes())?;
        }
        write_doubts(&mut out, &self.indeterminate_keys_by_sink())?;
        let mut buffer = Vec::new();
        for stripe in self.locks.stripes_in_order() {
            write_stripe(&mut out, &stripe.present, &mut buffer)?;
        }
        let crc = out.crc.clone().finalize();
        out.inner.write_all(&crc.to_le_bytes())?;
        out.inner.into_inner().map_err(|e| e.into_error())?.sync_all()
    }

    /// Whether the open read the saved filter (rather than scanning).
    pub fn opened_from_saved_filter(&self) -> bool {
        self.from_saved_filter.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Installs the saved filter and counts if the module doc's conditions hold; says
    /// whether it did.
    pub(in crate::store) fn read_saved_filter(&self) -> bool {
        let (Some(path), Some(seqno)) = (&self.saved_filter_path(), self.backend.write_seqno()) else {
            return false;
        };
        let id = match self.backend.get(Tree::Meta, SAVED_MARK) {
            Ok(id) => id.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %e, "could not read the saved presence filter's mark: scanning the store");
                return false;
            }
        };
        let saved = match read(path, &id, seqno) {
            Ok(Some(saved)) => saved,
            Ok(None) => return false,
            Err(why) => {
                tracing::info!(path = %path.display(), why, "not reading the saved presence filter: scanning the store");
                // Best effort: a file found stale never matches again (its number and id are
                // gone from the store), it only takes disk space until the next clean stop.
                let _ = std::fs::remove_file(path);
                return false;
            }
        };
        for (mut stripe, present) in self.locks.stripes_in_order().zip(saved.stripes) {
            stripe.present = present;
        }
        self.set_counts(saved.counts);
        self.doubts.set(saved.doubts);
        self.from_saved_filter.store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(path = %path.display(), "presence filter read back from the last clean stop: no scan");
        true
    }
}

/// One stripe: how many fingerprints, how many held more than once, then both lists,
/// built in one buffer so that the checksum runs over it at once.
fn write_stripe(out: &mut impl Write, present: &Presence, buffer: &mut Vec<u8>) -> std::io::Result<()> {
    let (once, more) = present.parts();
    buffer.clear();
    buffer.reserve(8 + once.len() * 4 + more.len() * 8);
    buffer.extend_from_slice(&(once.len() as u32).to_le_bytes());
    buffer.extend_from_slice(&(more.len() as u32).to_le_bytes());
    for fp in once {
        buffer.extend_from_slice(&fp.to_le_bytes());
    }
    for (fp, extra) in more {
        buffer.extend_from_slice(&fp.to_le_bytes());
        buffer.extend_from_slice(&extra.to_le_bytes());
    }
    out.write_all(buffer)
}

/// The saved filter at `path` if there is one and it may be used at `seqno`; `Ok(None)`
/// when there is none, `Err(why)` when there is one that may not.
fn read(path: &Path, id: &[u8], seqno: u64) -> Result<Option<Saved>, String> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let io = |e: std::io::Error| e.to_string();
    let header = (MAGIC.len() + 16 + 4 + 8 + 3 * 8) as u64;
    let mut left = file.metadata().map_err(io)?.len().checked_sub(header + 4).ok_or("shorter than its header")?;
    let mut input = Checksummed { inner: BufReader::with_capacity(1 << 20, file), crc: crc32fast::Hasher::new() };
    let mut magic = [0u8; 16];
    input.read_exact(&mut magic).map_err(io)?;
    if &magic != MAGIC {
        return Err("not a saved filter of this version".into());
    }
    let mut saved_id = [0u8; 16];
    input.read_exact(&mut saved_id).map_err(io)?;
    if saved_id.as_slice() != id {
        return Err("saved for another store, or another state of this one (its mark differs)".into());
    }
    if input.u32().map_err(io)? as usize != STRIPES {
        return Err("saved with another number of stripes".into());
    }
    let saved_seqno = input.u64().map_err(io)?;
    if saved_seqno != seqno {
        return Err(format!("the store was written after the save (sequence number {saved_seqno}, now {seqno})"));
    }
    let mut counts = [0i64; 3];
    for count in &mut counts {
        *count = input.u64().map_err(io)? as i64;
    }
    let doubts = read_doubts(&mut input, &mut left)?;
    if doubts.values().map(|keys| keys.len() as u64).sum::<u64>() != counts[2] as u64 {
        return Err("the keys in doubt are not as many as the indeterminate records".into());
    }
    let mut stripes = Vec::with_capacity(STRIPES);
    for _ in 0..STRIPES {
        stripes.push(read_stripe(&mut input, &mut left)?);
    }
    let crc = input.crc.clone().finalize();
    let mut stored = [0u8; 4];
    input.inner.read_exact(&mut stored).map_err(io)?;
    if u32::from_le_bytes(stored) != crc {
        return Err("checksum mismatch".into());
    }
    if input.inner.read(&mut [0u8; 1]).map_err(io)? != 0 {
        return Err("bytes after the checksum".into());
    }
    Ok(Some(Saved { stripes, counts, doubts }))
}

/// The keys of the `indeterminate` records per sink: how many sinks, then each one's name,
/// how many keys, and the keys (names and keys as a `u32` length and the bytes).
fn write_doubts(out: &mut impl Write, doubts: &KeysBySink) -> std::io::Result<()> {
    out.write_all(&(doubts.len() as u32).to_le_bytes())?;
    for (sink, keys) in doubts {
        write_text(out, sink)?;
        out.write_all(&(keys.len() as u64).to_le_bytes())?;
        for key in keys {
            write_text(out, key)?;
        }
    }
    Ok(())
}

/// Its length as a `u32`, then its bytes.
fn write_text(out: &mut impl Write, text: &str) -> std::io::Result<()> {
    let len = u32::try_from(text.len()).map_err(|_| std::io::Error::other("a sink or a key over 4 GiB"))?;
    out.write_all(&len.to_le_bytes())?;
    out.write_all(text.as_bytes())
}

/// What [`write_doubts`] wrote. Every length must fit in what is `left` of the file before
/// it is read: a damaged count or length ends the read instead of allocating for it.
fn read_doubts(input: &mut Checksummed<BufReader<File>>, left: &mut u64) -> Result<KeysBySink, String> {
    let io = |e: std::io::Error| e.to_string();
    let mut take =
        |bytes: u64| left.checked_sub(bytes).map(|rest| *left = rest).ok_or("the sinks run past the end of the file");
    take(4)?;
    let sinks = input.u32().map_err(io)?;
    let mut doubts = KeysBySink::new();
    for _ in 0..sinks {
        let sink = read_text(input, &mut take)?;
        take(8)?;
        let count = input.u64().map_err(io)?;
        let mut keys = BTreeSet::new();
        // Nothing is allocated for the count: each key takes at least its 4-byte length from
        // what is left, so a count larger than the file holds fails in `take`.
        for _ in 0..count {
            keys.insert(read_text(input, &mut take)?);
        }
        if keys.len() as u64 != count {
            return Err("a key in doubt saved twice".into());
        }
        if doubts.insert(sink, keys).is_some() {
            return Err("a sink saved twice".into());
        }
    }
    Ok(doubts)
}

/// A length, then that many bytes of UTF-8, once `take` finds they fit in the file.
fn read_text(
    input: &mut Checksummed<BufReader<File>>,
    take: &mut impl FnMut(u64) -> Result<(), &'static str>,
) -> Result<String, String> {
    let io = |e: std::io::Error| e.to_string();
    take(4)?;
    let len = input.u32().map_err(io)?;
    take(u64::from(len))?;
    let mut bytes = vec![0u8; len as usize];
    input.read_exact(&mut bytes).map_err(io)?;
    String::from_utf8(bytes).map_err(|_| "a sink or a key in doubt is not UTF-8".into())
}

fn read_stripe(input: &mut Checksummed<BufReader<File>>, left: &mut u64) -> Result<Presence, String> {
    let io = |e: std::io::Error| e.to_string();
    let (once_len, more_len) = (u64::from(input.u32().map_err(io)?), u64::from(input.u32().map_err(io)?));
    // The lengths come from the file: what they say must fit in what is left of it before
    // anything is allocated for them.
    let bytes = 8 + once_len * 4 + more_len * 8;
    *left = left.checked_sub(bytes).ok_or("a stripe's length runs past the end of the file")?;
    let mut buffer = vec![0u8; (once_len * 4 + more_len * 8) as usize];
    input.read_exact(&mut buffer).map_err(io)?;
    let (once, more) = buffer.split_at(once_len as usize * 4);
    let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let once: Vec<u32> = once.chunks_exact(4).map(word).collect();
    let more: Vec<(u32, u32)> = more.chunks_exact(8).map(|pair| (word(&pair[..4]), word(&pair[4..]))).collect();
    Presence::from_parts(&once, &more).ok_or_else(|| "a stripe's fingerprints are not a filter".to_string())
}

/// Makes a rename in `path`'s directory durable.
fn sync_directory(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// A reader or writer that keeps the CRC-32 of the bytes through it.
struct Checksummed<T> {
    inner: T,
    crc: crc32fast::Hasher,
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(bytes)?;
        self.crc.update(&bytes[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Checksummed<R> {
    fn read(&mut self, bytes: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(bytes)?;
        self.crc.update(&bytes[..n]);
        Ok(n)
    }
}

impl<R: Read> Checksummed<R> {
    fn u32(&mut self) -> std::io::Result<u32> {
        let mut b = [0u8; 4];
        self.read_exact(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }
    fn u64(&mut self) -> std::io::Result<u64> {
        let mut b = [0u8; 8];
        self.read_exact(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }
}
