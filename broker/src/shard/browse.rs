//! Browse: a page of one partition's messages, read at its owner with each
//! message's state and delivery count. Nothing here leases, acks, nacks or
//! counts a delivery: a browse changes no message's state.

use narad_net::types::{BrowsePage, BrowsedMessage};

use super::*;
use crate::limits::{BROWSE_BYTES_MAX, BROWSE_CALL_TIMEOUT};

impl<F: FileSystem> Shard<F> {
    /// A page of `partition` of `topic` from `from` on (`None`: its
    /// frontier; below the oldest retained message: from that one), at most
    /// `limit` messages, read at the partition's owner: 400 for a partition
    /// beyond the topic's, 502 when its owner's node does not answer, 503
    /// once it is marked dead.
    pub async fn browse(
        &self,
        topic: &Topic,
        partition: u32,
        from: Option<u64>,
        limit: u32,
    ) -> Browsed {
        if partition >= topic.config.partitions {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "partition must be from 0 to {}, got {partition}",
                    topic.config.partitions - 1
                ),
            ));
        }
        let op = Browse {
            topic: TopicRef::of(topic),
            partition,
            from,
            limit,
        };
        self.browse_within(topic, op, Reach::Cluster).await
    }

    /// Reads the page here, or asks the shard or node that owns the
    /// partition, within `reach`.
    pub(super) async fn browse_within(&self, topic: &Topic, op: Browse, reach: Reach) -> Browsed {
        let to = match self.route(topic, op.partition, reach)? {
            Location::Here => return self.browse_here(topic, &op).await,
            Location::Shard(shard) => Address::Shard(shard),
            Location::Node(node) => Address::Node(node),
        };
        let timeout = matches!(to, Address::Node(_)).then_some(BROWSE_CALL_TIMEOUT);
        self.call(to, op, timeout).await.map_err(|e| e.to_api(to))?
    }

    async fn browse_here(&self, topic: &Topic, op: &Browse) -> Browsed {
        let owner = self.owner(topic, op.partition).await?;
        let frontier = owner.frontier();
        let high_watermark = owner.high_watermark();
        let from = op
            .from
            .unwrap_or(frontier)
            .max(owner.log_start_offset())
            .min(high_watermark);
        let limit = usize::try_from(op.limit).unwrap_or(usize::MAX).max(1);
        let read = owner
            .browse(from, limit, BROWSE_BYTES_MAX, self.now())
            .await
            .map_err(|e| from_owner(&e))?;
        let next_offset = read.last().map_or(from, |(stored, _, _)| stored.offset + 1);
        let messages = read
            .into_iter()
            .map(|(stored, state, delivery_count)| BrowsedMessage {
                id: stored.message.id,
                partition: op.partition,
                offset: stored.offset,
                key: stored.message.key,
                value: stored.message.value,
                produced_at_ms: stored.message.produced_at_ms,
                state,
                delivery_count,
            })
            .collect();
        Ok(BrowsePage {
            messages,
            next_offset,
            frontier,
            high_watermark,
        })
    }
}
