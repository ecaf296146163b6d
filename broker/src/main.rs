//! `narad`: the Narad broker and its command line.

use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand};
use narad_broker::cli::{
    self, BrowseArgs, ChildAction, ClientArgs, ClusterAction, ConsumeArgs, DlqAction, GrantAction,
    ProduceArgs, QuarantineAction, SchemaAction, SearchArgs, Settle, TokenAction, TopicAction,
    UserAction,
};
use narad_broker::config::Config;

/// mimalloc: per-thread free lists suit one executor per core; the system
/// allocator cost a tenth of a shard's CPU on the produce path.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "narad",
    version,
    about = "Narad: a clustered message queue broker"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node (with no flags: a single-node cluster, data in ./narad-data, HTTP on 127.0.0.1:8080).
    Serve(ServeArgs),
    /// Create, list, describe or delete topics.
    Topic {
        #[command(subcommand)]
        action: TopicAction,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Create, list or delete a topic's children (fanout, delay, replica).
    Child {
        #[command(subcommand)]
        action: ChildAction,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Move a dead-letter topic's messages back to a topic (redrive), list
    /// or cancel redrives.
    Dlq {
        #[command(subcommand)]
        action: DlqAction,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// The cluster: `narad cluster status`.
    Cluster {
        #[command(subcommand)]
        action: ClusterAction,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Create, delete or list users.
    User {
        #[command(subcommand)]
        action: UserAction,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Create or revoke a user's bearer tokens.
    Token {
        #[command(subcommand)]
        action: TokenAction,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Set or show a user's grants.
    Grant {
        #[command(subcommand)]
        action: GrantAction,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Read what a node quarantined (a partition promoted elsewhere while
    /// it was away), and produce it again.
    Quarantine {
        #[command(subcommand)]
        action: QuarantineAction,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Put, get, delete or list JSON Schemas.
    Schema {
        #[command(subcommand)]
        action: SchemaAction,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Produce a message: the VALUE argument, or all of stdin (or
    /// `--file`) when it is absent or `-`; `--lines`: one message per line.
    Produce {
        #[command(flatten)]
        produce: ProduceArgs,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Consume (and lease) messages; `--ack` acks them once printed,
    /// `--follow` keeps long-polling until interrupted.
    Consume {
        #[command(flatten)]
        consume: ConsumeArgs,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show a page of one partition with each message's state and
    /// delivery count; nothing is leased, acked or counted.
    Browse {
        #[command(flatten)]
        browse: BrowseArgs,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Search a topic's messages at their owners by key or text;
    /// nothing is leased or acked. `--all` follows the cursor to the end.
    Search {
        #[command(flatten)]
        search: SearchArgs,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Ack a delivered message by its receipt: it is done.
    Ack {
        topic: String,
        receipt: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Nack a delivered message by its receipt: deliver it again, after
    /// `--delay-ms`.
    Nack {
        topic: String,
        receipt: String,
        /// Wait this long before delivering it again (0-43200000).
        #[arg(long, default_value_t = 0)]
        delay_ms: u64,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Extend the lease of a delivered message by its receipt.
    Extend {
        topic: String,
        receipt: String,
        /// The lease ends this long from now (1-43200000).
        #[arg(long, visible_alias = "visibility-timeout")]
        visibility_timeout_ms: u64,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print a completion script for a shell: `narad completions bash >
    /// /etc/bash_completion.d/narad`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff): `narad man > narad.1`; or, with
    /// `--dir DIR`, write it and a page for every subcommand
    /// (`narad-topic-create.1`, ...) into DIR.
    Man {
        /// The folder to write every page into (made if missing).
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// TOML config file.
    #[arg(long, value_name = "FILE")]
    config: Option<String>,
    /// Data folder (config key `data_dir`).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<String>,
    /// Client HTTP address; port 0 picks a free one (`listen`).
    #[arg(long, value_name = "HOST:PORT")]
    listen: Option<String>,
    /// This node's id (`node_id`).
    #[arg(long, value_name = "N")]
    node_id: Option<String>,
    /// Inter-node QUIC address (`peer_listen`).
    #[arg(long, value_name = "HOST:PORT")]
    peer_listen: Option<String>,
    /// The initial members, itself included: 1=HOST:PORT,2=HOST:PORT (`peers`).
    #[arg(long, value_name = "LIST")]
    peers: Option<String>,
    /// Join a running cluster through any member's peer address (`join`).
    #[arg(long, value_name = "HOST:PORT")]
    join: Option<String>,
    /// Shared secret that lets development nodes trust each other (`cluster.secret`).
    #[arg(long, value_name = "SECRET")]
    cluster_secret: Option<String>,
    /// Kafka protocol address; port 0 picks a free one (`kafka.listen`).
    #[arg(long, value_name = "HOST:PORT")]
    kafka_listen: Option<String>,
    /// Shards (cores) to run; 0 = every core (`shards`).
    #[arg(long, value_name = "N")]
    shards: Option<String>,
    /// Any config key: --set storage.segment_bytes=8388608 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

impl ServeArgs {
    fn flag_pairs(&self) -> Result<Vec<(String, String)>, String> {
        let mut pairs = Vec::new();
        let named = [
            ("data_dir", &self.data_dir),
            ("listen", &self.listen),
            ("node_id", &self.node_id),
            ("peer_listen", &self.peer_listen),
            ("peers", &self.peers),
            ("join", &self.join),
            ("cluster.secret", &self.cluster_secret),
            ("shards", &self.shards),
            ("kafka.listen", &self.kafka_listen),
        ];
        for (key, value) in named {
            if let Some(value) = value {
                pairs.push((key.to_string(), value.clone()));
            }
        }
        for item in &self.set {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("--set {item:?} must be KEY=VALUE"))?;
            pairs.push((key.trim().to_string(), value.to_string()));
        }
        Ok(pairs)
    }
}

/// The log filter without `NARAD_LOG` or `RUST_LOG`.
const DEFAULT_LOG_FILTER: &str =
    "warn,narad=info,narad_broker=info,narad_raft=info,narad_net=info,narad_storage=info";

fn init_logging() {
    // Narad's own INFO lines, and only warnings from its dependencies (a
    // first screen of openraft INFO lines tells a new user nothing).
    // `NARAD_LOG` or `RUST_LOG` choose otherwise.
    let filter = tracing_subscriber::EnvFilter::try_from_env("NARAD_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .init();
}

fn serve(args: &ServeArgs) -> Result<(), String> {
    let file = match &args.config {
        Some(path) => Some((
            path.clone(),
            std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))?,
        )),
        None => None,
    };
    let pairs = args.flag_pairs()?;
    let config = Config::resolve(
        file.as_ref().map(|(p, t)| (p.as_str(), t.as_str())),
        std::env::vars(),
        &pairs,
    )
    .map_err(|e| e.to_string())?;
    narad_broker::node::run(config)
}

/// A client subcommand whose output goes to a pipe that closes early
/// (`narad topic list | head -1`) ends quietly, as other command-line
/// tools do, instead of failing on its next write. The node (`serve`)
/// keeps the runtime's default: a closed socket is an error it handles.
fn quiet_on_closed_pipe() {
    // SAFETY: restoring the default disposition of SIGPIPE before any
    // thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        quiet_on_closed_pipe();
    }
    let result = match &cli.command {
        Command::Serve(args) => {
            init_logging();
            serve(args)
        }
        Command::Topic { action, client } => cli::topic(client, action),
        Command::Child { action, client } => cli::child(client, action),
        Command::Dlq { action, client } => cli::dlq(client, action),
        Command::Cluster { action, client } => cli::cluster(client, action),
        Command::User { action, client } => cli::user(client, action),
        Command::Token { action, client } => cli::token(client, action),
        Command::Grant { action, client } => cli::grant(client, action),
        Command::Schema { action, client } => cli::schema(client, action),
        Command::Quarantine { action, client } => cli::quarantine(client, action),
        Command::Produce { produce, client } => cli::produce(client, produce),
        Command::Consume { consume, client } => cli::consume(client, consume),
        Command::Browse { browse, client } => cli::browse(client, browse),
        Command::Search { search, client } => cli::search(client, search),
        Command::Ack {
            topic,
            receipt,
            client,
        } => cli::settle(client, topic, receipt, Settle::Ack),
        Command::Nack {
            topic,
            receipt,
            delay_ms,
            client,
        } => cli::settle(
            client,
            topic,
            receipt,
            Settle::Nack {
                delay_ms: *delay_ms,
            },
        ),
        Command::Extend {
            topic,
            receipt,
            visibility_timeout_ms,
            client,
        } => cli::settle(
            client,
            topic,
            receipt,
            Settle::Extend {
                visibility_timeout_ms: *visibility_timeout_ms,
            },
        ),
        Command::Completions { shell } => {
            clap_complete::generate(*shell, &mut Cli::command(), "narad", &mut std::io::stdout());
            Ok(())
        }
        Command::Man { dir: None } => clap_mangen::Man::new(Cli::command())
            .render(&mut std::io::stdout())
            .map_err(|e| format!("writing the manual page: {e}")),
        Command::Man { dir: Some(dir) } => std::fs::create_dir_all(dir)
            .and_then(|()| clap_mangen::generate_to(Cli::command(), dir))
            .map_err(|e| format!("writing the manual pages into {}: {e}", dir.display())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("narad: {message}");
            ExitCode::FAILURE
        }
    }
}
