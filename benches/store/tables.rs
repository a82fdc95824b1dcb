//! The parent's tables: dedupd against the raw floor at each size (medians over the pairs,
//! with each pair's ratio), and, with several sizes, how each backend's figures move as the
//! store grows.

use std::collections::BTreeMap;

use dedupd::store::StoreBackend;

use super::{Figures, removes};

fn human(v: f64) -> String {
    if v.is_nan() {
        "–".into() // a side not run (`--only`)
    } else if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} k", v / 1e3)
    } else {
        format!("{v:.1}")
    }
}

/// The median (the mean of the middle two for an even count); NaN for none.
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The median of `metric` over `figures` (NaN when absent).
fn median_of<'a>(figures: impl Iterator<Item = &'a Figures>, metric: &str) -> f64 {
    median(&figures.map(|f| f.get(metric).copied().unwrap_or(f64::NAN)).collect::<Vec<_>>())
}

/// How one backend's figures move with the store's size: dedupd's rates against its own at
/// the smallest size, and memory per million keys.
pub(super) fn print_scales(b: StoreBackend, by_scale: &[(u64, Vec<(Figures, Figures)>)]) {
    let store = |pairs: &[(Figures, Figures)], m: &str| median_of(pairs.iter().map(|(_, s)| s), m);
    let raw = |pairs: &[(Figures, Figures)], m: &str| median_of(pairs.iter().map(|(r, _)| r), m);
    let Some((_, first)) = by_scale.first() else { return };
    let (write0, get0) = (store(first, "write_per_s"), store(first, "get_per_s"));
    let idle_get0 = store(first, "get_idle_per_s");
    let (n0, raw_rss0, store_rss0) = (by_scale[0].0, raw(first, "rss_loaded_kib"), store(first, "rss_loaded_kib"));
    println!();
    println!("## {b} as the store grows (medians; dedupd's rates against its own at the smallest size)");
    println!();
    println!(
        "| keys | write raw / dedupd (keys/s) | dedupd write vs smallest | lookups raw / dedupd (gets/s) | dedupd lookups vs smallest | once idle: wait, lookups raw / dedupd (gets/s), dedupd vs smallest | remove the oldest 1M (or all) raw / dedupd (s per M keys) | disk settled raw / dedupd (B/key) | RSS growth raw / dedupd (MiB per M keys) | RSS each M keys past the smallest size added, raw / dedupd (MiB) | dedupd reopen: scanned / saved filter (s) |"
    );
    println!("|---:|---|---:|---|---:|---|---|---|---|---|---|");
    for (n, pairs) in by_scale {
        let per_m = 1e6 / *n as f64;
        let both = |m: &str, scale: f64, f: &dyn Fn(f64) -> String| {
            format!("{} / {}", f(raw(pairs, m) * scale), f(store(pairs, m) * scale))
        };
        // What each million keys past the smallest size added: the fixed costs (memtables,
        // caches, the journal's buffers) cancel out.
        let added = |rss: f64, rss0: f64| {
            if *n == n0 { "–".to_string() } else { format!("{:.1}", (rss - rss0) / 1024.0 * 1e6 / (*n - n0) as f64) }
        };
        println!(
            "| {} | {} | {:.2}× | {} | {:.2}× | {:.0} s, {}, {:.2}× | {} | {} | {} | {} / {} | {:.2} / {:.2} |",
            human(*n as f64),
            both("write_per_s", 1.0, &|v| human(v)),
            store(pairs, "write_per_s") / write0,
            both("get_per_s", 1.0, &|v| human(v)),
            store(pairs, "get_per_s") / get0,
            store(pairs, "idle_wait_s"),
            both("get_idle_per_s", 1.0, &|v| human(v)),
            store(pairs, "get_idle_per_s") / idle_get0,
            both("delete_s", 1e6 / removes(*n) as f64, &|v| format!("{v:.2}")),
            both("disk_settled_bytes", 1.0 / *n as f64, &|v| format!("{v:.0}")),
            both("rss_loaded_kib", per_m / 1024.0, &|v| format!("{v:.1}")),
            added(raw(pairs, "rss_loaded_kib"), raw_rss0),
            added(store(pairs, "rss_loaded_kib"), store_rss0),
            store(pairs, "reopen_s"),
            store(pairs, "reopen_saved_s"),
        );
    }
}

/// The table comparing dedupd with the raw floor at one size.
pub(super) fn print_comparison(n: u64, pairs: &[(Figures, Figures)]) {
    let per_m = 1e6 / n as f64;
    println!();
    println!("| measure | raw floor | dedupd KeyStore | ratio | per pair | target | met |");
    println!("|---|---:|---:|---:|---|---|---|");
    let row = |name: &str,
               raw_metric: &str,
               st_metric: &str,
               scale: f64,
               fmt: &dyn Fn(f64) -> String,
               target: Option<(&str, &dyn Fn(f64) -> bool)>| {
        let get = |m: &BTreeMap<String, f64>, k: &str| m.get(k).copied().unwrap_or(f64::NAN);
        let raws: Vec<f64> = pairs.iter().map(|(r, _)| get(r, raw_metric)).collect();
        let sts: Vec<f64> = pairs.iter().map(|(_, s)| get(s, st_metric)).collect();
        let ratios: Vec<f64> = raws.iter().zip(&sts).map(|(r, s)| s / r).collect();
        let ratio = median(&ratios);
        let (t, met) = match target {
            // No ratio when one side was not run (`--only`).
            Some((t, _)) if ratio.is_nan() => (t.to_string(), "–".into()),
            Some((t, ok)) => (t.to_string(), if ok(ratio) { "yes" } else { "**no**" }.to_string()),
            None => ("–".into(), "–".into()),
        };
        let each = ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", ");
        println!(
            "| {name} | {} | {} | {ratio:.2}× | {each} | {t} | {met} |",
            fmt(median(&raws) * scale),
            fmt(median(&sts) * scale)
        );
    };
    let per_s = |v: f64| format!("{}/s", human(v));
    let secs = |v: f64| format!("{v:.2} s");
    let bytes = |v: f64| format!("{v:.0} B");
    let mib = |v: f64| format!("{:.0} MiB", v / 1024.0);
    let at_least = |min: f64| move |r: f64| r >= min;
    let at_most = |max: f64| move |r: f64| r <= max;
    let per_key = 1.0 / n as f64;
    row(
        "write: raw insert vs claim+complete (keys/s)",
        "write_per_s",
        "write_per_s",
        1.0,
        &per_s,
        Some(("≥ 0.45×", &at_least(0.45))),
    );
    row("  claim + flush_claims only (keys/s)", "write_per_s", "claim_per_s", 1.0, &per_s, None);
    row("  complete + flush only (keys/s)", "write_per_s", "complete_per_s", 1.0, &per_s, None);
    row("lookup of existing keys (gets/s)", "get_per_s", "get_per_s", 1.0, &per_s, Some(("≥ 0.8×", &at_least(0.8))));
    row(
        "  its first round, nothing read before (gets/s)",
        "get_first_round_per_s",
        "get_first_round_per_s",
        1.0,
        &per_s,
        None,
    );
    row("  wait until the process is idle", "idle_wait_s", "idle_wait_s", 1.0, &secs, None);
    row("  then another sample, first round (gets/s)", "get_idle_per_s", "get_idle_per_s", 1.0, &per_s, None);
    row(
        "remove the oldest (all, at most 1M): raw deletes vs compact_expired",
        "delete_s",
        "delete_s",
        1.0,
        &secs,
        Some(("≤ 1.5×", &at_most(1.5))),
    );
    row(
        "disk bytes per key, right after the writes",
        "disk_bytes",
        "disk_bytes",
        per_key,
        &bytes,
        Some(("≤ 1.5×", &at_most(1.5))),
    );
    row(
        "disk bytes per key, settled (background work done)",
        "disk_settled_bytes",
        "disk_settled_bytes",
        per_key,
        &bytes,
        Some(("≤ 1.5×", &at_most(1.5))),
    );
    row("  directory walk, right after the writes", "dir_bytes", "dir_bytes", per_key, &bytes, None);
    row("RSS growth after the writes, per million keys", "rss_loaded_kib", "rss_loaded_kib", per_m, &mib, None);
    row("peak RSS growth (VmHWM), per million keys", "rss_hwm_kib", "rss_hwm_kib", per_m, &mib, None);
    let logical = pairs.first().and_then(|(r, _)| r.get("logical_bytes_per_key").copied()).unwrap_or(f64::NAN);
    let reopen = median_of(pairs.iter().map(|(_, s)| s), "reopen_s");
    let save = median_of(pairs.iter().map(|(_, s)| s), "save_s");
    let reopen_saved = median_of(pairs.iter().map(|(_, s)| s), "reopen_saved_s");
    println!();
    println!("Logical size (key + record): {logical:.0} B per key.");
    println!("dedupd's reopen (records counted, presence filter filled by a full scan): {reopen:.2} s.");
    println!("dedupd's clean stop saving the filter: {save:.2} s; the reopen reading it back: {reopen_saved:.2} s.");
}
