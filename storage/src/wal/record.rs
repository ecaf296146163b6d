//! The body of one WAL frame: one accepted message.
//!
//! ```text
//! 0   id          u128
//! 16  accept_ms   u64
//! 24  partition   u32
//! 28  topic_len   u16
//! 30  reserved    u16 (0)
//! 32  key_len     u32 (u32::MAX: no key)
//! 36  value_len   u32
//! 40  topic, key, value
//! ```

use crate::codec::{
    get_u128, get_u16, get_u32, get_u64, key_len_field, put_u128, put_u16, put_u32, put_u64, NO_KEY,
};
use crate::frame::frame_len;

const BODY_FIXED_BYTES: usize = 40;

/// A message as the ingress WAL holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalRecord {
    pub id: u128,
    pub topic: String,
    pub partition: u32,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub accept_ms: u64,
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
        }
    }
}

impl WalRecordRef<'_> {
    pub fn body_len(&self) -> usize {
        BODY_FIXED_BYTES + self.topic.len() + self.key.map_or(0, <[u8]>::len) + self.value.len()
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
        put_u16(buf, 0);
        put_u32(buf, key_len_field(self.key));
        put_u32(buf, u32::try_from(self.value.len()).unwrap_or(u32::MAX));
        buf.extend_from_slice(self.topic.as_bytes());
        if let Some(key) = self.key {
            buf.extend_from_slice(key);
        }
        buf.extend_from_slice(self.value);
    }
}

/// Decodes a body whose checksum already verified; `None` if it is malformed.
pub fn decode_body(body: &[u8]) -> Option<WalRecord> {
    let id = get_u128(body, 0)?;
    let accept_ms = get_u64(body, 16)?;
    let partition = get_u32(body, 24)?;
    let topic_len = usize::from(get_u16(body, 28)?);
    let key_len = get_u32(body, 32)?;
    let value_len = usize::try_from(get_u32(body, 36)?).ok()?;
    let mut at = BODY_FIXED_BYTES;
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
        assert_eq!(decode_body(&buf), Some(keyless));
        assert_eq!(decode_body(&buf[..buf.len() - 1]), None);
    }
}
