//! Copying a partition log to another node, as a move does: the source
//! lists its segments ([`PartitionLog::segment_extents`]) and serves their
//! bytes ([`PartitionLog::read_segment`]); the destination keeps a
//! [`CopyProgress`] of what it holds, asks for the rest a chunk at a time,
//! and writes what it gets with [`write_copied`]. Written segment bytes
//! never change, so a copy made while the source keeps appending needs
//! only the bytes written since, and a copy that the source's retention
//! overtook drops the segments the source deleted.
//!
//! Every batch of the copy is verified before it is served, as recovery
//! does; so that the handover does not wait for a scan of the whole copy,
//! [`VerifiedCopy`] reads back and checks what was synced while the source
//! still serves, a segment's new bytes at a time, and
//! [`PartitionLog::open_copy`] takes what it verified without reading it
//! again: only the bytes copied during the freeze are checked in it.
//!
//! [`PartitionLog::segment_extents`]: super::PartitionLog::segment_extents
//! [`PartitionLog::read_segment`]: super::PartitionLog::read_segment
//! [`PartitionLog::open_copy`]: super::PartitionLog::open_copy

use std::collections::BTreeMap;
use std::path::Path;

use super::{decode_segment_header, scan_batches, BatchEntry, SegmentExtent};
use crate::error::{Result, StorageError};
use crate::io::{FileSystem, OpenMode, StorageFile};
use crate::limits::{BLOCK_BYTES, RECOVERY_READ_CHUNK_BYTES};
use crate::util_fs::read_exact_or_short;

/// What a destination holds of a source's segments: bytes copied of each.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CopyProgress {
    copied: BTreeMap<String, u64>,
}

/// One read a copy still needs: `len` bytes of segment `name` from `pos`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyRead {
    pub name: String,
    pub pos: u64,
    pub len: u64,
}

impl CopyProgress {
    /// The next read against the source's `extents`, at most `chunk`
    /// bytes (a multiple of the block size); `None` once caught up.
    pub fn next_read(&self, extents: &[SegmentExtent], chunk: u64) -> Option<CopyRead> {
        extents.iter().find_map(|extent| {
            let have = self.copied.get(&extent.name).copied().unwrap_or(0);
            (have < extent.written).then(|| CopyRead {
                name: extent.name.clone(),
                pos: have,
                len: (extent.written - have).min(chunk),
            })
        })
    }

    /// `bytes` of segment `name` were written at `pos`.
    pub fn record(&mut self, name: &str, pos: u64, bytes: u64) {
        let have = self.copied.entry(name.to_string()).or_insert(0);
        *have = (*have).max(pos + bytes);
    }

    /// Bytes the source holds that the copy lacks.
    pub fn remaining(&self, extents: &[SegmentExtent]) -> u64 {
        extents
            .iter()
            .map(|e| {
                e.written
                    .saturating_sub(self.copied.get(&e.name).copied().unwrap_or(0))
            })
            .sum()
    }

    /// Bytes copied so far, over every segment.
    pub fn copied_bytes(&self) -> u64 {
        self.copied.values().sum()
    }

    /// Segments the copy holds that the source no longer has (retention
    /// deleted them there): forgotten here; the caller removes the files.
    pub fn drop_stale(&mut self, extents: &[SegmentExtent]) -> Vec<String> {
        let stale: Vec<String> = self
            .copied
            .keys()
            .filter(|name| !extents.iter().any(|e| e.name == **name))
            .cloned()
            .collect();
        for name in &stale {
            self.copied.remove(name);
        }
        stale
    }

    /// The segment files the copy holds.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.copied.keys().map(String::as_str)
    }
}

/// What a copy has read back from its disk and checked, per segment: the
/// segment's batches up to `verified_to`, the end of its last whole batch.
#[derive(Debug, Default, Clone)]
pub struct VerifiedCopy {
    segments: BTreeMap<String, VerifiedSegment>,
}

#[derive(Debug, Clone)]
pub(super) struct VerifiedSegment {
    pub(super) base_offset: u64,
    pub(super) batches: Vec<BatchEntry>,
    pub(super) verified_to: u64,
}

impl VerifiedCopy {
    /// Reads back from `dir` the bytes of each segment `progress` holds past
    /// what was verified before, and checks their batches. Only synced
    /// bytes may be verified. A segment with damage in it is left out: the
    /// log's open recovers it as it recovers any segment.
    pub async fn verify<F: FileSystem>(
        &mut self,
        fs: &F,
        dir: &Path,
        progress: &CopyProgress,
    ) -> Result<()> {
        self.segments
            .retain(|name, _| progress.copied.contains_key(name));
        let block = usize::try_from(BLOCK_BYTES).unwrap_or(4096);
        for (name, copied) in &progress.copied {
            let from = self.segments.get(name).map_or(0, |s| s.verified_to);
            if from >= *copied {
                continue;
            }
            let path = dir.join(name);
            let file = fs
                .open(&path, OpenMode::EXISTING_DIRECT)
                .await
                .map_err(|e| StorageError::io("open copy", &path, e))?;
            let bytes =
                read_exact_or_short(&file, &path, from, copied - from, RECOVERY_READ_CHUNK_BYTES)
                    .await?;
            let (base_offset, next_offset, first) = match self.segments.get(name) {
                Some(known) => (
                    known.base_offset,
                    known
                        .batches
                        .last()
                        .map_or(known.base_offset, BatchEntry::end_offset),
                    0,
                ),
                None => match bytes.get(..block).and_then(decode_segment_header) {
                    Some(base) => (base, base, block),
                    // Left to the log's open, which says what it finds.
                    None => continue,
                },
            };
            let mut scan = scan_batches(&bytes, from, first, next_offset);
            // A chunk may end inside a batch: its header verifies but its
            // records run past the bytes. Not damage, only not copied yet:
            // the scan stops before it.
            let end = from + bytes.len() as u64;
            if let Some(cut) = scan.batches.last().filter(|b| b.pos + b.len > end) {
                let whole = usize::try_from(cut.pos - from).unwrap_or(bytes.len());
                scan = scan_batches(&bytes[..whole], from, first, next_offset);
            }
            if scan.corrupt_records > 0 || scan.corrupt_regions > 0 {
                self.segments.remove(name);
                continue;
            }
            // The cut batch's bytes are checked again once the rest is
            // copied.
            let segment = self
                .segments
                .entry(name.clone())
                .or_insert_with(|| VerifiedSegment {
                    base_offset,
                    batches: Vec::new(),
                    verified_to: from,
                });
            segment.batches.extend(scan.batches);
            segment.verified_to = scan.write_pos;
        }
        Ok(())
    }

    /// Zeroes, in each segment `progress` holds, the bytes past the end of
    /// its last whole verified batch, and syncs them: a copy cut short (its
    /// source died mid-read) ends inside a batch, and those bytes hold a
    /// header that verifies over records that never arrived; left there,
    /// any open of the copy would take the batch's missing records for
    /// damage and move the high watermark past them. A segment left out of
    /// the verified copy (damage found) is left to the open's recovery.
    pub async fn cut_partial_batches<F: FileSystem>(
        &self,
        fs: &F,
        dir: &Path,
        progress: &CopyProgress,
    ) -> Result<()> {
        for (name, copied) in &progress.copied {
            let Some(segment) = self.segments.get(name) else {
                continue;
            };
            if segment.verified_to >= *copied {
                continue;
            }
            let path = dir.join(name);
            let file = fs
                .open(&path, OpenMode::EXISTING_BUFFERED)
                .await
                .map_err(|e| StorageError::io("open copy", &path, e))?;
            let len = usize::try_from(copied - segment.verified_to).unwrap_or(usize::MAX);
            file.write_at(&vec![0; len], segment.verified_to)
                .await
                .map_err(|e| StorageError::io("write copy", &path, e))?;
            file.sync_data()
                .await
                .map_err(|e| StorageError::io("fdatasync", &path, e))?;
        }
        Ok(())
    }

    pub(super) fn segment(&self, name: &str) -> Option<&VerifiedSegment> {
        self.segments.get(name)
    }

    /// Bytes read back and checked, over every segment.
    pub fn verified_bytes(&self) -> u64 {
        self.segments.values().map(|s| s.verified_to).sum()
    }
}

/// Writes copied bytes of segment `name` into `dir` at `pos` (the file is
/// made if missing). Not durable until [`sync_copied`].
pub async fn write_copied<F: FileSystem>(
    fs: &F,
    dir: &Path,
    name: &str,
    pos: u64,
    bytes: &[u8],
) -> Result<()> {
    let path = dir.join(name);
    let file = fs
        .open(&path, OpenMode::CREATE_BUFFERED)
        .await
        .map_err(|e| StorageError::io("open copy", &path, e))?;
    file.write_at(bytes, pos)
        .await
        .map_err(|e| StorageError::io("write copy", &path, e))
}

/// Makes every copied segment of `names` in `dir`, and the folder's
/// entries, durable.
pub async fn sync_copied<'a, F: FileSystem>(
    fs: &F,
    dir: &Path,
    names: impl IntoIterator<Item = &'a str>,
) -> Result<()> {
    for name in names {
        let path = dir.join(name);
        let file = fs
            .open(&path, OpenMode::EXISTING_BUFFERED)
            .await
            .map_err(|e| StorageError::io("open copy", &path, e))?;
        file.sync_data()
            .await
            .map_err(|e| StorageError::io("fdatasync", &path, e))?;
    }
    fs.sync_dir(dir)
        .await
        .map_err(|e| StorageError::io("fsync dir", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(name: &str, written: u64) -> SegmentExtent {
        SegmentExtent {
            name: name.into(),
            written,
        }
    }

    #[test]
    fn a_copy_reads_only_what_it_lacks_and_forgets_what_retention_deleted() {
        let mut progress = CopyProgress::default();
        let extents = vec![extent("a", 8192), extent("b", 4096)];
        assert_eq!(progress.remaining(&extents), 12288);
        let read = progress.next_read(&extents, 4096).expect("a read");
        assert_eq!((read.name.as_str(), read.pos, read.len), ("a", 0, 4096));
        progress.record("a", 0, 4096);
        let read = progress.next_read(&extents, 1 << 20).expect("a read");
        assert_eq!((read.name.as_str(), read.pos, read.len), ("a", 4096, 4096));
        progress.record("a", 4096, 4096);
        progress.record("b", 0, 4096);
        assert_eq!(progress.next_read(&extents, 4096), None);
        // The source appended to b and deleted a.
        let later = vec![extent("b", 12288), extent("c", 4096)];
        assert_eq!(progress.drop_stale(&later), vec!["a".to_string()]);
        assert_eq!(progress.remaining(&later), 8192 + 4096);
        let read = progress.next_read(&later, 1 << 20).expect("a read");
        assert_eq!((read.name.as_str(), read.pos), ("b", 4096));
    }
}
