//! The record batch of a partition log. Batches start on a block boundary
//! and are padded to one, so an append never rewrites fsynced bytes.
//!
//! ```text
//! 0   magic           u32
//! 4   header_crc      u32   crc32c of bytes 8..header_len
//! 8   base_offset     u64
//! 16  count           u32
//! 20  body_len        u32
//! 24  appended_at_ms  u64   the owner's clock at append (retention uses it)
//! 32  keys_len        u32   bytes of the keys area (0: none)
//! 36  reserved        u32 (0)
//! 40  table           count × (record_len u32, record_crc u32)
//! header_len = 40 + 8 × count; then the records, then the keys area, then
//! zero padding
//!
//! record: id u128, produced_at_ms u64, key_len u32 (u32::MAX: none),
//!         value_len u32, key, value
//! keys area: crc u32 (crc32c of the rest of the area), then per record
//!         len u16 (0: none), and for a key, since_ms u64 (when its window
//!         starts: the record's accept time, or the append's if earlier)
//!         and the producer's idempotency key
//! ```
//!
//! The idempotency keys lie after the records, so a release from before
//! them, which reads `keys_len` as reserved, reads every record as before:
//! where the keys area reaches past the padding it counted, it finds no
//! batch header there and skips to the next block that holds one. Should
//! such a release append over those blocks, a scan here finds the batch
//! header where the records' padding ends and takes the batch without keys
//! ([`DecodedBatch::len_without_keys`]).
//!
//! The header and the table are covered by one checksum; each record by its
//! own. A damaged record loses only itself; a damaged header loses its batch.

use crate::codec::{
    crc_of, get_u128, get_u32, get_u64, key_len_field, put_u128, put_u32, put_u64, round_up_usize,
    set_u32, NO_KEY,
};
use crate::limits::{BATCH_BYTES_MAX, BATCH_RECORDS_MAX, BLOCK_BYTES};
use bytes::Bytes;

const BATCH_MAGIC: u32 = 0x4E42_4154;
const FIXED_HEADER_BYTES: usize = 40;
const RECORD_FIXED_BYTES: usize = 32;

/// A message as a partition log stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub id: u128,
    pub produced_at_ms: u64,
    pub key: Option<Vec<u8>>,
    /// Shared, not copied, as it moves from request to WAL to log and cache.
    pub value: Bytes,
    /// The producer's idempotency key (1 to [`IDEMPOTENCY_KEY_BYTES_MAX`]
    /// bytes): the owner drops a later copy with the same key within the
    /// topic's window, also after a restart, by reading the log's tail.
    pub idempotency_key: Option<Bytes>,
}

/// The longest idempotency key a record holds.
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = u16::MAX as usize;

impl Message {
    /// The bytes its record takes after the fixed fields.
    fn variable_len(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len) + self.value.len()
    }
}

/// The idempotency key a record stores (none past the longest one).
fn stored_key(message: &Message) -> &[u8] {
    message
        .idempotency_key
        .as_deref()
        .filter(|k| k.len() <= IDEMPOTENCY_KEY_BYTES_MAX)
        .unwrap_or_default()
}

/// The bytes of a batch's keys area (0 when no message has a key).
fn keys_len(messages: &[Message]) -> usize {
    if messages.iter().all(|m| stored_key(m).is_empty()) {
        return 0;
    }
    4 + messages
        .iter()
        .map(|m| match stored_key(m).len() {
            0 => 2,
            len => 2 + 8 + len,
        })
        .sum::<usize>()
}

/// A message with its offset in the partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage {
    pub offset: u64,
    pub message: Message,
}

fn block() -> usize {
    usize::try_from(BLOCK_BYTES).unwrap_or(4096)
}

/// Encodes a batch padded to the block size.
pub fn encode_batch(base_offset: u64, appended_at_ms: u64, messages: &[Message]) -> Vec<u8> {
    let count = messages.len();
    let header_len = FIXED_HEADER_BYTES + 8 * count;
    let body_len: usize = messages
        .iter()
        .map(|m| RECORD_FIXED_BYTES + m.variable_len())
        .sum();
    let keys_len = keys_len(messages);
    let mut buf = Vec::with_capacity(round_up_usize(header_len + body_len + keys_len, block()));
    put_u32(&mut buf, BATCH_MAGIC);
    put_u32(&mut buf, 0);
    put_u64(&mut buf, base_offset);
    put_u32(&mut buf, u32::try_from(count).unwrap_or(u32::MAX));
    put_u32(&mut buf, u32::try_from(body_len).unwrap_or(u32::MAX));
    put_u64(&mut buf, appended_at_ms);
    put_u32(&mut buf, u32::try_from(keys_len).unwrap_or(u32::MAX));
    put_u32(&mut buf, 0);
    buf.resize(header_len, 0);
    for (i, message) in messages.iter().enumerate() {
        let start = buf.len();
        put_u128(&mut buf, message.id);
        put_u64(&mut buf, message.produced_at_ms);
        put_u32(&mut buf, key_len_field(message.key.as_deref()));
        put_u32(
            &mut buf,
            u32::try_from(message.value.len()).unwrap_or(u32::MAX),
        );
        if let Some(key) = &message.key {
            buf.extend_from_slice(key);
        }
        buf.extend_from_slice(&message.value);
        let len = buf.len() - start;
        let crc = crc_of(&buf, start, buf.len()).unwrap_or(0);
        set_u32(
            &mut buf,
            FIXED_HEADER_BYTES + 8 * i,
            u32::try_from(len).unwrap_or(u32::MAX),
        );
        set_u32(&mut buf, FIXED_HEADER_BYTES + 8 * i + 4, crc);
    }
    if keys_len > 0 {
        let area = buf.len();
        put_u32(&mut buf, 0);
        for message in messages {
            let key = stored_key(message);
            buf.extend_from_slice(&u16::try_from(key.len()).unwrap_or(0).to_le_bytes());
            if !key.is_empty() {
                put_u64(&mut buf, message.produced_at_ms.min(appended_at_ms));
                buf.extend_from_slice(key);
            }
        }
        let crc = crc_of(&buf, area + 4, buf.len()).unwrap_or(0);
        set_u32(&mut buf, area, crc);
    }
    let header_crc = crc_of(&buf, 8, header_len).unwrap_or(0);
    set_u32(&mut buf, 4, header_crc);
    buf.resize(round_up_usize(buf.len(), block()), 0);
    buf
}

/// Padded on-disk length of a batch of these messages.
pub fn encoded_len(messages: &[Message]) -> u64 {
    let raw: usize = FIXED_HEADER_BYTES
        + messages
            .iter()
            .map(|m| 8 + RECORD_FIXED_BYTES + m.variable_len())
            .sum::<usize>()
        + keys_len(messages);
    round_up_usize(raw, block()) as u64
}

/// A batch whose header verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedBatch {
    pub base_offset: u64,
    pub count: u32,
    pub appended_at_ms: u64,
    /// Padded length on disk.
    pub len: u64,
    /// Padded length of the header and records alone: what a release
    /// from before idempotency keys counts (equal to `len` without keys).
    pub len_without_keys: u64,
    /// One entry per record: the message, or `None` if its checksum failed.
    pub records: Vec<Option<Message>>,
}

impl DecodedBatch {
    pub fn bad_records(&self) -> u64 {
        self.records.iter().filter(|r| r.is_none()).count() as u64
    }
}

/// Decodes the batch at `bytes[at..]`; `None` if no valid header is there.
/// Each value is a copy.
pub fn decode_batch(bytes: &[u8], at: usize) -> Option<DecodedBatch> {
    decode_batch_with(bytes, at, &|range| Bytes::copy_from_slice(&bytes[range]))
}

/// [`decode_batch`] whose values are slices of `bytes`, not copies: for
/// reads whose messages leave soon (a consume's answer), where one buffer
/// for the batch costs less than a copy of each value.
pub fn decode_batch_shared(bytes: &Bytes, at: usize) -> Option<DecodedBatch> {
    decode_batch_with(bytes, at, &|range| bytes.slice(range))
}

/// Makes a message's value from its range of the batch's bytes.
type ValueOf<'a> = dyn Fn(std::ops::Range<usize>) -> Bytes + 'a;

fn decode_batch_with(bytes: &[u8], at: usize, value_of: &ValueOf<'_>) -> Option<DecodedBatch> {
    if get_u32(bytes, at)? != BATCH_MAGIC {
        return None;
    }
    let count = get_u32(bytes, at + 16)?;
    if count == 0 || count > BATCH_RECORDS_MAX {
        return None;
    }
    let count_usize = usize::try_from(count).ok()?;
    let header_len = FIXED_HEADER_BYTES + 8 * count_usize;
    if crc_of(bytes, at + 8, at + header_len)? != get_u32(bytes, at + 4)? {
        return None;
    }
    let base_offset = get_u64(bytes, at + 8)?;
    let body_len = usize::try_from(get_u32(bytes, at + 20)?).ok()?;
    let keys_len = usize::try_from(get_u32(bytes, at + 32)?).ok()?;
    if (header_len + body_len + keys_len) as u64 > BATCH_BYTES_MAX {
        return None;
    }
    let appended_at_ms = get_u64(bytes, at + 24)?;
    let len = round_up_usize(header_len + body_len + keys_len, block()) as u64;
    let len_without_keys = round_up_usize(header_len + body_len, block()) as u64;
    let mut records = Vec::with_capacity(count_usize);
    let mut record_at = at + header_len;
    for i in 0..count_usize {
        let record_len = usize::try_from(get_u32(bytes, at + FIXED_HEADER_BYTES + 8 * i)?).ok()?;
        let record_crc = get_u32(bytes, at + FIXED_HEADER_BYTES + 8 * i + 4)?;
        let ok = crc_of(bytes, record_at, record_at + record_len) == Some(record_crc);
        records.push(if ok {
            decode_record(
                bytes,
                record_at,
                record_at.checked_add(record_len)?,
                value_of,
            )
        } else {
            None
        });
        record_at += record_len;
    }
    if record_at != at + header_len + body_len {
        return None;
    }
    if keys_len > 0 {
        put_keys(bytes, record_at, keys_len, &mut records);
    }
    Some(DecodedBatch {
        base_offset,
        count,
        appended_at_ms,
        len,
        len_without_keys,
        records,
    })
}

/// Where a batch's keys area lies, read from the batch's first bytes (its
/// fixed header): its start from the batch's start, and its length; `None`
/// if the batch has none (or these bytes are no batch header). The header's
/// checksum is not checked here (it needs the whole table); the area's own
/// checksum is, by [`decode_keys_area`].
pub fn keys_area_of(header: &[u8]) -> Option<(usize, usize)> {
    if get_u32(header, 0)? != BATCH_MAGIC {
        return None;
    }
    let count = get_u32(header, 16)?;
    if count == 0 || count > BATCH_RECORDS_MAX {
        return None;
    }
    let body_len = usize::try_from(get_u32(header, 20)?).ok()?;
    let keys_len = usize::try_from(get_u32(header, 32)?).ok()?;
    let header_len = FIXED_HEADER_BYTES + 8 * usize::try_from(count).ok()?;
    (keys_len > 0).then_some((header_len + body_len, keys_len))
}

/// An idempotency key as a batch stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredKey {
    pub key: Bytes,
    /// When the key's window starts: its record's accept time, or the
    /// batch's append time if that came first.
    pub since_ms: u64,
}

/// The idempotency key of each of `count` records from a keys area (`None`
/// for a record without one), if its checksum holds and it has `count`
/// entries. Each key is its own copy.
pub fn decode_keys_area(area: &[u8], count: usize) -> Option<Vec<Option<StoredKey>>> {
    if crc_of(area, 4, area.len())? != get_u32(area, 0)? {
        return None;
    }
    let mut keys = Vec::with_capacity(count);
    let mut pos = 4;
    while pos < area.len() {
        let len_bytes = area.get(pos..pos + 2)?;
        let key_len = usize::from(u16::from_le_bytes([len_bytes[0], len_bytes[1]]));
        pos += 2;
        if key_len == 0 {
            keys.push(None);
            continue;
        }
        let since_ms = get_u64(area, pos)?;
        let key = area.get(pos + 8..pos + 8 + key_len)?;
        keys.push(Some(StoredKey {
            key: Bytes::copy_from_slice(key),
            since_ms,
        }));
        pos += 8 + key_len;
    }
    (keys.len() == count).then_some(keys)
}

/// Gives each record its idempotency key from the keys area at
/// `bytes[at..at + len]`. A damaged area gives none: the messages are
/// whole, only a later copy of one may then be stored beside it.
fn put_keys(bytes: &[u8], at: usize, len: usize, records: &mut [Option<Message>]) {
    let Some(keys) = bytes
        .get(at..at + len)
        .and_then(|area| decode_keys_area(area, records.len()))
    else {
        return;
    };
    for (record, key) in records.iter_mut().zip(keys) {
        if let Some(message) = record.as_mut() {
            message.idempotency_key = key.map(|k| k.key);
        }
    }
}

/// The record at `bytes[start..end]`.
fn decode_record(
    bytes: &[u8],
    start: usize,
    end: usize,
    value_of: &ValueOf<'_>,
) -> Option<Message> {
    let record = bytes.get(start..end)?;
    let id = get_u128(record, 0)?;
    let produced_at_ms = get_u64(record, 16)?;
    let key_len = get_u32(record, 24)?;
    let value_len = usize::try_from(get_u32(record, 28)?).ok()?;
    let mut at = RECORD_FIXED_BYTES;
    let key = if key_len == NO_KEY {
        None
    } else {
        let key_len = usize::try_from(key_len).ok()?;
        let key = record.get(at..at.checked_add(key_len)?)?.to_vec();
        at += key_len;
        Some(key)
    };
    let value_end = at.checked_add(value_len)?;
    if value_end != record.len() {
        return None;
    }
    Some(Message {
        id,
        produced_at_ms,
        key,
        value: value_of(start + at..start + value_end),
        // Set from the keys area, if the batch has one.
        idempotency_key: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(i: u8) -> Message {
        Message {
            id: u128::from(i),
            produced_at_ms: 7,
            key: (i % 2 == 0).then(|| vec![i; 3]),
            value: Bytes::from(vec![i; 100]),
            idempotency_key: (i % 3 == 0).then(|| Bytes::from(format!("key-{i}"))),
        }
    }

    #[test]
    fn batch_round_trips() {
        let messages: Vec<Message> = (0..5).map(message).collect();
        let buf = encode_batch(42, 1000, &messages);
        assert_eq!(buf.len() as u64, encoded_len(&messages));
        let batch = decode_batch(&buf, 0).expect("valid batch");
        assert_eq!(batch.base_offset, 42);
        assert_eq!(
            batch.records,
            messages.iter().cloned().map(Some).collect::<Vec<_>>()
        );
        // Read as slices of one buffer, the same messages.
        let shared = Bytes::from(buf);
        let sliced = decode_batch_shared(&shared, 0).expect("valid batch");
        assert_eq!(sliced, batch);
        let value = sliced.records[1].as_ref().expect("a record").value.clone();
        let inside = shared.as_ptr_range();
        assert!(inside.contains(&value.as_ptr()), "a slice, not a copy");
    }

    #[test]
    fn a_damaged_record_loses_only_itself() {
        let messages: Vec<Message> = (0..3).map(message).collect();
        let mut buf = encode_batch(0, 1000, &messages);
        let second_value = FIXED_HEADER_BYTES + 24 + (32 + 3 + 100) + 32 + 10;
        buf[second_value] ^= 0x40;
        let batch = decode_batch(&buf, 0).expect("header still valid");
        assert_eq!(batch.records[0].as_ref(), Some(&messages[0]));
        assert_eq!(batch.records[1], None);
        assert_eq!(batch.records[2].as_ref(), Some(&messages[2]));
    }

    /// The records of a batch with keys lie where they lie without keys:
    /// a release from before keys, which reads only them, reads the same
    /// messages. A damaged keys area loses the keys, not the messages.
    #[test]
    fn keys_lie_after_the_records_and_a_damaged_keys_area_loses_only_them() {
        let messages: Vec<Message> = (0..4).map(message).collect();
        let plain: Vec<Message> = messages
            .iter()
            .cloned()
            .map(|m| Message {
                idempotency_key: None,
                ..m
            })
            .collect();
        let with_keys = encode_batch(9, 1000, &messages);
        let without = encode_batch(9, 1000, &plain);
        let records_end = FIXED_HEADER_BYTES
            + 8 * 4
            + (0..4u8)
                .map(|i| 32 + if i % 2 == 0 { 3 } else { 0 } + 100)
                .sum::<usize>();
        assert_eq!(with_keys[8..32], without[8..32]);
        assert_eq!(with_keys[40..records_end], without[40..records_end]);
        assert_eq!(
            decode_batch(&without, 0).expect("batch").records,
            plain.iter().cloned().map(Some).collect::<Vec<_>>()
        );
        let mut damaged = with_keys.clone();
        damaged[records_end + 6] ^= 1;
        let batch = decode_batch(&damaged, 0).expect("header still valid");
        assert_eq!(
            batch.records,
            plain.into_iter().map(Some).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_damaged_header_loses_the_batch() {
        let messages: Vec<Message> = (0..3).map(message).collect();
        let mut buf = encode_batch(0, 1000, &messages);
        buf[17] ^= 1;
        assert_eq!(decode_batch(&buf, 0), None);
    }
}
