//! Message bytes in JSON: `"value"` when the bytes are valid UTF-8,
//! `"value_base64"` (standard base64) otherwise. Requests may use either.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::Serialize;

/// How a message value appears in a response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum JsonValue {
    Text { value: String },
    Binary { value_base64: String },
}

impl JsonValue {
    /// `value` if and only if the bytes are valid UTF-8.
    pub fn from_bytes(bytes: &[u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(text) => Self::Text {
                value: text.to_string(),
            },
            Err(_) => Self::Binary {
                value_base64: STANDARD.encode(bytes),
            },
        }
    }
}

/// Decodes standard base64 (padding required, as `STANDARD` writes it).
pub fn decode_base64(text: &str) -> Option<Vec<u8>> {
    STANDARD.decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_is_text_and_anything_else_is_base64() {
        assert_eq!(
            JsonValue::from_bytes(b"hi"),
            JsonValue::Text { value: "hi".into() }
        );
        assert_eq!(
            JsonValue::from_bytes(&[0, 1, 0xff]),
            JsonValue::Binary {
                value_base64: "AAH/".into()
            }
        );
        assert_eq!(decode_base64("AAH/"), Some(vec![0, 1, 0xff]));
        assert_eq!(decode_base64("not base64!"), None);
        let json = serde_json::to_string(&JsonValue::from_bytes(b"")).expect("json");
        assert_eq!(json, r#"{"value":""}"#);
    }
}
