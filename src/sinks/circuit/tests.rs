use super::*;
use crate::problems::Problem;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};

fn config(threshold: u32, backoff_ms: u64, max_ms: u64) -> CircuitConfig {
    CircuitConfig {
        enabled: true,
        failure_threshold: NonZeroU32::new(threshold).unwrap(),
        probe_backoff: Duration::from_millis(backoff_ms),
        max_probe_backoff: Duration::from_millis(max_ms),
    }
}

/// Whether `admit` would admit right now, without waiting.
fn admits_now<'c>(c: &'c Circuit, key: &str) -> Option<Admission<'c>> {
    let mut fut = pin!(c.admit(key));
    match fut.as_mut().poll(&mut Context::from_waker(std::task::Waker::noop())) {
        Poll::Ready(a) => Some(a),
        Poll::Pending => None,
    }
}

async fn fail_as(c: &Circuit, key: &str) -> Verdict {
    c.admit(key).await.failed_transiently()
}

#[tokio::test(start_paused = true)]
async fn opens_after_threshold_keys_failing_in_a_row_and_an_answer_resets_the_count() {
    let c = Circuit::new("s", &config(3, 1000, 8000));
    let mut rx = c.subscribe();
    assert_eq!(fail_as(&c, "a").await, Verdict::Counted);
    assert_eq!(fail_as(&c, "b").await, Verdict::Counted);
    c.admit("c").await.answered();
    assert!(c.is_closed() && !*rx.borrow_and_update(), "an answer resets the count");
    assert_eq!(fail_as(&c, "a").await, Verdict::Counted);
    assert_eq!(fail_as(&c, "b").await, Verdict::Counted);
    assert_eq!(fail_as(&c, "c").await, Verdict::SinkDown, "the third key in a row opens it");
    assert!(!c.is_closed());
    assert!(rx.has_changed().unwrap() && *rx.borrow_and_update(), "opening is announced");
    assert!(admits_now(&c, "d").is_none(), "no call goes while open");
}

#[tokio::test(start_paused = true)]
async fn one_key_failing_again_and_again_never_opens_it() {
    let c = Circuit::new("s", &config(3, 1000, 8000));
    for _ in 0..100 {
        assert_eq!(fail_as(&c, "bad").await, Verdict::Counted);
    }
    assert!(c.is_closed());
    assert_eq!(fail_as(&c, "b").await, Verdict::Counted);
    assert_eq!(fail_as(&c, "c").await, Verdict::SinkDown, "three different keys do");
}

#[tokio::test(start_paused = true)]
async fn probes_rotate_and_a_key_failing_probes_alone_spends_its_attempts() {
    let c = Arc::new(Circuit::new("s", &config(2, 100, 100)));
    assert_eq!(fail_as(&c, "bad").await, Verdict::Counted);
    assert_eq!(fail_as(&c, "x").await, Verdict::SinkDown);
    tokio::time::advance(Duration::from_millis(100)).await;
    let probe = admits_now(&c, "bad").expect("the first to ask probes");
    assert_eq!(probe.failed_transiently(), Verdict::SinkDown, "a first failed probe is the sink's");
    // At the next probe time another waiter goes first; the key that failed waits.
    let other = {
        let c = Arc::clone(&c);
        tokio::spawn(async move { c.admit("good").await.answered() })
    };
    let bad = {
        let c = Arc::clone(&c);
        tokio::spawn(async move {
            let a = c.admit("bad").await;
            (a.is_probe(), a.failed_transiently())
        })
    };
    other.await.unwrap();
    assert!(c.is_closed() || bad.is_finished(), "the other waiter probed and closed it");
    assert_eq!(bad.await.unwrap(), (false, Verdict::Counted), "then it retries as an ordinary call");
    // Alone, the failing key probes again and again: from the second time it counts.
    let c = Circuit::new("s", &config(1, 100, 100));
    assert_eq!(fail_as(&c, "bad").await, Verdict::SinkDown);
    assert_eq!(fail_as(&c, "bad").await, Verdict::SinkDown, "the first probe");
    let start = Instant::now();
    assert_eq!(fail_as(&c, "bad").await, Verdict::Counted, "the second probe in a row");
    assert_eq!(start.elapsed(), Duration::from_millis(200), "after letting others go first");
}

#[tokio::test(start_paused = true)]
async fn half_open_lets_exactly_one_probe_and_its_answer_closes() {
    let c = Arc::new(Circuit::new("s", &config(1, 1000, 8000)));
    assert_eq!(fail_as(&c, "a").await, Verdict::SinkDown);
    tokio::time::advance(Duration::from_millis(999)).await;
    assert!(admits_now(&c, "a").is_none(), "before the backoff no probe");
    tokio::time::advance(Duration::from_millis(1)).await;
    let probe = admits_now(&c, "a").expect("the probe goes at the backoff");
    assert!(probe.is_probe());
    // Everyone else waits while the probe is out, however long it takes.
    let waiters: Vec<_> = (0..3)
        .map(|i| {
            let c = Arc::clone(&c);
            tokio::spawn(async move {
                let a = c.admit(&format!("w{i}")).await;
                let probe = a.is_probe();
                a.answered();
                probe
            })
        })
        .collect();
    tokio::time::advance(Duration::from_secs(60)).await;
    tokio::task::yield_now().await;
    assert!(waiters.iter().all(|w| !w.is_finished()), "a second call went while the probe was out");
    probe.answered();
    for w in waiters {
        assert!(!w.await.unwrap(), "released as ordinary calls, not probes");
    }
    assert!(c.is_closed(), "the probe's answer closed the circuit");
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_probe_hands_probing_to_the_next_waiter() {
    let c = Arc::new(Circuit::new("s", &config(1, 1000, 8000)));
    assert_eq!(fail_as(&c, "a").await, Verdict::SinkDown);
    tokio::time::advance(Duration::from_millis(1000)).await;
    let probe = admits_now(&c, "a").expect("probe");
    let waiter = {
        let c = Arc::clone(&c);
        tokio::spawn(async move { c.admit("b").await.is_probe() })
    };
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    drop(probe);
    assert!(waiter.await.unwrap(), "the waiter became the probe without a new backoff");
}

#[tokio::test(start_paused = true)]
async fn failed_probes_double_the_backoff_up_to_the_cap() {
    let c = Circuit::new("s", &config(1, 100, 350));
    assert_eq!(fail_as(&c, "a").await, Verdict::SinkDown);
    let mut waited = Vec::new();
    for i in 0..4 {
        let start = Instant::now();
        let probe = c.admit(&format!("p{i}")).await;
        waited.push(start.elapsed());
        assert!(probe.is_probe());
        assert_eq!(probe.failed_transiently(), Verdict::SinkDown);
    }
    let ms: Vec<u128> = waited.iter().map(Duration::as_millis).collect();
    assert_eq!(ms, vec![100, 200, 350, 350]);
    let probe = c.admit("p").await;
    probe.answered();
    assert!(c.is_closed());
    // Closed again: the next opening starts from the initial backoff.
    assert_eq!(fail_as(&c, "a").await, Verdict::SinkDown);
    let start = Instant::now();
    c.admit("b").await.answered();
    assert_eq!(start.elapsed().as_millis(), 100);
}

#[tokio::test(start_paused = true)]
async fn failures_of_calls_admitted_before_opening_do_not_count_and_an_answer_closes() {
    let c = Circuit::new("s", &config(2, 1000, 8000));
    let late = c.admit("late").await;
    let late_ok = c.admit("late_ok").await;
    assert_eq!(fail_as(&c, "a").await, Verdict::Counted);
    assert_eq!(fail_as(&c, "b").await, Verdict::SinkDown);
    assert_eq!(late.failed_transiently(), Verdict::SinkDown, "failing while open: not the caller's fault");
    assert!(!c.is_closed());
    late_ok.answered();
    assert!(c.is_closed(), "any answer shows the sink is up");
}

#[test]
fn validate_names_the_key() {
    let found = |c: CircuitConfig| Problems::found_by("sinks.a", |p| c.validate(p));
    assert!(found(CircuitConfig::default()).is_empty());
    assert_eq!(found(config(1, 0, 10))[0].key, "sinks.a.circuit.probe_backoff");
    let Problem { key, value, reason } = found(config(1, 100, 10)).remove(0);
    assert_eq!((key.as_str(), value.as_str()), ("sinks.a.circuit.max_probe_backoff", "10ms"));
    assert!(reason.contains("sinks.a.circuit.probe_backoff"), "{reason}");
    let parsed: CircuitConfig = toml::from_str("failure_threshold = 2\nprobe_backoff = \"50ms\"").unwrap();
    assert_eq!(parsed.failure_threshold.get(), 2);
    assert!(toml::from_str::<CircuitConfig>("threshold = 2").is_err(), "unknown keys are refused");
}
