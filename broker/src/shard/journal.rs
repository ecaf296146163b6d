//! The produce path through the owner journal (`owner/journal.rs`): a
//! request whose messages all go to one partition of this shard, open and
//! not moving, is committed with one fdatasync (the WAL's) before its 202,
//! and is consumable as the 202 leaves. Everything else takes the path of
//! `produce.rs` (WAL, then the dispatcher's commit to the owner). Messages
//! with idempotency keys go through the journal too: their WAL records
//! carry the keys (the node's table marks them written in the same step),
//! and the owner judges the keys under its append turn, refusing a batch
//! with a key it holds (that batch takes the WAL path, where the owner's
//! commit drops the copy).

use super::*;
use crate::dispatcher::DispatchRecord;
use crate::limits::{JOURNAL_BATCH_BYTES, JOURNAL_REPLAY_RETRY};
use crate::owner::{JournalAppend, JournalError};

/// A produce waiting for its partition's next journal batch.
pub(super) struct JournalRequest {
    messages: Vec<Message>,
    /// Each message's idempotency key as the node's table knows it (empty
    /// when none has one).
    keys: Vec<Option<Keyed>>,
    answer: futures_channel::oneshot::Sender<Result<(), JournalOutcome>>,
}

/// The requests queued for one partition, and whether a task takes them.
#[derive(Default)]
pub(super) struct JournalQueue {
    requests: std::collections::VecDeque<JournalRequest>,
    draining: bool,
}

/// Why a produce did not go through the journal.
pub(super) enum JournalOutcome {
    /// Nothing was written: take the usual path.
    NotTaken,
    /// It failed; the client gets this error.
    Failed(ApiError),
}

impl<F: FileSystem> Shard<F> {
    /// Commits a produce whose messages all go to one partition of this
    /// node through its owning shard's journal: here, or one hop away on
    /// another shard. `false`: nothing was written (the partition is not
    /// this node's, not open, moving, or the messages go to several
    /// partitions), and the produce takes the WAL path.
    pub(super) async fn produce_at_owning_shard(
        &self,
        topic: &Topic,
        placed: &[Placed],
    ) -> Result<bool, ApiError> {
        let Some(partition) = placed.first().map(|p| p.partition) else {
            return Ok(false);
        };
        if placed.iter().any(|p| p.partition != partition) {
            return Ok(false);
        }
        match self.placement(topic).locate(partition) {
            Location::Here => {
                let Some(owner) = self.journal_owner(topic, placed) else {
                    return Ok(false);
                };
                match self.produce_through_journal(topic, owner, placed).await {
                    Ok(()) => Ok(true),
                    Err(JournalOutcome::Failed(error)) => Err(error),
                    Err(JournalOutcome::NotTaken) => Ok(false),
                }
            }
            Location::Shard(shard) => {
                let accept_ms = self.wall();
                let op = Produce {
                    topic: TopicRef::of(topic),
                    partition,
                    messages: placed
                        .iter()
                        .map(|p| Record {
                            id: p.id,
                            produced_at_ms: accept_ms,
                            key: p.key.clone(),
                            value: p.value.clone(),
                        })
                        .collect(),
                    keys: placed
                        .iter()
                        .enumerate()
                        .filter_map(|(index, p)| {
                            let keyed = p.idempotency.as_ref()?;
                            Some(ProduceKey {
                                index: u32::try_from(index).ok()?,
                                key: keyed.key.key.clone(),
                                expires_ms: keyed.expires_ms,
                            })
                        })
                        .collect(),
                };
                // No answer (the node is stopping) may follow a commit:
                // an error then, never a second copy through the WAL.
                let to = Address::Shard(shard);
                self.call(to, op, None).await.map_err(|e| e.to_api(to))?
            }
            Location::Node(_) => Ok(false),
        }
    }

    /// Another shard of this node sends a produce for a partition of this
    /// shard: it goes through the journal if it can.
    pub(super) async fn produce_for_shard(&self, op: Produce, from: Reach) -> Produced {
        if from != Reach::Shard {
            // Another node's records take the WAL path there.
            return Ok(false);
        }
        self.refuse_if_stopping()?;
        let topic = self.topic_at(&op.topic)?;
        let mut placed: Vec<Placed> = op
            .messages
            .into_iter()
            .map(|r| Placed {
                partition: op.partition,
                id: r.id,
                key: r.key,
                value: r.value,
                idempotency: None,
            })
            .collect();
        if !op.keys.is_empty() {
            let name: Arc<str> = Arc::from(topic.name.as_str());
            for key in op.keys {
                let index = usize::try_from(key.index).unwrap_or(usize::MAX);
                let Some(item) = placed.get_mut(index) else {
                    return Err(ApiError::new(
                        ErrorCode::Internal,
                        "a produce between shards named a key of a message it lacks",
                    ));
                };
                item.idempotency = Some(Keyed {
                    key: Arc::new(KeyId {
                        topic: name.clone(),
                        incarnation: topic.incarnation,
                        key: key.key,
                    }),
                    expires_ms: key.expires_ms,
                });
            }
        }
        let Some(owner) = self.journal_owner(&topic, &placed) else {
            return Ok(false);
        };
        match self.produce_through_journal(&topic, owner, &placed).await {
            Ok(()) => Ok(true),
            Err(JournalOutcome::Failed(error)) => Err(error),
            Err(JournalOutcome::NotTaken) => Ok(false),
        }
    }

    /// The owner a produce can go through the journal of: every message
    /// goes to one partition, that partition is this shard's, open, and
    /// not frozen for a move.
    pub(super) fn journal_owner(&self, topic: &Topic, placed: &[Placed]) -> Option<Owner<F>> {
        let partition = placed.first()?.partition;
        if placed.iter().any(|p| p.partition != partition)
            || self.placement(topic).locate(partition) != Location::Here
            || self.is_frozen(topic, partition)
        {
            return None;
        }
        let key = (topic.name.clone(), topic.incarnation, partition);
        match self.owners.slots.borrow().get(&key) {
            Some(OwnerSlot::Ready(owner)) => Some(owner.clone()),
            _ => None,
        }
    }

    /// Commits a produce through the journal and waits for it. Requests to
    /// one partition queue: one task per partition takes everything queued
    /// as one journal batch while the previous batch's write is under way
    /// (no linger), and no client drops it, so what it wrote is followed
    /// through.
    pub(super) async fn produce_through_journal(
        &self,
        topic: &Topic,
        owner: Owner<F>,
        placed: &[Placed],
    ) -> Result<(), JournalOutcome> {
        let Some(shard) = self.me.upgrade() else {
            return Err(JournalOutcome::NotTaken);
        };
        let accept_ms = self.wall();
        let partition = placed.first().map_or(0, |p| p.partition);
        let messages: Vec<Message> = placed
            .iter()
            .map(|p| Message {
                id: p.id,
                produced_at_ms: accept_ms,
                key: p.key.clone(),
                value: p.value.clone(),
                idempotency_key: p
                    .idempotency
                    .as_ref()
                    .map(|k| bytes::Bytes::copy_from_slice(&k.key.key)),
            })
            .collect();
        let keys: Vec<Option<Keyed>> = if placed.iter().any(|p| p.idempotency.is_some()) {
            placed.iter().map(|p| p.idempotency.clone()).collect()
        } else {
            Vec::new()
        };
        let key = (topic.name.clone(), topic.incarnation, partition);
        let (answer, answered) = futures_channel::oneshot::channel();
        self.flow
            .journal_commits
            .set(self.flow.journal_commits.get() + 1);
        let start = {
            let mut queues = self.journal_queues.borrow_mut();
            let queue = queues.entry(key.clone()).or_default();
            queue.requests.push_back(JournalRequest {
                messages,
                keys,
                answer,
            });
            !std::mem::replace(&mut queue.draining, true)
        };
        if start {
            let topic_name: Rc<str> = Rc::from(topic.name.as_str());
            self.env
                .runtime
                .spawn(Box::pin(shard.drain_journal(key, owner, topic_name)));
        }
        answered.await.unwrap_or_else(|_| {
            Err(JournalOutcome::Failed(ApiError::new(
                ErrorCode::Internal,
                "the commit task ended without an answer",
            )))
        })
    }

    /// Takes the requests queued for one partition, as many as fit one
    /// journal batch, until none is left.
    async fn drain_journal(self: Rc<Self>, key: OwnerKey, owner: Owner<F>, topic: Rc<str>) {
        loop {
            let batch = {
                let mut queues = self.journal_queues.borrow_mut();
                let Some(queue) = queues.get_mut(&key) else {
                    return;
                };
                let mut batch = Vec::new();
                let mut bytes = 0;
                while let Some(next) = queue.requests.front() {
                    let size: usize = next.messages.iter().map(|m| m.value.len()).sum();
                    if !batch.is_empty() && bytes + size > JOURNAL_BATCH_BYTES {
                        break;
                    }
                    bytes += size;
                    if let Some(request) = queue.requests.pop_front() {
                        batch.push(request);
                    }
                }
                if batch.is_empty() {
                    queues.remove(&key);
                    return;
                }
                batch
            };
            // The partition may have closed (moved, deleted) since: the
            // usual path knows what to do with those records.
            let current = matches!(
                self.owners.slots.borrow().get(&key),
                Some(OwnerSlot::Ready(open)) if Rc::ptr_eq(open, &owner)
            );
            if !current {
                self.answer_journal(batch, || Err(JournalOutcome::NotTaken));
                continue;
            }
            self.journal_batch(&key, &owner, &topic, batch).await;
        }
    }

    /// Answers every request of a batch.
    fn answer_journal(
        &self,
        batch: Vec<JournalRequest>,
        outcome: impl Fn() -> Result<(), JournalOutcome>,
    ) {
        let answered = batch.len();
        for request in batch {
            let _ = request.answer.send(outcome());
        }
        let commits = &self.flow.journal_commits;
        commits.set(commits.get().saturating_sub(answered));
        if self.flow.stopping.get() {
            // A stop's dispatcher loop waits for these too.
            self.dispatch.signal.notify();
        }
    }

    /// One journal batch: appended under the partition's turn; its
    /// durability awaited on a task of its own, so the next batch of the
    /// partition goes at once.
    async fn journal_batch(
        &self,
        key: &OwnerKey,
        owner: &Owner<F>,
        topic: &Rc<str>,
        batch: Vec<JournalRequest>,
    ) {
        let (_, incarnation, partition) = *key;
        let messages: Vec<Message> = batch
            .iter()
            .flat_map(|r| r.messages.iter().cloned())
            .collect();
        let keys: Vec<Option<&Keyed>> = batch
            .iter()
            .flat_map(|r| {
                let none = if r.keys.is_empty() {
                    r.messages.len()
                } else {
                    0
                };
                r.keys
                    .iter()
                    .map(Option::as_ref)
                    .chain(std::iter::repeat_n(None, none))
            })
            .collect();
        let wal = self.wal.clone();
        let taken = owner
            .journal_append(&messages, self.now(), |base| {
                let records: Vec<WalRecordRef<'_>> = messages
                    .iter()
                    .zip(&keys)
                    .zip(base..)
                    .map(|((message, keyed), offset)| WalRecordRef {
                        id: message.id,
                        topic,
                        partition,
                        key: message.key.as_deref(),
                        value: &message.value,
                        accept_ms: message.produced_at_ms,
                        topic_incarnation: Some(incarnation),
                        offset: Some(offset),
                        idempotency: keyed.map(Keyed::as_wal),
                        key_only: false,
                    })
                    .collect();
                let appended = wal.append_batch(&records)?;
                // In the same step as the append, as on the WAL path.
                self.mark_keys_written(
                    appended
                        .iter()
                        .zip(&messages)
                        .zip(&keys)
                        .map(|((a, m), keyed)| (a.end, m.id, *keyed)),
                );
                Ok(appended)
            })
            .await;
        drop(keys);
        let Some(shard) = self.me.upgrade() else {
            return;
        };
        match taken {
            Ok(JournalAppend { base, appended }) => {
                let positions: Vec<WalPos> = appended.iter().map(|a| a.pos).collect();
                let durable = appended.into_iter().last().map(|a| a.durable);
                let (owner, topic) = (owner.clone(), topic.clone());
                self.env.runtime.spawn(Box::pin(async move {
                    let outcome = match durable {
                        Some(durable) => durable.await,
                        None => Ok(()),
                    };
                    match outcome {
                        Ok(()) => {
                            owner.journal_durable(base, positions);
                            shard.announce_available(&topic, count_of(messages.len()));
                            shard.answer_journal(batch, || Ok(()));
                        }
                        Err(error) => {
                            owner.journal_failed(base);
                            let error = from_storage(&error);
                            shard.answer_journal(batch, || {
                                Err(JournalOutcome::Failed(error.clone()))
                            });
                        }
                    }
                }));
            }
            Err(JournalError::Refused) => {
                self.answer_journal(batch, || Err(JournalOutcome::NotTaken))
            }
            Err(JournalError::Wal(error)) => {
                let error = from_storage(&error);
                self.answer_journal(batch, || Err(JournalOutcome::Failed(error.clone())));
            }
            Err(JournalError::LogFailed { appended, error }) => {
                // The WAL holds them: the dispatcher commits them like any
                // other record (to this partition once its log takes appends
                // again, else to a sibling).
                tracing::warn!(%error, "a journal commit failed in the log; the dispatcher commits it");
                let mut last_durable = None;
                for (appended, message) in appended.into_iter().zip(messages) {
                    self.dispatch_once_durable(
                        topic,
                        partition,
                        appended.end,
                        DispatchRecord {
                            pos: appended.pos,
                            id: message.id,
                            key: message.key,
                            value: message.value,
                            accept_ms: message.produced_at_ms,
                            incarnation: Some(incarnation),
                            idempotency_key: message.idempotency_key,
                        },
                    );
                    last_durable = Some(appended.durable);
                }
                self.env.runtime.spawn(Box::pin(async move {
                    let outcome = match last_durable {
                        Some(durable) => durable.await.map_err(|e| from_storage(&e)),
                        None => Ok(()),
                    };
                    match outcome {
                        Ok(()) => shard.answer_journal(batch, || Ok(())),
                        Err(error) => shard
                            .answer_journal(batch, || Err(JournalOutcome::Failed(error.clone()))),
                    }
                }));
            }
        }
    }

    /// Syncs what every open partition wrote behind for the journal, so
    /// the WAL can reclaim the journal copies.
    pub async fn sync_journals(&self) {
        for owner in self.open_owners() {
            if !owner.journal_waiting() {
                continue;
            }
            if let Err(error) = owner.sync_journal().await {
                tracing::warn!(%error, "syncing a partition's journal batches failed");
            }
        }
    }

    /// Sets recovered journal records aside for their partitions' open;
    /// returns the other records.
    pub(super) fn set_journal_aside(
        &self,
        recovered: Vec<(WalPos, WalRecord)>,
    ) -> Vec<(WalPos, WalRecord)> {
        let mut replay = self.journal_replay.borrow_mut();
        let mut rest = Vec::with_capacity(recovered.len());
        for (pos, record) in recovered {
            match (record.offset, record.topic_incarnation) {
                (Some(_), Some(incarnation)) => replay
                    .entry((record.topic.clone(), incarnation, record.partition))
                    .or_default()
                    .push((pos, record)),
                _ => rest.push((pos, record)),
            }
        }
        for records in replay.values_mut() {
            records.sort_by_key(|(_, r)| r.offset);
        }
        rest
    }

    /// Appends the journal records set aside for a partition that just
    /// opened at their offsets; those the log cannot take there go to the
    /// dispatcher.
    pub(super) async fn replay_journal_into(
        &self,
        key: &OwnerKey,
        owner: &PartitionOwner<F>,
    ) -> Result<(), ApiError> {
        // Taken out only once they are back: an open dropped half way
        // leaves them for the next (which finds those it appended by id).
        let Some(records) = self.journal_replay.borrow().get(key).cloned() else {
            return Ok(());
        };
        let count = records.len();
        let topic = Rc::from(key.0.as_str());
        let entries: Vec<(WalPos, u64, Message)> = records
            .into_iter()
            .map(|(pos, record)| {
                let offset = record.offset.unwrap_or(0);
                let message = Message {
                    id: record.id,
                    produced_at_ms: record.accept_ms,
                    key: record.key,
                    value: record.value.into(),
                    idempotency_key: record.idempotency.map(|i| i.key.into()),
                };
                (pos, offset, message)
            })
            .collect();
        let leftover = owner
            .replay_journal(entries, self.now())
            .await
            .map_err(|e| from_owner(&e))?;
        self.journal_replay.borrow_mut().remove(key);
        tracing::info!(
            topic = %key.0,
            partition = key.2,
            records = count,
            again_as_new = leftover.len(),
            "journal records recovered from the WAL"
        );
        let now = self.mono();
        let mut dispatcher = self.dispatch.queue.borrow_mut();
        for (pos, message) in leftover {
            dispatcher.push(
                Destination {
                    topic: Rc::clone(&topic),
                    partition: key.2,
                },
                DispatchRecord {
                    pos,
                    id: message.id,
                    key: message.key,
                    value: message.value,
                    accept_ms: message.produced_at_ms,
                    incarnation: Some(key.1),
                    idempotency_key: message.idempotency_key,
                },
                now,
            );
        }
        drop(dispatcher);
        self.dispatch.signal.notify();
        Ok(())
    }

    /// Once the metadata is known: opens the partitions of this shard that
    /// recovered journal records (which appends them), and gives the
    /// records of partitions that are no longer this shard's to the
    /// dispatcher. Tries again until none is left.
    pub async fn replay_journals(self: Rc<Self>) {
        loop {
            if self.journal_replay.borrow().is_empty() || self.flow.stopping.get() {
                return;
            }
            if self.env.meta.caught_up() {
                let keys: Vec<OwnerKey> = self.journal_replay.borrow().keys().cloned().collect();
                for key in keys {
                    let topic = self.topic(&key.0).ok();
                    let here = topic.as_ref().filter(|t| {
                        t.incarnation == key.1
                            && key.2 < t.config.partitions
                            && self.placement(t).locate(key.2) == Location::Here
                    });
                    match here {
                        Some(topic) => {
                            if let Err(error) = self.owner(topic, key.2).await {
                                tracing::warn!(topic = %key.0, partition = key.2, %error, "could not open a partition to replay its journal; trying again");
                            }
                        }
                        None => {
                            let records = self.journal_replay.borrow_mut().remove(&key);
                            if let Some(records) = records {
                                self.redispatch(records);
                            }
                        }
                    }
                }
            }
            self.env.runtime.sleep(JOURNAL_REPLAY_RETRY).await;
        }
    }
}
