//! Topics: the cached metadata, creating, changing and deleting topics,
//! removing the folders of deleted ones, and per-partition figures.

use super::*;

impl<F: FileSystem> Shard<F> {
    /// The current metadata, from this shard's snapshot (an atomic load
    /// unless the metastore applied something since the last read).
    pub(super) fn view(&self) -> Arc<MetaView> {
        self.metadata.borrow_mut().view()
    }

    /// The topic, or 404 `topic_not_found` at once. Served from a cache of
    /// the current metadata version, so a request does not copy the topic.
    pub fn topic(&self, name: &str) -> Result<Rc<Topic>, ApiError> {
        let mut metadata = self.metadata.borrow_mut();
        if let Some(topic) = metadata.topic(name) {
            return Ok(topic);
        }
        // Through `view`, which empties the cache if the metastore applied
        // something since: a change that lands between the two reads must
        // not leave other topics cached at the older version.
        let Some(topic) = metadata.view().state.topics.get(name).cloned() else {
            // A node still learning the cluster's metadata cannot say a
            // topic is missing: 404 is final for a client, 503 is retried.
            if !self.env.meta.caught_up() {
                return Err(ApiError::new(
                    ErrorCode::CatchingUp,
                    format!(
                        "this node has not yet learned the cluster's topics; topic {name:?} may exist: retry"
                    ),
                ));
            }
            return Err(ApiError::new(
                ErrorCode::TopicNotFound,
                format!("topic {name:?} does not exist"),
            ));
        };
        let topic = Rc::new(topic);
        metadata.topics.insert(name.to_string(), topic.clone());
        Ok(topic)
    }

    pub fn topics(&self) -> Vec<Topic> {
        self.view().state.topics.values().cloned().collect()
    }

    /// Creates or updates a topic through the metastore. Returns whether it
    /// was created, and the topic.
    pub async fn put_topic(
        &self,
        name: &str,
        patch: TopicPatch,
    ) -> Result<(bool, Topic), ApiError> {
        let existing = self.view().state.topics.get(name).cloned();
        let (config, added) = self.resolve_config(existing.as_ref(), patch)?;
        let existing_partitions = existing.as_ref().map_or(0, |t| t.config.partitions);
        // The controller's placement (`controller::place`).
        let new_owners = place(name, existing_partitions, added, &self.live_nodes());
        let command = Command::PutTopic {
            name: name.to_string(),
            config,
            new_owners,
            now_ms: self.wall(),
        };
        let (created, topic) = match self.propose(command).await? {
            Applied::TopicCreated(topic) => (true, topic),
            Applied::TopicUpdated(topic) | Applied::TopicUnchanged(topic) => (false, topic),
            _ => {
                return Err(ApiError::new(
                    ErrorCode::Internal,
                    "the metastore answered a topic change oddly",
                ))
            }
        };
        self.applied_here(&topic).await;
        self.reconcile_owners();
        Ok((created, topic))
    }

    /// A topic's config after `patch` (on the existing topic's, or on the
    /// defaults), checked as far as this node can, and how many partitions
    /// it adds.
    pub(crate) fn resolve_config(
        &self,
        existing: Option<&Topic>,
        patch: TopicPatch,
    ) -> Result<(TopicConfig, u32), ApiError> {
        let base = existing
            .map(|t| t.config.clone())
            .unwrap_or_else(|| TopicConfig {
                partitions: 8,
                visibility_timeout_ms: self.settings.topics.default_visibility_timeout_ms,
                retention_ms: self.settings.topics.default_retention_ms,
                max_deliveries: 0,
                dead_letter_topic: None,
                schema: None,
                max_message_bytes: MAX_MESSAGE_BYTES_DEFAULT,
                idempotency_window_ms: self.settings.topics.default_idempotency_window_ms,
            });
        let config = TopicConfig {
            partitions: patch.partitions.unwrap_or(base.partitions),
            visibility_timeout_ms: patch
                .visibility_timeout_ms
                .unwrap_or(base.visibility_timeout_ms),
            retention_ms: patch.retention_ms.unwrap_or(base.retention_ms),
            max_deliveries: patch.max_deliveries.unwrap_or(base.max_deliveries),
            dead_letter_topic: patch.dead_letter_topic.unwrap_or(base.dead_letter_topic),
            schema: patch.schema.unwrap_or(base.schema),
            max_message_bytes: patch.max_message_bytes.unwrap_or(base.max_message_bytes),
            idempotency_window_ms: patch
                .idempotency_window_ms
                .unwrap_or(base.idempotency_window_ms),
        };
        if let Some(dlq) = &config.dead_letter_topic {
            narad_net::names::validate_topic_name(dlq).map_err(|e| {
                ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!("dead_letter_topic: {}", e.message),
                )
            })?;
        }
        if let Some(schema) = &config.schema {
            if !self.view().state.schemas.contains_key(schema) {
                return Err(ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!("schema {schema:?} does not exist"),
                ));
            }
        }
        let added = config
            .partitions
            .saturating_sub(existing.map_or(0, |t| t.config.partitions));
        Ok((config, added))
    }

    /// Waits until this node's metadata holds `topic` as the change left it
    /// (the leader applied it first), or a later incarnation: the answer to
    /// a topic change comes after the node that gives it can serve the
    /// topic as changed.
    async fn applied_here(&self, topic: &Topic) {
        self.applied_here_when(|state| {
            state
                .topics
                .get(&topic.name)
                .is_some_and(|t| t.incarnation > topic.incarnation || t == topic)
        })
        .await;
    }

    /// Proposes a change to the metastore; its refusal as an API error.
    pub(super) async fn propose(&self, command: Command) -> Result<Applied, ApiError> {
        self.env
            .meta
            .propose(command)
            .await
            .map_err(|e| from_meta(&e))
    }

    /// Waits until this node's metadata satisfies `holds`, at most
    /// [`LOCAL_APPLY_WAIT`] (the leader applies a change first).
    pub(super) async fn applied_here_when(&self, holds: impl Fn(&MetaState) -> bool) {
        let mut changes = self.env.meta.subscribe();
        let deadline = self.mono() + LOCAL_APPLY_WAIT.as_millis() as u64;
        loop {
            let held = holds(&changes.borrow_and_update().state);
            let now = self.mono();
            if held || now >= deadline {
                return;
            }
            let wait = async {
                self.env
                    .runtime
                    .sleep(Duration::from_millis(deadline - now))
                    .await;
                false
            };
            // The metastore stopped (its feed closed): nothing more comes.
            let closed = async { changes.changed().await.is_err() };
            if futures_lite::future::or(closed, wait).await {
                return;
            }
        }
    }

    pub async fn delete_topic(&self, name: &str) -> Result<(), ApiError> {
        self.topic(name)?;
        self.propose(Command::DeleteTopic {
            name: name.to_string(),
        })
        .await?;
        // Every node (this one included) closes its partitions and removes
        // their folders when it applies the delete (`watch_topics`).
        self.reconcile_owners();
        Ok(())
    }

    /// Brings this shard's open partitions in line with the metastore:
    /// partitions of deleted topics close, topic updates (retention,
    /// `max_deliveries`) apply.
    pub fn reconcile_owners(&self) {
        let view = self.view();
        let topics = &view.state.topics;
        let mut owners = self.owners.slots.borrow_mut();
        owners.retain(|(name, incarnation, _), slot| {
            let live = topics
                .get(name)
                .is_some_and(|t| t.incarnation == *incarnation);
            if let (false, OwnerSlot::Ready(owner)) = (live, &*slot) {
                // Nothing left to deliver to: the journal copies go.
                owner.release_journal();
            }
            live
        });
        for ((name, _, _), slot) in owners.iter() {
            if let (OwnerSlot::Ready(owner), Some(topic)) = (slot, topics.get(name)) {
                owner.reconfigure(
                    topic.config.retention_ms,
                    topic.config.max_deliveries,
                    topic.config.idempotency_window_ms,
                );
            }
        }
    }

    /// Reconciles on every metadata change, whichever shard or node made it.
    pub async fn watch_topics(self: Rc<Self>) {
        let mut changes = self.env.meta.subscribe();
        if self.identity.shard_id == 0 {
            let (wake, woken) = futures_channel::mpsc::unbounded();
            self.env.folders.wake_reaper_with(wake);
            let reaper = self.clone();
            self.env.runtime.spawn(Box::pin(async move {
                let mut woken = woken;
                while futures_util::StreamExt::next(&mut woken).await.is_some() {
                    reaper.reap_deleted_topics().await;
                }
            }));
        }
        self.reconcile_children();
        self.reap_deleted_topics().await;
        self.learn_peers();
        self.reconcile_moves();
        while changes.changed().await.is_ok() {
            self.learn_peers();
            self.reconcile_owners();
            self.reconcile_moves();
            self.reconcile_children();
            self.reap_deleted_topics().await;
        }
    }

    /// Removes the partition folders of topics that no longer exist (deleted,
    /// or created again as a new incarnation), on shard 0 of every node, once
    /// the metadata is caught up (before that, a topic missing from this
    /// node's view may merely be unknown yet) and no shard holds the folder
    /// any more (an owner's last append may still roll a segment there; its
    /// release wakes this again: `crate::folders`). Through the file seam,
    /// off the executor.
    pub(super) async fn reap_deleted_topics(&self) {
        if self.identity.shard_id != 0 || !self.env.meta.caught_up() {
            return;
        }
        let root = self.env.data_dir.join("partitions");
        let Ok(entries) = self.env.fs.list_dir(&root).await else {
            return;
        };
        let view = self.view();
        for entry in entries {
            let Some((name, incarnation)) = entry
                .rsplit_once('-')
                .and_then(|(name, n)| Some((name, n.parse::<u64>().ok()?)))
            else {
                continue;
            };
            let live = view
                .state
                .topics
                .get(name)
                .is_some_and(|t| t.incarnation == incarnation);
            if live {
                continue;
            }
            let Some(_reaping) = self.env.folders.reap(name, incarnation) else {
                continue;
            };
            let dir = root.join(&entry);
            match self.env.fs.remove_dir_all(&dir).await {
                Ok(()) => {
                    tracing::info!(dir = %dir.display(), "removed the partitions of a deleted topic")
                }
                Err(error) => {
                    tracing::warn!(dir = %dir.display(), %error, "could not remove a deleted topic's partitions")
                }
            }
        }
    }

    pub(super) fn topic_dir(&self, name: &str, incarnation: u64) -> PathBuf {
        self.env
            .data_dir
            .join("partitions")
            .join(format!("{name}-{incarnation}"))
    }

    /// Per-partition figures of a topic (opening its partitions if needed),
    /// from the shard and node that own each. A node that does not answer
    /// leaves its partitions' figures at zero.
    pub async fn partition_stats(
        &self,
        topic: &Topic,
    ) -> Result<(Vec<PartitionStats>, Vec<CopyFigures>), ApiError> {
        let op = Stats {
            topic: TopicRef::of(topic),
            partitions: (0..topic.config.partitions).collect(),
        };
        let mut stats = vec![PartitionStats::default(); topic.config.partitions as usize];
        let figures = self.stats(topic, op, Reach::Cluster).await?;
        for (partition, figures) in figures.partitions {
            if let Some(slot) = stats.get_mut(partition as usize) {
                *slot = figures;
            }
        }
        Ok((stats, figures.copies))
    }

    /// Whether every partition of `topic` answered and holds nothing
    /// available and nothing leased (a partition whose owner does not
    /// answer is not known to be empty).
    pub(super) async fn holds_nothing(&self, topic: &Topic) -> Result<bool, ApiError> {
        let op = Stats {
            topic: TopicRef::of(topic),
            partitions: (0..topic.config.partitions).collect(),
        };
        let figures = self.stats(topic, op, Reach::Cluster).await?;
        Ok(figures.partitions.len() == topic.config.partitions as usize
            && figures
                .partitions
                .iter()
                .all(|(_, s)| s.available == 0 && s.in_flight == 0))
    }

    /// Figures of the partitions of `op` within `reach`, from the shards
    /// that own them; other nodes that are dead, recently unreachable or
    /// refuse are left out.
    pub(super) async fn stats(&self, topic: &Topic, op: Stats, reach: Reach) -> Figures {
        let fanout = self.fan_out(topic, &op.partitions, reach, 0);
        let mut figures = TopicFigures::default();
        for (shard, partitions) in fanout.shards {
            if shard == self.shard_index() {
                figures.merge(self.stats_here(topic, &partitions).await?);
            } else {
                let to = Address::Shard(shard);
                let part = Stats {
                    topic: op.topic.clone(),
                    partitions,
                };
                figures.merge(
                    self.call(to, part, None)
                        .await
                        .map_err(|e| e.to_api(to))??,
                );
            }
        }
        for (node, partitions) in fanout.nodes {
            let part = Stats {
                topic: op.topic.clone(),
                partitions,
            };
            let answer = self
                .ask_node(node, part, STATS_CALL_TIMEOUT, "partition figures")
                .await;
            if let Some(list) = answer {
                figures.merge(list);
            }
        }
        Ok(figures)
    }

    async fn stats_here(&self, topic: &Topic, partitions: &[u32]) -> Figures {
        let mut figures = TopicFigures::default();
        for &partition in partitions {
            let owner = self.owner(topic, partition).await?;
            figures
                .partitions
                .push((partition, owner.stats(self.now())));
        }
        figures.copies = self.copy_figures(Some((topic, partitions)));
        Ok(figures)
    }

    /// The last 15 minutes of `topic`: every partition's points from its
    /// owner (through the one fan-out; a node that does not answer is
    /// left out, as for figures), added up interval by interval.
    pub async fn rates(&self, topic: &Topic) -> RatePoints {
        let op = TopicRates {
            topic: TopicRef::of(topic),
            partitions: (0..topic.config.partitions).collect(),
        };
        self.rates_within(topic, op, Reach::Cluster).await
    }

    pub(super) async fn rates_within(
        &self,
        topic: &Topic,
        op: TopicRates,
        reach: Reach,
    ) -> RatePoints {
        let fanout = self.fan_out(topic, &op.partitions, reach, 0);
        let mut merged = BTreeMap::new();
        for (shard, partitions) in fanout.shards {
            let points = if shard == self.shard_index() {
                let mut here = BTreeMap::new();
                for partition in partitions {
                    let owner = self.owner(topic, partition).await?;
                    crate::rates::merge(&mut here, &owner.rate_points(self.now()));
                }
                here.into_values().collect()
            } else {
                let to = Address::Shard(shard);
                let part = TopicRates {
                    topic: op.topic.clone(),
                    partitions,
                };
                self.call(to, part, None)
                    .await
                    .map_err(|e| e.to_api(to))??
            };
            crate::rates::merge(&mut merged, &points);
        }
        for (node, partitions) in fanout.nodes {
            let part = TopicRates {
                topic: op.topic.clone(),
                partitions,
            };
            if let Some(points) = self.ask_node(node, part, STATS_CALL_TIMEOUT, "rates").await {
                crate::rates::merge(&mut merged, &points);
            }
        }
        Ok(merged.into_values().collect())
    }
}
