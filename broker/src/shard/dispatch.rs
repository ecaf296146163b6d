//! The dispatcher's task: commit batches to their partition's owner (this
//! shard, another shard, another node), retry with backoff, reroute around an
//! owner that stays unreachable, and tell other nodes about new messages.

use super::*;
use crate::limits::REROUTE_LOG_INTERVAL_MS;
use crate::metric_names::{
    DISPATCHER_COMMIT_RECORDS, DISPATCHER_REROUTES_TOTAL, IDEMPOTENCY_KEYS_REROUTED_TOTAL,
    PRODUCE_DUPLICATES_TOTAL,
};

impl<F: FileSystem> Shard<F> {
    /// The dispatcher loop: sends ready batches, sleeps until the next
    /// deadline or a push.
    pub async fn run_dispatcher(self: Rc<Self>) {
        loop {
            let seen = self.dispatch.signal.version();
            let due = self.dispatch.queue.borrow().reroutes_due(self.mono());
            for destination in due {
                self.reroute(&destination);
            }
            let batches = self.dispatch.queue.borrow_mut().poll_ready(self.mono());
            for batch in batches {
                let shard = self.clone();
                self.env
                    .runtime
                    .spawn(Box::pin(async move { shard.commit_batch(batch).await }));
            }
            if self.flow.stopping.get() && self.undispatched() == 0 {
                return;
            }
            let deadline = self.dispatch.queue.borrow().next_deadline_ms(self.mono());
            let wait =
                deadline.map(|d| Duration::from_millis(d.saturating_sub(self.mono()).max(1)));
            match wait {
                Some(wait) => {
                    futures_lite::future::or(
                        self.dispatch.signal.changed(seen),
                        self.env.runtime.sleep(wait),
                    )
                    .await;
                }
                None => self.dispatch.signal.changed(seen).await,
            }
        }
    }

    /// Commits one batch to the shard and node that own its partition.
    /// When the owner is marked dead, or its commits have failed for
    /// `dispatcher.reroute_after_ms`, the records go to a live sibling
    /// partition instead (the loop above moves them); the WAL keeps them
    /// until some owner confirms. A probe (a batch without records) is an
    /// empty commit: its success ends the reroute.
    pub(super) async fn commit_batch(&self, batch: CommitBatch) {
        let topic = self
            .view()
            .state
            .topics
            .get(batch.destination.topic.as_ref())
            .cloned();
        let result = match topic {
            // A node that restarted without a quorum may not have applied
            // the topic yet: its records wait until the metadata is known.
            None | Some(_) if !self.env.meta.caught_up() && !self.knows(&batch) => {
                Err(ApiError::new(
                    ErrorCode::NoLeader,
                    "the metadata is not caught up; the records wait",
                ))
            }
            // The topic was deleted after the produce: nothing to deliver to.
            None => {
                tracing::debug!(topic = %batch.destination.topic, "commit: topic gone");
                Ok(())
            }
            Some(topic) if batch.destination.partition >= topic.config.partitions => {
                tracing::debug!("commit: partition gone");
                Ok(())
            }
            Some(topic) if batch.is_probe() => {
                let op = Commit {
                    topic: TopicRef::of(&topic),
                    partition: batch.destination.partition,
                    messages: Vec::new(),
                };
                self.commit(&topic, op.into(), Reach::Cluster).await
            }
            // Every record belongs to an earlier topic of this name, deleted
            // since: nothing to deliver to.
            Some(topic)
                if batch
                    .records
                    .iter()
                    .all(|r| !r.belongs_to(topic.incarnation)) =>
            {
                tracing::debug!(topic = %topic.name, "commit: records of a deleted incarnation");
                Ok(())
            }
            Some(topic) => {
                let records = batch
                    .records
                    .iter()
                    .filter(|r| r.belongs_to(topic.incarnation));
                let mut keys = Vec::new();
                let mut messages = Vec::new();
                for (index, r) in records.enumerate() {
                    if let Some(key) = &r.idempotency_key {
                        keys.push(KeyAt {
                            index: u32::try_from(index).unwrap_or(u32::MAX),
                            key: key.clone(),
                        });
                    }
                    messages.push(Record {
                        id: r.id,
                        produced_at_ms: r.accept_ms,
                        key: r.key.clone(),
                        value: r.value.clone(),
                    });
                }
                let op = KeyedCommit {
                    commit: Commit {
                        topic: TopicRef::of(&topic),
                        partition: batch.destination.partition,
                        messages,
                    },
                    keys,
                };
                self.commit(&topic, op, Reach::Cluster).await
            }
        };
        match result {
            Ok(()) => {
                metrics::histogram!(DISPATCHER_COMMIT_RECORDS).record(batch.records.len() as f64);
                let positions = self
                    .dispatch
                    .queue
                    .borrow_mut()
                    .on_committed(batch.batch_id, self.mono());
                for pos in positions {
                    self.wal.mark_committed(pos);
                }
            }
            Err(error) => {
                let owner_dead = error.code == ErrorCode::OwnerDead;
                let moved = error.code == ErrorCode::PartitionMoving;
                if !owner_dead && !moved && !batch.is_probe() {
                    tracing::warn!(topic = %batch.destination.topic, partition = batch.destination.partition, %error, "commit failed; will retry");
                }
                let mut queue = self.dispatch.queue.borrow_mut();
                let outcome = if moved {
                    queue.on_moved(batch.batch_id, self.mono())
                } else if owner_dead {
                    queue.on_owner_dead(batch.batch_id, self.mono())
                } else {
                    queue.on_failed(batch.batch_id, self.mono())
                };
                drop(queue);
                if matches!(outcome, Some(FailureOutcome::RerouteDue { .. })) {
                    self.reroute(&batch.destination);
                }
            }
        }
        self.dispatch.signal.notify();
    }

    /// Whether the metadata this node holds knows the batch's destination.
    pub(super) fn knows(&self, batch: &CommitBatch) -> bool {
        self.view()
            .state
            .topics
            .get(batch.destination.topic.as_ref())
            .is_some_and(|t| batch.destination.partition < t.config.partitions)
    }

    /// Moves the records waiting for a destination whose owner is dead or
    /// keeps failing to a sibling partition of the same topic: one of this
    /// node's if it has any, else one whose owner is alive. With no such
    /// sibling they keep waiting for their owner.
    pub(super) fn reroute(&self, from: &Destination) {
        let Ok(topic) = self.topic(&from.topic) else {
            return;
        };
        let placement = self.placement(&topic);
        let failing = placement.node_of(from.partition);
        let turn = self.flow.round_robin.get().wrapping_add(1);
        let now = self.mono();
        let rerouting = |partition| {
            let sibling = Destination {
                topic: from.topic.clone(),
                partition,
            };
            self.dispatch.queue.borrow().is_rerouting(&sibling, now)
        };
        let Some(sibling) = reroute_target(
            &placement,
            topic.config.partitions,
            from.partition,
            |node| self.is_dead(node),
            rerouting,
            turn,
        ) else {
            return;
        };
        self.flow.round_robin.set(turn);
        let records = self.dispatch.queue.borrow_mut().take_pending(from);
        if records.is_empty() {
            return;
        }
        let count = records.len();
        let keyed = records
            .iter()
            .filter(|r| r.idempotency_key.is_some())
            .count();
        if keyed > 0 {
            metrics::counter!(IDEMPOTENCY_KEYS_REROUTED_TOTAL, "topic" => from.topic.to_string())
                .increment(keyed as u64);
        }
        let to = Destination {
            topic: from.topic.clone(),
            partition: sibling,
        };
        let mut dispatcher = self.dispatch.queue.borrow_mut();
        for record in records {
            dispatcher.push(to.clone(), record, now);
        }
        drop(dispatcher);
        metrics::counter!(DISPATCHER_REROUTES_TOTAL).increment(count as u64);
        let mut log = self.dispatch.reroute_log.borrow_mut();
        let (logged_at, moved) = log.entry(from.clone()).or_insert((None, 0));
        *moved += count;
        if logged_at.is_none_or(|at| now.saturating_sub(at) >= REROUTE_LOG_INTERVAL_MS) {
            tracing::warn!(topic = %from.topic, partition = from.partition, owner = failing, to = sibling, records = *moved, "rerouted records around an unavailable owner");
            *logged_at = Some(now);
            *moved = 0;
        }
    }

    /// Appends a batch to its partition, at the shard and node that own it
    /// (within `reach`). Another node's commit is refused once this node
    /// stops, before it touches a log: the sender keeps the records and
    /// commits them again later, rather than a commit landing whose answer
    /// never leaves.
    pub(super) async fn commit(&self, topic: &Topic, op: KeyedCommit, reach: Reach) -> Committed {
        if reach == Reach::Node && self.flow.stopping.get() {
            return Err(ApiError::new(ErrorCode::Stopping, "the owner is stopping"));
        }
        let partition = op.commit.partition;
        match self.route(topic, partition, reach)? {
            Location::Here => self.commit_here(topic, partition, op.into_messages()).await,
            Location::Shard(shard) => {
                let to = Address::Shard(shard);
                self.call(to, op, None).await.map_err(|e| e.to_api(to))?
            }
            Location::Node(node) => {
                let to = Address::Node(node);
                let timeout = Some(COMMIT_CALL_TIMEOUT);
                if op.keys.is_empty() {
                    return self
                        .call(to, op.commit, timeout)
                        .await
                        .map_err(|e| e.to_api(to))?;
                }
                let plain = op.commit.clone();
                match self.call(to, op, timeout).await {
                    // A node of an earlier release does not know the
                    // kind (its refusal comes before any shard, as an
                    // internal error): it takes the plain commit.
                    Err(CallError::Refused(error)) if error.code == ErrorCode::Internal => self
                        .call(to, plain, timeout)
                        .await
                        .map_err(|e| e.to_api(to))?,
                    result => result.map_err(|e| e.to_api(to))?,
                }
            }
        }
    }

    /// Appends a batch to a partition of this shard and wakes long polls of
    /// its topic.
    pub(super) async fn commit_here(
        &self,
        topic: &Topic,
        partition: u32,
        messages: Vec<Message>,
    ) -> Result<(), ApiError> {
        let owner = self.owner(topic, partition).await?;
        // Taken and handed over with no await between: whichever commit
        // gets the append turn next recalls first.
        if let Some(since_ms) = self.env.recovered.take(&topic.name, partition) {
            owner.recall_before_next_append(since_ms);
        }
        let appended = loop {
            self.wait_unfrozen(topic, partition).await?;
            match owner.commit(&messages, self.now()).await {
                // Frozen after it looked: wait for the handover's outcome.
                Err(OwnerError::Frozen) => continue,
                result => break result.map_err(|e| from_owner(&e))?,
            }
        };
        let forgotten = owner.take_idempotency_keys_forgotten();
        let counted = &self.flow.owner_keys_forgotten;
        counted.set(counted.get() + forgotten);
        if appended.duplicates > 0 {
            metrics::counter!(PRODUCE_DUPLICATES_TOTAL, "topic" => topic.name.clone(), "at" => "owner")
                .increment(u64::from(appended.duplicates));
        }
        // A probe (no messages) makes nothing available.
        let stored = messages.len() - appended.duplicates as usize;
        if stored > 0 {
            self.announce_available(&topic.name, count_of(stored));
        }
        Ok(())
    }

    /// `count` messages of `topic` became available here: wake the long
    /// polls of that topic that cover them, first here, then what is left
    /// on the node's other shards, and tell the other nodes.
    /// [`EVERY_POLL`] when the count is not known.
    pub(super) fn announce_available(&self, topic: &str, count: u32) {
        let (left, asked) = self.flow.polls.gained(topic, count);
        if left > 0 || asked {
            self.wake_other_shards(topic, left);
        }
        if self.remote.peers.is_some() {
            add_gain(&mut self.remote.gained.borrow_mut(), topic, count);
            self.remote.notice.notify();
        }
    }

    /// Something changed for every long poll of this shard (a stop, the
    /// placement, another node's messages): each runs its round again.
    pub(super) fn wake_every_poll(&self) {
        self.flow.polls.wake_all();
    }

    /// Wakes every long poll of this node's other shards (another node's
    /// notice, which names no topic).
    pub(super) fn wake_other_shards_every_poll(&self) {
        self.flow.polls.forward_every_poll();
    }

    /// Sends a gain of `topic` to this node's other shards (through
    /// [`Self::forward_wakes`]).
    pub(super) fn wake_other_shards(&self, topic: &str, count: u32) {
        self.flow.polls.forward(topic, count);
    }

    /// Sends the wake-ups queued for the node's other shards (gains their
    /// polls here did not cover, wake-ups passed on), until the shard
    /// stops. Each waits for room in a full channel rather than being
    /// dropped; those queued meanwhile are added up by topic.
    pub async fn forward_wakes(self: Rc<Self>) {
        let polls = &self.flow.polls;
        let me = self.shard_index();
        let others: Vec<usize> = (0..usize::from(self.identity.shards))
            .filter(|s| *s != me)
            .collect();
        loop {
            let seen = polls.forward_due.version();
            let (all, gains) = polls.take_forward();
            for &shard in &others {
                let envelopes = all
                    .then(|| {
                        let (reply, _) = futures_channel::oneshot::channel();
                        Envelope::Available(Available { from: self.me() }, reply)
                    })
                    .into_iter()
                    .chain(gains.iter().map(|(topic, count)| {
                        let (reply, _) = futures_channel::oneshot::channel();
                        let op = Wake {
                            topic: topic.clone(),
                            shard: me as u32,
                            count: *count,
                        };
                        Envelope::Wake(op, reply)
                    }));
                for envelope in envelopes {
                    // A shard that stopped takes nothing: nobody waits there.
                    let _ = self
                        .links
                        .deliver(Address::Shard(shard), envelope, None)
                        .await;
                }
            }
            if self.flow.stopping.get() {
                return;
            }
            polls.forward_due.changed(seen).await;
        }
    }

    /// Tells the other nodes which topics gained messages on this shard
    /// (and how many), at most every `AVAILABLE_COALESCE`, so their long
    /// polls of those topics wake. At most one notice is in flight to each
    /// node; what is gained meanwhile waits for its answer and goes in the
    /// next, so a node that does not answer costs nothing but its own
    /// notices, and none is skipped.
    pub async fn notify_peers(self: Rc<Self>) {
        let Some(peers) = self.remote.peers.clone() else {
            return;
        };
        let owed: Rc<RefCell<HashMap<NodeId, Owed>>> = Rc::default();
        let mut seen = self.remote.notice.version();
        loop {
            self.remote.notice.changed(seen).await;
            seen = self.remote.notice.version();
            let gained = std::mem::take(&mut *self.remote.gained.borrow_mut());
            for node in peers.others() {
                if self.is_dead(node) {
                    continue;
                }
                let start = {
                    let mut owed = owed.borrow_mut();
                    let entry = owed.entry(node).or_default();
                    entry.add(&gained);
                    !std::mem::replace(&mut entry.sending, true)
                };
                if start {
                    let shard = self.clone();
                    let owed = owed.clone();
                    let from = peers.me();
                    self.env.runtime.spawn(Box::pin(async move {
                        shard.send_notices(node, from, &owed).await;
                    }));
                }
            }
            self.env.runtime.sleep(AVAILABLE_COALESCE).await;
        }
    }

    /// Sends node `node` what it is owed until nothing is left, one notice
    /// at a time and at most one every `AVAILABLE_COALESCE`: the topics by
    /// name, or (past [`GAINED_TOPICS_MAX`], or to a node of an earlier
    /// release, which refuses [`Gained`]) a notice that wakes every poll.
    async fn send_notices(
        &self,
        node: NodeId,
        from: NodeId,
        owed: &RefCell<HashMap<NodeId, Owed>>,
    ) {
        let to = Address::Node(node);
        loop {
            let (topics, every_poll) = {
                let mut owed = owed.borrow_mut();
                let entry = owed.entry(node).or_default();
                if entry.topics.is_empty() && !entry.every_poll {
                    entry.sending = false;
                    return;
                }
                (
                    std::mem::take(&mut entry.topics),
                    std::mem::take(&mut entry.every_poll),
                )
            };
            let every = Available { from };
            let result = if every_poll {
                self.call(to, every, Some(AVAILABLE_CALL_TIMEOUT)).await
            } else {
                let op = Gained {
                    from,
                    topics: topics.into_iter().collect(),
                };
                match self.call(to, op, Some(AVAILABLE_CALL_TIMEOUT)).await {
                    Err(CallError::Refused(_)) => {
                        self.call(to, every, Some(AVAILABLE_CALL_TIMEOUT)).await
                    }
                    result => result,
                }
            };
            if let Err(error) = result {
                tracing::debug!(node, ?error, "an availability notice was not delivered");
            }
            // What is gained meanwhile goes together in the next notice.
            self.env.runtime.sleep(AVAILABLE_COALESCE).await;
        }
    }

    pub fn dispatcher_pending(&self) -> usize {
        self.dispatch.queue.borrow().pending_records()
    }
}

/// What one other node is owed of this shard's gains, and whether a notice
/// to it is under way.
#[derive(Default)]
struct Owed {
    topics: BTreeMap<String, u32>,
    every_poll: bool,
    sending: bool,
}

impl Owed {
    fn add(&mut self, gained: &BTreeMap<String, u32>) {
        if self.every_poll {
            return;
        }
        for (topic, count) in gained {
            add_gain(&mut self.topics, topic, *count);
        }
        if self.topics.len() > GAINED_TOPICS_MAX {
            self.topics.clear();
            self.every_poll = true;
        }
    }
}

fn add_gain(gains: &mut BTreeMap<String, u32>, topic: &str, count: u32) {
    match gains.get_mut(topic) {
        Some(sum) => *sum = sum.saturating_add(count),
        None => {
            gains.insert(topic.to_string(), count);
        }
    }
}
