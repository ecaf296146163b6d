//! # narad-client
//!
//! An async client of Narad's HTTP API, on reqwest (rustls, a keep-alive
//! connection pool, HTTP/1.1 or HTTP/2 over TLS).
//!
//! - [`Client`]: produce one message or a batch, consume with a lease, ack,
//!   nack (with a delay), extend, and the batch forms of the three.
//! - [`Producer`]: many callers' messages sent together as batch requests,
//!   a batch leaving when the one before it is answered, each caller
//!   answered with its own id or error.
//! - [`Consumer`]: a loop that consumes, runs a handler on each message,
//!   extends the lease while the handler runs, and acks or nacks by the
//!   handler's result.
//! - Retries follow the API's status-code table: what it marks retryable
//!   (408, 429, 500, 502, 503, and no answer at all) is sent again with
//!   exponential backoff and full jitter; any other error is returned at
//!   once. Every produced message carries an idempotency key (one the
//!   caller gives, else a fresh random one), so the client's own retries
//!   of a produce store each message once.
//!
//! ```no_run
//! # async fn run() -> Result<(), narad_client::Error> {
//! use narad_client::{Client, Outgoing};
//!
//! let client = Client::builder("http://127.0.0.1:8080").build()?;
//! let id = client.produce("orders", Some("customer-42"), "order 1").await?;
//! let batch = [Outgoing::new("order 2"), Outgoing::new("order 3").with_key("k")];
//! let ids = client.produce_batch("orders", &batch).await?;
//! for delivery in client.consume("orders", &Default::default()).await? {
//!     client.ack("orders", &delivery.receipt).await?;
//! }
//! # let _ = (id, ids);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use bytes::Bytes;
use narad_net::client::code_for_status;
pub use narad_net::client::{encode_segment, RetryPolicy, REQUEST_TIMEOUT};
pub use narad_net::tls::ClientTlsFiles;
use narad_net::types::{parse_consume_binary, ConsumedMessage, MESSAGES_MEDIA_TYPE};
pub use narad_net::{ApiError, ErrorCode};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub mod blocking;
mod connection;
mod consumer;
mod producer;
pub use consumer::{Consumer, ConsumerOptions, Outcome};
pub use producer::{Producer, ProducerOptions};

/// What can go wrong with a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The node answered with an API error (after any retries).
    Api {
        /// The answer's HTTP status.
        status: u16,
        /// Its error code and message.
        error: ApiError,
    },
    /// No answer: refused, reset or timed out (after any retries).
    Transport(String),
    /// The TLS handshake failed (a certificate the other side does not
    /// trust, a missing client certificate): not retried.
    Tls(String),
    /// The client could not be made: a bad URL, unreadable TLS files.
    Config(String),
    /// An answer that is not what the API promises.
    BadResponse(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Api { status, error } => {
                write!(f, "{status} {}: {}", error.code.as_str(), error.message)
            }
            Self::Transport(detail) => write!(f, "no answer from {detail}"),
            Self::Tls(detail) => write!(f, "TLS with the server failed: {detail}"),
            Self::Config(detail) => write!(f, "client settings: {detail}"),
            Self::BadResponse(detail) => write!(f, "unexpected answer: {detail}"),
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// Whether the API's table says to try again.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Api { error, .. } => error.code.retry(),
            Self::Transport(_) => true,
            Self::Tls(_) | Self::Config(_) | Self::BadResponse(_) => false,
        }
    }

    /// The API error code, for an API error.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Self::Api { error, .. } => Some(error.code),
            _ => None,
        }
    }
}

/// Builds a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    url: String,
    authorization: Option<String>,
    tls: ClientTlsFiles,
    timeout: Duration,
    retry: RetryPolicy,
    idempotency_keys: bool,
}

impl ClientBuilder {
    /// Whether messages the caller gave no idempotency key get a fresh
    /// one (on by default). Off is for nodes of a release that does not
    /// take idempotency keys (it refuses them); a retried produce may then
    /// store a message twice.
    pub fn idempotency_keys(mut self, on: bool) -> Self {
        self.idempotency_keys = on;
        self
    }

    /// Sends `Authorization: Bearer TOKEN` with every request.
    pub fn token(mut self, token: &str) -> Self {
        self.authorization = Some(format!("Bearer {token}"));
        self
    }

    /// Sends HTTP Basic credentials with every request.
    pub fn password(mut self, user: &str, password: &str) -> Self {
        let pair = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        self.authorization = Some(format!("Basic {pair}"));
        self
    }

    /// For `https://`: the CA that signed the node's certificate (else the
    /// system's CA bundle), and a client certificate if the node asks for one.
    pub fn tls(mut self, files: ClientTlsFiles) -> Self {
        self.tls = files;
        self
    }

    /// How long one attempt may take (a long poll's `wait_ms` comes on top).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How calls are retried.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The client.
    pub fn build(self) -> Result<Client, Error> {
        let base = self.url.trim_end_matches('/').to_string();
        let https = base.starts_with("https://");
        let rest = base
            .strip_prefix("http://")
            .or_else(|| base.strip_prefix("https://"))
            .filter(|rest| !rest.is_empty() && !rest.contains('/'))
            .ok_or_else(|| {
                Error::Config(format!(
                    "server URL {:?} must look like http://HOST:PORT or https://HOST:PORT",
                    self.url
                ))
            })?;
        let _ = rest;
        let mut http = reqwest::Client::builder()
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .tcp_nodelay(true);
        let tls = if https {
            let config = narad_net::tls::client_config(&self.tls).map_err(Error::Config)?;
            http = http.use_preconfigured_tls((*config).clone());
            Some(config)
        } else {
            None
        };
        let http = http.build().map_err(|e| Error::Config(e.to_string()))?;
        Ok(Client {
            http,
            tls,
            base,
            authorization: self.authorization,
            timeout: self.timeout,
            retry: self.retry,
            idempotency_keys: self.idempotency_keys,
        })
    }
}

/// How long an idle pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// A client of one node (or of a load balancer in front of several). Cheap
/// to clone: clones share the connection pool.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    /// The TLS settings of an `https://` client, for
    /// [`blocking::Connection`]s.
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    base: String,
    authorization: Option<String>,
    timeout: Duration,
    retry: RetryPolicy,
    idempotency_keys: bool,
}

/// A successful answer of [`Client::request`]: its status (`200`, `201`,
/// `202`, `204`) and JSON body (`null` when empty).
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// The HTTP status.
    pub status: u16,
    /// The JSON body, `null` when the answer had none.
    pub body: Value,
}

/// A message to produce in a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// Its key: messages with one key go to one partition, in order.
    pub key: Option<String>,
    /// Its bytes (sent as text when they are UTF-8, else as base64).
    pub value: Bytes,
    /// What names it for retries (1 to 256 bytes of printable ASCII): a
    /// produce with a key the node accepted within the topic's window is
    /// not stored again. `None`: the client makes a fresh one.
    pub idempotency_key: Option<String>,
}

impl Outgoing {
    /// A message with this value and no key.
    pub fn new(value: impl Into<Bytes>) -> Self {
        Self {
            key: None,
            value: value.into(),
            idempotency_key: None,
        }
    }

    /// The same message with an idempotency key of the caller's (an order
    /// number, a request id), so that sending it again, also from another
    /// process, stores it once within the topic's window.
    pub fn with_idempotency_key(mut self, key: &str) -> Self {
        self.idempotency_key = Some(key.to_string());
        self
    }

    /// The same message with a key (one key, one partition, in order).
    pub fn with_key(mut self, key: &str) -> Self {
        self.key = Some(key.to_string());
        self
    }
}

/// What a consume asks for; `Default` is one message, no waiting, the
/// topic's lease length, any partition.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ConsumeRequest {
    /// The most messages to take (1-1,000; the API's default is 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_messages: Option<u32>,
    /// How long to wait for the first message (a long poll; at most
    /// 20,000 ms); none is no waiting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// How long the lease lasts; none is the topic's
    /// `visibility_timeout_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub visibility_timeout_ms: Option<u64>,
    /// Take only from this partition; none is any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
}

/// A delivered message, leased until `lease_expires_at_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The message's id, as the produce answered it.
    pub id: String,
    /// The topic it was consumed from.
    pub topic: String,
    /// Its partition.
    pub partition: u32,
    /// Its offset in the partition.
    pub offset: u64,
    /// Its key, if it was produced with one.
    pub key: Option<String>,
    /// Its bytes.
    pub value: Bytes,
    /// Settles this lease: ack, nack or extend.
    pub receipt: String,
    /// 1 on the first delivery (counted since the partition's owner started).
    pub delivery_count: u32,
    /// When the node accepted it (Unix ms).
    pub produced_at_ms: u64,
    /// When this lease ends unless extended (Unix ms).
    pub lease_expires_at_ms: u64,
}

/// A message as a browse shows it: no lease, no receipt; how it stands at
/// its owner when the browse looked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Browsed {
    /// The message's id, as the produce answered it.
    pub id: String,
    /// Its partition.
    pub partition: u32,
    /// Its offset in the partition.
    pub offset: u64,
    /// Its key, if it was produced with one.
    pub key: Option<String>,
    /// Its bytes.
    pub value: Bytes,
    /// When the node accepted it (Unix ms).
    pub produced_at_ms: u64,
    /// `available`, `leased` or `acked`.
    pub state: String,
    /// Deliveries since the partition's owner last started.
    pub delivery_count: u32,
}

/// A page of one partition ([`Client::browse`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrowsedPage {
    /// The page's messages, in offset order.
    pub messages: Vec<Browsed>,
    /// Where the next page starts.
    pub next_offset: u64,
    /// The partition's oldest unacked offset.
    pub frontier: u64,
    /// The offset the partition's next message gets.
    pub high_watermark: u64,
}

/// What a search looks for ([`Client::search`]): a message key equal to
/// `key`, and/or a key or value containing `contains` (bytes,
/// case-sensitive); at least one of the two.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SearchQuery {
    /// The key a message must have.
    pub key: Option<String>,
    /// Text its key or value must contain.
    pub contains: Option<String>,
    /// At most this many matches (1 to 1,000; `None`: the node's 20).
    pub limit: Option<u32>,
    /// Where an earlier search stopped ([`SearchPage::cursor`]).
    pub cursor: Option<String>,
}

/// Matches of one search call ([`Client::search`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchPage {
    /// The matches found in this stretch.
    pub messages: Vec<Browsed>,
    /// Where to go on; `None` once every retained message was searched.
    pub cursor: Option<String>,
}

/// One interval of a topic's rates ([`Client::rates`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct RatePoint {
    /// When the interval began (Unix ms).
    pub at_ms: u64,
    /// Messages produced within it.
    pub produced: u64,
    /// Messages acked within it.
    pub acked: u64,
    /// Messages moved to the dead-letter topic within it.
    pub dead_lettered: u64,
    /// Messages available at its end.
    pub available: u64,
    /// Messages leased at its end.
    pub in_flight: u64,
}

/// A topic's last 15 minutes, oldest first ([`Client::rates`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Rates {
    /// The length of each interval (5,000 ms).
    pub interval_ms: u64,
    /// One point per interval.
    pub points: Vec<RatePoint>,
}

/// A browsed message as the API writes it.
#[derive(Deserialize)]
struct WireBrowsed {
    id: String,
    partition: u32,
    offset: u64,
    key: Option<String>,
    value: Option<String>,
    value_base64: Option<String>,
    produced_at_ms: u64,
    state: String,
    delivery_count: u32,
}

/// A message's bytes from `value` or `value_base64`.
fn value_of(value: Option<String>, value_base64: Option<String>) -> Result<Bytes, Error> {
    match (value, value_base64) {
        (Some(text), None) => Ok(Bytes::from(text)),
        (None, Some(encoded)) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map(Bytes::from)
            .map_err(|e| Error::BadResponse(format!("value_base64: {e}"))),
        _ => Err(Error::BadResponse(
            "a message with neither or both of value and value_base64".into(),
        )),
    }
}

impl TryFrom<WireBrowsed> for Browsed {
    type Error = Error;

    fn try_from(wire: WireBrowsed) -> Result<Self, Error> {
        Ok(Self {
            value: value_of(wire.value, wire.value_base64)?,
            id: wire.id,
            partition: wire.partition,
            offset: wire.offset,
            key: wire.key,
            produced_at_ms: wire.produced_at_ms,
            state: wire.state,
            delivery_count: wire.delivery_count,
        })
    }
}

/// A delivery as the API writes it.
#[derive(Deserialize)]
struct WireDelivery {
    id: String,
    topic: String,
    partition: u32,
    offset: u64,
    key: Option<String>,
    value: Option<String>,
    value_base64: Option<String>,
    receipt: String,
    delivery_count: u32,
    produced_at_ms: u64,
    lease_expires_at_ms: u64,
}

impl Delivery {
    fn from_consumed(topic: &str, message: ConsumedMessage) -> Self {
        Self {
            id: format!("{:032x}", message.id),
            topic: topic.to_string(),
            partition: message.partition,
            offset: message.offset,
            key: message.key.map(|k| {
                String::from_utf8(k)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
            }),
            value: message.value,
            receipt: message.receipt,
            delivery_count: message.delivery_count,
            produced_at_ms: message.produced_at_ms,
            lease_expires_at_ms: message.lease_expires_at_ms,
        }
    }
}

impl TryFrom<WireDelivery> for Delivery {
    type Error = Error;

    fn try_from(wire: WireDelivery) -> Result<Self, Error> {
        let value = value_of(wire.value, wire.value_base64)?;
        Ok(Self {
            id: wire.id,
            topic: wire.topic,
            partition: wire.partition,
            offset: wire.offset,
            key: wire.key,
            value,
            receipt: wire.receipt,
            delivery_count: wire.delivery_count,
            produced_at_ms: wire.produced_at_ms,
            lease_expires_at_ms: wire.lease_expires_at_ms,
        })
    }
}

/// One receipt's result in a batch settle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// The receipt, as given.
    pub receipt: String,
    /// What the single call would have answered: `Ok` or its error.
    pub result: Result<(), ApiError>,
}

/// What a consume that carried acks answered.
#[derive(Debug, Clone)]
pub struct Consumed {
    /// The messages leased, as [`Client::consume`] returns them.
    pub deliveries: Vec<Delivery>,
    /// One result per receipt acked, in the order given.
    pub acks: Vec<Settled>,
}

/// A produced message: its id (the first copy's, for a duplicate) and
/// whether the node found it a duplicate of a message it accepted before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Produced {
    /// The message's id.
    pub id: String,
    /// The node had accepted a message with its idempotency key before.
    pub duplicate: bool,
}

/// A produced batch: an id per message, and the indexes of duplicates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducedBatch {
    /// `ids[i]` belongs to `messages[i]`.
    pub ids: Vec<String>,
    /// Indexes of the messages the node found to be duplicates.
    pub duplicates: Vec<usize>,
}

/// A fresh idempotency key: a random number drawn once per process and a
/// count, 32 hex characters, never the same twice in a process and
/// unlikely to meet another process's.
fn fresh_idempotency_key() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        hasher.write_u128(now);
        hasher.finish()
    });
    format!(
        "{prefix:016x}{:016x}",
        COUNT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The three ways to settle a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Done for good.
    Ack,
    /// Deliver again after the delay (or dead-letter it on its last allowed
    /// delivery).
    Nack {
        /// How long until it is delivered again.
        delay: Duration,
    },
    /// The lease ends this long from now.
    Extend {
        /// The lease's new length, from now.
        visibility: Duration,
    },
}

impl Settle {
    fn route(self) -> &'static str {
        match self {
            Self::Ack => "ack",
            Self::Nack { .. } => "nack",
            Self::Extend { .. } => "extend",
        }
    }

    fn fields(self, body: &mut serde_json::Map<String, Value>) {
        match self {
            Self::Ack => {}
            Self::Nack { delay } => {
                body.insert("delay_ms".into(), json!(millis(delay)));
            }
            Self::Extend { visibility } => {
                body.insert("visibility_timeout_ms".into(), json!(millis(visibility)));
            }
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl Client {
    /// A builder for a client of `url` (`http://HOST:PORT` or
    /// `https://HOST:PORT`).
    pub fn builder(url: &str) -> ClientBuilder {
        ClientBuilder {
            url: url.to_string(),
            authorization: None,
            tls: ClientTlsFiles::default(),
            timeout: REQUEST_TIMEOUT,
            retry: RetryPolicy::default(),
            idempotency_keys: true,
        }
    }

    /// `PUT /v1/topics/{topic}`: creates the topic, or changes the
    /// settings `settings` names (see the API for them).
    pub async fn put_topic(&self, topic: &str, settings: &Value) -> Result<Value, Error> {
        let path = format!("/v1/topics/{}", encode_segment(topic));
        self.call("PUT", &path, &[], body_of(settings), Duration::ZERO)
            .await
    }

    /// Produces one message; its id once the node has it durably (`202`).
    /// A key the `Narad-Key` header cannot carry intact (a control
    /// character, or a space at either end, which HTTP drops) goes in the
    /// JSON body of a batch of one instead.
    pub async fn produce(
        &self,
        topic: &str,
        key: Option<&str>,
        value: impl Into<Bytes>,
    ) -> Result<String, Error> {
        let message = Outgoing {
            key: key.map(str::to_string),
            value: value.into(),
            idempotency_key: None,
        };
        Ok(self.produce_message(topic, &message).await?.id)
    }

    /// Produces one message with its key and idempotency key; its id (the
    /// first copy's for a duplicate) and whether the node found it a
    /// duplicate.
    pub async fn produce_message(
        &self,
        topic: &str,
        message: &Outgoing,
    ) -> Result<Produced, Error> {
        let idempotency_key = self.idempotency_key_of(message);
        let fits = message.key.as_deref().is_none_or(fits_header)
            && idempotency_key.as_deref().is_none_or(fits_header);
        if !fits {
            let message = Outgoing {
                idempotency_key,
                ..message.clone()
            };
            let answer = self.send_batch(topic, &[message]).await?;
            let id = answer
                .ids
                .into_iter()
                .next()
                .ok_or_else(|| Error::BadResponse("a produce answer without an id".into()))?;
            return Ok(Produced {
                id,
                duplicate: answer.duplicates.contains(&0),
            });
        }
        let path = format!("/v1/topics/{}/messages", encode_segment(topic));
        let mut headers: Vec<(&str, &str)> = Vec::new();
        if let Some(key) = &message.key {
            headers.push(("Narad-Key", key));
        }
        if let Some(key) = &idempotency_key {
            headers.push(("Narad-Idempotency-Key", key));
        }
        let answer = self
            .call(
                "POST",
                &path,
                &headers,
                message.value.clone(),
                Duration::ZERO,
            )
            .await?;
        let id = answer["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| Error::BadResponse("a produce answer without an id".into()))?;
        Ok(Produced {
            id,
            duplicate: answer["duplicate"] == json!(true),
        })
    }

    /// The idempotency key a message goes with: the caller's, else a fresh
    /// one (unless the client was built without them).
    fn idempotency_key_of(&self, message: &Outgoing) -> Option<String> {
        message
            .idempotency_key
            .clone()
            .or_else(|| self.idempotency_keys.then(fresh_idempotency_key))
    }

    /// Produces up to 1,000 messages with one request; their ids, in order.
    pub async fn produce_batch(
        &self,
        topic: &str,
        messages: &[Outgoing],
    ) -> Result<Vec<String>, Error> {
        Ok(self.send_batch(topic, messages).await?.ids)
    }

    /// Produces up to 1,000 messages with one request: their ids (a
    /// duplicate's is its first copy's) and which were duplicates.
    pub async fn produce_batch_detailed(
        &self,
        topic: &str,
        messages: &[Outgoing],
    ) -> Result<ProducedBatch, Error> {
        self.send_batch(topic, messages).await
    }

    async fn send_batch(&self, topic: &str, messages: &[Outgoing]) -> Result<ProducedBatch, Error> {
        // The keys are made once: every retry of the request carries them.
        let items: Vec<Value> = messages
            .iter()
            .map(|m| {
                let mut item = serde_json::Map::new();
                if let Some(key) = &m.key {
                    item.insert("key".into(), json!(key));
                }
                if let Some(key) = self.idempotency_key_of(m) {
                    item.insert("idempotency_key".into(), json!(key));
                }
                match std::str::from_utf8(&m.value) {
                    Ok(text) => item.insert("value".into(), json!(text)),
                    Err(_) => item.insert(
                        "value_base64".into(),
                        json!(base64::engine::general_purpose::STANDARD.encode(&m.value)),
                    ),
                };
                Value::Object(item)
            })
            .collect();
        let path = format!("/v1/topics/{}/messages/batch", encode_segment(topic));
        let answer = self
            .call(
                "POST",
                &path,
                &[],
                body_of(&json!({ "messages": items })),
                Duration::ZERO,
            )
            .await?;
        let ids: Vec<String> = answer["ids"]
            .as_array()
            .map(|ids| {
                ids.iter()
                    .filter_map(|id| id.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        if ids.len() != messages.len() {
            return Err(Error::BadResponse(format!(
                "{} ids for {} messages",
                ids.len(),
                messages.len()
            )));
        }
        let duplicates = answer["duplicates"]
            .as_array()
            .map(|indexes| {
                indexes
                    .iter()
                    .filter_map(|i| i.as_u64().and_then(|i| usize::try_from(i).ok()))
                    .collect()
            })
            .unwrap_or_default();
        Ok(ProducedBatch { ids, duplicates })
    }

    /// Consumes (and leases) messages; empty when none came within
    /// `wait_ms`.
    pub async fn consume(
        &self,
        topic: &str,
        request: &ConsumeRequest,
    ) -> Result<Vec<Delivery>, Error> {
        self.consume_acking(topic, &[], request)
            .await
            .map(|consumed| consumed.deliveries)
    }

    /// Acks up to 1,000 receipts and then consumes, in one request: what a
    /// consumer loop does each turn, with half the round trips of a
    /// consume and a batch ack. The acks land before new messages are
    /// leased; if the answer is an error they may have landed anyway (an
    /// ack sent again then answers `lease_gone`).
    pub async fn consume_acking(
        &self,
        topic: &str,
        acks: &[&str],
        request: &ConsumeRequest,
    ) -> Result<Consumed, Error> {
        let path = format!("/v1/topics/{}/consume", encode_segment(topic));
        let mut body = serde_json::to_value(request).map_err(|e| Error::Config(e.to_string()))?;
        if !acks.is_empty() {
            body["ack"] = json!(acks);
        }
        let wait = Duration::from_millis(request.wait_ms.unwrap_or(0));
        // The binary answer: nothing to escape on the node, nothing to
        // parse here (a node that answers JSON anyway is read as JSON).
        let accept = [("Accept", MESSAGES_MEDIA_TYPE)];
        self.retrying("POST", &path, &accept, body_of(&body), wait, |raw| {
            if raw.binary && (200..300).contains(&raw.status) {
                let answer = parse_consume_binary(&raw.body)
                    .map_err(|e| Error::BadResponse(format!("messages: {e}")))?;
                let outcomes = answer.acks.unwrap_or_default();
                let settled = acks
                    .iter()
                    .zip(&outcomes)
                    .map(|(receipt, outcome)| Settled {
                        receipt: receipt.to_string(),
                        result: settled_result(outcome.status, outcome.error.as_ref()),
                    })
                    .collect();
                return Ok(Consumed {
                    deliveries: answer
                        .messages
                        .into_iter()
                        .map(|m| Delivery::from_consumed(topic, m))
                        .collect(),
                    acks: checked_acks(acks.len(), settled)?,
                });
            }
            let mut answer = answer(raw.status, &raw.body)?.body;
            let messages: Vec<WireDelivery> = serde_json::from_value(answer["messages"].take())
                .map_err(|e| Error::BadResponse(format!("messages: {e}")))?;
            Ok(Consumed {
                deliveries: messages
                    .into_iter()
                    .map(Delivery::try_from)
                    .collect::<Result<_, _>>()?,
                acks: checked_acks(acks.len(), settled_from_json(&answer["acks"]))?,
            })
        })
        .await
    }

    /// Reads up to `limit` messages (1 to 1,000) of one partition from
    /// `offset` on (`None`: its frontier) at the partition's owner, each
    /// with its state and delivery count. Nothing is leased, acked or
    /// counted.
    pub async fn browse(
        &self,
        topic: &str,
        partition: u32,
        offset: Option<u64>,
        limit: u32,
    ) -> Result<BrowsedPage, Error> {
        let mut path = format!(
            "/v1/topics/{}/partitions/{partition}/messages?limit={limit}",
            encode_segment(topic)
        );
        if let Some(offset) = offset {
            path.push_str(&format!("&offset={offset}"));
        }
        let mut answer = self
            .call("GET", &path, &[], Bytes::new(), Duration::ZERO)
            .await?;
        let messages: Vec<WireBrowsed> = serde_json::from_value(answer["messages"].take())
            .map_err(|e| Error::BadResponse(format!("messages: {e}")))?;
        let number = |name: &str| {
            answer[name]
                .as_u64()
                .ok_or_else(|| Error::BadResponse(format!("a browse answer without {name}")))
        };
        Ok(BrowsedPage {
            next_offset: number("next_offset")?,
            frontier: number("frontier")?,
            high_watermark: number("high_watermark")?,
            messages: messages
                .into_iter()
                .map(Browsed::try_from)
                .collect::<Result<_, _>>()?,
        })
    }

    /// Searches every partition of `topic` at the owners, within the
    /// node's bounds per call: the matches, and a cursor to go on with.
    /// Nothing is leased, acked or counted.
    pub async fn search(&self, topic: &str, query: &SearchQuery) -> Result<SearchPage, Error> {
        let mut pairs = form_urlencoded::Serializer::new(String::new());
        if let Some(key) = &query.key {
            pairs.append_pair("key", key);
        }
        if let Some(contains) = &query.contains {
            pairs.append_pair("contains", contains);
        }
        if let Some(limit) = query.limit {
            pairs.append_pair("limit", &limit.to_string());
        }
        if let Some(cursor) = &query.cursor {
            pairs.append_pair("cursor", cursor);
        }
        let path = format!(
            "/v1/topics/{}/messages?{}",
            encode_segment(topic),
            pairs.finish()
        );
        let mut answer = self
            .call("GET", &path, &[], Bytes::new(), Duration::ZERO)
            .await?;
        let messages: Vec<WireBrowsed> = serde_json::from_value(answer["messages"].take())
            .map_err(|e| Error::BadResponse(format!("messages: {e}")))?;
        Ok(SearchPage {
            cursor: answer["cursor"].as_str().map(str::to_string),
            messages: messages
                .into_iter()
                .map(Browsed::try_from)
                .collect::<Result<_, _>>()?,
        })
    }

    /// The last 15 minutes of `topic`: produced, acked and dead-lettered
    /// counts per interval, and the backlog at each interval's end.
    pub async fn rates(&self, topic: &str) -> Result<Rates, Error> {
        let path = format!("/v1/topics/{}/rates", encode_segment(topic));
        let answer = self
            .call("GET", &path, &[], Bytes::new(), Duration::ZERO)
            .await?;
        serde_json::from_value(answer).map_err(|e| Error::BadResponse(format!("rates: {e}")))
    }

    /// Acks a delivery: done for good.
    pub async fn ack(&self, topic: &str, receipt: &str) -> Result<(), Error> {
        self.settle(topic, receipt, Settle::Ack).await.map(|_| ())
    }

    /// Nacks a delivery: delivered again after `delay`.
    pub async fn nack(&self, topic: &str, receipt: &str, delay: Duration) -> Result<(), Error> {
        self.settle(topic, receipt, Settle::Nack { delay })
            .await
            .map(|_| ())
    }

    /// Extends a lease to `visibility` from now; when it ends then (Unix ms).
    pub async fn extend(
        &self,
        topic: &str,
        receipt: &str,
        visibility: Duration,
    ) -> Result<u64, Error> {
        let answer = self
            .settle(topic, receipt, Settle::Extend { visibility })
            .await?;
        answer["lease_expires_at_ms"]
            .as_u64()
            .ok_or_else(|| Error::BadResponse("an extend answer without its lease's end".into()))
    }

    async fn settle(&self, topic: &str, receipt: &str, how: Settle) -> Result<Value, Error> {
        let mut body = serde_json::Map::new();
        body.insert("receipt".into(), json!(receipt));
        how.fields(&mut body);
        let path = format!("/v1/topics/{}/{}", encode_segment(topic), how.route());
        self.call(
            "POST",
            &path,
            &[],
            body_of(&Value::Object(body)),
            Duration::ZERO,
        )
        .await
    }

    /// Settles up to 1,000 receipts with one request; one result per
    /// receipt, in order.
    pub async fn settle_batch(
        &self,
        topic: &str,
        receipts: &[&str],
        how: Settle,
    ) -> Result<Vec<Settled>, Error> {
        let mut body = serde_json::Map::new();
        body.insert("receipts".into(), json!(receipts));
        how.fields(&mut body);
        let path = format!("/v1/topics/{}/{}/batch", encode_segment(topic), how.route());
        let answer = self
            .call(
                "POST",
                &path,
                &[],
                body_of(&Value::Object(body)),
                Duration::ZERO,
            )
            .await?;
        if !answer["results"].is_array() {
            return Err(Error::BadResponse("a batch answer without results".into()));
        }
        Ok(settled_from_json(&answer["results"]))
    }

    /// Any request of the API, for the routes the typed methods do not
    /// cover (topics' settings, users, schemas, the cluster): `path` from
    /// `/v1/...` with its segments percent-encoded ([`encode_segment`]),
    /// `body` JSON or empty. The retry rules apply as for every call. A
    /// request the node may hold (a long-polling consume) gives its wait as
    /// `wait`, which the timeout allows on top.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
        wait: Duration,
    ) -> Result<Response, Error> {
        self.retrying(method, path, headers, body.into(), wait, |raw| {
            answer(raw.status, &raw.body)
        })
        .await
    }

    /// Sends a request until it gets an answer `read` takes, or an error
    /// that is not worth retrying, or the attempts run out.
    async fn retrying<T>(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
        wait: Duration,
        read: impl Fn(RawAnswer) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = self
                .once(method, path, headers, body.clone(), wait)
                .await
                .and_then(&read);
            match result {
                Err(error) if error.is_retryable() && attempt < self.retry.attempts => {
                    let exponential = self
                        .retry
                        .backoff_base
                        .saturating_mul(1 << (attempt - 1).min(16));
                    let ceiling = millis(exponential.min(self.retry.backoff_max)).max(1);
                    tokio::time::sleep(Duration::from_millis(jitter_below(ceiling))).await;
                }
                result => return result,
            }
        }
    }

    /// [`Self::request`], for the answer's body alone.
    async fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
        wait: Duration,
    ) -> Result<Value, Error> {
        Ok(self.request(method, path, headers, body, wait).await?.body)
    }

    /// What a request that got no answer is: [`Error::Tls`] when the TLS
    /// handshake failed (retrying changes nothing), else
    /// [`Error::Transport`]; with the URL and every cause reqwest gives.
    fn failed(&self, error: &reqwest::Error) -> Error {
        let mut detail = self.base.clone();
        let mut tls = false;
        let mut note = |error: &(dyn std::error::Error + 'static)| {
            tls |= error.is::<rustls::Error>();
            let text = error.to_string();
            if !detail.contains(&text) {
                detail.push_str(": ");
                detail.push_str(&text);
            }
        };
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
        while let Some(current) = cause {
            note(current);
            // An I/O error hides the error it wraps (which may be another
            // I/O error) from `source()`.
            let mut inner = current;
            while let Some(wrapped) = inner
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
            {
                inner = wrapped;
                note(inner);
            }
            cause = current.source();
        }
        if tls {
            Error::Tls(detail)
        } else {
            Error::Transport(detail)
        }
    }

    /// The URL this client sends to (`http://HOST:PORT`).
    pub fn url(&self) -> &str {
        &self.base
    }

    async fn once(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
        wait: Duration,
    ) -> Result<RawAnswer, Error> {
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|e| Error::Config(format!("method {method:?}: {e}")))?;
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .timeout(self.timeout + wait)
            .header("Content-Type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(authorization) = &self.authorization {
            request = request.header("Authorization", authorization);
        }
        // A header value reqwest cannot send (a line break) fails here,
        // before anything is sent.
        let request = request
            .body(body)
            .build()
            .map_err(|e| Error::Config(e.to_string()))?;
        let response = self
            .http
            .execute(request)
            .await
            .map_err(|e| self.failed(&e))?;
        let status = response.status().as_u16();
        let binary = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(MESSAGES_MEDIA_TYPE.as_bytes()));
        let body = response.bytes().await.map_err(|e| self.failed(&e))?;
        Ok(RawAnswer {
            status,
            binary,
            body,
        })
    }
}

/// An answer as it came: status, whether its body is the binary consume
/// answer, and the body.
struct RawAnswer {
    status: u16,
    binary: bool,
    body: Bytes,
}

/// An answer's status and body as a call's result: 2xx with its JSON (or
/// empty) body, or the API error it carries.
fn answer(status: u16, bytes: &[u8]) -> Result<Response, Error> {
    let json: Value = if bytes.is_empty() {
        Value::Null
    } else {
        match serde_json::from_slice(bytes) {
            Ok(json) => json,
            Err(_) if !(200..300).contains(&status) => Value::Null,
            Err(e) => return Err(Error::BadResponse(format!("status {status}: {e}"))),
        }
    };
    if (200..300).contains(&status) {
        return Ok(Response { status, body: json });
    }
    Err(Error::Api {
        status,
        error: api_error(status, &json["error"]),
    })
}

/// The API error an error object stands for (its status decides the code
/// when the body lacks the API's shape: a proxy's answer, say).
/// The per-receipt results of a batch settle or a consume's acks.
fn settled_from_json(results: &Value) -> Vec<Settled> {
    results
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(|r| Settled {
            receipt: r["receipt"].as_str().unwrap_or_default().to_string(),
            result: settled_result(
                r["status"]
                    .as_u64()
                    .map_or(0, |s| u16::try_from(s).unwrap_or(0)),
                Some(&r["error"]),
            ),
        })
        .collect()
}

fn settled_result(status: u16, error: Option<&Value>) -> Result<(), ApiError> {
    if (200..300).contains(&status) {
        Ok(())
    } else {
        Err(api_error(status, error.unwrap_or(&Value::Null)))
    }
}

/// A consume's ack results: one per receipt sent, or the answer is wrong.
fn checked_acks(sent: usize, acks: Vec<Settled>) -> Result<Vec<Settled>, Error> {
    if acks.len() == sent {
        Ok(acks)
    } else {
        Err(Error::BadResponse(format!(
            "{} ack results for {sent} receipts",
            acks.len()
        )))
    }
}

fn api_error(status: u16, error: &Value) -> ApiError {
    let code = error["code"]
        .as_str()
        .and_then(ErrorCode::parse)
        .unwrap_or_else(|| code_for_status(status));
    let message = error["message"]
        .as_str()
        .map_or_else(|| format!("the server answered {status}"), str::to_string);
    ApiError::new(code, message)
}

fn body_of(value: &Value) -> Bytes {
    Bytes::from(value.to_string())
}

/// A number below `ceiling`, spread by the clock and a counter (full
/// jitter: retries of many clients do not fall in step).
fn jitter_below(ceiling: u64) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()));
    let mixed = (nanos ^ COUNTER.fetch_add(0x9E37_79B9, Ordering::Relaxed))
        .wrapping_mul(0x2545_F491_4F6C_DD1D);
    mixed % ceiling.max(1)
}

/// Runs `future` with a deadline; `None` when it passed first.
pub(crate) async fn within<T>(deadline: Duration, future: impl Future<Output = T>) -> Option<T> {
    tokio::time::timeout(deadline, future).await.ok()
}

/// Whether `key` reaches the node unchanged in the `Narad-Key` header: a
/// header value holds no control character, and HTTP trims spaces and tabs
/// at its ends.
fn fits_header(key: &str) -> bool {
    http::HeaderValue::from_str(key).is_ok() && key.trim_matches([' ', '\t']) == key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_url_is_refused_at_build() {
        for url in ["ftp://x:1", "127.0.0.1:8080", "http://", "http://h:1/v1"] {
            assert!(
                matches!(Client::builder(url).build(), Err(Error::Config(_))),
                "{url}"
            );
        }
        assert!(Client::builder("http://127.0.0.1:8080/").build().is_ok());
    }

    #[test]
    fn only_keys_a_header_carries_unchanged_go_in_the_header() {
        for key in ["customer-42", "ключ", "a b", "tab\tinside"] {
            assert!(fits_header(key), "{key:?}");
        }
        for key in [
            "bell\u{7}",
            "line\nbreak",
            " leading",
            "trailing\t",
            "del\u{7f}",
        ] {
            assert!(!fits_header(key), "{key:?}");
        }
    }

    #[test]
    fn api_errors_keep_their_code_and_a_bare_status_gets_one() {
        let known = api_error(
            410,
            &json!({"code": "lease_gone", "message": "the lease ended"}),
        );
        assert_eq!(known.code, ErrorCode::LeaseGone);
        assert_eq!(known.message, "the lease ended");
        let bare = api_error(503, &Value::Null);
        assert!(bare.code.retry());
        let error = Error::Api {
            status: 410,
            error: known,
        };
        assert!(!error.is_retryable());
        assert_eq!(error.code(), Some(ErrorCode::LeaseGone));
    }

    #[test]
    fn jitter_stays_below_its_ceiling() {
        assert!((0..1000).all(|_| jitter_below(7) < 7));
        assert_eq!(jitter_below(0), 0);
    }
}
