//! The `raw` child: each engine used directly through its own API (default configuration,
//! no dedupd code), writing, reading and deleting the same keys and records as the `store`
//! child, so that dedupd's figures have a floor to be compared with.

use std::path::Path;
use std::time::{Duration, Instant};

use dedupd::store::{Record, StoreBackend};

use super::keys::key;
use super::{BATCH, CHUNK, RECORD_BYTES};
use super::{LookupSamples, batches, completed_record, keys_of, measure_lookups, removes};
use super::{dir_bytes, emit, proc_status_kib, rate, settled};

/// The raw floor: the engine's own API, default configuration, no dedupd code.
pub(super) fn raw_child(backend: StoreBackend, n: u64, lookups: u64, dir: &Path) {
    emit("logical_bytes_per_key", (key(0).len() + RECORD_BYTES) as f64);
    let Some(&(_, raw_floor)) = RAW_FLOORS.iter().find(|(b, _)| *b == backend) else {
        panic!("backend {backend} has no raw floor: add one to RAW_FLOORS");
    };
    let samples = LookupSamples::new(0, n, lookups);
    let rss0 = proc_status_kib("VmRSS:");
    raw_floor(RawInput { n, samples: &samples, dir, rss0 });
    emit("rss_hwm_kib", proc_status_kib("VmHWM:").saturating_sub(rss0) as f64);
}

/// What a raw floor writes, reads and deletes: keys `0..n`, each with its own encoded
/// record (built per batch outside the clock: one value shared by every key would let the
/// engine's block compression shrink the floor's disk and flush work far below what records
/// of this size cost), the lookup samples, and the RSS before loading.
struct RawInput<'a> {
    n: u64,
    samples: &'a LookupSamples,
    dir: &'a Path,
    rss0: u64,
}

impl RawInput<'_> {
    /// Writes every key in batches of `BATCH` through `write` (given the batch's keys and
    /// records; it makes them durable), timing only `write`. Returns the time taken.
    fn write_all(&self, mut write: impl FnMut(&[String], &[Vec<u8>])) -> Duration {
        let mut took = Duration::ZERO;
        for (start, len) in batches(self.n, BATCH) {
            let keys = keys_of(start, len);
            let values: Vec<Vec<u8>> =
                (start..start + len).map(|i| Record::Completed(completed_record(i)).encode()).collect();
            assert!(values.iter().all(|v| v.len() == RECORD_BYTES));
            let t = Instant::now();
            write(&keys, &values);
            took += t.elapsed();
        }
        took
    }

    /// Deletes the oldest `removes()` keys in chunks of `CHUNK` through `delete`, timing
    /// only `delete`.
    fn delete_oldest(&self, mut delete: impl FnMut(&[String])) -> Duration {
        let mut took = Duration::ZERO;
        for (start, len) in batches(removes(self.n), CHUNK) {
            let keys = keys_of(start, len);
            let t = Instant::now();
            delete(&keys);
            took += t.elapsed();
        }
        took
    }

    fn emit_loaded(&self) {
        emit("rss_loaded_kib", proc_status_kib("VmRSS:").saturating_sub(self.rss0) as f64);
    }
}

/// Writes, reads and deletes the keys through one engine's own API, emitting its figures.
type RawFloor = fn(RawInput);

/// The raw floor of each backend: its engine used directly, so it cannot come from the
/// store's registration. A registered backend missing here runs in the bench only once it
/// has one.
const RAW_FLOORS: &[(StoreBackend, RawFloor)] = &[(StoreBackend::Sled, raw_sled), (StoreBackend::Fjall, raw_fjall)];

fn raw_sled(input: RawInput) {
    let db = sled::open(input.dir).unwrap();
    let took = input.write_all(|keys, values| {
        let mut b = sled::Batch::default();
        for (k, v) in keys.iter().zip(values) {
            b.insert(k.as_bytes(), v.as_slice());
        }
        db.apply_batch(b).unwrap();
        db.flush().unwrap();
    });
    emit("write_per_s", rate(input.n, took));
    input.emit_loaded();
    emit("disk_bytes", db.size_on_disk().unwrap() as f64);
    emit("dir_bytes", dir_bytes(input.dir) as f64);
    emit("disk_settled_bytes", settled(|| db.size_on_disk().unwrap_or(0)) as f64);
    measure_lookups(input.samples, |k| db.get(k.as_bytes()).unwrap().is_some());
    let took = input.delete_oldest(|keys| {
        let mut b = sled::Batch::default();
        for k in keys {
            b.remove(k.as_bytes());
        }
        db.apply_batch(b).unwrap();
        db.flush().unwrap();
    });
    emit("delete_s", took.as_secs_f64());
    assert_eq!(db.len() as u64, input.n - removes(input.n));
}

fn raw_fjall(input: RawInput) {
    let db = fjall::Database::builder(input.dir).open().unwrap();
    let ks = db.keyspace("records", fjall::KeyspaceCreateOptions::default).unwrap();
    let took = input.write_all(|keys, values| {
        let mut b = db.batch();
        for (k, v) in keys.iter().zip(values) {
            b.insert(&ks, k.as_str(), v.as_slice());
        }
        b.commit().unwrap();
        db.persist(fjall::PersistMode::SyncAll).unwrap();
    });
    emit("write_per_s", rate(input.n, took));
    input.emit_loaded();
    emit("disk_bytes", db.disk_space().unwrap() as f64);
    emit("dir_bytes", dir_bytes(input.dir) as f64);
    emit("disk_settled_bytes", settled(|| db.disk_space().unwrap_or(0)) as f64);
    measure_lookups(input.samples, |k| ks.get(k.as_bytes()).unwrap().is_some());
    let took = input.delete_oldest(|keys| {
        let mut b = db.batch();
        for k in keys {
            b.remove(&ks, k.as_str());
        }
        b.commit().unwrap();
        db.persist(fjall::PersistMode::SyncAll).unwrap();
    });
    emit("delete_s", took.as_secs_f64());
    if removes(input.n) == input.n {
        assert!(ks.is_empty().unwrap());
    }
}
