//! Reading a Kafka record's headers without ever panicking on their bytes.
//!
//! rdkafka 0.39 hands out header names as `&str` and, for a name that is not UTF-8 (which
//! any C or Go producer can write), panics inside `Headers::try_get` (`CStr::to_str()
//! .unwrap()`); `get` and `iter` go through it too, and no rdkafka call returns a name's
//! raw bytes. dedupd forbids unsafe code of its own, so it cannot read the name through
//! librdkafka directly either. What is left: read each header in its own
//! `catch_unwind`, and skip the ones whose read panicked. Header names are matched as
//! ASCII names (docs/contract.md §1), so a name that is not UTF-8 can never be one dedupd
//! looks for: ignoring it changes no parse.
//!
//! The panic happens in rdkafka on purpose-free input, so it must not reach the log as a
//! crash report: a process-wide panic hook, installed once on first use, stays silent for
//! panics raised while this thread reads a header and hands every other panic to the hook
//! that was there before.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

use rdkafka::message::{Header, Headers};

/// A record's headers as the envelope parser takes them: name, value (`None` for a null
/// value), in record order.
pub type HeaderList = Vec<(String, Option<Vec<u8>>)>;

/// The headers that could be read, and how many could not (a name that is not UTF-8).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReadHeaders {
    /// Every header whose name is UTF-8, in record order.
    pub headers: HeaderList,
    /// Headers skipped because rdkafka could not hand out their name.
    pub unreadable: usize,
}

thread_local! {
    /// True while this thread reads one header, whose panic the hook keeps quiet.
    static READING_HEADER: Cell<bool> = const { Cell::new(false) };
}

/// Installs, once per process, the hook that keeps header-read panics out of the log.
fn install_quiet_hook() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !READING_HEADER.with(Cell::get) {
                previous(info);
            }
        }));
    });
}

/// Header `idx` of `headers`, or `Err` when rdkafka cannot hand out its name (its read
/// panicked, silently).
fn try_read<H: Headers + ?Sized>(headers: &H, idx: usize) -> Result<Option<Header<'_, &[u8]>>, ()> {
    install_quiet_hook();
    READING_HEADER.with(|r| r.set(true));
    let one = catch_unwind(AssertUnwindSafe(|| headers.try_get(idx)));
    READING_HEADER.with(|r| r.set(false));
    one.map_err(|_| ())
}

/// Reads every header of `headers`; never panics. Headers rdkafka cannot hand out are
/// counted in [`ReadHeaders::unreadable`] and left out.
pub fn read_headers<H: Headers + ?Sized>(headers: &H) -> ReadHeaders {
    let mut read = ReadHeaders { headers: Vec::with_capacity(headers.count()), unreadable: 0 };
    for idx in 0..headers.count() {
        match try_read(headers, idx) {
            Ok(Some(h)) => read.headers.push((h.key.to_string(), h.value.map(<[u8]>::to_vec))),
            Ok(None) => {}
            Err(()) => read.unreadable += 1,
        }
    }
    read
}

/// The bytes of the names and values of `headers`, without copying them; never panics. A
/// header rdkafka cannot hand out counts as nothing (its bytes cannot be reached).
pub fn header_bytes<H: Headers + ?Sized>(headers: &H) -> usize {
    (0..headers.count())
        .filter_map(|idx| try_read(headers, idx).ok().flatten())
        .map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len))
        .sum()
}

#[cfg(test)]
mod tests {
    use rdkafka::message::{Header, OwnedHeaders};

    use super::*;

    /// Headers whose name at `bad` cannot be handed out: rdkafka panics on it exactly so.
    struct WithBadName {
        inner: OwnedHeaders,
        bad: usize,
    }

    impl Headers for WithBadName {
        fn count(&self) -> usize {
            self.inner.count()
        }
        fn try_get(&self, idx: usize) -> Option<Header<'_, &[u8]>> {
            if idx == self.bad {
                let name: &[u8] = &[0xff, 0xfe];
                let _ = std::str::from_utf8(std::hint::black_box(name)).unwrap();
            }
            self.inner.try_get(idx)
        }
    }

    fn owned(names: &[&str]) -> OwnedHeaders {
        names.iter().fold(OwnedHeaders::new(), |h, n| h.insert(Header { key: n, value: Some("v") }))
    }

    #[test]
    fn every_header_is_read_in_order_with_null_values_kept() {
        let h = owned(&["a", "b"]).insert(Header::<&str> { key: "c", value: None });
        let read = read_headers(&h);
        assert_eq!(read.unreadable, 0);
        let names: Vec<&str> = read.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(read.headers[0].1.as_deref(), Some(&b"v"[..]));
        assert_eq!(read.headers[2].1, None);
    }

    #[test]
    fn a_header_whose_name_cannot_be_read_is_skipped_and_counted() {
        let h = WithBadName { inner: owned(&["a", "bad", "idempotency-key"]), bad: 1 };
        let read = read_headers(&h);
        assert_eq!(read.unreadable, 1);
        let names: Vec<&str> = read.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "idempotency-key"]);
        // The quiet hook is back off: a later header read on this thread is not silenced.
        assert!(!READING_HEADER.with(Cell::get));
    }

    #[test]
    fn header_bytes_sum_names_and_values_and_skip_unreadable_names() {
        let h = owned(&["a", "bb"]).insert(Header::<&str> { key: "c", value: None });
        assert_eq!(header_bytes(&h), 1 + 1 + 2 + 1 + 1);
        let h = WithBadName { inner: owned(&["a", "bad"]), bad: 1 };
        assert_eq!(header_bytes(&h), 2);
    }
}
