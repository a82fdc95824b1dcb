//! What is wrong with a sink's config: every problem of an instance, in the order its kind
//! checks them, so that `check-config` lists them all at once rather than one per run.

/// A value a config refuses: (key, value, reason), the key spelled in full (e.g.
/// `sinks.payments-api.timeout`), as [`crate::config::Config::validate`] reports it.
pub type Problem = (String, String, String);

/// The problems found in one sink instance's config, `sinks.NAME` being `at`.
#[derive(Debug)]
pub struct Problems<'a> {
    at: &'a str,
    found: Vec<Problem>,
}

impl<'a> Problems<'a> {
    /// None yet, for the instance whose keys start with `at` (`sinks.NAME`).
    pub fn new(at: &'a str) -> Self {
        Problems { at, found: Vec::new() }
    }

    /// The instance's key prefix (`sinks.NAME`), for checks that spell their own keys.
    pub fn at(&self) -> &'a str {
        self.at
    }

    /// The instance's key `key` (relative: `timeout`, `auth.basic_user`) holds `value`,
    /// refused for `reason`.
    pub fn add(&mut self, key: &str, value: impl Into<String>, reason: impl Into<String>) {
        self.found.push((format!("{}.{key}", self.at), value.into(), reason.into()));
    }

    /// A problem whose key is already spelled in full.
    pub fn push(&mut self, problem: Problem) {
        self.found.push(problem);
    }

    /// The first problem of a part that checks itself (`limits`, `circuit`, `auth`), if any.
    pub fn check(&mut self, part: Result<(), Problem>) {
        if let Err(problem) = part {
            self.push(problem);
        }
    }

    /// Everything found, in the order it was checked.
    pub fn into_vec(self) -> Vec<Problem> {
        self.found
    }
}
