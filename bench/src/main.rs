//! `narad-bench`: Narad's benchmarks, one subcommand each. `narad-bench
//! --help` lists the subcommands and `narad-bench SUB --help` every flag of
//! one with its default; unknown flags are refused.
//!
//! `narad-bench wal [--dir DIR] [--seconds S]`: the ingress WAL's group commit
//! at 1, 16, 64 and 256 concurrent appenders of 1 KiB records, beside the
//! disk's raw limits measured in the same run.
//!
//! `narad-bench produce --server URL --topic T [--connections 1,16,64,256]
//! [--seconds S] [--message-bytes N] [--batch N] [--json]
//! [--authorization HEADER]`: closed-loop produce load on a node over
//! keep-alive connections (`--json`: messages are JSON orders, for a topic
//! with a schema; `--authorization`: sent with every request).
//!
//! `narad-bench latency --server URL --topic T [--rate 100] [--messages 1000]
//! [--producers 1] [--consume-topic T]`: produce → consumable latency at a
//! light fixed rate.
//!
//! `narad-bench drain --server URL --topic T [--messages N] [--consumers C]
//! [--message-bytes N]`: consume + ack throughput (long polls of 100, batch
//! acks).
//!
//! `narad-bench workload FILE [--driver NAME] [--server URL] [--out DIR]`: an
//! OpenMessaging Benchmark workload file on one system, open loop at its
//! `producerRate`, with an OMB-style result file (see `omb.rs`).
//!
//! `narad-bench compare WORKLOAD... [--peers nats,rabbitmq,redis] [--rounds N]
//! [--out DIR]`: the same workloads on Narad and every peer that answers
//! (peers need `--features peers` and `bench/peers.sh start`), taking turns;
//! a ratio table, result files and SVG charts (see `compare.rs`). `workload`
//! and `compare` also take `--duration-seconds S` / `--warmup-seconds S`
//! (shorter runs) and the peers' addresses (`--nats`, `--rabbitmq`,
//! `--redis`).
//!
//! `narad-bench ceiling [--listen ADDR] [--dir DIR] [--shards N]`: the bare
//! endpoint the broker's produce is compared with (202 after a group-committed
//! fdatasync; one WAL ring per shard, every core by default).

mod ceiling;

/// The same allocator as `narad`, so the ceiling is measured on equal terms.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
mod chart;
mod coalescing;
mod compare;
mod drain;
mod driver;
mod http_load;
mod latency;
mod omb;
#[cfg(feature = "peers")]
mod peers;
mod reqwest_driver;
mod workload;

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use glommio::io::{DmaFile, OpenOptions};
use glommio::LocalExecutorBuilder;
use hdrhistogram::Histogram;
use narad_storage::io::glommio_fs::GlommioFs;
use narad_storage::wal::{Wal, WalConfig, WalRecordRef};

const RECORD_VALUE_BYTES: usize = 1024;
const CONCURRENCY_LEVELS: [usize; 4] = [1, 16, 64, 256];
const RING_BYTES: u64 = 256 * 1024 * 1024;
const RAW_SMALL_WRITES: usize = 2000;
const RAW_LARGE_WRITES: usize = 200;
const RAW_SEQUENTIAL_BYTES: usize = 256 * 1024 * 1024;
const IO_MEMORY_BYTES: usize = 16 * 1024 * 1024;

/// The node `produce`, `latency`, `drain`, `workload` and `compare` load
/// when `--server` does not say.
pub(crate) const DEFAULT_SERVER: &str = "http://127.0.0.1:8080";

/// Where `wal` and `ceiling` keep their files when `--dir` does not say.
const DEFAULT_DIR: &str = "./narad-bench-data";

/// Benchmarks for Narad: the storage engine against the raw disk, HTTP load
/// on a running node, OpenMessaging Benchmark workloads, and the same
/// workloads on peer brokers for a side-by-side comparison.
#[derive(Parser, Debug)]
#[command(name = "narad-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Group commit of the ingress WAL at 1, 16, 64 and 256 concurrent
    /// appenders of 1 KiB records, next to the disk's raw write limits.
    Wal(WalArgs),
    /// Closed-loop produce load on a node over keep-alive connections, at
    /// each connection count in turn.
    Produce(ProduceArgs),
    /// Latency from produce until the message can be consumed, at a light
    /// fixed rate.
    Latency(LatencyArgs),
    /// Consume and ack throughput: fills a topic, then drains it with long
    /// polls of 100 and batch acks.
    Drain(DrainArgs),
    /// Runs an OpenMessaging Benchmark workload file on one system and
    /// writes an OMB-style result file.
    Workload(compare::WorkloadArgs),
    /// Runs workload files on Narad and each peer broker that answers,
    /// taking turns; writes result files, a ratio table and SVG charts.
    Compare(compare::CompareArgs),
    /// Serves the bare produce endpoint the broker is measured against: 202
    /// once a group-committed fdatasync covers the request.
    Ceiling(CeilingArgs),
}

#[derive(Args, Debug)]
struct WalArgs {
    /// Directory for the WAL ring and the raw-disk test file (use the disk
    /// you want measured).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_DIR)]
    dir: PathBuf,
    /// Seconds each appender count runs.
    #[arg(long, value_name = "S", default_value_t = 5)]
    seconds: u64,
}

/// The node and topic a load subcommand works on.
#[derive(Args, Debug)]
struct TopicArgs {
    /// Base URL of the Narad node.
    #[arg(long, value_name = "URL", default_value = DEFAULT_SERVER)]
    server: String,
    /// The topic to use; it must already exist.
    #[arg(long, value_name = "TOPIC")]
    topic: String,
}

#[derive(Args, Debug)]
struct ProduceArgs {
    #[command(flatten)]
    target: TopicArgs,
    /// Comma-separated connection counts, each measured in its own run.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "1,16,64,256",
        value_parser = trimmed_count
    )]
    connections: Vec<usize>,
    /// Seconds each connection count runs.
    #[arg(long, value_name = "S", default_value_t = 5)]
    seconds: u64,
    /// Approximate size of each message in bytes.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    message_bytes: usize,
    /// Messages per batch request; 0 sends each message in its own request.
    #[arg(long, value_name = "N", default_value_t = 0)]
    batch: usize,
    /// Send JSON orders (the shape of bench/schemas/order.json) instead of
    /// filler bytes, for a topic that has a schema.
    #[arg(long)]
    json: bool,
    /// Value of the Authorization header sent with every request, for a
    /// node with auth on.
    #[arg(long, value_name = "HEADER")]
    authorization: Option<String>,
}

#[derive(Args, Debug)]
struct LatencyArgs {
    #[command(flatten)]
    target: TopicArgs,
    /// Messages per second, across all producers.
    #[arg(long, value_name = "N", default_value_t = 100)]
    rate: u64,
    /// Messages to send and time in all.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    messages: u64,
    /// Producer threads sharing the rate.
    #[arg(long, value_name = "N", default_value_t = 1)]
    producers: u64,
    /// Topic to consume from when it is not the one produced to (for
    /// example a child topic fed by the produced one); defaults to --topic.
    #[arg(long, value_name = "TOPIC")]
    consume_topic: Option<String>,
    /// Node to consume from when it is not --server (a remote child's
    /// topic on another cluster); defaults to --server.
    #[arg(long, value_name = "URL")]
    consume_server: Option<String>,
}

#[derive(Args, Debug)]
struct DrainArgs {
    #[command(flatten)]
    target: TopicArgs,
    /// Messages to put on the topic and then drain.
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    messages: u64,
    /// Consumers draining the topic at once.
    #[arg(long, value_name = "N", default_value_t = 4)]
    consumers: usize,
    /// Size of each message in bytes.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    message_bytes: usize,
    /// Produce nothing: the topic already holds --messages messages (a
    /// backlog filled by `produce`, read from disk after a restart).
    #[arg(long)]
    no_fill: bool,
}

#[derive(Args, Debug)]
struct CeilingArgs {
    /// Address to listen on; port 0 picks a free port (the address taken is
    /// printed).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    listen: String,
    /// Directory for the WAL rings.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_DIR)]
    dir: PathBuf,
    /// Shards, each with its own WAL ring and core; defaults to every core.
    #[arg(long, value_name = "N")]
    shards: Option<usize>,
}

/// One entry of `--connections`, spaces around it allowed.
fn trimmed_count(text: &str) -> Result<usize, String> {
    text.trim().parse().map_err(|e| format!("{e}"))
}

fn micros(histogram: &Histogram<u64>, quantile: f64) -> f64 {
    histogram.value_at_quantile(quantile) as f64
}

async fn timed_write_sync(file: &DmaFile, len: usize, pos: u64) -> u64 {
    let mut buf = file.alloc_dma_buffer(len);
    buf.as_bytes_mut().fill(0x5a);
    let started = Instant::now();
    file.write_at(buf, pos).await.expect("raw write");
    file.fdatasync().await.expect("raw fdatasync");
    started.elapsed().as_micros() as u64
}

async fn raw_limits(dir: &std::path::Path) -> Histogram<u64> {
    let path = dir.join("raw.bin");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .dma_open(&path)
        .await
        .expect("raw file");
    // Pre-write the file so that later writes overwrite allocated blocks.
    let started = Instant::now();
    let chunk = 1 << 20;
    for i in 0..RAW_SEQUENTIAL_BYTES / chunk {
        let mut buf = file.alloc_dma_buffer(chunk);
        buf.as_bytes_mut().fill(0);
        file.write_at(buf, (i * chunk) as u64)
            .await
            .expect("sequential write");
    }
    file.fdatasync().await.expect("sync");
    let sequential = RAW_SEQUENTIAL_BYTES as f64 / started.elapsed().as_secs_f64() / 1e6;
    let mut small = Histogram::<u64>::new(3).expect("histogram");
    let started = Instant::now();
    for i in 0..RAW_SMALL_WRITES {
        small
            .record(timed_write_sync(&file, 4096, (i * 4096) as u64).await)
            .ok();
    }
    let small_rate = RAW_SMALL_WRITES as f64 / started.elapsed().as_secs_f64();
    let mut large = Histogram::<u64>::new(3).expect("histogram");
    for i in 0..RAW_LARGE_WRITES {
        large
            .record(timed_write_sync(&file, 256 * 1024, (i * 256 * 1024) as u64).await)
            .ok();
    }
    println!("raw disk: O_DIRECT 4 KiB write+fdatasync on a pre-written file: {small_rate:.0}/s (p50 {:.0} us)", micros(&small, 0.5));
    println!("raw disk: sequential O_DIRECT 1 MiB writes: {sequential:.0} MB/s");
    println!(
        "raw disk: one 256 KiB O_DIRECT write+fdatasync: p50 {:.0} us, p99 {:.0} us",
        micros(&large, 0.5),
        micros(&large, 0.99)
    );
    file.close().await.ok();
    std::fs::remove_file(&path).ok();
    large
}

async fn wal_level(
    wal: &Rc<Wal<GlommioFs>>,
    appenders: usize,
    duration: Duration,
    flushes: &Rc<RefCell<(u64, u64)>>,
) -> LevelResult {
    *flushes.borrow_mut() = (0, 0);
    let latencies = Rc::new(RefCell::new(Histogram::<u64>::new(3).expect("histogram")));
    // A timer flips this flag, so appenders read the clock only to time appends.
    let running = Rc::new(std::cell::Cell::new(true));
    let stopper = running.clone();
    glommio::spawn_local(async move {
        glommio::timer::sleep(duration).await;
        stopper.set(false);
    })
    .detach();
    let value = vec![0xabu8; RECORD_VALUE_BYTES];
    let started = Instant::now();
    let mut tasks = Vec::new();
    for appender in 0..appenders {
        let (wal, latencies, value, running) = (
            wal.clone(),
            latencies.clone(),
            value.clone(),
            running.clone(),
        );
        tasks.push(glommio::spawn_local(async move {
            let mut done = 0u64;
            let mut id = appender as u128;
            while running.get() {
                let record = WalRecordRef {
                    id,
                    topic: "bench",
                    partition: 0,
                    key: None,
                    value: &value,
                    accept_ms: 0,
                    topic_incarnation: Some(0),
                    offset: None,
                    idempotency: None,
                    key_only: false,
                };
                let sent = Instant::now();
                let appended = wal.append(&record).expect("append");
                appended.durable.await.expect("durable");
                latencies
                    .borrow_mut()
                    .record(sent.elapsed().as_micros() as u64)
                    .ok();
                // Keep the ring from filling: the record counts as dispatched.
                wal.mark_committed(appended.pos);
                id += appenders as u128;
                done += 1;
            }
            done
        }));
    }
    let mut records = 0;
    for task in tasks {
        records += task.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (syncs, synced_records) = *flushes.borrow();
    let latencies = latencies.borrow();
    let rate = records as f64 / elapsed;
    println!(
        "wal: {appenders:>3} appenders: {:>8.0} records/s {:>7.1} MB/s  p50 {:>6.0} us  p99 {:>6.0} us  {:>5.1} records/fsync",
        records as f64 / elapsed,
        records as f64 * RECORD_VALUE_BYTES as f64 / elapsed / 1e6,
        micros(&latencies, 0.5),
        micros(&latencies, 0.99),
        synced_records as f64 / syncs.max(1) as f64
    );
    LevelResult {
        rate,
        p99_micros: micros(&latencies, 0.99),
    }
}

struct LevelResult {
    rate: f64,
    p99_micros: f64,
}

/// The storage issue's goal: at 256 appenders, at least half of
/// 256 ÷ (median raw 256 KiB write + fdatasync) records/s, and a p99 append
/// latency at most 3× that write's raw p99.
fn print_goal(raw: &Histogram<u64>, at_256: &LevelResult) {
    let raw_p50 = micros(raw, 0.5).max(1.0);
    let goal_rate = 0.5 * 256.0 / (raw_p50 / 1e6);
    let goal_p99 = 3.0 * micros(raw, 0.99);
    println!(
        "goal at 256 appenders: {:.0} records/s ({:.2} of the goal {goal_rate:.0}); p99 {:.0} us ({:.2} of the goal {goal_p99:.0} us)",
        at_256.rate,
        at_256.rate / goal_rate,
        at_256.p99_micros,
        at_256.p99_micros / goal_p99.max(1.0)
    );
}

/// A JSON order of about `bytes` bytes: an id, a customer, line items and
/// a note that pads it (the shape bench/schemas/order.json describes).
fn json_message(bytes: usize) -> String {
    let items: Vec<String> = (0..5)
        .map(|i| {
            format!(
                r#"{{"sku":"SKU-{i:05}","quantity":{},"price":{}.99}}"#,
                i + 1,
                10 + i
            )
        })
        .collect();
    let head = format!(
        r#"{{"id":123456,"customer":"customer-42","currency":"EUR","items":[{}],"note":""#,
        items.join(",")
    );
    let pad = bytes.saturating_sub(head.len() + 2);
    format!("{head}{}\"}}", "n".repeat(pad))
}

fn produce_main(args: ProduceArgs) -> Result<(), String> {
    let server = &args.target.server;
    let addr = server
        .strip_prefix("http://")
        .unwrap_or(server)
        .trim_end_matches('/')
        .to_string();
    let topic = &args.target.topic;
    let (seconds, batch) = (args.seconds, args.batch);
    // `--json`: each message is a JSON order of about `--message-bytes`
    // (for topics with a schema); else that many bytes of `x`.
    let value = if args.json {
        json_message(args.message_bytes)
    } else {
        "x".repeat(args.message_bytes)
    };
    let authorization = args.authorization;
    let (path, body, per_request) = if batch == 0 {
        (
            format!("/v1/topics/{topic}/messages"),
            value.into_bytes(),
            1,
        )
    } else {
        let items: Vec<String> = (0..batch)
            .map(|_| format!("{{\"value\":\"{value}\"}}"))
            .collect();
        (
            format!("/v1/topics/{topic}/messages/batch"),
            format!("{{\"messages\":[{}]}}", items.join(",")).into_bytes(),
            batch,
        )
    };
    for connections in args.connections {
        let config = http_load::LoadConfig {
            addr: addr.clone(),
            path: path.clone(),
            connections,
            duration: Duration::from_secs(seconds),
            body: body.clone(),
            messages_per_request: per_request,
            authorization: authorization.clone(),
        };
        let result = http_load::run(&config)?;
        let secs = result.elapsed.as_secs_f64();
        println!(
            "produce {}: {connections:>3} connections: {:>8.0} req/s {:>9.0} msg/s  p50 {:>6} us  p99 {:>6} us  p999 {:>6} us  errors {}",
            if batch == 0 { "single".to_string() } else { format!("batch x{batch}") },
            result.requests as f64 / secs,
            (result.requests * config.messages_per_request as u64) as f64 / secs,
            result.latency_us.value_at_quantile(0.5),
            result.latency_us.value_at_quantile(0.99),
            result.latency_us.value_at_quantile(0.999),
            result.errors
        );
    }
    Ok(())
}

/// `narad-bench drain`: fills the topic, then drains it.
fn drain_main(args: DrainArgs) -> Result<(), String> {
    let consumers = args.consumers;
    let result = drain::run(
        &args.target.server,
        &args.target.topic,
        args.messages,
        consumers,
        args.message_bytes,
        !args.no_fill,
    )?;
    println!(
        "consume + ack, {consumers} consumers, batches of 100: {} messages in {:.2} s = {:.0} msg/s",
        result.messages,
        result.elapsed.as_secs_f64(),
        result.messages as f64 / result.elapsed.as_secs_f64()
    );
    Ok(())
}

/// `narad-bench latency`: produce → consumable at a fixed rate.
fn latency_main(args: LatencyArgs) -> Result<(), String> {
    let topic = &args.target.topic;
    let rate = args.rate;
    let consume_topic = args.consume_topic.as_ref().unwrap_or(topic);
    let consume_server = args
        .consume_server
        .as_deref()
        .unwrap_or(&args.target.server);
    let histogram = latency::run(&latency::Plan {
        server: &args.target.server,
        topic,
        consume_topic,
        consume_server,
        rate_per_second: rate,
        messages: args.messages,
        producers: args.producers,
    })?;
    println!(
        "produce ({topic}) -> consumable ({consume_topic}) at {rate} msg/s: {} messages  p50 {} us  p99 {} us  p999 {} us  max {} us",
        histogram.len(),
        histogram.value_at_quantile(0.5),
        histogram.value_at_quantile(0.99),
        histogram.value_at_quantile(0.999),
        histogram.max()
    );
    Ok(())
}

/// `narad-bench ceiling`: serves until killed.
fn ceiling_main(args: CeilingArgs) -> Result<(), String> {
    let shards = args
        .shards
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    ceiling::run(&args.listen, &args.dir, shards)
}

/// `narad-bench wal`: the raw disk's limits, then the WAL at each appender
/// count.
fn wal_main(args: WalArgs) {
    let data_dir = args.dir.clone();
    let executor = LocalExecutorBuilder::default()
        .io_memory(IO_MEMORY_BYTES)
        .make()
        .expect("glommio executor");
    executor.run(async move {
        let fs = GlommioFs::new(&args.dir).await.expect("data dir");
        let raw = raw_limits(&args.dir).await;
        let wal_dir = args.dir.join("wal");
        std::fs::remove_dir_all(&wal_dir).ok();
        let (wal, _) = Wal::open(
            &fs,
            &wal_dir,
            WalConfig {
                ring_bytes: RING_BYTES,
                ..WalConfig::default()
            },
        )
        .await
        .expect("wal");
        let flushes = Rc::new(RefCell::new((0u64, 0u64)));
        let counter = flushes.clone();
        glommio::spawn_local(wal.clone().run_committer(move |outcome, _| {
            let mut c = counter.borrow_mut();
            c.0 += 1;
            c.1 += outcome.records as u64;
        }))
        .detach();
        let checkpointer = wal.clone();
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(Duration::from_millis(250)).await;
                if checkpointer.checkpoint(0).await.is_err() {
                    return;
                }
            }
        })
        .detach();
        for appenders in CONCURRENCY_LEVELS {
            let result =
                wal_level(&wal, appenders, Duration::from_secs(args.seconds), &flushes).await;
            if appenders == 256 {
                print_goal(&raw, &result);
            }
        }
        wal.close();
    });
    std::fs::remove_dir_all(data_dir.join("wal")).ok();
}

fn main() {
    let result = match Cli::parse().command {
        Command::Wal(args) => {
            wal_main(args);
            Ok(())
        }
        Command::Produce(args) => produce_main(args),
        Command::Latency(args) => latency_main(args),
        Command::Drain(args) => drain_main(args),
        Command::Workload(args) => compare::workload_main(args),
        Command::Compare(args) => compare::compare_main(args),
        Command::Ceiling(args) => ceiling_main(args),
    };
    if let Err(message) = result {
        eprintln!("narad-bench: {message}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use clap::error::ErrorKind;
    use clap::{CommandFactory, Parser};

    use super::{Cli, Command};

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn unknown_flags_are_refused() {
        let error = Cli::try_parse_from(["narad-bench", "produce", "--topic", "t", "--bogus", "1"])
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::UnknownArgument);
        let error = Cli::try_parse_from(["narad-bench", "wal", "--second", "3"]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::UnknownArgument);
    }

    #[test]
    fn compare_takes_several_workloads_and_a_peer_list() {
        let cli = Cli::try_parse_from([
            "narad-bench",
            "compare",
            "a.yaml",
            "b.yaml",
            "--peers",
            "nats,redis",
            "--rounds",
            "3",
            "--duration-seconds",
            "60",
        ])
        .unwrap();
        let Command::Compare(args) = cli.command else {
            panic!("not compare: {cli:?}");
        };
        assert_eq!(
            args.workloads,
            [PathBuf::from("a.yaml"), PathBuf::from("b.yaml")]
        );
        assert_eq!(args.peers, ["nats", "redis"]);
        assert_eq!(args.rounds, 3);
        assert_eq!(args.out, PathBuf::from("compare-results"));
        assert_eq!(args.system.server, "http://127.0.0.1:8080");
        assert_eq!(args.system.duration_seconds, Some(60.0));
        assert_eq!(args.system.warmup_seconds, None);
        assert_eq!(args.system.nats, "127.0.0.1:14222");
    }

    #[test]
    fn compare_defaults_to_every_peer_and_needs_a_workload() {
        let cli = Cli::try_parse_from(["narad-bench", "compare", "a.yaml"]).unwrap();
        let Command::Compare(args) = cli.command else {
            panic!("not compare: {cli:?}");
        };
        assert_eq!(args.peers, ["nats", "rabbitmq", "redis"]);
        let error = Cli::try_parse_from(["narad-bench", "compare", "--rounds", "2"]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn defaults_are_the_ones_the_scripts_rely_on() {
        let cli = Cli::try_parse_from(["narad-bench", "produce", "--topic", "t"]).unwrap();
        let Command::Produce(args) = cli.command else {
            panic!("not produce: {cli:?}");
        };
        assert_eq!(args.connections, [1, 16, 64, 256]);
        assert_eq!((args.seconds, args.message_bytes, args.batch), (5, 1024, 0));
        assert!(!args.json && args.authorization.is_none());
        let cli = Cli::try_parse_from([
            "narad-bench",
            "produce",
            "--topic",
            "t",
            "--connections",
            "64, 8",
        ])
        .unwrap();
        let Command::Produce(args) = cli.command else {
            panic!("not produce: {cli:?}");
        };
        assert_eq!(args.connections, [64, 8]);
        let error = Cli::try_parse_from(["narad-bench", "latency"]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::MissingRequiredArgument);
        let cli = Cli::try_parse_from(["narad-bench", "wal"]).unwrap();
        let Command::Wal(args) = cli.command else {
            panic!("not wal: {cli:?}");
        };
        assert_eq!(
            (args.dir, args.seconds),
            (PathBuf::from("./narad-bench-data"), 5)
        );
    }
}
