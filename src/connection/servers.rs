//! `bootstrap.servers` entries as librdkafka reads them: `host:port`, `host` (port 9092),
//! `[v6]:port`, each optionally after `SCHEME://`. Used to refuse an entry that is none of
//! these, and to tell whether two lists name the same brokers (a kafka sink on the main
//! cluster shares its connection).

use std::collections::BTreeSet;

/// librdkafka's port when an entry names none.
const DEFAULT_PORT: u16 = 9092;

/// The broker an entry names, as `host:port` (the host lower-cased, in brackets for IPv6,
/// the port filled in), or `None` when the entry is not a broker address.
pub fn broker_address(entry: &str) -> Option<String> {
    let entry = entry.trim();
    let entry = entry.split_once("://").map_or(entry, |(_, rest)| rest);
    let (host, port, v6) = match entry.strip_prefix('[') {
        Some(v6) => match v6.split_once(']')? {
            (host, "") => (host, None, true),
            (host, rest) => (host, Some(rest.strip_prefix(':')?), true),
        },
        None => match entry.split_once(':') {
            Some((host, port)) => (host, Some(port), false),
            None => (entry, None, false),
        },
    };
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == '/') {
        return None;
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p.parse::<u16>().ok().filter(|&p| p > 0)?,
    };
    let host = host.to_ascii_lowercase();
    Some(if v6 { format!("[{host}]:{port}") } else { format!("{host}:{port}") })
}

/// Whether two comma-separated lists name the same brokers, in any order, whatever their
/// schemes and whether they spell the default port.
pub fn same_brokers(a: &str, b: &str) -> bool {
    let brokers = |list: &str| -> BTreeSet<String> {
        list.split(',')
            .filter(|e| !e.trim().is_empty())
            .map(|e| broker_address(e).unwrap_or_else(|| e.trim().to_ascii_lowercase()))
            .collect()
    };
    brokers(a) == brokers(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_read_as_librdkafka_reads_them() {
        for (entry, broker) in [
            ("b:9092", "b:9092"),
            ("B", "b:9092"),
            ("10.0.0.1:9093", "10.0.0.1:9093"),
            ("[::1]:9092", "[::1]:9092"),
            ("[::1]", "[::1]:9092"),
            ("SASL_SSL://b.example.com:9096", "b.example.com:9096"),
        ] {
            assert_eq!(broker_address(entry).as_deref(), Some(broker), "{entry}");
        }
        for bad in ["", "b:", "b:0", "b:99999", "not a host:", ":9092", "::1:9092", "[::1", "[::1]x", "b:p"] {
            assert_eq!(broker_address(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_same_brokers_in_any_spelling_are_the_same() {
        assert!(same_brokers("a:9092,b:9093", " b:9093 , A:9092"));
        assert!(same_brokers("SASL_SSL://127.0.0.1:30089", "127.0.0.1:30089"));
        assert!(same_brokers("broker", "broker:9092"));
        assert!(!same_brokers("a:9092", "a:9093"));
        assert!(!same_brokers("a:9092,b:9092", "a:9092"));
    }
}
