//! What the registration of store backends generates (the list itself is
//! `registered_backends!` in the store's `mod.rs`): [`StoreBackend`] with one variant per
//! backend, its names, and the dispatch that opens one. Nothing else names a backend.

use std::fmt;
use std::str::FromStr;

use super::StoreBackend;

/// Generates [`StoreBackend`] and `open_backend` from the registered list. Called by
/// `registered_backends!` as `store_backends! { () <lines> }`.
macro_rules! store_backends {
    (() $($(#[$attr:meta])* $name:literal => $variant:ident($module:ident::$backend:ident),)+) => {
        /// Store backend, `backend = "..."` in `[store]`: one variant per registered backend.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Deserialize, serde::Serialize)]
        pub enum StoreBackend {
            $($(#[$attr])* #[serde(rename = $name)] $variant,)+
        }

        impl StoreBackend {
            /// Every registered backend, in registration order.
            pub const ALL: &'static [StoreBackend] = &[$(StoreBackend::$variant),+];

            /// The backend's name, as written in `backend = "..."`.
            pub fn name(self) -> &'static str {
                match self {
                    $(StoreBackend::$variant => $name,)+
                }
            }

            /// Whether `path` holds a store of this backend (not only leftovers of one).
            pub fn holds_store(self, path: &std::path::Path) -> bool {
                match self {
                    $(StoreBackend::$variant => $module::$backend::holds_store(path),)+
                }
            }
        }

        /// Opens a backend of `kind` at `path`, its cache sized `cache`.
        pub fn open_backend(kind: StoreBackend, path: &Path, cache: CacheSize) -> Result<Box<dyn Backend>, StoreError> {
            match kind {
                $(StoreBackend::$variant => Ok(Box::new($module::$backend::open(path, cache)?)),)+
            }
        }
    };
}
pub(super) use store_backends;

impl fmt::Display for StoreBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A backend name that is not registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown store backend {given:?} (registered: {})", registered())]
pub struct UnknownBackend {
    /// The name given.
    pub given: String,
}

fn registered() -> String {
    StoreBackend::ALL.iter().map(|b| b.name()).collect::<Vec<_>>().join(", ")
}

impl FromStr for StoreBackend {
    type Err = UnknownBackend;

    /// The backend registered under `name`, as in `backend = "..."`.
    fn from_str(name: &str) -> Result<StoreBackend, UnknownBackend> {
        StoreBackend::ALL
            .iter()
            .copied()
            .find(|b| b.name() == name)
            .ok_or_else(|| UnknownBackend { given: name.into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_match_serde() {
        for &backend in StoreBackend::ALL {
            assert_eq!(backend.name().parse::<StoreBackend>(), Ok(backend));
            assert_eq!(backend.to_string(), backend.name());
            let json = serde_json::to_string(&backend).unwrap();
            assert_eq!(json, format!("\"{}\"", backend.name()));
        }
        assert!("rocks".parse::<StoreBackend>().unwrap_err().to_string().contains("sled, fjall"));
        assert_eq!(StoreBackend::default().name(), "fjall");
    }
}
