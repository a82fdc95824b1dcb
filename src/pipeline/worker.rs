//! One partition's worker: takes a batch of records in offset order, parses them, raises
//! the store watermark, runs the batch through the engine, publishes every result, and
//! only then stores the offset of the last record whose result Kafka acknowledged.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message, OwnedMessage};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::consumer::PipelineContext;
use super::publish::Publisher;
use crate::config::{EnvelopeConfig, LimitsConfig};
use crate::engine::{Engine, Item, ItemResult};
use crate::envelope::{InputRecord, parse};
use crate::ops::Metrics;
use crate::outcome::{Outcome, Processed};
use crate::store::SourcePos;

/// What every worker shares.
pub(crate) struct WorkerShared {
    pub engine: Arc<Engine>,
    pub publisher: Arc<Publisher>,
    pub metrics: Arc<Metrics>,
    pub envelope: EnvelopeConfig,
    pub limits: LimitsConfig,
    pub batch_size: usize,
    pub batch_linger: Duration,
    /// Fired when the process must stop (a store failure).
    pub fatal: CancellationToken,
}

/// One partition's worker.
pub(crate) struct PartitionWorker {
    pub topic: String,
    pub partition: i32,
    pub rx: mpsc::Receiver<OwnedMessage>,
    pub cancel: CancellationToken,
    pub shared: Arc<WorkerShared>,
    pub consumer: Arc<BaseConsumer<PipelineContext>>,
}

impl PartitionWorker {
    pub(crate) async fn run(mut self) {
        loop {
            let first = tokio::select! {
                m = self.rx.recv() => m,
                () = self.cancel.cancelled() => None,
            };
            let Some(first) = first else { return };
            let mut batch = vec![first];
            // Take what is already queued; wait up to `batch_linger` for more only when it
            // is set. With the default of 0, batches grow by themselves under load (records
            // queue while the previous batch is at its sinks) and stay small when idle.
            while batch.len() < self.shared.batch_size {
                match self.rx.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            if !self.shared.batch_linger.is_zero() {
                let deadline = tokio::time::Instant::now() + self.shared.batch_linger;
                while batch.len() < self.shared.batch_size {
                    match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                        Ok(Some(m)) => batch.push(m),
                        _ => break,
                    }
                }
            }
            if !self.process(batch).await {
                return;
            }
        }
    }

    /// Returns false when the worker must stop (cancelled or fatal error).
    async fn process(&self, batch: Vec<OwnedMessage>) -> bool {
        let started = Instant::now();
        tracing::debug!(topic = %self.topic, partition = self.partition, first = batch.first().map(Message::offset), records = batch.len(), "batch");
        let items: Vec<Item> = batch.iter().map(|m| self.item(m)).collect();
        let store = Arc::clone(self.shared.engine.store());
        let last = batch.last().map_or(0, Message::offset);
        let wm = vec![(self.topic.clone(), self.partition, last)];
        if let Err(e) = store.raise_watermarks(&wm) {
            tracing::error!(error = %e, "store failed raising the watermark; stopping");
            self.shared.fatal.cancel();
            return false;
        }
        let sinks = super::circuits::sinks_of(&self.shared.engine, &items);
        let run = self.shared.engine.process_batch_reporting_flush(&items, &self.cancel);
        let tp = (self.topic.clone(), self.partition);
        let (results, flushed) = match super::circuits::pausing_while_open(&self.consumer, tp, &sinks, run).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, topic = %self.topic, partition = self.partition, "engine failed; stopping");
                self.shared.fatal.cancel();
                return false;
            }
        };
        // The watermark must be durable before the offset is committed (SPEC §3). A flush
        // the engine made for this batch (claims or completions) came after the raise and
        // covers it; a batch of only replays and rejections needs one of its own.
        if !flushed {
            let flush_store = Arc::clone(&store);
            if let Ok(Err(e)) | Err(e) = tokio::task::spawn_blocking(move || flush_store.flush())
                .await
                .map_err(|e| crate::store::StoreError::Backend { backend: "join", message: e.to_string() })
            {
                tracing::error!(error = %e, "store flush failed; stopping");
                self.shared.fatal.cancel();
                return false;
            }
        }
        // Publish the longest prefix of finished records; an abandoned record ends it.
        let done: Vec<(&OwnedMessage, &Processed)> = batch
            .iter()
            .zip(results.iter())
            .map_while(|(m, r)| match r {
                ItemResult::Done(p) => Some((m, p.as_ref())),
                ItemResult::Abandoned => None,
            })
            .collect();
        let complete = done.len() == batch.len();
        let engine_ms = started.elapsed().as_millis() as u64;
        if !done.is_empty() {
            if !self.publish_until_acked(&done).await {
                return false;
            }
            let (m, _) = done[done.len() - 1];
            if let Err(e) = self.consumer.store_offset(m.topic(), m.partition(), m.offset()) {
                tracing::warn!(error = %e, topic = m.topic(), partition = m.partition(), "could not store offset (partition revoked?)");
            }
            for (m, p) in &done {
                self.record_metrics(p);
                log_command(m, p);
            }
        }
        self.shared.metrics.batch_processed(started.elapsed().as_secs_f64());
        tracing::debug!(topic = %self.topic, partition = self.partition, records = batch.len(), engine_ms, ms = started.elapsed().as_millis() as u64, "batch done");
        complete
    }

    /// Publishes until Kafka acknowledges, retrying with backoff; gives up only when the
    /// partition is let go (then nothing is committed and the records come again).
    async fn publish_until_acked(&self, done: &[(&OwnedMessage, &Processed)]) -> bool {
        let mut wait = Duration::from_millis(100);
        loop {
            match self.shared.publisher.publish(done).await {
                Ok(()) => return true,
                Err(e) => {
                    tracing::warn!(error = %e, topic = %self.topic, partition = self.partition, "publishing results failed; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = self.cancel.cancelled() => return false,
                    }
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    fn record_metrics(&self, p: &Processed) {
        let m = &self.shared.metrics;
        m.command(p.result.outcome, p.result.route.as_deref());
        if let Some(dl) = &p.dead_letter {
            m.dead_lettered(dl.reason);
        }
        if p.result.outcome == Outcome::Duplicate
            && let Some(age) = p.duplicate_age_ms
        {
            m.duplicate_age(p.result.route.as_deref(), age as f64 / 1000.0);
        }
    }

    fn item(&self, m: &OwnedMessage) -> Item {
        let headers: Vec<(String, Option<Vec<u8>>)> = m
            .headers()
            .map(|h| h.iter().map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec))).collect())
            .unwrap_or_default();
        let record = InputRecord {
            topic: m.topic(),
            partition: m.partition(),
            offset: m.offset(),
            timestamp_ms: m.timestamp().to_millis(),
            key: m.key(),
            value: m.payload(),
            headers: &headers,
        };
        let traceparent = headers
            .iter()
            .rev()
            .find(|(k, _)| k.eq_ignore_ascii_case("traceparent"))
            .and_then(|(_, v)| v.as_ref())
            .and_then(|v| String::from_utf8(v.clone()).ok());
        let parsed = parse(&record, &self.shared.envelope, &self.shared.limits, self.shared.engine.router());
        Item {
            source: SourcePos { topic: m.topic().to_string(), partition: m.partition(), offset: m.offset() },
            parsed,
            traceparent,
        }
    }
}

/// One span per command once its result is acknowledged: key, topic, partition, offset and
/// outcome, with a debug event in it (`log.level = "dedupd=debug"` shows every command).
fn log_command(m: &OwnedMessage, p: &Processed) {
    let r = &p.result;
    let span = tracing::info_span!(
        "command",
        key = r.key.as_deref().unwrap_or(""),
        topic = m.topic(),
        partition = m.partition(),
        offset = m.offset(),
        outcome = r.outcome.as_str(),
    );
    let _entered = span.enter();
    tracing::debug!(route = r.route.as_deref(), sink_called = p.sink_called, replay = r.replay, "command done");
}
