//! The http check: its config (defaults, timing, every problem named by its key) and how its answer is read.

use super::*;
use serde_json::json;

fn sink(check: &str) -> HttpSinkConfig {
    let text =
        format!("url = \"https://api.test/payments\"\nforward_key = false\nrequest_timeout = \"2s\"\n[check]\n{check}");
    toml::from_str(&text).unwrap()
}

fn keys(config: &HttpSinkConfig) -> Vec<String> {
    use crate::sinks::SinkKind;
    config.problems("sinks.pay").into_iter().map(|p| p.key).collect()
}

#[test]
fn defaults() {
    let config = sink("url = \"https://api.test/payments?reference={/ref}\"");
    let check = config.check.as_ref().unwrap();
    assert_eq!(**check, HttpCheckConfig::new("https://api.test/payments?reference={/ref}"));
    assert_eq!(
        (check.method.as_str(), &check.found_status[..], &check.absent_status[..]),
        ("GET", &[200][..], &[404][..])
    );
    let timing = check.timing(config.request_timeout);
    assert_eq!(timing.delay, Duration::from_secs(4), "twice request_timeout");
    assert_eq!(keys(&config), Vec::<String>::new());
    assert_eq!(crate::sinks::SinkKind::check_timing(&config), Some(timing));
    assert_eq!(
        crate::sinks::SinkKind::check_timing(&sink("url = \"https://api.test/x\"\ndelay = \"1s\"")).map(|t| t.delay),
        Some(Duration::from_secs(1))
    );
}

#[test]
fn unknown_keys_are_refused() {
    let text = "url = \"https://api.test/\"\n[check]\nurl = \"https://api.test/\"\nstatus = [200]";
    let err = toml::from_str::<HttpSinkConfig>(text).unwrap_err();
    assert!(err.to_string().contains("status"), "{err}");
}

#[test]
fn every_problem_names_its_key_at_once() {
    let config = sink(
        "url = \"{/base}/payments\"\nmethod = \"DELETE\"\nfound_status = [200, 99]\nabsent_status = [404, 600]\n\
         found_pointer = \"data\"\nheaders = { Idempotency-Key = \"x\" }\nbody_template = { a = \"{oops\" }\n\
         delay = \"2d\"",
    );
    assert_eq!(
        keys(&config),
        [
            "sinks.pay.check.url",
            "sinks.pay.check.method",
            "sinks.pay.check.found_status",
            "sinks.pay.check.absent_status",
            "sinks.pay.check.found_pointer",
            "sinks.pay.check.headers",
            "sinks.pay.check.body_template",
            "sinks.pay.check.delay",
        ]
    );
}

#[test]
fn overlapping_and_empty_statuses_are_refused() {
    let config = sink("url = \"https://api.test/\"\nfound_status = [200, 404]\nabsent_status = [404, 410]");
    let problems = {
        use crate::sinks::SinkKind;
        config.problems("sinks.pay")
    };
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!((problems[0].key.as_str(), problems[0].value.as_str()), ("sinks.pay.check.absent_status", "404"));
    assert!(problems[0].reason.contains("found_status too"), "{}", problems[0].reason);
    assert_eq!(keys(&sink("url = \"https://api.test/\"\nfound_status = []")), ["sinks.pay.check.found_status"]);
    assert!(keys(&sink("url = \"https://api.test/\"\nabsent_status = []")).is_empty(), "found or indeterminate only");
}

#[test]
fn pointer_rules() {
    for ok in ["", "/", "/data/0/id", "/a~0b/c~1d"] {
        assert_eq!(check_pointer(ok), Ok(()), "{ok}");
    }
    for bad in ["data", "data/0", "/a~2", "/a~"] {
        assert!(check_pointer(bad).is_err(), "{bad}");
    }
    let head = sink("url = \"https://api.test/\"\nmethod = \"HEAD\"\nfound_pointer = \"/id\"");
    assert_eq!(keys(&head), ["sinks.pay.check.found_pointer"]);
    let get_body = sink("url = \"https://api.test/\"\nbody_template = { ref = \"{/ref}\" }");
    assert_eq!(keys(&get_body), ["sinks.pay.check.body_template"]);
    let post = sink("url = \"https://api.test/\"\nmethod = \"post\"\nbody_template = { ref = \"{/ref}\" }");
    assert!(keys(&post).is_empty());
}

#[test]
fn a_sink_that_forwards_the_key_is_refused_a_check() {
    let mut config = sink("url = \"https://api.test/\"");
    config.forward_key = true;
    let problems = {
        use crate::sinks::SinkKind;
        config.problems("sinks.pay")
    };
    assert_eq!(problems[0].key, "sinks.pay.forward_key");
    assert!(problems[0].reason.contains("a check is only used when forward_key = false"), "{}", problems[0].reason);
}

#[test]
fn a_delay_past_a_day_is_refused_naming_its_key() {
    let config = sink("url = \"https://api.test/\"\ndelay = \"25h\"");
    assert_eq!(keys(&config), ["sinks.pay.check.delay"]);
}

#[test]
fn check_headers_cannot_replace_auth() {
    let mut config = sink("url = \"https://api.test/\"\nheaders = { Authorization = \"x\", Accept = \"bad\\u0001\" }");
    assert_eq!(keys(&config), ["sinks.pay.check.headers.Accept"]);
    config.auth = Some(super::super::HttpAuthConfig { bearer_env: Some("T".into()), ..Default::default() });
    assert_eq!(keys(&config), ["sinks.pay.check.headers.Accept", "sinks.pay.check.headers"]);
}

fn check(found_pointer: Option<&str>) -> Check {
    let mut config = HttpCheckConfig::new("https://api.test/p?ref={/ref}");
    config.found_pointer = found_pointer.map(str::to_string);
    Check::build("pay", &config, false).unwrap()
}

fn body(text: &str) -> Body {
    Body::from_bytes(text.as_bytes(), false, super::super::MAX_BODY_BYTES)
}

#[test]
fn statuses_and_the_pointer_decide_the_answer() {
    let plain = check(None);
    assert_eq!(
        plain.judge(200, body(r#"{"id":"p1"}"#)),
        CheckAnswer::Found(json!({"status": 200, "body": {"id": "p1"}}))
    );
    assert_eq!(plain.judge(404, body("no")), CheckAnswer::Absent);
    let CheckAnswer::Unknown(why) = plain.judge(500, body("boom")) else { panic!("unknown") };
    assert_eq!(why, "HTTP 500 Internal Server Error, in neither check.found_status nor check.absent_status: boom");
    let pointed = check(Some("/data/0/id"));
    assert!(matches!(pointed.judge(200, body(r#"{"data":[{"id":"p1"}]}"#)), CheckAnswer::Found(_)));
    for empty in [r#"{"data":[]}"#, r#"{"data":[{"id":""}]}"#, r#"{"data":[{"id":null}]}"#, r#"{}"#] {
        assert_eq!(pointed.judge(200, body(empty)), CheckAnswer::Absent, "{empty}");
    }
    let whole = check(Some(""));
    assert_eq!(whole.judge(200, body("[]")), CheckAnswer::Absent);
    assert_eq!(whole.judge(200, body("{}")), CheckAnswer::Absent);
    assert!(matches!(whole.judge(200, body("[0]")), CheckAnswer::Found(_)));
    for unreadable in ["<html>oops</html>", ""] {
        assert!(matches!(pointed.judge(200, body(unreadable)), CheckAnswer::Unknown(_)), "{unreadable:?}");
    }
    let cut = Body::from_bytes(br#"{"data":[{"id":"p1"}]"#, true, 10);
    let CheckAnswer::Unknown(why) = pointed.judge(200, cut) else { panic!("unknown") };
    assert!(why.contains("max_response_bytes"), "{why}");
}

#[tokio::test]
async fn a_payload_the_url_cannot_take_is_an_error_naming_the_key() {
    let sink_config = sink("url = \"https://api.test/p?ref={/ref}\"");
    let http = HttpSink::new("pay", &sink_config).unwrap();
    let payload = json!({"amount": 1});
    let request = SinkRequest::unclaimed("k", "t", &payload, 1, None);
    let answer = crate::sinks::SinkEffect::check(&http, request).await;
    let CheckAnswer::Error(why) = answer else { panic!("{answer:?}") };
    assert!(why.starts_with("check.url: payload has no field `/ref`"), "{why}");
}
