//! docs/config.md against the config types: every key `Config::default()` serializes is
//! documented with the default the code applies, every optional or required key of a route
//! and a sink is documented, and every key the doc lists exists in the code.
//!
//! Run with `cargo test --test docs config_docs::`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use dedupd::config::Config;
use dedupd::routes::RouteConfig;
use dedupd::sinks::SinkConfig;
use dedupd::sinks::http::HttpSinkConfig;

/// One row of a key table in docs/config.md: key path and the Default cell.
#[derive(Debug)]
struct DocRow {
    key: String,
    default: String,
}

/// The rows of every key table: lines `| \`key\` | type | default | meaning |`.
fn doc_rows() -> Vec<DocRow> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/config.md");
    let text = std::fs::read_to_string(&path).expect("read docs/config.md");
    text.lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").map(|c| c.trim_matches(|ch| ch == '|' || ch == ' ')).collect();
            assert!(cells.len() >= 4, "docs/config.md: a key row needs 4 cells: {l}");
            DocRow { key: cells[0].trim_matches('`').to_string(), default: cells[2].to_string() }
        })
        .collect()
}

/// Every leaf of a TOML value as `path -> value`. Empty tables and arrays are leaves;
/// `sinks.<name>` becomes `sinks.NAME` and route fields `routes[].field`.
fn leaves(prefix: &str, v: &toml::Value, out: &mut BTreeMap<String, toml::Value>) {
    match v {
        // Pass-through tables and a tool's JSON Schema are values, not keys.
        toml::Value::Table(t)
            if !t.is_empty()
                && !["kafka.consumer", "kafka.producer", "intake.tools.NAME.input_schema"].contains(&prefix) =>
        {
            for (k, v) in t {
                let path = match prefix {
                    "" => k.clone(),
                    "sinks" => "sinks.NAME".to_string(),
                    "intake.clients" => "intake.clients.NAME".to_string(),
                    "intake.tools" => "intake.tools.NAME".to_string(),
                    p => format!("{p}.{k}"),
                };
                leaves(&path, v, out);
            }
        }
        toml::Value::Array(a) if prefix == "routes" && !a.is_empty() => {
            for route in a {
                leaves("routes[]", route, out);
            }
        }
        _ => {
            out.insert(prefix.to_string(), v.clone());
        }
    }
}

/// The keys and values of a config serialized to TOML.
fn serialized(c: &Config) -> BTreeMap<String, toml::Value> {
    let v = toml::Value::try_from(c).expect("serialize config");
    let mut out = BTreeMap::new();
    leaves("", &v, &mut out);
    out
}

/// The doc's Default cell as a TOML value (`None` for *required* / *unset*).
fn doc_value(cell: &str) -> Option<toml::Value> {
    let literal = cell.strip_prefix('`')?.strip_suffix('`')?;
    let mut t: toml::Table =
        toml::from_str(&format!("v = {literal}")).unwrap_or_else(|e| panic!("default `{literal}` is not TOML: {e}"));
    t.remove("v")
}

/// Equal as TOML values, or both durations of the same length ("24h" and "1day").
fn same_default(doc: &toml::Value, code: &toml::Value) -> bool {
    if doc == code {
        return true;
    }
    match (doc.as_str(), code.as_str()) {
        (Some(a), Some(b)) => match (humantime::parse_duration(a), humantime::parse_duration(b)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        },
        _ => false,
    }
}

/// A config with every optional field set, a route and a sink: its keys are every key the
/// types have (a new field in `RouteConfig` makes this fail to compile, so it stays complete).
fn every_key_set() -> Config {
    let mut c = Config::default();
    c.http.admin_token = Some("0123456789abcdef0123".into());
    c.store.cache_bytes = dedupd::store::CacheSize(std::num::NonZeroU64::new(64 << 20));
    c.store.changelog_topic = Some("dedupd.dedupd-state".into());
    c.pipeline.max_in_flight = std::num::NonZeroUsize::new(64);
    c.intake = Some(intake_with_defaults());
    if let Some(intake) = &mut c.intake {
        intake.topic = Some("commands".into());
        intake.tls = Some(dedupd::intake::config::IntakeTls {
            cert_file: "/etc/dedupd/intake.crt".into(),
            key_file: "/etc/dedupd/intake.key".into(),
        });
        intake.tools.insert(
            "charge_card".into(),
            toml::from_str("type = \"payment.charge\"\ndescription = \"d\"\n").expect("a tool"),
        );
        for client in intake.clients.values_mut() {
            client.burst = Some(10);
        }
    }
    c.sinks.insert(
        "api".into(),
        SinkConfig::Http(HttpSinkConfig {
            url: "http://127.0.0.1:8080/x".into(),
            forward_key: true,
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
            ..HttpSinkConfig::default()
        }),
    );
    c.routes.push(RouteConfig {
        name: Some("r".into()),
        types: vec!["*".into()],
        sink: "api".into(),
        ttl: Some(Duration::from_secs(60)),
        fingerprint_exclude: vec!["/payload/request_id".into()],
    });
    c
}

#[test]
fn every_default_key_is_documented_with_its_default() {
    let rows = doc_rows();
    let doc: BTreeMap<&str, &DocRow> = rows.iter().map(|r| (r.key.as_str(), r)).collect();
    let mut problems = Vec::new();
    for (key, code) in serialized(&Config::default()) {
        match doc.get(key.as_str()) {
            None => problems.push(format!("`{key}` (default {code}) is not in docs/config.md")),
            Some(row) => match doc_value(&row.default) {
                Some(d) if same_default(&d, &code) => {}
                other => problems.push(format!("`{key}`: docs/config.md says {other:?}, the code's default is {code}")),
            },
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_route_sink_and_optional_key_is_documented() {
    let rows = doc_rows();
    let documented: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
    let defaults = serialized(&Config::default());
    let mut missing = Vec::new();
    for key in serialized(&every_key_set()).keys() {
        // Kind-specific sink keys are documented in docs/sinks.md, only `kind` here.
        if key.starts_with("sinks.NAME.") && key != "sinks.NAME.kind" {
            continue;
        }
        if !documented.contains(&key.as_str()) {
            missing.push(key.clone());
        }
        // A key with no serialized default must say so in the doc (the optional
        // `[intake]`'s defaults are held by `the_intakes_defaults_are_documented`).
        if !defaults.contains_key(key)
            && !key.starts_with("intake.")
            && let Some(row) = rows.iter().find(|r| &r.key == key)
        {
            assert!(
                row.default.contains("required") || row.default.contains("unset"),
                "`{key}` has no default in the code; docs/config.md says {}",
                row.default
            );
        }
    }
    assert!(missing.is_empty(), "not in docs/config.md: {missing:?}");
}

#[test]
fn every_documented_key_exists() {
    let mut known = serialized(&every_key_set());
    known.extend(serialized(&Config::default()));
    // `sinks` and `routes` are documented as wholes too (their empty defaults).
    let unknown: Vec<String> = doc_rows().into_iter().map(|r| r.key).filter(|k| !known.contains_key(k)).collect();
    assert!(unknown.is_empty(), "docs/config.md lists keys the config types do not have: {unknown:?}");
}

#[test]
fn the_documented_defaults_load_as_a_config() {
    // Writing every documented default into a file gives a config that loads (so the
    // documented values are accepted, not only equal) and equals the defaults.
    let mut table = toml::Table::new();
    for row in doc_rows() {
        let (Some(value), Some((section, key))) = (doc_value(&row.default), row.key.split_once('.')) else {
            continue;
        };
        if section == "sinks" || section == "routes[]" || section == "intake" {
            continue;
        }
        let entry = table.entry(section.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        entry.as_table_mut().expect("section table").insert(key.to_string(), value);
    }
    let text = toml::to_string(&table).expect("render");
    let loaded = Config::from_toml_str(&text, Vec::<(String, String)>::new()).expect("documented defaults load");
    assert_eq!(serialized(&loaded), serialized(&Config::default()));
}

/// `[intake]` as written with only its required keys: what the code fills in.
fn intake_with_defaults() -> dedupd::intake::IntakeConfig {
    let text = "listen = \"127.0.0.1:8080\"\n[clients.NAME]\napi_key = \"0123456789abcdef\"\n";
    toml::from_str(text).expect("a minimal [intake]")
}

#[test]
fn the_intakes_defaults_are_documented() {
    let rows = doc_rows();
    let mut c = Config::default();
    c.intake = Some(intake_with_defaults());
    let mut problems = Vec::new();
    // No tools is an empty table: its keys are documented as `intake.tools.NAME.*`.
    let empty_table = |v: &toml::Value| v.as_table().is_some_and(toml::Table::is_empty);
    for (key, code) in serialized(&c).into_iter().filter(|(k, v)| k.starts_with("intake.") && !empty_table(v)) {
        let Some(row) = rows.iter().find(|r| r.key == key) else {
            problems.push(format!("`{key}` is not in docs/config.md"));
            continue;
        };
        let required = ["intake.listen", "intake.clients.NAME.api_key"].contains(&key.as_str());
        match doc_value(&row.default) {
            None if required && row.default.contains("required") => {}
            Some(d) if !required && same_default(&d, &code) => {}
            other => problems.push(format!("`{key}`: docs/config.md says {other:?}, the code's default is {code}")),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
