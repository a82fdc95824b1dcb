//! A circuit breaker per sink: when a sink keeps failing transiently (it is down, not one
//! command being bad), callers stop spending retries on it and wait instead, while one call
//! at a time probes it with a growing backoff.
//!
//! States:
//! - closed: calls go; `failure_threshold` transient failures in a row (any keys) open it.
//! - open: no call goes until `until`; then the first caller to ask becomes the probe.
//! - half-open: exactly one call (the probe) is out; everyone else waits for its answer.
//!   An answer (success or a permanent refusal: the sink is reachable) closes the circuit;
//!   a transient failure opens it again with the backoff doubled, capped at
//!   `max_probe_backoff`.
//!
//! Any answer closes the circuit, also from a call admitted before it opened: the sink
//! answered, so it is up. The probe is a real pending command's call with its own durable
//! claim and key, so it is as safe as any retry.
//!
//! This module knows nothing of retries or partitions: the engine asks [`Circuit::admit`]
//! before each call and reports the call's end on the [`Admission`]; the pipeline watches
//! [`Circuit::subscribe`] to pause partitions and set a gauge. Time is tokio's, so tests
//! run with `tokio::time::pause()`.

use std::num::NonZeroU32;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

/// `[sinks.NAME.circuit]`: the sink's circuit breaker. On for every sink by default.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CircuitConfig {
    /// Whether the breaker is on. Off: every transient failure counts toward
    /// `retry.max_attempts`, as if the sink were never down for long.
    pub enabled: bool,
    /// Transient failures in a row (across all keys) that open the circuit. Keep it at most
    /// `retry.max_attempts`, so that a lone command's last retry opens the circuit rather
    /// than completing as `failed`.
    pub failure_threshold: NonZeroU32,
    /// Wait from opening to the first probe; doubles after each failed probe.
    #[serde(with = "humantime_serde")]
    pub probe_backoff: Duration,
    /// Upper bound on the wait between probes.
    #[serde(with = "humantime_serde")]
    pub max_probe_backoff: Duration,
}

impl Default for CircuitConfig {
    fn default() -> Self {
        CircuitConfig {
            enabled: true,
            failure_threshold: NonZeroU32::new(5).unwrap_or(NonZeroU32::MIN),
            probe_backoff: Duration::from_secs(1),
            max_probe_backoff: Duration::from_secs(30),
        }
    }
}

impl CircuitConfig {
    /// Checks the values; `at` is the sink's key (`sinks.NAME`). On error returns (key,
    /// value, reason).
    pub fn validate(&self, at: &str) -> Result<(), (String, String, String)> {
        if self.probe_backoff.is_zero() {
            return Err((format!("{at}.circuit.probe_backoff"), "0s".into(), "must be positive".into()));
        }
        if self.max_probe_backoff < self.probe_backoff {
            return Err((
                format!("{at}.circuit.max_probe_backoff"),
                humantime::format_duration(self.max_probe_backoff).to_string(),
                format!("must be at least {at}.circuit.probe_backoff"),
            ));
        }
        Ok(())
    }

    /// Whether this is the default (then it is not written out when serialized).
    pub fn is_default(&self) -> bool {
        *self == CircuitConfig::default()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant, backoff: Duration },
    HalfOpen { backoff: Duration },
}

/// What a transient failure means for the caller's retry budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The circuit is closed: the failure counts toward the caller's attempts.
    Counted,
    /// The circuit is open (this failure may have opened it): the sink is down, so the
    /// caller waits for the circuit instead of spending an attempt.
    SinkDown,
}

/// One sink's circuit breaker.
#[derive(Debug)]
pub struct Circuit {
    sink: String,
    config: CircuitConfig,
    state: Mutex<State>,
    /// `true` while not closed; every transition is sent (waiters re-check on any send).
    open: watch::Sender<bool>,
}

/// Permission for one call; report how it ended with [`Admission::answered`] or
/// [`Admission::failed_transiently`]. Dropped unreported (the caller was cancelled), a
/// probe lets the next waiter probe at once.
#[derive(Debug)]
#[must_use = "report the call's end on the admission"]
pub struct Admission<'a> {
    circuit: &'a Circuit,
    probe: bool,
    reported: bool,
}

impl Circuit {
    /// A closed circuit for sink `sink`.
    pub fn new(sink: &str, config: &CircuitConfig) -> Circuit {
        Circuit {
            sink: sink.to_string(),
            config: config.clone(),
            state: Mutex::new(State::Closed { failures: 0 }),
            open: watch::channel(false).0,
        }
    }

    /// The sink's name.
    pub fn sink(&self) -> &str {
        &self.sink
    }

    /// Whether calls go freely now.
    pub fn is_closed(&self) -> bool {
        matches!(*self.state.lock(), State::Closed { .. })
    }

    /// A receiver of "not closed", told of every transition.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.open.subscribe()
    }

    /// Waits until a call may go: at once when closed; when open, until the probe time,
    /// then as the probe if first; while a probe is out, until it reports. Cancel-safe:
    /// dropping the future holds nothing.
    pub async fn admit(&self) -> Admission<'_> {
        loop {
            // Subscribed before reading the state, so no transition after the read is missed.
            let mut changed = self.open.subscribe();
            let wait_until = {
                let mut state = self.state.lock();
                match *state {
                    State::Closed { .. } => return Admission { circuit: self, probe: false, reported: false },
                    State::Open { until, backoff } if Instant::now() >= until => {
                        *state = State::HalfOpen { backoff };
                        tracing::info!(sink = %self.sink, "sink circuit half-open: probing with one call");
                        return Admission { circuit: self, probe: true, reported: false };
                    }
                    State::Open { until, .. } => Some(until),
                    State::HalfOpen { .. } => None,
                }
            };
            match wait_until {
                Some(until) => tokio::select! {
                    () = tokio::time::sleep_until(until) => {}
                    _ = changed.changed() => {}
                },
                // The sender lives as long as `self`: `changed` cannot fail while we borrow it.
                None => {
                    let _ = changed.changed().await;
                }
            }
        }
    }

    fn close(&self, state: &mut State) {
        let was = *state;
        *state = State::Closed { failures: 0 };
        if !matches!(was, State::Closed { .. }) {
            tracing::info!(sink = %self.sink, "sink circuit closed: the sink answered; calls go again");
            self.open.send_replace(false);
        }
    }

    fn failed(&self, probe: bool) -> Verdict {
        let mut state = self.state.lock();
        match *state {
            State::Closed { failures } => {
                let failures = failures.saturating_add(1);
                if failures < self.config.failure_threshold.get() {
                    *state = State::Closed { failures };
                    return Verdict::Counted;
                }
                let backoff = self.config.probe_backoff;
                *state = State::Open { until: Instant::now() + backoff, backoff };
                tracing::warn!(sink = %self.sink, failures, next_probe_in = ?backoff,
                    "sink circuit OPEN: transient failures in a row; commands wait for the sink instead of spending retries");
                self.open.send_replace(true);
                Verdict::SinkDown
            }
            State::HalfOpen { backoff } if probe => {
                let backoff = backoff.saturating_mul(2).min(self.config.max_probe_backoff);
                *state = State::Open { until: Instant::now() + backoff, backoff };
                tracing::info!(sink = %self.sink, next_probe_in = ?backoff, "sink circuit stays open: the probe failed");
                self.open.send_replace(true);
                Verdict::SinkDown
            }
            // A call admitted before the circuit opened, failing after: the sink is down.
            State::Open { .. } | State::HalfOpen { .. } => Verdict::SinkDown,
        }
    }
}

impl Admission<'_> {
    /// Whether this call is the half-open circuit's single probe.
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// The sink answered (success, or a permanent refusal): it is up; the circuit closes.
    pub fn answered(mut self) {
        self.reported = true;
        let mut state = self.circuit.state.lock();
        self.circuit.close(&mut state);
    }

    /// The call failed transiently: counts toward opening the circuit (or re-opens it, for
    /// a probe). Tells the caller whether to count the failure against its attempts.
    pub fn failed_transiently(mut self) -> Verdict {
        self.reported = true;
        self.circuit.failed(self.probe)
    }
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        if self.reported || !self.probe {
            return;
        }
        let mut state = self.circuit.state.lock();
        if let State::HalfOpen { backoff } = *state {
            // The probe was abandoned without an answer: let the next waiter probe now.
            *state = State::Open { until: Instant::now(), backoff };
            self.circuit.open.send_replace(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
    fn admits_now(c: &Circuit) -> Option<Admission<'_>> {
        let mut fut = pin!(c.admit());
        match fut.as_mut().poll(&mut Context::from_waker(std::task::Waker::noop())) {
            Poll::Ready(a) => Some(a),
            Poll::Pending => None,
        }
    }

    async fn fail_once(c: &Circuit) -> Verdict {
        c.admit().await.failed_transiently()
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_threshold_failures_in_a_row_and_success_resets_the_count() {
        let c = Circuit::new("s", &config(3, 1000, 8000));
        let mut rx = c.subscribe();
        assert_eq!(fail_once(&c).await, Verdict::Counted);
        assert_eq!(fail_once(&c).await, Verdict::Counted);
        c.admit().await.answered();
        assert!(c.is_closed() && !*rx.borrow_and_update(), "an answer resets the count");
        assert_eq!(fail_once(&c).await, Verdict::Counted);
        assert_eq!(fail_once(&c).await, Verdict::Counted);
        assert_eq!(fail_once(&c).await, Verdict::SinkDown, "the third in a row opens it");
        assert!(!c.is_closed());
        assert!(rx.has_changed().unwrap() && *rx.borrow_and_update(), "opening is announced");
        assert!(admits_now(&c).is_none(), "no call goes while open");
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_lets_exactly_one_probe_and_its_answer_closes() {
        let c = Arc::new(Circuit::new("s", &config(1, 1000, 8000)));
        assert_eq!(fail_once(&c).await, Verdict::SinkDown);
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(admits_now(&c).is_none(), "before the backoff no probe");
        tokio::time::advance(Duration::from_millis(1)).await;
        let probe = admits_now(&c).expect("the probe goes at the backoff");
        assert!(probe.is_probe());
        // Everyone else waits while the probe is out, however long it takes.
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let c = Arc::clone(&c);
                tokio::spawn(async move {
                    let a = c.admit().await;
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
        assert_eq!(fail_once(&c).await, Verdict::SinkDown);
        tokio::time::advance(Duration::from_millis(1000)).await;
        let probe = admits_now(&c).expect("probe");
        let waiter = {
            let c = Arc::clone(&c);
            tokio::spawn(async move { c.admit().await.is_probe() })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(probe);
        assert!(waiter.await.unwrap(), "the waiter became the probe without a new backoff");
    }

    #[tokio::test(start_paused = true)]
    async fn failed_probes_double_the_backoff_up_to_the_cap() {
        let c = Circuit::new("s", &config(1, 100, 350));
        assert_eq!(fail_once(&c).await, Verdict::SinkDown);
        let mut waited = Vec::new();
        for _ in 0..4 {
            let start = Instant::now();
            let probe = c.admit().await;
            waited.push(start.elapsed());
            assert!(probe.is_probe());
            assert_eq!(probe.failed_transiently(), Verdict::SinkDown);
        }
        let ms: Vec<u128> = waited.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, vec![100, 200, 350, 350]);
        let probe = c.admit().await;
        probe.answered();
        assert!(c.is_closed());
        // Closed again: the next opening starts from the initial backoff.
        assert_eq!(fail_once(&c).await, Verdict::SinkDown);
        let start = Instant::now();
        c.admit().await.answered();
        assert_eq!(start.elapsed().as_millis(), 100);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_of_calls_admitted_before_opening_do_not_count_and_an_answer_closes() {
        let c = Circuit::new("s", &config(2, 1000, 8000));
        let late = c.admit().await;
        let late_ok = c.admit().await;
        assert_eq!(fail_once(&c).await, Verdict::Counted);
        assert_eq!(fail_once(&c).await, Verdict::SinkDown);
        assert_eq!(late.failed_transiently(), Verdict::SinkDown, "failing while open: not the caller's fault");
        assert!(!c.is_closed());
        late_ok.answered();
        assert!(c.is_closed(), "any answer shows the sink is up");
    }

    #[test]
    fn validate_names_the_key() {
        assert!(CircuitConfig::default().validate("sinks.a").is_ok());
        let (key, _, _) = config(1, 0, 10).validate("sinks.a").unwrap_err();
        assert_eq!(key, "sinks.a.circuit.probe_backoff");
        let (key, value, reason) = config(1, 100, 10).validate("sinks.a").unwrap_err();
        assert_eq!((key.as_str(), value.as_str()), ("sinks.a.circuit.max_probe_backoff", "10ms"));
        assert!(reason.contains("probe_backoff"), "{reason}");
        let parsed: CircuitConfig = toml::from_str("failure_threshold = 2\nprobe_backoff = \"50ms\"").unwrap();
        assert_eq!(parsed.failure_threshold.get(), 2);
        assert!(toml::from_str::<CircuitConfig>("threshold = 2").is_err(), "unknown keys are refused");
    }
}
