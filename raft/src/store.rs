//! Durable storage for openraft: the log, the vote and the state machine's
//! snapshot, in one directory, with plain files (openraft runs on its own
//! thread, not on a glommio shard).
//!
//! - `raft.log`: an append-only sequence of checksummed, self-locating frames
//!   (`narad_storage::frame`), each holding one JSON record: an entry, a
//!   truncation or a purge. Every append is fdatasynced before openraft is
//!   told it is flushed. Recovery replays every valid frame in order,
//!   resynchronising past damaged ones (a damaged frame never hides the
//!   valid ones after it). Damage after the last valid frame is a torn tail
//!   (a crash in the middle of an append, never acknowledged) and is cut
//!   off. Damage with valid frames after it was durable, so what it held may
//!   have been acknowledged: it is accepted only if the records after it
//!   replaced, truncated or purged every entry it could have held; otherwise
//!   the log refuses to open, naming the missing entries (a power cut during
//!   a multi-entry append that reached the disk out of order looks the same
//!   and is refused too: it cannot be told from damage to acknowledged
//!   entries). After a purge the file is rewritten whole (tmp, fsync,
//!   rename, fsync dir) once it holds mostly purged records.
//! - Every file goes through [`BlockingFs`], so a test node's power-loss
//!   switch covers these files as it covers the storage engine's.
//! - `vote.json`: the vote, rewritten whole on every change.
//! - `snapshot.json`: the state machine, its last applied log id and
//!   membership, written whole on every snapshot; the state machine is
//!   rebuilt from it at start and openraft re-applies the log after it.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Range, RangeBounds};
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

/// An intact frame (its checksums hold) whose record does not decode: it is
/// not damage, and cutting it could destroy what a newer version wrote.
fn unreadable_record(path: &Path, at: u64, why: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!(
            "{}: the record at byte {at} is intact but cannot be read ({why}); refusing to open the Raft log",
            path.display()
        ),
    )
}

/// Entries that damage in the middle of the log may have held and that no
/// record after it has yet replaced, truncated or purged.
#[derive(Debug, Clone)]
struct Unaccounted {
    /// Where the damage lies in the file.
    damage: Range<u64>,
    /// The first index the damage may have held: the one after the last
    /// entry before it.
    first: u64,
    /// The last: the index before the next entry appended after it. `None`
    /// until an entry or truncation after the damage bounds it.
    last: Option<u64>,
}

impl Unaccounted {
    /// Every entry from `index` on was truncated or replaced; the next
    /// entry appended after the damage bounds what it held, since an append
    /// follows the log's last entry (openraft leaves no hole). False once
    /// nothing is left unaccounted.
    fn cut_from(&mut self, index: u64) -> bool {
        if index <= self.first {
            return false;
        }
        let below = index - 1;
        self.last = Some(self.last.map_or(below, |last| last.min(below)));
        true
    }

    /// Every entry up to `index` was purged. False once nothing is left.
    fn purge_to(&mut self, index: u64) -> bool {
        self.first = self.first.max(index.saturating_add(1));
        self.last.is_none_or(|last| self.first <= last)
    }
}

/// The log's state while its records are replayed.
#[derive(Debug, Default)]
struct Replay {
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    last_purged: Option<LogId<NodeId>>,
    unaccounted: Vec<Unaccounted>,
}

impl Replay {
    /// The index the next appended entry takes (0 for the first: openraft
    /// starts the log at 0).
    fn next_index(&self) -> u64 {
        self.entries
            .keys()
            .next_back()
            .or(self.last_purged.as_ref().map(|p| &p.index))
            .map_or(0, |index| index + 1)
    }

    /// Damaged bytes with valid records after them: they were durable, and
    /// may have held entries from the next index on.
    fn damaged(&mut self, damage: Range<u64>) {
        let first = self.next_index();
        self.unaccounted.push(Unaccounted {
            damage,
            first,
            last: None,
        });
    }

    fn cut_from(&mut self, index: u64) {
        self.entries.split_off(&index);
        self.unaccounted.retain_mut(|u| u.cut_from(index));
    }

    fn apply(&mut self, record: LogRecord) {
        match record {
            LogRecord::Entry(entry) => {
                let index = entry.log_id.index;
                // Raft's rule: an entry that differs from the one at its
                // index replaces it and everything after it (so a damaged
                // truncation record cannot bring back what it removed).
                // An identical one changes nothing.
                let same = self
                    .entries
                    .get(&index)
                    .is_some_and(|held| held.log_id == entry.log_id);
                if !same {
                    self.cut_from(index);
                }
                self.entries.insert(index, entry);
            }
            LogRecord::Truncate(index) => self.cut_from(index),
            LogRecord::Purge(log_id) => {
                self.entries = self.entries.split_off(&(log_id.index + 1));
                self.last_purged = Some(log_id);
                self.unaccounted.retain_mut(|u| u.purge_to(log_id.index));
            }
        }
    }

    /// Refuses a log whose damage hides entries, or whose entries are not
    /// contiguous from the purge point.
    fn check(&self, path: &Path) -> std::io::Result<()> {
        let missing = |what: String| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{}: {what}; refusing to open the Raft log rather than forget entries this node may have acknowledged",
                    path.display()
                ),
            )
        };
        if let Some(hidden) = self.unaccounted.first() {
            let Range { start, end } = hidden.damage;
            let what = match hidden.last {
                Some(last) => format!(
                    "entries {}..={last} are missing: damaged records at bytes {start}..{end} hid them",
                    hidden.first
                ),
                None => format!(
                    "damaged records at bytes {start}..{end} may have held entries {}.. and no later record accounts for them",
                    hidden.first
                ),
            };
            return Err(missing(what));
        }
        let mut expected = self.last_purged.map_or(0, |p| p.index + 1);
        for &index in self.entries.keys() {
            if index != expected {
                return Err(missing(format!(
                    "entries {expected}..={} are missing",
                    index - 1
                )));
            }
            expected = index + 1;
        }
        Ok(())
    }
}

/// The Raft log and vote. Clones share one store.
#[derive(Debug, Clone)]
pub struct LogStore {
    inner: Arc<Mutex<LogInner>>,
}

impl LogStore {
    /// Opens the log in `dir`, replaying it and cutting a torn tail; refuses
    /// a log whose damage hides entries (see the module documentation).
    pub fn open(fs: &BlockingFs, dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(LOG_FILE);
        let bytes = fs.read(&path)?.unwrap_or_default();
        let found = scan(&bytes, LOG_FRAME_MAGIC, FRAME_ALIGN, |at, pos| {
            at as u64 == pos
        });
        let mut replay = Replay::default();
        let mut valid_end = 0u64;
        for frame in &found.frames {
            let at = frame.at as u64;
            if at != valid_end {
                tracing::error!(path = %path.display(), from = valid_end, to = at, "Raft log is damaged; replaying the valid records after the damage");
                replay.damaged(valid_end..at);
            }
            let record: LogRecord = bytes
                .get(frame.body.clone())
                .ok_or_else(|| unreadable_record(&path, at, "its body is out of the file"))
                .and_then(|body| {
                    serde_json::from_slice(body)
                        .map_err(|e| unreadable_record(&path, at, &e.to_string()))
                })?;
            replay.apply(record);
            valid_end = at + frame.len as u64;
        }
        replay.check(&path)?;
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
                entries: replay.entries,
                last_purged: replay.last_purged,
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

#[cfg(test)]
mod tests {
    use super::*;
    use narad_storage::frame::FoundFrame;
    use openraft::CommittedLeaderId;

    fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Blank,
        }
    }

    fn log_id(term: u64, index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    /// Writes `records` through a store's own encoder, each fdatasynced as
    /// `append`, `truncate` and `purge` do, and returns the log file's path.
    fn write_log(dir: &Path, records: &[LogRecord]) -> PathBuf {
        let store = LogStore::open(&BlockingFs::real(), dir).expect("open");
        let mut inner = store.lock();
        for record in records {
            inner.write_record(record).expect("write");
            inner.file.sync_data().expect("sync");
        }
        dir.join(LOG_FILE)
    }

    fn frames(path: &Path) -> Vec<FoundFrame> {
        let bytes = std::fs::read(path).expect("read log");
        scan(&bytes, LOG_FRAME_MAGIC, FRAME_ALIGN, |at, pos| {
            at as u64 == pos
        })
        .frames
    }

    /// Flips one byte in the body of the `nth` frame: its checksum fails.
    fn damage(path: &Path, nth: usize) {
        let frame = frames(path).get(nth).cloned().expect("frame to damage");
        let mut bytes = std::fs::read(path).expect("read log");
        let byte = bytes.get_mut(frame.body.start + 2).expect("body byte");
        *byte ^= 0x20;
        std::fs::write(path, &bytes).expect("write log");
    }

    /// (term, index) of every entry the store holds, in order.
    fn held(store: &LogStore) -> Vec<(u64, u64)> {
        store
            .lock()
            .entries
            .values()
            .map(|e| (e.log_id.leader_id.term, e.log_id.index))
            .collect()
    }

    fn entries(term: u64, indexes: std::ops::RangeInclusive<u64>) -> Vec<LogRecord> {
        indexes.map(|i| LogRecord::Entry(entry(term, i))).collect()
    }

    fn refusal(dir: &Path) -> String {
        match LogStore::open(&BlockingFs::real(), dir) {
            Ok(store) => panic!("opened a log that hides entries: {:?}", held(&store)),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn a_damaged_entry_with_valid_entries_after_it_is_refused_not_truncated() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = write_log(tmp.path(), &entries(1, 0..=5));
        damage(&path, 2);
        let before = std::fs::read(&path).expect("read log");

        let error = refusal(tmp.path());
        assert!(error.contains("raft.log"), "names the file: {error}");
        assert!(
            error.contains("2..=2"),
            "names the missing entries: {error}"
        );
        assert_eq!(
            std::fs::read(&path).expect("read log"),
            before,
            "the valid entries after the damage are still in the file"
        );
        // Refusing again gives the same answer: nothing was cut.
        assert!(refusal(tmp.path()).contains("2..=2"));
    }

    #[test]
    fn damage_over_several_entries_names_the_whole_missing_range() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = write_log(tmp.path(), &entries(1, 0..=6));
        damage(&path, 2);
        // The third valid frame is now entry 3's: damage it too.
        damage(&path, 2);
        let error = refusal(tmp.path());
        assert!(error.contains("2..=3"), "names entries 2 and 3: {error}");
    }

    #[test]
    fn a_damaged_first_entry_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = write_log(tmp.path(), &entries(1, 0..=3));
        damage(&path, 0);
        let error = refusal(tmp.path());
        assert!(error.contains("0..=0"), "names entry 0: {error}");
    }

    #[test]
    fn a_damaged_last_entry_followed_only_by_a_purge_is_refused() {
        // The purge was fdatasynced after entry 4, so entry 4 was durable
        // (and maybe acknowledged): it may not be forgotten.
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut records = entries(1, 0..=4);
        records.push(LogRecord::Purge(log_id(1, 2)));
        let path = write_log(tmp.path(), &records);
        damage(&path, 4);
        let error = refusal(tmp.path());
        assert!(error.contains("raft.log"), "names the file: {error}");
        assert!(error.contains("4.."), "names entries from 4 on: {error}");
    }

    #[test]
    fn a_torn_tail_is_cut_and_the_entries_before_it_are_kept() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = write_log(tmp.path(), &entries(1, 0..=3));
        let valid_end = frames(&path).last().map(|f| f.at + f.len).expect("frames");
        // Half a frame at the end, as a crash in the middle of an append leaves.
        let mut bytes = std::fs::read(&path).expect("read log");
        let half: Vec<u8> = bytes.iter().take(40).copied().collect();
        bytes.extend_from_slice(&half);
        std::fs::write(&path, &bytes).expect("write log");

        let store = LogStore::open(&BlockingFs::real(), tmp.path()).expect("open");
        assert_eq!(held(&store), vec![(1, 0), (1, 1), (1, 2), (1, 3)]);
        assert_eq!(
            std::fs::metadata(&path).expect("stat").len(),
            valid_end as u64,
            "the torn tail is cut"
        );
        drop(store);

        // A damaged last frame is a torn tail too: its entry was never
        // acknowledged (acknowledgement follows the fdatasync).
        damage(&path, 3);
        let store = LogStore::open(&BlockingFs::real(), tmp.path()).expect("open");
        assert_eq!(held(&store), vec![(1, 0), (1, 1), (1, 2)]);
        {
            let mut inner = store.lock();
            inner
                .write_record(&LogRecord::Entry(entry(2, 3)))
                .expect("append");
            inner.file.sync_data().expect("sync");
        }
        drop(store);
        let store = LogStore::open(&BlockingFs::real(), tmp.path()).expect("reopen");
        assert_eq!(held(&store), vec![(1, 0), (1, 1), (1, 2), (2, 3)]);
    }

    /// Entries 0..=3 of term 1, truncated at 2 and 2..=3 written again in
    /// term 2: frames 0..=3 old entries, 4 the truncation, 5 and 6 the new.
    fn overwritten_log(dir: &Path) -> PathBuf {
        let mut records = entries(1, 0..=3);
        records.push(LogRecord::Truncate(2));
        records.extend(entries(2, 2..=3));
        write_log(dir, &records)
    }

    #[test]
    fn damage_in_an_overwritten_entry_hides_nothing() {
        for nth in [2, 3] {
            let tmp = tempfile::tempdir().expect("tempdir");
            let path = overwritten_log(tmp.path());
            damage(&path, nth);
            let store = LogStore::open(&BlockingFs::real(), tmp.path()).expect("open");
            assert_eq!(
                held(&store),
                vec![(1, 0), (1, 1), (2, 2), (2, 3)],
                "damaged frame {nth}"
            );
        }
    }

    #[test]
    fn a_damaged_truncation_does_not_bring_back_the_entries_it_removed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut records = entries(1, 0..=4);
        records.push(LogRecord::Truncate(2));
        records.extend(entries(2, 2..=3));
        let path = write_log(tmp.path(), &records);
        damage(&path, 5);
        let store = LogStore::open(&BlockingFs::real(), tmp.path()).expect("open");
        // Entry 2 of term 2 replaces entry 2 of term 1 and everything after it
        // (Raft's rule), so the old entry 4 does not come back.
        assert_eq!(held(&store), vec![(1, 0), (1, 1), (2, 2), (2, 3)]);
    }

    #[test]
    fn damage_in_a_duplicate_entry_hides_nothing() {
        for nth in [2, 3] {
            let tmp = tempfile::tempdir().expect("tempdir");
            let mut records = entries(1, 0..=2);
            records.extend(entries(1, 2..=3));
            let path = write_log(tmp.path(), &records);
            damage(&path, nth);
            let store = LogStore::open(&BlockingFs::real(), tmp.path()).expect("open");
            assert_eq!(
                held(&store),
                vec![(1, 0), (1, 1), (1, 2), (1, 3)],
                "damaged frame {nth}"
            );
        }
    }

    #[test]
    fn damage_in_a_purged_entry_hides_nothing_and_stays_harmless() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut records = entries(1, 0..=5);
        records.push(LogRecord::Purge(log_id(1, 3)));
        let path = write_log(tmp.path(), &records);
        damage(&path, 1);
        let store = LogStore::open(&BlockingFs::real(), tmp.path()).expect("open");
        assert_eq!(held(&store), vec![(1, 4), (1, 5)]);
        assert_eq!(store.lock().last_purged, Some(log_id(1, 3)));
        {
            let mut inner = store.lock();
            inner
                .write_record(&LogRecord::Entry(entry(1, 6)))
                .expect("append");
            inner.file.sync_data().expect("sync");
        }
        drop(store);
        let store = LogStore::open(&BlockingFs::real(), tmp.path()).expect("reopen");
        assert_eq!(held(&store), vec![(1, 4), (1, 5), (1, 6)]);
    }

    #[test]
    fn a_hole_in_an_undamaged_log_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut records = entries(1, 0..=1);
        records.extend(entries(1, 3..=4));
        write_log(tmp.path(), &records);
        let error = refusal(tmp.path());
        assert!(error.contains("entries 2..=2 are missing"), "{error}");
    }

    #[test]
    fn an_intact_record_that_does_not_decode_is_refused_not_cut() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = write_log(tmp.path(), &entries(1, 0..=1));
        let mut bytes = std::fs::read(&path).expect("read log");
        let at = bytes.len() as u64;
        encode_frame(&mut bytes, LOG_FRAME_MAGIC, at, |buf| {
            buf.extend_from_slice(br#"{"FromANewerVersion":1}"#)
        });
        std::fs::write(&path, &bytes).expect("write log");
        let error = refusal(tmp.path());
        assert!(error.contains("raft.log"), "names the file: {error}");
        assert_eq!(
            std::fs::read(&path).expect("read log"),
            bytes,
            "nothing cut"
        );
    }
}
