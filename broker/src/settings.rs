//! Every setting, typed: read once from the resolved [`Config`] at start
//! (through serde), so the code names a setting by its field and a
//! misspelt one does not compile. The key table, the sources' precedence
//! and the checks stay in [`crate::config`]; a key the table accepts that
//! has no field here fails [`Settings::from_config`] (and its test).

use std::path::PathBuf;

use serde::Deserialize;

use crate::config::Config;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub data_dir: PathBuf,
    /// `HOST:PORT`, an IP address or a DNS name (looked up to bind).
    pub listen: String,
    pub node_id: u16,
    pub peer_listen: String,
    /// `1=HOST:PORT,2=HOST:PORT`; unset for a single node.
    pub peers: Option<String>,
    /// A member's peer address to join a running cluster through.
    pub join: Option<String>,
    /// 0: one per core.
    pub shards: u64,
    pub storage: Storage,
    pub dispatcher: Dispatcher,
    pub leases: Leases,
    pub cluster: Cluster,
    pub topics: Topics,
    pub raft: Raft,
    pub http: Http,
    pub auth: Auth,
    pub kafka: Kafka,
    pub ui: Ui,
    pub children: Children,
    pub testing: Testing,
}

/// The console at `/ui/`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ui {
    pub enabled: bool,
}

/// Remote children, node-wide.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Children {
    /// The CA remote children's `https://` targets are verified against
    /// (else the system's bundle).
    pub remote_ca_file: Option<String>,
    /// Requests in flight per node to each remote child.
    pub remote_max_in_flight: u64,
}

/// The Kafka protocol listener: off unless `listen` is set.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kafka {
    pub listen: Option<String>,
    /// What Metadata tells clients to connect to (default: `listen`).
    pub advertised_address: Option<String>,
    pub tls: KafkaTls,
}

/// The Kafka listener's certificate: TLS only when both are set.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaTls {
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Auth {
    pub enabled: bool,
    /// The password `admin` starts with (read from `admin_password_file`
    /// when that is given).
    pub admin_password: Option<Secret>,
    pub admin_password_file: Option<String>,
}

/// A value never shown in logs or debug output.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn reveal(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<secret>")
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Storage {
    pub consumer_offset_commit_interval_ms: u64,
    pub ack_flush_interval_ms: u64,
    pub segment_bytes: u64,
    pub wal_ring_bytes: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dispatcher {
    pub max_linger_ms: u64,
    pub busy_linger_ms: u64,
    pub checkpoint_interval_ms: u64,
    pub reroute_after_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Leases {
    pub sweep_interval_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    pub heartbeat_interval_ms: u64,
    pub node_dead_after_ms: u64,
    pub move_promote_after_ms: u64,
    pub max_concurrent_moves: u64,
    pub move_bytes_per_s: u64,
    pub secret: Option<String>,
    pub tls: ClusterTls,
}

/// The operator's certificate files for the peer network (all three, or
/// the cluster secret instead).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterTls {
    pub ca_file: Option<String>,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topics {
    pub default_retention_ms: u64,
    pub default_visibility_timeout_ms: u64,
    /// The `idempotency_window_ms` a topic created without one gets.
    pub default_idempotency_window_ms: u64,
    pub retention_floor_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Raft {
    pub snapshot_after_entries: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Http {
    pub header_timeout_ms: u64,
    pub body_timeout_ms: u64,
    pub idle_timeout_ms: u64,
    pub max_batch_bytes: u64,
    pub max_connections: u64,
    pub max_buffered_body_bytes: u64,
    pub tls: HttpTls,
}

/// HTTPS on the client port: both files, or plain HTTP.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpTls {
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub client_ca_file: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Testing {
    /// `off`, `switchable` or `power_loss`.
    pub faults: String,
    /// Whether `topics.retention_floor_ms` may be below an hour (the
    /// configuration refuses a lower floor without it).
    pub short_retention: bool,
}

impl Settings {
    /// The settings of a resolved configuration (its values were checked
    /// against the key table already, so only a key without a field here,
    /// a programming error, can fail this).
    pub fn from_config(config: &Config) -> Result<Self, String> {
        let mut settings: Self = serde_json::from_value(config.nested())
            .map_err(|e| format!("the configuration does not fit the settings: {e}"))?;
        if let Some(path) = &settings.auth.admin_password_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("auth.admin_password_file {path}: {e}"))?;
            // A file written by `echo` ends in a newline that is no part
            // of the password.
            let password = text.trim_end_matches(['\n', '\r']);
            if password.is_empty() {
                return Err(format!("auth.admin_password_file {path} is empty"));
            }
            settings.auth.admin_password = Some(Secret(password.to_string()));
        }
        Ok(settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_accepted_key_has_a_typed_setting() {
        // `deny_unknown_fields` on every level: a key the table accepts
        // without a field fails here, and a field without a key fails as
        // missing.
        let config = Config::resolve(None, Vec::new(), &[]).expect("defaults");
        let settings = Settings::from_config(&config).expect("settings");
        assert_eq!(settings.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(settings.dispatcher.reroute_after_ms, 3000);
        assert_eq!(settings.storage.ack_flush_interval_ms, 100);
        assert!(settings.peers.is_none() && settings.cluster.tls.ca_file.is_none());
        assert!(!settings.auth.enabled && settings.auth.admin_password.is_none());
        let set = Config::resolve(
            None,
            Vec::new(),
            &[
                ("cluster.secret".to_string(), "s".to_string()),
                ("peers".to_string(), "1=127.0.0.1:9080".to_string()),
                ("node_id".to_string(), "7".to_string()),
            ],
        )
        .expect("flags");
        let settings = Settings::from_config(&set).expect("settings");
        assert_eq!(settings.node_id, 7);
        assert_eq!(settings.cluster.secret.as_deref(), Some("s"));
    }

    /// The settings of these flags, or the refusal.
    fn resolve(pairs: &[(&str, &str)]) -> Result<Settings, String> {
        let pairs = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>();
        Config::resolve(None, Vec::new(), &pairs)
            .map_err(|e| e.to_string())
            .and_then(|c| Settings::from_config(&c))
    }

    #[test]
    fn the_admin_password_comes_from_its_key_or_its_file_and_never_shows() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("admin-password");
        std::fs::write(&file, "from-file\n").expect("write");
        let settings = resolve(&[
            ("auth.enabled", "true"),
            ("auth.admin_password_file", file.to_str().expect("utf8")),
        ])
        .expect("settings");
        assert!(settings.auth.enabled);
        let password = settings.auth.admin_password.as_ref().expect("password");
        assert_eq!(password.reveal(), "from-file");
        assert!(!format!("{settings:?}").contains("from-file"));
        let settings = resolve(&[("auth.admin_password", "p")]).expect("settings");
        assert_eq!(
            settings.auth.admin_password.map(|p| p.0).as_deref(),
            Some("p")
        );
        for (pairs, says) in [
            (vec![("auth.enabled", "true")], "auth.enabled needs"),
            (vec![("auth.enabled", "yes")], "true or false"),
            (
                vec![
                    ("auth.admin_password", "a"),
                    ("auth.admin_password_file", "f"),
                ],
                "not both",
            ),
            (
                vec![("auth.admin_password_file", "/nonexistent/pw")],
                "/nonexistent/pw",
            ),
        ] {
            let error = resolve(&pairs).expect_err("refused");
            assert!(error.contains(says), "{error}");
        }
    }

    #[test]
    fn the_kafka_listener_is_off_unless_asked_and_takes_auth_only_over_tls() {
        let off = resolve(&[]).expect("defaults");
        assert!(off.kafka.listen.is_none() && off.kafka.advertised_address.is_none());
        assert!(off.kafka.tls.cert_file.is_none() && off.kafka.tls.key_file.is_none());
        let secured = resolve(&[
            ("kafka.listen", "127.0.0.1:9092"),
            ("kafka.tls.cert_file", "c.pem"),
            ("kafka.tls.key_file", "k.pem"),
            ("auth.enabled", "true"),
            ("auth.admin_password", "p"),
        ])
        .expect("auth with TLS on the listener");
        assert_eq!(secured.kafka.tls.key_file.as_deref(), Some("k.pem"));
        let on = resolve(&[
            ("kafka.listen", "0.0.0.0:9092"),
            ("kafka.advertised_address", "broker-1.example:9092"),
        ])
        .expect("settings");
        assert_eq!(on.kafka.listen.as_deref(), Some("0.0.0.0:9092"));
        assert_eq!(
            on.kafka.advertised_address.as_deref(),
            Some("broker-1.example:9092")
        );
        for (pairs, says) in [
            (
                vec![("kafka.advertised_address", "h:9092")],
                "kafka.advertised_address needs kafka.listen",
            ),
            (
                vec![
                    ("kafka.listen", "127.0.0.1:9092"),
                    ("auth.enabled", "true"),
                    ("auth.admin_password", "p"),
                ],
                "kafka.listen with auth.enabled needs kafka.tls.cert_file",
            ),
            (
                vec![
                    ("kafka.listen", "127.0.0.1:9092"),
                    ("kafka.tls.cert_file", "c.pem"),
                ],
                "kafka.tls.cert_file and kafka.tls.key_file go together",
            ),
            (
                vec![
                    ("kafka.tls.cert_file", "c.pem"),
                    ("kafka.tls.key_file", "k.pem"),
                ],
                "kafka.tls.cert_file needs kafka.listen",
            ),
            (vec![("kafka.listen", "no-port")], "kafka.listen"),
        ] {
            let error = resolve(&pairs).expect_err("refused");
            assert!(error.contains(says), "{error}");
        }
    }
}
