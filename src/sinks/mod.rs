//! Sinks (docs/contract.md §6): where a command's side effect happens. A sink is a named instance of a
//! kind; each kind lives in one file, has a config type (pure data) separate from its
//! runtime, and declares whether it forwards the key downstream (which decides what
//! happens to a claim orphaned by a crash, docs/contract.md §4).
//!
//! Adding a kind (docs/sinks.md walks through a complete example): write `src/sinks/NAME.rs`
//! with a config type implementing [`SinkKind`] and a runtime implementing [`SinkEffect`],
//! declare the module below, and add ONE line to the `sink_kinds!` registration. Each fact
//! about an instance is stated once, by its config ([`SinkKind`]); the runtime only
//! performs the effect. The registration generates the `kind = "..."`-tagged [`SinkConfig`]
//! enum and all of its dispatch (`problems`, `forwards_key`, `kind`, and building in
//! [`build_all`]); no dispatch code elsewhere names a kind. What the engine holds is a
//! [`Sink`]: those facts (name, key forwarding, circuit breaker) around the kind's effect.

pub mod check;
pub mod circuit;
pub mod exec;
pub mod http;
pub mod kafka;
pub mod limit;
pub mod log;
mod request;
pub mod smtp;
pub mod template;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use self::check::{CheckAnswer, CheckTimes, CheckTiming};
use self::circuit::{Admission, Circuit, CircuitConfig};
use self::limit::{LimitPermit, LimitedEffect, SinkLimiter, SinkLimits};
pub use self::request::{CallAnswer, CallWatch, SinkRequest};
pub use crate::problems::{Problem, Problems};
pub use crate::store::MAX_RESULT_BYTES;

/// What a kind's config provides; the `sink_kinds!` registration dispatches to it.
pub trait SinkKind {
    /// Checks the kind's values, adding each problem to `problems` (whose keys start with
    /// `sinks.NAME`); keeps going after one, so that every problem is reported at once.
    fn validate(&self, problems: &mut Problems);
    /// The kind's values, then its limits' and its circuit's, which every kind has.
    fn validate_instance(&self, problems: &mut Problems) {
        self.validate(problems);
        self.limits().validate(problems);
        self.circuit().validate(problems);
    }
    /// Every problem of this instance's config (its keys starting with `at`, `sinks.NAME`),
    /// in the order [`validate_instance`](Self::validate_instance) checks them; empty when
    /// it is valid.
    fn problems(&self, at: &str) -> Vec<Problem> {
        let mut problems = Problems::new(at);
        self.validate_instance(&mut problems);
        problems.into_vec()
    }
    /// Whether an instance with this config passes the key downstream so that re-running an
    /// orphaned claim is safe (docs/contract.md §4); `false` makes such a claim `indeterminate`.
    fn forwards_key(&self) -> bool;
    /// Whether each call in flight holds a resource of its own (a connection, a process), so
    /// that thousands at once need `limits.max_concurrency` or the machine's room
    /// ([`crate::config::Config::sinks_unbounded_by_default`]).
    fn call_holds_a_resource(&self) -> bool;
    /// The instance's `[sinks.NAME.limits]` (a `limits: SinkLimits` field with
    /// `#[serde(default)]` on the kind's config); [`Sink::build`] applies them to every kind.
    fn limits(&self) -> &SinkLimits;
    /// The instance's `[sinks.NAME.circuit]` (a `circuit: CircuitConfig` field with
    /// `#[serde(default)]`); [`Sink::build`] gives every kind its breaker.
    fn circuit(&self) -> &CircuitConfig;
    /// Builds the effect of the instance called `name` (the name is for its logs and errors).
    fn build(&self, name: &str) -> Result<Arc<dyn SinkEffect>, SinkBuildError>;
    /// When the instance has a check (`[sinks.NAME.check]`), its timing; its effect then
    /// answers [`SinkEffect::check`]. `None` (the default): no check, so a call of a sink
    /// that does not forward the key that may have landed unanswered makes its command
    /// `indeterminate` at once (docs/contract.md §4).
    fn check_timing(&self) -> Option<CheckTiming> {
        None
    }
}

/// Generates [`SinkConfig`] (one variant per kind, tagged by `kind = "<name>"`) and its
/// dispatch to [`SinkKind`]. One line per kind: `/// doc` then `"name" => Variant(module::Config),`.
macro_rules! sink_kinds {
    ($($(#[doc = $doc:literal])* $name:literal => $variant:ident($config:ty),)+) => {
        /// Config of one sink instance: `kind = "..."` plus the kind's own keys.
        #[derive(Debug, Clone, Deserialize, Serialize)]
        #[serde(tag = "kind")]
        pub enum SinkConfig {
            $($(#[doc = $doc])* #[serde(rename = $name)] $variant($config),)+
        }

        impl SinkConfig {
            /// Every registered kind's name, in registration order.
            pub const KINDS: &'static [&'static str] = &[$($name),+];

            /// The kind's name, as written in `kind = "..."`.
            pub fn kind(&self) -> &'static str {
                match self {
                    $(SinkConfig::$variant(_) => $name,)+
                }
            }

            /// The kind-specific config behind this instance.
            pub fn as_kind(&self) -> &dyn SinkKind {
                match self {
                    $(SinkConfig::$variant(c) => c,)+
                }
            }
        }
    };
}

sink_kinds! {
    /// JSON POST to a URL with an `Idempotency-Key` header.
    "http" => Http(http::HttpSinkConfig),
    /// Produces to a Kafka topic with an idempotent producer, the key as record key and header.
    "kafka" => Kafka(kafka::KafkaSinkConfig),
    /// Writes the command to the log; for trials and tests.
    "log" => Log(log::LogSinkConfig),
    /// Runs a program with the payload on stdin and the key in `DEDUPD_KEY`.
    "exec" => Exec(exec::ExecSinkConfig),
    /// Sends an email through an SMTP relay, the key as its Message-ID.
    "smtp" => Smtp(smtp::SmtpSinkConfig),
}

impl SinkConfig {
    /// Every problem of the instance's config (the kind's values, then its limits' and its
    /// circuit's, which every kind has), each key starting with `at` (`sinks.NAME`).
    pub fn problems(&self, at: &str) -> Vec<Problem> {
        self.as_kind().problems(at)
    }

    /// Checks the instance's config into `problems`, whose keys start with `sinks.NAME`.
    pub fn validate(&self, problems: &mut Problems) {
        self.as_kind().validate_instance(problems);
    }

    /// Whether this instance passes the key downstream so that a re-run is safe.
    pub fn forwards_key(&self) -> bool {
        self.as_kind().forwards_key()
    }

    /// Builds the instance called `name` (see [`Sink::build`]).
    pub fn build(&self, name: &str) -> Result<Sink, SinkBuildError> {
        Sink::build(name, self.as_kind())
    }
}

/// A sink failure, classified.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SinkError {
    /// Worth retrying with the same key: timeouts, connection errors, HTTP 5xx/429/408.
    #[error("transient: {message}")]
    Transient {
        /// What happened.
        message: String,
        /// A server-suggested wait (Retry-After), if any.
        retry_after: Option<Duration>,
    },
    /// Retrying cannot help: HTTP 4xx, a rejected address. Completes as `failed`.
    #[error("permanent: {message}")]
    Permanent {
        /// What happened.
        message: String,
        /// What the downstream answered, stored as the result.
        result: Value,
    },
}

/// A sink's successful answer: stored as the result and replayed to repeats.
pub type SinkOutput = Value;

/// What a kind's runtime provides: the effect, performed once per call.
#[async_trait::async_trait]
pub trait SinkEffect: Send + Sync {
    /// Performs the effect once. Says through `request` whether the receiver answered or
    /// the request never left ([`SinkRequest::answered`], [`SinkRequest::never_sent`]);
    /// saying neither means the call may have landed unanswered ([`CallAnswer::Maybe`]).
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError>;

    /// Asks the receiver whether the effect of `request`'s command exists (module
    /// [`check`]). Called only for an instance whose config has a check
    /// ([`SinkKind::check_timing`]), never beside a call of the same key.
    async fn check(&self, request: SinkRequest<'_>) -> CheckAnswer {
        let _ = request;
        CheckAnswer::Error("this sink has no check".into())
    }
}

/// One sink instance at run time, as the engine holds it: the facts its config states
/// around the kind's effect. Built by [`SinkConfig::build`]; tests build one around any
/// [`SinkEffect`] with [`Sink::new`].
pub struct Sink {
    name: String,
    forwards_key: bool,
    /// The check's timing, when the instance has a check.
    check: Option<CheckTiming>,
    circuit: Option<Circuit>,
    /// The limits the effect waits for, also taken ahead by [`Sink::try_reserve`].
    limiter: Option<Arc<SinkLimiter>>,
    effect: Arc<dyn SinkEffect>,
}

/// What one call of a sink needs to start at once: its circuit's admission (when it has a
/// circuit) and its limits' permit and token (when it has limits). Dropping it unused gives
/// everything back (the token excepted).
#[derive(Debug)]
pub struct Reservation<'a> {
    /// The circuit's admission, to report the call's end on.
    pub admission: Option<Admission<'a>>,
    /// The limits taken: the call is made with [`SinkRequest::with_limits_taken`] and this
    /// is held until it ends.
    pub limits: Option<LimitPermit<'a>>,
}

impl Sink {
    /// Builds the instance called `name` from its kind's config: the kind's effect behind
    /// its limits when it has any, with its circuit breaker (asked by the engine before each
    /// call, so outside the limits: a call waiting for the circuit holds no concurrency
    /// permit and spends no token).
    pub fn build(name: &str, kind: &dyn SinkKind) -> Result<Sink, SinkBuildError> {
        Ok(Sink::new(name, kind.forwards_key(), kind.build(name)?)
            .with_check(kind.check_timing())
            .with_limits(kind.limits())
            .with_circuit(kind.circuit()))
    }

    /// The instance `name` performing `effect`, without limits or circuit breaker.
    pub fn new(name: &str, forwards_key: bool, effect: Arc<dyn SinkEffect>) -> Sink {
        Sink { name: name.to_string(), forwards_key, check: None, circuit: None, limiter: None, effect }
    }

    /// The same instance with a check of this timing (none for `None`): its effect answers
    /// [`SinkEffect::check`].
    pub fn with_check(self, check: Option<CheckTiming>) -> Sink {
        Sink { check, ..self }
    }

    /// The same instance with its effect behind `limits` (unchanged when they set nothing).
    pub fn with_limits(self, limits: &SinkLimits) -> Sink {
        match SinkLimiter::new(limits) {
            None => self,
            Some(limiter) => {
                let limiter = Arc::new(limiter);
                Sink { effect: LimitedEffect::wrap(self.effect, Arc::clone(&limiter)), limiter: Some(limiter), ..self }
            }
        }
    }

    /// The same instance with the circuit breaker `config` describes (none when disabled).
    pub fn with_circuit(self, config: &CircuitConfig) -> Sink {
        let circuit = config.enabled.then(|| Circuit::new(&self.name, config));
        Sink { circuit, ..self }
    }

    /// The same instance with its effect wrapped by `wrap` (e.g. to measure every call).
    pub fn wrap_effect(self, wrap: impl FnOnce(Arc<dyn SinkEffect>) -> Arc<dyn SinkEffect>) -> Sink {
        Sink { effect: wrap(self.effect), ..self }
    }

    /// The instance name (from config).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether a re-run after a crash is safe because the key goes downstream.
    pub fn forwards_key(&self) -> bool {
        self.forwards_key
    }

    /// The instance's check's timing, when it has a check.
    pub fn check_timing(&self) -> Option<&CheckTiming> {
        self.check.as_ref()
    }

    /// Asks the receiver whether the effect of `request`'s command exists (see
    /// [`SinkEffect::check`]); only for an instance with a check.
    pub async fn check(&self, request: SinkRequest<'_>) -> CheckAnswer {
        self.effect.check(request).await
    }

    /// The instance's circuit breaker, if it has one: the engine asks it before every call
    /// and reports every call's end to it.
    pub fn circuit(&self) -> Option<&Circuit> {
        self.circuit.as_ref()
    }

    /// What a call for `key` needs to start now, if all of it is there without waiting: the
    /// circuit closed, a concurrency permit and a token.
    pub fn try_reserve(&self, key: &str) -> Option<Reservation<'_>> {
        let admission = match &self.circuit {
            Some(circuit) => Some(circuit.try_admit(key)?),
            None => None,
        };
        let limits = match &self.limiter {
            Some(limiter) => Some(limiter.try_acquire()?),
            None => None,
        };
        Some(Reservation { admission, limits })
    }

    /// Waits for what a call for `key` needs to start, in two steps between which the
    /// caller takes its own turn (the engine's `max_in_flight` permit): first the circuit
    /// (as its probe when it is open and it is this key's turn; `None` without a circuit),
    /// which holds nothing while it waits ...
    pub async fn admit(&self, key: &str) -> Option<Admission<'_>> {
        match &self.circuit {
            Some(circuit) => Some(circuit.admit(key).await),
            None => None,
        }
    }

    /// ... then the limits. Both are cancel-safe.
    pub async fn reserve_limits<'s>(&'s self, admission: Option<Admission<'s>>) -> Result<Reservation<'s>, SinkError> {
        let limits = match &self.limiter {
            Some(limiter) => Some(limiter.acquire().await?),
            None => None,
        };
        Ok(Reservation { admission, limits })
    }

    /// Performs the effect once (after waiting for the limits, if any).
    pub async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        self.effect.execute(request).await
    }
}

/// A sink that could not be built from its config.
#[derive(Debug, thiserror::Error)]
#[error("sink {name}: {reason}")]
pub struct SinkBuildError {
    /// The instance name.
    pub name: String,
    /// Why.
    pub reason: String,
}

/// Builds every configured sink instance, by name.
pub fn build_all(configs: &BTreeMap<String, SinkConfig>) -> Result<HashMap<String, Sink>, SinkBuildError> {
    configs.iter().map(|(name, config)| Ok((name.clone(), config.build(name)?))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registration_tags_configs_by_kind_name() {
        let log: SinkConfig = toml::from_str("kind = \"log\"").unwrap();
        assert_eq!(log.kind(), "log");
        assert!(log.forwards_key());
        assert!(SinkConfig::KINDS.contains(&"http") && SinkConfig::KINDS.contains(&"log"));
        let unknown = toml::from_str::<SinkConfig>("kind = \"carrier-pigeon\"").unwrap_err();
        assert!(unknown.to_string().contains("carrier-pigeon"), "{unknown}");
    }

    #[test]
    fn a_built_instance_takes_its_facts_from_the_config() {
        let log: SinkConfig = toml::from_str("kind = \"log\"").unwrap();
        let sink = log.build("trial").unwrap();
        assert_eq!((sink.name(), sink.forwards_key()), ("trial", true));
        assert_eq!(sink.circuit().map(Circuit::sink), Some("trial"), "a breaker by default");
        let off: SinkConfig = toml::from_str("kind = \"log\"\n[circuit]\nenabled = false").unwrap();
        assert!(off.build("trial").unwrap().circuit().is_none());
    }
}
