//! A circuit breaker per sink: when a sink keeps failing transiently (it is down, not one
//! command being bad), callers stop spending retries on it and wait instead, while one call
//! at a time probes it with a growing backoff.
//!
//! States:
//! - closed: transient failures of `failure_threshold` DIFFERENT keys, with no answer in
//!   between, open it. One key failing again and again counts once: a lone bad command
//!   spends its own `retry.max_attempts` and ends `failed`, it never opens the circuit.
//! - open: no call goes until `until`; then the first caller to ask becomes the probe,
//!   except that the key whose probe failed last lets any other waiter go first (it gets
//!   its turn one backoff later), so probes rotate over the waiting commands.
//! - half-open: exactly one call (the probe) is out; everyone else waits for its answer.
//!   An answer (success or a permanent refusal: the sink is reachable) closes the circuit;
//!   a transient failure opens it again with the backoff doubled, capped at
//!   `max_probe_backoff`.
//!
//! A failed probe does not count toward its command's attempts (the sink is down, not the
//! command) unless the same key also failed the probe before it: then nothing but that one
//! command shows the sink failing (no other waiter took a turn), so the failure counts and
//! the command ends `failed` when its budget is spent instead of probing for ever.
//!
//! Any answer closes the circuit, also from a call admitted before it opened: the sink
//! answered, so it is up. The probe is a real pending command's call with its own durable
//! claim and key, so it is as safe as any retry.
//!
//! This module knows nothing of retries or partitions: the engine asks [`Circuit::admit`]
//! before each call and reports the call's end on the [`Admission`]; the pipeline watches
//! [`Circuit::subscribe`] to pause partitions and set a gauge. Time is tokio's, so tests
//! run with `tokio::time::pause()`.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::num::NonZeroU32;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::problems::Problems;

/// `[sinks.NAME.circuit]`: the sink's circuit breaker. On for every sink by default.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CircuitConfig {
    /// Whether the breaker is on. Off: every transient failure counts toward
    /// `retry.max_attempts`, as if the sink were never down for long.
    pub enabled: bool,
    /// Different keys whose calls failed transiently, with no answer from the sink in
    /// between, that open the circuit. A key failing several times counts once, so one
    /// failing command never opens the circuit by itself.
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
    /// Checks the values into `problems` (whose keys start with the sink's, `sinks.NAME`).
    pub fn validate(&self, problems: &mut Problems) {
        if self.probe_backoff.is_zero() {
            problems.add("circuit.probe_backoff", "0s", "must be positive");
        } else if self.max_probe_backoff < self.probe_backoff {
            let reason = format!("must be at least {}.circuit.probe_backoff", problems.at());
            problems.add("circuit.max_probe_backoff", humantime::format_duration(self.max_probe_backoff), reason);
        }
    }

    /// Whether this is the default (then it is not written out when serialized).
    pub fn is_default(&self) -> bool {
        *self == CircuitConfig::default()
    }
}

/// A key as the circuit remembers it: a hash, so that remembering costs no allocation.
type KeyId = u64;

fn key_id(key: &str) -> KeyId {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// `failing`: the different keys that failed since the last answer (fewer than the
    /// threshold).
    Closed {
        failing: Vec<KeyId>,
    },
    /// `last_probe`: the key whose probe failed last, if one did since opening.
    Open {
        until: Instant,
        backoff: Duration,
        last_probe: Option<KeyId>,
    },
    HalfOpen {
        backoff: Duration,
        last_probe: Option<KeyId>,
    },
}

impl State {
    fn closed() -> State {
        State::Closed { failing: Vec::new() }
    }
}

/// What a transient failure means for the caller's retry budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The failure counts toward the caller's attempts: the circuit is closed, or the
    /// caller's key failed the last probe too.
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

/// Permission for one call of one key; report how it ended with [`Admission::answered`] or
/// [`Admission::failed_transiently`]. Dropped unreported (the caller was cancelled), a
/// probe lets the next waiter probe at once.
#[derive(Debug)]
#[must_use = "report the call's end on the admission"]
pub struct Admission<'a> {
    circuit: &'a Circuit,
    key: KeyId,
    probe: bool,
    reported: bool,
}

/// What a caller of [`Circuit::admit`] does next.
enum Wait {
    Until(Instant),
    ForTheProbe,
}

impl Circuit {
    /// A closed circuit for sink `sink`.
    pub fn new(sink: &str, config: &CircuitConfig) -> Circuit {
        Circuit {
            sink: sink.to_string(),
            config: config.clone(),
            state: Mutex::new(State::closed()),
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

    /// Admits a call for `key` only if it may go at once: the circuit is closed. Never
    /// waits and never makes a probe.
    pub fn try_admit(&self, key: &str) -> Option<Admission<'_>> {
        let closed = matches!(*self.state.lock(), State::Closed { .. });
        closed.then(|| Admission { circuit: self, key: key_id(key), probe: false, reported: false })
    }

    /// Waits until a call for `key` may go: at once when closed; when open, until the probe
    /// time, then as the probe if first (the key that failed the last probe one backoff
    /// later, so that another waiter probes first); while a probe is out, until it reports.
    /// Cancel-safe: dropping the future holds nothing.
    pub async fn admit(&self, key: &str) -> Admission<'_> {
        let key = key_id(key);
        let admitted = |probe| Admission { circuit: self, key, probe, reported: false };
        loop {
            // Subscribed before reading the state, so no transition after the read is missed.
            let mut changed = self.open.subscribe();
            let wait = {
                let mut state = self.state.lock();
                match *state {
                    State::Closed { .. } => return admitted(false),
                    State::Open { until, backoff, last_probe } => {
                        let turn = if last_probe == Some(key) { until + backoff } else { until };
                        if Instant::now() < turn {
                            Wait::Until(turn)
                        } else {
                            *state = State::HalfOpen { backoff, last_probe };
                            tracing::info!(sink = %self.sink, "sink circuit half-open: probing with one call");
                            return admitted(true);
                        }
                    }
                    State::HalfOpen { .. } => Wait::ForTheProbe,
                }
            };
            match wait {
                Wait::Until(until) => tokio::select! {
                    () = tokio::time::sleep_until(until) => {}
                    _ = changed.changed() => {}
                },
                // The sender lives as long as `self`: `changed` cannot fail while we borrow it.
                Wait::ForTheProbe => {
                    let _ = changed.changed().await;
                }
            }
        }
    }

    fn close(&self, state: &mut State) {
        let was_closed = matches!(state, State::Closed { .. });
        *state = State::closed();
        if !was_closed {
            tracing::info!(sink = %self.sink, "sink circuit closed: the sink answered; calls go again");
            self.open.send_replace(false);
        }
    }

    fn failed(&self, key: KeyId, probe: bool) -> Verdict {
        let mut state = self.state.lock();
        match &mut *state {
            State::Closed { failing } => {
                if !failing.contains(&key) {
                    failing.push(key);
                }
                let keys = failing.len();
                if keys < self.config.failure_threshold.get() as usize {
                    return Verdict::Counted;
                }
                let backoff = self.config.probe_backoff;
                *state = State::Open { until: Instant::now() + backoff, backoff, last_probe: None };
                tracing::warn!(sink = %self.sink, keys, next_probe_in = ?backoff,
                    "sink circuit OPEN: calls of different commands failed transiently with no answer in between; commands wait for the sink instead of spending retries");
                self.open.send_replace(true);
                Verdict::SinkDown
            }
            State::HalfOpen { backoff, last_probe } if probe => {
                let repeated = *last_probe == Some(key);
                let backoff = backoff.saturating_mul(2).min(self.config.max_probe_backoff);
                *state = State::Open { until: Instant::now() + backoff, backoff, last_probe: Some(key) };
                tracing::info!(sink = %self.sink, next_probe_in = ?backoff, repeated, "sink circuit stays open: the probe failed");
                self.open.send_replace(true);
                // The same command failed the probe before this one, and no other took a
                // turn: only it shows the sink failing, so it spends its own attempts.
                if repeated { Verdict::Counted } else { Verdict::SinkDown }
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
        self.circuit.failed(self.key, self.probe)
    }
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        if self.reported || !self.probe {
            return;
        }
        let mut state = self.circuit.state.lock();
        if let State::HalfOpen { backoff, last_probe } = *state {
            // The probe was abandoned without an answer: let the next waiter probe now.
            *state = State::Open { until: Instant::now(), backoff, last_probe };
            self.circuit.open.send_replace(true);
        }
    }
}

#[cfg(test)]
mod tests;
