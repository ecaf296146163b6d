//! The ingress WAL ring: one per shard. A produce is answered 202 only after
//! the group-commit fdatasync that covers its record returns.
//!
//! Layout of the ring directory:
//! - `ring.wal`: block 0 is a header (magic, version, capacity); the ring's
//!   `capacity` bytes follow. Created once, zero-filled and written through,
//!   so later O_DIRECT writes overwrite allocated blocks and never extend the
//!   file.
//! - `checkpoint.wal`: two one-block slots written alternately, each with a
//!   sequence number and a checksum; recovery takes the valid slot with the
//!   highest sequence. A torn checkpoint write damages only the slot it wrote.
//!   A slot names the tail (recovery dispatches every record from there) and,
//!   with a checksum of its own, the keys position at or before it (the
//!   oldest frame holding an idempotency key in its window, [`keys`]); a slot
//!   without a valid keys position reads as keys from the tail.
//!
//! Positions are logical (they grow forever); the physical place of `pos` is
//! `pos % capacity`. Each record is a [`crate::frame`] that names its own
//! position, and never spans the physical end of the ring.
//!
//! Invariants:
//! - Every flush starts at a block boundary and pads to one, so bytes that an
//!   earlier fdatasync made durable are never rewritten.
//! - Space is reclaimed only behind the *durable checkpoint's* keys position
//!   (at or before its tail): every record at or above it stays intact until
//!   a later checkpoint moves past it, so recovery from any checkpoint finds
//!   every record that was not committed and every idempotency key in its
//!   window.
//! - A failed write or fdatasync fails the WAL for good.

pub mod keys;
pub mod record;
mod recovery;

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use crate::codec::{crc_of, get_u32, get_u64, put_u32, put_u64, round_up, round_up_usize, set_u32};
use crate::error::{Result, StorageError};
use crate::frame::encode_frame;
use crate::io::{FileSystem, OpenMode, StorageFile};
use crate::limits::{
    BLOCK_BYTES, IDEMPOTENCY_KEYS_PER_SHARD_MAX, RECOVERY_READ_CHUNK_BYTES, WAL_RING_BYTES_DEFAULT,
    WAL_RING_BYTES_MIN,
};
use crate::metric_names::STORAGE_CORRUPT_RECORDS_TOTAL;
use crate::util_fs::create_file_through;
pub use keys::HeldKey;
use keys::{HeldKeys, CARRY_FILL_PERCENT};
pub use record::{Idempotency, IdempotencyRef, WalRecord, WalRecordRef};

const RING_MAGIC: u32 = 0x4E52_4E47;
const RECORD_MAGIC: u32 = 0x4E57_414C;
const CHECKPOINT_MAGIC: u32 = 0x4E43_4B50;
const FORMAT_VERSION: u32 = 1;
pub const RING_FILE_NAME: &str = "ring.wal";
pub const CHECKPOINT_FILE_NAME: &str = "checkpoint.wal";
const HEADER_FIELDS_BYTES: usize = 32;

/// A record's logical position in the ring; unique for the life of the ring.
pub type WalPos = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalConfig {
    /// Bytes of ring (`storage.wal_ring_bytes`); a multiple of 4096.
    pub ring_bytes: u64,
    /// Idempotency keys the ring holds at most.
    pub keys_max: usize,
}

impl Default for WalConfig {
    fn default() -> Self {
        Self {
            ring_bytes: WAL_RING_BYTES_DEFAULT,
            keys_max: IDEMPOTENCY_KEYS_PER_SHARD_MAX,
        }
    }
}

/// A recovered record that lies above the checkpoint: the dispatcher must
/// commit it again (it may already have been committed: duplicates allowed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredRecord {
    pub pos: WalPos,
    pub record: WalRecord,
}

/// What recovery found.
#[derive(Debug, Default, Clone)]
pub struct WalRecovery {
    pub records: Vec<RecoveredRecord>,
    /// Damaged records or regions with valid records after them.
    pub corrupt_records: u64,
    /// A damaged record at the end: the torn tail of a write that never completed.
    pub torn_tail: bool,
    /// The checkpoint tail recovery started from.
    pub checkpoint_tail: WalPos,
    /// Idempotency keys found from the checkpoint's keys position on (one
    /// frame per key, the newest), expired or not.
    pub keys: Vec<(WalPos, HeldKey)>,
}

/// Size and fill of the ring.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WalStats {
    pub capacity_bytes: u64,
    /// Bytes between the durable checkpoint tail and the next append position.
    pub used_bytes: u64,
    pub durable_end: WalPos,
    pub tail: WalPos,
    pub checkpoint_tail: WalPos,
    pub uncommitted_records: usize,
    /// Idempotency keys held, and those let go before their window ended.
    pub keys: usize,
    pub keys_forgotten: u64,
}

/// What one group commit wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FlushOutcome {
    pub records: usize,
    pub bytes: u64,
}

#[derive(Debug)]
struct LiveRecord {
    pos: WalPos,
    committed: bool,
}

#[derive(Debug)]
struct WalState {
    capacity: u64,
    /// Encoded records not yet handed to the disk; starts at `pending_start`.
    pending: Vec<u8>,
    /// The buffer of the previous flush, kept to be reused (no allocation per flush).
    spare: Vec<u8>,
    pending_start: WalPos,
    pending_records: usize,
    durable_end: WalPos,
    /// Records from the tail on, in position order (key-only records are
    /// never live: they need no commit).
    live: VecDeque<LiveRecord>,
    checkpoint_tail: WalPos,
    /// The durable checkpoint's keys position: space is reclaimed behind it.
    checkpoint_keys_from: WalPos,
    keys: HeldKeys,
    /// Keys carried forward whose copies are not durable yet: (where their
    /// old frames begin, where the copies end). The old frames stay until
    /// the copies are durable.
    carry_hold: Option<(WalPos, WalPos)>,
    checkpoint_seq: u64,
    failed: Option<String>,
    flushing: bool,
    closed: bool,
    durable_waiters: Vec<Waker>,
    committer_waker: Option<Waker>,
}

impl WalState {
    fn next_pos(&self) -> WalPos {
        self.pending_start + self.pending.len() as u64
    }
    fn tail(&self) -> WalPos {
        self.live.front().map_or_else(|| self.next_pos(), |r| r.pos)
    }
    fn used_bytes(&self) -> u64 {
        round_up(self.next_pos(), BLOCK_BYTES) - self.checkpoint_keys_from
    }
    fn wake_all(&mut self) {
        for waker in self.durable_waiters.drain(..) {
            waker.wake();
        }
        if let Some(waker) = self.committer_waker.take() {
            waker.wake();
        }
    }
    fn fail(&mut self, reason: String) {
        if self.failed.is_none() {
            tracing::error!(%reason, "ingress WAL failed; produces fail until restart");
            self.failed = Some(reason);
        }
        self.wake_all();
    }
    /// Where a frame of `len` bytes appended at `next` would go: (position,
    /// end, bytes skipped to the next lap), or why it cannot.
    fn place(&self, next: WalPos, len: u64) -> Result<(WalPos, WalPos, u64)> {
        if len > self.capacity / 4 {
            return Err(StorageError::TooLarge {
                what: "WAL record",
                len,
                max: self.capacity / 4,
            });
        }
        let physical = next % self.capacity;
        let skip = if physical + len > self.capacity {
            self.capacity - physical
        } else {
            0
        };
        let pos = next + skip;
        let end = pos + len;
        if round_up(end, BLOCK_BYTES) - self.checkpoint_keys_from > self.capacity {
            return Err(StorageError::WalFull {
                needed_bytes: end - self.next_pos(),
                free_bytes: self.capacity.saturating_sub(self.used_bytes()),
            });
        }
        Ok((pos, end, skip))
    }

    fn check_usable(&self) -> Result<()> {
        if let Some(reason) = &self.failed {
            return Err(StorageError::WalFailed {
                reason: reason.clone(),
            });
        }
        if self.closed {
            return Err(StorageError::Closed("ingress WAL"));
        }
        Ok(())
    }
}

/// One shard's ingress WAL ring.
pub struct Wal<F: FileSystem> {
    state: Rc<RefCell<WalState>>,
    ring: F::File,
    checkpoint: F::File,
    ring_path: PathBuf,
    checkpoint_path: PathBuf,
}

/// Returned by [`Wal::append`]: the record's position, and a future that
/// completes once the fdatasync covering it returned.
pub struct Appended {
    pub pos: WalPos,
    /// Where the record ends: it is durable once [`Wal::durable_end`] reaches this.
    pub end: WalPos,
    pub durable: Durable,
}

/// Completes with `Ok` once the record is durable, or with the WAL's failure.
pub struct Durable {
    state: Rc<RefCell<WalState>>,
    end: WalPos,
}

impl Future for Durable {
    type Output = Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let mut state = self.state.borrow_mut();
        if state.durable_end >= self.end {
            return Poll::Ready(Ok(()));
        }
        if let Some(reason) = &state.failed {
            return Poll::Ready(Err(StorageError::WalFailed {
                reason: reason.clone(),
            }));
        }
        state.durable_waiters.push(cx.waker().clone());
        Poll::Pending
    }
}

impl Durable {
    /// True once the record is durable (for callers that poll by hand).
    pub fn is_durable(&self) -> bool {
        self.state.borrow().durable_end >= self.end
    }
}

fn encode_ring_header(capacity: u64) -> Vec<u8> {
    let mut buf = Vec::with_capacity(HEADER_FIELDS_BYTES);
    put_u32(&mut buf, RING_MAGIC);
    put_u32(&mut buf, 0);
    put_u32(&mut buf, FORMAT_VERSION);
    put_u32(&mut buf, 0);
    put_u64(&mut buf, capacity);
    put_u64(&mut buf, 0);
    let crc = crc_of(&buf, 8, HEADER_FIELDS_BYTES).unwrap_or(0);
    set_u32(&mut buf, 4, crc);
    buf
}

fn decode_ring_header(block: &[u8]) -> Option<u64> {
    (get_u32(block, 0)? == RING_MAGIC).then_some(())?;
    (crc_of(block, 8, HEADER_FIELDS_BYTES)? == get_u32(block, 4)?).then_some(())?;
    (get_u32(block, 8)? == FORMAT_VERSION).then_some(())?;
    get_u64(block, 16)
}

/// Bytes of a checkpoint slot's keys position and its checksum, after the
/// fields an earlier version reads (which ignores them).
const KEYS_FROM_BYTES: usize = 12;

fn encode_checkpoint(seq: u64, tail: WalPos, keys_from: WalPos) -> Vec<u8> {
    let mut buf = Vec::with_capacity(usize::try_from(BLOCK_BYTES).unwrap_or(4096));
    put_u32(&mut buf, CHECKPOINT_MAGIC);
    put_u32(&mut buf, 0);
    put_u32(&mut buf, FORMAT_VERSION);
    put_u32(&mut buf, 0);
    put_u64(&mut buf, seq);
    put_u64(&mut buf, tail);
    let crc = crc_of(&buf, 8, HEADER_FIELDS_BYTES).unwrap_or(0);
    set_u32(&mut buf, 4, crc);
    put_u64(&mut buf, keys_from.min(tail));
    let keys_crc = crc_of(&buf, HEADER_FIELDS_BYTES, HEADER_FIELDS_BYTES + 8).unwrap_or(0);
    put_u32(&mut buf, keys_crc);
    buf.resize(usize::try_from(BLOCK_BYTES).unwrap_or(4096), 0);
    buf
}

/// A valid checkpoint slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CheckpointSlot {
    seq: u64,
    tail: WalPos,
    /// At or before `tail`: where frames holding keys begin.
    keys_from: WalPos,
}

fn decode_checkpoint(slot: &[u8]) -> Option<CheckpointSlot> {
    (get_u32(slot, 0)? == CHECKPOINT_MAGIC).then_some(())?;
    (crc_of(slot, 8, HEADER_FIELDS_BYTES)? == get_u32(slot, 4)?).then_some(())?;
    (get_u32(slot, 8)? == FORMAT_VERSION).then_some(())?;
    let (seq, tail) = (get_u64(slot, 16)?, get_u64(slot, 24)?);
    let keys_end = HEADER_FIELDS_BYTES + KEYS_FROM_BYTES;
    let keys_from = (crc_of(slot, HEADER_FIELDS_BYTES, HEADER_FIELDS_BYTES + 8)
        == get_u32(slot, keys_end - 4))
    .then(|| get_u64(slot, HEADER_FIELDS_BYTES))
    .flatten()
    .filter(|from| *from <= tail)
    .unwrap_or(tail);
    Some(CheckpointSlot {
        seq,
        tail,
        keys_from,
    })
}

impl<F: FileSystem> Wal<F> {
    /// Opens the ring in `dir`, creating it if needed, and recovers every
    /// record above the checkpoint.
    pub async fn open(fs: &F, dir: &Path, config: WalConfig) -> Result<(Rc<Self>, WalRecovery)> {
        if config.ring_bytes % BLOCK_BYTES != 0 || config.ring_bytes < WAL_RING_BYTES_MIN {
            return Err(StorageError::InvalidConfig(format!(
                "storage.wal_ring_bytes must be a multiple of {BLOCK_BYTES} and at least {WAL_RING_BYTES_MIN}, got {}",
                config.ring_bytes
            )));
        }
        fs.create_dir_all(dir)
            .await
            .map_err(|e| StorageError::io("create dir", dir, e))?;
        let ring_path = dir.join(RING_FILE_NAME);
        let checkpoint_path = dir.join(CHECKPOINT_FILE_NAME);
        if !fs
            .exists(&checkpoint_path)
            .await
            .map_err(|e| StorageError::io("stat", &checkpoint_path, e))?
        {
            let mut slots = vec![0u8; usize::try_from(BLOCK_BYTES).unwrap_or(4096)];
            slots.extend_from_slice(&encode_checkpoint(1, 0, 0));
            create_file_through(fs, dir, CHECKPOINT_FILE_NAME, &slots, 0).await?;
        }
        if !fs
            .exists(&ring_path)
            .await
            .map_err(|e| StorageError::io("stat", &ring_path, e))?
        {
            let mut header = encode_ring_header(config.ring_bytes);
            header.resize(usize::try_from(BLOCK_BYTES).unwrap_or(4096), 0);
            create_file_through(fs, dir, RING_FILE_NAME, &header, config.ring_bytes).await?;
        }
        // Files found whose names only the page cache holds (the process
        // died between creating one and syncing the folder) are made durable
        // before anything is accepted into them.
        fs.sync_dir(dir)
            .await
            .map_err(|e| StorageError::io("fsync dir", dir, e))?;
        let ring = fs
            .open(&ring_path, OpenMode::EXISTING_DIRECT)
            .await
            .map_err(|e| StorageError::io("open", &ring_path, e))?;
        let checkpoint = fs
            .open(&checkpoint_path, OpenMode::EXISTING_DIRECT)
            .await
            .map_err(|e| StorageError::io("open", &checkpoint_path, e))?;

        let block = usize::try_from(BLOCK_BYTES).unwrap_or(4096);
        let header = ring
            .read_at(0, block)
            .await
            .map_err(|e| StorageError::io("read header", &ring_path, e))?;
        let capacity = match decode_ring_header(&header) {
            Some(capacity) if capacity % BLOCK_BYTES == 0 && capacity >= WAL_RING_BYTES_MIN => {
                if capacity != config.ring_bytes {
                    tracing::warn!(
                        path = %ring_path.display(), existing = capacity, configured = config.ring_bytes,
                        "existing WAL ring keeps its size; drain and remove it to resize"
                    );
                }
                capacity
            }
            _ => {
                tracing::error!(path = %ring_path.display(), "WAL ring header is damaged; assuming the configured size");
                config.ring_bytes
            }
        };

        let slots = checkpoint
            .read_at(0, 2 * block)
            .await
            .map_err(|e| StorageError::io("read checkpoint", &checkpoint_path, e))?;
        let best = [slots.get(..block), slots.get(block..)]
            .into_iter()
            .flatten()
            .filter_map(decode_checkpoint)
            .max_by_key(|slot| slot.seq);
        if best.is_none() {
            tracing::error!(path = %checkpoint_path.display(), "both WAL checkpoint slots are damaged; replaying the whole ring");
        }

        let (recovery, live, head) = recovery::recover(
            &ring,
            &ring_path,
            capacity,
            best.map(|slot| (slot.tail, slot.keys_from)),
            RECOVERY_READ_CHUNK_BYTES as u64,
        )
        .await?;
        if recovery.corrupt_records > 0 {
            metrics::counter!(STORAGE_CORRUPT_RECORDS_TOTAL).increment(recovery.corrupt_records);
            tracing::error!(
                path = %ring_path.display(), corrupt = recovery.corrupt_records,
                "ingress WAL holds damaged records; they are skipped and every valid record after them is recovered"
            );
        }
        if recovery.torn_tail {
            tracing::warn!(path = %ring_path.display(), "ingress WAL had a torn tail (a write that never completed); truncated");
        }
        // What recovery found may sit only in the page cache (after a process
        // crash); make it durable before anyone relies on it.
        ring.sync_data()
            .await
            .map_err(|e| StorageError::io("fdatasync", &ring_path, e))?;
        let pending_start = round_up(head, BLOCK_BYTES);
        let state = WalState {
            capacity,
            pending: Vec::new(),
            spare: Vec::new(),
            pending_start,
            pending_records: 0,
            durable_end: pending_start,
            live,
            checkpoint_tail: recovery.checkpoint_tail,
            checkpoint_keys_from: recovery
                .keys
                .first()
                .map_or(recovery.checkpoint_tail, |(pos, _)| {
                    (*pos).min(recovery.checkpoint_tail)
                }),
            keys: HeldKeys::recovered(config.keys_max, recovery.keys.iter().cloned()),
            carry_hold: None,
            checkpoint_seq: best.map_or(1, |slot| slot.seq),
            failed: None,
            flushing: false,
            closed: false,
            durable_waiters: Vec::new(),
            committer_waker: None,
        };
        let wal = Self {
            state: Rc::new(RefCell::new(state)),
            ring,
            checkpoint,
            ring_path,
            checkpoint_path,
        };
        Ok((Rc::new(wal), recovery))
    }

    /// Adds a record to the next group commit. Fails at once when the WAL has
    /// failed, is closed, or the ring is full (nothing is written then).
    pub fn append(&self, record: &WalRecordRef<'_>) -> Result<Appended> {
        let mut guard = self.state.borrow_mut();
        let state = &mut *guard;
        state.check_usable()?;
        let len = record.frame_len() as u64;
        let (pos, end, skip) = state.place(state.next_pos(), len)?;
        let padded_len = state.pending.len() + usize::try_from(skip).unwrap_or(0);
        state.pending.resize(padded_len, 0);
        encode_frame(&mut state.pending, RECORD_MAGIC, pos, |buf| {
            record.encode_body(buf)
        });
        debug_assert_eq!(state.next_pos(), end);
        if !record.key_only {
            state.live.push_back(LiveRecord {
                pos,
                committed: false,
            });
        }
        if let Some(idempotency) = record.idempotency {
            state.keys.insert(
                pos,
                HeldKey {
                    id: record.id,
                    topic: record.topic.to_string(),
                    topic_incarnation: record.topic_incarnation,
                    partition: record.partition,
                    accept_ms: record.accept_ms,
                    idempotency: Idempotency {
                        key: idempotency.key.to_vec(),
                        expires_ms: idempotency.expires_ms,
                    },
                },
            );
        }
        state.pending_records += 1;
        if let Some(waker) = state.committer_waker.take() {
            waker.wake();
        }
        Ok(Appended {
            pos,
            end,
            durable: Durable {
                state: self.state.clone(),
                end,
            },
        })
    }

    /// Appends every record or none: when the ring cannot take them all, it
    /// answers `WalFull` having added nothing (the broker's 429 promises that
    /// nothing was accepted).
    pub fn append_batch(&self, records: &[WalRecordRef<'_>]) -> Result<Vec<Appended>> {
        {
            let state = self.state.borrow();
            state.check_usable()?;
            let mut next = state.next_pos();
            for record in records {
                let (_, end, _) = state.place(next, record.frame_len() as u64)?;
                next = end;
            }
        }
        records.iter().map(|record| self.append(record)).collect()
    }

    /// Writes everything appended so far with one write and one fdatasync,
    /// then completes the durability futures it covers. Only one task may
    /// flush (the committer, or a simulation driving the WAL by hand).
    pub async fn flush(&self) -> Result<FlushOutcome> {
        let (start, buf, records) = {
            let mut state = self.state.borrow_mut();
            if let Some(reason) = &state.failed {
                return Err(StorageError::WalFailed {
                    reason: reason.clone(),
                });
            }
            if state.pending.is_empty() {
                return Ok(FlushOutcome::default());
            }
            assert!(!state.flushing, "only one task flushes the ingress WAL");
            state.flushing = true;
            let spare = std::mem::take(&mut state.spare);
            let mut buf = std::mem::replace(&mut state.pending, spare);
            buf.resize(
                round_up_usize(buf.len(), usize::try_from(BLOCK_BYTES).unwrap_or(4096)),
                0,
            );
            let start = state.pending_start;
            state.pending_start = start + buf.len() as u64;
            (start, buf, std::mem::take(&mut state.pending_records))
        };
        let capacity = self.state.borrow().capacity;
        let result = self.write_and_sync(start, &buf, capacity).await;
        let mut state = self.state.borrow_mut();
        state.flushing = false;
        let bytes = buf.len() as u64;
        let mut buf = buf;
        buf.clear();
        state.spare = buf;
        match result {
            Ok(()) => {
                state.durable_end = start + bytes;
                state.wake_all();
                Ok(FlushOutcome { records, bytes })
            }
            Err(error) => {
                state.fail(error.to_string());
                Err(error)
            }
        }
    }

    async fn write_and_sync(&self, start: WalPos, buf: &[u8], capacity: u64) -> Result<()> {
        let physical = start % capacity;
        let first_len = usize::try_from(capacity - physical)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let (first, rest) = buf.split_at(first_len);
        let io = |e| StorageError::io("write", &self.ring_path, e);
        self.ring
            .write_at(first, BLOCK_BYTES + physical)
            .await
            .map_err(io)?;
        if !rest.is_empty() {
            self.ring.write_at(rest, BLOCK_BYTES).await.map_err(io)?;
        }
        self.ring
            .sync_data()
            .await
            .map_err(|e| StorageError::io("fdatasync", &self.ring_path, e))?;
        // Read back: a journal copy makes its batch visible once durable,
        // so the flush must hold the bytes written (their checksums with
        // them) before anyone is told it is.
        for (bytes, at) in [(first, BLOCK_BYTES + physical), (rest, BLOCK_BYTES)] {
            if bytes.is_empty() {
                continue;
            }
            let same = self
                .ring
                .read_equals(at, bytes)
                .await
                .map_err(|e| StorageError::io("read back", &self.ring_path, e))?;
            if !same {
                return Err(StorageError::VerifyFailed {
                    path: self.ring_path.clone(),
                    pos: at,
                    detail: "a group commit read back differs from what was written".into(),
                });
            }
        }
        Ok(())
    }

    /// Marks a record committed to its partition owner. Returns false for a
    /// position that is not an uncommitted record of this ring.
    pub fn mark_committed(&self, pos: WalPos) -> bool {
        let mut state = self.state.borrow_mut();
        let Ok(index) = state.live.binary_search_by_key(&pos, |r| r.pos) else {
            return false;
        };
        let Some(record) = state.live.get_mut(index) else {
            return false;
        };
        let newly = !record.committed;
        record.committed = true;
        while state.live.front().is_some_and(|r| r.committed) {
            state.live.pop_front();
        }
        newly
    }

    /// Syncs a checkpoint of the current tail and keys position (when
    /// either moved), which lets the ring reuse the space behind the keys
    /// position. Keys that expired by `now_ms` are let go first; keys held
    /// behind the tail in frames more than [`CARRY_FILL_PERCENT`] of the
    /// ring old are appended again as key-only records, and a checkpoint
    /// lets their old frames go only once those are durable. Returns
    /// whether a checkpoint was written.
    pub async fn checkpoint(&self, now_ms: u64) -> Result<bool> {
        let (tail, carried) = {
            let mut guard = self.state.borrow_mut();
            let state = &mut *guard;
            if let Some(reason) = &state.failed {
                return Err(StorageError::WalFailed {
                    reason: reason.clone(),
                });
            }
            let tail = state
                .tail()
                .min(state.durable_end.max(state.checkpoint_tail));
            state.keys.expire(now_ms);
            if state
                .carry_hold
                .is_some_and(|(_, end)| end <= state.durable_end)
            {
                state.carry_hold = None;
            }
            // Keys behind the tail in frames older than that share of the
            // ring: carried once, they stay until as much traffic again.
            let old = state
                .next_pos()
                .saturating_sub(state.capacity * CARRY_FILL_PERCENT / 100)
                .min(tail);
            let carried = if state.carry_hold.is_none() {
                state.keys.take_before(old)
            } else {
                Vec::new()
            };
            (tail, carried)
        };
        if !carried.is_empty() {
            self.carry(carried)?;
        }
        let (keys_from, seq) = {
            let state = self.state.borrow();
            let keys_from = [
                Some(tail),
                state.keys.first_pos(),
                state.carry_hold.map(|(from, _)| from),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(tail);
            if tail <= state.checkpoint_tail && keys_from <= state.checkpoint_keys_from {
                return Ok(false);
            }
            (keys_from, state.checkpoint_seq + 1)
        };
        let slot = encode_checkpoint(seq, tail, keys_from);
        let result = async {
            self.checkpoint
                .write_at(&slot, (seq % 2) * BLOCK_BYTES)
                .await
                .map_err(|e| StorageError::io("write", &self.checkpoint_path, e))?;
            self.checkpoint
                .sync_data()
                .await
                .map_err(|e| StorageError::io("fdatasync", &self.checkpoint_path, e))
        }
        .await;
        let mut state = self.state.borrow_mut();
        match result {
            Ok(()) => {
                state.checkpoint_tail = tail;
                state.checkpoint_keys_from = keys_from;
                state.checkpoint_seq = seq;
                Ok(true)
            }
            Err(error) => {
                state.fail(error.to_string());
                Err(error)
            }
        }
    }

    /// Appends `keys` again as key-only records, holding their old frames
    /// until those are durable. A ring too full to take them lets them go
    /// (counted in [`WalStats::keys_forgotten`]): space for messages comes
    /// first.
    fn carry(&self, keys: Vec<HeldKey>) -> Result<()> {
        let records: Vec<WalRecord> = keys.iter().map(HeldKey::carried).collect();
        let refs: Vec<WalRecordRef<'_>> = records.iter().map(WalRecord::as_ref).collect();
        match self.append_batch(&refs) {
            Ok(appended) => {
                let mut state = self.state.borrow_mut();
                if let Some(last) = appended.last() {
                    state.carry_hold = Some((state.checkpoint_keys_from, last.end));
                }
                Ok(())
            }
            Err(StorageError::WalFull { .. }) => {
                tracing::warn!(
                    path = %self.ring_path.display(), keys = keys.len(),
                    "the ingress WAL is too full to carry idempotency keys forward; they are forgotten before their window ends"
                );
                self.state.borrow_mut().keys.forgotten += keys.len() as u64;
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// Everything below this position is durable (an fdatasync covered it).
    pub fn durable_end(&self) -> WalPos {
        self.state.borrow().durable_end
    }

    /// Why the WAL failed, if it did.
    pub fn failure(&self) -> Option<String> {
        self.state.borrow().failed.clone()
    }

    pub fn has_pending(&self) -> bool {
        !self.state.borrow().pending.is_empty()
    }

    pub fn stats(&self) -> WalStats {
        let state = self.state.borrow();
        WalStats {
            capacity_bytes: state.capacity,
            used_bytes: state.used_bytes(),
            durable_end: state.durable_end,
            tail: state.tail(),
            checkpoint_tail: state.checkpoint_tail,
            uncommitted_records: state.live.iter().filter(|r| !r.committed).count(),
            keys: state.keys.len(),
            keys_forgotten: state.keys.forgotten,
        }
    }

    /// Refuses new appends; the committer flushes what is pending and stops.
    pub fn close(&self) {
        let mut state = self.state.borrow_mut();
        state.closed = true;
        state.wake_all();
    }

    /// The group-commit loop: waits for appended records, flushes them, and
    /// repeats until the WAL is closed (after a last flush) or fails.
    /// `on_flush` sees each group commit and how long it took.
    pub async fn run_committer(
        self: Rc<Self>,
        mut on_flush: impl FnMut(FlushOutcome, std::time::Duration),
    ) {
        loop {
            WaitForWork { state: &self.state }.await;
            let stop = {
                let state = self.state.borrow();
                state.failed.is_some() || (state.closed && state.pending.is_empty())
            };
            if stop {
                return;
            }
            let started = std::time::Instant::now();
            match self.flush().await {
                Ok(outcome) => on_flush(outcome, started.elapsed()),
                Err(_) => return,
            }
        }
    }
}

impl<F: FileSystem> Wal<F> {
    /// Syncs a checkpoint every `interval` (`dispatcher.checkpoint_interval_ms`)
    /// until the WAL is closed (one last checkpoint then) or fails. `sleep`
    /// is the executor's timer (glommio's in a node, a manual clock's in a
    /// simulation); `now_ms` the clock idempotency keys expire by.
    pub async fn run_checkpointer<S: Future<Output = ()>>(
        self: Rc<Self>,
        interval: std::time::Duration,
        sleep: impl Fn(std::time::Duration) -> S,
        now_ms: impl Fn() -> u64,
    ) {
        loop {
            sleep(interval).await;
            let closed = self.state.borrow().closed;
            if self.checkpoint(now_ms()).await.is_err() || closed {
                return;
            }
        }
    }
}

struct WaitForWork<'a> {
    state: &'a Rc<RefCell<WalState>>,
}

impl Future for WaitForWork<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.state.borrow_mut();
        if !state.pending.is_empty() || state.closed || state.failed.is_some() {
            return Poll::Ready(());
        }
        state.committer_waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl<F: FileSystem> std::fmt::Debug for Wal<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("ring", &self.ring_path)
            .field("stats", &self.stats())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_slot_round_trips_and_rejects_damage() {
        let mut slot = encode_checkpoint(9, 123_456, 100_000);
        let decoded = |seq, tail, keys_from| {
            Some(CheckpointSlot {
                seq,
                tail,
                keys_from,
            })
        };
        assert_eq!(decode_checkpoint(&slot), decoded(9, 123_456, 100_000));
        // A damaged keys position reads as keys from the tail.
        slot[HEADER_FIELDS_BYTES + 2] ^= 4;
        assert_eq!(decode_checkpoint(&slot), decoded(9, 123_456, 123_456));
        slot[20] ^= 4;
        assert_eq!(decode_checkpoint(&slot), None);
    }

    #[test]
    fn a_slot_of_an_earlier_version_reads_as_keys_from_its_tail() {
        let mut slot = encode_checkpoint(3, 4_096, 0);
        // The bytes after the fields an earlier version wrote were zero.
        slot[HEADER_FIELDS_BYTES..].fill(0);
        assert_eq!(
            decode_checkpoint(&slot),
            Some(CheckpointSlot {
                seq: 3,
                tail: 4_096,
                keys_from: 4_096
            })
        );
    }

    #[test]
    fn ring_header_round_trips() {
        let header = encode_ring_header(1 << 20);
        assert_eq!(decode_ring_header(&header), Some(1 << 20));
    }
}
