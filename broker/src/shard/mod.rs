//! One shard: a glommio executor that owns an ingress WAL ring, a
//! dispatcher and the partitions of this node that hash to it, and serves
//! the API on the shared client port.
//!
//! A request may need partitions of another shard or node: commits,
//! consumes, settles and figures then travel as operations (`rpc/`) to the
//! shard that owns them, through the shard's one transport (the mesh to its
//! node's shards, QUIC to other nodes): the dispatcher commits to the
//! owner, unpinned consumes lease from other nodes after this node's own
//! partitions, and receipts are settled where they were issued. Each shard
//! answers every operation in one place (`serve.rs`), whoever sent it.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use narad_net::http_server::NodeBudget;
use narad_net::types::{ConsumeRequest, ConsumedMessage, SettleAction, TopicPatch};
use narad_net::{ApiError, ErrorCode};
use narad_raft::node::MetaSnapshot;
use narad_raft::state::{Applied, Command, MetaState, NodeId, Topic, TopicConfig};
use narad_raft::store::MetaView;
use narad_storage::clock::{Now, SharedClock};
use narad_storage::consumer::{ConsumerConfig, ConsumerState};
use narad_storage::error::StorageError;
use narad_storage::io::faulty::{Fault, FaultControl, FaultyFs};
use narad_storage::io::glommio_fs::GlommioFs;
use narad_storage::io::FileSystem;
use narad_storage::limits::SEGMENT_PREALLOC_STEP_BYTES_DEFAULT;
use narad_storage::log::{LogConfig, Message, PartitionLog};
use narad_storage::wal::{Wal, WalConfig, WalPos, WalRecord, WalRecordRef};

use crate::auth::VerifiedPasswords;
use crate::controller::place;
use crate::dispatcher::{
    CommitBatch, Destination, DispatchRecord, Dispatcher, DispatcherConfig, FailureOutcome,
};
use crate::errors::{from_meta, from_owner, from_storage};
use crate::idempotency::{Claim, HeldCopy, KeyId, NodeKeys, Wanted};
use crate::limits::tail_cache_share;
use crate::limits::{
    ADOPT_CHUNK_RECORDS, ADOPT_FULL_RETRY, AVAILABLE_CALL_TIMEOUT, AVAILABLE_COALESCE,
    COLLECT_CALL_TIMEOUT, COLLECT_TOP_UP_TIMEOUT, COMMIT_CALL_TIMEOUT, DEAD_LETTER_FULL_RETRY,
    GAINED_TOPICS_MAX, GAUGES_TIMEOUT, IDEMPOTENT_CLAIM_ROUNDS, ID_INCARNATION_BITS,
    ID_SEQUENCE_BITS, ID_SHARD_BITS, LEASE_IDS_PER_OPEN, LOCAL_APPLY_WAIT, SETTLE_CALL_TIMEOUT,
    STATS_CALL_TIMEOUT, STOP_DRAIN_POLL, STOP_DRAIN_TIMEOUT,
};
use crate::metastore::Metastore;
use crate::owner::{OwnerConfig, OwnerError, PartitionOwner, PartitionStats};
use crate::partitioner::partition_for_key;
use crate::receipt::{Receipt, ReceiptKey};
use crate::remote::Peers;
use crate::route::{
    consume_order, group_by, reroute_target, rotated, InOrder, Location, Placement,
};
use crate::rpc::{
    Address, Available, Browse, Browsed, CallError, Collect, Collected, Commit, Committed,
    CopyFigures, Envelope, Figures, Gained, Gauges, KeyAt, KeyedCommit, Links, Operation, Produce,
    ProduceKey, Produced, RatePoints, Reach, Ready, Record, Search, SearchPage, Searched, Settle,
    SettleOutcome, Settled, ShardGauges, Stats, TopicFigures, TopicRates, TopicRef, Transport,
    Wake,
};
use crate::runtime::SharedRuntime;
use crate::schemas::CompiledSchemas;
use crate::settings::Settings;
use crate::signal::Signal;
use crate::wakeups::{PollWaiters, EVERY_POLL};

mod browse;
mod child_cursor;
mod children;
mod consume;
mod dispatch;
mod fanout;
mod health;
mod journal;
mod move_copy;
mod moves;
mod nodes;
mod owners;
mod produce;
mod redrive;
mod security;
mod serve;
mod settle;
mod stop;
mod tasks;
mod topics;

pub use crate::limits::MAX_MESSAGE_BYTES_DEFAULT;
pub use children::{child_statuses, ChildStatus};
pub use health::MemberReadiness;
pub use produce::{Incoming, ProduceOutcome};
use produce::{Keyed, Placed};
pub use redrive::RedriveStatus;

type OwnerKey = (String, u64, u32);
/// The metadata version the cached topics come from, and the topics.
/// This shard's copy of the metadata, and the topics of that version shared
/// by the requests that need them.
struct Metadata {
    snapshot: MetaSnapshot,
    topics: HashMap<String, Rc<Topic>>,
}

impl Metadata {
    /// The current view (refreshed if the metastore applied something).
    fn view(&mut self) -> Arc<MetaView> {
        let (view, changed) = self.snapshot.current();
        let view = view.clone();
        if changed {
            self.topics.clear();
        }
        view
    }

    /// A topic already shared at the current version.
    fn topic(&mut self, name: &str) -> Option<Rc<Topic>> {
        if self.snapshot.current().1 {
            self.topics.clear();
        }
        self.topics.get(name).cloned()
    }
}
/// The file system of a node: the real disk under the fault layer, which
/// passes every call through unless a test switched it on.
pub type NodeFs = FaultyFs<GlommioFs>;
type Owner<F> = Rc<PartitionOwner<F>>;

enum OwnerSlot<F: FileSystem> {
    Opening,
    Ready(Owner<F>),
}

/// A message id: unique for the life of the cluster, since the incarnation
/// is drawn at random at every start and the sequence counts within it.
fn message_id(identity: ShardIdentity, seq: u64) -> u128 {
    let incarnation_mask = (1u128 << ID_INCARNATION_BITS) - 1;
    let sequence_mask = (1u128 << ID_SEQUENCE_BITS) - 1;
    (u128::from(identity.node_id) << (ID_SHARD_BITS + ID_INCARNATION_BITS + ID_SEQUENCE_BITS))
        | (u128::from(identity.shard_id) << (ID_INCARNATION_BITS + ID_SEQUENCE_BITS))
        | ((u128::from(identity.incarnation) & incarnation_mask) << ID_SEQUENCE_BITS)
        | (u128::from(seq) & sequence_mask)
}

/// An owner slot marked `Opening` by a request: removed again (and its
/// waiters woken) if the request is dropped before the open finished.
struct OpeningSlot<'a, F: FileSystem> {
    shard: &'a Shard<F>,
    key: Option<OwnerKey>,
}

impl<F: FileSystem> OpeningSlot<'_, F> {
    /// The open finished: its caller fills or removes the slot.
    fn settled(mut self) {
        self.key = None;
    }
}

impl<F: FileSystem> Drop for OpeningSlot<'_, F> {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else {
            return;
        };
        let mut owners = self.shard.owners.slots.borrow_mut();
        if matches!(owners.get(&key), Some(OwnerSlot::Opening)) {
            owners.remove(&key);
        }
        drop(owners);
        self.shard.owners.changed.notify();
    }
}

/// Identity of this shard's process, for message ids and receipts.
#[derive(Debug, Clone, Copy)]
pub struct ShardIdentity {
    pub node_id: u16,
    pub shard_id: u16,
    /// How many shards the node has.
    pub shards: u16,
    /// Increases on every start of the node (kept in its data folder).
    pub epoch: u32,
    /// Drawn at random at every start: message ids and receipts carry it,
    /// so ids never repeat and receipts of an earlier start end, even when
    /// the data folder was lost or copied.
    pub incarnation: u64,
}

/// What a shard is made of.
pub struct ShardParts<F: FileSystem = NodeFs> {
    pub identity: ShardIdentity,
    pub settings: Arc<Settings>,
    /// The way to the node's other shards and to other nodes.
    pub links: Links,
    pub wal: Rc<Wal<F>>,
    /// The other nodes of the cluster; `None` for a single node.
    pub peers: Option<Arc<Peers>>,
    pub env: ShardEnv<F>,
}

pub struct Shard<F: FileSystem = NodeFs> {
    identity: ShardIdentity,
    settings: Arc<Settings>,
    links: Links,
    env: ShardEnv<F>,
    wal: Rc<Wal<F>>,
    /// This shard's copy of the metadata (no shared lock per request).
    metadata: RefCell<Metadata>,
    owners: Owners<F>,
    dispatch: Dispatch,
    remote: Remote,
    flow: Flow,
    /// Passwords checked here, and schemas compiled here.
    passwords: VerifiedPasswords,
    /// Password hashes under way on this shard.
    hashing: Cell<usize>,
    schemas: CompiledSchemas,
    /// The copies to children of this shard's partitions.
    copies: children::Copies,
    /// Partitions frozen for a handover here, and moves run here.
    moves: moves::Moves,
    /// Journal records the WAL held at the start, by partition, until the
    /// partition opens here and appends them at their offsets (or turns
    /// out to be owned elsewhere, and they are committed the usual way).
    journal_replay: RefCell<HashMap<OwnerKey, Vec<(WalPos, WalRecord)>>>,
    /// Produces waiting for their partition's next journal batch.
    journal_queues: RefCell<HashMap<OwnerKey, journal::JournalQueue>>,
    /// This shard itself, for the tasks it spawns.
    me: std::rc::Weak<Self>,
}

/// What the node gives each of its shards.
pub struct ShardEnv<F: FileSystem = NodeFs> {
    pub data_dir: PathBuf,
    pub fs: F,
    pub clock: SharedClock,
    /// Timers and tasks (glommio in the node).
    pub runtime: SharedRuntime,
    /// The cluster's metadata (openraft in a node).
    pub meta: Rc<dyn Metastore>,
    pub receipt_key: ReceiptKey,
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// Set once any shard's ingress WAL failed: the node answers 500 to
    /// produces until it restarts.
    pub wal_failed: Arc<AtomicBool>,
    /// The node's connections and request bodies (for its metrics).
    pub http_budget: Arc<NodeBudget>,
    /// Where remote children's copies leave the node.
    pub ship: Arc<dyn crate::ship::Ship + Send + Sync>,
    /// The fault switches (`testing.faults`; all off in production). The
    /// storage faults act in `fs`; [`Fault::HoldMoveFreeze`] acts here.
    pub faults: Arc<FaultControl>,
    /// The idempotency keys the node accepted, all shards.
    pub keys: Arc<NodeKeys>,
    /// Partitions that records recovered from the node's WALs go to.
    pub recovered: Arc<crate::recovered::Recovered>,
    /// The topic folders in use on the node, and those being removed.
    pub folders: Arc<crate::folders::TopicFolders>,
}

/// The partitions of this shard, each opened on first use.
struct Owners<F: FileSystem> {
    slots: RefCell<HashMap<OwnerKey, OwnerSlot<F>>>,
    /// Raised when a slot is filled or removed.
    changed: Signal,
    /// The first lease id of the next owner opened: each open takes
    /// [`LEASE_IDS_PER_OPEN`] ids, so receipts of one start of the node
    /// never repeat, even for a partition opened again.
    next_lease_ids: Cell<u64>,
}

/// Accepted records on their way to their partition's owner.
struct Dispatch {
    queue: RefCell<Dispatcher>,
    /// Records appended to the WAL and not yet durable, in WAL order, with
    /// where each ends: [`Shard::dispatch_durable`] moves them on.
    awaiting: RefCell<VecDeque<(WalPos, Destination, DispatchRecord)>>,
    /// Idempotency keys of records appended and not yet durable, in WAL
    /// order, with where each record ends.
    key_marks: RefCell<VecDeque<(WalPos, HeldCopy)>>,
    /// Raised when records are queued or the queue should look again.
    signal: Signal,
    /// Per partition rerouted from: when it was last logged, and the
    /// records moved since ([`REROUTE_LOG_INTERVAL_MS`]).
    reroute_log: RefCell<HashMap<Destination, (Option<u64>, usize)>>,
}

/// This shard's side of the other nodes.
struct Remote {
    /// The other nodes of the cluster and what is known of their messages;
    /// `None` for a single node.
    peers: Option<Arc<Peers>>,
    /// Raised when messages became available here, for other nodes, with
    /// how many of each topic since the notices last took them.
    notice: Signal,
    gained: RefCell<BTreeMap<String, u32>>,
    /// Requests of other nodes being answered, and a signal when one ends.
    in_flight: Cell<usize>,
    done: Signal,
}

/// The shard's own small state: signals, turns, and where it is in a stop.
struct Flow {
    /// The long polls parked here, woken by gains of their topic
    /// (`wakeups.rs`).
    polls: PollWaiters,
    /// Raised when a partition queued messages for its dead-letter topic.
    dead_letters_due: Signal,
    stopping: Cell<bool>,
    /// Set once acks were flushed for the stop: later settles are refused,
    /// since nothing would write them.
    acks_closed: Cell<bool>,
    /// The sequence of the next message id.
    next_seq: Cell<u64>,
    /// Idempotency keys this shard's partition owners let go before their
    /// window ended (their table was full).
    owner_keys_forgotten: Cell<u64>,
    /// Rotates starts (partitions, shards, nodes, reroutes) so none starves.
    round_robin: Cell<u32>,
    /// Commits through the owner journal under way (a stop waits for them).
    journal_commits: Cell<usize>,
}

impl<F: FileSystem> Shard<F> {
    pub fn new(parts: ShardParts<F>) -> Rc<Self> {
        let ShardParts {
            identity,
            settings,
            links,
            wal,
            peers,
            env,
        } = parts;
        let dispatcher = Dispatcher::new(DispatcherConfig::of(&settings));
        let metadata = Metadata {
            snapshot: env.meta.snapshot(),
            topics: HashMap::new(),
        };
        Rc::new_cyclic(|me| Self {
            identity,
            settings,
            links,
            env,
            wal,
            metadata: RefCell::new(metadata),
            owners: Owners {
                slots: RefCell::new(HashMap::new()),
                changed: Signal::default(),
                next_lease_ids: Cell::new(1),
            },
            dispatch: Dispatch {
                queue: RefCell::new(dispatcher),
                awaiting: RefCell::new(VecDeque::new()),
                key_marks: RefCell::new(VecDeque::new()),
                signal: Signal::default(),
                reroute_log: RefCell::new(HashMap::new()),
            },
            remote: Remote {
                peers,
                notice: Signal::default(),
                gained: RefCell::default(),
                in_flight: Cell::new(0),
                done: Signal::default(),
            },
            flow: Flow {
                polls: PollWaiters::new(
                    usize::from(identity.shards),
                    usize::from(identity.shard_id),
                ),
                dead_letters_due: Signal::default(),
                stopping: Cell::new(false),
                acks_closed: Cell::new(false),
                next_seq: Cell::new(0),
                owner_keys_forgotten: Cell::new(0),
                round_robin: Cell::new(0),
                journal_commits: Cell::new(0),
            },
            passwords: VerifiedPasswords::default(),
            hashing: Cell::new(0),
            schemas: CompiledSchemas::default(),
            copies: RefCell::default(),
            moves: moves::Moves::default(),
            journal_replay: RefCell::default(),
            journal_queues: RefCell::default(),
            me: me.clone(),
        })
    }

    /// The node's connections and request bodies held now.
    pub fn http_budget(&self) -> &NodeBudget {
        &self.env.http_budget
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn meta(&self) -> &dyn Metastore {
        self.env.meta.as_ref()
    }

    pub fn wal(&self) -> &Wal<F> {
        &self.wal
    }

    /// The Prometheus text of every recorded metric.
    pub fn render_metrics(&self) -> String {
        self.env.metrics.render()
    }

    pub fn is_stopping(&self) -> bool {
        self.flow.stopping.get()
    }

    /// Both clocks at once: what a partition owner takes.
    fn now(&self) -> Now {
        self.env.clock.now()
    }

    /// The monotonic clock: every duration, deadline and timer of the shard.
    pub fn mono(&self) -> u64 {
        self.env.clock.mono_ms()
    }

    /// The wall clock: times that are kept, shown or sent to other nodes.
    fn wall(&self) -> u64 {
        self.env.clock.now_ms()
    }

    /// This shard's index among its node's shards.
    fn shard_index(&self) -> usize {
        usize::from(self.identity.shard_id)
    }

    /// The next turn of the rotation that keeps starts fair.
    fn next_turn(&self) -> u32 {
        let turn = self.flow.round_robin.get().wrapping_add(1);
        self.flow.round_robin.set(turn);
        turn
    }

    /// Sends an operation to another shard or node and waits for its reply,
    /// at most `timeout`.
    async fn call<O: Operation>(
        &self,
        to: Address,
        op: O,
        timeout: Option<Duration>,
    ) -> Result<O::Reply, CallError> {
        crate::rpc::call(&self.links, self.env.runtime.as_ref(), to, op, timeout).await
    }
}

/// A number of messages as a wake-up counts them.
fn count_of(messages: usize) -> u32 {
    u32::try_from(messages).unwrap_or(EVERY_POLL)
}

/// Runs `tick` every `interval` until the shard stops.
pub async fn every<F: FileSystem>(
    shard: Rc<Shard<F>>,
    interval: Duration,
    tick: impl Fn(Rc<Shard<F>>) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>,
) {
    while !shard.is_stopping() {
        shard.env.runtime.sleep(interval).await;
        tick(shard.clone()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_pack_node_shard_incarnation_and_sequence() {
        let identity = ShardIdentity {
            node_id: 7,
            shard_id: 1,
            shards: 2,
            epoch: 1,
            incarnation: 0x0000_1234_5678_9abc,
        };
        let text = format!("{:032x}", message_id(identity, 42));
        assert_eq!(text, "00070001123456789abc00000000002a");
    }

    #[test]
    fn a_node_started_again_with_an_empty_folder_never_repeats_an_id() {
        // Same node, shard and start counter (a lost volume starts the
        // counter again): only the incarnation drawn at start differs.
        let before = ShardIdentity {
            node_id: 2,
            shard_id: 0,
            shards: 1,
            epoch: 1,
            incarnation: 0xaaaa,
        };
        let after = ShardIdentity {
            incarnation: 0xbbbb,
            ..before
        };
        let first: HashSet<u128> = (0..1000).map(|seq| message_id(before, seq)).collect();
        assert!((0..1000).all(|seq| !first.contains(&message_id(after, seq))));
    }
}
