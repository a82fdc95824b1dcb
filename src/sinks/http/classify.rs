//! How an `http` sink's attempt ended and what that means (docs/contract.md §4): the one place that
//! names what is transient, and the server's `Retry-After`.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, LOCATION, RETRY_AFTER};

/// Most characters of a `Location` kept in a failure's message and result: enough to
/// recognise where the receiver points, bounded because the receiver chooses it.
const LOCATION_CHARS: usize = 512;

/// How one POST ended, as far as classification cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// A response head arrived with this status code (redirects are never followed, so a
    /// 3xx is the receiver's answer).
    Status(u16),
    /// No response: connect error (refused, DNS, TLS), connect or request timeout, or an
    /// I/O error while sending the request or before the response head arrived.
    NoResponse,
    /// The redirect policy stopped the request. The client follows no redirect, so this is
    /// not expected; if it happens it must not be retried for ever.
    RedirectLoop,
    /// The request could not be built (e.g. an unusable URL or header value).
    Unbuildable,
}

impl Ending {
    /// The ending a reqwest error stands for.
    pub(super) fn of_error(err: &reqwest::Error) -> Ending {
        if err.is_redirect() {
            Ending::RedirectLoop
        } else if err.is_builder() {
            Ending::Unbuildable
        } else if let Some(status) = err.status() {
            Ending::Status(status.as_u16())
        } else {
            // is_connect, is_timeout, is_request, is_body and anything unforeseen: nothing
            // was answered, so the same key may safely be tried again.
            Ending::NoResponse
        }
    }
}

/// What a POST's ending means for the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// The receiver accepted it: store the result.
    Success,
    /// Retry with the same key, with backoff (docs/contract.md §4).
    Transient,
    /// Retrying cannot help: complete as `failed` and replay that.
    Permanent,
}

/// The single place that says which endings are transient (docs/contract.md §4).
///
/// Transient (retried with the same key):
/// - no response at all: connect errors (refused, unreachable, DNS, TLS handshake), the
///   connect or request timeout, and request errors before a response head arrived —
///   the receiver may or may not have acted, and the key lets it tell;
/// - HTTP 5xx (the receiver failed, not the command);
/// - HTTP 429 Too Many Requests and 408 Request Timeout (come back later).
///
/// Permanent: every other non-2xx status (other 4xx, every 3xx: redirects are never
/// followed, see [`redirect_location`]; codes outside 100..=599), a redirect-policy error,
/// and a request that could not be built.
///
/// Success: 2xx.
pub(crate) fn classify(ending: Ending) -> Class {
    match ending {
        Ending::NoResponse => Class::Transient,
        Ending::Status(200..=299) => Class::Success,
        Ending::Status(408 | 429 | 500..=599) => Class::Transient,
        Ending::Status(_) => Class::Permanent,
        Ending::RedirectLoop | Ending::Unbuildable => Class::Permanent,
    }
}

/// Where a 3xx answer points: its `Location` as text (invalid bytes replaced, at most
/// [`LOCATION_CHARS`] characters), `None` for other statuses or without the header.
///
/// The sink never follows it: a POST answered 301/302/303 would become a GET whose 200
/// says nothing about the command, and following 307/308 would re-send the payload and
/// any configured secret headers to whatever host the receiver names.
pub(crate) fn redirect_location(code: u16, headers: &HeaderMap) -> Option<String> {
    if !(300..=399).contains(&code) {
        return None;
    }
    let text = String::from_utf8_lossy(headers.get(LOCATION)?.as_bytes()).into_owned();
    let mut location: String = text.chars().take(LOCATION_CHARS).collect();
    if location.len() < text.len() {
        location.push('…');
    }
    Some(location)
}

/// Most redirects followed for one request with `follow_redirects = "same_origin"`.
pub(crate) const MAX_REDIRECT_HOPS: usize = 10;

/// The client's redirect policy. `Never` stops at the first 3xx. `SameOrigin` follows only
/// 307/308 (the method and body are kept, so the command is what arrives) and only to the
/// configured URL's scheme, host and port (so configured secret headers never leave it);
/// it stops at anything else, leaving the 3xx to [`classify`], and fails after
/// [`MAX_REDIRECT_HOPS`] hops.
pub(super) fn redirect_policy(follow: super::FollowRedirects) -> reqwest::redirect::Policy {
    match follow {
        super::FollowRedirects::Never => reqwest::redirect::Policy::none(),
        super::FollowRedirects::SameOrigin => reqwest::redirect::Policy::custom(|attempt| {
            let keeps_method = matches!(attempt.status().as_u16(), 307 | 308);
            let same_origin = attempt.previous().first().is_some_and(|first| same_origin(first, attempt.url()));
            if !(keeps_method && same_origin) {
                attempt.stop()
            } else if attempt.previous().len() > MAX_REDIRECT_HOPS {
                attempt.error(format!("more than {MAX_REDIRECT_HOPS} redirects"))
            } else {
                attempt.follow()
            }
        }),
    }
}

/// Whether two URLs have the same scheme, host and port.
fn same_origin(a: &reqwest::Url, b: &reqwest::Url) -> bool {
    a.scheme() == b.scheme() && a.host() == b.host() && a.port_or_known_default() == b.port_or_known_default()
}

/// The server-suggested wait: `Retry-After` on a 429 or 503 only, in delta-seconds or as
/// an HTTP date (the time until then). A date already past or a garbage value yields `None`
/// (the engine's own backoff applies, as it caps any wait by `retry.max_backoff`).
pub(crate) fn retry_after(code: u16, headers: &HeaderMap) -> Option<Duration> {
    retry_after_at(code, headers, SystemTime::now())
}

/// [`retry_after`] with `now` as the current time.
fn retry_after_at(code: u16, headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    if code != 429 && code != 503 {
        return None;
    }
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse::<u64>().ok().map(Duration::from_secs);
    }
    httpdate::parse_http_date(text).ok()?.duration_since(now).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn two_hundreds_succeed() {
        for code in [200, 201, 202, 204, 299] {
            assert_eq!(classify(Ending::Status(code)), Class::Success, "{code}");
        }
    }

    #[test]
    fn no_response_is_transient() {
        assert_eq!(classify(Ending::NoResponse), Class::Transient);
    }

    #[test]
    fn server_errors_throttling_and_request_timeout_are_transient() {
        for code in [500, 501, 502, 503, 504, 599, 429, 408] {
            assert_eq!(classify(Ending::Status(code)), Class::Transient, "{code}");
        }
    }

    #[test]
    fn other_client_errors_are_permanent() {
        for code in [400, 401, 403, 404, 405, 409, 410, 413, 415, 422, 451, 499] {
            assert_eq!(classify(Ending::Status(code)), Class::Permanent, "{code}");
        }
    }

    #[test]
    fn unfollowed_redirects_odd_codes_loops_and_unbuildable_are_permanent() {
        for code in [100, 300, 304, 399, 600, 999] {
            assert_eq!(classify(Ending::Status(code)), Class::Permanent, "{code}");
        }
        assert_eq!(classify(Ending::RedirectLoop), Class::Permanent);
        assert_eq!(classify(Ending::Unbuildable), Class::Permanent);
    }

    #[test]
    fn redirect_location_is_read_on_3xx_only_and_bounded() {
        let mut headers = HeaderMap::new();
        headers.insert(LOCATION, HeaderValue::from_static("https://elsewhere.test/x"));
        for code in [301, 302, 303, 307, 308] {
            assert_eq!(redirect_location(code, &headers).as_deref(), Some("https://elsewhere.test/x"), "{code}");
        }
        assert_eq!(redirect_location(200, &headers), None);
        assert_eq!(redirect_location(404, &headers), None);
        assert_eq!(redirect_location(301, &HeaderMap::new()), None);
        let long = format!("/{}", "a".repeat(2 * LOCATION_CHARS));
        headers.insert(LOCATION, HeaderValue::from_str(&long).unwrap());
        let kept = redirect_location(302, &headers).unwrap();
        assert_eq!(kept.chars().count(), LOCATION_CHARS + 1, "bounded, with an ellipsis");
        headers.insert(LOCATION, HeaderValue::from_bytes(b"/caf\xe9").unwrap());
        assert_eq!(redirect_location(307, &headers).as_deref(), Some("/caf\u{fffd}"));
    }

    fn with_retry_after(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn retry_after_seconds_on_429_and_503_only() {
        assert_eq!(retry_after(429, &with_retry_after("3")), Some(Duration::from_secs(3)));
        assert_eq!(retry_after(503, &with_retry_after(" 120 ")), Some(Duration::from_secs(120)));
        assert_eq!(retry_after(503, &with_retry_after("0")), Some(Duration::ZERO));
        assert_eq!(retry_after(500, &with_retry_after("3")), None);
        assert_eq!(retry_after(408, &with_retry_after("3")), None);
        assert_eq!(retry_after(429, &HeaderMap::new()), None);
    }

    #[test]
    fn retry_after_dates_wait_until_then_in_every_http_date_format() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        let at = |value: &str| retry_after_at(503, &with_retry_after(value), now);
        assert_eq!(at("Wed, 21 Oct 2015 07:30:00 GMT"), Some(Duration::from_secs(120)));
        assert_eq!(at("Wednesday, 21-Oct-15 07:28:30 GMT"), Some(Duration::from_secs(30)), "RFC 850");
        assert_eq!(at("Wed Oct 21 07:28:05 2015"), Some(Duration::from_secs(5)), "asctime");
        assert_eq!(at("Wed, 21 Oct 2015 07:28:00 GMT"), Some(Duration::ZERO));
        assert_eq!(at("Wed, 21 Oct 2015 07:27:59 GMT"), None, "already past");
        assert_eq!(at("Wed, 21 Oct 2015 07:30:00"), None, "not an HTTP date");
        assert_eq!(retry_after_at(500, &with_retry_after("Wed, 21 Oct 2015 07:30:00 GMT"), now), None);
    }

    #[test]
    fn retry_after_past_dates_and_garbage_are_ignored() {
        assert_eq!(retry_after(429, &with_retry_after("Wed, 21 Oct 2015 07:28:00 GMT")), None);
        assert_eq!(retry_after(429, &with_retry_after("-3")), None);
        assert_eq!(retry_after(429, &with_retry_after("+3")), None);
        assert_eq!(retry_after(429, &with_retry_after("1.5")), None);
        assert_eq!(retry_after(429, &with_retry_after("")), None);
        assert_eq!(retry_after(429, &with_retry_after("99999999999999999999999")), None);
    }
}
