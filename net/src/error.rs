//! Error codes, their HTTP status and retry advice: one exhaustive mapping,
//! pinned by a table test.

use serde::Serialize;

/// Every error code of the API. Stable snake_case strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    InvalidRequest,
    InvalidTopicName,
    InvalidReceipt,
    UnknownField,
    Unauthenticated,
    Forbidden,
    TopicNotFound,
    NotFound,
    MethodNotAllowed,
    RequestTimeout,
    Conflict,
    LeaseGone,
    TooLarge,
    SchemaMismatch,
    Overloaded,
    WalFailed,
    Internal,
    OwnerUnreachable,
    OwnerDead,
    NoQuorum,
    Stopping,
    /// `/readyz` only: the node has no Raft leader.
    NoLeader,
    /// The node's metastore has not yet applied what the cluster committed
    /// (it started, or lost its volume): it cannot say a topic is missing.
    CatchingUp,
    /// Acks cannot be made durable on this node: an ack, nack or extend
    /// did not land.
    AckStateFailed,
    /// The partition is in a move's handover: an ack, nack or extend did
    /// not land; retried, it reaches the new owner (which answers 410: the
    /// message is delivered again).
    PartitionMoving,
}

impl ErrorCode {
    /// Every code, for tables and tests.
    pub const ALL: [ErrorCode; 25] = [
        Self::InvalidRequest,
        Self::InvalidTopicName,
        Self::InvalidReceipt,
        Self::UnknownField,
        Self::Unauthenticated,
        Self::Forbidden,
        Self::TopicNotFound,
        Self::NotFound,
        Self::MethodNotAllowed,
        Self::RequestTimeout,
        Self::Conflict,
        Self::LeaseGone,
        Self::TooLarge,
        Self::SchemaMismatch,
        Self::Overloaded,
        Self::WalFailed,
        Self::Internal,
        Self::OwnerUnreachable,
        Self::OwnerDead,
        Self::NoQuorum,
        Self::Stopping,
        Self::NoLeader,
        Self::CatchingUp,
        Self::AckStateFailed,
        Self::PartitionMoving,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request",
            Self::InvalidTopicName => "invalid_topic_name",
            Self::InvalidReceipt => "invalid_receipt",
            Self::UnknownField => "unknown_field",
            Self::Unauthenticated => "unauthenticated",
            Self::Forbidden => "forbidden",
            Self::TopicNotFound => "topic_not_found",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::RequestTimeout => "request_timeout",
            Self::Conflict => "conflict",
            Self::LeaseGone => "lease_gone",
            Self::TooLarge => "too_large",
            Self::SchemaMismatch => "schema_mismatch",
            Self::Overloaded => "overloaded",
            Self::WalFailed => "wal_failed",
            Self::Internal => "internal",
            Self::OwnerUnreachable => "owner_unreachable",
            Self::OwnerDead => "owner_dead",
            Self::NoQuorum => "no_quorum",
            Self::Stopping => "stopping",
            Self::NoLeader => "no_leader",
            Self::CatchingUp => "catching_up",
            Self::AckStateFailed => "ack_state_failed",
            Self::PartitionMoving => "partition_moving",
        }
    }

    /// The HTTP status of this code (docs/status-codes.md).
    pub fn status(self) -> u16 {
        match self {
            Self::InvalidRequest
            | Self::InvalidTopicName
            | Self::InvalidReceipt
            | Self::UnknownField => 400,
            Self::Unauthenticated => 401,
            Self::Forbidden => 403,
            Self::TopicNotFound | Self::NotFound => 404,
            Self::MethodNotAllowed => 405,
            Self::RequestTimeout => 408,
            Self::Conflict => 409,
            Self::LeaseGone => 410,
            Self::TooLarge => 413,
            Self::SchemaMismatch => 422,
            Self::Overloaded => 429,
            Self::WalFailed | Self::Internal => 500,
            Self::OwnerUnreachable => 502,
            Self::OwnerDead
            | Self::NoQuorum
            | Self::Stopping
            | Self::NoLeader
            | Self::CatchingUp
            | Self::AckStateFailed
            | Self::PartitionMoving => 503,
        }
    }

    /// Whether a client should retry (with backoff); equals the API table's column.
    pub fn retry(self) -> bool {
        match self {
            Self::InvalidRequest
            | Self::InvalidTopicName
            | Self::InvalidReceipt
            | Self::UnknownField
            | Self::Unauthenticated
            | Self::Forbidden
            | Self::TopicNotFound
            | Self::NotFound
            | Self::MethodNotAllowed
            | Self::Conflict
            | Self::LeaseGone
            | Self::TooLarge
            | Self::SchemaMismatch => false,
            Self::RequestTimeout
            | Self::Overloaded
            | Self::WalFailed
            | Self::Internal
            | Self::OwnerUnreachable
            | Self::OwnerDead
            | Self::NoQuorum
            | Self::Stopping
            | Self::NoLeader
            | Self::CatchingUp
            | Self::AckStateFailed
            | Self::PartitionMoving => true,
        }
    }

    pub fn parse(code: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == code)
    }
}

/// An error as the API answers it: a code and a human sentence. Between
/// nodes it travels in rkyv with its code as text, so the code a node
/// answered reaches the client unchanged.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ApiError {
    #[rkyv(with = CodeText)]
    pub code: ErrorCode,
    pub message: String,
}

/// Archives an [`ErrorCode`] as its text: a node that does not know a code
/// (a newer node's) reads it as `internal` rather than as another code.
pub struct CodeText;

impl rkyv::with::ArchiveWith<ErrorCode> for CodeText {
    type Archived = rkyv::string::ArchivedString;
    type Resolver = rkyv::string::StringResolver;

    fn resolve_with(code: &ErrorCode, resolver: Self::Resolver, out: rkyv::Place<Self::Archived>) {
        rkyv::string::ArchivedString::resolve_from_str(code.as_str(), resolver, out);
    }
}

impl<S> rkyv::with::SerializeWith<ErrorCode, S> for CodeText
where
    S: rkyv::rancor::Fallible + ?Sized,
    S::Error: rkyv::rancor::Source,
    str: rkyv::SerializeUnsized<S>,
{
    fn serialize_with(code: &ErrorCode, serializer: &mut S) -> Result<Self::Resolver, S::Error> {
        rkyv::string::ArchivedString::serialize_from_str(code.as_str(), serializer)
    }
}

impl<D> rkyv::with::DeserializeWith<rkyv::string::ArchivedString, ErrorCode, D> for CodeText
where
    D: rkyv::rancor::Fallible + ?Sized,
{
    fn deserialize_with(
        text: &rkyv::string::ArchivedString,
        _: &mut D,
    ) -> Result<ErrorCode, D::Error> {
        Ok(ErrorCode::parse(text.as_str()).unwrap_or(ErrorCode::Internal))
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorFields<'a>,
}

#[derive(Serialize)]
struct ErrorFields<'a> {
    code: &'a str,
    message: &'a str,
    retry: bool,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub fn status(&self) -> u16 {
        self.code.status()
    }

    /// `{"error": {"code": "...", "message": "...", "retry": bool}}`
    pub fn to_json(&self) -> String {
        let body = ErrorBody {
            error: ErrorFields {
                code: self.code.as_str(),
                message: &self.message,
                retry: self.code.retry(),
            },
        };
        serde_json::to_string(&body).unwrap_or_else(|_| {
            format!(
                r#"{{"error":{{"code":"{}","message":"","retry":{}}}}}"#,
                self.code.as_str(),
                self.code.retry()
            )
        })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.code.as_str(),
            self.status(),
            self.message
        )
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table of docs/status-codes.md, row by row: code, status, retry.
    const TABLE: [(&str, u16, bool); 25] = [
        ("invalid_request", 400, false),
        ("invalid_topic_name", 400, false),
        ("invalid_receipt", 400, false),
        ("unknown_field", 400, false),
        ("unauthenticated", 401, false),
        ("forbidden", 403, false),
        ("topic_not_found", 404, false),
        ("not_found", 404, false),
        ("method_not_allowed", 405, false),
        ("request_timeout", 408, true),
        ("conflict", 409, false),
        ("lease_gone", 410, false),
        ("too_large", 413, false),
        ("schema_mismatch", 422, false),
        ("overloaded", 429, true),
        ("wal_failed", 500, true),
        ("internal", 500, true),
        ("owner_unreachable", 502, true),
        ("owner_dead", 503, true),
        ("no_quorum", 503, true),
        ("stopping", 503, true),
        ("no_leader", 503, true),
        ("catching_up", 503, true),
        ("ack_state_failed", 503, true),
        ("partition_moving", 503, true),
    ];

    #[test]
    fn every_code_maps_to_the_api_tables_status_and_retry() {
        for (name, status, retry) in TABLE {
            let code = ErrorCode::parse(name).unwrap_or_else(|| panic!("{name} is a code"));
            assert_eq!(code.as_str(), name);
            assert_eq!(code.status(), status, "{name}");
            assert_eq!(code.retry(), retry, "{name}");
        }
        assert_eq!(TABLE.len(), ErrorCode::ALL.len());
    }

    #[test]
    fn error_json_has_the_api_shape() {
        let json = ApiError::new(ErrorCode::LeaseGone, "the lease \"x\" ended").to_json();
        let value: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
        assert_eq!(value["error"]["code"], "lease_gone");
        assert_eq!(value["error"]["message"], "the lease \"x\" ended");
        assert_eq!(value["error"]["retry"], false);
    }

    #[test]
    fn an_error_crosses_nodes_with_its_code_and_an_unknown_code_reads_as_internal() {
        use rkyv::rancor::Error;
        for code in ErrorCode::ALL {
            let error = ApiError::new(code, "why");
            let bytes = rkyv::to_bytes::<Error>(&error).expect("encode");
            assert_eq!(
                rkyv::from_bytes::<ApiError, Error>(&bytes).expect("decode"),
                error
            );
        }
        // What a newer node with a code this one does not know would send.
        #[derive(rkyv::Archive, rkyv::Serialize)]
        struct Newer {
            code: String,
            message: String,
        }
        let newer = Newer {
            code: "a_code_from_the_future".into(),
            message: "why".into(),
        };
        let bytes = rkyv::to_bytes::<Error>(&newer).expect("encode");
        let read = rkyv::from_bytes::<ApiError, Error>(&bytes).expect("decode");
        assert_eq!(read.code, ErrorCode::Internal);
        assert_eq!(read.message, "why");
    }
}
