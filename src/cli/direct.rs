//! Operator commands on a stopped instance's store, opened from its config file.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use serde_json::Value;

use super::CliError;
use crate::config::Config;
use crate::engine::{Clock, SystemClock};
use crate::ops::settle::{self, SettleError};
use crate::sinks::Sink;
use crate::store::{Completion, ForgetError, KeyStore, ResolveError, StoreBackend, StoreError, record_json};

/// An opened store and the config it came from.
pub struct Direct {
    pub(super) store: KeyStore,
    pub(super) config: Config,
    /// The config's sinks, built once at the first `resolve --check` (not for every key
    /// of a `resolve --where ... --check`).
    sinks: OnceLock<HashMap<String, Arc<Sink>>>,
}

/// A settle refused or failed, as the CLI exits for it: 4 no such key, 3 not
/// indeterminate, else 2.
pub(super) fn settle_error(e: SettleError) -> CliError {
    match e {
        SettleError::NotFound(_) => CliError::NotFound(e.to_string()),
        SettleError::NotIndeterminate { .. } | SettleError::Changed(_) => CliError::Conflict(e.to_string()),
        SettleError::Store(e) => e.into(),
        e => CliError::Other(e.to_string()),
    }
}

/// True when the backend could not get the store directory's lock (another process has it).
fn is_lock_error(e: &StoreError) -> bool {
    matches!(e, StoreError::Locked { .. })
}

impl Direct {
    /// Opens the configured store; a store held by a running instance is a [`CliError::Locked`].
    /// Without `create`, a path holding no store of the configured backend is refused
    /// rather than made one: an export of a mistyped path (or of a volume not mounted yet)
    /// must not be an empty backup that succeeded, nor `inspect` say a key is absent.
    pub fn open(config: Config, create: bool) -> Result<Direct, CliError> {
        let (backend, path) = (config.store.backend, &config.store.path);
        // Another backend's store there is refused by the open, naming it.
        if !create && !StoreBackend::ALL.iter().any(|b| b.holds_store(path)) {
            return Err(CliError::Other(format!(
                "no {backend} store at {} (store.path): nothing to read or change there; `dedupd run` or \
                 `dedupd import` creates one",
                path.display()
            )));
        }
        match KeyStore::open_configured(&config.store) {
            Ok(store) => Ok(Direct { store, config, sinks: OnceLock::new() }),
            Err(e) if is_lock_error(&e) => {
                Err(CliError::Locked { path: config.store.path.display().to_string(), source: e })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The record as JSON.
    pub fn inspect(&self, key: &str) -> Result<Value, CliError> {
        match self.store.get(key)? {
            Some(r) => Ok(record_json(key, &r, SystemClock.now_ms())),
            None => Err(CliError::NotFound(format!("key {} has no record", super::output::quoted(key)))),
        }
    }

    /// Forgets `key`; returns the state it was in.
    pub fn forget(&self, key: &str, force: bool) -> Result<String, CliError> {
        match self.store.forget_checked(key, force) {
            Ok(was) => Ok(was.state().as_str().to_string()),
            Err(e @ ForgetError::NotFound(_)) => Err(CliError::NotFound(e.to_string())),
            Err(e @ ForgetError::InProgress(_)) => Err(CliError::Conflict(format!("{e} (--force)"))),
            Err(ForgetError::Store(e)) => Err(e.into()),
        }
    }

    /// Resolves an indeterminate key; returns the new record as JSON.
    pub fn resolve(&self, key: &str, outcome: Completion) -> Result<Value, CliError> {
        let ttl = i64::try_from(self.config.store.default_ttl.as_millis()).unwrap_or(i64::MAX);
        let now = SystemClock.now_ms();
        match self.store.resolve(key, outcome, now, ttl) {
            Ok(r) => Ok(record_json(key, &r, now)),
            Err(e @ ResolveError::NotFound(_)) => Err(CliError::NotFound(e.to_string())),
            Err(e @ ResolveError::NotIndeterminate { .. }) => Err(CliError::Conflict(e.to_string())),
            Err(ResolveError::Store(e)) => Err(e.into()),
        }
    }

    /// Settles an indeterminate key by its sink's check (`resolve --check`): the sinks are
    /// built from the config, as `run` builds them. Returns what was asked and the new
    /// record.
    pub async fn resolve_by_check(&self, key: &str) -> Result<Value, CliError> {
        let doubt = settle::in_doubt(&self.store, self.sinks()?, key).map_err(settle_error)?;
        let answer = settle::ask(&doubt).await;
        let ttl = i64::try_from(self.config.store.default_ttl.as_millis()).unwrap_or(i64::MAX);
        settle::settle(&self.store, &doubt, answer, SystemClock.now_ms(), ttl).map_err(settle_error)
    }

    /// The config's sinks, as `run` builds them.
    fn sinks(&self) -> Result<&HashMap<String, Arc<Sink>>, CliError> {
        if let Some(sinks) = self.sinks.get() {
            return Ok(sinks);
        }
        let built = crate::sinks::build_all(&self.config.sinks).map_err(|e| CliError::Other(e.to_string()))?;
        Ok(self.sinks.get_or_init(|| built.into_iter().map(|(name, sink)| (name, Arc::new(sink))).collect()))
    }

    /// The stats document.
    pub fn stats(&self) -> Result<Value, CliError> {
        Ok(self.store.stats_json()?)
    }

    /// Removes expired records; returns how many.
    pub fn compact(&self) -> Result<u64, CliError> {
        Ok(self.store.compact_expired(SystemClock.now_ms(), self.config.store.compaction_chunk.get())? as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreBackend;

    #[test]
    fn a_store_held_elsewhere_is_refused_with_a_pointer_to_the_admin_api() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.store.backend = StoreBackend::Fjall;
        config.store.path = dir.path().join("store");
        let _held = KeyStore::open_configured(&config.store).unwrap();
        match Direct::open(config, false) {
            Err(e @ CliError::Locked { .. }) => assert!(e.to_string().contains("--admin"), "{e}"),
            Err(other) => panic!("expected Locked, got {other}"),
            Ok(_) => panic!("opened a store another handle holds"),
        }
    }

    #[test]
    fn only_an_import_makes_a_store_where_there_is_none() {
        let dir = tempfile::tempdir().unwrap();
        for backend in StoreBackend::ALL {
            let mut config = Config::default();
            config.store.backend = *backend;
            config.store.path = dir.path().join(format!("typo-{backend}"));
            match Direct::open(config.clone(), false) {
                Err(e) => assert!(e.to_string().contains(&format!("no {backend} store at")), "{e}"),
                Ok(_) => panic!("{backend}: opened a store where there was none"),
            }
            assert!(!config.store.path.exists(), "{backend}: the refused open left a directory");
            let made = Direct::open(config.clone(), true).expect("an import creates the store");
            drop(made);
            assert!(backend.holds_store(&config.store.path), "{backend}: no store made");
            Direct::open(config, false).expect("the store made is opened");
        }
    }

    #[test]
    fn a_store_of_another_backend_is_refused_naming_it() {
        for (made, configured) in [(StoreBackend::Fjall, StoreBackend::Sled), (StoreBackend::Sled, StoreBackend::Fjall)]
        {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("store");
            drop(KeyStore::open(made, &path, crate::store::SyncMode::Batch).unwrap());
            let mut config = Config::default();
            config.store.backend = configured;
            config.store.path = path.clone();
            for create in [false, true] {
                match Direct::open(config.clone(), create) {
                    Err(e) => assert!(e.to_string().contains(&format!("holds a {made} store")), "{e}"),
                    Ok(_) => panic!("{configured} opened over a {made} store"),
                }
            }
            assert!(!configured.holds_store(&path), "a {configured} store was made beside the {made} one");
        }
    }
}
