//! One shard: a glommio executor that owns an ingress WAL ring, a
//! dispatcher and the partitions of this node that hash to it, and serves
//! the API on the shared client port.
//!
//! A request may need partitions of another shard: commits, consumes,
//! settles and figures then go to the owning shard as one [`ShardMsg`]
//! (`mesh.rs`). A partition of another node is reached over QUIC
//! (`remote.rs`): the dispatcher commits to its owner there, unpinned
//! consumes lease from it after this node's own partitions, and receipts
//! are settled where they were issued.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use narad_net::http_server::NodeBudget;
use narad_net::types::{ConsumeRequest, ConsumedMessage, SettleAction, TopicPatch};
use narad_net::value::JsonValue;
use narad_net::{ApiError, ErrorCode};
use narad_raft::node::MetaNode;
use narad_raft::state::{Applied, Command, NodeId, Topic, TopicConfig};
use narad_raft::store::MetaView;
use narad_storage::clock::SharedClock;
use narad_storage::consumer::{ConsumerConfig, ConsumerState};
use narad_storage::error::StorageError;
use narad_storage::io::faulty::FaultyFs;
use narad_storage::io::glommio_fs::GlommioFs;
use narad_storage::io::FileSystem;
use narad_storage::limits::SEGMENT_PREALLOC_STEP_BYTES_DEFAULT;
use narad_storage::log::{LogConfig, Message, PartitionLog};
use narad_storage::wal::{Wal, WalConfig, WalPos, WalRecord, WalRecordRef};

use crate::config::Config;
use crate::dispatcher::{
    CommitBatch, Destination, DispatchRecord, Dispatcher, DispatcherConfig, FailureOutcome,
};
use crate::errors::{from_meta, from_owner, from_storage};
use crate::mesh::{shard_for, Mesh, SettleOutcome, ShardGauges, ShardMsg};
use crate::owner::{OwnerConfig, PartitionOwner, PartitionStats};
use crate::partitioner::partition_for_key;
use crate::receipt::{Receipt, ReceiptKey};
use crate::remote::{
    CallError, DataAnswer, DataRequest, Inbound, Peers, WireConsumed, WireMessage, WireOutcome,
    WireStats, AVAILABLE_CALL_TIMEOUT, AVAILABLE_COALESCE, COLLECT_CALL_TIMEOUT,
    COLLECT_TOP_UP_TIMEOUT, COMMIT_CALL_TIMEOUT, SETTLE_CALL_TIMEOUT, STATS_CALL_TIMEOUT,
};
use crate::signal::Signal;

/// Bytes of recent messages each partition keeps in memory.
const TAIL_CACHE_BYTES: usize = 4 * 1024 * 1024;
/// Largest commit batch the dispatcher sends.
const COMMIT_BATCH_RECORDS_MAX: usize = 4096;
const COMMIT_BATCH_BYTES_MAX: u64 = 8 * 1024 * 1024;
const COMMIT_RETRY_BACKOFF_MIN_MS: u64 = 50;
const COMMIT_RETRY_BACKOFF_MAX_MS: u64 = 2000;
/// How long a graceful stop waits for the dispatcher to drain.
const STOP_DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// Records written per batch when a shard adopts a removed shard's WAL.
const ADOPT_CHUNK_RECORDS: usize = 256;
/// How often adoption tries again while this shard's ring is full.
const ADOPT_FULL_RETRY: Duration = Duration::from_millis(20);
/// How often a shard opens the partitions it owns that are not open yet,
/// so that retention reaches idle ones (retention is an hour at least).
pub const IDLE_PARTITION_OPEN_INTERVAL: Duration = Duration::from_secs(30);
/// How long `/metrics` and `/readyz` wait for another shard's figures.
const GAUGES_TIMEOUT: Duration = Duration::from_secs(2);
/// Default `max_message_bytes` of a topic.
pub const MAX_MESSAGE_BYTES_DEFAULT: u64 = 1024 * 1024;

type OwnerKey = (String, u64, u32);
/// The metadata version the cached topics come from, and the topics.
type TopicCache = (Option<Arc<MetaView>>, HashMap<String, Rc<Topic>>);
/// The file system of a node: the real disk under the fault layer, which
/// passes every call through unless a test switched it on.
pub type NodeFs = FaultyFs<GlommioFs>;
type Owner = Rc<PartitionOwner<NodeFs>>;

enum OwnerSlot {
    Opening,
    Ready(Owner),
}

/// Bits of a message id: node (16) | shard (16) | incarnation (48) | sequence (48).
const ID_INCARNATION_BITS: u32 = 48;
const ID_SEQUENCE_BITS: u32 = 48;

/// A message id: unique for the life of the cluster, since the incarnation
/// is drawn at random at every start and the sequence counts within it.
fn message_id(identity: ShardIdentity, seq: u64) -> u128 {
    let incarnation_mask = (1u128 << ID_INCARNATION_BITS) - 1;
    let sequence_mask = (1u128 << ID_SEQUENCE_BITS) - 1;
    (u128::from(identity.node_id) << 112)
        | (u128::from(identity.shard_id) << 96)
        | ((u128::from(identity.incarnation) & incarnation_mask) << ID_SEQUENCE_BITS)
        | (u128::from(seq) & sequence_mask)
}

/// An owner slot marked `Opening` by a request: removed again (and its
/// waiters woken) if the request is dropped before the open finished.
struct OpeningSlot<'a> {
    shard: &'a Shard,
    key: Option<OwnerKey>,
}

impl OpeningSlot<'_> {
    /// The open finished: its caller fills or removes the slot.
    fn settled(mut self) {
        self.key = None;
    }
}

impl Drop for OpeningSlot<'_> {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else {
            return;
        };
        let mut owners = self.shard.owners.borrow_mut();
        if matches!(owners.get(&key), Some(OwnerSlot::Opening)) {
            owners.remove(&key);
        }
        drop(owners);
        self.shard.owners_changed.notify();
    }
}

/// Identity of this shard's process, for message ids and receipts.
#[derive(Debug, Clone, Copy)]
pub struct ShardIdentity {
    pub node_id: u16,
    pub shard_id: u16,
    /// Increases on every start of the node (kept in its data folder).
    pub epoch: u32,
    /// Drawn at random at every start: message ids and receipts carry it,
    /// so ids never repeat and receipts of an earlier start end, even when
    /// the data folder was lost or copied.
    pub incarnation: u64,
}

/// What a shard is made of.
pub struct ShardParts {
    pub identity: ShardIdentity,
    pub config: Rc<Config>,
    pub data_dir: PathBuf,
    pub fs: NodeFs,
    pub clock: SharedClock,
    pub wal: Rc<Wal<NodeFs>>,
    pub meta: Arc<MetaNode>,
    pub receipt_key: ReceiptKey,
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    pub mesh: Mesh,
    /// The other nodes of the cluster; `None` for a single node.
    pub peers: Option<Arc<Peers>>,
    /// Set once any shard's ingress WAL failed: the node answers 500 to
    /// produces until it restarts.
    pub node_wal_failed: Arc<AtomicBool>,
    /// The node's connections and request bodies (for its metrics).
    pub http_budget: Arc<NodeBudget>,
}

pub struct Shard {
    identity: ShardIdentity,
    mesh: Mesh,
    config: Rc<Config>,
    data_dir: PathBuf,
    fs: NodeFs,
    clock: SharedClock,
    wal: Rc<Wal<NodeFs>>,
    meta: Arc<MetaNode>,
    receipt_key: ReceiptKey,
    owners: RefCell<HashMap<OwnerKey, OwnerSlot>>,
    owners_changed: Signal,
    dispatcher: RefCell<Dispatcher>,
    /// Records appended to the WAL and not yet durable, in WAL order, with
    /// where each ends: [`Self::dispatch_durable`] moves them on.
    awaiting_durability: RefCell<VecDeque<(WalPos, Destination, DispatchRecord)>>,
    dispatch_signal: Signal,
    availability: Signal,
    /// Raised when a partition queued messages for its dead-letter topic.
    dead_letters_due: Signal,
    next_seq: Cell<u64>,
    round_robin: Cell<u32>,
    /// Topics of one metadata version, shared by the requests that need them.
    topic_cache: RefCell<TopicCache>,
    stopping: Cell<bool>,
    /// Set once acks were flushed for the stop: later settles are refused,
    /// since nothing would write them.
    acks_closed: Cell<bool>,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    peers: Option<Arc<Peers>>,
    /// Raised when messages became available here, for other nodes.
    peer_notice: Signal,
    /// Requests of other nodes being answered, and a signal when one ends.
    remote_in_flight: Cell<usize>,
    remote_done: Signal,
    node_wal_failed: Arc<AtomicBool>,
    http_budget: Arc<NodeBudget>,
}

impl Shard {
    pub fn new(parts: ShardParts) -> Rc<Self> {
        let ShardParts {
            identity,
            config,
            data_dir,
            fs,
            clock,
            wal,
            meta,
            receipt_key,
            metrics,
            mesh,
            peers,
            node_wal_failed,
            http_budget,
        } = parts;
        let dispatcher = Dispatcher::new(DispatcherConfig {
            max_linger_ms: config.u64("dispatcher.max_linger_ms"),
            busy_linger_ms: config.u64("dispatcher.busy_linger_ms"),
            reroute_after_ms: config.u64("dispatcher.reroute_after_ms"),
            batch_records_max: COMMIT_BATCH_RECORDS_MAX,
            batch_bytes_max: COMMIT_BATCH_BYTES_MAX,
            retry_backoff_min_ms: COMMIT_RETRY_BACKOFF_MIN_MS,
            retry_backoff_max_ms: COMMIT_RETRY_BACKOFF_MAX_MS,
            in_flight_per_destination_max: 1,
        });
        Rc::new(Self {
            identity,
            mesh,
            config,
            data_dir,
            fs,
            clock,
            wal,
            meta,
            receipt_key,
            owners: RefCell::new(HashMap::new()),
            owners_changed: Signal::default(),
            dispatcher: RefCell::new(dispatcher),
            awaiting_durability: RefCell::new(VecDeque::new()),
            dispatch_signal: Signal::default(),
            availability: Signal::default(),
            dead_letters_due: Signal::default(),
            next_seq: Cell::new(0),
            round_robin: Cell::new(0),
            topic_cache: RefCell::new((None, HashMap::new())),
            stopping: Cell::new(false),
            acks_closed: Cell::new(false),
            metrics,
            peers,
            peer_notice: Signal::default(),
            remote_in_flight: Cell::new(0),
            remote_done: Signal::default(),
            node_wal_failed,
            http_budget,
        })
    }

    /// The node's connections and request bodies held now.
    pub fn http_budget(&self) -> &NodeBudget {
        &self.http_budget
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn meta(&self) -> &MetaNode {
        &self.meta
    }

    pub fn wal(&self) -> &Wal<NodeFs> {
        &self.wal
    }

    /// The Prometheus text of every recorded metric.
    pub fn render_metrics(&self) -> String {
        self.metrics.render()
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.get()
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    // ------------------------------------------------------------ nodes

    fn me(&self) -> NodeId {
        NodeId::from(self.identity.node_id)
    }

    /// The node that owns a partition (per the metastore).
    fn owner_node(&self, topic: &Topic, partition: u32) -> NodeId {
        topic
            .owners
            .get(partition as usize)
            .copied()
            .unwrap_or_else(|| self.me())
    }

    /// Whether the controller marked a node dead.
    fn is_dead(&self, node: NodeId) -> bool {
        node != self.me()
            && self
                .meta
                .view()
                .state
                .nodes
                .get(&node)
                .is_some_and(|record| !record.alive)
    }

    /// Every node of the cluster the controller has not marked dead, in id
    /// order (this node always among them).
    /// Every member of the cluster and whether this node's view of the
    /// controller's liveness holds it alive (this node always is).
    pub fn members_alive(&self) -> Vec<(NodeId, bool)> {
        let mut members: Vec<(NodeId, bool)> = self
            .meta
            .members()
            .into_iter()
            .map(|(node, _)| (node, !self.is_dead(node)))
            .collect();
        if !members.iter().any(|(node, _)| *node == self.me()) {
            members.push((self.me(), true));
        }
        members.sort_unstable();
        members
    }

    fn live_nodes(&self) -> Vec<NodeId> {
        let mut nodes = vec![self.me()];
        if let Some(peers) = &self.peers {
            nodes.extend(peers.others().filter(|n| !self.is_dead(*n)));
        }
        nodes.sort_unstable();
        nodes
    }

    fn owner_dead(node: NodeId) -> ApiError {
        ApiError::new(
            ErrorCode::OwnerDead,
            format!("the partition's owner, node {node}, is marked dead; its messages wait for it"),
        )
    }

    /// Partitions split into this node's and each other node's, each list
    /// keeping the order it was given in.
    fn by_node(
        &self,
        topic: &Topic,
        partitions: impl IntoIterator<Item = u32>,
    ) -> (Vec<u32>, BTreeMap<NodeId, Vec<u32>>) {
        let me = self.me();
        let mut local = Vec::new();
        let mut remote: BTreeMap<NodeId, Vec<u32>> = BTreeMap::new();
        for partition in partitions {
            match self.owner_node(topic, partition) {
                node if node == me => local.push(partition),
                node => remote.entry(node).or_default().push(partition),
            }
        }
        (local, remote)
    }

    /// Calls another node of the cluster.
    async fn call_node(
        &self,
        node: NodeId,
        request: &DataRequest,
        timeout: Duration,
    ) -> Result<DataAnswer, CallError> {
        match &self.peers {
            Some(peers) => peers.call(node, request, timeout).await,
            None => Err(CallError::Unreachable(format!(
                "node {node} is not a member of this single-node cluster"
            ))),
        }
    }

    // ------------------------------------------------------------ topics

    /// The topic, or 404 `topic_not_found` at once. Served from a cache of
    /// the current metadata version, so a request does not copy the topic.
    pub fn topic(&self, name: &str) -> Result<Rc<Topic>, ApiError> {
        let view = self.meta.view();
        let mut cache = self.topic_cache.borrow_mut();
        if !cache
            .0
            .as_ref()
            .is_some_and(|cached| Arc::ptr_eq(cached, &view))
        {
            cache.1.clear();
            cache.0 = Some(view.clone());
        }
        if let Some(topic) = cache.1.get(name) {
            return Ok(topic.clone());
        }
        let Some(topic) = view.state.topics.get(name).cloned() else {
            // A node still learning the cluster's metadata cannot say a
            // topic is missing: 404 is final for a client, 503 is retried.
            if !self.meta.caught_up() {
                return Err(ApiError::new(
                    ErrorCode::CatchingUp,
                    format!(
                        "this node has not yet learned the cluster's topics; topic {name:?} may exist: retry"
                    ),
                ));
            }
            return Err(ApiError::new(
                ErrorCode::TopicNotFound,
                format!("topic {name:?} does not exist"),
            ));
        };
        let topic = Rc::new(topic);
        cache.1.insert(name.to_string(), topic.clone());
        Ok(topic)
    }

    pub fn topics(&self) -> Vec<Topic> {
        self.meta.view().state.topics.values().cloned().collect()
    }

    /// Creates or updates a topic through the metastore. Returns whether it
    /// was created, and the topic.
    pub async fn put_topic(
        &self,
        name: &str,
        patch: TopicPatch,
    ) -> Result<(bool, Topic), ApiError> {
        let existing = self.meta.view().state.topics.get(name).cloned();
        let base = existing
            .as_ref()
            .map(|t| t.config.clone())
            .unwrap_or_else(|| TopicConfig {
                partitions: 8,
                visibility_timeout_ms: self.config.u64("topics.default_visibility_timeout_ms"),
                retention_ms: self.config.u64("topics.default_retention_ms"),
                max_deliveries: 0,
                dead_letter_topic: None,
                schema: None,
                max_message_bytes: MAX_MESSAGE_BYTES_DEFAULT,
            });
        let config = TopicConfig {
            partitions: patch.partitions.unwrap_or(base.partitions),
            visibility_timeout_ms: patch
                .visibility_timeout_ms
                .unwrap_or(base.visibility_timeout_ms),
            retention_ms: patch.retention_ms.unwrap_or(base.retention_ms),
            max_deliveries: patch.max_deliveries.unwrap_or(base.max_deliveries),
            dead_letter_topic: patch.dead_letter_topic.unwrap_or(base.dead_letter_topic),
            schema: patch.schema.unwrap_or(base.schema),
            max_message_bytes: patch.max_message_bytes.unwrap_or(base.max_message_bytes),
        };
        if let Some(dlq) = &config.dead_letter_topic {
            narad_net::names::validate_topic_name(dlq).map_err(|e| {
                ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!("dead_letter_topic: {}", e.message),
                )
            })?;
        }
        if let Some(schema) = &config.schema {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!("schema {schema:?} does not exist"),
            ));
        }
        let existing_partitions = existing.as_ref().map_or(0, |t| t.config.partitions);
        let added = config.partitions.saturating_sub(existing_partitions);
        // The controller's placement: new partitions go round the live
        // nodes from a per-topic start, so topics spread evenly and a node
        // marked dead gets none.
        let live = self.live_nodes();
        let start = shard_for(name, existing_partitions, live.len());
        let new_owners = (0..added as usize)
            .map(|i| live[(start + i) % live.len()])
            .collect();
        let command = Command::PutTopic {
            name: name.to_string(),
            config,
            new_owners,
            now_ms: self.now(),
        };
        let applied = self
            .meta
            .propose(command)
            .await
            .map_err(|e| from_meta(&e))?;
        let (created, topic) = match applied {
            Applied::TopicCreated(topic) => (true, topic),
            Applied::TopicUpdated(topic) | Applied::TopicUnchanged(topic) => (false, topic),
            Applied::TopicDeleted | Applied::ClusterChanged | Applied::Nothing => {
                return Err(ApiError::new(
                    ErrorCode::Internal,
                    "the metastore answered a topic change oddly",
                ))
            }
        };
        self.reconcile_owners();
        Ok((created, topic))
    }

    pub async fn delete_topic(&self, name: &str) -> Result<(), ApiError> {
        self.topic(name)?;
        self.meta
            .propose(Command::DeleteTopic {
                name: name.to_string(),
            })
            .await
            .map_err(|e| from_meta(&e))?;
        // Every node (this one included) closes its partitions and removes
        // their folders when it applies the delete (`watch_topics`).
        self.reconcile_owners();
        Ok(())
    }

    /// Brings this shard's open partitions in line with the metastore:
    /// partitions of deleted topics close, topic updates (retention,
    /// `max_deliveries`) apply.
    pub fn reconcile_owners(&self) {
        let view = self.meta.view();
        let topics = &view.state.topics;
        let mut owners = self.owners.borrow_mut();
        owners.retain(|(name, incarnation, _), _| {
            topics
                .get(name)
                .is_some_and(|t| t.incarnation == *incarnation)
        });
        for ((name, _, _), slot) in owners.iter() {
            if let (OwnerSlot::Ready(owner), Some(topic)) = (slot, topics.get(name)) {
                owner.reconfigure(topic.config.retention_ms, topic.config.max_deliveries);
            }
        }
    }

    /// Reconciles on every metadata change, whichever shard or node made it.
    pub async fn watch_topics(self: Rc<Self>) {
        let mut changes = self.meta.subscribe();
        self.reap_deleted_topics().await;
        while changes.changed().await.is_ok() {
            self.reconcile_owners();
            self.reap_deleted_topics().await;
        }
    }

    /// Removes the partition folders of topics that no longer exist (deleted,
    /// or created again as a new incarnation), on shard 0 of every node, once
    /// the metadata is caught up (before that, a topic missing from this
    /// node's view may merely be unknown yet). Through the file seam, off
    /// the executor.
    async fn reap_deleted_topics(&self) {
        if self.identity.shard_id != 0 || !self.meta.caught_up() {
            return;
        }
        let root = self.data_dir.join("partitions");
        let Ok(entries) = self.fs.list_dir(&root).await else {
            return;
        };
        let view = self.meta.view();
        for entry in entries {
            let Some((name, incarnation)) = entry
                .rsplit_once('-')
                .and_then(|(name, n)| Some((name, n.parse::<u64>().ok()?)))
            else {
                continue;
            };
            let live = view
                .state
                .topics
                .get(name)
                .is_some_and(|t| t.incarnation == incarnation);
            if live {
                continue;
            }
            let dir = root.join(&entry);
            match self.fs.remove_dir_all(&dir).await {
                Ok(()) => {
                    tracing::info!(dir = %dir.display(), "removed the partitions of a deleted topic")
                }
                Err(error) => {
                    tracing::warn!(dir = %dir.display(), %error, "could not remove a deleted topic's partitions")
                }
            }
        }
    }

    fn topic_dir(&self, name: &str, incarnation: u64) -> PathBuf {
        self.data_dir
            .join("partitions")
            .join(format!("{name}-{incarnation}"))
    }

    /// Per-partition figures of a topic (opening its partitions if needed),
    /// asking the shard and node that owns each. A node that does not
    /// answer leaves its partitions' figures at zero.
    pub async fn partition_stats(&self, topic: &Topic) -> Result<Vec<PartitionStats>, ApiError> {
        let mut stats = vec![PartitionStats::default(); topic.config.partitions as usize];
        let (local, remote) = self.by_node(topic, 0..topic.config.partitions);
        let mut figures = self.stats_on_node(topic, local).await?;
        for (node, partitions) in remote {
            let unreachable = self
                .peers
                .as_ref()
                .is_some_and(|p| p.recently_unreachable(node, self.now()));
            if self.is_dead(node) || unreachable {
                continue;
            }
            let request = DataRequest::Stats {
                topic: topic.name.clone(),
                incarnation: topic.incarnation,
                partitions,
            };
            match self.call_node(node, &request, STATS_CALL_TIMEOUT).await {
                Ok(DataAnswer::Stats(list)) => {
                    figures.extend(list.iter().map(WireStats::to_stats));
                }
                Ok(_) => tracing::warn!(node, "partition figures: an odd answer"),
                Err(CallError::Unreachable(reason)) => {
                    tracing::debug!(node, reason, "partition figures: no answer from a node");
                    if let Some(peers) = &self.peers {
                        peers.unreachable(node, self.now());
                    }
                }
                Err(CallError::Refused(error)) => {
                    tracing::debug!(node, %error, "partition figures: a node refused")
                }
            }
        }
        for (partition, figures) in figures {
            if let Some(slot) = stats.get_mut(partition as usize) {
                *slot = figures;
            }
        }
        Ok(stats)
    }

    /// Figures of partitions of this node, from the shards that own them.
    async fn stats_on_node(
        &self,
        topic: &Topic,
        partitions: Vec<u32>,
    ) -> Result<Vec<(u32, PartitionStats)>, ApiError> {
        let mut stats = Vec::with_capacity(partitions.len());
        for (shard, partitions) in self.by_shard(topic, partitions) {
            let figures = if shard == self.mesh.me() {
                self.local_stats(topic, &partitions).await?
            } else {
                let topic = topic.clone();
                self.mesh
                    .call(shard, None, |reply| ShardMsg::Stats {
                        topic,
                        partitions,
                        reply,
                    })
                    .await??
            };
            stats.extend(figures);
        }
        Ok(stats)
    }

    async fn local_stats(
        &self,
        topic: &Topic,
        partitions: &[u32],
    ) -> Result<Vec<(u32, PartitionStats)>, ApiError> {
        let mut stats = Vec::with_capacity(partitions.len());
        for &partition in partitions {
            let owner = self.owner(topic, partition).await?;
            stats.push((partition, owner.stats(self.now())));
        }
        Ok(stats)
    }

    /// Partitions grouped by the shard that owns them, each group keeping
    /// the order it was given in.
    fn by_shard(
        &self,
        topic: &Topic,
        partitions: impl IntoIterator<Item = u32>,
    ) -> Vec<(usize, Vec<u32>)> {
        let mut groups: Vec<Vec<u32>> = vec![Vec::new(); self.mesh.shards()];
        for partition in partitions {
            groups[self.mesh.owner_of(&topic.name, partition)].push(partition);
        }
        groups
            .into_iter()
            .enumerate()
            .filter(|(_, g)| !g.is_empty())
            .collect()
    }

    // ------------------------------------------------------------ owners

    /// The owner of a partition of this shard, opened on first use.
    async fn owner(&self, topic: &Topic, partition: u32) -> Result<Owner, ApiError> {
        debug_assert!(
            self.mesh.is_local(&topic.name, partition),
            "a shard opens only its own partitions"
        );
        let key = (topic.name.clone(), topic.incarnation, partition);
        loop {
            let seen = self.owners_changed.version();
            match self.owners.borrow().get(&key) {
                Some(OwnerSlot::Ready(owner)) => return Ok(owner.clone()),
                Some(OwnerSlot::Opening) => {}
                None => break,
            }
            self.owners_changed.changed(seen).await;
        }
        self.owners
            .borrow_mut()
            .insert(key.clone(), OwnerSlot::Opening);
        // Opening reads the partition's files and may take a while; if this
        // request is dropped meanwhile, the slot goes and the next caller
        // opens it (the files are consistent at every await of an open).
        let opening = OpeningSlot {
            shard: self,
            key: Some(key.clone()),
        };
        let opened = self.open_owner(topic, partition).await;
        opening.settled();
        let mut owners = self.owners.borrow_mut();
        let result = match opened {
            Ok(owner) => {
                let owner = Rc::new(owner);
                owners.insert(key, OwnerSlot::Ready(owner.clone()));
                Ok(owner)
            }
            Err(error) => {
                owners.remove(&key);
                Err(error)
            }
        };
        drop(owners);
        self.owners_changed.notify();
        result
    }

    async fn open_owner(
        &self,
        topic: &Topic,
        partition: u32,
    ) -> Result<PartitionOwner<NodeFs>, ApiError> {
        let dir = self
            .topic_dir(&topic.name, topic.incarnation)
            .join(partition.to_string());
        let log_config = LogConfig {
            segment_bytes: self.config.u64("storage.segment_bytes"),
            prealloc_step_bytes: SEGMENT_PREALLOC_STEP_BYTES_DEFAULT
                .min(self.config.u64("storage.segment_bytes")),
            retention_ms: topic.config.retention_ms,
        };
        let (log, recovery) = PartitionLog::open(&self.fs, &dir, log_config, self.clock.clone())
            .await
            .map_err(|e| from_storage(&e))?;
        if recovery.torn_tail || recovery.corrupt_records > 0 {
            tracing::warn!(topic = %topic.name, partition, ?recovery, "partition log recovered");
        }
        let consumer_config = ConsumerConfig {
            ack_flush_interval_ms: self.config.u64("storage.ack_flush_interval_ms"),
            commit_interval_ms: self
                .config
                .u64("storage.consumer_offset_commit_interval_ms"),
            ..ConsumerConfig::default()
        };
        let acks = ConsumerState::open(
            &self.fs,
            &dir.join("consumer"),
            consumer_config,
            self.clock.clone(),
        )
        .await
        .map_err(|e| from_storage(&e))?;
        let owner_config = OwnerConfig {
            max_deliveries: topic.config.max_deliveries,
            tail_cache_bytes: TAIL_CACHE_BYTES,
        };
        Ok(PartitionOwner::new(log, acks, owner_config))
    }

    fn open_owners(&self) -> Vec<Owner> {
        self.owners
            .borrow()
            .values()
            .filter_map(|slot| match slot {
                OwnerSlot::Ready(owner) => Some(owner.clone()),
                OwnerSlot::Opening => None,
            })
            .collect()
    }

    // ------------------------------------------------------------ produce

    fn next_id(&self) -> u128 {
        let seq = self.next_seq.get();
        self.next_seq.set(seq + 1);
        message_id(self.identity, seq)
    }

    fn pick_partition(&self, topic: &Topic, key: Option<&[u8]>) -> u32 {
        match key {
            Some(key) => partition_for_key(key, topic.config.partitions),
            None => {
                let next = self.round_robin.get().wrapping_add(1);
                self.round_robin.set(next);
                next % topic.config.partitions.max(1)
            }
        }
    }

    fn refuse_if_stopping(&self) -> Result<(), ApiError> {
        if self.stopping.get() {
            return Err(ApiError::new(
                ErrorCode::Stopping,
                "the node is stopping; send to another node",
            ));
        }
        Ok(())
    }

    /// The contract: once an ingress WAL of this node failed, the node
    /// answers 500 to produces until it restarts (not only that shard).
    fn refuse_if_wal_failed(&self) -> Result<(), ApiError> {
        if let Some(reason) = self.wal.failure() {
            self.node_wal_failed.store(true, Ordering::SeqCst);
            return Err(from_storage(&StorageError::WalFailed { reason }));
        }
        if self.node_wal_failed.load(Ordering::SeqCst) {
            return Err(ApiError::new(
                ErrorCode::WalFailed,
                "an ingress WAL of this node failed; it takes no produces until it restarts",
            ));
        }
        Ok(())
    }

    /// Accepts messages: one WAL record each, answered once the group commit
    /// covering all of them is durable. Returns their ids in order.
    pub async fn produce(
        &self,
        topic: &Topic,
        messages: Vec<(Option<Vec<u8>>, bytes::Bytes)>,
    ) -> Result<Vec<String>, ApiError> {
        self.refuse_if_stopping()?;
        self.refuse_if_wal_failed()?;
        for (index, (_, value)) in messages.iter().enumerate() {
            if value.len() as u64 > topic.config.max_message_bytes {
                return Err(ApiError::new(
                    ErrorCode::TooLarge,
                    format!(
                        "message {index} is {} bytes, over the topic's max_message_bytes of {}",
                        value.len(),
                        topic.config.max_message_bytes
                    ),
                ));
            }
        }
        let accept_ms = self.now();
        let placed: Vec<(u32, u128)> = messages
            .iter()
            .map(|(key, _)| (self.pick_partition(topic, key.as_deref()), self.next_id()))
            .collect();
        let records: Vec<WalRecordRef<'_>> = messages
            .iter()
            .zip(&placed)
            .map(|((key, value), (partition, id))| WalRecordRef {
                id: *id,
                topic: &topic.name,
                partition: *partition,
                key: key.as_deref(),
                value,
                accept_ms,
                topic_incarnation: Some(topic.incarnation),
            })
            .collect();
        // All or nothing: a full ring answers 429 having accepted none.
        let appended = self
            .wal
            .append_batch(&records)
            .map_err(|e| from_storage(&e))?;
        drop(records);
        // Handed on before the first await: a record that becomes durable is
        // dispatched even if this handler is dropped (its client went away).
        let mut ids = Vec::with_capacity(appended.len());
        let mut last_durable = None;
        for ((appended, (partition, id)), (key, value)) in
            appended.into_iter().zip(placed).zip(messages)
        {
            self.dispatch_once_durable(
                &topic.name,
                partition,
                appended.end,
                DispatchRecord {
                    pos: appended.pos,
                    id,
                    key,
                    value,
                    accept_ms,
                    incarnation: Some(topic.incarnation),
                },
            );
            ids.push(format!("{id:032x}"));
            last_durable = Some(appended.durable);
        }
        // Records become durable in the order they were appended.
        if let Some(durable) = last_durable {
            durable.await.map_err(|e| from_storage(&e))?;
        }
        Ok(ids)
    }

    /// Takes over the WAL ring of a shard that no longer exists (the node
    /// ran with more shards before): its records above the checkpoint are
    /// written again into this shard's ring, dispatched, and the old ring is
    /// removed. A crash half way writes some of them twice, never none.
    pub async fn adopt_wal(self: Rc<Self>, dir: PathBuf, config: WalConfig) {
        let (orphan, recovery) = match Wal::open(&self.fs, &dir, config).await {
            Ok(opened) => opened,
            Err(error) => {
                tracing::error!(dir = %dir.display(), %error, "cannot open the WAL of a removed shard; leaving it in place");
                return;
            }
        };
        let records = recovery.records;
        let total = records.len();
        for chunk in records.chunks(ADOPT_CHUNK_RECORDS) {
            let refs: Vec<WalRecordRef<'_>> = chunk
                .iter()
                .map(|r| WalRecordRef {
                    id: r.record.id,
                    topic: &r.record.topic,
                    partition: r.record.partition,
                    key: r.record.key.as_deref(),
                    value: &r.record.value,
                    accept_ms: r.record.accept_ms,
                    topic_incarnation: r.record.topic_incarnation,
                })
                .collect();
            let appended = loop {
                match self.wal.append_batch(&refs) {
                    Ok(appended) => break appended,
                    // The ring frees space as the dispatcher commits.
                    Err(StorageError::WalFull { .. }) => {
                        glommio::timer::sleep(ADOPT_FULL_RETRY).await;
                    }
                    Err(error) => {
                        tracing::error!(dir = %dir.display(), %error, "adopting a removed shard's WAL failed; it stays for the next start");
                        return;
                    }
                }
            };
            let mut last_durable = None;
            for (appended, recovered) in appended.into_iter().zip(chunk) {
                let record = &recovered.record;
                self.dispatch_once_durable(
                    &record.topic,
                    record.partition,
                    appended.end,
                    DispatchRecord {
                        pos: appended.pos,
                        id: record.id,
                        key: record.key.clone(),
                        value: bytes::Bytes::copy_from_slice(&record.value),
                        accept_ms: record.accept_ms,
                        incarnation: record.topic_incarnation,
                    },
                );
                last_durable = Some(appended.durable);
            }
            if let Some(durable) = last_durable {
                if let Err(error) = durable.await {
                    tracing::error!(dir = %dir.display(), %error, "adopting a removed shard's WAL failed; it stays for the next start");
                    return;
                }
            }
        }
        orphan.close();
        drop(orphan);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {
                tracing::info!(dir = %dir.display(), records = total, "adopted the WAL of a removed shard")
            }
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "could not remove an adopted WAL")
            }
        }
    }

    /// Holds a record just appended to the WAL until the group commit that
    /// covers it is durable; [`Self::dispatch_durable`] then hands it to the
    /// dispatcher, whether or not the request that appended it still runs.
    fn dispatch_once_durable(
        &self,
        topic: &str,
        partition: u32,
        end: WalPos,
        record: DispatchRecord,
    ) {
        let destination = Destination {
            topic: Rc::from(topic),
            partition,
        };
        self.awaiting_durability
            .borrow_mut()
            .push_back((end, destination, record));
        if end <= self.wal.durable_end() {
            self.dispatch_durable();
        }
    }

    /// Records accepted here and not yet committed to their owner: waiting
    /// for the WAL's fsync, waiting in the dispatcher, or in flight.
    /// (A failed WAL makes nothing durable again: what waits for it is not
    /// accepted and not counted.)
    fn undispatched(&self) -> usize {
        let awaiting = if self.wal.failure().is_some() {
            0
        } else {
            self.awaiting_durability.borrow().len()
        };
        awaiting + self.dispatcher.borrow().pending_records()
    }

    /// Moves every record the WAL made durable to the dispatcher. The WAL's
    /// committer calls it after each group commit.
    pub fn dispatch_durable(&self) {
        let durable_end = self.wal.durable_end();
        let now = self.now();
        let mut waiting = self.awaiting_durability.borrow_mut();
        let mut dispatcher = self.dispatcher.borrow_mut();
        let mut moved = false;
        while waiting
            .front()
            .is_some_and(|(end, _, _)| *end <= durable_end)
        {
            if let Some((_, destination, record)) = waiting.pop_front() {
                dispatcher.push(destination, record, now);
                moved = true;
            }
        }
        drop((waiting, dispatcher));
        if moved {
            self.dispatch_signal.notify();
        }
    }

    /// Hands records recovered from the WAL to the dispatcher again.
    pub fn redispatch(&self, records: Vec<(u64, WalRecord)>) {
        let now = self.now();
        let mut dispatcher = self.dispatcher.borrow_mut();
        for (pos, record) in records {
            let destination = Destination {
                topic: Rc::from(record.topic.as_str()),
                partition: record.partition,
            };
            dispatcher.push(
                destination,
                DispatchRecord {
                    pos,
                    id: record.id,
                    key: record.key,
                    value: record.value.into(),
                    accept_ms: record.accept_ms,
                    incarnation: record.topic_incarnation,
                },
                now,
            );
        }
        drop(dispatcher);
        self.dispatch_signal.notify();
    }

    // ------------------------------------------------------------ dispatch

    /// The dispatcher loop: sends ready batches, sleeps until the next
    /// deadline or a push.
    pub async fn run_dispatcher(self: Rc<Self>) {
        loop {
            let seen = self.dispatch_signal.version();
            let batches = self.dispatcher.borrow_mut().poll_ready(self.now());
            for batch in batches {
                let shard = self.clone();
                glommio::spawn_local(async move { shard.commit_batch(batch).await }).detach();
            }
            if self.stopping.get() && self.undispatched() == 0 {
                return;
            }
            let deadline = self.dispatcher.borrow().next_deadline_ms();
            let wait = deadline.map(|d| Duration::from_millis(d.saturating_sub(self.now()).max(1)));
            match wait {
                Some(wait) => {
                    futures_lite::future::or(
                        self.dispatch_signal.changed(seen),
                        glommio::timer::sleep(wait),
                    )
                    .await;
                }
                None => self.dispatch_signal.changed(seen).await,
            }
        }
    }

    /// Commits one batch to the shard and node that own its partition.
    /// When the owner is marked dead, or its commits have failed for
    /// `dispatcher.reroute_after_ms`, the records go to a live sibling
    /// partition instead; the WAL keeps them until some owner confirms.
    async fn commit_batch(&self, batch: CommitBatch) {
        let topic = self
            .meta
            .view()
            .state
            .topics
            .get(batch.destination.topic.as_ref())
            .cloned();
        let mut dead_owner = None;
        let result = match topic {
            // A node that restarted without a quorum may not have applied
            // the topic yet: its records wait until the metadata is known.
            None | Some(_) if !self.meta.caught_up() && !self.knows(&batch) => Err(ApiError::new(
                ErrorCode::NoLeader,
                "the metadata is not caught up; the records wait",
            )),
            // The topic was deleted after the produce: nothing to deliver to.
            None => {
                tracing::debug!(topic = %batch.destination.topic, "commit: topic gone");
                Ok(())
            }
            Some(topic) if batch.destination.partition >= topic.config.partitions => {
                tracing::debug!("commit: partition gone");
                Ok(())
            }
            // Every record belongs to an earlier topic of this name, deleted
            // since: nothing to deliver to.
            Some(topic)
                if batch
                    .records
                    .iter()
                    .all(|r| !r.belongs_to(topic.incarnation)) =>
            {
                tracing::debug!(topic = %topic.name, "commit: records of a deleted incarnation");
                Ok(())
            }
            Some(topic) => {
                let partition = batch.destination.partition;
                let node = self.owner_node(&topic, partition);
                if node == self.me() {
                    let messages: Vec<Message> = batch
                        .records
                        .iter()
                        .filter(|r| r.belongs_to(topic.incarnation))
                        .map(|r| Message {
                            id: r.id,
                            produced_at_ms: r.accept_ms,
                            key: r.key.clone(),
                            value: r.value.clone(),
                        })
                        .collect();
                    self.commit_on_node(&topic, partition, messages).await
                } else if self.is_dead(node) {
                    dead_owner = Some(node);
                    Err(Self::owner_dead(node))
                } else {
                    let request = DataRequest::Commit {
                        topic: topic.name.clone(),
                        incarnation: topic.incarnation,
                        partition,
                        messages: batch
                            .records
                            .iter()
                            .filter(|r| r.belongs_to(topic.incarnation))
                            .map(|r| WireMessage {
                                id: r.id,
                                produced_at_ms: r.accept_ms,
                                key: r.key.clone(),
                                value: r.value.to_vec(),
                            })
                            .collect(),
                    };
                    self.call_node(node, &request, COMMIT_CALL_TIMEOUT)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_api(node))
                }
            }
        };
        match result {
            Ok(()) => {
                metrics::histogram!("narad_dispatcher_commit_records")
                    .record(batch.records.len() as f64);
                let positions = self
                    .dispatcher
                    .borrow_mut()
                    .on_committed(batch.batch_id, self.now());
                for pos in positions {
                    self.wal.mark_committed(pos);
                }
            }
            Err(error) => {
                if dead_owner.is_none() {
                    tracing::warn!(topic = %batch.destination.topic, partition = batch.destination.partition, %error, "commit failed; will retry");
                }
                let outcome = self
                    .dispatcher
                    .borrow_mut()
                    .on_failed(batch.batch_id, self.now());
                if dead_owner.is_some()
                    || matches!(outcome, Some(FailureOutcome::RerouteDue { .. }))
                {
                    self.reroute(&batch.destination);
                }
            }
        }
        self.dispatch_signal.notify();
    }

    /// Whether the metadata this node holds knows the batch's destination.
    fn knows(&self, batch: &CommitBatch) -> bool {
        self.meta
            .view()
            .state
            .topics
            .get(batch.destination.topic.as_ref())
            .is_some_and(|t| batch.destination.partition < t.config.partitions)
    }

    /// Moves the records waiting for a destination whose owner is dead or
    /// keeps failing to a sibling partition of the same topic: one of this
    /// node's if it has any, else one whose owner is alive. With no such
    /// sibling they keep waiting for their owner.
    fn reroute(&self, from: &Destination) {
        let Ok(topic) = self.topic(&from.topic) else {
            return;
        };
        let failing = self.owner_node(&topic, from.partition);
        let siblings = |accept: &dyn Fn(NodeId) -> bool| -> Vec<u32> {
            (0..topic.config.partitions)
                .filter(|p| *p != from.partition && accept(self.owner_node(&topic, *p)))
                .collect()
        };
        let me = self.me();
        let mut candidates = siblings(&|node| node == me);
        if candidates.is_empty() {
            candidates = siblings(&|node| node != failing && !self.is_dead(node));
        }
        if candidates.is_empty() {
            return;
        }
        let turn = self.round_robin.get().wrapping_add(1);
        self.round_robin.set(turn);
        let sibling = candidates[turn as usize % candidates.len()];
        let records = self.dispatcher.borrow_mut().take_pending(from);
        if records.is_empty() {
            return;
        }
        let count = records.len();
        let to = Destination {
            topic: from.topic.clone(),
            partition: sibling,
        };
        let now = self.now();
        let mut dispatcher = self.dispatcher.borrow_mut();
        for record in records {
            dispatcher.push(to.clone(), record, now);
        }
        drop(dispatcher);
        metrics::counter!("narad_dispatcher_reroutes_total").increment(count as u64);
        tracing::warn!(topic = %from.topic, partition = from.partition, owner = failing, to = sibling, records = count, "rerouted records around an unavailable owner");
    }

    /// Appends a batch to a partition of this node, at the shard that owns it.
    async fn commit_on_node(
        &self,
        topic: &Topic,
        partition: u32,
        messages: Vec<Message>,
    ) -> Result<(), ApiError> {
        let shard = self.mesh.owner_of(&topic.name, partition);
        if shard == self.mesh.me() {
            return self.commit_local(topic, partition, messages).await;
        }
        let topic = topic.clone();
        self.mesh
            .call(shard, None, |reply| ShardMsg::Commit {
                topic,
                partition,
                messages,
                reply,
            })
            .await
            .and_then(|answer| answer)
    }

    /// Appends a batch to a partition of this shard and wakes long polls on
    /// every shard.
    async fn commit_local(
        &self,
        topic: &Topic,
        partition: u32,
        messages: Vec<Message>,
    ) -> Result<(), ApiError> {
        let owner = self.owner(topic, partition).await?;
        owner
            .commit(&messages, self.now())
            .await
            .map_err(|e| from_owner(&e))?;
        self.announce_available();
        Ok(())
    }

    /// Messages became available here: wake long polls on every shard and
    /// tell the other nodes.
    fn announce_available(&self) {
        self.availability.notify();
        self.mesh.announce_available();
        self.peer_notice.notify();
    }

    /// Tells the other nodes when messages became available on this shard,
    /// at most every `AVAILABLE_COALESCE`, so their long polls wake. At most
    /// one notice is in flight to each node, so a node that does not answer
    /// costs nothing but its own notices.
    pub async fn notify_peers(self: Rc<Self>) {
        let Some(peers) = self.peers.clone() else {
            return;
        };
        let in_flight: Rc<RefCell<HashSet<NodeId>>> = Rc::default();
        let mut seen = self.peer_notice.version();
        loop {
            self.peer_notice.changed(seen).await;
            seen = self.peer_notice.version();
            for node in peers.others() {
                if self.is_dead(node) || !in_flight.borrow_mut().insert(node) {
                    continue;
                }
                let (peers, in_flight) = (peers.clone(), in_flight.clone());
                let request = DataRequest::Available { from: peers.me() };
                glommio::spawn_local(async move {
                    if let Err(error) = peers.call(node, &request, AVAILABLE_CALL_TIMEOUT).await {
                        tracing::debug!(node, ?error, "an availability notice was not delivered");
                    }
                    in_flight.borrow_mut().remove(&node);
                })
                .detach();
            }
            glommio::timer::sleep(AVAILABLE_COALESCE).await;
        }
    }

    pub fn dispatcher_pending(&self) -> usize {
        self.dispatcher.borrow().pending_records()
    }

    // ------------------------------------------------------------ consume

    /// Long-polls for up to `max_messages` messages of a topic.
    pub async fn consume(
        &self,
        topic: &Topic,
        request: ConsumeRequest,
    ) -> Result<Vec<ConsumedMessage>, ApiError> {
        if let Some(partition) = request.partition {
            if partition >= topic.config.partitions {
                return Err(ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!(
                        "partition must be from 0 to {}, got {partition}",
                        topic.config.partitions - 1
                    ),
                ));
            }
        }
        let visibility = request
            .visibility_timeout_ms
            .unwrap_or(topic.config.visibility_timeout_ms);
        let deadline = self.now() + request.wait_ms;
        loop {
            let seen = self.availability.version();
            let got = self.collect(topic, request, visibility).await?;
            let now = self.now();
            if !got.is_empty() || now >= deadline || self.stopping.get() {
                return Ok(got);
            }
            let wait = Duration::from_millis(deadline - now);
            let _parked = LongPollGauge::park();
            futures_lite::future::or(self.availability.changed(seen), glommio::timer::sleep(wait))
                .await;
        }
    }

    /// Leases from the topic's partitions: this node's first (going round
    /// its shards from a rotating start), then other nodes' that may have
    /// messages, from a rotating start too, so no partition starves. A
    /// pinned partition of another node is asked directly: 502 if its
    /// owner does not answer, 503 once the owner is marked dead.
    async fn collect(
        &self,
        topic: &Topic,
        request: ConsumeRequest,
        visibility: u64,
    ) -> Result<Vec<ConsumedMessage>, ApiError> {
        let rotation = self.round_robin.get().wrapping_add(1);
        self.round_robin.set(rotation);
        let partitions: Vec<u32> = match request.partition {
            Some(p) => vec![p],
            None => {
                let n = topic.config.partitions.max(1);
                (0..n).map(|i| rotation.wrapping_add(i) % n).collect()
            }
        };
        let max = request.max_messages as usize;
        let (local, remote) = self.by_node(topic, partitions);
        if request.partition.is_some() {
            if let Some((node, partitions)) = remote.clone().into_iter().next() {
                if self.is_dead(node) {
                    return Err(Self::owner_dead(node));
                }
                return self
                    .collect_remote(
                        topic,
                        node,
                        partitions,
                        max,
                        visibility,
                        COLLECT_CALL_TIMEOUT,
                    )
                    .await
                    .map_err(|e| e.to_api(node));
            }
        }
        let mut out = match self
            .collect_on_node(topic, local, max, visibility, rotation)
            .await
        {
            Ok(out) => out,
            Err(error) if remote.is_empty() => return Err(error),
            Err(error) => {
                tracing::warn!(%error, "consume: this node's partitions failed; asking the others");
                Vec::new()
            }
        };
        let Some(peers) = self.peers.clone() else {
            return Ok(out);
        };
        let mut nodes: Vec<(NodeId, Vec<u32>)> = remote.into_iter().collect();
        let turn = rotation as usize % nodes.len().max(1);
        nodes.rotate_left(turn);
        for (node, partitions) in nodes {
            let room = max - out.len();
            if room == 0 {
                break;
            }
            let asked_at = self.now();
            if self.is_dead(node) || !peers.worth_asking(node, asked_at) {
                continue;
            }
            let timeout = if out.is_empty() {
                COLLECT_CALL_TIMEOUT
            } else {
                COLLECT_TOP_UP_TIMEOUT
            };
            match self
                .collect_remote(topic, node, partitions, room, visibility, timeout)
                .await
            {
                Ok(got) if got.is_empty() => peers.found_empty(node, asked_at),
                Ok(got) => {
                    peers.found_messages(node);
                    out.extend(got);
                }
                Err(CallError::Unreachable(reason)) => {
                    tracing::debug!(
                        node,
                        reason,
                        "consume: a node did not answer; skipping it for a while"
                    );
                    peers.unreachable(node, self.now());
                }
                Err(CallError::Refused(error)) => {
                    tracing::debug!(node, %error, "consume: a node refused");
                }
            }
        }
        Ok(out)
    }

    /// Leases up to `max` messages from partitions of another node.
    async fn collect_remote(
        &self,
        topic: &Topic,
        node: NodeId,
        partitions: Vec<u32>,
        max: usize,
        visibility: u64,
        timeout: Duration,
    ) -> Result<Vec<ConsumedMessage>, CallError> {
        let request = DataRequest::Collect {
            topic: topic.name.clone(),
            incarnation: topic.incarnation,
            partitions,
            max: u32::try_from(max).unwrap_or(u32::MAX),
            visibility_ms: visibility,
        };
        match self.call_node(node, &request, timeout).await? {
            DataAnswer::Collected(messages) => Ok(messages
                .into_iter()
                .map(|m| m.into_consumed(&topic.name))
                .collect()),
            _ => Err(CallError::Refused(ApiError::new(
                ErrorCode::Internal,
                format!("node {node} answered a consume oddly"),
            ))),
        }
    }

    /// Leases from partitions of this node, going round its shards from a
    /// rotating start.
    async fn collect_on_node(
        &self,
        topic: &Topic,
        partitions: Vec<u32>,
        max: usize,
        visibility: u64,
        rotation: u32,
    ) -> Result<Vec<ConsumedMessage>, ApiError> {
        let mut groups = self.by_shard(topic, partitions);
        let turn = rotation as usize % groups.len().max(1);
        groups.rotate_left(turn);
        let mut out = Vec::new();
        for (shard, partitions) in groups {
            let room = max - out.len();
            if room == 0 {
                break;
            }
            let got = if shard == self.mesh.me() {
                self.collect_local(topic, &partitions, room, visibility)
                    .await
            } else {
                let topic = topic.clone();
                self.mesh
                    .call(shard, None, |reply| ShardMsg::Collect {
                        topic,
                        partitions,
                        max: room,
                        visibility_ms: visibility,
                        reply,
                    })
                    .await
                    .and_then(|answer| answer)
            };
            match got {
                Ok(got) => out.extend(got),
                // Messages already leased go back to the client; the failed
                // shard's are simply not leased.
                Err(error) if !out.is_empty() => {
                    tracing::warn!(shard, %error, "consume: a shard failed; answering with what others gave");
                    break;
                }
                Err(error) => return Err(error),
            }
        }
        Ok(out)
    }

    /// Leases up to `max` messages from partitions of this shard.
    async fn collect_local(
        &self,
        topic: &Topic,
        partitions: &[u32],
        max: usize,
        visibility: u64,
    ) -> Result<Vec<ConsumedMessage>, ApiError> {
        let mut out = Vec::new();
        for &partition in partitions {
            if out.len() >= max {
                break;
            }
            let owner = self.owner(topic, partition).await?;
            self.sweep_owner(&owner);
            let deliveries = owner
                .consume(max - out.len(), visibility, self.now())
                .await
                .map_err(|e| from_owner(&e))?;
            for delivery in deliveries {
                let receipt = Receipt {
                    topic: topic.name.clone(),
                    partition,
                    offset: delivery.offset,
                    lease_id: delivery.lease.lease_id,
                    owner_epoch: self.identity.incarnation,
                }
                .encode(&self.receipt_key);
                out.push(ConsumedMessage {
                    id: format!("{:032x}", delivery.message.id),
                    topic: topic.name.clone(),
                    partition,
                    offset: delivery.offset,
                    key: delivery
                        .message
                        .key
                        .as_ref()
                        .map(|k| String::from_utf8_lossy(k).into_owned()),
                    value: JsonValue::from_bytes(&delivery.message.value),
                    receipt,
                    delivery_count: delivery.lease.delivery_count,
                    produced_at_ms: delivery.message.produced_at_ms,
                    lease_expires_at_ms: delivery.lease.expires_at_ms,
                });
            }
        }
        Ok(out)
    }

    /// Ends expired leases of one partition; messages out of deliveries are
    /// queued for the dead-letter mover. Synchronous: a consume dropped here
    /// leaves nothing half done.
    fn sweep_owner(&self, owner: &Owner) {
        let sweep = owner.sweep(self.now());
        // Only a sweep that ended leases changes availability; notifying on
        // every sweep would wake a long poll with its own sweep, and the
        // poll would spin without yielding the shard.
        if sweep.ended > 0 {
            self.announce_available();
        }
        // Also a move that failed to read its message: tried again each sweep.
        if sweep.dead > 0 || owner.has_dead_letters() {
            self.dead_letters_due.notify();
        }
    }

    /// The dead-letter mover: a task of its own (never a request's future),
    /// so a client that goes away cannot leave a message parked. Each
    /// message is written durably to the dead-letter topic, then settled
    /// in its partition; a move cut short is done again (at least once).
    pub async fn run_dead_letters(self: Rc<Self>) {
        loop {
            let seen = self.dead_letters_due.version();
            for (key, slot) in self.owners_snapshot() {
                let OwnerSlot::Ready(owner) = slot else {
                    continue;
                };
                if !owner.has_dead_letters() {
                    continue;
                }
                let Some(topic) = self.topic(&key.0).ok().filter(|t| t.incarnation == key.1) else {
                    continue;
                };
                self.move_dead_letters(&topic, &owner).await;
            }
            if self.stopping.get() {
                return;
            }
            self.dead_letters_due.changed(seen).await;
        }
    }

    async fn move_dead_letters(&self, topic: &Topic, owner: &Owner) {
        loop {
            let letter = match owner.next_dead_letter().await {
                Ok(Some(letter)) => letter,
                Ok(None) => return,
                Err(error) => {
                    tracing::warn!(topic = %topic.name, %error, "reading a message for the dead-letter topic failed");
                    return;
                }
            };
            match self.dead_letter(topic, &letter.message).await {
                Ok(()) => {
                    metrics::counter!("narad_dead_lettered_total", "topic" => topic.name.clone())
                        .increment(1);
                    owner.dead_lettered(letter.offset);
                }
                Err(error) => {
                    tracing::warn!(topic = %topic.name, offset = letter.offset, %error, "dead-lettering failed; delivering again");
                    owner.dead_letter_failed(letter.offset);
                    self.announce_available();
                }
            }
        }
    }

    /// Writes a message durably to the topic's dead-letter topic (same id,
    /// key and value) through this shard's WAL.
    async fn dead_letter(&self, topic: &Topic, message: &Message) -> Result<(), ApiError> {
        let dlq_name = topic
            .config
            .dead_letter_topic
            .as_deref()
            .ok_or_else(|| ApiError::new(ErrorCode::Internal, "no dead-letter topic"))?;
        let dlq = self.topic(dlq_name)?;
        let partition = self.pick_partition(&dlq, message.key.as_deref());
        let accept_ms = self.now();
        let record = WalRecordRef {
            id: message.id,
            topic: &dlq.name,
            partition,
            key: message.key.as_deref(),
            value: &message.value,
            accept_ms,
            topic_incarnation: Some(dlq.incarnation),
        };
        let appended = self.wal.append(&record).map_err(|e| from_storage(&e))?;
        self.dispatch_once_durable(
            &dlq.name,
            partition,
            appended.end,
            DispatchRecord {
                pos: appended.pos,
                id: message.id,
                key: message.key.clone(),
                value: message.value.clone(),
                accept_ms,
                incarnation: Some(dlq.incarnation),
            },
        );
        appended.durable.await.map_err(|e| from_storage(&e))
    }

    /// Sweeps every open partition (the periodic lease sweep).
    pub async fn sweep_all(&self) {
        for topic in self.topics() {
            for (key, slot) in self.owners_snapshot() {
                if key.0 == topic.name && key.1 == topic.incarnation {
                    if let OwnerSlot::Ready(owner) = slot {
                        self.sweep_owner(&owner);
                    }
                }
            }
        }
    }

    fn owners_snapshot(&self) -> Vec<(OwnerKey, OwnerSlot)> {
        self.owners
            .borrow()
            .iter()
            .filter_map(|(k, slot)| match slot {
                OwnerSlot::Ready(owner) => Some((k.clone(), OwnerSlot::Ready(owner.clone()))),
                OwnerSlot::Opening => None,
            })
            .collect()
    }

    /// Opens every partition this shard owns that is not open yet, so that
    /// retention (applied by [`Self::maintain_all`] to open partitions) also
    /// ages out partitions nobody produced to or consumed from since the
    /// node started. Runs every [`IDLE_PARTITION_OPEN_INTERVAL`].
    pub async fn open_idle_partitions(&self) {
        if !self.meta.caught_up() {
            return;
        }
        for topic in self.topics() {
            if topic.config.retention_ms == 0 {
                continue;
            }
            for partition in 0..topic.config.partitions {
                let local = self.owner_node(&topic, partition) == self.me()
                    && self.mesh.is_local(&topic.name, partition);
                let key = (topic.name.clone(), topic.incarnation, partition);
                if !local || self.owners.borrow().contains_key(&key) {
                    continue;
                }
                if let Err(error) = self.owner(&topic, partition).await {
                    tracing::warn!(topic = %topic.name, partition, %error, "could not open a partition for retention");
                }
            }
        }
    }

    /// Writes acks on their intervals and applies retention everywhere.
    pub async fn maintain_all(&self) {
        for owner in self.open_owners() {
            if let Err(error) = owner.maintain().await {
                tracing::warn!(%error, "partition maintenance failed");
            }
        }
    }

    // ------------------------------------------------------------ settle

    /// Ack, nack or extend receipts, each at the node and shard that own
    /// its partition (where it was issued and is authenticated). Answers in
    /// the order given; extend answers the new lease end.
    pub async fn settle(
        &self,
        topic: &Topic,
        receipts: &[String],
        action: SettleAction,
    ) -> Vec<SettleOutcome> {
        let mut outcomes: Vec<Option<SettleOutcome>> = vec![None; receipts.len()];
        let me = self.me();
        let mut groups: BTreeMap<NodeId, Vec<(usize, String)>> = BTreeMap::new();
        for (index, text) in receipts.iter().enumerate() {
            match Receipt::peek(text, &topic.name) {
                // A partition beyond the topic's is "this node's": it is
                // authenticated here, then answered 410.
                Ok(receipt) => groups
                    .entry(self.owner_node(topic, receipt.partition))
                    .or_default()
                    .push((index, text.clone())),
                Err(error) => outcomes[index] = Some(Err(error)),
            }
        }
        for (node, group) in groups {
            let (indexes, texts): (Vec<usize>, Vec<String>) = group.into_iter().unzip();
            let count = texts.len();
            let answers = if node == me {
                self.settle_on_node(topic, texts, action).await
            } else if self.is_dead(node) {
                vec![Err(Self::owner_dead(node)); count]
            } else {
                let request = DataRequest::Settle {
                    topic: topic.name.clone(),
                    incarnation: topic.incarnation,
                    receipts: texts,
                    action: action.into(),
                };
                match self.call_node(node, &request, SETTLE_CALL_TIMEOUT).await {
                    Ok(DataAnswer::Settled(list)) if list.len() == count => list
                        .into_iter()
                        .map(|o| match o.error {
                            Some(error) => Err(error.to_api()),
                            None => Ok(o.lease_expires_at_ms),
                        })
                        .collect(),
                    Ok(_) => vec![
                        Err(ApiError::new(
                            ErrorCode::Internal,
                            format!("node {node} answered a settle oddly"),
                        ));
                        count
                    ],
                    Err(error) => vec![Err(error.to_api(node)); count],
                }
            };
            for (index, answer) in indexes.into_iter().zip(answers) {
                outcomes[index] = Some(answer);
            }
        }
        Self::in_request_order(outcomes)
    }

    /// Settles receipts of this node's partitions, each at the shard that
    /// owns its partition.
    async fn settle_on_node(
        &self,
        topic: &Topic,
        receipts: Vec<String>,
        action: SettleAction,
    ) -> Vec<SettleOutcome> {
        let mut outcomes: Vec<Option<SettleOutcome>> = vec![None; receipts.len()];
        let mut groups: Vec<Vec<(usize, Receipt)>> = vec![Vec::new(); self.mesh.shards()];
        for (index, text) in receipts.iter().enumerate() {
            match self.check_receipt(topic, text) {
                Ok(receipt) => {
                    groups[self.mesh.owner_of(&topic.name, receipt.partition)]
                        .push((index, receipt));
                }
                Err(error) => outcomes[index] = Some(Err(error)),
            }
        }
        for (shard, group) in groups.into_iter().enumerate() {
            if group.is_empty() {
                continue;
            }
            let (indexes, receipts): (Vec<usize>, Vec<Receipt>) = group.into_iter().unzip();
            let answers = if shard == self.mesh.me() {
                self.settle_local(topic, receipts, action)
            } else {
                let count = receipts.len();
                let topic = topic.clone();
                match self
                    .mesh
                    .call(shard, None, |reply| ShardMsg::Settle {
                        topic,
                        receipts,
                        action,
                        reply,
                    })
                    .await
                {
                    Ok(answers) => answers,
                    Err(error) => vec![Err(error); count],
                }
            };
            for (index, answer) in indexes.into_iter().zip(answers) {
                outcomes[index] = Some(answer);
            }
        }
        Self::in_request_order(outcomes)
    }

    /// Outcomes gathered per owner, back in request order (a receipt left
    /// unanswered would be a bug: it answers 500 rather than vanishing).
    fn in_request_order(outcomes: Vec<Option<SettleOutcome>>) -> Vec<SettleOutcome> {
        outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| Err(ApiError::new(ErrorCode::Internal, "receipt not settled")))
            })
            .collect()
    }

    fn lease_gone() -> ApiError {
        ApiError::new(
            ErrorCode::LeaseGone,
            "the lease already ended; the message is or will be delivered again",
        )
    }

    /// Decodes a receipt: 400 if forged or of another topic, 410 if it comes
    /// from an earlier start of the node or names a partition that is gone.
    fn check_receipt(&self, topic: &Topic, text: &str) -> Result<Receipt, ApiError> {
        let receipt = Receipt::decode(text, &topic.name, &self.receipt_key)?;
        if receipt.owner_epoch != self.identity.incarnation
            || receipt.partition >= topic.config.partitions
        {
            return Err(Self::lease_gone());
        }
        Ok(receipt)
    }

    /// Settles receipts of partitions this shard owns.
    fn settle_local(
        &self,
        topic: &Topic,
        receipts: Vec<Receipt>,
        action: SettleAction,
    ) -> Vec<SettleOutcome> {
        if self.acks_closed.get() {
            let stopping = ApiError::new(ErrorCode::Stopping, "the node is stopping");
            return vec![Err(stopping); receipts.len()];
        }
        let now = self.now();
        let answers: Vec<SettleOutcome> = receipts
            .into_iter()
            .map(|receipt| {
                let key = (topic.name.clone(), topic.incarnation, receipt.partition);
                let owner = match self.owners.borrow().get(&key) {
                    Some(OwnerSlot::Ready(owner)) => owner.clone(),
                    _ => return Err(Self::lease_gone()),
                };
                let (offset, lease) = (receipt.offset, receipt.lease_id);
                // An ack that cannot be made durable did not land: say so
                // rather than answer 204 for an ack held in memory only.
                if let Some(reason) = owner.ack_state_failure() {
                    return Err(ApiError::new(
                        ErrorCode::AckStateFailed,
                        format!(
                            "acks of partition {} cannot be made durable on this node: {reason}",
                            receipt.partition
                        ),
                    ));
                }
                let result = match action {
                    SettleAction::Ack => owner.ack(offset, lease, now).map(|()| None),
                    SettleAction::Nack { delay_ms } => {
                        let nacked = owner.nack(offset, lease, delay_ms, now).map(|()| None);
                        if owner.has_dead_letters() {
                            self.dead_letters_due.notify();
                        }
                        nacked
                    }
                    SettleAction::Extend {
                        visibility_timeout_ms,
                    } => owner
                        .extend(offset, lease, visibility_timeout_ms, now)
                        .map(Some),
                };
                result.map_err(|e| from_owner(&e))
            })
            .collect();
        match action {
            SettleAction::Ack => {
                for answer in &answers {
                    let label = if answer.is_ok() {
                        "acked"
                    } else {
                        "lease_gone"
                    };
                    metrics::counter!("narad_acks_total", "result" => label).increment(1);
                }
            }
            SettleAction::Nack { .. } => self.announce_available(),
            SettleAction::Extend { .. } => {}
        }
        answers
    }

    // ------------------------------------------------------------ health and stop

    /// Why the node is not ready, if it is not: stopping, any shard's WAL
    /// failed, or no Raft leader.
    pub async fn not_ready(&self) -> Option<ApiError> {
        if self.stopping.get() {
            return Some(ApiError::new(ErrorCode::Stopping, "the node is stopping"));
        }
        for gauges in self.gauges().await {
            if let Some(reason) = gauges.wal_failure {
                return Some(ApiError::new(
                    ErrorCode::WalFailed,
                    format!("the ingress WAL of shard {} failed: {reason}", gauges.shard),
                ));
            }
            if let Some(reason) = gauges.ack_state_failure {
                return Some(ApiError::new(
                    ErrorCode::AckStateFailed,
                    format!(
                        "the ack state of a partition of shard {} failed: {reason}",
                        gauges.shard
                    ),
                ));
            }
        }
        if self.meta.leader().is_none() {
            return Some(ApiError::new(
                ErrorCode::NoLeader,
                "the node has no Raft leader",
            ));
        }
        if !self.meta.caught_up() {
            return Some(ApiError::new(
                ErrorCode::CatchingUp,
                "the node has not yet applied the metadata the cluster committed",
            ));
        }
        None
    }

    /// This shard's figures.
    pub fn local_gauges(&self) -> ShardGauges {
        let now = self.now();
        let partitions = self
            .owners_snapshot()
            .into_iter()
            .filter_map(|((topic, _, partition), slot)| match slot {
                OwnerSlot::Ready(owner) => Some((topic, partition, owner.stats(now))),
                OwnerSlot::Opening => None,
            })
            .collect();
        ShardGauges {
            shard: self.mesh.me(),
            wal_used_bytes: self.wal.stats().used_bytes,
            wal_failure: self.wal.failure().map(|f| f.to_string()),
            ack_state_failure: self
                .open_owners()
                .iter()
                .find_map(|owner| owner.ack_state_failure()),
            dispatcher_pending: self.dispatcher_pending() as u64,
            partitions,
        }
    }

    /// Every shard's figures (a shard that does not answer in time is left
    /// out and logged).
    pub async fn gauges(&self) -> Vec<ShardGauges> {
        let mut all = vec![self.local_gauges()];
        for shard in 0..self.mesh.shards() {
            if shard == self.mesh.me() {
                continue;
            }
            match self
                .mesh
                .call(shard, Some(GAUGES_TIMEOUT), |reply| ShardMsg::Gauges {
                    reply,
                })
                .await
            {
                Ok(gauges) => all.push(gauges),
                Err(error) => tracing::warn!(shard, %error, "no figures from a shard"),
            }
        }
        all.sort_by_key(|g| g.shard);
        all
    }

    /// Answers what other shards ask, until they all stopped.
    pub async fn serve_peers(
        self: Rc<Self>,
        inbox: glommio::channels::shared_channel::ConnectedReceiver<ShardMsg>,
    ) {
        while let Some(message) = inbox.recv().await {
            if let ShardMsg::Available = message {
                self.availability.notify();
                continue;
            }
            let shard = self.clone();
            glommio::spawn_local(async move { shard.answer(message).await }).detach();
        }
    }

    /// Answers what other nodes ask of this one (the QUIC thread hands
    /// their requests to this shard), until the node stops.
    pub async fn serve_remote(
        self: Rc<Self>,
        mut inbox: futures_channel::mpsc::UnboundedReceiver<Inbound>,
    ) {
        use futures_lite::StreamExt;
        while let Some(Inbound { request, reply }) = inbox.next().await {
            // Once stopping, commits are refused before they touch a log:
            // the sender keeps the records and commits them again later,
            // rather than a commit landing whose answer never leaves.
            if self.stopping.get() && matches!(request, DataRequest::Commit { .. }) {
                let stopping = ApiError::new(ErrorCode::Stopping, "the owner is stopping");
                let _ = reply.send(DataAnswer::failed(&stopping));
                continue;
            }
            let shard = self.clone();
            shard.remote_in_flight.set(shard.remote_in_flight.get() + 1);
            glommio::spawn_local(async move {
                // A caller that gave up dropped its end: leases it would have
                // received expire and the messages are delivered again.
                let _ = reply.send(shard.answer_remote(request).await);
                shard.remote_in_flight.set(shard.remote_in_flight.get() - 1);
                shard.remote_done.notify();
            })
            .detach();
        }
    }

    /// The topic another node names, if this node knows that incarnation.
    fn topic_for_peer(&self, name: &str, incarnation: u64) -> Result<Rc<Topic>, ApiError> {
        let topic = self.topic(name)?;
        if topic.incarnation != incarnation {
            return Err(ApiError::new(
                ErrorCode::TopicNotFound,
                format!(
                    "node {} holds incarnation {} of topic {name:?}, not {incarnation}",
                    self.me(),
                    topic.incarnation
                ),
            ));
        }
        Ok(topic)
    }

    /// The partitions of a request from another node that this node owns
    /// (the sender's metadata may be older or newer than ours).
    fn own_partitions(&self, topic: &Topic, partitions: Vec<u32>) -> Vec<u32> {
        let me = self.me();
        partitions
            .into_iter()
            .filter(|p| *p < topic.config.partitions && self.owner_node(topic, *p) == me)
            .collect()
    }

    async fn answer_remote(&self, request: DataRequest) -> DataAnswer {
        let failed = |error: ApiError| DataAnswer::failed(&error);
        match request {
            DataRequest::Commit {
                topic,
                incarnation,
                partition,
                messages,
            } => {
                let topic = match self.topic_for_peer(&topic, incarnation) {
                    Ok(topic) => topic,
                    Err(error) => return failed(error),
                };
                if partition >= topic.config.partitions
                    || self.owner_node(&topic, partition) != self.me()
                {
                    return failed(ApiError::new(
                        ErrorCode::Conflict,
                        format!("node {} does not own partition {partition}", self.me()),
                    ));
                }
                let messages = messages
                    .into_iter()
                    .map(|m| Message {
                        id: m.id,
                        produced_at_ms: m.produced_at_ms,
                        key: m.key,
                        value: m.value.into(),
                    })
                    .collect();
                match self.commit_on_node(&topic, partition, messages).await {
                    Ok(()) => DataAnswer::Done,
                    Err(error) => failed(error),
                }
            }
            DataRequest::Collect {
                topic,
                incarnation,
                partitions,
                max,
                visibility_ms,
            } => {
                let topic = match self.topic_for_peer(&topic, incarnation) {
                    Ok(topic) => topic,
                    Err(error) => return failed(error),
                };
                let partitions = self.own_partitions(&topic, partitions);
                let rotation = self.round_robin.get().wrapping_add(1);
                self.round_robin.set(rotation);
                match self
                    .collect_on_node(&topic, partitions, max as usize, visibility_ms, rotation)
                    .await
                {
                    Ok(got) => DataAnswer::Collected(
                        got.into_iter().map(WireConsumed::from_consumed).collect(),
                    ),
                    Err(error) => failed(error),
                }
            }
            DataRequest::Settle {
                topic,
                incarnation,
                receipts,
                action,
            } => {
                let topic = match self.topic_for_peer(&topic, incarnation) {
                    Ok(topic) => topic,
                    Err(error) => return failed(error),
                };
                let outcomes = self
                    .settle_on_node(&topic, receipts, action.into())
                    .await
                    .into_iter()
                    .map(|outcome| match outcome {
                        Ok(lease_expires_at_ms) => WireOutcome {
                            error: None,
                            lease_expires_at_ms,
                        },
                        Err(error) => WireOutcome {
                            error: Some((&error).into()),
                            lease_expires_at_ms: None,
                        },
                    })
                    .collect();
                DataAnswer::Settled(outcomes)
            }
            DataRequest::Stats {
                topic,
                incarnation,
                partitions,
            } => {
                let topic = match self.topic_for_peer(&topic, incarnation) {
                    Ok(topic) => topic,
                    Err(error) => return failed(error),
                };
                let partitions = self.own_partitions(&topic, partitions);
                match self.stats_on_node(&topic, partitions).await {
                    Ok(stats) => DataAnswer::Stats(
                        stats
                            .iter()
                            .map(|(partition, figures)| WireStats::new(*partition, figures))
                            .collect(),
                    ),
                    Err(error) => failed(error),
                }
            }
            DataRequest::Available { from } => {
                if let Some(peers) = &self.peers {
                    peers.heard_available(from, self.now());
                }
                self.availability.notify();
                self.mesh.announce_available();
                DataAnswer::Done
            }
        }
    }

    async fn answer(&self, message: ShardMsg) {
        // A requester that gave up dropped its end: nothing to tell it.
        match message {
            ShardMsg::Commit {
                topic,
                partition,
                messages,
                reply,
            } => {
                let _ = reply.send(self.commit_local(&topic, partition, messages).await);
            }
            ShardMsg::Collect {
                topic,
                partitions,
                max,
                visibility_ms,
                reply,
            } => {
                let got = self
                    .collect_local(&topic, &partitions, max, visibility_ms)
                    .await;
                if let Err(Ok(unclaimed)) = reply.send(got) {
                    // The consumer is gone: its leases expire and the
                    // messages are delivered again.
                    tracing::debug!(
                        messages = unclaimed.len(),
                        "a consume gave up before its answer"
                    );
                }
            }
            ShardMsg::Settle {
                topic,
                receipts,
                action,
                reply,
            } => {
                let _ = reply.send(self.settle_local(&topic, receipts, action));
            }
            ShardMsg::Stats {
                topic,
                partitions,
                reply,
            } => {
                let _ = reply.send(self.local_stats(&topic, &partitions).await);
            }
            ShardMsg::Gauges { reply } => {
                let _ = reply.send(self.local_gauges());
            }
            ShardMsg::Available => self.availability.notify(),
        }
    }

    /// Graceful stop, first half: refuse new produces and let the dispatcher
    /// commit what it holds (other shards keep answering commits until every
    /// shard finished this half).
    pub async fn drain(&self) {
        self.stopping.set(true);
        self.availability.notify();
        self.dispatch_signal.notify();
        let deadline = std::time::Instant::now() + STOP_DRAIN_TIMEOUT;
        while self.undispatched() > 0 && std::time::Instant::now() < deadline {
            let seen = self.dispatch_signal.version();
            futures_lite::future::or(
                self.dispatch_signal.changed(seen),
                glommio::timer::sleep(Duration::from_millis(50)),
            )
            .await;
        }
        // Commits other nodes sent before the stop finish and are answered.
        while self.remote_in_flight.get() > 0 && std::time::Instant::now() < deadline {
            let seen = self.remote_done.version();
            futures_lite::future::or(
                self.remote_done.changed(seen),
                glommio::timer::sleep(Duration::from_millis(50)),
            )
            .await;
        }
        let left = self.undispatched();
        if left > 0 {
            tracing::warn!(
                records = left,
                "stopping with records not yet committed; the WAL keeps them for the next start"
            );
        }
    }

    /// Graceful stop, second half: sync the WAL checkpoint and flush every
    /// ack to disk.
    pub async fn finish(&self) {
        self.acks_closed.set(true);
        self.wal.close();
        if let Err(error) = self.wal.checkpoint().await {
            tracing::error!(%error, "final WAL checkpoint failed");
        }
        for owner in self.open_owners() {
            if let Err(error) = owner.flush_acks().await {
                tracing::error!(%error, "flushing acks at stop failed");
            }
        }
    }
}

/// Counts long polls parked waiting for messages
/// (`narad_consume_long_polls_waiting`), also when the client goes away.
struct LongPollGauge;

impl LongPollGauge {
    fn park() -> Self {
        metrics::gauge!("narad_consume_long_polls_waiting").increment(1.0);
        Self
    }
}

impl Drop for LongPollGauge {
    fn drop(&mut self) {
        metrics::gauge!("narad_consume_long_polls_waiting").decrement(1.0);
    }
}

/// Runs `tick` every `interval` until the shard stops.
pub async fn every(
    shard: Rc<Shard>,
    interval: Duration,
    tick: impl Fn(Rc<Shard>) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>,
) {
    while !shard.is_stopping() {
        glommio::timer::sleep(interval).await;
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
