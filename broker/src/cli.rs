//! The client subcommands of `narad`: topics, produce and consume over the
//! `narad-net` client. Human-readable tables by default, the API's JSON with
//! `--output json`; any failure exits non-zero with the error's message.

use std::io::Read;

use clap::{Args, Subcommand, ValueEnum};
use narad_net::client::{Client, ClientError};
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
}

#[derive(Subcommand, Debug)]
pub enum TopicAction {
    /// Create a topic, or update the settings given.
    Create {
        name: String,
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
    },
    /// List every topic.
    List,
    /// A topic's settings and per-partition figures.
    Describe { name: String },
    /// Delete a topic.
    Delete { name: String },
}

fn client(args: &ClientArgs) -> Result<Client, String> {
    Client::new(&args.server).map_err(|e| e.to_string())
}

fn failed(error: ClientError) -> String {
    error.to_string()
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
}

pub fn cluster(args: &ClientArgs, action: &ClusterAction) -> Result<(), String> {
    let client = client(args)?;
    match action {
        ClusterAction::Status => {
            let status = client.cluster().map_err(failed)?;
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
                                    ["id", "addr", "state", "partitions"]
                                        .iter()
                                        .map(|k| cell(&n[*k]))
                                        .collect()
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    print_table(&["ID", "ADDR", "STATE", "PARTITIONS"], &rows);
                }
            }
        }
    }
    Ok(())
}

pub fn topic(args: &ClientArgs, action: &TopicAction) -> Result<(), String> {
    let client = client(args)?;
    match action {
        TopicAction::Create {
            name,
            partitions,
            retention_ms,
            visibility_timeout_ms,
            max_deliveries,
            dead_letter_topic,
            max_message_bytes,
        } => {
            let mut body = Map::new();
            let mut put = |key: &str, value: Option<Value>| {
                if let Some(value) = value {
                    body.insert(key.to_string(), value);
                }
            };
            put("partitions", partitions.map(Value::from));
            put("retention_ms", retention_ms.map(Value::from));
            put(
                "visibility_timeout_ms",
                visibility_timeout_ms.map(Value::from),
            );
            put("max_deliveries", max_deliveries.map(Value::from));
            put(
                "dead_letter_topic",
                dead_letter_topic.clone().map(Value::from),
            );
            put("max_message_bytes", max_message_bytes.map(Value::from));
            let answer = client
                .put_topic(name, &Value::Object(body))
                .map_err(failed)?;
            match args.output {
                Output::Json => print_json(&answer.body),
                Output::Human => {
                    let verb = if answer.status == 201 {
                        "created"
                    } else {
                        "updated"
                    };
                    println!(
                        "{verb} topic {name} ({} partitions)",
                        cell(&answer.body["partitions"])
                    );
                }
            }
        }
        TopicAction::List => {
            let listing = client.list_topics().map_err(failed)?;
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
                        ],
                        &rows,
                    );
                }
            }
        }
        TopicAction::Describe { name } => {
            let topic = client.get_topic(name).map_err(failed)?;
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
                }
            }
        }
        TopicAction::Delete { name } => {
            client.delete_topic(name).map_err(failed)?;
            match args.output {
                Output::Json => print_json(&json!({})),
                Output::Human => println!("deleted topic {name}"),
            }
        }
    }
    Ok(())
}

/// `narad produce TOPIC [--key K] [VALUE | -]`: with no value or `-`, reads stdin.
pub fn produce(
    args: &ClientArgs,
    topic: &str,
    key: Option<&str>,
    value: Option<&str>,
) -> Result<(), String> {
    let client = client(args)?;
    let bytes = match value {
        Some("-") | None => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .map_err(|e| format!("reading stdin: {e}"))?;
            buf
        }
        Some(text) => text.as_bytes().to_vec(),
    };
    let id = client.produce(topic, key, &bytes).map_err(failed)?;
    match args.output {
        Output::Json => print_json(&json!({ "id": id })),
        Output::Human => println!("{id}"),
    }
    Ok(())
}

/// `narad consume TOPIC [--max N] [--wait-ms MS] [--ack]`.
pub fn consume(
    args: &ClientArgs,
    topic: &str,
    max: u32,
    wait_ms: u64,
    ack: bool,
) -> Result<(), String> {
    let client = client(args)?;
    let messages = client.consume(topic, max, wait_ms).map_err(failed)?;
    if ack {
        for message in &messages {
            let receipt = message["receipt"].as_str().unwrap_or_default();
            client.ack(topic, receipt).map_err(failed)?;
        }
    }
    match args.output {
        Output::Json => print_json(&json!({ "messages": messages })),
        Output::Human if messages.is_empty() => println!("no messages"),
        Output::Human => {
            let rows: Vec<Vec<String>> = messages
                .iter()
                .map(|m| {
                    let value = if m["value"].is_null() {
                        format!("base64:{}", cell(&m["value_base64"]))
                    } else {
                        cell(&m["value"])
                    };
                    vec![
                        cell(&m["partition"]),
                        cell(&m["offset"]),
                        cell(&m["delivery_count"]),
                        cell(&m["id"]),
                        value,
                    ]
                })
                .collect();
            print_table(&["PARTITION", "OFFSET", "DELIVERIES", "ID", "VALUE"], &rows);
            if ack {
                println!("acked {}", messages.len());
            }
        }
    }
    Ok(())
}
