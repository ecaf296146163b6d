//! Narad through a stock HTTP client: `reqwest` on a Tokio runtime, the way
//! a service with no client of ours calls the HTTP API. Each producer and
//! consumer has its own `reqwest::Client`, whose pool keeps one keep-alive
//! connection, driven by its own single-threaded runtime on the producer's
//! thread (as the harness runs a thread per producer; a shared runtime
//! entered from 64 threads adds a thread hop to every request); bodies go
//! through `serde_json`. Selected with `--driver narad-reqwest` (or
//! `--peers narad-reqwest` in `compare`, to run it beside the others).

use std::time::Duration;

use narad_client::encode_segment;
use serde_json::{json, Value};
use tokio::runtime::Runtime;

use crate::driver::{take_messages, Consumer, Driver, Producer};

/// The longest a request may take: a long poll's wait and then some.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

pub struct ReqwestDriver {
    base: String,
    admin: Runtime,
    admin_client: reqwest::Client,
}

fn runtime() -> Result<Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))
}

fn client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .tcp_nodelay(true)
        .timeout(REQUEST_TIMEOUT)
        .build()
        .map_err(|e| format!("reqwest client: {e}"))
}

/// Sends `request`, and answers its JSON body if the status is one of
/// `expected` (an empty body reads as `null`).
async fn call(request: reqwest::RequestBuilder, expected: &[u16]) -> Result<Value, String> {
    let response = request.send().await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response.bytes().await.map_err(|e| e.to_string())?;
    if !expected.contains(&status) {
        return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body)));
    }
    if body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&body).map_err(|e| format!("answer is not JSON: {e}"))
}

impl ReqwestDriver {
    pub fn new(server: &str) -> Result<Self, String> {
        Ok(Self {
            base: server.trim_end_matches('/').to_string(),
            admin: runtime()?,
            admin_client: client()?,
        })
    }

    fn topic_url(&self, topic: &str) -> String {
        format!("{}/v1/topics/{}", self.base, encode_segment(topic))
    }
}

impl Driver for ReqwestDriver {
    fn name(&self) -> &'static str {
        "narad-reqwest"
    }

    fn durability(&self) -> Result<String, String> {
        let request = self.admin_client.get(format!("{}/v1/cluster", self.base));
        let cluster = self.admin.block_on(call(request, &[200]))?;
        let nodes = cluster["nodes"].as_array().map_or(1, Vec::len);
        Ok(format!(
            "202 after the ingress WAL's group-commit fdatasync (always; {nodes} node(s)); client: reqwest"
        ))
    }

    fn create_topic(&self, topic: &str, partitions: u32) -> Result<(), String> {
        let request = self
            .admin_client
            .put(self.topic_url(topic))
            .header("content-type", "application/json")
            .body(json!({ "partitions": partitions }).to_string());
        self.admin.block_on(call(request, &[201, 200])).map(|_| ())
    }

    fn delete_topic(&self, topic: &str) -> Result<(), String> {
        let request = self.admin_client.delete(self.topic_url(topic));
        self.admin.block_on(call(request, &[204])).map(|_| ())
    }

    fn producer(&self, topic: &str) -> Result<Box<dyn Producer>, String> {
        Ok(Box::new(ReqwestProducer {
            runtime: runtime()?,
            client: client()?,
            url: format!("{}/messages", self.topic_url(topic)),
        }))
    }

    fn consumer(&self, topic: &str) -> Result<Box<dyn Consumer>, String> {
        Ok(Box::new(ReqwestConsumer {
            runtime: runtime()?,
            client: client()?,
            consume: format!("{}/consume", self.topic_url(topic)),
            receipts: Vec::new(),
            acking: Vec::new(),
        }))
    }
}

struct ReqwestProducer {
    runtime: Runtime,
    client: reqwest::Client,
    url: String,
}

impl Producer for ReqwestProducer {
    fn send(&mut self, key: Option<&str>, payload: &[u8]) -> Result<(), String> {
        let mut request = self.client.post(&self.url).body(payload.to_vec());
        if let Some(key) = key {
            request = request.header("Narad-Key", key);
        }
        self.runtime.block_on(call(request, &[202])).map(|_| ())
    }
}

struct ReqwestConsumer {
    runtime: Runtime,
    client: reqwest::Client,
    consume: String,
    receipts: Vec<String>,
    /// Acked by the caller, sent with the next consume.
    acking: Vec<String>,
}

impl Consumer for ReqwestConsumer {
    fn receive(&mut self, max: usize, wait: Duration) -> Result<Vec<Vec<u8>>, String> {
        let mut body = json!({
            "max_messages": max,
            "wait_ms": u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        });
        if !self.acking.is_empty() {
            body["ack"] = json!(std::mem::take(&mut self.acking));
        }
        let request = self
            .client
            .post(&self.consume)
            .header("content-type", "application/json")
            .body(body.to_string());
        let answer = self.runtime.block_on(call(request, &[200]))?;
        Ok(take_messages(&answer, &mut self.receipts))
    }

    fn ack(&mut self) -> Result<(), String> {
        self.acking.append(&mut self.receipts);
        Ok(())
    }
}
