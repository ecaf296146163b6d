//! File helpers shared by the WAL, the partition log and consumer state.

use std::path::Path;

use crate::error::{Result, StorageError};
use crate::io::{FileSystem, OpenMode, StorageFile};
use crate::limits::{BLOCK_BYTES, RECOVERY_READ_CHUNK_BYTES};

/// Creates `dir/name` whole or not at all: writes `head` and then `zero_bytes`
/// of zeros through to `name.tmp` with O_DIRECT, fdatasyncs it, renames it
/// into place and fsyncs the directory. `head.len()` and `zero_bytes` must be
/// multiples of the block size.
pub async fn create_file_through<F: FileSystem>(
    fs: &F,
    dir: &Path,
    name: &str,
    head: &[u8],
    zero_bytes: u64,
) -> Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let path = dir.join(name);
    let file = fs
        .open(&tmp, OpenMode::CREATE_DIRECT)
        .await
        .map_err(|e| StorageError::io("create", &tmp, e))?;
    file.write_at(head, 0)
        .await
        .map_err(|e| StorageError::io("write", &tmp, e))?;
    zero_fill(&file, &tmp, head.len() as u64, zero_bytes).await?;
    file.sync_data()
        .await
        .map_err(|e| StorageError::io("fdatasync", &tmp, e))?;
    drop(file);
    fs.rename(&tmp, &path)
        .await
        .map_err(|e| StorageError::io("rename", &tmp, e))?;
    fs.sync_dir(dir)
        .await
        .map_err(|e| StorageError::io("fsync dir", dir, e))
}

/// Writes `len` zero bytes at `pos` in large aligned chunks (no sync).
pub async fn zero_fill<Fl: StorageFile>(file: &Fl, path: &Path, pos: u64, len: u64) -> Result<()> {
    debug_assert!(pos % BLOCK_BYTES == 0 && len % BLOCK_BYTES == 0);
    // No larger than the fill: many small segments growing at once must not
    // each hold a whole chunk of zeros.
    let chunk = vec![
        0u8;
        usize::try_from(len).map_or(RECOVERY_READ_CHUNK_BYTES, |len| len
            .min(RECOVERY_READ_CHUNK_BYTES))
    ];
    let mut written = 0u64;
    while written < len {
        let n = (len - written).min(chunk.len() as u64);
        let slice = chunk
            .get(..usize::try_from(n).unwrap_or(0))
            .unwrap_or_default();
        file.write_at(slice, pos + written)
            .await
            .map_err(|e| StorageError::io("write", path, e))?;
        written += n;
    }
    Ok(())
}

/// Reads `len` bytes at `pos` in chunks; a file shorter than that reads as
/// zeros past its end.
pub async fn read_exact_or_short<Fl: StorageFile>(
    file: &Fl,
    path: &Path,
    pos: u64,
    len: u64,
    chunk_bytes: usize,
) -> Result<Vec<u8>> {
    let total = usize::try_from(len).map_err(|_| StorageError::TooLarge {
        what: "file read",
        len,
        max: usize::MAX as u64,
    })?;
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        let want = (total - out.len()).min(chunk_bytes);
        let got = file
            .read_at(pos + out.len() as u64, want)
            .await
            .map_err(|e| StorageError::io("read", path, e))?;
        let short = got.len() < want;
        out.extend_from_slice(&got);
        if short {
            break;
        }
    }
    out.resize(total, 0);
    Ok(out)
}

/// Removes the file at `path` in `dir` and syncs `dir`: the removal
/// survives a power cut.
pub async fn remove_durably<F: FileSystem>(fs: &F, dir: &Path, path: &Path) -> Result<()> {
    fs.remove_file(path)
        .await
        .map_err(|e| StorageError::io("remove", path, e))?;
    fs.sync_dir(dir)
        .await
        .map_err(|e| StorageError::io("fsync dir", dir, e))
}

/// Reads a whole (small, buffered) file.
pub async fn read_whole_file<F: FileSystem>(fs: &F, path: &Path) -> Result<Vec<u8>> {
    let file = fs
        .open(path, OpenMode::EXISTING_BUFFERED)
        .await
        .map_err(|e| StorageError::io("open", path, e))?;
    let size = file
        .size()
        .await
        .map_err(|e| StorageError::io("stat", path, e))?;
    file.read_at(0, usize::try_from(size).unwrap_or(0))
        .await
        .map_err(|e| StorageError::io("read", path, e))
}
