//! Between nodes: the QUIC [`Transport`] ([`QuicNodes`]), what this node
//! knows of the others' messages ([`Peers`]), and [`DataInbox`], which hands
//! operations of other nodes from the QUIC thread to this node's shards.
//!
//! Outbound, an operation is encoded (`rpc/wire.rs`), sent on a stream of
//! its own with a deadline (so a slow commit never holds a consume or an
//! ack behind it), and its answer decoded as that operation's reply type.
//! Inbound, the QUIC thread decodes a request into an envelope and hands it
//! to a shard through one unbounded channel per shard (the QUIC thread
//! never waits on a shard); the shard's reply is encoded on the way back.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures_channel::mpsc::{UnboundedReceiver, UnboundedSender};
use narad_net::peer::{PeerEndpoint, PeerError};
use narad_net::{ApiError, ErrorCode};
use narad_raft::node::BoxFuture;
use narad_raft::state::NodeId;

use crate::limits::{
    COMMIT_CALL_TIMEOUT, EMPTY_HINT_TTL_MS, INBOX_REQUESTS_MAX, UNREACHABLE_BACKOFF_MS,
};
use crate::mesh::shard_for;
use crate::rpc::{
    answer_from_wire, encode_refusal, encode_request, open, Address, CallError, Delivered,
    Envelope, Operation, Reply, Transport, Visit,
};

// ------------------------------------------------------------ outbound

/// This node's QUIC endpoint and the other nodes (their addresses:
/// `HOST:PORT`, an IP address or a DNS name the endpoint looks up).
#[derive(Clone)]
pub struct QuicNodes {
    endpoint: Arc<PeerEndpoint>,
    peers: Arc<Peers>,
}

impl QuicNodes {
    pub fn new(endpoint: Arc<PeerEndpoint>, peers: Arc<Peers>) -> Self {
        Self { endpoint, peers }
    }
}

/// One operation's round trip over QUIC.
struct RoundTrip {
    endpoint: Arc<PeerEndpoint>,
    addr: Arc<str>,
    timeout: Duration,
}

impl Visit for RoundTrip {
    type Output = Delivered<'static>;

    fn visit<O: Operation>(self, op: O, reply: Reply<O::Reply>) -> Delivered<'static> {
        Box::pin(async move {
            let payload = encode_request(&op).map_err(CallError::Unreachable)?;
            let answer = self
                .endpoint
                .call(&self.addr, O::KIND, payload, self.timeout)
                .await
                .map_err(|e| match e {
                    PeerError::Remote { reason, .. } => {
                        CallError::Refused(ApiError::new(ErrorCode::Internal, reason))
                    }
                    other => CallError::Unreachable(other.to_string()),
                })?;
            answer_from_wire::<O>(&answer, reply)
        })
    }
}

impl Transport for QuicNodes {
    fn deliver(&self, to: Address, envelope: Envelope, timeout: Option<Duration>) -> Delivered<'_> {
        let addr = match to {
            Address::Node(node) => self
                .peers
                .addr(node)
                .ok_or_else(|| CallError::Unreachable(format!("node {node} is not a peer"))),
            Address::Shard(shard) => Err(CallError::Unreachable(format!(
                "shard {shard} is not a node"
            ))),
        };
        match addr {
            Ok(addr) => envelope.visit(RoundTrip {
                endpoint: self.endpoint.clone(),
                addr,
                timeout: timeout.unwrap_or(COMMIT_CALL_TIMEOUT),
            }),
            Err(error) => Box::pin(async move { Err(error) }),
        }
    }
}

/// What this node knows of another's messages, for unpinned consumes.
#[derive(Debug, Default)]
struct Hint {
    /// When it last said messages became available (ms), of any topic.
    available_at: AtomicU64,
    /// By topic: when a consume there began that found nothing (ms). One
    /// topic found empty says nothing of another's partitions on that node.
    empty_since: Mutex<HashMap<String, u64>>,
    /// Until when it is skipped after not answering (ms).
    skip_until: AtomicU64,
}

impl Hint {
    fn empties(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        // A panic elsewhere while holding it leaves hints, not invariants.
        self.empty_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Topics a node remembers as found empty at another, before it forgets
/// the stale ones.
const EMPTY_HINTS_MAX: usize = 1024;

/// Another node: where it listens and what this node knows of its messages.
#[derive(Debug)]
struct PeerNode {
    addr: Arc<str>,
    hint: Hint,
}

/// The other nodes, by id, and what this node knows of their messages.
/// Nodes join and leave: the table follows the metastore's node records.
pub struct Peers {
    me: NodeId,
    nodes: std::sync::RwLock<BTreeMap<NodeId, Arc<PeerNode>>>,
}

impl Peers {
    /// The members other than `me`, with their peer addresses.
    pub fn new(me: NodeId, members: &BTreeMap<NodeId, String>) -> Self {
        let nodes = members
            .iter()
            .filter(|(id, _)| **id != me)
            .map(|(id, addr)| {
                let node = PeerNode {
                    addr: Arc::from(addr.as_str()),
                    hint: Hint::default(),
                };
                (*id, Arc::new(node))
            })
            .collect();
        Self {
            me,
            nodes: std::sync::RwLock::new(nodes),
        }
    }

    pub fn me(&self) -> NodeId {
        self.me
    }

    fn table(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<NodeId, Arc<PeerNode>>> {
        // A panic elsewhere while holding it leaves addresses, not invariants.
        self.nodes
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn node(&self, id: NodeId) -> Option<Arc<PeerNode>> {
        self.table().get(&id).cloned()
    }

    /// Every other node.
    pub fn others(&self) -> Vec<NodeId> {
        self.table().keys().copied().collect()
    }

    /// Where `node` listens for other nodes.
    pub fn addr(&self, node: NodeId) -> Option<Arc<str>> {
        self.node(node).map(|n| n.addr.clone())
    }

    /// Follows the metastore: `nodes` are the recorded nodes with their
    /// addresses (new ones are added, moved ones get their new address);
    /// `removed` were removed from the cluster.
    pub fn learn<'a>(
        &self,
        nodes: impl IntoIterator<Item = (NodeId, &'a str)>,
        removed: impl IntoIterator<Item = NodeId>,
    ) {
        let changes: Vec<(NodeId, &str)> = {
            let table = self.table();
            nodes
                .into_iter()
                .filter(|(id, addr)| {
                    *id != self.me && table.get(id).is_none_or(|n| &*n.addr != *addr)
                })
                .collect()
        };
        let removed: Vec<NodeId> = removed.into_iter().collect();
        if changes.is_empty() && !removed.iter().any(|id| self.table().contains_key(id)) {
            return;
        }
        let mut table = self
            .nodes
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (id, addr) in changes {
            tracing::info!(node = id, addr, "learned another node's address");
            let node = PeerNode {
                addr: Arc::from(addr),
                hint: Hint::default(),
            };
            table.insert(id, Arc::new(node));
        }
        for id in removed {
            table.remove(&id);
        }
    }

    /// Whether `node` recently failed to answer (skip optional calls).
    pub fn recently_unreachable(&self, node: NodeId, now_ms: u64) -> bool {
        self.node(node)
            .is_some_and(|n| now_ms < n.hint.skip_until.load(Ordering::Relaxed))
    }

    /// Whether an unpinned consume of `topic` should ask `node` now.
    pub fn worth_asking(&self, node: NodeId, topic: &str, now_ms: u64) -> bool {
        let Some(peer) = self.node(node) else {
            return false;
        };
        let hint = &peer.hint;
        if now_ms < hint.skip_until.load(Ordering::Relaxed) {
            return false;
        }
        let Some(empty_since) = hint.empties().get(topic).copied() else {
            return true;
        };
        hint.available_at.load(Ordering::Relaxed) >= empty_since
            || now_ms.saturating_sub(empty_since) >= EMPTY_HINT_TTL_MS
    }

    /// A consume of `topic` that began at `asked_at_ms` found nothing there.
    pub fn found_empty(&self, node: NodeId, topic: &str, asked_at_ms: u64) {
        if let Some(peer) = self.node(node) {
            let hint = &peer.hint;
            let mut empties = hint.empties();
            // Forget stale ones now and then (topics come and go).
            if empties.len() >= EMPTY_HINTS_MAX {
                empties.retain(|_, since| asked_at_ms.saturating_sub(*since) < EMPTY_HINT_TTL_MS);
            }
            empties.insert(topic.to_string(), asked_at_ms.max(1));
        }
    }

    pub fn found_messages(&self, node: NodeId, topic: &str) {
        if let Some(peer) = self.node(node) {
            let hint = &peer.hint;
            hint.empties().remove(topic);
        }
    }

    pub fn unreachable(&self, node: NodeId, now_ms: u64) {
        if let Some(peer) = self.node(node) {
            let hint = &peer.hint;
            hint.skip_until
                .store(now_ms + UNREACHABLE_BACKOFF_MS, Ordering::Relaxed);
        }
    }

    /// `node` said messages became available there.
    pub fn heard_available(&self, node: NodeId, now_ms: u64) {
        if let Some(peer) = self.node(node) {
            let hint = &peer.hint;
            hint.available_at.store(now_ms, Ordering::Relaxed);
            hint.skip_until.store(0, Ordering::Relaxed);
        }
    }
}

// ------------------------------------------------------------ inbound

/// Hands requests from the QUIC thread to this node's shards.
pub struct DataInbox {
    shards: OnceLock<Vec<UnboundedSender<Envelope>>>,
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
    pub fn wire(&self, shards: usize) -> Vec<UnboundedReceiver<Envelope>> {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..shards)
            .map(|_| futures_channel::mpsc::unbounded())
            .unzip();
        let _ = self.shards.set(senders);
        receivers
    }

    /// Serves one operation of another node (the QUIC thread calls this).
    pub fn handle(
        self: &Arc<Self>,
        kind: u8,
        payload: Vec<u8>,
    ) -> BoxFuture<Result<Vec<u8>, String>> {
        let this = self.clone();
        Box::pin(async move {
            let (envelope, reply) = open(kind, &payload)?;
            if this.closed.load(Ordering::SeqCst) {
                let stopping = ApiError::new(ErrorCode::Stopping, "the node is stopping");
                return encode_refusal(&stopping);
            }
            let Some(_held) = this.try_hold() else {
                let refused = ApiError::new(
                    ErrorCode::Overloaded,
                    format!(
                        "the node holds {} requests of other nodes; retry with backoff",
                        this.max
                    ),
                );
                return encode_refusal(&refused);
            };
            let shards = this
                .shards
                .get()
                .ok_or_else(|| "the node is starting".to_string())?;
            let shard = envelope.home().map_or(0, |(topic, partition)| {
                shard_for(topic, partition, shards.len())
            });
            shards
                .get(shard)
                .ok_or_else(|| "no such shard".to_string())?
                .unbounded_send(envelope)
                .map_err(|_| "the node is stopping".to_string())?;
            reply.await
        })
    }
}

#[cfg(test)]
mod tests;
