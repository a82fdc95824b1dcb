//! A parser for the Prometheus text exposition format (what `GET /metrics` returns), enough
//! for tests to read exact sample values and the `# HELP` / `# TYPE` lines.

use std::collections::{BTreeMap, HashMap};

/// One sample line: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric (or series, e.g. `x_bucket`) name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// A parsed scrape.
#[derive(Debug, Clone, Default)]
pub struct Exposition {
    /// `# HELP` text per metric name.
    pub help: HashMap<String, String>,
    /// `# TYPE` per metric name (`counter`, `gauge`, `histogram`, ...).
    pub types: HashMap<String, String>,
    /// Every sample, in order.
    pub samples: Vec<Sample>,
}

impl Exposition {
    /// Parses `text`; panics (it is a test helper) on a line it cannot read.
    pub fn parse(text: &str) -> Exposition {
        let mut out = Exposition::default();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
                out.help.insert(name.to_string(), help.to_string());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap_or_else(|| panic!("bad TYPE line {line:?}"));
                out.types.insert(name.to_string(), kind.to_string());
            } else if line.starts_with('#') {
                continue;
            } else {
                out.samples.push(parse_sample(line));
            }
        }
        out
    }

    /// Every sample of series `name` (e.g. `dedupd_commands_total`), as labels → value.
    pub fn series(&self, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        self.samples.iter().filter(|s| s.name == name).map(|s| (s.labels.clone(), s.value)).collect()
    }

    /// The value of the sample of `name` whose labels are exactly `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.samples.iter().find(|s| s.name == name && s.labels == want).map(|s| s.value)
    }

    /// The non-zero samples of `name`, keyed by the values of `keys` (in that order), summed
    /// over any other label.
    pub fn nonzero_by(&self, name: &str, keys: &[&str]) -> BTreeMap<Vec<String>, f64> {
        let mut m = BTreeMap::new();
        for s in self.samples.iter().filter(|s| s.name == name) {
            let k: Vec<String> = keys.iter().map(|k| s.labels.get(*k).cloned().unwrap_or_default()).collect();
            *m.entry(k).or_insert(0.0) += s.value;
        }
        m.retain(|_, v| *v != 0.0);
        m
    }
}

fn parse_sample(line: &str) -> Sample {
    let name_end = line.find(['{', ' ']).unwrap_or_else(|| panic!("bad sample line {line:?}"));
    let name = line[..name_end].to_string();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices();
        let mut key = String::new();
        let end = loop {
            let (i, c) = chars.next().unwrap_or_else(|| panic!("unterminated labels in {line:?}"));
            match c {
                '}' => break i,
                ',' | ' ' => {}
                '=' => {
                    assert_eq!(chars.next().map(|(_, c)| c), Some('"'), "label value must be quoted in {line:?}");
                    let mut value = String::new();
                    loop {
                        match chars.next().map(|(_, c)| c) {
                            Some('"') => break,
                            Some('\\') => match chars.next().map(|(_, c)| c) {
                                Some('n') => value.push('\n'),
                                Some(c) => value.push(c),
                                None => panic!("bad escape in {line:?}"),
                            },
                            Some(c) => value.push(c),
                            None => panic!("unterminated label value in {line:?}"),
                        }
                    }
                    labels.insert(std::mem::take(&mut key), value);
                }
                c => key.push(c),
            }
        };
        rest = &inner[end + 1..];
    }
    let value_text = rest.split_whitespace().next().unwrap_or_else(|| panic!("no value in {line:?}"));
    let value = match value_text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().unwrap_or_else(|_| panic!("bad value {v:?} in {line:?}")),
    };
    Sample { name, labels, value }
}

/// `GET http://HTTP/metrics`, parsed; panics (a test helper) when it cannot be read.
pub async fn scrape(client: &reqwest::Client, http: &str) -> Exposition {
    let response = client.get(format!("http://{http}/metrics")).send().await.expect("GET /metrics");
    Exposition::parse(&response.text().await.expect("body"))
}
