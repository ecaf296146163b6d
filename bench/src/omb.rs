//! `narad-bench workload FILE --server URL [--out RESULT.json]`: runs an
//! OpenMessaging Benchmark workload against a Narad node and writes an
//! OMB-style result file.
//!
//! Producers run open loop at `producerRate` (each message has a due time;
//! publish latency counts from it, so a slow answer also delays what queues
//! behind it, as coordinated-omission correction requires), or closed loop
//! at rate 0. Every payload starts with its due time in microseconds, so a
//! consumer records end-to-end latency (due → consumed). Rates, backlog and
//! latency percentiles are kept per 10-second interval and for the whole run.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use serde_json::{json, Value};

use crate::workload::{due_offset, KeyDistributor, Workload};

/// OMB reports rates and percentiles per interval of this length.
const INTERVAL: Duration = Duration::from_secs(10);
const CONSUME_BATCH: u32 = 100;
const CONSUME_WAIT_MS: u64 = 500;
/// Latencies above an hour are recorded as an hour.
const LATENCY_MAX_MICROS: u64 = 3_600_000_000;
/// Longest a run waits for consumers to catch up after producers stop.
const DRAIN_DEADLINE: Duration = Duration::from_secs(60);

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A keep-alive HTTP/1.1 connection.
struct Conn {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn open(addr: &str) -> Result<Self, String> {
        let stream = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let writer = stream.try_clone().map_err(|e| e.to_string())?;
        Ok(Self {
            writer,
            reader: BufReader::new(stream),
        })
    }

    fn call(
        &mut self,
        method: &str,
        path: &str,
        header: Option<(&str, &str)>,
        body: &[u8],
    ) -> Result<(u16, Vec<u8>), String> {
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: {}\r\n",
            body.len()
        );
        if let Some((name, value)) = header {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        let mut request = head.into_bytes();
        request.extend_from_slice(body);
        self.writer.write_all(&request).map_err(|e| e.to_string())?;
        let mut line = String::new();
        self.reader
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        let status = line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("no status line: {line:?}"))?;
        let mut length = 0usize;
        loop {
            line.clear();
            self.reader
                .read_line(&mut line)
                .map_err(|e| e.to_string())?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut answer = vec![0u8; length];
        self.reader
            .read_exact(&mut answer)
            .map_err(|e| e.to_string())?;
        Ok((status, answer))
    }
}

/// Latencies of one interval or of the whole run, in microseconds.
struct Latencies {
    publish: Histogram<u64>,
    publish_delay: Histogram<u64>,
    end_to_end: Histogram<u64>,
}

impl Latencies {
    fn new() -> Result<Self, String> {
        let make = || {
            Histogram::<u64>::new_with_bounds(1, LATENCY_MAX_MICROS, 3).map_err(|e| e.to_string())
        };
        Ok(Self {
            publish: make()?,
            publish_delay: make()?,
            end_to_end: make()?,
        })
    }
}

/// What the threads record into.
struct Recorder {
    interval: Mutex<Latencies>,
    total: Mutex<Latencies>,
    recording: AtomicBool,
    published: AtomicU64,
    publish_errors: AtomicU64,
    consumed: AtomicU64,
    stop_producers: AtomicBool,
    stop_consumers: AtomicBool,
    consumers_paused: AtomicBool,
}

impl Recorder {
    fn record(&self, pick: impl Fn(&mut Latencies) -> &mut Histogram<u64>, micros: u64) {
        if !self.recording.load(Ordering::Relaxed) {
            return;
        }
        for latencies in [&self.interval, &self.total] {
            if let Ok(mut latencies) = latencies.lock() {
                pick(&mut latencies).saturating_record(micros.clamp(1, LATENCY_MAX_MICROS));
            }
        }
    }
}

fn payloads(workload: &Workload) -> Vec<Vec<u8>> {
    let pool = if workload.use_randomized_payloads {
        workload.randomized_payload_pool_size.max(1)
    } else {
        1
    };
    let random_bytes = (workload.message_size as f64 * workload.random_bytes_ratio) as usize;
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..pool)
        .map(|_| {
            (0..workload.message_size)
                .map(|i| {
                    if workload.use_randomized_payloads && i < random_bytes {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        b"abcdefghijklmnopqrstuvwxyz0123456789"[(seed % 36) as usize]
                    } else {
                        b'x'
                    }
                })
                .collect()
        })
        .collect()
}

fn producer(
    addr: &str,
    path: &str,
    workload: &Workload,
    rate: f64,
    recorder: &Recorder,
    pool: &[Vec<u8>],
    index: usize,
) -> Result<(), String> {
    let mut conn = Conn::open(addr)?;
    let started = Instant::now();
    let mut n = 0u64;
    while !recorder.stop_producers.load(Ordering::Relaxed) {
        let due = due_offset(n, rate).map(|offset| started + offset);
        if let Some(due) = due {
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        let sent = Instant::now();
        let due = due.unwrap_or(sent);
        let due_unix = unix_micros().saturating_sub(sent.duration_since(due).as_micros() as u64);
        let mut body = pool[(n as usize + index) % pool.len()].clone();
        let stamp = format!("{due_unix:020}|");
        let stamp_len = stamp.len().min(body.len());
        body[..stamp_len].copy_from_slice(&stamp.as_bytes()[..stamp_len]);
        let key = match workload.key_distributor {
            KeyDistributor::NoKey => None,
            KeyDistributor::KeyRoundRobin => Some(format!("k{}", n % 1000)),
            KeyDistributor::RandomNano => Some(format!("{}", unix_micros() * 1000 + n % 1000)),
        };
        let header = key.as_deref().map(|k| ("Narad-Key", k));
        match conn.call("POST", path, header, &body) {
            Ok((202, _)) => {
                recorder.published.fetch_add(1, Ordering::Relaxed);
                recorder.record(|l| &mut l.publish, due.elapsed().as_micros() as u64);
                recorder.record(
                    |l| &mut l.publish_delay,
                    sent.duration_since(due).as_micros() as u64,
                );
            }
            Ok(_) => {
                recorder.publish_errors.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                recorder.publish_errors.fetch_add(1, Ordering::Relaxed);
                conn = Conn::open(addr)?;
            }
        }
        n += 1;
    }
    Ok(())
}

fn consumer(addr: &str, topic: &str, recorder: &Recorder) -> Result<(), String> {
    let mut conn = Conn::open(addr)?;
    let consume = format!("/v1/topics/{topic}/consume");
    let ack = format!("/v1/topics/{topic}/ack/batch");
    let request = json!({"max_messages": CONSUME_BATCH, "wait_ms": CONSUME_WAIT_MS}).to_string();
    while !recorder.stop_consumers.load(Ordering::Relaxed) {
        if recorder.consumers_paused.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let (status, body) = conn.call("POST", &consume, None, request.as_bytes())?;
        if status != 200 {
            continue;
        }
        let now = unix_micros();
        let answer: Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        let messages = answer["messages"].as_array().cloned().unwrap_or_default();
        let mut receipts = Vec::with_capacity(messages.len());
        for message in &messages {
            let due: u64 = message["value"]
                .as_str()
                .and_then(|v| v.get(..20))
                .and_then(|v| v.parse().ok())
                .unwrap_or(now);
            recorder.record(|l| &mut l.end_to_end, now.saturating_sub(due));
            if let Some(receipt) = message["receipt"].as_str() {
                receipts.push(receipt.to_string());
            }
        }
        recorder
            .consumed
            .fetch_add(messages.len() as u64, Ordering::Relaxed);
        if !receipts.is_empty() {
            let body = json!({ "receipts": receipts }).to_string();
            conn.call("POST", &ack, None, body.as_bytes())?;
        }
    }
    Ok(())
}

fn percentiles(prefix: &str, histogram: &Histogram<u64>, out: &mut serde_json::Map<String, Value>) {
    let ms = |micros: u64| micros as f64 / 1000.0;
    out.insert(format!("{prefix}Avg"), json!(histogram.mean() / 1000.0));
    for (name, q) in [
        ("50pct", 0.5),
        ("75pct", 0.75),
        ("95pct", 0.95),
        ("99pct", 0.99),
        ("999pct", 0.999),
        ("9999pct", 0.9999),
    ] {
        out.insert(
            format!("{prefix}{name}"),
            json!(ms(histogram.value_at_quantile(q))),
        );
    }
    out.insert(format!("{prefix}Max"), json!(ms(histogram.max())));
}

/// Runs `workload` against the node at `addr` and returns the OMB-style
/// result document.
pub fn run(addr: &str, workload: &Workload) -> Result<Value, String> {
    if workload.subscriptions_per_topic != 1 {
        return Err(format!(
            "subscriptionsPerTopic {}: a Narad topic is one queue (one subscription); fan-out children come later",
            workload.subscriptions_per_topic
        ));
    }
    let run_id = unix_micros() % 1_000_000_000;
    let topics: Vec<String> = (0..workload.topics)
        .map(|i| format!("omb-{run_id}-{i}"))
        .collect();
    let mut admin = Conn::open(addr)?;
    for topic in &topics {
        let body = json!({"partitions": workload.partitions_per_topic}).to_string();
        let (status, answer) =
            admin.call("PUT", &format!("/v1/topics/{topic}"), None, body.as_bytes())?;
        if status != 201 {
            return Err(format!(
                "creating {topic}: {status} {}",
                String::from_utf8_lossy(&answer)
            ));
        }
    }
    let recorder = Arc::new(Recorder {
        interval: Mutex::new(Latencies::new()?),
        total: Mutex::new(Latencies::new()?),
        recording: AtomicBool::new(false),
        published: AtomicU64::new(0),
        publish_errors: AtomicU64::new(0),
        consumed: AtomicU64::new(0),
        stop_producers: AtomicBool::new(false),
        stop_consumers: AtomicBool::new(false),
        consumers_paused: AtomicBool::new(workload.consumer_backlog_size_gb > 0.0),
    });
    let pool = Arc::new(payloads(workload));
    let per_producer = workload.producer_rate as f64 / f64::from(workload.producers());
    let mut threads = Vec::new();
    for (t, topic) in topics.iter().enumerate() {
        for p in 0..workload.producers_per_topic {
            let (addr, path, workload, recorder, pool) = (
                addr.to_string(),
                format!("/v1/topics/{topic}/messages"),
                workload.clone(),
                recorder.clone(),
                pool.clone(),
            );
            let index = t * workload.producers_per_topic as usize + p as usize;
            threads.push(std::thread::spawn(move || {
                producer(
                    &addr,
                    &path,
                    &workload,
                    per_producer,
                    &recorder,
                    &pool,
                    index,
                )
            }));
        }
        for _ in 0..workload.consumer_per_subscription {
            let (addr, topic, recorder) = (addr.to_string(), topic.clone(), recorder.clone());
            threads.push(std::thread::spawn(move || {
                consumer(&addr, &topic, &recorder)
            }));
        }
    }

    std::thread::sleep(workload.warmup_duration());
    recorder.recording.store(true, Ordering::SeqCst);
    let backlog_bytes = (workload.consumer_backlog_size_gb * 1e9) as u64;
    let mut intervals: Vec<Value> = Vec::new();
    let started = Instant::now();
    let (mut last_published, mut last_consumed) = (
        recorder.published.load(Ordering::Relaxed),
        recorder.consumed.load(Ordering::Relaxed),
    );
    while started.elapsed() < workload.test_duration() {
        std::thread::sleep(INTERVAL.min(workload.test_duration()));
        let (published, consumed) = (
            recorder.published.load(Ordering::Relaxed),
            recorder.consumed.load(Ordering::Relaxed),
        );
        let backlog = published.saturating_sub(consumed);
        if recorder.consumers_paused.load(Ordering::Relaxed)
            && backlog * workload.message_size as u64 >= backlog_bytes
        {
            recorder.consumers_paused.store(false, Ordering::SeqCst);
            eprintln!("backlog of {backlog} messages built: consumers start draining");
        }
        let seconds = INTERVAL.min(workload.test_duration()).as_secs_f64();
        let fresh = Latencies::new()?;
        let latencies = recorder
            .interval
            .lock()
            .map(|mut l| std::mem::replace(&mut *l, fresh))
            .map_err(|e| e.to_string())?;
        let mut entry = serde_json::Map::new();
        entry.insert(
            "publishRate".into(),
            json!((published - last_published) as f64 / seconds),
        );
        entry.insert(
            "consumeRate".into(),
            json!((consumed - last_consumed) as f64 / seconds),
        );
        entry.insert("backlog".into(), json!(backlog));
        percentiles("publishLatency", &latencies.publish, &mut entry);
        percentiles("publishDelayLatency", &latencies.publish_delay, &mut entry);
        percentiles("endToEndLatency", &latencies.end_to_end, &mut entry);
        eprintln!(
            "pub {:>8.0} msg/s  cons {:>8.0} msg/s  backlog {:>7}  pub p99 {:>7.2} ms  e2e p99 {:>7.2} ms",
            entry["publishRate"].as_f64().unwrap_or(0.0),
            entry["consumeRate"].as_f64().unwrap_or(0.0),
            backlog,
            latencies.publish.value_at_quantile(0.99) as f64 / 1000.0,
            latencies.end_to_end.value_at_quantile(0.99) as f64 / 1000.0,
        );
        intervals.push(Value::Object(entry));
        last_published = published;
        last_consumed = consumed;
    }
    recorder.stop_producers.store(true, Ordering::SeqCst);
    recorder.consumers_paused.store(false, Ordering::SeqCst);
    let drain_started = Instant::now();
    while recorder.consumed.load(Ordering::Relaxed) < recorder.published.load(Ordering::Relaxed)
        && drain_started.elapsed() < DRAIN_DEADLINE
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    recorder.stop_consumers.store(true, Ordering::SeqCst);
    for thread in threads {
        match thread.join() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => eprintln!("a client stopped: {error}"),
            Err(_) => eprintln!("a client thread panicked"),
        }
    }

    let total = recorder.total.lock().map_err(|e| e.to_string())?;
    let series =
        |key: &str| -> Value { Value::Array(intervals.iter().map(|i| i[key].clone()).collect()) };
    let mut result = serde_json::Map::new();
    result.insert("workload".into(), json!(workload.name));
    result.insert("driver".into(), json!("narad"));
    result.insert("messageSize".into(), json!(workload.message_size));
    result.insert("topics".into(), json!(workload.topics));
    result.insert("partitions".into(), json!(workload.partitions_per_topic));
    result.insert(
        "producersPerTopic".into(),
        json!(workload.producers_per_topic),
    );
    result.insert(
        "consumersPerTopic".into(),
        json!(workload.consumer_per_subscription),
    );
    for key in [
        "publishRate",
        "consumeRate",
        "backlog",
        "publishLatencyAvg",
        "publishLatency50pct",
        "publishLatency75pct",
        "publishLatency95pct",
        "publishLatency99pct",
        "publishLatency999pct",
        "publishLatency9999pct",
        "publishLatencyMax",
        "publishDelayLatencyAvg",
        "publishDelayLatency50pct",
        "publishDelayLatency99pct",
        "endToEndLatencyAvg",
        "endToEndLatency50pct",
        "endToEndLatency75pct",
        "endToEndLatency95pct",
        "endToEndLatency99pct",
        "endToEndLatency999pct",
        "endToEndLatency9999pct",
        "endToEndLatencyMax",
    ] {
        result.insert(key.into(), series(key));
    }
    result.insert(
        "publishErrorRate".into(),
        json!(
            recorder.publish_errors.load(Ordering::Relaxed) as f64
                / workload.test_duration().as_secs_f64().max(1.0)
        ),
    );
    let mut aggregated = serde_json::Map::new();
    percentiles("aggregatedPublishLatency", &total.publish, &mut aggregated);
    percentiles(
        "aggregatedPublishDelayLatency",
        &total.publish_delay,
        &mut aggregated,
    );
    percentiles(
        "aggregatedEndToEndLatency",
        &total.end_to_end,
        &mut aggregated,
    );
    result.extend(aggregated);
    Ok(Value::Object(result))
}

/// The terminal summary of a result.
pub fn summary(result: &Value) -> String {
    let mean = |key: &str| {
        let values: Vec<f64> = result[key]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default();
        values.iter().sum::<f64>() / values.len().max(1) as f64
    };
    format!(
        "{}: publish {:.0} msg/s, consume {:.0} msg/s\n  publish latency ms: p50 {} p99 {} p99.9 {} max {}\n  end-to-end ms:      p50 {} p99 {} p99.9 {} max {}",
        result["workload"].as_str().unwrap_or("?"),
        mean("publishRate"),
        mean("consumeRate"),
        result["aggregatedPublishLatency50pct"],
        result["aggregatedPublishLatency99pct"],
        result["aggregatedPublishLatency999pct"],
        result["aggregatedPublishLatencyMax"],
        result["aggregatedEndToEndLatency50pct"],
        result["aggregatedEndToEndLatency99pct"],
        result["aggregatedEndToEndLatency999pct"],
        result["aggregatedEndToEndLatencyMax"],
    )
}
