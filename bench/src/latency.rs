//! `narad-bench latency`: produce → consumable latency at a fixed rate.
//! Producer threads (each a share of the rate) send messages carrying their
//! send time; one thread long-polls, acks, and records now − send time when
//! each arrives. The consumer may read another topic than the producers
//! write (a child of theirs): then it measures produce → consumable in the
//! child, the copy included.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use narad_client::blocking::Client;
use narad_client::ConsumeRequest;

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// What one run measures.
pub struct Plan<'a> {
    pub server: &'a str,
    /// Produced to.
    pub topic: &'a str,
    /// Consumed from (the produced topic, or a child of it).
    pub consume_topic: &'a str,
    /// Where `consume_topic` is (`server`, unless it is a remote child's
    /// topic on another cluster).
    pub consume_server: &'a str,
    pub rate_per_second: u64,
    pub messages: u64,
    pub producers: u64,
}

pub fn run(plan: &Plan<'_>) -> Result<Histogram<u64>, String> {
    let consumer = Client::builder(plan.consume_server)
        .build()
        .map_err(|e| e.to_string())?;
    let producers = plan.producers.max(1);
    // Each producer sends every `producers`-th message on the shared schedule.
    let interval = Duration::from_micros(1_000_000 / plan.rate_per_second.max(1));
    let consume_topic = plan.consume_topic.to_string();
    let messages = plan.messages;
    let receiver = std::thread::spawn(move || -> Result<Histogram<u64>, String> {
        let mut histogram = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
        let request = ConsumeRequest {
            max_messages: Some(100),
            wait_ms: Some(1000),
            ..Default::default()
        };
        let deadline = Instant::now()
            + Duration::from_secs(60)
            + interval * u32::try_from(messages).unwrap_or(u32::MAX);
        // Each consume carries the last one's acks: one request a turn.
        let mut acking: Vec<String> = Vec::new();
        while histogram.len() < messages && Instant::now() < deadline {
            let receipts: Vec<&str> = acking.iter().map(String::as_str).collect();
            let got = consumer
                .consume_acking(&consume_topic, &receipts, &request)
                .map_err(|e| e.to_string())?
                .deliveries;
            let arrived = now_micros();
            for message in &got {
                let sent: u64 = std::str::from_utf8(&message.value)
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                histogram.record(arrived.saturating_sub(sent)).ok();
            }
            acking = got.into_iter().map(|m| m.receipt).collect();
        }
        Ok(histogram)
    });
    let started = Instant::now();
    let senders: Vec<_> = (0..producers)
        .map(|p| {
            let (server, topic) = (plan.server.to_string(), plan.topic.to_string());
            std::thread::spawn(move || -> Result<(), String> {
                let producer = Client::builder(&server)
                    .build()
                    .map_err(|e| e.to_string())?;
                for i in (p..messages).step_by(usize::try_from(producers).unwrap_or(1)) {
                    let due = started + interval * u32::try_from(i).unwrap_or(u32::MAX);
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    producer
                        .produce(&topic, None, now_micros().to_string())
                        .map_err(|e| e.to_string())?;
                }
                Ok(())
            })
        })
        .collect();
    for sender in senders {
        sender
            .join()
            .map_err(|_| "a producer thread panicked".to_string())??;
    }
    receiver
        .join()
        .map_err(|_| "the consumer thread panicked".to_string())?
}
