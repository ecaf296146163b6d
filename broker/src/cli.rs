//! The client subcommands of `narad`: topics, produce and consume over
//! `narad-client` (its blocking form). Human-readable tables by default, the API's JSON with
//! `--output json`; any failure exits non-zero with the error's message.

use std::io::Read;

use clap::{Args, Subcommand, ValueEnum};
use std::time::Duration;

use narad_client::blocking::Client;
use narad_client::{
    encode_segment, ClientTlsFiles, Error as ClientError, Outgoing, Response, Settle as Settling,
};
use narad_net::types::{CONSUME_MAX_MESSAGES_MAX, CONSUME_WAIT_MS_MAX, VISIBILITY_TIMEOUT_MS_MAX};
use serde_json::{json, Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Human,
    Json,
}

#[derive(Args, Debug)]
pub struct ClientArgs {
    /// The node to talk to.
    #[arg(
        long,
        env = "NARAD_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub server: String,
    /// Output format.
    #[arg(long, value_enum, default_value = "human", global = true)]
    pub output: Output,
    /// A bearer token (with auth on).
    #[arg(long, env = "NARAD_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// A user name, with `--password` (with auth on).
    #[arg(long = "user", id = "auth_user", env = "NARAD_USER", global = true)]
    pub user: Option<String>,
    /// The password of `--user`.
    #[arg(long, env = "NARAD_PASSWORD", global = true, hide_env_values = true)]
    pub password: Option<String>,
    /// PEM file of the CA that signed the node's certificate (https://
    /// URLs; without it, the system's CA bundle).
    #[arg(long, env = "NARAD_CA_FILE", global = true)]
    pub ca_file: Option<String>,
    /// This client's certificate and key (PEM), for a node that asks for one.
    #[arg(long, env = "NARAD_CERT_FILE", global = true)]
    pub cert_file: Option<String>,
    #[arg(long, env = "NARAD_KEY_FILE", global = true)]
    pub key_file: Option<String>,
    /// Seconds one attempt of a request may take before it is given up
    /// (a call makes up to 5 attempts when the error is retryable); a long
    /// poll waits its `--wait-ms` on top.
    #[arg(
        long,
        env = "NARAD_TIMEOUT",
        value_name = "SECONDS",
        default_value_t = CLIENT_TIMEOUT_SECONDS,
        value_parser = clap::value_parser!(u64).range(1..),
        global = true
    )]
    pub timeout: u64,
}

/// The default of `--timeout`.
pub const CLIENT_TIMEOUT_SECONDS: u64 = 60;

/// How long each long poll of `narad consume --follow` waits when
/// `--wait-ms` does not say (the API's longest).
pub const FOLLOW_WAIT_MS: u64 = 20_000;

/// The most messages one batch request carries (the API's limit).
pub const BATCH_MESSAGES_MAX: u32 = 1_000;

/// `narad produce`: where its messages come from.
#[derive(Args, Debug)]
pub struct ProduceArgs {
    pub topic: String,
    /// The message; absent or `-`: all of stdin (or of `--file`) as one
    /// message.
    pub value: Option<String>,
    /// The messages' key (messages with one key go to one partition).
    #[arg(long)]
    pub key: Option<String>,
    /// Read from FILE instead of stdin.
    #[arg(long, value_name = "FILE")]
    pub file: Option<String>,
    /// One message per line (empty lines are skipped), sent with the batch API.
    #[arg(long)]
    pub lines: bool,
    /// Names the message for retries: sent again with the same key within
    /// the topic's idempotency window, it is stored once (1-256 printable
    /// ASCII characters). With `--lines`, line N (from 0) gets `KEY-N`.
    /// Without it, each message gets a fresh key, which covers the CLI's
    /// own retries.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Messages per batch request with `--lines` (1-1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=i64::from(BATCH_MESSAGES_MAX)))]
    pub batch: u32,
}

/// `narad consume`: what to ask for and what to do with it.
#[derive(Args, Debug)]
pub struct ConsumeArgs {
    pub topic: String,
    /// At most this many messages per request (1-1000).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=CONSUME_MAX_MESSAGES_MAX as i64))]
    pub max: u32,
    /// Long poll: wait up to this long for the first message (0-20000;
    /// with `--follow`, 20000 unless given).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=CONSUME_WAIT_MS_MAX))]
    pub wait_ms: Option<u64>,
    /// Ack each message once it is printed.
    #[arg(long)]
    pub ack: bool,
    /// Keep consuming until interrupted, printing messages as they come.
    #[arg(long)]
    pub follow: bool,
    /// Consume only this partition.
    #[arg(long)]
    pub partition: Option<u32>,
    /// Lease length for these messages (1-43200000); the topic's otherwise.
    #[arg(long, visible_alias = "visibility-timeout", value_parser = clap::value_parser!(u64).range(1..=VISIBILITY_TIMEOUT_MS_MAX))]
    pub visibility_timeout_ms: Option<u64>,
}

/// `narad browse`: which page of which partition.
#[derive(Args, Debug)]
pub struct BrowseArgs {
    pub topic: String,
    /// The partition to read.
    #[arg(long)]
    pub partition: u32,
    /// The first offset to show; the partition's frontier (its oldest
    /// unacked message) unless given.
    #[arg(long)]
    pub offset: Option<u64>,
    /// At most this many messages (1-1000).
    #[arg(long, default_value_t = crate::limits::BROWSE_LIMIT_DEFAULT, value_parser = clap::value_parser!(u32).range(1..=i64::from(crate::limits::BROWSE_LIMIT_MAX)))]
    pub limit: u32,
}

/// `narad browse TOPIC --partition P [--offset O] [--limit N]`: a page of
/// one partition with each message's state and delivery count; nothing is
/// leased or acked.
pub fn browse(args: &ClientArgs, browse: &BrowseArgs) -> Result<(), String> {
    let client = client(args)?;
    let mut path = format!(
        "/v1/topics/{}/partitions/{}/messages?limit={}",
        encode_segment(&browse.topic),
        browse.partition,
        browse.limit
    );
    if let Some(offset) = browse.offset {
        path.push_str(&format!("&offset={offset}"));
    }
    let answer = client
        .request("GET", &path, &[], Vec::new(), Duration::ZERO)
        .map_err(failed)?
        .body;
    if args.output == Output::Json {
        print_json(&answer);
        return Ok(());
    }
    let messages = answer["messages"].as_array().cloned().unwrap_or_default();
    if messages.is_empty() {
        println!("no messages from offset {}", cell(&answer["next_offset"]));
    } else {
        let rows: Vec<Vec<String>> = messages
            .iter()
            .map(|m| {
                let mut row = message_row(m);
                // In place of the receipt (a browse has none): the state.
                row[4] = cell(&m["state"]);
                row
            })
            .collect();
        let mut columns = MESSAGE_COLUMNS;
        columns[4] = "STATE";
        print_table(&columns, &rows);
    }
    println!(
        "next offset {}, frontier {}, high watermark {}",
        cell(&answer["next_offset"]),
        cell(&answer["frontier"]),
        cell(&answer["high_watermark"])
    );
    Ok(())
}

/// `narad search`: what to look for.
#[derive(Args, Debug)]
pub struct SearchArgs {
    pub topic: String,
    /// Messages with exactly this key.
    #[arg(long)]
    pub key: Option<String>,
    /// Messages whose key or value contains this text (case-sensitive).
    #[arg(long)]
    pub contains: Option<String>,
    /// At most this many matches per request (1-1000).
    #[arg(long, default_value_t = crate::limits::BROWSE_LIMIT_DEFAULT, value_parser = clap::value_parser!(u32).range(1..=i64::from(crate::limits::BROWSE_LIMIT_MAX)))]
    pub limit: u32,
    /// Go on from where an earlier search stopped (the cursor it printed).
    #[arg(long)]
    pub cursor: Option<String>,
    /// Follow the cursor until every retained message was searched.
    #[arg(long)]
    pub all: bool,
}

/// `narad search TOPIC [--key K] [--contains TEXT] [--limit N] [--cursor C]
/// [--all]`: the topic's messages with a key or some text, searched at
/// their owners; nothing is leased or acked.
pub fn search(args: &ClientArgs, search: &SearchArgs) -> Result<(), String> {
    if search.key.is_none() && search.contains.as_deref().is_none_or(str::is_empty) {
        return Err("give --key, or a non-empty --contains, or both".into());
    }
    let client = client(args)?;
    let mut cursor = search.cursor.clone();
    let mut printed_header = false;
    loop {
        let mut query = form_urlencoded::Serializer::new(String::new());
        if let Some(key) = &search.key {
            query.append_pair("key", key);
        }
        if let Some(contains) = &search.contains {
            query.append_pair("contains", contains);
        }
        query.append_pair("limit", &search.limit.to_string());
        if let Some(cursor) = &cursor {
            query.append_pair("cursor", cursor);
        }
        let path = format!(
            "/v1/topics/{}/messages?{}",
            encode_segment(&search.topic),
            query.finish()
        );
        let answer = client
            .request("GET", &path, &[], Vec::new(), Duration::ZERO)
            .map_err(failed)?
            .body;
        let messages = answer["messages"].as_array().cloned().unwrap_or_default();
        cursor = answer["cursor"].as_str().map(str::to_string);
        match args.output {
            // One answer per line, as the API gave it.
            Output::Json => println!("{answer}"),
            Output::Human => {
                let mut columns = MESSAGE_COLUMNS;
                columns[4] = "STATE";
                if !printed_header && !messages.is_empty() {
                    println!("{}", columns.join("\t"));
                    printed_header = true;
                }
                for m in &messages {
                    let mut row = message_row(m);
                    row[4] = cell(&m["state"]);
                    println!("{}", row.join("\t"));
                }
            }
        }
        match (&cursor, search.all) {
            (Some(_), true) => continue,
            (Some(next), false) => {
                if args.output == Output::Human {
                    println!("more to search: --cursor {next}");
                }
                return Ok(());
            }
            (None, _) => {
                if args.output == Output::Human {
                    println!("every retained message searched");
                }
                return Ok(());
            }
        }
    }
}

/// What `narad ack|nack|extend` does with a receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    Ack,
    Nack { delay_ms: u64 },
    Extend { visibility_timeout_ms: u64 },
}

#[derive(Subcommand, Debug)]
pub enum TopicAction {
    /// Create a topic, or update the settings given.
    Create {
        name: String,
        #[command(flatten)]
        settings: TopicSettings,
    },
    /// List every topic.
    List,
    /// A topic's settings and per-partition figures.
    Describe { name: String },
    /// Delete a topic.
    Delete { name: String },
    /// A topic's children: kind, lag, dropped messages and state.
    Children { name: String },
}

/// A topic's settings as flags (those given only): the body of
/// `PUT /v1/topics/{topic}`, and the `topic` of a child.
#[derive(Args, Debug)]
pub struct TopicSettings {
    #[arg(long)]
    partitions: Option<u32>,
    #[arg(long)]
    retention_ms: Option<u64>,
    #[arg(long)]
    visibility_timeout_ms: Option<u64>,
    #[arg(long)]
    max_deliveries: Option<u32>,
    #[arg(long)]
    dead_letter_topic: Option<String>,
    #[arg(long)]
    max_message_bytes: Option<u64>,
}

impl TopicSettings {
    fn body(&self) -> Value {
        let given = [
            ("partitions", self.partitions.map(Value::from)),
            ("retention_ms", self.retention_ms.map(Value::from)),
            (
                "visibility_timeout_ms",
                self.visibility_timeout_ms.map(Value::from),
            ),
            ("max_deliveries", self.max_deliveries.map(Value::from)),
            (
                "dead_letter_topic",
                self.dead_letter_topic.clone().map(Value::from),
            ),
            ("max_message_bytes", self.max_message_bytes.map(Value::from)),
        ];
        Value::Object(
            given
                .into_iter()
                .filter_map(|(key, value)| Some((key.to_string(), value?)))
                .collect::<Map<String, Value>>(),
        )
    }
}

/// What `narad dlq` does.
#[derive(Subcommand, Debug)]
pub enum DlqAction {
    /// Move the messages of dead-letter topic DLQ to --to, each written
    /// durably there before it is acked in DLQ.
    Redrive {
        dlq: String,
        /// The topic to write the messages to (usually the one they were
        /// dead-lettered from).
        #[arg(long)]
        to: String,
        /// At most this many messages a second.
        #[arg(long)]
        rate_per_s: Option<u64>,
        /// Stop after this many.
        #[arg(long)]
        max_messages: Option<u64>,
    },
    /// DLQ's redrives: moved, remaining, state.
    Tasks { dlq: String },
    /// Cancel a running redrive.
    Cancel { dlq: String, id: String },
}

/// What `narad child` does.
// Parsed once per command run: the size of its largest variant costs
// nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum ChildAction {
    /// Create a child of PARENT that gets a copy of every message written
    /// to PARENT from now on (or change its settings).
    Create {
        parent: String,
        child: String,
        /// fanout (copy at once), delay (copy after --delay-ms), replica
        /// (each partition on another node than its parent partition) or
        /// remote (a topic of another Narad cluster: --remote-url,
        /// --remote-topic).
        #[arg(long, value_parser = ["fanout", "delay", "replica", "remote"])]
        kind: String,
        /// For a delay child: how long after the parent accepted a message
        /// its copy becomes consumable.
        #[arg(long)]
        delay_ms: Option<u64>,
        /// For a remote child: the other cluster (`https://HOST:PORT`).
        #[arg(long, value_name = "URL")]
        remote_url: Option<String>,
        /// For a remote child: the topic there (it must exist).
        #[arg(long, value_name = "TOPIC")]
        remote_topic: Option<String>,
        /// For a remote child: a file holding a bearer token of the other
        /// cluster with the produce grant on that topic (left out for a
        /// cluster without auth).
        #[arg(long, value_name = "PATH")]
        remote_token_file: Option<std::path::PathBuf>,
        /// For a remote child: bytes per second it ships at most, over the
        /// whole cluster.
        #[arg(long, value_name = "N")]
        rate_bytes_per_s: Option<u64>,
        /// The child topic's settings (as `topic create`).
        #[command(flatten)]
        settings: TopicSettings,
    },
    /// PARENT's children (as `topic children`).
    List { parent: String },
    /// Stop copying to CHILD; the child topic stays until deleted.
    Delete { parent: String, child: String },
}

fn client(args: &ClientArgs) -> Result<Client, String> {
    let builder = Client::builder(&args.server)
        .timeout(Duration::from_secs(args.timeout))
        .tls(ClientTlsFiles {
            ca_file: args.ca_file.clone(),
            cert_file: args.cert_file.clone(),
            key_file: args.key_file.clone(),
        });
    let builder = match (&args.token, &args.user, &args.password) {
        (Some(_), Some(_), _) => return Err("give --token or --user, not both".into()),
        (Some(token), None, _) => builder.token(token),
        (None, Some(user), Some(password)) => builder.password(user, password),
        (None, Some(_), None) => return Err("--user needs --password (or NARAD_PASSWORD)".into()),
        (None, None, _) => builder,
    };
    builder.build().map_err(failed)
}

fn failed(error: ClientError) -> String {
    match error {
        // Most often nothing listens there: say how to point elsewhere.
        ClientError::Transport(_) => format!(
            "{error}\n(is a node running there? point the CLI at one with --server URL or NARAD_URL)"
        ),
        error => error.to_string(),
    }
}

/// `3 partitions`, `1 partition`.
fn partitions(count: &Value) -> String {
    match count.as_u64() {
        Some(1) => "1 partition".into(),
        _ => format!("{} partitions", cell(count)),
    }
}

fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}

/// Prints rows as a left-aligned table.
fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.len());
            }
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths.get(i).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join("  ")
    };
    println!(
        "{}",
        line(header.iter().map(|h| h.to_string()).collect()).trim_end()
    );
    for row in rows {
        println!("{}", line(row.clone()).trim_end());
    }
}

fn cell(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// What `narad cluster` does.
#[derive(Subcommand, Debug)]
pub enum ClusterAction {
    /// The members, their state, the leader and the term.
    Status,
    /// Partition moves: state, bytes copied of total, rate, start, expected end.
    Moves,
    /// Plan moves that even partitions out over the live nodes.
    Rebalance,
    /// Move one partition to another node.
    Move {
        topic: String,
        partition: u32,
        /// The node to move it to.
        #[arg(long)]
        to: u64,
    },
    /// Move every partition off a node; it takes no new ones.
    Decommission { id: u64 },
    /// Admit a node (it then starts with `--join`).
    Join {
        id: u64,
        /// Its peer address, HOST:PORT.
        addr: String,
    },
    /// Remove a decommissioned or dead node that owns nothing.
    Remove { id: u64 },
}

/// A node's readiness in `narad cluster status`: `yes`, or `no` with the
/// reason's code (`-` from a node of a release that did not say).
fn readiness_cell(node: &Value) -> String {
    match node["ready"].as_bool() {
        Some(true) => "yes".to_string(),
        Some(false) => format!("no ({})", cell(&node["not_ready"]["code"])),
        None => "-".to_string(),
    }
}

pub fn cluster(args: &ClientArgs, action: &ClusterAction) -> Result<(), String> {
    let client = client(args)?;
    match action {
        ClusterAction::Status => {
            let status = call(&client, "GET", "/v1/cluster", &Value::Null)?.body;
            match args.output {
                Output::Json => print_json(&status),
                Output::Human => {
                    println!("cluster: {}", cell(&status["cluster_id"]));
                    println!("leader: {}", cell(&status["leader"]));
                    println!("term: {}", cell(&status["term"]));
                    let rows: Vec<Vec<String>> = status["nodes"]
                        .as_array()
                        .map(|nodes| {
                            nodes
                                .iter()
                                .map(|n| {
                                    let mut row: Vec<String> =
                                        ["id", "addr", "kafka_addr", "state", "partitions"]
                                            .iter()
                                            .map(|k| cell(&n[*k]))
                                            .collect();
                                    row.push(readiness_cell(n));
                                    row
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    print_table(
                        &["ID", "ADDR", "KAFKA", "STATE", "PARTITIONS", "READY"],
                        &rows,
                    );
                }
            }
        }
        ClusterAction::Moves => {
            let listing = call(&client, "GET", "/v1/cluster/moves", &Value::Null)?.body;
            print_moves(args.output, &listing);
        }
        ClusterAction::Rebalance => {
            let planned = call(&client, "POST", "/v1/cluster/rebalance", &json!({}))?.body;
            print_moves(args.output, &planned);
        }
        ClusterAction::Move {
            topic,
            partition,
            to,
        } => {
            let body = json!({"topic": topic, "partition": partition, "to": to});
            let planned = call(&client, "POST", "/v1/cluster/moves", &body)?.body;
            print_moves(args.output, &planned);
        }
        ClusterAction::Decommission { id } => {
            let path = format!("/v1/cluster/nodes/{id}/decommission");
            let planned = call(&client, "POST", &path, &json!({}))?.body;
            print_moves(args.output, &planned);
        }
        ClusterAction::Join { id, addr } => {
            let body = json!({"id": id, "addr": addr});
            let status = call(&client, "POST", "/v1/cluster/nodes", &body)?.body;
            match args.output {
                Output::Json => print_json(&status),
                Output::Human => println!(
                    "node {id} admitted at {addr}; start it with --join (it votes once caught up)"
                ),
            }
        }
        ClusterAction::Remove { id } => {
            call(
                &client,
                "DELETE",
                &format!("/v1/cluster/nodes/{id}"),
                &Value::Null,
            )?;
            if args.output == Output::Human {
                println!("node {id} removed from the cluster");
            }
        }
    }
    Ok(())
}

/// A list of moves: as JSON, or a table.
fn print_moves(output: Output, listing: &Value) {
    if output == Output::Json {
        print_json(listing);
        return;
    }
    let moves = listing["moves"].as_array().cloned().unwrap_or_default();
    if moves.is_empty() {
        println!("no moves");
        return;
    }
    let rows: Vec<Vec<String>> = moves
        .iter()
        .map(|m| {
            let copied = format!("{} / {}", cell(&m["copied_bytes"]), cell(&m["total_bytes"]));
            vec![
                cell(&m["id"]),
                format!("{}/{}", cell(&m["topic"]), cell(&m["partition"])),
                format!("{} -> {}", cell(&m["from"]), cell(&m["to"])),
                cell(&m["state"]),
                copied,
                cell(&m["rate_bytes_per_s"]),
                cell(&m["started_at_ms"]),
                cell(&m["expected_end_ms"]),
            ]
        })
        .collect();
    print_table(
        &[
            "ID",
            "PARTITION",
            "FROM -> TO",
            "STATE",
            "BYTES",
            "RATE/S",
            "STARTED",
            "EXPECTED END",
        ],
        &rows,
    );
}

pub fn topic(args: &ClientArgs, action: &TopicAction) -> Result<(), String> {
    let client = client(args)?;
    match action {
        TopicAction::Create { name, settings } => {
            let answer = call(&client, "PUT", &topic_path(name), &settings.body())?;
            match args.output {
                Output::Json => print_json(&answer.body),
                Output::Human => {
                    let verb = created_or_updated(answer.status);
                    println!(
                        "{verb} topic {name} ({})",
                        partitions(&answer.body["partitions"])
                    );
                }
            }
        }
        TopicAction::List => {
            let listing = call(&client, "GET", "/v1/topics", &Value::Null)?.body;
            match args.output {
                Output::Json => print_json(&listing),
                Output::Human => {
                    let rows: Vec<Vec<String>> = listing["topics"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .iter()
                        .map(|t| {
                            [
                                "name",
                                "partitions",
                                "retention_ms",
                                "visibility_timeout_ms",
                                "dead_letter_topic",
                                "parent",
                            ]
                            .iter()
                            .map(|k| cell(&t[*k]))
                            .collect()
                        })
                        .collect();
                    print_table(
                        &[
                            "NAME",
                            "PARTITIONS",
                            "RETENTION_MS",
                            "VISIBILITY_TIMEOUT_MS",
                            "DEAD_LETTER_TOPIC",
                            "PARENT",
                        ],
                        &rows,
                    );
                }
            }
        }
        TopicAction::Describe { name } => {
            let topic = call(&client, "GET", &topic_path(name), &Value::Null)?.body;
            match args.output {
                Output::Json => print_json(&topic),
                Output::Human => {
                    for key in [
                        "name",
                        "partitions",
                        "visibility_timeout_ms",
                        "retention_ms",
                        "max_deliveries",
                        "dead_letter_topic",
                        "max_message_bytes",
                    ] {
                        println!("{key}: {}", cell(&topic[key]));
                    }
                    if topic.get("parent").is_some() {
                        println!("parent: {}", cell(&topic["parent"]));
                    }
                    let keys = [
                        "partition",
                        "owner",
                        "high_watermark",
                        "frontier",
                        "available",
                        "in_flight",
                        "oldest_unacked_age_ms",
                    ];
                    let rows: Vec<Vec<String>> = topic["partition_stats"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .iter()
                        .map(|s| keys.iter().map(|k| cell(&s[*k])).collect())
                        .collect();
                    println!();
                    print_table(
                        &[
                            "PARTITION",
                            "OWNER",
                            "HIGH_WATERMARK",
                            "FRONTIER",
                            "AVAILABLE",
                            "IN_FLIGHT",
                            "OLDEST_UNACKED_MS",
                        ],
                        &rows,
                    );
                    if topic["children"].as_array().is_some_and(|c| !c.is_empty()) {
                        println!();
                        print_children(&topic["children"]);
                    }
                }
            }
        }
        TopicAction::Children { name } => list_children(&client, args, name)?,
        TopicAction::Delete { name } => {
            call(&client, "DELETE", &topic_path(name), &Value::Null)?;
            match args.output {
                Output::Json => print_json(&json!({})),
                Output::Human => println!("deleted topic {name}"),
            }
        }
    }
    Ok(())
}

/// `narad produce TOPIC [--key K] [VALUE | - | --file F] [--lines [--batch N]]`.
pub fn produce(args: &ClientArgs, produce: &ProduceArgs) -> Result<(), String> {
    let client = client(args)?;
    let read_input = || -> Result<Vec<u8>, String> {
        let mut buf = Vec::new();
        match &produce.file {
            Some(path) => {
                buf = std::fs::read(path).map_err(|e| format!("reading {path}: {e}"))?;
            }
            None => {
                std::io::stdin()
                    .read_to_end(&mut buf)
                    .map_err(|e| format!("reading stdin: {e}"))?;
            }
        }
        Ok(buf)
    };
    let given = produce.value.as_deref().filter(|v| *v != "-");
    if given.is_some() && produce.file.is_some() {
        return Err("give a VALUE or --file, not both".into());
    }
    if produce.lines {
        let input = match given {
            Some(text) => text.as_bytes().to_vec(),
            None => read_input()?,
        };
        return produce_lines(&client, args, produce, &input);
    }
    let bytes = match given {
        Some(text) => text.as_bytes().to_vec(),
        None => read_input()?,
    };
    let message = Outgoing {
        key: produce.key.clone(),
        value: bytes.into(),
        idempotency_key: produce.idempotency_key.clone(),
    };
    let produced = client
        .produce_message(&produce.topic, &message)
        .map_err(failed)?;
    match (args.output, produced.duplicate) {
        (Output::Json, false) => print_json(&json!({ "id": produced.id })),
        (Output::Json, true) => print_json(&json!({ "id": produced.id, "duplicate": true })),
        (Output::Human, false) => println!("{}", produced.id),
        (Output::Human, true) => println!("{} (a duplicate: stored before)", produced.id),
    }
    Ok(())
}

/// One message per non-empty line of `input`, `--batch` to a request;
/// prints each id as its batch is accepted.
fn produce_lines(
    client: &Client,
    args: &ClientArgs,
    produce: &ProduceArgs,
    input: &[u8],
) -> Result<(), String> {
    let lines: Vec<&[u8]> = input
        .split(|b| *b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
        .filter(|line| !line.is_empty())
        .collect();
    let mut all = Vec::new();
    let batch = produce.batch as usize;
    for (index, chunk) in lines.chunks(batch).enumerate() {
        let messages: Vec<Outgoing> = chunk
            .iter()
            .enumerate()
            .map(|(i, line)| Outgoing {
                key: produce.key.clone(),
                value: line.to_vec().into(),
                idempotency_key: produce
                    .idempotency_key
                    .as_ref()
                    .map(|key| format!("{key}-{}", index * batch + i)),
            })
            .collect();
        let ids = client
            .produce_batch(&produce.topic, &messages)
            .map_err(failed)?;
        if args.output == Output::Human {
            for id in &ids {
                println!("{id}");
            }
        }
        all.extend(ids);
    }
    if args.output == Output::Json {
        print_json(&json!({ "ids": all }));
    }
    Ok(())
}

/// `narad consume TOPIC [--max N] [--wait-ms MS] [--ack] [--follow]
/// [--partition P] [--visibility-timeout-ms MS]`.
pub fn consume(args: &ClientArgs, consume: &ConsumeArgs) -> Result<(), String> {
    let client = client(args)?;
    let default_wait = if consume.follow { FOLLOW_WAIT_MS } else { 0 };
    let mut request = json!({
        "max_messages": consume.max,
        "wait_ms": consume.wait_ms.unwrap_or(default_wait),
    });
    if let Some(partition) = consume.partition {
        request["partition"] = json!(partition);
    }
    if let Some(visibility) = consume.visibility_timeout_ms {
        request["visibility_timeout_ms"] = json!(visibility);
    }
    if !consume.follow {
        let messages = consume_once(&client, &consume.topic, &request)?;
        if consume.ack {
            ack_all(&client, &consume.topic, &messages)?;
        }
        match args.output {
            Output::Json => print_json(&json!({ "messages": messages })),
            Output::Human if messages.is_empty() => println!("no messages"),
            Output::Human => {
                let rows: Vec<Vec<String>> = messages.iter().map(message_row).collect();
                print_table(&MESSAGE_COLUMNS, &rows);
                if consume.ack {
                    println!("acked {}", messages.len());
                }
            }
        }
        return Ok(());
    }
    // Followed: one line per message as it comes (JSON: one object per
    // line), acked (with `--ack`) only once printed.
    if args.output == Output::Human {
        println!("{}", MESSAGE_COLUMNS.join("\t"));
    }
    loop {
        let messages = consume_once(&client, &consume.topic, &request)?;
        for message in &messages {
            match args.output {
                Output::Json => println!("{message}"),
                Output::Human => println!("{}", message_row(message).join("\t")),
            }
        }
        if consume.ack {
            ack_all(&client, &consume.topic, &messages)?;
        }
    }
}

/// The columns of a message in the human output.
const MESSAGE_COLUMNS: [&str; 7] = [
    "PARTITION",
    "OFFSET",
    "DELIVERIES",
    "ID",
    "RECEIPT",
    "KEY",
    "VALUE",
];

fn message_row(m: &Value) -> Vec<String> {
    let value = if m["value"].is_null() {
        format!("base64:{}", cell(&m["value_base64"]))
    } else {
        printable(&cell(&m["value"]))
    };
    vec![
        cell(&m["partition"]),
        cell(&m["offset"]),
        cell(&m["delivery_count"]),
        cell(&m["id"]),
        cell(&m["receipt"]),
        printable(&cell(&m["key"])),
        value,
    ]
}

/// `text` with its control characters escaped (`\n`, `\t`, `\u{1b}`):
/// a value is one cell of one line, and cannot move the terminal's cursor
/// or change its colours. `--output json` gives values as they are.
fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars()
        .map(|c| match c {
            '\n' => "\\n".to_string(),
            '\r' => "\\r".to_string(),
            '\t' => "\\t".to_string(),
            c if c.is_control() => c.escape_unicode().to_string(),
            c => c.to_string(),
        })
        .collect()
}

/// One consume: the messages as the API wrote them (printed as they are).
fn consume_once(client: &Client, topic: &str, request: &Value) -> Result<Vec<Value>, String> {
    let wait = Duration::from_millis(request["wait_ms"].as_u64().unwrap_or(0));
    let path = format!("/v1/topics/{}/consume", encode_segment(topic));
    let answer = client
        .request("POST", &path, &[], request.to_string(), wait)
        .map_err(failed)?;
    Ok(answer.body["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

/// Acks `messages` with batch requests; fails if any ack was refused.
fn ack_all(client: &Client, topic: &str, messages: &[Value]) -> Result<(), String> {
    let receipts: Vec<&str> = messages
        .iter()
        .filter_map(|m| m["receipt"].as_str())
        .collect();
    for chunk in receipts.chunks(BATCH_MESSAGES_MAX as usize) {
        let results = client
            .settle_batch(topic, chunk, Settling::Ack)
            .map_err(failed)?;
        let refused: Vec<String> = results
            .into_iter()
            .filter_map(|settled| settled.result.err().map(|e| e.message))
            .collect();
        if let Some(first) = refused.first() {
            return Err(format!("{} acks refused: {first}", refused.len()));
        }
    }
    Ok(())
}

/// `narad ack|nack|extend TOPIC RECEIPT`.
pub fn settle(args: &ClientArgs, topic: &str, receipt: &str, how: Settle) -> Result<(), String> {
    let client = client(args)?;
    let (route, body, said) = match how {
        Settle::Ack => ("ack", json!({ "receipt": receipt }), "acked".to_string()),
        Settle::Nack { delay_ms } => (
            "nack",
            json!({ "receipt": receipt, "delay_ms": delay_ms }),
            // A message on its last allowed delivery goes to the dead-letter
            // topic instead, whatever the delay.
            if delay_ms == 0 {
                "nacked".to_string()
            } else {
                format!("nacked (delay {delay_ms} ms)")
            },
        ),
        Settle::Extend {
            visibility_timeout_ms,
        } => (
            "extend",
            json!({ "receipt": receipt, "visibility_timeout_ms": visibility_timeout_ms }),
            format!("lease extended: it ends {visibility_timeout_ms} ms from now"),
        ),
    };
    let path = format!("/v1/topics/{}/{route}", encode_segment(topic));
    let answer = call(&client, "POST", &path, &body)?;
    // The API's answer: `{}` for a 204, `{"lease_expires_at_ms"}` for extend.
    let answer = if answer.body.is_null() {
        json!({})
    } else {
        answer.body
    };
    match args.output {
        Output::Json => print_json(&answer),
        Output::Human => match answer["lease_expires_at_ms"].as_u64() {
            Some(at) => println!("{said} (at {at}, Unix ms)"),
            None => println!("{said}"),
        },
    }
    Ok(())
}

/// What `narad user` does.
#[derive(Subcommand, Debug)]
pub enum UserAction {
    /// Create a user, or change its password (`--password-stdin` reads it
    /// from standard input, so it stays out of the process list).
    Create {
        name: String,
        #[arg(long = "new-password", conflicts_with = "password_stdin")]
        new_password: Option<String>,
        #[arg(long)]
        password_stdin: bool,
    },
    /// Delete a user and its tokens.
    Delete { name: String },
    /// Every user with its grants and tokens (never a secret).
    List,
}

/// What `narad token` does.
#[derive(Subcommand, Debug)]
pub enum TokenAction {
    /// A new bearer token of USER: shown once.
    Create { user: String },
    /// Revoke a token by its id.
    Revoke { user: String, id: String },
}

/// What `narad grant` does.
#[derive(Subcommand, Debug)]
pub enum GrantAction {
    /// Replace a user's grants: `--grant TOPIC=ACTION[,ACTION]` (repeat it;
    /// TOPIC may end in `*`; actions: produce, consume, admin, cluster).
    Set {
        user: String,
        #[arg(long = "grant", value_name = "TOPIC=ACTIONS")]
        grants: Vec<String>,
    },
    /// A user's grants.
    Show { user: String },
}

/// What `narad schema` does.
#[derive(Subcommand, Debug)]
pub enum SchemaAction {
    /// Put a JSON Schema document (a file, or `-` for stdin) as the next
    /// version of NAME.
    Put { name: String, file: String },
    /// The latest version of a schema.
    Get { name: String },
    /// Delete a schema no topic uses.
    Delete { name: String },
    /// Every schema with its latest version.
    List,
}

/// One request of the API with a JSON body (none for `null`).
fn call(client: &Client, method: &str, path: &str, body: &Value) -> Result<Response, String> {
    let bytes = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    client
        .request(method, path, &[], bytes, Duration::ZERO)
        .map_err(failed)
}

/// `/v1/topics/{name}`.
fn topic_path(name: &str) -> String {
    format!("/v1/topics/{}", encode_segment(name))
}

/// A `DELETE`: `{}` with `--output json` (as `topic delete`), else `said`.
fn delete(client: &Client, args: &ClientArgs, path: &str, said: &str) -> Result<(), String> {
    call(client, "DELETE", path, &Value::Null)?;
    match args.output {
        Output::Json => print_json(&json!({})),
        Output::Human => println!("{said}"),
    }
    Ok(())
}

/// One table row per element of a JSON array (none if it is not one).
fn rows_of(list: &Value, row: impl Fn(&Value) -> Vec<String>) -> Vec<Vec<String>> {
    list.as_array()
        .map(|items| items.iter().map(row).collect())
        .unwrap_or_default()
}

/// A grant's actions as `produce,consume`.
fn actions_cell(grant: &Value) -> String {
    rows_of(&grant["actions"], |a| vec![cell(a)])
        .concat()
        .join(",")
}

/// A user's grants as `orders=produce,consume billing.*=admin`, or `-`.
fn grants_cell(grants: &Value) -> String {
    let grants = rows_of(grants, |g| {
        vec![format!("{}={}", cell(&g["topic"]), actions_cell(g))]
    });
    if grants.is_empty() {
        return "-".into();
    }
    grants.concat().join(" ")
}

/// `TOPIC=ACTION[,ACTION]` as a grant.
fn parse_grant(text: &str) -> Result<Value, String> {
    let (topic, actions) = text
        .split_once('=')
        .ok_or_else(|| format!("grant {text:?} must look like TOPIC=ACTION[,ACTION]"))?;
    let actions: Vec<&str> = actions
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    Ok(json!({"topic": topic, "actions": actions}))
}

pub fn user(args: &ClientArgs, action: &UserAction) -> Result<(), String> {
    let client = client(args)?;
    match action {
        UserAction::Create {
            name,
            new_password,
            password_stdin,
        } => {
            let password = match (new_password, password_stdin) {
                (Some(p), _) => p.clone(),
                (None, true) => {
                    let mut text = String::new();
                    std::io::stdin()
                        .read_to_string(&mut text)
                        .map_err(|e| format!("reading the password from stdin: {e}"))?;
                    text.trim_end_matches(['\n', '\r']).to_string()
                }
                (None, false) => {
                    return Err("give the password with --new-password or --password-stdin".into())
                }
            };
            let answer = call(
                &client,
                "PUT",
                &format!("/v1/users/{}", encode_segment(name)),
                &json!({ "password": password }),
            )?;
            match args.output {
                Output::Json => print_json(&answer.body),
                Output::Human if answer.status == 201 => println!("created user {name}"),
                Output::Human => println!("changed the password of user {name}"),
            }
        }
        UserAction::Delete { name } => delete(
            &client,
            args,
            &format!("/v1/users/{}", encode_segment(name)),
            &format!("deleted user {name}"),
        )?,
        UserAction::List => {
            let listing = call(&client, "GET", "/v1/users", &Value::Null)?.body;
            match args.output {
                Output::Json => print_json(&listing),
                Output::Human => {
                    let rows = rows_of(&listing["users"], |u| {
                        let tokens = u["tokens"].as_array().map_or(0, Vec::len);
                        vec![
                            cell(&u["name"]),
                            grants_cell(&u["grants"]),
                            tokens.to_string(),
                        ]
                    });
                    print_table(&["NAME", "GRANTS", "TOKENS"], &rows);
                }
            }
        }
    }
    Ok(())
}

pub fn token(args: &ClientArgs, action: &TokenAction) -> Result<(), String> {
    let client = client(args)?;
    match action {
        TokenAction::Create { user } => {
            let answer = call(
                &client,
                "POST",
                &format!("/v1/users/{}/tokens", encode_segment(user)),
                &Value::Null,
            )?;
            match args.output {
                Output::Json => print_json(&answer.body),
                Output::Human => {
                    println!("id: {}", cell(&answer.body["id"]));
                    println!("token: {}", cell(&answer.body["token"]));
                    println!("(the token is shown only now: keep it)");
                }
            }
        }
        TokenAction::Revoke { user, id } => delete(
            &client,
            args,
            &format!(
                "/v1/users/{}/tokens/{}",
                encode_segment(user),
                encode_segment(id)
            ),
            &format!("revoked token {id} of user {user}"),
        )?,
    }
    Ok(())
}

pub fn grant(args: &ClientArgs, action: &GrantAction) -> Result<(), String> {
    let client = client(args)?;
    let (user, answer) = match action {
        GrantAction::Set { user, grants } => {
            let grants = grants
                .iter()
                .map(|g| parse_grant(g))
                .collect::<Result<Vec<_>, _>>()?;
            let path = format!("/v1/users/{}/grants", encode_segment(user));
            (
                user,
                call(&client, "PUT", &path, &json!({ "grants": grants }))?,
            )
        }
        GrantAction::Show { user } => {
            let path = format!("/v1/users/{}/grants", encode_segment(user));
            (user, call(&client, "GET", &path, &Value::Null)?)
        }
    };
    match args.output {
        Output::Json => print_json(&answer.body),
        Output::Human => {
            let rows = rows_of(&answer.body["grants"], |g| {
                vec![cell(&g["topic"]), actions_cell(g)]
            });
            println!("grants of {user}:");
            print_table(&["TOPIC", "ACTIONS"], &rows);
        }
    }
    Ok(())
}

pub fn schema(args: &ClientArgs, action: &SchemaAction) -> Result<(), String> {
    let client = client(args)?;
    match action {
        SchemaAction::Put { name, file } => {
            let mut text = String::new();
            if file == "-" {
                std::io::stdin()
                    .read_to_string(&mut text)
                    .map_err(|e| format!("reading stdin: {e}"))?;
            } else {
                text = std::fs::read_to_string(file).map_err(|e| format!("reading {file}: {e}"))?;
            }
            let answer = client
                .request(
                    "PUT",
                    &format!("/v1/schemas/{}", encode_segment(name)),
                    &[],
                    text,
                    Duration::ZERO,
                )
                .map_err(failed)?;
            match args.output {
                Output::Json => print_json(&answer.body),
                Output::Human => println!(
                    "schema {name} is at version {}",
                    cell(&answer.body["version"])
                ),
            }
        }
        SchemaAction::Get { name } => {
            let answer = call(
                &client,
                "GET",
                &format!("/v1/schemas/{}", encode_segment(name)),
                &Value::Null,
            )?;
            match args.output {
                Output::Json => print_json(&answer.body),
                Output::Human => {
                    println!("schema {name}, version {}", cell(&answer.body["version"]));
                    print_json(&answer.body["schema"]);
                }
            }
        }
        SchemaAction::Delete { name } => delete(
            &client,
            args,
            &format!("/v1/schemas/{}", encode_segment(name)),
            &format!("deleted schema {name}"),
        )?,
        SchemaAction::List => {
            let listing = call(&client, "GET", "/v1/schemas", &Value::Null)?.body;
            match args.output {
                Output::Json => print_json(&listing),
                Output::Human => {
                    let rows = rows_of(&listing["schemas"], |s| {
                        vec![cell(&s["name"]), cell(&s["version"])]
                    });
                    print_table(&["NAME", "VERSION"], &rows);
                }
            }
        }
    }
    Ok(())
}

/// What a `PUT` that answered `status` did.
fn created_or_updated(status: u16) -> &'static str {
    if status == 201 {
        "created"
    } else {
        "updated"
    }
}

fn children_path(parent: &str) -> String {
    format!("/v1/topics/{}/children", encode_segment(parent))
}

fn list_children(client: &Client, args: &ClientArgs, parent: &str) -> Result<(), String> {
    let listing = call(client, "GET", &children_path(parent), &Value::Null)?.body;
    match args.output {
        Output::Json => print_json(&listing),
        Output::Human => print_children(&listing["children"]),
    }
    Ok(())
}

/// A table of children as `GET /v1/topics/{parent}/children` lists them.
fn print_children(children: &Value) {
    let rows = rows_of(children, |c| {
        [
            "name",
            "kind",
            "lag_messages",
            "lag_seconds",
            "dropped_messages",
            "state",
            "last_error",
        ]
        .iter()
        .map(|k| cell(&c[*k]))
        .collect()
    });
    print_table(
        &[
            "NAME",
            "KIND",
            "LAG_MESSAGES",
            "LAG_SECONDS",
            "DROPPED",
            "STATE",
            "LAST_ERROR",
        ],
        &rows,
    );
}

pub fn child(args: &ClientArgs, action: &ChildAction) -> Result<(), String> {
    let client = client(args)?;
    match action {
        ChildAction::Create {
            parent,
            child,
            kind,
            delay_ms,
            remote_url,
            remote_topic,
            remote_token_file,
            rate_bytes_per_s,
            settings,
        } => {
            let mut body = json!({ "kind": kind });
            if kind == "remote" {
                if settings.body().as_object().is_some_and(|o| !o.is_empty()) {
                    return Err(
                        "a remote child has no topic here: its settings are those of --remote-topic on the other cluster".into(),
                    );
                }
                let token = match remote_token_file {
                    Some(path) => Some(
                        std::fs::read_to_string(path)
                            .map_err(|e| format!("--remote-token-file {}: {e}", path.display()))?
                            .trim()
                            .to_string(),
                    ),
                    None => None,
                };
                body["remote"] = json!({
                    "url": remote_url.as_deref().ok_or("a remote child needs --remote-url")?,
                    "topic": remote_topic.as_deref().ok_or("a remote child needs --remote-topic")?,
                    "token": token,
                    "rate_bytes_per_s": rate_bytes_per_s,
                });
            } else {
                if remote_url.is_some()
                    || remote_topic.is_some()
                    || remote_token_file.is_some()
                    || rate_bytes_per_s.is_some()
                {
                    return Err(format!(
                        "--remote-url, --remote-topic, --remote-token-file and --rate-bytes-per-s are for a remote child, not {kind}"
                    ));
                }
                body["topic"] = settings.body();
            }
            if let Some(delay_ms) = delay_ms {
                body["delay_ms"] = json!(delay_ms);
            }
            let path = format!("{}/{}", children_path(parent), encode_segment(child));
            let answer = call(&client, "PUT", &path, &body)?;
            match args.output {
                Output::Json => print_json(&answer.body),
                Output::Human => {
                    let verb = created_or_updated(answer.status);
                    if kind == "remote" {
                        println!(
                            "{verb} remote child {child} of {parent} (to {} at {})",
                            cell(&answer.body["remote"]["topic"]),
                            cell(&answer.body["remote"]["url"])
                        );
                    } else {
                        println!(
                            "{verb} {kind} child {child} of {parent} ({})",
                            partitions(&answer.body["partitions"])
                        );
                    }
                }
            }
        }
        ChildAction::List { parent } => list_children(&client, args, parent)?,
        ChildAction::Delete { parent, child } => delete(
            &client,
            args,
            &format!("{}/{}", children_path(parent), encode_segment(child)),
            &format!("{child} is no longer a child of {parent} (the topic {child} stays)"),
        )?,
    }
    Ok(())
}

fn redrive_path(dlq: &str) -> String {
    format!("/v1/topics/{}/redrive", encode_segment(dlq))
}

pub fn dlq(args: &ClientArgs, action: &DlqAction) -> Result<(), String> {
    let client = client(args)?;
    match action {
        DlqAction::Redrive {
            dlq,
            to,
            rate_per_s,
            max_messages,
        } => {
            let mut body = json!({ "to": to });
            if let Some(rate) = rate_per_s {
                body["rate_per_s"] = json!(rate);
            }
            if let Some(max) = max_messages {
                body["max_messages"] = json!(max);
            }
            let answer = call(&client, "POST", &redrive_path(dlq), &body)?;
            match args.output {
                Output::Json => print_json(&answer.body),
                Output::Human => println!(
                    "redrive {} started: {dlq} -> {to} (see `narad dlq tasks {dlq}`)",
                    cell(&answer.body["id"])
                ),
            }
        }
        DlqAction::Tasks { dlq } => {
            let listing = call(&client, "GET", &redrive_path(dlq), &Value::Null)?.body;
            match args.output {
                Output::Json => print_json(&listing),
                Output::Human => {
                    let rows = rows_of(&listing["tasks"], |t| {
                        ["id", "to", "moved", "remaining", "state", "rate_per_s"]
                            .iter()
                            .map(|k| cell(&t[*k]))
                            .collect()
                    });
                    print_table(
                        &["ID", "TO", "MOVED", "REMAINING", "STATE", "RATE_PER_S"],
                        &rows,
                    );
                }
            }
        }
        DlqAction::Cancel { dlq, id } => delete(
            &client,
            args,
            &format!("{}/{}", redrive_path(dlq), encode_segment(id)),
            &format!("redrive {id} cancelled"),
        )?,
    }
    Ok(())
}

/// What `narad quarantine` does.
#[derive(Subcommand, Debug)]
pub enum QuarantineAction {
    /// Print every message a quarantined partition folder holds, oldest
    /// first, one JSON object a line (`offset`, `id`, `produced_at_ms`,
    /// `key`, and `value` or `value_base64`).
    Export { folder: String },
    /// Produce every message of a quarantined partition folder to TOPIC
    /// (keys kept; each gets a new id). Messages already delivered from the
    /// promoted copy arrive again: this is at-least-once.
    Replay {
        folder: String,
        #[arg(long)]
        topic: String,
    },
}

/// Messages per batch a replay produces.
const REPLAY_BATCH: usize = 100;

pub fn quarantine(args: &ClientArgs, action: &QuarantineAction) -> Result<(), String> {
    match action {
        QuarantineAction::Export { folder } => {
            for message in quarantined(folder)? {
                println!("{}", message_json(&message));
            }
            Ok(())
        }
        QuarantineAction::Replay { folder, topic } => {
            let messages = quarantined(folder)?;
            let client = client(args)?;
            let path = format!("/v1/topics/{}/messages/batch", encode_segment(topic));
            for chunk in messages.chunks(REPLAY_BATCH) {
                let items: Vec<Value> = chunk
                    .iter()
                    .map(|m| {
                        let mut item = message_json(m);
                        if let Some(object) = item.as_object_mut() {
                            object.retain(|k, _| {
                                ["key", "value", "value_base64"].contains(&k.as_str())
                            });
                        }
                        item
                    })
                    .collect();
                call(&client, "POST", &path, &json!({ "messages": items }))?;
            }
            if args.output == Output::Human {
                println!("{} messages produced to {topic}", messages.len());
            }
            Ok(())
        }
    }
}

/// The messages of a partition folder, read from its segment files.
fn quarantined(folder: &str) -> Result<Vec<narad_storage::log::StoredMessage>, String> {
    let dir = std::path::Path::new(folder);
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{folder}: {e}"))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("{folder}: {e}"))?;
        let name = entry.file_name().to_string_lossy().to_string();
        if name.ends_with(".seg") {
            let bytes = std::fs::read(entry.path()).map_err(|e| format!("{name}: {e}"))?;
            files.push((name, bytes));
        }
    }
    if files.is_empty() {
        return Err(format!("{folder} holds no segment files (*.seg)"));
    }
    Ok(narad_storage::log::messages_in_segments(
        files.iter().map(|(n, b)| (n.as_str(), b.as_slice())),
    ))
}

fn message_json(stored: &narad_storage::log::StoredMessage) -> Value {
    use base64::Engine;
    let message = &stored.message;
    let mut value = json!({
        "offset": stored.offset,
        "id": format!("{:032x}", message.id),
        "produced_at_ms": message.produced_at_ms,
    });
    if let Some(key) = &message.key {
        value["key"] = json!(String::from_utf8_lossy(key));
    }
    match std::str::from_utf8(&message.value) {
        Ok(text) => value["value"] = json!(text),
        Err(_) => {
            value["value_base64"] =
                json!(base64::engine::general_purpose::STANDARD.encode(&message.value))
        }
    }
    value
}
