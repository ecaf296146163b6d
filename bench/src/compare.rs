//! `narad-bench workload` (one system) and `narad-bench compare` (Narad and
//! every peer that answers, in one invocation, taking turns), with result
//! files, a ratio table and charts.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::chart;
use crate::driver::{Driver, NaradDriver};
use crate::omb;
use crate::reqwest_driver::ReqwestDriver;
use crate::workload::Workload;

const DEFAULT_SERVER: &str = "http://127.0.0.1:8080";

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

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

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
fn load_workload(file: &str, args: &[String]) -> Result<Workload, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("reading {file}: {e}"))?;
    let mut workload = Workload::parse(&text).map_err(|e| format!("{file}: {e}"))?;
    if let Some(seconds) = flag(args, "--duration-seconds") {
        let seconds: f64 = seconds
            .parse()
            .map_err(|_| format!("--duration-seconds: {seconds:?} is not a number"))?;
        workload.test_duration_minutes = seconds / 60.0;
    }
    if let Some(seconds) = flag(args, "--warmup-seconds") {
        let seconds: f64 = seconds
            .parse()
            .map_err(|_| format!("--warmup-seconds: {seconds:?} is not a number"))?;
        workload.warmup_duration_minutes = seconds / 60.0;
    }
    Ok(workload)
}

/// The driver for `name`, or why it cannot be used.
fn driver(name: &str, args: &[String]) -> Result<Arc<dyn Driver>, String> {
    match name {
        "narad" => {
            let server = flag(args, "--server").unwrap_or_else(|| DEFAULT_SERVER.into());
            Ok(Arc::new(NaradDriver::new(&server)?))
        }
        "narad-reqwest" => {
            let server = flag(args, "--server").unwrap_or_else(|| DEFAULT_SERVER.into());
            Ok(Arc::new(ReqwestDriver::new(&server)?))
        }
        #[cfg(feature = "peers")]
        peer => crate::peers::driver(peer, args),
        #[cfg(not(feature = "peers"))]
        peer => Err(format!(
            "{peer}: peer drivers are built with `--features peers`"
        )),
    }
}

/// The peers compare tries when `--peers` is not given.
const PEERS: [&str; 3] = ["nats", "rabbitmq", "redis"];

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
pub fn workload_main(args: &[String]) -> Result<(), String> {
    let file = args.get(1).filter(|a| !a.starts_with("--")).ok_or(
        "usage: narad-bench workload FILE [--driver narad|narad-reqwest|nats|rabbitmq|redis] [--server URL] \
         [--out DIR] [--duration-seconds S] [--warmup-seconds S]",
    )?;
    let workload = load_workload(file, args)?;
    let driver = driver(
        &flag(args, "--driver").unwrap_or_else(|| "narad".into()),
        args,
    )?;
    let out = PathBuf::from(flag(args, "--out").unwrap_or_else(|| ".".into()));
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let result = omb::run(&driver, &workload)?;
    let path = write_result(&out, &workload, &result, 1)?;
    println!("{}\n  result: {}", omb::summary(&result), path.display());
    Ok(())
}

/// `narad-bench compare WORKLOAD... [--peers a,b] [--rounds N] [--out DIR]`.
pub fn compare_main(args: &[String]) -> Result<(), String> {
    let files: Vec<&String> = args
        .iter()
        .skip(1)
        .take_while(|a| !a.starts_with("--"))
        .collect();
    if files.is_empty() {
        return Err(
            "usage: narad-bench compare WORKLOAD.yaml... [--server URL] \
             [--peers nats,rabbitmq,redis] [--rounds N] [--out DIR] [--duration-seconds S] \
             [--warmup-seconds S]"
                .into(),
        );
    }
    let out = PathBuf::from(flag(args, "--out").unwrap_or_else(|| "compare-results".into()));
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let rounds: usize = flag(args, "--rounds")
        .map_or(Ok(1), |r| r.parse())
        .map_err(|_| "--rounds: not a number".to_string())?;
    let wanted: Vec<String> = flag(args, "--peers").map_or_else(
        || PEERS.iter().map(|p| (*p).to_string()).collect(),
        |list| {
            list.split(',')
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect()
        },
    );
    let mut systems: Vec<Arc<dyn Driver>> = vec![driver("narad", args)?];
    for peer in &wanted {
        match driver(peer, args) {
            Ok(driver) => systems.push(driver),
            Err(why) => eprintln!("compare: {peer} skipped: {why}"),
        }
    }
    let mut report = String::new();
    for file in files {
        let workload = load_workload(file, args)?;
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
                        write_result(&out, &workload, &result, round)?;
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
