//! Background housekeeping: TTL compaction that sleeps until the next expiry (at most
//! `store.compaction_interval`), and the store gauges (its records, its bytes, its volume).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::engine::{Clock, Engine};
use crate::ops::Metrics;
use crate::store::{KeyStore, StoreConfig};

/// Runs until `stop`.
pub(super) async fn run(
    store: Arc<KeyStore>,
    metrics: Arc<Metrics>,
    engine: Arc<Engine>,
    clock: Arc<dyn Clock>,
    config: StoreConfig,
    stop: CancellationToken,
) {
    let (interval, chunk) = (config.compaction_interval, config.compaction_chunk.get());
    loop {
        let now = clock.now_ms();
        let s = Arc::clone(&store);
        let removed = tokio::task::spawn_blocking(move || s.compact_expired(now, chunk)).await;
        match removed {
            Ok(Ok(n)) if n > 0 => {
                metrics.compacted(n);
                tracing::debug!(removed = n, "compaction");
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "compaction failed"),
            Err(e) => tracing::error!(error = %e, "compaction task failed"),
        }
        metrics.store(store.counts(), store.disk_bytes().unwrap_or(0), store.fsyncs());
        metrics.store_volume(&config.path);
        metrics.set_in_flight(engine.in_flight());
        // Sleep until the next record expires, but wake at least every interval (new
        // records with earlier expiries may arrive) and refresh gauges every few seconds.
        let next = store.next_expiry().ok().flatten();
        let until_next = next.map_or(interval, |at| Duration::from_millis(u64::try_from(at - now).unwrap_or(0)));
        let sleep = until_next.min(interval).min(Duration::from_secs(5)).max(Duration::from_millis(50));
        tokio::select! {
            () = tokio::time::sleep(sleep) => {}
            () = stop.cancelled() => return,
        }
    }
}
