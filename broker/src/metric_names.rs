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
/// Rounds of a long poll that a wake-up started and that found nothing.
pub const CONSUME_EMPTY_WAKES_TOTAL: &str = "narad_consume_empty_wakes_total";
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
/// How long until a remote child's oldest message not yet shipped ages
/// out of its parent.
pub const REMOTE_CHILD_HEADROOM_SECONDS: &str = "narad_remote_child_headroom_seconds";
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
/// Kafka protocol requests answered, by API and error.
pub const KAFKA_REQUESTS_TOTAL: &str = "narad_kafka_requests_total";
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
/// Produced messages found to be duplicates by their idempotency key, by
/// topic and where (`node`: the node that took the produce; `owner`: the
/// partition's owner, which committed a copy with the same key).
pub const PRODUCE_DUPLICATES_TOTAL: &str = "narad_produce_duplicates_total";
/// Records with an idempotency key rerouted to a sibling partition, by
/// topic: a copy of each may be stored twice (the owner of the sibling
/// does not know the first).
pub const IDEMPOTENCY_KEYS_REROUTED_TOTAL: &str = "narad_idempotency_keys_rerouted_total";
/// Idempotency keys this node holds in its table (all shards).
pub const IDEMPOTENCY_KEYS: &str = "narad_idempotency_keys";
/// Idempotency keys let go before their window ended: the node's table or
/// a shard's WAL held its limit of them.
pub const IDEMPOTENCY_KEYS_FORGOTTEN_TOTAL: &str = "narad_idempotency_keys_forgotten_total";
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

/// What kind of metric a name is, for its `# TYPE` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// The help text of a metric (`# HELP`), from [`ALL`]; empty for a name
/// not listed there (the tests keep every metric the node exposes listed).
pub fn help(name: &str) -> &'static str {
    ALL.iter()
        .find(|(listed, _, _)| *listed == name)
        .map_or("", |(_, _, help)| help)
}

/// Every metric with its kind and help text: the one place help texts are
/// written (`/metrics` and the recorder's descriptions both read them).
pub const ALL: &[(&str, Kind, &str)] = &[
    (STORAGE_CORRUPT_RECORDS_TOTAL, Kind::Counter, "Records or frames recovery or a read found damaged and skipped (or refused)."),
    (ACKS_TOTAL, Kind::Counter, "Acks answered 204."),
    (CONNECTIONS_OPEN, Kind::Gauge, "Client connections open on this node (at most http.max_connections)."),
    (CONSUMER_STATE_FAILED, Kind::Gauge, "1 once the ack state of a partition on this node failed (its acks answer 503 ack_state_failed)."),
    (CONSUME_LONG_POLLS_WAITING, Kind::Gauge, "Consumes parked waiting for messages."),
    (CONSUME_EMPTY_WAKES_TOTAL, Kind::Counter, "Rounds of a long poll that a wake-up started and that found nothing."),
    (DEAD_LETTERED_TOTAL, Kind::Counter, "Messages moved to a dead-letter topic."),
    (DISPATCHER_COMMIT_RECORDS, Kind::Histogram, "Records per dispatcher commit."),
    (DISPATCHER_PENDING_RECORDS, Kind::Gauge, "Accepted records not yet committed to their partition."),
    (FANOUT_CHILD_DROPPED_MESSAGES, Kind::Counter, "Messages the child skipped because the parent's retention removed them first (since this node started)."),
    (FANOUT_CHILD_LAG_MESSAGES, Kind::Gauge, "Messages of this node's parent partitions not yet copied to the child."),
    (FANOUT_CHILD_LAG_SECONDS, Kind::Gauge, "Age of the oldest message not yet copied to the child (a delay child: how far past its due time)."),
    (REMOTE_CHILD_HEADROOM_SECONDS, Kind::Gauge, "Seconds until the oldest message not yet shipped to the remote child ages out of its parent (the parent's retention when none waits; +Inf when it keeps messages forever)."),
    (DISPATCHER_REROUTES_TOTAL, Kind::Counter, "Records rerouted around an unavailable owner."),
    (HTTP_BUFFERED_BODY_BYTES, Kind::Gauge, "Bytes of request bodies this node holds (at most http.max_buffered_body_bytes)."),
    (HTTP_REQUESTS_TOTAL, Kind::Counter, "Requests answered, by route and status."),
    (HTTP_REQUEST_SECONDS, Kind::Histogram, "Request latency."),
    (KAFKA_REQUESTS_TOTAL, Kind::Counter, "Kafka protocol requests answered, by API and error (none when it succeeded)."),
    (INGRESS_WAL_FAILED, Kind::Gauge, "1 once an ingress WAL of the node failed (its shard answers 500 to produces until restart)."),
    (NODE_ALIVE, Kind::Gauge, "1 for each member this node's controller sees alive, 0 once marked dead."),
    (PARTITION_AVAILABLE_MESSAGES, Kind::Gauge, "Messages neither leased nor acked."),
    (PARTITION_FRONTIER, Kind::Gauge, "Lowest offset not acked."),
    (PARTITION_HIGH_WATERMARK, Kind::Gauge, "Next offset of the partition."),
    (PARTITION_IN_FLIGHT, Kind::Gauge, "Messages under a lease."),
    (PARTITION_OLDEST_UNACKED_AGE_SECONDS, Kind::Gauge, "Age of the oldest unacked message."),
    (PRODUCE_DUPLICATES_TOTAL, Kind::Counter, "Produced messages found to be duplicates by their idempotency key, by topic and where (node: the node that took the produce; owner: the partition's owner)."),
    (IDEMPOTENCY_KEYS, Kind::Gauge, "Idempotency keys this node holds (at most 500000 per shard)."),
    (IDEMPOTENCY_KEYS_REROUTED_TOTAL, Kind::Counter, "Records with an idempotency key rerouted to a sibling partition, by topic: a retry of one of them may be stored twice."),
    (IDEMPOTENCY_KEYS_FORGOTTEN_TOTAL, Kind::Counter, "Idempotency keys let go before their window ended: the node's table, a shard's WAL or a partition's owner held its limit of them."),
    (RAFT_IS_LEADER, Kind::Gauge, "1 while this node is the Raft leader."),
    (RAFT_TERM, Kind::Gauge, "Current Raft term."),
    (WAL_RECORDS_PER_SYNC, Kind::Histogram, "Records per WAL fdatasync."),
    (WAL_SYNC_SECONDS, Kind::Histogram, "WAL fdatasync latency."),
    (WAL_USED_BYTES, Kind::Gauge, "Bytes of the ingress WAL ring in use."),
    (MOVES_IN_PROGRESS, Kind::Gauge, "Partition moves this node runs as their destination."),
    (MOVE_COPIED_BYTES_TOTAL, Kind::Counter, "Bytes partition moves copied to this node."),
    (MOVE_FREEZE_SECONDS, Kind::Histogram, "How long a move's partition stayed frozen for its handover."),
    (QUARANTINED_PARTITIONS_TOTAL, Kind::Counter, "Partitions this node quarantined: it held messages of a partition promoted elsewhere while it was away."),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_documented_and_named_once() {
        let docs = include_str!("../../docs/metrics.md");
        for (name, _, help) in ALL {
            assert!(!help.is_empty(), "{name} has no help text");
            assert!(name.starts_with("narad_"), "{name}");
            assert!(docs.contains(name), "{name} is not in docs/metrics.md");
        }
        let mut sorted: Vec<&str> = ALL.iter().map(|(name, _, _)| *name).collect();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ALL.len(), "a metric name defined twice");
    }
}
