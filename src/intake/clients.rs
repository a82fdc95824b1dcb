//! Who is calling: a request's API key (`Authorization: Bearer KEY`) names its client,
//! compared in constant time with every client's key; each client has its own rate.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::Duration;

use axum::http::{HeaderMap, header};
use governor::{Quota, RateLimiter, clock::Clock, clock::DefaultClock};
use subtle::ConstantTimeEq;

use super::config::IntakeClient;
use crate::connection::ValueError;

type Bucket = RateLimiter<governor::state::NotKeyed, governor::state::InMemoryState, DefaultClock>;

/// The clients of the intake, with their keys read and their buckets full.
pub struct Clients {
    known: Vec<Known>,
    clock: DefaultClock,
}

struct Known {
    name: String,
    api_key: Vec<u8>,
    bucket: Bucket,
}

/// Why a request was not let through.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// No bearer key, or one no client has.
    Unknown,
    /// The client's rate is used up: try again after this long.
    RateLimited(Duration),
}

impl Clients {
    /// Reads every client's API key now (from the file, the environment or a file).
    pub fn new(clients: &BTreeMap<String, IntakeClient>) -> Result<Clients, (String, ValueError)> {
        let mut known = Vec::with_capacity(clients.len());
        for (name, client) in clients {
            let api_key = client.api_key.resolve().map_err(|e| (name.clone(), e))?;
            let rate = NonZeroU32::new(client.rate_per_second).unwrap_or(NonZeroU32::MIN);
            let quota = Quota::per_second(rate).allow_burst(client.burst());
            known.push(Known { name: name.clone(), api_key: api_key.into_bytes(), bucket: RateLimiter::direct(quota) });
        }
        Ok(Clients { known, clock: DefaultClock::default() })
    }

    /// The client a request comes from, after taking one of its rate's tokens.
    pub fn admit(&self, headers: &HeaderMap) -> Result<&str, Refused> {
        let known = self.known(headers).ok_or(Refused::Unknown)?;
        match known.bucket.check() {
            Ok(()) => Ok(&known.name),
            Err(not_until) => Err(Refused::RateLimited(not_until.wait_time_from(self.clock.now()))),
        }
    }

    /// The name of the client whose API key a request carries, its rate untouched (for
    /// the intake's metrics).
    pub fn name_of(&self, headers: &HeaderMap) -> Option<&str> {
        self.known(headers).map(|known| known.name.as_str())
    }

    fn known(&self, headers: &HeaderMap) -> Option<&Known> {
        let given = bearer(headers)?;
        // Every key is compared, whichever matches, so that the time taken says nothing.
        let mut found = None;
        for known in &self.known {
            if bool::from(known.api_key.ct_eq(given.as_bytes())) {
                found = Some(known);
            }
        }
        found
    }
}

/// The key of `Authorization: Bearer KEY` (the scheme in any case).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::PropertyValue;

    fn clients(rate: u32) -> Clients {
        let client = |key: &str| IntakeClient {
            api_key: PropertyValue::Text(key.into()),
            rate_per_second: rate,
            burst: Some(2),
        };
        let all = BTreeMap::from([
            ("alice".to_string(), client("alice-key-0123456789")),
            ("bob".to_string(), client("bob-key-0123456789ab")),
        ]);
        Clients::new(&all).expect("keys")
    }

    fn with_auth(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, value.parse().expect("header"));
        h
    }

    #[test]
    fn the_key_names_the_client() {
        let c = clients(100);
        assert_eq!(c.admit(&with_auth("Bearer alice-key-0123456789")), Ok("alice"));
        assert_eq!(c.admit(&with_auth("bearer bob-key-0123456789ab")), Ok("bob"));
        assert_eq!(c.admit(&with_auth("Bearer alice-key-012345678")), Err(Refused::Unknown));
        assert_eq!(c.admit(&with_auth("Basic alice-key-0123456789")), Err(Refused::Unknown));
        assert_eq!(c.admit(&HeaderMap::new()), Err(Refused::Unknown));
    }

    #[test]
    fn past_its_burst_a_client_waits_and_others_do_not() {
        let c = clients(1);
        let alice = with_auth("Bearer alice-key-0123456789");
        assert!(c.admit(&alice).is_ok());
        assert!(c.admit(&alice).is_ok());
        assert!(matches!(c.admit(&alice), Err(Refused::RateLimited(wait)) if wait > Duration::ZERO));
        assert_eq!(c.admit(&with_auth("Bearer bob-key-0123456789ab")), Ok("bob"));
    }
}
