//! The bench's command line (the options are described in `benches/pipeline.rs`).

use dedupd::store::StoreBackend;

pub(super) struct Args {
    pub(super) records: usize,
    pub(super) rate: usize,
    pub(super) seconds: u64,
    pub(super) backends: Vec<StoreBackend>,
    /// Only dedupd on Kafka against Kafka Streams' recipe, side by side, in `rounds` rounds.
    pub(super) streams: bool,
    pub(super) rounds: usize,
    /// Only the backlog drain (to profile it): no plain consumer, relay, floor or latency.
    pub(super) drain_only: bool,
    /// Relay and drain the backlog six times first, so that the broker has stopped compiling.
    pub(super) warm_broker: bool,
    /// Also drain with the store on Kafka (`store.changelog`), beside each embedded drain.
    pub(super) changelog: bool,
    /// Only the restore phase, with this many keys on the changelog.
    pub(super) restore: Option<usize>,
    /// Only drains with 1, 2 and 3 instances in one group (store on Kafka, by-key topic).
    pub(super) instances: bool,
    /// Only the failover of a killed instance, at `rate` commands/s, with `state` keys on
    /// the changelog first, and with standby copies (`store.standby`) if `standby`.
    pub(super) failover_state: usize,
    pub(super) standby: bool,
    /// Only the failover of a killed instance, at `rate` commands/s.
    pub(super) failover: bool,
    /// Only the takeover of `failover_state` keys by a joining instance, at `rate`.
    pub(super) takeover: bool,
}

pub(super) fn args() -> Args {
    let mut a = Args {
        records: 200_000,
        rate: 5_000,
        seconds: 10,
        backends: StoreBackend::ALL.to_vec(),
        streams: false,
        rounds: 3,
        drain_only: false,
        warm_broker: false,
        changelog: false,
        restore: None,
        instances: false,
        failover: false,
        takeover: false,
        failover_state: 0,
        standby: false,
    };
    let argv: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < argv.len() {
        let next = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--records" => a.records = next.parse().expect("--records N"),
            "--rate" => a.rate = next.parse().expect("--rate R"),
            "--seconds" => a.seconds = next.parse().expect("--seconds S"),
            "--backends" => {
                a.backends = next.split(',').map(|b| b.parse().unwrap_or_else(|e| panic!("--backends: {e}"))).collect()
            }
            "--streams" => {
                a.streams = true;
                i += 1;
                continue;
            }
            "--drain-only" => {
                a.drain_only = true;
                i += 1;
                continue;
            }
            "--warm-broker" => {
                a.warm_broker = true;
                i += 1;
                continue;
            }
            "--changelog" => {
                a.changelog = true;
                i += 1;
                continue;
            }
            "--rounds" => a.rounds = next.parse().expect("--rounds N"),
            "--restore" => a.restore = Some(next.parse().expect("--restore N")),
            "--state" => a.failover_state = next.parse().expect("--state N"),
            "--standby" => {
                a.standby = true;
                i += 1;
                continue;
            }
            "--instances" | "--failover" | "--takeover" => {
                match argv[i].as_str() {
                    "--instances" => a.instances = true,
                    "--takeover" => a.takeover = true,
                    _ => a.failover = true,
                }
                i += 1;
                continue;
            }
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    a
}
