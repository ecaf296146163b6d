//! Message bytes in JSON: `"value"` when the bytes are valid UTF-8,
//! `"value_base64"` (standard base64) otherwise. Requests may use either.
//!
//! Consume answers carry up to a thousand values each, so they are written
//! here by hand rather than through serde: the buffer is sized once, a value
//! goes in with one copy, and the scan for bytes JSON must escape looks at
//! eight bytes at a time. The output is byte for byte what serde_json writes
//! for the same fields (tested against it).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

/// Decodes standard base64 (padding required, as `STANDARD` writes it).
pub fn decode_base64(text: &str) -> Option<Vec<u8>> {
    STANDARD.decode(text).ok()
}

/// Appends `"name":` and the value: `"value":"text"` when `bytes` are
/// UTF-8, `"value_base64":"..."` otherwise.
pub fn write_value_field(out: &mut Vec<u8>, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => {
            out.extend_from_slice(b"\"value\":");
            write_str(out, text);
        }
        Err(_) => {
            out.extend_from_slice(b"\"value_base64\":\"");
            let start = out.len();
            out.resize(start + base64_len(bytes.len()), 0);
            // The buffer was sized for exactly this encoding.
            let written = STANDARD.encode_slice(bytes, &mut out[start..]).unwrap_or(0);
            out.truncate(start + written);
            out.push(b'"');
        }
    }
}

/// Bytes a value takes in a JSON answer at most before escapes: what to
/// reserve for it.
pub fn value_json_len(bytes: &[u8]) -> usize {
    base64_len(bytes.len()).max(bytes.len()) + 20
}

fn base64_len(bytes: usize) -> usize {
    bytes.div_ceil(3) * 4
}

/// Lowercase hex digits, for escapes and ids.
const HEX: &[u8; 16] = b"0123456789abcdef";

const LOW_BITS: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// Whether any of the eight bytes in `word` is one JSON must escape: a
/// control character (below 0x20), `"` or `\`.
fn needs_escape(word: u64) -> bool {
    let has_zero = |v: u64| v.wrapping_sub(LOW_BITS) & !v & HIGH_BITS;
    // A byte below 0x20 borrows when 0x20 is taken from it; bytes of 0x80
    // and above are excluded by `!word`.
    let control = word.wrapping_sub(LOW_BITS * 0x20) & !word & HIGH_BITS;
    control
        | has_zero(word ^ (LOW_BITS * u64::from(b'"')))
        | has_zero(word ^ (LOW_BITS * u64::from(b'\\')))
        != 0
}

/// Appends `text` as a JSON string, quotes included, escaped as serde_json
/// escapes it.
pub fn write_str(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    // Bytes from `run` on are not written yet and need no escape.
    let mut run = 0;
    let mut at = 0;
    while at < bytes.len() {
        if let Some(chunk) = bytes.get(at..at + 8) {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            if !needs_escape(u64::from_le_bytes(word)) {
                at += 8;
                continue;
            }
        }
        let end = (at + 8).min(bytes.len());
        for (i, &byte) in bytes[at..end].iter().enumerate() {
            if let Some(escape) = escape_of(byte) {
                out.extend_from_slice(&bytes[run..at + i]);
                write_escape(out, byte, escape);
                run = at + i + 1;
            }
        }
        at = end;
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

/// How a byte is escaped: its letter after `\`, `u` for `\u00XX`, or none.
fn escape_of(byte: u8) -> Option<u8> {
    match byte {
        b'"' => Some(b'"'),
        b'\\' => Some(b'\\'),
        0x08 => Some(b'b'),
        0x0c => Some(b'f'),
        b'\n' => Some(b'n'),
        b'\r' => Some(b'r'),
        b'\t' => Some(b't'),
        0..=0x1f => Some(b'u'),
        _ => None,
    }
}

fn write_escape(out: &mut Vec<u8>, byte: u8, escape: u8) {
    out.push(b'\\');
    out.push(escape);
    if escape == b'u' {
        out.extend_from_slice(b"00");
        out.push(HEX[usize::from(byte >> 4)]);
        out.push(HEX[usize::from(byte & 0xf)]);
    }
}

/// Appends a message id as the API writes it: 32 lowercase hex digits.
pub fn write_hex_u128(out: &mut Vec<u8>, n: u128) {
    for shift in (0..32).rev() {
        out.push(HEX[((n >> (shift * 4)) & 0xf) as usize]);
    }
}

/// Appends an unsigned integer in decimal.
pub fn write_u64(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value_json(bytes: &[u8]) -> String {
        let mut out = Vec::new();
        write_value_field(&mut out, bytes);
        String::from_utf8(out).expect("JSON is UTF-8")
    }

    #[test]
    fn utf8_is_text_and_anything_else_is_base64() {
        assert_eq!(value_json(b"hi"), r#""value":"hi""#);
        assert_eq!(value_json(&[0, 1, 0xff]), r#""value_base64":"AAH/""#);
        assert_eq!(value_json(b""), r#""value":"""#);
        assert_eq!(decode_base64("AAH/"), Some(vec![0, 1, 0xff]));
        assert_eq!(decode_base64("not base64!"), None);
        for len in 0..10 {
            let bytes: Vec<u8> = (0..len).map(|i| 0xf0 ^ i).collect();
            let json = value_json(&bytes);
            let encoded = STANDARD.encode(&bytes);
            if std::str::from_utf8(&bytes).is_err() {
                assert_eq!(json, format!(r#""value_base64":"{encoded}""#));
            }
        }
    }

    /// Strings made of the characters JSON treats specially, at every
    /// position around the eight-byte boundaries, written as serde_json
    /// writes them.
    #[test]
    fn strings_are_escaped_exactly_as_serde_json_escapes_them() {
        let alphabet: Vec<char> = "ab\"\\\n\r\t\u{8}\u{c}\u{0}\u{1f}\u{7f}/é€😀 "
            .chars()
            .collect();
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let len = (next() % 40) as usize;
            let text: String = (0..len)
                .map(|_| {
                    // Mostly plain letters, so that runs cross eight bytes.
                    if next() % 4 == 0 {
                        alphabet[(next() % alphabet.len() as u64) as usize]
                    } else {
                        'x'
                    }
                })
                .collect();
            let mut out = Vec::new();
            write_str(&mut out, &text);
            let expected = serde_json::to_string(&text).expect("json");
            assert_eq!(String::from_utf8(out).expect("utf-8"), expected, "{text:?}");
        }
    }

    #[test]
    fn ids_are_written_as_32_hex_digits() {
        for n in [0, 42, u128::from(u64::MAX) << 7, u128::MAX] {
            let mut out = Vec::new();
            write_hex_u128(&mut out, n);
            assert_eq!(String::from_utf8(out).expect("ascii"), format!("{n:032x}"));
        }
    }

    #[test]
    fn integers_are_written_in_decimal() {
        for n in [0, 7, 10, 99, 1_000, u64::from(u32::MAX), u64::MAX] {
            let mut out = Vec::new();
            write_u64(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
        }
    }
}
