//! The one place that turns errors of the layers below into API errors.
//! Every match is exhaustive, so a new variant anywhere forces a decision
//! here.

use narad_net::{ApiError, ErrorCode};
use narad_raft::node::MetaError;
use narad_raft::state::Refused;
use narad_storage::StorageError;

use crate::owner::OwnerError;

pub fn from_storage(error: &StorageError) -> ApiError {
    let code = match error {
        StorageError::WalFull { .. } => ErrorCode::Overloaded,
        StorageError::WalFailed { .. } => ErrorCode::WalFailed,
        StorageError::TooLarge { .. } => ErrorCode::TooLarge,
        StorageError::Closed(_) => ErrorCode::Stopping,
        StorageError::Io { .. }
        | StorageError::VerifyFailed { .. }
        | StorageError::InvalidConfig(_)
        | StorageError::BadFormat { .. } => ErrorCode::Internal,
    };
    let message = match error {
        StorageError::WalFull { .. } => {
            "the node is shedding load: its ingress WAL is full; retry with backoff".to_string()
        }
        StorageError::WalFailed { .. } => {
            "the node's ingress WAL failed; it accepts no produce until it restarts".to_string()
        }
        other => other.to_string(),
    };
    ApiError::new(code, message)
}

pub fn from_meta(error: &MetaError) -> ApiError {
    match error {
        MetaError::Refused(refused) => {
            let code = match refused {
                Refused::NoSuchTopic(_) => ErrorCode::TopicNotFound,
                Refused::NoSuchDeadLetterTopic(_)
                | Refused::OwnDeadLetterTopic
                | Refused::MaxDeliveriesWithoutDeadLetterTopic
                | Refused::OwnChild
                | Refused::ChildOfChild { .. }
                | Refused::RetentionBelowDelay { .. }
                | Refused::ReplicaPartitions { .. }
                | Refused::ReplicaPlacement { .. }
                | Refused::RedriveToItself(_)
                | Refused::MoveTargetUnfit(_) => ErrorCode::InvalidRequest,
                Refused::FewerPartitions { .. }
                | Refused::DeadLetterTopicInUse { .. }
                | Refused::SchemaInUse { .. }
                | Refused::UndeletableUser(_)
                | Refused::TokenIdTaken(_)
                | Refused::ChildTopicExists(_)
                | Refused::ChildKindChange { .. }
                | Refused::HasChildren { .. }
                | Refused::RetentionBreaksDelayChild { .. }
                | Refused::ReplicaPartitionsFixed { .. }
                | Refused::RedriveIdTaken(_)
                | Refused::TooManyRedrives { .. }
                | Refused::MoveNotPlanned { .. }
                | Refused::MoveNotRunning { .. }
                | Refused::TooManyMoves { .. }
                | Refused::MoveSourceNotOwner { .. }
                | Refused::PartitionMoving { .. }
                | Refused::NodeOwnsPartitions { .. }
                | Refused::NodeInService(_)
                | Refused::MemberAddressTaken { .. } => ErrorCode::Conflict,
                Refused::NoSuchUser(_)
                | Refused::NoSuchToken { .. }
                | Refused::NoSuchChild { .. }
                | Refused::NoSuchRedrive { .. }
                | Refused::NoSuchNode(_)
                | Refused::NoSuchMove(_) => ErrorCode::NotFound,
                // A topic naming a schema that is gone (a delete raced it).
                Refused::NoSuchSchema(_) => ErrorCode::InvalidRequest,
                Refused::OwnersMismatch { .. } => ErrorCode::Internal,
            };
            ApiError::new(code, refused.to_string())
        }
        MetaError::NoQuorum(detail) => {
            ApiError::new(ErrorCode::NoQuorum, format!("no Raft quorum: {detail}"))
        }
        MetaError::Failed(detail) => {
            ApiError::new(ErrorCode::Internal, format!("metastore failed: {detail}"))
        }
    }
}

pub fn from_owner(error: &OwnerError) -> ApiError {
    match error {
        OwnerError::LeaseGone(_) => ApiError::new(
            ErrorCode::LeaseGone,
            "the lease already ended (it ran out, or the message was settled); unless it was acked, the message is or will be delivered again",
        ),
        OwnerError::Storage(storage) => from_storage(storage),
        OwnerError::Frozen => ApiError::new(
            ErrorCode::PartitionMoving,
            "the partition is being handed over to another node; retry",
        ),
        OwnerError::JournalBroken => ApiError::new(ErrorCode::Internal, error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leases::LeaseGone;

    #[test]
    fn each_error_maps_to_its_status() {
        assert_eq!(
            from_storage(&StorageError::WalFull {
                needed_bytes: 1,
                free_bytes: 0
            })
            .status(),
            429
        );
        assert_eq!(
            from_storage(&StorageError::WalFailed {
                reason: "EIO".into()
            })
            .status(),
            500
        );
        assert_eq!(from_storage(&StorageError::Closed("wal")).status(), 503);
        assert_eq!(
            from_meta(&MetaError::NoQuorum("x".into())).code,
            ErrorCode::NoQuorum
        );
        assert_eq!(
            from_meta(&MetaError::Refused(Refused::NoSuchTopic("t".into()))).status(),
            404
        );
        assert_eq!(
            from_meta(&MetaError::Refused(Refused::FewerPartitions {
                from: 2,
                to: 1
            }))
            .status(),
            409
        );
        assert_eq!(
            from_meta(&MetaError::Refused(Refused::DeadLetterTopicInUse {
                topic: "d".into(),
                by: "t".into()
            }))
            .status(),
            409
        );
        assert_eq!(
            from_meta(&MetaError::Refused(Refused::OwnDeadLetterTopic)).status(),
            400
        );
        assert_eq!(from_owner(&OwnerError::LeaseGone(LeaseGone)).status(), 410);
    }
}
