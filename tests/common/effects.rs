//! What the downstream of each sink kind received, in one shape ([`Effect`]), so that a test
//! can check every kind against the same rules (tests/common/kill_check.rs):
//! - `http`: a request at a [`SlowReceiver`] (path = the sink's name);
//! - `kafka`: a record in the sink topic (read back with a `TopicTail`);
//! - `smtp`: a message stored by the aiosmtpd server (Message-ID `<KEY@SINK.test>`);
//! - `exec`: a line the [`exec_recorder`] script appended to its file.
//!
//! Each effect has an id that the sink's stored result names ([`answered`]), so a stored or
//! replayed result can be traced back to the effect it answers.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rdkafka::message::{Message, OwnedMessage};
use serde_json::{Value, json};

use super::kafka::header;
use super::process::{Seen, SlowReceiver};
use super::smtp_server::Received;

/// The sink kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SinkKind {
    Http,
    Kafka,
    Smtp,
    Exec,
}

/// One thing a sink's downstream received.
#[derive(Debug, Clone)]
pub struct Effect {
    /// The sink (its config name) that caused it, as the downstream tells it.
    pub sink: String,
    /// The key it carried (`Idempotency-Key`; Kafka key and `idempotency-key` header;
    /// Message-ID; `DEDUPD_KEY`).
    pub key: Option<String>,
    /// dedupd's attempt number, for the kinds that pass one on (all but smtp).
    pub attempt: Option<u64>,
    /// The payload as the downstream saw it (see [`seen_as`]).
    pub seen: Value,
    /// Identifies it; a stored result names it (see [`answered`]).
    pub id: String,
}

/// Where the sinks' downstreams are.
pub struct Downstreams<'a> {
    /// The HTTP receiver (each http sink posts to the path `/SINK`).
    pub http: &'a SlowReceiver,
    /// The cluster and topic of the kafka sink.
    pub kafka_bootstrap: &'a str,
    pub kafka_topic: &'a str,
    /// The plain-text SMTP server on 127.0.0.1.
    pub smtp_port: u16,
    /// The [`exec_recorder`] script (each exec sink runs it with its name as argument).
    pub exec_program: &'a Path,
}

impl Downstreams<'_> {
    /// The body of the `[sinks.NAME]` table of sink `name` of `kind`, reaching its
    /// downstream so that the downstream can tell which sink an effect came from.
    pub fn sink_table(&self, name: &str, kind: SinkKind, forwarding: bool) -> String {
        match kind {
            SinkKind::Http => format!(
                "kind = \"http\"\nurl = \"{}\"\nforward_key = {forwarding}\nrequest_timeout = \"10s\"",
                self.http.url(&format!("/{name}"))
            ),
            SinkKind::Kafka => format!(
                "kind = \"kafka\"\nbrokers = \"{}\"\ntopic = \"{}\"\ndelivery_timeout = \"20s\"",
                self.kafka_bootstrap, self.kafka_topic
            ),
            SinkKind::Smtp => format!(
                "kind = \"smtp\"\nhost = \"127.0.0.1\"\nport = {}\ntls = \"none\"\ntimeout = \"10s\"\n\
                 from = \"dedupd@example.com\"\nmessage_id_domain = \"{}\"\nforward_key = {forwarding}",
                self.smtp_port,
                smtp_domain(name)
            ),
            SinkKind::Exec => format!(
                "kind = \"exec\"\nprogram = {:?}\nargs = [\"{name}\"]\ntimeout = \"10s\"\nforward_key = {forwarding}",
                self.exec_program.to_str().expect("utf-8 path")
            ),
        }
    }
}

/// The domain of the Message-IDs of smtp sink `sink` (its `message_id_domain`).
pub fn smtp_domain(sink: &str) -> String {
    format!("{sink}.test")
}

/// How the downstream of `kind` sees `payload`: smtp as the message's recipients, subject
/// and text; every other kind the payload itself.
pub fn seen_as(kind: SinkKind, payload: &Value) -> Value {
    match kind {
        SinkKind::Smtp => json!({"to": [payload["to"]], "subject": payload["subject"], "text": payload["text"]}),
        _ => payload.clone(),
    }
}

/// The id of the effect that the stored `result` of `key` at a sink of `kind` answers.
pub fn answered(kind: SinkKind, key: &str, result: &Value) -> Option<String> {
    match kind {
        SinkKind::Http => result.pointer("/body/seq").and_then(Value::as_u64).map(|seq| format!("http#{seq}")),
        SinkKind::Kafka => {
            let (topic, partition, offset) =
                (result["topic"].as_str()?, result["partition"].as_i64()?, result["offset"].as_i64()?);
            Some(format!("kafka#{topic}/{partition}/{offset}"))
        }
        SinkKind::Smtp => {
            let n: u64 = result["reply"].as_str()?.rsplit_once("queued as ")?.1.trim().parse().ok()?;
            Some(format!("smtp#{n}"))
        }
        SinkKind::Exec => result.pointer("/stdout/run").and_then(Value::as_str).map(|run| format!("exec#{key}/{run}")),
    }
}

fn json_or_text(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

/// Requests a [`SlowReceiver`](super::process::SlowReceiver) saw; the path names the sink.
pub fn from_http(seen: &[Seen]) -> Vec<Effect> {
    seen.iter()
        .map(|s| Effect {
            sink: s.path.trim_start_matches('/').to_string(),
            key: s.key.clone(),
            attempt: s.attempt.as_deref().and_then(|a| a.parse().ok()),
            seen: json_or_text(&s.body),
            id: format!("http#{}", s.seq),
        })
        .collect()
}

/// Records of the topic of kafka sink `sink`, in offset order per partition (one key, one
/// partition: the order a key's records were produced in). A record whose Kafka key and
/// `idempotency-key` header differ is reported in `failures` and carries no key.
pub fn from_kafka(sink: &str, records: &[OwnedMessage], failures: &mut Vec<String>) -> Vec<Effect> {
    let mut sorted: Vec<&OwnedMessage> = records.iter().collect();
    sorted.sort_by_key(|m| (m.partition(), m.offset()));
    sorted
        .into_iter()
        .map(|m| {
            let kafka_key = m.key().map(|k| String::from_utf8_lossy(k).into_owned());
            let header_key = header(m, "idempotency-key");
            let id = format!("kafka#{}/{}/{}", m.topic(), m.partition(), m.offset());
            if kafka_key != header_key {
                failures.push(format!("{id}: Kafka key {kafka_key:?} but idempotency-key header {header_key:?}"));
            }
            Effect {
                sink: sink.to_string(),
                key: kafka_key.filter(|k| Some(k) == header_key.as_ref()),
                attempt: header(m, "dedupd-attempt").and_then(|a| a.parse().ok()),
                seen: json_or_text(m.payload().unwrap_or_default()),
                id,
            }
        })
        .collect()
}

/// Messages the SMTP server stored, with their numbers (the `queued as N` of its reply). The
/// Message-ID `<KEY@SINK.test>` names key and sink.
pub fn from_smtp(received: &[(u64, Received)]) -> Vec<Effect> {
    received
        .iter()
        .map(|(n, m)| {
            let message_id = m.header("Message-ID").unwrap_or_default();
            let (key, domain) = message_id
                .strip_prefix('<')
                .and_then(|s| s.strip_suffix('>'))
                .and_then(|s| s.rsplit_once('@'))
                .unwrap_or_default();
            Effect {
                sink: domain.strip_suffix(".test").unwrap_or(domain).to_string(),
                key: Some(key.to_string()).filter(|k| !k.is_empty()),
                attempt: None,
                seen: json!({"to": m.rcpt_tos, "subject": m.header("Subject"), "text": m.body().trim_end()}),
                id: format!("smtp#{n}"),
            }
        })
        .collect()
}

/// Writes `exec_recorder.sh` into `dir`: run as `exec_recorder.sh SINK`, it reads the
/// payload from stdin, appends `SINK KEY ATTEMPT RUN PAYLOAD` to `file` (the effect: one
/// short append, atomic), waits 10–30 ms (so that a kill can land between the effect and the
/// completion) and prints `{"run": "RUN"}` (RUN: its process id). Without a payload (the
/// dedupd that started it died before writing stdin) it does nothing and exits 75.
pub fn exec_recorder(dir: &Path, file: &Path) -> PathBuf {
    let path = dir.join("exec_recorder.sh");
    let script = format!(
        "#!/bin/sh\n\
         IFS= read -r payload\n\
         [ -n \"$payload\" ] || exit 75\n\
         printf '%s %s %s %s %s\\n' \"$1\" \"$DEDUPD_KEY\" \"$DEDUPD_ATTEMPT\" \"$$\" \"$payload\" >> '{}'\n\
         sleep 0.0$(( $$ % 3 + 1 ))\n\
         printf '{{\"run\": \"%s\"}}\\n' \"$$\"\n",
        file.display()
    );
    std::fs::write(&path, script).expect("write the exec script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("make it executable");
    path
}

/// The lines [`exec_recorder`] appended to `file`, in order; a malformed line is reported in
/// `failures`.
pub fn from_exec(file: &Path, failures: &mut Vec<String>) -> Vec<Effect> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let fields: Vec<&str> = line.splitn(5, ' ').collect();
        let &[sink, key, attempt, run, payload] = fields.as_slice() else {
            failures.push(format!("exec effects line {}: malformed: {line:?}", n + 1));
            continue;
        };
        out.push(Effect {
            sink: sink.to_string(),
            key: Some(key.to_string()),
            attempt: attempt.parse().ok(),
            seen: json_or_text(payload.as_bytes()),
            id: format!("exec#{key}/{run}"),
        });
    }
    out
}
