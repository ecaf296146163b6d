//! One scatter-gather over the transport. An operation over several
//! partitions of a topic (a consume's collect, the figures of `stats`) is
//! split here into the parts it asks, in the order it asks them: this
//! node's shards, then other nodes, each within the operation's reach; and
//! another node's answer is taken here, so a node that refuses or does not
//! answer is handled the same way by every fan-out.

use super::*;

/// The parts of a fan-out over some partitions of a topic.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Fanout {
    /// This node's shards within the reach (this one among them), each
    /// with its partitions.
    pub shards: Vec<(usize, Vec<u32>)>,
    /// Other nodes within the reach that are alive and answered lately,
    /// each with its partitions.
    pub nodes: Vec<(NodeId, Vec<u32>)>,
    /// Other nodes within the reach that own some of the partitions,
    /// whether or not they are asked.
    pub other_nodes: usize,
}

impl<F: FileSystem> Shard<F> {
    /// Splits `partitions` of `topic` (any past the topic's count left out)
    /// into a fan-out's parts within `reach` ([`Placement::fan_out`]),
    /// leaving out nodes known dead or skipped for a while since they last
    /// did not answer.
    pub(super) fn fan_out(
        &self,
        topic: &Topic,
        partitions: &[u32],
        reach: Reach,
        rotation: u32,
    ) -> Fanout {
        let count = topic.config.partitions;
        let (shards, others) = self.placement(topic).fan_out(
            partitions.iter().copied().filter(|p| *p < count),
            reach,
            rotation,
        );
        let other_nodes = others.len();
        let now = self.mono();
        let skipped = |node: NodeId| {
            self.is_dead(node)
                || self
                    .remote
                    .peers
                    .as_ref()
                    .is_some_and(|p| p.recently_unreachable(node, now))
        };
        let nodes = others
            .into_iter()
            .filter(|(node, _)| !skipped(*node))
            .collect();
        Fanout {
            shards,
            nodes,
            other_nodes,
        }
    }

    /// Asks another node within `timeout`: its answer, or `None` when it
    /// refused (logged) or did not answer (logged, and the node is skipped
    /// for a while: see [`Self::fan_out`]). `what` names the fan-out.
    pub(super) async fn ask_node<O, T>(
        &self,
        node: NodeId,
        op: O,
        timeout: Duration,
        what: &'static str,
    ) -> Option<T>
    where
        O: Operation<Reply = Result<T, ApiError>>,
    {
        match self.call(Address::Node(node), op, Some(timeout)).await {
            Ok(Ok(answer)) => Some(answer),
            Ok(Err(error)) | Err(CallError::Refused(error)) => {
                tracing::debug!(node, %error, what, "a node refused");
                None
            }
            Err(CallError::Unreachable(reason)) => {
                tracing::debug!(
                    node,
                    reason,
                    what,
                    "a node did not answer; skipping it for a while"
                );
                if let Some(peers) = &self.remote.peers {
                    peers.unreachable(node, self.mono());
                }
                None
            }
        }
    }
}
