//! Readiness and the figures `/metrics` and `/readyz` gather from every shard.

use super::*;
use crate::limits::READINESS_CALL_TIMEOUT;

/// Whether a member of the cluster is ready, as `GET /v1/cluster` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberReadiness {
    Ready,
    /// The member said why it is not (its `/readyz` error).
    NotReady(ApiError),
    /// The member could not be asked: known dead, or no answer in time.
    Unreachable(String),
}

impl<F: FileSystem> Shard<F> {
    /// Why the node is not ready, if it is not: stopping, any shard's WAL
    /// failed, or no Raft leader.
    pub async fn not_ready(&self) -> Option<ApiError> {
        if self.flow.stopping.get() {
            return Some(ApiError::new(ErrorCode::Stopping, "the node is stopping"));
        }
        for gauges in self.gauges().await {
            if let Some(reason) = gauges.wal_failure {
                return Some(ApiError::new(
                    ErrorCode::WalFailed,
                    format!("the ingress WAL of shard {} failed: {reason}", gauges.shard),
                ));
            }
            if let Some(reason) = gauges.ack_state_failure {
                return Some(ApiError::new(
                    ErrorCode::AckStateFailed,
                    format!(
                        "the ack state of a partition of shard {} failed: {reason}",
                        gauges.shard
                    ),
                ));
            }
        }
        if let Some(reason) = self.env.meta.failed() {
            return Some(ApiError::new(
                ErrorCode::Internal,
                format!("this node's metastore stopped ({reason}); restart the node"),
            ));
        }
        if self.env.meta.leader().is_none() {
            return Some(ApiError::new(
                ErrorCode::NoLeader,
                "the node has no Raft leader",
            ));
        }
        if !self.env.meta.caught_up() {
            return Some(ApiError::new(
                ErrorCode::CatchingUp,
                "the node has not yet applied the metadata the cluster committed",
            ));
        }
        None
    }

    /// Whether each of `members` is ready: this node's own answer, and the
    /// others asked at once, each within [`READINESS_CALL_TIMEOUT`]. A member
    /// the controller marked dead, or that did not answer lately, is not
    /// asked (a partitioned node would otherwise cost every call the wait).
    pub async fn readiness_of(&self, members: &[NodeId]) -> Vec<MemberReadiness> {
        futures_util::future::join_all(members.iter().map(|node| self.member_readiness(*node)))
            .await
    }

    async fn member_readiness(&self, node: NodeId) -> MemberReadiness {
        if node == self.me() {
            return match self.not_ready().await {
                None => MemberReadiness::Ready,
                Some(error) => MemberReadiness::NotReady(error),
            };
        }
        if self.is_dead(node) {
            return MemberReadiness::Unreachable(
                "the controller marked the node dead: its heartbeats stopped".to_string(),
            );
        }
        let peers = self.remote.peers.as_ref();
        if peers.is_some_and(|p| p.recently_unreachable(node, self.mono())) {
            return MemberReadiness::Unreachable(
                "the node did not answer this node lately".to_string(),
            );
        }
        match self
            .call(Address::Node(node), Ready, Some(READINESS_CALL_TIMEOUT))
            .await
        {
            Ok(Ok(())) => MemberReadiness::Ready,
            Ok(Err(error)) | Err(CallError::Refused(error)) => MemberReadiness::NotReady(error),
            Err(CallError::Unreachable(reason)) => {
                if let Some(peers) = peers {
                    peers.unreachable(node, self.mono());
                }
                MemberReadiness::Unreachable(format!(
                    "the node could not be asked (waiting at most {} ms): {reason}",
                    READINESS_CALL_TIMEOUT.as_millis()
                ))
            }
        }
    }

    /// This shard's figures.
    pub fn local_gauges(&self) -> ShardGauges {
        let now = self.now();
        let partitions = self
            .owners_snapshot()
            .into_iter()
            .filter_map(|((topic, _, partition), slot)| match slot {
                OwnerSlot::Ready(owner) => Some((topic, partition, owner.stats(now))),
                OwnerSlot::Opening => None,
            })
            .collect();
        ShardGauges {
            shard: u32::from(self.identity.shard_id),
            wal_used_bytes: self.wal.stats().used_bytes,
            wal_keys_forgotten: self.wal.stats().keys_forgotten,
            owner_keys_forgotten: self.flow.owner_keys_forgotten.get(),
            wal_failure: self.wal.failure().map(|f| f.to_string()),
            ack_state_failure: self
                .open_owners()
                .iter()
                .find_map(|owner| owner.ack_state_failure()),
            dispatcher_pending: self.dispatcher_pending() as u64,
            partitions,
            copies: self.copy_figures(None),
            remote_headroom: self.remote_headroom(),
        }
    }

    /// Every shard's figures (a shard that does not answer in time is left
    /// out and logged).
    pub async fn gauges(&self) -> Vec<ShardGauges> {
        let mut all = vec![self.local_gauges()];
        for shard in (0..usize::from(self.identity.shards)).filter(|s| *s != self.shard_index()) {
            match self
                .call(Address::Shard(shard), Gauges, Some(GAUGES_TIMEOUT))
                .await
            {
                Ok(gauges) => all.push(gauges),
                Err(error) => tracing::warn!(shard, ?error, "no figures from a shard"),
            }
        }
        all.sort_by_key(|g| g.shard);
        all
    }
}
