//! The deployment files, checked as far as a machine without Docker or Kubernetes allows:
//! - docker-compose.yml, deploy/k8s/*.yaml (multi-document), deploy/prometheus/*.yml and
//!   deploy/grafana/** parse;
//! - every file the compose file mounts or builds from, the Dockerfile copies and the
//!   kustomization lists exists;
//! - every `dedupd_*` metric an alert rule, a rule unit test or a dashboard panel queries is
//!   one dedupd exports, and every alert links to a section of docs/runbook.md;
//! - the dedupd configs of compose and of the Kubernetes ConfigMap pass dedupd's validation;
//! - Kubernetes: probes, the headless Service, the generated ConfigMap, monitoring as an
//!   optional component whose PrometheusRule holds rules.yml; rendered by `kustomize build`
//!   (the base, and the base with the component).
//!
//! Run with `cargo test --test ops deploy_files::`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use dedupd::config::Config;
use dedupd::ops::Metrics;
use dedupd::outcome::Outcome;
use dedupd::store::{Fsyncs, StateCounts};
use serde::Deserialize;
use serde_norway::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// Every YAML document of a file.
fn yaml_documents(rel: &str) -> Vec<Value> {
    let text = read(rel);
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{rel} is not valid YAML: {e}")))
        .collect()
}

fn yaml(rel: &str) -> Value {
    let mut docs = yaml_documents(rel);
    assert_eq!(docs.len(), 1, "{rel}: expected one YAML document");
    docs.remove(0)
}

/// Files under `dir` (relative to the repository) whose name ends with one of `exts`.
fn files_under(dir: &str, exts: &[&str]) -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut found = Vec::new();
    walk(&root().join(dir), &mut found);
    let mut rel: Vec<String> = found
        .into_iter()
        .filter(|p| exts.iter().any(|e| p.to_string_lossy().ends_with(e)))
        .map(|p| p.strip_prefix(root()).expect("under root").to_string_lossy().into_owned())
        .collect();
    rel.sort();
    rel
}

/// The names of every metric family dedupd exports (each updated once so that it renders).
fn exported_metrics() -> BTreeSet<String> {
    let m = Metrics::new().expect("metrics");
    m.command(Outcome::Succeeded, Some("r"));
    m.sink_request("s", "ok", 0.01);
    m.batch_processed(0.01);
    m.store(StateCounts { in_progress: 1, completed: 1, indeterminate: 1 }, 1, Fsyncs { journal: 1, store: 1 });
    m.compacted(1);
    m.lag("t", 0, 1);
    m.set_in_flight(1);
    m.dead_lettered("invalid_json");
    m.rebalance();
    m.duplicate_age(Some("r"), 1.0);
    m.set_refused_partitions(0);
    m.set_restoring(0, false);
    m.set_sink_circuit_open("s", false);
    m.init_known(&["r"], &["s"]);
    let names: BTreeSet<String> = m
        .render()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    assert!(names.len() >= 13, "expected every docs/contract.md §10 metric, got {names:?}");
    names
}

/// The `dedupd_*` and `process_*` metric names a PromQL text refers to, without histogram
/// suffixes.
fn metrics_in(promql: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for prefix in ["dedupd_", "process_"] {
        let mut rest = promql;
        while let Some(at) = rest.find(prefix) {
            let preceded_by_word =
                rest[..at].chars().next_back().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            let tail = &rest[at..];
            let len = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
            if !preceded_by_word {
                let name = &tail[..len];
                let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
                out.insert(base.to_string());
            }
            rest = &tail[len..];
        }
    }
    out
}

/// Every string value under a JSON value whose key is `expr`.
fn json_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => json_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| json_exprs(v, out)),
        _ => {}
    }
}

/// Every alerting rule of rules.yml.
fn alert_rules() -> Vec<Value> {
    let rules = yaml("deploy/prometheus/rules.yml");
    let groups = rules["groups"].as_sequence().expect("rules.yml: groups");
    groups.iter().flat_map(|g| g["rules"].as_sequence().expect("group rules").clone()).collect()
}

#[test]
fn every_yaml_and_json_file_parses() {
    let mut checked = 0;
    for rel in ["docker-compose.yml".to_string()]
        .into_iter()
        .chain(files_under("deploy/k8s", &[".yaml", ".yml"]))
        .chain(files_under("deploy/prometheus", &[".yml", ".yaml"]))
        .chain(files_under("deploy/grafana", &[".yml", ".yaml"]))
    {
        for doc in yaml_documents(&rel) {
            assert!(doc.is_mapping(), "{rel}: every document should be a mapping");
            checked += 1;
        }
    }
    for rel in files_under("deploy/grafana", &[".json"]) {
        let v: serde_json::Value = serde_json::from_str(&read(&rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        assert!(v["panels"].as_array().is_some_and(|p| !p.is_empty()), "{rel}: a dashboard with panels");
        checked += 1;
    }
    assert!(checked >= 12, "only {checked} documents found");
}

#[test]
fn every_file_compose_mounts_or_builds_from_exists() {
    let compose = yaml("docker-compose.yml");
    let services = compose["services"].as_mapping().expect("services");
    for name in ["kafka", "dedupd-1", "dedupd-2", "prometheus", "grafana", "mailpit", "producer"] {
        assert!(services.contains_key(name), "docker-compose.yml has no `{name}` service");
    }
    let mut mounts = 0;
    for (name, svc) in services {
        let name = name.as_str().unwrap_or("?");
        if let Some(build) = svc.get("build") {
            let context = build["context"].as_str().or(build.as_str()).expect("build context");
            let dockerfile = build["dockerfile"].as_str().unwrap_or("Dockerfile");
            assert!(root().join(context).join(dockerfile).is_file(), "{name}: {context}/{dockerfile} does not exist");
        }
        for volume in svc["volumes"].as_sequence().into_iter().flatten() {
            let source = volume.as_str().and_then(|v| v.split(':').next()).expect("short volume syntax");
            if source.starts_with('.') || source.starts_with('/') {
                assert!(root().join(source).exists(), "{name}: mounts {source}, which does not exist");
                mounts += 1;
            } else {
                let named = compose["volumes"].as_mapping().is_some_and(|v| v.contains_key(source));
                assert!(named, "{name}: volume `{source}` is not declared under top-level volumes");
            }
        }
    }
    assert!(mounts >= 5, "expected the compose file to mount its config files, found {mounts}");
    // Prometheus in compose loads the rules file its config names.
    let prometheus = yaml("deploy/prometheus/prometheus.yml");
    for file in prometheus["rule_files"].as_sequence().expect("rule_files") {
        let file = file.as_str().expect("rule file");
        assert!(root().join("deploy/prometheus").join(file).is_file(), "prometheus.yml names missing {file}");
    }
}

#[test]
fn every_file_the_dockerfile_copies_exists() {
    let dockerfile = read("Dockerfile");
    let mut copies = 0;
    for line in dockerfile.lines().filter(|l| l.starts_with("COPY ") && !l.contains("--from=")) {
        let parts: Vec<&str> = line.split_whitespace().skip(1).collect();
        for source in &parts[..parts.len() - 1] {
            assert!(root().join(source).exists(), "Dockerfile copies {source}, which does not exist");
            copies += 1;
        }
    }
    assert!(copies >= 4, "found {copies} COPY sources");
    assert!(dockerfile.contains("USER 10001"), "the runtime image runs as a non-root user");
    // An init process as PID 1 (signals forwarded, children reaped) and OCI labels.
    assert!(dockerfile.contains(r#"ENTRYPOINT ["/usr/bin/tini", "--", "dedupd"]"#), "tini runs dedupd");
    assert!(dockerfile.contains("ca-certificates tini"), "tini is installed");
    for label in ["title", "description", "version", "revision", "licenses"] {
        assert!(dockerfile.contains(&format!("org.opencontainers.image.{label}=")), "OCI label {label}");
    }
    // The image carries dedupd's license and the notices of what its binary links in.
    assert!(dockerfile.contains("scripts/third-party-licenses"), "the build writes the third-party notices");
    assert!(
        dockerfile.contains("COPY --from=build /usr/local/share/doc/dedupd /usr/share/doc/dedupd"),
        "the runtime image has LICENSE and THIRD-PARTY-LICENSES"
    );
}

/// The documents of a kustomization's `resources` (files, not directories), by kind.
fn kustomize_resources(dir: &str) -> Vec<(String, Value)> {
    let kustomization = yaml(&format!("{dir}/kustomization.yaml"));
    let mut docs = Vec::new();
    for resource in kustomization["resources"].as_sequence().expect("resources") {
        let rel = format!("{dir}/{}", resource.as_str().expect("resource path"));
        for doc in yaml_documents(&rel) {
            assert!(doc["apiVersion"].is_string() && doc["metadata"]["name"].is_string(), "{rel}: apiVersion and name");
            docs.push((doc["kind"].as_str().expect("kind").to_string(), doc));
        }
    }
    docs
}

#[test]
fn kubernetes_manifests_are_complete() {
    let base = kustomize_resources("deploy/k8s");
    let kinds: BTreeSet<&str> = base.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, BTreeSet::from(["PodDisruptionBudget", "Service", "StatefulSet"]), "kinds in deploy/k8s");

    // The config comes from a generator (a new name per content, so a change rolls the
    // pods), and it validates.
    let kustomization = yaml("deploy/k8s/kustomization.yaml");
    let generator = &kustomization["configMapGenerator"][0];
    assert_eq!(generator["name"], "dedupd-config");
    assert_eq!(generator["files"][0], "dedupd.toml");
    let path = root().join("deploy/k8s/dedupd.toml");
    let config = Config::load(&path, Vec::<(String, String)>::new()).unwrap_or_else(|e| panic!("{e}"));
    assert!(config.store.changelog, "deploy/k8s runs the store on Kafka");

    for (kind, doc) in &base {
        if kind == "StatefulSet" {
            assert!(doc["spec"]["volumeClaimTemplates"].is_sequence(), "the store needs a volume claim");
            let pod = &doc["spec"]["template"]["spec"];
            assert_eq!(pod["volumes"][0]["configMap"]["name"], "dedupd-config", "the generated ConfigMap");
            let container = &pod["containers"][0];
            assert_eq!(container["startupProbe"]["httpGet"]["path"], "/healthz");
            assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
            assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
            assert!(container["livenessProbe"]["initialDelaySeconds"].is_null(), "the startupProbe covers the start");
        }
        if kind == "Service" {
            // The admin API and the scrape must reach a pod while /readyz is 503.
            assert_eq!(doc["spec"]["publishNotReadyAddresses"], true, "headless Service");
        }
    }

    // Monitoring is an optional component: the base works on a cluster without the
    // Prometheus Operator's CRDs.
    let component = yaml("deploy/k8s/monitoring/kustomization.yaml");
    assert_eq!(component["kind"], "Component");
    let monitoring = kustomize_resources("deploy/k8s/monitoring");
    let kinds: BTreeSet<&str> = monitoring.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, BTreeSet::from(["PrometheusRule", "ServiceMonitor"]));
    let example = yaml("deploy/k8s-with-monitoring/kustomization.yaml");
    assert_eq!(example["resources"][0], "../k8s");
    assert_eq!(example["components"][0], "../k8s/monitoring");
}

/// `kustomize build DIR`, or `None` when kustomize is not installed (scripts/test installs
/// it and sets `DEDUPD_REQUIRE_KUSTOMIZE`, which makes its absence a failure).
fn kustomize_build(dir: &str) -> Option<Vec<Value>> {
    let out = match std::process::Command::new("kustomize").arg("build").arg(root().join(dir)).output() {
        Ok(out) => out,
        Err(e) => {
            assert!(std::env::var_os("DEDUPD_REQUIRE_KUSTOMIZE").is_none(), "kustomize: {e}");
            eprintln!("kustomize not found: {dir} not rendered");
            return None;
        }
    };
    assert!(out.status.success(), "kustomize build {dir}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    Some(serde_norway::Deserializer::from_str(&text).map(|d| Value::deserialize(d).expect("rendered YAML")).collect())
}

#[test]
fn kustomize_renders_the_base_and_the_monitoring_overlay() {
    let Some(base) = kustomize_build("deploy/k8s") else { return };
    let kind_of = |d: &Value| d["kind"].as_str().unwrap_or("").to_string();
    let kinds: BTreeSet<String> = base.iter().map(kind_of).collect();
    let expected = ["ConfigMap", "PodDisruptionBudget", "Service", "StatefulSet"];
    assert_eq!(kinds, expected.iter().map(|k| k.to_string()).collect());
    // The generated ConfigMap's name carries its hash, and the StatefulSet follows it.
    let config_map = base.iter().find(|d| d["kind"] == "ConfigMap").expect("ConfigMap");
    let name = config_map["metadata"]["name"].as_str().expect("name");
    assert!(name.starts_with("dedupd-config-"), "{name}");
    let set = base.iter().find(|d| d["kind"] == "StatefulSet").expect("StatefulSet");
    assert_eq!(set["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"].as_str(), Some(name));
    assert_eq!(config_map["data"]["dedupd.toml"].as_str(), Some(read("deploy/k8s/dedupd.toml").as_str()));

    let Some(with_monitoring) = kustomize_build("deploy/k8s-with-monitoring") else { return };
    let kinds: BTreeSet<String> = with_monitoring.iter().map(kind_of).collect();
    let expected = ["ConfigMap", "PodDisruptionBudget", "PrometheusRule", "Service", "ServiceMonitor", "StatefulSet"];
    assert_eq!(kinds, expected.iter().map(|k| k.to_string()).collect());
}

#[test]
fn the_prometheus_rule_holds_rules_yml() {
    let rule = yaml("deploy/k8s/monitoring/prometheusrule.yaml");
    assert_eq!(rule["kind"], "PrometheusRule");
    assert_eq!(
        rule["spec"]["groups"],
        yaml("deploy/prometheus/rules.yml")["groups"],
        "prometheusrule.yaml differs from rules.yml: run scripts/alert-rules"
    );
}

#[test]
fn compose_dedupd_config_validates() {
    let path = root().join("deploy/compose/dedupd.toml");
    let config = Config::load(&path, Vec::<(String, String)>::new()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.kafka.bootstrap_servers, "kafka:9092");
    assert_eq!(config.http.listen.port(), 9464, "prometheus.yml scrapes dedupd-1:9464 and dedupd-2:9464");
    assert!(config.store.changelog, "the two compose instances share their state through Kafka");
}

#[test]
fn every_metric_an_alert_or_dashboard_queries_is_exported() {
    let exported = exported_metrics();
    let mut used: Vec<(String, String)> = Vec::new();
    for rule in alert_rules() {
        let name = rule["alert"].as_str().expect("alert name").to_string();
        used.extend(metrics_in(rule["expr"].as_str().expect("expr")).into_iter().map(|m| (name.clone(), m)));
    }
    // The unit tests' input series too: a test on a misspelt name proves nothing.
    let tests = yaml("deploy/prometheus/rules_test.yml");
    for t in tests["tests"].as_sequence().expect("tests") {
        for s in t["input_series"].as_sequence().expect("input_series") {
            let series = s["series"].as_str().expect("series");
            used.extend(metrics_in(series).into_iter().map(|m| ("rules_test.yml".to_string(), m)));
        }
    }
    for rel in files_under("deploy/grafana", &[".json"]) {
        let v: serde_json::Value = serde_json::from_str(&read(&rel)).expect("dashboard json");
        let mut exprs = Vec::new();
        json_exprs(&v, &mut exprs);
        assert!(!exprs.is_empty(), "{rel}: no panel queries");
        for e in exprs {
            used.extend(metrics_in(&e).into_iter().map(|m| (rel.clone(), m)));
        }
    }
    assert!(used.len() >= 20, "found only {} metric uses", used.len());
    let unknown: Vec<_> = used.iter().filter(|(_, m)| !exported.contains(m)).collect();
    assert!(unknown.is_empty(), "metrics queried but not exported: {unknown:?}\nexported: {exported:?}");
}

/// GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn every_alert_has_severity_annotations_and_a_runbook_section() {
    let runbook = read("docs/runbook.md");
    let anchors: BTreeSet<String> =
        runbook.lines().filter_map(|l| l.strip_prefix('#')).map(|l| anchor(l.trim_start_matches('#'))).collect();
    let rules = alert_rules();
    assert!(rules.len() >= 15, "rules.yml has {} alerts", rules.len());
    let mut bases = BTreeSet::new();
    for rule in rules {
        let name = rule["alert"].as_str().expect("alert");
        assert!(
            ["critical", "warning"].contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
            "{name}: severity label"
        );
        assert!(rule["for"].is_string(), "{name}: a `for:` duration");
        for key in ["summary", "description", "runbook_url"] {
            assert!(rule["annotations"][key].is_string(), "{name}: annotation {key}");
        }
        // Absolute, under one base (scripts/alert-rules --runbook-base changes it).
        let url = rule["annotations"]["runbook_url"].as_str().unwrap_or("");
        let (base, fragment) = url.split_once('#').unwrap_or_else(|| panic!("{name}: runbook_url {url}"));
        assert!(base.starts_with("https://") || base.starts_with("http://"), "{name}: runbook_url {url}");
        bases.insert(base.to_string());
        assert!(anchors.contains(fragment), "{name}: docs/runbook.md has no section #{fragment}");
    }
    assert_eq!(bases.len(), 1, "one runbook base: {bases:?}");
}
