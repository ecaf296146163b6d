//! `POST /v1/topics/{topic}/messages/batch`: validated whole before anything
//! is written. One bad item rejects the batch with 400 (413 for size) naming
//! its index; 0 or more than 1000 items is 400.

use serde::Deserialize;
use serde_json::Value;

use crate::error::{ApiError, ErrorCode};
use crate::types::Fields;
use crate::value::decode_base64;

pub const BATCH_MESSAGES_MAX: usize = 1000;
/// Longest message key, in bytes. A key routes a message and comes back
/// with it; the topic's `max_message_bytes` bounds the value alone.
pub const KEY_BYTES_MAX: usize = 4096;
/// Longest idempotency key, in bytes (printable ASCII only).
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 256;

/// One message of a batch, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchItem {
    pub key: Option<String>,
    pub value: Vec<u8>,
    /// The producer's idempotency key (checked by [`check_idempotency_key`]).
    pub idempotency_key: Option<String>,
}

fn invalid(message: String) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, message)
}

/// Parses and validates a whole batch body.
///
/// A valid batch is read straight into its items; anything the quick
/// reading does not take (an error of any kind, or a form it leaves to the
/// full reading) is read again field by field, which names what is wrong.
/// Both readings take exactly the same batches (tested).
pub fn parse_batch(body: &[u8], max_message_bytes: u64) -> Result<Vec<BatchItem>, ApiError> {
    match parse_batch_quickly(body, max_message_bytes) {
        Some(items) => Ok(items),
        None => parse_batch_by_fields(body, max_message_bytes),
    }
}

/// A batch body as a valid batch has it; any other field, type or a null
/// where a string belongs fails to read.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuickBatch {
    messages: Vec<QuickItem>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuickItem {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    value: Present,
    #[serde(default)]
    value_base64: Present,
    #[serde(default)]
    idempotency_key: Option<String>,
}

/// A field that is either absent or a string (a null fails to read: the
/// full reading decides what a null means there).
#[derive(Default)]
enum Present {
    #[default]
    Absent,
    Text(String),
}

impl<'de> Deserialize<'de> for Present {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Present::Text)
    }
}

fn parse_batch_quickly(body: &[u8], max_message_bytes: u64) -> Option<Vec<BatchItem>> {
    let batch: QuickBatch = serde_json::from_slice(body).ok()?;
    if batch.messages.is_empty() || batch.messages.len() > BATCH_MESSAGES_MAX {
        return None;
    }
    batch
        .messages
        .into_iter()
        .map(|item| {
            let value = match (item.value, item.value_base64) {
                (Present::Text(text), Present::Absent) => text.into_bytes(),
                (Present::Absent, Present::Text(encoded)) => decode_base64(&encoded)?,
                _ => return None,
            };
            let key_fits = item.key.as_ref().is_none_or(|k| k.len() <= KEY_BYTES_MAX);
            let idempotency_fits = item
                .idempotency_key
                .as_ref()
                .is_none_or(|k| idempotency_key_fault(k.as_bytes()).is_none());
            (key_fits && idempotency_fits && value.len() as u64 <= max_message_bytes).then_some(
                BatchItem {
                    key: item.key,
                    value,
                    idempotency_key: item.idempotency_key,
                },
            )
        })
        .collect()
}

fn parse_batch_by_fields(body: &[u8], max_message_bytes: u64) -> Result<Vec<BatchItem>, ApiError> {
    let mut fields = Fields::parse(body)?;
    let messages = match fields.take("messages") {
        Some(Value::Array(items)) => items,
        None | Some(Value::Null) => return Err(invalid("messages is required".into())),
        Some(other) => return Err(invalid(format!("messages must be an array, got {other}"))),
    };
    fields.finish()?;
    if messages.is_empty() || messages.len() > BATCH_MESSAGES_MAX {
        return Err(invalid(format!(
            "a batch holds 1 to {BATCH_MESSAGES_MAX} messages, got {}",
            messages.len()
        )));
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(index, item)| parse_item(index, item, max_message_bytes))
        .collect()
}

fn parse_item(index: usize, item: Value, max_message_bytes: u64) -> Result<BatchItem, ApiError> {
    let Value::Object(mut map) = item else {
        return Err(invalid(format!("messages[{index}] must be an object")));
    };
    let key = match map.remove("key") {
        None | Some(Value::Null) => None,
        Some(Value::String(key)) => Some(key),
        Some(other) => {
            return Err(invalid(format!(
                "messages[{index}].key must be a string, got {other}"
            )))
        }
    };
    let idempotency_key = match map.remove("idempotency_key") {
        None | Some(Value::Null) => None,
        Some(Value::String(key)) => {
            check_idempotency_key(
                &format!("messages[{index}].idempotency_key"),
                key.as_bytes(),
            )?;
            Some(key)
        }
        Some(other) => {
            return Err(invalid(format!(
                "messages[{index}].idempotency_key must be a string, got {other}"
            )))
        }
    };
    let value = match (map.remove("value"), map.remove("value_base64")) {
        (Some(Value::String(text)), None) => text.into_bytes(),
        (None, Some(Value::String(encoded))) => decode_base64(&encoded).ok_or_else(|| {
            invalid(format!(
                "messages[{index}].value_base64 is not valid standard base64"
            ))
        })?,
        (Some(_), Some(_)) => {
            return Err(invalid(format!(
                "messages[{index}] has both value and value_base64; give one"
            )))
        }
        (None, None) => {
            return Err(invalid(format!(
                "messages[{index}] needs value or value_base64"
            )))
        }
        (Some(other), None) => {
            return Err(invalid(format!(
                "messages[{index}].value must be a string, got {other}"
            )))
        }
        (None, Some(other)) => {
            return Err(invalid(format!(
                "messages[{index}].value_base64 must be a string, got {other}"
            )))
        }
    };
    if let Some(name) = map.keys().next() {
        return Err(ApiError::new(
            ErrorCode::UnknownField,
            format!("messages[{index}] has an unknown field {name:?}"),
        ));
    }
    if value.len() as u64 > max_message_bytes {
        return Err(ApiError::new(
            ErrorCode::TooLarge,
            format!("messages[{index}] is {} bytes, over the topic's max_message_bytes of {max_message_bytes}", value.len()),
        ));
    }
    if let Some(key) = key.as_ref().filter(|k| k.len() > KEY_BYTES_MAX) {
        return Err(key_too_long(&format!("messages[{index}].key"), key.len()));
    }
    Ok(BatchItem {
        key,
        value,
        idempotency_key,
    })
}

/// What is wrong with an idempotency key, if anything: it must be 1 to
/// [`IDEMPOTENCY_KEY_BYTES_MAX`] bytes of printable ASCII.
fn idempotency_key_fault(key: &[u8]) -> Option<String> {
    if key.is_empty() {
        return Some("is empty".into());
    }
    if key.len() > IDEMPOTENCY_KEY_BYTES_MAX {
        return Some(format!(
            "is {} bytes, over {IDEMPOTENCY_KEY_BYTES_MAX}",
            key.len()
        ));
    }
    key.iter()
        .position(|b| !(b' '..=b'~').contains(b))
        .map(|at| format!("has a byte that is not printable ASCII at {at}"))
}

/// Checks an idempotency key; `what` names where it came from (the
/// `Narad-Idempotency-Key` header or a batch item's field).
pub fn check_idempotency_key(what: &str, key: &[u8]) -> Result<(), ApiError> {
    match idempotency_key_fault(key) {
        None => Ok(()),
        Some(fault) => Err(invalid(format!(
            "{what} {fault}: an idempotency key is 1 to {IDEMPOTENCY_KEY_BYTES_MAX} bytes of printable ASCII; nothing was written"
        ))),
    }
}

/// The error for a key longer than [`KEY_BYTES_MAX`]; `what` names where
/// the key came from (a batch field or the `Narad-Key` header).
pub fn key_too_long(what: &str, len: usize) -> ApiError {
    ApiError::new(
        ErrorCode::TooLarge,
        format!("{what} is {len} bytes, over the key limit of {KEY_BYTES_MAX}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_batch_keeps_order_and_decodes_both_value_forms() {
        let items = parse_batch(
            br#"{"messages":[{"key":"k1","value":"text"},{"value_base64":"AAEC"}]}"#,
            100,
        )
        .expect("ok");
        assert_eq!(
            items[0],
            BatchItem {
                key: Some("k1".into()),
                value: b"text".to_vec(),
                idempotency_key: None,
            }
        );
        assert_eq!(
            items[1],
            BatchItem {
                key: None,
                value: vec![0, 1, 2],
                idempotency_key: None,
            }
        );
    }

    /// The quick reading takes a batch only when the full reading would
    /// take it too, item for item.
    #[test]
    fn both_readings_take_the_same_batches() {
        let bodies: &[&str] = &[
            r#"{"messages":[{"key":"k1","value":"text"},{"value_base64":"AAEC"}]}"#,
            r#"{"messages":[{"key":null,"value":"a\"b\n\u00e9"}]}"#,
            r#"{"messages":[{"value":null,"value_base64":"AA=="}]}"#,
            r#"{"messages":[{"value":"a","value_base64":null}]}"#,
            r#"{"messages":[{"value":"a","value_base64":"AA=="}]}"#,
            r#"{"messages":[{"value":7}]}"#,
            r#"{"messages":[{"key":7,"value":"a"}]}"#,
            r#"{"messages":[{"value":"a","extra":1}]}"#,
            r#"{"messages":[{"value":"a"}],"extra":1}"#,
            r#"{"messages":[{"value":"a","value":"b"}]}"#,
            r#"{"messages":[{"value_base64":"!!"}]}"#,
            r#"{"messages":[{"value":"0123456789ab"}]}"#,
            r#"{"messages":[]}"#,
            r#"{"messages":null}"#,
            r#"{"messages":{}}"#,
            r#"{}"#,
            r#"[]"#,
            r#""#,
            r#"{"messages":[{}]}"#,
            r#"{"messages":[{"value":"a"}]} trailing"#,
            r#"{"messages":[{"value":"a","idempotency_key":"order-1"}]}"#,
            r#"{"messages":[{"value":"a","idempotency_key":null}]}"#,
            r#"{"messages":[{"value":"a","idempotency_key":""}]}"#,
            r#"{"messages":[{"value":"a","idempotency_key":"tab\there"}]}"#,
            r#"{"messages":[{"value":"a","idempotency_key":"\u00e9"}]}"#,
            r#"{"messages":[{"value":"a","idempotency_key":7}]}"#,
        ];
        for body in bodies {
            let quick = parse_batch(body.as_bytes(), 10);
            let full = parse_batch_by_fields(body.as_bytes(), 10);
            assert_eq!(quick, full, "{body}");
        }
        let many = |n: usize| {
            format!(
                r#"{{"messages":[{}]}}"#,
                vec![r#"{"value":"x"}"#; n].join(",")
            )
        };
        for n in [1, 1000, 1001] {
            let body = many(n);
            assert_eq!(
                parse_batch(body.as_bytes(), 10),
                parse_batch_by_fields(body.as_bytes(), 10),
                "{n} messages"
            );
        }
        assert!(parse_batch_quickly(many(1000).as_bytes(), 10).is_some());
    }

    #[test]
    fn one_bad_item_rejects_the_batch_naming_its_index() {
        let long_key = format!(
            r#"{{"messages":[{{"value":"a"}},{{"value":"b","idempotency_key":"{}"}}]}}"#,
            "k".repeat(257)
        );
        let cases: [(&[u8], ErrorCode, &str); 10] = [
            (
                long_key.as_bytes(),
                ErrorCode::InvalidRequest,
                "messages[1].idempotency_key is 257 bytes",
            ),
            (
                br#"{"messages":[{"value":"a","idempotency_key":""}]}"#,
                ErrorCode::InvalidRequest,
                "messages[0].idempotency_key is empty",
            ),
            (
                br#"{"messages":[{"value":"a","idempotency_key":"caf\u00e9"}]}"#,
                ErrorCode::InvalidRequest,
                "messages[0].idempotency_key has a byte that is not printable ASCII",
            ),
            (
                br#"{"messages":[{"value":"a"},{"value":"b","value_base64":"AA=="}]}"#,
                ErrorCode::InvalidRequest,
                "messages[1]",
            ),
            (
                br#"{"messages":[{"value":"a"},{}]}"#,
                ErrorCode::InvalidRequest,
                "messages[1]",
            ),
            (
                br#"{"messages":[{"value_base64":"!!"}]}"#,
                ErrorCode::InvalidRequest,
                "messages[0]",
            ),
            (
                br#"{"messages":[{"value":"a","key":7}]}"#,
                ErrorCode::InvalidRequest,
                "messages[0].key",
            ),
            (
                br#"{"messages":[{"value":"a"},{"value":"0123456789ab"}]}"#,
                ErrorCode::TooLarge,
                "messages[1]",
            ),
            (
                br#"{"messages":[]}"#,
                ErrorCode::InvalidRequest,
                "1 to 1000",
            ),
            (
                br#"{"msgs":[]}"#,
                ErrorCode::InvalidRequest,
                "messages is required",
            ),
        ];
        for (body, code, needle) in cases {
            let error = parse_batch(body, 10).expect_err("rejected");
            assert_eq!(error.code, code, "{}", String::from_utf8_lossy(body));
            assert!(
                error.message.contains(needle),
                "{} lacks {needle}",
                error.message
            );
        }
        let too_many = format!(
            r#"{{"messages":[{}]}}"#,
            vec![r#"{"value":"x"}"#; 1001].join(",")
        );
        assert_eq!(
            parse_batch(too_many.as_bytes(), 10).expect_err("1001").code,
            ErrorCode::InvalidRequest
        );
    }
}
