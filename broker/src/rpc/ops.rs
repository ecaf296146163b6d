//! The operations, each a request type with its reply type, and
//! [`Envelope`], the one message a transport carries: an operation with the
//! oneshot its reply goes back on.
//!
//! Adding an operation: its request and reply types here, its variant in
//! [`Envelope`] (and in `kind` and `visit`), its `KIND` in `wire.rs`'s
//! list, and its arm in `Shard::serve`.

use bytes::Bytes;
use futures_channel::oneshot;
use narad_net::types::{BrowsePage, BrowsedMessage, ConsumedMessage, SettleAction};
use narad_net::ApiError;
use narad_raft::state::{NodeId, Topic};
use narad_storage::log::Message;
use rkyv::{Archive, Deserialize, Serialize};

use super::wire::{
    Wire, KIND_AVAILABLE, KIND_BROWSE, KIND_COLLECT, KIND_COMMIT, KIND_GAINED, KIND_GAUGES,
    KIND_KEYED_COMMIT, KIND_MOVE_SOURCE, KIND_PRODUCE, KIND_RATES, KIND_READY, KIND_SEARCH,
    KIND_SETTLE, KIND_STATS, KIND_WAKE,
};
use crate::owner::PartitionStats;
use crate::rates::RatePoint;

/// Where an answer goes.
pub type Reply<T> = oneshot::Sender<T>;

/// A request with its own reply type.
pub trait Operation: Wire + Send + Sized + 'static {
    /// Its request kind between nodes.
    const KIND: u8;
    type Reply: Wire + Send + 'static;

    /// The operation in the envelope transports carry.
    fn wrap(self, reply: Reply<Self::Reply>) -> Envelope;
}

/// A topic as operations name it: with its incarnation, so an operation
/// about an earlier topic of the same name is refused.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct TopicRef {
    pub name: String,
    pub incarnation: u64,
}

impl TopicRef {
    pub fn of(topic: &Topic) -> Self {
        Self {
            name: topic.name.clone(),
            incarnation: topic.incarnation,
        }
    }
}

/// Appends a dispatcher batch, in order, to one partition.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct Commit {
    pub topic: TopicRef,
    pub partition: u32,
    pub messages: Vec<Record>,
}
pub type Committed = Result<(), ApiError>;

/// A [`Commit`] some of whose records carry the producer's idempotency
/// key: the owner drops a copy whose key it committed within the topic's
/// window, and answers it as done. A node of an earlier release refuses
/// this kind; the sender then sends the plain [`Commit`] (that owner
/// drops no copies).
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct KeyedCommit {
    pub commit: Commit,
    /// The keys, by index into `commit.messages`, in index order.
    pub keys: Vec<KeyAt>,
}

/// The idempotency key of one record of a [`KeyedCommit`].
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct KeyAt {
    pub index: u32,
    pub key: Bytes,
}

impl From<Commit> for KeyedCommit {
    fn from(commit: Commit) -> Self {
        Self {
            commit,
            keys: Vec::new(),
        }
    }
}

impl KeyedCommit {
    /// The messages to append, each with its idempotency key.
    pub fn into_messages(self) -> Vec<Message> {
        let mut messages: Vec<Message> = self
            .commit
            .messages
            .into_iter()
            .map(Message::from)
            .collect();
        for at in self.keys {
            if let Some(message) = usize::try_from(at.index)
                .ok()
                .and_then(|i| messages.get_mut(i))
            {
                message.idempotency_key = Some(at.key);
            }
        }
        messages
    }
}

/// A produce another shard of this node took, whose messages all go to one
/// partition of the receiver: committed through the receiver's journal
/// (`shard/journal.rs`) before any WAL holds them, so that the one
/// fdatasync before the 202 is the receiver's. Only between shards of one
/// node: records for another node's partitions take the WAL first.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct Produce {
    pub topic: TopicRef,
    pub partition: u32,
    pub messages: Vec<Record>,
    /// The idempotency keys of messages that carry one (claimed in the
    /// node's table by the sender), with when each key's window ends.
    pub keys: Vec<ProduceKey>,
}

/// The idempotency key of `messages[index]` of a [`Produce`].
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct ProduceKey {
    pub index: u32,
    pub key: Vec<u8>,
    pub expires_ms: u64,
}
/// Whether the receiver committed them (durable and visible); `false`:
/// nothing was written, and the sender takes the WAL path.
pub type Produced = Result<bool, ApiError>;

/// One message of a commit. Its value is shared, not copied, between shards.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct Record {
    pub id: u128,
    pub produced_at_ms: u64,
    pub key: Option<Vec<u8>>,
    pub value: Bytes,
}

impl From<Record> for Message {
    fn from(record: Record) -> Self {
        Self {
            id: record.id,
            produced_at_ms: record.produced_at_ms,
            key: record.key,
            value: record.value,
            idempotency_key: None,
        }
    }
}

/// Leases up to `max` available messages from these partitions, visited in
/// the order given. Never waits: long polls wait where the client is.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct Collect {
    pub topic: TopicRef,
    pub partitions: Vec<u32>,
    pub max: u32,
    pub visibility_ms: u64,
}
/// The leased messages, in the order the partitions were visited.
pub type Collected = Result<Vec<ConsumedMessage>, ApiError>;

/// Acks, nacks or extends receipts, answered one by one in the order given.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct Settle {
    pub topic: TopicRef,
    pub receipts: Vec<String>,
    pub action: SettleAction,
}
/// The answer to one receipt: for extend, the new lease end.
pub type SettleOutcome = Result<Option<u64>, ApiError>;
pub type Settled = Vec<SettleOutcome>;

/// A page of one partition's messages from `from` on (`None`: its
/// frontier), at most `limit` of them, read at its owner: leases, acks and
/// counts nothing.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct Browse {
    pub topic: TopicRef,
    pub partition: u32,
    pub from: Option<u64>,
    pub limit: u32,
}
pub type Browsed = Result<BrowsePage, ApiError>;

/// Searches partitions of a topic at their owners for messages whose key
/// is `key` and whose key or value contains `contains` (each when given),
/// from the offsets given, in the order given, until `limit` matches:
/// each partition's scan looks at no more than `SEARCH_SCAN_MAX` messages.
/// Changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct Search {
    pub topic: TopicRef,
    /// Each partition with the offset its scan goes on from.
    pub from: Vec<(u32, u64)>,
    pub key: Option<Vec<u8>>,
    pub contains: Option<Vec<u8>>,
    pub limit: u32,
}

/// What a search found, in the order it searched, and where each
/// partition's scan stopped (`None`: it reached the partition's end).
#[derive(Debug, Clone, Default, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct SearchPage {
    pub messages: Vec<BrowsedMessage>,
    pub next: Vec<(u32, Option<u64>)>,
}
pub type Searched = Result<SearchPage, ApiError>;

/// The rates of these partitions over the last 15 minutes (opening them
/// if needed), added up interval by interval.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct TopicRates {
    pub topic: TopicRef,
    pub partitions: Vec<u32>,
}
/// The points, oldest first.
pub type RatePoints = Result<Vec<RatePoint>, ApiError>;

/// Figures of these partitions (opening them if needed).
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct Stats {
    pub topic: TopicRef,
    pub partitions: Vec<u32>,
}
pub type Figures = Result<TopicFigures, ApiError>;

/// Figures of some partitions of a topic: each partition's own, and how
/// each of its copies to the topic's children stands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct TopicFigures {
    pub partitions: Vec<(u32, PartitionStats)>,
    pub copies: Vec<CopyFigures>,
}

impl TopicFigures {
    pub fn merge(&mut self, other: TopicFigures) {
        self.partitions.extend(other.partitions);
        self.copies.extend(other.copies);
    }
}

/// How the copy of one parent partition to one child stands, at the
/// parent partition's owner.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct CopyFigures {
    pub parent: String,
    pub child: String,
    pub partition: u32,
    /// Messages of the parent partition not copied yet.
    pub lag_messages: u64,
    /// Age of the oldest message not copied yet (for a delay child: how
    /// far past its due time).
    pub lag_ms: u64,
    /// Messages retention removed before they were copied, since the
    /// owner started.
    pub dropped: u64,
    /// Why the last attempt failed, while it keeps failing.
    pub last_error: Option<String>,
}

/// Whether the node is ready, as its `/readyz` would answer now (for
/// `GET /v1/cluster`, which shows every member's).
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct Ready;
/// `Ok` when the node is ready; otherwise the reason `/readyz` gives.
pub type Readiness = Result<(), ApiError>;

/// One shard's own figures, for `/metrics` and `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct Gauges;

/// One shard's figures.
#[derive(Debug, Clone, Default, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct ShardGauges {
    pub shard: u32,
    pub wal_used_bytes: u64,
    /// Idempotency keys the WAL let go before their window ended (its
    /// bound, or a ring too full to carry them).
    pub wal_keys_forgotten: u64,
    /// Idempotency keys its partition owners let go before their window
    /// ended (a table at its bound).
    pub owner_keys_forgotten: u64,
    pub wal_failure: Option<String>,
    /// Why a partition's ack state on this shard failed, if one did.
    pub ack_state_failure: Option<String>,
    pub dispatcher_pending: u64,
    /// (topic, partition, figures) of every open partition.
    pub partitions: Vec<(String, u32, PartitionStats)>,
    /// Every copy to a child this shard runs.
    pub copies: Vec<CopyFigures>,
    /// (parent, child, headroom in ms; `u64::MAX`: no limit) of every copy
    /// to a remote child this shard runs.
    pub remote_headroom: Vec<(String, String, u64)>,
}

/// A move's destination asks the partition's source (its owner) for what
/// it copies, and to freeze or thaw the partition.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct MoveSource {
    pub topic: TopicRef,
    pub partition: u32,
    /// The move, as the metastore names it.
    pub move_id: String,
    pub action: MoveAction,
}

#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub enum MoveAction {
    /// The source's state, and these bytes of a segment if any:
    /// (segment name, position, length).
    Read(Option<(String, u64, u64)>),
    /// Commits to the partition wait from now on, acks, nacks and extends
    /// wait for the freeze to end, consumes find nothing there; then the
    /// state.
    Freeze,
    /// The move was abandoned: the partition serves again.
    Thaw,
}

/// What the source holds of a moving partition.
#[derive(Debug, Clone, Default, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct SourceState {
    /// Every segment file and its written bytes, oldest first.
    pub extents: Vec<(String, u64)>,
    /// The bytes asked for.
    pub bytes: Vec<u8>,
    /// The ack set, encoded (`AckSet::encode`).
    pub acks: Vec<u8>,
    pub high_watermark: u64,
    /// The cursor of each copy to a child: (child, child incarnation, next offset).
    pub cursors: Vec<(String, u64, u64)>,
    /// The ids and write times of the last records appended, so that the
    /// new owner drops a commit sent again after its answer was lost
    /// (a freeze's answer only).
    pub recent: Vec<(u128, u64)>,
    /// Which start of the source node answered: answers from the start
    /// that froze the partition come from a source frozen all along.
    pub incarnation: u64,
}
pub type SourceAnswer = Result<SourceState, ApiError>;

/// Messages became available at the sender: wake long polls.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct Available {
    /// The node they became available on.
    pub from: NodeId,
}

/// Messages of these topics became available at the sender since its last
/// notice to this node, with how many of each (added up, saturating): wake
/// the long polls of those topics that cover them. Nodes of this release
/// send it in place of [`Available`], which wakes every poll.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct Gained {
    /// The node they became available on.
    pub from: NodeId,
    pub topics: Vec<(String, u32)>,
}

/// Messages of one topic became available on another shard of this node
/// (`count` of them that the sender's own long polls did not cover, or 0
/// when it only ends what the receiver knew of it): wake long polls of that
/// topic here (`wakeups.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct Wake {
    pub topic: String,
    /// The sending shard's index.
    pub shard: u32,
    pub count: u32,
}

/// An operation and where its reply goes: the one message every transport
/// carries.
pub enum Envelope {
    Commit(Commit, Reply<Committed>),
    KeyedCommit(KeyedCommit, Reply<Committed>),
    Produce(Produce, Reply<Produced>),
    Collect(Collect, Reply<Collected>),
    Settle(Settle, Reply<Settled>),
    Browse(Browse, Reply<Browsed>),
    Search(Search, Reply<Searched>),
    TopicRates(TopicRates, Reply<RatePoints>),
    Stats(Stats, Reply<Figures>),
    Gauges(Gauges, Reply<ShardGauges>),
    Ready(Ready, Reply<Readiness>),
    Available(Available, Reply<()>),
    Gained(Gained, Reply<()>),
    MoveSource(MoveSource, Reply<SourceAnswer>),
    Wake(Wake, Reply<()>),
}

/// Something done with an envelope's typed operation and reply.
pub trait Visit {
    type Output;
    fn visit<O: Operation>(self, op: O, reply: Reply<O::Reply>) -> Self::Output;
}

impl Envelope {
    pub fn kind(&self) -> u8 {
        match self {
            Self::Commit(..) => Commit::KIND,
            Self::KeyedCommit(..) => KeyedCommit::KIND,
            Self::Produce(..) => Produce::KIND,
            Self::Collect(..) => Collect::KIND,
            Self::Settle(..) => Settle::KIND,
            Self::Browse(..) => Browse::KIND,
            Self::Search(..) => Search::KIND,
            Self::TopicRates(..) => TopicRates::KIND,
            Self::Stats(..) => Stats::KIND,
            Self::Gauges(..) => Gauges::KIND,
            Self::Ready(..) => Ready::KIND,
            Self::Available(..) => Available::KIND,
            Self::Gained(..) => Gained::KIND,
            Self::MoveSource(..) => MoveSource::KIND,
            Self::Wake(..) => Wake::KIND,
        }
    }

    /// Hands the typed operation and its reply to `visitor`.
    pub fn visit<V: Visit>(self, visitor: V) -> V::Output {
        match self {
            Self::Commit(op, reply) => visitor.visit(op, reply),
            Self::KeyedCommit(op, reply) => visitor.visit(op, reply),
            Self::Produce(op, reply) => visitor.visit(op, reply),
            Self::Collect(op, reply) => visitor.visit(op, reply),
            Self::Settle(op, reply) => visitor.visit(op, reply),
            Self::Browse(op, reply) => visitor.visit(op, reply),
            Self::Search(op, reply) => visitor.visit(op, reply),
            Self::TopicRates(op, reply) => visitor.visit(op, reply),
            Self::Stats(op, reply) => visitor.visit(op, reply),
            Self::Gauges(op, reply) => visitor.visit(op, reply),
            Self::Ready(op, reply) => visitor.visit(op, reply),
            Self::Available(op, reply) => visitor.visit(op, reply),
            Self::Gained(op, reply) => visitor.visit(op, reply),
            Self::MoveSource(op, reply) => visitor.visit(op, reply),
            Self::Wake(op, reply) => visitor.visit(op, reply),
        }
    }

    /// The topic and the first partition it is about, which picks the
    /// shard of a node that takes it in.
    pub fn home(&self) -> Option<(&str, u32)> {
        match self {
            Self::Commit(op, _) => Some((&op.topic.name, op.partition)),
            Self::KeyedCommit(op, _) => Some((&op.commit.topic.name, op.commit.partition)),
            Self::Produce(op, _) => Some((&op.topic.name, op.partition)),
            Self::Collect(op, _) => Some((&op.topic.name, first(&op.partitions))),
            Self::Stats(op, _) => Some((&op.topic.name, first(&op.partitions))),
            Self::TopicRates(op, _) => Some((&op.topic.name, first(&op.partitions))),
            Self::Settle(op, _) => Some((&op.topic.name, 0)),
            Self::Browse(op, _) => Some((&op.topic.name, op.partition)),
            Self::Search(op, _) => Some((&op.topic.name, op.from.first().map_or(0, |f| f.0))),
            Self::MoveSource(op, _) => Some((&op.topic.name, op.partition)),
            Self::Gauges(..)
            | Self::Ready(..)
            | Self::Available(..)
            | Self::Gained(..)
            | Self::Wake(..) => None,
        }
    }
}

fn first(partitions: &[u32]) -> u32 {
    partitions.first().copied().unwrap_or(0)
}

macro_rules! operation {
    ($op:ident, $reply:ty, $kind:expr) => {
        impl Operation for $op {
            const KIND: u8 = $kind;
            type Reply = $reply;
            fn wrap(self, reply: Reply<$reply>) -> Envelope {
                Envelope::$op(self, reply)
            }
        }
    };
}

operation!(Commit, Committed, KIND_COMMIT);
operation!(KeyedCommit, Committed, KIND_KEYED_COMMIT);
operation!(Produce, Produced, KIND_PRODUCE);
operation!(Collect, Collected, KIND_COLLECT);
operation!(Settle, Settled, KIND_SETTLE);
operation!(Browse, Browsed, KIND_BROWSE);
operation!(Search, Searched, KIND_SEARCH);
operation!(TopicRates, RatePoints, KIND_RATES);
operation!(Stats, Figures, KIND_STATS);
operation!(Gauges, ShardGauges, KIND_GAUGES);
operation!(Ready, Readiness, KIND_READY);
operation!(Available, (), KIND_AVAILABLE);
operation!(Gained, (), KIND_GAINED);
operation!(MoveSource, SourceAnswer, KIND_MOVE_SOURCE);
operation!(Wake, (), KIND_WAKE);
