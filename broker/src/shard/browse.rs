//! Browse and search: a page of one partition's messages, or the messages
//! of a topic with a key or some text, read at their owners with each
//! message's state and delivery count. Nothing here leases, acks, nacks or
//! counts a delivery: neither changes any message's state.

use narad_net::types::{BrowsePage, BrowsedMessage, MessageState};
use narad_storage::log::StoredMessage;

use super::*;
use crate::limits::{
    BROWSE_BYTES_MAX, BROWSE_CALL_TIMEOUT, SEARCH_CALL_TIMEOUT, SEARCH_SCAN_BYTES_MAX,
    SEARCH_SCAN_MAX,
};
use crate::owner::ScanLimits;

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
            .map(|found| browsed(op.partition, found))
            .collect();
        Ok(BrowsePage {
            messages,
            next_offset,
            frontier,
            high_watermark,
        })
    }

    /// Searches every partition of `topic` from `at` (each partition's next
    /// offset to look at, `None` once searched to its end) for messages
    /// whose key is `key` and whose key or value contains `contains` (each
    /// when given), up to `limit` matches: the matches, in partition order,
    /// and where the search stands after (all `None`: every retained
    /// message was searched). Each partition's scan looks at no more than
    /// `SEARCH_SCAN_MAX` messages per call.
    pub async fn search(
        &self,
        topic: &Topic,
        key: Option<Vec<u8>>,
        contains: Option<Vec<u8>>,
        at: &[Option<u64>],
        limit: u32,
    ) -> Result<(Vec<BrowsedMessage>, Vec<Option<u64>>), ApiError> {
        let op = Search {
            topic: TopicRef::of(topic),
            from: (0..topic.config.partitions)
                .zip(at)
                .filter_map(|(p, from)| from.map(|from| (p, from)))
                .collect(),
            key,
            contains,
            limit,
        };
        let page = self.search_within(topic, op, Reach::Cluster).await?;
        let mut after = at.to_vec();
        for (partition, next) in page.next {
            if let Some(slot) = usize::try_from(partition)
                .ok()
                .and_then(|p| after.get_mut(p))
            {
                *slot = next;
            }
        }
        let mut messages = page.messages;
        messages.sort_by_key(|m| (m.partition, m.offset));
        Ok((messages, after))
    }

    /// Searches `op.from`'s partitions, in that order, at their owners
    /// within `reach`, until `op.limit` matches. A partition whose owner's
    /// node does not answer makes the search 502 (503 once marked dead):
    /// a search that skipped it would say it had looked.
    pub(super) async fn search_within(&self, topic: &Topic, op: Search, reach: Reach) -> Searched {
        let mut groups: Vec<(Location, Vec<(u32, u64)>)> = Vec::new();
        for &(partition, from) in &op.from {
            let location = self.route(topic, partition, reach)?;
            match groups.iter_mut().find(|(l, _)| *l == location) {
                Some((_, group)) => group.push((partition, from)),
                None => groups.push((location, vec![(partition, from)])),
            }
        }
        let mut page = SearchPage::default();
        for (location, from) in groups {
            let left = op.limit.saturating_sub(count_of(page.messages.len()));
            if left == 0 {
                // Not searched this time: they go on from where they were.
                page.next
                    .extend(from.into_iter().map(|(p, o)| (p, Some(o))));
                continue;
            }
            let part = Search {
                topic: op.topic.clone(),
                from,
                key: op.key.clone(),
                contains: op.contains.clone(),
                limit: left,
            };
            let found = match location {
                Location::Here => self.search_here(topic, part).await?,
                Location::Shard(shard) => {
                    let to = Address::Shard(shard);
                    self.call(to, part, None)
                        .await
                        .map_err(|e| e.to_api(to))??
                }
                Location::Node(node) => {
                    let to = Address::Node(node);
                    self.call(to, part, Some(SEARCH_CALL_TIMEOUT))
                        .await
                        .map_err(|e| e.to_api(to))??
                }
            };
            page.messages.extend(found.messages);
            page.next.extend(found.next);
        }
        Ok(page)
    }

    async fn search_here(&self, topic: &Topic, op: Search) -> Searched {
        let wanted = |message: &narad_storage::log::Message| {
            let key = message.key.as_deref();
            op.key.as_deref().is_none_or(|k| key == Some(k))
                && op.contains.as_deref().is_none_or(|text| {
                    key.is_some_and(|k| memchr::memmem::find(k, text).is_some())
                        || memchr::memmem::find(&message.value, text).is_some()
                })
        };
        let mut page = SearchPage::default();
        for (partition, from) in op.from {
            let left = usize::try_from(op.limit)
                .unwrap_or(usize::MAX)
                .saturating_sub(page.messages.len());
            if left == 0 {
                page.next.push((partition, Some(from)));
                continue;
            }
            let owner = self.owner(topic, partition).await?;
            let limits = ScanLimits {
                scan_max: SEARCH_SCAN_MAX,
                scan_bytes: SEARCH_SCAN_BYTES_MAX,
                found_max: left,
            };
            let (found, next) = owner
                .search(from, limits, wanted, self.now())
                .await
                .map_err(|e| from_owner(&e))?;
            page.messages
                .extend(found.into_iter().map(|found| browsed(partition, found)));
            page.next.push((partition, next));
        }
        Ok(page)
    }
}

/// A message of `partition` as a browse or a search shows it.
fn browsed(
    partition: u32,
    (stored, state, delivery_count): (StoredMessage, MessageState, u32),
) -> BrowsedMessage {
    BrowsedMessage {
        id: stored.message.id,
        partition,
        offset: stored.offset,
        key: stored.message.key,
        value: stored.message.value,
        produced_at_ms: stored.message.produced_at_ms,
        state,
        delivery_count,
    }
}
