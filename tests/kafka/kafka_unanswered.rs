//! The lost answer, on a real broker (docs/contract.md §4, "Calls without an answer"):
//! `dedupd run` with an `http` sink that does not forward the key, whose receiver reads the
//! whole first POST of a key and never answers it. dedupd must not send that command again
//! blind: without a check each key ends `indeterminate` after exactly one POST (no retry
//! spent, the partition moves on), and its repeats report `indeterminate` too. With a check
//! (`GET /payments?reference=...`) each key ends `succeeded` after that one POST, the
//! lookup's answer its result, and its repeat is a `duplicate` of it; a key whose POST the
//! receiver lost (taken, never recorded) is found absent and POSTed once more. With the
//! lookups down, the keys are left `indeterminate`, the reconciler asks again every
//! `check.interval` (no POST meanwhile), and once the lookups are back each key is settled
//! and its settlement published (`settled_by: "check"`). A SIGKILL during the reconciler's
//! own call leaves its claim, which the next start takes up and checks.
//!
//! Run with `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --test kafka kafka_unanswered::`.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use common::exposition::scrape;
use common::kafka;
use common::process::{DedupdProcess, KeptOnFailure, tail_of_file, wait_for_http_addr, wait_until};
use parking_lot::Mutex;
use serde_json::{Value, json};

/// The receiver: POSTs per key, the payments it made (by reference), and its lookups.
#[derive(Default)]
struct Payments {
    posts: Mutex<BTreeMap<String, usize>>,
    made: Mutex<BTreeMap<String, String>>,
    lookups: Mutex<usize>,
    /// While set, every lookup answers 503: the check cannot tell.
    lookups_down: std::sync::atomic::AtomicBool,
}

/// A payments API: the first POST of a key is read whole and never answered (the answer is
/// lost); its payment is made, unless the key starts with `lost-` (the request was taken
/// and dropped). A later POST is answered 201.
async fn pay(State(payments): State<Arc<Payments>>, headers: HeaderMap, body: Bytes) -> (StatusCode, String) {
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let payload: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let reference = payload["ref"].as_str().unwrap_or_default().to_string();
    let seen = {
        let mut posts = payments.posts.lock();
        let n = posts.entry(key.clone()).or_default();
        *n += 1;
        *n
    };
    let id = format!("pay-{key}-{seen}");
    if seen > 1 || !key.starts_with("lost-") {
        payments.made.lock().insert(reference, id.clone());
    }
    if seen == 1 {
        // Read, never answered: the client's request timeout ends the call.
        std::future::pending::<()>().await;
    }
    (StatusCode::CREATED, json!({"id": id, "ref": payload["ref"]}).to_string())
}

/// `GET /payments?reference=R`: 200 with the payment made for `R`, an empty list for none;
/// 503 while lookups are down.
async fn find(
    State(payments): State<Arc<Payments>>,
    axum::extract::Query(query): axum::extract::Query<HashMap<String, String>>,
) -> (StatusCode, String) {
    *payments.lookups.lock() += 1;
    if payments.lookups_down.load(std::sync::atomic::Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "lookups are down".into());
    }
    let reference = query.get("reference").cloned().unwrap_or_default();
    let data: Vec<Value> = payments.made.lock().get(&reference).map(|id| json!({"id": id})).into_iter().collect();
    (StatusCode::OK, json!({ "data": data }).to_string())
}

/// Starts the payments API on a free loopback port; returns its address.
async fn start_payments(payments: Arc<Payments>) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let app = axum::Router::new()
        .route("/pay", axum::routing::post(pay))
        .route("/payments", axum::routing::get(find))
        .with_state(payments);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, task)
}

/// A dedupd config: the `pay` sink (no key forwarded, a 1 s request timeout, no circuit
/// breaker so that every command goes straight to its call) with `extra` appended to it.
fn config(bootstrap: &str, topics: (&str, &str, &str), store: &std::path::Path, api: &str, extra: &str) -> String {
    let (input, results, dlq) = topics;
    format!(
        "{}\n[store]\npath = {store:?}\n\n[retry]\nmax_attempts = 5\ninitial_backoff = \"50ms\"\n\n\
         [sinks.pay]\nkind = \"http\"\nurl = \"http://{api}/pay\"\nforward_key = false\nrequest_timeout = \"1s\"\n{extra}\n\
         [sinks.pay.circuit]\nenabled = false\n\n[[routes]]\ntypes = [\"*\"]\nsink = \"pay\"\n\n\
         [http]\nlisten = \"127.0.0.1:0\"\n\n[log]\nformat = \"json\"\n",
        kafka::kafka_table(bootstrap, &kafka::unique("ua-group"), input, results, dlq),
    )
}

/// Each key twice (the second a plain repeat), to `input`.
async fn produce_twice(bootstrap: &str, input: &str, keys: &[String]) {
    let mut records = Vec::new();
    for _ in 0..2 {
        for key in keys {
            let value =
                json!({"id": key, "type": "payment.create", "payload": {"ref": format!("ref-{key}"), "cents": 100}});
            records.push((key.clone(), serde_json::to_vec(&value).expect("json"), vec![]));
        }
    }
    kafka::produce_all(bootstrap, input, records).await;
}

/// The `outcome` of every result, by key, in the order published.
fn outcomes_by_key(results: &[rdkafka::message::OwnedMessage]) -> HashMap<String, Vec<String>> {
    use rdkafka::Message;
    let mut by_key: HashMap<String, Vec<String>> = HashMap::new();
    for m in results {
        let v: Value = serde_json::from_slice(m.payload().unwrap_or_default()).expect("result json");
        let key = v["key"].as_str().unwrap_or_default().to_string();
        by_key.entry(key).or_default().push(v["outcome"].as_str().unwrap_or_default().to_string());
    }
    by_key
}

/// `dedupd inspect KEY -c CONFIG` against the stopped instance's store.
fn inspect(config: &std::path::Path, key: &str) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dedupd"))
        .args(["inspect", key, "-c"])
        .arg(config)
        .output()
        .expect("dedupd inspect");
    assert!(out.status.success(), "inspect {key}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("inspect json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_without_a_check_is_indeterminate_after_one_call() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let (input, results, dlq) = (kafka::unique("ua-in"), kafka::unique("ua-results"), kafka::unique("ua-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, 2), (&results, 1), (&dlq, 1)]).await;
    let payments = Arc::new(Payments::default());
    let (api, server) = start_payments(Arc::clone(&payments)).await;
    let keys: Vec<String> = (0..4).map(|i| format!("charge-{i}")).collect();
    produce_twice(&bootstrap, &input, &keys).await;

    let dir = KeptOnFailure::new();
    let (config_path, log) = (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"));
    let text = config(&bootstrap, (&input, &results, &dlq), &dir.path().join("store"), &api, "");
    std::fs::write(&config_path, text).expect("config");
    let mut dedupd = DedupdProcess::run(&config_path, &log);
    let http = wait_for_http_addr(&log, &mut dedupd, Duration::from_secs(60)).await;
    let published = kafka::read_all(&bootstrap, &results, 2 * keys.len(), Duration::from_secs(90)).await;
    assert_eq!(published.len(), 2 * keys.len(), "a result per input:\n{}", tail_of_file(&log, 40));
    // The keys in doubt, by the sink an operator must ask (the gauges refresh every ≤ 5 s).
    let in_doubt = gauge_once(&http, "dedupd_indeterminate_keys", keys.len() as f64, Duration::from_secs(30)).await;
    assert_eq!(in_doubt, Some(keys.len() as f64), "dedupd_indeterminate_keys{{sink=\"pay\"}}");
    // No check will settle them: each waits for an operator.
    let unattended = gauge_once(&http, UNATTENDED, keys.len() as f64, Duration::from_secs(30)).await;
    assert_eq!(unattended, Some(keys.len() as f64), "{UNATTENDED}{{sink=\"pay\"}}");
    assert!(dedupd.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()), "dedupd did not stop cleanly");
    server.abort();

    let posts = payments.posts.lock().clone();
    let expected: BTreeMap<String, usize> = keys.iter().map(|k| (k.clone(), 1)).collect();
    assert_eq!(posts, expected, "exactly one POST per key: a call that may have landed is never repeated blind");
    let outcomes = outcomes_by_key(&published);
    for key in &keys {
        assert_eq!(outcomes[key], ["indeterminate", "indeterminate"], "{key}: its input and its repeat");
        let record = inspect(&config_path, key);
        assert_eq!(record["state"], "indeterminate", "{key}: {record}");
        assert_eq!(record["attempts"], 1, "{key}: {record}");
        // The command in doubt is kept with the key, for whoever asks the receiver.
        assert_eq!(
            (&record["sink"], &record["route"], &record["type"]),
            (&json!("pay"), &json!("pay"), &json!("payment.create"))
        );
        assert_eq!(record["payload"]["ref"], format!("ref-{key}"), "{record}");
        let why = record["why"].as_str().unwrap_or_default();
        assert!(why.contains("may have reached sink `pay` without an answer"), "{key}: {why}");
    }
    assert_eq!(kafka::count_records(&bootstrap, &results).await, 2 * keys.len() as i64, "one result per input");
}

/// The keys no check settles any more, by sink.
const UNATTENDED: &str = "dedupd_indeterminate_keys_unattended";

/// The gauge `name{sink="pay"}` once it reads `want`, or what it read last when `within`
/// passed.
async fn gauge_once(http: &str, name: &str, want: f64, within: Duration) -> Option<f64> {
    let client = reqwest::Client::new();
    let deadline = std::time::Instant::now() + within;
    loop {
        let value = scrape(&client, http).await.value(name, &[("sink", "pay")]);
        if value == Some(want) || std::time::Instant::now() >= deadline {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The check: the payments API's search by the payload's reference; a payment listed is
/// found, an empty list absent. The reconciler asks again every second.
fn check_table(api: &str) -> String {
    format!(
        "[sinks.pay.check]\nurl = \"http://{api}/payments?reference={{/ref}}\"\nfound_pointer = \"/data/0/id\"\ndelay = \"500ms\"\ninterval = \"1s\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_is_settled_by_the_check() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let (input, results, dlq) = (kafka::unique("uc-in"), kafka::unique("uc-results"), kafka::unique("uc-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, 2), (&results, 1), (&dlq, 1)]).await;
    let payments = Arc::new(Payments::default());
    let (api, server) = start_payments(Arc::clone(&payments)).await;
    let mut keys: Vec<String> = (0..3).map(|i| format!("charge-{i}")).collect();
    keys.push("lost-0".into());
    produce_twice(&bootstrap, &input, &keys).await;

    let dir = KeptOnFailure::new();
    let (config_path, log) = (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"));
    let text = config(&bootstrap, (&input, &results, &dlq), &dir.path().join("store"), &api, &check_table(&api));
    std::fs::write(&config_path, text).expect("config");
    let mut dedupd = DedupdProcess::run(&config_path, &log);
    let published = kafka::read_all(&bootstrap, &results, 2 * keys.len(), Duration::from_secs(90)).await;
    assert_eq!(published.len(), 2 * keys.len(), "a result per input:\n{}", tail_of_file(&log, 40));
    assert!(dedupd.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()), "dedupd did not stop cleanly");
    server.abort();

    let posts = payments.posts.lock().clone();
    let made = payments.made.lock().clone();
    let outcomes = outcomes_by_key(&published);
    for key in &keys {
        let lost = key.starts_with("lost-");
        assert_eq!(posts[key], if lost { 2 } else { 1 }, "{key}: POSTs ({posts:?})");
        assert_eq!(outcomes[key], ["succeeded", "duplicate"], "{key}: its input and its repeat");
        let record = inspect(&config_path, key);
        assert_eq!((&record["state"], &record["outcome"]), (&json!("completed"), &json!("succeeded")), "{record}");
        let answer = if lost { "absent" } else { "found" };
        assert_eq!((&record["settled_by"], &record["check_answer"]), (&json!("check"), &json!(answer)), "{record}");
        let payment = &made[&format!("ref-{key}")];
        if lost {
            // Absent, so POSTed again: that POST's answer is the result.
            assert_eq!(record["result"]["body"]["id"], json!(payment), "{record}");
            assert_eq!(record["attempts"], 2, "{record}");
        } else {
            // Found: the lookup's answer is the result; the POST was never sent again.
            assert_eq!(record["result"]["body"]["data"][0]["id"], json!(payment), "{record}");
            assert_eq!(record["attempts"], 1, "{record}");
        }
    }
    assert!(*payments.lookups.lock() >= keys.len(), "one lookup per lost answer at least");
    assert_eq!(kafka::count_records(&bootstrap, &results).await, 2 * keys.len() as i64, "one result per input");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_that_cannot_reach_the_receiver_is_asked_again_by_the_reconciler() {
    reconciler_settles_once_the_lookups_are_back(false).await;
}

/// The same with the store on Kafka (`store.changelog`, transactional results, the by-key
/// hop): the reconciler settles only keys of the state partitions this instance holds, its
/// writes go to the changelog and its settlements out in the open transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_store_on_kafka_the_reconciler_settles_the_keys_it_holds() {
    reconciler_settles_once_the_lookups_are_back(true).await;
}

/// The lookups down while the commands run, then back; `on_kafka`: with `store.changelog`.
async fn reconciler_settles_once_the_lookups_are_back(on_kafka: bool) {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let (input, results, dlq) = (kafka::unique("ur-in"), kafka::unique("ur-results"), kafka::unique("ur-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, 2), (&results, 1), (&dlq, 1)]).await;
    let payments = Arc::new(Payments::default());
    payments.lookups_down.store(true, std::sync::atomic::Ordering::SeqCst);
    let (api, server) = start_payments(Arc::clone(&payments)).await;
    let keys: Vec<String> = vec!["charge-0".into(), "charge-1".into(), "lost-0".into()];
    produce_twice(&bootstrap, &input, &keys).await;

    let dir = KeptOnFailure::new();
    let (config_path, log) = (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"));
    let mut text = config(&bootstrap, (&input, &results, &dlq), &dir.path().join("store"), &api, &check_table(&api));
    if on_kafka {
        text = text.replacen("[kafka]\n", "[kafka]\ntransactional_results = true\n", 1).replacen(
            "[store]\n",
            "[store]\nchangelog = true\n",
            1,
        );
    }
    std::fs::write(&config_path, text).expect("config");
    let mut dedupd = DedupdProcess::run(&config_path, &log);
    let http = wait_for_http_addr(&log, &mut dedupd, Duration::from_secs(60)).await;
    // The lookups are down: each key's check cannot tell, so each is left in doubt.
    let published = kafka::read_all(&bootstrap, &results, 2 * keys.len(), Duration::from_secs(90)).await;
    assert_eq!(published.len(), 2 * keys.len(), "a result per input:\n{}", tail_of_file(&log, 40));
    for (key, outcomes) in outcomes_by_key(&published) {
        assert_eq!(outcomes, ["indeterminate", "indeterminate"], "{key}");
    }
    // The reconciler asks again every second while they are down, and nothing is POSTed.
    let asked = *payments.lookups.lock();
    let again = wait_until(Duration::from_secs(30), || *payments.lookups.lock() >= asked + 2 * keys.len()).await;
    assert!(again, "the reconciler asked again:\n{}", tail_of_file(&log, 40));
    assert!(payments.posts.lock().values().all(|n| *n == 1), "no second POST while in doubt");
    let in_doubt = gauge_once(&http, "dedupd_indeterminate_keys", keys.len() as f64, Duration::from_secs(30)).await;
    assert_eq!(in_doubt, Some(keys.len() as f64), "dedupd_indeterminate_keys{{sink=\"pay\"}}");
    // Within the check's deadline: the reconciler, not an operator, is on them.
    assert_eq!(gauge_once(&http, UNATTENDED, 0.0, Duration::ZERO).await, Some(0.0), "{UNATTENDED}");

    // Back up: the next pass settles every key and publishes each settlement.
    payments.lookups_down.store(false, std::sync::atomic::Ordering::SeqCst);
    let published = kafka::read_all(&bootstrap, &results, 3 * keys.len(), Duration::from_secs(60)).await;
    assert_eq!(published.len(), 3 * keys.len(), "a settlement per key:\n{}", tail_of_file(&log, 40));
    let in_doubt = gauge_once(&http, "dedupd_indeterminate_keys", 0.0, Duration::from_secs(30)).await;
    assert_eq!(in_doubt, Some(0.0), "dedupd_indeterminate_keys{{sink=\"pay\"}}");
    assert!(dedupd.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()), "dedupd did not stop cleanly");
    server.abort();

    let posts = payments.posts.lock().clone();
    for key in &keys {
        let lost = key.starts_with("lost-");
        assert_eq!(posts[key], if lost { 2 } else { 1 }, "{key}: POSTed again only when found absent ({posts:?})");
        let settlement = settlement_of(&published, key);
        assert_eq!(settlement["outcome"], "succeeded", "{settlement}");
        assert_eq!(settlement["source"]["topic"], json!(input), "the input in doubt: {settlement}");
        let record = inspect(&config_path, key);
        assert_eq!((&record["state"], &record["outcome"]), (&json!("completed"), &json!("succeeded")), "{record}");
        assert_eq!(record["attempts"], if lost { 2 } else { 1 }, "{record}");
        // What settled it, and when: the reconciler's check, after the lookups came back.
        let answer = if lost { "absent" } else { "found" };
        assert_eq!((&record["settled_by"], &record["check_answer"]), (&json!("check"), &json!(answer)), "{record}");
        assert!(record["settled_at"].as_str() > record["first_seen_at"].as_str(), "{record}");
    }
    // Nothing more on the topic (read whole: under transactions its offsets count markers too).
    let all = kafka::read_all(&bootstrap, &results, 3 * keys.len() + 1, Duration::from_secs(5)).await;
    assert_eq!(all.len(), 3 * keys.len(), "one settlement per key");
}

/// The one result of `key` settled by its check (`settled_by: "check"`).
fn settlement_of(results: &[rdkafka::message::OwnedMessage], key: &str) -> Value {
    use rdkafka::Message;
    let settled: Vec<Value> = results
        .iter()
        .map(|m| serde_json::from_slice::<Value>(m.payload().unwrap_or_default()).expect("result json"))
        .filter(|v| v["key"] == key && v["settled_by"] == "check")
        .collect();
    assert_eq!(settled.len(), 1, "{key}: {settled:?}");
    settled[0].clone()
}

/// The reconciler's own run killed during its call (SIGKILL at crash point `sink.call`,
/// its claim durable): the claim keeps the command, so the next start takes it up as a key
/// in doubt, checks it, and POSTs only because the lookup found no payment. One payment in
/// all, the key completed, nothing left in doubt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_during_the_reconcilers_own_call_is_checked_at_the_next_start() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let (input, results, dlq) = (kafka::unique("uk-in"), kafka::unique("uk-results"), kafka::unique("uk-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, 1), (&results, 1), (&dlq, 1)]).await;
    let payments = Arc::new(Payments::default());
    payments.lookups_down.store(true, std::sync::atomic::Ordering::SeqCst);
    let (api, server) = start_payments(Arc::clone(&payments)).await;
    let key = "lost-0".to_string();
    produce_twice(&bootstrap, &input, std::slice::from_ref(&key)).await;

    let dir = KeptOnFailure::new();
    let (config_path, log) = (dir.path().join("dedupd.toml"), dir.path().join("dedupd.log"));
    let text = config(&bootstrap, (&input, &results, &dlq), &dir.path().join("store"), &api, &check_table(&api));
    std::fs::write(&config_path, text).expect("config");
    let config_arg = config_path.to_str().expect("utf-8");
    // The first call passes (its answer lost, the lookups down: indeterminate); the next,
    // the reconciler's, is killed as it starts.
    let env = [("FAILPOINTS", "sink.call=1*off->return")];
    let mut first = DedupdProcess::spawn_with_env(&["run", "-c", config_arg], &env, &log);
    let published = kafka::read_all(&bootstrap, &results, 2, Duration::from_secs(90)).await;
    assert_eq!(outcomes_by_key(&published)[&key], ["indeterminate", "indeterminate"], "{}", tail_of_file(&log, 40));
    payments.lookups_down.store(false, std::sync::atomic::Ordering::SeqCst);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while first.exited().is_none() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(first.exited().is_some(), "the reconciler's call reached the crash point:\n{}", tail_of_file(&log, 40));
    let left = inspect(&config_path, &key);
    assert_eq!(
        (&left["state"], &left["sink"], &left["attempts"]),
        (&json!("in_progress"), &json!("pay"), &json!(2)),
        "{left}"
    );
    assert_eq!(payments.posts.lock()[&key], 1, "killed before its request left");

    let mut second = DedupdProcess::run(&config_path, &log);
    let http = wait_for_http_addr(&log, &mut second, Duration::from_secs(60)).await;
    let paid = wait_until(Duration::from_secs(60), || payments.made.lock().contains_key("ref-lost-0")).await;
    assert!(paid, "the next start took the claim up:\n{}", tail_of_file(&log, 40));
    let in_doubt = gauge_once(&http, "dedupd_indeterminate_keys", 0.0, Duration::from_secs(30)).await;
    assert_eq!(in_doubt, Some(0.0), "dedupd_indeterminate_keys{{sink=\"pay\"}}");
    assert!(second.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()), "dedupd did not stop cleanly");
    server.abort();

    assert_eq!(payments.posts.lock()[&key], 2, "POSTed again only once the lookup found nothing");
    let record = inspect(&config_path, &key);
    assert_eq!((&record["state"], &record["outcome"]), (&json!("completed"), &json!("succeeded")), "{record}");
    assert_eq!((&record["settled_by"], &record["check_answer"]), (&json!("check"), &json!("absent")), "{record}");
    assert_eq!(record["result"]["body"]["id"], json!(payments.made.lock()["ref-lost-0"]), "{record}");
}
