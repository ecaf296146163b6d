//! Runs an OpenMessaging Benchmark workload on one system (a [`Driver`]) and
//! returns an OMB-style result document.
//!
//! Producers run open loop at `producerRate` (each message has a due time;
//! publish latency counts from it, so a slow answer also delays what queues
//! behind it, as coordinated-omission correction requires), or closed loop
//! at rate 0. Every payload starts with its due time in microseconds and
//! its producer and sequence number, so a consumer records end-to-end
//! latency (due → consumed) and confirm → consumed (the producer's 202 or
//! publish confirm → consumed; for Narad, 202 → consumable plus the
//! consumer's poll). Rates, backlog and latency percentiles are kept per
//! 10-second interval and for the whole run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use serde_json::{json, Value};

use crate::driver::Driver;
use crate::workload::{due_offset, KeyDistributor, Workload};

/// OMB reports rates and percentiles per interval of this length.
const INTERVAL: Duration = Duration::from_secs(10);
const CONSUME_BATCH: usize = 100;
const CONSUME_WAIT: Duration = Duration::from_millis(500);
/// Confirm times kept per producer, by sequence number, for the consumers'
/// confirm → consumed figure (a message consumed later than this many sends
/// after it is left out of that figure).
const CONFIRM_RING: usize = 1 << 15;
/// The payload's stamp: due time (µs), producer, sequence, separated by `|`.
const STAMP_LEN: usize = 20 + 1 + 5 + 1 + 12 + 1;
/// Latencies above an hour are recorded as an hour.
const LATENCY_MAX_MICROS: u64 = 3_600_000_000;
/// Longest a run waits for consumers to catch up after producers stop (a
/// system whose consumers fell behind is not drained to the end: its
/// backlog is already in the result).
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(20);

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Latencies of one interval or of the whole run, in microseconds.
struct Latencies {
    publish: Histogram<u64>,
    publish_delay: Histogram<u64>,
    end_to_end: Histogram<u64>,
    confirm_to_consume: Histogram<u64>,
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
            confirm_to_consume: make()?,
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
    /// Per producer: (sequence, confirm time µs) by sequence modulo the ring.
    confirms: Vec<Box<[(AtomicU64, AtomicU64)]>>,
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

fn stamp(due_unix: u64, producer: usize, seq: u64) -> String {
    format!(
        "{due_unix:020}|{:05}|{:012}|",
        producer % 100_000,
        seq % 1_000_000_000_000
    )
}

/// The stamp's fields: due time, producer, sequence.
fn read_stamp(payload: &[u8]) -> Option<(u64, usize, u64)> {
    let text = std::str::from_utf8(payload.get(..STAMP_LEN)?).ok()?;
    let mut fields = text.split('|');
    let due = fields.next()?.parse().ok()?;
    let producer = fields.next()?.parse().ok()?;
    let seq = fields.next()?.parse().ok()?;
    Some((due, producer, seq))
}

fn producer(
    driver: &dyn Driver,
    topic: &str,
    workload: &Workload,
    rate: f64,
    recorder: &Recorder,
    pool: &[Vec<u8>],
    index: usize,
) -> Result<(), String> {
    let mut producer = driver.producer(topic)?;
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
        let stamp = stamp(due_unix, index, n);
        let stamp_len = stamp.len().min(body.len());
        body[..stamp_len].copy_from_slice(&stamp.as_bytes()[..stamp_len]);
        let key = match workload.key_distributor {
            KeyDistributor::NoKey => None,
            KeyDistributor::KeyRoundRobin => Some(format!("k{}", n % 1000)),
            KeyDistributor::RandomNano => Some(format!("{}", unix_micros() * 1000 + n % 1000)),
        };
        match producer.send(key.as_deref(), &body) {
            Ok(()) => {
                if let Some((seq, at)) = recorder
                    .confirms
                    .get(index)
                    .map(|ring| &ring[n as usize % CONFIRM_RING])
                {
                    at.store(unix_micros(), Ordering::Relaxed);
                    seq.store(n, Ordering::Release);
                }
                recorder.published.fetch_add(1, Ordering::Relaxed);
                recorder.record(|l| &mut l.publish, due.elapsed().as_micros() as u64);
                recorder.record(
                    |l| &mut l.publish_delay,
                    sent.duration_since(due).as_micros() as u64,
                );
            }
            Err(_) => {
                recorder.publish_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        n += 1;
    }
    Ok(())
}

fn consumer(driver: &dyn Driver, topic: &str, recorder: &Recorder) -> Result<(), String> {
    let mut consumer = driver.consumer(topic)?;
    while !recorder.stop_consumers.load(Ordering::Relaxed) {
        if recorder.consumers_paused.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let Ok(payloads) = consumer.receive(CONSUME_BATCH, CONSUME_WAIT) else {
            continue;
        };
        let now = unix_micros();
        for payload in &payloads {
            let Some((due, producer, seq)) = read_stamp(payload) else {
                continue;
            };
            recorder.record(|l| &mut l.end_to_end, now.saturating_sub(due));
            if let Some((stored, at)) = recorder
                .confirms
                .get(producer)
                .map(|ring| &ring[seq as usize % CONFIRM_RING])
            {
                if stored.load(Ordering::Acquire) == seq {
                    let confirmed = at.load(Ordering::Relaxed);
                    recorder.record(|l| &mut l.confirm_to_consume, now.saturating_sub(confirmed));
                }
            }
        }
        recorder
            .consumed
            .fetch_add(payloads.len() as u64, Ordering::Relaxed);
        consumer.ack()?;
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

/// Runs `workload` on `driver`'s system and returns the OMB-style result
/// document.
pub fn run(driver: &Arc<dyn Driver>, workload: &Workload) -> Result<Value, String> {
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
    let durability = driver.durability()?;
    for topic in &topics {
        driver
            .create_topic(topic, workload.partitions_per_topic)
            .map_err(|e| format!("{}: creating {topic}: {e}", driver.name()))?;
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
        confirms: (0..workload.producers())
            .map(|_| {
                (0..CONFIRM_RING)
                    .map(|_| (AtomicU64::new(u64::MAX), AtomicU64::new(0)))
                    .collect()
            })
            .collect(),
    });
    let pool = Arc::new(payloads(workload));
    let per_producer = workload.producer_rate as f64 / f64::from(workload.producers());
    let mut threads = Vec::new();
    for (t, topic) in topics.iter().enumerate() {
        for p in 0..workload.producers_per_topic {
            let (driver, topic, workload, recorder, pool) = (
                driver.clone(),
                topic.clone(),
                workload.clone(),
                recorder.clone(),
                pool.clone(),
            );
            let index = t * workload.producers_per_topic as usize + p as usize;
            threads.push(std::thread::spawn(move || {
                producer(
                    driver.as_ref(),
                    &topic,
                    &workload,
                    per_producer,
                    &recorder,
                    &pool,
                    index,
                )
            }));
        }
        for _ in 0..workload.consumer_per_subscription {
            let (driver, topic, recorder) = (driver.clone(), topic.clone(), recorder.clone());
            threads.push(std::thread::spawn(move || {
                consumer(driver.as_ref(), &topic, &recorder)
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
        percentiles(
            "confirmToConsumeLatency",
            &latencies.confirm_to_consume,
            &mut entry,
        );
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
    result.insert("driver".into(), json!(driver.name()));
    result.insert("durability".into(), json!(durability));
    result.insert("producerRate".into(), json!(workload.producer_rate));
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
        "confirmToConsumeLatency50pct",
        "confirmToConsumeLatency99pct",
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
    percentiles(
        "aggregatedConfirmToConsumeLatency",
        &total.confirm_to_consume,
        &mut aggregated,
    );
    result.extend(aggregated);
    result.insert(
        "aggregatedPublishLatencyQuantiles".into(),
        quantiles(&total.publish),
    );
    result.insert(
        "aggregatedEndToEndLatencyQuantiles".into(),
        quantiles(&total.end_to_end),
    );
    for topic in &topics {
        if let Err(error) = driver.delete_topic(topic) {
            eprintln!("{}: deleting {topic}: {error}", driver.name());
        }
    }
    Ok(Value::Object(result))
}

/// Percentile → latency (ms) for the latency curves, as OMB's
/// `aggregated*Quantiles` maps.
fn quantiles(histogram: &Histogram<u64>) -> Value {
    let mut out = serde_json::Map::new();
    for percentile in CURVE_PERCENTILES {
        out.insert(
            format!("{percentile}"),
            json!(histogram.value_at_quantile(percentile / 100.0) as f64 / 1000.0),
        );
    }
    Value::Object(out)
}

/// The points of a latency curve.
pub const CURVE_PERCENTILES: [f64; 12] = [
    50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 99.995, 99.999, 100.0,
];

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
