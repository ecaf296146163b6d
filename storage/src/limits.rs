//! Every limit and default interval of the storage engine, in one place.

/// Alignment of every O_DIRECT write and of every flush boundary. A flush
/// always starts on a fresh block, so no fsynced byte is ever rewritten.
pub const BLOCK_BYTES: u64 = 4096;
/// Granularity at which the simulated disk tears a write on power loss.
pub const SECTOR_BYTES: u64 = 512;

/// Default size of one shard's ingress WAL ring (`storage.wal_ring_bytes`).
pub const WAL_RING_BYTES_DEFAULT: u64 = 256 * 1024 * 1024;
/// Smallest ring we accept: a few records plus a checkpoint's worth of slack.
pub const WAL_RING_BYTES_MIN: u64 = 64 * 1024;
/// Idempotency keys one ring holds at most; past it the oldest is let go
/// before its window ends (the node then forgets it early).
pub const IDEMPOTENCY_KEYS_PER_SHARD_MAX: usize = 500_000;
/// Interval of the dispatcher checkpoint (`dispatcher.checkpoint_interval_ms`).
pub const WAL_CHECKPOINT_INTERVAL_MS_DEFAULT: u64 = 250;

/// Default segment size of a partition log (`storage.segment_bytes`).
pub const SEGMENT_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
/// A segment grows in preallocated, written-through steps of at most this
/// size: each step is as large as what the segment already holds, from
/// [`SEGMENT_PREALLOC_FIRST_BYTES`] on, so a partition that holds little
/// takes little disk (a thousand quiet partitions do not hold 4 GB of
/// zeros) and a busy one soon grows in whole steps.
pub const SEGMENT_PREALLOC_STEP_BYTES_DEFAULT: u64 = 4 * 1024 * 1024;
/// The first preallocation of a segment (at most the step).
pub const SEGMENT_PREALLOC_FIRST_BYTES: u64 = 64 * 1024;
/// Largest number of records in one partition-log batch.
pub const BATCH_RECORDS_MAX: u32 = 65_536;
/// Largest encoded partition-log batch.
pub const BATCH_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// Messages appended behind wait in memory, to be written as one batch,
/// until they would make a batch larger than this (or a sync comes).
pub const BEHIND_WRITE_BYTES_MAX: u64 = 1024 * 1024;
/// An owner reading back its partition's recent idempotency keys at open
/// reads neighbouring batches of at most `KEYS_GROUP_BATCH_BYTES_MAX`
/// together, up to this many bytes at a time; a larger batch is read only
/// in its header and keys, not its values.
pub const KEYS_READ_BYTES: u64 = 1024 * 1024;
pub const KEYS_GROUP_BATCH_BYTES_MAX: u64 = 4 * BLOCK_BYTES;

/// Acks reach the OS within this interval (`storage.ack_flush_interval_ms`).
pub const ACK_FLUSH_INTERVAL_MS_DEFAULT: u64 = 100;
/// Acks reach the disk within this interval
/// (`storage.consumer_offset_commit_interval_ms`).
pub const CONSUMER_OFFSET_COMMIT_INTERVAL_MS_DEFAULT: u64 = 1000;
/// The ack log is compacted into a snapshot once it holds this many bytes.
pub const ACK_LOG_COMPACT_BYTES_DEFAULT: u64 = 1024 * 1024;

/// Largest key of one message.
pub const KEY_BYTES_MAX: usize = 64 * 1024;
/// Largest topic name (the HTTP API's topic names: `[A-Za-z0-9._-]{1,249}`).
pub const TOPIC_NAME_BYTES_MAX: usize = 249;

/// Chunk size used when scanning files during recovery.
pub const RECOVERY_READ_CHUNK_BYTES: usize = 1024 * 1024;

const _: () = assert!(WAL_RING_BYTES_DEFAULT % BLOCK_BYTES == 0);
const _: () = assert!(WAL_RING_BYTES_MIN % BLOCK_BYTES == 0);
const _: () = assert!(SEGMENT_BYTES_DEFAULT % BLOCK_BYTES == 0);
const _: () = assert!(SEGMENT_PREALLOC_STEP_BYTES_DEFAULT % BLOCK_BYTES == 0);
const _: () = assert!(SEGMENT_PREALLOC_STEP_BYTES_DEFAULT <= SEGMENT_BYTES_DEFAULT);
const _: () = assert!(SEGMENT_PREALLOC_FIRST_BYTES % BLOCK_BYTES == 0);
const _: () = assert!(SEGMENT_PREALLOC_FIRST_BYTES <= SEGMENT_PREALLOC_STEP_BYTES_DEFAULT);
const _: () = assert!(BLOCK_BYTES % SECTOR_BYTES == 0);
const _: () = assert!(ACK_FLUSH_INTERVAL_MS_DEFAULT <= CONSUMER_OFFSET_COMMIT_INTERVAL_MS_DEFAULT);
