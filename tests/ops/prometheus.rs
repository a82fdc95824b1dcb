//! dedupd's metrics through a real Prometheus (Debian's `prometheus` package): `dedupd run`
//! as a child on a real broker handles a few commands, a Prometheus server scrapes it every
//! second, and Prometheus' HTTP API must report `dedupd_commands_total` per outcome exactly
//! as the results topic shows the run did (and `up` = 1 for the dedupd target).
//!
//! Run with `scripts/kafka/kafka.sh with cargo test --test ops prometheus::`. Skips without a
//! broker or without `prometheus` on PATH, unless `DEDUPD_REQUIRE_KAFKA=1`, which makes
//! either missing a failure (scripts/test installs the package).

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::kafka;
use common::process::{DedupdProcess, KeptOnFailure, tail_of_file, wait_for_http_addr};
use serde_json::{Value, json};

/// Distinct commands produced; each of the first `REPEATS` is produced a second time.
const DISTINCT: usize = 5;
const REPEATS: usize = 2;

/// The Prometheus server binary, or `None` when the test should skip.
fn prometheus_binary() -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("prometheus"))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var("DEDUPD_REQUIRE_KAFKA").as_deref() != Ok("1"),
            "DEDUPD_REQUIRE_KAFKA=1 but `prometheus` is not installed (apt-get install prometheus; scripts/test does)"
        );
        eprintln!("skipped: `prometheus` is not installed (apt-get install prometheus)");
    }
    found
}

/// A free port on 127.0.0.1 (bound, read and released: Prometheus takes no port 0).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    l.local_addr().expect("local addr").port()
}

/// A Prometheus server, killed (and reaped) on drop.
struct PrometheusProcess {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl PrometheusProcess {
    /// Starts Prometheus on a free loopback port scraping `target` every second, with its
    /// storage under `dir`.
    fn start(binary: &Path, dir: &Path, target: &str) -> PrometheusProcess {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: dedupd\n    static_configs:\n      - targets: [\"{target}\"]\n"
            ),
        )
        .expect("write prometheus.yml");
        let addr = format!("127.0.0.1:{}", free_port());
        let log = dir.join("prometheus.log");
        let file = std::fs::File::create(&log).expect("prometheus log");
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::from(file.try_clone().expect("clone log")))
            .stderr(Stdio::from(file))
            .spawn()
            .expect("spawn prometheus");
        PrometheusProcess { child, addr, log }
    }

    /// Runs an instant query; `None` while Prometheus is not answering yet.
    async fn query(&self, client: &reqwest::Client, promql: &str) -> Option<Vec<Value>> {
        let url = format!("http://{}/api/v1/query?query={promql}", self.addr);
        let body: Value = client.get(url).send().await.ok()?.json().await.ok()?;
        if body["status"] != "success" {
            return None;
        }
        body["data"]["result"].as_array().cloned()
    }
}

impl Drop for PrometheusProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The sample value of a vector element (`"value": [ts, "12"]`).
fn sample(v: &Value) -> f64 {
    v["value"][1].as_str().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN)
}

/// `dedupd_commands_total` summed per outcome, for the target `instance`.
fn per_outcome(result: &[Value], instance: &str) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for v in result.iter().filter(|v| v["metric"]["instance"] == instance && v["metric"]["job"] == "dedupd") {
        let outcome = v["metric"]["outcome"].as_str().unwrap_or("?").to_string();
        *m.entry(outcome).or_insert(0.0) += sample(v);
    }
    m.retain(|_, n| *n != 0.0);
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_dedupd_commands_total() {
    let Some(bootstrap) = kafka::bootstrap() else {
        return;
    };
    let Some(prometheus) = prometheus_binary() else {
        return;
    };

    let (input, results, dlq) = (kafka::unique("prom-in"), kafka::unique("prom-results"), kafka::unique("prom-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, 1), (&results, 1), (&dlq, 1)]).await;

    let dir = KeptOnFailure::new();
    let config_path = dir.path().join("dedupd.toml");
    let log_path = dir.path().join("dedupd.log");
    std::fs::write(
        &config_path,
        format!(
            r#"{kafka_table}
[store]
path = "{store}"

[sinks.audit]
kind = "log"

[[routes]]
name = "audit"
types = ["*"]
sink = "audit"

[http]
listen = "127.0.0.1:0"

[log]
format = "json"
level = "info"
"#,
            kafka_table = kafka::kafka_table(&bootstrap, &kafka::unique("prom-group"), &input, &results, &dlq),
            store = dir.path().join("store").display(),
        ),
    )
    .expect("write config");

    let mut dedupd = DedupdProcess::run(&config_path, &log_path);
    let http_addr = wait_for_http_addr(&log_path, &mut dedupd, Duration::from_secs(60)).await;

    // DISTINCT commands, then the first REPEATS again with the same payload: duplicates.
    let command = |i: usize| {
        let v = json!({"id": format!("prom-{i}"), "type": "audit.note", "payload": {"i": i}});
        (format!("prom-{i}"), serde_json::to_vec(&v).expect("json"), vec![])
    };
    let records: Vec<_> = (0..DISTINCT).chain(0..REPEATS).map(command).collect();
    kafka::produce_all(&bootstrap, &input, records).await;
    let published = kafka::read_all(&bootstrap, &results, DISTINCT + REPEATS, Duration::from_secs(60)).await;
    let mut from_topic: BTreeMap<String, f64> = BTreeMap::new();
    for m in &published {
        *from_topic.entry(kafka::header(m, "dedupd-outcome").unwrap_or_default()).or_insert(0.0) += 1.0;
    }
    let expected: BTreeMap<String, f64> =
        [("succeeded".to_string(), DISTINCT as f64), ("duplicate".to_string(), REPEATS as f64)].into();
    assert_eq!(from_topic, expected, "results topic, dedupd log:\n{}", tail_of_file(&log_path, 40));

    let prom = PrometheusProcess::start(&prometheus, dir.path(), &http_addr);
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("client");
    let deadline = Instant::now() + Duration::from_secs(90);
    let (mut seen, mut up) = (BTreeMap::new(), None);
    while Instant::now() < deadline && (seen != expected || up != Some(1.0)) {
        if let Some(r) = prom.query(&client, "dedupd_commands_total").await {
            seen = per_outcome(&r, &http_addr);
        }
        if let Some(r) = prom.query(&client, "up").await {
            up = r.iter().find(|v| v["metric"]["instance"] == http_addr.as_str()).map(sample);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        seen,
        expected,
        "dedupd_commands_total per outcome through Prometheus' API; prometheus log:\n{}",
        tail_of_file(&prom.log, 30)
    );
    assert_eq!(up, Some(1.0), "up{{instance=\"{http_addr}\"}}");

    drop(prom);
    assert!(dedupd.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()), "dedupd did not stop cleanly");
}
