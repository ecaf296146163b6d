//! The metastore as a shard sees it: one seam, so that the shard's logic
//! runs on openraft in a node ([`MetaNode`]) and on a deterministic
//! stand-in in a simulation.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use narad_raft::node::{MemberChange, MetaError, MetaFeed, MetaNode, MetaSnapshot};
use narad_raft::state::{Applied, Command, NodeId};
use narad_raft::store::MetaView;

/// A proposal under way.
pub type Proposal<'a> = Pin<Box<dyn Future<Output = Result<Applied, MetaError>> + 'a>>;

/// What a shard asks of the cluster's metadata.
pub trait Metastore {
    /// A reader's own copy of the applied state.
    fn snapshot(&self) -> MetaSnapshot;
    /// Every applied state, as it is applied.
    fn subscribe(&self) -> MetaFeed;
    /// The applied state now.
    fn view(&self) -> Arc<MetaView>;
    /// Whether this node applied what the cluster had committed when it
    /// started (before that, a missing topic may merely be unknown yet).
    fn caught_up(&self) -> bool;
    /// The leader, if one can commit.
    fn leader(&self) -> Option<NodeId>;
    /// Why this node's Raft stopped for good, if it did (a storage error):
    /// the node then serves no metadata until it is restarted.
    fn failed(&self) -> Option<String> {
        None
    }
    /// Whether this node is that leader.
    fn is_leader(&self) -> bool;
    fn term(&self) -> u64;
    /// The members, with their peer addresses.
    fn members(&self) -> Vec<(NodeId, String)>;
    /// Members that are learners: joining, not voting yet.
    fn learners(&self) -> Vec<NodeId>;
    /// Commits a command and answers once it is applied (at the leader).
    fn propose(&self, command: Command) -> Proposal<'_>;
    /// Admits or removes a node (at the leader).
    fn change_members(&self, change: MemberChange) -> Proposal<'_>;
}

impl Metastore for MetaNode {
    fn snapshot(&self) -> MetaSnapshot {
        MetaNode::snapshot(self)
    }

    fn subscribe(&self) -> MetaFeed {
        MetaNode::subscribe(self)
    }

    fn view(&self) -> Arc<MetaView> {
        MetaNode::view(self)
    }

    fn caught_up(&self) -> bool {
        MetaNode::caught_up(self)
    }

    fn leader(&self) -> Option<NodeId> {
        MetaNode::leader(self)
    }

    fn failed(&self) -> Option<String> {
        MetaNode::failed(self)
    }

    fn is_leader(&self) -> bool {
        MetaNode::is_leader(self)
    }

    fn term(&self) -> u64 {
        MetaNode::term(self)
    }

    fn members(&self) -> Vec<(NodeId, String)> {
        MetaNode::members(self)
    }

    fn learners(&self) -> Vec<NodeId> {
        MetaNode::learners(self)
    }

    fn propose(&self, command: Command) -> Proposal<'_> {
        Box::pin(MetaNode::propose(self, command))
    }

    fn change_members(&self, change: MemberChange) -> Proposal<'_> {
        Box::pin(MetaNode::change_members(self, change))
    }
}

impl<T: Metastore + ?Sized> Metastore for Arc<T> {
    fn snapshot(&self) -> MetaSnapshot {
        (**self).snapshot()
    }

    fn subscribe(&self) -> MetaFeed {
        (**self).subscribe()
    }

    fn view(&self) -> Arc<MetaView> {
        (**self).view()
    }

    fn caught_up(&self) -> bool {
        (**self).caught_up()
    }

    fn leader(&self) -> Option<NodeId> {
        (**self).leader()
    }

    fn failed(&self) -> Option<String> {
        (**self).failed()
    }

    fn is_leader(&self) -> bool {
        (**self).is_leader()
    }

    fn term(&self) -> u64 {
        (**self).term()
    }

    fn members(&self) -> Vec<(NodeId, String)> {
        (**self).members()
    }

    fn learners(&self) -> Vec<NodeId> {
        (**self).learners()
    }

    fn propose(&self, command: Command) -> Proposal<'_> {
        (**self).propose(command)
    }

    fn change_members(&self, change: MemberChange) -> Proposal<'_> {
        (**self).change_members(change)
    }
}
