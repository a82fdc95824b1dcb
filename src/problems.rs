//! What a config refuses, collected: each section's type checks its own values into one
//! [`Problems`], every problem naming its key in full, the value and the reason, so that
//! `check-config` lists them all at once and `run` stops at the first. Rules that span
//! sections are the config's (src/config/load.rs); `check-config` adds each key's line.

use std::fmt::Display;

/// A value a config refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The key spelled in full, as the file writes it: `sinks.payments-api.timeout`,
    /// `routes[1].sink`, `kafka.consumer."group.id"`.
    pub key: String,
    /// The value as written (a secret's shown as `(hidden)`).
    pub value: String,
    /// Why it is refused.
    pub reason: String,
}

/// The problems found so far, the keys of those added with [`add`](Self::add) starting
/// with the section or instance being checked (`at`: `store`, `sinks.NAME`).
#[derive(Debug, Default)]
pub struct Problems {
    at: String,
    found: Vec<Problem>,
}

impl Problems {
    /// None yet; [`add`](Self::add) puts `at.` before its keys (nothing when `at` is empty).
    pub fn new(at: impl Into<String>) -> Self {
        Problems { at: at.into(), found: Vec::new() }
    }

    /// Every problem `check` finds, its keys under `at`.
    pub fn found_by(at: &str, check: impl FnOnce(&mut Problems)) -> Vec<Problem> {
        let mut problems = Problems::new(at);
        check(&mut problems);
        problems.into_vec()
    }

    /// The key prefix (`sinks.NAME`), for checks that spell their own keys.
    pub fn at(&self) -> &str {
        &self.at
    }

    /// The key `key` (relative to `at`: `timeout`, `auth.basic_user`) holds `value`,
    /// refused for `reason`.
    pub fn add(&mut self, key: &str, value: impl Display, reason: impl Into<String>) {
        let key = if self.at.is_empty() { key.to_string() } else { format!("{}.{key}", self.at) };
        self.found.push(Problem { key, value: value.to_string(), reason: reason.into() });
    }

    /// A problem whose key is already spelled in full.
    pub fn push(&mut self, problem: Problem) {
        self.found.push(problem);
    }

    /// Runs `check` with the keys it adds under `at.part` (`limits`, `routes[2]`), then
    /// goes on under `at`.
    pub fn within(&mut self, part: &str, check: impl FnOnce(&mut Problems)) {
        let outer = self.at.clone();
        self.at = if outer.is_empty() { part.to_string() } else { format!("{outer}.{part}") };
        check(self);
        self.at = outer;
    }

    /// Everything found, in the order it was checked.
    pub fn into_vec(self) -> Vec<Problem> {
        self.found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_spelled_in_full_under_each_part() {
        let mut problems = Problems::new("sinks.api");
        problems.add("timeout", "0s", "must be positive");
        problems.within("limits", |p| p.add("burst", 3, "needs limits.rate_per_second"));
        problems.add("url", "x", "is not a URL");
        let mut top = Problems::new("");
        top.within("routes[1]", |p| p.add("sink", "nope", "names no sink in [sinks]"));
        top.add("log.level", "loud", "is not a tracing filter");
        let keys: Vec<String> = problems.into_vec().into_iter().chain(top.into_vec()).map(|p| p.key).collect();
        assert_eq!(
            keys,
            ["sinks.api.timeout", "sinks.api.limits.burst", "sinks.api.url", "routes[1].sink", "log.level"]
        );
    }
}
