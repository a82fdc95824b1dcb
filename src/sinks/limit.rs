//! Per-sink limits: a rate limit (`rate_per_second`, `burst`) and a cap on calls in
//! flight (`max_concurrency`), so that a provider's sending limit is respected whatever
//! the pipeline's own concurrency is.
//!
//! Every kind's config carries a `limits` sub-table (`[sinks.NAME.limits]`, unlimited when
//! absent); [`super::Sink::build`] puts each built effect behind a [`LimitedEffect`] when any
//! limit is set, sharing its [`SinkLimiter`] with the [`super::Sink`], whose caller (the
//! engine) takes the limits of a command's first call before it claims the command.
//!
//! Order in [`SinkLimiter::acquire`]: a concurrency permit first, then a token, then
//! the call. Taking the token while already holding the permit means tokens are never
//! spent by calls that then queue for a permit and would all start at once when permits
//! free up: calls leave at most at the bucket's pace. A caller that gives up while waiting
//! (a drain, see [`super::SinkRequest::given_up`]) takes neither and its call never begins.
//!
//! Time is tokio's, so that tests can run with `tokio::time::pause()`.

use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::Arc;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::{Duration, Instant};

use super::{CheckAnswer, SinkEffect, SinkError, SinkOutput, SinkRequest};

use crate::problems::Problems;

/// `[sinks.NAME.limits]`: all optional; an absent key means no limit of that kind.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SinkLimits {
    /// Sustained calls per second (token bucket refill rate); may be fractional (0.5 = one
    /// call every 2 s). Counts attempts, retries included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_second: Option<f64>,
    /// Calls that may go out at once after a quiet period (bucket capacity); default 1.
    /// Over any window of T seconds at most `burst + rate_per_second * T` calls start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<NonZeroU32>,
    /// Most calls of this sink in flight at once, across all partitions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<NonZeroUsize>,
}

/// Highest accepted `rate_per_second` (a million calls per second is no limit at all).
const MAX_RATE: f64 = 1_000_000.0;

impl SinkLimits {
    /// Checks the values into `problems` (whose keys start with the sink's, `sinks.NAME`).
    pub fn validate(&self, problems: &mut Problems) {
        if let Some(rate) = self.rate_per_second
            && !(rate.is_finite() && rate > 0.0 && rate <= MAX_RATE)
        {
            problems.add("limits.rate_per_second", rate, format!("must be a number above 0 and at most {MAX_RATE}"));
        }
        if let Some(burst) = self.burst
            && self.rate_per_second.is_none()
        {
            problems.add("limits.burst", burst, "needs limits.rate_per_second");
        }
    }

    /// Whether any limit is set.
    pub fn is_unlimited(&self) -> bool {
        self.rate_per_second.is_none() && self.max_concurrency.is_none()
    }
}

/// Tokio's clock as governor's, so that limits follow `tokio::time::pause()`: time is the
/// span since the bucket was made.
#[derive(Debug, Clone)]
struct TokioClock {
    origin: Instant,
}

impl Clock for TokioClock {
    type Instant = Duration;

    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// A token bucket on tokio time (governor's GCRA): `burst` calls at once after a quiet
/// period, then one every `1 / rate` seconds. Waiters take turns on a fair lock, so they
/// are served in arrival order and only the first in line sleeps on the limiter; a waiter
/// cancelled while sleeping took no token and hands its turn to the next.
#[derive(Debug)]
pub struct TokenBucket {
    limiter: RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<Duration>>,
    clock: TokioClock,
    turn: tokio::sync::Mutex<()>,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens refilled at `rate` per second (`rate` > 0 and at most
    /// a million; a rate outside that range is clamped into it).
    pub fn new(rate: f64, burst: NonZeroU32) -> TokenBucket {
        let period = Duration::from_secs_f64(1.0 / rate.clamp(1.0 / u32::MAX as f64, MAX_RATE));
        let quota = Quota::with_period(period).unwrap_or(Quota::per_second(NonZeroU32::MAX)).allow_burst(burst);
        let clock = TokioClock { origin: Instant::now() };
        TokenBucket {
            limiter: RateLimiter::direct_with_clock(quota, clock.clone()),
            clock,
            turn: tokio::sync::Mutex::new(()),
        }
    }

    /// Waits until a token is available and takes it. Cancel-safe: dropping the future
    /// before it is ready takes no token.
    pub async fn acquire(&self) {
        let _turn = self.turn.lock().await;
        while let Err(not_until) = self.limiter.check() {
            tokio::time::sleep(not_until.wait_time_from(self.clock.now())).await;
        }
    }

    /// Takes a token if one is there now and nobody is waiting in line for one.
    pub fn try_acquire(&self) -> bool {
        match self.turn.try_lock() {
            Ok(_turn) => self.limiter.check().is_ok(),
            Err(_) => false,
        }
    }
}

/// A sink's limits, shared by its [`LimitedEffect`] and the engine: the engine takes them
/// before it claims a command, so that a durable claim is a call that can start at once.
#[derive(Debug)]
pub struct SinkLimiter {
    bucket: Option<TokenBucket>,
    permits: Option<Semaphore>,
}

/// What one call took from its sink's limits: a concurrency permit, given back when this is
/// dropped (its token is spent).
#[derive(Debug)]
pub struct LimitPermit<'a> {
    _permit: Option<SemaphorePermit<'a>>,
}

impl SinkLimiter {
    /// The limiter `limits` describe; `None` when they set nothing.
    pub fn new(limits: &SinkLimits) -> Option<SinkLimiter> {
        if limits.is_unlimited() {
            return None;
        }
        let bucket = limits
            .rate_per_second
            .filter(|rate| rate.is_finite() && *rate > 0.0)
            .map(|rate| TokenBucket::new(rate, limits.burst.unwrap_or(NonZeroU32::MIN)));
        let permits = limits.max_concurrency.map(|n| Semaphore::new(n.get().min(Semaphore::MAX_PERMITS)));
        Some(SinkLimiter { bucket, permits })
    }

    /// Waits for a concurrency permit, then for a token (see the module doc for the order).
    /// Cancel-safe: dropping the future before it is ready holds nothing and takes no token.
    pub async fn acquire(&self) -> Result<LimitPermit<'_>, SinkError> {
        // The semaphore is never closed, so acquire cannot fail; if it ever did, running
        // unthrottled would break the provider's limit, so fail transiently instead.
        let permit = match &self.permits {
            Some(permits) => Some(permits.acquire().await.map_err(|_| SinkError::Transient {
                message: "sink concurrency limiter closed".into(),
                retry_after: None,
            })?),
            None => None,
        };
        if let Some(bucket) = &self.bucket {
            bucket.acquire().await;
        }
        Ok(LimitPermit { _permit: permit })
    }

    /// A permit and a token if both are there now; never waits.
    pub fn try_acquire(&self) -> Option<LimitPermit<'_>> {
        let permit = match &self.permits {
            Some(permits) => Some(permits.try_acquire().ok()?),
            None => None,
        };
        if let Some(bucket) = &self.bucket
            && !bucket.try_acquire()
        {
            return None;
        }
        Some(LimitPermit { _permit: permit })
    }
}

/// A sink's effect behind its limits. A request whose caller took the limits already
/// ([`SinkRequest::limits_taken`]) goes straight through.
pub struct LimitedEffect {
    inner: Arc<dyn SinkEffect>,
    limiter: Arc<SinkLimiter>,
}

impl LimitedEffect {
    /// Wraps `inner` behind `limiter`.
    pub fn wrap(inner: Arc<dyn SinkEffect>, limiter: Arc<SinkLimiter>) -> Arc<dyn SinkEffect> {
        Arc::new(LimitedEffect { inner, limiter })
    }
}

#[async_trait::async_trait]
impl SinkEffect for LimitedEffect {
    async fn execute(&self, request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
        if request.limits_taken() {
            return self.inner.execute(request).await;
        }
        // Waiting for a permit or a token ends when the caller gives up (a drain): the call
        // then never begins, and says so.
        let _permit = tokio::select! {
            biased;
            () = request.given_up() => {
                request.never_sent();
                return Err(SinkError::Transient {
                    message: "given up while waiting for the sink's limits; not sent".into(),
                    retry_after: None,
                });
            }
            permit = self.limiter.acquire() => permit?,
        };
        self.inner.execute(request).await
    }

    /// A check asks the receiver, so it waits for the limits as a call does (it never runs
    /// beside a call of its key, so it never holds limits the caller took for one).
    async fn check(&self, request: SinkRequest<'_>) -> CheckAnswer {
        let permit = tokio::select! {
            biased;
            () = request.given_up() => return CheckAnswer::Error("given up while waiting for the sink's limits".into()),
            permit = self.limiter.acquire() => permit,
        };
        match permit {
            Ok(_permit) => self.inner.check(request).await,
            Err(e) => CheckAnswer::Error(format!("the sink's limits: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// `inner` behind the limiter `limits` describe (they set something).
    fn limited(inner: Arc<dyn SinkEffect>, limits: &SinkLimits) -> Arc<dyn SinkEffect> {
        LimitedEffect::wrap(inner, Arc::new(SinkLimiter::new(limits).expect("limits set")))
    }

    /// Records when each call started and how many ran at once; each call takes `busy`.
    struct Recorder {
        starts: Mutex<Vec<Instant>>,
        in_flight: AtomicUsize,
        max_in_flight: AtomicUsize,
        busy: Duration,
    }

    #[async_trait::async_trait]
    impl SinkEffect for Recorder {
        async fn execute(&self, _request: SinkRequest<'_>) -> Result<SinkOutput, SinkError> {
            self.starts.lock().push(Instant::now());
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_in_flight.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(self.busy).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok(json!({}))
        }
    }

    fn recorder(busy: Duration) -> Arc<Recorder> {
        Arc::new(Recorder {
            starts: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            busy,
        })
    }

    async fn run_many(sink: Arc<dyn SinkEffect>, n: usize) {
        let payload = json!({});
        let calls = (0..n).map(|_| {
            let sink = Arc::clone(&sink);
            let payload = payload.clone();
            async move {
                let request = SinkRequest::unclaimed("k", "t", &payload, 1, None);
                sink.execute(request).await
            }
        });
        for result in futures::future::join_all(calls).await {
            assert!(result.is_ok());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn rate_and_burst_bound_every_window() {
        let inner = recorder(Duration::ZERO);
        let limits = SinkLimits { rate_per_second: Some(10.0), burst: NonZeroU32::new(3), max_concurrency: None };
        let t0 = Instant::now();
        run_many(limited(inner.clone(), &limits), 33).await;
        let starts: Vec<Duration> = inner.starts.lock().iter().map(|t| *t - t0).collect();
        assert_eq!(starts.len(), 33);
        // The burst goes at once, then one call every 100 ms: the 33rd at 3.0 s.
        assert_eq!(starts.iter().filter(|d| d.is_zero()).count(), 3);
        let last = starts.iter().max().copied().unwrap_or_default();
        assert!(last >= Duration::from_millis(2_990) && last <= Duration::from_millis(3_010), "{last:?}");
        for from in &starts {
            let in_window = starts.iter().filter(|d| **d >= *from && **d < *from + Duration::from_secs(1)).count();
            assert!(in_window <= 10 + 3, "{in_window} calls in the second from {from:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_bucket_refills_after_a_quiet_period_but_not_beyond_burst() {
        let inner = recorder(Duration::ZERO);
        let limits = SinkLimits { rate_per_second: Some(2.0), burst: NonZeroU32::new(2), max_concurrency: None };
        let sink = limited(inner.clone(), &limits);
        run_many(Arc::clone(&sink), 2).await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        let t1 = Instant::now();
        run_many(sink, 3).await;
        let late: Vec<Duration> = inner.starts.lock()[2..].iter().map(|t| *t - t1).collect();
        assert_eq!(late[..2], [Duration::ZERO, Duration::ZERO]);
        assert!(late[2] >= Duration::from_millis(490), "{late:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_waiter_takes_no_token_and_hands_on_its_turn() {
        let bucket = TokenBucket::new(1.0, NonZeroU32::MIN);
        let t0 = Instant::now();
        bucket.acquire().await;
        assert!(tokio::time::timeout(Duration::from_millis(500), bucket.acquire()).await.is_err());
        bucket.acquire().await;
        assert_eq!(Instant::now() - t0, Duration::from_secs(1), "the next token, not a later one");
        bucket.acquire().await;
        assert_eq!(Instant::now() - t0, Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn max_concurrency_caps_calls_in_flight() {
        let inner = recorder(Duration::from_millis(100));
        let limits = SinkLimits { rate_per_second: None, burst: None, max_concurrency: NonZeroUsize::new(4) };
        run_many(limited(inner.clone(), &limits), 40).await;
        assert_eq!(inner.starts.lock().len(), 40);
        assert_eq!(inner.max_in_flight.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn unlimited_is_the_default_and_not_wrapped() {
        assert!(SinkLimits::default().is_unlimited());
        let parsed: SinkLimits = toml::from_str("rate_per_second = 0.5\nburst = 2\nmax_concurrency = 3").unwrap();
        assert_eq!(parsed.rate_per_second, Some(0.5));
        assert!(toml::from_str::<SinkLimits>("rate = 1").is_err(), "unknown keys are refused");
    }

    fn found(limits: &SinkLimits) -> Vec<crate::problems::Problem> {
        Problems::found_by("sinks.x", |p| limits.validate(p))
    }

    #[test]
    fn validate_names_the_key() {
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY, 2e6] {
            let limits = SinkLimits { rate_per_second: Some(rate), ..SinkLimits::default() };
            assert_eq!(found(&limits)[0].key, "sinks.x.limits.rate_per_second");
        }
        let burst_alone = SinkLimits { burst: NonZeroU32::new(3), ..SinkLimits::default() };
        assert_eq!(found(&burst_alone)[0].key, "sinks.x.limits.burst");
        assert!(found(&SinkLimits { rate_per_second: Some(0.5), ..SinkLimits::default() }).is_empty());
    }
}
