//! Time: where "now" comes from, and how instants are written. A leaf: imports nothing of
//! ours. Durations in config are humantime strings ("24h", "500ms") read by
//! `humantime_serde` in each section's own type.

/// Where "now" comes from; tests move it by hand.
pub trait Clock: Send + Sync {
    /// Now, Unix ms.
    fn now_ms(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        chrono::Utc::now().timestamp_millis()
    }
}

/// Unix ms as RFC 3339 with milliseconds, UTC. An instant chrono cannot represent (beyond
/// year 262143) is written as the raw number rather than refused: it only ever labels output.
pub fn rfc3339_ms(ms: i64) -> String {
    match chrono::DateTime::from_timestamp_millis(ms) {
        Some(t) => t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        None => ms.to_string(),
    }
}

/// [`rfc3339_ms`] for many instants of which few differ (a round's results share their
/// claim's and their answer's millisecond): the text of the last two instants is reused,
/// as formatting costs several times the copy.
#[derive(Debug, Default)]
pub struct Rfc3339Memo {
    recent: [Option<(i64, String)>; 2],
    /// The slot the next new instant replaces.
    next: usize,
}

impl Rfc3339Memo {
    /// `ms` as [`rfc3339_ms`] writes it.
    pub fn format(&mut self, ms: i64) -> String {
        if let Some((_, text)) = self.recent.iter().flatten().find(|(at, _)| *at == ms) {
            return text.clone();
        }
        let text = rfc3339_ms(ms);
        self.recent[self.next] = Some((ms, text.clone()));
        self.next = (self.next + 1) % self.recent.len();
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memo_writes_what_rfc3339_ms_writes() {
        let mut memo = Rfc3339Memo::default();
        for ms in [5, 1_700_000_000_123, 5, 1_700_000_000_123, 7, 5, i64::MAX, 7] {
            assert_eq!(memo.format(ms), rfc3339_ms(ms), "{ms}");
        }
    }

    #[test]
    fn rfc3339_has_milliseconds_and_utc() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
