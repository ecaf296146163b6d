//! Every limit, interval and timeout of the broker, in one place, with the
//! relations between them checked at compile time. (The storage engine's
//! are in `narad_storage::limits`; the metastore's beside its node.)

use std::time::Duration;

use narad_storage::limits::{BATCH_BYTES_MAX, BATCH_RECORDS_MAX};

// ------------------------------------------------------------ messages

/// The contract's retention floor: a topic keeps a message at least an
/// hour (or forever). `topics.retention_floor_ms` may raise it; only a node
/// started with `testing.short_retention` may lower it.
pub const RETENTION_FLOOR_MS: u64 = 3_600_000;
/// Default `max_message_bytes` of a topic.
pub const MAX_MESSAGE_BYTES_DEFAULT: u64 = 1024 * 1024;
/// Bits of a message id: node (16) | shard (16) | incarnation (48) |
/// sequence (48).
pub const ID_NODE_BITS: u32 = 16;
pub const ID_SHARD_BITS: u32 = 16;
pub const ID_INCARNATION_BITS: u32 = 48;
pub const ID_SEQUENCE_BITS: u32 = 48;

// ------------------------------------------------------------ dispatch

/// Largest commit batch the dispatcher sends.
pub const COMMIT_BATCH_RECORDS_MAX: usize = 4096;
pub const COMMIT_BATCH_BYTES_MAX: u64 = 8 * 1024 * 1024;
/// Commits in flight to one partition from one shard's dispatcher: the
/// second leaves once records waited `dispatcher.max_linger_ms` behind the
/// first (a slow owner), so no record waits longer than that plus one
/// commit's time. The owner takes appends in turn.
pub const COMMIT_IN_FLIGHT_PER_PARTITION: usize = 2;
/// Backoff between retries of a failed commit.
pub const COMMIT_RETRY_BACKOFF_MIN_MS: u64 = 50;
pub const COMMIT_RETRY_BACKOFF_MAX_MS: u64 = 2000;
/// `dispatcher.reroute_after_ms`: how long a destination may fail before
/// its records go to a sibling partition.
pub const REROUTE_AFTER_MS_DEFAULT: u64 = 3000;
/// A partition whose records are being rerouted is logged (at WARN) at most
/// once per this interval, with the records moved since: under load a
/// reroute moves records one at a time, thousands a second.
pub const REROUTE_LOG_INTERVAL_MS: u64 = 10_000;
/// Idempotency keys a partition's owner remembers (`owner/keys.rs`): past
/// it the oldest are let go before their window ends (counted in
/// `narad_idempotency_keys_forgotten_total`), and an owner that opens reads
/// at most this many records back for them. About 300 bytes each with a
/// 36-byte key (docs/benchmarks.md).
pub const OWNER_IDEMPOTENCY_KEYS_MAX: usize = 100_000;
/// Record ids a partition remembers to drop a repeated commit: more than
/// the largest dispatcher batch, so a whole batch sent again is caught.
pub const RECENT_IDS_MAX: usize = 8192;
/// Records written per batch when a shard adopts a removed shard's WAL.
pub const ADOPT_CHUNK_RECORDS: usize = 256;
/// How often adoption tries again while this shard's ring is full.
pub const ADOPT_FULL_RETRY: Duration = Duration::from_millis(20);
/// Rounds of claiming a produce's idempotency keys: a round after the
/// first writes the items whose first copy was let go unwritten while the
/// produce waited for it (that copy's produce failed).
pub const IDEMPOTENT_CLAIM_ROUNDS: usize = 3;
/// How often a move to a dead-letter topic tries again while this shard's
/// ring is full (the message stays parked meanwhile, not delivered again).
pub const DEAD_LETTER_FULL_RETRY: Duration = Duration::from_millis(20);

// ------------------------------------------------------------ partitions

/// Bytes of recent messages each partition keeps in memory, at most.
pub const TAIL_CACHE_BYTES: usize = 4 * 1024 * 1024;
/// Bytes of recent messages all the partitions of one shard keep together:
/// a shard with many partitions gives each an even share of it (between
/// [`TAIL_CACHE_MIN_BYTES`] and [`TAIL_CACHE_BYTES`]), so a thousand busy
/// partitions do not hold 4 GB. Consumers behind the cache read the log.
pub const TAIL_CACHE_SHARD_BYTES: usize = 256 * 1024 * 1024;
/// The smallest tail cache a partition keeps, however many share the shard.
pub const TAIL_CACHE_MIN_BYTES: usize = 16 * 1024;
/// Commit times a partition keeps for its oldest-unacked age: beyond it,
/// every other one is dropped (the age then comes from an earlier batch, so
/// it reads at most a little high), so an unconsumed partition's memory
/// stays bounded however many commits it takes.
pub const COMMIT_TIMES_MAX: usize = 1024;

const _: () = assert!(TAIL_CACHE_MIN_BYTES <= TAIL_CACHE_BYTES);
const _: () = assert!(TAIL_CACHE_BYTES <= TAIL_CACHE_SHARD_BYTES);

/// Each partition's share of its shard's tail cache when `open` are open: a
/// power of two, so it changes (and every open partition is told) only when
/// the count of open partitions doubles.
pub fn tail_cache_share(open: usize) -> usize {
    let even = TAIL_CACHE_SHARD_BYTES / open.max(1);
    let power_of_two = 1usize << (usize::BITS - 1 - even.max(1).leading_zeros());
    power_of_two.clamp(TAIL_CACHE_MIN_BYTES, TAIL_CACHE_BYTES)
}

/// How often a shard applies retention to its open partitions, on a task
/// of its own, off the path that writes acks (retention is an hour at
/// least).
pub const RETENTION_INTERVAL: Duration = Duration::from_secs(1);
/// How often a shard opens the partitions it owns that are not open yet,
/// so that retention reaches idle ones (retention is an hour at least).
pub const IDLE_PARTITION_OPEN_INTERVAL: Duration = Duration::from_secs(30);

// ------------------------------------------------------------ between shards

/// Messages one shard may have queued for another before senders wait.
pub const MESH_CHANNEL_CAPACITY: usize = 1024;
/// How long `/metrics` and `/readyz` wait for another shard's figures.
pub const GAUGES_TIMEOUT: Duration = Duration::from_secs(2);

// ------------------------------------------------------------ between nodes

/// How long `GET /v1/cluster` waits for another member to say whether it is
/// ready; one that does not answer in time is shown not ready.
pub const READINESS_CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// A dispatcher commit to a remote owner: append, fdatasync, read back
/// (milliseconds when healthy). Short, so that a dead owner is retried a
/// few times within `dispatcher.reroute_after_ms` before the reroute.
pub const COMMIT_CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// Leasing from a remote owner never waits for messages, so it answers fast.
pub const COLLECT_CALL_TIMEOUT: Duration = Duration::from_millis(1500);
/// Asking another node for more once a consume already holds leases: the
/// client's leases are running, so a node that does not answer soon (down but
/// not yet known to be) is not waited for. Leases it granted after all come
/// back when their visibility timeout ends.
pub const COLLECT_TOP_UP_TIMEOUT: Duration = Duration::from_millis(50);
pub const SETTLE_CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long an ack, nack or extend of a partition frozen for its handover
/// waits for the freeze to end (a freeze usually lasts milliseconds) before
/// it is answered 503 `partition_moving`: within a caller's
/// [`SETTLE_CALL_TIMEOUT`], so a settle sent on from another node is
/// answered rather than timed out.
pub const SETTLE_FREEZE_WAIT: Duration = Duration::from_millis(1500);
const _: () = assert!(SETTLE_FREEZE_WAIT.as_millis() < SETTLE_CALL_TIMEOUT.as_millis());
/// Figures are a convenience of describe (and of the answer to a topic
/// PUT): a node that does not answer quickly leaves its figures at zero.
pub const STATS_CALL_TIMEOUT: Duration = Duration::from_millis(300);
/// A topic change answers once this node applied it too (so the next
/// request here sees it), waiting at most this long for that.
pub const LOCAL_APPLY_WAIT: Duration = Duration::from_secs(5);
pub const AVAILABLE_CALL_TIMEOUT: Duration = Duration::from_millis(500);
/// A shard tells other nodes "messages are available here" at most this
/// often; everything that became available in between rides along.
pub const AVAILABLE_COALESCE: Duration = Duration::from_millis(2);
/// A notice to another node names at most this many topics that gained
/// messages; past it, the notice wakes every long poll of that node.
pub const GAINED_TOPICS_MAX: usize = 256;
/// A node that answered "nothing available" is asked again after this
/// long even without hearing that it has messages (a lost notice costs at
/// most this much).
pub const EMPTY_HINT_TTL_MS: u64 = 1000;
/// A node that did not answer a consume is skipped by unpinned consumes
/// for this long.
pub const UNREACHABLE_BACKOFF_MS: u64 = 1000;
/// Requests of other nodes a node holds at once (queued for a shard or
/// being answered). Over it a request is answered `overloaded` at once: the
/// caller's dispatcher backs off and retries, a consume moves on, so a
/// flood from peers cannot grow this node's memory without bound.
pub const INBOX_REQUESTS_MAX: usize = 8192;

// ------------------------------------------------------------ start and stop

/// How long a clustered node waits for a leader before it serves anyway.
pub const CLUSTER_CATCH_UP_WAIT: Duration = Duration::from_secs(2);
/// How long a starting node waits for its metastore to replay its log.
pub const META_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);
/// How soon after the start a shard opens its idle partitions (for
/// retention), leaving the start itself to serving.
pub const IDLE_PARTITION_FIRST_OPEN: Duration = Duration::from_secs(1);
/// How often a shard looks at the stop flag.
pub const STOP_POLL_INTERVAL: Duration = Duration::from_millis(20);
/// How long a graceful stop waits for the dispatcher to drain.
pub const STOP_DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// How often the drain looks again when nothing woke it.
pub const STOP_DRAIN_POLL: Duration = Duration::from_millis(50);
/// How long a stopping shard waits for the others at each stop barrier.
pub const STOP_BARRIER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stopped shard waits for its dispatcher's last round; records
/// the drain gave up on stay in the WAL for the next start.
pub const STOP_DISPATCHER_WAIT: Duration = Duration::from_secs(1);

// ------------------------------------------------------------ security

/// Longest user name (`[A-Za-z0-9._@-]`).
pub const USER_NAME_BYTES_MAX: usize = 128;
/// Longest password a user may be given.
pub const PASSWORD_BYTES_MAX: usize = 1024;
/// Password hashes (argon2id, tens of ms each) a shard runs at once; a
/// login beyond them answers `429 overloaded`.
pub const PASSWORD_CHECKS_MAX: usize = 4;
/// Passwords a shard remembers as verified before it forgets them all.
pub const VERIFIED_PASSWORDS_MAX: usize = 4096;
/// How often a node that bootstraps the user `admin` tries again while the
/// metastore has no leader.
pub const ADMIN_BOOTSTRAP_RETRY: Duration = Duration::from_millis(500);
/// Largest JSON Schema document a schema version may hold.
pub const SCHEMA_DOCUMENT_BYTES_MAX: usize = 1024 * 1024;
/// Records a child copies per commit to its partitions (a repeat of a
/// whole copy is still recognised by the child's owner).
pub const CHILD_COPY_RECORDS_MAX: usize = 1024;
/// Bytes of values a child copies per commit, about.
pub const CHILD_COPY_BYTES_MAX: usize = 4 * 1024 * 1024;
/// How often an idle copy looks again without being woken (a deleted link,
/// retention, a delay coming due).
pub const CHILD_IDLE_RECHECK: Duration = Duration::from_secs(1);
/// Backoff of a copy whose commit to the child failed.
pub const CHILD_RETRY_BACKOFF_MIN: Duration = Duration::from_millis(50);
pub const CHILD_RETRY_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// A new child's cursor starts at the first message accepted at most this
/// long before the child was created (clocks of nodes differ a little), so
/// no message accepted after it is missed by an owner that learned of the
/// child late.
pub const CHILD_START_CLOCK_SLACK_MS: u64 = 1000;
/// A copy whose oldest uncopied message is older than this is `behind`.
pub const CHILD_BEHIND_AFTER_MS: u64 = 10_000;
/// A copy stores its cursor at most this often while it copies (and
/// whenever it catches up, stops or fails): after a crash, at most this
/// much is copied again.
pub const CHILD_CURSOR_STORE_INTERVAL: Duration = Duration::from_millis(50);
/// Sighting marks a delay copy keeps before it halves them (each pair as
/// its later mark): a long delay on a busy partition stays within memory,
/// its copies a little later, never earlier.
pub const CHILD_OBSERVED_MARKS_MAX: usize = 4096;
/// A delay copy notes when commits became visible at most this often.
pub const CHILD_OBSERVED_COALESCE_MS: u64 = 50;
/// A remote child's batch (one request of the remote's batch produce API):
/// at most this many messages and about this many bytes of keys and
/// values; with a rate, at most `REMOTE_RATE_BATCH_DIVISOR`th of a
/// second's share.
pub const REMOTE_SHIP_RECORDS_MAX: usize = 1000;
pub const REMOTE_SHIP_BYTES_MAX: usize = 1024 * 1024;
pub const REMOTE_RATE_BATCH_DIVISOR: u64 = 4;
/// How long one request to a remote cluster may take; one without an
/// answer by then is sent again (the remote may hold it twice).
pub const REMOTE_SHIP_TIMEOUT: Duration = Duration::from_secs(10);
/// A remote child's lane (its client and connections) unused this long is
/// let go: its child may have been deleted, and a live one gets a new lane
/// with its next batch.
pub const REMOTE_LANE_IDLE: Duration = Duration::from_secs(300);
/// Backoff of a remote copy whose request failed, with full jitter.
pub const REMOTE_RETRY_BACKOFF_MIN: Duration = Duration::from_millis(100);
pub const REMOTE_RETRY_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Requests in flight per node to each remote child
/// (`children.remote_max_in_flight`): its default and its largest value.
pub const REMOTE_MAX_IN_FLIGHT_DEFAULT: u64 = 4;
pub const REMOTE_MAX_IN_FLIGHT_MAX: u64 = 1024;
/// Messages a redrive moves per batch (leased, written, acked together).
pub const REDRIVE_BATCH_MAX: usize = 100;
/// How long a redrive's lease on a dead-letter message lasts: past it, a
/// message whose move was cut short is delivered again.
pub const REDRIVE_VISIBILITY_MS: u64 = 30_000;
/// A redrive that finds only leased messages looks again after this.
pub const REDRIVE_WAIT_MS: u64 = 200;
/// A redrive ends once its topic stayed empty this long (messages accepted
/// just before may still be on their way to their partitions).
pub const REDRIVE_EMPTY_GRACE: Duration = Duration::from_secs(1);
/// How often a running redrive records its progress in the metastore.
pub const REDRIVE_PROGRESS_INTERVAL: Duration = Duration::from_secs(1);
/// A redrive batch that failed is tried again after this.
pub const REDRIVE_RETRY: Duration = Duration::from_millis(500);

// ------------------------------------------------------------ Kafka listener

/// The largest request frame the Kafka listener reads (a Produce request
/// of many partitions included); a longer length prefix closes the
/// connection before its body is read. Kafka's own default
/// (`socket.request.max.bytes`) is 100 MiB; clients send at most
/// `message.max.bytes`, 1 MB by default.
pub const KAFKA_REQUEST_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Requests of one connection answered side by side (Kafka clients send up
/// to 5 without waiting); beyond it the listener reads no more until the
/// oldest is answered, and answers always go out in request order.
pub const KAFKA_IN_FLIGHT_PER_CONNECTION: usize = 16;
/// A connection with no request under way this long is closed (Kafka's
/// `connections.max.idle.ms` default; clients connect again).
pub const KAFKA_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// A Kafka connection's TLS handshake finishes within this, or the
/// connection closes.
pub const KAFKA_TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The throttle time a Produce answer asks for when the node sheds load
/// (HTTP's `429 overloaded`).
pub const KAFKA_OVERLOAD_THROTTLE_MS: i32 = 100;
/// Share-group members: the heartbeat interval a member is told, and how
/// long a member may go unheard before it leaves (its records are given
/// back). Kafka's defaults (`group.share.heartbeat.interval.ms`,
/// `group.share.session.timeout.ms`).
pub const SHARE_HEARTBEAT_INTERVAL_MS: i32 = 5_000;
pub const SHARE_MEMBER_TIMEOUT: Duration = Duration::from_secs(45);
/// Share sessions a node holds at once (Kafka's
/// `group.share.max.share.sessions` default): beyond it a new session is
/// `SHARE_SESSION_LIMIT_REACHED`.
pub const SHARE_SESSIONS_MAX: usize = 2_000;
/// Records one ShareFetch leases: what the client asks (`max.poll.records`),
/// at most the most one consume takes; the default when it asks none.
pub const SHARE_FETCH_RECORDS_MAX: u64 = 1_000;
pub const SHARE_FETCH_RECORDS_DEFAULT: u64 = 500;
/// Offsets the acknowledgement ranges of one request may cover in all (a
/// range is walked offset by offset): far more than a session holds.
pub const SHARE_ACK_OFFSETS_PER_REQUEST_MAX: u64 = 100_000;
/// The longest a ShareFetch waits for records (a consume's longest wait).
pub const SHARE_FETCH_WAIT_MS_MAX: u64 = 20_000;
/// How often a node that has not yet recorded its Kafka address in the
/// metastore tries again (no quorum, no leader yet).
pub const KAFKA_ADDRESS_RETRY: Duration = Duration::from_secs(1);
/// A signed-in Kafka connection with no request under way checks this
/// often that its credentials still hold (it is closed once they do not).
pub const KAFKA_SESSION_CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// Metadata asks an owner that it would name as a partition's leader
/// whether it answers, at most this often (a probe waits at most
/// `READINESS_CALL_TIMEOUT`); one that has not answered for
/// `dispatcher.reroute_after_ms` is not named.
pub const KAFKA_LEADER_PROBE_INTERVAL_MS: u64 = 1_000;
/// A REJECTed share record's lock is held this long while its copy is
/// written to the dead-letter topic (a WAL append takes milliseconds).
pub const KAFKA_REJECT_HOLD_MS: u64 = 30_000;
/// Idempotent producer ids whose newest epoch a node remembers (to refuse
/// an older epoch's records): between half this and this many, the most
/// recently new ones; about 40 bytes each.
pub const KAFKA_PRODUCER_EPOCHS_MAX: usize = 200_000;

// ------------------------------------------------------------ relations

// A message id is exactly 128 bits.
const _: () = assert!(ID_NODE_BITS + ID_SHARD_BITS + ID_INCARNATION_BITS + ID_SEQUENCE_BITS == 128);
// Every commit in flight to a partition, sent again, is recognised as a
// repeat.
const _: () = assert!(RECENT_IDS_MAX >= COMMIT_IN_FLIGHT_PER_PARTITION * COMMIT_BATCH_RECORDS_MAX);
// A commit batch fits one partition-log batch.
const _: () = assert!(COMMIT_BATCH_RECORDS_MAX as u64 <= BATCH_RECORDS_MAX as u64);
const _: () = assert!(COMMIT_BATCH_BYTES_MAX <= BATCH_BYTES_MAX);
const _: () = assert!(COMMIT_RETRY_BACKOFF_MIN_MS <= COMMIT_RETRY_BACKOFF_MAX_MS);
// A dead owner is retried more than once before its records are rerouted.
const _: () = assert!(2 * COMMIT_CALL_TIMEOUT.as_millis() < REROUTE_AFTER_MS_DEFAULT as u128);
const _: () = assert!(COMMIT_RETRY_BACKOFF_MAX_MS < REROUTE_AFTER_MS_DEFAULT);
// A top-up never waits longer than a first ask.
const _: () = assert!(COLLECT_TOP_UP_TIMEOUT.as_millis() < COLLECT_CALL_TIMEOUT.as_millis());
// The drain ends before the other shards give up waiting at the barrier.
const _: () = assert!(STOP_DRAIN_TIMEOUT.as_millis() < STOP_BARRIER_TIMEOUT.as_millis());
// Idle partitions are opened soon after the start, then periodically.
const _: () =
    assert!(IDLE_PARTITION_FIRST_OPEN.as_millis() < IDLE_PARTITION_OPEN_INTERVAL.as_millis());
// A whole child copy sent again is recognised as a repeat by the child's owner.
const _: () = assert!(RECENT_IDS_MAX > CHILD_COPY_RECORDS_MAX);
const _: () = assert!(CHILD_COPY_RECORDS_MAX as u64 <= BATCH_RECORDS_MAX as u64);
const _: () = assert!((CHILD_COPY_BYTES_MAX as u64) < BATCH_BYTES_MAX);
const _: () = assert!(CHILD_RETRY_BACKOFF_MIN.as_millis() <= CHILD_RETRY_BACKOFF_MAX.as_millis());
const _: () = assert!(REMOTE_RETRY_BACKOFF_MIN.as_millis() <= REMOTE_RETRY_BACKOFF_MAX.as_millis());
// A remote batch fits the batch produce API of any Narad.
const _: () = assert!(REMOTE_SHIP_RECORDS_MAX <= narad_net::batch::BATCH_MESSAGES_MAX);

/// A move reads at most this many bytes of its source in one call.
pub const MOVE_CHUNK_BYTES: u64 = 1 << 20;
/// A move freezes its partition once it lacks less than this of the
/// source's log: what the freeze copies is short.
pub const MOVE_FREEZE_BELOW_BYTES: u64 = 512 * 1024;
/// A source frozen this long without a handover abandons the move and
/// serves the partition again.
pub const MOVE_FREEZE_MAX: Duration = Duration::from_secs(10);
/// How often a destination held by the `hold_move_freeze` test switch looks
/// whether it was lifted.
pub const MOVE_HOLD_POLL: Duration = Duration::from_millis(10);
/// Lease ids each opening of a partition owner takes from its shard's
/// range (an owner that grants more ids than this within one opening
/// would repeat the next owner's receipts: 4 billion leases).
pub const LEASE_IDS_PER_OPEN: u64 = 1 << 32;
/// A decommission whose moves were abandoned plans its remaining
/// partitions again at most this often.
pub const DECOMMISSION_REPLAN_INTERVAL_MS: u64 = 5_000;
/// How often each shard looks for moves to start or resume.
pub const MOVE_POLL_INTERVAL: Duration = Duration::from_millis(500);
/// How often a running move records its progress in the metastore.
pub const MOVE_PROGRESS_INTERVAL_MS: u64 = 1_000;
/// How long one call of a move to its source may take.
pub const MOVE_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a move waiting on its source looks whether the source has
/// been dead long enough for a promotion (a promotion comes at most this
/// late).
pub const MOVE_PROMOTION_CHECK: Duration = Duration::from_millis(100);
/// A move whose source does not answer tries again after this, doubling.
pub const MOVE_RETRY_BACKOFF_MIN: Duration = Duration::from_millis(50);
pub const MOVE_RETRY_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Moves one plan may hold.
pub const MOVES_PER_PLAN_MAX: usize = 10_000;

/// Connections the kernel queues for a shard's client listener before the
/// shard accepts them.
pub const CLIENT_LISTEN_BACKLOG: i32 = 1024;

/// A commit of records a crashed node's WAL gave back first recalls what
/// its partition's log holds from a little before their write times: the
/// log is read back from its end in steps of this many records ...
pub const RECALL_STEP_RECORDS: usize = 256;
/// ... until a step starts this long before the oldest of those write
/// times (commits from other shards and nodes land out of write order) ...
pub const RECALL_REORDER_SLACK_MS: u64 = 60_000;
/// ... or this many bytes of values were read (what is older is not
/// recalled, and may be stored twice, as the contract allows).
pub const RECALL_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Journal records recovered from the WAL are appended again in batches of
/// at most this many records ...
pub const JOURNAL_REPLAY_BATCH_RECORDS: usize = 256;
/// ... and about this many bytes of values.
pub const JOURNAL_REPLAY_BATCH_BYTES: usize = 8 * 1024 * 1024;
/// A journal batch takes the produces queued for its partition up to about
/// this many bytes of values (a larger request goes alone).
pub const JOURNAL_BATCH_BYTES: usize = 1024 * 1024;
/// How often a shard syncs and reads back what its partitions' logs wrote
/// behind for the owner journal, so the WAL can reclaim the journal copies.
pub const JOURNAL_SYNC_INTERVAL: std::time::Duration = std::time::Duration::from_millis(50);
/// How often a shard looks again for partitions whose recovered journal
/// records wait for the metadata or an open.
pub const JOURNAL_REPLAY_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// Messages a browse answers when the request names no `limit`.
pub const BROWSE_LIMIT_DEFAULT: u32 = 20;
/// The most messages one browse or search answers (`limit`: 1 to this).
pub const BROWSE_LIMIT_MAX: u32 = 1000;
/// Bytes of values a page of a browse holds at most (at least one
/// message): a thousand large messages do not make one answer of a
/// gigabyte.
pub const BROWSE_BYTES_MAX: usize = 4 << 20;
/// Messages one search call looks at in each partition, at most; a cursor
/// goes on from where it stopped.
pub const SEARCH_SCAN_MAX: usize = 10_000;
/// ... and bytes of values: a partition of large messages stops sooner.
pub const SEARCH_SCAN_BYTES_MAX: usize = 64 << 20;
/// A search reads a partition this many messages (and bytes of values) at
/// a time.
pub const SEARCH_READ_RECORDS: usize = 2048;
pub const SEARCH_READ_BYTES: usize = 4 << 20;
/// How long a search waits for another node's owners (each scans up to
/// `SEARCH_SCAN_MAX` messages of each of its partitions): then 502.
pub const SEARCH_CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a browse waits for another node's owner: then 502.
pub const BROWSE_CALL_TIMEOUT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_with_many_partitions_gives_each_a_smaller_tail_cache_within_its_budget() {
        assert_eq!(tail_cache_share(0), TAIL_CACHE_BYTES);
        assert_eq!(tail_cache_share(16), TAIL_CACHE_BYTES);
        assert_eq!(tail_cache_share(64), TAIL_CACHE_BYTES);
        assert_eq!(tail_cache_share(65), TAIL_CACHE_BYTES / 2);
        assert_eq!(tail_cache_share(1000), 256 * 1024);
        assert_eq!(tail_cache_share(1_000_000), TAIL_CACHE_MIN_BYTES);
        for open in 1..5000 {
            let share = tail_cache_share(open);
            assert!(share.is_power_of_two());
            assert!(
                share * open <= TAIL_CACHE_SHARD_BYTES || share == TAIL_CACHE_MIN_BYTES,
                "{open} partitions of {share} bytes each"
            );
        }
    }
}
