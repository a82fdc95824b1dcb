//! What the linked librdkafka was built with: its version and `builtin.features` (TLS, SASL
//! mechanisms, compression codecs). Read from librdkafka at run time, not from Cargo
//! features, so `dedupd --version` and the start-up log show what the binary can really do.

use rdkafka::ClientConfig;
use rdkafka::util::get_rdkafka_version;

/// librdkafka's version and build features.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibrdkafkaBuild {
    /// e.g. `2.12.1`.
    pub version: String,
    /// `builtin.features` as librdkafka lists them, e.g. `gzip,snappy,ssl,sasl,...`.
    pub features: String,
}

impl LibrdkafkaBuild {
    /// Asks the linked librdkafka; `builtin.features` is a read-only property of every
    /// config object, so a fresh one (no client, no connection) answers it.
    pub fn read() -> Result<Self, rdkafka::error::KafkaError> {
        let (_, version) = get_rdkafka_version();
        let features = ClientConfig::new().create_native_config()?.get("builtin.features")?;
        Ok(Self { version, features })
    }

    /// Whether librdkafka lists `feature` (exact name, e.g. `zstd`, `sasl_scram`).
    pub fn has(&self, feature: &str) -> bool {
        self.features.split(',').any(|f| f == feature)
    }
}

/// The text after `dedupd ` for `dedupd --version`: the crate's version, then librdkafka's.
pub fn long_version() -> String {
    let librdkafka = match LibrdkafkaBuild::read() {
        Ok(build) => format!("librdkafka {}\nbuiltin.features: {}", build.version, build.features),
        Err(e) => format!("librdkafka {} (builtin.features unreadable: {e})", get_rdkafka_version().1),
    };
    format!("{}\n{librdkafka}", env!("CARGO_PKG_VERSION"))
}

/// One info line at the start of `dedupd run`: which librdkafka, with which features.
pub fn log_build() {
    match LibrdkafkaBuild::read() {
        Ok(build) => tracing::info!(
            librdkafka = %build.version,
            builtin_features = %build.features,
            "librdkafka build"
        ),
        Err(e) => tracing::warn!(error = %e, "librdkafka build features unreadable"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What managed clusters need: TLS, SASL PLAIN and SCRAM (OAUTHBEARER is listed too, but
    /// without `oidc` it needs a token callback dedupd does not have), and every codec a
    /// producer may have compressed the input with.
    #[test]
    fn librdkafka_is_built_with_tls_sasl_and_every_codec() {
        let build = LibrdkafkaBuild::read().unwrap();
        for feature in ["ssl", "sasl", "sasl_plain", "sasl_scram", "sasl_oauthbearer", "gzip", "snappy", "lz4", "zstd"]
        {
            assert!(build.has(feature), "librdkafka {} lacks {feature}: {}", build.version, build.features);
        }
    }

    #[test]
    fn the_long_version_names_the_crate_librdkafka_and_its_features() {
        let text = long_version();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(env!("CARGO_PKG_VERSION")));
        assert!(lines.next().is_some_and(|l| l.starts_with("librdkafka 2.")), "{text}");
        assert!(lines.next().is_some_and(|l| l.starts_with("builtin.features: ") && l.contains("zstd")), "{text}");
    }
}
