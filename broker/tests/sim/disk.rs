//! A simulated disk that takes time: every write and sync waits on the
//! manual clock (a little, or a lot while the disk is slow), so a crash can
//! land in the middle of a flush, as it can on a real disk.

use std::cell::{Cell, RefCell};
use std::io;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use narad_storage::io::sim::{SimFile, SimFs};
use narad_storage::io::{FileSystem, OpenMode, StorageFile};
use narad_storage::rng::SimRng;

use super::executor::Executor;

/// How long the disk takes.
pub struct Latency {
    executor: Rc<Executor>,
    rng: RefCell<SimRng>,
    /// While set, writes and syncs take up to [`SLOW_MS_MAX`].
    pub slow: Cell<bool>,
    /// While set, they take no time (a node opening its files at start,
    /// outside the executor).
    pub instant: Cell<bool>,
}

const FAST_MS_MAX: u64 = 1;
const SLOW_MS_MAX: u64 = 40;

impl Latency {
    pub fn new(executor: Rc<Executor>, seed: u64) -> Rc<Self> {
        Rc::new(Self {
            executor,
            rng: RefCell::new(SimRng::new(seed ^ 0xD15C_5105)),
            slow: Cell::new(false),
            instant: Cell::new(false),
        })
    }

    async fn wait(&self) {
        if self.instant.get() {
            return;
        }
        let max = if self.slow.get() {
            SLOW_MS_MAX
        } else {
            FAST_MS_MAX
        };
        let ms = self.rng.borrow_mut().below(max + 1);
        if ms > 0 {
            self.executor.sleep(Duration::from_millis(ms)).await;
        }
    }
}

/// [`SimFs`] with time taken by writes and syncs.
#[derive(Clone)]
pub struct TimedFs {
    pub inner: SimFs,
    latency: Rc<Latency>,
}

impl TimedFs {
    pub fn new(inner: SimFs, latency: Rc<Latency>) -> Self {
        Self { inner, latency }
    }
}

pub struct TimedFile {
    inner: SimFile,
    latency: Rc<Latency>,
}

impl StorageFile for TimedFile {
    async fn write_at(&self, data: &[u8], pos: u64) -> io::Result<()> {
        self.latency.wait().await;
        self.inner.write_at(data, pos).await
    }

    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        self.inner.read_at(pos, len).await
    }

    async fn sync_data(&self) -> io::Result<()> {
        self.latency.wait().await;
        self.inner.sync_data().await
    }

    async fn size(&self) -> io::Result<u64> {
        self.inner.size().await
    }
}

impl FileSystem for TimedFs {
    type File = TimedFile;

    async fn open(&self, path: &Path, mode: OpenMode) -> io::Result<TimedFile> {
        Ok(TimedFile {
            inner: self.inner.open(path, mode).await?,
            latency: self.latency.clone(),
        })
    }

    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path).await
    }

    async fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.latency.wait().await;
        self.inner.sync_dir(path).await
    }

    async fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        self.inner.list_dir(path).await
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path).await
    }

    async fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_dir_all(path).await
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to).await
    }

    async fn exists(&self, path: &Path) -> io::Result<bool> {
        self.inner.exists(path).await
    }
}
