//! Durable storage for openraft: the log, the vote and the state machine's
//! snapshot, in one directory, with plain files (openraft runs on its own
//! thread, not on a glommio shard).
//!
//! - `raft.log`: an append-only sequence of checksummed, self-locating frames
//!   (`narad_storage::frame`), each holding one JSON record: an entry, a
//!   truncation or a purge. Every append is fdatasynced before openraft is
//!   told it is flushed. Recovery replays the frames in order and stops at
//!   the first damaged one (a torn tail), cutting the file there. After a
//!   purge the file is rewritten whole (tmp, fsync, rename, fsync dir) once
//!   it holds mostly purged records.
//! - Every file goes through [`BlockingFs`], so a test node's power-loss
//!   switch covers these files as it covers the storage engine's.
//! - `vote.json`: the vote, rewritten whole on every change.
//! - `snapshot.json`: the state machine, its last applied log id and
//!   membership, written whole on every snapshot; the state machine is
//!   rebuilt from it at start and openraft re-applies the log after it.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use narad_storage::frame::{encode_frame, scan, FRAME_ALIGN};
use narad_storage::io::blocking::{AppendFile, BlockingFs};
use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, LogState, OptionalSend, RaftLogReader,
    RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError, StorageIOError, StoredMembership,
    Vote,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::state::{Applied, Command, MetaState, Refused};

/// What applying one entry answers.
pub type ApplyResult = Result<Applied, Refused>;

openraft::declare_raft_types!(
    /// The metastore's Raft types.
    pub TypeConfig:
        D = Command,
        R = ApplyResult,
        NodeId = u64,
        Node = BasicNode,
);

pub type NodeId = u64;
type RaftStorageError = StorageError<NodeId>;

const LOG_FILE: &str = "raft.log";
const VOTE_FILE: &str = "vote.json";
const SNAPSHOT_FILE: &str = "snapshot.json";
const LOG_FRAME_MAGIC: u32 = 0x4E52_4C47;
/// Rewrite the log once it holds this many more bytes than its live entries need.
const LOG_REWRITE_SLACK_BYTES: u64 = 4 * 1024 * 1024;

/// The applied state, as the metastore publishes it to shards.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetaView {
    pub state: MetaState,
    /// Index of the last applied entry (0 before any).
    pub applied_index: u64,
}

#[derive(Debug, Serialize, Deserialize)]
enum LogRecord {
    Entry(Entry<TypeConfig>),
    Truncate(u64),
    Purge(LogId<NodeId>),
}

fn io_error(error: impl std::error::Error + Send + Sync + 'static) -> std::io::Error {
    std::io::Error::other(error)
}

fn write_failed(error: std::io::Error) -> RaftStorageError {
    StorageIOError::write_logs(&error).into()
}

/// JSON with a crc32c line in front, so a damaged file is refused, not misread.
fn checksummed(json: &[u8]) -> Vec<u8> {
    let mut out = format!("{:08x}\n", crc32c::crc32c(json)).into_bytes();
    out.extend_from_slice(json);
    out
}

fn verify_checksummed(bytes: &[u8]) -> Option<&[u8]> {
    let (head, json) = bytes.split_at_checked(9)?;
    let crc = u32::from_str_radix(std::str::from_utf8(head.get(..8)?).ok()?, 16).ok()?;
    (crc32c::crc32c(json) == crc).then_some(json)
}

fn read_checksummed<T: for<'de> Deserialize<'de>>(
    fs: &BlockingFs,
    path: &Path,
) -> std::io::Result<Option<T>> {
    let Some(bytes) = fs.read(path)? else {
        return Ok(None);
    };
    let json = verify_checksummed(&bytes).ok_or_else(|| {
        std::io::Error::other(format!("{} is damaged (checksum)", path.display()))
    })?;
    serde_json::from_slice(json).map(Some).map_err(io_error)
}

#[derive(Debug)]
struct LogInner {
    fs: BlockingFs,
    dir: PathBuf,
    file: AppendFile,
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    last_purged: Option<LogId<NodeId>>,
    vote: Option<Vote<NodeId>>,
}

impl LogInner {
    fn write_record(&mut self, record: &LogRecord) -> std::io::Result<()> {
        let json = serde_json::to_vec(record).map_err(io_error)?;
        let mut frame = Vec::with_capacity(json.len() + 32);
        encode_frame(&mut frame, LOG_FRAME_MAGIC, self.file.len(), |buf| {
            buf.extend_from_slice(&json)
        });
        self.file.append(&frame)
    }

    fn live_bytes_estimate(&self) -> u64 {
        self.entries.len() as u64 * 256
    }

    /// Rewrites the log with only its live records.
    fn rewrite(&mut self) -> std::io::Result<()> {
        let mut bytes = Vec::new();
        let mut records: Vec<LogRecord> = Vec::new();
        if let Some(purged) = self.last_purged {
            records.push(LogRecord::Purge(purged));
        }
        records.extend(self.entries.values().cloned().map(LogRecord::Entry));
        for record in &records {
            let json = serde_json::to_vec(record).map_err(io_error)?;
            let pos = bytes.len() as u64;
            encode_frame(&mut bytes, LOG_FRAME_MAGIC, pos, |buf| {
                buf.extend_from_slice(&json)
            });
        }
        self.fs.write_whole(&self.dir, LOG_FILE, &bytes)?;
        self.file = self.fs.open_append(&self.dir.join(LOG_FILE))?;
        Ok(())
    }
}

/// The Raft log and vote. Clones share one store.
#[derive(Debug, Clone)]
pub struct LogStore {
    inner: Arc<Mutex<LogInner>>,
}

impl LogStore {
    /// Opens the log in `dir`, replaying it and cutting a torn tail.
    pub fn open(fs: &BlockingFs, dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(LOG_FILE);
        let bytes = fs.read(&path)?.unwrap_or_default();
        let found = scan(&bytes, LOG_FRAME_MAGIC, FRAME_ALIGN, |at, pos| {
            at as u64 == pos
        });
        let mut entries = BTreeMap::new();
        let mut last_purged = None;
        let mut valid_end = 0u64;
        for frame in &found.frames {
            if frame.at as u64 != valid_end {
                tracing::error!(path = %path.display(), at = valid_end, "Raft log is damaged; records after the damage are dropped");
                break;
            }
            let record: LogRecord = match bytes.get(frame.body.clone()).map(serde_json::from_slice)
            {
                Some(Ok(record)) => record,
                _ => break,
            };
            match record {
                LogRecord::Entry(entry) => {
                    entries.insert(entry.log_id.index, entry);
                }
                LogRecord::Truncate(index) => {
                    entries.split_off(&index);
                }
                LogRecord::Purge(log_id) => {
                    entries = entries.split_off(&(log_id.index + 1));
                    last_purged = Some(log_id);
                }
            }
            valid_end = frame.at as u64 + frame.len as u64;
        }
        let mut file = fs.open_append(&path)?;
        if valid_end < bytes.len() as u64 {
            tracing::warn!(path = %path.display(), cut = bytes.len() as u64 - valid_end, "Raft log had a torn tail; truncated");
            file.truncate(valid_end)?;
        }
        let vote = read_checksummed(fs, &dir.join(VOTE_FILE))?;
        Ok(Self {
            inner: Arc::new(Mutex::new(LogInner {
                fs: fs.clone(),
                dir: dir.to_path_buf(),
                file,
                entries,
                last_purged,
                vote,
            })),
        })
    }

    fn lock(&self) -> MutexGuard<'_, LogInner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, RaftStorageError> {
        Ok(self
            .lock()
            .entries
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, RaftStorageError> {
        let inner = self.lock();
        let last = inner
            .entries
            .values()
            .next_back()
            .map(|e| e.log_id)
            .or(inner.last_purged);
        Ok(LogState {
            last_purged_log_id: inner.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), RaftStorageError> {
        let mut inner = self.lock();
        let json = serde_json::to_vec(vote).map_err(|e| StorageIOError::write_vote(&e))?;
        inner
            .fs
            .write_whole(&inner.dir, VOTE_FILE, &checksummed(&json))
            .map_err(|e| StorageIOError::write_vote(&e))?;
        inner.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, RaftStorageError> {
        Ok(self.lock().vote)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), RaftStorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.lock();
        let mut result = Ok(());
        for entry in entries {
            if let Err(error) = inner.write_record(&LogRecord::Entry(entry.clone())) {
                result = Err(error);
                break;
            }
            inner.entries.insert(entry.log_id.index, entry);
        }
        let result = result.and_then(|()| inner.file.sync_data());
        let reported = result
            .as_ref()
            .map(|_| ())
            .map_err(|e| std::io::Error::new(e.kind(), e.to_string()));
        callback.log_io_completed(reported);
        result.map_err(write_failed)
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), RaftStorageError> {
        let mut inner = self.lock();
        inner
            .write_record(&LogRecord::Truncate(log_id.index))
            .map_err(write_failed)?;
        inner.file.sync_data().map_err(write_failed)?;
        inner.entries.split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), RaftStorageError> {
        let mut inner = self.lock();
        inner
            .write_record(&LogRecord::Purge(log_id))
            .map_err(write_failed)?;
        inner.file.sync_data().map_err(write_failed)?;
        inner.entries = inner.entries.split_off(&(log_id.index + 1));
        inner.last_purged = Some(log_id);
        if inner.file.len() > inner.live_bytes_estimate() + LOG_REWRITE_SLACK_BYTES {
            inner.rewrite().map_err(write_failed)?;
        }
        Ok(())
    }
}

/// What `snapshot.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, BasicNode>,
    state: MetaState,
}

#[derive(Debug)]
struct MachineInner {
    fs: BlockingFs,
    dir: PathBuf,
    state: MetaState,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    snapshot: Option<StoredSnapshot>,
    snapshot_count: u64,
    publish: watch::Sender<Arc<MetaView>>,
}

impl MachineInner {
    fn publish(&self) {
        let view = MetaView {
            state: self.state.clone(),
            applied_index: self.last_applied.map_or(0, |l| l.index),
        };
        self.publish.send_replace(Arc::new(view));
    }
}

/// The state machine. Clones share one machine.
#[derive(Debug, Clone)]
pub struct StateMachine {
    inner: Arc<Mutex<MachineInner>>,
}

impl StateMachine {
    /// Opens the state machine in `dir` from its last snapshot; every applied
    /// state is published on the returned channel.
    pub fn open(
        fs: &BlockingFs,
        dir: &Path,
    ) -> std::io::Result<(Self, watch::Receiver<Arc<MetaView>>)> {
        std::fs::create_dir_all(dir)?;
        let snapshot: Option<StoredSnapshot> = read_checksummed(fs, &dir.join(SNAPSHOT_FILE))?;
        let (publish, receiver) = watch::channel(Arc::new(MetaView::default()));
        let inner = MachineInner {
            fs: fs.clone(),
            dir: dir.to_path_buf(),
            state: snapshot
                .as_ref()
                .map(|s| s.state.clone())
                .unwrap_or_default(),
            last_applied: snapshot.as_ref().and_then(|s| s.meta.last_log_id),
            membership: snapshot
                .as_ref()
                .map(|s| s.meta.last_membership.clone())
                .unwrap_or_default(),
            snapshot,
            snapshot_count: 0,
            publish,
        };
        inner.publish();
        Ok((
            Self {
                inner: Arc::new(Mutex::new(inner)),
            },
            receiver,
        ))
    }

    fn lock(&self) -> MutexGuard<'_, MachineInner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, RaftStorageError> {
        let mut inner = self.lock();
        inner.snapshot_count += 1;
        let snapshot_id = format!(
            "{}-{}",
            inner.last_applied.map_or(0, |l| l.index),
            inner.snapshot_count
        );
        let meta = SnapshotMeta {
            last_log_id: inner.last_applied,
            last_membership: inner.membership.clone(),
            snapshot_id,
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            state: inner.state.clone(),
        };
        let json =
            serde_json::to_vec(&stored).map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        inner
            .fs
            .write_whole(&inner.dir, SNAPSHOT_FILE, &checksummed(&json))
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        inner.snapshot = Some(stored);
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(json)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), RaftStorageError>
    {
        let inner = self.lock();
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ApplyResult>, RaftStorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.lock();
        let mut results = Vec::new();
        for entry in entries {
            inner.last_applied = Some(entry.log_id);
            let result = match entry.payload {
                EntryPayload::Blank => Ok(Applied::Nothing),
                EntryPayload::Normal(command) => inner.state.apply(&command),
                EntryPayload::Membership(membership) => {
                    inner.membership = StoredMembership::new(Some(entry.log_id), membership);
                    Ok(Applied::Nothing)
                }
            };
            results.push(result);
        }
        inner.publish();
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, RaftStorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), RaftStorageError> {
        let stored: StoredSnapshot = serde_json::from_slice(snapshot.get_ref())
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        let mut inner = self.lock();
        inner
            .fs
            .write_whole(&inner.dir, SNAPSHOT_FILE, &checksummed(snapshot.get_ref()))
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        inner.state = stored.state.clone();
        inner.last_applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        inner.snapshot = Some(stored);
        inner.publish();
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, RaftStorageError> {
        let inner = self.lock();
        let Some(stored) = &inner.snapshot else {
            return Ok(None);
        };
        let json =
            serde_json::to_vec(stored).map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(Some(Snapshot {
            meta: stored.meta.clone(),
            snapshot: Box::new(Cursor::new(json)),
        }))
    }
}
