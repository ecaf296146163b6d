//! The partitions of this shard: each opened on first use (or by the idle
//! sweep) as a [`PartitionOwner`].

use super::*;

impl<F: FileSystem> Shard<F> {
    /// The owner of a partition of this shard, opened on first use.
    pub(super) async fn owner(&self, topic: &Topic, partition: u32) -> Result<Owner<F>, ApiError> {
        debug_assert!(
            self.placement(topic).shard_of(partition) == self.shard_index(),
            "a shard opens only its own partitions"
        );
        if !self.serves(topic, partition) {
            return Err(Self::moving_error(topic, partition));
        }
        let key = (topic.name.clone(), topic.incarnation, partition);
        loop {
            let seen = self.owners.changed.version();
            match self.owners.slots.borrow().get(&key) {
                Some(OwnerSlot::Ready(owner)) => return Ok(owner.clone()),
                Some(OwnerSlot::Opening) => {}
                None => break,
            }
            self.owners.changed.changed(seen).await;
        }
        // Held before anything is created in it: a deleted topic's folder
        // being removed (this shard may not know of the deletion yet) is
        // not opened again.
        let Some(hold) = self.env.folders.hold(&topic.name, topic.incarnation) else {
            return Err(ApiError::new(
                ErrorCode::TopicNotFound,
                format!("topic {:?} was deleted", topic.name),
            ));
        };
        self.owners
            .slots
            .borrow_mut()
            .insert(key.clone(), OwnerSlot::Opening);
        // Opening reads the partition's files and may take a while; if this
        // request is dropped meanwhile, the slot goes and the next caller
        // opens it (the files are consistent at every await of an open, and
        // an open makes what it adopts durable before using it).
        let opening = OpeningSlot {
            shard: self,
            key: Some(key.clone()),
        };
        let opened = self.open_owner(topic, partition).await;
        opening.settled();
        let mut owners = self.owners.slots.borrow_mut();
        let result = match opened {
            Ok(owner) => {
                owner.hold_folder(hold);
                let owner = Rc::new(owner);
                // A partition frozen for a handover before it opened.
                if self.is_frozen(topic, partition) {
                    owner.mark_frozen();
                }
                owners.insert(key, OwnerSlot::Ready(owner.clone()));
                // One more open partition: every one's share of the shard's
                // tail cache shrinks to keep the shard within its budget.
                let share = tail_cache_share(owners.len());
                if share != tail_cache_share(owners.len().saturating_sub(1)) {
                    for slot in owners.values() {
                        if let OwnerSlot::Ready(open) = slot {
                            open.set_tail_cache_bytes(share);
                        }
                    }
                }
                Ok(owner)
            }
            Err(error) => {
                owners.remove(&key);
                Err(error)
            }
        };
        drop(owners);
        self.owners.changed.notify();
        result
    }

    pub(super) async fn open_owner(
        &self,
        topic: &Topic,
        partition: u32,
    ) -> Result<PartitionOwner<F>, ApiError> {
        let dir = self
            .topic_dir(&topic.name, topic.incarnation)
            .join(partition.to_string());
        let log_config = LogConfig {
            segment_bytes: self.settings.storage.segment_bytes,
            prealloc_step_bytes: SEGMENT_PREALLOC_STEP_BYTES_DEFAULT
                .min(self.settings.storage.segment_bytes),
            retention_ms: topic.config.retention_ms,
        };
        // A move's copy opens with what was verified of it while it grew.
        let key = (topic.name.clone(), topic.incarnation, partition);
        let verified = self.moves_verified(&key);
        let clock = self.env.clock.clone();
        let (log, recovery) = match verified {
            Some(verified) => {
                PartitionLog::open_copy(&self.env.fs, &dir, log_config, clock, &verified).await
            }
            None => PartitionLog::open(&self.env.fs, &dir, log_config, clock).await,
        }
        .map_err(|e| from_storage(&e))?;
        if recovery.torn_tail || recovery.corrupt_records > 0 {
            tracing::warn!(topic = %topic.name, partition, ?recovery, "partition log recovered");
        }
        let consumer_config = ConsumerConfig {
            ack_flush_interval_ms: self.settings.storage.ack_flush_interval_ms,
            commit_interval_ms: self.settings.storage.consumer_offset_commit_interval_ms,
            ..ConsumerConfig::default()
        };
        let acks = ConsumerState::open(
            &self.env.fs,
            &dir.join("consumer"),
            consumer_config,
            self.env.clock.clone(),
        )
        .await
        .map_err(|e| from_storage(&e))?;
        let first_lease_id = self.owners.next_lease_ids.get();
        self.owners
            .next_lease_ids
            .set(first_lease_id.saturating_add(LEASE_IDS_PER_OPEN));
        let owner_config = OwnerConfig {
            first_lease_id,
            max_deliveries: topic.config.max_deliveries,
            tail_cache_bytes: tail_cache_share(self.owners.slots.borrow().len()),
            idempotency_window_ms: topic.config.idempotency_window_ms,
        };
        let owner = PartitionOwner::new(log, acks, owner_config);
        owner.use_journal(self.wal.clone());
        self.replay_journal_into(&key, &owner).await?;
        owner
            .load_idempotency_keys(self.wall())
            .await
            .map_err(|e| from_owner(&e))?;
        owner
            .cut_acks_past_log()
            .await
            .map_err(|e| from_owner(&e))?;
        owner.load_oldest_unacked_time().await;
        Ok(owner)
    }

    /// The open partitions, in key order ([`Self::owners_snapshot`]).
    pub(super) fn open_owners(&self) -> Vec<Owner<F>> {
        self.owners_snapshot()
            .into_iter()
            .filter_map(|(_, slot)| match slot {
                OwnerSlot::Ready(owner) => Some(owner),
                OwnerSlot::Opening => None,
            })
            .collect()
    }
}
