//! The engine's durability points when the store is the cache of a changelog
//! (`store.changelog`): there, what is durable is what the changelog topic committed, so
//! each durability point (a round's claims, a batch's last completions) also sends the
//! store's captured changes and waits for their commit. The Kafka side is the pipeline's;
//! the engine sees only [`ChangeLog`].

use std::sync::Arc;

use super::{Engine, EngineError};

/// Where the store's changes become durable besides the local store.
#[async_trait::async_trait]
pub trait ChangeLog: Send + Sync {
    /// Sends every change the store captured so far and returns once they are committed;
    /// an error means they may never be, and the batch cannot go on.
    async fn commit(&self) -> Result<(), String>;
}

impl Engine {
    /// This engine with `changelog` as part of every durability point: no sink runs before
    /// its claim is committed there, and no key is released before its completion is.
    pub fn with_changelog(mut self, changelog: Arc<dyn ChangeLog>) -> Engine {
        self.changelog = Some(changelog);
        self
    }

    /// Commits the store's changes to the changelog, if there is one.
    pub(super) async fn commit_changelog(&self) -> Result<(), EngineError> {
        match &self.changelog {
            Some(changelog) => changelog.commit().await.map_err(EngineError::ChangeLog),
            None => Ok(()),
        }
    }
}
