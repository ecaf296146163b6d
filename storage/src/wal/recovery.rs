//! Recovery of the ring through a window of its bytes.
//!
//! The scan reads the ring once, front to back, holding one chunk (or one
//! frame, when a frame is longer) at a time: the memory recovery takes does
//! not grow with `storage.wal_ring_bytes`, so a node with large rings neither
//! needs their size in memory at start nor keeps it afterwards. The scan's
//! rules are those of [`crate::frame::scan`] over the whole ring; a second
//! pass reads back only the gaps between consecutive live records, to count
//! damage found there.

use std::collections::VecDeque;
use std::path::Path;

use super::keys::HeldKey;
use super::record;
use super::{LiveRecord, RecoveredRecord, WalPos, WalRecovery, RECORD_MAGIC};
use crate::codec::round_up;
use crate::error::{Result, StorageError};
use crate::frame::{probe, Probe, FRAME_ALIGN, FRAME_HEADER_BYTES};
use crate::io::StorageFile;
use crate::limits::BLOCK_BYTES;

const HEADER: u64 = FRAME_HEADER_BYTES as u64;

/// Bytes `[base, base + bytes.len())` of the ring (physical offsets; the
/// ring starts at `BLOCK_BYTES` in its file).
struct Window<'a, Fl> {
    file: &'a Fl,
    path: &'a Path,
    capacity: u64,
    chunk: u64,
    base: u64,
    bytes: Vec<u8>,
}

impl<'a, Fl: StorageFile> Window<'a, Fl> {
    fn new(file: &'a Fl, path: &'a Path, capacity: u64, chunk: u64) -> Self {
        Self {
            file,
            path,
            capacity,
            chunk: round_up(chunk.max(1), BLOCK_BYTES),
            base: 0,
            bytes: Vec::new(),
        }
    }

    fn end(&self) -> u64 {
        self.base + self.bytes.len() as u64
    }

    /// Makes `[at, at + len)` (cut at the ring's end) present, dropping
    /// what lies before `at`. Bytes past the end of a short file read as zero.
    async fn cover(&mut self, at: u64, len: u64) -> Result<()> {
        let want_end = at.saturating_add(len).min(self.capacity);
        if at >= self.base && want_end <= self.end() {
            return Ok(());
        }
        if at >= self.end() || at < self.base {
            self.base = at - at % BLOCK_BYTES;
            self.bytes.clear();
        } else {
            let keep_from = at - at % BLOCK_BYTES;
            let drop = usize::try_from(keep_from - self.base).unwrap_or(0);
            self.bytes.drain(..drop.min(self.bytes.len()));
            self.base = keep_from;
        }
        while self.end() < want_end {
            let from = self.end();
            let n =
                round_up(self.chunk.max(want_end - from), BLOCK_BYTES).min(self.capacity - from);
            let want = usize::try_from(n).map_err(|_| StorageError::TooLarge {
                what: "WAL recovery read",
                len: n,
                max: usize::MAX as u64,
            })?;
            let got = self
                .file
                .read_at(BLOCK_BYTES + from, want)
                .await
                .map_err(|e| StorageError::io("read", self.path, e))?;
            let start = self.bytes.len();
            self.bytes.extend_from_slice(&got);
            self.bytes.resize(start + want, 0);
        }
        Ok(())
    }

    fn offset(&self, at: u64) -> usize {
        usize::try_from(at - self.base).unwrap_or(usize::MAX)
    }

    /// Probes the frame at `at`, reading its whole extent if its header is
    /// valid and the body runs past the window.
    async fn probe(&mut self, at: u64) -> Result<Probe> {
        self.cover(at, HEADER).await?;
        let found = probe(&self.bytes, self.offset(at), RECORD_MAGIC);
        if let Probe::BadBody { len, .. } = found {
            if at + len as u64 > self.end() && self.end() < self.capacity {
                self.cover(at, len as u64).await?;
                return Ok(probe(&self.bytes, self.offset(at), RECORD_MAGIC));
            }
        }
        Ok(found)
    }
}

/// A frame the scan accepted, its body already decoded (`None`: damaged
/// inside a valid checksum, counted as corrupt).
struct Found {
    pos: WalPos,
    len: u64,
    record: Option<record::WalRecord>,
}

/// Recovers every record of the ring above the checkpoint's tail (every
/// record of the newest lap without one): the records, the live list and
/// the head; and the idempotency keys of every frame from the checkpoint's
/// keys position on (`checkpoint`: tail, keys position).
pub(super) async fn recover<Fl: StorageFile>(
    file: &Fl,
    path: &Path,
    capacity: u64,
    checkpoint: Option<(WalPos, WalPos)>,
    chunk: u64,
) -> Result<(WalRecovery, VecDeque<LiveRecord>, WalPos)> {
    let checkpoint_tail = checkpoint.map(|(tail, _)| tail);
    let scan_from = checkpoint.map(|(tail, keys_from)| keys_from.min(tail));
    let accept =
        |at: u64, pos: u64| pos % capacity == at && scan_from.is_none_or(|from| pos >= from);
    let mut window = Window::new(file, path, capacity, chunk);
    let mut frames: Vec<Found> = Vec::new();
    let mut bad_bodies: Vec<u64> = Vec::new();
    let mut at = 0u64;
    while at + HEADER <= capacity {
        match window.probe(at).await? {
            Probe::Valid { pos, body, len } if accept(at, pos) => {
                let bytes = window.bytes.get(body).unwrap_or_default();
                if let Some(flags) = record::unknown_flags(bytes) {
                    return Err(StorageError::BadFormat {
                        path: path.to_path_buf(),
                        detail: format!(
                            "the record at ring position {pos} was written by a newer version \
                             of Narad (record flags {flags:#06x}); start that version (or a \
                             later one) on this data folder"
                        ),
                    });
                }
                let record = record::decode_body(bytes);
                frames.push(Found {
                    pos,
                    len: len as u64,
                    record,
                });
                at += len as u64;
            }
            Probe::BadBody { pos, len } if accept(at, pos) => {
                bad_bodies.push(pos);
                at = next_frame_inside(&mut window, at, len as u64, &accept).await?;
            }
            // A valid frame of another position is stale (an earlier lap).
            Probe::Valid { len, .. } => at += len as u64,
            Probe::BadBody { .. } | Probe::NoFrame => at += FRAME_ALIGN as u64,
        }
    }
    frames.sort_by_key(|f| f.pos);
    if checkpoint_tail.is_none() {
        // Without a checkpoint keep the newest lap's worth of records.
        if let Some(max) = frames.last().map(|f| f.pos) {
            frames.retain(|f| f.pos + capacity > max);
        }
    }
    let tail = checkpoint_tail.unwrap_or_else(|| frames.first().map_or(0, |f| f.pos));
    let last_valid = frames.last().map(|f| f.pos);
    let mut recovery = WalRecovery {
        checkpoint_tail: tail,
        ..WalRecovery::default()
    };
    for pos in &bad_bodies {
        if last_valid.is_some_and(|last| *pos < last) {
            recovery.corrupt_records += 1;
        } else {
            recovery.torn_tail = true;
        }
    }
    let mut gaps = Vec::new();
    let mut live = VecDeque::with_capacity(frames.len());
    let mut head = tail;
    let mut previous_end: Option<WalPos> = None;
    for frame in frames {
        if let Some(end) = previous_end {
            let gap_has_bad_body = bad_bodies.iter().any(|p| *p >= end && *p < frame.pos);
            if !gap_has_bad_body && end < frame.pos {
                gaps.push((end, frame.pos));
            }
        }
        previous_end = Some(frame.pos + frame.len);
        match frame.record {
            Some(record) => {
                if let Some(key) = HeldKey::of(&record) {
                    recovery.keys.push((frame.pos, key));
                }
                // Frames behind the tail were committed: only their keys
                // are wanted. Key-only frames are never dispatched.
                if frame.pos >= tail && !record.key_only {
                    live.push_back(LiveRecord {
                        pos: frame.pos,
                        committed: false,
                    });
                    recovery.records.push(RecoveredRecord {
                        pos: frame.pos,
                        record,
                    });
                }
            }
            None => recovery.corrupt_records += 1,
        }
        head = frame.pos.saturating_add(frame.len).max(head);
    }
    recovery.corrupt_records += nonzero_gaps(&mut window, &gaps).await?;
    Ok((recovery, live, head))
}

/// After a damaged frame at `at` of `len` bytes: the first block boundary
/// inside it that holds an accepted frame header (a later flush's), else its end.
async fn next_frame_inside<Fl: StorageFile>(
    window: &mut Window<'_, Fl>,
    at: u64,
    len: u64,
    accept: &impl Fn(u64, u64) -> bool,
) -> Result<u64> {
    let end = at.saturating_add(len);
    let mut candidate = (at / BLOCK_BYTES + 1) * BLOCK_BYTES;
    while candidate < end && candidate + HEADER <= window.capacity {
        window.cover(candidate, HEADER).await?;
        match probe(&window.bytes, window.offset(candidate), RECORD_MAGIC) {
            Probe::Valid { pos, .. } | Probe::BadBody { pos, .. } if accept(candidate, pos) => {
                return Ok(candidate)
            }
            _ => candidate += BLOCK_BYTES,
        }
    }
    Ok(end)
}

/// How many of the logical ranges `gaps` (each between two consecutive live
/// records) hold a non-zero byte: damage where no frame could be found.
async fn nonzero_gaps<Fl: StorageFile>(
    window: &mut Window<'_, Fl>,
    gaps: &[(WalPos, WalPos)],
) -> Result<u64> {
    let capacity = window.capacity;
    // Each gap as physical pieces (a gap may wrap the ring's end), read in
    // physical order so one read serves every gap inside it.
    let mut pieces: Vec<(u64, u64, usize)> = Vec::new();
    for (index, &(from, to)) in gaps.iter().enumerate() {
        let mut pos = from;
        while pos < to {
            let at = pos % capacity;
            let len = (to - pos).min(capacity - at);
            pieces.push((at, len, index));
            pos += len;
        }
    }
    pieces.sort_unstable();
    let mut nonzero = vec![false; gaps.len()];
    for (at, len, index) in pieces {
        if nonzero.get(index).copied().unwrap_or(true) {
            continue;
        }
        window.cover(at, len).await?;
        let from = window.offset(at);
        let to = from + usize::try_from(len).unwrap_or(0);
        if window
            .bytes
            .get(from..to)
            .is_some_and(|b| b.iter().any(|b| *b != 0))
        {
            if let Some(flag) = nonzero.get_mut(index) {
                *flag = true;
            }
        }
    }
    Ok(nonzero.iter().filter(|n| **n).count() as u64)
}

#[cfg(test)]
mod tests;
