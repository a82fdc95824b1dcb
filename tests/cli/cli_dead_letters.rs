//! `dedupd dead-letters replay` on a real broker: dead letters written by the real pipeline
//! (`no_route`, `invalid_json`) and one stand-in are replayed to the input topic with their
//! original key, value and headers, once each: the count comes first and nothing is written
//! without `--yes`, `--reason` selects, a second run replays nothing again (the marks), and
//! a stand-in is reported and skipped. What the topics hold afterwards is checked, not
//! only what the command printed; bad arguments and an unreachable cluster exit 2.
//!
//! Run with `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --features
//! failpoints --test cli cli_dead_letters::`. Without a broker each test prints "skipped: no
//! broker" and passes.

use crate::common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::kafka;
use common::process::{DedupdProcess, KeptOnFailure, tail_of_file};
use rdkafka::ClientConfig;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use serde_json::{Value, json};

/// How long one CLI run may take.
const CLI_TIMEOUT: Duration = Duration::from_secs(120);

/// `dedupd ARGS...` with no `DEDUPD_*` variables from the test's environment, bounded in
/// time: its exit code, stdout and stderr.
async fn dedupd(args: &[&str]) -> (i32, String, String) {
    dedupd_with_env(args, &[]).await
}

/// [`dedupd`] with `env` set (`FAILPOINTS`); a process killed by a signal exits -1 here.
async fn dedupd_with_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_dedupd"));
    cmd.args(args).stdin(Stdio::null()).kill_on_drop(true);
    for (k, _) in std::env::vars() {
        if k.starts_with("DEDUPD_") || k == "FAILPOINTS" {
            cmd.env_remove(&k);
        }
    }
    cmd.envs(env.iter().copied());
    let out = tokio::time::timeout(CLI_TIMEOUT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("dedupd {args:?} did not end within {CLI_TIMEOUT:?}"))
        .expect("run dedupd");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

fn command(id: &str, kind: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"id": id, "type": kind, "payload": {"id": id}})).expect("json")
}

/// The record's headers as (name, value) text pairs, in order.
fn headers_of(m: &OwnedMessage) -> Vec<(String, String)> {
    m.headers()
        .map(|h| {
            h.iter()
                .map(|h| (h.key.to_string(), String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// A stand-in as publish.rs writes one for a copy too large: reason headers and the size,
/// no key, no value.
async fn produce_stand_in(bootstrap: &str, dlq: &str, source: &str) {
    let producer: FutureProducer = ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("producer");
    let headers = OwnedHeaders::new()
        .insert(Header { key: "dedupd-reason", value: Some("too_large") })
        .insert(Header { key: "dedupd-error", value: Some("the command is larger than limits.max_command_bytes") })
        .insert(Header { key: "dedupd-source", value: Some(source) })
        .insert(Header { key: "dedupd-original-size", value: Some("5000000") });
    let record = FutureRecord::<[u8], [u8]>::to(dlq).partition(0).headers(headers);
    producer.send(record, Duration::from_secs(30)).await.map_err(|(e, _)| e).expect("stand-in produced");
}

/// The lines of stdout as JSON.
fn json_lines(stdout: &str) -> Vec<Value> {
    stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}"))).collect()
}

/// The records of `topic` that are replays (carry `dedupd-replay-of`).
async fn replays_in(bootstrap: &str, topic: &str) -> Vec<OwnedMessage> {
    let all = kafka::read_to_end(bootstrap, topic, "read_committed").await;
    all.into_iter().filter(|m| kafka::header(m, "dedupd-replay-of").is_some()).collect()
}

struct Setup {
    bootstrap: String,
    input: String,
    dlq: String,
    config: String,
    _dir: KeptOnFailure,
}

/// Topics, a config, and the real pipeline run over five records: two commands that run
/// and three it dead-letters (two `no_route`, one with a header, and an `invalid_json` with
/// headers); plus a stand-in in the dead-letter topic.
async fn setup(bootstrap: String) -> Setup {
    let (input, results, dlq) = (kafka::unique("dl-in"), kafka::unique("dl-results"), kafka::unique("dl-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, 1), (&results, 1), (&dlq, 2)]).await;
    let records: Vec<kafka::OutgoingTo> = vec![
        ("ok-0".into(), command("ok-0", "order.ship"), vec![], None),
        ("nr-1".into(), command("nr-1", "invoice.send"), vec![("trace-id".into(), "t-1".into())], None),
        ("ok-1".into(), command("ok-1", "order.ship"), vec![], None),
        (
            "bad-1".into(),
            b"not json {".to_vec(),
            vec![("origin".into(), "legacy".into()), ("x".into(), "y".into())],
            None,
        ),
        ("nr-2".into(), command("nr-2", "invoice.send"), vec![], None),
    ];
    kafka::produce_all_to(&bootstrap, &input, records).await;

    let mut dir = KeptOnFailure::new();
    let config_path = dir.path().join("dedupd.toml");
    let log_path = dir.path().join("dedupd.log");
    let store = dir.path().join("store");
    let group = kafka::unique("dl-group");
    std::fs::write(
        &config_path,
        format!(
            "{kafka_table}connect_timeout = \"20s\"\n\n[store]\npath = {store:?}\n\n[sinks.out]\nkind = \"log\"\n\n\
             [[routes]]\ntypes = [\"order.*\"]\nsink = \"out\"\n\n[http]\nlisten = \"127.0.0.1:0\"\n",
            kafka_table = kafka::kafka_table(&bootstrap, &group, &input, &results, &dlq)
        ),
    )
    .expect("write config");
    let mut child = DedupdProcess::run(&config_path, &log_path);
    let got = kafka::read_all(&bootstrap, &results, 5, Duration::from_secs(90)).await;
    let exited = child.terminate(Duration::from_secs(30));
    if got.len() != 5 {
        let kept = dir.keep();
        panic!(
            "{} of 5 results (exit {exited:?}, kept {}); log:\n{}",
            got.len(),
            kept.display(),
            tail_of_file(&log_path, 40)
        );
    }
    assert_eq!(kafka::count_records(&bootstrap, &dlq).await, 3, "the pipeline dead-lettered three records");
    produce_stand_in(&bootstrap, &dlq, &format!("{input}/0/99")).await;
    let config = config_path.to_str().expect("utf-8 path").to_string();
    Setup { bootstrap, input, dlq, config, _dir: dir }
}

/// The dead letters the pipeline wrote, by their Kafka key.
async fn dead_letters(s: &Setup) -> Vec<OwnedMessage> {
    let all = kafka::read_to_end(&s.bootstrap, &s.dlq, "read_committed").await;
    all.into_iter().filter(|m| kafka::header(m, "dedupd-reason").is_some() && m.payload().is_some()).collect()
}

/// Each replayed record is its dead letter's input as it was: key, value, the input's own
/// headers and then `dedupd-replay-of` naming the dead letter; and each dead letter is
/// replayed exactly once.
fn assert_replays_are_the_inputs(replays: &[OwnedMessage], letters: &[&OwnedMessage], dlq: &str) {
    assert_eq!(replays.len(), letters.len(), "one replay per dead letter");
    for letter in letters {
        let of = format!("{dlq}/{}/{}", letter.partition(), letter.offset());
        let copies: Vec<&OwnedMessage> =
            replays.iter().filter(|r| kafka::header(r, "dedupd-replay-of").as_deref() == Some(of.as_str())).collect();
        assert_eq!(copies.len(), 1, "{of} replayed once");
        let replay = copies[0];
        assert_eq!(replay.key(), letter.key(), "{of}: key");
        assert_eq!(replay.payload(), letter.payload(), "{of}: value");
        let mut want: Vec<(String, String)> =
            headers_of(letter).into_iter().filter(|(k, _)| !k.starts_with("dedupd-")).collect();
        want.push(("dedupd-replay-of".into(), of.clone()));
        assert_eq!(headers_of(replay), want, "{of}: headers");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_replayed_once_each_with_their_original_record() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let s = setup(bootstrap).await;
    let letters = dead_letters(&s).await;
    let by_reason = |reason: &str| -> Vec<&OwnedMessage> {
        letters.iter().filter(|m| kafka::header(m, "dedupd-reason").as_deref() == Some(reason)).collect()
    };
    let (no_route, invalid) = (by_reason("no_route"), by_reason("invalid_json"));
    assert_eq!((no_route.len(), invalid.len()), (2, 1), "what the pipeline dead-lettered");
    let input_before = kafka::read_to_end(&s.bootstrap, &s.input, "read_committed").await.len();

    // The count first; nothing written without --yes.
    let (code, out, err) = dedupd(&["dead-letters", "replay", "-c", &s.config, "--reason", "no_route"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("2 dead letter(s) match; nothing replayed: add --yes"), "{err}");
    assert_eq!(kafka::read_to_end(&s.bootstrap, &s.input, "read_committed").await.len(), input_before);

    // --reason selects: only the two no_route letters.
    let (code, out, err) = dedupd(&["dead-letters", "replay", "-c", &s.config, "--reason", "no_route", "--yes"]).await;
    assert_eq!(code, 0, "{err}\n{out}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 2, "{out}");
    for line in &lines {
        assert_eq!(line["reason"], "no_route", "{line}");
        assert_eq!(line["to"]["topic"], s.input.as_str(), "{line}");
        assert!(line.get("error").is_none(), "{line}");
    }
    assert_replays_are_the_inputs(&replays_in(&s.bootstrap, &s.input).await, &no_route, &s.dlq);

    // Every reason now: the no_route ones are marked, so only invalid_json goes; the
    // stand-in is reported and skipped.
    let (code, out, err) = dedupd(&["dead-letters", "replay", "-c", &s.config, "--yes"]).await;
    assert_eq!(code, 0, "{err}\n{out}");
    assert!(err.contains("1 dead letter(s) match: replay each (2 already replayed, skipped; 1 stand-in(s)"), "{err}");
    let lines = json_lines(&out);
    let replayed: Vec<&Value> = lines.iter().filter(|l| l.get("to").is_some()).collect();
    let skipped: Vec<&Value> = lines.iter().filter(|l| l.get("skipped").is_some()).collect();
    assert_eq!((replayed.len(), skipped.len(), lines.len()), (1, 1, 2), "{out}");
    assert_eq!(replayed[0]["reason"], "invalid_json");
    assert_eq!(skipped[0]["reason"], "too_large");
    assert_eq!(skipped[0]["source"], format!("{}/0/99", s.input));
    let all: Vec<&OwnedMessage> = no_route.iter().chain(invalid.iter()).copied().collect();
    assert_replays_are_the_inputs(&replays_in(&s.bootstrap, &s.input).await, &all, &s.dlq);

    // Again: nothing is replayed twice; the input topic holds exactly one copy of each.
    let input_now = kafka::read_to_end(&s.bootstrap, &s.input, "read_committed").await.len();
    assert_eq!(input_now, input_before + 3);
    let (code, out, err) = dedupd(&["dead-letters", "replay", "-c", &s.config, "--yes"]).await;
    assert_eq!(code, 0, "{err}\n{out}");
    assert!(err.contains("0 dead letter(s) match: replay each (3 already replayed, skipped"), "{err}");
    assert!(json_lines(&out).iter().all(|l| l.get("to").is_none()), "{out}");
    assert_eq!(kafka::read_to_end(&s.bootstrap, &s.input, "read_committed").await.len(), input_now);
    assert_replays_are_the_inputs(&replays_in(&s.bootstrap, &s.input).await, &all, &s.dlq);

    // The marks: one per replay, on its dead letter's partition, naming it.
    let marks: Vec<OwnedMessage> = kafka::read_to_end(&s.bootstrap, &s.dlq, "read_committed")
        .await
        .into_iter()
        .filter(|m| m.key() == Some(b"dedupd-replayed".as_slice()))
        .collect();
    assert_eq!(marks.len(), 3, "one mark per replay");
    for letter in &all {
        let of = format!("{}/{}/{}", s.dlq, letter.partition(), letter.offset());
        let mark = marks.iter().find(|m| kafka::header(m, "dedupd-replayed-of").as_deref() == Some(of.as_str()));
        assert_eq!(mark.map(Message::partition), Some(letter.partition()), "{of} marked on its partition");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn since_to_and_errors() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let s = setup(bootstrap).await;
    let other = kafka::unique("dl-other");
    kafka::create_topics(&s.bootstrap, &[(&other, 1)]).await;

    // A --since after every dead letter selects none.
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let (code, _, err) = dedupd(&["dead-letters", "replay", "-c", &s.config, "--since", &later, "--yes"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("0 dead letter(s) match"), "{err}");

    // --to: every letter since an hour ago to another topic.
    let earlier = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    let (code, out, err) =
        dedupd(&["dead-letters", "replay", "-c", &s.config, "--since", &earlier, "--to", &other, "--yes"]).await;
    assert_eq!(code, 0, "{err}\n{out}");
    let letters = dead_letters(&s).await;
    let letters: Vec<&OwnedMessage> = letters.iter().collect();
    assert_replays_are_the_inputs(&replays_in(&s.bootstrap, &other).await, &letters, &s.dlq);
    assert!(replays_in(&s.bootstrap, &s.input).await.is_empty(), "nothing went to the input topic");

    // Errors: exit 2 naming the cause, nothing written.
    let (code, _, err) = dedupd(&["dead-letters", "replay", "-c", &s.config, "--since", "yesterday"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--since yesterday: not an RFC 3339 instant"), "{err}");
    let (code, _, err) = dedupd(&["dead-letters", "replay", "-c", &s.config, "--to", "no-such-topic", "--yes"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--to: topic no-such-topic does not exist"), "{err}");
    let (code, _, err) = dedupd(&["dead-letters", "replay", "--yes"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("-c FILE"), "{err}");

    // No broker: the cause named within connect_timeout.
    let unreachable = Path::new(&s.config).with_file_name("unreachable.toml");
    let text = std::fs::read_to_string(&s.config).expect("config");
    let text =
        text.replace(&s.bootstrap, "127.0.0.1:1").replace("connect_timeout = \"20s\"", "connect_timeout = \"3s\"");
    std::fs::write(&unreachable, text).expect("write config");
    let started = Instant::now();
    let (code, _, err) = dedupd(&["dead-letters", "replay", "-c", unreachable.to_str().expect("utf-8"), "--yes"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("127.0.0.1:1"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
}

/// A dead letter in a transaction still open when the replay reads (as the pipeline's are
/// under `kafka.transactional_results`): the read waits for it, since a mark behind it
/// would be missed, and names it when it stays open past `kafka.connect_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_transaction_on_the_dead_letter_topic_is_waited_for() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let s = setup(bootstrap).await;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &s.bootstrap)
        .set("transactional.id", kafka::unique("dl-open"))
        .create()
        .expect("transactional producer");
    let source = format!("{}/0/77", s.input);
    tokio::task::block_in_place(|| {
        producer.init_transactions(Duration::from_secs(30)).expect("init");
        producer.begin_transaction().expect("begin");
    });
    let headers = OwnedHeaders::new()
        .insert(Header { key: "dedupd-reason", value: Some("no_route") })
        .insert(Header { key: "dedupd-error", value: Some("no route") })
        .insert(Header { key: "dedupd-source", value: Some(source.as_str()) });
    let value = command("late-1", "invoice.send");
    let record = FutureRecord::<[u8], [u8]>::to(&s.dlq).partition(1).key(b"late-1").payload(&value).headers(headers);
    producer.send(record, Duration::from_secs(30)).await.map_err(|(e, _)| e).expect("late letter sent");

    // Held past connect_timeout: exit 2 naming why, nothing replayed.
    let short = Path::new(&s.config).with_file_name("short.toml");
    let text = std::fs::read_to_string(&s.config).expect("config");
    std::fs::write(&short, text.replace("connect_timeout = \"20s\"", "connect_timeout = \"3s\"")).expect("write");
    let (code, out, err) =
        dedupd(&["dead-letters", "replay", "-c", short.to_str().expect("utf-8"), "--reason", "no_route", "--yes"])
            .await;
    assert_eq!(code, 2, "{err}\n{out}");
    assert!(err.contains("a transaction open on them"), "{err}");
    assert!(replays_in(&s.bootstrap, &s.input).await.is_empty(), "nothing replayed");

    // Committed while a replay waits: the replay reads it and replays it with the others.
    let committer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        tokio::task::block_in_place(|| producer.commit_transaction(Duration::from_secs(30))).expect("commit");
    });
    let (code, out, err) = dedupd(&["dead-letters", "replay", "-c", &s.config, "--reason", "no_route", "--yes"]).await;
    committer.await.expect("committer");
    assert_eq!(code, 0, "{err}\n{out}");
    assert!(err.contains("3 dead letter(s) match: replay each"), "{err}");
    let replays = replays_in(&s.bootstrap, &s.input).await;
    assert_eq!(replays.len(), 3, "the two from the pipeline and the late one");
    assert!(replays.iter().any(|r| r.key() == Some(b"late-1".as_slice())), "the late one replayed");
}

/// Killed between a replay's writes and its commit (crash point `replay.delivered`): the
/// replayed record and its mark are aborted together, so the next run replays that dead
/// letter, and a `read_committed` reader sees exactly one copy of each.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_killed_before_its_commit_leaves_neither_record_nor_mark() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let s = setup(bootstrap).await;
    let args = ["dead-letters", "replay", "-c", s.config.as_str(), "--reason", "no_route", "--yes"];
    // The first replay passes, the second is killed with both its records delivered.
    let (code, out, err) = dedupd_with_env(&args, &[("FAILPOINTS", "replay.delivered=1*off->return")]).await;
    assert_eq!(code, -1, "killed at the crash point: {err}\n{out}");
    let uncommitted = kafka::read_to_end(&s.bootstrap, &s.input, "read_uncommitted").await;
    let written = uncommitted.iter().filter(|m| kafka::header(m, "dedupd-replay-of").is_some()).count();
    assert_eq!(written, 2, "both replays reached the broker, the second in a transaction left open");

    // The next run takes the transactional id (aborting the open transaction) and replays
    // only the one whose mark did not commit.
    let (code, out, err) = dedupd(&args).await;
    assert_eq!(code, 0, "{err}\n{out}");
    assert!(err.contains("1 dead letter(s) match: replay each (1 already replayed, skipped)"), "{err}");
    let letters = dead_letters(&s).await;
    let no_route: Vec<&OwnedMessage> =
        letters.iter().filter(|m| kafka::header(m, "dedupd-reason").as_deref() == Some("no_route")).collect();
    assert_replays_are_the_inputs(&replays_in(&s.bootstrap, &s.input).await, &no_route, &s.dlq);
    let marks = kafka::read_to_end(&s.bootstrap, &s.dlq, "read_committed")
        .await
        .into_iter()
        .filter(|m| kafka::header(m, "dedupd-replayed-of").is_some())
        .count();
    assert_eq!(marks, 2, "one committed mark per dead letter");
}
