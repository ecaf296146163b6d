//! The real disk: O_DIRECT files through glommio's io_uring DMA API, and
//! buffered files for the small consumer-state logs.
//!
//! Must run inside a glommio executor. Directory listing, creation and
//! existence checks use `std::fs`: they are rare (startup, partition
//! creation), tiny and have no io_uring form in glommio 0.9.

use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::io::{BufferedFile, DmaFile, OpenOptions};

use super::{FileSystem, OpenMode, StorageFile};
use crate::limits::BLOCK_BYTES;

/// Name of the marker file that [`GlommioFs::new`] writes and opens first.
pub const IO_PROBE_FILE_NAME: &str = ".narad-io-probe";

/// The real file system. Create it with [`GlommioFs::new`] before opening
/// any other DMA file in the process.
#[derive(Debug, Clone, Default)]
pub struct GlommioFs {
    _private: (),
}

impl GlommioFs {
    /// Prepares `data_dir` and makes the first DMA file this process opens one
    /// that already holds data. glommio probes the disk's capabilities with
    /// the first DMA file it opens; probing a new, empty file gets it wrong and
    /// makes every later O_DIRECT read of the process fail with EOPNOTSUPP.
    pub async fn new(data_dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(data_dir)?;
        // One probe file per call: shards of one node start together, and a
        // probe another shard is rewriting would be read empty.
        static PROBES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let probe = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let probe_path = data_dir.join(format!("{IO_PROBE_FILE_NAME}-{probe}"));
        let block = vec![0x4e_u8; usize::try_from(BLOCK_BYTES).unwrap_or(4096)];
        std::fs::write(&probe_path, &block)?;
        std::fs::File::open(&probe_path)?.sync_all()?;
        let probe = OpenOptions::new()
            .read(true)
            .dma_open(&probe_path)
            .await
            .map_err(io::Error::from)?;
        let read = probe
            .read_at_aligned(0, block.len())
            .await
            .map_err(io::Error::from)?;
        probe.close().await.map_err(io::Error::from)?;
        let _ = std::fs::remove_file(&probe_path);
        if read.len() != block.len() {
            return Err(io::Error::other("O_DIRECT probe read came back short"));
        }
        Ok(Self { _private: () })
    }
}

/// Buffered writes up to this size are made on the shard's thread (a
/// `pwrite`: a copy into the page cache, microseconds). Through io_uring,
/// ext4 hands a buffered write to the kernel's worker threads, where it
/// queues behind every fdatasync the node has in flight: with 1,000
/// partitions syncing, an ack log's 100-byte write took up to 270 ms and
/// acks missed their `storage.ack_flush_interval_ms`. Larger writes (a
/// moved segment) may wait for dirty-page throttling, so they stay on
/// io_uring.
const INLINE_BUFFERED_WRITE_BYTES: usize = 64 * 1024;

/// Writes `data` at `pos` of a buffered file with `pwrite` on this thread.
fn write_into_page_cache(file: &BufferedFile, data: &[u8], pos: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::{AsRawFd, FromRawFd};
    // SAFETY: the descriptor belongs to `file`, which outlives this call;
    // `ManuallyDrop` keeps the borrowed `File` from closing it.
    let borrowed =
        std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(file.as_raw_fd()) });
    borrowed.write_all_at(data, pos)
}

/// An open file: O_DIRECT or buffered.
pub enum GlommioFile {
    Direct {
        file: Rc<DmaFile>,
        path: PathBuf,
    },
    Buffered {
        file: Rc<BufferedFile>,
        path: PathBuf,
    },
}

impl StorageFile for GlommioFile {
    async fn write_at(&self, data: &[u8], pos: u64) -> io::Result<()> {
        let written = match self {
            Self::Direct { file, .. } => {
                let mut buf = file.alloc_dma_buffer(data.len());
                buf.as_bytes_mut().copy_from_slice(data);
                file.write_at(buf, pos).await.map_err(io::Error::from)?
            }
            Self::Buffered { file, .. } if data.len() <= INLINE_BUFFERED_WRITE_BYTES => {
                write_into_page_cache(file, data, pos)?;
                data.len()
            }
            Self::Buffered { file, .. } => file
                .write_at(data.to_vec(), pos)
                .await
                .map_err(io::Error::from)?,
        };
        if written != data.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write: {written} of {} bytes", data.len()),
            ));
        }
        Ok(())
    }

    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        let read = match self {
            Self::Direct { file, .. } => file.read_at(pos, len).await.map_err(io::Error::from)?,
            Self::Buffered { file, .. } => file.read_at(pos, len).await.map_err(io::Error::from)?,
        };
        Ok(read.to_vec())
    }

    async fn read_equals(&self, pos: u64, expected: &[u8]) -> io::Result<bool> {
        let read = match self {
            Self::Direct { file, .. } => file.read_at(pos, expected.len()).await,
            Self::Buffered { file, .. } => file.read_at(pos, expected.len()).await,
        };
        Ok(*read.map_err(io::Error::from)? == *expected)
    }

    async fn sync_data(&self) -> io::Result<()> {
        match self {
            Self::Direct { file, .. } => file.fdatasync().await.map_err(io::Error::from),
            Self::Buffered { file, .. } => file.fdatasync().await.map_err(io::Error::from),
        }
    }

    async fn size(&self) -> io::Result<u64> {
        match self {
            Self::Direct { file, .. } => file.file_size().await.map_err(io::Error::from),
            Self::Buffered { file, .. } => file.file_size().await.map_err(io::Error::from),
        }
    }
}

impl std::fmt::Debug for GlommioFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Direct { path, .. } => write!(f, "DirectFile({})", path.display()),
            Self::Buffered { path, .. } => write!(f, "BufferedFile({})", path.display()),
        }
    }
}

impl FileSystem for GlommioFs {
    type File = GlommioFile;

    async fn open(&self, path: &Path, mode: OpenMode) -> io::Result<GlommioFile> {
        let mut options = OpenOptions::new();
        options.read(true).write(true).create(mode.create);
        if mode.direct {
            // glommio's `dma_open` unwraps a `statfs` of the path after
            // opening it, so a file must not be removed while it opens: the
            // broker removes a folder only once nothing that writes in it
            // is left (a deleted topic's, after its owners' last append).
            let file = options.dma_open(path).await.map_err(io::Error::from)?;
            Ok(GlommioFile::Direct {
                file: Rc::new(file),
                path: path.to_path_buf(),
            })
        } else {
            let file = options.buffered_open(path).await.map_err(io::Error::from)?;
            Ok(GlommioFile::Buffered {
                file: Rc::new(file),
                path: path.to_path_buf(),
            })
        }
    }

    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    async fn sync_dir(&self, path: &Path) -> io::Result<()> {
        // glommio opens with no base directory, so a relative path fails.
        let path = std::path::absolute(path)?;
        let dir = glommio::io::Directory::open(&path)
            .await
            .map_err(io::Error::from)?;
        dir.sync().await.map_err(io::Error::from)?;
        dir.close().await.map_err(io::Error::from)
    }

    async fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(path)? {
            let entry = entry?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_string());
            }
        }
        names.sort();
        Ok(names)
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        glommio::io::remove(path).await.map_err(io::Error::from)
    }

    async fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        // A deep folder takes many unlinks: off the shard's thread.
        let target = path.to_path_buf();
        let removed = glommio::executor()
            .spawn_blocking(move || match std::fs::remove_dir_all(&target) {
                Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
                other => other,
            })
            .await;
        removed?;
        match path.parent() {
            Some(parent) if parent.exists() => self.sync_dir(parent).await,
            _ => Ok(()),
        }
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        glommio::io::rename(from, to).await.map_err(io::Error::from)
    }

    async fn exists(&self, path: &Path) -> io::Result<bool> {
        path.try_exists()
    }
}
