//! The body of one WAL frame: one accepted message.
//!
//! ```text
//! 0   id          u128
//! 16  accept_ms   u64
//! 24  partition   u32
//! 28  topic_len   u16
//! 30  flags       u16
//! 32  key_len     u32 (u32::MAX: no key)
//! 36  value_len   u32
//! 40  topic_incarnation u64, when flags has FLAG_TOPIC_INCARNATION
//! ..  offset      u64, when flags has FLAG_OFFSET
//! ..  topic, key, value
//! ```
//!
//! Records written before the flags existed have 0 there (the field was
//! reserved) and no topic incarnation. A record with an offset is the
//! owner's journal copy of a commit: its partition is owned by the shard
//! that wrote it, which gave it that offset, and recovery puts it back at
//! that offset.

use crate::codec::{
    get_u128, get_u16, get_u32, get_u64, key_len_field, put_u128, put_u16, put_u32, put_u64, NO_KEY,
};
use crate::frame::frame_len;

const BODY_FIXED_BYTES: usize = 40;
/// The body carries the incarnation of the topic the message was accepted
/// for, so that a topic deleted and created again under the same name never
/// receives the old one's messages.
const FLAG_TOPIC_INCARNATION: u16 = 1;
const INCARNATION_BYTES: usize = 8;
/// The body carries the partition offset its owner gave it.
const FLAG_OFFSET: u16 = 2;
const OFFSET_BYTES: usize = 8;
const KNOWN_FLAGS: u16 = FLAG_TOPIC_INCARNATION | FLAG_OFFSET;

/// A message as the ingress WAL holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalRecord {
    pub id: u128,
    pub topic: String,
    pub partition: u32,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub accept_ms: u64,
    /// Which incarnation of `topic` accepted it (`None` in old records).
    pub topic_incarnation: Option<u64>,
    /// Its offset in the partition, when the record is its owner's journal
    /// copy of the commit (`None`: the dispatcher commits it).
    pub offset: Option<u64>,
}

/// A borrowed message to append, so the hot path copies bytes only once.
#[derive(Debug, Clone, Copy)]
pub struct WalRecordRef<'a> {
    pub id: u128,
    pub topic: &'a str,
    pub partition: u32,
    pub key: Option<&'a [u8]>,
    pub value: &'a [u8],
    pub accept_ms: u64,
    pub topic_incarnation: Option<u64>,
    pub offset: Option<u64>,
}

impl WalRecord {
    pub fn as_ref(&self) -> WalRecordRef<'_> {
        WalRecordRef {
            id: self.id,
            topic: &self.topic,
            partition: self.partition,
            key: self.key.as_deref(),
            value: &self.value,
            accept_ms: self.accept_ms,
            topic_incarnation: self.topic_incarnation,
            offset: self.offset,
        }
    }
}

impl WalRecordRef<'_> {
    pub fn body_len(&self) -> usize {
        BODY_FIXED_BYTES
            + self.topic_incarnation.map_or(0, |_| INCARNATION_BYTES)
            + self.offset.map_or(0, |_| OFFSET_BYTES)
            + self.topic.len()
            + self.key.map_or(0, <[u8]>::len)
            + self.value.len()
    }

    /// Length of the whole frame this record becomes.
    pub fn frame_len(&self) -> usize {
        frame_len(self.body_len())
    }

    pub fn encode_body(&self, buf: &mut Vec<u8>) {
        put_u128(buf, self.id);
        put_u64(buf, self.accept_ms);
        put_u32(buf, self.partition);
        put_u16(buf, u16::try_from(self.topic.len()).unwrap_or(u16::MAX));
        let flags = self.topic_incarnation.map_or(0, |_| FLAG_TOPIC_INCARNATION)
            | self.offset.map_or(0, |_| FLAG_OFFSET);
        put_u16(buf, flags);
        put_u32(buf, key_len_field(self.key));
        put_u32(buf, u32::try_from(self.value.len()).unwrap_or(u32::MAX));
        if let Some(incarnation) = self.topic_incarnation {
            put_u64(buf, incarnation);
        }
        if let Some(offset) = self.offset {
            put_u64(buf, offset);
        }
        buf.extend_from_slice(self.topic.as_bytes());
        if let Some(key) = self.key {
            buf.extend_from_slice(key);
        }
        buf.extend_from_slice(self.value);
    }
}

/// The flags of a body whose checksum verified, if it carries flags this
/// build does not know: a newer version wrote it, and reading it as
/// damaged would drop an accepted message, so recovery refuses instead.
pub fn unknown_flags(body: &[u8]) -> Option<u16> {
    get_u16(body, 30).filter(|flags| flags & !KNOWN_FLAGS != 0)
}

/// Decodes a body whose checksum already verified; `None` if it is malformed.
pub fn decode_body(body: &[u8]) -> Option<WalRecord> {
    let id = get_u128(body, 0)?;
    let accept_ms = get_u64(body, 16)?;
    let partition = get_u32(body, 24)?;
    let topic_len = usize::from(get_u16(body, 28)?);
    let flags = get_u16(body, 30)?;
    if flags & !KNOWN_FLAGS != 0 {
        // Written by a newer version: not a record this one can read.
        return None;
    }
    let key_len = get_u32(body, 32)?;
    let value_len = usize::try_from(get_u32(body, 36)?).ok()?;
    let mut at = BODY_FIXED_BYTES;
    let topic_incarnation = if flags & FLAG_TOPIC_INCARNATION != 0 {
        let incarnation = get_u64(body, at)?;
        at += INCARNATION_BYTES;
        Some(incarnation)
    } else {
        None
    };
    let offset = if flags & FLAG_OFFSET != 0 {
        let offset = get_u64(body, at)?;
        at += OFFSET_BYTES;
        Some(offset)
    } else {
        None
    };
    let topic = std::str::from_utf8(body.get(at..at + topic_len)?)
        .ok()?
        .to_string();
    at += topic_len;
    let key = if key_len == NO_KEY {
        None
    } else {
        let key_len = usize::try_from(key_len).ok()?;
        let key = body.get(at..at + key_len)?.to_vec();
        at += key_len;
        Some(key)
    };
    let value = body.get(at..at + value_len)?.to_vec();
    if at + value_len != body.len() {
        return None;
    }
    Some(WalRecord {
        id,
        topic,
        partition,
        key,
        value,
        accept_ms,
        topic_incarnation,
        offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_body_round_trips() {
        let record = WalRecord {
            id: 0x1234_5678_9abc_def0_1122_3344_5566_7788,
            topic: "orders".into(),
            partition: 7,
            key: Some(b"customer-42".to_vec()),
            value: vec![0, 1, 2, 255],
            accept_ms: 1_700_000_000_000,
            topic_incarnation: Some(0x0102_0304_0506_0708),
            offset: None,
        };
        let mut buf = Vec::new();
        record.as_ref().encode_body(&mut buf);
        assert_eq!(buf.len(), record.as_ref().body_len());
        assert_eq!(decode_body(&buf), Some(record.clone()));
        let keyless = WalRecord {
            key: None,
            value: Vec::new(),
            ..record
        };
        buf.clear();
        keyless.as_ref().encode_body(&mut buf);
        assert_eq!(decode_body(&buf), Some(keyless.clone()));
        assert_eq!(decode_body(&buf[..buf.len() - 1]), None);
        let journal = WalRecord {
            offset: Some(41),
            ..keyless
        };
        buf.clear();
        journal.as_ref().encode_body(&mut buf);
        assert_eq!(buf.len(), journal.as_ref().body_len());
        assert_eq!(decode_body(&buf), Some(journal));
    }

    #[test]
    fn a_record_from_before_topic_incarnations_reads_without_one() {
        let record = WalRecord {
            id: 7,
            topic: "orders".into(),
            partition: 1,
            key: None,
            value: b"old".to_vec(),
            accept_ms: 5,
            topic_incarnation: None,
            offset: None,
        };
        let mut buf = Vec::new();
        record.as_ref().encode_body(&mut buf);
        // The layout records had when bytes 30..32 were reserved.
        assert_eq!(&buf[30..32], &[0, 0]);
        assert_eq!(buf.len(), BODY_FIXED_BYTES + 6 + 3);
        assert_eq!(decode_body(&buf), Some(record));
        assert_eq!(unknown_flags(&buf), None);
        // Flags this version does not know: not a record it can read.
        buf[30] = 0x80;
        assert_eq!(decode_body(&buf), None);
        assert_eq!(unknown_flags(&buf), Some(0x80));
    }
}
