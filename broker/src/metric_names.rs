//! Every metric name the broker exports, defined once (docs/metrics.md
//! describes each). The storage engine's own are in
//! `narad_storage::metric_names` and re-exported here.

pub use narad_storage::metric_names::STORAGE_CORRUPT_RECORDS_TOTAL;

/// Acks answered 204.
pub const ACKS_TOTAL: &str = "narad_acks_total";
/// Client connections open on this node.
pub const CONNECTIONS_OPEN: &str = "narad_connections_open";
/// 1 once a partition's ack state failed.
pub const CONSUMER_STATE_FAILED: &str = "narad_consumer_state_failed";
/// Consumes parked waiting for messages.
pub const CONSUME_LONG_POLLS_WAITING: &str = "narad_consume_long_polls_waiting";
/// Messages moved to a dead-letter topic.
pub const DEAD_LETTERED_TOTAL: &str = "narad_dead_lettered_total";
/// Records per dispatcher commit (histogram).
pub const DISPATCHER_COMMIT_RECORDS: &str = "narad_dispatcher_commit_records";
/// Messages a child skipped because its parent's retention removed them first.
pub const FANOUT_CHILD_DROPPED_MESSAGES: &str = "narad_fanout_child_dropped_messages";
/// Messages of a parent not yet copied to a child (this node's partitions).
pub const FANOUT_CHILD_LAG_MESSAGES: &str = "narad_fanout_child_lag_messages";
/// Age of the oldest message not yet copied to a child.
pub const FANOUT_CHILD_LAG_SECONDS: &str = "narad_fanout_child_lag_seconds";
/// Partition moves this node runs as their destination.
pub const MOVES_IN_PROGRESS: &str = "narad_moves_in_progress";
/// Bytes partition moves copied to this node.
pub const MOVE_COPIED_BYTES_TOTAL: &str = "narad_move_copied_bytes_total";
/// How long a move's partition stayed frozen for its handover (histogram).
pub const MOVE_FREEZE_SECONDS: &str = "narad_move_freeze_seconds";
/// Partitions this node quarantined: it held messages of a partition
/// promoted elsewhere while it was away.
pub const QUARANTINED_PARTITIONS_TOTAL: &str = "narad_quarantined_partitions_total";
/// Accepted records not yet committed.
pub const DISPATCHER_PENDING_RECORDS: &str = "narad_dispatcher_pending_records";
/// Records rerouted around an unavailable owner.
pub const DISPATCHER_REROUTES_TOTAL: &str = "narad_dispatcher_reroutes_total";
/// Request-body bytes held by the node.
pub const HTTP_BUFFERED_BODY_BYTES: &str = "narad_http_buffered_body_bytes";
/// Requests answered, by route and status.
pub const HTTP_REQUESTS_TOTAL: &str = "narad_http_requests_total";
/// Request latency (histogram).
pub const HTTP_REQUEST_SECONDS: &str = "narad_http_request_seconds";
/// 1 once an ingress WAL failed.
pub const INGRESS_WAL_FAILED: &str = "narad_ingress_wal_failed";
/// Each member as this node's controller sees it.
pub const NODE_ALIVE: &str = "narad_node_alive";
/// Messages neither leased nor acked.
pub const PARTITION_AVAILABLE_MESSAGES: &str = "narad_partition_available_messages";
/// Lowest offset not acked.
pub const PARTITION_FRONTIER: &str = "narad_partition_frontier";
/// Next offset of the partition.
pub const PARTITION_HIGH_WATERMARK: &str = "narad_partition_high_watermark";
/// Messages under a lease.
pub const PARTITION_IN_FLIGHT: &str = "narad_partition_in_flight";
/// Age of the oldest unacked message.
pub const PARTITION_OLDEST_UNACKED_AGE_SECONDS: &str = "narad_partition_oldest_unacked_age_seconds";
/// 1 while this node leads.
pub const RAFT_IS_LEADER: &str = "narad_raft_is_leader";
/// Current Raft term.
pub const RAFT_TERM: &str = "narad_raft_term";
/// Records per WAL fdatasync (histogram).
pub const WAL_RECORDS_PER_SYNC: &str = "narad_wal_records_per_sync";
/// WAL fdatasync latency (histogram).
pub const WAL_SYNC_SECONDS: &str = "narad_wal_sync_seconds";
/// Bytes of the ingress WAL ring in use.
pub const WAL_USED_BYTES: &str = "narad_wal_used_bytes";

/// Every name above.
pub const ALL: &[&str] = &[
    STORAGE_CORRUPT_RECORDS_TOTAL,
    ACKS_TOTAL,
    CONNECTIONS_OPEN,
    CONSUMER_STATE_FAILED,
    CONSUME_LONG_POLLS_WAITING,
    DEAD_LETTERED_TOTAL,
    DISPATCHER_COMMIT_RECORDS,
    DISPATCHER_PENDING_RECORDS,
    FANOUT_CHILD_DROPPED_MESSAGES,
    FANOUT_CHILD_LAG_MESSAGES,
    FANOUT_CHILD_LAG_SECONDS,
    DISPATCHER_REROUTES_TOTAL,
    HTTP_BUFFERED_BODY_BYTES,
    HTTP_REQUESTS_TOTAL,
    HTTP_REQUEST_SECONDS,
    INGRESS_WAL_FAILED,
    NODE_ALIVE,
    PARTITION_AVAILABLE_MESSAGES,
    PARTITION_FRONTIER,
    PARTITION_HIGH_WATERMARK,
    PARTITION_IN_FLIGHT,
    PARTITION_OLDEST_UNACKED_AGE_SECONDS,
    RAFT_IS_LEADER,
    RAFT_TERM,
    WAL_RECORDS_PER_SYNC,
    WAL_SYNC_SECONDS,
    WAL_USED_BYTES,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_documented_and_named_once() {
        let docs = include_str!("../../docs/metrics.md");
        for name in ALL {
            assert!(name.starts_with("narad_"), "{name}");
            assert!(docs.contains(name), "{name} is not in docs/metrics.md");
        }
        let mut sorted = ALL.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ALL.len(), "a metric name defined twice");
    }
}
