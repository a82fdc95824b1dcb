//! The engine's rule for calls without an answer (docs/contract.md §4): for a sink that
//! does not forward the key, a call that may have landed unanswered (`maybe`) is never
//! followed by another call unless the sink's check said the effect is absent; a claim a
//! crash left in progress is checked, not marked `indeterminate` straight away, when the
//! sink has a check. A sink that forwards the key keeps retrying with it, asking first when
//! it has a check (a record found is not written twice).
//!
//! The sink here is scripted (what each call and check answers) so that every row of that
//! rule is driven exactly; the real sinks' answers are proven against real receivers in
//! their own tests (http_check, exec_sink, smtp_sink, kafka_sink_check, kafka_unanswered).
//!
//! Run with `cargo test --test engine engine_unanswered::`.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::orphan::EngineWithSink;
use common::scripted_sink::{Call, Scripted};
use dedupd::outcome::Outcome;
use dedupd::sinks::{CheckAnswer, CheckTiming, Sink, SinkEffect};
use dedupd::store::{Record, SettledBy};
use serde_json::json;

/// A check with no delay worth waiting for.
fn timing() -> Option<CheckTiming> {
    Some(CheckTiming {
        delay: Duration::from_millis(10),
        interval: Duration::from_secs(60),
        deadline: Duration::from_secs(86_400),
    })
}

/// Runs one command through `scripted` (forwarding the key or not, with a check or not).
async fn run_one(
    scripted: &Arc<Scripted>,
    forwards_key: bool,
    check: Option<CheckTiming>,
) -> (EngineWithSink, Outcome) {
    let sink = Sink::new("s", forwards_key, Arc::clone(scripted) as Arc<dyn SinkEffect>).with_check(check);
    let mut e = EngineWithSink::new(Arc::new(sink));
    let item = e.item("pay-1", json!({"ref": "r-1"}));
    let results = e.deliver(&[item]).await;
    let outcome = results[0].result.outcome;
    (e, outcome)
}

#[tokio::test]
async fn a_lost_answer_without_a_check_is_indeterminate_after_one_call() {
    let scripted = Scripted::new(&[Call::Lost], vec![]);
    let (e, outcome) = run_one(&scripted, false, None).await;
    assert_eq!(outcome, Outcome::Indeterminate);
    assert_eq!(scripted.log(), ["call Lost"], "no second call, no retry spent");
    let Some(Record::Indeterminate(r)) = e.record("pay-1") else { panic!("{:?}", e.record("pay-1")) };
    assert_eq!(r.attempts, 1);
    assert!(r.why.contains("has no check"), "{}", r.why);
}

#[tokio::test]
async fn a_lost_answer_found_by_the_check_succeeds_with_the_checks_answer() {
    let found = json!({"status": 200, "body": {"id": "pay-1"}});
    let scripted = Scripted::new(&[Call::Lost], vec![CheckAnswer::Found(found.clone())]);
    let (e, outcome) = run_one(&scripted, false, timing()).await;
    assert_eq!(outcome, Outcome::Succeeded);
    assert_eq!(scripted.log(), ["call Lost", "check found"]);
    let Some(Record::Completed(c)) = e.record("pay-1") else { panic!("{:?}", e.record("pay-1")) };
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&c.result).unwrap(), found);
    assert_eq!(c.attempts, 1);
    assert_eq!(e.settled_by("pay-1"), Some(SettledBy::CheckFound), "the record says the check settled it");
}

#[tokio::test]
async fn a_lost_answer_the_check_finds_absent_is_called_again() {
    let scripted = Scripted::new(&[Call::Lost, Call::Ok], vec![CheckAnswer::Absent]);
    let (e, outcome) = run_one(&scripted, false, timing()).await;
    assert_eq!(outcome, Outcome::Succeeded);
    assert_eq!(scripted.log(), ["call Lost", "check absent", "call Ok"]);
    let Some(Record::Completed(c)) = e.record("pay-1") else { panic!("{:?}", e.record("pay-1")) };
    assert_eq!(c.attempts, 2);
    assert_eq!(e.settled_by("pay-1"), Some(SettledBy::CheckAbsent), "the call the check allowed");
}

#[tokio::test]
async fn a_check_that_does_not_tell_leaves_the_key_indeterminate() {
    for answer in [CheckAnswer::Unknown("HTTP 500".into()), CheckAnswer::Error("connection refused".into())] {
        let label = answer.label();
        let scripted = Scripted::new(&[Call::Lost], vec![answer]);
        let (e, outcome) = run_one(&scripted, false, timing()).await;
        assert_eq!(outcome, Outcome::Indeterminate, "{label}");
        assert_eq!(scripted.log(), ["call Lost".to_string(), format!("check {label}")]);
        let Some(Record::Indeterminate(r)) = e.record("pay-1") else { panic!("{label}: {:?}", e.record("pay-1")) };
        assert!(r.why.contains("its check did not tell"), "{}", r.why);
    }
}

#[tokio::test]
async fn answered_and_unsent_failures_are_retried_without_a_check() {
    // The engine here makes at most 2 calls (common::engine::test_retry).
    for first in [Call::Busy, Call::Refused] {
        let scripted = Scripted::new(&[first, Call::Ok], vec![]);
        let (e, outcome) = run_one(&scripted, false, timing()).await;
        assert_eq!(outcome, Outcome::Succeeded, "{first:?}");
        assert_eq!(scripted.log(), [format!("call {first:?}"), "call Ok".to_string()], "nothing in doubt: no check");
        assert_eq!(e.settled_by("pay-1"), None, "never in doubt");
    }
}

#[tokio::test]
async fn a_sink_that_forwards_the_key_retries_a_lost_answer_with_it() {
    let scripted = Scripted::new(&[Call::Lost, Call::Ok], vec![]);
    let (_, outcome) = run_one(&scripted, true, None).await;
    assert_eq!(outcome, Outcome::Succeeded);
    assert_eq!(scripted.log(), ["call Lost", "call Ok"]);
}

#[tokio::test]
async fn a_sink_that_forwards_the_key_and_has_a_check_is_not_called_again_for_an_effect_found() {
    let found = json!({"topic": "payments", "partition": 0, "offset": 7});
    let scripted = Scripted::new(&[Call::Lost], vec![CheckAnswer::Found(found.clone())]);
    let (e, outcome) = run_one(&scripted, true, timing()).await;
    assert_eq!(outcome, Outcome::Succeeded);
    assert_eq!(scripted.log(), ["call Lost", "check found"], "no second record");
    let Some(Record::Completed(c)) = e.record("pay-1") else { panic!("{:?}", e.record("pay-1")) };
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&c.result).unwrap(), found);
}

#[tokio::test]
async fn a_sink_that_forwards_the_key_is_called_again_when_its_check_does_not_tell() {
    for answer in [CheckAnswer::Absent, CheckAnswer::Unknown("past max_records".into())] {
        let label = answer.label();
        let scripted = Scripted::new(&[Call::Lost, Call::Ok], vec![answer]);
        let (_, outcome) = run_one(&scripted, true, timing()).await;
        assert_eq!(outcome, Outcome::Succeeded, "{label}");
        assert_eq!(scripted.log(), ["call Lost".to_string(), format!("check {label}"), "call Ok".to_string()]);
    }
}

/// A claim left in progress by a crash, then the command delivered again to a fresh
/// engine whose sink has a check (and does not forward the key).
async fn orphan_then_redelivered(scripted: &Arc<Scripted>) -> (EngineWithSink, Outcome) {
    orphan_at(scripted, false).await
}

/// As [`orphan_then_redelivered`], the sink forwarding the key or not.
async fn orphan_at(scripted: &Arc<Scripted>, forwards_key: bool) -> (EngineWithSink, Outcome) {
    let sink = Sink::new("s", forwards_key, Arc::clone(scripted) as Arc<dyn SinkEffect>).with_check(timing());
    let mut e = EngineWithSink::new(Arc::new(sink));
    let item = e.item("pay-1", json!({"ref": "r-1"}));
    e.orphan_claim(&item);
    let results = e.deliver(&[item]).await;
    let outcome = results[0].result.outcome;
    (e, outcome)
}

#[tokio::test]
async fn an_orphan_found_by_the_check_succeeds_without_a_call() {
    let scripted = Scripted::new(&[], vec![CheckAnswer::Found(json!({"status": 200}))]);
    let (e, outcome) = orphan_then_redelivered(&scripted).await;
    assert_eq!(outcome, Outcome::Succeeded);
    assert_eq!(scripted.log(), ["check found"]);
    let Some(Record::Completed(c)) = e.record("pay-1") else { panic!("{:?}", e.record("pay-1")) };
    assert_eq!(c.attempts, 1, "the crashed run's call, no other");
    assert_eq!(e.settled_by("pay-1"), Some(SettledBy::CheckFound));
}

#[tokio::test]
async fn an_orphan_the_check_finds_absent_runs() {
    let scripted = Scripted::new(&[Call::Ok], vec![CheckAnswer::Absent]);
    let (e, outcome) = orphan_then_redelivered(&scripted).await;
    assert_eq!(outcome, Outcome::Succeeded);
    assert_eq!(scripted.log(), ["check absent", "call Ok"]);
    let Some(Record::Completed(c)) = e.record("pay-1") else { panic!("{:?}", e.record("pay-1")) };
    assert_eq!(c.attempts, 2);
    assert_eq!(e.settled_by("pay-1"), Some(SettledBy::CheckAbsent));
}

#[tokio::test]
async fn an_orphan_the_check_cannot_settle_is_indeterminate_without_a_call() {
    let scripted = Scripted::new(&[], vec![CheckAnswer::Error("connection refused".into())]);
    let (e, outcome) = orphan_then_redelivered(&scripted).await;
    assert_eq!(outcome, Outcome::Indeterminate);
    assert_eq!(scripted.log(), ["check error"]);
    let Some(Record::Indeterminate(r)) = e.record("pay-1") else { panic!("{:?}", e.record("pay-1")) };
    assert!(r.why.contains("left in progress by a crash"), "{}", r.why);
}

#[tokio::test]
async fn an_orphan_at_a_sink_that_forwards_the_key_is_checked_then_run_again_unless_found() {
    let scripted = Scripted::new(&[], vec![CheckAnswer::Found(json!({"offset": 3}))]);
    let (_, outcome) = orphan_at(&scripted, true).await;
    assert_eq!(outcome, Outcome::Succeeded);
    assert_eq!(scripted.log(), ["check found"], "the record the crashed run wrote is not written again");
    let scripted = Scripted::new(&[Call::Ok], vec![CheckAnswer::Error("cluster unreachable".into())]);
    let (e, outcome) = orphan_at(&scripted, true).await;
    assert_eq!(outcome, Outcome::Succeeded);
    assert_eq!(scripted.log(), ["check error", "call Ok"], "run again with the key");
    let Some(Record::Completed(c)) = e.record("pay-1") else { panic!("{:?}", e.record("pay-1")) };
    assert_eq!(c.attempts, 2);
}
