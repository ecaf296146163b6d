//! The file I/O seam. Every byte the engine stores goes through
//! [`FileSystem`] and [`StorageFile`]; [`glommio_fs`] is the real O_DIRECT
//! implementation and [`sim`] an in-memory disk that loses unsynced writes,
//! tears writes, flips bits and fails operations on command.
//!
//! The traits use `async fn` on purpose without `Send` bounds: the engine runs
//! on one glommio shard and never crosses threads.
#![allow(async_fn_in_trait)]

pub mod blocking;
pub mod faulty;
pub mod glommio_fs;
pub mod sim;

use std::io;
use std::path::Path;

/// How a file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenMode {
    /// Create the file if it does not exist.
    pub create: bool,
    /// O_DIRECT: writes must be block-aligned in position and length.
    pub direct: bool,
}

impl OpenMode {
    pub const CREATE_DIRECT: Self = Self {
        create: true,
        direct: true,
    };
    pub const EXISTING_DIRECT: Self = Self {
        create: false,
        direct: true,
    };
    pub const CREATE_BUFFERED: Self = Self {
        create: true,
        direct: false,
    };
    pub const EXISTING_BUFFERED: Self = Self {
        create: false,
        direct: false,
    };
}

pub trait StorageFile {
    /// Writes all of `data` at `pos`. A short write is an error.
    async fn write_at(&self, data: &[u8], pos: u64) -> io::Result<()>;
    /// Reads up to `len` bytes at `pos`; fewer only at the end of the file.
    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>>;
    /// Reads `expected.len()` bytes at `pos` and says whether they are
    /// exactly `expected` (a short read is not). A file that can compare in
    /// its own buffer, without a copy, does.
    async fn read_equals(&self, pos: u64, expected: &[u8]) -> io::Result<bool> {
        Ok(self.read_at(pos, expected.len()).await? == expected)
    }
    /// fdatasync: everything written before it is durable once it returns Ok.
    async fn sync_data(&self) -> io::Result<()>;
    async fn size(&self) -> io::Result<u64>;
}

pub trait FileSystem: Clone + 'static {
    type File: StorageFile + 'static;
    async fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Self::File>;
    async fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// fsync of a directory, making created, renamed and removed entries durable.
    async fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Names of the entries (files and directories) directly in `path`, sorted.
    async fn list_dir(&self, path: &Path) -> io::Result<Vec<String>>;
    async fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Removes a folder and everything under it, durably (its parent is
    /// synced), without blocking the caller's executor. A missing folder is
    /// not an error.
    async fn remove_dir_all(&self, path: &Path) -> io::Result<()>;
    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    async fn exists(&self, path: &Path) -> io::Result<bool>;
}
