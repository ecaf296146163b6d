//! The index of a sealed segment: where each of its batches lies, written
//! once when the segment is sealed, so that opening a partition reads a
//! small file per sealed segment instead of scanning the segment's bytes.
//!
//! ```text
//! 0   magic        u32
//! 4   version      u32
//! 8   seq          u64   the segment's sequence number
//! 16  base_offset  u64   the segment's base offset
//! 24  write_pos    u64   where its batches end
//! 32  count        u32   batch entries that follow
//! 36  entries      count x 36 bytes: base_offset u64, count u32, pos u64,
//!                  len u64, appended_at_ms u64
//! ..  crc          u32   crc32c of every byte before it
//! then zero padding to a whole block (the file is written with O_DIRECT)
//! ```
//!
//! An index that is missing, damaged, or disagrees with its segment is
//! ignored: the segment is scanned as it was before indexes existed. The
//! index is only ever a shortcut to what a scan finds.

use super::BatchEntry;
use crate::codec::{crc_of, get_u32, get_u64, put_u32, put_u64, round_up_usize};
use crate::limits::BLOCK_BYTES;

const INDEX_MAGIC: u32 = 0x4E49_4458;
const INDEX_VERSION: u32 = 1;
const HEADER_BYTES: usize = 36;
const ENTRY_BYTES: usize = 36;
pub(super) const INDEX_SUFFIX: &str = ".index";

/// What an index says of its segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SegmentIndex {
    pub seq: u64,
    pub base_offset: u64,
    pub write_pos: u64,
    pub batches: Vec<BatchEntry>,
}

/// The index file's name beside the segment `segment_name`.
pub(super) fn index_name(segment_name: &str) -> String {
    format!("{segment_name}{INDEX_SUFFIX}")
}

/// The encoded index, padded to whole blocks.
pub(super) fn encode(index: &SegmentIndex) -> Vec<u8> {
    let mut buf = Vec::with_capacity(HEADER_BYTES + index.batches.len() * ENTRY_BYTES + 4);
    put_u32(&mut buf, INDEX_MAGIC);
    put_u32(&mut buf, INDEX_VERSION);
    put_u64(&mut buf, index.seq);
    put_u64(&mut buf, index.base_offset);
    put_u64(&mut buf, index.write_pos);
    put_u32(
        &mut buf,
        u32::try_from(index.batches.len()).unwrap_or(u32::MAX),
    );
    for entry in &index.batches {
        put_u64(&mut buf, entry.base_offset);
        put_u32(&mut buf, entry.count);
        put_u64(&mut buf, entry.pos);
        put_u64(&mut buf, entry.len);
        put_u64(&mut buf, entry.appended_at_ms);
    }
    let crc = crc32c::crc32c(&buf);
    put_u32(&mut buf, crc);
    let block = usize::try_from(BLOCK_BYTES).unwrap_or(4096);
    buf.resize(round_up_usize(buf.len(), block), 0);
    buf
}

/// The index in `bytes`, if it is whole and consistent with itself: entries
/// in order, each batch after the previous and inside `write_pos`, offsets
/// from the segment's base on.
pub(super) fn decode(bytes: &[u8]) -> Option<SegmentIndex> {
    if get_u32(bytes, 0)? != INDEX_MAGIC || get_u32(bytes, 4)? != INDEX_VERSION {
        return None;
    }
    let count = usize::try_from(get_u32(bytes, 32)?).ok()?;
    let end = HEADER_BYTES.checked_add(count.checked_mul(ENTRY_BYTES)?)?;
    if crc_of(bytes, 0, end)? != get_u32(bytes, end)? {
        return None;
    }
    let index = SegmentIndex {
        seq: get_u64(bytes, 8)?,
        base_offset: get_u64(bytes, 16)?,
        write_pos: get_u64(bytes, 24)?,
        batches: (0..count)
            .map(|i| {
                let at = HEADER_BYTES + i * ENTRY_BYTES;
                Some(BatchEntry {
                    base_offset: get_u64(bytes, at)?,
                    count: get_u32(bytes, at + 8)?,
                    pos: get_u64(bytes, at + 12)?,
                    len: get_u64(bytes, at + 20)?,
                    appended_at_ms: get_u64(bytes, at + 28)?,
                })
            })
            .collect::<Option<Vec<_>>>()?,
    };
    let mut next_pos = BLOCK_BYTES;
    let mut next_offset = index.base_offset;
    for entry in &index.batches {
        let ordered = entry.pos >= next_pos
            && entry.base_offset >= next_offset
            && entry.count > 0
            && entry.len > 0;
        if !ordered {
            return None;
        }
        next_pos = entry.pos.checked_add(entry.len)?;
        next_offset = entry.end_offset();
    }
    (next_pos <= index.write_pos).then_some(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(base_offset: u64, count: u32, pos: u64, len: u64) -> BatchEntry {
        BatchEntry {
            base_offset,
            count,
            pos,
            len,
            appended_at_ms: 1_700_000_000_000 + base_offset,
        }
    }

    fn sample() -> SegmentIndex {
        SegmentIndex {
            seq: 7,
            base_offset: 100,
            write_pos: 4096 + 300,
            batches: vec![
                entry(100, 3, 4096, 120),
                entry(103, 1, 4216, 40),
                entry(104, 10, 4256, 140),
            ],
        }
    }

    #[test]
    fn an_index_round_trips_in_whole_blocks() {
        let bytes = encode(&sample());
        assert_eq!(bytes.len() % 4096, 0);
        assert_eq!(decode(&bytes), Some(sample()));
        let empty = SegmentIndex {
            batches: Vec::new(),
            ..sample()
        };
        assert_eq!(decode(&encode(&empty)), Some(empty));
    }

    #[test]
    fn a_damaged_or_inconsistent_index_is_refused() {
        let bytes = encode(&sample());
        for at in [0, 9, 33, 40, 60, HEADER_BYTES + 3 * ENTRY_BYTES] {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x10;
            assert_eq!(decode(&damaged), None, "a flipped bit at {at}");
        }
        assert_eq!(decode(&bytes[..50]), None, "cut short");
        let overlapping = SegmentIndex {
            batches: vec![entry(100, 3, 4096, 120), entry(103, 1, 4100, 40)],
            ..sample()
        };
        assert_eq!(decode(&encode(&overlapping)), None);
        let past_the_end = SegmentIndex {
            write_pos: 4096 + 100,
            ..sample()
        };
        assert_eq!(decode(&encode(&past_the_end)), None);
        let offsets_backwards = SegmentIndex {
            batches: vec![entry(100, 3, 4096, 120), entry(101, 1, 4216, 40)],
            ..sample()
        };
        assert_eq!(decode(&encode(&offsets_backwards)), None);
    }
}
