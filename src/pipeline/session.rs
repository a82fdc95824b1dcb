//! The group session the broker enforces on this instance's consumer: how long after its
//! last heartbeat the group takes its partitions away. The call lease of transactional
//! results is half of it (`transactions`, invariant 7) and a transaction left open is
//! aborted after it (`changelog::stalled`), so it must be the one that holds, not a guess.
//! - Under the classic protocol the consumer asks for it: `session.timeout.ms` (librdkafka's
//!   default 45 s), which the broker takes or refuses.
//! - Under KIP-848 (`"group.protocol" = "consumer"`) the broker sets it: the group's own
//!   `consumer.session.timeout.ms` when set, else the broker's
//!   `group.consumer.session.timeout.ms`; the client's setting is not used. Read at start
//!   with DescribeConfigs. A group whose own setting is there but cannot be read (rdkafka
//!   0.39 refuses the answer: "bogus config source type ... GROUP_CONFIG") is taken at the
//!   broker's `group.consumer.min.session.timeout.ms`, the least any group's can be: a
//!   lease from it is shorter than the session, never longer. When nothing can be read,
//!   the broker default (45 s) is assumed and the log says so.

use std::time::Duration;

use rdkafka::admin::ResourceSpecifier;

use super::{KafkaConfig, PipelineError};

/// The broker's default `group.consumer.session.timeout.ms`.
const KIP848_DEFAULT: Duration = Duration::from_secs(45);

/// Whether the consumer joins under KIP-848's protocol.
fn kip848(kafka: &KafkaConfig) -> bool {
    kafka.consumer.get("group.protocol").is_some_and(|p| p.trim().eq_ignore_ascii_case("consumer"))
}

/// What was read of the group's own setting.
#[derive(Debug, Clone, PartialEq, Eq)]
enum GroupSetting {
    /// Read: its value, if the group has one.
    Read(Option<String>),
    /// The broker answered, but with what could not be read.
    Unreadable,
}

/// The session and where it came from: the group's own setting; else, when the group has
/// none, the broker's; else, when the group's cannot be read, the broker's least
/// (`broker = (default, min)`, each a value in milliseconds when it was read).
fn chosen(group: &GroupSetting, (default, min): (Option<&str>, Option<&str>)) -> Option<(Duration, &'static str)> {
    let ms =
        |v: Option<&str>| v.and_then(|v| v.trim().parse::<u64>().ok()).filter(|ms| *ms > 0).map(Duration::from_millis);
    match group {
        GroupSetting::Read(Some(own)) if ms(Some(own)).is_some() => ms(Some(own)).map(|s| (s, "group")),
        GroupSetting::Read(_) => ms(default).map(|s| (s, "broker")),
        GroupSetting::Unreadable => ms(min).map(|s| (s, "broker_minimum")),
    }
}

/// The session the broker enforces (see the module doc).
pub(super) async fn group_session(kafka: &KafkaConfig, broker_id: Option<i32>) -> Result<Duration, PipelineError> {
    if !kip848(kafka) {
        return Ok(kafka.session_timeout());
    }
    let group = match super::describe::settings(kafka, &ResourceSpecifier::Group(&kafka.group_id)).await? {
        Ok(read) => GroupSetting::Read(read.get("consumer.session.timeout.ms").cloned()),
        Err(_) => GroupSetting::Unreadable,
    };
    let broker = match broker_id {
        Some(id) => super::describe::settings(kafka, &ResourceSpecifier::Broker(id)).await?.unwrap_or_default(),
        None => Default::default(),
    };
    let broker_session = (
        broker.get("group.consumer.session.timeout.ms").map(String::as_str),
        broker.get("group.consumer.min.session.timeout.ms").map(String::as_str),
    );
    Ok(match chosen(&group, broker_session) {
        Some((session, from)) => {
            tracing::info!(session = %humantime::format_duration(session), from, "group session enforced by the broker (KIP-848)");
            session
        }
        None => {
            tracing::warn!(assumed = %humantime::format_duration(KIP848_DEFAULT),
                "could not read the group session the broker enforces (DescribeConfigs on the group and a broker); assuming its default");
            KIP848_DEFAULT
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_groups_own_session_wins_and_one_that_cannot_be_read_is_taken_at_the_least() {
        let broker = (Some("45000"), Some("30000"));
        let own = GroupSetting::Read(Some("50000".into()));
        assert_eq!(chosen(&own, broker), Some((Duration::from_secs(50), "group")));
        assert_eq!(chosen(&GroupSetting::Read(None), broker), Some((Duration::from_secs(45), "broker")));
        assert_eq!(chosen(&GroupSetting::Read(Some("".into())), broker), Some((Duration::from_secs(45), "broker")));
        assert_eq!(chosen(&GroupSetting::Unreadable, broker), Some((Duration::from_secs(30), "broker_minimum")));
        assert_eq!(chosen(&GroupSetting::Read(None), (None, None)), None);
        assert_eq!(chosen(&GroupSetting::Unreadable, (Some("45000"), Some("0"))), None);
    }

    #[test]
    fn only_kip848_reads_it_from_the_cluster() {
        let mut kafka = KafkaConfig::default();
        assert!(!kip848(&kafka));
        kafka.consumer.insert("group.protocol".into(), "Consumer".into());
        assert!(kip848(&kafka));
        kafka.consumer.insert("group.protocol".into(), "classic".into());
        assert!(!kip848(&kafka));
    }
}
