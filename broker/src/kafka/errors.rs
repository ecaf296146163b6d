//! The one place an API error becomes a Kafka error code: what the HTTP
//! API answers with a status, the Kafka listener answers with the code a
//! Kafka client handles the same way (retried where HTTP says retry).

use kafka_protocol::ResponseError;
use narad_net::error::ErrorCode;

/// The Kafka error for an API error code.
pub fn kafka_error(code: ErrorCode) -> ResponseError {
    match code {
        ErrorCode::InvalidRequest | ErrorCode::UnknownField | ErrorCode::InvalidReceipt => {
            ResponseError::InvalidRequest
        }
        ErrorCode::InvalidTopicName => ResponseError::InvalidTopicException,
        ErrorCode::Unauthenticated => ResponseError::SaslAuthenticationFailed,
        ErrorCode::Forbidden => ResponseError::TopicAuthorizationFailed,
        ErrorCode::TopicNotFound | ErrorCode::NotFound => ResponseError::UnknownTopicOrPartition,
        ErrorCode::MethodNotAllowed => ResponseError::InvalidRequest,
        ErrorCode::RequestTimeout => ResponseError::RequestTimedOut,
        ErrorCode::Conflict => ResponseError::InvalidRequest,
        ErrorCode::LeaseGone => ResponseError::InvalidRecordState,
        ErrorCode::TooLarge => ResponseError::MessageTooLarge,
        ErrorCode::SchemaMismatch => ResponseError::InvalidRecord,
        // Retriable: the client backs off (with the answer's throttle time).
        ErrorCode::Overloaded => ResponseError::NotEnoughReplicas,
        ErrorCode::WalFailed | ErrorCode::AckStateFailed => ResponseError::KafkaStorageError,
        ErrorCode::Internal => ResponseError::UnknownServerError,
        // Retriable: the client asks again, maybe through another node.
        ErrorCode::OwnerUnreachable
        | ErrorCode::OwnerDead
        | ErrorCode::NoQuorum
        | ErrorCode::NoLeader
        | ErrorCode::CatchingUp => ResponseError::NotEnoughReplicas,
        ErrorCode::Stopping | ErrorCode::PartitionMoving => ResponseError::NotLeaderOrFollower,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What HTTP tells a client to retry, a Kafka client retries too, and
    /// the other way round, but for two codes Kafka has no twin of: a
    /// missing topic or partition (Kafka's code for it is retriable, as a
    /// client's metadata may be stale) and an internal error (Kafka's
    /// unknown server error is not).
    #[test]
    fn retriable_errors_stay_retriable() {
        for code in ErrorCode::ALL {
            let kafka = kafka_error(code);
            let differs = matches!(
                code,
                ErrorCode::TopicNotFound | ErrorCode::NotFound | ErrorCode::Internal
            );
            assert_eq!(
                kafka.is_retriable() != code.retry(),
                differs,
                "{} -> {kafka:?}",
                code.as_str()
            );
            assert_ne!(kafka.code(), 0, "{}", code.as_str());
        }
    }
}
