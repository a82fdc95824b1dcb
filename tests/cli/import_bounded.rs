//! An import reads lines of at most `MAX_LINE_BYTES` (docs/admin.md, "Import"): a stream
//! with a longer line, more than any record makes, is refused naming the line, after reading
//! no more than the bound of it, and nothing is imported: with the real `dedupd import` on a
//! stopped store (`-c`), and through `POST /v1/import` of an admin API on 127.0.0.1.
//!
//! Run with `cargo test --test cli import_bounded::`.

use crate::common;

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::admin::Server;
use dedupd::store::transfer::{MAX_LINE_BYTES, end_line, header_line};
use dedupd::store::{KeyStore, StoreBackend, SyncMode};

const TOKEN: &str = "import-bounded-token-0123456789";

/// An export whose line 2 is one byte longer than the bound (a `{` after another).
fn with_an_overlong_line(path: &Path) {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).expect("create"));
    writeln!(file, "{}", header_line(1, "fjall", 1)).expect("write");
    let chunk = vec![b'{'; 1 << 20];
    let mut left = MAX_LINE_BYTES + 1;
    while left > 0 {
        let n = left.min(chunk.len());
        file.write_all(&chunk[..n]).expect("write");
        left -= n;
    }
    writeln!(file, "\n{}", end_line(0, 0)).expect("write");
    file.flush().expect("flush");
}

#[tokio::test]
async fn a_line_longer_than_any_record_is_refused_by_number_through_the_cli_and_the_admin_api() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("overlong.jsonl");
    with_an_overlong_line(&file);
    let want = format!("line 2: longer than {MAX_LINE_BYTES} bytes");

    // The CLI on a stopped store: refused before anything is written.
    let store_path = dir.path().join("store");
    let config = dir.path().join("dedupd.toml");
    std::fs::write(&config, format!("[store]\npath = {store_path:?}\n")).expect("config");
    let mut cli = tokio::process::Command::new(env!("CARGO_BIN_EXE_dedupd"));
    cli.args(["import", file.to_str().expect("utf-8"), "-c", config.to_str().expect("utf-8")]);
    let out = tokio::time::timeout(Duration::from_secs(60), cli.output()).await.expect("within a minute").expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&want), "{stderr}");

    // The admin API, streamed the same bytes: a 400 naming the line; the store unchanged.
    let store = Arc::new(KeyStore::open(StoreBackend::Fjall, &dir.path().join("api"), SyncMode::Batch).expect("open"));
    let server = Server::start(Some(common::admin::api(&store, TOKEN))).await;
    let body = tokio_util::io::ReaderStream::new(tokio::fs::File::open(&file).await.expect("open"));
    let response = reqwest::Client::new()
        .post(format!("{}/v1/import", server.base))
        .bearer_auth(TOKEN)
        .body(reqwest::Body::wrap_stream(body))
        .send();
    let response =
        tokio::time::timeout(Duration::from_secs(60), response).await.expect("within a minute").expect("sent");
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    assert_eq!(status, reqwest::StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains(&want), "{text}");
    assert_eq!(store.counts(), Default::default(), "nothing imported");
    server.stop().await;
}
