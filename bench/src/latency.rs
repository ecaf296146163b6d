//! `narad-bench latency`: produce → consumable latency at a light, fixed
//! rate. One thread produces messages carrying their send time; another
//! long-polls, acks, and records now − send time when each arrives.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use narad_net::client::Client;

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

pub fn run(
    server: &str,
    topic: &str,
    rate_per_second: u64,
    messages: u64,
) -> Result<Histogram<u64>, String> {
    let producer = Client::new(server).map_err(|e| e.to_string())?;
    let consumer = Client::new(server).map_err(|e| e.to_string())?;
    let interval = Duration::from_micros(1_000_000 / rate_per_second.max(1));
    let topic_owned = topic.to_string();
    let receiver = std::thread::spawn(move || -> Result<Histogram<u64>, String> {
        let mut histogram = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
        let deadline = Instant::now()
            + Duration::from_secs(60)
            + interval * u32::try_from(messages).unwrap_or(u32::MAX);
        while histogram.len() < messages && Instant::now() < deadline {
            for message in consumer
                .consume(&topic_owned, 100, 1000)
                .map_err(|e| e.to_string())?
            {
                let sent: u64 = message["value"]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                histogram.record(now_micros().saturating_sub(sent)).ok();
                if let Some(receipt) = message["receipt"].as_str() {
                    consumer
                        .ack(&topic_owned, receipt)
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        Ok(histogram)
    });
    let started = Instant::now();
    for i in 0..messages {
        let due = started + interval * u32::try_from(i).unwrap_or(u32::MAX);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        producer
            .produce(topic, None, now_micros().to_string().as_bytes())
            .map_err(|e| e.to_string())?;
    }
    receiver
        .join()
        .map_err(|_| "the consumer thread panicked".to_string())?
}
