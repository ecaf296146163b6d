//! Where the cluster's nodes stand: this node, the owner of a partition,
//! which nodes are alive, and calls to another node.

use super::*;

impl<F: FileSystem> Shard<F> {
    pub(super) fn me(&self) -> NodeId {
        NodeId::from(self.identity.node_id)
    }

    /// Where the topic's partitions live, as this shard sees them.
    pub(super) fn placement<'a>(&self, topic: &'a Topic) -> Placement<'a> {
        Placement {
            me: self.me(),
            shard: self.shard_index(),
            shards: usize::from(self.identity.shards),
            topic: &topic.name,
            owners: &topic.owners,
        }
    }

    /// The node that owns a partition (per the metastore).
    pub(super) fn owner_node(&self, topic: &Topic, partition: u32) -> NodeId {
        self.placement(topic).node_of(partition)
    }

    /// Whether the controller marked a node dead.
    pub(super) fn is_dead(&self, node: NodeId) -> bool {
        node != self.me()
            && self
                .view()
                .state
                .nodes
                .get(&node)
                .is_some_and(|record| !record.alive)
    }

    /// Every member of the cluster and whether this node's view of the
    /// controller's liveness holds it alive (this node always is).
    pub fn members_alive(&self) -> Vec<(NodeId, bool)> {
        let mut members: Vec<(NodeId, bool)> = self
            .env
            .meta
            .members()
            .into_iter()
            .map(|(node, _)| (node, !self.is_dead(node)))
            .collect();
        if !members.iter().any(|(node, _)| *node == self.me()) {
            members.push((self.me(), true));
        }
        members.sort_unstable();
        members
    }

    /// The nodes new partitions may go to: alive, not joining (a learner
    /// still catching up), not being decommissioned.
    pub(super) fn live_nodes(&self) -> Vec<NodeId> {
        let view = self.view();
        let learners = self.env.meta.learners();
        let mut nodes = vec![self.me()];
        if let Some(peers) = &self.remote.peers {
            nodes.extend(peers.others());
        }
        nodes.retain(|n| {
            !self.is_dead(*n) && !view.state.decommissioning(*n) && !learners.contains(n)
        });
        if nodes.is_empty() {
            // A node being decommissioned alone: it still takes topics.
            nodes.push(self.me());
        }
        nodes.sort_unstable();
        nodes
    }

    /// Follows nodes joining, moving and leaving: the peer table takes
    /// the metastore's node records.
    pub(super) fn learn_peers(&self) {
        let Some(peers) = &self.remote.peers else {
            return;
        };
        let view = self.view();
        let state = &view.state;
        peers.learn(
            state.nodes.iter().map(|(id, r)| (*id, r.addr.as_str())),
            state.removed_nodes.iter().copied(),
        );
    }

    pub(super) fn owner_dead(node: NodeId) -> ApiError {
        ApiError::new(
            ErrorCode::OwnerDead,
            format!("the partition's owner, node {node}, is marked dead; its messages wait for it"),
        )
    }
}
