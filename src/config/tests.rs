//! Config tests: loading, overrides, validation, and the example config in deploy/.

mod unit {
    use super::super::*;

    fn no_env() -> Vec<(String, String)> {
        Vec::new()
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = Config::from_toml_str("", no_env()).unwrap();
        assert_eq!(c.store.default_ttl, Duration::from_secs(86_400));
        assert_eq!(c.store.max_ttl, Duration::from_secs(7 * 86_400));
        assert_eq!(c.http.listen.to_string(), "127.0.0.1:9464");
        assert!(c.envelope.stale_guard);
    }

    #[test]
    fn env_overrides_a_nested_key() {
        let env = vec![
            ("DEDUPD_KAFKA__BOOTSTRAP_SERVERS".to_string(), "10.0.0.1:9093".to_string()),
            ("DEDUPD_PIPELINE__MAX_IN_FLIGHT".to_string(), "7".to_string()),
            ("HOME".to_string(), "/root".to_string()),
        ];
        let c = Config::from_toml_str("[kafka]\nbootstrap_servers = \"a:1\"\n", env).unwrap();
        assert_eq!(c.kafka.bootstrap_servers, "10.0.0.1:9093");
        assert_eq!(c.pipeline.max_in_flight.get(), 7);
    }

    #[test]
    fn unknown_key_is_refused() {
        let err = Config::from_toml_str("[store]\nbakend = \"sled\"\n", no_env()).unwrap_err();
        assert!(err.to_string().contains("bakend"), "{err}");
    }

    #[test]
    fn bad_duration_names_the_value() {
        let err = Config::from_toml_str("[store]\ndefault_ttl = \"soon\"\n", no_env()).unwrap_err();
        assert!(err.to_string().contains("soon"), "{err}");
    }

    #[test]
    fn zero_in_flight_is_refused() {
        let err = Config::from_toml_str("[pipeline]\nmax_in_flight = 0\n", no_env()).unwrap_err();
        assert!(err.to_string().contains("max_in_flight") || err.to_string().contains("zero"), "{err}");
    }

    #[test]
    fn route_to_missing_sink_names_the_key() {
        let err = Config::from_toml_str("[[routes]]\ntypes = [\"a\"]\nsink = \"nope\"\n", no_env()).unwrap_err();
        assert!(err.to_string().contains("routes[0].sink"), "{err}");
    }

    #[test]
    fn max_ttl_below_default_is_refused() {
        let err = Config::from_toml_str("[store]\nmax_ttl = \"1h\"\n", no_env()).unwrap_err();
        assert!(err.to_string().contains("store.max_ttl"), "{err}");
    }
}

mod example {
    use super::super::*;

    #[test]
    fn the_example_config_in_deploy_parses_and_validates() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/dedupd.toml");
        let c = Config::load(&path, Vec::<(String, String)>::new()).unwrap();
        assert_eq!(c.sinks.len(), 2);
        assert_eq!(c.routes[0].ttl, Some(Duration::from_secs(72 * 3600)));
        assert!(c.sinks["payments-api"].forwards_key());
    }
}
