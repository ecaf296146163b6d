//! The shards of one node and how they talk: one typed message enum over
//! glommio shared channels (lock-free, bounded), one channel per ordered pair
//! of shards, and the stable hash that says which shard owns a partition.
//!
//! A request that lands on shard S and needs a partition that shard O owns
//! becomes one [`ShardMsg`] from S to O; the answer comes back on a oneshot
//! carried inside the message. Nothing else is shared between shards.

use std::time::Duration;

use futures_channel::oneshot;
use glommio::channels::shared_channel::{
    self, ConnectedReceiver, ConnectedSender, SharedReceiver, SharedSender,
};
use narad_net::types::{ConsumedMessage, SettleAction};
use narad_net::{ApiError, ErrorCode};
use narad_raft::state::Topic;
use narad_storage::log::Message;

use crate::limits::MESH_CHANNEL_CAPACITY;
use crate::owner::PartitionStats;
use crate::receipt::Receipt;

/// Where an answer goes.
pub type Reply<T> = oneshot::Sender<T>;

/// The answer to one settle (ack, nack, extend): the new lease end for extend.
pub type SettleOutcome = Result<Option<u64>, ApiError>;

/// Everything one shard asks of another.
pub enum ShardMsg {
    /// Append a dispatcher batch to a partition this shard owns.
    Commit {
        topic: Topic,
        partition: u32,
        messages: Vec<Message>,
        reply: Reply<Result<(), ApiError>>,
    },
    /// Lease up to `max` available messages from these partitions (no wait).
    Collect {
        topic: Topic,
        partitions: Vec<u32>,
        max: usize,
        visibility_ms: u64,
        reply: Reply<Result<Vec<ConsumedMessage>, ApiError>>,
    },
    /// Settle receipts of partitions this shard owns, answered in order.
    Settle {
        topic: Topic,
        receipts: Vec<Receipt>,
        action: SettleAction,
        reply: Reply<Vec<SettleOutcome>>,
    },
    /// Figures of these partitions (opening them if needed).
    Stats {
        topic: Topic,
        partitions: Vec<u32>,
        reply: Reply<Result<Vec<(u32, PartitionStats)>, ApiError>>,
    },
    /// The shard's own figures, for `/metrics` and `/readyz`.
    Gauges { reply: Reply<ShardGauges> },
    /// Messages became available on the sender's partitions: wake long polls.
    Available,
}

/// One shard's figures.
#[derive(Debug, Clone, Default)]
pub struct ShardGauges {
    pub shard: usize,
    pub wal_used_bytes: u64,
    pub wal_failure: Option<String>,
    /// Why a partition's ack state on this shard failed, if one did.
    pub ack_state_failure: Option<String>,
    pub dispatcher_pending: u64,
    /// (topic, partition, figures) of every open partition.
    pub partitions: Vec<(String, u32, PartitionStats)>,
}

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
    senders: Vec<Option<SharedSender<ShardMsg>>>,
    receivers: Vec<SharedReceiver<ShardMsg>>,
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
    pub async fn connect(self) -> (Mesh, Vec<ConnectedReceiver<ShardMsg>>) {
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
    senders: Vec<Option<ConnectedSender<ShardMsg>>>,
}

fn peer_gone() -> ApiError {
    ApiError::new(
        ErrorCode::Stopping,
        "another shard of this node stopped; try again",
    )
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

    pub fn owner_of(&self, topic: &str, partition: u32) -> usize {
        shard_for(topic, partition, self.shards())
    }

    pub fn is_local(&self, topic: &str, partition: u32) -> bool {
        self.owner_of(topic, partition) == self.me
    }

    /// Sends a request to shard `to` and waits for its answer, at most
    /// `timeout` when one is given. A stopped peer answers 503 `stopping`.
    pub async fn call<T>(
        &self,
        to: usize,
        timeout: Option<Duration>,
        make: impl FnOnce(Reply<T>) -> ShardMsg,
    ) -> Result<T, ApiError> {
        let sender = self
            .senders
            .get(to)
            .and_then(Option::as_ref)
            .ok_or_else(|| ApiError::new(ErrorCode::Internal, format!("no shard {to}")))?;
        let (reply, answer) = oneshot::channel();
        if sender.send(make(reply)).await.is_err() {
            return Err(peer_gone());
        }
        match timeout {
            None => answer.await.map_err(|_| peer_gone()),
            Some(timeout) => {
                let timed = async {
                    glommio::timer::sleep(timeout).await;
                    None
                };
                match futures_lite::future::or(async { Some(answer.await) }, timed).await {
                    Some(answer) => answer.map_err(|_| peer_gone()),
                    None => Err(ApiError::new(
                        ErrorCode::Internal,
                        format!("shard {to} did not answer within {timeout:?}"),
                    )),
                }
            }
        }
    }

    /// Tells every other shard that messages became available here. A full
    /// channel already holds a wake-up for that shard, so none is lost.
    pub fn announce_available(&self) {
        for sender in self.senders.iter().flatten() {
            let _ = sender.try_send(ShardMsg::Available);
        }
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
