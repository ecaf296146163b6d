//! What every client of the HTTP API shares: the retry policy of the
//! status-code table, path-segment encoding, and the error code an answer
//! without the API's error body stands for. The client itself is the
//! `narad-client` crate (`net/client`), async and blocking.

use std::time::Duration;

use crate::error::ErrorCode;

/// How a client retries what docs/status-codes.md marks retryable (408,
/// 429, 500, 502, 503, and no answer at all): up to `attempts` tries in
/// all, waiting a random time below `backoff_base * 2^(try - 1)`, capped at
/// `backoff_max`, between them. Any other error is returned at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 5,
            backoff_base: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
        }
    }
}

/// How long one request may take before a client gives up on it, unless it
/// is told otherwise.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Percent-encodes a path segment (everything but `A-Za-z0-9-._~@`; `@`
/// is allowed in a path segment, and user names may hold it).
pub fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b'@') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The error code an answer without a JSON error body stands for (a
/// proxy's answer, or hyper refusing a malformed request).
pub fn code_for_status(status: u16) -> ErrorCode {
    match status {
        400 => ErrorCode::InvalidRequest,
        401 => ErrorCode::Unauthenticated,
        403 => ErrorCode::Forbidden,
        404 => ErrorCode::NotFound,
        405 => ErrorCode::MethodNotAllowed,
        408 => ErrorCode::RequestTimeout,
        409 => ErrorCode::Conflict,
        410 => ErrorCode::LeaseGone,
        413 => ErrorCode::TooLarge,
        422 => ErrorCode::SchemaMismatch,
        429 => ErrorCode::Overloaded,
        502 => ErrorCode::OwnerUnreachable,
        503 => ErrorCode::Stopping,
        _ => ErrorCode::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(encode_segment("orders.v2_x-y"), "orders.v2_x-y");
        assert_eq!(encode_segment("bad name/x"), "bad%20name%2Fx");
        assert_eq!(encode_segment("ann@example.com"), "ann@example.com");
    }

    #[test]
    fn a_bare_status_stands_for_its_code_and_only_the_tables_retryable_ones_retry() {
        assert!(code_for_status(429).retry());
        assert!(code_for_status(503).retry());
        assert!(code_for_status(502).retry());
        assert!(!code_for_status(410).retry());
        assert!(!code_for_status(400).retry());
        assert_eq!(code_for_status(418), ErrorCode::Internal);
    }
}
