//! The decision table of docs/contract.md §4 as one pure function: what to do with an arrival, given
//! what the store holds. No I/O, no clock: `now` comes in through [`Context`].
//!
//! Choices where the table could be read another way, made here (and in docs/decisions.md):
//! - The stale guard only stops *execution*. A stale repeat of a key whose completed record
//!   still exists gets its replay (`duplicate`) or `conflict`, which is more useful and
//!   equally safe; only an arrival that would run the sink becomes `stale`.
//! - An expired `completed` record counts as absent even before compaction removed it.
//! - A different fingerprint is a `conflict` against any live record, including one being
//!   executed right now (no point waiting for it).
//! - The record that claimed a key, read again (a crash came before its offset was
//!   committed), is not a repeat of itself: it gets its own outcome again, not `duplicate`.
//!   Under transactional results its first result was aborted, so this is the only one a
//!   `read_committed` reader sees.

use crate::envelope::RejectReason;
use crate::fingerprint::Fingerprint;
use crate::store::{Record, SourcePos};

/// The facts of a valid arrival that the decision needs.
#[derive(Debug, Clone, Copy)]
pub struct Arrival<'a> {
    /// Fingerprint of the arriving command.
    pub fingerprint: &'a Fingerprint,
    /// When it was produced (per `envelope.stale_by`), Unix ms, if known.
    pub produced_at_ms: Option<i64>,
    /// Its effective TTL in ms.
    pub ttl_ms: i64,
    /// Where it was read (input topic, partition, offset).
    pub source: &'a SourcePos,
    /// Not an arrival from Kafka but the reconciler taking up an `indeterminate` key whose
    /// check just answered *absent*: the command it keeps may run.
    pub checked_absent: bool,
}

/// Facts about the world at decision time, gathered by the caller.
#[derive(Debug, Clone, Copy)]
pub struct Context {
    /// Now, Unix ms.
    pub now_ms: i64,
    /// The key is being executed by this process right now (in-memory registry).
    pub executing_here: bool,
    /// The route's sink forwards the key downstream, so a re-run is safe.
    pub sink_forwards_key: bool,
    /// The route's sink has a check: its receiver can be asked whether an effect exists.
    pub sink_has_check: bool,
    /// `envelope.stale_guard`.
    pub stale_guard: bool,
}

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Claim the key (replacing nothing, or an expired record) and run the sink once.
    Execute,
    /// Re-claim an orphaned `in_progress` record (attempt + 1) and run the sink again with
    /// the same key: safe because the sink forwards the key.
    RerunOrphan,
    /// Re-claim an orphaned `in_progress` record and ask the sink's receiver, with its
    /// check, whether the effect exists before any call: found completes it, absent runs
    /// it, anything else makes it `indeterminate`, or, when the sink forwards the key, runs
    /// it again with the key.
    CheckOrphan,
    /// Claim an `indeterminate` key (attempt + 1) whose check just said the effect is
    /// absent, and run the command it keeps once more (the reconciler).
    RunChecked,
    /// Turn an orphaned `in_progress` record into `indeterminate` and report that.
    MarkIndeterminate,
    /// Publish `duplicate`, replaying the stored result.
    Replay,
    /// Publish the stored outcome (`succeeded`/`failed`) as this record's own result, not
    /// a replay: the arriving record is the one that claimed the key, read again after a
    /// crash (or an aborted results transaction) before its offset was committed.
    Republish,
    /// Publish `conflict`: same key, other payload.
    Conflict,
    /// Wait until this process finishes the key, then decide again.
    Wait,
    /// Publish `indeterminate` (the record already is).
    ReportIndeterminate,
    /// Publish `stale` and dead-letter: never executed.
    Stale,
    /// Publish `rejected` and dead-letter.
    Reject(RejectReason),
}

/// Decides what to do with `input` when the store holds `stored`.
pub fn decide(input: Result<&Arrival<'_>, RejectReason>, stored: Option<&Record>, ctx: &Context) -> Action {
    let arrival = match input {
        Ok(a) => a,
        Err(reason) => return Action::Reject(reason),
    };
    let live = stored.filter(|r| !r.is_expired(ctx.now_ms));
    let Some(record) = live else {
        // Another task of this process has decided to claim the key and has not written
        // the claim yet: its result (or conflict) is what this arrival must see.
        if ctx.executing_here {
            return Action::Wait;
        }
        return if ctx.stale_guard && is_stale(arrival, ctx.now_ms) { Action::Stale } else { Action::Execute };
    };
    if record.fingerprint() != arrival.fingerprint {
        return Action::Conflict;
    }
    match record {
        Record::Completed(c) if c.source.as_ref() == Some(arrival.source) => Action::Republish,
        Record::Completed(_) => Action::Replay,
        Record::Indeterminate(_) if arrival.checked_absent => Action::RunChecked,
        Record::Indeterminate(_) => Action::ReportIndeterminate,
        Record::InProgress(_) if ctx.executing_here => Action::Wait,
        Record::InProgress(_) if ctx.sink_has_check => Action::CheckOrphan,
        Record::InProgress(_) if ctx.sink_forwards_key => Action::RerunOrphan,
        Record::InProgress(_) => Action::MarkIndeterminate,
    }
}

fn is_stale(arrival: &Arrival<'_>, now_ms: i64) -> bool {
    arrival.produced_at_ms.is_some_and(|produced| now_ms.saturating_sub(produced) > arrival.ttl_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Completed, Completion, InProgress, Indeterminate, SourcePos};

    const NOW: i64 = 1_000_000_000;
    const HOUR: i64 = 3_600_000;
    const FP: Fingerprint = Fingerprint([1; 32]);
    const OTHER: Fingerprint = Fingerprint([2; 32]);
    /// Where every arrival of these tests was read.
    static HERE: SourcePos = SourcePos { topic: String::new(), partition: 1, offset: 7 };
    /// Where the stored records' claims were read, unless a test says otherwise.
    static ELSEWHERE: SourcePos = SourcePos { topic: String::new(), partition: 2, offset: 3 };

    fn arrival(fp: &Fingerprint) -> Arrival<'_> {
        Arrival {
            fingerprint: fp,
            produced_at_ms: Some(NOW - 1000),
            ttl_ms: 24 * HOUR,
            source: &HERE,
            checked_absent: false,
        }
    }

    fn ctx() -> Context {
        Context {
            now_ms: NOW,
            executing_here: false,
            sink_forwards_key: false,
            sink_has_check: false,
            stale_guard: true,
        }
    }

    fn completed(fp: Fingerprint, expires_at_ms: i64) -> Record {
        Record::Completed(Completed {
            fingerprint: fp,
            outcome: Completion::Succeeded,
            result: b"{}".to_vec(),
            error: None,
            first_seen_at_ms: NOW - HOUR,
            completed_at_ms: NOW - HOUR,
            expires_at_ms,
            attempts: 1,
            source: Some(ELSEWHERE.clone()),
            settled: None,
        })
    }

    fn in_progress(fp: Fingerprint) -> Record {
        Record::InProgress(InProgress {
            fingerprint: fp,
            claimed_at_ms: NOW - 10,
            attempts: 1,
            source: SourcePos::default(),
            held: None,
        })
    }

    fn indeterminate(fp: Fingerprint) -> Record {
        Record::Indeterminate(Indeterminate {
            fingerprint: fp,
            claimed_at_ms: NOW - 10,
            attempts: 1,
            why: "crash".into(),
            held: None,
        })
    }

    #[test]
    fn row_nothing_stored_executes() {
        assert_eq!(decide(Ok(&arrival(&FP)), None, &ctx()), Action::Execute);
    }

    #[test]
    fn row_expired_record_executes() {
        let expired = completed(FP, NOW);
        assert_eq!(decide(Ok(&arrival(&FP)), Some(&expired), &ctx()), Action::Execute);
        // Even with another fingerprint: an expired record is as good as absent.
        assert_eq!(decide(Ok(&arrival(&OTHER)), Some(&expired), &ctx()), Action::Execute);
    }

    #[test]
    fn row_completed_same_fingerprint_replays() {
        let rec = completed(FP, NOW + 1);
        assert_eq!(decide(Ok(&arrival(&FP)), Some(&rec), &ctx()), Action::Replay);
        // A record written before completions kept their source: a replay too.
        let Record::Completed(mut unknown) = rec else { unreachable!() };
        unknown.source = None;
        assert_eq!(decide(Ok(&arrival(&FP)), Some(&Record::Completed(unknown)), &ctx()), Action::Replay);
    }

    #[test]
    fn row_completed_by_this_very_record_republishes_its_outcome() {
        let Record::Completed(mut own) = completed(FP, NOW + 1) else { unreachable!() };
        own.source = Some(HERE.clone());
        let own = Record::Completed(own);
        assert_eq!(decide(Ok(&arrival(&FP)), Some(&own), &ctx()), Action::Republish);
        // Another payload under the key is still a conflict, whoever claimed it.
        assert_eq!(decide(Ok(&arrival(&OTHER)), Some(&own), &ctx()), Action::Conflict);
    }

    #[test]
    fn row_any_record_other_fingerprint_conflicts() {
        for rec in [completed(FP, NOW + HOUR), in_progress(FP), indeterminate(FP)] {
            assert_eq!(decide(Ok(&arrival(&OTHER)), Some(&rec), &ctx()), Action::Conflict, "{rec:?}");
            let here = Context { executing_here: true, ..ctx() };
            assert_eq!(decide(Ok(&arrival(&OTHER)), Some(&rec), &here), Action::Conflict, "{rec:?}");
        }
    }

    #[test]
    fn row_in_progress_here_waits() {
        let here = Context { executing_here: true, ..ctx() };
        assert_eq!(decide(Ok(&arrival(&FP)), Some(&in_progress(FP)), &here), Action::Wait);
        let forwarding = Context { sink_forwards_key: true, ..here };
        assert_eq!(decide(Ok(&arrival(&FP)), Some(&in_progress(FP)), &forwarding), Action::Wait);
    }

    #[test]
    fn key_being_claimed_here_waits_even_before_its_record_exists() {
        let here = Context { executing_here: true, ..ctx() };
        assert_eq!(decide(Ok(&arrival(&FP)), None, &here), Action::Wait);
        assert_eq!(decide(Ok(&arrival(&FP)), Some(&completed(FP, NOW - 1)), &here), Action::Wait);
        assert_eq!(decide(Ok(&arrival(&OTHER)), None, &here), Action::Wait);
    }

    #[test]
    fn row_orphan_reruns_when_sink_forwards_key() {
        let c = Context { sink_forwards_key: true, ..ctx() };
        assert_eq!(decide(Ok(&arrival(&FP)), Some(&in_progress(FP)), &c), Action::RerunOrphan);
    }

    #[test]
    fn row_orphan_is_checked_when_sink_has_a_check() {
        let c = Context { sink_has_check: true, ..ctx() };
        assert_eq!(decide(Ok(&arrival(&FP)), Some(&in_progress(FP)), &c), Action::CheckOrphan);
        // A sink that forwards the key is asked too: a record found is not written twice.
        let forwarding = Context { sink_forwards_key: true, ..c };
        assert_eq!(decide(Ok(&arrival(&FP)), Some(&in_progress(FP)), &forwarding), Action::CheckOrphan);
    }

    #[test]
    fn row_orphan_becomes_indeterminate_otherwise() {
        assert_eq!(decide(Ok(&arrival(&FP)), Some(&in_progress(FP)), &ctx()), Action::MarkIndeterminate);
    }

    #[test]
    fn row_indeterminate_reports_indeterminate() {
        assert_eq!(decide(Ok(&arrival(&FP)), Some(&indeterminate(FP)), &ctx()), Action::ReportIndeterminate);
        let with_check = Context { sink_has_check: true, sink_forwards_key: true, ..ctx() };
        assert_eq!(decide(Ok(&arrival(&FP)), Some(&indeterminate(FP)), &with_check), Action::ReportIndeterminate);
    }

    #[test]
    fn row_indeterminate_whose_check_said_absent_runs_for_the_reconciler() {
        let checked = Arrival { checked_absent: true, ..arrival(&FP) };
        assert_eq!(decide(Ok(&checked), Some(&indeterminate(FP)), &ctx()), Action::RunChecked);
        // Only an indeterminate record: anything else it finds is decided as for an arrival.
        assert_eq!(decide(Ok(&checked), Some(&completed(FP, NOW + HOUR)), &ctx()), Action::Replay);
        assert_eq!(decide(Ok(&checked), Some(&indeterminate(OTHER)), &ctx()), Action::Conflict);
        let executing = Context { executing_here: true, ..ctx() };
        assert_eq!(decide(Ok(&checked), Some(&in_progress(FP)), &executing), Action::Wait);
    }

    #[test]
    fn row_produced_longer_ago_than_ttl_is_stale() {
        let old = Arrival {
            fingerprint: &FP,
            produced_at_ms: Some(NOW - 25 * HOUR),
            ttl_ms: 24 * HOUR,
            source: &HERE,
            checked_absent: false,
        };
        assert_eq!(decide(Ok(&old), None, &ctx()), Action::Stale);
        // Exactly at the TTL is not yet stale.
        let edge = Arrival { produced_at_ms: Some(NOW - 24 * HOUR), ..old };
        assert_eq!(decide(Ok(&edge), None, &ctx()), Action::Execute);
        // The guard can be turned off.
        let off = Context { stale_guard: false, ..ctx() };
        assert_eq!(decide(Ok(&old), None, &off), Action::Execute);
        // Unknown production time is never stale.
        let unknown = Arrival { produced_at_ms: None, ..old };
        assert_eq!(decide(Ok(&unknown), None, &ctx()), Action::Execute);
        // A stale repeat of a live completed key still gets its replay.
        assert_eq!(decide(Ok(&old), Some(&completed(FP, NOW + HOUR)), &ctx()), Action::Replay);
    }

    #[test]
    fn row_invalid_input_is_rejected() {
        for reason in RejectReason::ALL {
            assert_eq!(decide(Err(reason), Some(&completed(FP, NOW + HOUR)), &ctx()), Action::Reject(reason));
        }
    }
}
