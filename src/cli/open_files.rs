//! The open-files limit, raised at start to what the system allows.
//!
//! Each sink call in flight may hold a socket (`http`, `smtp`) or a process's pipes
//! (`exec`), beside librdkafka's sockets and the store's files, and up to 4096 calls may be
//! in flight by default (`Config::max_in_flight`): a soft limit of
//! 1024, systemd's default for a service, is below that. So `dedupd run` raises its soft
//! limit to the hard one, as Go's runtime does for every program at start.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// The most a hard limit of "unlimited" is taken to allow: Linux's default `fs.nr_open`.
const UNLIMITED_AS: u64 = 1 << 20;

/// The soft limit to ask for: the hard one, or `UNLIMITED_AS` when that is unlimited; `None`
/// when the soft limit is already there (or unlimited).
fn raised(limit: &Rlimit) -> Option<u64> {
    let current = limit.current?;
    let target = limit.maximum.unwrap_or(UNLIMITED_AS);
    (current < target).then_some(target)
}

/// Raises this process's soft limit on open files to its hard limit. Logs what it did; a
/// limit that cannot be raised is logged and left as it is.
pub(super) fn raise_open_files_limit() {
    let limit = getrlimit(Resource::Nofile);
    let Some(target) = raised(&limit) else { return };
    match setrlimit(Resource::Nofile, Rlimit { current: Some(target), maximum: limit.maximum }) {
        Ok(()) => tracing::info!(from = limit.current, to = target, "open files limit raised to the hard limit"),
        Err(error) => tracing::warn!(
            %error,
            soft = limit.current,
            hard = limit.maximum,
            "could not raise the open files limit; many sink calls at once may run out of file descriptors"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        // Lowered first (always allowed), as systemd's default leaves it, so that there is a
        // raise to see whatever limit the test starts with.
        let before = getrlimit(Resource::Nofile);
        let lowered = before.maximum.map_or(1024, |hard| hard.min(1024));
        setrlimit(Resource::Nofile, Rlimit { current: Some(lowered), maximum: before.maximum }).unwrap();
        raise_open_files_limit();
        let after = getrlimit(Resource::Nofile);
        let expected = after.maximum.unwrap_or(UNLIMITED_AS);
        assert!(
            after.current.is_none_or(|soft| soft == expected),
            "soft {:?}, hard {:?}",
            after.current,
            after.maximum
        );
    }

    #[test]
    fn what_is_asked_for() {
        assert_eq!(raised(&Rlimit { current: Some(1024), maximum: Some(524_288) }), Some(524_288));
        assert_eq!(raised(&Rlimit { current: Some(1024), maximum: None }), Some(UNLIMITED_AS));
        assert_eq!(raised(&Rlimit { current: Some(4096), maximum: Some(4096) }), None);
        assert_eq!(raised(&Rlimit { current: None, maximum: None }), None);
    }
}
