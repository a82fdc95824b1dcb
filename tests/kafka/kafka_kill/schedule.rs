//! The kill schedule: how one incarnation ends (`Ending`, and the `FAILPOINTS` it starts
//! with), every ending of a lane shuffled, and the inputs cut into one chunk per incarnation.

use std::ops::Range;
use std::time::Duration;

use super::{DURING_CALL_MS, JOURNAL_REWRITE_AT, KILL_DELAY_MS};
use crate::common::kill_workload::{self as workload, Input};
use crate::common::process::SplitMix;

/// How one incarnation ends.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ending {
    /// SIGKILL from the test, `delay` after the incarnation started working (or spawned).
    Random { from_spawn: bool, delay: Duration },
    /// It SIGKILLs itself at crash point `point`, after passing it `skip` times (for
    /// `sink.call`, `delay_ms` after reaching it).
    At { point: &'static str, skip: u64, delay_ms: Option<u64> },
}

impl Ending {
    /// The `FAILPOINTS` the incarnation starts with.
    pub(super) fn failpoints(&self) -> String {
        let rewrites = format!("journal.rewrite_at=return({JOURNAL_REWRITE_AT})");
        match self {
            Ending::Random { .. } => rewrites,
            Ending::At { point, skip, delay_ms } => {
                let action = delay_ms.map_or("return".to_string(), |ms| format!("return({ms})"));
                format!("{rewrites};{point}={skip}*off->{action}")
            }
        }
    }
}

pub(super) fn count_from_env(var: &str, default: usize) -> usize {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The inputs split into one chunk per incarnation (one more than `endings`). An
/// incarnation meant to die at `claim.appended_with_completions` needs batches of several
/// rounds (a round's claims carrying the previous round's completions), so its chunk is
/// six times the others: a few records per partition do not make a second round.
///
/// The workload ends in late repeats only (`workload::workload`): keys completed long
/// before, so replays that claim nothing. A kill chunk made of them could never reach a
/// claim point, so they all go to the final run's chunk; the kill chunks share the rest.
pub(super) fn chunks(endings: &[Ending], inputs: &[Input]) -> Vec<Range<usize>> {
    let late_tail = inputs.iter().rev().take_while(|input| input.kind == workload::Kind::Late).count();
    let body = inputs.len() - late_tail;
    let weights: Vec<usize> = endings
        .iter()
        .map(|e| match e {
            Ending::At { point: "claim.appended_with_completions", .. } => 6,
            _ => 1,
        })
        .chain([1])
        .collect();
    let total: usize = weights.iter().sum();
    let mut before = 0;
    let mut ranges: Vec<Range<usize>> = weights
        .iter()
        .map(|w| {
            let start = before * body / total;
            before += w;
            start..before * body / total
        })
        .collect();
    if let Some(last) = ranges.last_mut() {
        last.end = inputs.len();
    }
    ranges
}

/// Every point `point_kills` times and `random_kills` random kills, shuffled.
pub(super) fn schedule(rng: &mut SplitMix, point_kills: usize, random_kills: usize) -> Vec<Ending> {
    let mut endings = Vec::new();
    for point in dedupd::crash::POINTS {
        for _ in 0..point_kills {
            let delay_ms = (point == "sink.call").then(|| rng.between(DURING_CALL_MS.0, DURING_CALL_MS.1));
            // Compaction meets only expired records (the fodder, and those planted before
            // each incarnation meant to die there: `plant_expiring`), and a round carries
            // completions only when the partition's next round finds its tickets at once
            // (measured: reached once in nearly every chunk, twice not always within the
            // bound); every other point is met a few times by each incarnation's chunk (one
            // claim round, sink call, batch... per partition), so passing it once still
            // lands in work.
            let skip = match point {
                "compaction.chunk" | "claim.appended_with_completions" => 0,
                _ => rng.between(0, 1),
            };
            endings.push(Ending::At { point, skip, delay_ms });
        }
    }
    for k in 0..random_kills {
        let delay = Duration::from_millis(rng.between(KILL_DELAY_MS.0, KILL_DELAY_MS.1));
        endings.push(Ending::Random { from_spawn: k % 5 == 4, delay });
    }
    for i in (1..endings.len()).rev() {
        endings.swap(i, rng.between(0, i as u64) as usize);
    }
    endings
}
