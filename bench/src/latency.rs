//! `narad-bench latency`: produce → consumable latency at a fixed rate.
//! Producer threads (each a share of the rate) send messages carrying their
//! send time; one thread long-polls, acks, and records now − send time when
//! each arrives (every delivery, so a message delivered again counts
//! twice). At the end it acks the last deliveries too, and prints the
//! slowest delivery (when it was accepted and when consumed) and any acks
//! that did not land. The consumer may read another topic than the producers
//! write (a child of theirs): then it measures produce → consumable in the
//! child, the copy included.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use narad_client::blocking::Client;
use narad_client::{ConsumeRequest, Settle};

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
        // The slowest delivery, to say where its time went.
        let mut slowest: Option<(u64, String)> = None;
        // Acks that did not land, by error.
        let mut ack_failures: std::collections::BTreeMap<String, u64> = Default::default();
        while histogram.len() < messages && Instant::now() < deadline {
            let receipts: Vec<&str> = acking.iter().map(String::as_str).collect();
            let consumed = consumer
                .consume_acking(&consume_topic, &receipts, &request)
                .map_err(|e| e.to_string())?;
            for settled in &consumed.acks {
                if let Err(error) = &settled.result {
                    *ack_failures.entry(error.to_string()).or_insert(0) += 1;
                }
            }
            let got = consumed.deliveries;
            let arrived = now_micros();
            for message in &got {
                let sent: u64 = std::str::from_utf8(&message.value)
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let took = arrived.saturating_sub(sent);
                histogram.record(took).ok();
                if slowest.as_ref().is_none_or(|(most, _)| took > *most) {
                    let accepted_after_ms =
                        i128::from(message.produced_at_ms) - i128::from(sent / 1000);
                    let what = format!(
                        "{} (partition {} offset {}, delivery {}): accepted {accepted_after_ms} ms \
                         after it was sent, consumed {} ms after that",
                        message.id,
                        message.partition,
                        message.offset,
                        message.delivery_count,
                        i128::from(arrived / 1000) - i128::from(message.produced_at_ms)
                    );
                    slowest = Some((took, what));
                }
            }
            acking = got.into_iter().map(|m| m.receipt).collect();
        }
        // The last deliveries' acks have no next consume to ride on: left
        // leased, they would come back in a later run (after their lease,
        // or at once if their partition moves) as very late deliveries.
        if !acking.is_empty() {
            let receipts: Vec<&str> = acking.iter().map(String::as_str).collect();
            let settled = consumer
                .settle_batch(&consume_topic, &receipts, Settle::Ack)
                .map_err(|e| e.to_string())?;
            for settled in settled {
                if let Err(error) = settled.result {
                    *ack_failures.entry(error.to_string()).or_insert(0) += 1;
                }
            }
        }
        if let Some((took, what)) = slowest {
            eprintln!("slowest delivery: {took} us, {what}");
        }
        for (error, count) in &ack_failures {
            eprintln!("{count} acks did not land: {error}");
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
