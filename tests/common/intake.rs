//! A client of the HTTP intake (docs/intake.md) for the tests: where a `dedupd run` serves
//! it, requests with an API key and an `Idempotency-Key`, and answers read as status,
//! `Idempotent-Replayed` and JSON.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use super::kafka;
use super::process::{DedupdProcess, tail_of_file, wait_for_http_addr};

/// A `dedupd run` config on `topics` (input, results, dead letters) of the test broker:
/// its group named after `group`, its store at `store`, JSON logs, an HTTP listener on a
/// free port; then `rest` (sinks, routes, `[intake]`).
pub fn dedupd_toml(bootstrap: &str, group: &str, topics: [&str; 3], store: &Path, rest: &str) -> String {
    let [input, results, dlq] = topics;
    format!(
        "{kafka}\n[store]\npath = {store:?}\n\n[http]\nlisten = \"127.0.0.1:0\"\n\n[log]\nformat = \"json\"\n{rest}",
        kafka = kafka::kafka_table(bootstrap, &kafka::unique(group), input, results, dlq),
        store = store.to_str().expect("utf-8 path"),
    )
}

/// The `intake_addr` of the "dedupd running" line, once logged.
pub async fn intake_addr(log: &Path, child: &mut DedupdProcess) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        // Only what this process logged: an earlier one's address may be in the same log.
        let bytes = std::fs::read(log).unwrap_or_default();
        let start = usize::try_from(child.log_start).unwrap_or(0).min(bytes.len());
        let text = String::from_utf8_lossy(&bytes[start..]);
        let found = text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).find_map(|v| {
            (v["fields"]["message"] == "dedupd running")
                .then(|| v["fields"]["intake_addr"].as_str().map(str::to_string))?
        });
        if let Some(addr) = found {
            return addr;
        }
        assert!(child.exited().is_none(), "dedupd exited early:\n{}", tail_of_file(log, 40));
        assert!(tokio::time::Instant::now() < deadline, "dedupd did not start:\n{}", tail_of_file(log, 40));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub struct Door {
    pub base: String,
    pub http: reqwest::Client,
    /// Every (method, status) answered so far, for the test of what the OpenAPI document lists.
    seen: parking_lot::Mutex<BTreeSet<(&'static str, u16)>>,
}

impl Door {
    /// The intake at `base` (`http://HOST:PORT`), asked with `http`.
    pub fn new(base: String, http: reqwest::Client) -> Door {
        Door { base, http, seen: Default::default() }
    }

    /// The statuses answered so far to `method` (`"POST"` or `"GET"`).
    pub fn seen(&self, method: &str) -> BTreeSet<u16> {
        self.seen.lock().iter().filter(|(m, _)| *m == method).map(|(_, s)| *s).collect()
    }

    /// [`answer`], counted as a POST's.
    pub async fn answer_post(&self, response: reqwest::Response) -> (StatusCode, Option<String>, Value) {
        self.seen.lock().insert(("POST", response.status().as_u16()));
        answer(response).await
    }

    /// The intake of `child`, once the process is ready (`/readyz` 200: its partitions
    /// assigned).
    pub async fn when_ready(log: &Path, child: &mut DedupdProcess) -> Door {
        let door = Door::new(format!("http://{}", intake_addr(log, child).await), reqwest::Client::new());
        let ops = wait_for_http_addr(log, child, Duration::from_secs(60)).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let r = door.http.get(format!("http://{ops}/readyz")).send().await;
            if r.is_ok_and(|r| r.status() == StatusCode::OK) {
                return door;
            }
            assert!(child.exited().is_none(), "dedupd exited early:\n{}", tail_of_file(log, 40));
            assert!(tokio::time::Instant::now() < deadline, "not ready:\n{}", tail_of_file(log, 40));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn post(&self, api_key: &str, kind: &str, key: Option<&str>) -> reqwest::RequestBuilder {
        let mut r = self
            .http
            .post(format!("{}/v1/commands/{kind}", self.base))
            .bearer_auth(api_key)
            .header("content-type", "application/json");
        if let Some(key) = key {
            r = r.header("idempotency-key", key);
        }
        r
    }

    pub async fn send(&self, api_key: &str, kind: &str, key: &str, body: Value) -> (StatusCode, Option<String>, Value) {
        let response = self.post(api_key, kind, Some(key)).body(body.to_string()).send().await.expect("request");
        self.answer_post(response).await
    }

    pub async fn get(&self, api_key: &str, path: &str) -> (StatusCode, Value) {
        let response =
            self.http.get(format!("{}{path}", self.base)).bearer_auth(api_key).send().await.expect("request");
        self.seen.lock().insert(("GET", response.status().as_u16()));
        let (status, _, body) = answer(response).await;
        (status, body)
    }
}

/// Status, `Idempotent-Replayed`, and the body as JSON.
pub async fn answer(response: reqwest::Response) -> (StatusCode, Option<String>, Value) {
    let status = response.status();
    let replayed = response.headers().get("idempotent-replayed").map(|v| v.to_str().unwrap_or("").to_string());
    let text = response.text().await.expect("body");
    (status, replayed, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

pub fn problem_type(body: &Value) -> &str {
    body["type"].as_str().unwrap_or("").trim_start_matches("urn:dedupd:problem:")
}
