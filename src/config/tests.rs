//! Config tests: loading, overrides, validation, and the example config in deploy/.

mod unit {
    use super::super::*;

    fn no_env() -> Vec<(String, String)> {
        Vec::new()
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = Config::from_toml_str("", no_env()).unwrap();
        assert_eq!(c.store.default_ttl, std::time::Duration::from_secs(86_400));
        assert_eq!(c.store.max_ttl, std::time::Duration::from_secs(7 * 86_400));
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
        assert_eq!(c.max_in_flight().get(), 7);
    }

    /// A sink of each kind; `api` and `run` hold a connection or a process per call and
    /// have no bound of their own, `bounded` has one.
    const EVERY_KIND: &str = "[sinks.api]\nkind = \"http\"\nurl = \"http://127.0.0.1:1/x\"\n\
                              [sinks.run]\nkind = \"exec\"\nprogram = \"/bin/true\"\n\
                              [sinks.bounded]\nkind = \"http\"\nurl = \"http://127.0.0.1:1/y\"\n\
                              [sinks.bounded.limits]\nmax_concurrency = 8\n\
                              [sinks.audit]\nkind = \"log\"\n\
                              [sinks.shipments]\nkind = \"kafka\"\ntopic = \"shipments\"\n";
    const ON_KAFKA: &str = "[kafka]\ntransactional_results = true\n[store]\nchangelog = true\n";

    fn max_in_flight_of(toml: &str) -> usize {
        Config::from_toml_str(toml, no_env()).unwrap().max_in_flight().get()
    }

    #[test]
    fn max_in_flight_unset_is_4096_but_256_on_the_embedded_store_beside_an_unbounded_connection_sink() {
        assert_eq!(max_in_flight_of(""), 4096);
        let fast = "[sinks.audit]\nkind = \"log\"\n[sinks.shipments]\nkind = \"kafka\"\ntopic = \"shipments\"\n";
        assert_eq!(max_in_flight_of(fast), 4096, "log and kafka sinks hold nothing per call and forward the key");
        let bounded =
            "[sinks.api]\nkind = \"http\"\nurl = \"http://127.0.0.1:1/x\"\n[sinks.api.limits]\nmax_concurrency = 8\n";
        assert_eq!(
            max_in_flight_of(&format!("{fast}{bounded}")),
            4096,
            "every connection sink bounded by its own limit"
        );
        assert_eq!(max_in_flight_of(EVERY_KIND), 256);
        assert_eq!(max_in_flight_of("[sinks.run]\nkind = \"exec\"\nprogram = \"/bin/true\"\n"), 256);
        assert_eq!(max_in_flight_of(&format!("{ON_KAFKA}{EVERY_KIND}")), 4096, "the store on Kafka warns instead");
        assert_eq!(max_in_flight_of(&format!("{ON_KAFKA}[pipeline]\nmax_in_flight = 300\n")), 300);
        assert_eq!(max_in_flight_of(&format!("[pipeline]\nmax_in_flight = 5000\n{EVERY_KIND}")), 5000);
    }

    #[test]
    fn sinks_without_a_bound_of_their_own_are_those_holding_a_resource_per_call_without_max_concurrency() {
        let on_kafka = Config::from_toml_str(&format!("{ON_KAFKA}{EVERY_KIND}"), no_env()).unwrap();
        assert_eq!(on_kafka.sinks_unbounded_by_default(), vec!["api", "run"]);
        assert!(on_kafka.sinks_holding_the_default_down().is_empty());
        let embedded = Config::from_toml_str(EVERY_KIND, no_env()).unwrap();
        assert_eq!(embedded.sinks_holding_the_default_down(), vec!["api", "run"]);
        assert!(embedded.sinks_unbounded_by_default().is_empty());
        for mode in [ON_KAFKA, ""] {
            let set = Config::from_toml_str(&format!("{mode}[pipeline]\nmax_in_flight = 4096\n{EVERY_KIND}"), no_env());
            let set = set.unwrap();
            assert!(set.sinks_unbounded_by_default().is_empty(), "an explicit max_in_flight is the operator's");
            assert!(set.sinks_holding_the_default_down().is_empty(), "an explicit max_in_flight is the operator's");
        }
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn env_override_is_read_as_the_type_of_its_key() {
        let c = Config::from_toml_str(
            "",
            env(&[
                ("DEDUPD_HTTP__ADMIN_TOKEN", "1234567890123456"),
                ("DEDUPD_KAFKA__RESULTS_TOPIC", "2024"),
                ("DEDUPD_KAFKA__CONSUMER__SESSION.TIMEOUT.MS", "45000"),
                ("DEDUPD_KAFKA__INPUT_TOPICS", "[\"orders\", \"2025\"]"),
                ("DEDUPD_ENVELOPE__STALE_GUARD", "false"),
                ("DEDUPD_STORE__DEFAULT_TTL", "36h"),
            ]),
        )
        .unwrap();
        assert_eq!(c.http.admin_token.as_deref(), Some("1234567890123456"));
        assert_eq!(c.kafka.results_topic, "2024");
        assert_eq!(c.kafka.consumer.get("session.timeout.ms").map(String::as_str), Some("45000"));
        assert_eq!(c.kafka.input_topics, vec!["orders".to_string(), "2025".to_string()]);
        assert!(!c.envelope.stale_guard);
        assert_eq!(c.store.default_ttl, std::time::Duration::from_secs(36 * 3600));
    }

    #[test]
    fn env_override_of_a_sink_key_takes_numbers_and_strings() {
        let file = "[sinks.api]\nkind = \"http\"\nurl = \"http://127.0.0.1:1/x\"\n";
        let c = Config::from_toml_str(
            file,
            env(&[
                ("DEDUPD_SINKS__API__MAX_RESPONSE_BYTES", "2048"),
                ("DEDUPD_SINKS__API__URL", "http://127.0.0.1:2/y"),
            ]),
        )
        .unwrap();
        let shown = toml::to_string(&c.sinks["api"]).unwrap();
        assert!(shown.contains("max_response_bytes = 2048"), "{shown}");
        assert!(shown.contains("http://127.0.0.1:2/y"), "{shown}");
    }

    /// The store on Kafka: `kafka.copartitioned` with one input topic only (two owners of a
    /// state partition otherwise), and the by-key topic read from its start.
    #[test]
    fn the_store_on_kafka_refuses_what_would_give_a_state_partition_two_owners_or_lose_commands() {
        let on_kafka = |kafka: &str| {
            let toml = format!("[kafka]\ntransactional_results = true\n{kafka}\n[store]\nchangelog = true\n");
            Config::from_toml_str(&toml, no_env()).map(|_| ()).map_err(|e| e.to_string())
        };
        let two_topics = "input_topics = [\"orders\", \"refunds\"]\n";
        let err = on_kafka(&format!("copartitioned = true\n{two_topics}")).unwrap_err();
        assert!(err.contains("kafka.copartitioned") && err.contains("takes one input topic, not 2"), "{err}");
        assert_eq!(on_kafka(two_topics), Ok(()), "through the by-key topic");
        assert_eq!(on_kafka("copartitioned = true\ninput_topics = [\"orders\"]\n"), Ok(()));
        for reset in ["latest", "end", "largest", "error"] {
            let err = on_kafka(&format!("[kafka.consumer]\n\"auto.offset.reset\" = \"{reset}\"\n")).unwrap_err();
            assert!(err.contains("auto.offset.reset") && err.contains("by-key topic"), "{reset}: {err}");
            let copartitioned =
                format!("copartitioned = true\n[kafka.consumer]\n\"auto.offset.reset\" = \"{reset}\"\n");
            assert_eq!(on_kafka(&copartitioned), Ok(()), "{reset}: no by-key topic");
        }
        assert_eq!(on_kafka("[kafka.consumer]\n\"auto.offset.reset\" = \"earliest\"\n"), Ok(()));
    }

    /// What a record keeps is bounded, so that an export's every line is one an import reads.
    #[test]
    fn results_and_commands_larger_than_a_record_keeps_are_refused() {
        let over = crate::sinks::MAX_RESULT_BYTES + 1;
        for (toml, key) in [
            (
                format!("[sinks.a]\nkind = \"http\"\nurl = \"http://127.0.0.1:1/\"\nmax_response_bytes = {over}\n"),
                "sinks.a.max_response_bytes",
            ),
            (
                format!("[sinks.r]\nkind = \"exec\"\nprogram = \"/bin/true\"\nmax_output_bytes = {over}\n"),
                "sinks.r.max_output_bytes",
            ),
            (
                format!("[limits]\nmax_command_bytes = {over}\n[kafka.producer]\n\"message.max.bytes\" = \"{over}\"\n"),
                "limits.max_command_bytes",
            ),
        ] {
            let err = Config::from_toml_str(&toml, no_env()).map(|_| ()).unwrap_err().to_string();
            assert!(err.contains(key) && err.contains("at most 8388608"), "{key}: {err}");
            let at_the_cap = toml.replace(&over.to_string(), &crate::sinks::MAX_RESULT_BYTES.to_string());
            assert!(Config::from_toml_str(&at_the_cap, no_env()).is_ok(), "{key} at the cap");
        }
    }

    #[test]
    fn one_underscore_after_a_section_is_refused_with_the_spelling_that_works() {
        let err = Config::from_toml_str("", env(&[("DEDUPD_PIPELINE_MAX_IN_FLIGHT", "4")])).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Env { var, reason }
                if var == "DEDUPD_PIPELINE_MAX_IN_FLIGHT" && reason.contains("did you mean DEDUPD_PIPELINE__MAX_IN_FLIGHT?")),
            "{err}"
        );
        // Refused for its name, whatever its value.
        let err = Config::from_toml_str("", env(&[("DEDUPD_log_level", "loud")])).unwrap_err();
        assert!(err.to_string().contains("DEDUPD_LOG__LEVEL"), "{err}");
        let err = Config::from_toml_str("", env(&[("DEDUPD_HTTP_ADMIN_TOKEN", "0123456789abcdef")])).unwrap_err();
        assert!(err.to_string().contains("DEDUPD_HTTP__ADMIN_TOKEN"), "{err}");
        // Not meant as overrides: the command line's own, Kubernetes' service links, the
        // test broker's, a sink's name, others.
        let others = [
            ("DEDUPD_LOG", "debug"),
            ("DEDUPD_CONFIG", "/etc/dedupd.toml"),
            ("DEDUPD_SERVICE_HOST", "10.0.0.1"),
            ("DEDUPD_PORT_9464_TCP_ADDR", "10.0.0.1"),
            ("DEDUPD_KAFKA_HOME", "/tmp/kafka"),
            ("DEDUPD_KAFKA_VERSION", "4.3.1"),
            ("DEDUPD_SINKS_API", "x"),
            ("DEDUPD_STOREFRONT_URL", "x"),
            ("DEDUPD_REQUIRE_KAFKA", "1"),
        ];
        Config::from_toml_str("", env(&others)).expect("none of them is taken for a key");
    }

    #[test]
    fn a_whole_section_is_refused_and_a_sink_is_found_whatever_its_case() {
        for var in ["DEDUPD_ROUTES", "DEDUPD_sinks", "DEDUPD_STORE"] {
            let err = Config::from_toml_str("", env(&[(var, "[]")])).unwrap_err();
            assert!(err.to_string().contains("a section is not set whole"), "{var}: {err}");
        }
        let file = "[sinks.PaymentsApi]\nkind = \"http\"\nurl = \"http://127.0.0.1:1/x\"\n";
        let c =
            Config::from_toml_str(file, env(&[("DEDUPD_SINKS__PAYMENTSAPI__URL", "http://127.0.0.1:2/y")])).unwrap();
        assert_eq!(c.sinks.len(), 1, "no second sink made");
        let shown = toml::to_string(&c.sinks["PaymentsApi"]).unwrap();
        assert!(shown.contains("http://127.0.0.1:2/y"), "{shown}");
        // A bad value there still names its variable.
        let var = "DEDUPD_SINKS__PAYMENTSAPI__MAX_RESPONSE_BYTES";
        let err = Config::from_toml_str(file, env(&[(var, "lots")])).unwrap_err();
        assert!(err.to_string().contains(var), "{err}");
    }

    #[test]
    fn the_sections_refused_with_one_underscore_are_the_configs() {
        let shown = toml::Value::try_from(Config::default()).expect("serializes");
        let mut keys: Vec<&str> = shown.as_table().expect("a table").keys().map(String::as_str).collect();
        let mut sections = super::super::env::SECTIONS.to_vec();
        // An empty list and a section that is off (None) are left out of TOML.
        keys.extend(["routes", "intake"]);
        keys.sort_unstable();
        keys.dedup();
        sections.sort_unstable();
        assert_eq!(keys, sections);
    }

    #[test]
    fn bad_env_override_names_the_variable() {
        for (var, value) in [
            ("DEDUPD_PIPELINE__MAX_IN_FLIGHT", "lots"),
            ("DEDUPD_STORE__BAKEND", "sled"),
            ("DEDUPD_STORE__DEFAULT_TTL", "soon"),
            ("DEDUPD_KAFKA__INPUT_TOPICS", "[\"a\""),
        ] {
            let err = Config::from_toml_str("", env(&[(var, value)])).unwrap_err();
            assert!(matches!(&err, ConfigError::Env { var: named, .. } if named == var), "{var}: {err:?}");
            assert!(err.to_string().contains(var), "{var}: {err}");
        }
    }

    #[test]
    fn a_string_that_starts_with_a_bracket_is_a_string() {
        let vars =
            [("DEDUPD_KAFKA__CONNECTION__SASL.PASSWORD", "[S3cret"), ("DEDUPD_HTTP__ADMIN_TOKEN", "[0123456789abcdef")];
        let c = Config::from_toml_str("", env(&vars)).unwrap();
        let password = c.kafka.connection.iter().find(|(k, _)| *k == "sasl.password").map(|(_, v)| v.clone());
        assert_eq!(password, Some(crate::connection::PropertyValue::Text("[S3cret".into())));
        assert_eq!(c.http.admin_token.as_deref(), Some("[0123456789abcdef"));
    }

    #[test]
    fn file_error_keeps_its_line_when_env_is_set() {
        let text = "[store]\n\ndefault_ttl = \"soon\"\n";
        let err = Config::from_toml_str(text, env(&[("DEDUPD_PIPELINE__MAX_IN_FLIGHT", "8")])).unwrap_err();
        assert!(matches!(&err, ConfigError::Value { key, line: Some(3), .. } if key == "store.default_ttl"), "{err:?}");
        assert!(err.to_string().contains("soon"), "{err}");
    }

    #[test]
    fn a_rule_broken_by_an_env_override_names_the_variable_not_the_file() {
        let text = "[store]\nmax_ttl = \"7d\"\n\n[[routes]]\ntypes = [\"a\"]\nsink = \"nope\"\n";
        let config = Config::read_toml_str(text, env(&[("DEDUPD_STORE__DEFAULT_TTL", "0s")])).expect("reads");
        let problems = config.problems();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            matches!(&problems[0], ConfigError::Env { var, reason }
                if var == "DEDUPD_STORE__DEFAULT_TTL" && reason.contains("`store.default_ttl` = 0s")),
            "{problems:?}"
        );
        // The file's own problem stays the file's.
        assert!(matches!(&problems[1], ConfigError::Invalid { key, .. } if key == "routes[0].sink"), "{problems:?}");
    }

    #[test]
    fn every_section_reports_every_problem_into_one_list_with_keys_in_full() {
        let text = "[kafka]\ngroup_id = \"\"\n[store]\ncompaction_interval = \"0s\"\n\
                    [retry]\ninitial_backoff = \"0s\"\n[log]\nlevel = \"dedupd=loud\"\n\
                    [http]\nadmin_token = \"short\"\n\
                    [sinks.api]\nkind = \"log\"\n[sinks.api.limits]\nburst = 3\n\
                    [sinks.api.circuit]\nprobe_backoff = \"0s\"\n\
                    [[routes]]\ntypes = [\"[\"]\nsink = \"api\"\n";
        let config = Config::read_toml_str(text, no_env()).expect("reads");
        let keys: Vec<String> = config
            .problems()
            .into_iter()
            .map(|e| match e {
                ConfigError::Invalid { key, .. } => key,
                other => panic!("not a rule's problem: {other:?}"),
            })
            .collect();
        assert_eq!(
            keys,
            [
                "kafka.group_id",
                "store.compaction_interval",
                "retry.initial_backoff",
                "sinks.api.limits.burst",
                "sinks.api.circuit.probe_backoff",
                "routes[0].types",
                "http.admin_token",
                "log.level",
            ]
        );
    }

    #[test]
    fn a_value_of_the_wrong_type_or_an_unknown_key_names_the_key_and_its_line() {
        let err = Config::from_toml_str("[retry]\n\nmax_attempts = \"three\"\n", no_env()).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Value { key, line: Some(3), .. } if key == "retry.max_attempts"),
            "{err:?}"
        );
        let err = Config::from_toml_str("[limits]\nmax_comand_bytes = 5\n", no_env()).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Value { key, line: Some(2), .. } if key == "limits.max_comand_bytes"),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "config key `limits.max_comand_bytes`: is not a key here; expected `max_command_bytes`",
        );
        let err = Config::from_toml_str("[kafka]\ngroup_id = \n", no_env()).unwrap_err();
        assert!(matches!(&err, ConfigError::Parse { line: Some(2), .. }), "{err:?}");
        assert!(err.to_string().starts_with("config is not valid TOML at line 2: "), "{err}");
    }

    #[test]
    fn transaction_interval_is_a_positive_duration() {
        let c = Config::from_toml_str("[kafka]\ntransaction_interval = \"500ms\"\n", no_env()).expect("valid");
        assert_eq!(c.kafka.transaction_interval, std::time::Duration::from_millis(500));
        let err = Config::from_toml_str("[kafka]\ntransaction_interval = \"0s\"\n", no_env()).unwrap_err();
        assert!(err.to_string().contains("kafka.transaction_interval"), "{err}");
    }

    #[test]
    fn a_cooperative_assignor_is_refused_with_transactional_results_under_the_classic_protocol() {
        let coop = "[kafka.consumer]\n\"partition.assignment.strategy\" = \"cooperative-sticky\"\n";
        let err =
            Config::from_toml_str(&format!("[kafka]\ntransactional_results = true\n{coop}"), no_env()).unwrap_err();
        assert!(err.to_string().contains("partition.assignment.strategy"), "{err}");
        assert!(err.to_string().contains("group.protocol"), "{err}");
        // Fine without transactions, and under the consumer protocol (which assigns itself).
        assert!(Config::from_toml_str(coop, no_env()).is_ok());
        let kip848 = format!("[kafka]\ntransactional_results = true\n{coop}\"group.protocol\" = \"consumer\"\n");
        assert!(Config::from_toml_str(&kip848, no_env()).is_ok());
    }

    #[test]
    fn transactional_results_is_a_boolean() {
        let c = Config::from_toml_str("[kafka]\ntransactional_results = true\n", no_env()).expect("valid");
        assert!(c.kafka.transactional_results);
        let err = Config::from_toml_str("[kafka]\ntransactional_results = \"yes\"\n", no_env()).unwrap_err();
        assert!(err.to_string().contains("transactional_results"), "{err}");
    }

    #[test]
    fn unknown_key_is_refused() {
        let err = Config::from_toml_str("[store]\nbakend = \"sled\"\n", no_env()).unwrap_err();
        assert!(err.to_string().contains("bakend"), "{err}");
    }

    #[test]
    fn bootstrap_servers_must_be_broker_addresses() {
        let text = "[kafka]\nbootstrap_servers = \"a:9092, not a host::\"\n";
        let err = Config::from_toml_str(text, no_env()).unwrap_err();
        assert!(matches!(&err, ConfigError::Invalid { key, .. } if key == "kafka.bootstrap_servers"), "{err:?}");
        assert!(err.to_string().contains("\"not a host::\" is not a host:port"), "{err}");
        assert!(Config::from_toml_str("[kafka]\nbootstrap_servers = \"a:9092,b:9093\"\n", no_env()).is_ok());
    }

    #[test]
    fn a_zero_initial_backoff_is_refused() {
        let err = Config::from_toml_str("[retry]\ninitial_backoff = \"0s\"\n", no_env()).unwrap_err();
        assert_eq!(err.to_string(), "config key `retry.initial_backoff` = 0s: must be positive");
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
    fn store_cache_bytes_is_positive_and_opens_every_backend() {
        let err = Config::from_toml_str("[store]\ncache_bytes = 0\n", no_env()).unwrap_err();
        assert!(err.to_string().contains("cache_bytes"), "{err}");
        for &backend in crate::store::StoreBackend::ALL {
            let dir = tempfile::tempdir().unwrap();
            let text = format!("[store]\nbackend = \"{backend}\"\ncache_bytes = 8388608\npath = {:?}\n", dir.path());
            let c = Config::from_toml_str(&text, no_env()).unwrap();
            assert_eq!(c.store.cache_bytes.or(1), 8 << 20);
            let store = crate::store::KeyStore::open_configured(&c.store).unwrap();
            assert_eq!(store.counts().completed, 0, "{backend}");
        }
    }

    #[test]
    fn a_ttl_past_its_cap_is_refused() {
        let err = Config::from_toml_str("[store]\nmax_ttl = \"99999999d\"\n", no_env()).unwrap_err();
        assert!(err.to_string().contains("at most 100 years"), "{err}");
        let text = "[store]\nmax_ttl = \"7d\"\n[sinks.s]\nkind = \"log\"\n[[routes]]\ntypes = [\"a\"]\nsink = \"s\"\nttl = \"30d\"\n";
        let err = Config::from_toml_str(text, no_env()).unwrap_err();
        assert!(
            err.to_string().contains("routes[0].ttl") && err.to_string().contains("above store.max_ttl (7days)"),
            "{err}"
        );
        Config::from_toml_str(&text.replace("30d", "7d"), no_env()).expect("a route at the cap");
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
        assert_eq!(c.routes[0].ttl, Some(std::time::Duration::from_secs(72 * 3600)));
        assert!(c.sinks["payments-api"].forwards_key());
    }

    #[test]
    fn the_largest_command_must_fit_the_results_producer() {
        let text = "[limits]\nmax_command_bytes = 1048576\n[kafka.producer]\n\"message.max.bytes\" = \"1000000\"\n";
        let err = Config::from_toml_str(text, Vec::<(String, String)>::new()).unwrap_err().to_string();
        assert!(
            err.contains("kafka.producer.\"message.max.bytes\"") && err.contains("max_command_bytes = 1048576"),
            "{err}"
        );
        let fits = "[limits]\nmax_command_bytes = 900000\n[kafka.producer]\n\"message.max.bytes\" = \"1000000\"\n";
        assert!(Config::from_toml_str(fits, Vec::<(String, String)>::new()).is_ok());
        assert!(Config::from_toml_str("", Vec::<(String, String)>::new()).is_ok(), "the defaults are consistent");
    }
}
