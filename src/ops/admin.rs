//! The admin API (docs/contract.md §9; routes, status codes and formats in docs/admin.md).
//!
//! Mounted on the ops listener only when `http.admin_token` is set; without it every
//! `/v1/...` path answers 404 saying the API is off. Every route needs
//! `Authorization: Bearer TOKEN`; the token is compared in constant time (over SHA-256
//! digests, so neither its bytes nor its length leak through timing). Store calls block
//! (sled, fjall), so each runs on the blocking pool.
//!
//! A key is a path segment (`/v1/keys/{key}`) or, for any key, a query parameter
//! (`/v1/keys?key=K`, `/v1/resolve?key=K`): the keys `.` and `..` are valid, but URL
//! parsers remove them as path segments even percent-encoded (`%2E` is a dot segment too),
//! so no client can send them in the path.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use futures::TryStreamExt;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::metrics::Metrics;
use super::settle::{self, SettleError};
use crate::sinks::Sink;
use crate::store::transfer::ImportOptions;
use crate::store::{
    Completion, ForgetError, KeyStore, KeysQuery, ResolveError, StoreError, TransferError, record_json,
};
use crate::time::{Clock, SystemClock};

/// What the admin routes need.
#[derive(Clone)]
pub struct AdminApi {
    /// The running instance's store.
    pub store: Arc<KeyStore>,
    /// `http.admin_token`.
    pub token: String,
    /// How long a record resolved by an operator is kept (`store.default_ttl`).
    pub resolve_ttl: Duration,
    /// Expired records removed per compaction chunk (`store.compaction_chunk`).
    pub compaction_chunk: usize,
    /// What `/v1/status` shows: set by `dedupd run`; without it the route answers 404.
    pub status: Option<super::StatusSources>,
    /// With several instances (`store.changelog`): whether this one may change a key now.
    pub owner: Option<Arc<dyn KeyOwner>>,
    /// The engine's sinks by name, for `resolve --check`: weak, so that the engine alone
    /// keeps them (and drops them when it stops).
    pub sinks: HashMap<String, Weak<Sink>>,
}

/// Says whether this instance may change a key's record now. With the store on Kafka a key
/// belongs to one state partition, and only the instance that holds it (restored) may
/// write it: a write elsewhere would reach the changelog but not the owner's copy, which
/// goes on deciding from the old record.
pub trait KeyOwner: Send + Sync {
    /// `Ok` when this instance holds `key`'s state partition, else why not (for the answer).
    fn check(&self, key: &str) -> Result<(), String>;
}

/// Refuses a write to a key this instance does not own: 421 Misdirected Request.
fn check_owner(a: &AdminApi, key: &str) -> Result<(), ApiError> {
    match &a.owner {
        Some(owner) => owner.check(key).map_err(|why| ApiError::new(StatusCode::MISDIRECTED_REQUEST, why)),
        None => Ok(()),
    }
}

/// An error answer: the status and `{"error": "..."}`.
struct ApiError {
    status: StatusCode,
    message: String,
    challenge: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), challenge: None }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(serde_json::json!({"error": self.message}))).into_response();
        if let Some(c) = self.challenge {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(c));
        }
        r
    }
}

type ApiResult = Result<Response, ApiError>;

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

/// A store failure: 421 for a write of a key whose state partition this instance let go
/// since its owner check (a rebalance raced the request: nothing was written, and the
/// key's new owner takes it), 500 otherwise.
fn store_error(e: &StoreError) -> ApiError {
    match e {
        StoreError::NotOwned { .. } => ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            format!("{e}; send the request to the instance that holds it now (`dedupd status --admin URL`)"),
        ),
        e => internal(e),
    }
}

/// Runs a blocking store call off the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(internal)?
}

/// The `/v1` routes: the API when `admin` is set, else a 404 explaining it is off. What an
/// operator's compaction removes is counted in `metrics` as the background's is.
pub fn router(admin: Option<AdminApi>, metrics: Arc<Metrics>) -> Router {
    let Some(admin) = admin else {
        return Router::new().route(
            "/v1/{*rest}",
            any(|| async { ApiError::new(StatusCode::NOT_FOUND, "the admin API is off: set http.admin_token") }),
        );
    };
    Router::new()
        .route("/v1/keys/{key}", get(inspect).delete(forget))
        .route("/v1/keys/{key}/resolve", post(resolve))
        .route("/v1/keys", get(keys_query).delete(forget_query))
        .route("/v1/resolve", post(resolve_query))
        .route("/v1/stats", get(stats))
        .route("/v1/status", get(status))
        .route("/v1/compact", post(compact))
        .route("/v1/export", get(export))
        .route("/v1/import", post(import))
        .route_layer(middleware::from_fn_with_state(admin.clone(), require_token))
        .layer(axum::Extension(metrics))
        .with_state(admin)
}

/// Equal tokens, in time independent of where they differ and of their lengths.
fn token_matches(expected: &str, given: &str) -> bool {
    // Digests first: equal lengths, so the compare's time says nothing about the token's.
    let (a, b) = (Sha256::digest(expected.as_bytes()), Sha256::digest(given.as_bytes()));
    a.as_slice().ct_eq(b.as_slice()).into()
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

async fn require_token(State(admin): State<AdminApi>, request: Request, next: Next) -> Response {
    match bearer(request.headers()) {
        None => ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "missing bearer token (Authorization: Bearer TOKEN)".into(),
            challenge: Some("Bearer realm=\"dedupd\""),
        }
        .into_response(),
        Some(t) if !token_matches(&admin.token, t) => ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "wrong bearer token".into(),
            challenge: Some("Bearer realm=\"dedupd\", error=\"invalid_token\""),
        }
        .into_response(),
        Some(_) => next.run(request).await,
    }
}

/// `?key=K`: the key of the query-form routes.
#[derive(Deserialize)]
struct KeyParam {
    key: String,
}

/// Takes the key of a query-form route; a query without one is a 400.
fn key_param(params: Result<Query<KeyParam>, QueryRejection>) -> Result<String, ApiError> {
    match params {
        Ok(Query(KeyParam { key })) => Ok(key),
        Err(_) => Err(ApiError::new(StatusCode::BAD_REQUEST, "bad query: ?key=KEY is required")),
    }
}

async fn inspect(State(a): State<AdminApi>, Path(key): Path<String>) -> ApiResult {
    inspect_key(a, key).await
}

async fn inspect_key(a: AdminApi, key: String) -> ApiResult {
    blocking(move || match a.store.get(&key).map_err(internal)? {
        Some(r) => Ok(axum::Json(record_json(&key, &r, SystemClock.now_ms())).into_response()),
        None => Err(ApiError::new(StatusCode::NOT_FOUND, format!("key {} has no record", quoted(&key)))),
    })
    .await
}

/// A key in a message, as a JSON string: quoted, with `"`, `\` and control characters escaped.
fn quoted(key: &str) -> String {
    serde_json::Value::from(key).to_string()
}

#[derive(Deserialize)]
struct ForgetParams {
    #[serde(default)]
    force: bool,
}

#[derive(Deserialize)]
struct ForgetQueryParams {
    key: String,
    #[serde(default)]
    force: bool,
}

const BAD_FORCE: &str = "bad query: force must be true or false";

async fn forget(
    State(a): State<AdminApi>,
    Path(key): Path<String>,
    params: Result<Query<ForgetParams>, QueryRejection>,
) -> ApiResult {
    let Ok(Query(params)) = params else {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, BAD_FORCE));
    };
    forget_key(a, key, params.force).await
}

async fn forget_query(
    State(a): State<AdminApi>,
    params: Result<Query<ForgetQueryParams>, QueryRejection>,
) -> ApiResult {
    let Ok(Query(params)) = params else {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, format!("{BAD_FORCE}, and ?key=KEY is required")));
    };
    forget_key(a, params.key, params.force).await
}

async fn forget_key(a: AdminApi, key: String, force: bool) -> ApiResult {
    check_owner(&a, &key)?;
    blocking(move || match a.store.forget_checked(&key, force) {
        Ok(was) => Ok(axum::Json(serde_json::json!({"forgot": key, "was": was.state().as_str()})).into_response()),
        Err(e @ ForgetError::NotFound(_)) => Err(ApiError::new(StatusCode::NOT_FOUND, e.to_string())),
        Err(e @ ForgetError::InProgress(_)) => Err(ApiError::new(StatusCode::CONFLICT, format!("{e} (?force=true)"))),
        Err(ForgetError::Store(e)) => Err(store_error(&e)),
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    #[serde(rename = "as", default)]
    outcome: Option<Completion>,
    /// Settle by the sink's check instead (`resolve --check`).
    #[serde(default)]
    check: bool,
}

async fn resolve(State(a): State<AdminApi>, Path(key): Path<String>, body: Bytes) -> ApiResult {
    resolve_key(a, key, body).await
}

async fn resolve_query(
    State(a): State<AdminApi>,
    params: Result<Query<KeyParam>, QueryRejection>,
    body: Bytes,
) -> ApiResult {
    resolve_key(a, key_param(params)?, body).await
}

async fn resolve_key(a: AdminApi, key: String, body: Bytes) -> ApiResult {
    const SHAPE: &str = "body must be {\"as\": \"succeeded\"|\"failed\"} or {\"check\": true}";
    let body: ResolveBody =
        serde_json::from_slice(&body).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("{SHAPE}: {e}")))?;
    let outcome = match (body.outcome, body.check) {
        (Some(outcome), false) => outcome,
        (None, true) => return resolve_by_check(a, key).await,
        _ => return Err(ApiError::new(StatusCode::BAD_REQUEST, SHAPE)),
    };
    check_owner(&a, &key)?;
    blocking(move || {
        let now = SystemClock.now_ms();
        let ttl = i64::try_from(a.resolve_ttl.as_millis()).unwrap_or(i64::MAX);
        match a.store.resolve(&key, outcome, now, ttl) {
            Ok(r) => Ok(axum::Json(record_json(&key, &r, now)).into_response()),
            Err(e @ ResolveError::NotFound(_)) => Err(ApiError::new(StatusCode::NOT_FOUND, e.to_string())),
            Err(e @ ResolveError::NotIndeterminate { .. }) => Err(ApiError::new(StatusCode::CONFLICT, e.to_string())),
            Err(ResolveError::Store(e)) => Err(store_error(&e)),
        }
    })
    .await
}

/// `resolve --check`: the key's sink's check, run by this instance (its sinks as the engine
/// holds them), settles it. Only the key's owner may, as for any write.
async fn resolve_by_check(a: AdminApi, key: String) -> ApiResult {
    check_owner(&a, &key)?;
    // The engine keeps the sinks; gone, the instance is stopping.
    let sinks: HashMap<String, Arc<Sink>> =
        a.sinks.iter().filter_map(|(name, sink)| Some((name.clone(), sink.upgrade()?))).collect();
    let (store, k) = (Arc::clone(&a.store), key.clone());
    let doubt = blocking(move || settle::in_doubt(&store, &sinks, &k).map_err(settle_refused)).await?;
    let answer = settle::ask(&doubt).await;
    blocking(move || {
        let ttl = i64::try_from(a.resolve_ttl.as_millis()).unwrap_or(i64::MAX);
        let settled = settle::settle(&a.store, &doubt, answer, SystemClock.now_ms(), ttl).map_err(settle_refused)?;
        Ok(axum::Json(settled).into_response())
    })
    .await
}

/// The answer to a settle refused or failed: 404 no record, 409 not indeterminate or
/// changed meanwhile, 502 the receiver's check did not tell, 422 nothing to ask with.
fn settle_refused(e: SettleError) -> ApiError {
    let status = match &e {
        SettleError::NotFound(_) => StatusCode::NOT_FOUND,
        SettleError::NotIndeterminate { .. } | SettleError::Changed(_) => StatusCode::CONFLICT,
        SettleError::NotHeld(_) | SettleError::NoCheck { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        SettleError::Unsettled { .. } => StatusCode::BAD_GATEWAY,
        SettleError::Store(e) => return store_error(e),
    };
    ApiError::new(status, e.to_string())
}

async fn stats(State(a): State<AdminApi>) -> ApiResult {
    blocking(move || Ok(axum::Json(a.store.stats_json().map_err(internal)?).into_response())).await
}

async fn status(State(a): State<AdminApi>) -> ApiResult {
    let Some(sources) = a.status else {
        return Err(ApiError::new(StatusCode::NOT_FOUND, "no pipeline runs here: /v1/status is served by dedupd run"));
    };
    Ok(axum::Json(sources.status()).into_response())
}

async fn compact(State(a): State<AdminApi>, axum::Extension(metrics): axum::Extension<Arc<Metrics>>) -> ApiResult {
    blocking(move || {
        let now = SystemClock.now_ms();
        let removed = a.store.compact_expired(now, a.compaction_chunk).map_err(internal)?;
        metrics.compacted(removed);
        Ok(axum::Json(serde_json::json!({"removed": removed})).into_response())
    })
    .await
}

/// Hands what the exporter writes to the response body in chunks; a gone client ends it.
struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: Vec<u8>,
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= 64 * 1024 {
            self.flush()?;
        }
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::take(&mut self.buf));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

async fn export(State(a): State<AdminApi>) -> Response {
    jsonl_body("export", move |out| a.store.export_to(SystemClock.now_ms(), out).map(drop))
}

/// `GET /v1/keys`: with `?key=K`, the key's record (as `/v1/keys/K`); otherwise the records
/// matching the filter the query gives (`state`, `route`, `sink`, `since`, `until`: as
/// `dedupd keys` takes them), JSON lines, streamed.
async fn keys_query(
    State(a): State<AdminApi>,
    params: Result<Query<std::collections::BTreeMap<String, String>>, QueryRejection>,
) -> ApiResult {
    let Ok(Query(params)) = params else {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "bad query"));
    };
    if let Some(key) = params.get("key") {
        if params.len() > 1 {
            return Err(ApiError::new(StatusCode::BAD_REQUEST, "bad query: ?key=KEY takes no filter"));
        }
        return inspect_key(a, key.clone()).await;
    }
    let bad = |e: String| ApiError::new(StatusCode::BAD_REQUEST, format!("bad query: {e}"));
    let query = KeysQuery::from_pairs(params).map_err(bad)?;
    let filter = query.filter().map_err(bad)?;
    Ok(jsonl_body("listing", move |out| a.store.list_keys(&filter, SystemClock.now_ms(), out).map(drop)))
}

/// An `application/jsonl` body of what `write` writes, run on the blocking pool and handed
/// over in chunks. An error cuts the body off: the client sees a stream cut, not an end.
fn jsonl_body(
    what: &'static str,
    write: impl FnOnce(&mut dyn Write) -> Result<(), TransferError> + Send + 'static,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    tokio::task::spawn_blocking(move || {
        let mut out = ChannelWriter { tx: tx.clone(), buf: Vec::new() };
        if let Err(e) = write(&mut out).and_then(|()| out.flush().map_err(TransferError::from)) {
            tracing::warn!(error = %e, "admin {what} stopped");
            let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
    });
    let body = Body::from_stream(tokio_stream_from(rx));
    ([(header::CONTENT_TYPE, "application/jsonl")], body).into_response()
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[derive(Deserialize)]
struct ImportParams {
    #[serde(default)]
    overwrite: bool,
    #[serde(default)]
    force: bool,
}

async fn import(
    State(a): State<AdminApi>,
    params: Result<Query<ImportParams>, QueryRejection>,
    body: Body,
) -> ApiResult {
    let Ok(Query(params)) = params else {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "bad query: overwrite and force must be true or false"));
    };
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    let reader = tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(stream));
    blocking(move || {
        let options = ImportOptions { overwrite: params.overwrite, force: params.force, now_ms: SystemClock.now_ms() };
        match a.store.import_from(std::io::BufReader::new(reader), options, |_| {}) {
            Ok(report) => Ok(axum::Json(report).into_response()),
            Err(e @ (TransferError::Line { .. } | TransferError::Incomplete { .. })) => {
                Err(ApiError::new(StatusCode::BAD_REQUEST, format!("{e} (the lines before it were applied)")))
            }
            Err(TransferError::Io(e)) => Err(ApiError::new(StatusCode::BAD_REQUEST, format!("reading the body: {e}"))),
            Err(TransferError::Store(e)) => Err(store_error(&e)),
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_equal_only_when_equal() {
        assert!(token_matches("0123456789abcdef", "0123456789abcdef"));
        assert!(!token_matches("0123456789abcdef", "0123456789abcdeF"));
        assert!(!token_matches("0123456789abcdef", "0123456789abcdef0"));
        assert!(!token_matches("0123456789abcdef", ""));
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("bearer abc"));
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer(&h), None);
    }
}
