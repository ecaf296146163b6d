//! Operations between shards and between nodes.
//!
//! Each operation is a request type with its own reply type (`ops.rs`).
//! One [`Transport`] carries an operation to another shard of this node or
//! to another node (`transport.rs`: the mesh between shards and QUIC between
//! nodes are its two implementations); between nodes an operation travels
//! in a versioned rkyv form (`wire.rs`). A shard answers every operation in
//! one place (`Shard::serve`), whether a shard or a node sent it, and how
//! far it may still travel is its [`Reach`].

mod ops;
mod transport;
mod wire;

pub use ops::{
    Available, Browse, Browsed, Collect, Collected, Commit, Committed, CopyFigures, Envelope,
    Figures, Gained, Gauges, KeyAt, KeyedCommit, MoveAction, MoveSource, Operation, Produce,
    ProduceKey, Produced, RatePoints, Readiness, Ready, Record, Reply, Search, SearchPage,
    Searched, Settle, SettleOutcome, Settled, ShardGauges, SourceAnswer, SourceState, Stats,
    TopicFigures, TopicRates, TopicRef, Visit, Wake,
};
pub use transport::{answer_from_wire, call, Address, CallError, Delivered, Links, Transport};
pub use wire::{decode_answer, encode_refusal, encode_request};
pub use wire::{is_operation_kind, open, EncodedReply, Wire, WIRE_VERSION};

/// How far an operation may still travel from the shard that serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// From a client of this node: to any shard of any node.
    Cluster,
    /// From another node: to any shard of this node, no further (the
    /// sender's metadata may differ; partitions this node does not own are
    /// refused, never sent on).
    Node,
    /// From another shard of this node: this shard only.
    Shard,
}

impl Reach {
    /// Whether the operation may go on to another shard of this node.
    pub fn crosses_shards(self) -> bool {
        self != Self::Shard
    }

    /// Whether the operation may go on to another node.
    pub fn crosses_nodes(self) -> bool {
        self == Self::Cluster
    }
}
