//! The `[store]` section: which backend, where, how durable, and how long keys live.

use std::num::{NonZeroU64, NonZeroUsize};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::StoreBackend;
use crate::problems::Problems;

/// When the store's writes reach the disk.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum SyncMode {
    /// One fsync covers the claims (and then the completions) of a batch. Safe.
    #[default]
    Batch,
    /// Leave it to the OS. UNSAFE: a power loss can forget claims whose sink already ran.
    None,
}

/// Store settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// One of the registered backends (see `registered_backends!`).
    pub backend: StoreBackend,
    /// Directory of the store.
    pub path: PathBuf,
    /// `batch` (default) or `none` (unsafe).
    pub sync: SyncMode,
    /// TTL of a completed record when neither command nor route sets one.
    #[serde(with = "humantime_serde")]
    pub default_ttl: Duration,
    /// Upper bound on any TTL.
    #[serde(with = "humantime_serde")]
    pub max_ttl: Duration,
    /// How often expired records are removed.
    #[serde(with = "humantime_serde")]
    pub compaction_interval: Duration,
    /// Most records removed per compaction chunk (one write batch).
    pub compaction_chunk: NonZeroUsize,
    /// Bytes of the backend's block (fjall) or page (sled) cache; unset: the backend's
    /// default ([`CacheSize`]).
    pub cache_bytes: CacheSize,
    /// Keep every key's record on Kafka too, in a compacted changelog topic the local
    /// store caches and is restored from (docs/decisions.md, "State on Kafka").
    pub changelog: bool,
    /// The changelog topic; unset: `"<kafka.group_id>.dedupd-state"`.
    pub changelog_topic: Option<String>,
    /// Replication factor of the changelog topic when dedupd creates it (capped by the
    /// cluster's broker count).
    pub changelog_replication_factor: u16,
    /// `min.insync.replicas` of the changelog topic when dedupd creates it (capped below
    /// the replication factor it gets).
    pub changelog_min_insync_replicas: u16,
    /// With `changelog`: tail the changelog partitions this instance does not own into the
    /// local store (standby replicas), so that taking one over restores only the tail.
    pub standby: bool,
}

/// How large a backend's cache is: the memory a store takes beyond its own per-key
/// structures (the presence filter) and the backend's write buffers. In a config file, a
/// positive number of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(transparent)]
pub struct CacheSize(pub Option<NonZeroU64>);

impl CacheSize {
    /// fjall's block cache when none is configured: a dedup store's reads are the recent
    /// keys (repeats) and claims of fresh keys, which the presence filter answers without a
    /// read, so a large cache buys little.
    pub const FJALL_DEFAULT: u64 = 64 << 20;
    /// sled's page cache when none is configured: sled's own default.
    pub const SLED_DEFAULT: u64 = 1 << 30;

    /// The configured size, or `default`.
    pub fn or(self, default: u64) -> u64 {
        self.0.map_or(default, NonZeroU64::get)
    }
}

/// The largest `store.max_ttl`: beyond it an expiry is no longer a date anyone means (and far
/// beyond it, past year 262143, not one that can be written).
const MAX_TTL_CAP: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl StoreConfig {
    /// `[store]` on its own, keys under `problems`' `store`: positive TTLs and intervals,
    /// the cap above the default, the changelog's replication and what a standby needs.
    pub fn validate(&self, problems: &mut Problems) {
        if self.default_ttl.is_zero() {
            problems.add("default_ttl", "0s", "must be positive");
        }
        if self.max_ttl > MAX_TTL_CAP {
            problems.add(
                "max_ttl",
                humantime::format_duration(self.max_ttl),
                "must be at most 100 years: a record is kept at most this long",
            );
        }
        if self.max_ttl < self.default_ttl {
            problems.add("max_ttl", humantime::format_duration(self.max_ttl), "must be at least store.default_ttl");
        }
        if self.compaction_interval.is_zero() {
            problems.add("compaction_interval", "0s", "must be positive");
        }
        if self.changelog_replication_factor == 0 {
            problems.add("changelog_replication_factor", "0", "must be at least 1");
        }
        if self.changelog_min_insync_replicas == 0 {
            problems.add("changelog_min_insync_replicas", "0", "must be at least 1");
        }
        if self.standby && !self.changelog {
            problems.add("standby", "true", "needs store.changelog = true (a standby tails the changelog)");
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            backend: StoreBackend::default(),
            path: PathBuf::from("./dedupd-data"),
            sync: SyncMode::Batch,
            default_ttl: Duration::from_secs(24 * 3600),
            max_ttl: Duration::from_secs(7 * 24 * 3600),
            compaction_interval: Duration::from_secs(60),
            compaction_chunk: NonZeroUsize::new(10_000).unwrap_or(NonZeroUsize::MIN),
            cache_bytes: CacheSize::default(),
            changelog: false,
            changelog_topic: None,
            changelog_replication_factor: 3,
            changelog_min_insync_replicas: 2,
            standby: false,
        }
    }
}
