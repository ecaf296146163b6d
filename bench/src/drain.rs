//! `narad-bench drain`: consume + ack throughput. Fills a topic with batch
//! produces, then consumer threads long-poll up to 100 messages at a time,
//! each consume acking the batch before it, until the topic is empty. With `fill` off it only drains
//! what the topic already holds (a backlog left by an earlier run, read from
//! disk after a restart).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use narad_client::blocking::Client;
use narad_client::{ConsumeRequest, Settle};
use serde_json::json;

const BATCH: usize = 100;

pub struct DrainResult {
    pub messages: u64,
    pub elapsed: Duration,
}

pub fn run(
    server: &str,
    topic: &str,
    messages: u64,
    consumers: usize,
    message_bytes: usize,
    fill: bool,
) -> Result<DrainResult, String> {
    let client = Client::builder(server).build().map_err(|e| e.to_string())?;
    let value = "x".repeat(message_bytes);
    let body =
        json!({ "messages": (0..BATCH).map(|_| json!({ "value": value })).collect::<Vec<_>>() })
            .to_string();
    let mut produced = if fill { 0 } else { messages };
    while produced < messages {
        client
            .request(
                "POST",
                &format!("/v1/topics/{topic}/messages/batch"),
                &[],
                body.clone(),
                Duration::ZERO,
            )
            .map_err(|e| e.to_string())?;
        produced += BATCH as u64;
    }
    let consumed = AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|scope| -> Result<(), String> {
        let workers: Vec<_> = (0..consumers)
            .map(|_| {
                scope.spawn(|| -> Result<(), String> {
                    let client = Client::builder(server).build().map_err(|e| e.to_string())?;
                    let request = ConsumeRequest {
                        max_messages: Some(BATCH as u32),
                        wait_ms: Some(200),
                        ..Default::default()
                    };
                    // Each consume carries the last one's acks; the last
                    // batch is acked on its own.
                    let mut acking: Vec<String> = Vec::new();
                    while consumed.load(Ordering::Relaxed) < produced {
                        let receipts: Vec<&str> = acking.iter().map(String::as_str).collect();
                        let got = client
                            .consume_acking(topic, &receipts, &request)
                            .map_err(|e| e.to_string())?
                            .deliveries;
                        acking.clear();
                        if got.is_empty() {
                            // A backlog not filled here may hold fewer than
                            // --messages: the first empty answer ends it.
                            if !fill {
                                return Ok(());
                            }
                            continue;
                        }
                        consumed.fetch_add(got.len() as u64, Ordering::Relaxed);
                        acking = got.into_iter().map(|m| m.receipt).collect();
                    }
                    if !acking.is_empty() {
                        let receipts: Vec<&str> = acking.iter().map(String::as_str).collect();
                        client
                            .settle_batch(topic, &receipts, Settle::Ack)
                            .map_err(|e| e.to_string())?;
                    }
                    Ok(())
                })
            })
            .collect();
        for worker in workers {
            worker
                .join()
                .map_err(|_| "a consumer thread panicked".to_string())??;
        }
        Ok(())
    })?;
    Ok(DrainResult {
        messages: consumed.load(Ordering::Relaxed),
        elapsed: started.elapsed(),
    })
}
