//! The storage layer's one error type.

use std::io;
use std::path::PathBuf;
use std::rc::Rc;

pub type Result<T, E = StorageError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error, Clone)]
pub enum StorageError {
    /// An I/O operation failed. The component that hit it is failed for good
    /// (a failed write or fsync is never retried into a success).
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: Rc<io::Error>,
    },
    /// The ingress WAL failed earlier and accepts nothing until restart.
    #[error("ingress WAL failed earlier ({reason}); restart the node")]
    WalFailed { reason: String },
    /// The ingress WAL ring has no room until committed records are reclaimed.
    #[error("ingress WAL ring full: {needed_bytes} bytes needed, {free_bytes} free")]
    WalFull { needed_bytes: u64, free_bytes: u64 },
    /// A record, key, topic or batch is larger than the engine allows.
    #[error("{what} of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        what: &'static str,
        len: u64,
        max: u64,
    },
    /// A batch read back after its fsync did not verify.
    #[error("read-back of {path} at {pos} failed verification: {detail}")]
    VerifyFailed {
        path: PathBuf,
        pos: u64,
        detail: String,
    },
    /// Configuration that cannot work.
    #[error("invalid storage config: {0}")]
    InvalidConfig(String),
    /// An on-disk file has a format this build cannot read.
    #[error("{path}: {detail}")]
    BadFormat { path: PathBuf, detail: String },
    /// The component was closed.
    #[error("{0} is closed")]
    Closed(&'static str),
}

impl StorageError {
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source: Rc::new(source),
        }
    }

    /// The raw OS error of an I/O failure, if there is one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Self::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}
