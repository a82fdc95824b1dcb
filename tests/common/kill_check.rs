//! What must hold after `dedupd` was SIGKILLed many times while it worked (tests/kafka/kafka_kill.rs),
//! judged from the outside only: the results topic, what each sink's downstream received
//! ([`Effect`]s, tests/common/effects.rs) and the store opened directly. docs/contract.md §3 "durable
//! before the sink is called", §4 crash rows, §5 "nothing is lost":
//! - every input record (partition/offset) has a result; every key has one; outcomes are
//!   only `succeeded`, `duplicate`, `indeterminate`; a key never has both a
//!   `succeeded`/`duplicate` and an `indeterminate`, nor `succeeded` results of two inputs
//!   (the input that ran it, read again after a kill, publishes its `succeeded` again);
//! - every effect carries its command's key and payload and reached the command's own sink;
//! - non-forwarding sink: at most one effect per key; a key it never received ends
//!   `indeterminate` (store and results);
//! - forwarding sink: every key ends `succeeded` (orphans are re-run, never indeterminate);
//!   its repeated effects for a key are identical, with strictly increasing attempt numbers
//!   where the kind passes them on;
//! - every key stored or published as succeeded was received by its own sink, and its stored
//!   and replayed result answers one of its own effects;
//! - the input that ran a key (the completed record's source) has only `succeeded` results;
//! - the store holds no `in_progress` record.

use std::collections::{BTreeMap, HashMap, HashSet};

use dedupd::outcome::{Outcome, ResultRecord};
use dedupd::store::{Completion, KeyStore, Record};
use rdkafka::message::{Message, OwnedMessage};
use serde_json::Value;

use super::effects::{Effect, SinkKind, answered};
use super::kafka::header;

/// One key of the workload and where its route sends it.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The idempotency key.
    pub key: String,
    /// The sink its route names.
    pub sink: &'static str,
    /// That sink's kind.
    pub kind: SinkKind,
    /// Whether that sink forwards the key (`forwards_key`).
    pub forwarding: bool,
    /// What the sink's downstream should see of the payload (`effects::seen_as`).
    pub seen: Value,
}

/// What the run left, as seen from the outside.
pub struct Outside<'a> {
    /// The input topic (every result names it).
    pub input_topic: &'a str,
    /// The plan index of each input record, in the order produced.
    pub inputs: &'a [usize],
    /// Input record position (partition, offset) to its index in `inputs`.
    pub by_pos: &'a HashMap<(i32, i64), usize>,
    /// Every record of the results topic.
    pub results: &'a [OwnedMessage],
    /// Everything every sink's downstream received.
    pub effects: &'a [Effect],
    /// The store, opened after the final run.
    pub store: &'a KeyStore,
}

/// The crash rows a run exercised at one sink.
#[derive(Debug, Default, Clone)]
pub struct SinkCoverage {
    /// Keys routed to it.
    pub keys: usize,
    /// Effects its downstream received.
    pub effects: usize,
    /// Keys received but ending indeterminate (killed between the effect and the durable
    /// completion); non-forwarding sinks only.
    pub received_indeterminate: usize,
    /// Keys never received, ending indeterminate (claimed, then killed before the effect).
    pub unreceived_indeterminate: usize,
    /// Keys with more than one effect (orphans re-run); forwarding sinks only.
    pub reran: usize,
}

/// Checks the rules above; every violation is pushed to `failures`. Returns what each sink
/// (by name) exercised.
pub fn check(
    label: &str,
    plans: &[Plan],
    o: &Outside<'_>,
    failures: &mut Vec<String>,
) -> BTreeMap<&'static str, SinkCoverage> {
    let n = o.inputs.len();
    let index: HashMap<&str, usize> = plans.iter().enumerate().map(|(i, p)| (p.key.as_str(), i)).collect();
    let mut fail = |s: String| failures.push(s);

    // Results: every input has at least one; each names a known input and its key.
    let mut per_seq: Vec<Vec<ResultRecord>> = vec![Vec::new(); n];
    let mut per_key: Vec<Vec<ResultRecord>> = vec![Vec::new(); plans.len()];
    let mut outcomes: BTreeMap<&'static str, usize> = BTreeMap::new();
    for m in o.results {
        let r: ResultRecord = match serde_json::from_slice(m.payload().unwrap_or_default()) {
            Ok(r) => r,
            Err(e) => {
                fail(format!("unreadable result record: {e}"));
                continue;
            }
        };
        if r.source.topic != o.input_topic {
            fail(format!("result from another topic: {:?}", r.source));
            continue;
        }
        let Some(&seq) = o.by_pos.get(&(r.source.partition, r.source.offset)) else {
            fail(format!("result for an unknown input {:?}", r.source));
            continue;
        };
        let i = o.inputs[seq];
        if r.key.as_deref() != Some(plans[i].key.as_str()) {
            fail(format!("result of input {seq} names key {:?}, expected {}", r.key, plans[i].key));
        }
        if header(m, "dedupd-outcome").as_deref() != Some(r.outcome.as_str()) {
            fail(format!("dedupd-outcome header of input {seq} differs from {}", r.outcome.as_str()));
        }
        *outcomes.entry(r.outcome.as_str()).or_insert(0) += 1;
        per_seq[seq].push(r.clone());
        per_key[i].push(r);
    }
    let missing: Vec<usize> = (0..n).filter(|s| per_seq[*s].is_empty()).collect();
    if !missing.is_empty() {
        fail(format!(
            "{} inputs without a result, e.g. {:?}",
            missing.len(),
            missing.iter().take(10).map(|s| (*s, &plans[o.inputs[*s]].key)).collect::<Vec<_>>()
        ));
    }
    let repeated_results = per_seq.iter().filter(|v| v.len() > 1).count();

    // The downstreams: who got what.
    let mut received: Vec<Vec<&Effect>> = vec![Vec::new(); plans.len()];
    for e in o.effects {
        let Some(&i) = e.key.as_deref().and_then(|k| index.get(k)) else {
            fail(format!("effect {} at sink {} carries an unknown key {:?}", e.id, e.sink, e.key));
            continue;
        };
        let plan = &plans[i];
        if e.sink != plan.sink {
            fail(format!(
                "effect {} for {} reached sink {}, its route's sink is {}",
                e.id, plan.key, e.sink, plan.sink
            ));
        }
        if e.seen != plan.seen {
            fail(format!("effect {} for {}: {} is not its payload {}", e.id, plan.key, e.seen, plan.seen));
        }
        if plan.kind != SinkKind::Smtp && e.attempt.is_none() {
            fail(format!("effect {} for {} carries no attempt number", e.id, plan.key));
        }
        received[i].push(e);
    }
    for (plan, effects) in plans.iter().zip(&received) {
        let ids = || effects.iter().map(|e| e.id.as_str()).collect::<Vec<_>>();
        if !plan.forwarding && effects.len() > 1 {
            fail(format!(
                "non-forwarding key {} executed {} times at {} ({:?})",
                plan.key,
                effects.len(),
                plan.sink,
                ids()
            ));
        }
        if plan.forwarding && effects.len() > 1 {
            let attempts: Vec<u64> = effects.iter().map(|e| e.attempt.unwrap_or(0)).collect();
            if plan.kind != SinkKind::Smtp && attempts.windows(2).any(|w| w[0] >= w[1]) {
                fail(format!(
                    "forwarding key {}: attempt not increasing over its re-runs {:?}: {attempts:?}",
                    plan.key,
                    ids()
                ));
            }
        }
    }

    // Per key: results, effects and the stored record agree.
    let mut records: HashMap<String, Record> = HashMap::new();
    let mut after: Option<String> = None;
    loop {
        let page = o.store.scan_records(after.as_deref(), 1000).expect("scan the store");
        let Some((last, _)) = page.last() else { break };
        after = Some(last.clone());
        records.extend(page);
    }
    let counts = o.store.counts();
    if counts.in_progress != 0 {
        fail(format!("the store holds {} in_progress record(s) after the final run", counts.in_progress));
    }
    let mut coverage: BTreeMap<&'static str, SinkCoverage> = BTreeMap::new();
    for (i, plan) in plans.iter().enumerate() {
        let key = &plan.key;
        let rs = &per_key[i];
        let effects = &received[i];
        let own: HashSet<&str> = effects.iter().map(|e| e.id.as_str()).collect();
        let cov = coverage.entry(plan.sink).or_default();
        cov.keys += 1;
        cov.effects += effects.len();
        if plan.forwarding && effects.len() > 1 {
            cov.reran += 1;
        }
        if rs.is_empty() {
            fail(format!("key {key} has no result at all"));
        }
        let succeeded = rs
            .iter()
            .filter(|r| r.outcome == Outcome::Succeeded)
            .map(|r| (r.source.partition, r.source.offset))
            .collect::<HashSet<_>>()
            .len();
        let ok = rs.iter().filter(|r| matches!(r.outcome, Outcome::Succeeded | Outcome::Duplicate)).count();
        let ind = rs.iter().filter(|r| r.outcome == Outcome::Indeterminate).count();
        if let Some(r) =
            rs.iter().find(|r| !matches!(r.outcome, Outcome::Succeeded | Outcome::Duplicate | Outcome::Indeterminate))
        {
            fail(format!("key {key}: unexpected outcome {:?}: {r:?}", r.outcome));
        }
        if succeeded > 1 {
            fail(format!("key {key}: `succeeded` results of {succeeded} inputs (only the one that ran it may say so)"));
        }
        if ok > 0 && ind > 0 {
            fail(format!("key {key}: both succeeded/duplicate ({ok}) and indeterminate ({ind}) results"));
        }
        if plan.forwarding && ind > 0 {
            fail(format!("forwarding key {key} published `indeterminate` ({ind} times); its orphans must be re-run"));
        }
        if ok > 0 && effects.is_empty() {
            fail(format!(
                "key {key} was published as succeeded/duplicate but its sink ({}) never received it",
                plan.sink
            ));
        }
        match records.get(key) {
            None => fail(format!("key {key}: no record in the store")),
            Some(Record::InProgress(p)) => fail(format!("key {key} is still in_progress: {p:?}")),
            Some(Record::Completed(c)) => {
                if c.outcome != Completion::Succeeded {
                    fail(format!("key {key} completed as {:?}: {:?}", c.outcome, c.error));
                }
                if effects.is_empty() {
                    fail(format!("key {key} is stored completed but its sink ({}) never received it", plan.sink));
                }
                let stored: Value = serde_json::from_slice(&c.result).unwrap_or(Value::Null);
                match answered(plan.kind, key, &stored) {
                    Some(id) if own.contains(id.as_str()) => {}
                    other => fail(format!(
                        "key {key}: the stored result {stored} answers {other:?}, not one of its own {own:?}"
                    )),
                }
                for r in rs.iter().filter(|r| matches!(r.outcome, Outcome::Succeeded | Outcome::Duplicate)) {
                    if r.result != stored {
                        fail(format!(
                            "key {key}: published result {} (input {:?}) differs from the stored {stored}",
                            r.result, r.source
                        ));
                    }
                }
                if ind > 0 {
                    fail(format!("key {key} is stored completed but was published indeterminate"));
                }
                // The input that ran it is never told it is a repeat of itself, even when a
                // kill made it come again.
                if let Some(src) = &c.source
                    && let Some(&seq) = o.by_pos.get(&(src.partition, src.offset))
                    && let Some(r) = per_seq[seq].iter().find(|r| r.outcome != Outcome::Succeeded)
                {
                    fail(format!("key {key}: the input that ran it ({src:?}) was published as {:?}", r.outcome));
                }
            }
            Some(Record::Indeterminate(r)) => {
                if plan.forwarding {
                    fail(format!("forwarding key {key} is stored indeterminate: {}", r.why));
                }
                if ok > 0 {
                    fail(format!("key {key} is stored indeterminate but was published succeeded/duplicate"));
                }
                if ind == 0 {
                    fail(format!("key {key} is stored indeterminate but no result says so"));
                }
                if effects.is_empty() { cov.unreceived_indeterminate += 1 } else { cov.received_indeterminate += 1 }
            }
        }
        if !plan.forwarding && effects.is_empty() && ind == 0 {
            fail(format!("non-forwarding key {key} was never received and has no `indeterminate` result"));
        }
    }
    // Compaction fodder (its own route, a TTL of a second) and the records planted for an
    // incarnation meant to die in compaction (a TTL of 2 s) may still be there, unexpired or
    // not compacted yet when the final run stopped (it can stop a second after the last
    // incarnation planted them): every other record is a planned key's.
    let planned_records = records.keys().filter(|k| !k.starts_with("fodder-") && !k.starts_with("planted-")).count();
    if planned_records != plans.len() {
        fail(format!("the store holds {planned_records} records besides fodder, expected {}", plans.len()));
    }
    println!(
        "[{label}] results: {} records for {n} inputs ({repeated_results} inputs with more than one), outcomes {outcomes:?}; \
         store {counts:?}",
        o.results.len()
    );
    for (sink, c) in &coverage {
        println!(
            "[{label}]   {sink:<10} {:>4} keys, {:>4} effects; {:>3} keys re-run after a kill; indeterminate: {:>3} received \
             (killed between the effect and the completion flush), {:>3} never received (claimed, then killed before the effect)",
            c.keys, c.effects, c.reran, c.received_indeterminate, c.unreceived_indeterminate
        );
    }
    coverage
}
