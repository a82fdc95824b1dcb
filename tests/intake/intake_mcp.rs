//! The intake as an MCP server (docs/intake.md, "MCP"), called by a real MCP client, the
//! Python `mcp` package (tests/support/mcp_client.py; scripts/test installs it), over
//! Streamable HTTP on loopback against `dedupd run` and the real broker: the tool is listed
//! with its schema and the `idempotency_key` argument; a call runs the command once, a
//! repeat returns the stored result marked replayed, a call without the key is refused, and
//! the receiver saw one request. The client's key scope is the HTTP door's.

use crate::common;

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use common::intake::Door;
use common::kafka;
use common::process::{DedupdProcess, KeptOnFailure, tail_of_file};
use common::scripted::ScriptedReceiver;
use serde_json::{Value, json};

const KEY: &str = "agent-key-0123456789abcdef";

fn config(bootstrap: &str, topics: [&str; 3], store: &std::path::Path, url: &str) -> String {
    let rest = format!(
        r#"
[sinks.pay]
kind = "http"
url = "{url}"

[[routes]]
types = ["payment.*"]
sink = "pay"

[intake]
listen = "127.0.0.1:0"

[intake.clients.agent]
api_key = "{KEY}"

[intake.tools.charge_card]
type = "payment.charge"
description = "Charge a customer's card once per idempotency key."
input_schema = {{ type = "object", properties = {{ amount = {{ type = "integer" }}, customer = {{ type = "string" }} }}, required = ["amount", "customer"] }}
"#,
    );
    common::intake::dedupd_toml(bootstrap, "intake-mcp-dedupd", topics, store, &rest)
}

/// Runs the MCP client with `calls`; its one line of output.
fn mcp_client(url: &str, calls: &Value) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/mcp_client.py");
    let mut child = std::process::Command::new("python3")
        .args([script, url, KEY])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child.stdin.take().expect("stdin").write_all(calls.to_string().as_bytes()).expect("write calls");
    let out = child.wait_with_output().expect("client");
    assert!(
        out.status.success(),
        "the MCP client failed (is the `mcp` package installed? scripts/test installs it):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the client's JSON line")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_runs_a_tool_once_per_idempotency_key() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let topics = [kafka::unique("intake-mcp-in"), kafka::unique("intake-mcp-out"), kafka::unique("intake-mcp-dlq")];
    kafka::create_topics(&bootstrap, &[(&topics[0], 2), (&topics[1], 2), (&topics[2], 1)]).await;
    let pay = ScriptedReceiver::start(&[]).await;
    let dir = KeptOnFailure::new();
    let (config_path, log) = (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"));
    let names = [topics[0].as_str(), topics[1].as_str(), topics[2].as_str()];
    std::fs::write(&config_path, config(&bootstrap, names, &dir.path().join("store"), &pay.url("/pay")))
        .expect("write config");
    let mut dedupd = DedupdProcess::run(&config_path, &log);
    let door = Door::when_ready(&log, &mut dedupd).await;
    let url = format!("{}/mcp", door.base);

    let charge = json!({"idempotency_key": "task-7:step-2", "amount": 1200, "customer": "c_42"});
    let calls = json!([
        {"tool": "charge_card", "arguments": charge},
        {"tool": "charge_card", "arguments": charge},
        {"tool": "charge_card", "arguments": {"amount": 5, "customer": "c_1"}},
    ]);
    let out = tokio::task::spawn_blocking(move || mcp_client(&url, &calls)).await.expect("client task");

    let tools = out["tools"].as_array().expect("tools");
    assert_eq!(tools.len(), 1, "{out}");
    assert_eq!(tools[0]["name"], "charge_card");
    let schema = &tools[0]["input_schema"];
    assert_eq!(schema["properties"]["amount"]["type"], "integer", "{schema}");
    assert_eq!(schema["properties"]["idempotency_key"]["type"], "string", "{schema}");
    assert_eq!(schema["required"], json!(["amount", "customer", "idempotency_key"]), "{schema}");

    let answers = out["answers"].as_array().expect("answers");
    assert_eq!(
        answers[0],
        json!({"structured": {"outcome": "succeeded", "replayed": false, "result": {"status": 200, "body": {"accepted": true}}}, "is_error": false})
    );
    assert_eq!(answers[1]["structured"]["replayed"], true, "{out}");
    assert_eq!(answers[1]["structured"]["result"], answers[0]["structured"]["result"]);
    let refused = answers[2]["protocol_error"].as_str().unwrap_or("");
    assert!(refused.contains("idempotency_key"), "a call without the key is refused: {out}");

    // The sink got one request, the payload without the intake's argument, under the
    // client's scope; the HTTP door sees the same key.
    let received = pay.answered();
    assert_eq!(received.len(), 1, "one sink call for two tool calls");
    assert_eq!(received[0].key.as_deref(), Some("agent/task-7:step-2"));
    let body: Value = serde_json::from_slice(&received[0].body).expect("sink body");
    assert_eq!(body, json!({"amount": 1200, "customer": "c_42"}));
    let (status, state) = door.get(KEY, "/v1/commands/task-7:step-2").await;
    assert_eq!((status.as_u16(), state["state"].as_str()), (200, Some("completed")), "{state}");

    // Without an API key the endpoint answers 401, as the HTTP routes do.
    let anonymous = reqwest::Client::new()
        .post(format!("{}/mcp", door.base))
        .header("content-type", "application/json")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
        .send()
        .await
        .expect("request");
    assert_eq!(anonymous.status().as_u16(), 401);
    assert!(dedupd.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()), "{}", tail_of_file(&log, 40));
}
