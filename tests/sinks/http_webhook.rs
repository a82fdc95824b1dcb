//! What webhook users need from the `http` sink, checked at a real axum server on
//! 127.0.0.1 that records every request: static and environment headers, bearer and basic
//! auth from the environment, URL and body templates over the payload, a bounded response
//! body as the result, and the config path from TOML to a built sink.

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use dedupd::config::Config;
use dedupd::sinks::http::{HttpAuthConfig, HttpSink, HttpSinkConfig};
use dedupd::sinks::{SinkEffect, SinkError, SinkOutput, SinkRequest, build_all};
use serde_json::{Value, json};

/// Upper bound on anything a test waits for.
const BOUND: Duration = Duration::from_secs(20);

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    /// Path and query, as sent (percent-encoding kept).
    target: String,
    headers: HeaderMap,
    body: Bytes,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().expect("ASCII header"))
    }
}

#[derive(Clone)]
struct Server {
    status: u16,
    body: Vec<u8>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn handle(State(server): State<Server>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let target = uri.path_and_query().map(|p| p.as_str().to_string()).unwrap_or_default();
    server.seen.lock().unwrap().push(Seen { target, headers, body });
    (StatusCode::from_u16(server.status).unwrap(), server.body.clone()).into_response()
}

/// Starts a recording server answering `status` with `body`; returns its base URL
/// (`http://127.0.0.1:PORT`) and what it saw.
async fn start(status: u16, body: &[u8]) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new().fallback(handle).with_state(Server { status, body: body.to_vec(), seen: seen.clone() });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (format!("http://{addr}"), seen)
}

fn payload() -> Value {
    json!({
        "customer": {"id": "c/1 x", "email": "ana@example.com", "name": "Ana"},
        "lang": "fr",
        "order": {"id": 42, "total": 12.5},
    })
}

async fn run(sink: &dyn SinkEffect, payload: &Value) -> Result<SinkOutput, SinkError> {
    let claim = common::claims::durable_claim("order-42");
    let request = SinkRequest::new(&claim, "notify", payload, 1, None);
    tokio::time::timeout(BOUND, sink.execute(request)).await.expect("the sink answers within the bound")
}

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |var| map.get(var).cloned()
}

#[tokio::test]
async fn headers_bearer_auth_url_and_body_templates_reach_the_receiver() {
    let (base, log) = start(200, br#"{"delivered":true}"#).await;
    let config = HttpSinkConfig {
        url: format!("{base}/customers/{{/customer/id}}/notify?lang={{payload.lang}}"),
        headers: [("X-Static".to_string(), "static-1".to_string())].into(),
        headers_from_env: [("X-Api-Key".to_string(), "WEBHOOK_KEY".to_string())].into(),
        auth: Some(HttpAuthConfig { bearer_env: Some("WEBHOOK_TOKEN".into()), ..HttpAuthConfig::default() }),
        body_template: Some(json!({
            "to": "{/customer/email}",
            "text": "Bonjour {payload.customer.name}, order {/order/id}",
            "order": "{/order}",
            "source": "dedupd",
        })),
        ..HttpSinkConfig::default()
    };
    let sink = HttpSink::with_env("notify", &config, &env(&[("WEBHOOK_KEY", "key-abc"), ("WEBHOOK_TOKEN", "tok-123")]))
        .unwrap();

    let output = run(&sink, &payload()).await.unwrap();
    assert_eq!(output, json!({"status": 200, "body": {"delivered": true}}));

    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let request = &seen[0];
    assert_eq!(request.target, "/customers/c%2F1%20x/notify?lang=fr", "fields are percent-encoded into the URL");
    assert_eq!(request.header("x-static"), Some("static-1"));
    assert_eq!(request.header("x-api-key"), Some("key-abc"));
    assert_eq!(request.header("authorization"), Some("Bearer tok-123"));
    assert_eq!(request.header("idempotency-key"), Some("order-42"));
    assert_eq!(request.header("content-type"), Some("application/json"));
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(
        body,
        json!({
            "to": "ana@example.com",
            "text": "Bonjour Ana, order 42",
            "order": {"id": 42, "total": 12.5},
            "source": "dedupd",
        })
    );
}

#[tokio::test]
async fn basic_auth_from_env_and_the_payload_as_body_by_default() {
    let (base, log) = start(202, b"queued").await;
    let config = HttpSinkConfig {
        url: format!("{base}/hook"),
        auth: Some(HttpAuthConfig {
            basic_user: Some("ops".into()),
            basic_password_env: Some("HOOK_PASSWORD".into()),
            ..HttpAuthConfig::default()
        }),
        ..HttpSinkConfig::default()
    };
    let sink = HttpSink::with_env("hook", &config, &env(&[("HOOK_PASSWORD", "s3cr3t")])).unwrap();
    let output = run(&sink, &payload()).await.unwrap();
    assert_eq!(output, json!({"status": 202, "body": "queued"}));

    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    // base64("ops:s3cr3t")
    assert_eq!(seen[0].header("authorization"), Some("Basic b3BzOnMzY3IzdA=="));
    assert_eq!(seen[0].target, "/hook");
    assert_eq!(serde_json::from_slice::<Value>(&seen[0].body).unwrap(), payload());
}

#[tokio::test]
async fn a_missing_payload_field_fails_permanently_naming_it_and_sends_nothing() {
    let (base, log) = start(200, b"").await;
    for config in [
        HttpSinkConfig { url: format!("{base}/x/{{/customer/phone}}"), ..HttpSinkConfig::default() },
        HttpSinkConfig {
            url: format!("{base}/x"),
            body_template: Some(json!({"sms": "{/customer/phone}"})),
            ..HttpSinkConfig::default()
        },
    ] {
        let sink = HttpSink::with_env("s", &config, &env(&[])).unwrap();
        match run(&sink, &payload()).await {
            Err(SinkError::Permanent { message, result }) => {
                assert!(message.contains("/customer/phone"), "{message}");
                assert_eq!(result["error"], json!(message));
            }
            other => panic!("expected a permanent failure, got {other:?}"),
        }
    }
    assert!(log.lock().unwrap().is_empty(), "nothing was sent");
}

#[tokio::test]
async fn the_stored_response_is_bounded_by_max_response_bytes() {
    let (base, _log) = start(200, &[b'z'; 1000]).await;
    let config = HttpSinkConfig {
        url: format!("{base}/big"),
        max_response_bytes: std::num::NonZeroUsize::new(100).unwrap(),
        ..HttpSinkConfig::default()
    };
    let sink = HttpSink::with_env("s", &config, &env(&[])).unwrap();
    let output = run(&sink, &payload()).await.unwrap();
    assert_eq!(output, json!({"status": 200, "body": "z".repeat(100), "truncated": true}));
}

#[tokio::test]
async fn from_toml_config_to_a_built_sink_and_a_missing_env_var_stops_the_build() {
    let (base, log) = start(200, b"{}").await;
    let text = format!(
        r#"
[sinks.crm]
kind = "http"
url = "{base}/crm/{{/customer/id}}"
headers = {{ "X-Team" = "billing" }}
headers_from_env = {{ "X-Api-Key" = "DEDUPD_TEST_WEBHOOK_KEY_SURELY_UNSET_5e1c" }}
max_response_bytes = 1024
body_template = {{ email = "{{/customer/email}}" }}

[sinks.crm.limits]
rate_per_second = 50
burst = 5
max_concurrency = 2

[[routes]]
types = ["notify"]
sink = "crm"
"#
    );
    let config = Config::from_toml_str(&text, Vec::<(String, String)>::new()).unwrap();
    let err = build_all(&config.sinks).err().expect("the build fails without the variable");
    let message = err.to_string();
    assert!(message.contains("DEDUPD_TEST_WEBHOOK_KEY_SURELY_UNSET_5e1c"), "{message}");
    assert!(message.contains("crm"), "{message}");

    // The same config with the variable supplied builds and sends (limits wrapped around it).
    let Some(dedupd::sinks::SinkConfig::Http(http)) = config.sinks.get("crm") else { panic!("an http sink") };
    assert_eq!(http.limits.max_concurrency.map(|n| n.get()), Some(2));
    let sink = HttpSink::with_env("crm", http, &env(&[("DEDUPD_TEST_WEBHOOK_KEY_SURELY_UNSET_5e1c", "k")])).unwrap();
    run(&sink, &payload()).await.unwrap();
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].target, "/crm/c%2F1%20x");
    assert_eq!(seen[0].header("x-team"), Some("billing"));
    assert_eq!(seen[0].header("x-api-key"), Some("k"));
    assert_eq!(serde_json::from_slice::<Value>(&seen[0].body).unwrap(), json!({"email": "ana@example.com"}));
}

#[test]
fn config_errors_name_the_key() {
    let cases = [
        ("url = \"{/base}/x\"", "sinks.h.url"),
        ("url = \"https://a.test/\"\nheaders = { \"Idempotency-Key\" = \"x\" }", "sinks.h.headers"),
        ("url = \"https://a.test/\"\nauth = { basic_user = \"u\" }", "sinks.h.auth.basic_user"),
        ("url = \"https://a.test/\"\nbody_template = { a = \"{/x\" }", "sinks.h.body_template"),
        ("url = \"https://a.test/\"\n[sinks.h.limits]\nrate_per_second = 0", "sinks.h.limits.rate_per_second"),
    ];
    for (body, key) in cases {
        let text = format!("[sinks.h]\nkind = \"http\"\n{body}\n");
        let err = Config::from_toml_str(&text, Vec::<(String, String)>::new()).unwrap_err().to_string();
        assert!(err.contains(key), "{body}: {err}");
    }
}
