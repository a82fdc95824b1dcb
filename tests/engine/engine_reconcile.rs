//! The reconciler's step for one key in doubt (docs/contract.md §4, "Keys in doubt"):
//! [`Engine::reconcile`] asks the sink's check about an `indeterminate` key's kept command
//! and settles it by the answer: *found* → `succeeded` with the check's answer, no call;
//! *absent* → the command runs once more (claimed first), or past its TTL → `failed`, not
//! run; *unknown* or an error → left as it is. A key not owned here, past the check's
//! deadline, or at a sink without a check is not taken up. A test per row, on a scripted
//! sink; the reconciler's loop and its published settlements are proven on the real
//! broker (kafka_unanswered).
//!
//! Run with `cargo test --test engine engine_reconcile::`.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::orphan::EngineWithSink;
use common::scripted_sink::{Call, Scripted};
use dedupd::engine::{Reconciled, Skip};
use dedupd::outcome::Outcome;
use dedupd::sinks::{CheckAnswer, CheckTiming, Sink, SinkEffect};
use dedupd::store::{Record, SettledBy, SourcePos};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const KEY: &str = "pay-1";

fn timing(deadline: Duration) -> CheckTiming {
    CheckTiming { delay: Duration::from_millis(10), interval: Duration::from_secs(60), deadline }
}

/// An engine whose sink (not forwarding the key) is `scripted` with a check of `deadline`,
/// and `KEY` made `indeterminate` by a call that got no answer and a check that did not
/// tell: the script's first call and first check go to that.
async fn in_doubt(scripted: &Arc<Scripted>, deadline: Duration) -> EngineWithSink {
    let sink = Sink::new("s", false, Arc::clone(scripted) as Arc<dyn SinkEffect>).with_check(Some(timing(deadline)));
    let mut e = EngineWithSink::new(Arc::new(sink));
    let item = e.item(KEY, json!({"ref": "r-1"}));
    let results = e.deliver(&[item]).await;
    assert_eq!(results[0].result.outcome, Outcome::Indeterminate);
    e
}

/// Every key is this instance's.
fn everywhere(_: &str, _: &SourcePos) -> bool {
    true
}

async fn reconcile(e: &EngineWithSink, owns: &(dyn Fn(&str, &SourcePos) -> bool + Sync)) -> Reconciled {
    let cancel = CancellationToken::new();
    let run = e.engine.reconcile(KEY, owns, &cancel);
    tokio::time::timeout(Duration::from_secs(30), run).await.expect("within the bound").unwrap()
}

fn unknown() -> CheckAnswer {
    CheckAnswer::Unknown("HTTP 500".into())
}

#[tokio::test]
async fn found_settles_the_key_succeeded_with_the_checks_answer_and_no_call() {
    let found = json!({"status": 200, "body": {"id": "ch_1"}});
    let scripted = Scripted::new(&[Call::Lost], vec![unknown(), CheckAnswer::Found(found.clone())]);
    let e = in_doubt(&scripted, Duration::from_secs(3600)).await;
    let Reconciled::Settled(p) = reconcile(&e, &everywhere).await else { panic!("not settled") };
    assert_eq!(scripted.log(), ["call Lost", "check unknown", "check found"], "no second call");
    assert_eq!((p.result.outcome, p.result.replay), (Outcome::Succeeded, false));
    assert_eq!(p.result.settled_by.as_deref(), Some("check"));
    assert_eq!(p.result.result, found);
    assert_eq!(p.result.source.offset, 1, "the result of the input that was in doubt");
    let Some(Record::Completed(c)) = e.record(KEY) else { panic!("{:?}", e.record(KEY)) };
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&c.result).unwrap(), found);
    assert_eq!(c.attempts, 1);
    assert_eq!(e.settled_by(KEY), Some(SettledBy::CheckFound));
}

#[tokio::test]
async fn an_intake_commands_settlement_names_its_client() {
    let found = json!({"status": 200, "body": {"id": "ch_1"}});
    for answer in [CheckAnswer::Found(found), CheckAnswer::Absent] {
        let scripted = Scripted::new(&[Call::Lost, Call::Ok], vec![unknown(), answer]);
        let sink = Sink::new("s", false, Arc::clone(&scripted) as Arc<dyn SinkEffect>)
            .with_check(Some(timing(Duration::from_secs(3600))));
        let mut e = EngineWithSink::new(Arc::new(sink));
        let mut item = e.item(KEY, json!({"ref": "r-1"}));
        if let Ok(command) = &mut item.parsed {
            command.intake_client = Some("agent".into());
        }
        let results = e.deliver(&[item]).await;
        assert_eq!(results[0].result.outcome, Outcome::Indeterminate);
        let Some(Record::Indeterminate(r)) = e.record(KEY) else { panic!("{:?}", e.record(KEY)) };
        assert_eq!(r.held.and_then(|h| h.intake_client).as_deref(), Some("agent"), "the record keeps the client");
        let Reconciled::Settled(p) = reconcile(&e, &everywhere).await else { panic!("not settled") };
        let client = p.result.source.intake.as_ref().map(|i| i.client.as_str());
        assert_eq!(client, Some("agent"), "{:?}", scripted.log());
    }
}

#[tokio::test]
async fn absent_runs_the_command_once_more_claimed_first() {
    let scripted = Scripted::new(&[Call::Lost, Call::Ok], vec![unknown(), CheckAnswer::Absent]);
    let e = in_doubt(&scripted, Duration::from_secs(3600)).await;
    let Reconciled::Settled(p) = reconcile(&e, &everywhere).await else { panic!("not settled") };
    assert_eq!(scripted.log(), ["call Lost", "check unknown", "check absent", "call Ok"]);
    assert_eq!(p.result.outcome, Outcome::Succeeded);
    assert_eq!(p.result.settled_by.as_deref(), Some("check"));
    assert_eq!(p.result.result, json!({"paid": KEY}));
    let Some(Record::Completed(c)) = e.record(KEY) else { panic!("{:?}", e.record(KEY)) };
    assert_eq!(c.attempts, 2, "the call in doubt and this one");
    assert_eq!(e.settled_by(KEY), Some(SettledBy::CheckAbsent), "the run its check allowed");
}

#[tokio::test]
async fn a_run_left_during_its_call_is_checked_by_the_next_pass_not_called_again() {
    let found = json!({"status": 200, "body": {"id": "ch_1"}});
    let checks = vec![unknown(), CheckAnswer::Absent, CheckAnswer::Found(found.clone())];
    let scripted = Scripted::new(&[Call::Lost, Call::Slow], checks);
    let e = in_doubt(&scripted, Duration::from_secs(3600)).await;
    // The pass is let go (a stop, a revoke) while the run its *absent* allowed is calling.
    let cancel = CancellationToken::new();
    let let_go = async {
        let calling = common::process::wait_until(Duration::from_secs(10), || scripted.log().len() == 4).await;
        cancel.cancel();
        calling
    };
    let pass = async { e.engine.reconcile(KEY, &everywhere, &cancel).await.unwrap() };
    let (left, calling) = tokio::time::timeout(Duration::from_secs(30), async { tokio::join!(pass, let_go) })
        .await
        .expect("within the bound");
    assert!(calling, "the run called: {:?}", scripted.log());
    assert!(matches!(left, Reconciled::Skipped(Skip::LetGo)), "{left:?}");
    // Its claim is left, keeping the command: still in doubt, and nothing else would take it
    // up (its input was committed long ago).
    let Some(Record::InProgress(claim)) = e.record(KEY) else { panic!("{:?}", e.record(KEY)) };
    assert_eq!((claim.attempts, claim.held.map(|h| h.sink)), (2, Some("s".to_string())));
    assert_eq!(e.store.indeterminate_keys("s"), [KEY]);

    // The next pass takes the claim up as a key in doubt: checked, found, no third call.
    let Reconciled::Settled(p) = reconcile(&e, &everywhere).await else { panic!("not settled") };
    assert_eq!(scripted.log(), ["call Lost", "check unknown", "check absent", "call Slow", "check found"]);
    assert_eq!((p.result.outcome, &p.result.result), (Outcome::Succeeded, &found));
    let Some(Record::Completed(c)) = e.record(KEY) else { panic!("{:?}", e.record(KEY)) };
    assert_eq!(c.attempts, 2, "the two calls in doubt");
    assert_eq!(e.settled_by(KEY), Some(SettledBy::CheckFound));
    assert!(e.store.indeterminate_keys("s").is_empty());
}

#[tokio::test]
async fn a_run_whose_call_is_lost_again_stays_in_doubt_without_a_blind_call() {
    let scripted = Scripted::new(&[Call::Lost, Call::Lost], vec![unknown(), CheckAnswer::Absent, unknown()]);
    let e = in_doubt(&scripted, Duration::from_secs(3600)).await;
    let Reconciled::Unsettled { .. } = reconcile(&e, &everywhere).await else { panic!("settled") };
    assert_eq!(scripted.log(), ["call Lost", "check unknown", "check absent", "call Lost", "check unknown"]);
    let Some(Record::Indeterminate(r)) = e.record(KEY) else { panic!("{:?}", e.record(KEY)) };
    assert_eq!(r.attempts, 2);
}

#[tokio::test]
async fn absent_past_the_commands_ttl_fails_the_key_without_running_it() {
    let scripted = Scripted::new(&[Call::Lost], vec![unknown(), CheckAnswer::Absent]);
    let e = in_doubt(&scripted, Duration::from_secs(86_400)).await;
    // Claimed longer ago than the route's TTL (an hour), within the check's deadline.
    let Some(Record::Indeterminate(was)) = e.record(KEY) else { panic!("{:?}", e.record(KEY)) };
    let old = Record::Indeterminate(dedupd::store::Indeterminate {
        claimed_at_ms: was.claimed_at_ms - 2 * 3_600_000,
        ..was.clone()
    });
    e.store.compare_and_swap(KEY, Some(&Record::Indeterminate(was)), Some(&old)).unwrap().unwrap();
    let Reconciled::Settled(p) = reconcile(&e, &everywhere).await else { panic!("not settled") };
    assert_eq!(scripted.log(), ["call Lost", "check unknown", "check absent"], "not run");
    assert_eq!(p.result.outcome, Outcome::Failed);
    assert!(p.result.error.as_deref().unwrap_or_default().contains("TTL was over"), "{:?}", p.result.error);
    assert_eq!(e.settled_by(KEY), Some(SettledBy::CheckAbsent), "completed as the check left it");
}

#[tokio::test]
async fn a_check_that_does_not_tell_leaves_the_key_as_it_is() {
    for answer in [unknown(), CheckAnswer::Error("connection refused".into())] {
        let label = answer.label();
        let scripted = Scripted::new(&[Call::Lost], vec![unknown(), answer]);
        let e = in_doubt(&scripted, Duration::from_secs(3600)).await;
        let before = e.record(KEY);
        let Reconciled::Unsettled { answer, .. } = reconcile(&e, &everywhere).await else { panic!("{label}") };
        assert_eq!(answer, label);
        assert_eq!(scripted.log(), ["call Lost".to_string(), "check unknown".into(), format!("check {label}")]);
        assert_eq!(e.record(KEY), before, "{label}: nothing written");
    }
}

#[tokio::test]
async fn a_key_not_owned_here_or_past_the_deadline_is_not_asked_about() {
    let scripted = Scripted::new(&[Call::Lost], vec![unknown()]);
    let e = in_doubt(&scripted, Duration::from_secs(3600)).await;
    let elsewhere = |_: &str, _: &SourcePos| false;
    assert!(matches!(reconcile(&e, &elsewhere).await, Reconciled::Skipped(Skip::NotOwned)));
    let scripted = Scripted::new(&[Call::Lost], vec![unknown()]);
    // Its claim is at least the check's delay (10 ms) old.
    let e = in_doubt(&scripted, Duration::ZERO).await;
    assert!(matches!(reconcile(&e, &everywhere).await, Reconciled::Skipped(Skip::PastDeadline)));
    assert_eq!(scripted.log(), ["call Lost", "check unknown"], "no check asked");
    assert!(matches!(e.record(KEY), Some(Record::Indeterminate(_))));
}

#[tokio::test]
async fn a_key_in_doubt_at_a_sink_without_a_check_is_left_to_an_operator() {
    let scripted = Scripted::new(&[Call::Lost], vec![]);
    let sink = Sink::new("s", false, Arc::clone(&scripted) as Arc<dyn SinkEffect>);
    let mut e = EngineWithSink::new(Arc::new(sink));
    let item = e.item(KEY, json!({"ref": "r-1"}));
    assert_eq!(e.deliver(&[item]).await[0].result.outcome, Outcome::Indeterminate);
    assert!(matches!(reconcile(&e, &everywhere).await, Reconciled::Skipped(Skip::NoCheck)));
    assert_eq!(scripted.log(), ["call Lost"]);
}
