//! Consumer state of one partition: which offsets are acked.
//!
//! In memory: the *frontier* (the lowest offset not acked; everything below
//! is settled) and the acked ranges above it ([`AckSet`]). On disk, in the
//! partition's `consumer/` directory:
//! - `snapshot-{gen:020}.ack`: frontier and ranges, whole, with a checksum;
//! - `acks-{gen:020}.log`: acks since that snapshot, as [`crate::frame`]s of
//!   offsets.
//!
//! The owner calls [`ConsumerState::maintain`] every `ack_flush_interval_ms`:
//! each call hands every ack not yet written to the OS, so an ack reaches
//! the OS within one interval of being recorded, and fdatasyncs once the
//! oldest unsynced ack is `commit_interval_ms` old, so it reaches the disk
//! within that plus one interval; [`ConsumerState::flush_now`] does both at
//! once for a graceful stop. Compaction writes snapshot `gen+1`
//! (synced, with its directory entry) before it removes generation `gen`, so a
//! crash at any point leaves a valid snapshot. Recovery takes the newest valid
//! snapshot and replays every ack log of that generation or newer.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::clock::SharedClock;
use crate::codec::{crc_of, get_u32, get_u64, put_u32, put_u64, set_u32};
use crate::error::{Result, StorageError};
use crate::frame::{encode_frame, scan};
use crate::io::{FileSystem, OpenMode, StorageFile};
use crate::limits::{
    ACK_FLUSH_INTERVAL_MS_DEFAULT, ACK_LOG_COMPACT_BYTES_DEFAULT,
    CONSUMER_OFFSET_COMMIT_INTERVAL_MS_DEFAULT,
};
use crate::util_fs::read_whole_file;

const SNAPSHOT_MAGIC: u32 = 0x4E53_4E50;
const ACK_FRAME_MAGIC: u32 = 0x4E41_434B;
/// The first frame of every ack log: its format version.
const ACK_LOG_HEADER_MAGIC: u32 = 0x4E41_4C48;
const FORMAT_VERSION: u32 = 1;
const SNAPSHOT_FIXED_BYTES: usize = 40;

/// The frontier and the acked ranges above it. Pure logic, no I/O.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AckSet {
    frontier: u64,
    /// start → end (exclusive), disjoint, not touching, all above the frontier.
    ranges: BTreeMap<u64, u64>,
}

impl AckSet {
    pub fn new(frontier: u64) -> Self {
        Self {
            frontier,
            ranges: BTreeMap::new(),
        }
    }

    /// The lowest offset not acked.
    pub fn frontier(&self) -> u64 {
        self.frontier
    }

    pub fn is_acked(&self, offset: u64) -> bool {
        offset < self.frontier
            || self
                .ranges
                .range(..=offset)
                .next_back()
                .is_some_and(|(_, end)| offset < *end)
    }

    /// The lowest offset at or after `offset` that is not acked: `offset`
    /// itself, or the end of the acked range that holds it. O(log ranges).
    pub fn next_unacked(&self, offset: u64) -> u64 {
        if offset <= self.frontier {
            return self.frontier;
        }
        match self.ranges.range(..=offset).next_back() {
            // Ranges never touch one another nor the frontier: their end is
            // not acked.
            Some((_, end)) if offset < *end => *end,
            _ => offset,
        }
    }

    /// The run of offsets not acked that starts at [`Self::next_unacked`]`(offset)`:
    /// it ends where the next acked range starts, or at `u64::MAX` if none
    /// does. O(log ranges).
    pub fn unacked_run(&self, offset: u64) -> Range<u64> {
        let start = self.next_unacked(offset);
        let end = self
            .ranges
            .range(start..)
            .next()
            .map_or(u64::MAX, |(acked, _)| *acked);
        start..end
    }

    /// Records an ack; returns false if the offset was already acked.
    pub fn ack(&mut self, offset: u64) -> bool {
        if self.is_acked(offset) {
            return false;
        }
        let mut start = offset;
        let mut end = offset + 1;
        if let Some((&prev_start, &prev_end)) = self.ranges.range(..offset).next_back() {
            if prev_end == offset {
                start = prev_start;
                self.ranges.remove(&prev_start);
            }
        }
        if let Some(next_end) = self.ranges.remove(&end) {
            end = next_end;
        }
        if start == self.frontier {
            self.frontier = end;
        } else {
            self.ranges.insert(start, end);
        }
        debug_assert!(self.ranges.keys().all(|s| *s > self.frontier));
        true
    }

    /// Forgets every ack at or above `end`: a log that ends there (a
    /// promoted copy that holds less than its source did) gives those
    /// offsets to new messages, which must not read as acked.
    pub fn cut_at(&mut self, end: u64) {
        self.frontier = self.frontier.min(end);
        self.ranges.retain(|start, _| *start < end);
        for stop in self.ranges.values_mut() {
            *stop = (*stop).min(end);
        }
    }

    /// Moves the frontier up to `offset` (retention deleted what lies below);
    /// returns how many unacked offsets were skipped.
    pub fn skip_to(&mut self, offset: u64) -> u64 {
        if offset <= self.frontier {
            return 0;
        }
        let mut skipped = offset - self.frontier;
        let below: Vec<(u64, u64)> = self.ranges.range(..offset).map(|(s, e)| (*s, *e)).collect();
        self.frontier = offset;
        for (start, end) in below {
            self.ranges.remove(&start);
            skipped -= end.min(offset) - start;
            if end > offset {
                self.frontier = end;
            }
        }
        if let Some(end) = self.ranges.remove(&self.frontier) {
            self.frontier = end;
        }
        skipped
    }

    /// Acked ranges above the frontier.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(s, e)| (*s, *e))
    }

    /// Number of acked offsets above the frontier.
    pub fn acked_above_frontier(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }

    /// The set as bytes (a checksummed snapshot), for a partition's move.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_snapshot(0)
    }

    /// A set from [`Self::encode`]'s bytes; `None` when they are damaged.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        Self::decode_snapshot(bytes).map(|(_, set)| set)
    }

    fn encode_snapshot(&self, generation: u64) -> Vec<u8> {
        let mut buf = Vec::with_capacity(SNAPSHOT_FIXED_BYTES + 16 * self.ranges.len());
        put_u32(&mut buf, SNAPSHOT_MAGIC);
        put_u32(&mut buf, 0);
        put_u32(&mut buf, FORMAT_VERSION);
        put_u32(&mut buf, 0);
        put_u64(&mut buf, generation);
        put_u64(&mut buf, self.frontier);
        put_u64(&mut buf, self.ranges.len() as u64);
        for (start, end) in &self.ranges {
            put_u64(&mut buf, *start);
            put_u64(&mut buf, *end);
        }
        let crc = crc_of(&buf, 8, buf.len()).unwrap_or(0);
        set_u32(&mut buf, 4, crc);
        buf
    }

    fn decode_snapshot(bytes: &[u8]) -> Option<(u64, Self)> {
        (get_u32(bytes, 0)? == SNAPSHOT_MAGIC).then_some(())?;
        (get_u32(bytes, 8)? == FORMAT_VERSION).then_some(())?;
        let count = usize::try_from(get_u64(bytes, 32)?).ok()?;
        let end = SNAPSHOT_FIXED_BYTES.checked_add(count.checked_mul(16)?)?;
        (crc_of(bytes, 8, end)? == get_u32(bytes, 4)?).then_some(())?;
        let generation = get_u64(bytes, 16)?;
        let mut set = Self::new(get_u64(bytes, 24)?);
        for i in 0..count {
            let start = get_u64(bytes, SNAPSHOT_FIXED_BYTES + 16 * i)?;
            let stop = get_u64(bytes, SNAPSHOT_FIXED_BYTES + 16 * i + 8)?;
            for offset in start..stop {
                set.ack(offset);
            }
        }
        Some((generation, set))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerConfig {
    /// `storage.ack_flush_interval_ms`
    pub ack_flush_interval_ms: u64,
    /// `storage.consumer_offset_commit_interval_ms`
    pub commit_interval_ms: u64,
    /// Compact the ack log into a snapshot past this many bytes.
    pub compact_bytes: u64,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            ack_flush_interval_ms: ACK_FLUSH_INTERVAL_MS_DEFAULT,
            commit_interval_ms: CONSUMER_OFFSET_COMMIT_INTERVAL_MS_DEFAULT,
            compact_bytes: ACK_LOG_COMPACT_BYTES_DEFAULT,
        }
    }
}

struct State<Fl> {
    acks: AckSet,
    generation: u64,
    next_generation: u64,
    log: Rc<Fl>,
    log_path: PathBuf,
    log_end: u64,
    unwritten: Vec<u64>,
    oldest_unwritten_ms: Option<u64>,
    /// The recording time of the oldest ack whose write completed and that
    /// no fdatasync begun after that completion covers yet.
    oldest_unsynced_ms: Option<u64>,
    /// A write or a compaction runs (one at a time). An fdatasync does not
    /// count: writes go on while one runs, so new acks reach the OS on
    /// their interval however slow the disk's syncs are.
    writing: bool,
    failed: Option<String>,
    /// Why the last write of acks found no space: they are held back and
    /// written again at the next tick; acks are refused until one succeeds.
    full: Option<String>,
}

/// One partition's consumer state.
pub struct ConsumerState<F: FileSystem> {
    fs: F,
    dir: PathBuf,
    config: ConsumerConfig,
    clock: SharedClock,
    state: RefCell<State<F::File>>,
}

fn snapshot_name(generation: u64) -> String {
    format!("snapshot-{generation:020}.ack")
}
fn log_name(generation: u64) -> String {
    format!("acks-{generation:020}.log")
}
fn parse_generation(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    name.strip_prefix(prefix)?
        .strip_suffix(suffix)?
        .parse()
        .ok()
}

/// Refuses an ack log written by a newer format; a missing or damaged header
/// is logged (its frames check themselves).
fn check_log_header(bytes: &[u8], path: &Path) -> Result<()> {
    match crate::frame::probe(bytes, 0, ACK_LOG_HEADER_MAGIC) {
        crate::frame::Probe::Valid { body, .. } => {
            let version = get_u32(bytes, body.start).unwrap_or(0);
            if version > FORMAT_VERSION {
                return Err(StorageError::BadFormat {
                    path: path.to_path_buf(),
                    detail: format!(
                        "ack log format {version} is newer than this build's {FORMAT_VERSION}"
                    ),
                });
            }
        }
        _ if bytes.is_empty() => {}
        _ => tracing::warn!(path = %path.display(), "ack log header is missing or damaged"),
    }
    Ok(())
}

/// Writes a consumer state that holds `acks` into the empty folder `dir`
/// (made if missing), durably: a moved partition's new owner opens it with
/// [`ConsumerState::open`]. It writes the shape `open` leaves (a snapshot
/// and an empty log of one generation), so that opening it writes nothing.
pub async fn write_initial<F: FileSystem>(fs: &F, dir: &Path, acks: &AckSet) -> Result<()> {
    const GENERATION: u64 = 1;
    fs.create_dir_all(dir)
        .await
        .map_err(|e| StorageError::io("create dir", dir, e))?;
    let files = [
        (snapshot_name(GENERATION), acks.encode_snapshot(GENERATION)),
        (log_name(GENERATION), log_header()),
    ];
    for (name, bytes) in files {
        let path = dir.join(name);
        let file = fs
            .open(&path, OpenMode::CREATE_BUFFERED)
            .await
            .map_err(|e| StorageError::io("create", &path, e))?;
        file.write_at(&bytes, 0)
            .await
            .map_err(|e| StorageError::io("write", &path, e))?;
        file.sync_data()
            .await
            .map_err(|e| StorageError::io("fdatasync", &path, e))?;
    }
    fs.sync_dir(dir)
        .await
        .map_err(|e| StorageError::io("fsync dir", dir, e))
}

/// The header that starts every ack log.
fn log_header() -> Vec<u8> {
    let mut header = Vec::new();
    encode_frame(&mut header, ACK_LOG_HEADER_MAGIC, 0, |buf| {
        put_u32(buf, FORMAT_VERSION)
    });
    header
}

impl<F: FileSystem> ConsumerState<F> {
    /// Opens the state in `dir` (creating it), recovers it, and starts a new
    /// generation so that the files on disk are one snapshot and one empty
    /// log; files already in that shape (as [`write_initial`] leaves them)
    /// are kept as they are, and opening writes nothing. It syncs the log
    /// and the folder, though: an open that died after creating them (a
    /// crash, an error, its caller gone) may have left them only in the
    /// page cache, and acks synced into a file whose name is not durable
    /// vanish at a power cut.
    pub async fn open(
        fs: &F,
        dir: &Path,
        config: ConsumerConfig,
        clock: SharedClock,
    ) -> Result<Self> {
        fs.create_dir_all(dir)
            .await
            .map_err(|e| StorageError::io("create dir", dir, e))?;
        let names = fs
            .list_dir(dir)
            .await
            .map_err(|e| StorageError::io("list", dir, e))?;
        let mut snapshots: Vec<u64> = names
            .iter()
            .filter_map(|n| parse_generation(n, "snapshot-", ".ack"))
            .collect();
        let mut logs: Vec<u64> = names
            .iter()
            .filter_map(|n| parse_generation(n, "acks-", ".log"))
            .collect();
        snapshots.sort_unstable();
        logs.sort_unstable();
        let mut acks = AckSet::new(0);
        let mut base_generation = 0;
        // One snapshot and one log of its generation holding only its
        // header: the shape a compaction leaves, kept as it is.
        let mut in_shape = false;
        for generation in snapshots.iter().rev() {
            let path = dir.join(snapshot_name(*generation));
            let bytes = read_whole_file(fs, &path).await?;
            match AckSet::decode_snapshot(&bytes) {
                Some((stored, set)) if stored == *generation => {
                    acks = set;
                    base_generation = *generation;
                    break;
                }
                _ => {
                    tracing::error!(path = %path.display(), "consumer snapshot is damaged; trying an older one")
                }
            }
        }
        for generation in logs.iter().filter(|g| **g >= base_generation) {
            let path = dir.join(log_name(*generation));
            let bytes = read_whole_file(fs, &path).await?;
            check_log_header(&bytes, &path)?;
            in_shape = snapshots.as_slice() == [base_generation]
                && logs.as_slice() == [base_generation]
                && bytes == log_header();
            let found = scan(
                &bytes,
                ACK_FRAME_MAGIC,
                crate::frame::FRAME_ALIGN,
                |at, pos| at as u64 == pos,
            );
            for frame in &found.frames {
                let body = bytes.get(frame.body.clone()).unwrap_or_default();
                for chunk in body.chunks_exact(8) {
                    if let Some(offset) = get_u64(chunk, 0) {
                        acks.ack(offset);
                    }
                }
            }
        }
        let next_generation = snapshots
            .iter()
            .chain(logs.iter())
            .max()
            .map_or(1, |g| g + 1);
        // In shape: append to the log there. Else a placeholder until the
        // compaction below writes a new generation.
        let (log_path, mode, log_end) = if in_shape {
            let path = dir.join(log_name(base_generation));
            (path, OpenMode::EXISTING_BUFFERED, log_header().len() as u64)
        } else {
            let path = dir.join(log_name(next_generation));
            (path, OpenMode::CREATE_BUFFERED, 0)
        };
        let log = fs
            .open(&log_path, mode)
            .await
            .map_err(|e| StorageError::io("open", &log_path, e))?;
        let consumer = Self {
            fs: fs.clone(),
            dir: dir.to_path_buf(),
            config,
            clock,
            state: RefCell::new(State {
                acks,
                generation: base_generation,
                next_generation,
                log: Rc::new(log),
                log_path,
                log_end,
                unwritten: Vec::new(),
                oldest_unwritten_ms: None,
                oldest_unsynced_ms: None,
                writing: false,
                failed: None,
                full: None,
            }),
        };
        if in_shape {
            consumer.make_adopted_files_durable().await?;
            return Ok(consumer);
        }
        consumer.compact().await?;
        Ok(consumer)
    }

    /// Syncs the adopted log and the folder's entries. The snapshot needs
    /// no sync of its own: whoever made these files (a compaction,
    /// [`write_initial`]) synced it before it created the log.
    async fn make_adopted_files_durable(&self) -> Result<()> {
        let (log, log_path) = {
            let state = self.state.borrow();
            (state.log.clone(), state.log_path.clone())
        };
        log.sync_data()
            .await
            .map_err(|e| StorageError::io("fdatasync", &log_path, e))?;
        self.fs
            .sync_dir(&self.dir)
            .await
            .map_err(|e| StorageError::io("fsync dir", &self.dir, e))
    }

    /// Records an ack in memory; it reaches the disk on the next flushes.
    /// Returns false if the offset was already acked.
    pub fn ack(&self, offset: u64) -> bool {
        let mut state = self.state.borrow_mut();
        if !state.acks.ack(offset) {
            return false;
        }
        state.unwritten.push(offset);
        if state.oldest_unwritten_ms.is_none() {
            state.oldest_unwritten_ms = Some(self.clock.mono_ms());
        }
        true
    }

    pub fn is_acked(&self, offset: u64) -> bool {
        self.state.borrow().acks.is_acked(offset)
    }

    pub fn frontier(&self) -> u64 {
        self.state.borrow().acks.frontier()
    }

    /// The run of offsets not acked from the lowest one at or after
    /// `offset` ([`AckSet::unacked_run`]).
    pub fn unacked_run(&self, offset: u64) -> Range<u64> {
        self.state.borrow().acks.unacked_run(offset)
    }

    /// A copy of the in-memory ack set.
    pub fn ack_set(&self) -> AckSet {
        self.state.borrow().acks.clone()
    }

    /// Retention deleted everything below `oldest_retained`: moves the
    /// frontier there if it was below. Returns the number of unacked offsets
    /// skipped; the caller logs `consumer frontier fell behind retention;
    /// skipped to oldest retained offset` when it is non-zero.
    pub fn skip_to_retained(&self, oldest_retained: u64) -> u64 {
        self.state.borrow_mut().acks.skip_to(oldest_retained)
    }

    /// Why the state does not persist acks now, if it does not: failed for
    /// good (an I/O error), or the disk is full (until a write succeeds).
    pub fn failure(&self) -> Option<String> {
        let state = self.state.borrow();
        state.failed.clone().or_else(|| state.full.clone())
    }

    /// The latest time [`Self::maintain`] must run to keep the promises:
    /// the oldest unwritten ack written `ack_flush_interval_ms` after it was
    /// recorded, the oldest unsynced one synced `commit_interval_ms` after.
    /// (A call before then writes what is unwritten anyway.) `None` when
    /// nothing waits.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        let state = self.state.borrow();
        let write = state
            .oldest_unwritten_ms
            .map(|t| t + self.config.ack_flush_interval_ms);
        let sync = state
            .oldest_unsynced_ms
            .map(|t| t + self.config.commit_interval_ms);
        write.into_iter().chain(sync).min()
    }

    /// One tick of `ack_flush_interval_ms`: [`Self::write_acks`] then
    /// [`Self::sync_if_due`]. The owner runs the two apart, so that a slow
    /// sync holds up no write.
    pub async fn maintain(&self) -> Result<()> {
        self.write_acks().await?;
        self.sync_if_due().await
    }

    /// Writes every ack not yet written to the OS (however young: waiting
    /// for it to be one interval old, on ticks one interval apart, would
    /// let an ack wait almost two intervals, which a process crash loses),
    /// or compacts a long log (which writes them into its snapshot). One
    /// call at a time; it may run beside [`Self::sync_if_due`].
    pub async fn write_acks(&self) -> Result<()> {
        let compact_due = self.state.borrow().log_end >= self.config.compact_bytes;
        if compact_due {
            return self.compact().await;
        }
        self.write_to_os().await
    }

    /// Whether the oldest unsynced ack is `commit_interval_ms` old.
    pub fn sync_due(&self) -> bool {
        let now = self.clock.mono_ms();
        self.state
            .borrow()
            .oldest_unsynced_ms
            .is_some_and(|t| now.saturating_sub(t) >= self.config.commit_interval_ms)
    }

    /// Fdatasyncs the log once the oldest unsynced ack is
    /// `commit_interval_ms` old.
    pub async fn sync_if_due(&self) -> Result<()> {
        if self.sync_due() {
            self.sync().await?;
        }
        Ok(())
    }

    /// Writes and fdatasyncs every ack now (graceful stop).
    pub async fn flush_now(&self) -> Result<()> {
        self.write_to_os().await?;
        self.sync().await
    }

    /// The error of a state that failed for good, if it did.
    fn refuse_if_failed(&self, state: &State<F::File>) -> Result<()> {
        match &state.failed {
            Some(reason) => Err(StorageError::Io {
                op: "consumer state",
                path: self.dir.clone(),
                source: Rc::new(std::io::Error::other(reason.clone())),
            }),
            None => Ok(()),
        }
    }

    /// Fails the state for good: acks stay in memory only.
    fn fail(&self, state: &mut State<F::File>, error: &StorageError) {
        tracing::error!(dir = %self.dir.display(), %error, "consumer state failed; acks stay in memory only");
        state.failed = Some(error.to_string());
    }

    fn begin_io(&self) -> Result<()> {
        let mut state = self.state.borrow_mut();
        self.refuse_if_failed(&state)?;
        assert!(!state.writing, "one task writes a consumer state");
        state.writing = true;
        Ok(())
    }

    fn end_io<T>(&self, result: Result<T>) -> Result<T> {
        let mut state = self.state.borrow_mut();
        state.writing = false;
        if let Err(error) = &result {
            self.fail(&mut state, error);
        }
        result
    }

    async fn write_to_os(&self) -> Result<()> {
        self.begin_io()?;
        let (log, path, pos, frame, offsets, written_at) = {
            let mut state = self.state.borrow_mut();
            let offsets = std::mem::take(&mut state.unwritten);
            let written_at = state.oldest_unwritten_ms.take();
            if offsets.is_empty() {
                state.writing = false;
                return Ok(());
            }
            let pos = state.log_end;
            let mut frame = Vec::new();
            encode_frame(&mut frame, ACK_FRAME_MAGIC, pos, |buf| {
                for offset in &offsets {
                    put_u64(buf, *offset);
                }
            });
            state.log_end += frame.len() as u64;
            (
                state.log.clone(),
                state.log_path.clone(),
                pos,
                frame,
                offsets,
                written_at,
            )
        };
        let result = log.write_at(&frame, pos).await;
        match result {
            Err(error) if error.raw_os_error() == Some(libc::ENOSPC) => {
                // No space: nothing was acknowledged as written, so hold the
                // acks back and write them again (the frame at the same
                // place) at the next tick.
                let mut state = self.state.borrow_mut();
                state.writing = false;
                state.log_end = pos;
                let mut held = offsets;
                held.append(&mut state.unwritten);
                state.unwritten = held;
                state.oldest_unwritten_ms = match (written_at, state.oldest_unwritten_ms) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                let error = StorageError::io("write", &path, error);
                if state.full.is_none() {
                    tracing::warn!(dir = %self.dir.display(), %error, "no space for acks; holding them back until a write succeeds");
                }
                state.full = Some(error.to_string());
                Err(error)
            }
            result => {
                if result.is_ok() {
                    // Written: unsynced from now on (a sync begun before
                    // this moment may not cover it).
                    let mut state = self.state.borrow_mut();
                    state.full = None;
                    if state.oldest_unsynced_ms.is_none() {
                        state.oldest_unsynced_ms = written_at;
                    }
                }
                self.end_io(result.map_err(|e| StorageError::io("write", &path, e)))
            }
        }
    }

    /// Fdatasyncs the log: every write completed before it begins is on
    /// the disk when it returns. It may run beside a write (whose acks it
    /// then leaves unsynced) and beside a compaction (which replaces the
    /// log and syncs the new one itself).
    async fn sync(&self) -> Result<()> {
        let (log, path) = {
            let mut state = self.state.borrow_mut();
            self.refuse_if_failed(&state)?;
            // Taken now: a failure fails the state for good, so nothing
            // needs putting back.
            state.oldest_unsynced_ms = None;
            (state.log.clone(), state.log_path.clone())
        };
        let result = log
            .sync_data()
            .await
            .map_err(|e| StorageError::io("fdatasync", &path, e));
        if let Err(error) = &result {
            self.fail(&mut self.state.borrow_mut(), error);
        }
        result
    }

    /// Forgets every ack at or above `end` ([`AckSet::cut_at`]) and writes
    /// the state whole, so the cut is durable before anything reuses those
    /// offsets.
    pub async fn cut_at(&self, end: u64) -> Result<()> {
        self.state.borrow_mut().acks.cut_at(end);
        self.compact().await
    }

    /// Writes a snapshot of every ack (a new generation) and removes the older files.
    pub async fn compact(&self) -> Result<()> {
        self.begin_io()?;
        let result = self.compact_inner().await;
        self.end_io(result)
    }

    async fn compact_inner(&self) -> Result<()> {
        let (generation, snapshot) = {
            let mut state = self.state.borrow_mut();
            let generation = state.next_generation;
            state.next_generation += 1;
            state.unwritten.clear();
            state.oldest_unwritten_ms = None;
            (generation, state.acks.encode_snapshot(generation))
        };
        let io_dir = |op| {
            let dir = self.dir.clone();
            move |e| StorageError::io(op, dir, e)
        };
        let snapshot_path = self.dir.join(snapshot_name(generation));
        let file = self
            .fs
            .open(&snapshot_path, OpenMode::CREATE_BUFFERED)
            .await
            .map_err(io_dir("create snapshot"))?;
        file.write_at(&snapshot, 0)
            .await
            .map_err(|e| StorageError::io("write", &snapshot_path, e))?;
        file.sync_data()
            .await
            .map_err(|e| StorageError::io("fdatasync", &snapshot_path, e))?;
        drop(file);
        let log_path = self.dir.join(log_name(generation));
        let log = self
            .fs
            .open(&log_path, OpenMode::CREATE_BUFFERED)
            .await
            .map_err(|e| StorageError::io("create", &log_path, e))?;
        let header = log_header();
        log.write_at(&header, 0)
            .await
            .map_err(|e| StorageError::io("write", &log_path, e))?;
        log.sync_data()
            .await
            .map_err(|e| StorageError::io("fdatasync", &log_path, e))?;
        self.fs
            .sync_dir(&self.dir)
            .await
            .map_err(io_dir("fsync dir"))?;
        {
            let mut state = self.state.borrow_mut();
            state.log = Rc::new(log);
            state.log_path = log_path;
            state.log_end = header.len() as u64;
            state.generation = generation;
            state.oldest_unsynced_ms = None;
        }
        let names = self.fs.list_dir(&self.dir).await.map_err(io_dir("list"))?;
        let mut removed = false;
        for name in names {
            let old = parse_generation(&name, "snapshot-", ".ack")
                .or_else(|| parse_generation(&name, "acks-", ".log"));
            if old.is_some_and(|g| g < generation) {
                let path = self.dir.join(&name);
                self.fs
                    .remove_file(&path)
                    .await
                    .map_err(|e| StorageError::io("remove", &path, e))?;
                removed = true;
            }
        }
        if removed {
            self.fs
                .sync_dir(&self.dir)
                .await
                .map_err(io_dir("fsync dir"))?;
        }
        Ok(())
    }
}

impl<F: FileSystem> std::fmt::Debug for ConsumerState<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerState")
            .field("dir", &self.dir)
            .field("frontier", &self.frontier())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frontier_advances_over_contiguous_acks() {
        let mut set = AckSet::new(0);
        assert!(set.ack(2));
        assert!(set.ack(1));
        assert_eq!(set.frontier(), 0);
        assert!(set.ack(0));
        assert_eq!(set.frontier(), 3);
        assert!(!set.ack(1));
        assert!(set.ack(5));
        assert!(set.is_acked(5) && !set.is_acked(4) && !set.is_acked(6));
        assert_eq!(set.acked_above_frontier(), 1);
    }

    #[test]
    fn skip_to_jumps_the_frontier_and_counts_unacked() {
        let mut set = AckSet::new(0);
        set.ack(3);
        set.ack(4);
        set.ack(10);
        assert_eq!(set.skip_to(4), 3);
        assert_eq!(set.frontier(), 5);
        assert_eq!(set.skip_to(2), 0);
        assert!(set.is_acked(10) && !set.is_acked(9));
    }

    #[test]
    fn cut_at_forgets_every_ack_from_the_cut_on() {
        // The frontier past the cut comes back to it.
        let mut set = AckSet::new(700);
        set.ack(705);
        set.cut_at(400);
        assert_eq!(set.frontier(), 400);
        assert!(set.is_acked(399) && !set.is_acked(400) && !set.is_acked(705));
        // Ranges at or across the cut are dropped or trimmed.
        let mut set = AckSet::new(2);
        for offset in [4, 5, 6, 9, 10] {
            set.ack(offset);
        }
        set.cut_at(6);
        assert_eq!(set.frontier(), 2);
        assert_eq!(set.ranges().collect::<Vec<_>>(), vec![(4, 6)]);
        assert!(!set.is_acked(6) && !set.is_acked(9));
        let again = AckSet::decode(&set.encode()).expect("round trip");
        assert_eq!(again.ranges().collect::<Vec<_>>(), vec![(4, 6)]);
        // A cut above everything changes nothing.
        set.cut_at(100);
        assert_eq!(set.ranges().collect::<Vec<_>>(), vec![(4, 6)]);
    }

    #[test]
    fn next_unacked_and_unacked_run_agree_with_a_scan() {
        let mut rng = crate::rng::SimRng::new(7);
        for _ in 0..300 {
            let mut set = AckSet::new(rng.below(6));
            for _ in 0..rng.below(40) {
                set.ack(rng.below(48));
            }
            if rng.chance(1, 4) {
                set.skip_to(rng.below(24));
            }
            for offset in 0..56 {
                let start = (offset..).find(|o| !set.is_acked(*o));
                assert_eq!(Some(set.next_unacked(offset)), start, "{set:?} at {offset}");
                let start = set.next_unacked(offset);
                // Nothing at or above 48 is acked.
                let end = (start..64).find(|o| set.is_acked(*o)).unwrap_or(u64::MAX);
                assert_eq!(set.unacked_run(offset), start..end, "{set:?} at {offset}");
            }
        }
    }

    /// A simulated disk and a manual clock, and a partition's consumer
    /// state on them with the default intervals.
    struct Disk {
        fs: crate::io::sim::SimFs,
        clock: crate::clock::ManualClock,
    }

    impl Disk {
        fn new(seed: u64) -> Self {
            Self {
                fs: crate::io::sim::SimFs::new(seed),
                clock: crate::clock::ManualClock::new(0),
            }
        }

        fn open(
            fs: &crate::io::sim::SimFs,
            clock: &crate::clock::ManualClock,
        ) -> ConsumerState<crate::io::sim::SimFs> {
            let shared: SharedClock = Rc::new(clock.clone());
            let dir = Path::new("/data/partitions/t/0/consumer");
            let open = ConsumerState::open(fs, dir, ConsumerConfig::default(), shared);
            futures_lite::future::block_on(open).expect("open")
        }
    }

    #[test]
    fn every_tick_writes_every_unwritten_ack_however_young() {
        use crate::clock::Clock;
        use futures_lite::future::block_on;

        // 100 ms to the OS, 1 s to the disk; the owner ticks every 100 ms.
        let Disk { fs, clock, .. } = Disk::new(7);
        let open = || Disk::open(&fs, &clock);
        let state = open();
        // Recorded 1 ms after a tick: 99 ms old at the next one.
        clock.advance_ms(1);
        assert!(state.ack(0));
        assert_eq!(state.next_deadline_ms(), Some(101));
        clock.advance_ms(99);
        block_on(state.maintain()).expect("tick");
        assert_eq!(
            state.next_deadline_ms(),
            Some(1_001),
            "written to the OS; only the sync waits"
        );
        drop(state);
        fs.crash_process();
        let state = open();
        assert!(
            state.is_acked(0),
            "an ack written at the first tick after it survives a process crash"
        );
        // Recorded at 100: the tick at 1,100 syncs it, not the one before.
        assert!(state.ack(1));
        for _ in 0..9 {
            clock.advance_ms(100);
            block_on(state.maintain()).expect("tick");
        }
        assert_eq!(clock.now_ms(), 1_000);
        assert_eq!(state.next_deadline_ms(), Some(1_100));
        clock.advance_ms(100);
        block_on(state.maintain()).expect("tick that syncs");
        assert_eq!(state.next_deadline_ms(), None, "nothing waits");
        drop(state);
        fs.power_loss();
        assert!(
            open().is_acked(1),
            "synced within 1 s and one tick of being recorded"
        );
    }

    #[test]
    fn a_state_written_for_a_move_opens_without_writing_and_keeps_new_acks() {
        use futures_lite::future::block_on;

        let Disk { fs, clock, .. } = Disk::new(3);
        let dir = Path::new("/data/partitions/t/0/consumer");
        let mut acks = AckSet::new(2);
        acks.ack(5);
        block_on(write_initial(&fs, dir, &acks)).expect("write");
        let syncs = fs.sync_count();
        let state = Disk::open(&fs, &clock);
        assert_eq!(
            fs.sync_count(),
            syncs + 1,
            "opening it wrote nothing and synced only the log it adopts"
        );
        assert!(state.is_acked(1) && state.is_acked(5) && !state.is_acked(2));
        assert!(state.ack(2));
        block_on(state.flush_now()).expect("flush");
        drop(state);
        fs.power_loss();
        let state = Disk::open(&fs, &clock);
        assert_eq!(state.frontier(), 3, "the ack made after the open is kept");
        assert!(state.is_acked(5));
        // Opened again after a compaction-free life: still one generation.
        let names = block_on(fs.list_dir(dir)).expect("list");
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn a_full_disk_holds_acks_back_until_space_returns_while_an_io_error_stays() {
        use crate::io::sim::{FaultError, FaultOp, FaultRule};
        use futures_lite::future::block_on;

        let Disk { fs, clock, .. } = Disk::new(11);
        let open = || Disk::open(&fs, &clock);
        let state = open();
        assert!(state.ack(0));
        fs.inject(FaultRule::always(
            FaultOp::Write,
            "consumer",
            FaultError::Enospc,
        ));
        clock.advance_ms(100);
        assert!(block_on(state.maintain()).is_err(), "the write fails");
        assert!(state.failure().is_some(), "acks are refused meanwhile");
        clock.advance_ms(100);
        assert!(block_on(state.maintain()).is_err(), "still full");
        // Space returns: the next tick writes what was held back.
        fs.clear_faults();
        clock.advance_ms(100);
        block_on(state.maintain()).expect("written once space returned");
        assert_eq!(state.failure(), None, "acks are taken again");
        assert!(state.ack(1));
        clock.advance_ms(100);
        block_on(state.maintain()).expect("tick");
        drop(state);
        fs.crash_process();
        let state = open();
        assert!(
            state.is_acked(0) && state.is_acked(1),
            "the ack held back through the full disk survives a crash"
        );
        // An I/O error is another matter: the state stays failed.
        assert!(state.ack(2));
        fs.inject(FaultRule::always(
            FaultOp::Write,
            "consumer",
            FaultError::Eio,
        ));
        clock.advance_ms(100);
        assert!(block_on(state.maintain()).is_err());
        fs.clear_faults();
        assert!(state.ack(3));
        clock.advance_ms(100);
        assert!(block_on(state.maintain()).is_err(), "EIO is final");
        assert!(state.failure().is_some());
    }

    #[test]
    fn snapshot_round_trips() {
        let mut set = AckSet::new(7);
        for offset in [9, 10, 12, 20] {
            set.ack(offset);
        }
        let bytes = set.encode_snapshot(4);
        assert_eq!(AckSet::decode_snapshot(&bytes), Some((4, set)));
        let mut damaged = bytes.clone();
        damaged[30] ^= 1;
        assert_eq!(AckSet::decode_snapshot(&damaged), None);
    }
}
