//! The shards of one node and how they talk: the [`Transport`] between
//! them, over glommio shared channels (lock-free, bounded), one channel per
//! ordered pair of shards, carrying [`Envelope`]s; and the stable hash that
//! says which shard owns a partition.
//!
//! An operation that lands on shard S and needs a partition that shard O
//! owns becomes one envelope from S to O; the reply comes back on the
//! oneshot inside it. Nothing else is shared between shards.

use std::time::Duration;

use glommio::channels::shared_channel::{
    self, ConnectedReceiver, ConnectedSender, SharedReceiver, SharedSender,
};
use narad_net::{ApiError, ErrorCode};

use crate::limits::MESH_CHANNEL_CAPACITY;
use crate::rpc::{Address, CallError, Delivered, Envelope, Transport};

/// The shard that owns `partition` of `topic` among `shards` shards: the
/// partitions of one topic go round the shards from a per-topic start, so
/// every topic spreads evenly. Partition folders are not per shard, so a
/// node restarted with another shard count finds every partition.
pub fn shard_for(topic: &str, partition: u32, shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in topic.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let slot = hash.wrapping_add(u64::from(partition));
    // The remainder is below `shards`, which is a usize.
    (slot % shards as u64) as usize
}

/// The unconnected ends of one shard, made on the main thread and moved
/// into the shard's executor.
pub struct MeshEnds {
    me: usize,
    senders: Vec<Option<SharedSender<Envelope>>>,
    receivers: Vec<SharedReceiver<Envelope>>,
}

/// Makes the channels of `shards` shards: one per ordered pair.
pub fn wire(shards: usize) -> Vec<MeshEnds> {
    let mut ends: Vec<MeshEnds> = (0..shards)
        .map(|me| MeshEnds {
            me,
            senders: (0..shards).map(|_| None).collect(),
            receivers: Vec::new(),
        })
        .collect();
    for from in 0..shards {
        for to in 0..shards {
            if from == to {
                continue;
            }
            let (sender, receiver) = shared_channel::new_bounded(MESH_CHANNEL_CAPACITY);
            ends[from].senders[to] = Some(sender);
            ends[to].receivers.push(receiver);
        }
    }
    ends
}

impl MeshEnds {
    /// Connects every end at once (a connect waits for the peer's), giving
    /// this shard's senders and the receivers it must drain.
    pub async fn connect(self) -> (Mesh, Vec<ConnectedReceiver<Envelope>>) {
        let mut senders = Vec::new();
        for sender in self.senders {
            senders.push(sender.map(|s| glommio::spawn_local(s.connect())));
        }
        let receivers: Vec<_> = self
            .receivers
            .into_iter()
            .map(|r| glommio::spawn_local(r.connect()))
            .collect();
        let mut connected = Vec::with_capacity(senders.len());
        for sender in senders {
            connected.push(match sender {
                Some(task) => Some(task.await),
                None => None,
            });
        }
        let mut inbox = Vec::with_capacity(receivers.len());
        for receiver in receivers {
            inbox.push(receiver.await);
        }
        (
            Mesh {
                me: self.me,
                senders: connected,
            },
            inbox,
        )
    }
}

/// This shard's way to every other shard of the node.
pub struct Mesh {
    me: usize,
    senders: Vec<Option<ConnectedSender<Envelope>>>,
}

fn peer_gone() -> CallError {
    CallError::Refused(ApiError::new(
        ErrorCode::Stopping,
        "another shard of this node stopped; try again",
    ))
}

impl Mesh {
    /// A mesh of one shard (tests and `--shards 1`).
    pub fn single() -> Self {
        Self {
            me: 0,
            senders: vec![None],
        }
    }

    pub fn me(&self) -> usize {
        self.me
    }

    pub fn shards(&self) -> usize {
        self.senders.len()
    }

    fn sender(&self, to: Address) -> Result<&ConnectedSender<Envelope>, CallError> {
        match to {
            Address::Shard(shard) => self
                .senders
                .get(shard)
                .and_then(Option::as_ref)
                .ok_or_else(|| CallError::Unreachable(format!("no shard {shard}"))),
            Address::Node(node) => Err(CallError::Unreachable(format!(
                "node {node} is not a shard of this node"
            ))),
        }
    }
}

impl Transport for Mesh {
    fn deliver(
        &self,
        to: Address,
        envelope: Envelope,
        _timeout: Option<Duration>,
    ) -> Delivered<'_> {
        Box::pin(async move {
            let sender = self.sender(to)?;
            // A stopped shard closed its end: answered 503 `stopping`.
            sender.send(envelope).await.map_err(|_| peer_gone())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shard_owns_everything() {
        assert_eq!(shard_for("orders", 7, 1), 0);
        assert_eq!(shard_for("orders", 7, 0), 0);
    }

    #[test]
    fn partitions_of_a_topic_spread_evenly_and_stably() {
        for shards in 2..=8usize {
            let mut counts = vec![0; shards];
            for partition in 0..(shards as u32 * 4) {
                let shard = shard_for("orders", partition, shards);
                assert!(shard < shards);
                assert_eq!(shard, shard_for("orders", partition, shards), "stable");
                counts[shard] += 1;
            }
            assert!(counts.iter().all(|c| *c == 4), "{shards}: {counts:?}");
        }
    }

    #[test]
    fn single_partition_topics_do_not_all_land_on_one_shard() {
        let shards: std::collections::HashSet<usize> = (0..32)
            .map(|i| shard_for(&format!("topic-{i}"), 0, 4))
            .collect();
        assert!(shards.len() > 1);
    }
}
