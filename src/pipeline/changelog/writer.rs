//! Sends the store's captured changes to the changelog in the process's open transaction,
//! keyed by the idempotency key, on the key's state partition; and commits them (or only
//! queues them), for the engine's durability points ([`ChangeLog`]) and the periodic
//! committer.

use std::collections::HashSet;
use std::sync::Arc;

use rdkafka::producer::{FutureProducer, FutureRecord};

use super::partition::state_partition;
use crate::engine::ChangeLog;
use crate::pipeline::publish::Publisher;
use crate::pipeline::transactions::{BeforeCommit, Transactions, writer_headers};
use crate::store::{Change, KeyStore};

/// The store's changes to the changelog topic.
pub(crate) struct ChangelogWriter {
    store: Arc<KeyStore>,
    transactions: Arc<Transactions>,
    producer: FutureProducer,
    topic: String,
    partitions: i32,
    /// Held while taking and queueing changes, so that two callers cannot queue one key's
    /// changes out of the order the store made them (`store::changelog`, invariant 1).
    sending: tokio::sync::Mutex<Sending>,
}

/// What the writer knows of the open transaction.
#[derive(Default)]
struct Sending {
    /// The number of the commit that carries the changes queued last.
    carried_by: u64,
    /// The partitions written in that transaction so far: the first record of each names
    /// the writer (`transactions`, invariant 8), and this writer is the changelog's only one.
    named: HashSet<i32>,
}

impl ChangelogWriter {
    pub(crate) fn new(
        store: Arc<KeyStore>,
        transactions: Arc<Transactions>,
        producer: FutureProducer,
        topic: &super::ChangelogTopic,
    ) -> ChangelogWriter {
        ChangelogWriter {
            store,
            transactions,
            producer,
            topic: topic.name.clone(),
            partitions: topic.partitions,
            sending: tokio::sync::Mutex::new(Sending::default()),
        }
    }

    /// Queues every change captured so far in the open transaction, in the order made, and
    /// returns the number of the commit that carries them (when another caller took them
    /// first, the one that carries what it queued). A change that cannot be queued fails the
    /// transaction (it must not commit without it).
    pub(crate) async fn send_changes(&self) -> Result<u64, String> {
        let mut sending = self.sending.lock().await;
        if !self.store.has_changes() {
            return Ok(sending.carried_by);
        }
        let member = self.transactions.join().await.map_err(|e| e.to_string())?;
        // Taken inside the member, so that the commit letting a partition go carries every
        // expiry of it taken before its expiries stopped (store::expiries, invariant 5).
        let changes = self.store.take_changes();
        let carried_by = self.transactions.carrying_commit(&member);
        if carried_by != sending.carried_by {
            sending.named.clear();
            sending.carried_by = carried_by;
        }
        let writer = writer_headers(self.transactions.id());
        for Change { key, value } in &changes {
            let partition = state_partition(key, self.partitions);
            let mut record = FutureRecord::to(&self.topic).partition(partition).key(key.as_bytes());
            if sending.named.insert(partition) {
                record = record.headers(writer.clone());
            }
            let record = match value {
                Some(v) => record.payload(v.as_slice()),
                None => record,
            };
            // Its acknowledgement is the commit's to wait for (transactions, invariant 2).
            if let Err(e) = Publisher::enqueue_on(&self.producer, record).await {
                self.transactions.fail();
                return Err(format!("queueing a change of key {key:?} to {}: {e}", self.topic));
            }
        }
        if !sending.named.is_empty() {
            self.transactions.named(&member);
        }
        drop(member);
        tracing::debug!(changes = changes.len(), "changes queued");
        Ok(carried_by)
    }

    /// Sends the captured changes and commits them itself, for when no committer runs
    /// (a clean stop, after the last commit of the consumer).
    pub(crate) async fn commit_now(&self) -> Result<(), String> {
        let _ = self.send_changes().await?;
        self.transactions.commit().await.map_err(|e| e.to_string())
    }
}

/// The engine's durability points: the changes sent, then the committer's next commit.
#[async_trait::async_trait]
impl ChangeLog for ChangelogWriter {
    async fn commit(&self) -> Result<(), String> {
        let carried_by = self.send_changes().await?;
        self.transactions.commit_queued(carried_by).await.map_err(|e| e.to_string())
    }

    async fn queue(&self) -> Result<(), String> {
        let _ = self.send_changes().await?;
        self.transactions.commit_soon();
        Ok(())
    }

    async fn prove_owned(&self) -> Result<(), String> {
        self.transactions.prove_owned().await.map_err(|e| e.to_string())
    }
}

/// The committer's commits carry the changes made outside a batch (expiry tombstones, an
/// operator's write) too.
#[async_trait::async_trait]
impl BeforeCommit for ChangelogWriter {
    async fn before_commit(&self) -> Result<(), String> {
        self.send_changes().await.map(|_| ())
    }
}
