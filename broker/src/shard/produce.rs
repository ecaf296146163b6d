//! Produce: records appended to the ingress WAL and handed to the
//! dispatcher once durable, also when the request that appended them is gone;
//! adopting the WAL of a removed shard; redispatch after a restart.

use super::*;

impl<F: FileSystem> Shard<F> {
    pub(super) fn next_id(&self) -> u128 {
        let seq = self.flow.next_seq.get();
        self.flow.next_seq.set(seq + 1);
        message_id(self.identity, seq)
    }

    pub(super) fn pick_partition(&self, topic: &Topic, key: Option<&[u8]>) -> u32 {
        match key {
            Some(key) => partition_for_key(key, topic.config.partitions),
            None => {
                let count = topic.config.partitions.max(1);
                let placement = self.placement(topic);
                let mut next = self.flow.round_robin.get();
                let first = next.wrapping_add(1) % count;
                // Round robin, preferring partitions of this shard: their
                // commits need no hop to another shard.
                let steps = (2 * placement.shards as u32).min(count);
                for _ in 0..steps {
                    next = next.wrapping_add(1);
                    if placement.locate(next % count) == Location::Here {
                        self.flow.round_robin.set(next);
                        return next % count;
                    }
                }
                self.flow.round_robin.set(next);
                first
            }
        }
    }

    pub(super) fn refuse_if_stopping(&self) -> Result<(), ApiError> {
        if self.flow.stopping.get() {
            return Err(ApiError::new(
                ErrorCode::Stopping,
                "the node is stopping; send to another node",
            ));
        }
        Ok(())
    }

    /// The contract: once an ingress WAL of this node failed, the node
    /// answers 500 to produces until it restarts (not only that shard).
    pub(super) fn refuse_if_wal_failed(&self) -> Result<(), ApiError> {
        if let Some(reason) = self.wal.failure() {
            self.env.wal_failed.store(true, Ordering::SeqCst);
            return Err(from_storage(&StorageError::WalFailed { reason }));
        }
        if self.env.wal_failed.load(Ordering::SeqCst) {
            return Err(ApiError::new(
                ErrorCode::WalFailed,
                "an ingress WAL of this node failed; it takes no produces until it restarts",
            ));
        }
        Ok(())
    }

    /// Accepts messages: one WAL record each, answered once the group commit
    /// covering all of them is durable. Returns their ids in order.
    pub async fn produce(
        &self,
        topic: &Topic,
        messages: Vec<(Option<Vec<u8>>, bytes::Bytes)>,
    ) -> Result<Vec<String>, ApiError> {
        self.refuse_if_stopping()?;
        self.refuse_if_wal_failed()?;
        for (index, (_, value)) in messages.iter().enumerate() {
            if value.len() as u64 > topic.config.max_message_bytes {
                return Err(ApiError::new(
                    ErrorCode::TooLarge,
                    format!(
                        "{} is {} bytes, over the topic's max_message_bytes of {}",
                        if messages.len() == 1 {
                            "the message".to_string()
                        } else {
                            format!("messages[{index}]")
                        },
                        value.len(),
                        topic.config.max_message_bytes
                    ),
                ));
            }
        }
        if let Some(schema) = &topic.config.schema {
            let view = self.view();
            self.schemas
                .check(&view.state, schema, messages.iter().map(|(_, v)| &v[..]))?;
        }
        let placed: Vec<(u32, u128, Option<Vec<u8>>, bytes::Bytes)> = messages
            .into_iter()
            .map(|(key, value)| {
                let partition = self.pick_partition(topic, key.as_deref());
                (partition, self.next_id(), key, value)
            })
            .collect();
        let ids = placed
            .iter()
            .map(|(_, id, _, _)| format!("{id:032x}"))
            .collect();
        if self.produce_at_owning_shard(topic, &placed).await? {
            return Ok(ids);
        }
        self.write_through_wal(topic, placed).await?;
        Ok(ids)
    }

    /// Appends records (partition, id, key, value) to this shard's WAL as
    /// one all-or-nothing batch (a full ring accepts none), queues each for
    /// dispatch once durable before any await (so a caller dropped while it
    /// waits changes nothing), and returns once all are durable. Produces,
    /// dead-letter moves and redrives all write this way.
    pub(super) async fn write_through_wal(
        &self,
        topic: &Topic,
        placed: Vec<(u32, u128, Option<Vec<u8>>, bytes::Bytes)>,
    ) -> Result<(), ApiError> {
        let accept_ms = self.now();
        let records: Vec<WalRecordRef<'_>> = placed
            .iter()
            .map(|(partition, id, key, value)| WalRecordRef {
                id: *id,
                topic: &topic.name,
                partition: *partition,
                key: key.as_deref(),
                value,
                accept_ms,
                topic_incarnation: Some(topic.incarnation),
                offset: None,
                idempotency: None,
                key_only: false,
            })
            .collect();
        let appended = self
            .wal
            .append_batch(&records)
            .map_err(|e| from_storage(&e))?;
        drop(records);
        let mut last_durable = None;
        for (appended, (partition, id, key, value)) in appended.into_iter().zip(placed) {
            self.dispatch_once_durable(
                &topic.name,
                partition,
                appended.end,
                DispatchRecord {
                    pos: appended.pos,
                    id,
                    key,
                    value,
                    accept_ms,
                    incarnation: Some(topic.incarnation),
                },
            );
            last_durable = Some(appended.durable);
        }
        // Records become durable in the order they were appended.
        if let Some(durable) = last_durable {
            durable.await.map_err(|e| from_storage(&e))?;
        }
        Ok(())
    }

    /// Takes over the WAL ring of a shard that no longer exists (the node
    /// ran with more shards before): its records above the checkpoint are
    /// written again into this shard's ring, dispatched, and the old ring is
    /// removed. A crash half way writes some of them twice, never none.
    pub async fn adopt_wal(self: Rc<Self>, dir: PathBuf, config: WalConfig) {
        let (orphan, recovery) = match Wal::open(&self.env.fs, &dir, config).await {
            Ok(opened) => opened,
            Err(error) => {
                tracing::error!(dir = %dir.display(), %error, "cannot open the WAL of a removed shard; leaving it in place");
                return;
            }
        };
        let records = recovery.records;
        let total = records.len();
        for chunk in records.chunks(ADOPT_CHUNK_RECORDS) {
            let refs: Vec<WalRecordRef<'_>> = chunk
                .iter()
                .map(|r| WalRecordRef {
                    id: r.record.id,
                    topic: &r.record.topic,
                    partition: r.record.partition,
                    key: r.record.key.as_deref(),
                    value: &r.record.value,
                    accept_ms: r.record.accept_ms,
                    topic_incarnation: r.record.topic_incarnation,
                    // Committed the usual way from here: the partition may
                    // belong to another shard now.
                    offset: None,
                    idempotency: None,
                    key_only: false,
                })
                .collect();
            let appended = loop {
                match self.wal.append_batch(&refs) {
                    Ok(appended) => break appended,
                    // The ring frees space as the dispatcher commits.
                    Err(StorageError::WalFull { .. }) => {
                        self.env.runtime.sleep(ADOPT_FULL_RETRY).await;
                    }
                    Err(error) => {
                        tracing::error!(dir = %dir.display(), %error, "adopting a removed shard's WAL failed; it stays for the next start");
                        return;
                    }
                }
            };
            let mut last_durable = None;
            for (appended, recovered) in appended.into_iter().zip(chunk) {
                let record = &recovered.record;
                self.dispatch_once_durable(
                    &record.topic,
                    record.partition,
                    appended.end,
                    DispatchRecord {
                        pos: appended.pos,
                        id: record.id,
                        key: record.key.clone(),
                        value: bytes::Bytes::copy_from_slice(&record.value),
                        accept_ms: record.accept_ms,
                        incarnation: record.topic_incarnation,
                    },
                );
                last_durable = Some(appended.durable);
            }
            if let Some(durable) = last_durable {
                if let Err(error) = durable.await {
                    tracing::error!(dir = %dir.display(), %error, "adopting a removed shard's WAL failed; it stays for the next start");
                    return;
                }
            }
        }
        orphan.close();
        drop(orphan);
        match self.env.fs.remove_dir_all(&dir).await {
            Ok(()) => {
                tracing::info!(dir = %dir.display(), records = total, "adopted the WAL of a removed shard")
            }
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "could not remove an adopted WAL")
            }
        }
    }

    /// Holds a record just appended to the WAL until the group commit that
    /// covers it is durable; [`Self::dispatch_durable`] then hands it to the
    /// dispatcher, whether or not the request that appended it still runs.
    pub(super) fn dispatch_once_durable(
        &self,
        topic: &str,
        partition: u32,
        end: WalPos,
        record: DispatchRecord,
    ) {
        let destination = Destination {
            topic: Rc::from(topic),
            partition,
        };
        self.dispatch
            .awaiting
            .borrow_mut()
            .push_back((end, destination, record));
        if end <= self.wal.durable_end() {
            self.dispatch_durable();
        }
    }

    /// Records accepted here and not yet committed to their owner: waiting
    /// for the WAL's fsync, waiting in the dispatcher, or in flight.
    /// (A failed WAL makes nothing durable again: what waits for it is not
    /// accepted and not counted.)
    pub(crate) fn undispatched(&self) -> usize {
        let awaiting = if self.wal.failure().is_some() {
            0
        } else {
            self.dispatch.awaiting.borrow().len()
        };
        awaiting + self.dispatch.queue.borrow().pending_records() + self.flow.journal_commits.get()
    }

    /// Moves every record the WAL made durable to the dispatcher. The WAL's
    /// committer calls it after each group commit.
    pub fn dispatch_durable(&self) {
        let durable_end = self.wal.durable_end();
        let now = self.now();
        let mut waiting = self.dispatch.awaiting.borrow_mut();
        let mut dispatcher = self.dispatch.queue.borrow_mut();
        let mut moved = false;
        while waiting
            .front()
            .is_some_and(|(end, _, _)| *end <= durable_end)
        {
            if let Some((_, destination, record)) = waiting.pop_front() {
                dispatcher.push(destination, record, now);
                moved = true;
            }
        }
        drop((waiting, dispatcher));
        if moved {
            self.dispatch.signal.notify();
        }
    }

    /// Hands records recovered from the WAL to the dispatcher again.
    pub fn redispatch(&self, records: Vec<(u64, WalRecord)>) {
        let now = self.now();
        let mut dispatcher = self.dispatch.queue.borrow_mut();
        for (pos, record) in records {
            let destination = Destination {
                topic: Rc::from(record.topic.as_str()),
                partition: record.partition,
            };
            dispatcher.push(
                destination,
                DispatchRecord {
                    pos,
                    id: record.id,
                    key: record.key,
                    value: record.value.into(),
                    accept_ms: record.accept_ms,
                    incarnation: record.topic_incarnation,
                },
                now,
            );
        }
        drop(dispatcher);
        self.dispatch.signal.notify();
    }
}
