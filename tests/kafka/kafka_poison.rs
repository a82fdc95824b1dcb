//! A poison record on a real broker: a header whose name is not UTF-8 (any C or Go
//! producer can write one) must not stop its partition. The record is processed with that
//! header ignored, and the commands behind it on the same partition all run.
//!
//! Run with `DEDUPD_REQUIRE_KAFKA=1 scripts/kafka/kafka.sh with cargo test --test kafka kafka_poison::`.
//! Without a broker each test prints "skipped: no broker" and passes.

use crate::common;

use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::time::Duration;

use common::kafka;
use common::process::{DedupdProcess, KeptOnFailure, tail_of_file};
use rdkafka::ClientConfig;
use rdkafka::bindings as rd;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, Producer};
use serde_json::{Value, json};

/// Commands produced behind the poison record, on the same partition.
const BEHIND: usize = 20;

/// Produces one record to partition 0 of `topic` with a header whose name is the raw bytes
/// `name` (rdkafka's safe API takes `&str` names only, so this goes through librdkafka's
/// `rd_kafka_produceva`, which takes a C string), and waits for it to be acknowledged.
fn produce_with_raw_header_name(bootstrap: &str, topic: &str, value: &[u8], name: &[u8]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()
        .expect("producer");
    let topic = CString::new(topic).expect("topic name");
    let name = CString::new(name).expect("header name without NUL");
    let header_value = b"poison";
    let part = |vtype, u| rd::rd_kafka_vu_t { vtype, u };
    let vus = [
        part(rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_TOPIC, rd::rd_kafka_vu_s__bindgen_ty_1 { cstr: topic.as_ptr() }),
        part(rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_PARTITION, rd::rd_kafka_vu_s__bindgen_ty_1 { i32_: 0 }),
        part(
            rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_VALUE,
            rd::rd_kafka_vu_s__bindgen_ty_1 {
                mem: rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                    ptr: value.as_ptr() as *mut c_void,
                    size: value.len(),
                },
            },
        ),
        part(
            rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_HEADER,
            rd::rd_kafka_vu_s__bindgen_ty_1 {
                header: rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_2 {
                    name: name.as_ptr(),
                    val: header_value.as_ptr() as *const c_void,
                    size: header_value.len() as isize,
                },
            },
        ),
    ];
    // SAFETY: every pointer in `vus` points into a live local (`topic`, `name`, `value`,
    // `header_value`) for the duration of the call. Without RD_KAFKA_MSG_F_COPY librdkafka
    // keeps the value pointer until delivery: `flush` below waits for it while `value` lives.
    let error = unsafe { rd::rd_kafka_produceva(producer.client().native_ptr(), vus.as_ptr(), vus.len()) };
    assert!(error.is_null(), "rd_kafka_produceva refused the record");
    producer.flush(Duration::from_secs(30)).expect("poison record acknowledged");
}

fn command(id: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"id": id, "type": "order.ship", "payload": {"id": id}})).expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_name_that_is_not_utf8_stops_nothing() {
    let Some(bootstrap) = kafka::bootstrap() else { return };
    let (input, results, dlq) = (kafka::unique("kp-in"), kafka::unique("kp-results"), kafka::unique("kp-dlq"));
    kafka::create_topics(&bootstrap, &[(&input, 1), (&results, 1), (&dlq, 1)]).await;

    let (b, t) = (bootstrap.clone(), input.clone());
    tokio::task::spawn_blocking(move || produce_with_raw_header_name(&b, &t, &command("poison"), &[0xff, 0xfe]))
        .await
        .expect("produce task");
    let behind: Vec<kafka::OutgoingTo> =
        (0..BEHIND).map(|i| (format!("k-{i}"), command(&format!("cmd-{i}")), vec![], Some(0))).collect();
    kafka::produce_all_to(&bootstrap, &input, behind).await;

    let mut dir = KeptOnFailure::new();
    let config_path = dir.path().join("dedupd.toml");
    let log_path = dir.path().join("dedupd.log");
    let store = dir.path().join("store");
    let group = kafka::unique("kp-group");
    std::fs::write(
        &config_path,
        format!(
            "{kafka_table}\n[store]\npath = {store:?}\n\n[sinks.out]\nkind = \"log\"\n\n\
             [[routes]]\ntypes = [\"order.*\"]\nsink = \"out\"\n\n[http]\nlisten = \"127.0.0.1:0\"\n",
            kafka_table = kafka::kafka_table(&bootstrap, &group, &input, &results, &dlq)
        ),
    )
    .expect("write config");

    let mut child = DedupdProcess::run(&config_path, &log_path);
    let got = kafka::read_all(&bootstrap, &results, BEHIND + 1, Duration::from_secs(90)).await;
    let exited = child.terminate(Duration::from_secs(30));
    let outcomes: HashMap<String, String> = got
        .iter()
        .map(|m| {
            let r: Value = serde_json::from_slice(m.payload().expect("result")).expect("result json");
            (r["key"].as_str().unwrap_or("").to_string(), r["outcome"].as_str().unwrap_or("").to_string())
        })
        .collect();
    if got.len() != BEHIND + 1 {
        let kept = dir.keep();
        panic!(
            "{} of {} results (exit {exited:?}, kept {}): {outcomes:?}; log tail:\n{}",
            got.len(),
            BEHIND + 1,
            kept.display(),
            tail_of_file(&log_path, 40)
        );
    }
    // The poison record itself is a valid command: processed, its unreadable header ignored.
    assert_eq!(outcomes.get("poison").map(String::as_str), Some("succeeded"), "{outcomes:?}");
    for i in 0..BEHIND {
        assert_eq!(outcomes.get(&format!("cmd-{i}")).map(String::as_str), Some("succeeded"), "{outcomes:?}");
    }
    assert_eq!(kafka::count_records(&bootstrap, &dlq).await, 0, "nothing dead-lettered");
}
