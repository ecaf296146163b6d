//! The mark a graceful stop leaves in a partition's folder: the log's
//! newest segment and where its last batch ends, written only when every
//! append since the log was opened succeeded. The next open takes the mark
//! away before anything can be appended, and skips rewriting the newest
//! segment if the segment is as the mark says (the rewrite exists for the
//! page-cache ghosts of a failed fdatasync, which a clean run cannot have).
//!
//! ```text
//! 0   magic      u32
//! 4   write_pos  u64
//! 12  name_len   u32
//! 16  name       name_len bytes (the segment's file name)
//! ..  crc        u32   crc32c of every byte before it
//! then zero padding to a whole block
//! ```

use std::path::Path;

use crate::codec::{crc_of, get_u32, get_u64, put_u32, put_u64, round_up_usize};
use crate::error::{Result, StorageError};
use crate::io::FileSystem;
use crate::limits::BLOCK_BYTES;
use crate::util_fs::{create_file_through, read_whole_file, remove_durably};

const MAGIC: u32 = 0x4E43_4C4E;
const FILE_NAME: &str = "clean.mark";

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CleanMark {
    pub segment: String,
    pub write_pos: u64,
}

fn encode(mark: &CleanMark) -> Vec<u8> {
    let mut buf = Vec::new();
    put_u32(&mut buf, MAGIC);
    put_u64(&mut buf, mark.write_pos);
    put_u32(
        &mut buf,
        u32::try_from(mark.segment.len()).unwrap_or(u32::MAX),
    );
    buf.extend_from_slice(mark.segment.as_bytes());
    let crc = crc32c::crc32c(&buf);
    put_u32(&mut buf, crc);
    let block = usize::try_from(BLOCK_BYTES).unwrap_or(4096);
    buf.resize(round_up_usize(buf.len(), block), 0);
    buf
}

fn decode(bytes: &[u8]) -> Option<CleanMark> {
    if get_u32(bytes, 0)? != MAGIC {
        return None;
    }
    let len = usize::try_from(get_u32(bytes, 12)?).ok()?;
    let end = 16usize.checked_add(len)?;
    if crc_of(bytes, 0, end)? != get_u32(bytes, end)? {
        return None;
    }
    Some(CleanMark {
        segment: String::from_utf8(bytes.get(16..end)?.to_vec()).ok()?,
        write_pos: get_u64(bytes, 4)?,
    })
}

/// Leaves the mark (written through and its folder synced).
pub(super) async fn put<F: FileSystem>(fs: &F, dir: &Path, mark: &CleanMark) -> Result<()> {
    create_file_through(fs, dir, FILE_NAME, &encode(mark), 0).await
}

/// Takes the mark away, durably, and answers what it said (`None`: there
/// was none, or it was damaged).
pub(super) async fn take<F: FileSystem>(fs: &F, dir: &Path) -> Result<Option<CleanMark>> {
    let path = dir.join(FILE_NAME);
    if !fs
        .exists(&path)
        .await
        .map_err(|e| StorageError::io("stat", &path, e))?
    {
        return Ok(None);
    }
    let mark = read_whole_file(fs, &path)
        .await
        .ok()
        .and_then(|b| decode(&b));
    remove_durably(fs, dir, &path).await?;
    Ok(mark)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_round_trips_and_damage_is_refused() {
        let mark = CleanMark {
            segment: "0000000003-00000000000000000120.seg".into(),
            write_pos: 4096 * 9,
        };
        let bytes = encode(&mark);
        assert_eq!(bytes.len() % 4096, 0);
        assert_eq!(decode(&bytes), Some(mark));
        for at in [0, 5, 13, 20] {
            let mut damaged = bytes.clone();
            damaged[at] ^= 1;
            assert_eq!(decode(&damaged), None, "a flipped bit at {at}");
        }
    }
}
