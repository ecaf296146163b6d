//! # narad-storage
//!
//! Narad keeps one copy of each message, so this crate's fsyncs and checksums
//! are the whole of its durability. It provides:
//!
//! - [`wal`]: the per-shard ingress WAL ring with group commit. A produce is
//!   answered 202 once the fdatasync that covers its record returned.
//! - [`log`]: partition logs of checksummed record batches in segments; an
//!   append is written, fdatasynced and read back verified before the high
//!   watermark moves.
//! - [`consumer`]: per-partition ack state (frontier plus acked ranges above
//!   it) with a batched ack log and snapshots.
//! - [`io`]: the file seam. The engine runs against real O_DIRECT files on
//!   glommio or against a simulated disk that loses unsynced writes, tears and
//!   corrupts writes and fails operations, deterministically from a seed.
//!
//! ## Invariants
//! - A byte range that an fsync made durable is never rewritten in place.
//! - Every record carries a crc32c; a record whose checksum fails is never returned.
//! - A damaged record never stops recovery of the valid records after it; a
//!   torn tail (bytes past the last durable write) is truncated.
//! - A failed write or fsync is never retried into a success.
//! - Recovery is idempotent.
//!
//! ## Prerequisites
//! The real file system needs io_uring (Linux ≥ 5.8) and a glommio executor.
//! glommio registers `io_memory` with io_uring: as a non-root user raise
//! `LimitMEMLOCK` (systemd) or the container's memlock limit.

pub mod clock;
pub mod codec;
pub mod consumer;
pub mod cursor;
pub mod error;
pub mod frame;
pub mod io;
pub mod limits;
pub mod log;
pub mod metric_names;
pub mod rng;
mod util_fs;
pub mod wal;

pub use error::{Result, StorageError};
