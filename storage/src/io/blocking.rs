//! Blocking file I/O for the files written off the glommio shards: the
//! metastore's Raft log, vote and snapshot (openraft runs on its own thread)
//! and the node's start-up files (`node.epoch`, `receipt.key`).
//!
//! It follows the same power-loss model as [`super::faulty`]: with
//! [`FaultControl::power_loss`] on, appended bytes stay in this process's
//! memory until [`AppendFile::sync_data`], so a SIGKILL drops exactly what a
//! power cut would. Whole-file writes ([`BlockingFs::write_whole`]) are made
//! durable before they return (tmp file, fdatasync, rename, fsync of the
//! folder): once the call returns there is nothing unsynced to lose, and a
//! cut during the call leaves the old file or the new one, both of which the
//! caller must accept because it was not told the write was done.
//!
//! Without a fault control (production) every call goes straight to the file
//! system.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

use super::faulty::FaultControl;

/// Opens and writes whole files and append-only logs.
#[derive(Debug, Clone, Default)]
pub struct BlockingFs {
    faults: Option<Arc<FaultControl>>,
}

impl BlockingFs {
    /// The real file system, no fault layer.
    pub fn real() -> Self {
        Self::default()
    }

    /// Through the fault layer's switches (tests only).
    pub fn with_faults(faults: Arc<FaultControl>) -> Self {
        Self {
            faults: Some(faults),
        }
    }

    fn power_loss(&self) -> bool {
        self.faults.as_ref().is_some_and(|f| f.power_loss())
    }

    /// The whole file, or `None` if it does not exist.
    pub fn read(&self, path: &Path) -> io::Result<Option<Vec<u8>>> {
        match std::fs::read(path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Replaces `dir/name` with `bytes` durably: tmp file, fdatasync,
    /// rename, fsync of `dir`.
    pub fn write_whole(&self, dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
        let tmp = dir.join(format!("{name}.tmp"));
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_data()?;
        std::fs::rename(&tmp, dir.join(name))?;
        sync_dir(dir)
    }

    /// Opens (creating it and making its entry durable if needed) an
    /// append-only file.
    pub fn open_append(&self, path: &Path) -> io::Result<AppendFile> {
        let existed = path.exists();
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        if !existed {
            if let Some(dir) = path.parent() {
                sync_dir(dir)?;
            }
        }
        let len = file.metadata()?.len();
        Ok(AppendFile {
            file,
            len,
            pending: self.power_loss().then(Vec::new),
        })
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// An append-only file whose appends are durable after [`Self::sync_data`].
#[derive(Debug)]
pub struct AppendFile {
    file: File,
    /// Length as this process sees it (synced plus pending bytes).
    len: u64,
    /// Appends not yet synced (power-loss mode only).
    pending: Option<Vec<u8>>,
}

impl AppendFile {
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        match &mut self.pending {
            Some(pending) => pending.extend_from_slice(bytes),
            None => self.file.write_all(bytes)?,
        }
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// fdatasync: every append before it is durable once it returns Ok.
    pub fn sync_data(&mut self) -> io::Result<()> {
        if let Some(pending) = &mut self.pending {
            if !pending.is_empty() {
                self.file.write_all(pending)?;
                pending.clear();
            }
        }
        self.file.sync_data()
    }

    /// Cuts the file to `len` bytes, durably (pending appends past it go).
    pub fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.sync_data()?;
        self.file.set_len(len)?;
        self.file.sync_all()?;
        self.len = len;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "narad-blocking-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    #[test]
    fn with_power_loss_only_synced_appends_reach_the_file() {
        let dir = folder("power");
        let fs = BlockingFs::with_faults(FaultControl::new(true));
        let path = dir.join("log");
        let mut file = fs.open_append(&path).expect("open");
        file.append(b"durable").expect("append");
        file.sync_data().expect("sync");
        file.append(b" lost").expect("append");
        assert_eq!(file.len(), 12, "the process sees its own appends");
        // What a power cut now would leave: only what was synced.
        assert_eq!(std::fs::read(&path).expect("read"), b"durable");
        drop(file);
        let mut file = fs.open_append(&path).expect("reopen");
        assert_eq!(file.len(), 7);
        file.append(b"!").expect("append");
        file.truncate(3).expect("truncate");
        assert_eq!(std::fs::read(&path).expect("read"), b"dur");
        std::fs::remove_dir_all(&dir).expect("clean");
    }

    #[test]
    fn without_faults_appends_go_straight_to_the_file() {
        let dir = folder("real");
        let fs = BlockingFs::real();
        let mut file = fs.open_append(&dir.join("log")).expect("open");
        file.append(b"abc").expect("append");
        assert_eq!(std::fs::read(dir.join("log")).expect("read"), b"abc");
        fs.write_whole(&dir, "whole", b"xyz").expect("write");
        assert_eq!(
            fs.read(&dir.join("whole")).expect("read").as_deref(),
            Some(&b"xyz"[..])
        );
        assert_eq!(fs.read(&dir.join("absent")).expect("read"), None);
        std::fs::remove_dir_all(&dir).expect("clean");
    }
}
