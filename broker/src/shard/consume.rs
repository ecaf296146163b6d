//! Consume: leases from this shard's partitions, then other shards', then
//! other nodes', with long polls; lease sweeps, retention and dead letters.

use super::*;
use crate::metric_names::{
    CONSUME_EMPTY_WAKES_TOTAL, CONSUME_LONG_POLLS_WAITING, DEAD_LETTERED_TOTAL,
};
use crate::wakeups::Woken;

impl<F: FileSystem> Shard<F> {
    /// Refuses a consume the topic cannot serve (a pinned partition beyond
    /// its count) before anything is done for it.
    pub fn check_consume(&self, topic: &Topic, request: &ConsumeRequest) -> Result<(), ApiError> {
        match request.partition {
            Some(partition) if partition >= topic.config.partitions => Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "partition must be from 0 to {}, got {partition}",
                    topic.config.partitions - 1
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Long-polls for up to `max_messages` messages of a topic.
    pub async fn consume(
        &self,
        topic: &Topic,
        request: ConsumeRequest,
    ) -> Result<Vec<ConsumedMessage>, ApiError> {
        self.consume_from(topic, request, None).await
    }

    /// [`Shard::consume`], from these partitions only (`None`: all, or the
    /// request's pinned one): a Kafka share session takes the partitions
    /// its client asked this node for.
    pub async fn consume_from(
        &self,
        topic: &Topic,
        request: ConsumeRequest,
        only: Option<&[u32]>,
    ) -> Result<Vec<ConsumedMessage>, ApiError> {
        self.check_consume(topic, &request)?;
        let visibility = request
            .visibility_timeout_ms
            .unwrap_or(topic.config.visibility_timeout_ms);
        let deadline = self.mono() + request.wait_ms;
        let room = request.max_messages;
        let name: &str = &topic.name;
        // The wake-up that started this round, if any: it is finished (or,
        // dropped with the request, passed on) once the round is done.
        let mut woken: Option<Woken<'_>> = None;
        loop {
            let seen = self.flow.polls.version(name);
            // Each round asks the owners as they are now: a partition may
            // have moved since the poll began.
            let current = self
                .topic(&topic.name)
                .ok()
                .filter(|t| t.incarnation == topic.incarnation);
            let topic = current.as_deref().unwrap_or(topic);
            let got = self
                .collect_for_client(topic, request, visibility, only)
                .await?;
            if let Some(woken) = woken.take() {
                if got.is_empty() {
                    metrics::counter!(CONSUME_EMPTY_WAKES_TOTAL).increment(1);
                }
                woken.finish(got.len());
            }
            let now = self.mono();
            if !got.is_empty() || now >= deadline || self.flow.stopping.get() {
                return Ok(got);
            }
            let wait = Duration::from_millis(deadline - now);
            let _parked = LongPollGauge::park();
            woken = futures_lite::future::or(
                async { Some(self.flow.polls.wait(name, room, seen).await) },
                async {
                    self.env.runtime.sleep(wait).await;
                    None
                },
            )
            .await;
        }
    }

    /// One round of a client's consume: every partition from a rotating
    /// start, or the pinned one. A pinned partition of another node is
    /// asked directly: 502 if its owner does not answer, 503 once the owner
    /// is marked dead.
    pub(super) async fn collect_for_client(
        &self,
        topic: &Topic,
        request: ConsumeRequest,
        visibility_ms: u64,
        only: Option<&[u32]>,
    ) -> Collected {
        let rotation = self.next_turn();
        let partitions = match only {
            Some(only) => rotated(
                only.iter()
                    .copied()
                    .filter(|p| *p < topic.config.partitions)
                    .collect(),
                rotation,
            ),
            None => consume_order(topic.config.partitions, rotation, request.partition),
        };
        let op = Collect {
            topic: TopicRef::of(topic),
            partitions,
            max: request.max_messages,
            visibility_ms,
        };
        if let Some(partition) = request.partition {
            if let Location::Node(node) = self.route(topic, partition, Reach::Cluster)? {
                let to = Address::Node(node);
                return self
                    .call(to, op, Some(COLLECT_CALL_TIMEOUT))
                    .await
                    .map_err(|e| e.to_api(to))?;
            }
        }
        self.collect(topic, op, Reach::Cluster, rotation).await
    }

    /// Leases up to `op.max` messages from the partitions of `op` within
    /// `reach`: this node's first (going round its shards from a rotating
    /// start), then other nodes' that may have messages, from a rotating
    /// start too, so no partition starves (`rotation` is the round's turn).
    /// A shard or node that fails leaves its partitions out when others
    /// answered.
    pub(super) async fn collect(
        &self,
        topic: &Topic,
        op: Collect,
        reach: Reach,
        rotation: u32,
    ) -> Collected {
        let count = topic.config.partitions;
        let fanout = self.fan_out(topic, &op.partitions, reach, rotation);
        let max = op.max as usize;
        let mut out = Vec::new();
        for (shard, partitions) in fanout.shards {
            let room = max - out.len();
            if room == 0 {
                break;
            }
            let got = if shard == self.shard_index() {
                self.collect_here(topic, &partitions, room, op.visibility_ms)
                    .await
            } else {
                // Asked for every partition there: what it answers says
                // whether it has anything of the topic at all.
                let whole = op.partitions.len() >= count as usize;
                let polls = &self.flow.polls;
                if whole && polls.known_empty(&topic.name, shard) {
                    continue;
                }
                let asked_at = polls.asking(&topic.name, shard);
                let to = Address::Shard(shard);
                let part = Collect {
                    topic: op.topic.clone(),
                    partitions,
                    max: u32::try_from(room).unwrap_or(u32::MAX),
                    visibility_ms: op.visibility_ms,
                };
                let got = self
                    .call(to, part, None)
                    .await
                    .map_err(|e| e.to_api(to))
                    .and_then(|got| got);
                if whole && matches!(&got, Ok(got) if got.is_empty()) {
                    polls.found_empty(&topic.name, shard, asked_at);
                }
                got
            };
            match got {
                Ok(got) => out.extend(got),
                // Messages already leased go back to the client; the failed
                // shard's are simply not leased.
                Err(error) if !out.is_empty() => {
                    tracing::warn!(shard, %error, "consume: a shard failed; answering with what others gave");
                    break;
                }
                Err(error) if fanout.other_nodes == 0 => return Err(error),
                Err(error) => {
                    tracing::warn!(%error, "consume: this node's partitions failed; asking the others");
                    break;
                }
            }
        }
        let Some(peers) = self.remote.peers.clone() else {
            return Ok(out);
        };
        for (node, partitions) in fanout.nodes {
            let room = max - out.len();
            if room == 0 {
                break;
            }
            let asked_at = self.mono();
            if !peers.worth_asking(node, &topic.name, asked_at) {
                continue;
            }
            let timeout = if out.is_empty() {
                COLLECT_CALL_TIMEOUT
            } else {
                COLLECT_TOP_UP_TIMEOUT
            };
            let part = Collect {
                topic: op.topic.clone(),
                partitions,
                max: u32::try_from(room).unwrap_or(u32::MAX),
                visibility_ms: op.visibility_ms,
            };
            match self.ask_node(node, part, timeout, "consume").await {
                Some(got) if got.is_empty() => peers.found_empty(node, &topic.name, asked_at),
                Some(got) => {
                    peers.found_messages(node, &topic.name);
                    out.extend(got);
                }
                None => {}
            }
        }
        Ok(out)
    }

    /// Leases up to `max` messages from partitions of this shard.
    pub(super) async fn collect_here(
        &self,
        topic: &Topic,
        partitions: &[u32],
        max: usize,
        visibility: u64,
    ) -> Collected {
        let mut out = Vec::new();
        for &partition in partitions {
            if out.len() >= max {
                break;
            }
            // Being handed over, or moved away since the consume was
            // routed: its messages come from the new owner.
            if self.is_frozen(topic, partition) || !self.serves(topic, partition) {
                continue;
            }
            let owner = self.owner(topic, partition).await?;
            self.sweep_owner(&topic.name, &owner);
            let now = self.now();
            let deliveries = owner
                .consume(max - out.len(), visibility, now)
                .await
                .map_err(|e| from_owner(&e))?;
            for delivery in deliveries {
                let receipt = Receipt {
                    topic: topic.name.clone(),
                    partition,
                    offset: delivery.offset,
                    lease_id: delivery.lease.lease_id,
                    owner_epoch: self.identity.incarnation,
                }
                .encode(&self.env.receipt_key);
                out.push(ConsumedMessage {
                    id: delivery.message.id,
                    partition,
                    offset: delivery.offset,
                    key: delivery.message.key.clone(),
                    value: delivery.message.value.clone(),
                    receipt,
                    delivery_count: delivery.lease.delivery_count,
                    produced_at_ms: delivery.message.produced_at_ms,
                    lease_expires_at_ms: now.wall_of(delivery.lease.expires_at_ms),
                });
            }
        }
        Ok(out)
    }

    /// Ends expired leases of one partition; messages out of deliveries are
    /// queued for the dead-letter mover. Synchronous: a consume dropped here
    /// leaves nothing half done.
    pub(super) fn sweep_owner(&self, topic: &str, owner: &Owner<F>) {
        let sweep = owner.sweep(self.now());
        // Only a sweep that ended leases changes availability; notifying on
        // every sweep would wake a long poll with its own sweep, and the
        // poll would spin without yielding the shard.
        if sweep.ended > 0 {
            self.announce_available(topic, count_of(sweep.ended));
        }
        // Also a move that failed to read its message: tried again each sweep.
        if sweep.dead > 0 || owner.has_dead_letters() {
            self.flow.dead_letters_due.notify();
        }
    }

    /// The dead-letter mover: a task of its own (never a request's future),
    /// so a client that goes away cannot leave a message parked. Each
    /// message is written durably to the dead-letter topic, then settled
    /// in its partition; a move cut short is done again (at least once).
    pub async fn run_dead_letters(self: Rc<Self>) {
        loop {
            let seen = self.flow.dead_letters_due.version();
            for (key, slot) in self.owners_snapshot() {
                let OwnerSlot::Ready(owner) = slot else {
                    continue;
                };
                if !owner.has_dead_letters() {
                    continue;
                }
                let Some(topic) = self.topic(&key.0).ok().filter(|t| t.incarnation == key.1) else {
                    continue;
                };
                self.move_dead_letters(&topic, &owner).await;
            }
            if self.flow.stopping.get() {
                return;
            }
            self.flow.dead_letters_due.changed(seen).await;
        }
    }

    pub(super) async fn move_dead_letters(&self, topic: &Topic, owner: &Owner<F>) {
        loop {
            let letter = match owner.next_dead_letter().await {
                Ok(Some(letter)) => letter,
                Ok(None) => return,
                Err(error) => {
                    tracing::warn!(topic = %topic.name, %error, "reading a message for the dead-letter topic failed");
                    return;
                }
            };
            let mut moved = self
                .dead_letter(topic, std::slice::from_ref(&letter.message))
                .await;
            // A full ring frees as the dispatcher commits: the message waits,
            // parked, rather than being delivered past its max_deliveries.
            while moved
                .as_ref()
                .is_err_and(|e| e.code == ErrorCode::Overloaded)
                && !self.flow.stopping.get()
            {
                self.env.runtime.sleep(DEAD_LETTER_FULL_RETRY).await;
                moved = self
                    .dead_letter(topic, std::slice::from_ref(&letter.message))
                    .await;
            }
            match moved {
                Ok(()) => {
                    metrics::counter!(DEAD_LETTERED_TOTAL, "topic" => topic.name.clone())
                        .increment(1);
                    owner.dead_lettered(letter.offset, self.now());
                }
                Err(error) => {
                    tracing::warn!(topic = %topic.name, offset = letter.offset, %error, "dead-lettering failed; delivering again");
                    owner.dead_letter_failed(letter.offset);
                    self.announce_available(&topic.name, 1);
                }
            }
        }
    }

    /// Writes messages durably to the topic's dead-letter topic (same ids,
    /// keys and values) through this shard's WAL.
    pub async fn dead_letter(&self, topic: &Topic, messages: &[Message]) -> Result<(), ApiError> {
        let dlq_name = topic
            .config
            .dead_letter_topic
            .as_deref()
            .ok_or_else(|| ApiError::new(ErrorCode::Internal, "no dead-letter topic"))?;
        let dlq = self.topic(dlq_name)?;
        self.write_durably(&dlq, messages).await
    }

    /// Writes messages (same ids, keys and values) to `topic` through this
    /// shard's WAL, as a produce does: Ok once the WAL holds them durably,
    /// after which they reach their partitions whatever happens to the
    /// caller.
    pub(super) async fn write_durably(
        &self,
        topic: &Topic,
        messages: &[Message],
    ) -> Result<(), ApiError> {
        let placed = messages
            .iter()
            .map(|m| Placed {
                partition: self.pick_partition(topic, m.key.as_deref()),
                id: m.id,
                key: m.key.clone(),
                value: m.value.clone(),
                idempotency: None,
            })
            .collect();
        self.write_through_wal(topic, placed).await
    }

    /// Sweeps every open partition (the periodic lease sweep).
    pub async fn sweep_all(&self) {
        for topic in self.topics() {
            for (key, slot) in self.owners_snapshot() {
                if key.0 == topic.name && key.1 == topic.incarnation {
                    if let OwnerSlot::Ready(owner) = slot {
                        self.sweep_owner(&topic.name, &owner);
                    }
                }
            }
        }
    }

    /// The open partitions in key order, not the map's: what is done to
    /// each (ack writes, dead-letter moves) happens in this order.
    pub(super) fn owners_snapshot(&self) -> Vec<(OwnerKey, OwnerSlot<F>)> {
        let mut open: Vec<(OwnerKey, OwnerSlot<F>)> = self
            .owners
            .slots
            .borrow()
            .iter()
            .filter_map(|(k, slot)| match slot {
                OwnerSlot::Ready(owner) => Some((k.clone(), OwnerSlot::Ready(owner.clone()))),
                OwnerSlot::Opening => None,
            })
            .collect();
        open.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
        open
    }

    /// Opens every partition this shard owns that is not open yet, so that
    /// retention (applied by [`Self::retain_all`] to open partitions) also
    /// ages out partitions nobody produced to or consumed from since the
    /// node started. Runs every [`IDLE_PARTITION_OPEN_INTERVAL`].
    pub async fn open_idle_partitions(&self) {
        if !self.env.meta.caught_up() {
            return;
        }
        for topic in self.topics() {
            if topic.config.retention_ms == 0 {
                continue;
            }
            for partition in 0..topic.config.partitions {
                let local = self.owner_node(&topic, partition) == self.me()
                    && self.placement(&topic).shard_of(partition) == self.shard_index();
                let key = (topic.name.clone(), topic.incarnation, partition);
                if !local || self.owners.slots.borrow().contains_key(&key) {
                    continue;
                }
                if let Err(error) = self.owner(&topic, partition).await {
                    tracing::warn!(topic = %topic.name, partition, %error, "could not open a partition for retention");
                }
            }
        }
    }

    /// Sends the new acks of every open partition on their way to the OS
    /// (and syncs those due), each partition on a task of its own: a slow
    /// sync of one holds up no other, so an ack reaches the OS within about
    /// one `storage.ack_flush_interval_ms` however many partitions the
    /// shard has. Retention is not on this path ([`Self::retain_all`]).
    pub fn persist_acks_all(&self) {
        for owner in self.open_owners() {
            if !owner.acks_waiting() {
                continue;
            }
            self.env.runtime.spawn(Box::pin(async move {
                if let Err(error) = owner.persist_acks().await {
                    tracing::warn!(%error, "writing acks failed");
                }
            }));
        }
    }

    /// Applies retention to every open partition.
    pub async fn retain_all(&self) {
        for owner in self.open_owners() {
            if let Err(error) = owner.apply_retention().await {
                tracing::warn!(%error, "applying retention failed");
            }
        }
    }
}

/// Counts long polls parked waiting for messages
/// (`narad_consume_long_polls_waiting`), also when the client goes away.
struct LongPollGauge;

impl LongPollGauge {
    fn park() -> Self {
        metrics::gauge!(CONSUME_LONG_POLLS_WAITING).increment(1.0);
        Self
    }
}

impl Drop for LongPollGauge {
    fn drop(&mut self) {
        metrics::gauge!(CONSUME_LONG_POLLS_WAITING).decrement(1.0);
    }
}
