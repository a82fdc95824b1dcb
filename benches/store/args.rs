//! The bench's command line (described in `benches/store.rs`), for the parent and for the
//! children it spawns (`--child raw|store`).

use std::path::PathBuf;

use dedupd::store::StoreBackend;

pub(super) fn parse_backend(name: &str) -> StoreBackend {
    name.parse().unwrap_or_else(|e| panic!("--backend: {e}"))
}

/// The command line.
pub(super) struct Args {
    pub(super) child: Option<String>,
    pub(super) backend: String,
    /// The store sizes to run, smallest first.
    pub(super) scales: Vec<u64>,
    /// Keys read by the lookup phase (default `DEFAULT_LOOKUPS`, at most all of them).
    pub(super) lookups: Option<u64>,
    /// Run only this side of each pair (`raw` or `store`): a size where the other side
    /// would take too long, or is not needed.
    pub(super) only: Option<String>,
    pub(super) dir: Option<PathBuf>,
    pub(super) pairs: usize,
    /// `store.cache_bytes` for dedupd's side (the backend's default when unset).
    pub(super) cache_bytes: Option<u64>,
}

pub(super) fn parse_args() -> Args {
    let mut args = std::env::args().skip(1);
    let mut a = Args {
        child: None,
        backend: "all".into(),
        scales: vec![1_000_000],
        lookups: None,
        only: None,
        dir: None,
        pairs: 3,
        cache_bytes: None,
    };
    let count = |v: Option<String>, what: &str| -> u64 {
        v.and_then(|v| v.replace('_', "").parse().ok()).filter(|&n| n > 0).unwrap_or_else(|| panic!("{what} N (>= 1)"))
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--child" => a.child = args.next(),
            "--backend" => a.backend = args.next().expect("--backend VALUE"),
            "--keys" => {
                let list = args.next().expect("--keys N[,N...]");
                a.scales = list.split(',').map(|v| count(Some(v.to_string()), "--keys")).collect();
                a.scales.sort_unstable();
            }
            "--lookups" => a.lookups = Some(count(args.next(), "--lookups")),
            "--only" => {
                a.only = args.next().filter(|s| s == "raw" || s == "store").or_else(|| panic!("--only raw|store"))
            }
            "--dir" => a.dir = args.next().map(PathBuf::from),
            "--pairs" => a.pairs = count(args.next(), "--pairs") as usize,
            "--cache" => a.cache_bytes = Some(count(args.next(), "--cache")),
            "--bench" => {} // added by `cargo bench`
            other => panic!(
                "unknown argument {other}; use --keys N[,N...] --backend NAME|all [--lookups N] [--only raw|store] [--pairs N] [--dir DIR] [--cache BYTES]"
            ),
        }
    }
    a
}
