//! The one place a shard answers operations, whether another shard of this
//! node (over the mesh) or another node (over QUIC) sent them.

use super::*;

impl<F: FileSystem> Shard<F> {
    /// Takes in what a transport hands this shard, until it closes: another
    /// shard's operations (`Reach::Shard`) or another node's (`Reach::Node`).
    pub async fn serve_from(
        self: Rc<Self>,
        mut inbox: impl futures_lite::Stream<Item = Envelope> + Unpin,
        from: Reach,
    ) {
        use futures_lite::StreamExt;
        while let Some(envelope) = inbox.next().await {
            self.receive(envelope, from);
        }
    }

    /// Takes in one operation: a wake-up at once, anything else in a task of
    /// its own (a slow one never holds the next behind it).
    pub fn receive(self: &Rc<Self>, envelope: Envelope, from: Reach) {
        let envelope = match envelope {
            Envelope::Available(op, reply) => {
                self.heard_available(&op, from);
                let _ = reply.send(());
                return;
            }
            Envelope::Wake(op, reply) => {
                self.heard_wake(&op);
                let _ = reply.send(());
                return;
            }
            Envelope::Gained(op, reply) => {
                self.heard_gained(&op);
                let _ = reply.send(());
                return;
            }
            envelope => envelope,
        };
        let in_flight = (from == Reach::Node).then(|| InFlight::enter(self));
        let shard = self.clone();
        self.env.runtime.spawn(Box::pin(async move {
            shard.serve(envelope, from).await;
            drop(in_flight);
        }));
    }

    /// Answers one operation. A sender that gave up dropped its end: there
    /// is nobody to tell (leases it would have received expire and their
    /// messages are delivered again).
    pub async fn serve(&self, envelope: Envelope, from: Reach) {
        match envelope {
            Envelope::Commit(op, reply) => {
                let answer = match self.topic_at(&op.topic) {
                    Ok(topic) => self.commit(&topic, op.into(), from).await,
                    Err(error) => Err(error),
                };
                let _ = reply.send(answer);
            }
            Envelope::KeyedCommit(op, reply) => {
                let answer = match self.topic_at(&op.commit.topic) {
                    Ok(topic) => self.commit(&topic, op, from).await,
                    Err(error) => Err(error),
                };
                let _ = reply.send(answer);
            }
            Envelope::Produce(op, reply) => {
                let _ = reply.send(self.produce_for_shard(op, from).await);
            }
            Envelope::Collect(op, reply) => {
                if from == Reach::Shard {
                    // Its next gain goes to the other shards, which may
                    // now count this one as having nothing.
                    self.flow.polls.asked(&op.topic.name);
                }
                let answer = match self.topic_at(&op.topic) {
                    Ok(topic) => self.collect(&topic, op, from, self.next_turn()).await,
                    Err(error) => Err(error),
                };
                let _ = reply.send(answer);
            }
            Envelope::Settle(op, reply) => {
                let answer = match self.topic_at(&op.topic) {
                    Ok(topic) => self.settle_receipts(&topic, op, from).await,
                    Err(error) => vec![Err(error); op.receipts.len()],
                };
                let _ = reply.send(answer);
            }
            Envelope::Browse(op, reply) => {
                let answer = match self.topic_at(&op.topic) {
                    Ok(topic) => self.browse_within(&topic, op, from).await,
                    Err(error) => Err(error),
                };
                let _ = reply.send(answer);
            }
            Envelope::Search(op, reply) => {
                let answer = match self.topic_at(&op.topic) {
                    Ok(topic) => self.search_within(&topic, op, from).await,
                    Err(error) => Err(error),
                };
                let _ = reply.send(answer);
            }
            Envelope::TopicRates(op, reply) => {
                let answer = match self.topic_at(&op.topic) {
                    Ok(topic) => self.rates_within(&topic, op, from).await,
                    Err(error) => Err(error),
                };
                let _ = reply.send(answer);
            }
            Envelope::Stats(op, reply) => {
                let answer = match self.topic_at(&op.topic) {
                    Ok(topic) => self.stats(&topic, op, from).await,
                    Err(error) => Err(error),
                };
                let _ = reply.send(answer);
            }
            Envelope::Gauges(_, reply) => {
                let _ = reply.send(self.local_gauges());
            }
            Envelope::Ready(_, reply) => {
                let _ = reply.send(self.not_ready().await.map_or(Ok(()), Err));
            }
            Envelope::Available(op, reply) => {
                self.heard_available(&op, from);
                let _ = reply.send(());
            }
            Envelope::Wake(op, reply) => {
                self.heard_wake(&op);
                let _ = reply.send(());
            }
            Envelope::Gained(op, reply) => {
                self.heard_gained(&op);
                let _ = reply.send(());
            }
            Envelope::MoveSource(op, reply) => {
                let _ = reply.send(self.serve_move_source(op).await);
            }
        }
    }

    /// Messages became available on another node of an earlier release (or,
    /// from a node of an earlier release, another shard): wake every long
    /// poll here, and (for another node's) on every shard of this node.
    fn heard_available(&self, op: &Available, from: Reach) {
        self.wake_every_poll();
        if from == Reach::Node {
            if let Some(peers) = &self.remote.peers {
                peers.heard_available(op.from, self.mono());
            }
            self.wake_other_shards_every_poll();
        }
    }

    /// Another node gained messages of these topics: wake the polls of each
    /// here that cover them, then on the node's other shards what is left.
    fn heard_gained(&self, op: &Gained) {
        if let Some(peers) = &self.remote.peers {
            peers.heard_available(op.from, self.mono());
        }
        for (topic, count) in &op.topics {
            let left = self.flow.polls.gained_elsewhere(topic, *count);
            if left > 0 {
                self.wake_other_shards(topic, left);
            }
        }
    }

    /// Another shard of this node gained messages of a topic.
    fn heard_wake(&self, op: &Wake) {
        let from = usize::try_from(op.shard).unwrap_or(usize::MAX);
        self.flow.polls.heard(&op.topic, from, op.count);
    }

    /// The topic an operation names, if this shard knows that incarnation.
    pub(super) fn topic_at(&self, topic: &TopicRef) -> Result<Rc<Topic>, ApiError> {
        let found = self.topic(&topic.name)?;
        if found.incarnation != topic.incarnation {
            return Err(ApiError::new(
                ErrorCode::TopicNotFound,
                format!(
                    "node {} holds incarnation {} of topic {:?}, not {}",
                    self.me(),
                    found.incarnation,
                    topic.name,
                    topic.incarnation
                ),
            ));
        }
        Ok(found)
    }

    /// Where an operation on one partition goes from here, within `reach`:
    /// refused when it is beyond the topic or the reach, or its owner is
    /// marked dead.
    pub(super) fn route(
        &self,
        topic: &Topic,
        partition: u32,
        reach: Reach,
    ) -> Result<Location, ApiError> {
        let location = self.placement(topic).locate(partition);
        if partition >= topic.config.partitions || !location.within(reach) {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!(
                    "node {} shard {} does not own partition {partition} of {:?}",
                    self.me(),
                    self.shard_index(),
                    topic.name
                ),
            ));
        }
        match location {
            Location::Node(node) if self.is_dead(node) => Err(Self::owner_dead(node)),
            location => Ok(location),
        }
    }
}

/// An operation of another node being answered; the stop waits for them.
struct InFlight<F: FileSystem>(Rc<Shard<F>>);

impl<F: FileSystem> InFlight<F> {
    fn enter(shard: &Rc<Shard<F>>) -> Self {
        shard.remote.in_flight.set(shard.remote.in_flight.get() + 1);
        Self(shard.clone())
    }
}

impl<F: FileSystem> Drop for InFlight<F> {
    fn drop(&mut self) {
        let remote = &self.0.remote;
        remote.in_flight.set(remote.in_flight.get() - 1);
        remote.done.notify();
    }
}
