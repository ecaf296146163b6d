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
//! ..  expires_ms  u64, idempotency_len u16, when flags has FLAG_IDEMPOTENCY
//! ..  topic, key, value, idempotency key
//! ```
//!
//! Records written before the flags existed have 0 there (the field was
//! reserved) and no topic incarnation. A record with an offset is the
//! owner's journal copy of a commit: its partition is owned by the shard
//! that wrote it, which gave it that offset, and recovery puts it back at
//! that offset.
//!
//! A record with an idempotency key holds it until `expires_ms` (the
//! accepting node's clock): the ring keeps it that long, carrying it
//! forward as a key-only record (`FLAG_KEY_ONLY`: no message, nothing to
//! dispatch) when its frame's space is needed ([`super::keys`]). A version
//! of Narad from before these flags refuses to start on a ring that holds
//! them, naming the flags, rather than misreading them.

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
/// The body carries an idempotency key and when it expires.
const FLAG_IDEMPOTENCY: u16 = 4;
const IDEMPOTENCY_FIXED_BYTES: usize = 10;
/// The record holds only an idempotency key carried forward from an earlier
/// record (its value is empty); recovery takes the key and dispatches
/// nothing.
const FLAG_KEY_ONLY: u16 = 8;
const KNOWN_FLAGS: u16 = FLAG_TOPIC_INCARNATION | FLAG_OFFSET | FLAG_IDEMPOTENCY | FLAG_KEY_ONLY;

/// The longest idempotency key a record holds.
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = u16::MAX as usize;

/// An idempotency key and when the accepting node forgets it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Idempotency {
    pub key: Vec<u8>,
    pub expires_ms: u64,
}

/// A borrowed [`Idempotency`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdempotencyRef<'a> {
    pub key: &'a [u8],
    pub expires_ms: u64,
}

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
    /// The producer's idempotency key, if it gave one.
    pub idempotency: Option<Idempotency>,
    /// Only the idempotency key of an earlier record, carried forward: not
    /// a message.
    pub key_only: bool,
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
    pub idempotency: Option<IdempotencyRef<'a>>,
    pub key_only: bool,
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
            idempotency: self.idempotency.as_ref().map(|i| IdempotencyRef {
                key: &i.key,
                expires_ms: i.expires_ms,
            }),
            key_only: self.key_only,
        }
    }
}

impl WalRecordRef<'_> {
    pub fn body_len(&self) -> usize {
        BODY_FIXED_BYTES
            + self.topic_incarnation.map_or(0, |_| INCARNATION_BYTES)
            + self.offset.map_or(0, |_| OFFSET_BYTES)
            + self
                .idempotency
                .map_or(0, |i| IDEMPOTENCY_FIXED_BYTES + i.key.len())
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
            | self.offset.map_or(0, |_| FLAG_OFFSET)
            | self.idempotency.map_or(0, |_| FLAG_IDEMPOTENCY)
            | if self.key_only { FLAG_KEY_ONLY } else { 0 };
        put_u16(buf, flags);
        put_u32(buf, key_len_field(self.key));
        put_u32(buf, u32::try_from(self.value.len()).unwrap_or(u32::MAX));
        if let Some(incarnation) = self.topic_incarnation {
            put_u64(buf, incarnation);
        }
        if let Some(offset) = self.offset {
            put_u64(buf, offset);
        }
        if let Some(idempotency) = self.idempotency {
            put_u64(buf, idempotency.expires_ms);
            put_u16(
                buf,
                u16::try_from(idempotency.key.len()).unwrap_or(u16::MAX),
            );
        }
        buf.extend_from_slice(self.topic.as_bytes());
        if let Some(key) = self.key {
            buf.extend_from_slice(key);
        }
        buf.extend_from_slice(self.value);
        if let Some(idempotency) = self.idempotency {
            buf.extend_from_slice(idempotency.key);
        }
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
    let idempotency = if flags & FLAG_IDEMPOTENCY != 0 {
        let expires_ms = get_u64(body, at)?;
        let len = usize::from(get_u16(body, at + 8)?);
        at += IDEMPOTENCY_FIXED_BYTES;
        Some((expires_ms, len))
    } else {
        None
    };
    let key_only = flags & FLAG_KEY_ONLY != 0;
    if key_only && idempotency.is_none() {
        return None;
    }
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
    at += value_len;
    let idempotency = match idempotency {
        Some((expires_ms, len)) => {
            let key = body.get(at..at + len)?.to_vec();
            at += len;
            Some(Idempotency { key, expires_ms })
        }
        None => None,
    };
    if at != body.len() {
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
        idempotency,
        key_only,
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
            idempotency: None,
            key_only: false,
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
        assert_eq!(decode_body(&buf), Some(journal.clone()));
        let idempotent = WalRecord {
            idempotency: Some(Idempotency {
                key: b"order-17".to_vec(),
                expires_ms: 1_700_000_300_000,
            }),
            key: Some(b"k".to_vec()),
            value: b"v".to_vec(),
            ..journal
        };
        buf.clear();
        idempotent.as_ref().encode_body(&mut buf);
        assert_eq!(buf.len(), idempotent.as_ref().body_len());
        assert_eq!(decode_body(&buf), Some(idempotent.clone()));
        assert_eq!(decode_body(&buf[..buf.len() - 1]), None);
        let carried = WalRecord {
            value: Vec::new(),
            key_only: true,
            ..idempotent
        };
        buf.clear();
        carried.as_ref().encode_body(&mut buf);
        assert_eq!(decode_body(&buf), Some(carried));
    }

    #[test]
    fn a_key_only_record_without_a_key_is_malformed() {
        let record = WalRecord {
            id: 1,
            topic: "t".into(),
            partition: 0,
            key: None,
            value: Vec::new(),
            accept_ms: 0,
            topic_incarnation: None,
            offset: None,
            idempotency: None,
            key_only: true,
        };
        let mut buf = Vec::new();
        record.as_ref().encode_body(&mut buf);
        assert_eq!(decode_body(&buf), None);
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
            idempotency: None,
            key_only: false,
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
