//! Answers what other shards (over the mesh) and other nodes (over QUIC)
//! ask of this shard's partitions.

use super::*;

impl Shard {
    /// Answers what other shards ask, until they all stopped.
    pub async fn serve_peers(
        self: Rc<Self>,
        inbox: glommio::channels::shared_channel::ConnectedReceiver<ShardMsg>,
    ) {
        while let Some(message) = inbox.recv().await {
            if let ShardMsg::Available = message {
                self.flow.availability.notify();
                continue;
            }
            let shard = self.clone();
            self.env
                .runtime
                .spawn(Box::pin(async move { shard.answer(message).await }));
        }
    }

    /// Answers what other nodes ask of this one (the QUIC thread hands
    /// their requests to this shard), until the node stops.
    pub async fn serve_remote(
        self: Rc<Self>,
        mut inbox: futures_channel::mpsc::UnboundedReceiver<Inbound>,
    ) {
        use futures_lite::StreamExt;
        while let Some(Inbound { request, reply }) = inbox.next().await {
            // Once stopping, commits are refused before they touch a log:
            // the sender keeps the records and commits them again later,
            // rather than a commit landing whose answer never leaves.
            if self.flow.stopping.get() && matches!(request, DataRequest::Commit { .. }) {
                let stopping = ApiError::new(ErrorCode::Stopping, "the owner is stopping");
                let _ = reply.send(DataAnswer::failed(&stopping));
                continue;
            }
            let shard = self.clone();
            shard.remote.in_flight.set(shard.remote.in_flight.get() + 1);
            self.env.runtime.spawn(Box::pin(async move {
                // A caller that gave up dropped its end: leases it would have
                // received expire and the messages are delivered again.
                let _ = reply.send(shard.answer_remote(request).await);
                shard.remote.in_flight.set(shard.remote.in_flight.get() - 1);
                shard.remote.done.notify();
            }));
        }
    }

    /// The topic another node names, if this node knows that incarnation.
    pub(super) fn topic_for_peer(
        &self,
        name: &str,
        incarnation: u64,
    ) -> Result<Rc<Topic>, ApiError> {
        let topic = self.topic(name)?;
        if topic.incarnation != incarnation {
            return Err(ApiError::new(
                ErrorCode::TopicNotFound,
                format!(
                    "node {} holds incarnation {} of topic {name:?}, not {incarnation}",
                    self.me(),
                    topic.incarnation
                ),
            ));
        }
        Ok(topic)
    }

    /// The partitions of a request from another node that this node owns
    /// (the sender's metadata may be older or newer than ours).
    pub(super) fn own_partitions(&self, topic: &Topic, partitions: Vec<u32>) -> Vec<u32> {
        let me = self.me();
        partitions
            .into_iter()
            .filter(|p| *p < topic.config.partitions && self.owner_node(topic, *p) == me)
            .collect()
    }

    pub(super) async fn answer_remote(&self, request: DataRequest) -> DataAnswer {
        let failed = |error: ApiError| DataAnswer::failed(&error);
        match request {
            DataRequest::Commit {
                topic,
                incarnation,
                partition,
                messages,
            } => {
                let topic = match self.topic_for_peer(&topic, incarnation) {
                    Ok(topic) => topic,
                    Err(error) => return failed(error),
                };
                if partition >= topic.config.partitions
                    || self.owner_node(&topic, partition) != self.me()
                {
                    return failed(ApiError::new(
                        ErrorCode::Conflict,
                        format!("node {} does not own partition {partition}", self.me()),
                    ));
                }
                let messages = messages
                    .into_iter()
                    .map(|m| Message {
                        id: m.id,
                        produced_at_ms: m.produced_at_ms,
                        key: m.key,
                        value: m.value.into(),
                    })
                    .collect();
                match self.commit_on_node(&topic, partition, messages).await {
                    Ok(()) => DataAnswer::Done,
                    Err(error) => failed(error),
                }
            }
            DataRequest::Collect {
                topic,
                incarnation,
                partitions,
                max,
                visibility_ms,
            } => {
                let topic = match self.topic_for_peer(&topic, incarnation) {
                    Ok(topic) => topic,
                    Err(error) => return failed(error),
                };
                let partitions = self.own_partitions(&topic, partitions);
                let rotation = self.flow.round_robin.get().wrapping_add(1);
                self.flow.round_robin.set(rotation);
                match self
                    .collect_on_node(&topic, partitions, max as usize, visibility_ms, rotation)
                    .await
                {
                    Ok(got) => DataAnswer::Collected(
                        got.into_iter().map(WireConsumed::from_consumed).collect(),
                    ),
                    Err(error) => failed(error),
                }
            }
            DataRequest::Settle {
                topic,
                incarnation,
                receipts,
                action,
            } => {
                let topic = match self.topic_for_peer(&topic, incarnation) {
                    Ok(topic) => topic,
                    Err(error) => return failed(error),
                };
                let outcomes = self
                    .settle_on_node(&topic, receipts, action.into())
                    .await
                    .into_iter()
                    .map(|outcome| match outcome {
                        Ok(lease_expires_at_ms) => WireOutcome {
                            error: None,
                            lease_expires_at_ms,
                        },
                        Err(error) => WireOutcome {
                            error: Some((&error).into()),
                            lease_expires_at_ms: None,
                        },
                    })
                    .collect();
                DataAnswer::Settled(outcomes)
            }
            DataRequest::Stats {
                topic,
                incarnation,
                partitions,
            } => {
                let topic = match self.topic_for_peer(&topic, incarnation) {
                    Ok(topic) => topic,
                    Err(error) => return failed(error),
                };
                let partitions = self.own_partitions(&topic, partitions);
                match self.stats_on_node(&topic, partitions).await {
                    Ok(stats) => DataAnswer::Stats(
                        stats
                            .iter()
                            .map(|(partition, figures)| WireStats::new(*partition, figures))
                            .collect(),
                    ),
                    Err(error) => failed(error),
                }
            }
            DataRequest::Available { from } => {
                if let Some(peers) = &self.remote.peers {
                    peers.heard_available(from, self.now());
                }
                self.flow.availability.notify();
                self.mesh.announce_available();
                DataAnswer::Done
            }
        }
    }

    pub(super) async fn answer(&self, message: ShardMsg) {
        // A requester that gave up dropped its end: nothing to tell it.
        match message {
            ShardMsg::Commit {
                topic,
                partition,
                messages,
                reply,
            } => {
                let _ = reply.send(self.commit_local(&topic, partition, messages).await);
            }
            ShardMsg::Collect {
                topic,
                partitions,
                max,
                visibility_ms,
                reply,
            } => {
                let got = self
                    .collect_local(&topic, &partitions, max, visibility_ms)
                    .await;
                if let Err(Ok(unclaimed)) = reply.send(got) {
                    // The consumer is gone: its leases expire and the
                    // messages are delivered again.
                    tracing::debug!(
                        messages = unclaimed.len(),
                        "a consume gave up before its answer"
                    );
                }
            }
            ShardMsg::Settle {
                topic,
                receipts,
                action,
                reply,
            } => {
                let _ = reply.send(self.settle_local(&topic, receipts, action));
            }
            ShardMsg::Stats {
                topic,
                partitions,
                reply,
            } => {
                let _ = reply.send(self.local_stats(&topic, &partitions).await);
            }
            ShardMsg::Gauges { reply } => {
                let _ = reply.send(self.local_gauges());
            }
            ShardMsg::Available => self.flow.availability.notify(),
        }
    }
}
