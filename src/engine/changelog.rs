//! The engine's durability points when the store is the cache of a changelog
//! (`store.changelog`): there, what is durable is what the changelog topic committed.
//! - A round's claims are committed before any of their sinks runs ([`ChangeLog::commit`]):
//!   a claim a crash could take back would let a sink run twice.
//! - Completions need only be *queued* in the open transaction before their keys are let go
//!   ([`ChangeLog::queue`]): everything that can depend on a completion (its batch's results
//!   and offsets, another batch's replay of it) is queued after it, so in the same
//!   transaction or a later one, and the pipeline's one producer commits its transactions
//!   in order and commits none after one that failed. A crash before the commit takes the
//!   completion back together with all that depends on it. The commit is asked for at once,
//!   not awaited.
//!
//! - Before every sink call, the instance proves it still owns the key's state partition
//!   ([`ChangeLog::prove_owned`]): a process paused after its claim committed, whose
//!   partitions moved meanwhile, makes no call when it wakes.
//!
//! The Kafka side is the pipeline's; the engine sees only [`ChangeLog`].

use std::sync::Arc;

use super::{Engine, EngineError};

/// Where the store's changes become durable besides the local store.
#[async_trait::async_trait]
pub trait ChangeLog: Send + Sync {
    /// Sends every change the store captured so far and returns once they are committed;
    /// an error means they may never be, and the batch cannot go on.
    async fn commit(&self) -> Result<(), String>;

    /// Queues every change the store captured so far in the open transaction, and asks for
    /// it to be committed soon without waiting; an error means they may never be, and the
    /// batch cannot go on.
    async fn queue(&self) -> Result<(), String>;

    /// Returns once this instance has shown, recently enough, that it still owns the state
    /// partitions it works on (a group generation that is gone cannot); an error means it
    /// may not, and no sink call may start.
    async fn prove_owned(&self) -> Result<(), String>;
}

impl Engine {
    /// This engine with `changelog` as part of every durability point: no sink runs before
    /// its claim is committed there, and no key is released before its completion is
    /// queued there (see the module doc).
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

    /// Queues the store's changes in the changelog's open transaction, if there is one.
    pub(super) async fn queue_changelog(&self) -> Result<(), EngineError> {
        match &self.changelog {
            Some(changelog) => changelog.queue().await.map_err(EngineError::ChangeLog),
            None => Ok(()),
        }
    }
}
