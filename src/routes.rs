//! Routes (docs/contract.md §6): command types, exact or glob, to a named sink with its own TTL and
//! fingerprint exclusions. First matching route wins; `*` makes a default route.

use std::time::Duration;

use globset::{Glob, GlobMatcher};

use serde::{Deserialize, Serialize};

use crate::problems::Problems;

/// One route: command types to a sink.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Name used in metrics and result records; defaults to the sink's name.
    #[serde(default)]
    pub name: Option<String>,
    /// Exact types or globs (`email.*`, `*` for a default route).
    pub types: Vec<String>,
    /// Name of a sink in `[sinks]`.
    pub sink: String,
    /// TTL of this route's completed records (capped by `store.max_ttl`).
    #[serde(default, with = "humantime_serde")]
    pub ttl: Option<Duration>,
    /// JSON pointers (into `{"type", "payload"}`) left out of the fingerprint.
    #[serde(default)]
    pub fingerprint_exclude: Vec<String>,
}

impl RouteConfig {
    /// The route's own values, keys under `problems`' `routes[i]`: at least one type, each
    /// a valid glob, a positive TTL, JSON pointers for its exclusions. Whether its sink
    /// exists and its TTL is under `store.max_ttl` are the config's rules.
    pub fn validate(&self, problems: &mut Problems) {
        if self.types.is_empty() {
            problems.add("types", "[]", "must list at least one type or glob");
        }
        for t in &self.types {
            if let Err(e) = Glob::new(t) {
                problems.add("types", t, format!("is not a valid glob: {e}"));
            }
        }
        if self.ttl.is_some_and(|ttl| ttl.is_zero()) {
            problems.add("ttl", "0s", "must be positive");
        }
        for p in &self.fingerprint_exclude {
            if !(p.is_empty() || p.starts_with('/')) {
                problems.add("fingerprint_exclude", p, "must be a JSON pointer starting with '/'");
            }
        }
    }
}

/// One compiled route.
#[derive(Debug, Clone)]
pub struct Route {
    /// Name in metrics and result records.
    pub name: String,
    /// Name of the sink it sends to.
    pub sink: String,
    /// Route TTL, if set (already capped).
    pub ttl: Option<Duration>,
    /// JSON pointers left out of the fingerprint.
    pub fingerprint_exclude: Vec<String>,
    matchers: Vec<GlobMatcher>,
}

/// Routes in order, plus the TTL defaults they fall back to.
#[derive(Debug, Clone)]
pub struct Router {
    routes: Vec<Route>,
    default_ttl: Duration,
    max_ttl: Duration,
}

/// A route pattern that is not a valid glob.
#[derive(Debug, thiserror::Error)]
#[error("route {route}: type pattern `{pattern}` is not a valid glob: {reason}")]
pub struct RouteError {
    route: String,
    pattern: String,
    reason: String,
}

impl Router {
    /// Compiles `routes`; `default_ttl` and `max_ttl` come from `[store]`.
    pub fn new(routes: &[RouteConfig], default_ttl: Duration, max_ttl: Duration) -> Result<Router, RouteError> {
        let mut compiled = Vec::with_capacity(routes.len());
        for r in routes {
            let name = r.name.clone().unwrap_or_else(|| r.sink.clone());
            let mut matchers = Vec::with_capacity(r.types.len());
            for t in &r.types {
                let glob = Glob::new(t).map_err(|e| RouteError {
                    route: name.clone(),
                    pattern: t.clone(),
                    reason: e.to_string(),
                })?;
                matchers.push(glob.compile_matcher());
            }
            compiled.push(Route {
                name,
                sink: r.sink.clone(),
                ttl: r.ttl.map(|t| t.min(max_ttl)),
                fingerprint_exclude: r.fingerprint_exclude.clone(),
                matchers,
            });
        }
        Ok(Router { routes: compiled, default_ttl, max_ttl })
    }

    /// The first route whose patterns match `kind`.
    pub fn route(&self, kind: &str) -> Option<&Route> {
        self.routes.iter().find(|r| r.matchers.iter().any(|m| m.is_match(kind)))
    }

    /// Every route, in order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// TTL of a command: its own, else its route's, else the default; capped by `max_ttl`.
    pub fn effective_ttl(&self, command_ttl: Option<Duration>, route: &Route) -> Duration {
        command_ttl.or(route.ttl).unwrap_or(self.default_ttl).min(self.max_ttl)
    }

    /// The cap on any TTL.
    pub fn max_ttl(&self) -> Duration {
        self.max_ttl
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(types: &[&str], sink: &str, ttl: Option<u64>) -> RouteConfig {
        RouteConfig {
            name: None,
            types: types.iter().map(|s| s.to_string()).collect(),
            sink: sink.into(),
            ttl: ttl.map(Duration::from_secs),
            fingerprint_exclude: vec![],
        }
    }

    #[test]
    fn first_match_wins_and_star_is_default() {
        let r = Router::new(
            &[route(&["email.send"], "smtp", None), route(&["email.*"], "http", None), route(&["*"], "log", None)],
            Duration::from_secs(60),
            Duration::from_secs(600),
        )
        .unwrap();
        assert_eq!(r.route("email.send").unwrap().sink, "smtp");
        assert_eq!(r.route("email.bounce").unwrap().sink, "http");
        assert_eq!(r.route("charge").unwrap().sink, "log");
    }

    #[test]
    fn no_match_without_default() {
        let r = Router::new(&[route(&["a.*"], "s", None)], Duration::from_secs(1), Duration::from_secs(2)).unwrap();
        assert!(r.route("b").is_none());
    }

    #[test]
    fn ttl_precedence_and_cap() {
        let r = Router::new(
            &[route(&["a"], "s", Some(100)), route(&["b"], "s", None), route(&["c"], "s", Some(10_000))],
            Duration::from_secs(50),
            Duration::from_secs(1000),
        )
        .unwrap();
        let a = r.route("a").unwrap();
        let b = r.route("b").unwrap();
        let c = r.route("c").unwrap();
        assert_eq!(r.effective_ttl(None, a), Duration::from_secs(100));
        assert_eq!(r.effective_ttl(Some(Duration::from_secs(7)), a), Duration::from_secs(7));
        assert_eq!(r.effective_ttl(None, b), Duration::from_secs(50));
        assert_eq!(r.effective_ttl(None, c), Duration::from_secs(1000));
        assert_eq!(r.effective_ttl(Some(Duration::from_secs(99_999)), b), Duration::from_secs(1000));
    }
}
