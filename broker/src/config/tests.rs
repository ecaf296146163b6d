//! Tests of [`super`].

use super::*;

fn flags(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn defaults_match_the_api_table() {
    let config = Config::resolve(None, Vec::new(), &[]).expect("defaults");
    for (key, value) in [
        ("storage.consumer_offset_commit_interval_ms", 1000),
        ("storage.ack_flush_interval_ms", 100),
        ("storage.segment_bytes", 67_108_864),
        ("dispatcher.max_linger_ms", 50),
        ("dispatcher.checkpoint_interval_ms", 250),
        (
            "dispatcher.reroute_after_ms",
            crate::limits::REROUTE_AFTER_MS_DEFAULT,
        ),
        ("leases.sweep_interval_ms", 1000),
        ("cluster.heartbeat_interval_ms", 1000),
        ("cluster.node_dead_after_ms", 30_000),
        ("topics.default_retention_ms", 604_800_000),
        ("topics.default_visibility_timeout_ms", 30_000),
        ("topics.default_idempotency_window_ms", 300_000),
        ("http.max_batch_bytes", 16_777_216),
    ] {
        assert_eq!(config.u64(key), value, "{key}");
    }
    assert_eq!(config.text("cluster.secret"), None);
    assert_eq!(config.text("data_dir"), Some("./narad-data"));
    assert_eq!(config.text("listen"), Some("127.0.0.1:8080"));
}

#[test]
fn flags_beat_env_beat_file_beat_defaults() {
    let file = "[storage]\nsegment_bytes = 8192\nack_flush_interval_ms = 10\n[dispatcher]\nmax_linger_ms = 7\n";
    let env = vec![
        (
            "NARAD_STORAGE__SEGMENT_BYTES".to_string(),
            "16384".to_string(),
        ),
        (
            "NARAD_DISPATCHER__MAX_LINGER_MS".to_string(),
            "8".to_string(),
        ),
        ("NARAD_URL".to_string(), "http://x".to_string()),
        ("PATH".to_string(), "/bin".to_string()),
    ];
    let config = Config::resolve(
        Some(("narad.toml", file)),
        env,
        &flags(&[("dispatcher.max_linger_ms", "9")]),
    )
    .expect("resolves");
    assert_eq!(config.u64("storage.segment_bytes"), 16384);
    assert_eq!(config.source("storage.segment_bytes"), Some(Source::Env));
    assert_eq!(config.u64("dispatcher.max_linger_ms"), 9);
    assert_eq!(
        config.source("dispatcher.max_linger_ms"),
        Some(Source::Flag)
    );
    assert_eq!(config.u64("storage.ack_flush_interval_ms"), 10);
    assert_eq!(
        config.source("storage.ack_flush_interval_ms"),
        Some(Source::File)
    );
    assert_eq!(
        env_name("storage.segment_bytes"),
        "NARAD_STORAGE__SEGMENT_BYTES"
    );
}

#[test]
fn unknown_keys_and_bad_values_are_refused_naming_the_key() {
    let unknown = Config::resolve(None, Vec::new(), &flags(&[("storage.segmnt_bytes", "1")]))
        .expect_err("unknown");
    assert!(unknown.to_string().contains("storage.segmnt_bytes"));
    let in_file = Config::resolve(Some(("f.toml", "[http]\nmax_batch = 3\n")), Vec::new(), &[])
        .expect_err("unknown");
    assert!(in_file.to_string().contains("http.max_batch"));
    let bad = Config::resolve(
        None,
        Vec::new(),
        &flags(&[("leases.sweep_interval_ms", "soon")]),
    )
    .expect_err("bad");
    assert!(bad.to_string().contains("leases.sweep_interval_ms"));
    let typo_env = Config::resolve(
        None,
        vec![("NARAD_STORAGE__SEGMNT_BYTES".into(), "8192".into())],
        &[],
    )
    .expect_err("typo");
    assert!(
        typo_env.to_string().contains("storage.segmnt_bytes")
            && typo_env.to_string().contains("environment")
    );
    Config::resolve(None, vec![("NARAD_SIM_SEED".into(), "7".into())], &[])
        .expect("a test's own variable is not a key");
    let toml_error =
        Config::resolve(Some(("f.toml", "[storage\n")), Vec::new(), &[]).expect_err("syntax");
    assert!(toml_error.to_string().contains("f.toml"));
}

#[test]
fn remote_children_keys_are_taken_from_every_source_and_their_bounds_kept() {
    let key = "children.remote_max_in_flight";
    let flag = Config::resolve(None, Vec::new(), &flags(&[(key, "8")])).expect("flag");
    assert_eq!(flag.text(key), Some("8"));
    let env = Config::resolve(None, vec![(env_name(key), "9".to_string())], &[]).expect("env");
    assert_eq!(env.text(key), Some("9"));
    let file = Config::resolve(
        Some((
            "f.toml",
            "[children]\nremote_max_in_flight = 5\nremote_ca_file = \"/ca.pem\"\n",
        )),
        Vec::new(),
        &[],
    )
    .expect("file");
    assert_eq!(file.text(key), Some("5"));
    assert_eq!(file.text("children.remote_ca_file"), Some("/ca.pem"));
    let defaults = Config::resolve(None, Vec::new(), &[]).expect("defaults");
    assert_eq!(defaults.text(key), Some("4"));
    for bad in ["0", "1025", "many"] {
        let refused = Config::resolve(None, Vec::new(), &flags(&[(key, bad)])).expect_err(bad);
        assert!(refused.to_string().contains(key), "{refused}");
    }
    // The child's own settings are not node keys.
    let unknown = Config::resolve(
        None,
        Vec::new(),
        &flags(&[("remote.rate_bytes_per_s", "1")]),
    )
    .expect_err("unknown");
    assert!(
        unknown.to_string().contains("remote.rate_bytes_per_s"),
        "{unknown}"
    );
}

/// Every accepted key is read somewhere outside its own table: a key
/// that nothing reads would be accepted and change nothing.
#[test]
fn every_accepted_key_has_a_reader() {
    // Code reads a setting by its path in `Settings`
    // (`settings.storage.segment_bytes`, `settings.listen`), which
    // `Settings::from_config` fills from exactly these keys.
    let sources = [
        include_str!("../node/mod.rs"),
        include_str!("../node/faults.rs"),
        include_str!("../node/folder.rs"),
        include_str!("../node/peers.rs"),
        include_str!("../node/shard_thread.rs"),
        include_str!("../node/telemetry.rs"),
        include_str!("../api.rs"),
        include_str!("../main.rs"),
        include_str!("../cli.rs"),
        include_str!("../shard/mod.rs"),
        include_str!("../shard/owners.rs"),
        include_str!("../shard/topics.rs"),
        include_str!("../shard/tasks.rs"),
        include_str!("../shard/moves.rs"),
        include_str!("../settings.rs"),
        include_str!("../dispatcher.rs"),
    ];
    for (key, _) in Config::keys() {
        let path = if key.contains('.') {
            format!(".{key}")
        } else {
            format!("settings.{key}")
        };
        assert!(
            sources.iter().any(|source| source.contains(&path)),
            "config key {key} is accepted but nothing reads it"
        );
    }
}

#[test]
fn inconsistent_settings_are_refused() {
    let ring = Config::resolve(
        None,
        Vec::new(),
        &flags(&[("storage.wal_ring_bytes", "70000")]),
    )
    .expect_err("align");
    assert!(ring.to_string().contains("storage.wal_ring_bytes"));
    let retention = Config::resolve(
        None,
        Vec::new(),
        &flags(&[("topics.default_retention_ms", "60000")]),
    )
    .expect_err("under the floor");
    assert!(retention
        .to_string()
        .contains("topics.default_retention_ms"));
    Config::resolve(
        None,
        Vec::new(),
        &flags(&[("topics.default_retention_ms", "0")]),
    )
    .expect("0 keeps forever");
    let floor = Config::resolve(
        None,
        Vec::new(),
        &flags(&[("topics.retention_floor_ms", "1000")]),
    )
    .expect_err("a floor under an hour is for tests");
    assert!(
        floor.to_string().contains("topics.retention_floor_ms")
            && floor.to_string().contains("testing.short_retention"),
        "{floor}"
    );
    Config::resolve(
        None,
        Vec::new(),
        &flags(&[
            ("topics.retention_floor_ms", "1000"),
            ("testing.short_retention", "true"),
        ]),
    )
    .expect("tests may lower the floor");
    Config::resolve(
        None,
        Vec::new(),
        &flags(&[("topics.retention_floor_ms", "7200000")]),
    )
    .expect("anyone may raise it");
    let peers = Config::resolve(None, Vec::new(), &flags(&[("peers", "1=127.0.0.1:9001")]))
        .expect_err("trust");
    assert!(peers.to_string().contains("cluster-secret"));
    Config::resolve(
        None,
        Vec::new(),
        &flags(&[("peers", "1=127.0.0.1:9001"), ("cluster.secret", "s")]),
    )
    .expect("a secret is enough");
}

#[test]
fn addresses_are_ip_or_dns_names_with_a_port() {
    for good in [
        "127.0.0.1:8080",
        "[::1]:9080",
        "localhost:0",
        "narad-0.narad:9080",
        "narad-0.narad.default.svc.cluster.local.:9080",
    ] {
        assert_eq!(check_host_port(good), Ok(()), "{good}");
    }
    for bad in [
        "localhost",
        "host:port",
        ":80",
        "-bad.example:80",
        "under_score:80",
        "a..b:80",
        "127.0.0.1:70000",
    ] {
        assert!(check_host_port(bad).is_err(), "{bad}");
    }
}

#[test]
fn join_is_refused_beside_peers_and_without_trust_between_nodes() {
    let both = Config::resolve(
        None,
        Vec::new(),
        &flags(&[
            ("join", "127.0.0.1:9080"),
            ("peers", "1=127.0.0.1:9080"),
            ("cluster.secret", "s"),
        ]),
    )
    .expect_err("join and peers");
    assert!(both.to_string().contains("--join"), "{both}");
    let untrusted = Config::resolve(None, Vec::new(), &flags(&[("join", "127.0.0.1:9080")]))
        .expect_err("no secret");
    assert!(
        untrusted.to_string().contains("cluster-secret"),
        "{untrusted}"
    );
    let bad = Config::resolve(None, Vec::new(), &flags(&[("join", "no-port")]))
        .expect_err("not HOST:PORT");
    assert!(bad.to_string().contains("join"), "{bad}");
    Config::resolve(
        None,
        Vec::new(),
        &flags(&[("join", "narad-0.narad:9080"), ("cluster.secret", "s")]),
    )
    .expect("a DNS name to join through");
}
