//! A simulated disk, deterministic from a seed.
//!
//! Fault model (what the simulation tests can do to the engine):
//! - **Page cache.** Writes land in a volatile view that reads see at once.
//!   `sync_data` makes a file's writes durable; `sync_dir` makes a directory's
//!   entries (created, renamed, removed files) durable.
//! - **Process crash** ([`SimFs::crash_process`]): open handles die; the page
//!   cache survives, as it does when a process is SIGKILLed.
//! - **Power loss** ([`SimFs::power_loss`]): every unsynced write is dropped,
//!   kept, or torn (each 512-byte sector kept or lost on its own); directory
//!   entries fall back to their last synced state; files with no durable name
//!   vanish. Directories themselves are durable once created.
//! - **Bit flips** in stored data ([`SimFs::flip_bit`]), and writes that land
//!   with a flipped bit ([`SimFs::corrupt_next_writes`]).
//! - **Failed operations**: any read, write, sync, open or directory operation
//!   can fail with EIO or ENOSPC, by rule ([`SimFs::inject`]) or at random
//!   ([`SimFs::set_random_failure_rate`]). A failed write may have partly landed.
//!
//! Every operation completes at once; the futures never pend.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use super::{FileSystem, OpenMode, StorageFile};
use crate::limits::{BLOCK_BYTES, SECTOR_BYTES};
use crate::rng::SimRng;

/// The operations a fault rule can match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOp {
    Write,
    Read,
    Sync,
    Open,
    SyncDir,
    Remove,
    Rename,
}

/// The error an injected fault returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultError {
    Eio,
    Enospc,
}

impl FaultError {
    fn to_io(self) -> io::Error {
        match self {
            Self::Eio => io::Error::from_raw_os_error(libc::EIO),
            Self::Enospc => io::Error::from_raw_os_error(libc::ENOSPC),
        }
    }
}

/// Fail matching operations: skip the first `skip` matches, then fail `times`.
#[derive(Debug, Clone)]
pub struct FaultRule {
    pub op: FaultOp,
    pub path_contains: String,
    pub error: FaultError,
    pub skip: u32,
    pub times: u32,
}

impl FaultRule {
    /// Fails the next `op` on a path containing `path_contains`, once.
    pub fn once(op: FaultOp, path_contains: &str, error: FaultError) -> Self {
        Self {
            op,
            path_contains: path_contains.to_string(),
            error,
            skip: 0,
            times: 1,
        }
    }
    /// Fails every matching `op` from now on.
    pub fn always(op: FaultOp, path_contains: &str, error: FaultError) -> Self {
        Self {
            op,
            path_contains: path_contains.to_string(),
            error,
            skip: 0,
            times: u32::MAX,
        }
    }
}

/// One bit the simulation flipped in stored data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flip {
    pub path: PathBuf,
    pub pos: u64,
}

#[derive(Debug, Default)]
struct Inode {
    durable: Vec<u8>,
    current: Vec<u8>,
    pending: Vec<(u64, Vec<u8>)>,
}

#[derive(Debug)]
struct SimDisk {
    rng: SimRng,
    epoch: u64,
    next_inode: u64,
    inodes: HashMap<u64, Inode>,
    names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    dirs: std::collections::BTreeSet<PathBuf>,
    rules: Vec<FaultRule>,
    corrupt_writes: Vec<(String, u32)>,
    random_failure_per_million: u64,
    flips: Vec<Flip>,
    syncs: u64,
    bytes_read: u64,
}

/// A simulated file system; clones share one disk.
#[derive(Debug, Clone)]
pub struct SimFs {
    disk: Rc<RefCell<SimDisk>>,
}

/// A handle to a simulated file; it dies with the process that opened it.
#[derive(Debug)]
pub struct SimFile {
    disk: Rc<RefCell<SimDisk>>,
    inode: u64,
    epoch: u64,
    path: PathBuf,
    direct: bool,
}

fn write_into(buf: &mut Vec<u8>, pos: usize, data: &[u8]) {
    let end = pos + data.len();
    if buf.len() < end {
        buf.resize(end, 0);
    }
    if let Some(dst) = buf.get_mut(pos..end) {
        dst.copy_from_slice(data);
    }
}

fn parent_of(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

impl SimDisk {
    /// Applies rules and random failures; returns the error to report, if any.
    fn check_fault(&mut self, op: FaultOp, path: &Path) -> Option<io::Error> {
        let text = path.to_string_lossy();
        for rule in &mut self.rules {
            if rule.op != op || rule.times == 0 || !text.contains(rule.path_contains.as_str()) {
                continue;
            }
            if rule.skip > 0 {
                rule.skip -= 1;
                continue;
            }
            rule.times -= 1;
            return Some(rule.error.to_io());
        }
        let random_op = matches!(op, FaultOp::Write | FaultOp::Sync | FaultOp::Read);
        if random_op
            && self.random_failure_per_million > 0
            && self.rng.chance(self.random_failure_per_million, 1_000_000)
        {
            let error = if self.rng.chance(1, 2) {
                FaultError::Eio
            } else {
                FaultError::Enospc
            };
            return Some(error.to_io());
        }
        None
    }

    fn take_write_corruption(&mut self, path: &Path) -> bool {
        let text = path.to_string_lossy();
        for (pattern, count) in &mut self.corrupt_writes {
            if *count > 0 && text.contains(pattern.as_str()) {
                *count -= 1;
                return true;
            }
        }
        false
    }

    /// The file named `path` and `pos` as an index into it.
    fn file_at(&mut self, path: &Path, pos: u64) -> Option<(&mut Inode, usize)> {
        let id = *self.names.get(path)?;
        let at = usize::try_from(pos).ok()?;
        Some((self.inodes.get_mut(&id)?, at))
    }

    fn inode_mut(&mut self, inode: u64) -> io::Result<&mut Inode> {
        self.inodes
            .get_mut(&inode)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }
}

impl SimFs {
    pub fn new(seed: u64) -> Self {
        Self {
            disk: Rc::new(RefCell::new(SimDisk {
                rng: SimRng::new(seed),
                epoch: 0,
                next_inode: 1,
                inodes: HashMap::new(),
                names: BTreeMap::new(),
                durable_names: BTreeMap::new(),
                dirs: Default::default(),
                rules: Vec::new(),
                corrupt_writes: Vec::new(),
                random_failure_per_million: 0,
                flips: Vec::new(),
                syncs: 0,
                bytes_read: 0,
            })),
        }
    }

    /// Adds a fault rule.
    pub fn inject(&self, rule: FaultRule) {
        self.disk.borrow_mut().rules.push(rule);
    }

    /// Removes every fault rule and random failure rate ("the disk was fixed").
    pub fn clear_faults(&self) {
        let mut disk = self.disk.borrow_mut();
        disk.rules.clear();
        disk.corrupt_writes.clear();
        disk.random_failure_per_million = 0;
    }

    /// Reads, writes and syncs fail at random with this probability (per million).
    pub fn set_random_failure_rate(&self, per_million: u64) {
        self.disk.borrow_mut().random_failure_per_million = per_million;
    }

    /// The next `count` writes to a path containing `path_contains` land with one bit flipped.
    pub fn corrupt_next_writes(&self, path_contains: &str, count: u32) {
        self.disk
            .borrow_mut()
            .corrupt_writes
            .push((path_contains.to_string(), count));
    }

    /// The process dies: handles stop working, the page cache survives.
    pub fn crash_process(&self) {
        self.disk.borrow_mut().epoch += 1;
    }

    /// The machine loses power: see the module docs for what survives.
    pub fn power_loss(&self) {
        let mut guard = self.disk.borrow_mut();
        let disk = &mut *guard;
        disk.epoch += 1;
        disk.names = disk.durable_names.clone();
        let live: std::collections::HashSet<u64> = disk.names.values().copied().collect();
        disk.inodes.retain(|id, _| live.contains(id));
        let mut ids: Vec<u64> = disk.inodes.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let Some(inode) = disk.inodes.get_mut(&id) else {
                continue;
            };
            for (pos, data) in std::mem::take(&mut inode.pending) {
                let pos = usize::try_from(pos).unwrap_or(usize::MAX / 2);
                match disk.rng.below(3) {
                    0 => {}
                    1 => write_into(&mut inode.durable, pos, &data),
                    _ => {
                        let sector = usize::try_from(SECTOR_BYTES).unwrap_or(512);
                        for (i, chunk) in data.chunks(sector).enumerate() {
                            if disk.rng.chance(1, 2) {
                                write_into(&mut inode.durable, pos + i * sector, chunk);
                            }
                        }
                    }
                }
            }
            inode.current = inode.durable.clone();
        }
    }

    /// Flips one bit of the byte at `pos` of `path`, durable copy included.
    pub fn flip_bit(&self, path: &Path, pos: u64, bit: u8) -> bool {
        let mut guard = self.disk.borrow_mut();
        let disk = &mut *guard;
        let Some((inode, at)) = disk.file_at(path, pos) else {
            return false;
        };
        let mask = 1u8 << (bit % 8);
        let mut flipped = false;
        if let Some(b) = inode.durable.get_mut(at) {
            *b ^= mask;
            flipped = true;
        }
        if let Some(b) = inode.current.get_mut(at) {
            *b ^= mask;
            flipped = true;
        }
        for (wpos, data) in &mut inode.pending {
            if let Some(offset) = pos.checked_sub(*wpos).and_then(|o| usize::try_from(o).ok()) {
                if let Some(b) = data.get_mut(offset) {
                    *b ^= mask;
                }
            }
        }
        if flipped {
            disk.flips.push(Flip {
                path: path.to_path_buf(),
                pos,
            });
        }
        flipped
    }

    /// Flips a random bit in a random non-zero byte of a random file whose path
    /// contains `path_contains`; returns where.
    pub fn flip_random_bit(&self, path_contains: &str) -> Option<Flip> {
        let (path, pos, bit) = {
            let mut guard = self.disk.borrow_mut();
            let disk = &mut *guard;
            let candidates: Vec<(PathBuf, u64)> = disk
                .names
                .iter()
                .filter(|(p, _)| p.to_string_lossy().contains(path_contains))
                .map(|(p, id)| (p.clone(), *id))
                .collect();
            if candidates.is_empty() {
                return None;
            }
            let index = usize::try_from(disk.rng.below(candidates.len() as u64)).ok()?;
            let (path, id) = candidates.get(index)?.clone();
            let inode = disk.inodes.get(&id)?;
            let non_zero: Vec<usize> = inode
                .durable
                .iter()
                .enumerate()
                .filter(|(_, b)| **b != 0)
                .map(|(i, _)| i)
                .collect();
            if non_zero.is_empty() {
                return None;
            }
            let pick = usize::try_from(disk.rng.below(non_zero.len() as u64)).ok()?;
            let pos = *non_zero.get(pick)? as u64;
            let bit = u8::try_from(disk.rng.below(8)).ok()?;
            (path, pos, bit)
        };
        let flipped = self.flip_bit(&path, pos, bit);
        flipped.then_some(Flip { path, pos })
    }

    /// Every bit flipped so far, by path at the time of the flip.
    pub fn flips(&self) -> Vec<Flip> {
        self.disk.borrow().flips.clone()
    }

    /// Number of successful `sync_data` calls so far.
    pub fn sync_count(&self) -> u64 {
        self.disk.borrow().syncs
    }

    /// Bytes that reads returned so far.
    pub fn bytes_read(&self) -> u64 {
        self.disk.borrow().bytes_read
    }

    /// The durable bytes of a file (what survives a power loss without tearing).
    pub fn durable_bytes(&self, path: &Path) -> Option<Vec<u8>> {
        let disk = self.disk.borrow();
        let id = disk.durable_names.get(path)?;
        Some(disk.inodes.get(id)?.durable.clone())
    }

    /// Overwrites part of a file, page cache and durable copy alike (for tests
    /// that hand-craft damage, such as garbage past the end of a log).
    pub fn scribble(&self, path: &Path, pos: u64, data: &[u8]) -> bool {
        let mut disk = self.disk.borrow_mut();
        let Some((inode, at)) = disk.file_at(path, pos) else {
            return false;
        };
        write_into(&mut inode.durable, at, data);
        write_into(&mut inode.current, at, data);
        true
    }
}

impl SimFile {
    fn check_epoch(&self) -> io::Result<()> {
        if self.disk.borrow().epoch != self.epoch {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        }
        Ok(())
    }
}

impl StorageFile for SimFile {
    async fn write_at(&self, data: &[u8], pos: u64) -> io::Result<()> {
        self.check_epoch()?;
        if self.direct && (pos % BLOCK_BYTES != 0 || data.len() as u64 % BLOCK_BYTES != 0) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut guard = self.disk.borrow_mut();
        let disk = &mut *guard;
        let fault = disk.check_fault(FaultOp::Write, &self.path);
        let mut data = data.to_vec();
        let landed = match &fault {
            // A failed write may have partly landed: some whole sectors of it.
            Some(_) => {
                let sectors = (data.len() as u64).div_ceil(SECTOR_BYTES);
                let keep = disk.rng.below(sectors + 1) * SECTOR_BYTES;
                usize::try_from(keep).unwrap_or(0).min(data.len())
            }
            None => data.len(),
        };
        data.truncate(landed);
        if fault.is_none() && !data.is_empty() && disk.take_write_corruption(&self.path) {
            let at = usize::try_from(disk.rng.below(data.len() as u64)).unwrap_or(0);
            let bit = disk.rng.below(8);
            if let Some(b) = data.get_mut(at) {
                *b ^= 1 << bit;
            }
            disk.flips.push(Flip {
                path: self.path.clone(),
                pos: pos + at as u64,
            });
        }
        let inode = disk.inode_mut(self.inode)?;
        let at = usize::try_from(pos).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        write_into(&mut inode.current, at, &data);
        if !data.is_empty() {
            inode.pending.push((pos, data));
        }
        match fault {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        self.check_epoch()?;
        let mut disk = self.disk.borrow_mut();
        if let Some(e) = disk.check_fault(FaultOp::Read, &self.path) {
            return Err(e);
        }
        let inode = disk.inode_mut(self.inode)?;
        let start = usize::try_from(pos)
            .unwrap_or(usize::MAX)
            .min(inode.current.len());
        let end = start.saturating_add(len).min(inode.current.len());
        let read = inode
            .current
            .get(start..end)
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        disk.bytes_read += read.len() as u64;
        Ok(read)
    }

    async fn sync_data(&self) -> io::Result<()> {
        self.check_epoch()?;
        let mut guard = self.disk.borrow_mut();
        let disk = &mut *guard;
        if let Some(e) = disk.check_fault(FaultOp::Sync, &self.path) {
            // fsyncgate: after a failed sync the kernel may have dropped the
            // dirty pages; some writes may have reached the disk, others not.
            let inode = disk.inode_mut(self.inode)?;
            let pending = std::mem::take(&mut inode.pending);
            for (pos, data) in pending {
                if disk.rng.chance(1, 2) {
                    let at = usize::try_from(pos).unwrap_or(0);
                    if let Some(inode) = disk.inodes.get_mut(&self.inode) {
                        write_into(&mut inode.durable, at, &data);
                    }
                }
            }
            return Err(e);
        }
        let inode = disk.inode_mut(self.inode)?;
        for (pos, data) in std::mem::take(&mut inode.pending) {
            let at = usize::try_from(pos).unwrap_or(0);
            write_into(&mut inode.durable, at, &data);
        }
        disk.syncs += 1;
        Ok(())
    }

    async fn size(&self) -> io::Result<u64> {
        self.check_epoch()?;
        let mut disk = self.disk.borrow_mut();
        Ok(disk.inode_mut(self.inode)?.current.len() as u64)
    }
}

impl FileSystem for SimFs {
    type File = SimFile;

    async fn open(&self, path: &Path, mode: OpenMode) -> io::Result<SimFile> {
        let mut disk = self.disk.borrow_mut();
        if let Some(e) = disk.check_fault(FaultOp::Open, path) {
            return Err(e);
        }
        if !disk.dirs.contains(&parent_of(path)) {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        let inode = match disk.names.get(path) {
            Some(id) => *id,
            None if mode.create => {
                let id = disk.next_inode;
                disk.next_inode += 1;
                disk.inodes.insert(id, Inode::default());
                disk.names.insert(path.to_path_buf(), id);
                id
            }
            None => return Err(io::Error::from_raw_os_error(libc::ENOENT)),
        };
        Ok(SimFile {
            disk: self.disk.clone(),
            inode,
            epoch: disk.epoch,
            path: path.to_path_buf(),
            direct: mode.direct,
        })
    }

    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut disk = self.disk.borrow_mut();
        for ancestor in path.ancestors() {
            disk.dirs.insert(ancestor.to_path_buf());
        }
        Ok(())
    }

    async fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut guard = self.disk.borrow_mut();
        let disk = &mut *guard;
        if let Some(e) = disk.check_fault(FaultOp::SyncDir, path) {
            return Err(e);
        }
        disk.durable_names.retain(|name, _| parent_of(name) != path);
        for (name, id) in &disk.names {
            if parent_of(name) == path {
                disk.durable_names.insert(name.clone(), *id);
            }
        }
        Ok(())
    }

    async fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let disk = self.disk.borrow();
        if !disk.dirs.contains(path) {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        let mut names: Vec<String> = disk
            .names
            .keys()
            .chain(disk.dirs.iter())
            .filter(|name| name.parent() == Some(path))
            .filter_map(|name| {
                name.file_name()
                    .and_then(|n| n.to_str())
                    .map(str::to_string)
            })
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut disk = self.disk.borrow_mut();
        if let Some(e) = disk.check_fault(FaultOp::Remove, path) {
            return Err(e);
        }
        disk.names
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
    }

    /// Removal is durable at once here (the simulated disk syncs the
    /// parent as a real one does).
    async fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut disk = self.disk.borrow_mut();
        if let Some(e) = disk.check_fault(FaultOp::Remove, path) {
            return Err(e);
        }
        disk.names.retain(|name, _| !name.starts_with(path));
        disk.durable_names.retain(|name, _| !name.starts_with(path));
        disk.dirs.retain(|dir| !dir.starts_with(path));
        Ok(())
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut guard = self.disk.borrow_mut();
        let disk = &mut *guard;
        if let Some(e) = disk.check_fault(FaultOp::Rename, from) {
            return Err(e);
        }
        if disk.dirs.contains(from) {
            // A folder moves whole, with what is under it. Like
            // `remove_dir_all`, the simulation makes it durable at once.
            let moved = |path: &Path| -> Option<PathBuf> {
                path.strip_prefix(from).ok().map(|rest| to.join(rest))
            };
            if disk.dirs.iter().any(|d| d.starts_with(to))
                || disk.names.keys().any(|n| n.starts_with(to))
            {
                return Err(io::Error::from_raw_os_error(libc::ENOTEMPTY));
            }
            let dirs: Vec<PathBuf> = disk
                .dirs
                .iter()
                .filter(|d| d.starts_with(from))
                .cloned()
                .collect();
            for dir in dirs {
                disk.dirs.remove(&dir);
                if let Some(new) = moved(&dir) {
                    disk.dirs.insert(new);
                }
            }
            for table in [&mut disk.names, &mut disk.durable_names] {
                let entries: Vec<(PathBuf, u64)> = table
                    .iter()
                    .filter(|(n, _)| n.starts_with(from))
                    .map(|(n, id)| (n.clone(), *id))
                    .collect();
                for (name, id) in entries {
                    table.remove(&name);
                    if let Some(new) = moved(&name) {
                        table.insert(new, id);
                    }
                }
            }
            return Ok(());
        }
        let id = disk
            .names
            .remove(from)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        disk.names.insert(to.to_path_buf(), id);
        Ok(())
    }

    async fn exists(&self, path: &Path) -> io::Result<bool> {
        let disk = self.disk.borrow();
        Ok(disk.names.contains_key(path) || disk.dirs.contains(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_renamed_takes_its_files_along_for_good() {
        let fs = SimFs::new(3);
        let (from, to) = (Path::new("/d/t-1/0.incoming"), Path::new("/d/t-1/0"));
        futures_lite::future::block_on(async {
            fs.create_dir_all(&from.join("consumer"))
                .await
                .expect("dir");
            let file = fs
                .open(
                    &from.join("consumer").join("s.ack"),
                    OpenMode::CREATE_BUFFERED,
                )
                .await
                .expect("open");
            file.write_at(b"x", 0).await.expect("write");
            file.sync_data().await.expect("sync");
            fs.sync_dir(&from.join("consumer")).await.expect("sync dir");
            fs.rename(from, to).await.expect("rename");
            fs.power_loss();
            assert!(fs
                .exists(&to.join("consumer").join("s.ack"))
                .await
                .expect("exists"));
            assert!(!fs.exists(from).await.expect("exists"));
            assert_eq!(
                fs.list_dir(to).await.expect("list"),
                vec!["consumer".to_string()]
            );
        });
    }

    #[test]
    fn remove_dir_all_removes_the_folder_and_only_it_for_good() {
        let fs = SimFs::new(9);
        let (gone, kept) = (Path::new("/d/topic-1"), Path::new("/d/topic-10"));
        futures_lite::future::block_on(async {
            for dir in [gone, kept] {
                fs.create_dir_all(&dir.join("0")).await.expect("dir");
                let file = fs
                    .open(&dir.join("0").join("a.seg"), OpenMode::CREATE_BUFFERED)
                    .await
                    .expect("open");
                file.write_at(b"x", 0).await.expect("write");
                file.sync_data().await.expect("sync");
                fs.sync_dir(&dir.join("0")).await.expect("sync dir");
            }
            fs.remove_dir_all(gone).await.expect("remove");
            fs.power_loss();
            assert!(!fs
                .exists(&gone.join("0").join("a.seg"))
                .await
                .expect("exists"));
            assert!(!fs.exists(gone).await.expect("exists"));
            assert!(fs
                .exists(&kept.join("0").join("a.seg"))
                .await
                .expect("exists"));
            fs.remove_dir_all(Path::new("/nowhere"))
                .await
                .expect("missing is fine");
        });
    }
}
