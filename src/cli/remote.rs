//! Operator commands on a running instance, through its admin API (docs/admin.md).
//! The bearer token comes from `DEDUPD_ADMIN_TOKEN` (never a flag: it would show in `ps`).

use reqwest::{Method, RequestBuilder, Response, StatusCode, Url};
use serde_json::Value;

use super::CliError;
use crate::store::Completion;

/// The environment variable holding the admin token.
pub const TOKEN_ENV: &str = "DEDUPD_ADMIN_TOKEN";

/// Which route of a key.
#[derive(Clone, Copy)]
enum KeyAction {
    /// Inspect (GET) or forget (DELETE) the record.
    Record,
    /// Resolve it (POST).
    Resolve,
}

/// A client for one instance's admin API.
pub struct Remote {
    pub(super) client: reqwest::Client,
    base: Url,
    token: String,
}

fn remote(e: impl std::fmt::Display) -> CliError {
    CliError::Remote(e.to_string())
}

impl Remote {
    /// A client for the listener at `base` (e.g. `http://127.0.0.1:9464`).
    pub fn new(base: &str) -> Result<Remote, CliError> {
        let base = Url::parse(base).map_err(|e| CliError::Remote(format!("--admin {base}: {e}")))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(CliError::Remote(format!("--admin {base}: not an http(s) URL")));
        }
        let token = std::env::var(TOKEN_ENV)
            .ok()
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| CliError::Remote(format!("set {TOKEN_ENV} to the instance's http.admin_token")))?;
        let client =
            reqwest::Client::builder().connect_timeout(std::time::Duration::from_secs(10)).build().map_err(remote)?;
        Ok(Remote { client, base, token: token.trim().to_string() })
    }

    /// The URL of `/v1/SEGMENTS...`, each segment percent-encoded (a key may hold `/`).
    pub(super) fn url(&self, segments: &[&str]) -> Result<Url, CliError> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|()| CliError::Remote(format!("--admin {}: not a base URL", self.base)))?
            .pop_if_empty()
            .push("v1")
            .extend(segments);
        Ok(url)
    }

    /// A request with the bearer token.
    pub(super) fn request(&self, method: Method, url: Url) -> RequestBuilder {
        self.client.request(method, url).bearer_auth(&self.token)
    }

    /// The URL of a key's route. The key is one percent-encoded path segment
    /// (`/v1/keys/KEY`, `/v1/keys/KEY/resolve`), except `.` and `..`: URL parsing removes
    /// those from a path in any spelling (`%2E` too), so they go in the query
    /// (`/v1/keys?key=K`, `/v1/resolve?key=K`; docs/admin.md).
    fn key_url(&self, key: &str, action: KeyAction) -> Result<Url, CliError> {
        let dot_segment = matches!(key, "." | "..");
        let mut url = match (dot_segment, action) {
            (false, KeyAction::Record) => self.url(&["keys", key])?,
            (false, KeyAction::Resolve) => self.url(&["keys", key, "resolve"])?,
            (true, KeyAction::Record) => self.url(&["keys"])?,
            (true, KeyAction::Resolve) => self.url(&["resolve"])?,
        };
        if dot_segment {
            url.query_pairs_mut().append_pair("key", key);
        }
        Ok(url)
    }

    pub(super) async fn call(&self, method: Method, url: Url, body: Option<Value>) -> Result<Value, CliError> {
        let mut request = self.request(method, url);
        if let Some(b) = body {
            request = request.json(&b);
        }
        let response = request.send().await.map_err(|e| CliError::Remote(format!("{}: {e}", self.base)))?;
        let response = check(response).await?;
        response.json::<Value>().await.map_err(remote)
    }

    /// The record as JSON.
    pub async fn inspect(&self, key: &str) -> Result<Value, CliError> {
        self.call(Method::GET, self.key_url(key, KeyAction::Record)?, None).await
    }

    /// Forgets `key`; returns the state it was in.
    pub async fn forget(&self, key: &str, force: bool) -> Result<String, CliError> {
        let mut url = self.key_url(key, KeyAction::Record)?;
        if force {
            url.query_pairs_mut().append_pair("force", "true");
        }
        let answer = self.call(Method::DELETE, url, None).await.map_err(|e| match e {
            // The API names its query parameter; this command's user passes a flag.
            CliError::Conflict(m) => CliError::Conflict(format!("{} (--force)", m.trim_end_matches(" (?force=true)"))),
            e => e,
        })?;
        Ok(answer.get("was").and_then(Value::as_str).unwrap_or("unknown").to_string())
    }

    /// Resolves an indeterminate key; returns the new record as JSON.
    pub async fn resolve(&self, key: &str, outcome: Completion) -> Result<Value, CliError> {
        let body = serde_json::json!({"as": outcome.as_str()});
        self.call(Method::POST, self.key_url(key, KeyAction::Resolve)?, Some(body)).await
    }

    /// Settles an indeterminate key by its sink's check, run by the instance.
    pub async fn resolve_by_check(&self, key: &str) -> Result<Value, CliError> {
        let body = serde_json::json!({"check": true});
        self.call(Method::POST, self.key_url(key, KeyAction::Resolve)?, Some(body)).await
    }

    /// The stats document.
    pub async fn stats(&self) -> Result<Value, CliError> {
        self.call(Method::GET, self.url(&["stats"])?, None).await
    }

    /// Removes expired records; returns how many.
    pub async fn compact(&self) -> Result<u64, CliError> {
        let answer = self.call(Method::POST, self.url(&["compact"])?, None).await?;
        answer.get("removed").and_then(Value::as_u64).ok_or_else(|| remote(format!("unexpected answer {answer}")))
    }
}

/// Passes a 2xx response on; turns the API's error answers into [`CliError`]s.
pub(super) async fn check(response: Response) -> Result<Response, CliError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let url = response.url().clone();
    let text = response.text().await.unwrap_or_default();
    // dedupd's API answers every error with `{"error": "..."}`.
    let api_message = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_string));
    Err(match (status, api_message) {
        // Only dedupd saying a key has no record is "no such key" (exit 4): a 404 from
        // anything else (a wrong port, a proxy path, the API off) is no answer about it.
        (StatusCode::NOT_FOUND, Some(message)) if message.starts_with("key ") => CliError::NotFound(message),
        (StatusCode::NOT_FOUND, Some(message)) => CliError::Remote(message),
        (StatusCode::NOT_FOUND, None) => CliError::Remote(format!(
            "{url} answered 404 without dedupd's error body: is --admin the address of dedupd's HTTP listener \
             (http.listen)? ({})",
            text.trim().chars().take(200).collect::<String>()
        )),
        (status, message) => check_other(status, message.unwrap_or(text)),
    })
}

/// A non-404 error answer.
fn check_other(status: StatusCode, message: String) -> CliError {
    match status {
        StatusCode::CONFLICT => CliError::Conflict(message),
        StatusCode::UNAUTHORIZED => CliError::Remote(format!("401 {message}: check {TOKEN_ENV}")),
        other => CliError::Remote(format!("{other}: {message}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(base: &str) -> Remote {
        Remote { client: reqwest::Client::new(), base: Url::parse(base).unwrap(), token: "t".into() }
    }

    #[test]
    fn a_key_is_one_path_segment_or_for_dot_segments_the_query() {
        let r = remote("http://h:1");
        let url = |key: &str, action| r.key_url(key, action).unwrap().to_string();
        assert_eq!(url("a/b c", KeyAction::Record), "http://h:1/v1/keys/a%2Fb%20c");
        assert_eq!(url("100%?#", KeyAction::Resolve), "http://h:1/v1/keys/100%25%3F%23/resolve");
        assert_eq!(url("%2E", KeyAction::Record), "http://h:1/v1/keys/%252E");
        assert_eq!(url(".", KeyAction::Record), "http://h:1/v1/keys?key=.");
        assert_eq!(url("..", KeyAction::Resolve), "http://h:1/v1/resolve?key=..");
        // A base with a path (behind a proxy) keeps it.
        let r = remote("http://h:1/dedupd/");
        assert_eq!(r.key_url("k", KeyAction::Record).unwrap().as_str(), "http://h:1/dedupd/v1/keys/k");
    }
}
