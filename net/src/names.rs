//! Topic names: `[A-Za-z0-9._-]{1,249}`.

use crate::error::{ApiError, ErrorCode};

pub const TOPIC_NAME_BYTES_MAX: usize = 249;

pub fn is_valid_topic_name(name: &str) -> bool {
    // `.` and `..` would be path segments that clients fold away.
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= TOPIC_NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Checks a topic name, answering 400 `invalid_topic_name` with the reason.
pub fn validate_topic_name(name: &str) -> Result<(), ApiError> {
    if is_valid_topic_name(name) {
        return Ok(());
    }
    let shown: String = name.chars().take(64).collect();
    Err(ApiError::new(
        ErrorCode::InvalidTopicName,
        format!("topic name {shown:?} must be 1 to {TOPIC_NAME_BYTES_MAX} characters of A-Z, a-z, 0-9, '.', '_' or '-'"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_the_pattern() {
        for ok in ["orders", "a", "A.b_c-9", &"x".repeat(249)] {
            assert!(is_valid_topic_name(ok), "{ok}");
        }
        for bad in ["", "a b", "a/b", "é", "a*", &"x".repeat(250), "%2e"] {
            assert!(!is_valid_topic_name(bad), "{bad}");
            assert_eq!(
                validate_topic_name(bad).map_err(|e| e.code),
                Err(ErrorCode::InvalidTopicName)
            );
        }
    }
}
