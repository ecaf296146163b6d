//! Partition logs: one directory per partition, holding segments of record
//! batches.
//!
//! - Segment files are named `{seq:010}-{base_offset:020}.seg`; `seq` orders
//!   them (a segment created after a failed append may start at the same
//!   offset as its predecessor, and then supersedes it from that offset on).
//! - Block 0 of a segment is its header (magic, version, base offset, seq).
//! - A segment grows in preallocated steps, zero-filled and fdatasynced, so
//!   appends overwrite allocated blocks instead of extending the file.
//! - An append is: write the batch, fdatasync, read it back and verify every
//!   checksum, and only then move the high watermark. Any failure seals the
//!   segment (it is never written again) and reports an error; the next append
//!   opens a new segment.
//! - Segments close at `segment_bytes`, and also once their first batch is
//!   older than half the retention, so that deleting whole segments removes a
//!   message within about twice its retention.
//! - Retention deletes whole segments whose newest batch is older than
//!   `retention_ms`, oldest first. The active segment is replaced by an empty
//!   one first, so the next offset survives a restart.

pub mod batch;
mod clean_mark;
pub mod copy;
mod index;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;

pub use batch::{Message, StoredMessage};

use crate::clock::SharedClock;
use crate::codec::{crc_of, get_u32, get_u64, put_u32, put_u64, round_up, set_u32};
use crate::error::{Result, StorageError};
use crate::io::{FileSystem, OpenMode, StorageFile};
use crate::limits::{
    BATCH_BYTES_MAX, BATCH_RECORDS_MAX, BEHIND_WRITE_BYTES_MAX, BLOCK_BYTES,
    KEYS_GROUP_BATCH_BYTES_MAX, KEYS_READ_BYTES, RECOVERY_READ_CHUNK_BYTES, SEGMENT_BYTES_DEFAULT,
    SEGMENT_PREALLOC_FIRST_BYTES, SEGMENT_PREALLOC_STEP_BYTES_DEFAULT,
};
use crate::metric_names::STORAGE_CORRUPT_RECORDS_TOTAL;
use crate::util_fs::{
    create_file_through, read_exact_or_short, read_whole_file, remove_durably, zero_fill,
};

const SEGMENT_MAGIC: u32 = 0x4E53_4547;
const FORMAT_VERSION: u32 = 1;
const SEGMENT_SUFFIX: &str = ".seg";
const SEGMENT_HEADER_FIELDS_BYTES: usize = 40;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    /// Largest segment (`storage.segment_bytes`), header included.
    pub segment_bytes: u64,
    /// Preallocation step.
    pub prealloc_step_bytes: u64,
    /// The topic's retention; 0 keeps messages forever.
    pub retention_ms: u64,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            prealloc_step_bytes: SEGMENT_PREALLOC_STEP_BYTES_DEFAULT,
            retention_ms: 0,
        }
    }
}

/// What opening a log found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LogRecovery {
    pub segments: usize,
    pub high_watermark: u64,
    /// Damaged records (or damaged batch headers) with valid data after them.
    pub corrupt_records: u64,
    /// Whether a torn tail was truncated.
    pub torn_tail: bool,
    /// Sealed segments taken from their index, without reading them.
    pub indexed_segments: usize,
    /// Bytes of the newest segment rewritten to make them durable (none
    /// after a clean close: see [`PartitionLog::mark_clean`]).
    pub rewritten_bytes: u64,
}

/// One segment file as a partition's move copies it: its name and how
/// many of its bytes (from the start, a multiple of the block size) hold
/// its header and batches. Those bytes never change once written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentExtent {
    pub name: String,
    pub written: u64,
}

/// What one retention pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RetentionOutcome {
    pub deleted_segments: usize,
    /// The oldest offset still stored (the high watermark when nothing is).
    pub log_start_offset: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BatchEntry {
    base_offset: u64,
    count: u32,
    pos: u64,
    len: u64,
    appended_at_ms: u64,
}

impl BatchEntry {
    fn end_offset(&self) -> u64 {
        self.base_offset + u64::from(self.count)
    }
}

struct Segment<Fl> {
    seq: u64,
    base_offset: u64,
    path: PathBuf,
    file: Rc<Fl>,
    batches: Vec<BatchEntry>,
    write_pos: u64,
    allocated: u64,
    sealed: bool,
}

impl<Fl> Segment<Fl> {
    fn end_offset(&self) -> u64 {
        self.batches
            .last()
            .map_or(self.base_offset, BatchEntry::end_offset)
    }
    fn first_offset(&self) -> u64 {
        self.batches
            .first()
            .map_or(self.base_offset, |b| b.base_offset)
    }
    fn first_append_ms(&self) -> Option<u64> {
        self.batches.first().map(|b| b.appended_at_ms)
    }
    fn newest_append_ms(&self) -> Option<u64> {
        self.batches.iter().map(|b| b.appended_at_ms).max()
    }
}

/// A batch written behind: where, and the bytes to verify it against (and
/// to write again elsewhere if its sync fails: a batch's bytes do not
/// depend on where it lies).
struct Behind {
    /// The segment it lies in.
    seq: u64,
    pos: u64,
    base_offset: u64,
    count: u32,
    bytes: Vec<u8>,
}

/// The batches written behind at one moment, to sync and read back without
/// holding up appends ([`PartitionLog::behind_snapshot`]).
pub struct BehindSnapshot<Fl> {
    file: Rc<Fl>,
    path: PathBuf,
    seq: u64,
    pos: u64,
    bytes: Vec<u8>,
    last_pos: u64,
    failures: u64,
    /// The offset after its last batch.
    pub end_offset: u64,
}

/// The batches a read takes from segment files, in order.
type ReadPlan<Fl> = Vec<(Rc<Fl>, PathBuf, BatchEntry)>;

/// Messages appended behind, not yet written: they follow the segments'
/// last offset.
#[derive(Default)]
struct Pending {
    messages: Vec<Message>,
    /// Their encoded length as one batch.
    len: u64,
}

struct LogState<Fl> {
    segments: Vec<Segment<Fl>>,
    next_offset: u64,
    next_seq: u64,
    retention_ms: u64,
}

/// One partition's log. Appends must not overlap (the owner serialises
/// them); reads may run beside an append.
pub struct PartitionLog<F: FileSystem> {
    fs: F,
    dir: PathBuf,
    config: LogConfig,
    clock: SharedClock,
    state: RefCell<LogState<F::File>>,
    appending: Cell<bool>,
    /// Batches written behind ([`Self::append_behind`]) and not yet synced
    /// and verified, oldest first; all in the active segment (a roll syncs
    /// them first).
    behind: RefCell<Vec<Behind>>,
    /// Messages appended behind and not written yet, from the end of the
    /// segments on: read from memory until [`Self::write_behind`] (or a
    /// sync) writes them as one batch. Small batches appended one by one
    /// would each take a block of their own and a write.
    pending: RefCell<Pending>,
    /// A write or sync of the active segment failed after batches were
    /// written behind into it: a later fdatasync may succeed without
    /// having written them (fsyncgate), so they are written again, not
    /// trusted.
    behind_suspect: Cell<bool>,
    /// Failures of writes or syncs since the log opened: a snapshot of
    /// batches written behind is trusted only if none came after it.
    failures: Cell<u64>,
    /// An append failed since the log was opened: its batch may sit in the
    /// page cache only, so the log is never marked clean.
    append_failed: Cell<bool>,
    corrupt_records: Cell<u64>,
}

fn segment_name(seq: u64, base_offset: u64) -> String {
    format!("{seq:010}-{base_offset:020}{SEGMENT_SUFFIX}")
}

fn parse_segment_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(SEGMENT_SUFFIX)?;
    let (seq, base) = stem.split_once('-')?;
    Some((seq.parse().ok()?, base.parse().ok()?))
}

/// The messages a partition folder's segment files hold (their bytes, in
/// name order), oldest first, read without opening the log: for tools that
/// look into a folder no node serves (a quarantined partition). Damaged
/// records are left out; a later segment supersedes earlier batches from
/// its base offset on, as recovery does.
pub fn messages_in_segments<'a>(
    segments: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> Vec<StoredMessage> {
    let mut found: Vec<(u64, u64, &[u8])> = segments
        .into_iter()
        .filter_map(|(name, bytes)| parse_segment_name(name).map(|(seq, base)| (seq, base, bytes)))
        .collect();
    found.sort_by_key(|(seq, base, _)| (*seq, *base));
    let mut out: BTreeMap<u64, StoredMessage> = BTreeMap::new();
    for (_, name_base, bytes) in found {
        let block = usize::try_from(BLOCK_BYTES).unwrap_or(4096);
        let base = bytes
            .get(..block)
            .and_then(decode_segment_header)
            .unwrap_or(name_base);
        // A later segment supersedes what earlier ones hold from its base.
        out.split_off(&base);
        for entry in scan_segment(bytes, base).batches {
            let Some(batch) = usize::try_from(entry.pos)
                .ok()
                .and_then(|at| batch::decode_batch(bytes, at))
            else {
                continue;
            };
            for (offset, record) in (batch.base_offset..).zip(batch.records) {
                if let Some(message) = record {
                    out.insert(offset, StoredMessage { offset, message });
                }
            }
        }
    }
    out.into_values().collect()
}

fn encode_segment_header(seq: u64, base_offset: u64, created_ms: u64) -> Vec<u8> {
    let mut buf = Vec::new();
    put_u32(&mut buf, SEGMENT_MAGIC);
    put_u32(&mut buf, 0);
    put_u32(&mut buf, FORMAT_VERSION);
    put_u32(&mut buf, 0);
    put_u64(&mut buf, base_offset);
    put_u64(&mut buf, seq);
    put_u64(&mut buf, created_ms);
    let crc = crc_of(&buf, 8, SEGMENT_HEADER_FIELDS_BYTES).unwrap_or(0);
    set_u32(&mut buf, 4, crc);
    buf.resize(usize::try_from(BLOCK_BYTES).unwrap_or(4096), 0);
    buf
}

/// The base offset of a valid segment header.
fn decode_segment_header(block: &[u8]) -> Option<u64> {
    (get_u32(block, 0)? == SEGMENT_MAGIC).then_some(())?;
    (crc_of(block, 8, SEGMENT_HEADER_FIELDS_BYTES)? == get_u32(block, 4)?).then_some(())?;
    (get_u32(block, 8)? == FORMAT_VERSION).then_some(())?;
    get_u64(block, 16)
}

/// An idempotency key the log holds ([`PartitionLog::idempotency_keys_since`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecentIdempotencyKey {
    pub key: Bytes,
    /// When its window starts: its record's accept time, or its batch's
    /// append time if that came first.
    pub since_ms: u64,
}

/// Result of scanning one segment's bytes.
struct SegmentScan {
    batches: Vec<BatchEntry>,
    /// Bad records in batches that are kept (valid data follows them).
    corrupt_records: u64,
    /// Regions with no valid header between valid batches.
    corrupt_regions: u64,
    /// Non-zero bytes with no valid batch header after the last batch.
    torn_tail: bool,
    write_pos: u64,
}

fn scan_segment(bytes: &[u8], base_offset: u64) -> SegmentScan {
    let block = usize::try_from(BLOCK_BYTES).unwrap_or(4096);
    scan_batches(bytes, 0, block, base_offset)
}

/// The length a batch takes in the segment: with its keys area, unless the
/// next batch (from offset `end`) starts where its records' padding ends.
/// A release from before idempotency keys counts only the records, and
/// appends its next batch there, over the keys: the keys are lost, the
/// batches are not.
fn len_as_written(bytes: &[u8], at: usize, decoded: &batch::DecodedBatch, end: u64) -> u64 {
    if decoded.len_without_keys == decoded.len {
        return decoded.len;
    }
    let next = usize::try_from(decoded.len_without_keys)
        .ok()
        .and_then(|len| batch::decode_batch(bytes, at + len));
    match next {
        Some(next) if next.base_offset == end => decoded.len_without_keys,
        _ => decoded.len,
    }
}

/// Scans the batches of `bytes`, which hold a segment's bytes from file
/// position `origin`, starting at index `first`, for batches from offset
/// `next_offset` on. Positions in the result are file positions.
fn scan_batches(bytes: &[u8], origin: u64, first: usize, next_offset: u64) -> SegmentScan {
    let block = usize::try_from(BLOCK_BYTES).unwrap_or(4096);
    let mut batches = Vec::new();
    let mut bad_in_batch: Vec<u64> = Vec::new();
    let mut corrupt_regions = 0;
    let mut garbage_since_last = false;
    let mut next_offset = next_offset;
    let mut at = first;
    while at + block <= bytes.len() {
        match batch::decode_batch(bytes, at) {
            Some(decoded) if decoded.base_offset >= next_offset => {
                if garbage_since_last {
                    corrupt_regions += 1;
                    garbage_since_last = false;
                }
                let end = decoded.base_offset + u64::from(decoded.count);
                let len = len_as_written(bytes, at, &decoded, end);
                batches.push(BatchEntry {
                    base_offset: decoded.base_offset,
                    count: decoded.count,
                    pos: origin + at as u64,
                    len,
                    appended_at_ms: decoded.appended_at_ms,
                });
                bad_in_batch.push(decoded.bad_records());
                next_offset = end;
                at += usize::try_from(len).unwrap_or(block);
            }
            _ => {
                if bytes
                    .get(at..at + block)
                    .is_some_and(|b| b.iter().any(|x| *x != 0))
                {
                    garbage_since_last = true;
                }
                at += block;
            }
        }
    }
    // A batch whose header verified is kept even at the tail: its valid
    // records are never dropped, its damaged ones are never served. Only bytes
    // with no valid header past the last batch are a torn tail.
    let write_pos = batches
        .last()
        .map_or(origin + first as u64, |b| b.pos + b.len);
    SegmentScan {
        batches,
        corrupt_records: bad_in_batch.iter().sum(),
        corrupt_regions,
        torn_tail: garbage_since_last,
        write_pos,
    }
}

impl<Fl> Segment<Fl> {
    /// What this segment's index says, taken as it stands now.
    fn index(&self) -> index::SegmentIndex {
        index::SegmentIndex {
            seq: self.seq,
            base_offset: self.base_offset,
            write_pos: self.write_pos,
            batches: self.batches.clone(),
        }
    }
}

/// Batches of earlier segments at or above a later segment's base are
/// failed appends that never moved the watermark (a roll seals the previous
/// segment before it creates the next): the later segment supersedes them.
fn supersede<Fl>(earlier: &mut [Segment<Fl>], base_offset: u64) {
    for segment in earlier {
        segment.batches.retain(|b| b.base_offset < base_offset);
    }
}

/// Writes `index` beside the sealed segment at `path`. The index is only a
/// shortcut (without it the segment is scanned), so a failure to write it
/// is logged and nothing more.
async fn write_index<F: FileSystem>(fs: &F, dir: &Path, path: &Path, index: &index::SegmentIndex) {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return;
    };
    let bytes = index::encode(index);
    if let Err(error) = create_file_through(fs, dir, &index::index_name(name), &bytes, 0).await {
        tracing::warn!(path = %path.display(), %error, "could not write the segment's index; the next open scans the segment");
    }
}

/// Rewrites the batches of `segment` with the bytes they hold and
/// fdatasyncs them. After a failed fdatasync the page cache can show a batch
/// that never reached the disk, and a later fdatasync succeeds without writing
/// it (fsyncgate); recovery after a process crash would then serve a batch a
/// power loss can still take away. Rewriting identical bytes is safe against
/// a torn write and makes everything recovery serves durable.
async fn make_batches_durable<Fl: StorageFile>(segment: &Segment<Fl>) -> Result<()> {
    let end = segment.write_pos;
    let bytes = read_exact_or_short(
        &*segment.file,
        &segment.path,
        BLOCK_BYTES,
        end - BLOCK_BYTES,
        RECOVERY_READ_CHUNK_BYTES,
    )
    .await?;
    segment
        .file
        .write_at(&bytes, BLOCK_BYTES)
        .await
        .map_err(|e| StorageError::io("rewrite", &segment.path, e))?;
    segment
        .file
        .sync_data()
        .await
        .map_err(|e| StorageError::io("fdatasync", &segment.path, e))
}

impl<F: FileSystem> PartitionLog<F> {
    /// Opens (or creates) the log in `dir` and recovers it.
    pub async fn open(
        fs: &F,
        dir: &Path,
        config: LogConfig,
        clock: SharedClock,
    ) -> Result<(Self, LogRecovery)> {
        Self::open_with(fs, dir, config, clock, None).await
    }

    /// Opens a move's copy of a partition log: the segments `verified`
    /// already read back from the disk and checked (after they were synced)
    /// are taken as it found them, without reading them again; any other
    /// file is recovered as [`Self::open`] does.
    pub async fn open_copy(
        fs: &F,
        dir: &Path,
        config: LogConfig,
        clock: SharedClock,
        verified: &copy::VerifiedCopy,
    ) -> Result<(Self, LogRecovery)> {
        Self::open_with(fs, dir, config, clock, Some(verified)).await
    }

    async fn open_with(
        fs: &F,
        dir: &Path,
        config: LogConfig,
        clock: SharedClock,
        verified: Option<&copy::VerifiedCopy>,
    ) -> Result<(Self, LogRecovery)> {
        if config.segment_bytes % BLOCK_BYTES != 0
            || config.prealloc_step_bytes == 0
            || config.prealloc_step_bytes % BLOCK_BYTES != 0
            || config.segment_bytes < 2 * BLOCK_BYTES
        {
            return Err(StorageError::InvalidConfig(format!(
                "segment_bytes ({}) and prealloc_step_bytes ({}) must be positive multiples of {BLOCK_BYTES}",
                config.segment_bytes, config.prealloc_step_bytes
            )));
        }
        fs.create_dir_all(dir)
            .await
            .map_err(|e| StorageError::io("create dir", dir, e))?;
        let mut names = fs
            .list_dir(dir)
            .await
            .map_err(|e| StorageError::io("list", dir, e))?;
        for name in names.iter().filter(|n| n.ends_with(".tmp")) {
            let path = dir.join(name);
            fs.remove_file(&path)
                .await
                .map_err(|e| StorageError::io("remove", &path, e))?;
        }
        // A process that died between creating a segment and syncing the
        // folder leaves a name only the page cache holds: appends into that
        // segment would vanish with it at a power cut. What recovery finds
        // is made durable before it is used, names included.
        fs.sync_dir(dir)
            .await
            .map_err(|e| StorageError::io("fsync dir", dir, e))?;
        names.retain(|n| !n.ends_with(".tmp"));
        // An index whose segment is gone (retention removed the index
        // first, then died before the segment went): nothing to keep.
        for name in &names {
            let orphan = name
                .strip_suffix(index::INDEX_SUFFIX)
                .is_some_and(|segment| !names.iter().any(|n| n == segment));
            if orphan {
                let path = dir.join(name);
                fs.remove_file(&path)
                    .await
                    .map_err(|e| StorageError::io("remove", &path, e))?;
            }
        }
        let indexed: Vec<String> = names
            .iter()
            .filter(|n| n.ends_with(index::INDEX_SUFFIX))
            .cloned()
            .collect();
        let mut found: Vec<(u64, u64, String)> = names
            .into_iter()
            .filter_map(|n| parse_segment_name(&n).map(|(seq, base)| (seq, base, n)))
            .collect();
        found.sort();

        let mut recovery = LogRecovery::default();
        let mut segments: Vec<Segment<F::File>> = Vec::new();
        // Which segments came verified from a copy (parallel to `segments`).
        let mut trusted: Vec<bool> = Vec::new();
        let last_index = found.len().saturating_sub(1);
        for (index, (seq, name_base, name)) in found.iter().enumerate() {
            let path = dir.join(name);
            let file = fs
                .open(&path, OpenMode::EXISTING_DIRECT)
                .await
                .map_err(|e| StorageError::io("open", &path, e))?;
            let known = match verified.and_then(|v| v.segment(name)) {
                Some(known) => {
                    let size = file
                        .size()
                        .await
                        .map_err(|e| StorageError::io("stat", &path, e))?;
                    (size == known.verified_to).then_some((known, size))
                }
                None => None,
            };
            if let Some((known, size)) = known {
                supersede(&mut segments, known.base_offset);
                trusted.push(true);
                segments.push(Segment {
                    seq: *seq,
                    base_offset: known.base_offset,
                    path,
                    file: Rc::new(file),
                    batches: known.batches.clone(),
                    write_pos: known.verified_to,
                    allocated: size.max(BLOCK_BYTES),
                    sealed: index != last_index,
                });
                continue;
            }
            // A sealed segment with its index: every batch the index names
            // was fdatasynced before the index was written, so the segment
            // is neither read nor synced again.
            let index_name = index::index_name(name);
            if index != last_index && indexed.contains(&index_name) {
                if let Some((sealed_index, size)) =
                    Self::read_index(fs, dir, &index_name, &file, *seq, *name_base).await
                {
                    supersede(&mut segments, sealed_index.base_offset);
                    trusted.push(true);
                    segments.push(Segment {
                        seq: *seq,
                        base_offset: sealed_index.base_offset,
                        path,
                        file: Rc::new(file),
                        batches: sealed_index.batches,
                        write_pos: sealed_index.write_pos,
                        allocated: size.max(BLOCK_BYTES),
                        sealed: true,
                    });
                    recovery.indexed_segments += 1;
                    continue;
                }
                tracing::warn!(path = %dir.join(&index_name).display(), "segment index is damaged or does not match its segment; scanning the segment");
            }
            // After a process crash a batch may sit only in the page cache;
            // make what recovery finds durable before it is served.
            file.sync_data()
                .await
                .map_err(|e| StorageError::io("fdatasync", &path, e))?;
            let size = file
                .size()
                .await
                .map_err(|e| StorageError::io("stat", &path, e))?;
            let size = size - size % BLOCK_BYTES;
            let bytes =
                read_exact_or_short(&file, &path, 0, size, RECOVERY_READ_CHUNK_BYTES).await?;
            let base_offset = match bytes
                .get(..usize::try_from(BLOCK_BYTES).unwrap_or(4096))
                .and_then(decode_segment_header)
            {
                Some(base) if base == *name_base => base,
                _ => {
                    tracing::error!(path = %path.display(), "segment header is damaged; using the offset in its name");
                    *name_base
                }
            };
            let scan = scan_segment(&bytes, base_offset);
            drop(bytes);
            trusted.push(false);
            recovery.corrupt_records += scan.corrupt_records + scan.corrupt_regions;
            if scan.torn_tail && index == last_index {
                recovery.torn_tail = true;
            } else if scan.torn_tail {
                // Not the last segment: damage at its end is corruption of
                // data that was durable (or a failed append that sealed it).
                recovery.corrupt_records += 1;
            }
            supersede(&mut segments, base_offset);
            segments.push(Segment {
                seq: *seq,
                base_offset,
                path,
                file: Rc::new(file),
                batches: scan.batches,
                write_pos: scan.write_pos,
                allocated: size.max(BLOCK_BYTES),
                sealed: index != last_index,
            });
            // A sealed segment scanned (one from before indexes, or whose
            // index was damaged) gets its index now: the next open reads it.
            if let Some(sealed) = segments.last().filter(|s| s.sealed) {
                write_index(fs, dir, &sealed.path, &sealed.index()).await;
            }
        }
        if recovery.corrupt_records > 0 {
            metrics::counter!(STORAGE_CORRUPT_RECORDS_TOTAL).increment(recovery.corrupt_records);
            tracing::error!(
                dir = %dir.display(), corrupt = recovery.corrupt_records,
                "partition log holds damaged records; they are never served, every valid record is kept"
            );
        }
        // A copy's verified segments were synced and read back by this
        // process: nothing of them sits only in the page cache.
        // The newest segment takes appends from now on: an index of it (its
        // seal's successor never reached the disk) would not cover them, and
        // a later seal that fails to write a new one must not leave it to be
        // believed.
        if let Some((_, _, name)) = found.last() {
            let stale = index::index_name(name);
            if indexed.contains(&stale) {
                remove_durably(fs, dir, &dir.join(&stale)).await?;
            }
        }
        // After a clean close the newest segment holds exactly what was
        // fdatasynced without a failure: nothing to rewrite. The mark goes
        // before anything is appended, so it never outlives this open.
        let clean = clean_mark::take(fs, dir).await?;
        if let Some((newest, _)) = segments
            .iter()
            .zip(&trusted)
            .rev()
            .find(|(s, _)| !s.batches.is_empty())
            .filter(|(_, trusted)| !**trusted)
        {
            let name = newest.path.file_name().and_then(|n| n.to_str());
            let closed_cleanly = clean.as_ref().is_some_and(|mark| {
                Some(mark.segment.as_str()) == name && mark.write_pos == newest.write_pos
            });
            if !closed_cleanly {
                make_batches_durable(newest).await?;
                recovery.rewritten_bytes = newest.write_pos - BLOCK_BYTES;
            }
        }
        let next_offset = segments.iter().map(Segment::end_offset).max().unwrap_or(0);
        let next_seq = found.last().map_or(0, |(seq, _, _)| seq + 1);
        recovery.segments = segments.len();
        recovery.high_watermark = next_offset;
        let state = LogState {
            segments,
            next_offset,
            next_seq,
            retention_ms: config.retention_ms,
        };
        let log = Self {
            fs: fs.clone(),
            dir: dir.to_path_buf(),
            config,
            clock,
            state: RefCell::new(state),
            appending: Cell::new(false),
            behind: RefCell::new(Vec::new()),
            pending: RefCell::default(),
            behind_suspect: Cell::new(false),
            failures: Cell::new(0),
            append_failed: Cell::new(false),
            corrupt_records: Cell::new(0),
        };
        Ok((log, recovery))
    }

    /// Records, at a graceful stop, that every append since the log was
    /// opened succeeded and where the newest batch ends: the next open,
    /// finding the log so, does not rewrite its newest segment (which only
    /// guards against a failed fdatasync's page-cache ghosts). Nothing is
    /// recorded after a failed append.
    pub async fn mark_clean(&self) -> Result<()> {
        self.sync_behind().await?;
        if self.append_failed.get() {
            return Ok(());
        }
        let mark = {
            let state = self.state.borrow();
            state
                .segments
                .iter()
                .rev()
                .find(|s| !s.batches.is_empty())
                .and_then(|s| {
                    Some(clean_mark::CleanMark {
                        segment: s.path.file_name()?.to_str()?.to_string(),
                        write_pos: s.write_pos,
                    })
                })
        };
        match mark {
            Some(mark) => clean_mark::put(&self.fs, &self.dir, &mark).await,
            None => Ok(()),
        }
    }

    /// The next offset to be written: every offset below it is committed
    /// (or appended behind).
    pub fn high_watermark(&self) -> u64 {
        self.state.borrow().next_offset + self.pending.borrow().messages.len() as u64
    }

    /// The oldest offset still stored (the high watermark when the log is empty).
    pub fn log_start_offset(&self) -> u64 {
        let state = self.state.borrow();
        state
            .segments
            .iter()
            .find(|s| !s.batches.is_empty())
            .map_or(state.next_offset, Segment::first_offset)
    }

    /// Damaged records met by reads since the log was opened.
    pub fn corrupt_records_read(&self) -> u64 {
        self.corrupt_records.get()
    }

    pub fn set_retention_ms(&self, retention_ms: u64) {
        self.state.borrow_mut().retention_ms = retention_ms;
    }

    pub fn segment_count(&self) -> usize {
        self.state.borrow().segments.len()
    }

    /// Appends one batch: write, fdatasync, read back, verify, then move the
    /// high watermark. Returns the batch's first offset.
    pub async fn append(&self, messages: &[Message]) -> Result<u64> {
        if messages.is_empty() {
            return Ok(self.high_watermark());
        }
        let (count, len) = Self::batch_size(messages)?;
        assert!(
            !self.appending.replace(true),
            "partition log appends must not overlap"
        );
        // Batches written behind come first: this append's sync would make
        // them durable, but not verified.
        let result = match self.sync_behind_inner().await {
            Ok(()) => self.append_inner(messages, count, len, true).await,
            Err(error) => Err(error),
        };
        self.appending.set(false);
        result
    }

    /// Appends one batch without syncing it: it is readable at once and
    /// the high watermark moves, but a power cut may take it until
    /// [`Self::sync_behind`] returns. For a caller whose batch is already
    /// durable elsewhere (a journal that replays it at the same offsets
    /// after a crash). Returns the batch's first offset.
    pub async fn append_behind(&self, messages: &[Message]) -> Result<u64> {
        if messages.is_empty() {
            return Ok(self.high_watermark());
        }
        let (count, len) = Self::batch_size(messages)?;
        assert!(
            !self.appending.replace(true),
            "partition log appends must not overlap"
        );
        let result = self.append_pending(messages, count, len).await;
        self.appending.set(false);
        result
    }

    /// Adds a batch to the messages waiting to be written, writing those
    /// first if the batch would make them more than one write holds.
    async fn append_pending(&self, messages: &[Message], count: u32, len: u64) -> Result<u64> {
        let full = {
            let pending = self.pending.borrow();
            !pending.messages.is_empty()
                && (pending.messages.len() + count as usize > BATCH_RECORDS_MAX as usize
                    || pending.len + len > BEHIND_WRITE_BYTES_MAX)
        };
        if full {
            self.write_pending().await?;
        }
        let base = self.high_watermark();
        let mut pending = self.pending.borrow_mut();
        pending.messages.extend_from_slice(messages);
        pending.len = batch::encoded_len(&pending.messages);
        Ok(base)
    }

    /// Writes the messages appended behind (one batch, no sync), so that
    /// [`Self::behind_snapshot`] covers them. Call it where appends take
    /// turns: it writes to the active segment.
    pub async fn write_behind(&self) -> Result<()> {
        assert!(
            !self.appending.replace(true),
            "partition log appends must not overlap"
        );
        let result = self.write_pending().await;
        self.appending.set(false);
        result
    }

    /// Writes the pending messages as one batch behind. They stay pending
    /// (and readable) until the write succeeds; a failed write seals the
    /// segment, and the next sync writes them into a new one.
    async fn write_pending(&self) -> Result<()> {
        let messages = {
            let pending = self.pending.borrow();
            if pending.messages.is_empty() {
                return Ok(());
            }
            pending.messages.clone()
        };
        let (count, len) = Self::batch_size(&messages)?;
        let now = self.clock.now_ms();
        if self.needs_roll(len, now) {
            self.sync_written_behind().await?;
            // A failed sync wrote its batches again into a new segment.
            if self.needs_roll(len, now) {
                self.roll(now).await?;
            }
        }
        self.write_at_tail(&messages, count, len, false).await?;
        let mut pending = self.pending.borrow_mut();
        pending.messages.drain(..messages.len());
        pending.len = batch::encoded_len(&pending.messages);
        Ok(())
    }

    /// Syncs every batch written behind and reads it back: returns the
    /// offset below which everything is durable and verified (the high
    /// watermark). A batch whose sync or read-back fails is written again,
    /// whole, at the start of a new segment (which supersedes the old
    /// segment from there, as recovery reads it); an error means even that
    /// failed, and the log stands at the last verified batch.
    pub async fn sync_behind(&self) -> Result<u64> {
        assert!(
            !self.appending.replace(true),
            "partition log appends must not overlap"
        );
        let result = self.sync_behind_inner().await;
        self.appending.set(false);
        result.map(|()| self.high_watermark())
    }

    /// Whether batches written behind wait for [`Self::sync_behind`].
    pub fn has_behind(&self) -> bool {
        !self.behind.borrow().is_empty() || !self.pending.borrow().messages.is_empty()
    }

    /// The batches written behind so far (not those still pending: see
    /// [`Self::write_behind`]), when they lie one after the other in the
    /// active segment (else `None`, and [`Self::sync_behind`] is the way):
    /// [`Self::verify_behind`] syncs and reads them back while appends go
    /// on, and [`Self::behind_verified`] takes them off the list.
    pub fn behind_snapshot(&self) -> Option<BehindSnapshot<F::File>> {
        if self.behind_suspect.get() {
            return None;
        }
        let behind = self.behind.borrow();
        let first = behind.first()?;
        let last = behind.last()?;
        let contiguous = behind
            .windows(2)
            .all(|w| w[0].seq == w[1].seq && w[0].pos + w[0].bytes.len() as u64 == w[1].pos);
        let state = self.state.borrow();
        let segment = state.segments.last()?;
        if !contiguous || segment.seq != first.seq {
            return None;
        }
        Some(BehindSnapshot {
            file: segment.file.clone(),
            path: segment.path.clone(),
            seq: first.seq,
            pos: first.pos,
            bytes: behind
                .iter()
                .flat_map(|b| b.bytes.iter().copied())
                .collect(),
            last_pos: last.pos,
            failures: self.failures.get(),
            end_offset: last.base_offset + u64::from(last.count),
        })
    }

    /// fdatasyncs the snapshot's segment and reads the snapshot back:
    /// whether every byte is as written. Needs no turn: appends write past it.
    pub async fn verify_behind(snapshot: &BehindSnapshot<F::File>) -> Result<bool> {
        snapshot
            .file
            .sync_data()
            .await
            .map_err(|e| StorageError::io("fdatasync", &snapshot.path, e))?;
        snapshot
            .file
            .read_equals(snapshot.pos, &snapshot.bytes)
            .await
            .map_err(|e| StorageError::io("read back", &snapshot.path, e))
    }

    /// The snapshot verified: its batches are durable (those a roll or a
    /// sync took care of meanwhile are gone from the list already). False,
    /// and nothing changes, if a write or sync failed since the snapshot
    /// (a later fdatasync may then succeed without having written them, or
    /// the log went back): [`Self::sync_behind`] settles them.
    pub fn behind_verified(&self, snapshot: &BehindSnapshot<F::File>) -> bool {
        if self.failures.get() != snapshot.failures {
            return false;
        }
        self.behind
            .borrow_mut()
            .retain(|b| b.seq != snapshot.seq || b.pos > snapshot.last_pos);
        true
    }

    /// The snapshot's sync or read-back failed: the next sync writes its
    /// batches again rather than trust them (fsyncgate).
    pub fn behind_failed(&self) {
        self.failures.set(self.failures.get() + 1);
        if !self.behind.borrow().is_empty() {
            self.behind_suspect.set(true);
        }
    }

    /// Writes what is pending, then syncs and verifies every batch written
    /// behind. Ok: every offset below the high watermark is verified. An
    /// error: the log stands at its last verified batch.
    async fn sync_behind_inner(&self) -> Result<()> {
        let end = self.high_watermark();
        let result = match self.write_pending().await {
            Ok(()) => self.sync_written_behind().await,
            Err(error) => {
                // The failed write sealed the segment: what was written
                // before is settled (written again in a new segment if need
                // be), then the pending messages are written after it.
                tracing::warn!(%error, "writing batches appended behind failed; writing them into a new segment");
                let retried = async {
                    self.sync_written_behind().await?;
                    self.write_pending().await?;
                    self.sync_written_behind().await
                }
                .await;
                match retried {
                    Ok(()) if self.high_watermark() == end => Ok(()),
                    Ok(()) => Err(error),
                    Err(again) => Err(again),
                }
            }
        };
        if result.is_err() {
            // Nothing pending has a place after the last verified batch.
            *self.pending.borrow_mut() = Pending::default();
        }
        result
    }

    /// Syncs and verifies every batch written behind; a batch that fails is
    /// written again, synced, in a new segment.
    async fn sync_written_behind(&self) -> Result<()> {
        if self.behind.borrow().is_empty() {
            return Ok(());
        }
        let (file, path, ..) = self.active_tail()?;
        let mut failure = if self.behind_suspect.replace(false) {
            Some(StorageError::Io {
                op: "an earlier write or sync",
                path: path.clone(),
                source: std::rc::Rc::new(std::io::Error::other(
                    "failed after batches were written behind",
                )),
            })
        } else {
            file.sync_data()
                .await
                .map_err(|e| StorageError::io("fdatasync", &path, e))
                .err()
        };
        if failure.is_none() {
            // The batches lie one after the other: one read checks them all.
            let checks: Vec<(u64, Vec<u8>)> = {
                let behind = self.behind.borrow();
                let contiguous = behind
                    .windows(2)
                    .all(|w| w[0].pos + w[0].bytes.len() as u64 == w[1].pos);
                match (contiguous, behind.first()) {
                    (true, Some(first)) => vec![(
                        first.pos,
                        behind
                            .iter()
                            .flat_map(|b| b.bytes.iter().copied())
                            .collect(),
                    )],
                    _ => behind.iter().map(|b| (b.pos, b.bytes.clone())).collect(),
                }
            };
            for (pos, bytes) in checks {
                match file.read_equals(pos, &bytes).await {
                    Ok(true) => {}
                    Ok(false) => {
                        failure = Some(StorageError::VerifyFailed {
                            path: path.clone(),
                            pos,
                            detail: "bytes written behind differ when read back".into(),
                        });
                        break;
                    }
                    Err(e) => {
                        failure = Some(StorageError::io("read back", &path, e));
                        break;
                    }
                }
            }
        }
        let Some(error) = failure else {
            self.behind.borrow_mut().clear();
            return Ok(());
        };
        tracing::error!(path = %path.display(), %error, "partition log sync of batches written behind failed; writing them again in a new segment");
        self.failures.set(self.failures.get() + 1);
        self.append_failed.set(true);
        let result = self.write_behind_again().await;
        if result.is_err() {
            // The log stands at the last batch written again: the pending
            // messages, which followed them all, have no offsets left.
            *self.pending.borrow_mut() = Pending::default();
        }
        result
    }

    /// Forgets the batches written behind where they lie and writes them
    /// again, synced, at the start of a new segment.
    async fn write_behind_again(&self) -> Result<()> {
        let behind = std::mem::take(&mut *self.behind.borrow_mut());
        let first = behind.first().map(|b| (b.pos, b.base_offset));
        {
            // Forget them where they are: the log ends at the last verified
            // batch, and the active segment takes no more appends.
            let mut state = self.state.borrow_mut();
            let Some((pos, base_offset)) = first else {
                return Ok(());
            };
            let segment = state
                .segments
                .last_mut()
                .ok_or(StorageError::Closed("partition log segment"))?;
            segment.batches.retain(|b| b.base_offset < base_offset);
            segment.write_pos = pos;
            segment.sealed = true;
            state.next_offset = base_offset;
        }
        let now = self.clock.now_ms();
        self.roll(now).await?;
        for batch in behind {
            self.write_again(batch).await?;
        }
        Ok(())
    }

    /// The active segment's file, path, write position and allocation.
    fn active_tail(&self) -> Result<(Rc<F::File>, PathBuf, u64, u64)> {
        let state = self.state.borrow();
        let segment = state
            .segments
            .last()
            .ok_or(StorageError::Closed("partition log segment"))?;
        Ok((
            segment.file.clone(),
            segment.path.clone(),
            segment.write_pos,
            segment.allocated,
        ))
    }

    /// Writes a batch that failed where it was written behind at the end of
    /// the active segment, synced and verified.
    async fn write_again(&self, batch: Behind) -> Result<()> {
        let (file, path, pos, allocated) = self.active_tail()?;
        let len = batch.bytes.len() as u64;
        let result = self
            .write_verified(
                &file,
                &path,
                &batch.bytes,
                pos,
                allocated,
                batch.base_offset,
                batch.count,
            )
            .await;
        let mut state = self.state.borrow_mut();
        let segment = state
            .segments
            .last_mut()
            .ok_or(StorageError::Closed("partition log segment"))?;
        match result {
            Ok(new_allocated) => {
                segment.allocated = new_allocated;
                segment.batches.push(BatchEntry {
                    base_offset: batch.base_offset,
                    count: batch.count,
                    pos,
                    len,
                    appended_at_ms: self.clock.now_ms(),
                });
                segment.write_pos = pos + len;
                state.next_offset = batch.base_offset + u64::from(batch.count);
                Ok(())
            }
            Err(error) => {
                segment.sealed = true;
                Err(error)
            }
        }
    }

    fn batch_size(messages: &[Message]) -> Result<(u32, u64)> {
        let count = u32::try_from(messages.len())
            .ok()
            .filter(|c| *c <= BATCH_RECORDS_MAX)
            .ok_or(StorageError::TooLarge {
                what: "batch record count",
                len: messages.len() as u64,
                max: u64::from(BATCH_RECORDS_MAX),
            })?;
        let len = batch::encoded_len(messages);
        if len > BATCH_BYTES_MAX {
            return Err(StorageError::TooLarge {
                what: "batch",
                len,
                max: BATCH_BYTES_MAX,
            });
        }
        Ok((count, len))
    }

    async fn append_inner(
        &self,
        messages: &[Message],
        count: u32,
        len: u64,
        sync: bool,
    ) -> Result<u64> {
        let now = self.clock.now_ms();
        if self.needs_roll(len, now) {
            self.sync_behind_inner().await?;
            // A failed sync wrote its batches again into a new segment.
            if self.needs_roll(len, now) {
                self.roll(now).await?;
            }
        }
        self.write_at_tail(messages, count, len, sync).await
    }

    /// Writes a batch at the end of the active segment (synced and verified,
    /// or behind), after the segments' last offset. Nothing may be pending
    /// but the batch itself.
    async fn write_at_tail(
        &self,
        messages: &[Message],
        count: u32,
        len: u64,
        sync: bool,
    ) -> Result<u64> {
        let now = self.clock.now_ms();
        let (file, path, pos, allocated) = self.active_tail()?;
        let base_offset = self.state.borrow().next_offset;
        let buf = batch::encode_batch(base_offset, now, messages);
        let result = if sync {
            self.write_verified(&file, &path, &buf, pos, allocated, base_offset, count)
                .await
        } else {
            self.write_batch(&file, &path, &buf, pos, allocated).await
        };
        let mut state = self.state.borrow_mut();
        let segment = state
            .segments
            .last_mut()
            .ok_or(StorageError::Closed("partition log segment"))?;
        match result {
            Ok(new_allocated) => {
                segment.allocated = new_allocated;
                segment.batches.push(BatchEntry {
                    base_offset,
                    count,
                    pos,
                    len,
                    appended_at_ms: now,
                });
                segment.write_pos = pos + len;
                let seq = segment.seq;
                state.next_offset = base_offset + u64::from(count);
                if !sync {
                    self.behind.borrow_mut().push(Behind {
                        seq,
                        pos,
                        base_offset,
                        count,
                        bytes: buf,
                    });
                }
                Ok(base_offset)
            }
            Err(error) => {
                tracing::error!(path = %path.display(), %error, "partition log append failed; segment sealed");
                self.failures.set(self.failures.get() + 1);
                self.append_failed.set(true);
                segment.sealed = true;
                if !self.behind.borrow().is_empty() {
                    self.behind_suspect.set(true);
                }
                Err(error)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn write_verified(
        &self,
        file: &F::File,
        path: &Path,
        buf: &[u8],
        pos: u64,
        allocated: u64,
        base_offset: u64,
        count: u32,
    ) -> Result<u64> {
        let new_allocated = self.write_batch(file, path, buf, pos, allocated).await?;
        file.sync_data()
            .await
            .map_err(|e| StorageError::io("fdatasync", path, e))?;
        // The bytes read back must be the bytes written: the same bytes
        // carry the checksums encode_batch computed, so one comparison
        // verifies them all. Only a mismatch is decoded, to say what broke.
        let same = file
            .read_equals(pos, buf)
            .await
            .map_err(|e| StorageError::io("read back", path, e))?;
        if !same {
            let back = file
                .read_at(pos, buf.len())
                .await
                .map_err(|e| StorageError::io("read back", path, e))?;
            let detail = match batch::decode_batch(&back, 0) {
                None => "batch header checksum",
                Some(d) if d.base_offset != base_offset || d.count != count => {
                    "batch header fields"
                }
                Some(d) if d.bad_records() > 0 => "record checksum",
                Some(_) => "bytes differ from what was written",
            };
            return Err(StorageError::VerifyFailed {
                path: path.to_path_buf(),
                pos,
                detail: detail.to_string(),
            });
        }
        Ok(new_allocated)
    }

    /// Writes a batch at `pos`, growing the segment's preallocation first
    /// if it needs room; no sync of the batch. Returns the new allocation.
    async fn write_batch(
        &self,
        file: &F::File,
        path: &Path,
        buf: &[u8],
        pos: u64,
        allocated: u64,
    ) -> Result<u64> {
        let needed = pos + buf.len() as u64;
        let mut new_allocated = allocated;
        if needed > allocated {
            // Grow by as much as the segment holds (doubling it), within
            // the first preallocation and the step.
            let step = allocated
                .max(SEGMENT_PREALLOC_FIRST_BYTES)
                .min(self.config.prealloc_step_bytes);
            let target = round_up(needed, step).min(needed.max(self.config.segment_bytes));
            let target = round_up(target, BLOCK_BYTES);
            zero_fill(file, path, allocated, target - allocated).await?;
            file.sync_data()
                .await
                .map_err(|e| StorageError::io("fdatasync", path, e))?;
            new_allocated = target;
        }
        file.write_at(buf, pos)
            .await
            .map_err(|e| StorageError::io("write", path, e))?;
        Ok(new_allocated)
    }

    fn needs_roll(&self, len: u64, now: u64) -> bool {
        let state = self.state.borrow();
        let Some(active) = state.segments.last() else {
            return true;
        };
        if active.sealed {
            return true;
        }
        if !active.batches.is_empty() && active.write_pos + len > self.config.segment_bytes {
            return true;
        }
        let half_retention = state.retention_ms / 2;
        state.retention_ms > 0
            && active
                .first_append_ms()
                .is_some_and(|first| now.saturating_sub(first) >= half_retention)
    }

    /// The index `index_name` of the segment `seq`/`base_offset` (open as
    /// `file`) and the segment's size, if the index is whole and matches it.
    async fn read_index(
        fs: &F,
        dir: &Path,
        index_name: &str,
        file: &F::File,
        seq: u64,
        base_offset: u64,
    ) -> Option<(index::SegmentIndex, u64)> {
        let bytes = read_whole_file(fs, &dir.join(index_name)).await.ok()?;
        let found = index::decode(&bytes)?;
        let size = file.size().await.ok()?;
        let size = size - size % BLOCK_BYTES;
        let matches =
            found.seq == seq && found.base_offset == base_offset && found.write_pos <= size;
        matches.then_some((found, size))
    }

    /// Rolls once the batches written behind are synced and verified: a
    /// sealed segment's index says its batches are durable.
    async fn sync_behind_and_roll(&self, now: u64) -> Result<()> {
        self.sync_behind_inner().await?;
        self.roll(now).await
    }

    /// Creates a new active segment starting at the high watermark.
    async fn roll(&self, now: u64) -> Result<()> {
        let (seq, base_offset) = {
            let state = self.state.borrow();
            (state.next_seq, state.next_offset)
        };
        let name = segment_name(seq, base_offset);
        let path = self.dir.join(&name);
        let header = encode_segment_header(seq, base_offset, now);
        {
            // Seal first: once a file with a later seq may exist, the previous
            // segment must never take another append (recovery lets a later
            // segment supersede earlier ones from its base).
            let mut state = self.state.borrow_mut();
            state.next_seq = seq + 1;
            if let Some(previous) = state.segments.last_mut() {
                previous.sealed = true;
            }
        }
        // Every batch of the sealed segment was fdatasynced when appended:
        // its index may say so.
        let sealed = {
            let state = self.state.borrow();
            state.segments.last().map(|s| (s.path.clone(), s.index()))
        };
        if let Some((path, index)) = &sealed {
            write_index(&self.fs, &self.dir, path, index).await;
        }
        create_file_through(&self.fs, &self.dir, &name, &header, 0).await?;
        let file = self
            .fs
            .open(&path, OpenMode::EXISTING_DIRECT)
            .await
            .map_err(|e| StorageError::io("open", &path, e))?;
        let mut state = self.state.borrow_mut();
        state.segments.push(Segment {
            seq,
            base_offset,
            path,
            file: Rc::new(file),
            batches: Vec::new(),
            write_pos: BLOCK_BYTES,
            allocated: BLOCK_BYTES,
            sealed: false,
        });
        Ok(())
    }

    /// Reads up to `max_messages` messages (and about `max_bytes` of values)
    /// from offset `from` on. Damaged records are skipped, counted and logged;
    /// offsets below the log start are skipped. Each value owns its bytes:
    /// the messages may be kept (a child's copy lands in its tail cache).
    pub async fn read(
        &self,
        from: u64,
        max_messages: usize,
        max_bytes: usize,
    ) -> Result<Vec<StoredMessage>> {
        self.read_as(from, max_messages, max_bytes, Values::Owned)
            .await
    }

    /// [`PartitionLog::read`] for messages that leave at once (a consume's
    /// answer): the values of a batch are slices of the one buffer it was
    /// read into, not copies. Keeping them would keep the whole batch.
    pub async fn read_for_delivery(
        &self,
        from: u64,
        max_messages: usize,
        max_bytes: usize,
    ) -> Result<Vec<StoredMessage>> {
        self.read_as(from, max_messages, max_bytes, Values::Shared)
            .await
    }

    async fn read_as(
        &self,
        from: u64,
        max_messages: usize,
        max_bytes: usize,
        values: Values,
    ) -> Result<Vec<StoredMessage>> {
        // What the segments hold, and (taken at the same moment) what
        // follows them in memory, not written yet.
        let (plan, unwritten): (ReadPlan<F::File>, Vec<StoredMessage>) = {
            let state = self.state.borrow();
            let pending = self.pending.borrow();
            let unwritten = (state.next_offset..)
                .zip(&pending.messages)
                .skip_while(|(offset, _)| *offset < from)
                .take(max_messages)
                .map(|(offset, message)| StoredMessage {
                    offset,
                    message: message.clone(),
                })
                .collect();
            let mut plan = Vec::new();
            let mut planned = 0u64;
            let mut planned_bytes = 0u64;
            'segments: for segment in state.segments.iter().filter(|s| s.end_offset() > from) {
                let start = segment.batches.partition_point(|b| b.end_offset() <= from);
                for entry in segment.batches.iter().skip(start) {
                    plan.push((segment.file.clone(), segment.path.clone(), *entry));
                    planned += u64::from(entry.count)
                        - from
                            .saturating_sub(entry.base_offset)
                            .min(u64::from(entry.count));
                    planned_bytes += entry.len;
                    if planned >= max_messages as u64 || planned_bytes >= max_bytes as u64 {
                        break 'segments;
                    }
                }
            }
            (plan, unwritten)
        };
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for (file, path, entry) in plan {
            let len = usize::try_from(entry.len).unwrap_or(usize::MAX);
            let raw = file
                .read_at(entry.pos, len)
                .await
                .map_err(|e| StorageError::io("read", &path, e))?;
            let decoded = match values {
                Values::Owned => batch::decode_batch(&raw, 0),
                Values::Shared => batch::decode_batch_shared(&Bytes::from(raw), 0),
            }
            .filter(|d| d.base_offset == entry.base_offset && d.count == entry.count);
            let Some(decoded) = decoded else {
                self.report_corrupt(&path, entry.base_offset, u64::from(entry.count));
                continue;
            };
            for (offset, record) in (entry.base_offset..).zip(decoded.records) {
                if offset < from {
                    continue;
                }
                let Some(message) = record else {
                    self.report_corrupt(&path, offset, 1);
                    continue;
                };
                if out.len() >= max_messages || (bytes >= max_bytes && !out.is_empty()) {
                    return Ok(out);
                }
                bytes += message.value.len();
                out.push(StoredMessage { offset, message });
            }
        }
        for stored in unwritten {
            if out.len() >= max_messages || (bytes >= max_bytes && !out.is_empty()) {
                break;
            }
            bytes += stored.message.value.len();
            out.push(stored);
        }
        Ok(out)
    }

    /// The idempotency keys of the newest records, oldest first, each with
    /// its batch's append time: records of batches appended at `since_ms`
    /// or later, among the last `max_records` records. How an owner
    /// rebuilds its table of recent keys at open. Neighbouring small
    /// batches (at most [`KEYS_GROUP_BATCH_BYTES_MAX`] each, a few records
    /// whose values cost little to read along) are read together, up to
    /// [`KEYS_READ_BYTES`] at a time: one read per batch would make an open
    /// wait on thousands of reads. A larger batch is read only in its first
    /// block and the blocks of its keys area, not its values. A keys area
    /// that fails its checksum gives no keys.
    pub async fn idempotency_keys_since(
        &self,
        since_ms: u64,
        max_records: usize,
    ) -> Result<Vec<RecentIdempotencyKey>> {
        // The batches to read, per segment, oldest first.
        let plan: Vec<(Rc<F::File>, PathBuf, Vec<BatchEntry>)> = {
            let state = self.state.borrow();
            let mut plan = Vec::new();
            let mut planned = 0usize;
            'segments: for segment in state.segments.iter().rev() {
                let mut entries = Vec::new();
                for entry in segment.batches.iter().rev() {
                    if entry.appended_at_ms < since_ms || planned >= max_records {
                        if !entries.is_empty() {
                            entries.reverse();
                            plan.push((segment.file.clone(), segment.path.clone(), entries));
                        }
                        break 'segments;
                    }
                    planned += entry.count as usize;
                    entries.push(*entry);
                }
                if !entries.is_empty() {
                    entries.reverse();
                    plan.push((segment.file.clone(), segment.path.clone(), entries));
                }
            }
            plan.reverse();
            plan
        };
        let mut keys = Vec::new();
        for (file, path, entries) in plan {
            let read = |pos: u64, len: u64| {
                let file = file.clone();
                let path = path.clone();
                async move {
                    let len = usize::try_from(len).unwrap_or(usize::MAX);
                    file.read_at(pos, len)
                        .await
                        .map_err(|e| StorageError::io("read", &path, e))
                }
            };
            let mut next = 0;
            while let Some(first) = entries.get(next) {
                if first.len > KEYS_GROUP_BATCH_BYTES_MAX {
                    next += 1;
                    let header = read(first.pos, BLOCK_BYTES.min(first.len)).await?;
                    let Some((at, len)) = batch::keys_area_of(&header) else {
                        continue;
                    };
                    let (at, len) = (at as u64, len as u64);
                    if at + len > first.len {
                        continue;
                    }
                    let from = at - at % BLOCK_BYTES;
                    let blocks = read(
                        first.pos + from,
                        round_up(at + len, BLOCK_BYTES).min(first.len) - from,
                    )
                    .await?;
                    let area = usize::try_from(at - from)
                        .ok()
                        .and_then(|at| blocks.get(at..at + len as usize));
                    keys_of_area(&mut keys, area, first, &path);
                    continue;
                }
                // Neighbours that fit one read with the first.
                let mut last = next;
                while entries.get(last + 1).is_some_and(|e| {
                    e.len <= KEYS_GROUP_BATCH_BYTES_MAX
                        && e.pos + e.len - first.pos <= KEYS_READ_BYTES
                }) {
                    last += 1;
                }
                let end = entries[last].pos + entries[last].len;
                let bytes = read(first.pos, end - first.pos).await?;
                for entry in &entries[next..=last] {
                    let Some(batch) = usize::try_from(entry.pos - first.pos)
                        .ok()
                        .and_then(|from| bytes.get(from..from + entry.len as usize))
                    else {
                        continue;
                    };
                    let Some((at, len)) = batch::keys_area_of(batch) else {
                        continue;
                    };
                    keys_of_area(&mut keys, batch.get(at..at + len), entry, &path);
                }
                next = last + 1;
            }
        }
        Ok(keys)
    }

    /// Every segment file, oldest first, with the bytes that hold batches.
    pub fn segment_extents(&self) -> Vec<SegmentExtent> {
        let state = self.state.borrow();
        state
            .segments
            .iter()
            .map(|s| SegmentExtent {
                name: segment_name(s.seq, s.base_offset),
                written: s.write_pos,
            })
            .collect()
    }

    /// Up to `len` bytes of segment `name` from `pos` (a multiple of the
    /// block size), no further than its written bytes; empty past them.
    pub async fn read_segment(&self, name: &str, pos: u64, len: u64) -> Result<Vec<u8>> {
        let (file, path, written) = {
            let state = self.state.borrow();
            let segment = state
                .segments
                .iter()
                .find(|s| segment_name(s.seq, s.base_offset) == name)
                .ok_or_else(|| StorageError::BadFormat {
                    path: self.dir.join(name),
                    detail: "no such segment (retention may have deleted it)".into(),
                })?;
            (
                segment.file.clone(),
                segment.path.clone(),
                segment.write_pos,
            )
        };
        if pos % BLOCK_BYTES != 0 {
            return Err(StorageError::InvalidConfig(format!(
                "a segment read at {pos} is not block-aligned"
            )));
        }
        let len = round_up(len.min(written.saturating_sub(pos)), BLOCK_BYTES);
        if len == 0 {
            return Ok(Vec::new());
        }
        read_exact_or_short(&*file, &path, pos, len, RECOVERY_READ_CHUNK_BYTES).await
    }

    /// Where each batch lies: (segment path, position, length, base offset,
    /// count). For tests and tools that map damage to offsets.
    pub fn batch_extents(&self) -> Vec<(PathBuf, u64, u64, u64, u32)> {
        let state = self.state.borrow();
        state
            .segments
            .iter()
            .flat_map(|s| {
                s.batches
                    .iter()
                    .map(|b| (s.path.clone(), b.pos, b.len, b.base_offset, b.count))
            })
            .collect()
    }

    fn report_corrupt(&self, path: &Path, offset: u64, count: u64) {
        self.corrupt_records.set(self.corrupt_records.get() + count);
        metrics::counter!(STORAGE_CORRUPT_RECORDS_TOTAL).increment(count);
        tracing::error!(path = %path.display(), offset, count, "damaged record in partition log; not served");
    }

    /// Deletes whole segments whose newest batch is older than the retention,
    /// oldest first.
    pub async fn enforce_retention(&self) -> Result<RetentionOutcome> {
        let now = self.clock.now_ms();
        let mut outcome = RetentionOutcome::default();
        loop {
            let (expired, is_active) = {
                let state = self.state.borrow();
                let retention = state.retention_ms;
                let Some(oldest) = state.segments.first() else {
                    break;
                };
                let expired = retention > 0
                    && oldest
                        .newest_append_ms()
                        .is_none_or(|newest| now.saturating_sub(newest) >= retention);
                let is_active = state.segments.len() == 1;
                // Messages pending behind the active segment are the newest.
                let pending = is_active && !self.pending.borrow().messages.is_empty();
                (
                    expired && !pending && (!oldest.batches.is_empty() || !is_active),
                    is_active,
                )
            };
            if !expired {
                break;
            }
            if is_active {
                // Keep an (empty) segment that remembers the next offset.
                self.sync_behind_and_roll(now).await?;
            }
            let oldest = self.state.borrow_mut().segments.remove(0);
            drop(oldest.file);
            // The index goes first: an index left without its segment is
            // removed at the next open; a segment without its index is
            // only scanned.
            if let Some(name) = oldest.path.file_name().and_then(|n| n.to_str()) {
                let index_path = self.dir.join(index::index_name(name));
                let exists = self
                    .fs
                    .exists(&index_path)
                    .await
                    .map_err(|e| StorageError::io("stat", &index_path, e))?;
                if exists {
                    self.fs
                        .remove_file(&index_path)
                        .await
                        .map_err(|e| StorageError::io("remove", &index_path, e))?;
                }
            }
            self.fs
                .remove_file(&oldest.path)
                .await
                .map_err(|e| StorageError::io("remove", &oldest.path, e))?;
            self.fs
                .sync_dir(&self.dir)
                .await
                .map_err(|e| StorageError::io("fsync dir", &self.dir, e))?;
            tracing::info!(path = %oldest.path.display(), seq = oldest.seq, "retention deleted segment");
            outcome.deleted_segments += 1;
        }
        outcome.log_start_offset = self.log_start_offset();
        Ok(outcome)
    }
}

impl<F: FileSystem> std::fmt::Debug for PartitionLog<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionLog")
            .field("dir", &self.dir)
            .field("high_watermark", &self.high_watermark())
            .finish()
    }
}

/// Whether the values a read returns own their bytes or share the batch's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Values {
    Owned,
    Shared,
}

/// The keys a batch's keys area holds (`None`: the area lies past the
/// batch), added to `keys`; a damaged area gives none, with a warning.
fn keys_of_area(
    keys: &mut Vec<RecentIdempotencyKey>,
    area: Option<&[u8]>,
    entry: &BatchEntry,
    path: &Path,
) {
    let Some(area) = area else {
        return;
    };
    let Some(found) = batch::decode_keys_area(area, entry.count as usize) else {
        tracing::warn!(path = %path.display(), offset = entry.base_offset, "a batch's idempotency keys are damaged; its messages are served without them");
        return;
    };
    keys.extend(
        found
            .into_iter()
            .flatten()
            .map(|stored| RecentIdempotencyKey {
                key: stored.key,
                since_ms: stored.since_ms,
            }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A release from before idempotency keys counts a batch without its
    /// keys area and appends its next batch where the records' padding
    /// ends, over the keys: a scan here finds both batches (the first
    /// without its keys).
    #[test]
    fn a_batch_written_over_the_keys_area_by_an_earlier_release_is_found() {
        let keyed = Message {
            id: 1,
            produced_at_ms: 5,
            key: None,
            // The records end 10 bytes before the block's end: the keys
            // area runs into the next block.
            value: vec![3u8; 4096 - 48 - 32 - 10].into(),
            idempotency_key: Some(Bytes::from("a-key-of-twenty-byte")),
        };
        let mut bytes = batch::encode_batch(0, 7, std::slice::from_ref(&keyed));
        assert_eq!(bytes.len(), 8192, "the keys spill into a second block");
        let plain = Message {
            id: 2,
            idempotency_key: None,
            ..keyed.clone()
        };
        let next = batch::encode_batch(1, 8, &[plain]);
        bytes.truncate(4096);
        bytes.extend_from_slice(&next);
        let scan = scan_batches(&bytes, 0, 0, 0);
        let found: Vec<(u64, u64, u64)> = scan
            .batches
            .iter()
            .map(|b| (b.base_offset, b.pos, b.len))
            .collect();
        assert_eq!(found, vec![(0, 0, 4096), (1, 4096, 4096)]);
        assert!(!scan.torn_tail);
        // Untouched, the keyed batch takes its keys area with it.
        let whole = batch::encode_batch(0, 7, &[keyed]);
        let scan = scan_batches(&whole, 0, 0, 0);
        assert_eq!(scan.batches[0].len, 8192);
    }

    /// The keys of recent records come back oldest first, after a restart,
    /// no older than asked and no more records back than asked; records
    /// without a key (or written before keys existed) have none.
    #[test]
    fn recent_idempotency_keys_are_read_back_from_the_tail() {
        use crate::clock::ManualClock;
        use crate::io::sim::SimFs;
        use futures_lite::future::block_on;
        let fs = SimFs::new(12);
        let clock = Rc::new(ManualClock::new(1_000));
        let shared: SharedClock = clock.clone();
        let dir = PathBuf::from("/data/partitions/t-0/0");
        let open = |fs: &SimFs| {
            block_on(PartitionLog::open(
                fs,
                &dir,
                LogConfig::default(),
                shared.clone(),
            ))
            .expect("open")
            .0
        };
        let message = |id: u128| Message {
            id,
            produced_at_ms: 1,
            key: None,
            value: vec![7u8; 100].into(),
            idempotency_key: (id % 2 == 0).then(|| Bytes::from(format!("k{id}"))),
        };
        let log = open(&fs);
        for id in 0..6u128 {
            block_on(log.append(&[message(id)])).expect("append");
            clock.advance_ms(1_000);
        }
        drop(log);
        let log = open(&fs);
        let keys = block_on(log.idempotency_keys_since(0, usize::MAX)).expect("scan");
        // A batch whose keys lie blocks past its header.
        let big = |id: u128| Message {
            value: vec![1u8; 5_000].into(),
            idempotency_key: Some(Bytes::from(format!("big{id}"))),
            ..message(id)
        };
        let other = open(&SimFs::new(13));
        block_on(other.append(&[big(1), message(3), big(2)])).expect("append");
        // A batch too large to be read along with others, between others.
        let huge = Message {
            value: vec![2u8; KEYS_GROUP_BATCH_BYTES_MAX as usize + 5_000].into(),
            idempotency_key: Some(Bytes::from("huge")),
            ..message(5)
        };
        block_on(other.append(&[huge])).expect("append");
        block_on(other.append(&[message(6)])).expect("append");
        let far = block_on(other.idempotency_keys_since(0, usize::MAX)).expect("scan");
        assert_eq!(
            far.iter().map(|k| k.key.clone()).collect::<Vec<_>>(),
            vec![
                Bytes::from("big1"),
                Bytes::from("big2"),
                Bytes::from("huge"),
                Bytes::from("k6")
            ]
        );
        // Each window starts at its record's accept time (1 here), not at
        // the append.
        let found: Vec<(&[u8], u64)> = keys.iter().map(|k| (&k.key[..], k.since_ms)).collect();
        assert_eq!(
            found,
            vec![(&b"k0"[..], 1), (&b"k2"[..], 1), (&b"k4"[..], 1)]
        );
        let names = |keys: Vec<RecentIdempotencyKey>| -> Vec<Bytes> {
            keys.into_iter().map(|k| k.key).collect()
        };
        let since = block_on(log.idempotency_keys_since(3_000, usize::MAX)).expect("scan");
        assert_eq!(names(since), vec![Bytes::from("k2"), Bytes::from("k4")]);
        let last_two = block_on(log.idempotency_keys_since(0, 2)).expect("scan");
        assert_eq!(names(last_two), vec![Bytes::from("k4")]);
    }

    /// Small batches appended behind wait in memory, readable at once, and
    /// go to the segment as one batch in one write when the sync comes: a
    /// crash before it leaves the segment without them, one after it
    /// recovers them all at their offsets.
    #[test]
    fn batches_appended_behind_are_written_as_one_when_synced() {
        use crate::clock::ManualClock;
        use crate::io::sim::SimFs;
        use futures_lite::future::block_on;
        let fs = SimFs::new(11);
        let clock: SharedClock = Rc::new(ManualClock::new(1_000));
        let dir = PathBuf::from("/data/partitions/t-0/0");
        let open = |fs: &SimFs| {
            block_on(PartitionLog::open(
                fs,
                &dir,
                LogConfig::default(),
                clock.clone(),
            ))
            .expect("open")
            .0
        };
        let message = |id: u128| Message {
            idempotency_key: None,
            id,
            produced_at_ms: 1,
            key: None,
            value: vec![7u8; 1000].into(),
        };
        let log = open(&fs);
        block_on(log.append(&[message(0)])).expect("append");
        for id in 1..=5 {
            let base = block_on(log.append_behind(&[message(id)])).expect("append behind");
            assert_eq!(base, u64::try_from(id).expect("small"));
        }
        assert_eq!(log.high_watermark(), 6);
        let read = block_on(log.read(0, 100, usize::MAX)).expect("read");
        let ids: Vec<u128> = read.iter().map(|s| s.message.id).collect();
        assert_eq!(ids, vec![0, 1, 2, 3, 4, 5], "readable before any write");
        assert_eq!(
            log.batch_extents().len(),
            1,
            "nothing written yet but the first"
        );
        drop(log);
        fs.power_loss();
        let log = open(&fs);
        assert_eq!(
            log.high_watermark(),
            1,
            "unwritten batches are gone at a cut"
        );

        for id in 1..=5 {
            block_on(log.append_behind(&[message(id)])).expect("append behind");
        }
        assert_eq!(block_on(log.sync_behind()).expect("sync"), 6);
        let extents = log.batch_extents();
        assert_eq!(
            extents.len(),
            2,
            "the five batches went as one: {extents:?}"
        );
        assert_eq!((extents[1].3, extents[1].4), (1, 5));
        drop(log);
        fs.power_loss();
        let log = open(&fs);
        let read = block_on(log.read(0, 100, usize::MAX)).expect("read");
        let at: Vec<(u64, u128)> = read.iter().map(|s| (s.offset, s.message.id)).collect();
        assert_eq!(
            at,
            (0..6).map(|i| (i, u128::from(i as u8))).collect::<Vec<_>>()
        );
    }

    /// A partition that holds little takes little disk: a segment grows
    /// by what it holds (doubling) from the first preallocation up to the
    /// step, never by a whole step at once.
    #[test]
    fn a_segment_preallocates_in_steps_that_grow_with_it() {
        use crate::clock::ManualClock;
        use crate::io::sim::SimFs;
        use futures_lite::future::block_on;
        let fs = SimFs::new(9);
        let clock: SharedClock = Rc::new(ManualClock::new(1_000));
        let dir = PathBuf::from("/data/partitions/t-0/0");
        let (log, _) =
            block_on(PartitionLog::open(&fs, &dir, LogConfig::default(), clock)).expect("open");
        let file_size = |log: &PartitionLog<SimFs>| {
            let (path, ..) = log.batch_extents()[0].clone();
            let file = block_on(fs.open(&path, OpenMode::EXISTING_DIRECT)).expect("open segment");
            block_on(file.size()).expect("size")
        };
        let batch = |id: u128| {
            vec![Message {
                idempotency_key: None,
                id,
                produced_at_ms: 1,
                key: None,
                value: vec![1u8; 1000].into(),
            }]
        };
        block_on(log.append(&batch(0))).expect("append");
        assert_eq!(
            file_size(&log),
            SEGMENT_PREALLOC_FIRST_BYTES,
            "one small message: the first preallocation, header included"
        );
        let mut sizes = vec![file_size(&log)];
        for id in 1..12_000 {
            block_on(log.append(&batch(id))).expect("append");
            let size = file_size(&log);
            if Some(&size) != sizes.last() {
                sizes.push(size);
            }
        }
        let steps: Vec<u64> = sizes.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            steps.windows(2).all(|w| w[1] >= w[0]),
            "steps only grow: {steps:?}"
        );
        assert_eq!(steps.first(), Some(&SEGMENT_PREALLOC_FIRST_BYTES));
        assert_eq!(steps.last(), Some(&SEGMENT_PREALLOC_STEP_BYTES_DEFAULT));
        assert!(steps
            .iter()
            .all(|s| *s <= SEGMENT_PREALLOC_STEP_BYTES_DEFAULT));
    }

    /// A segment whose directory entry was never synced (the process died
    /// between creating it and syncing the folder) is found by the next
    /// open, which appends into it: a power cut must not take it, and the
    /// batches in it, away after that.
    #[test]
    fn a_segment_found_at_open_survives_a_later_power_cut() {
        use crate::clock::ManualClock;
        use crate::io::sim::{FaultError, FaultOp, FaultRule, SimFs};
        use futures_lite::future::block_on;
        let fs = SimFs::new(5);
        let clock: SharedClock = Rc::new(ManualClock::new(1_000));
        let dir = PathBuf::from("/data/partitions/t-0/0");
        let config = LogConfig {
            segment_bytes: 4 * BLOCK_BYTES,
            prealloc_step_bytes: BLOCK_BYTES,
            retention_ms: 0,
        };
        let message = |id| Message {
            idempotency_key: None,
            id,
            produced_at_ms: 1,
            key: None,
            value: vec![7u8; 3000].into(),
        };
        let (log, _) =
            block_on(PartitionLog::open(&fs, &dir, config, clock.clone())).expect("open");
        let mut id = 0;
        // Fill the first segment; the roll to the next one dies before it
        // syncs the folder (its file is there, its name not durable).
        fs.inject(FaultRule::always(
            FaultOp::SyncDir,
            "t-0/0",
            FaultError::Eio,
        ));
        let mut failed = false;
        for _ in 0..100 {
            id += 1;
            if block_on(log.append(&[message(id)])).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed, "the roll failed");
        fs.clear_faults();
        drop(log);
        fs.crash_process();
        let (log, _) =
            block_on(PartitionLog::open(&fs, &dir, config, clock.clone())).expect("reopen");
        let before = log.high_watermark();
        id += 1;
        block_on(log.append(&[message(id)])).expect("append after the restart");
        drop(log);
        fs.power_loss();
        let (log, _) = block_on(PartitionLog::open(&fs, &dir, config, clock)).expect("after power");
        assert_eq!(
            log.high_watermark(),
            before + 1,
            "an acknowledged append vanished with its segment's name"
        );
    }

    #[test]
    fn segment_names_sort_and_parse() {
        assert_eq!(parse_segment_name(&segment_name(3, 77)), Some((3, 77)));
        assert!(segment_name(2, 999) < segment_name(10, 0));
        assert_eq!(parse_segment_name("junk.seg"), None);
    }
}
