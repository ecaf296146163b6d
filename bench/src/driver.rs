//! The seam every system under test sits behind: Narad, and (with the
//! `peers` feature) the peer brokers the compare command runs the same
//! workload on. One rate controller and one set of histograms drive them
//! all; a driver only knows how to talk to its system.
//!
//! Every driver answers a producer only once its system confirmed the
//! message durable (Narad: 202 after the WAL's fdatasync; the peers: as
//! configured by `bench/peers.sh`, read back by [`Driver::durability`]).

use std::time::Duration;

use narad_client::blocking::{Client, Connection};
use narad_client::{encode_segment, Error as ClientError, Response};
use serde_json::{json, Value};

/// A system under test.
pub trait Driver: Send + Sync {
    /// Its short name in tables and charts.
    fn name(&self) -> &'static str;
    /// How it makes a message durable before confirming it, as read back
    /// from the running server.
    fn durability(&self) -> Result<String, String>;
    /// Creates a topic (stream, queue) for one run.
    fn create_topic(&self, topic: &str, partitions: u32) -> Result<(), String>;
    /// Deletes a run's topic (best effort).
    fn delete_topic(&self, topic: &str) -> Result<(), String>;
    fn producer(&self, topic: &str) -> Result<Box<dyn Producer>, String>;
    fn consumer(&self, topic: &str) -> Result<Box<dyn Consumer>, String>;
}

/// One producer: one connection, one message in flight.
pub trait Producer: Send {
    /// Sends one message; returns once the system confirmed it durable.
    fn send(&mut self, key: Option<&str>, payload: &[u8]) -> Result<(), String>;
}

/// One consumer of a topic's single subscription (work queue).
pub trait Consumer: Send {
    /// Up to `max` messages, waiting up to `wait` for the first; their
    /// payloads. They stay leased until [`Consumer::ack`].
    fn receive(&mut self, max: usize, wait: Duration) -> Result<Vec<Vec<u8>>, String>;
    /// Acks everything received since the last ack (a driver may carry
    /// the acks on its next receive, as Narad's consume can).
    fn ack(&mut self) -> Result<(), String>;
}

/// The values of a consume answer's messages; their receipts go to `receipts`.
pub fn take_messages(answer: &serde_json::Value, receipts: &mut Vec<String>) -> Vec<Vec<u8>> {
    let messages = answer["messages"].as_array().map_or(&[][..], Vec::as_slice);
    let mut payloads = Vec::with_capacity(messages.len());
    for message in messages {
        if let Some(receipt) = message["receipt"].as_str() {
            receipts.push(receipt.to_string());
        }
        payloads.push(
            message["value"]
                .as_str()
                .unwrap_or_default()
                .as_bytes()
                .to_vec(),
        );
    }
    payloads
}

fn text(error: ClientError) -> String {
    error.to_string()
}

/// Narad over its HTTP API through `narad-client`: one kept-alive
/// [`Connection`] per producer and consumer, each with a client (and so a
/// runtime) of its own on its thread; single-message produce, long-poll
/// consume carrying the last turn's acks. `narad-idempotent` is the same
/// with a fresh `Narad-Idempotency-Key` on every message (what a retrying
/// producer sends), to measure what keys cost.
pub struct NaradDriver {
    server: String,
    client: Client,
    idempotency_keys: bool,
    /// Producers made so far: each producer's keys start with its number.
    producers: std::sync::atomic::AtomicU64,
}

impl NaradDriver {
    pub fn new(server: &str) -> Result<Self, String> {
        Ok(Self {
            server: server.to_string(),
            client: Client::builder(server).build().map_err(text)?,
            idempotency_keys: false,
            producers: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The driver whose producers give every message an idempotency key.
    pub fn with_idempotency_keys(server: &str) -> Result<Self, String> {
        Ok(Self {
            idempotency_keys: true,
            ..Self::new(server)?
        })
    }

    fn admin(&self, method: &str, path: &str, body: &Value) -> Result<Value, String> {
        let body = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        self.client
            .request(method, path, &[], body, Duration::ZERO)
            .map(|answer| answer.body)
            .map_err(text)
    }
}

impl Driver for NaradDriver {
    fn name(&self) -> &'static str {
        if self.idempotency_keys {
            "narad-idempotent"
        } else {
            "narad"
        }
    }

    fn durability(&self) -> Result<String, String> {
        // Not a setting: a 202 always follows the ingress WAL's fdatasync.
        let cluster = self.admin("GET", "/v1/cluster", &Value::Null)?;
        let nodes = cluster["nodes"].as_array().map_or(1, Vec::len);
        Ok(format!(
            "202 after the ingress WAL's group-commit fdatasync (always; {nodes} node(s))"
        ))
    }

    fn create_topic(&self, topic: &str, partitions: u32) -> Result<(), String> {
        self.client
            .put_topic(topic, &json!({ "partitions": partitions }))
            .map(|_| ())
            .map_err(text)
    }

    fn delete_topic(&self, topic: &str) -> Result<(), String> {
        let path = format!("/v1/topics/{}", encode_segment(topic));
        self.admin("DELETE", &path, &Value::Null).map(|_| ())
    }

    fn producer(&self, topic: &str) -> Result<Box<dyn Producer>, String> {
        let number = self
            .producers
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Box::new(NaradProducer {
            link: Link::open(&self.server)?,
            path: format!("/v1/topics/{}/messages", encode_segment(topic)),
            keys: self.idempotency_keys.then(|| (format!("p{number}-"), 0)),
        }))
    }

    fn consumer(&self, topic: &str) -> Result<Box<dyn Consumer>, String> {
        let topic = encode_segment(topic);
        Ok(Box::new(NaradConsumer {
            link: Link::open(&self.server)?,
            consume: format!("/v1/topics/{topic}/consume"),
            receipts: Vec::new(),
            acking: Vec::new(),
        }))
    }
}

/// A kept-alive connection, opened again after a transport error, on a
/// client (and runtime) of its own.
struct Link {
    client: Client,
    conn: Connection,
}

impl Link {
    fn open(server: &str) -> Result<Self, String> {
        let client = Client::builder(server).build().map_err(text)?;
        let conn = client.connect().map_err(text)?;
        Ok(Self { client, conn })
    }

    fn call(
        &mut self,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        wait: Duration,
    ) -> Result<Response, String> {
        match self.conn.request("POST", path, headers, body, wait) {
            Ok(answer) => Ok(answer),
            Err(error @ ClientError::Transport(_)) => {
                self.conn = self.client.connect().map_err(text)?;
                Err(text(error))
            }
            Err(error) => Err(text(error)),
        }
    }
}

struct NaradProducer {
    link: Link,
    path: String,
    /// With idempotency keys: this producer's prefix and the next number.
    keys: Option<(String, u64)>,
}

impl Producer for NaradProducer {
    fn send(&mut self, key: Option<&str>, payload: &[u8]) -> Result<(), String> {
        let idempotency_key = self.keys.as_mut().map(|(prefix, next)| {
            *next += 1;
            format!("{prefix}{next}")
        });
        let mut headers: Vec<(&str, &str)> = Vec::with_capacity(2);
        if let Some(key) = key {
            headers.push(("Narad-Key", key));
        }
        if let Some(idempotency_key) = &idempotency_key {
            headers.push(("Narad-Idempotency-Key", idempotency_key));
        }
        self.link
            .call(&self.path, &headers, payload, Duration::ZERO)
            .map(|_| ())
    }
}

struct NaradConsumer {
    link: Link,
    consume: String,
    /// Received and not yet handed to [`Consumer::ack`].
    receipts: Vec<String>,
    /// Acked by the caller: sent with the next consume, which settles them
    /// before it leases more (one request a turn, not two).
    acking: Vec<String>,
}

impl Consumer for NaradConsumer {
    fn receive(&mut self, max: usize, wait: Duration) -> Result<Vec<Vec<u8>>, String> {
        let mut request = json!({
            "max_messages": max,
            "wait_ms": u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        });
        if !self.acking.is_empty() {
            request["ack"] = json!(std::mem::take(&mut self.acking));
        }
        let answer = self
            .link
            .call(&self.consume, &[], request.to_string().as_bytes(), wait)?;
        Ok(take_messages(&answer.body, &mut self.receipts))
    }

    fn ack(&mut self) -> Result<(), String> {
        self.acking.append(&mut self.receipts);
        Ok(())
    }
}
