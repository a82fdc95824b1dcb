//! The `smtp` sink against a real SMTP server (aiosmtpd) on 127.0.0.1 that stores every
//! message it accepts; the tests assert on what it stored. See tests/common/smtp_server.rs
//! (skipped without aiosmtpd unless DEDUPD_REQUIRE_KAFKA=1).
//!
//! Every await on the network is bounded by [`BOUND`].

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use dedupd::outcome::Outcome;
use dedupd::sinks::smtp::{SmtpSink, SmtpSinkConfig, SmtpTls, message_id};
use dedupd::sinks::{CallAnswer, CallWatch, SinkConfig, SinkEffect, SinkError, SinkOutput, SinkRequest};
use dedupd::store::Record;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use common::orphan::EngineWithSink;
use common::silent_smtp::SilentSmtp;
use common::smtp_server::{ServerTls, SmtpServer, test_ca};

/// Upper bound on anything a test waits for.
const BOUND: Duration = Duration::from_secs(20);

/// A plain-text loopback sink config as the TOML `[sinks.NAME]` table would give it (so keys
/// added later with defaults need no change here); tests adjust fields.
fn config(port: u16) -> SmtpSinkConfig {
    let text = format!(
        "host = \"127.0.0.1\"\nport = {port}\ntls = \"none\"\ntimeout = \"10s\"\n\
         message_id_domain = \"mail.example\"\nfrom = \"Dedupd <noreply@example.com>\"\n"
    );
    let config: SmtpSinkConfig = toml::from_str(&text).unwrap();
    assert!(!config.forward_key && config.username.is_none(), "the documented defaults");
    config
}

async fn send(sink: &SmtpSink, key: &str, payload: Value) -> Result<SinkOutput, SinkError> {
    let claim = common::claims::durable_claim(key);
    let request = SinkRequest::new(&claim, "email.send", &payload, 1, None);
    tokio::time::timeout(BOUND, sink.execute(request)).await.expect("the sink answers within the bound")
}

/// Like [`send`], watched as the engine watches a call: also what the sink said of whether
/// the relay answered.
async fn send_watched(sink: &SmtpSink, key: &str, payload: Value) -> (Result<SinkOutput, SinkError>, CallAnswer) {
    let claim = common::claims::durable_claim(key);
    let watch = CallWatch::new(&CancellationToken::new());
    let request = SinkRequest::new(&claim, "email.send", &payload, 1, None).watched_by(&watch);
    let result = tokio::time::timeout(BOUND, sink.execute(request)).await.expect("the sink answers within the bound");
    (result, request.call_answer().expect("a watched request"))
}

#[tokio::test]
async fn one_message_with_the_keys_message_id_headers_and_body() {
    let Some(server) = SmtpServer::start() else { return };
    let sink = SmtpSink::new("mailer", &config(server.port)).unwrap();
    let instance = SinkConfig::Smtp(config(server.port)).build("mailer").unwrap();
    assert!(!instance.forwards_key(), "smtp does not declare the key forwarded unless configured");

    let payload = json!({
        "from": "Billing <billing@example.com>",
        "to": ["alice@example.org", "Bob <bob@example.org>"],
        "cc": "carol@example.org",
        "subject": "Your receipt 42",
        "text": "Thanks for your order.\r\nTotal: 12.50 EUR",
    });
    let output = send(&sink, "order-42", payload).await.unwrap();
    assert_eq!(output["message_id"], json!("<order-42@mail.example>"));
    assert_eq!(output["code"], json!(250));
    assert!(output["reply"].as_str().unwrap().contains("queued as 1"), "{output}");

    let got = server.wait_for(1);
    assert_eq!(got.len(), 1);
    let m = &got[0];
    assert_eq!(m.mail_from, "billing@example.com");
    assert_eq!(m.rcpt_tos, ["alice@example.org", "bob@example.org", "carol@example.org"]);
    assert_eq!(m.header("Message-ID").as_deref(), Some("<order-42@mail.example>"));
    assert_eq!(m.header("From").as_deref(), Some("Billing <billing@example.com>"));
    assert_eq!(m.header("To").as_deref(), Some("alice@example.org, Bob <bob@example.org>"));
    assert_eq!(m.header("Cc").as_deref(), Some("carol@example.org"));
    assert_eq!(m.header("Subject").as_deref(), Some("Your receipt 42"));
    assert!(m.header("Content-Type").unwrap().starts_with("text/plain"), "{:?}", m.header("Content-Type"));
    assert_eq!(m.body().trim_end(), "Thanks for your order.\r\nTotal: 12.50 EUR");
    assert_eq!(m.auth_login, None);
}

#[tokio::test]
async fn text_and_html_make_an_alternative_and_the_default_from_applies() {
    let Some(server) = SmtpServer::start() else { return };
    let sink = SmtpSink::new("mailer", &config(server.port)).unwrap();
    let payload =
        json!({ "to": "alice@example.org", "subject": "Hi", "text": "plain part", "html": "<p>html part</p>" });
    send(&sink, "k:1 ü", payload).await.unwrap();

    let got = server.wait_for(1);
    let m = &got[0];
    assert_eq!(m.mail_from, "noreply@example.com");
    assert_eq!(m.header("From").as_deref(), Some("Dedupd <noreply@example.com>"));
    // The key, made safe for a Message-ID.
    assert_eq!(m.header("Message-ID").as_deref(), Some("<k%3A1%20%C3%BC@mail.example>"));
    assert_eq!(m.header("Message-ID"), Some(message_id("k:1 ü", "mail.example")));
    assert!(m.header("Content-Type").unwrap().starts_with("multipart/alternative"), "{:?}", m.header("Content-Type"));
    let body = m.body();
    let (plain, html) = (body.find("plain part").unwrap(), body.find("<p>html part</p>").unwrap());
    assert!(plain < html, "text first, then html (preferred last)");
    assert!(body.contains("text/plain") && body.contains("text/html"));
}

#[tokio::test]
async fn through_the_engine_one_message_per_key() {
    let Some(server) = SmtpServer::start() else { return };
    let sink = Arc::new(SinkConfig::Smtp(config(server.port)).build("mailer").unwrap());
    let mut h = EngineWithSink::new(sink);
    let mail = |n: u32| json!({ "to": "alice@example.org", "subject": format!("n{n}"), "text": format!("body {n}") });

    let first = vec![h.item("welcome-1", mail(1)), h.item("welcome-2", mail(2)), h.item("welcome-1", mail(1))];
    let outcomes: Vec<Outcome> = h.deliver(&first).await.into_iter().map(|p| p.result.outcome).collect();
    assert_eq!(outcomes, [Outcome::Succeeded, Outcome::Succeeded, Outcome::Duplicate]);
    // Redelivered later (a consumer restart): replayed, not sent.
    let again = vec![h.item("welcome-2", mail(2))];
    assert_eq!(h.deliver(&again).await[0].result.outcome, Outcome::Duplicate);

    let got = server.received();
    let mut ids: Vec<String> = got.iter().map(|m| m.header("Message-ID").unwrap()).collect();
    ids.sort();
    assert_eq!(ids, ["<welcome-1@mail.example>", "<welcome-2@mail.example>"]);
    assert_eq!(got.iter().filter(|m| m.header("Subject").as_deref() == Some("n1")).count(), 1);
}

#[tokio::test]
async fn replies_4xx_are_transient_5xx_permanent() {
    let Some(server) = SmtpServer::start() else { return };
    let sink = SmtpSink::new("mailer", &config(server.port)).unwrap();

    // Every reply with a code answers the call, whatever it says.
    match send_watched(&sink, "k1", json!({ "to": "tempfail@example.org", "text": "x" })).await {
        (Err(SinkError::Transient { message, .. }), CallAnswer::Answered) => {
            assert!(message.contains("451"), "{message}")
        }
        other => panic!("451 must be transient and answered, got {other:?}"),
    }
    match send_watched(&sink, "k2", json!({ "to": ["alice@example.org", "reject@example.org"], "text": "x" })).await {
        (Err(SinkError::Permanent { message, result }), CallAnswer::Answered) => {
            assert!(message.contains("550"), "{message}");
            assert_eq!(result["code"], json!(550));
            assert_eq!(result["message_id"], json!("<k2@mail.example>"));
        }
        other => panic!("550 must be permanent and answered, got {other:?}"),
    }
    // The same (pooled) sink still delivers afterwards.
    let (sent, answer) = send_watched(&sink, "k3", json!({ "to": "alice@example.org", "text": "after" })).await;
    assert_eq!((sent.is_ok(), answer), (true, CallAnswer::Answered), "{sent:?}");
    let got = server.wait_for(1);
    assert_eq!(got.len(), 1, "refused messages are not stored");
    assert_eq!(got[0].header("Message-ID").as_deref(), Some("<k3@mail.example>"));
}

#[tokio::test]
async fn an_unreachable_relay_is_transient_and_was_never_sent() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let sink = SmtpSink::new("mailer", &config(port)).unwrap();
    match send_watched(&sink, "k", json!({ "to": "alice@example.org", "text": "x" })).await {
        (Err(SinkError::Transient { message, .. }), CallAnswer::NeverSent) => {
            assert!(message.contains("SMTP send failed"), "{message}")
        }
        other => panic!("connection refused must be transient and never sent, got {other:?}"),
    }
}

/// The case the sink cannot settle: the relay read the whole message and its reply never
/// came. The call may have delivered it.
#[tokio::test]
async fn no_reply_to_the_end_of_the_message_is_a_maybe() {
    let server = SilentSmtp::start().await;
    let mut cfg = config(server.port);
    cfg.timeout = Duration::from_secs(1);
    let sink = SmtpSink::new("mailer", &cfg).unwrap();
    match send_watched(&sink, "k-silent", json!({ "to": "alice@example.org", "text": "x" })).await {
        (Err(SinkError::Transient { message, .. }), CallAnswer::Maybe) => {
            assert!(message.contains("no reply to the end of the message within 1s"), "{message}")
        }
        other => panic!("a silent end of DATA must be transient and a maybe, got {other:?}"),
    }
    assert_eq!(server.messages(), 1, "the relay has the whole message");
}

/// Through the engine, a sink that does not forward the key (the default) and has no check
/// (smtp has none) sends once: the key is indeterminate, not retried blind.
#[tokio::test]
async fn through_the_engine_a_silent_relay_gets_one_message_and_the_key_is_indeterminate() {
    let server = SilentSmtp::start().await;
    let mut cfg = config(server.port);
    cfg.timeout = Duration::from_secs(1);
    assert!(!cfg.forward_key);
    let mut h = EngineWithSink::new(Arc::new(SinkConfig::Smtp(cfg).build("mailer").unwrap()));
    let item = h.item("silent-1", json!({ "to": "alice@example.org", "subject": "once", "text": "x" }));
    let done = h.deliver(std::slice::from_ref(&item)).await;
    assert_eq!(done[0].result.outcome, Outcome::Indeterminate, "{:?}", done[0].result);
    assert!(matches!(h.record("silent-1"), Some(Record::Indeterminate(r)) if r.attempts == 1));
    server.wait_for(1, BOUND).await;
    assert_eq!(server.messages(), 1, "one message, never sent again (retry.max_attempts is 2 here)");
}

#[tokio::test]
async fn bad_payloads_are_permanent_with_a_clear_message_and_send_nothing() {
    let Some(server) = SmtpServer::start() else { return };
    let mut no_default_from = config(server.port);
    no_default_from.from = None;
    let sink = SmtpSink::new("mailer", &no_default_from).unwrap();
    let cases = [
        (json!({ "to": "alice@example.org", "text": "x" }), "`from` is missing"),
        (json!({ "from": "a@example.com", "text": "x" }), "`to` is missing"),
        (json!({ "from": "a@example.com", "to": [], "text": "x" }), "no recipient"),
        (json!({ "from": "a@example.com", "to": "not an address", "text": "x" }), "`to`: \"not an address\""),
        (json!({ "from": "a@example.com", "to": "b@example.org", "cc": [7], "text": "x" }), "`cc` must be"),
        (json!({ "from": "a@example.com", "to": "b@example.org" }), "needs `text` or `html`"),
        (json!({ "from": "a@example.com", "to": "b@example.org", "text": 3 }), "`text` must be a string"),
        (
            json!({ "from": "a@example.com", "to": "b@example.org", "text": "x", "bcc": "c@example.org" }),
            "unknown payload field `bcc`",
        ),
        (json!(["not", "an", "object"]), "must be a JSON object"),
    ];
    for (payload, expected) in cases {
        match send(&sink, "k", payload.clone()).await {
            Err(SinkError::Permanent { message, .. }) => assert!(message.contains(expected), "{payload}: {message}"),
            other => panic!("{payload}: expected permanent, got {other:?}"),
        }
    }
    assert!(server.received().is_empty());
}

#[tokio::test]
async fn auth_uses_the_configured_credentials() {
    let Some(server) = SmtpServer::start() else { return };
    let mut with_auth = config(server.port);
    with_auth.username = Some("dedupd".into());
    with_auth.password = Some("s3cret".into());
    let sink = SmtpSink::new("mailer", &with_auth).unwrap();
    send(&sink, "k-auth", json!({ "to": "alice@example.org", "text": "x" })).await.unwrap();
    assert_eq!(server.wait_for(1)[0].auth_login.as_deref(), Some("dedupd"));

    with_auth.password = Some("wrong".into());
    let sink = SmtpSink::new("mailer", &with_auth).unwrap();
    // A reply before the mail transaction answers the call too.
    match send_watched(&sink, "k-bad-auth", json!({ "to": "alice@example.org", "text": "x" })).await {
        (Err(SinkError::Permanent { message, .. }), CallAnswer::Answered) => {
            assert!(message.contains("535"), "{message}")
        }
        other => panic!("bad credentials (535) must be permanent and answered, got {other:?}"),
    }
    assert_eq!(server.received().len(), 1);

    // password_env names a variable that must exist when the sink is built.
    with_auth.password = None;
    with_auth.password_env = Some("DEDUPD_TEST_SURELY_UNSET_PASSWORD".into());
    let err = SmtpSink::new("mailer", &with_auth).err().expect("a missing password variable fails the build");
    assert!(err.to_string().contains("DEDUPD_TEST_SURELY_UNSET_PASSWORD"), "{err}");
}

/// `password_env`: the password is read from the named variable when the sink is built. The
/// variable is one this test process already has (cargo sets CARGO_MANIFEST_DIR for tests),
/// so the test changes no environment; the server accepts `envuser` with that value only.
#[tokio::test]
async fn auth_reads_the_password_from_the_named_variable() {
    let Some(secret) = std::env::var("CARGO_MANIFEST_DIR").ok().filter(|v| !v.is_empty()) else {
        eprintln!("SKIPPED: CARGO_MANIFEST_DIR is not set at run time (run through cargo test)");
        return;
    };
    let Some(server) = SmtpServer::start_full(ServerTls::Plain, Some(&secret)) else { return };
    let mut with_env = config(server.port);
    with_env.username = Some("envuser".into());
    with_env.password_env = Some("CARGO_MANIFEST_DIR".into());
    let sink = SmtpSink::new("mailer", &with_env).unwrap();
    send(&sink, "k-env", json!({ "to": "alice@example.org", "text": "x" })).await.unwrap();
    let got = server.wait_for(1);
    assert_eq!(got[0].auth_login.as_deref(), Some("envuser"));
}

/// A relay with a private CA: trusted through `ca_file`, refused (transient) without it.
#[tokio::test]
async fn starttls_and_implicit_tls_verify_the_relay_certificate() {
    for (server_tls, tls) in [(ServerTls::Starttls, SmtpTls::Starttls), (ServerTls::Implicit, SmtpTls::Tls)] {
        let Some(server) = SmtpServer::start_with(server_tls) else { return };
        let mut secured = config(server.port);
        secured.host = "localhost".into();
        secured.tls = tls;
        secured.username = Some("dedupd".into());
        secured.password = Some("s3cret".into());

        // The system's roots do not include the test CA: the handshake fails, nothing is sent.
        let untrusted = SmtpSink::new("mailer", &secured).unwrap();
        match send_watched(&untrusted, "k-untrusted", json!({ "to": "alice@example.org", "text": "x" })).await {
            (Err(SinkError::Transient { message, .. }), CallAnswer::NeverSent) => {
                assert!(message.contains("invalid peer certificate: UnknownIssuer"), "{message}")
            }
            other => panic!("{tls:?}: an untrusted certificate must fail (transient), got {other:?}"),
        }
        assert!(server.received().is_empty(), "{tls:?}: nothing sent over an unverified connection");

        secured.ca_file = Some(test_ca());
        let trusted = SmtpSink::new("mailer", &secured).unwrap();
        send(&trusted, "k-tls", json!({ "to": "alice@example.org", "subject": "secure", "text": "x" })).await.unwrap();
        let got = server.wait_for(1);
        assert_eq!(got.len(), 1, "{tls:?}");
        assert_eq!(got[0].header("Message-ID").as_deref(), Some("<k-tls@mail.example>"));
        assert_eq!(got[0].auth_login.as_deref(), Some("dedupd"), "{tls:?}: logged in over TLS");
    }
}

/// The crash window: the claim reached the disk, the process died before completing it.
#[tokio::test]
async fn an_orphaned_claim_reruns_with_the_same_message_id_only_when_forwarding() {
    let Some(server) = SmtpServer::start() else { return };
    let payload = json!({ "to": "alice@example.org", "subject": "once", "text": "x" });

    // forward_key = true: the relay drops repeated Message-IDs, so the re-run is safe.
    let mut forwarding = config(server.port);
    forwarding.forward_key = true;
    let mut h = EngineWithSink::new(Arc::new(SinkConfig::Smtp(forwarding).build("mailer").unwrap()));
    let item = h.item("orphan-1", payload.clone());
    h.orphan_claim(&item);
    let done = h.deliver(std::slice::from_ref(&item)).await;
    assert_eq!(done[0].result.outcome, Outcome::Succeeded);
    assert!(done[0].sink_called);
    let got = server.wait_for(1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].header("Message-ID").as_deref(), Some("<orphan-1@mail.example>"));
    assert!(
        matches!(h.record("orphan-1"), Some(Record::Completed(c)) if c.attempts == 2),
        "the re-run counts the interrupted run"
    );

    // forward_key = false (default): the effect is unknown; nothing is sent.
    let mut h = EngineWithSink::new(Arc::new(SinkConfig::Smtp(config(server.port)).build("mailer").unwrap()));
    let item = h.item("orphan-2", payload);
    h.orphan_claim(&item);
    let done = h.deliver(std::slice::from_ref(&item)).await;
    assert_eq!(done[0].result.outcome, Outcome::Indeterminate);
    assert!(!done[0].sink_called);
    assert!(matches!(h.record("orphan-2"), Some(Record::Indeterminate(_))));
    assert_eq!(server.received().len(), 1, "no message for the indeterminate key");
}
