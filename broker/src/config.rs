//! Node configuration: every key of docs/configuration.md with its default, from four
//! sources in this order of precedence: flags and `--set KEY=VALUE`, then
//! `NARAD_` environment variables (the key upper-cased, `.` → `__`), then the
//! TOML file, then the defaults. A key no source may set is refused, naming
//! the key; so is a value that does not parse or is out of range.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use crate::limits::RETENTION_FLOOR_MS;
use narad_storage::limits::{BLOCK_BYTES, WAL_RING_BYTES_MIN};

/// Where a value came from, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    Default,
    File,
    Env,
    Flag,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Default => "default",
            Self::File => "config file",
            Self::Env => "environment",
            Self::Flag => "command line",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("unknown config key {key:?} (from the {from})")]
    UnknownKey { key: String, from: Source },
    #[error("config key {key} = {value:?} (from the {from}): {reason}")]
    InvalidValue {
        key: String,
        value: String,
        from: Source,
        reason: String,
    },
    #[error("config file {path}: {reason}")]
    File { path: String, reason: String },
    #[error("{0}")]
    Inconsistent(String),
}

/// The kind of value a key takes.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// An integer in `min..=max`.
    U64 {
        min: u64,
        max: u64,
    },
    Text,
    Addr,
    /// `true` or `false`.
    Bool,
    /// One of these words.
    OneOf(&'static [&'static str]),
}

/// Every key, its kind and its default (`None`: unset unless given).
const KEYS: &[(&str, Kind, Option<&str>)] = &[
    ("data_dir", Kind::Text, Some("./narad-data")),
    ("listen", Kind::Addr, Some("127.0.0.1:8080")),
    (
        "node_id",
        Kind::U64 {
            min: 1,
            max: 65_535,
        },
        Some("1"),
    ),
    ("peer_listen", Kind::Addr, Some("127.0.0.1:9080")),
    ("peers", Kind::Text, None),
    ("join", Kind::Addr, None),
    ("shards", Kind::U64 { min: 0, max: 1024 }, Some("0")),
    (
        "storage.consumer_offset_commit_interval_ms",
        Kind::U64 {
            min: 1,
            max: 3_600_000,
        },
        Some("1000"),
    ),
    (
        "storage.ack_flush_interval_ms",
        Kind::U64 {
            min: 1,
            max: 3_600_000,
        },
        Some("100"),
    ),
    (
        "storage.segment_bytes",
        Kind::U64 {
            min: 2 * BLOCK_BYTES,
            max: 1 << 34,
        },
        Some("67108864"),
    ),
    (
        "storage.wal_ring_bytes",
        Kind::U64 {
            min: WAL_RING_BYTES_MIN,
            max: 1 << 40,
        },
        Some("268435456"),
    ),
    (
        "dispatcher.max_linger_ms",
        Kind::U64 {
            min: 0,
            max: 10_000,
        },
        Some("50"),
    ),
    (
        "dispatcher.busy_linger_ms",
        Kind::U64 {
            min: 0,
            max: 10_000,
        },
        Some("10"),
    ),
    (
        "dispatcher.checkpoint_interval_ms",
        Kind::U64 {
            min: 1,
            max: 60_000,
        },
        Some("250"),
    ),
    (
        "dispatcher.reroute_after_ms",
        Kind::U64 {
            min: 1,
            max: 3_600_000,
        },
        Some("3000"),
    ),
    (
        "leases.sweep_interval_ms",
        Kind::U64 {
            min: 1,
            max: 3_600_000,
        },
        Some("1000"),
    ),
    (
        "cluster.heartbeat_interval_ms",
        Kind::U64 {
            min: 1,
            max: 3_600_000,
        },
        Some("1000"),
    ),
    (
        "cluster.node_dead_after_ms",
        Kind::U64 {
            min: 1,
            max: 86_400_000,
        },
        Some("30000"),
    ),
    (
        "cluster.move_promote_after_ms",
        Kind::U64 {
            min: 100,
            max: 86_400_000,
        },
        Some("120000"),
    ),
    (
        "cluster.max_concurrent_moves",
        Kind::U64 { min: 1, max: 64 },
        Some("2"),
    ),
    (
        "cluster.move_bytes_per_s",
        Kind::U64 {
            min: 4_096,
            max: 1 << 40,
        },
        Some("104857600"),
    ),
    ("cluster.secret", Kind::Text, None),
    ("cluster.tls.ca_file", Kind::Text, None),
    ("cluster.tls.cert_file", Kind::Text, None),
    ("cluster.tls.key_file", Kind::Text, None),
    (
        "topics.default_retention_ms",
        Kind::U64 {
            min: 0,
            max: u64::MAX,
        },
        Some("604800000"),
    ),
    (
        "topics.default_visibility_timeout_ms",
        Kind::U64 {
            min: 1,
            max: 43_200_000,
        },
        Some("30000"),
    ),
    (
        "topics.default_idempotency_window_ms",
        Kind::U64 {
            min: 0,
            max: 86_400_000,
        },
        Some("300000"),
    ),
    // The smallest non-zero retention a topic may have: at least the
    // contract's hour, unless `testing.short_retention` lets a test lower it.
    (
        "topics.retention_floor_ms",
        Kind::U64 {
            min: 1,
            max: u64::MAX,
        },
        Some("3600000"),
    ),
    // Entries between two snapshots of the metastore (which purge its log).
    (
        "raft.snapshot_after_entries",
        Kind::U64 {
            min: 1,
            max: u64::MAX,
        },
        Some("1000"),
    ),
    (
        "http.header_timeout_ms",
        Kind::U64 {
            min: 1,
            max: 3_600_000,
        },
        Some("10000"),
    ),
    (
        "http.body_timeout_ms",
        Kind::U64 {
            min: 1,
            max: 3_600_000,
        },
        Some("30000"),
    ),
    (
        "http.idle_timeout_ms",
        Kind::U64 {
            min: 1,
            max: 86_400_000,
        },
        Some("120000"),
    ),
    (
        "http.max_batch_bytes",
        Kind::U64 {
            min: 1024,
            max: 1 << 30,
        },
        Some("16777216"),
    ),
    // Node-wide bounds on what clients hold: connections, and bytes of
    // request bodies being read or handled.
    (
        "http.max_connections",
        Kind::U64 {
            min: 1,
            max: 10_000_000,
        },
        Some("10000"),
    ),
    (
        "http.max_buffered_body_bytes",
        Kind::U64 {
            min: 1024,
            max: 1 << 40,
        },
        Some("1073741824"),
    ),
    // HTTPS on the client port (docs/security.md).
    ("http.tls.cert_file", Kind::Text, None),
    ("http.tls.key_file", Kind::Text, None),
    ("http.tls.client_ca_file", Kind::Text, None),
    // The Kafka protocol listener (docs/kafka-clients.md).
    ("kafka.listen", Kind::Addr, None),
    ("kafka.advertised_address", Kind::Addr, None),
    ("kafka.tls.cert_file", Kind::Text, None),
    ("kafka.tls.key_file", Kind::Text, None),
    // Authentication and grants (docs/security.md).
    ("auth.enabled", Kind::Bool, Some("false")),
    ("ui.enabled", Kind::Bool, Some("true")),
    ("auth.admin_password", Kind::Text, None),
    ("auth.admin_password_file", Kind::Text, None),
    // Remote children (docs/children.md): the CA their https:// targets
    // are verified against, and requests in flight per node to each.
    ("children.remote_ca_file", Kind::Text, None),
    (
        "children.remote_max_in_flight",
        Kind::U64 { min: 1, max: 1024 },
        Some("4"),
    ),
    // For tests only: a fault layer under every storage file, switched at
    // runtime through `<data_dir>/fault-control` (see docs/testing.md).
    (
        "testing.faults",
        Kind::OneOf(&["off", "switchable", "power_loss"]),
        Some("off"),
    ),
    // For tests only: lets `topics.retention_floor_ms` go below an hour.
    ("testing.short_retention", Kind::Bool, Some("false")),
];

/// Environment variables with the `NARAD_` prefix that are not config keys.
const NON_CONFIG_ENV: &[&str] = &[
    "NARAD_URL",
    "NARAD_LOG",
    "NARAD_TOKEN",
    "NARAD_USER",
    "NARAD_PASSWORD",
    "NARAD_CA_FILE",
    "NARAD_CERT_FILE",
    "NARAD_KEY_FILE",
];

/// The resolved configuration: every key's value and where it came from.
#[derive(Debug, Clone)]
pub struct Config {
    values: BTreeMap<&'static str, (Option<String>, Source)>,
}

/// Puts `value` at the path `parts` of a nested JSON object.
fn insert_at(
    map: &mut serde_json::Map<String, serde_json::Value>,
    parts: &[&str],
    value: serde_json::Value,
) {
    match parts {
        [] => {}
        [leaf] => {
            map.insert((*leaf).to_string(), value);
        }
        [first, rest @ ..] => {
            let entry = map
                .entry((*first).to_string())
                .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
            if let Some(inner) = entry.as_object_mut() {
                insert_at(inner, rest, value);
            }
        }
    }
}

/// The environment variable of a key: `storage.segment_bytes` → `NARAD_STORAGE__SEGMENT_BYTES`.
pub fn env_name(key: &str) -> String {
    format!("NARAD_{}", key.to_uppercase().replace('.', "__"))
}

fn spec(key: &str) -> Option<(&'static str, Kind)> {
    KEYS.iter()
        .find(|(k, _, _)| *k == key)
        .map(|(k, kind, _)| (*k, *kind))
}

/// Whether `value` is `HOST:PORT`: an IPv4 address, an IPv6 address in
/// brackets, or a DNS name (`narad-0.narad.default.svc`), and a port. A
/// name is looked up where it is used, not here: a peer's name may not
/// resolve yet when this node starts.
pub fn check_host_port(value: &str) -> Result<(), String> {
    if value.parse::<SocketAddr>().is_ok() {
        return Ok(());
    }
    let (host, port) = value
        .rsplit_once(':')
        .ok_or_else(|| "no :PORT".to_string())?;
    port.parse::<u16>()
        .map_err(|_| format!("{port:?} is not a port"))?;
    let label_ok = |label: &str| {
        (1..=63).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(format!("{host:?} is neither an IP address nor a DNS name"));
    }
    Ok(())
}

fn check(key: &str, value: &str, kind: Kind, source: Source) -> Result<(), ConfigError> {
    let invalid = |reason: String| ConfigError::InvalidValue {
        key: key.to_string(),
        value: value.to_string(),
        from: source,
        reason,
    };
    match kind {
        Kind::U64 { min, max } => match value.trim().parse::<u64>() {
            Ok(v) if (min..=max).contains(&v) => Ok(()),
            _ => Err(invalid(format!("must be an integer from {min} to {max}"))),
        },
        Kind::Addr => {
            check_host_port(value).map_err(|why| invalid(format!("must be HOST:PORT: {why}")))
        }
        Kind::Text => Ok(()),
        Kind::Bool => match value.trim() {
            "true" | "false" => Ok(()),
            _ => Err(invalid("must be true or false".into())),
        },
        Kind::OneOf(words) => {
            if words.contains(&value) {
                Ok(())
            } else {
                Err(invalid(format!("must be one of {}", words.join(", "))))
            }
        }
    }
}

/// Flattens a TOML table into dotted keys with string values.
fn flatten(
    prefix: &str,
    table: &toml::Table,
    out: &mut Vec<(String, String)>,
) -> Result<(), ConfigError> {
    for (name, value) in table {
        let key = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        match value {
            toml::Value::Table(inner) => flatten(&key, inner, out)?,
            toml::Value::String(s) => out.push((key, s.clone())),
            toml::Value::Integer(i) => out.push((key, i.to_string())),
            toml::Value::Boolean(b) => out.push((key, b.to_string())),
            other => {
                return Err(ConfigError::InvalidValue {
                    key,
                    value: other.to_string(),
                    from: Source::File,
                    reason: "must be a string, an integer or a boolean".into(),
                })
            }
        }
    }
    Ok(())
}

impl Config {
    /// Resolves the configuration from its sources. `file` is the TOML text
    /// (and its path, for messages); `env` the process environment; `flags`
    /// the `KEY=VALUE` pairs of flags and `--set`, in order (later wins).
    pub fn resolve(
        file: Option<(&str, &str)>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &[(String, String)],
    ) -> Result<Self, ConfigError> {
        let mut values: BTreeMap<&'static str, (Option<String>, Source)> = KEYS
            .iter()
            .map(|(k, _, d)| (*k, (d.map(str::to_string), Source::Default)))
            .collect();
        let mut set = |key: &str, value: String, source: Source| -> Result<(), ConfigError> {
            let (name, kind) = spec(key).ok_or_else(|| ConfigError::UnknownKey {
                key: key.to_string(),
                from: source,
            })?;
            check(name, &value, kind, source)?;
            values.insert(name, (Some(value), source));
            Ok(())
        };
        if let Some((path, text)) = file {
            let table: toml::Table =
                text.parse()
                    .map_err(|e: toml::de::Error| ConfigError::File {
                        path: path.to_string(),
                        reason: e.to_string(),
                    })?;
            let mut pairs = Vec::new();
            flatten("", &table, &mut pairs)?;
            for (key, value) in pairs {
                set(&key, value, Source::File)?;
            }
        }
        let mut env: Vec<(String, String)> = env
            .into_iter()
            .filter(|(name, _)| name.starts_with("NARAD_"))
            .collect();
        env.sort();
        for (name, value) in env {
            if NON_CONFIG_ENV.contains(&name.as_str()) {
                continue;
            }
            let key = name
                .trim_start_matches("NARAD_")
                .to_lowercase()
                .replace("__", ".");
            // A name with `__` has the shape of a sectioned key: it must be
            // one (a typo is refused, not ignored). Other `NARAD_` names are
            // config keys only when they name one (tests use `NARAD_SIM_SEED`
            // and the like for themselves).
            if name.contains("__") || spec(&key).is_some() {
                set(&key, value, Source::Env)?;
            }
        }
        for (key, value) in flags {
            set(key, value.clone(), Source::Flag)?;
        }
        let config = Self { values };
        config.check_consistency()?;
        Ok(config)
    }

    fn check_consistency(&self) -> Result<(), ConfigError> {
        if self.u64("storage.wal_ring_bytes") % BLOCK_BYTES != 0 {
            return Err(ConfigError::Inconsistent(format!(
                "storage.wal_ring_bytes must be a multiple of {BLOCK_BYTES}"
            )));
        }
        if self.u64("storage.segment_bytes") % BLOCK_BYTES != 0 {
            return Err(ConfigError::Inconsistent(format!(
                "storage.segment_bytes must be a multiple of {BLOCK_BYTES}"
            )));
        }
        if self.u64("storage.ack_flush_interval_ms")
            > self.u64("storage.consumer_offset_commit_interval_ms")
        {
            return Err(ConfigError::Inconsistent(
                "storage.ack_flush_interval_ms must not exceed storage.consumer_offset_commit_interval_ms".into(),
            ));
        }
        let largest_body = 2 * self.u64("http.max_batch_bytes");
        if self.u64("http.max_buffered_body_bytes") < largest_body {
            return Err(ConfigError::Inconsistent(format!(
                "http.max_buffered_body_bytes must be at least twice http.max_batch_bytes ({largest_body}), or no batch could ever be read"
            )));
        }
        let retention = self.u64("topics.default_retention_ms");
        let floor = self.u64("topics.retention_floor_ms");
        if floor < RETENTION_FLOOR_MS && self.text("testing.short_retention") != Some("true") {
            return Err(ConfigError::Inconsistent(format!(
                "topics.retention_floor_ms must be at least {RETENTION_FLOOR_MS} (one hour: retention is at least that long), got {floor}; only tests lower it, with testing.short_retention = true"
            )));
        }
        if retention != 0 && retention < floor {
            return Err(ConfigError::Inconsistent(format!(
                "topics.default_retention_ms must be 0 (forever) or at least {floor} (the retention floor), got {retention}"
            )));
        }
        let has_tls = [
            "cluster.tls.ca_file",
            "cluster.tls.cert_file",
            "cluster.tls.key_file",
        ]
        .iter()
        .all(|k| self.text(k).is_some());
        match (
            self.text("http.tls.cert_file"),
            self.text("http.tls.key_file"),
            self.text("http.tls.client_ca_file"),
        ) {
            (Some(_), Some(_), _) | (None, None, None) => {}
            (None, None, Some(_)) => return Err(ConfigError::Inconsistent(
                "http.tls.client_ca_file needs http.tls.cert_file and http.tls.key_file (HTTPS)"
                    .into(),
            )),
            _ => {
                return Err(ConfigError::Inconsistent(
                    "http.tls.cert_file and http.tls.key_file go together".into(),
                ))
            }
        }
        let passwords = [
            self.text("auth.admin_password"),
            self.text("auth.admin_password_file"),
        ];
        match passwords {
            [Some(_), Some(_)] => {
                return Err(ConfigError::Inconsistent(
                    "give auth.admin_password or auth.admin_password_file, not both".into(),
                ))
            }
            [Some(""), None] => {
                return Err(ConfigError::Inconsistent(
                    "auth.admin_password must not be empty".into(),
                ))
            }
            [None, None] if self.text("auth.enabled") == Some("true") => {
                return Err(ConfigError::Inconsistent(
                    "auth.enabled needs auth.admin_password or auth.admin_password_file (the password of the user admin)".into(),
                ))
            }
            _ => {}
        }
        if self.text("kafka.advertised_address").is_some() && self.text("kafka.listen").is_none() {
            return Err(ConfigError::Inconsistent(
                "kafka.advertised_address needs kafka.listen (the Kafka listener it names)".into(),
            ));
        }
        let kafka_tls = [
            self.text("kafka.tls.cert_file"),
            self.text("kafka.tls.key_file"),
        ];
        match kafka_tls {
            [Some(_), Some(_)] | [None, None] => {}
            _ => {
                return Err(ConfigError::Inconsistent(
                    "kafka.tls.cert_file and kafka.tls.key_file go together".into(),
                ))
            }
        }
        if kafka_tls[0].is_some() && self.text("kafka.listen").is_none() {
            return Err(ConfigError::Inconsistent(
                "kafka.tls.cert_file needs kafka.listen (the Kafka listener it secures)".into(),
            ));
        }
        if self.text("kafka.listen").is_some()
            && self.text("auth.enabled") == Some("true")
            && kafka_tls[0].is_none()
        {
            return Err(ConfigError::Inconsistent(
                "kafka.listen with auth.enabled needs kafka.tls.cert_file and kafka.tls.key_file: SASL PLAIN sends passwords, which must not cross the network in the clear".into(),
            ));
        }
        if self.text("peers").is_some() && self.text("join").is_some() {
            return Err(ConfigError::Inconsistent(
                "give --join (a new node joining a running cluster) or --peers (the initial members), not both".into(),
            ));
        }
        if self.text("join").is_some() && self.text("cluster.secret").is_none() && !has_tls {
            return Err(ConfigError::Inconsistent(
                "--join needs --cluster-secret (development) or cluster.tls.ca_file, cert_file and key_file (production)"
                    .into(),
            ));
        }
        if self.text("peers").is_some() && self.text("cluster.secret").is_none() && !has_tls {
            return Err(ConfigError::Inconsistent(
                "--peers needs --cluster-secret (development) or cluster.tls.ca_file, cert_file and key_file (production)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// An integer key's value, for the checks above. Panics on a key that
    /// is not an integer key: that is a programming error, caught by the
    /// tests. Everything else reads [`crate::settings::Settings`].
    fn u64(&self, key: &str) -> u64 {
        self.text(key)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("config key {key} is not a set integer"))
    }

    fn text(&self, key: &str) -> Option<&str> {
        self.values.get(key).and_then(|(v, _)| v.as_deref())
    }

    /// Where a key's value came from.
    pub fn source(&self, key: &str) -> Option<Source> {
        self.values.get(key).map(|(_, s)| *s)
    }

    /// Every value as one JSON object nested at the dots (integers as
    /// numbers, unset keys as null), for [`crate::settings::Settings`].
    pub fn nested(&self) -> serde_json::Value {
        let mut root = serde_json::Map::new();
        for (key, kind, _) in KEYS {
            let value = match (self.text(key), kind) {
                (None, _) => serde_json::Value::Null,
                (Some(text), Kind::U64 { .. }) => text
                    .trim()
                    .parse::<u64>()
                    .map_or_else(|_| text.into(), serde_json::Value::from),
                (Some(text), Kind::Bool) => serde_json::Value::Bool(text.trim() == "true"),
                (Some(text), _) => text.into(),
            };
            let parts: Vec<&str> = key.split('.').collect();
            insert_at(&mut root, &parts, value);
        }
        serde_json::Value::Object(root)
    }

    /// Every key with its default, for the configuration reference.
    pub fn keys() -> impl Iterator<Item = (&'static str, Option<&'static str>)> {
        KEYS.iter().map(|(k, _, d)| (*k, *d))
    }
}

#[cfg(test)]
mod tests;
