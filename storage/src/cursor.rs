//! A durable position: a fan-out child's cursor in its parent partition
//! (the next parent offset to copy).
//!
//! One file of two one-block slots written alternately, each with a
//! sequence number and a checksum, as the WAL's checkpoint: a torn write
//! damages only the slot it wrote, and opening takes the valid slot with the
//! highest sequence. A store is written, fdatasynced and read back before it
//! returns, so a position it reported stored survives a crash.

use std::cell::Cell;
use std::path::{Path, PathBuf};

use crate::codec::{crc_of, get_u32, get_u64, put_u32, put_u64, set_u32};
use crate::error::{Result, StorageError};
use crate::io::{FileSystem, OpenMode, StorageFile};
use crate::limits::BLOCK_BYTES;
use crate::util_fs::create_file_through;

const CURSOR_MAGIC: u32 = 0x4E43_5552;
const FORMAT_VERSION: u32 = 1;
/// Bytes of a slot that carry fields (the rest of the block is zero).
const SLOT_FIELDS_BYTES: usize = 32;

fn block() -> usize {
    usize::try_from(BLOCK_BYTES).unwrap_or(4096)
}

fn encode_slot(seq: u64, position: u64) -> Vec<u8> {
    let mut buf = Vec::with_capacity(block());
    put_u32(&mut buf, CURSOR_MAGIC);
    put_u32(&mut buf, 0);
    put_u32(&mut buf, FORMAT_VERSION);
    put_u32(&mut buf, 0);
    put_u64(&mut buf, seq);
    put_u64(&mut buf, position);
    let crc = crc_of(&buf, 8, SLOT_FIELDS_BYTES).unwrap_or(0);
    set_u32(&mut buf, 4, crc);
    buf.resize(block(), 0);
    buf
}

/// (seq, position) of a valid slot.
fn decode_slot(slot: &[u8]) -> Option<(u64, u64)> {
    (get_u32(slot, 0)? == CURSOR_MAGIC).then_some(())?;
    (crc_of(slot, 8, SLOT_FIELDS_BYTES)? == get_u32(slot, 4)?).then_some(())?;
    (get_u32(slot, 8)? == FORMAT_VERSION).then_some(())?;
    Some((get_u64(slot, 16)?, get_u64(slot, 24)?))
}

/// One stored position.
pub struct Cursor<F: FileSystem> {
    file: F::File,
    path: PathBuf,
    seq: Cell<u64>,
    position: Cell<u64>,
}

impl<F: FileSystem> Cursor<F> {
    /// Opens `dir/name`: `Ok(None)` if it does not exist. A file whose two
    /// slots are both damaged is an error (the caller decides where to
    /// start again, and says so).
    pub async fn open(fs: &F, dir: &Path, name: &str) -> Result<Option<Self>> {
        let path = dir.join(name);
        let exists = fs
            .exists(&path)
            .await
            .map_err(|e| StorageError::io("stat", &path, e))?;
        if !exists {
            return Ok(None);
        }
        // Its name may be only in the page cache (a crash right after it
        // was created): durable before it is stored into.
        fs.sync_dir(dir)
            .await
            .map_err(|e| StorageError::io("fsync dir", dir, e))?;
        let file = fs
            .open(&path, OpenMode::EXISTING_DIRECT)
            .await
            .map_err(|e| StorageError::io("open", &path, e))?;
        let bytes = file
            .read_at(0, 2 * block())
            .await
            .map_err(|e| StorageError::io("read", &path, e))?;
        let best = [bytes.get(..block()), bytes.get(block()..)]
            .into_iter()
            .flatten()
            .filter_map(decode_slot)
            .max_by_key(|(seq, _)| *seq);
        let Some((seq, position)) = best else {
            return Err(StorageError::BadFormat {
                path,
                detail: "both cursor slots are damaged".into(),
            });
        };
        Ok(Some(Self {
            file,
            path,
            seq: Cell::new(seq),
            position: Cell::new(position),
        }))
    }

    /// Creates `dir/name` (and `dir`) holding `position`, whole or not at
    /// all, replacing any file of that name.
    pub async fn create(fs: &F, dir: &Path, name: &str, position: u64) -> Result<Self> {
        let new_dir = !fs
            .exists(dir)
            .await
            .map_err(|e| StorageError::io("stat", dir, e))?;
        fs.create_dir_all(dir)
            .await
            .map_err(|e| StorageError::io("create dir", dir, e))?;
        if new_dir {
            // The folder's own entry, so a power cut does not take it.
            if let Some(parent) = dir.parent() {
                fs.sync_dir(parent)
                    .await
                    .map_err(|e| StorageError::io("fsync dir", parent, e))?;
            }
        }
        // Sequence 1 in the slot `store` writes sequence 1 to (the second):
        // the first store (sequence 2) then writes the other slot, never the
        // only valid one.
        let mut slots = vec![0u8; block()];
        slots.extend_from_slice(&encode_slot(1, position));
        create_file_through(fs, dir, name, &slots, 0).await?;
        let path = dir.join(name);
        let file = fs
            .open(&path, OpenMode::EXISTING_DIRECT)
            .await
            .map_err(|e| StorageError::io("open", &path, e))?;
        Ok(Self {
            file,
            path,
            seq: Cell::new(1),
            position: Cell::new(position),
        })
    }

    /// The position last stored.
    pub fn position(&self) -> u64 {
        self.position.get()
    }

    /// Stores `position` durably: writes the older slot, fdatasyncs, and
    /// reads it back. Callers take turns (one store at a time).
    pub async fn store(&self, position: u64) -> Result<()> {
        let seq = self.seq.get() + 1;
        let slot = encode_slot(seq, position);
        let at = (seq % 2) * BLOCK_BYTES;
        self.file
            .write_at(&slot, at)
            .await
            .map_err(|e| StorageError::io("write", &self.path, e))?;
        self.file
            .sync_data()
            .await
            .map_err(|e| StorageError::io("fdatasync", &self.path, e))?;
        let back = self
            .file
            .read_at(at, block())
            .await
            .map_err(|e| StorageError::io("read back", &self.path, e))?;
        if decode_slot(&back) != Some((seq, position)) {
            return Err(StorageError::BadFormat {
                path: self.path.clone(),
                detail: "a cursor read back differs from what was written".into(),
            });
        }
        self.seq.set(seq);
        self.position.set(position);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::sim::SimFs;

    fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
        futures_lite::future::block_on(f)
    }

    #[test]
    fn a_slot_round_trips_and_damage_is_refused() {
        let mut slot = encode_slot(7, 1234);
        assert_eq!(decode_slot(&slot), Some((7, 1234)));
        slot[24] ^= 1;
        assert_eq!(decode_slot(&slot), None);
    }

    #[test]
    fn the_first_store_writes_the_other_slot_than_the_created_one() {
        // So a first store that goes wrong never damages the only valid
        // slot: after it, both hold a position.
        let fs = SimFs::new(4);
        let dir = Path::new("/p/1/children");
        let path = dir.join("c-2.cursor");
        block_on(async {
            let cursor = Cursor::create(&fs, dir, "c-2.cursor", 10)
                .await
                .expect("create");
            cursor.store(20).await.expect("store");
            let file = fs
                .open(&path, OpenMode::EXISTING_DIRECT)
                .await
                .expect("open");
            let bytes = file.read_at(0, 2 * block()).await.expect("read");
            let slots: Vec<Option<(u64, u64)>> = [bytes.get(..block()), bytes.get(block()..)]
                .into_iter()
                .map(|slot| slot.and_then(decode_slot))
                .collect();
            assert_eq!(slots, vec![Some((2, 20)), Some((1, 10))]);
        });
    }

    #[test]
    fn stored_positions_survive_a_crash_and_a_torn_slot_falls_back() {
        let fs = SimFs::new(3);
        let dir = Path::new("/p/0/children");
        block_on(async {
            assert!(Cursor::open(&fs, dir, "c-1.cursor")
                .await
                .expect("open")
                .is_none());
            let cursor = Cursor::create(&fs, dir, "c-1.cursor", 10)
                .await
                .expect("create");
            cursor.store(20).await.expect("store");
            cursor.store(30).await.expect("store");
        });
        fs.power_loss();
        block_on(async {
            let cursor = Cursor::open(&fs, dir, "c-1.cursor")
                .await
                .expect("open")
                .expect("exists");
            assert_eq!(cursor.position(), 30);
        });
    }
}
