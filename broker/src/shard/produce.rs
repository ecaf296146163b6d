//! Produce: records appended to the ingress WAL and handed to the
//! dispatcher once durable, also when the request that appended them is gone;
//! adopting the WAL of a removed shard; redispatch after a restart.

use super::*;
use crate::metric_names::PRODUCE_DUPLICATES_TOTAL;
use narad_storage::wal::IdempotencyRef;

/// One message of a produce, as the API hands it over.
#[derive(Debug, Clone)]
pub struct Incoming {
    pub key: Option<Vec<u8>>,
    pub value: bytes::Bytes,
    /// The producer's idempotency key (already checked).
    pub idempotency_key: Option<Vec<u8>>,
    /// The partition the producer chose (a Kafka client does; checked
    /// against the topic's count); `None`: by key, else round robin.
    pub partition: Option<u32>,
}

impl Incoming {
    /// A message with no key and no idempotency key.
    pub fn value(value: bytes::Bytes) -> Self {
        Self {
            key: None,
            value,
            idempotency_key: None,
            partition: None,
        }
    }
}

/// What a produce answers: an id per message (a duplicate's is its first
/// copy's) and the indexes of the duplicates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceOutcome {
    pub ids: Vec<String>,
    pub duplicates: Vec<usize>,
}

/// An idempotency key as a record carries it: what it is known by and
/// when it expires.
#[derive(Debug, Clone)]
pub(crate) struct Keyed {
    pub key: Arc<KeyId>,
    pub expires_ms: u64,
}

impl Keyed {
    pub fn as_wal(&self) -> IdempotencyRef<'_> {
        IdempotencyRef {
            key: &self.key.key,
            expires_ms: self.expires_ms,
        }
    }
}

/// A message placed on its partition, with its id.
#[derive(Debug, Clone)]
pub(crate) struct Placed {
    pub partition: u32,
    pub id: u128,
    pub key: Option<Vec<u8>>,
    pub value: bytes::Bytes,
    pub idempotency: Option<Keyed>,
}

/// A write that failed after an earlier part of its produce was stored:
/// the answer must not say nothing was.
fn stored_in_part(error: &ApiError) -> ApiError {
    ApiError::new(
        ErrorCode::Internal,
        format!(
            "part of this request was stored before the rest failed ({}); send it again",
            error.message
        ),
    )
}

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
    /// covering all of them is durable. Items whose idempotency key this
    /// node accepted within the topic's window are not written again:
    /// their id is the first copy's, answered once that copy is durable.
    pub async fn produce(
        &self,
        topic: &Topic,
        messages: Vec<Incoming>,
    ) -> Result<ProduceOutcome, ApiError> {
        self.refuse_if_stopping()?;
        self.refuse_if_wal_failed()?;
        for (index, message) in messages.iter().enumerate() {
            if let Some(partition) = message.partition {
                if partition >= topic.config.partitions {
                    return Err(ApiError::new(
                        ErrorCode::NotFound,
                        format!(
                            "topic {} has no partition {partition} (it has {})",
                            topic.name, topic.config.partitions
                        ),
                    ));
                }
            }
            let size = message.value.len();
            if size as u64 > topic.config.max_message_bytes {
                return Err(ApiError::new(
                    ErrorCode::TooLarge,
                    format!(
                        "{} is {} bytes, over the topic's max_message_bytes of {}",
                        if messages.len() == 1 {
                            "the message".to_string()
                        } else {
                            format!("messages[{index}]")
                        },
                        size,
                        topic.config.max_message_bytes
                    ),
                ));
            }
        }
        if let Some(schema) = &topic.config.schema {
            let view = self.view();
            self.schemas
                .check(&view.state, schema, messages.iter().map(|m| &m.value[..]))?;
        }
        let window = topic.config.idempotency_window_ms;
        let keyed = window > 0 && messages.iter().any(|m| m.idempotency_key.is_some());
        if keyed && !self.env.keys.ready() {
            return Err(ApiError::new(
                ErrorCode::CatchingUp,
                "the node is still recovering the idempotency keys it accepted; try again shortly",
            ));
        }
        let accept_ms = self.wall();
        let topic_name: Arc<str> = Arc::from(topic.name.as_str());
        let placed: Vec<Placed> = messages
            .into_iter()
            .map(|message| {
                let idempotency = message
                    .idempotency_key
                    .filter(|_| window > 0)
                    .map(|key| Keyed {
                        key: Arc::new(KeyId {
                            topic: topic_name.clone(),
                            incarnation: topic.incarnation,
                            key,
                        }),
                        expires_ms: accept_ms.saturating_add(window),
                    });
                // Every copy of a keyless message meets at one owner.
                let routing = message
                    .key
                    .as_deref()
                    .or(idempotency.as_ref().map(|k| &k.key.key[..]));
                Placed {
                    partition: message
                        .partition
                        .unwrap_or_else(|| self.pick_partition(topic, routing)),
                    id: self.next_id(),
                    key: message.key,
                    value: message.value,
                    idempotency,
                }
            })
            .collect();
        let mut ids: Vec<String> = placed.iter().map(|p| format!("{:032x}", p.id)).collect();
        if !keyed {
            if !self.produce_at_owning_shard(topic, &placed).await? {
                self.write_through_wal(topic, placed).await?;
            }
            return Ok(ProduceOutcome {
                ids,
                duplicates: Vec::new(),
            });
        }
        // Items to settle: all of them first; then those whose first copy
        // was let go unwritten while this produce waited for it (it wrote
        // nothing: this produce writes them instead).
        let mut pending: Vec<(usize, Placed)> = placed.into_iter().enumerate().collect();
        let mut duplicates = Vec::new();
        let mut wrote = false;
        for _ in 0..IDEMPOTENT_CLAIM_ROUNDS {
            let wanted: Vec<Wanted> = pending
                .iter()
                .filter_map(|(_, p)| {
                    let keyed = p.idempotency.as_ref()?;
                    Some(Wanted {
                        key: keyed.key.clone(),
                        id: p.id,
                        expires_ms: keyed.expires_ms,
                    })
                })
                .collect();
            // Claimed in one step: the guard lets go of claims nothing wrote.
            let (claims, guard) = self.env.keys.claim(self.wall(), &wanted);
            let mut claims = claims.into_iter();
            let mut to_write = Vec::with_capacity(pending.len());
            let mut waiting = Vec::new();
            for (index, item) in pending.drain(..) {
                let claim = match &item.idempotency {
                    Some(_) => claims.next().unwrap_or(Claim::New),
                    None => Claim::New,
                };
                match claim {
                    Claim::New => to_write.push(item),
                    Claim::Duplicate { first, durable } => {
                        ids[index] = format!("{first:032x}");
                        if durable {
                            duplicates.push(index);
                        } else {
                            waiting.push((index, item, first));
                        }
                    }
                }
            }
            // Through the owner journal where it takes them (the records'
            // keys are marked written as its task appends them, whatever
            // becomes of this request), else the WAL path, appended before
            // its first await: either way the claims are written by the
            // time the guard could drop, or taken again when written. A
            // power cut may keep the journal's copy in the log and take its
            // WAL record: the owner reads the key back from the log, and
            // drops a retry's copy there.
            if !to_write.is_empty() {
                let written = match self.produce_at_owning_shard(topic, &to_write).await {
                    Ok(true) => Ok(()),
                    Ok(false) => self.write_through_wal(topic, to_write).await,
                    Err(error) => Err(error),
                };
                written.map_err(|e| if wrote { stored_in_part(&e) } else { e })?;
                wrote = true;
            }
            drop(guard);
            // A duplicate's 202 promises what the first copy's does: durable.
            for (index, item, first) in waiting {
                let durable = match item.idempotency.as_ref() {
                    Some(keyed) => {
                        let copy = self.env.keys.durable_copy(keyed.key.clone(), first);
                        copy.await.is_ok()
                    }
                    None => false,
                };
                if durable {
                    duplicates.push(index);
                } else {
                    ids[index] = format!("{:032x}", item.id);
                    pending.push((index, item));
                }
            }
            if pending.is_empty() {
                break;
            }
        }
        if !pending.is_empty() {
            return Err(ApiError::new(
                ErrorCode::Internal,
                "the first copies of messages with these idempotency keys kept failing to be written; send them again (this request may have been stored in part)",
            ));
        }
        duplicates.sort_unstable();
        if !duplicates.is_empty() {
            metrics::counter!(PRODUCE_DUPLICATES_TOTAL, "topic" => topic.name.clone(), "at" => "node")
                .increment(duplicates.len() as u64);
        }
        Ok(ProduceOutcome { ids, duplicates })
    }

    /// Appends records to this shard's WAL as
    /// one all-or-nothing batch (a full ring accepts none), queues each for
    /// dispatch once durable before any await (so a caller dropped while it
    /// waits changes nothing), and returns once all are durable. Produces,
    /// dead-letter moves and redrives all write this way.
    pub(super) async fn write_through_wal(
        &self,
        topic: &Topic,
        placed: Vec<Placed>,
    ) -> Result<(), ApiError> {
        let accept_ms = self.wall();
        let records: Vec<WalRecordRef<'_>> = placed
            .iter()
            .map(|p| WalRecordRef {
                id: p.id,
                topic: &topic.name,
                partition: p.partition,
                key: p.key.as_deref(),
                value: &p.value,
                accept_ms,
                topic_incarnation: Some(topic.incarnation),
                offset: None,
                idempotency: p.idempotency.as_ref().map(Keyed::as_wal),
                key_only: false,
            })
            .collect();
        let appended = self
            .wal
            .append_batch(&records)
            .map_err(|e| from_storage(&e))?;
        drop(records);
        self.mark_keys_written(
            appended
                .iter()
                .zip(&placed)
                .map(|(a, p)| (a.end, p.id, p.idempotency.as_ref())),
        );
        let mut last_durable = None;
        for (appended, placed) in appended.into_iter().zip(placed) {
            self.dispatch_once_durable(
                &topic.name,
                placed.partition,
                appended.end,
                DispatchRecord {
                    pos: appended.pos,
                    id: placed.id,
                    key: placed.key,
                    value: placed.value,
                    accept_ms,
                    incarnation: Some(topic.incarnation),
                    idempotency_key: placed
                        .idempotency
                        .map(|k| bytes::Bytes::copy_from_slice(&k.key.key)),
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

    /// Marks the idempotency keys of records just appended to this shard's
    /// WAL as written (in the same step as the append), to be marked
    /// durable by [`Self::dispatch_durable`].
    pub(super) fn mark_keys_written<'a>(
        &self,
        appended: impl IntoIterator<Item = (WalPos, u128, Option<&'a Keyed>)>,
    ) {
        let mut marks = self.dispatch.key_marks.borrow_mut();
        for (end, id, keyed) in appended {
            if let Some(keyed) = keyed {
                self.env.keys.written(&keyed.key, id, keyed.expires_ms);
                marks.push_back((end, (keyed.key.clone(), id)));
            }
        }
    }

    /// Idempotency keys the node holds, and those it let go early (full).
    pub fn idempotency_keys(&self) -> (usize, u64) {
        self.env.keys.stats()
    }

    /// The WAL failed: the keys of records it will never make durable are
    /// let go (their duplicates learn it).
    pub(super) fn keys_lost(&self) {
        let lost: Vec<HeldCopy> = self
            .dispatch
            .key_marks
            .borrow_mut()
            .drain(..)
            .map(|(_, mark)| mark)
            .collect();
        self.env.keys.lost(&lost);
    }

    /// Takes over the WAL ring of a shard that no longer exists (the node
    /// ran with more shards before): its records above the checkpoint are
    /// written again into this shard's ring, dispatched, and the old ring is
    /// removed. A crash half way writes some of them twice, never none.
    pub async fn adopt_wal(self: Rc<Self>, dir: PathBuf, config: WalConfig) {
        let (orphan, recovery) = match Wal::open(&self.env.fs, &dir, config).await {
            Ok(opened) => opened,
            Err(error) => {
                tracing::error!(dir = %dir.display(), %error, "cannot open the WAL of a removed shard; leaving it in place (the idempotency keys it holds are not known until it opens)");
                self.env.keys.shard_loaded();
                return;
            }
        };
        // Its keys hold here too, and in this shard's ring from now on
        // (as key-only records: their own records may be committed).
        self.env
            .keys
            .recover(recovery.keys.iter().map(|(_, key)| key), self.wall());
        self.env.keys.shard_loaded();
        let carried: Vec<WalRecord> = recovery.keys.iter().map(|(_, k)| k.carried()).collect();
        for chunk in carried.chunks(ADOPT_CHUNK_RECORDS) {
            let refs: Vec<WalRecordRef<'_>> = chunk.iter().map(WalRecord::as_ref).collect();
            let appended = match self.append_when_room(&refs).await {
                Ok(appended) => appended,
                Err(error) => {
                    tracing::error!(dir = %dir.display(), %error, "adopting a removed shard's WAL failed; it stays for the next start");
                    return;
                }
            };
            if let Some(last) = appended.into_iter().last() {
                if let Err(error) = last.durable.await {
                    tracing::error!(dir = %dir.display(), %error, "adopting a removed shard's WAL failed; it stays for the next start");
                    return;
                }
            }
        }
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
                    idempotency: r.record.idempotency.as_ref().map(|i| IdempotencyRef {
                        key: &i.key,
                        expires_ms: i.expires_ms,
                    }),
                    key_only: false,
                })
                .collect();
            let appended = match self.append_when_room(&refs).await {
                Ok(appended) => appended,
                Err(error) => {
                    tracing::error!(dir = %dir.display(), %error, "adopting a removed shard's WAL failed; it stays for the next start");
                    return;
                }
            };
            let mut last_durable = None;
            for (appended, recovered) in appended.into_iter().zip(chunk) {
                let record = &recovered.record;
                // It may be in its partition's log already.
                self.env
                    .recovered
                    .note(&record.topic, record.partition, record.accept_ms);
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
                        idempotency_key: record
                            .idempotency
                            .as_ref()
                            .map(|i| bytes::Bytes::copy_from_slice(&i.key)),
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

    /// Appends `refs` as one batch, waiting while the ring is full (it
    /// frees space as the dispatcher commits).
    async fn append_when_room(
        &self,
        refs: &[WalRecordRef<'_>],
    ) -> Result<Vec<narad_storage::wal::Appended>, StorageError> {
        loop {
            match self.wal.append_batch(refs) {
                Err(StorageError::WalFull { .. }) => {
                    self.env.runtime.sleep(ADOPT_FULL_RETRY).await;
                }
                other => return other,
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
        let now = self.mono();
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
        let durable: Vec<HeldCopy> = {
            let mut marks = self.dispatch.key_marks.borrow_mut();
            let count = marks.partition_point(|(end, _)| *end <= durable_end);
            marks.drain(..count).map(|(_, mark)| mark).collect()
        };
        if !durable.is_empty() {
            self.env.keys.durable(&durable);
        }
    }

    /// Hands records recovered from the WAL to the dispatcher again.
    pub fn redispatch(&self, records: Vec<(u64, WalRecord)>) {
        let now = self.mono();
        let mut dispatcher = self.dispatch.queue.borrow_mut();
        for (pos, record) in records {
            // It may be in its partition's log already.
            self.env
                .recovered
                .note(&record.topic, record.partition, record.accept_ms);
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
                    idempotency_key: record.idempotency.map(|i| i.key.into()),
                },
                now,
            );
        }
        drop(dispatcher);
        self.dispatch.signal.notify();
    }
}
