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
//! `narad-bench latency --server URL --topic T [--rate 100] [--messages 1000]`:
//! produce → consumable latency at a light fixed rate.
//!
//! `narad-bench drain --server URL --topic T [--messages N] [--consumers C]`:
//! consume + ack throughput (long polls of 100, batch acks).
//!
//! `narad-bench workload FILE [--driver NAME] [--server URL] [--out DIR]`: an
//! OpenMessaging Benchmark workload file on one system, open loop at its
//! `producerRate`, with an OMB-style result file (see `omb.rs`).
//!
//! `narad-bench compare WORKLOAD... [--peers nats,rabbitmq,redis] [--rounds N]
//! [--out DIR]`: the same workloads on Narad and every peer that answers
//! (peers need `--features peers` and `bench/peers.sh start`), taking turns;
//! a ratio table, result files and SVG charts (see `compare.rs`).
//!
//! `narad-bench ceiling [--listen ADDR] [--dir DIR] [--shards N]`: the bare
//! endpoint the broker's produce is compared with (202 after a group-committed
//! fdatasync; one WAL ring per shard, every core by default).

mod ceiling;

/// The same allocator as `narad`, so the ceiling is measured on equal terms.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
mod chart;
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

struct Args {
    dir: PathBuf,
    seconds: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("wal") => {}
        other => {
            return Err(format!(
                "usage: narad-bench wal [--dir DIR] [--seconds S] (got {other:?})"
            ))
        }
    }
    let mut parsed = Args {
        dir: PathBuf::from("./narad-bench-data"),
        seconds: 5,
    };
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--dir" => parsed.dir = PathBuf::from(value),
            "--seconds" => parsed.seconds = value.parse().map_err(|e| format!("--seconds: {e}"))?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(parsed)
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

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
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

fn produce_main(args: &[String]) -> Result<(), String> {
    let server = flag(args, "--server").unwrap_or_else(|| "http://127.0.0.1:8080".into());
    let addr = server
        .strip_prefix("http://")
        .unwrap_or(&server)
        .trim_end_matches('/')
        .to_string();
    let topic = flag(args, "--topic").ok_or("--topic is required")?;
    let seconds: u64 = flag(args, "--seconds")
        .map_or(Ok(5), |s| s.parse())
        .map_err(|e| format!("--seconds: {e}"))?;
    let message_bytes: usize = flag(args, "--message-bytes")
        .map_or(Ok(1024), |s| s.parse())
        .map_err(|e| format!("--message-bytes: {e}"))?;
    let batch: usize = flag(args, "--batch")
        .map_or(Ok(0), |s| s.parse())
        .map_err(|e| format!("--batch: {e}"))?;
    let levels: Vec<usize> = flag(args, "--connections")
        .unwrap_or_else(|| "1,16,64,256".into())
        .split(',')
        .map(|c| c.trim().parse().map_err(|e| format!("--connections: {e}")))
        .collect::<Result<_, _>>()?;
    // `--json`: each message is a JSON order of about `--message-bytes`
    // (for topics with a schema); else that many bytes of `x`.
    let value = if args.iter().any(|a| a == "--json") {
        json_message(message_bytes)
    } else {
        "x".repeat(message_bytes)
    };
    let authorization = flag(args, "--authorization");
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
    for connections in levels {
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

/// `narad-bench drain --server URL --topic T [--messages 20000] [--consumers 4] [--message-bytes 1024]`
fn drain_main(args: &[String]) -> Result<(), String> {
    let server = flag(args, "--server").unwrap_or_else(|| "http://127.0.0.1:8080".into());
    let topic = flag(args, "--topic").ok_or("--topic is required")?;
    let messages: u64 = flag(args, "--messages")
        .map_or(Ok(20_000), |s| s.parse())
        .map_err(|e| format!("--messages: {e}"))?;
    let consumers: usize = flag(args, "--consumers")
        .map_or(Ok(4), |s| s.parse())
        .map_err(|e| format!("--consumers: {e}"))?;
    let bytes: usize = flag(args, "--message-bytes")
        .map_or(Ok(1024), |s| s.parse())
        .map_err(|e| format!("--message-bytes: {e}"))?;
    let result = drain::run(&server, &topic, messages, consumers, bytes)?;
    println!(
        "consume + ack, {consumers} consumers, batches of 100: {} messages in {:.2} s = {:.0} msg/s",
        result.messages,
        result.elapsed.as_secs_f64(),
        result.messages as f64 / result.elapsed.as_secs_f64()
    );
    Ok(())
}

/// `narad-bench latency --server URL --topic T [--rate 100] [--messages 1000]`
fn latency_main(args: &[String]) -> Result<(), String> {
    let server = flag(args, "--server").unwrap_or_else(|| "http://127.0.0.1:8080".into());
    let topic = flag(args, "--topic").ok_or("--topic is required")?;
    let rate: u64 = flag(args, "--rate")
        .map_or(Ok(100), |s| s.parse())
        .map_err(|e| format!("--rate: {e}"))?;
    let messages: u64 = flag(args, "--messages")
        .map_or(Ok(1000), |s| s.parse())
        .map_err(|e| format!("--messages: {e}"))?;
    let producers: u64 = flag(args, "--producers")
        .map_or(Ok(1), |s| s.parse())
        .map_err(|e| format!("--producers: {e}"))?;
    let consume_topic = flag(args, "--consume-topic").unwrap_or_else(|| topic.clone());
    let histogram = latency::run(&latency::Plan {
        server: &server,
        topic: &topic,
        consume_topic: &consume_topic,
        rate_per_second: rate,
        messages,
        producers,
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

fn main() {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let mode_result = match all.first().map(String::as_str) {
        Some("produce") => Some(produce_main(&all)),
        Some("workload") => Some(compare::workload_main(&all)),
        Some("compare") => Some(compare::compare_main(&all)),
        Some("latency") => Some(latency_main(&all)),
        Some("drain") => Some(drain_main(&all)),
        Some("ceiling") => {
            let listen = flag(&all, "--listen").unwrap_or_else(|| "127.0.0.1:0".into());
            let dir =
                PathBuf::from(flag(&all, "--dir").unwrap_or_else(|| "./narad-bench-data".into()));
            let shards = flag(&all, "--shards")
                .map(|s| s.parse::<usize>())
                .transpose()
                .map_err(|e| format!("--shards: {e}"));
            Some(shards.and_then(|shards| {
                let cpus = std::thread::available_parallelism().map_or(1, usize::from);
                ceiling::run(&listen, &dir, shards.unwrap_or(cpus))
            }))
        }
        _ => None,
    };
    if let Some(result) = mode_result {
        if let Err(message) = result {
            eprintln!("narad-bench: {message}");
            std::process::exit(1);
        }
        return;
    }
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
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
                if checkpointer.checkpoint().await.is_err() {
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
