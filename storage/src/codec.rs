//! Little-endian field access for the on-disk formats. Readers never index
//! out of bounds: every accessor returns `None` past the end.

pub fn put_u16(buf: &mut Vec<u8>, v: u16) {
    buf.extend_from_slice(&v.to_le_bytes());
}
pub fn put_u32(buf: &mut Vec<u8>, v: u32) {
    buf.extend_from_slice(&v.to_le_bytes());
}
pub fn put_u64(buf: &mut Vec<u8>, v: u64) {
    buf.extend_from_slice(&v.to_le_bytes());
}
pub fn put_u128(buf: &mut Vec<u8>, v: u128) {
    buf.extend_from_slice(&v.to_le_bytes());
}

pub fn get_u16(buf: &[u8], at: usize) -> Option<u16> {
    let b = buf.get(at..at.checked_add(2)?)?;
    Some(u16::from_le_bytes(b.try_into().ok()?))
}
pub fn get_u32(buf: &[u8], at: usize) -> Option<u32> {
    let b = buf.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(b.try_into().ok()?))
}
pub fn get_u64(buf: &[u8], at: usize) -> Option<u64> {
    let b = buf.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}
pub fn get_u128(buf: &[u8], at: usize) -> Option<u128> {
    let b = buf.get(at..at.checked_add(16)?)?;
    Some(u128::from_le_bytes(b.try_into().ok()?))
}

/// Overwrites four bytes at `at` (used to fill in a checksum after encoding).
pub fn set_u32(buf: &mut [u8], at: usize, v: u32) {
    if let Some(b) = buf.get_mut(at..at + 4) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

pub fn round_up(v: u64, align: u64) -> u64 {
    v.div_ceil(align) * align
}

pub fn round_up_usize(v: usize, align: usize) -> usize {
    v.div_ceil(align) * align
}

/// crc32c of `buf[from..to]`, or `None` if the range is out of bounds.
pub fn crc_of(buf: &[u8], from: usize, to: usize) -> Option<u32> {
    Some(crc32c::crc32c(buf.get(from..to)?))
}

/// Encodes an optional key as a length (u32::MAX for none) and bytes.
pub const NO_KEY: u32 = u32::MAX;

pub fn key_len_field(key: Option<&[u8]>) -> u32 {
    match key {
        Some(k) => u32::try_from(k.len()).unwrap_or(NO_KEY - 1),
        None => NO_KEY,
    }
}
