//! `narad-bench workload` (one system) and `narad-bench compare` (Narad and
//! every peer that answers, in one invocation, taking turns), with result
//! files, a ratio table and charts.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use serde_json::Value;

use crate::chart;
use crate::coalescing::CoalescingDriver;
use crate::driver::{Driver, NaradDriver};
use crate::omb;
use crate::reqwest_driver::ReqwestDriver;
use crate::workload::Workload;

/// Where `bench/peers.sh start` runs each peer (loopback, ports of their
/// own so as not to clash with a system-wide install).
const NATS_URL: &str = "127.0.0.1:14222";
const RABBITMQ_URL: &str = "amqp://guest:guest@127.0.0.1:15673";
const REDIS_URL: &str = "redis://127.0.0.1:16379/";

/// The peers compare tries when `--peers` is not given.
const PEERS: &str = "nats,rabbitmq,redis";

/// The systems `workload --driver` can run on.
const DRIVERS: [&str; 8] = [
    "narad",
    "narad-idempotent",
    "narad-reqwest",
    "narad-coalescing",
    "nats",
    "rabbitmq",
    "redis",
    "redis-pipelined",
];

/// Where the systems under test are and how long each run lasts; shared by
/// `workload` and `compare`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct SystemArgs {
    /// Base URL of the Narad node.
    #[arg(long, value_name = "URL", default_value = crate::DEFAULT_SERVER)]
    pub server: String,
    /// Measuring time of each run in seconds, in place of the workload
    /// file's testDurationMinutes.
    #[arg(long, value_name = "S")]
    pub duration_seconds: Option<f64>,
    /// Warm-up time of each run in seconds, in place of the workload file's
    /// warmupDurationMinutes.
    #[arg(long, value_name = "S")]
    pub warmup_seconds: Option<f64>,
    /// NATS server address (used with --features peers).
    #[arg(long, value_name = "ADDR", default_value = NATS_URL, help_heading = PEER_HEADING)]
    pub nats: String,
    /// RabbitMQ AMQP URL (used with --features peers).
    #[arg(long, value_name = "URL", default_value = RABBITMQ_URL, help_heading = PEER_HEADING)]
    pub rabbitmq: String,
    /// Redis URL (used with --features peers).
    #[arg(long, value_name = "URL", default_value = REDIS_URL, help_heading = PEER_HEADING)]
    pub redis: String,
}

const PEER_HEADING: &str = "Peer brokers (built with --features peers)";

/// `narad-bench workload`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct WorkloadArgs {
    /// The OpenMessaging Benchmark workload file (YAML).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The system to run it on (the peers need --features peers).
    #[arg(long, value_name = "NAME", default_value = "narad",
          value_parser = clap::builder::PossibleValuesParser::new(DRIVERS))]
    pub driver: String,
    /// Directory the result file is written to.
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub out: PathBuf,
    #[command(flatten)]
    pub system: SystemArgs,
}

/// `narad-bench compare`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct CompareArgs {
    /// One or more OpenMessaging Benchmark workload files (YAML), run one
    /// after the other.
    #[arg(value_name = "WORKLOAD", required = true, num_args = 1..)]
    pub workloads: Vec<PathBuf>,
    /// Comma-separated peers to run beside Narad (nats, rabbitmq, redis);
    /// a peer that cannot be reached is skipped with a message.
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = PEERS)]
    pub peers: Vec<String>,
    /// Rounds: each runs every system once, Narad first; the table shows
    /// each system's median round by publish rate.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub rounds: usize,
    /// Directory for the result files, compare.md and the charts.
    #[arg(long, value_name = "DIR", default_value = "compare-results")]
    pub out: PathBuf,
    #[command(flatten)]
    pub system: SystemArgs,
}

/// The figures of the ratio table: (label, result key, higher is better).
const TABLE: [(&str, &str, bool); 8] = [
    ("publish msg/s", "publishRate", true),
    ("consume msg/s", "consumeRate", true),
    ("publish p50 ms", "aggregatedPublishLatency50pct", false),
    ("publish p99 ms", "aggregatedPublishLatency99pct", false),
    ("publish p99.9 ms", "aggregatedPublishLatency999pct", false),
    ("end-to-end p50 ms", "aggregatedEndToEndLatency50pct", false),
    ("end-to-end p99 ms", "aggregatedEndToEndLatency99pct", false),
    (
        "confirm→consumed p99 ms",
        "aggregatedConfirmToConsumeLatency99pct",
        false,
    ),
];

/// File-name form of a workload's name.
fn slug(name: &str) -> String {
    let raw: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    raw.split('-')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

/// Reads a workload file and applies `--duration-seconds` /
/// `--warmup-seconds` overrides (shorter runs for a quick compare).
fn load_workload(file: &Path, system: &SystemArgs) -> Result<Workload, String> {
    let shown = file.display();
    let text = std::fs::read_to_string(file).map_err(|e| format!("reading {shown}: {e}"))?;
    let mut workload = Workload::parse(&text).map_err(|e| format!("{shown}: {e}"))?;
    if let Some(seconds) = system.duration_seconds {
        workload.test_duration_minutes = seconds / 60.0;
    }
    if let Some(seconds) = system.warmup_seconds {
        workload.warmup_duration_minutes = seconds / 60.0;
    }
    Ok(workload)
}

/// The driver for `name`, or why it cannot be used.
fn driver(name: &str, system: &SystemArgs) -> Result<Arc<dyn Driver>, String> {
    match name {
        "narad" => Ok(Arc::new(NaradDriver::new(&system.server)?)),
        "narad-idempotent" => Ok(Arc::new(NaradDriver::with_idempotency_keys(
            &system.server,
        )?)),
        "narad-reqwest" => Ok(Arc::new(ReqwestDriver::new(&system.server)?)),
        "narad-coalescing" => Ok(Arc::new(CoalescingDriver::new(&system.server)?)),
        #[cfg(feature = "peers")]
        peer => crate::peers::driver(peer, system),
        #[cfg(not(feature = "peers"))]
        peer => Err(format!(
            "{peer}: peer drivers are built with `--features peers`"
        )),
    }
}

fn write_result(
    dir: &Path,
    workload: &Workload,
    result: &Value,
    round: usize,
) -> Result<PathBuf, String> {
    let system = result["driver"].as_str().unwrap_or("system");
    let path = dir.join(format!("{}-{system}-{round}.json", slug(&workload.name)));
    let text = serde_json::to_string_pretty(result).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(path)
}

/// `narad-bench workload FILE [--driver NAME] [--server URL] [--out DIR]`.
pub fn workload_main(args: WorkloadArgs) -> Result<(), String> {
    let workload = load_workload(&args.file, &args.system)?;
    let driver = driver(&args.driver, &args.system)?;
    let out = args.out;
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let result = omb::run(&driver, &workload)?;
    let path = write_result(&out, &workload, &result, 1)?;
    println!("{}\n  result: {}", omb::summary(&result), path.display());
    Ok(())
}

/// `narad-bench compare WORKLOAD... [--peers a,b] [--rounds N] [--out DIR]`.
pub fn compare_main(args: CompareArgs) -> Result<(), String> {
    let out = &args.out;
    std::fs::create_dir_all(out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let rounds = args.rounds;
    let system = &args.system;
    let mut systems: Vec<Arc<dyn Driver>> = vec![driver("narad", system)?];
    for peer in args.peers.iter().filter(|p| !p.is_empty()) {
        match driver(peer, system) {
            Ok(driver) => systems.push(driver),
            Err(why) => eprintln!("compare: {peer} skipped: {why}"),
        }
    }
    let mut report = String::new();
    for file in &args.workloads {
        let workload = load_workload(file, system)?;
        // Taking turns: each round runs every system once, Narad first.
        let mut results: Vec<Vec<Value>> = vec![Vec::new(); systems.len()];
        for round in 1..=rounds {
            for (i, system) in systems.iter().enumerate() {
                eprintln!(
                    "== {} on {} (round {round}/{rounds})",
                    workload.name,
                    system.name()
                );
                match omb::run(system, &workload) {
                    Ok(result) => {
                        write_result(out, &workload, &result, round)?;
                        results[i].push(result);
                    }
                    Err(error) => eprintln!("compare: {} failed: {error}", system.name()),
                }
            }
        }
        let best: Vec<&Value> = results.iter().filter_map(|r| median_run(r)).collect();
        let table = ratio_table(&workload, &best);
        println!("{table}");
        report.push_str(&table);
        report.push('\n');
        let base = out.join(slug(&workload.name));
        chart::latency_curves(&base.with_extension("latency.svg"), &workload.name, &best)?;
        chart::throughput(
            &base.with_extension("throughput.svg"),
            &workload.name,
            &best,
        )?;
    }
    let path = out.join("compare.md");
    std::fs::write(&path, report).map_err(|e| format!("writing {}: {e}", path.display()))?;
    println!("tables: {}; results and charts beside it", path.display());
    Ok(())
}

/// The run with the median publish rate of a system's rounds.
fn median_run(runs: &[Value]) -> Option<&Value> {
    let mut sorted: Vec<&Value> = runs.iter().collect();
    sorted.sort_by(|a, b| mean(a, "publishRate").total_cmp(&mean(b, "publishRate")));
    sorted.get(sorted.len() / 2).copied()
}

/// A figure of a result: the mean of a per-interval series, or a number.
pub fn mean(result: &Value, key: &str) -> f64 {
    match &result[key] {
        Value::Array(values) => {
            let values: Vec<f64> = values.iter().filter_map(Value::as_f64).collect();
            values.iter().sum::<f64>() / values.len().max(1) as f64
        }
        value => value.as_f64().unwrap_or(f64::NAN),
    }
}

/// A markdown table: each system's figures, and each as a ratio to Narad's
/// (the first column).
fn ratio_table(workload: &Workload, results: &[&Value]) -> String {
    let mut out = format!("### {}\n\n| figure |", workload.name);
    for result in results {
        out.push_str(&format!(" {} |", result["driver"].as_str().unwrap_or("?")));
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(results.len()));
    out.push('\n');
    let Some(narad) = results.first() else {
        return out;
    };
    for (label, key, _higher_is_better) in TABLE {
        out.push_str(&format!("| {label} |"));
        let base = mean(narad, key);
        for (i, result) in results.iter().enumerate() {
            let value = mean(result, key);
            if i == 0 {
                out.push_str(&format!(" {} |", figure(value)));
            } else {
                // How Narad compares: its figure over the peer's for rates,
                // the peer's over Narad's for latencies, so > 1 favours Narad.
                let ratio = if key.ends_with("Rate") {
                    base / value
                } else {
                    value / base
                };
                out.push_str(&format!(" {} ({}) |", figure(value), ratio_text(ratio)));
            }
        }
        out.push('\n');
    }
    out.push_str("\nDurability as read back from each server:\n\n");
    for result in results {
        out.push_str(&format!(
            "- {}: {}\n",
            result["driver"].as_str().unwrap_or("?"),
            result["durability"].as_str().unwrap_or("?")
        ));
    }
    out.push_str(
        "\nIn brackets: Narad's advantage (its rate over the peer's; the peer's latency \
         over Narad's); above 1 favours Narad.\n",
    );
    out
}

fn figure(value: f64) -> String {
    if !value.is_finite() {
        "n/a".into()
    } else if value >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

fn ratio_text(ratio: f64) -> String {
    if ratio.is_finite() {
        format!("{ratio:.2}×")
    } else {
        "n/a".into()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn slugs_are_file_names() {
        assert_eq!(
            slug("1 topic / 16 partitions / 1kb / max rate"),
            "1-topic-16-partitions-1kb-max-rate"
        );
    }

    #[test]
    fn the_table_gives_ratios_that_favour_narad_above_one() {
        let narad = json!({"driver": "narad", "durability": "fsync", "publishRate": [40000.0, 60000.0],
            "aggregatedPublishLatency99pct": 2.0});
        let peer = json!({"driver": "peer", "durability": "fsync", "publishRate": [10000.0],
            "aggregatedPublishLatency99pct": 8.0});
        let table = ratio_table(&Workload::default(), &[&narad, &peer]);
        assert!(
            table.contains("| publish msg/s | 50000 | 10000 (5.00×) |"),
            "{table}"
        );
        assert!(
            table.contains("| publish p99 ms | 2.00 | 8.00 (4.00×) |"),
            "{table}"
        );
    }

    #[test]
    fn the_median_round_is_picked_by_publish_rate() {
        let runs = vec![
            json!({"publishRate": [3.0]}),
            json!({"publishRate": [1.0]}),
            json!({"publishRate": [2.0]}),
        ];
        assert_eq!(median_run(&runs).map(|r| mean(r, "publishRate")), Some(2.0));
    }
}
