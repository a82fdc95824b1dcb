//! `--warm-broker`: before anything is measured, [`ROUNDS`] rounds of a plain relay and a
//! `dedupd run` drain of the backlog. A broker started for the bench goes on compiling
//! through its first million records or more, by bursts (docs/performance-notes.md, "A
//! broker still compiling"), and that CPU lands on the cores the relay and the drain share
//! with it, by different amounts; a broker in production compiled long ago. Every measured phase
//! prints what the broker's JIT compilers took in it, so a reader sees whether they did.

use dedupd::store::StoreBackend;

use super::cpu::Snapshot;
use super::measure_drain;
use super::relay::plain_relay;
use super::topics::{create_topic, unique};

/// Rounds of warming: 1.2M records relayed and 1.2M drained at 200k records. Measured, the
/// compilers' share of a drain's machine CPU fell from 10–15% to about 1% over as many.
const ROUNDS: usize = 6;

/// Warms the broker on `input` (`records` commands) as the module doc says, printing what
/// its JIT compilers took in each round.
pub async fn warm_broker(bootstrap: &str, input: &str, backend: StoreBackend, records: usize) {
    for round in 1..=ROUNDS {
        let from = Snapshot::take();
        let out = unique("bench-warm-out");
        create_topic(bootstrap, &out, 6).await;
        plain_relay(bootstrap, input, &out, records, None, None).await;
        measure_drain(bootstrap, input, backend, records).await;
        match from.broker_jit_share(&Snapshot::take()) {
            Some(share) => println!(
                "warming the broker: round {round} of {ROUNDS}, its JIT compilers took {:.0}% of its CPU",
                share * 100.0
            ),
            None => return println!("warming the broker: no kafka.Kafka process found; not warmed"),
        }
    }
}
