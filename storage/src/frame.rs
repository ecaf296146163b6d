//! Self-locating frames: the unit of the WAL ring and the ack log.
//!
//! ```text
//! 0   magic        u32   identifies the file kind
//! 4   header_crc   u32   crc32c of bytes 8..24
//! 8   pos          u64   the frame's own logical position in its file
//! 16  body_len     u32
//! 20  body_crc     u32   crc32c of the body
//! 24  body         body_len bytes, then zero padding to a multiple of 8
//! ```
//!
//! Because each frame names its own position, recovery can find every valid
//! frame after a damaged one by probing each 8-byte boundary: a damaged frame
//! never stops the recovery of the valid frames after it, and stale frames
//! from an earlier lap of a ring are told apart by their position.

use std::ops::Range;

use crate::codec::{crc_of, get_u32, get_u64, put_u32, put_u64, round_up_usize, set_u32};

pub const FRAME_HEADER_BYTES: usize = 24;
pub const FRAME_ALIGN: usize = 8;

/// Encoded length of a frame with a body of `body_len` bytes, padding included.
pub fn frame_len(body_len: usize) -> usize {
    round_up_usize(FRAME_HEADER_BYTES + body_len, FRAME_ALIGN)
}

/// Appends one frame to `buf`; `write_body` appends the body bytes.
pub fn encode_frame(
    buf: &mut Vec<u8>,
    magic: u32,
    pos: u64,
    write_body: impl FnOnce(&mut Vec<u8>),
) {
    let start = buf.len();
    put_u32(buf, magic);
    put_u32(buf, 0);
    put_u64(buf, pos);
    put_u32(buf, 0);
    put_u32(buf, 0);
    let body_start = buf.len();
    write_body(buf);
    let body_end = buf.len();
    let body_len = u32::try_from(body_end - body_start).unwrap_or(u32::MAX);
    let body_crc = crc32c::crc32c(buf.get(body_start..body_end).unwrap_or_default());
    set_u32(buf, start + 16, body_len);
    set_u32(buf, start + 20, body_crc);
    let header_crc = crc_of(buf, start + 8, start + FRAME_HEADER_BYTES).unwrap_or(0);
    set_u32(buf, start + 4, header_crc);
    buf.resize(start + frame_len(body_end - body_start), 0);
}

/// What a probe at one position found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// A whole, valid frame; `body` indexes the scanned slice.
    Valid {
        pos: u64,
        body: Range<usize>,
        len: usize,
    },
    /// A valid header whose body fails its checksum (or runs off the end).
    BadBody { pos: u64, len: usize },
    /// Nothing that looks like a frame of this kind.
    NoFrame,
}

/// Probes `bytes[at..]` for a frame of kind `magic`.
pub fn probe(bytes: &[u8], at: usize, magic: u32) -> Probe {
    if get_u32(bytes, at) != Some(magic) {
        return Probe::NoFrame;
    }
    let (Some(header_crc), Some(pos), Some(body_len), Some(body_crc)) = (
        get_u32(bytes, at + 4),
        get_u64(bytes, at + 8),
        get_u32(bytes, at + 16),
        get_u32(bytes, at + 20),
    ) else {
        return Probe::NoFrame;
    };
    if crc_of(bytes, at + 8, at + FRAME_HEADER_BYTES) != Some(header_crc) {
        return Probe::NoFrame;
    }
    let Ok(body_len) = usize::try_from(body_len) else {
        return Probe::NoFrame;
    };
    let len = frame_len(body_len);
    let body = at + FRAME_HEADER_BYTES..at + FRAME_HEADER_BYTES + body_len;
    match crc_of(bytes, body.start, body.end) {
        Some(crc) if crc == body_crc => Probe::Valid { pos, body, len },
        _ => Probe::BadBody { pos, len },
    }
}

/// A valid frame found by [`scan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundFrame {
    pub pos: u64,
    /// Where the body lies in the scanned slice.
    pub body: Range<usize>,
    /// Offset of the frame in the scanned slice.
    pub at: usize,
    pub len: usize,
}

/// Everything [`scan`] found in one slice.
#[derive(Debug, Default, Clone)]
pub struct ScanResult {
    pub frames: Vec<FoundFrame>,
    /// Frames whose header was valid and whose body was not: (pos, slice offset).
    pub bad_bodies: Vec<(u64, usize)>,
}

/// Finds every frame of kind `magic` in `bytes` whose position `accept`
/// approves; `accept(offset_in_slice, stored_pos)`. Damaged regions are
/// skipped 8 bytes at a time.
///
/// `flush_align` is the boundary every write of the file starts on (the
/// block size for the WAL ring, [`FRAME_ALIGN`] for a buffered log). A frame
/// whose header is valid and whose body is not may have been torn, truncated
/// by recovery and partly overwritten by later writes; so inside its extent
/// each `flush_align` boundary is probed for a later write's frames before
/// the scan goes on at the end of the damaged frame.
pub fn scan(
    bytes: &[u8],
    magic: u32,
    flush_align: usize,
    accept: impl Fn(usize, u64) -> bool,
) -> ScanResult {
    let mut result = ScanResult::default();
    let mut at = 0usize;
    while at + FRAME_HEADER_BYTES <= bytes.len() {
        match probe(bytes, at, magic) {
            Probe::Valid { pos, body, len } if accept(at, pos) => {
                result.frames.push(FoundFrame { pos, body, at, len });
                at += len;
            }
            Probe::BadBody { pos, len } if accept(at, pos) => {
                result.bad_bodies.push((pos, at));
                at = next_frame_inside(bytes, magic, flush_align, at, len, &accept);
            }
            // A valid frame of another position is stale (an earlier lap):
            // skip it whole, it holds nothing of this lap.
            Probe::Valid { len, .. } => at += len,
            Probe::BadBody { .. } | Probe::NoFrame => at += FRAME_ALIGN,
        }
    }
    result
}

/// After a damaged frame at `at` of `len` bytes: the first `flush_align`
/// boundary inside it that holds an accepted frame header, else its end.
fn next_frame_inside(
    bytes: &[u8],
    magic: u32,
    flush_align: usize,
    at: usize,
    len: usize,
    accept: &impl Fn(usize, u64) -> bool,
) -> usize {
    let end = at.saturating_add(len);
    let align = flush_align.max(FRAME_ALIGN);
    let mut candidate = (at / align + 1) * align;
    while candidate < end && candidate + FRAME_HEADER_BYTES <= bytes.len() {
        match probe(bytes, candidate, magic) {
            Probe::Valid { pos, .. } | Probe::BadBody { pos, .. } if accept(candidate, pos) => {
                return candidate
            }
            _ => candidate += align,
        }
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trips_and_detects_damage() {
        let mut buf = Vec::new();
        encode_frame(&mut buf, 0xABCD, 0, |b| b.extend_from_slice(b"hello"));
        let second = buf.len();
        encode_frame(&mut buf, 0xABCD, second as u64, |b| {
            b.extend_from_slice(b"world!")
        });
        let found = scan(&buf, 0xABCD, FRAME_ALIGN, |at, pos| at as u64 == pos);
        assert_eq!(found.frames.len(), 2);
        assert_eq!(buf.get(found.frames[1].body.clone()), Some(&b"world!"[..]));

        // Damage the first body: the second frame is still found.
        buf[FRAME_HEADER_BYTES] ^= 1;
        let found = scan(&buf, 0xABCD, FRAME_ALIGN, |at, pos| at as u64 == pos);
        assert_eq!(found.frames.len(), 1);
        assert_eq!(found.frames[0].pos, second as u64);
        assert_eq!(found.bad_bodies.len(), 1);

        // Damage the first header: the second frame is still found.
        buf[FRAME_HEADER_BYTES] ^= 1;
        buf[9] ^= 0x10;
        let found = scan(&buf, 0xABCD, FRAME_ALIGN, |at, pos| at as u64 == pos);
        assert_eq!(found.frames.len(), 1);
        assert!(found.bad_bodies.is_empty());
    }

    #[test]
    fn a_torn_frame_overwritten_by_a_later_flush_hides_nothing() {
        // A long frame at 0 whose body was torn; recovery truncated it and a
        // later flush wrote a frame at the next 64-byte boundary, inside it.
        let mut buf = Vec::new();
        encode_frame(&mut buf, 9, 0, |b| b.extend_from_slice(&[1u8; 200]));
        let mut later = Vec::new();
        encode_frame(&mut later, 9, 64, |b| b.extend_from_slice(b"later"));
        buf[64..64 + later.len()].copy_from_slice(&later);
        let found = scan(&buf, 9, 64, |at, pos| at as u64 == pos);
        assert_eq!(
            found.frames.iter().map(|f| f.pos).collect::<Vec<_>>(),
            vec![64]
        );
        assert_eq!(found.bad_bodies.len(), 1);
    }

    #[test]
    fn frames_at_the_wrong_position_are_ignored() {
        let mut buf = Vec::new();
        encode_frame(&mut buf, 7, 4096, |b| b.extend_from_slice(b"stale"));
        let found = scan(&buf, 7, FRAME_ALIGN, |at, pos| at as u64 == pos);
        assert!(found.frames.is_empty());
    }
}
