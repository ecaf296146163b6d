//! The owner of one partition: its log, its consumer state, its leases, a
//! cache of recent messages, and the signal that wakes long polls.
//!
//! Generic over the file seam, so it runs on real files in a shard and on
//! the simulated disk in tests. One task per partition commits; consumes,
//! acks and sweeps may interleave with it (no `RefCell` borrow is held across
//! an await).
//!
//! - `commit`: append the batch (write, fdatasync, verified read-back), then
//!   move the high watermark, cache the messages and wake long polls.
//! - `consume`: leases the lowest available offsets first (synchronously, so
//!   two consumes never lease one offset), then reads them from the cache or
//!   the log. An offset the log can no longer return (a damaged record) is
//!   settled so that it cannot hold the frontier back forever, and logged.
//! - `ack`, `nack`, `extend`: check the lease (ended → `LeaseGone`), then
//!   record the ack in the consumer state.
//! - `sweep` and `nack`: end leases; a message whose `max_deliveries`-th
//!   lease ended is parked and queued for dead-lettering instead of
//!   redelivery (`next_dead_letter`, then `dead_lettered`).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashSet, VecDeque};

use narad_net::types::MessageState;
use narad_storage::clock::Now;
use narad_storage::consumer::ConsumerState;
use narad_storage::io::FileSystem;
use narad_storage::log::{Message, PartitionLog, StoredMessage};
use narad_storage::StorageError;

use crate::leases::{Lease, LeaseGone, LeaseTable};
use crate::limits::{
    COMMIT_TIMES_MAX, OWNER_IDEMPOTENCY_KEYS_MAX, RECALL_BYTES_MAX, RECALL_REORDER_SLACK_MS,
    RECALL_STEP_RECORDS, RECENT_IDS_MAX, SEARCH_READ_BYTES, SEARCH_READ_RECORDS,
};
use crate::rates::{RateEvent, RatePoint, Rates};

use crate::signal::{Changed, Signal};

#[derive(Debug, Clone, thiserror::Error)]
pub enum OwnerError {
    #[error(transparent)]
    LeaseGone(#[from] LeaseGone),
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// Frozen for a move's handover: nothing is appended.
    #[error("the partition is frozen for a move's handover")]
    Frozen,
    /// A batch written behind for the journal could be neither synced nor
    /// written again: the log lacks offsets the journal gave out, so the
    /// partition takes no appends until the node restarts and replays them.
    #[error("the partition's log lost batches its journal holds; it takes no appends until the node restarts")]
    JournalBroken,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerConfig {
    pub max_deliveries: u32,
    /// Bytes of recent messages kept in memory for consumers at the tail.
    pub tail_cache_bytes: usize,
    /// The first lease id this owner grants: a partition that moves away
    /// and back (or is opened again) within one start of the node must not
    /// grant a lease whose receipt equals one its earlier owner granted.
    pub first_lease_id: u64,
    /// The topic's `idempotency_window_ms` (0: keys are not looked at).
    pub idempotency_window_ms: u64,
}

/// What a commit appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// The first offset of what it appended (the high watermark if it
    /// appended nothing).
    pub base: u64,
    /// Copies dropped because a copy with the same idempotency key was
    /// committed within the window.
    pub duplicates: u32,
}

/// How much one search of a partition may look at and find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanLimits {
    /// Messages looked at, at most.
    pub scan_max: usize,
    /// Bytes of values looked at: the scan stops once past it.
    pub scan_bytes: usize,
    /// Matches, at most.
    pub found_max: usize,
}

/// A message handed to a consumer under a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub offset: u64,
    pub message: Message,
    pub lease: Lease,
}

/// A message whose deliveries ran out: move it to the dead-letter topic, then
/// call [`PartitionOwner::dead_lettered`] (or [`PartitionOwner::dead_letter_failed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub offset: u64,
    pub message: Message,
}

/// What a sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Leases that ended (their messages are available again, or dead).
    pub ended: usize,
    /// Of those, messages out of deliveries, queued for the dead-letter topic.
    pub dead: usize,
}

/// Per-partition figures for `GET /v1/topics/{t}` and the metrics.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub struct PartitionStats {
    pub high_watermark: u64,
    pub frontier: u64,
    pub available: u64,
    pub in_flight: u64,
    pub oldest_unacked_age_ms: u64,
}

/// Recent messages, newest last, bounded by bytes.
#[derive(Debug, Default)]
struct TailCache {
    messages: VecDeque<StoredMessage>,
    bytes: usize,
    capacity_bytes: usize,
}

impl TailCache {
    fn push(&mut self, stored: StoredMessage) {
        self.bytes += stored.message.value.len();
        self.messages.push_back(stored);
        self.trim();
    }

    fn trim(&mut self) {
        while self.bytes > self.capacity_bytes {
            match self.messages.pop_front() {
                Some(old) => self.bytes -= old.message.value.len(),
                None => break,
            }
        }
    }

    fn get(&self, offset: u64) -> Option<&StoredMessage> {
        let first = self.messages.front()?.offset;
        let index = usize::try_from(offset.checked_sub(first)?).ok()?;
        self.messages.get(index).filter(|m| m.offset == offset)
    }
}

/// One kind of I/O (appending, or writing acks) that callers take turns at.
#[derive(Default)]
struct TurnGate {
    busy: Cell<bool>,
    done: Signal,
}

impl TurnGate {
    /// Waits for the turn; it is given back when the [`Turn`] drops (also
    /// when the future holding it is dropped half way).
    async fn take(&self) -> Turn<'_> {
        while self.busy.get() {
            let seen = self.done.version();
            self.done.changed(seen).await;
        }
        self.busy.set(true);
        Turn { gate: self }
    }
}

/// The right to one kind of I/O, given back on drop.
struct Turn<'a> {
    gate: &'a TurnGate,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.gate.busy.set(false);
        self.gate.done.notify();
    }
}

/// What a partition remembers of its last commits.
#[derive(Default)]
struct Recent {
    /// Produce time of each unacked offset is in the log; this remembers the
    /// append time of the oldest batches for the age figure.
    commit_times: RefCell<VecDeque<(u64, u64)>>,
    /// The records appended last, to drop a repeated commit.
    ids: RefCell<RecentIds>,
}

/// Leases a consume granted and has not handed out yet: taken back on drop.
struct Granted<'a, F: FileSystem> {
    owner: &'a PartitionOwner<F>,
    leased: Option<&'a [(u64, Lease)]>,
}

impl<F: FileSystem> Granted<'_, F> {
    fn handed_out(mut self) {
        self.leased = None;
    }
}

impl<F: FileSystem> Drop for Granted<'_, F> {
    fn drop(&mut self) {
        if let Some(leased) = self.leased.take() {
            self.owner.unlease(leased);
        }
    }
}

pub struct PartitionOwner<F: FileSystem> {
    log: PartitionLog<F>,
    acks: ConsumerState<F>,
    leases: RefCell<LeaseTable>,
    cache: RefCell<TailCache>,
    signal: Signal,
    /// Commits from several shards take turns at appending.
    appends: TurnGate,
    /// Writes of acks (the periodic ones, compactions, the flush at stop)
    /// take turns. Syncs run beside them.
    ack_writes: TurnGate,
    /// A periodic write of acks waits for its turn: the next tick leaves
    /// the new acks to it (it takes every ack there is when its turn comes).
    ack_write_waiting: Cell<bool>,
    /// A periodic sync of acks is under way (it may take a while): the next
    /// tick starts no other.
    ack_syncing: Cell<bool>,
    /// The topic's `max_deliveries`, which a topic update may change.
    max_deliveries: Cell<u32>,
    recent: Recent,
    /// Parked offsets out of deliveries, waiting to be moved to the
    /// dead-letter topic.
    dead_pending: RefCell<BTreeSet<u64>>,
    /// The last 15 minutes of what happened here, for people watching.
    rates: RefCell<Rates>,
    /// Frozen for a move's handover: commits are refused once they have
    /// their turn, so none lands after the freeze's last look.
    frozen: Cell<bool>,
    /// Records recovered from a crashed node's WAL come to this partition,
    /// written from this time on: the next commit first recalls what the
    /// log holds from then ([`Self::recall_before_next_append`]).
    recall_since_ms: Cell<Option<u64>>,
    /// Commits through the owner journal (`owner/journal.rs`).
    journal: journal::Journal<F>,
    /// Idempotency keys committed within the window (`owner/keys.rs`).
    keys: RefCell<keys::OwnerKeys>,
    idempotency_window_ms: Cell<u64>,
    /// Keeps the topic's folder from being removed while the owner lives
    /// (`crate::folders`).
    folder: RefCell<Option<crate::folders::FolderHold>>,
}

fn record_commit_time(times: &mut VecDeque<(u64, u64)>, base: u64, now_ms: u64) {
    if times.len() >= COMMIT_TIMES_MAX {
        let mut index = 0;
        times.retain(|_| {
            index += 1;
            index % 2 == 1
        });
    }
    times.push_back((base, now_ms));
}

/// The last [`RECENT_IDS_MAX`] records appended to a partition, each as
/// its id and the time it was written (`produced_at_ms`): a commit sent
/// again carries both unchanged, while the same message written again on
/// purpose (a dead-letter move, a redrive) has a new write time and is kept.
#[derive(Debug, Default)]
struct RecentIds {
    order: VecDeque<RecentKey>,
    /// Ids are the nodes' own (never a client's), so a fast hash with a
    /// random seed serves; SipHash cost more than the rest of the insert.
    set: HashSet<RecentKey, foldhash::fast::RandomState>,
}

type RecentKey = (u128, u64);

fn recent_key(message: &Message) -> RecentKey {
    (message.id, message.produced_at_ms)
}

impl RecentIds {
    fn contains(&self, key: RecentKey) -> bool {
        self.set.contains(&key)
    }

    fn insert(&mut self, id: RecentKey) {
        if self.set.insert(id) {
            self.order.push_back(id);
            if self.order.len() > RECENT_IDS_MAX {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }
}

impl<F: FileSystem> PartitionOwner<F> {
    pub fn new(log: PartitionLog<F>, acks: ConsumerState<F>, config: OwnerConfig) -> Self {
        Self {
            log,
            acks,
            leases: RefCell::new(LeaseTable::starting_at(config.first_lease_id)),
            cache: RefCell::new(TailCache {
                capacity_bytes: config.tail_cache_bytes,
                ..TailCache::default()
            }),
            signal: Signal::default(),
            appends: TurnGate::default(),
            ack_writes: TurnGate::default(),
            ack_write_waiting: Cell::new(false),
            ack_syncing: Cell::new(false),
            max_deliveries: Cell::new(config.max_deliveries),
            recent: Recent::default(),
            dead_pending: RefCell::default(),
            rates: RefCell::default(),
            frozen: Cell::new(false),
            recall_since_ms: Cell::new(None),
            journal: journal::Journal::default(),
            keys: RefCell::default(),
            idempotency_window_ms: Cell::new(config.idempotency_window_ms),
            folder: RefCell::new(None),
        }
    }

    /// Holds the topic's folder for as long as the owner lives: the last
    /// append of an owner still referenced is done before it can go.
    pub fn hold_folder(&self, hold: crate::folders::FolderHold) {
        *self.folder.borrow_mut() = Some(hold);
    }

    /// Rebuilds the table of idempotency keys from the log's tail (at
    /// open, before any commit): keys of batches appended within the
    /// window, among the last [`OWNER_IDEMPOTENCY_KEYS_MAX`] records.
    pub async fn load_idempotency_keys(&self, now_ms: u64) -> Result<(), OwnerError> {
        let window = self.idempotency_window_ms.get();
        if window == 0 {
            return Ok(());
        }
        let since = now_ms.saturating_sub(window);
        let found = self
            .log
            .idempotency_keys_since(since, OWNER_IDEMPOTENCY_KEYS_MAX)
            .await?;
        self.keys.borrow_mut().restore(found, window);
        Ok(())
    }

    /// Gives the age figure its start after an open (before any commit):
    /// the write time of the message at the frontier, the oldest unacked
    /// one. Commit times live in memory only, so without this a restart
    /// would show the oldest unacked message as new (batches the journal
    /// replayed at the open are newer than the frontier's). A figure only:
    /// a failed read leaves it as it was rather than failing the open.
    pub async fn load_oldest_unacked_time(&self) {
        let frontier = self.acks.frontier();
        let known =
            |times: &VecDeque<(u64, u64)>| times.front().is_some_and(|(base, _)| *base <= frontier);
        if frontier >= self.high_watermark() || known(&self.recent.commit_times.borrow()) {
            return;
        }
        match self.read(frontier, 1, usize::MAX).await {
            Ok(read) => {
                let mut times = self.recent.commit_times.borrow_mut();
                if let (Some(first), false) = (read.first(), known(&times)) {
                    times.push_front((frontier, first.message.produced_at_ms));
                }
            }
            Err(error) => {
                tracing::debug!(%error, frontier, "could not read the oldest unacked message's time")
            }
        }
    }

    /// Idempotency keys the table let go before their window ended (it was
    /// full), since the last call.
    pub fn take_idempotency_keys_forgotten(&self) -> u64 {
        self.keys.borrow_mut().take_forgotten()
    }

    /// Why the partition's ack state failed (acks cannot be made durable).
    pub fn ack_state_failure(&self) -> Option<String> {
        self.acks.failure()
    }

    /// The end of what consumers may see: the log's end, or the first
    /// batch written behind whose journal copy is not durable yet.
    pub fn high_watermark(&self) -> u64 {
        self.journal.visible_end(self.log.high_watermark())
    }

    pub fn frontier(&self) -> u64 {
        self.acks.frontier()
    }

    /// The oldest offset retention kept.
    pub fn log_start_offset(&self) -> u64 {
        self.log.log_start_offset()
    }

    /// Up to `max` committed messages from `from` on (about `max_bytes` of
    /// values), from the cache of recent messages when it holds them, else
    /// from the log. Leases nothing: this is how children copy.
    pub async fn read(
        &self,
        from: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<StoredMessage>, OwnerError> {
        let visible = self.high_watermark();
        {
            let cache = self.cache.borrow();
            if cache.get(from).is_some() {
                let mut out = Vec::new();
                let mut bytes = 0;
                let mut offset = from;
                while let Some(stored) = cache.get(offset) {
                    if out.len() >= max
                        || (bytes >= max_bytes && !out.is_empty())
                        || offset >= visible
                    {
                        break;
                    }
                    bytes += stored.message.value.len();
                    out.push(stored.clone());
                    offset += 1;
                }
                return Ok(out);
            }
        }
        let mut read = self.log.read(from, max, max_bytes).await?;
        read.retain(|stored| stored.offset < visible);
        Ok(read)
    }

    /// Up to `max` committed messages from `from` on (about `max_bytes` of
    /// values, at least one), each with how it stands now and its
    /// deliveries since the owner started. Leases, acks and counts
    /// nothing: a browse changes no message's state.
    pub async fn browse(
        &self,
        from: u64,
        max: usize,
        max_bytes: usize,
        now: Now,
    ) -> Result<Vec<(StoredMessage, MessageState, u32)>, OwnerError> {
        let read = self.read(from, max, max_bytes).await?;
        let leases = self.leases.borrow();
        Ok(read
            .into_iter()
            .map(|stored| {
                let offset = stored.offset;
                let state = if self.acks.is_acked(offset) {
                    MessageState::Acked
                } else if leases.is_leased(offset, now.mono_ms) {
                    MessageState::Leased
                } else {
                    MessageState::Available
                };
                (stored, state, leases.delivery_count(offset))
            })
            .collect())
    }

    /// Scans committed messages from `from` on for those `wanted` takes, up
    /// to `found_max` of them, looking at no more than `scan_max` messages
    /// (about `scan_bytes` of values): the matches, each with its state and
    /// delivery count as [`Self::browse`] gives them, and where the scan
    /// stopped (`None`: it reached the end of what is committed). Like a
    /// browse, it changes nothing.
    pub async fn search(
        &self,
        from: u64,
        limits: ScanLimits,
        wanted: impl Fn(&Message) -> bool,
        now: Now,
    ) -> Result<(Vec<(StoredMessage, MessageState, u32)>, Option<u64>), OwnerError> {
        let mut found = Vec::new();
        let mut next = from.max(self.log_start_offset());
        let (mut scanned, mut bytes) = (0, 0);
        loop {
            if next >= self.high_watermark() {
                return Ok((found, None));
            }
            if scanned >= limits.scan_max
                || bytes >= limits.scan_bytes
                || found.len() >= limits.found_max
            {
                return Ok((found, Some(next)));
            }
            let step = (limits.scan_max - scanned).min(SEARCH_READ_RECORDS);
            let read = self.browse(next, step, SEARCH_READ_BYTES, now).await?;
            let Some(last) = read.last().map(|(stored, _, _)| stored.offset) else {
                // Nothing readable at `next` (damaged, and logged as such):
                // the scan goes past it.
                next += 1;
                scanned += 1;
                continue;
            };
            for (stored, state, count) in read {
                if found.len() >= limits.found_max {
                    return Ok((found, Some(stored.offset)));
                }
                scanned += 1;
                bytes += stored.message.value.len();
                next = stored.offset + 1;
                if wanted(&stored.message) {
                    found.push((stored, state, count));
                }
            }
            next = next.max(last + 1);
        }
    }

    /// Appends a batch and makes it visible. Commits from several shards
    /// take turns: the log takes one append at a time. A copy whose
    /// idempotency key was committed within the window is dropped.
    pub async fn commit(&self, messages: &[Message], now: Now) -> Result<Appended, OwnerError> {
        let _turn = self.take_append_turn().await;
        self.close_rate_interval(now);
        if self.frozen.get() {
            return Err(OwnerError::Frozen);
        }
        if self.journal.broken() {
            return Err(OwnerError::JournalBroken);
        }
        // Batches the journal wrote behind are synced first: a failure
        // there must not let this append take their offsets.
        self.sync_journal_in_turn().await?;
        if let Some(since_ms) = self.recall_since_ms.take() {
            if let Err(error) = self.recall_appended_since(since_ms).await {
                // The next commit tries again.
                self.recall_before_next_append(since_ms);
                return Err(error);
            }
        }
        // A dispatcher that did not hear the answer to a commit sends the
        // same records again: append only those not appended recently.
        let fresh: Vec<Message>;
        let messages = {
            let recent = self.recent.ids.borrow();
            if messages.iter().any(|m| recent.contains(recent_key(m))) {
                fresh = messages
                    .iter()
                    .filter(|m| !recent.contains(recent_key(m)))
                    .cloned()
                    .collect();
                tracing::debug!(
                    skipped = messages.len() - fresh.len(),
                    "a commit repeated records already appended"
                );
                &fresh[..]
            } else {
                messages
            }
        };
        // A copy of a key committed within the window is not stored.
        let unique: Vec<Message>;
        let window = self.idempotency_window_ms.get();
        let judged = {
            let mut keys = self.keys.borrow_mut();
            keys.expire(window, now.wall_ms);
            keys.judge(messages, window, now.wall_ms)
        };
        let messages = if judged.keep.len() == messages.len() {
            messages
        } else {
            unique = judged.keep.iter().map(|&i| messages[i].clone()).collect();
            &unique[..]
        };
        if messages.is_empty() {
            return Ok(Appended {
                base: self.high_watermark(),
                duplicates: judged.duplicates,
            });
        }
        let base = self.log.append(messages).await?;
        self.remember_appended(base, messages, now);
        self.signal.notify();
        Ok(Appended {
            base,
            duplicates: judged.duplicates,
        })
    }

    async fn take_append_turn(&self) -> Turn<'_> {
        self.appends.take().await
    }

    /// The current availability version, to wait on with [`Self::changed`].
    pub fn version(&self) -> u64 {
        self.signal.version()
    }

    /// Completes once something may have become available after `seen`.
    pub fn changed(&self, seen: u64) -> Changed<'_> {
        self.signal.changed(seen)
    }

    /// Applies a topic update: retention of the log, `max_deliveries` and
    /// the idempotency window.
    pub fn reconfigure(&self, retention_ms: u64, max_deliveries: u32, idempotency_window_ms: u64) {
        self.max_deliveries.set(max_deliveries);
        self.idempotency_window_ms.set(idempotency_window_ms);
        self.log.set_retention_ms(retention_ms);
    }

    /// Leases up to `max` messages for `visibility_ms`, lowest offsets first.
    pub async fn consume(
        &self,
        max: usize,
        visibility_ms: u64,
        now: Now,
    ) -> Result<Vec<Delivery>, OwnerError> {
        let now_ms = now.mono_ms;
        let leased: Vec<(u64, Lease)> = {
            let mut leases = self.leases.borrow_mut();
            let offsets = leases.available(
                self.acks.frontier(),
                self.high_watermark(),
                max,
                now_ms,
                |o| self.acks.unacked_run(o),
            );
            offsets
                .into_iter()
                .map(|offset| (offset, leases.lease(offset, now_ms, visibility_ms)))
                .collect()
        };
        // Until every message is read, the leases are taken back if this
        // consume fails or is dropped (its client went away): a delivery
        // nobody received neither hides the message nor counts.
        let granted = Granted {
            owner: self,
            leased: Some(&leased),
        };
        let mut deliveries = Vec::with_capacity(leased.len());
        let mut missing = Vec::new();
        let cached = |offset: u64| self.cache.borrow().get(offset).map(|m| m.message.clone());
        let mut next = 0;
        while let Some(&(offset, lease)) = leased.get(next) {
            if let Some(message) = cached(offset) {
                deliveries.push(Delivery {
                    offset,
                    message,
                    lease,
                });
                next += 1;
                continue;
            }
            // A run of consecutive offsets the cache does not hold is one
            // read of the log, which reads each batch it spans once.
            let run_end = leased
                .iter()
                .enumerate()
                .skip(next + 1)
                .find(|&(i, &(o, _))| {
                    o != leased[i - 1].0 + 1 || self.cache.borrow().get(o).is_some()
                })
                .map_or(leased.len(), |(i, _)| i);
            let mut read = self
                .log
                .read_for_delivery(offset, run_end - next, usize::MAX)
                .await?
                .into_iter()
                .peekable();
            for &(offset, lease) in &leased[next..run_end] {
                // Damaged records and offsets below the log start are not
                // in what the log returns.
                while read.next_if(|m| m.offset < offset).is_some() {}
                match read.next_if(|m| m.offset == offset) {
                    Some(stored) => deliveries.push(Delivery {
                        offset,
                        message: stored.message,
                        lease,
                    }),
                    None => missing.push((offset, lease.lease_id)),
                }
            }
            next = run_end;
        }
        granted.handed_out();
        for (offset, lease_id) in missing {
            tracing::error!(
                offset,
                "record is damaged or gone from the log; settling it so the frontier can move"
            );
            if self
                .leases
                .borrow_mut()
                .ack(offset, lease_id, now_ms)
                .is_ok()
            {
                self.acks.ack(offset);
            }
        }
        Ok(deliveries)
    }

    fn unlease(&self, leased: &[(u64, Lease)]) {
        let mut leases = self.leases.borrow_mut();
        for (offset, lease) in leased {
            leases.unlease(*offset, lease.lease_id);
        }
        drop(leases);
        self.signal.notify();
    }

    pub fn ack(&self, offset: u64, lease_id: u64, now: Now) -> Result<(), OwnerError> {
        self.close_rate_interval(now);
        self.leases
            .borrow_mut()
            .ack(offset, lease_id, now.mono_ms)?;
        self.acks.ack(offset);
        self.note_rate(now, RateEvent::Acked(1));
        Ok(())
    }

    pub fn nack(
        &self,
        offset: u64,
        lease_id: u64,
        delay_ms: u64,
        now: Now,
    ) -> Result<(), OwnerError> {
        let lease = self
            .leases
            .borrow_mut()
            .nack(offset, lease_id, delay_ms, now.mono_ms)?;
        // A nack ends the lease: the last allowed delivery moves the message
        // to the dead-letter topic instead of delivering it again.
        let limit = self.max_deliveries.get();
        if limit > 0 && lease.delivery_count >= limit {
            self.park_for_dead_letter(offset);
        } else if delay_ms == 0 {
            self.signal.notify();
        }
        Ok(())
    }

    pub fn extend(
        &self,
        offset: u64,
        lease_id: u64,
        visibility_ms: u64,
        now: Now,
    ) -> Result<u64, OwnerError> {
        let expires_mono_ms =
            self.leases
                .borrow_mut()
                .extend(offset, lease_id, visibility_ms, now.mono_ms)?;
        Ok(now.wall_of(expires_mono_ms))
    }

    /// Ends expired leases. Messages that reached `max_deliveries` are parked
    /// and queued for dead-lettering ([`Self::next_dead_letter`]); the others
    /// become available again. Synchronous, so a dropped caller leaves
    /// nothing half done.
    pub fn sweep(&self, now: Now) -> Sweep {
        let expired = self.leases.borrow_mut().sweep(now.mono_ms);
        if expired.is_empty() {
            return Sweep::default();
        }
        let limit = self.max_deliveries.get();
        let mut dead = 0;
        for ended in &expired {
            if limit > 0 && ended.delivery_count >= limit {
                self.park_for_dead_letter(ended.offset);
                dead += 1;
            }
        }
        self.signal.notify();
        Sweep {
            ended: expired.len(),
            dead,
        }
    }

    fn park_for_dead_letter(&self, offset: u64) {
        self.leases.borrow_mut().park(offset);
        self.dead_pending.borrow_mut().insert(offset);
    }

    /// Whether parked messages wait to be moved to the dead-letter topic.
    pub fn has_dead_letters(&self) -> bool {
        !self.dead_pending.borrow().is_empty()
    }

    /// The lowest parked message waiting for the dead-letter topic, read from
    /// the cache or the log. It stays queued until [`Self::dead_lettered`] or
    /// [`Self::dead_letter_failed`], so a mover dropped half way leaves it for
    /// the next. `Ok(None)` when none waits; a message the log cannot return
    /// any more is settled (as `consume` does) and skipped.
    pub async fn next_dead_letter(&self) -> Result<Option<DeadLetter>, OwnerError> {
        loop {
            let Some(offset) = self.dead_pending.borrow().first().copied() else {
                return Ok(None);
            };
            let cached = self.cache.borrow().get(offset).map(|m| m.message.clone());
            let message = match cached {
                Some(message) => Some(message),
                None => self
                    .log
                    .read(offset, 1, usize::MAX)
                    .await?
                    .into_iter()
                    .find(|m| m.offset == offset)
                    .map(|m| m.message),
            };
            match message {
                Some(message) => return Ok(Some(DeadLetter { offset, message })),
                None => {
                    tracing::error!(
                        offset,
                        "a message out of deliveries is damaged or gone from the log; settling it"
                    );
                    self.settle_parked(offset);
                }
            }
        }
    }

    /// The dead-letter topic durably holds the message: settle it here.
    pub fn dead_lettered(&self, offset: u64, now: Now) {
        self.close_rate_interval(now);
        if self.settle_parked(offset) {
            self.note_rate(now, RateEvent::DeadLettered(1));
        }
    }

    /// Settles a parked message for good; whether it was parked.
    fn settle_parked(&self, offset: u64) -> bool {
        let parked = self.dead_pending.borrow_mut().remove(&offset);
        if parked {
            self.leases.borrow_mut().unpark(offset);
            self.acks.ack(offset);
        }
        parked
    }

    /// Closes the rates' earlier intervals with the backlog as it is: called
    /// before an event changes it.
    pub(crate) fn close_rate_interval(&self, now: Now) {
        self.rates.borrow_mut().close_before(now.wall_ms, || {
            let stats = self.stats(now);
            (stats.available, stats.in_flight)
        });
    }

    /// Counts `event` in this partition's rates.
    pub(crate) fn note_rate(&self, now: Now, event: RateEvent) {
        self.rates.borrow_mut().note(now.wall_ms, event, || {
            let stats = self.stats(now);
            (stats.available, stats.in_flight)
        });
    }

    /// The partition's points of the last 15 minutes, oldest first.
    pub fn rate_points(&self, now: Now) -> Vec<RatePoint> {
        let stats = self.stats(now);
        self.rates
            .borrow_mut()
            .points(now.wall_ms, (stats.available, stats.in_flight))
    }

    /// Moving it failed: deliver it again.
    pub fn dead_letter_failed(&self, offset: u64) {
        if self.dead_pending.borrow_mut().remove(&offset) {
            self.leases.borrow_mut().unpark(offset);
            self.signal.notify();
        }
    }

    /// Whether acks wait to be written to the OS or synced.
    pub fn acks_waiting(&self) -> bool {
        self.acks.next_deadline_ms().is_some()
    }

    /// Persists acks on their intervals: writes every new ack to the OS,
    /// and fdatasyncs once `storage.consumer_offset_commit_interval_ms`
    /// passed. Writes do not wait for a sync under way (an earlier call's),
    /// so an ack reaches the OS within about one
    /// `storage.ack_flush_interval_ms` however slow the disk's syncs are.
    pub async fn persist_acks(&self) -> Result<(), OwnerError> {
        // The flags are reset even if the call is dropped; the ack state
        // itself is not drop-safe mid-write (it stays busy), so these
        // calls run on tasks that are never dropped before the stop's flush.
        if !self.ack_write_waiting.replace(true) {
            let waiting = ResetOnDrop(&self.ack_write_waiting);
            let _turn = self.ack_writes.take().await;
            drop(waiting);
            self.acks.write_acks().await?;
        }
        if self.acks.sync_due() && !self.ack_syncing.replace(true) {
            let _syncing = ResetOnDrop(&self.ack_syncing);
            self.acks.sync_if_due().await?;
        }
        Ok(())
    }

    /// Forgets (durably) every ack at or above `end`: a promoted copy ends
    /// there and gives those offsets to new messages.
    pub async fn cut_acks_at(&self, end: u64) -> Result<(), OwnerError> {
        let _turn = self.ack_writes.take().await;
        Ok(self.acks.cut_at(end).await?)
    }

    /// Forgets (durably) acks of offsets the log does not hold: after a
    /// crash whose journal records could not all be put back at their
    /// offsets, the log gives those offsets to new messages.
    pub async fn cut_acks_past_log(&self) -> Result<(), OwnerError> {
        let end = self.log.high_watermark();
        let set = self.acks.ack_set();
        let past = set.frontier() > end || set.ranges().any(|(_, to)| to > end);
        if !past {
            return Ok(());
        }
        tracing::warn!(
            high_watermark = end,
            "acks recorded past the end of the partition log; forgetting them"
        );
        self.cut_acks_at(end).await
    }

    /// Applies retention. Returns how many unacked offsets it made the
    /// frontier skip.
    pub async fn apply_retention(&self) -> Result<u64, OwnerError> {
        let outcome = self.log.enforce_retention().await?;
        let skipped = self.acks.skip_to_retained(outcome.log_start_offset);
        if skipped > 0 {
            tracing::warn!(
                skipped,
                oldest_retained = outcome.log_start_offset,
                "consumer frontier fell behind retention; skipped to oldest retained offset"
            );
            self.leases
                .borrow_mut()
                .forget_below(outcome.log_start_offset);
        }
        Ok(skipped)
    }

    /// Every segment file of the log, for a move's copy.
    pub fn segment_extents(&self) -> Vec<narad_storage::log::SegmentExtent> {
        self.log.segment_extents()
    }

    /// Bytes of one segment file, for a move's copy.
    pub async fn read_segment(
        &self,
        name: &str,
        pos: u64,
        len: u64,
    ) -> Result<Vec<u8>, OwnerError> {
        Ok(self.log.read_segment(name, pos, len).await?)
    }

    /// Which offsets are acked now.
    pub fn ack_set(&self) -> narad_storage::consumer::AckSet {
        self.acks.ack_set()
    }

    /// Freezes the partition for a move's handover and waits until no
    /// append is under way: no commit appends after this returns.
    pub async fn freeze(&self) {
        self.frozen.set(true);
        let _turn = self.take_append_turn().await;
        // A batch written behind whose journal copy is not durable yet is
        // in the log but not visible: the state the freeze answers must
        // cover what the copy will hold, so its WAL flush (which needs no
        // turn) is awaited first.
        loop {
            let seen = self.signal.version();
            if !self.journal.writing_behind() {
                break;
            }
            self.signal.changed(seen).await;
        }
        // What the journal wrote behind is synced before the handover copies
        // it, and its journal copies go.
        if let Err(error) = self.sync_journal_in_turn().await {
            tracing::warn!(%error, "syncing a frozen partition's journal batches failed");
        }
    }

    /// Freezes without waiting (a restarted source taking a handover's
    /// freeze up again; nothing was appending yet).
    pub fn mark_frozen(&self) {
        self.frozen.set(true);
    }

    /// The move was abandoned: commits append again.
    pub fn thaw(&self) {
        self.frozen.set(false);
    }

    /// The ids and write times of the last records appended.
    pub fn recent_ids(&self) -> Vec<(u128, u64)> {
        self.recent.ids.borrow().order.iter().copied().collect()
    }

    /// Records written from `since_ms` on, recovered from a crashed node's
    /// WAL, are on their way here: the next commit, in its append turn,
    /// first recalls what the log holds from about then, so those already
    /// appended before the crash are not appended again.
    pub fn recall_before_next_append(&self, since_ms: u64) {
        let since = self
            .recall_since_ms
            .get()
            .map_or(since_ms, |s| s.min(since_ms));
        self.recall_since_ms.set(Some(since));
    }

    /// Remembers the records of the log's tail written from
    /// [`RECALL_REORDER_SLACK_MS`] before `since_ms` on, reading back from
    /// the end in steps of [`RECALL_STEP_RECORDS`] up to
    /// [`RECALL_BYTES_MAX`] of values (and at most [`RECENT_IDS_MAX`]
    /// records, what the memory of recent records holds).
    async fn recall_appended_since(&self, since_ms: u64) -> Result<(), OwnerError> {
        let floor = since_ms.saturating_sub(RECALL_REORDER_SLACK_MS);
        let start = self.log.log_start_offset();
        let mut end = self.log.high_watermark();
        let mut bytes = 0;
        let mut steps: Vec<Vec<RecentKey>> = Vec::new();
        let mut count = 0;
        while end > start && bytes < RECALL_BYTES_MAX && count < RECENT_IDS_MAX {
            let from = end.saturating_sub(RECALL_STEP_RECORDS as u64).max(start);
            let read = self
                .log
                .read(from, RECALL_STEP_RECORDS, RECALL_BYTES_MAX)
                .await?;
            let step: Vec<RecentKey> = read
                .iter()
                .filter(|s| s.offset < end)
                .map(|s| {
                    bytes += s.message.value.len();
                    recent_key(&s.message)
                })
                .collect();
            let older = read
                .first()
                .is_none_or(|s| s.message.produced_at_ms < floor);
            count += step.len();
            steps.push(step);
            if older {
                break;
            }
            end = from;
        }
        let mut recent = self.recent.ids.borrow_mut();
        for key in steps.iter().rev().flatten() {
            recent.insert(*key);
        }
        tracing::debug!(
            records = count,
            "recalled the log's tail for recovered records"
        );
        Ok(())
    }

    /// Remembers records another owner appended last (a moved partition's
    /// new owner), so a commit sent again is not appended twice.
    pub fn remember_recent(&self, ids: &[(u128, u64)]) {
        let mut recent = self.recent.ids.borrow_mut();
        for id in ids {
            recent.insert(*id);
        }
    }

    /// Writes every ack to disk now (graceful stop).
    pub async fn flush_acks(&self) -> Result<(), OwnerError> {
        let _turn = self.ack_writes.take().await;
        Ok(self.acks.flush_now().await?)
    }

    /// Marks the log closed cleanly (graceful stop, after the last append):
    /// the next open need not rewrite its newest segment.
    pub async fn mark_log_clean(&self) -> Result<(), OwnerError> {
        let _turn = self.appends.take().await;
        Ok(self.log.mark_clean().await?)
    }

    /// Bounds the tail cache to `bytes` (its share of the shard's), giving
    /// back at once what is over it.
    pub fn set_tail_cache_bytes(&self, bytes: usize) {
        let mut cache = self.cache.borrow_mut();
        cache.capacity_bytes = bytes;
        cache.trim();
    }

    /// Leases counted on the monotonic clock, the oldest message's age on
    /// the wall clock (its commit time may be from before a restart).
    pub fn stats(&self, now: Now) -> PartitionStats {
        let high_watermark = self.high_watermark();
        let frontier = self.acks.frontier();
        let leases = self.leases.borrow();
        let acked_above = self.acks.ack_set().acked_above_frontier();
        let in_flight = leases.in_flight(now.mono_ms) as u64;
        let unsettled = high_watermark
            .saturating_sub(frontier)
            .saturating_sub(acked_above);
        let mut times = self.recent.commit_times.borrow_mut();
        while times.len() > 1 && times.get(1).is_some_and(|(base, _)| *base <= frontier) {
            times.pop_front();
        }
        let oldest_unacked_age_ms = if unsettled == 0 {
            0
        } else {
            times
                .front()
                .map_or(0, |(_, at)| now.wall_ms.saturating_sub(*at))
        };
        PartitionStats {
            high_watermark,
            frontier,
            available: unsettled.saturating_sub(in_flight),
            in_flight,
            oldest_unacked_age_ms,
        }
    }
}

mod journal;
mod keys;
pub use journal::{JournalAppend, JournalError};

#[cfg(test)]
mod tests;

/// Sets a flag back to `false` when dropped.
struct ResetOnDrop<'a>(&'a Cell<bool>);

impl Drop for ResetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}
