//! The owner journal: a commit to a partition owned by the shard that
//! accepted it is made durable by one fdatasync, the shard's WAL group
//! commit, before it becomes visible.
//!
//! Under the partition's append turn the owner gives the batch its offsets,
//! the shard writes the journal copy (WAL records carrying those offsets),
//! and the log writes the batch behind (no sync). Once the WAL flush that
//! holds the copy is synced and read back, the batch becomes visible and
//! the producer gets its 202. The log's copy is synced and read back later
//! ([`PartitionOwner::sync_journal`]); only then are the WAL records marked
//! committed, so a visible message is always in at least one verified place.
//! After a crash the shard appends journal records the log lacks at their
//! own offsets before the partition opens (`Shard::open_owner`).
//!
//! A batch whose messages carry idempotency keys is judged against the
//! keys the partition holds under the same turn, before it gets offsets:
//! one holding a key the partition holds (or twice) is refused, and takes
//! the usual path, whose commit drops the copy. The keys of a batch taken
//! are remembered at once, before its copies are durable: a commit judging
//! a later copy against them first syncs what the journal wrote behind
//! (`PartitionOwner::commit`), so a copy is only ever dropped for one a
//! power cut cannot take.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;

use narad_storage::clock::Now;
use narad_storage::io::FileSystem;
use narad_storage::log::{Message, PartitionLog, StoredMessage};
use narad_storage::wal::{Appended, Wal, WalPos};
use narad_storage::StorageError;

use super::{recent_key, record_commit_time, OwnerError, PartitionOwner};
use crate::limits::{JOURNAL_REPLAY_BATCH_BYTES, JOURNAL_REPLAY_BATCH_RECORDS};
use crate::rates::RateEvent;

/// The journal state of one partition.
pub(super) struct Journal<F: FileSystem> {
    /// The shard's WAL, which holds the journal copies (set when the shard
    /// opens the owner; without it nothing goes through the journal).
    wal: RefCell<Option<Rc<Wal<F>>>>,
    /// Batches written behind whose journal copy is not durable yet, by
    /// base offset, with their end: not visible.
    waiting: RefCell<BTreeMap<u64, u64>>,
    /// Batches whose journal copy failed (the WAL failed): visible once
    /// the log's own copy is verified.
    unjournaled: RefCell<BTreeMap<u64, u64>>,
    /// Journal copies of visible batches, with the end offset of each
    /// batch, until the log's copy is verified.
    held: RefCell<VecDeque<(u64, Vec<WalPos>)>>,
    /// The log lost batches the journal holds: no more appends.
    broken: Cell<bool>,
}

impl<F: FileSystem> Default for Journal<F> {
    fn default() -> Self {
        Self {
            wal: RefCell::new(None),
            waiting: RefCell::default(),
            unjournaled: RefCell::default(),
            held: RefCell::default(),
            broken: Cell::new(false),
        }
    }
}

impl<F: FileSystem> Journal<F> {
    /// The end of what consumers may see, given the log's end.
    pub(super) fn visible_end(&self, log_end: u64) -> u64 {
        let first_waiting = self.waiting.borrow().keys().next().copied();
        let first_unjournaled = self.unjournaled.borrow().keys().next().copied();
        [first_waiting, first_unjournaled]
            .into_iter()
            .flatten()
            .fold(log_end, u64::min)
    }

    /// Whether a batch written behind waits for its journal copy.
    pub(super) fn writing_behind(&self) -> bool {
        !self.waiting.borrow().is_empty()
    }

    pub(super) fn broken(&self) -> bool {
        self.broken.get()
    }
}

/// A batch the journal took: its first offset and its WAL records.
pub struct JournalAppend {
    pub base: u64,
    pub appended: Vec<Appended>,
}

/// Why a batch did not go through the journal.
pub enum JournalError {
    /// Nothing was written (no journal, frozen for a move, or broken):
    /// commit it the usual way.
    Refused,
    /// The WAL refused the records (full, failed): nothing was written.
    Wal(StorageError),
    /// The WAL took the records, but the log took the batch neither behind
    /// nor synced: the dispatcher commits these records like any other.
    LogFailed {
        appended: Vec<Appended>,
        error: OwnerError,
    },
}

impl<F: FileSystem> PartitionOwner<F> {
    /// Lets commits of this partition go through `wal`, the shard's.
    pub fn use_journal(&self, wal: Rc<Wal<F>>) {
        *self.journal.wal.borrow_mut() = Some(wal);
    }

    /// Appends a batch through the journal: under the append turn, gives it
    /// its offsets, has `write_journal` append its journal copy to the WAL
    /// (records carrying those offsets; it must not await), and writes the
    /// batch behind. The batch is not visible until
    /// [`Self::journal_durable`]. Appends made this way and by
    /// [`Self::commit`] take turns; the journal copy of each is appended in
    /// offset order. A batch with an idempotency key the partition holds
    /// within the window, or with one key twice, is refused.
    pub async fn journal_append(
        &self,
        messages: &[Message],
        now: Now,
        write_journal: impl FnOnce(u64) -> Result<Vec<Appended>, StorageError>,
    ) -> Result<JournalAppend, JournalError> {
        let _turn = self.take_append_turn().await;
        self.close_rate_interval(now);
        if self.frozen.get() || self.journal.broken() || self.journal.wal.borrow().is_none() {
            return Err(JournalError::Refused);
        }
        if messages.iter().any(|m| m.idempotency_key.is_some()) {
            let window = self.idempotency_window_ms.get();
            let mut keys = self.keys.borrow_mut();
            keys.expire(window, now.wall_ms);
            if keys.judge(messages, window, now.wall_ms).keep.len() != messages.len() {
                return Err(JournalError::Refused);
            }
        }
        let base = self.log.high_watermark();
        let end = base + messages.len() as u64;
        let appended = write_journal(base).map_err(JournalError::Wal)?;
        self.journal.waiting.borrow_mut().insert(base, end);
        let written = match self.log.append_behind(messages).await {
            Ok(at) => Ok(at),
            Err(error) => {
                tracing::warn!(%error, "writing a journal batch behind failed; appending it synced");
                self.log.append(messages).await
            }
        };
        match written {
            Ok(at) if at == base => {
                self.remember_appended(base, messages, now);
                Ok(JournalAppend { base, appended })
            }
            Ok(at) => {
                // The synced retry found earlier batches gone: the log no
                // longer holds offsets the journal gave out.
                self.journal.waiting.borrow_mut().remove(&base);
                self.break_journal(&format!("the log went back from {base} to {at}"));
                Err(JournalError::LogFailed {
                    appended,
                    error: OwnerError::JournalBroken,
                })
            }
            Err(error) => {
                self.journal.waiting.borrow_mut().remove(&base);
                // A failed write gives back what was waiting to be written:
                // batches before this one, whose offsets (and keys) the
                // journal gave out, may be gone from the log too.
                let end = self.log.high_watermark();
                if end < base {
                    self.break_journal(&format!("the log went back from {base} to {end}"));
                    return Err(JournalError::LogFailed {
                        appended,
                        error: OwnerError::JournalBroken,
                    });
                }
                Err(JournalError::LogFailed {
                    appended,
                    error: error.into(),
                })
            }
        }
    }

    /// The recent ids, the tail cache, the commit times and the idempotency
    /// keys of an append, for every path (a journal batch's as soon as it
    /// is written behind: see the module's notes).
    pub(super) fn remember_appended(&self, base: u64, messages: &[Message], now: Now) {
        {
            let mut recent = self.recent.ids.borrow_mut();
            for message in messages {
                recent.insert(recent_key(message));
            }
        }
        {
            let mut cache = self.cache.borrow_mut();
            for (offset, message) in (base..).zip(messages) {
                cache.push(StoredMessage {
                    offset,
                    message: message.clone(),
                });
            }
        }
        record_commit_time(
            &mut self.recent.commit_times.borrow_mut(),
            base,
            now.wall_ms,
        );
        self.note_rate(now, RateEvent::Produced(messages.len() as u64));
        self.keys
            .borrow_mut()
            .remember(messages, self.idempotency_window_ms.get(), now.wall_ms);
    }

    /// The journal copy of the batch at `base` is durable (synced and read
    /// back with the WAL flush that holds it): the batch becomes visible,
    /// and the copy is held until the log's own copy is verified.
    pub fn journal_durable(&self, base: u64, positions: Vec<WalPos>) {
        let Some(end) = self.journal.waiting.borrow_mut().remove(&base) else {
            return;
        };
        // Held before the signal wakes a freeze waiting for it, whose sync
        // then releases it.
        self.journal.held.borrow_mut().push_back((end, positions));
        self.signal.notify();
    }

    /// The journal copy of the batch at `base` never became durable (the
    /// WAL failed): the batch becomes visible once the log's copy is
    /// verified, as any commit would.
    pub fn journal_failed(&self, base: u64) {
        if let Some(end) = self.journal.waiting.borrow_mut().remove(&base) {
            self.journal.unjournaled.borrow_mut().insert(base, end);
            // A freeze waiting for it goes on (its sync makes it visible).
            self.signal.notify();
        }
    }

    /// Whether batches wait for [`Self::sync_journal`].
    pub fn journal_waiting(&self) -> bool {
        self.log.has_behind()
            || !self.journal.held.borrow().is_empty()
            || !self.journal.unjournaled.borrow().is_empty()
    }

    /// Syncs and reads back what the log wrote behind, then lets the WAL
    /// reclaim the journal copies of every batch verified.
    pub async fn sync_journal(&self) -> Result<(), OwnerError> {
        if !self.journal_waiting() || self.journal.broken() {
            return Ok(());
        }
        {
            // What waits in memory is written in turn (one write for every
            // batch since the last sync); the sync and the read-back then
            // run beside appends, without their turn: only a failure (a
            // rewrite) takes it.
            let turn = self.take_append_turn().await;
            let before = self.log.high_watermark();
            let written = self.log.write_behind().await;
            if self.log.high_watermark() < before {
                self.break_journal(&format!(
                    "the log went back from {before} to {}",
                    self.log.high_watermark()
                ));
                return Err(OwnerError::JournalBroken);
            }
            if written.is_err() {
                // The sync in turn writes them into a new segment.
                let result = self.sync_journal_in_turn().await;
                drop(turn);
                return result;
            }
        }
        match self.log.behind_snapshot() {
            Some(snapshot) => match PartitionLog::<F>::verify_behind(&snapshot).await {
                Ok(true) if self.log.behind_verified(&snapshot) => {
                    if !self.journal.broken() {
                        self.release_verified(snapshot.end_offset);
                    }
                    return Ok(());
                }
                // A failure since the snapshot: the turn's sync settles it.
                Ok(true) => {}
                Ok(false) | Err(_) => self.log.behind_failed(),
            },
            None if !self.log.has_behind() => {
                // Everything the log holds was verified.
                self.release_verified(self.log.high_watermark());
                return Ok(());
            }
            None => {}
        }
        let _turn = self.take_append_turn().await;
        self.sync_journal_in_turn().await
    }

    /// The log's copy of every offset below `end` is verified: batches
    /// waiting for that become visible, journal copies go.
    fn release_verified(&self, end: u64) {
        let before = self.journal.unjournaled.borrow().len();
        self.journal
            .unjournaled
            .borrow_mut()
            .retain(|_, e| *e > end);
        let mut released = Vec::new();
        {
            let mut held = self.journal.held.borrow_mut();
            while held.front().is_some_and(|(e, _)| *e <= end) {
                if let Some((_, positions)) = held.pop_front() {
                    released.extend(positions);
                }
            }
        }
        if let Some(wal) = self.journal.wal.borrow().as_ref() {
            for pos in released {
                wal.mark_committed(pos);
            }
        }
        if self.journal.unjournaled.borrow().len() != before {
            self.signal.notify();
        }
    }

    /// [`Self::sync_journal`] for a caller that holds the append turn.
    pub(super) async fn sync_journal_in_turn(&self) -> Result<(), OwnerError> {
        if !self.journal_waiting() {
            return Ok(());
        }
        if self.journal.broken() {
            return Err(OwnerError::JournalBroken);
        }
        let before = self.log.high_watermark();
        match self.log.sync_behind().await {
            Ok(end) if end == before => {
                self.release_verified(end);
                Ok(())
            }
            Ok(end) => {
                self.break_journal(&format!("the log went back from {before} to {end}"));
                Err(OwnerError::JournalBroken)
            }
            Err(error) => {
                let went_back = self.log.high_watermark() < before;
                if went_back {
                    self.break_journal(&error.to_string());
                    return Err(OwnerError::JournalBroken);
                }
                Err(error.into())
            }
        }
    }

    /// The log lost batches the journal holds: the partition takes no more
    /// appends (commits answer errors, so the dispatcher reroutes), and
    /// the node's next start appends them again from the WAL.
    fn break_journal(&self, why: &str) {
        tracing::error!(
            why,
            "a partition's log lost batches its journal holds; the partition takes no appends until the node restarts"
        );
        self.journal.broken.set(true);
    }

    /// Lets the WAL reclaim every journal copy this owner holds, whatever
    /// the log's copy: the partition's topic is gone, or the partition moved
    /// and its new owner verified its copy.
    pub fn release_journal(&self) {
        let held: Vec<WalPos> = self
            .journal
            .held
            .borrow_mut()
            .drain(..)
            .flat_map(|(_, positions)| positions)
            .collect();
        if let Some(wal) = self.journal.wal.borrow().as_ref() {
            for pos in held {
                wal.mark_committed(pos);
            }
        }
    }

    /// Journal records recovered from the WAL, in offset order: those at or
    /// above the log's end are appended there (synced), in batches as they
    /// were written. Returns the records the log could not take at their
    /// offsets (a gap, or a failure), for the caller to commit the usual way.
    pub async fn replay_journal(
        &self,
        records: Vec<(WalPos, u64, Message)>,
        now: Now,
    ) -> Result<Vec<(WalPos, Message)>, OwnerError> {
        let turn = self.take_append_turn().await;
        let mut leftover = Vec::new();
        let mut done = Vec::new();
        // Records below the log's end must be there already, the same
        // message at the same offset (a journal commit whose log append
        // failed was committed again elsewhere, and its offset reused).
        let end = self.log.high_watermark();
        let (below, records): (Vec<_>, Vec<_>) = records
            .into_iter()
            .partition(|(_, offset, _)| *offset < end);
        let mut present: HashMap<u64, u128> = HashMap::new();
        if let Some(mut from) = below.iter().map(|(_, o, _)| *o).min() {
            while from < end {
                let read = self
                    .log
                    .read(
                        from,
                        JOURNAL_REPLAY_BATCH_RECORDS,
                        JOURNAL_REPLAY_BATCH_BYTES,
                    )
                    .await?;
                let Some(last) = read.last().map(|s| s.offset) else {
                    break;
                };
                present.extend(read.iter().map(|s| (s.offset, s.message.id)));
                from = last + 1;
            }
        }
        for (pos, offset, message) in below {
            if present.get(&offset) == Some(&message.id) {
                done.push(pos);
            } else {
                leftover.push((pos, message));
            }
        }
        let mut batch: Vec<Message> = Vec::new();
        let mut batch_bytes = 0;
        let mut batch_positions: Vec<WalPos> = Vec::new();
        let mut batch_base = 0;
        let mut records = records.into_iter().peekable();
        while let Some((pos, offset, message)) = records.next() {
            let end = self.log.high_watermark() + batch.len() as u64;
            if offset != end {
                leftover.push((pos, message));
                continue;
            }
            if batch.is_empty() {
                batch_base = offset;
            }
            batch_bytes += message.value.len();
            batch.push(message);
            batch_positions.push(pos);
            let next_follows = records.peek().is_some_and(|(_, o, m)| {
                *o == offset + 1 && batch_bytes + m.value.len() <= JOURNAL_REPLAY_BATCH_BYTES
            });
            if !next_follows || batch.len() >= JOURNAL_REPLAY_BATCH_RECORDS {
                let base = self.log.append(&batch).await?;
                debug_assert_eq!(base, batch_base);
                self.remember_appended(base, &batch, now);
                done.append(&mut batch_positions);
                batch.clear();
                batch_bytes = 0;
            }
        }
        drop(turn);
        if let Some(wal) = self.journal.wal.borrow().as_ref() {
            for pos in done {
                wal.mark_committed(pos);
            }
        }
        if !leftover.is_empty() {
            let end = self.log.high_watermark();
            tracing::warn!(
                records = leftover.len(),
                high_watermark = end,
                "journal records found past a gap in the partition log; committing them as new messages"
            );
            // Acks of the offsets lost with the gap would settle the new
            // messages the log gives those offsets.
            self.cut_acks_at(end).await?;
        }
        Ok(leftover)
    }
}
