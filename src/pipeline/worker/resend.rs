//! Sending again what Kafka did not take: a batch's results are retried with backoff,
//! only the records not taken, until they are or the partition is let go; a failure
//! retrying cannot fix stops the process (`publish::is_permanent`).

use std::time::Duration;

use rdkafka::message::OwnedMessage;

use super::PartitionWorker;
use crate::outcome::Processed;
use crate::pipeline::publish::{Acks, NotTaken, Parts};

impl PartitionWorker {
    /// Hands `parts` of a batch's results to the producer, retrying with backoff what could
    /// not be queued (only that: what was queued is published already); `None` when the
    /// partition is let go first or the failure is permanent.
    pub(super) async fn send_until_queued(
        &self,
        records: &[(&OwnedMessage, &Processed)],
        mut parts: Parts,
    ) -> Option<Acks> {
        let mut queued = Vec::new();
        let mut wait = Duration::from_millis(100);
        loop {
            let sent = self.shared.publisher.send(records, &parts).await;
            queued.push(sent.acks);
            let Some(rest) = sent.rest else { return Some(Acks::join(queued)) };
            if !self.may_retry(&rest.error, "queueing results failed; retrying", &mut wait).await {
                return None;
            }
            parts = rest.parts;
        }
    }

    /// Sends again what Kafka did not acknowledge until it does, retrying with backoff;
    /// gives up only when the partition is let go (then nothing is committed and the
    /// records come again) or the failure is permanent.
    pub(super) async fn publish_until_acked(
        &self,
        records: &[(&OwnedMessage, &Processed)],
        mut not_taken: NotTaken,
    ) -> bool {
        let mut wait = Duration::from_millis(100);
        loop {
            if !self
                .may_retry(
                    &not_taken.error,
                    "publishing results failed; sending again what was not acknowledged",
                    &mut wait,
                )
                .await
            {
                return false;
            }
            let Some(mut acks) = self.send_until_queued(records, not_taken.parts).await else { return false };
            match acks.acknowledged().await {
                Ok(()) => return true,
                Err(again) => not_taken = again,
            }
        }
    }

    /// After a publishing failure: false (stop) when retrying cannot fix it or the
    /// partition is let go while backing off; true to retry.
    async fn may_retry(&self, error: &rdkafka::error::KafkaError, message: &str, wait: &mut Duration) -> bool {
        if crate::pipeline::publish::is_permanent(error) {
            self.stop_for_good(error);
            return false;
        }
        tracing::warn!(error = %error, topic = %self.topic, partition = self.partition, "{message}");
        self.back_off(wait).await
    }

    /// A publishing failure retrying cannot fix (see `publish::is_permanent`): stop the
    /// process with the cause named; the batch stays uncommitted and comes again once the
    /// operator has fixed it.
    fn stop_for_good(&self, e: &rdkafka::error::KafkaError) {
        tracing::error!(error = %e, topic = %self.topic, partition = self.partition, "publishing results failed for a reason retrying cannot fix (missing topic, no permission, record too large); stopping");
        self.shared.fatal.cancel();
    }

    /// Sleeps `wait` (doubling it, up to 5 s); false when cancelled first.
    async fn back_off(&self, wait: &mut Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(*wait) => {}
            () = self.cancel.cancelled() => return false,
        }
        *wait = (*wait * 2).min(Duration::from_secs(5));
        true
    }
}
