//! An existing changelog or by-key topic must keep what dedupd writes to it for as long as
//! dedupd needs it; one made by hand (or by an older tool) may not. Checked at start, each
//! refused naming the setting to change:
//! - the changelog: `cleanup.policy=compact` only. With `delete` among its policies Kafka
//!   deletes claims and completions by time or size: a restore would miss them, and a key
//!   would run again.
//! - the by-key topic: `cleanup.policy=delete` only (compaction would drop a repeat of a key
//!   before it is processed, leaving its input without a result), and a retention of at
//!   least [`BY_KEY_MIN_RETENTION_MS`] and [`BY_KEY_MIN_RETENTION_BYTES`] (or none):
//!   dedupd deletes what its group committed itself (`purge`), so a limit only ever
//!   deletes commands not processed yet, after an outage longer than it.
//!
//! When the settings cannot be read (no `DescribeConfigs` permission, an old broker) the
//! topic is taken as it is and the log says so.

use rdkafka::admin::ResourceSpecifier;

use super::Purpose;
use crate::pipeline::{KafkaConfig, PipelineError};

/// The least `retention.ms` a by-key topic may have: a week, an outage's worth.
pub(super) const BY_KEY_MIN_RETENTION_MS: i64 = 7 * 24 * 3600 * 1000;
/// The least `retention.bytes` (per partition) a by-key topic may have: 1 GiB.
pub(super) const BY_KEY_MIN_RETENTION_BYTES: i64 = 1 << 30;

/// What is wrong with topic `name`'s settings for `purpose`, by `setting` (a setting's
/// value, `None` when the broker did not list it): the sentence that refuses it.
pub(super) fn wrong(name: &str, purpose: Purpose, setting: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let policy = setting("cleanup.policy").unwrap_or_else(|| "delete".into());
    let mut policies: Vec<&str> = policy.split(',').map(str::trim).filter(|p| !p.is_empty()).collect();
    policies.sort_unstable();
    policies.dedup();
    let limit = |key: &str, floor: i64| match setting(key).and_then(|v| v.trim().parse::<i64>().ok()) {
        Some(v) if v >= 0 && v < floor => Some(v),
        _ => None,
    };
    match purpose {
        Purpose::Changelog if policies != ["compact"] => Some(format!(
            "changelog topic {name:?} has cleanup.policy={policy}: Kafka would delete claims and completions by time or size, and their keys would run again; set cleanup.policy=compact"
        )),
        Purpose::ByKey if policies != ["delete"] => Some(format!(
            "by-key topic {name:?} has cleanup.policy={policy}: compaction drops a repeat of a key before it is processed, leaving its input without a result; set cleanup.policy=delete"
        )),
        Purpose::ByKey => {
            if let Some(ms) = limit("retention.ms", BY_KEY_MIN_RETENTION_MS) {
                return Some(format!(
                    "by-key topic {name:?} has retention.ms={ms}: commands not processed within it (an outage) would be deleted; set retention.ms=-1 (dedupd deletes what its group committed) or at least {BY_KEY_MIN_RETENTION_MS}"
                ));
            }
            limit("retention.bytes", BY_KEY_MIN_RETENTION_BYTES).map(|bytes| format!(
                "by-key topic {name:?} has retention.bytes={bytes}: commands not processed yet would be deleted past it; set retention.bytes=-1 (dedupd deletes what its group committed) or at least {BY_KEY_MIN_RETENTION_BYTES}"
            ))
        }
        Purpose::Changelog => None,
    }
}

/// Refuses topic `name` when its settings do not keep what `purpose` needs ([`wrong`]).
pub(super) async fn check(kafka: &KafkaConfig, name: &str, purpose: Purpose) -> Result<(), PipelineError> {
    let settings = match crate::pipeline::describe::settings(kafka, &ResourceSpecifier::Topic(name)).await? {
        Ok(settings) => settings,
        Err(why) => {
            tracing::warn!(topic = name, ?purpose, why, "could not read the topic's settings; taking it as it is");
            return Ok(());
        }
    };
    let setting = |key: &str| settings.get(key).cloned();
    match wrong(name, purpose, &setting) {
        Some(why) => Err(PipelineError::Changelog(why)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |key| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    #[test]
    fn a_changelog_is_compacted_and_never_deleted() {
        assert_eq!(wrong("s", Purpose::Changelog, &settings(&[("cleanup.policy", "compact")])), None);
        for policy in ["delete", "compact,delete", "delete, compact"] {
            let why = wrong("s", Purpose::Changelog, &settings(&[("cleanup.policy", policy)])).expect(policy);
            assert!(why.contains("set cleanup.policy=compact"), "{why}");
        }
        assert!(wrong("s", Purpose::Changelog, &settings(&[])).is_some(), "the broker's default is delete");
    }

    #[test]
    fn a_by_key_topic_is_not_compacted_and_keeps_commands_long_enough() {
        let kept = [("cleanup.policy", "delete"), ("retention.ms", "-1"), ("retention.bytes", "-1")];
        assert_eq!(wrong("b", Purpose::ByKey, &settings(&kept)), None);
        let week = BY_KEY_MIN_RETENTION_MS.to_string();
        assert_eq!(
            wrong("b", Purpose::ByKey, &settings(&[("cleanup.policy", "delete"), ("retention.ms", &week)])),
            None
        );
        for (key, value, says) in [
            ("cleanup.policy", "compact", "set cleanup.policy=delete"),
            ("cleanup.policy", "delete,compact", "set cleanup.policy=delete"),
            ("retention.ms", "3600000", "retention.ms=3600000"),
            ("retention.bytes", "1048576", "retention.bytes=1048576"),
        ] {
            let mut these = kept.to_vec();
            these.retain(|(k, _)| *k != key);
            these.push((key, value));
            let why = wrong("b", Purpose::ByKey, &settings(&these)).unwrap_or_else(|| panic!("{key}={value}"));
            assert!(why.contains(says), "{why}");
        }
    }
}
