//! `dedupd keys`: the records matching a filter, one JSON document per line on stdout, as
//! they are read (a store of millions lists without holding them): from a stopped
//! instance's store, or from a running one through `GET /v1/keys`.

use std::io::{ErrorKind, Write};

use clap::Args;
use futures::StreamExt;
use reqwest::Method;

use super::CliError;
use super::direct::Direct;
use super::remote::{Remote, check};
use crate::engine::{Clock, SystemClock};
use crate::store::{KeysQuery, TransferError};

/// Which records to list: every filter given must hold.
#[derive(Debug, Clone, Args)]
pub struct KeysArgs {
    /// Only records in this state.
    #[arg(long, value_parser = ["in_progress", "completed", "indeterminate"])]
    pub state: Option<String>,
    /// Only records of this route (known only to `indeterminate` records, which keep the
    /// command in doubt).
    #[arg(long)]
    pub route: Option<String>,
    /// Only records of this sink (known as the route is).
    #[arg(long)]
    pub sink: Option<String>,
    /// Only records that took their state (claimed, or completed) at or after this RFC 3339
    /// instant, e.g. 2026-12-07T10:00:00Z.
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// ... and before this one.
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
}

impl KeysArgs {
    /// The filter in words, as the admin API takes it.
    fn query(&self) -> KeysQuery {
        KeysQuery {
            state: self.state.clone(),
            route: self.route.clone(),
            sink: self.sink.clone(),
            since: self.since.clone(),
            until: self.until.clone(),
        }
    }
}

/// Lists the matching records of the stopped store `d` on stdout.
pub fn list_direct(d: &Direct, args: &KeysArgs) -> Result<(), CliError> {
    let filter = args.query().filter().map_err(|e| CliError::Other(format!("--{e}")))?;
    let mut out = std::io::stdout().lock();
    match d.store.list_keys(&filter, SystemClock.now_ms(), &mut out) {
        Ok(_) => Ok(()),
        Err(TransferError::Io(e)) => closed_or(e),
        Err(e) => Err(e.into()),
    }
}

/// Lists the matching records of a running instance on stdout, through `GET /v1/keys`.
pub async fn list_remote(r: &Remote, args: &KeysArgs) -> Result<(), CliError> {
    let query = args.query();
    // Refused here as the direct path refuses it, before any request.
    query.filter().map_err(|e| CliError::Other(format!("--{e}")))?;
    let mut out = std::io::stdout().lock();
    let mut written = Ok(());
    stream_remote(r, &query, &mut |chunk| {
        written = out.write_all(chunk);
        written.is_ok()
    })
    .await?;
    written.and_then(|()| out.flush()).or_else(closed_or)
}

/// The keys of a running instance's records matching `query`, in key order.
pub async fn keys_remote(r: &Remote, query: &KeysQuery) -> Result<Vec<String>, CliError> {
    let mut text = Vec::new();
    stream_remote(r, query, &mut |chunk| {
        text.extend_from_slice(chunk);
        true
    })
    .await?;
    text.split(|b| *b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| {
            let record: serde_json::Value = serde_json::from_slice(line)
                .map_err(|e| CliError::Remote(format!("a listed record is not JSON: {e}")))?;
            record["key"]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| CliError::Remote("a listed record has no key".into()))
        })
        .collect()
}

/// `GET /v1/keys` with `query`, handing each chunk of the answer to `each` until it says
/// stop.
async fn stream_remote(r: &Remote, query: &KeysQuery, each: &mut dyn FnMut(&[u8]) -> bool) -> Result<(), CliError> {
    let mut url = r.url(&["keys"])?;
    url.query_pairs_mut().extend_pairs(query.pairs());
    let response = r.request(Method::GET, url).send().await.map_err(|e| CliError::Remote(e.to_string()))?;
    let mut stream = check(response).await?.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| CliError::Remote(format!("the listing was cut: {e}")))?;
        if !each(&chunk) {
            break;
        }
    }
    Ok(())
}

/// A closed stdout ends the listing quietly (`dedupd keys | head`); any other write error
/// is one.
fn closed_or(e: std::io::Error) -> Result<(), CliError> {
    if e.kind() == ErrorKind::BrokenPipe { Ok(()) } else { Err(CliError::Stdout(e)) }
}
