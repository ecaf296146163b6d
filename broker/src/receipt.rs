//! Receipts: opaque strings that name a lease and cannot be forged.
//!
//! ```text
//! payload = version u8 | owner_epoch u64 | partition u32 | offset u64
//!         | lease_id u64 | topic_len u16 | topic
//! receipt = base64url(payload | first 16 bytes of blake3_keyed(key, payload))
//! ```
//!
//! The key lives in the node's data folder and survives restarts, so a
//! receipt issued before a restart still verifies and is answered 410 (its
//! epoch is old), not 400.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use narad_net::{ApiError, ErrorCode};

const RECEIPT_VERSION: u8 = 1;
const MAC_BYTES: usize = 16;
const FIXED_BYTES: usize = 1 + 8 + 4 + 8 + 8 + 2;
/// A receipt longer than this (base64 of the largest topic name) is malformed.
pub const RECEIPT_CHARS_MAX: usize = 512;

/// The key that authenticates receipts.
#[derive(Clone)]
pub struct ReceiptKey([u8; 32]);

impl ReceiptKey {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }
    fn mac(&self, payload: &[u8]) -> [u8; MAC_BYTES] {
        let hash = blake3::keyed_hash(&self.0, payload);
        let mut mac = [0u8; MAC_BYTES];
        mac.copy_from_slice(&hash.as_bytes()[..MAC_BYTES]);
        mac
    }
}

impl std::fmt::Debug for ReceiptKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReceiptKey(..)")
    }
}

/// What a receipt names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    pub topic: String,
    pub partition: u32,
    pub offset: u64,
    pub lease_id: u64,
    pub owner_epoch: u64,
}

fn invalid(why: &str) -> ApiError {
    ApiError::new(ErrorCode::InvalidReceipt, format!("invalid receipt: {why}"))
}

impl Receipt {
    pub fn encode(&self, key: &ReceiptKey) -> String {
        let topic = self.topic.as_bytes();
        let mut bytes = Vec::with_capacity(FIXED_BYTES + topic.len() + MAC_BYTES);
        bytes.push(RECEIPT_VERSION);
        bytes.extend_from_slice(&self.owner_epoch.to_le_bytes());
        bytes.extend_from_slice(&self.partition.to_le_bytes());
        bytes.extend_from_slice(&self.offset.to_le_bytes());
        bytes.extend_from_slice(&self.lease_id.to_le_bytes());
        bytes.extend_from_slice(&u16::try_from(topic.len()).unwrap_or(u16::MAX).to_le_bytes());
        bytes.extend_from_slice(topic);
        let mac = key.mac(&bytes);
        bytes.extend_from_slice(&mac);
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// Decodes and authenticates a receipt presented on `topic`'s endpoint:
    /// 400 `invalid_receipt` if it is malformed, forged, or of another topic.
    pub fn decode(text: &str, topic: &str, key: &ReceiptKey) -> Result<Self, ApiError> {
        let bytes = Self::bytes(text)?;
        let (payload, mac) = bytes.split_at(bytes.len() - MAC_BYTES);
        let expected = key.mac(payload);
        let difference = expected
            .iter()
            .zip(mac)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if difference != 0 {
            return Err(invalid("it was not issued by this cluster"));
        }
        Self::fields(payload, topic)
    }

    /// Reads a receipt without authenticating it: only to route it to the
    /// node that owns its partition, which authenticates it with its key.
    pub fn peek(text: &str, topic: &str) -> Result<Self, ApiError> {
        let bytes = Self::bytes(text)?;
        Self::fields(&bytes[..bytes.len() - MAC_BYTES], topic)
    }

    fn bytes(text: &str) -> Result<Vec<u8>, ApiError> {
        if text.len() > RECEIPT_CHARS_MAX {
            return Err(invalid("too long"));
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|_| invalid("not a receipt"))?;
        if bytes.len() < FIXED_BYTES + MAC_BYTES {
            return Err(invalid("too short"));
        }
        Ok(bytes)
    }

    fn fields(payload: &[u8], topic: &str) -> Result<Self, ApiError> {
        let field = |at: usize, len: usize| {
            payload
                .get(at..at + len)
                .ok_or_else(|| invalid("truncated"))
        };
        if payload.first() != Some(&RECEIPT_VERSION) {
            return Err(invalid("unknown version"));
        }
        let u64_at = |at| -> Result<u64, ApiError> {
            Ok(u64::from_le_bytes(
                field(at, 8)?.try_into().map_err(|_| invalid("truncated"))?,
            ))
        };
        let owner_epoch = u64_at(1)?;
        let partition =
            u32::from_le_bytes(field(9, 4)?.try_into().map_err(|_| invalid("truncated"))?);
        let offset = u64_at(13)?;
        let lease_id = u64_at(21)?;
        let topic_len = usize::from(u16::from_le_bytes(
            field(29, 2)?.try_into().map_err(|_| invalid("truncated"))?,
        ));
        if payload.len() != FIXED_BYTES + topic_len {
            return Err(invalid("bad length"));
        }
        let receipt_topic = std::str::from_utf8(field(FIXED_BYTES, topic_len)?)
            .map_err(|_| invalid("bad topic"))?;
        if receipt_topic != topic {
            return Err(invalid(&format!(
                "it belongs to topic {receipt_topic:?}, not {topic:?}"
            )));
        }
        Ok(Self {
            topic: receipt_topic.to_string(),
            partition,
            offset,
            lease_id,
            owner_epoch,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> ReceiptKey {
        ReceiptKey::from_bytes([byte; 32])
    }

    fn receipt() -> Receipt {
        Receipt {
            topic: "orders".into(),
            partition: 3,
            offset: 1234,
            lease_id: 99,
            owner_epoch: 7,
        }
    }

    #[test]
    fn a_receipt_round_trips_on_its_topic() {
        let text = receipt().encode(&key(1));
        assert_eq!(Receipt::decode(&text, "orders", &key(1)), Ok(receipt()));
    }

    #[test]
    fn forged_tampered_foreign_and_garbage_receipts_are_invalid() {
        let text = receipt().encode(&key(1));
        let code = |text: &str, topic: &str, k: u8| {
            Receipt::decode(text, topic, &key(k)).map_err(|e| e.code)
        };
        assert_eq!(
            code(&text, "orders", 2),
            Err(ErrorCode::InvalidReceipt),
            "another key"
        );
        assert_eq!(
            code(&text, "billing", 1),
            Err(ErrorCode::InvalidReceipt),
            "another topic"
        );
        let mut bytes = URL_SAFE_NO_PAD.decode(&text).expect("base64");
        bytes[13] ^= 1; // the offset
        assert_eq!(
            code(&URL_SAFE_NO_PAD.encode(&bytes), "orders", 1),
            Err(ErrorCode::InvalidReceipt),
            "tampered"
        );
        for garbage in ["", "!!!", "AAAA", &"A".repeat(600)] {
            assert_eq!(
                code(garbage, "orders", 1),
                Err(ErrorCode::InvalidReceipt),
                "{garbage}"
            );
        }
    }
}
