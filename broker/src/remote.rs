//! The data plane between nodes: what one node asks of another over QUIC
//! (commit a dispatcher batch, lease messages, settle receipts, partition
//! figures, "messages are available here"), encoded with rkyv.
//!
//! Outbound, [`Peers`] calls a node by id with a deadline per kind of call.
//! Inbound, the QUIC thread decodes a request and hands it to a shard of
//! this node through [`DataInbox`] (one unbounded channel per shard: the
//! QUIC thread never waits on a shard), and the shard's answer goes back on
//! a oneshot. Each call is a stream of its own, so a slow commit never holds
//! a consume or an ack behind it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_channel::mpsc::{UnboundedReceiver, UnboundedSender};
use futures_channel::oneshot;
use narad_net::peer::{PeerEndpoint, PeerError};
use narad_net::types::{ConsumedMessage, SettleAction};
use narad_net::value::JsonValue;
use narad_net::{ApiError, ErrorCode};
use narad_raft::node::BoxFuture;
use narad_raft::state::NodeId;
use rkyv::rancor::Error as RkyvError;

use crate::limits::{EMPTY_HINT_TTL_MS, INBOX_REQUESTS_MAX, UNREACHABLE_BACKOFF_MS};
use crate::mesh::shard_for;
use crate::owner::PartitionStats;

/// QUIC request kinds of the data plane (the metastore uses 1 to 15).
pub const KIND_COMMIT: u8 = 16;
pub const KIND_COLLECT: u8 = 17;
pub const KIND_SETTLE: u8 = 18;
pub const KIND_STATS: u8 = 19;
pub const KIND_AVAILABLE: u8 = 20;

pub fn is_data_kind(kind: u8) -> bool {
    (KIND_COMMIT..=KIND_AVAILABLE).contains(&kind)
}

// ------------------------------------------------------------ wire types

#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireMessage {
    pub id: u128,
    pub produced_at_ms: u64,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum WireAction {
    Ack,
    Nack { delay_ms: u64 },
    Extend { visibility_timeout_ms: u64 },
}

impl From<SettleAction> for WireAction {
    fn from(action: SettleAction) -> Self {
        match action {
            SettleAction::Ack => Self::Ack,
            SettleAction::Nack { delay_ms } => Self::Nack { delay_ms },
            SettleAction::Extend {
                visibility_timeout_ms,
            } => Self::Extend {
                visibility_timeout_ms,
            },
        }
    }
}

impl From<WireAction> for SettleAction {
    fn from(action: WireAction) -> Self {
        match action {
            WireAction::Ack => Self::Ack,
            WireAction::Nack { delay_ms } => Self::Nack { delay_ms },
            WireAction::Extend {
                visibility_timeout_ms,
            } => Self::Extend {
                visibility_timeout_ms,
            },
        }
    }
}

/// One request of the data plane. Topics are named with their incarnation,
/// so a request about an older topic of the same name is refused.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum DataRequest {
    Commit {
        topic: String,
        incarnation: u64,
        partition: u32,
        messages: Vec<WireMessage>,
    },
    Collect {
        topic: String,
        incarnation: u64,
        partitions: Vec<u32>,
        max: u32,
        visibility_ms: u64,
    },
    Settle {
        topic: String,
        incarnation: u64,
        receipts: Vec<String>,
        action: WireAction,
    },
    Stats {
        topic: String,
        incarnation: u64,
        partitions: Vec<u32>,
    },
    /// Messages became available on the sender's partitions.
    Available { from: NodeId },
}

impl DataRequest {
    fn kind(&self) -> u8 {
        match self {
            Self::Commit { .. } => KIND_COMMIT,
            Self::Collect { .. } => KIND_COLLECT,
            Self::Settle { .. } => KIND_SETTLE,
            Self::Stats { .. } => KIND_STATS,
            Self::Available { .. } => KIND_AVAILABLE,
        }
    }

    /// The topic and the first partition the request is about, which picks
    /// the shard that takes it in.
    fn home(&self) -> Option<(&str, u32)> {
        match self {
            Self::Commit {
                topic, partition, ..
            } => Some((topic, *partition)),
            Self::Collect {
                topic, partitions, ..
            }
            | Self::Stats {
                topic, partitions, ..
            } => Some((topic, partitions.first().copied().unwrap_or(0))),
            Self::Settle { topic, .. } => Some((topic, 0)),
            Self::Available { .. } => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireError {
    pub code: String,
    pub message: String,
}

impl From<&ApiError> for WireError {
    fn from(error: &ApiError) -> Self {
        Self {
            code: error.code.as_str().to_string(),
            message: error.message.clone(),
        }
    }
}

impl WireError {
    pub fn to_api(&self) -> ApiError {
        let code = ErrorCode::parse(&self.code).unwrap_or(ErrorCode::Internal);
        ApiError::new(code, self.message.clone())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum WireValue {
    Text(String),
    Base64(String),
}

#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireConsumed {
    pub id: String,
    pub partition: u32,
    pub offset: u64,
    pub key: Option<String>,
    pub value: WireValue,
    pub receipt: String,
    pub delivery_count: u32,
    pub produced_at_ms: u64,
    pub lease_expires_at_ms: u64,
}

impl WireConsumed {
    pub fn from_consumed(message: ConsumedMessage) -> Self {
        Self {
            id: message.id,
            partition: message.partition,
            offset: message.offset,
            key: message.key,
            value: match message.value {
                JsonValue::Text { value } => WireValue::Text(value),
                JsonValue::Binary { value_base64 } => WireValue::Base64(value_base64),
            },
            receipt: message.receipt,
            delivery_count: message.delivery_count,
            produced_at_ms: message.produced_at_ms,
            lease_expires_at_ms: message.lease_expires_at_ms,
        }
    }

    pub fn into_consumed(self, topic: &str) -> ConsumedMessage {
        ConsumedMessage {
            id: self.id,
            topic: topic.to_string(),
            partition: self.partition,
            offset: self.offset,
            key: self.key,
            value: match self.value {
                WireValue::Text(value) => JsonValue::Text { value },
                WireValue::Base64(value_base64) => JsonValue::Binary { value_base64 },
            },
            receipt: self.receipt,
            delivery_count: self.delivery_count,
            produced_at_ms: self.produced_at_ms,
            lease_expires_at_ms: self.lease_expires_at_ms,
        }
    }
}

/// One settled receipt: an error, or (for extend) the new lease end.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireOutcome {
    pub error: Option<WireError>,
    pub lease_expires_at_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireStats {
    pub partition: u32,
    pub high_watermark: u64,
    pub frontier: u64,
    pub available: u64,
    pub in_flight: u64,
    pub oldest_unacked_age_ms: u64,
}

impl WireStats {
    pub fn new(partition: u32, stats: &PartitionStats) -> Self {
        Self {
            partition,
            high_watermark: stats.high_watermark,
            frontier: stats.frontier,
            available: stats.available,
            in_flight: stats.in_flight,
            oldest_unacked_age_ms: stats.oldest_unacked_age_ms,
        }
    }

    pub fn to_stats(&self) -> (u32, PartitionStats) {
        (
            self.partition,
            PartitionStats {
                high_watermark: self.high_watermark,
                frontier: self.frontier,
                available: self.available,
                in_flight: self.in_flight,
                oldest_unacked_age_ms: self.oldest_unacked_age_ms,
            },
        )
    }
}

/// The answer to one [`DataRequest`].
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum DataAnswer {
    Done,
    Collected(Vec<WireConsumed>),
    Settled(Vec<WireOutcome>),
    Stats(Vec<WireStats>),
    Failed(WireError),
}

impl DataAnswer {
    pub fn failed(error: &ApiError) -> Self {
        Self::Failed(error.into())
    }
}

pub fn encode_request(request: &DataRequest) -> Result<Vec<u8>, String> {
    rkyv::to_bytes::<RkyvError>(request)
        .map(|bytes| bytes.into_vec())
        .map_err(|e| format!("encoding a request: {e}"))
}

pub fn encode_answer(answer: &DataAnswer) -> Result<Vec<u8>, String> {
    rkyv::to_bytes::<RkyvError>(answer)
        .map(|bytes| bytes.into_vec())
        .map_err(|e| format!("encoding an answer: {e}"))
}

/// Copies into an aligned buffer (what arrives from QUIC has no alignment)
/// and validates before reading.
fn aligned(bytes: &[u8]) -> rkyv::util::AlignedVec {
    let mut buffer = rkyv::util::AlignedVec::with_capacity(bytes.len());
    buffer.extend_from_slice(bytes);
    buffer
}

pub fn decode_request(bytes: &[u8]) -> Result<DataRequest, String> {
    rkyv::from_bytes::<DataRequest, RkyvError>(&aligned(bytes))
        .map_err(|e| format!("a malformed data-plane request: {e}"))
}

pub fn decode_answer(bytes: &[u8]) -> Result<DataAnswer, String> {
    rkyv::from_bytes::<DataAnswer, RkyvError>(&aligned(bytes))
        .map_err(|e| format!("a malformed data-plane answer: {e}"))
}

// ------------------------------------------------------------ outbound

/// How a call to another node failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// No answer (down, partitioned, or slower than the deadline): the
    /// request may or may not have been carried out.
    Unreachable(String),
    /// The node answered with an error of the API.
    Refused(ApiError),
}

impl CallError {
    /// As the API answers it: 502 `owner_unreachable`, or the owner's error.
    pub fn to_api(&self, node: NodeId) -> ApiError {
        match self {
            Self::Unreachable(reason) => ApiError::new(
                ErrorCode::OwnerUnreachable,
                format!("the partition's owner, node {node}, did not answer: {reason}"),
            ),
            Self::Refused(error) => error.clone(),
        }
    }
}

/// What this node knows of another's messages, for unpinned consumes.
#[derive(Debug, Default)]
struct Hint {
    /// When it last said messages became available (ms).
    available_at: AtomicU64,
    /// When a consume there began that found nothing (ms).
    empty_since: AtomicU64,
    /// Until when it is skipped after not answering (ms).
    skip_until: AtomicU64,
}

/// The other nodes, by id, and this node's QUIC endpoint to reach them.
pub struct Peers {
    me: NodeId,
    endpoint: Arc<PeerEndpoint>,
    addrs: BTreeMap<NodeId, SocketAddr>,
    hints: BTreeMap<NodeId, Hint>,
}

impl Peers {
    pub fn new(
        me: NodeId,
        endpoint: Arc<PeerEndpoint>,
        members: &BTreeMap<NodeId, String>,
    ) -> Result<Self, String> {
        let mut addrs = BTreeMap::new();
        for (id, addr) in members {
            if *id == me {
                continue;
            }
            let addr = addr
                .parse::<SocketAddr>()
                .map_err(|e| format!("peer {id} address {addr:?}: {e}"))?;
            addrs.insert(*id, addr);
        }
        let hints = addrs.keys().map(|id| (*id, Hint::default())).collect();
        Ok(Self {
            me,
            endpoint,
            addrs,
            hints,
        })
    }

    pub fn me(&self) -> NodeId {
        self.me
    }

    /// Every other node.
    pub fn others(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.addrs.keys().copied()
    }

    pub async fn call(
        &self,
        node: NodeId,
        request: &DataRequest,
        timeout: Duration,
    ) -> Result<DataAnswer, CallError> {
        let addr = *self
            .addrs
            .get(&node)
            .ok_or_else(|| CallError::Unreachable(format!("node {node} is not a peer")))?;
        let payload = encode_request(request).map_err(CallError::Unreachable)?;
        let answer = self
            .endpoint
            .call(addr, request.kind(), payload, timeout)
            .await
            .map_err(|e| match e {
                PeerError::Remote { reason, .. } => {
                    CallError::Refused(ApiError::new(ErrorCode::Internal, reason))
                }
                other => CallError::Unreachable(other.to_string()),
            })?;
        match decode_answer(&answer).map_err(CallError::Unreachable)? {
            DataAnswer::Failed(error) => Err(CallError::Refused(error.to_api())),
            answer => Ok(answer),
        }
    }

    /// Whether `node` recently failed to answer (skip optional calls).
    pub fn recently_unreachable(&self, node: NodeId, now_ms: u64) -> bool {
        self.hints
            .get(&node)
            .is_some_and(|hint| now_ms < hint.skip_until.load(Ordering::Relaxed))
    }

    /// Whether an unpinned consume should ask `node` now.
    pub fn worth_asking(&self, node: NodeId, now_ms: u64) -> bool {
        let Some(hint) = self.hints.get(&node) else {
            return false;
        };
        if now_ms < hint.skip_until.load(Ordering::Relaxed) {
            return false;
        }
        let empty_since = hint.empty_since.load(Ordering::Relaxed);
        empty_since == 0
            || hint.available_at.load(Ordering::Relaxed) >= empty_since
            || now_ms.saturating_sub(empty_since) >= EMPTY_HINT_TTL_MS
    }

    /// A consume that began at `asked_at_ms` found nothing there.
    pub fn found_empty(&self, node: NodeId, asked_at_ms: u64) {
        if let Some(hint) = self.hints.get(&node) {
            hint.empty_since
                .store(asked_at_ms.max(1), Ordering::Relaxed);
        }
    }

    pub fn found_messages(&self, node: NodeId) {
        if let Some(hint) = self.hints.get(&node) {
            hint.empty_since.store(0, Ordering::Relaxed);
        }
    }

    pub fn unreachable(&self, node: NodeId, now_ms: u64) {
        if let Some(hint) = self.hints.get(&node) {
            hint.skip_until
                .store(now_ms + UNREACHABLE_BACKOFF_MS, Ordering::Relaxed);
        }
    }

    /// `node` said messages became available there.
    pub fn heard_available(&self, node: NodeId, now_ms: u64) {
        if let Some(hint) = self.hints.get(&node) {
            hint.available_at.store(now_ms, Ordering::Relaxed);
            hint.skip_until.store(0, Ordering::Relaxed);
        }
    }
}

// ------------------------------------------------------------ inbound

/// A request from another node, on its way to a shard.
pub struct Inbound {
    pub request: DataRequest,
    pub reply: oneshot::Sender<DataAnswer>,
}

/// Hands requests from the QUIC thread to this node's shards.
pub struct DataInbox {
    shards: OnceLock<Vec<UnboundedSender<Inbound>>>,
    held: Arc<AtomicUsize>,
    max: usize,
    /// Set once the node's shards stopped: requests are answered
    /// `stopping` at once instead of waiting for a shard that is gone.
    closed: AtomicBool,
}

/// One request held by the inbox; given back when answered or dropped.
struct Held(Arc<AtomicUsize>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Default for DataInbox {
    fn default() -> Self {
        Self::new()
    }
}

impl DataInbox {
    pub fn new() -> Self {
        Self::with_max(INBOX_REQUESTS_MAX)
    }

    /// An inbox holding at most `max` requests at once.
    pub fn with_max(max: usize) -> Self {
        Self {
            shards: OnceLock::new(),
            held: Arc::default(),
            max,
            closed: AtomicBool::new(false),
        }
    }

    /// The shards stopped (the node hands leadership over and exits next):
    /// later requests are answered `stopping` at once, so callers retry
    /// elsewhere instead of waiting out their deadline.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Requests held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    fn try_hold(&self) -> Option<Held> {
        self.held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| Held(self.held.clone()))
    }

    /// Makes one channel per shard; the receivers go to the shards.
    pub fn wire(&self, shards: usize) -> Vec<UnboundedReceiver<Inbound>> {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..shards)
            .map(|_| futures_channel::mpsc::unbounded())
            .unzip();
        let _ = self.shards.set(senders);
        receivers
    }

    /// Serves one request of the data plane (the QUIC thread calls this).
    pub fn handle(self: &Arc<Self>, payload: Vec<u8>) -> BoxFuture<Result<Vec<u8>, String>> {
        let this = self.clone();
        Box::pin(async move {
            let request = decode_request(&payload)?;
            if this.closed.load(Ordering::SeqCst) {
                let stopping = ApiError::new(ErrorCode::Stopping, "the node is stopping");
                return encode_answer(&DataAnswer::failed(&stopping));
            }
            let Some(_held) = this.try_hold() else {
                let refused = ApiError::new(
                    ErrorCode::Overloaded,
                    format!(
                        "the node holds {} requests of other nodes; retry with backoff",
                        this.max
                    ),
                );
                return encode_answer(&DataAnswer::failed(&refused));
            };
            let shards = this
                .shards
                .get()
                .ok_or_else(|| "the node is starting".to_string())?;
            let shard = request.home().map_or(0, |(topic, partition)| {
                shard_for(topic, partition, shards.len())
            });
            let (reply, answer) = oneshot::channel();
            shards
                .get(shard)
                .ok_or_else(|| "no such shard".to_string())?
                .unbounded_send(Inbound { request, reply })
                .map_err(|_| "the node is stopping".to_string())?;
            let answer = answer
                .await
                .map_err(|_| "the shard dropped the request".to_string())?;
            encode_answer(&answer)
        })
    }
}

#[cfg(test)]
mod tests;
