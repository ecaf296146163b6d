//! A fault layer over a real [`FileSystem`], for process-level tests: the
//! switch that makes a running node's disk misbehave the way a real one can.
//!
//! - **Power loss.** With [`FaultControl::power_loss`] on, nothing reaches
//!   the inner file system until it is synced: file writes wait in memory
//!   until `sync_data`, and creates, renames and removals of directory
//!   entries until `sync_dir` of their directory. The process sees its own
//!   writes; a SIGKILL then drops exactly what a power cut would. A file
//!   whose creation was never made durable lives under a hidden name
//!   (`*.narad-unsynced-N`), and [`FaultyFs::new`] deletes those at start.
//! - **A failing disk.** [`Fault::WalWriteFails`] makes writes under a `wal`
//!   folder fail with EIO while it is raised.
//! - **A failing ack disk.** [`Fault::AckWriteFails`] makes writes under a
//!   `consumer` folder (a partition's ack state) fail with EIO.
//! - **A broken build.** [`Fault::SkipWalSync`] makes `sync_data` under a
//!   `wal` folder return success without syncing: the deliberate bug that the
//!   delivery checker must catch. [`Fault::ForgetWalCheckpoint`] makes the
//!   WAL's checkpoint file read as zeros, so a node that starts sends its
//!   whole ring to the owners again: the checker must catch that too.
//!
//! Faults are raised and lifted at runtime through shared atomics (the node
//! polls a control file). With everything off, every call goes straight to
//! the inner file system.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{FileSystem, OpenMode, StorageFile};

/// Suffix of files whose directory entry is not durable yet.
const UNSYNCED_MARK: &str = ".narad-unsynced-";

/// A fault that can be raised and lifted while a node runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Writes to files under a `wal` folder fail with EIO.
    WalWriteFails,
    /// fdatasync of files under a `wal` folder does nothing and succeeds.
    SkipWalSync,
    /// Writes to files under a `consumer` folder (a partition's ack state)
    /// fail with EIO.
    AckWriteFails,
    /// Reads of the WAL's checkpoint file return zeros (both slots read as
    /// damaged), so the WAL opens by replaying its whole ring.
    ForgetWalCheckpoint,
    /// Not a disk fault: a move's destination holds the source's freeze
    /// (waits after the freeze answered) while it is raised, so a test can
    /// see what clients get during a handover.
    HoldMoveFreeze,
}

impl Fault {
    pub const ALL: [Fault; 5] = [
        Fault::WalWriteFails,
        Fault::SkipWalSync,
        Fault::AckWriteFails,
        Fault::ForgetWalCheckpoint,
        Fault::HoldMoveFreeze,
    ];

    /// The word for this fault in a control file.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::WalWriteFails => "wal_write_fails",
            Fault::SkipWalSync => "skip_wal_sync",
            Fault::AckWriteFails => "ack_write_fails",
            Fault::ForgetWalCheckpoint => "forget_wal_checkpoint",
            Fault::HoldMoveFreeze => "hold_move_freeze",
        }
    }
}

/// The switches, shared by every shard of a node.
#[derive(Debug, Default)]
pub struct FaultControl {
    power_loss: bool,
    wal_write_fails: AtomicBool,
    skip_wal_sync: AtomicBool,
    ack_write_fails: AtomicBool,
    forget_wal_checkpoint: AtomicBool,
    hold_move_freeze: AtomicBool,
}

impl FaultControl {
    /// `power_loss` is fixed for the life of the process.
    pub fn new(power_loss: bool) -> Arc<Self> {
        Arc::new(Self {
            power_loss,
            ..Self::default()
        })
    }

    pub fn power_loss(&self) -> bool {
        self.power_loss
    }

    fn flag(&self, fault: Fault) -> &AtomicBool {
        match fault {
            Fault::WalWriteFails => &self.wal_write_fails,
            Fault::SkipWalSync => &self.skip_wal_sync,
            Fault::AckWriteFails => &self.ack_write_fails,
            Fault::ForgetWalCheckpoint => &self.forget_wal_checkpoint,
            Fault::HoldMoveFreeze => &self.hold_move_freeze,
        }
    }

    pub fn set(&self, fault: Fault, raised: bool) {
        self.flag(fault).store(raised, Ordering::SeqCst);
    }

    pub fn is_raised(&self, fault: Fault) -> bool {
        self.flag(fault).load(Ordering::SeqCst)
    }

    /// Raises exactly the faults named in `text` (whitespace separated) and
    /// lifts the others. Unknown words are returned.
    pub fn apply(&self, text: &str) -> Vec<String> {
        let words: BTreeSet<&str> = text.split_whitespace().collect();
        for fault in Fault::ALL {
            self.set(fault, words.contains(fault.as_str()));
        }
        words
            .into_iter()
            .filter(|w| !Fault::ALL.iter().any(|f| f.as_str() == *w))
            .map(str::to_string)
            .collect()
    }
}

fn under_wal(path: &Path) -> bool {
    under(path, "wal")
}

fn under(path: &Path, folder: &str) -> bool {
    path.components().any(|c| c.as_os_str() == folder)
}

fn unsynced_name(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.contains(UNSYNCED_MARK))
}

/// Writes not yet synced to one real file, in the order they were made.
#[derive(Debug, Default)]
struct Pending {
    writes: Vec<(u64, Vec<u8>)>,
}

impl Pending {
    fn end(&self) -> u64 {
        self.writes
            .iter()
            .map(|(pos, data)| pos + data.len() as u64)
            .max()
            .unwrap_or(0)
    }
}

/// The names this process sees that the disk does not have durably yet.
#[derive(Debug, Default)]
struct Namespace {
    /// Visible path → the real file behind it (a hidden name, or the old
    /// name of a renamed file).
    mapped: BTreeMap<PathBuf, PathBuf>,
    /// Real paths that are gone for this process (removed or renamed away).
    hidden: BTreeSet<PathBuf>,
    /// Unsynced writes by real path.
    pending: HashMap<PathBuf, Rc<RefCell<Pending>>>,
    next_hidden: u64,
}

impl Namespace {
    /// The real path behind a visible one, or `None` if it does not exist
    /// for this process.
    fn resolve(&self, path: &Path) -> Option<PathBuf> {
        if let Some(real) = self.mapped.get(path) {
            return Some(real.clone());
        }
        (!self.hidden.contains(path)).then(|| path.to_path_buf())
    }

    fn pending(&mut self, real: &Path) -> Rc<RefCell<Pending>> {
        self.pending.entry(real.to_path_buf()).or_default().clone()
    }
}

/// The fault layer. Clones share the namespace (one per shard).
#[derive(Clone)]
pub struct FaultyFs<F: FileSystem> {
    inner: F,
    control: Arc<FaultControl>,
    names: Rc<RefCell<Namespace>>,
}

impl<F: FileSystem> FaultyFs<F> {
    /// Wraps `inner`. With power loss on, first deletes under `root` every
    /// file whose creation never became durable (a power cut lost it).
    pub async fn new(inner: F, control: Arc<FaultControl>, root: &Path) -> io::Result<Self> {
        if control.power_loss() {
            remove_unsynced(&inner, root).await?;
        }
        Ok(Self::wrap(inner, control))
    }

    /// Wraps `inner` without the start-up sweep (a node sweeps once with
    /// [`remove_unsynced_files`] before its shards start).
    pub fn wrap(inner: F, control: Arc<FaultControl>) -> Self {
        Self {
            inner,
            control,
            names: Rc::default(),
        }
    }

    pub fn control(&self) -> &Arc<FaultControl> {
        &self.control
    }
}

/// Deletes hidden files of entries that never became durable, in every
/// folder under `root` (a folder is whatever lists).
async fn remove_unsynced<F: FileSystem>(fs: &F, root: &Path) -> io::Result<()> {
    let mut folders = vec![root.to_path_buf()];
    while let Some(dir) = folders.pop() {
        let Ok(names) = fs.list_dir(&dir).await else {
            continue;
        };
        for name in names {
            let path = dir.join(&name);
            if name.contains(UNSYNCED_MARK) {
                fs.remove_file(&path).await?;
            } else {
                folders.push(path);
            }
        }
    }
    Ok(())
}

/// [`FaultyFs::new`]'s sweep with `std::fs`, for a node before it starts.
pub fn remove_unsynced_files(root: &Path) -> io::Result<()> {
    let entries = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            remove_unsynced_files(&path)?;
        } else if unsynced_name(&path) {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// An open file of [`FaultyFs`].
pub struct FaultyFile<F: FileSystem> {
    inner: F::File,
    /// The visible path (for the WAL faults).
    path: PathBuf,
    control: Arc<FaultControl>,
    /// Unsynced writes (power-loss mode only).
    pending: Option<Rc<RefCell<Pending>>>,
}

impl<F: FileSystem> StorageFile for FaultyFile<F> {
    async fn write_at(&self, data: &[u8], pos: u64) -> io::Result<()> {
        if self.control.is_raised(Fault::WalWriteFails) && under_wal(&self.path) {
            return Err(io::Error::other("injected fault: WAL write fails"));
        }
        if self.control.is_raised(Fault::AckWriteFails) && under(&self.path, "consumer") {
            return Err(io::Error::other("injected fault: ack state write fails"));
        }
        match &self.pending {
            Some(pending) => {
                pending.borrow_mut().writes.push((pos, data.to_vec()));
                Ok(())
            }
            None => self.inner.write_at(data, pos).await,
        }
    }

    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        if self.control.is_raised(Fault::ForgetWalCheckpoint)
            && under_wal(&self.path)
            && self
                .path
                .file_name()
                .is_some_and(|n| n == crate::wal::CHECKPOINT_FILE_NAME)
        {
            return Ok(vec![0; len]);
        }
        let Some(pending) = &self.pending else {
            return self.inner.read_at(pos, len).await;
        };
        let size = self.size().await?;
        let want = usize::try_from(size.saturating_sub(pos))
            .unwrap_or(usize::MAX)
            .min(len);
        let mut buf = self.inner.read_at(pos, want).await?;
        buf.resize(want, 0);
        let end = pos + want as u64;
        for (at, data) in &pending.borrow().writes {
            let write_end = at + data.len() as u64;
            if write_end <= pos || *at >= end {
                continue;
            }
            let from = pos.max(*at);
            let to = end.min(write_end);
            let (dst, src) = ((from - pos) as usize, (from - at) as usize);
            let n = (to - from) as usize;
            buf[dst..dst + n].copy_from_slice(&data[src..src + n]);
        }
        Ok(buf)
    }

    async fn sync_data(&self) -> io::Result<()> {
        if self.control.is_raised(Fault::SkipWalSync) && under_wal(&self.path) {
            return Ok(());
        }
        if let Some(pending) = &self.pending {
            let writes = std::mem::take(&mut pending.borrow_mut().writes);
            for (pos, data) in writes {
                self.inner.write_at(&data, pos).await?;
            }
        }
        self.inner.sync_data().await
    }

    async fn size(&self) -> io::Result<u64> {
        let real = self.inner.size().await?;
        Ok(match &self.pending {
            Some(pending) => real.max(pending.borrow().end()),
            None => real,
        })
    }
}

impl<F: FileSystem> FileSystem for FaultyFs<F> {
    type File = FaultyFile<F>;

    async fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FaultyFile<F>> {
        if !self.control.power_loss() {
            return Ok(FaultyFile {
                inner: self.inner.open(path, mode).await?,
                path: path.to_path_buf(),
                control: self.control.clone(),
                pending: None,
            });
        }
        let resolved = self.names.borrow().resolve(path);
        let real = match resolved {
            Some(real) if self.inner.exists(&real).await? => real,
            _ if !mode.create => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{} does not exist", path.display()),
                ))
            }
            _ => {
                // A new entry: a hidden real name until its directory syncs.
                let mut names = self.names.borrow_mut();
                names.next_hidden += 1;
                let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
                let hidden =
                    path.with_file_name(format!("{file_name}{UNSYNCED_MARK}{}", names.next_hidden));
                names.mapped.insert(path.to_path_buf(), hidden.clone());
                names.hidden.remove(path);
                hidden
            }
        };
        let inner = self
            .inner
            .open(
                &real,
                OpenMode {
                    create: true,
                    ..mode
                },
            )
            .await?;
        let pending = self.names.borrow_mut().pending(&real);
        Ok(FaultyFile {
            inner,
            path: path.to_path_buf(),
            control: self.control.clone(),
            pending: Some(pending),
        })
    }

    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path).await
    }

    async fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        if self.control.power_loss() {
            // Make the disk's entries in `dir` match what this process sees:
            // renames first, then removals.
            let (moves, removals): (Vec<(PathBuf, PathBuf)>, Vec<PathBuf>) = {
                let names = self.names.borrow();
                let moves = names
                    .mapped
                    .iter()
                    .filter(|(visible, _)| visible.parent() == Some(dir))
                    .map(|(visible, real)| (visible.clone(), real.clone()))
                    .collect();
                let removals = names
                    .hidden
                    .iter()
                    .filter(|p| p.parent() == Some(dir) && !names.mapped.contains_key(*p))
                    .cloned()
                    .collect();
                (moves, removals)
            };
            for (visible, real) in moves {
                if real != visible {
                    self.inner.rename(&real, &visible).await?;
                    let mut names = self.names.borrow_mut();
                    if let Some(pending) = names.pending.remove(&real) {
                        names.pending.insert(visible.clone(), pending);
                    }
                    for other in names.mapped.values_mut() {
                        if *other == real {
                            other.clone_from(&visible);
                        }
                    }
                }
                self.names.borrow_mut().mapped.remove(&visible);
            }
            for removed in removals {
                match self.inner.remove_file(&removed).await {
                    Ok(()) => {}
                    Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                    Err(error) => return Err(error),
                }
                let mut names = self.names.borrow_mut();
                names.hidden.remove(&removed);
                names.pending.remove(&removed);
            }
        }
        self.inner.sync_dir(dir).await
    }

    async fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let real = self.inner.list_dir(path).await?;
        if !self.control.power_loss() {
            return Ok(real);
        }
        let names = self.names.borrow();
        let mut visible: BTreeSet<String> = real
            .into_iter()
            .filter(|name| {
                let full = path.join(name);
                !unsynced_name(&full) && !names.hidden.contains(&full)
            })
            .collect();
        for mapped in names.mapped.keys() {
            if mapped.parent() == Some(path) {
                if let Some(name) = mapped.file_name().and_then(|n| n.to_str()) {
                    visible.insert(name.to_string());
                }
            }
        }
        Ok(visible.into_iter().collect())
    }

    async fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        if self.control.power_loss() {
            // Whatever waited under it for a sync is gone with it.
            let mut names = self.names.borrow_mut();
            names.mapped.retain(|visible, _| !visible.starts_with(path));
            names.pending.retain(|real, _| !real.starts_with(path));
            names.hidden.retain(|real| !real.starts_with(path));
        }
        self.inner.remove_dir_all(path).await
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        if !self.control.power_loss() {
            return self.inner.remove_file(path).await;
        }
        let mut names = self.names.borrow_mut();
        let Some(real) = names.resolve(path) else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} does not exist", path.display()),
            ));
        };
        names.mapped.remove(path);
        names.hidden.insert(path.to_path_buf());
        if real != path {
            // A file never made durable under any name: gone at the next
            // sync of its folder, or at the next start.
            names.hidden.insert(real);
        }
        Ok(())
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        if !self.control.power_loss() {
            return self.inner.rename(from, to).await;
        }
        let mut names = self.names.borrow_mut();
        let Some(real) = names.resolve(from) else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} does not exist", from.display()),
            ));
        };
        names.mapped.remove(from);
        names.hidden.insert(from.to_path_buf());
        names.hidden.remove(to);
        names.mapped.insert(to.to_path_buf(), real);
        Ok(())
    }

    async fn exists(&self, path: &Path) -> io::Result<bool> {
        if !self.control.power_loss() {
            return self.inner.exists(path).await;
        }
        let resolved = self.names.borrow().resolve(path);
        match resolved {
            Some(real) => self.inner.exists(&real).await,
            None => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_lite::future::block_on;

    use super::*;
    use crate::io::sim::SimFs;

    const ROOT: &str = "/data";

    fn layer(disk: &SimFs, control: &Arc<FaultControl>) -> FaultyFs<SimFs> {
        block_on(FaultyFs::new(
            disk.clone(),
            control.clone(),
            Path::new(ROOT),
        ))
        .expect("new")
    }

    /// The process dies: the layer's memory is gone, the disk keeps what it
    /// was given.
    fn power_cut(disk: &SimFs, control: &Arc<FaultControl>) -> FaultyFs<SimFs> {
        disk.crash_process();
        layer(disk, control)
    }

    fn write_file(fs: &FaultyFs<SimFs>, path: &Path, data: &[u8], sync: bool) {
        block_on(async {
            let file = fs.open(path, OpenMode::CREATE_BUFFERED).await?;
            file.write_at(data, 0).await?;
            if sync {
                file.sync_data().await?;
            }
            io::Result::Ok(())
        })
        .expect("write");
    }

    fn read_file(fs: &FaultyFs<SimFs>, path: &Path) -> Option<Vec<u8>> {
        block_on(async {
            let file = fs.open(path, OpenMode::EXISTING_BUFFERED).await.ok()?;
            let size = file.size().await.ok()?;
            file.read_at(0, size as usize).await.ok()
        })
    }

    fn setup() -> (SimFs, Arc<FaultControl>, FaultyFs<SimFs>) {
        let disk = SimFs::new(7);
        block_on(disk.create_dir_all(Path::new("/data/wal"))).expect("dir");
        let control = FaultControl::new(true);
        let fs = layer(&disk, &control);
        (disk, control, fs)
    }

    #[test]
    fn a_process_sees_its_writes_and_a_power_cut_keeps_only_synced_ones() {
        let (disk, control, fs) = setup();
        let kept = Path::new("/data/kept");
        let lost = Path::new("/data/lost");
        write_file(&fs, kept, b"durable", true);
        block_on(fs.sync_dir(Path::new(ROOT))).expect("sync dir");
        write_file(&fs, lost, b"in memory", false);
        block_on(fs.sync_dir(Path::new(ROOT))).expect("sync dir");
        assert_eq!(read_file(&fs, lost).as_deref(), Some(&b"in memory"[..]));
        let fs = power_cut(&disk, &control);
        assert_eq!(read_file(&fs, kept).as_deref(), Some(&b"durable"[..]));
        assert_eq!(
            read_file(&fs, lost).as_deref(),
            Some(&b""[..]),
            "the entry was synced, its data was not"
        );
    }

    #[test]
    fn entries_need_their_folder_synced() {
        let (disk, control, fs) = setup();
        let dir = Path::new(ROOT);
        write_file(&fs, Path::new("/data/old"), b"a", true);
        block_on(fs.sync_dir(dir)).expect("sync");
        // Created, renamed and removed, none of it synced.
        write_file(&fs, Path::new("/data/new"), b"b", true);
        block_on(fs.rename(Path::new("/data/old"), Path::new("/data/moved"))).expect("rename");
        let listed = block_on(fs.list_dir(dir)).expect("list");
        assert_eq!(
            listed,
            vec!["moved", "new", "wal"],
            "the process sees its changes"
        );
        let fs = power_cut(&disk, &control);
        let listed = block_on(fs.list_dir(dir)).expect("list");
        assert_eq!(listed, vec!["old", "wal"], "a power cut undoes them");
        assert_eq!(
            read_file(&fs, Path::new("/data/old")).as_deref(),
            Some(&b"a"[..])
        );

        // The same, synced this time.
        write_file(&fs, Path::new("/data/new"), b"b", true);
        block_on(fs.rename(Path::new("/data/old"), Path::new("/data/moved"))).expect("rename");
        block_on(fs.sync_dir(dir)).expect("sync");
        block_on(fs.remove_file(Path::new("/data/new"))).expect("remove");
        let fs = power_cut(&disk, &control);
        let listed = block_on(fs.list_dir(dir)).expect("list");
        assert_eq!(
            listed,
            vec!["moved", "new", "wal"],
            "the removal was not synced"
        );
        assert_eq!(
            read_file(&fs, Path::new("/data/moved")).as_deref(),
            Some(&b"a"[..])
        );
        block_on(fs.remove_file(Path::new("/data/new"))).expect("remove");
        block_on(fs.sync_dir(dir)).expect("sync");
        let fs = power_cut(&disk, &control);
        assert_eq!(
            block_on(fs.list_dir(dir)).expect("list"),
            vec!["moved", "wal"]
        );
    }

    #[test]
    fn wal_faults_touch_only_the_wal_and_lift() {
        let (disk, control, fs) = setup();
        assert!(control
            .apply("wal_write_fails bogus")
            .contains(&"bogus".to_string()));
        let wal = Path::new("/data/wal/ring");
        let error = block_on(async {
            let file = fs.open(wal, OpenMode::CREATE_BUFFERED).await?;
            file.write_at(b"x", 0).await
        });
        assert!(error.is_err(), "WAL writes fail while raised");
        write_file(&fs, Path::new("/data/segment"), b"ok", true);
        control.apply("");
        write_file(&fs, wal, b"x", true);

        // The broken build: the WAL's fdatasync succeeds without syncing.
        control.apply("skip_wal_sync");
        write_file(&fs, wal, b"y", true);
        assert_eq!(read_file(&fs, wal).as_deref(), Some(&b"y"[..]));
        block_on(fs.sync_dir(Path::new("/data/wal"))).expect("sync");
        control.apply("");
        let fs = power_cut(&disk, &control);
        assert_eq!(
            read_file(&fs, wal).as_deref(),
            Some(&b"x"[..]),
            "the unsynced write is lost"
        );
    }

    #[test]
    fn without_power_loss_every_call_passes_through() {
        let disk = SimFs::new(3);
        let control = FaultControl::new(false);
        block_on(disk.create_dir_all(Path::new(ROOT))).expect("dir");
        let fs = layer(&disk, &control);
        write_file(&fs, Path::new("/data/f"), b"direct", false);
        assert_eq!(
            read_file(&fs, Path::new("/data/f")).as_deref(),
            Some(&b"direct"[..])
        );
        block_on(fs.rename(Path::new("/data/f"), Path::new("/data/g"))).expect("rename");
        assert!(block_on(disk.exists(Path::new("/data/g"))).expect("exists"));
    }
}
