//! A whole cluster in one thread: nodes of shards over simulated disks, a
//! simulated network between them, and a stand-in for the metastore's
//! decisions, all on the executor's manual clock.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::{Rc, Weak};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use narad_broker::config::Config;
use narad_broker::idempotency::NodeKeys;
use narad_broker::mesh::shard_for;
use narad_broker::metastore::{Metastore, Proposal};
use narad_broker::receipt::ReceiptKey;
use narad_broker::remote::Peers;
use narad_broker::rpc::{
    answer_from_wire, encode_request, open, Address, CallError, Delivered, Envelope, Links,
    Operation, Reach, Reply, Transport, Visit,
};
use narad_broker::settings::Settings;
use narad_broker::shard::{Shard, ShardEnv, ShardIdentity, ShardParts};
use narad_net::http_server::NodeBudget;
use narad_net::{ApiError, ErrorCode};
use narad_raft::detector::Detector;
use narad_raft::node::{meta_feed, MemberChange, MetaError, MetaFeed, MetaPublisher, MetaSnapshot};
use narad_raft::state::{Applied, Command, MetaState, NodeId};
use narad_raft::store::MetaView;
use narad_storage::clock::{Clock, SharedClock};
use narad_storage::io::faulty::FaultControl;
use narad_storage::io::sim::SimFs;
use narad_storage::limits::IDEMPOTENCY_KEYS_PER_SHARD_MAX;
use narad_storage::rng::SimRng;
use narad_storage::wal::{Wal, WalConfig};

use super::disk::{Latency, TimedFs};
use super::executor::{Executor, Group, SimRuntime};

pub const SHARDS: usize = 2;
/// How long a call between nodes waits when its deadline is not given.
const CALL_TIMEOUT_DEFAULT: Duration = Duration::from_secs(1);
/// How long a started node takes to learn the metadata (ms), drawn up to
/// this.
const CATCH_UP_MS_MAX: u64 = 300;
/// Latency of one hop between nodes (ms), drawn up to this.
const HOP_MS_MAX: u64 = 3;

pub type SimShard = Shard<TimedFs>;

fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| PrometheusBuilder::new().build_recorder().handle())
        .clone()
}

/// The settings every simulated node runs with: the defaults the contract
/// windows assume, with small files, then `overrides`.
pub fn settings(overrides: &[(&str, &str)]) -> Arc<Settings> {
    let flags: Vec<(String, String)> = [
        ("storage.wal_ring_bytes", "1048576"),
        ("storage.segment_bytes", "262144"),
        ("cluster.node_dead_after_ms", "3000"),
        ("cluster.heartbeat_interval_ms", "200"),
        ("dispatcher.reroute_after_ms", "2000"),
    ]
    .iter()
    .chain(overrides)
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let config = Config::resolve(None, Vec::new(), &flags).expect("the simulation's config");
    Arc::new(Settings::from_config(&config).expect("the simulation's settings"))
}

// ------------------------------------------------------------ metastore

/// The metastore's decisions, made at once by a deterministic stand-in for
/// the Raft leader (the real state machine, without its log). Each node
/// sees them through its own feed: a node that starts holds what it had
/// applied before (nothing after a lost volume) and is not caught up until
/// it has learned the rest, a little later, as a restarted node is.
pub struct StandIn {
    state: RefCell<MetaState>,
    applied: Cell<u64>,
    latest: RefCell<Arc<MetaView>>,
    feeds: RefCell<BTreeMap<NodeId, NodeFeed>>,
    members: Vec<(NodeId, String)>,
}

/// What one node has applied.
struct NodeFeed {
    publisher: MetaPublisher,
    feed: MetaFeed,
    caught_up: Rc<Cell<bool>>,
}

impl NodeFeed {
    fn new(view: Arc<MetaView>, caught_up: bool) -> Self {
        let (publisher, feed) = meta_feed(MetaView::clone(&view));
        Self {
            publisher,
            feed,
            caught_up: Rc::new(Cell::new(caught_up)),
        }
    }
}

impl StandIn {
    pub fn new(nodes: u64) -> Rc<Self> {
        let state = MetaState::default();
        let latest = Arc::new(MetaView {
            state: state.clone(),
            applied_index: 0,
        });
        let feeds = (1..=nodes)
            .map(|id| (id, NodeFeed::new(latest.clone(), true)))
            .collect();
        Rc::new(Self {
            state: RefCell::new(state),
            applied: Cell::new(0),
            latest: RefCell::new(latest),
            feeds: RefCell::new(feeds),
            members: (1..=nodes).map(|id| (id, format!("sim-{id}"))).collect(),
        })
    }

    /// Applies a command and hands the new state to every caught-up node.
    pub fn apply(&self, command: &Command) -> Result<Applied, MetaError> {
        let applied = self.state.borrow_mut().apply(command)?;
        self.applied.set(self.applied.get() + 1);
        let view = Arc::new(MetaView {
            state: self.state.borrow().clone(),
            applied_index: self.applied.get(),
        });
        *self.latest.borrow_mut() = view.clone();
        for feed in self.feeds.borrow().values() {
            if feed.caught_up.get() {
                let _ = feed.publisher.send(view.clone());
            }
        }
        Ok(applied)
    }

    /// The leader's state.
    pub fn view(&self) -> Arc<MetaView> {
        self.latest.borrow().clone()
    }

    /// A node starts: with what it applied before (or nothing, after a lost
    /// volume), not caught up.
    fn restart(&self, node: NodeId, lost_volume: bool) {
        let mut feeds = self.feeds.borrow_mut();
        let held = match (lost_volume, feeds.get(&node)) {
            (false, Some(feed)) => feed.feed.borrow().clone(),
            _ => Arc::new(MetaView::default()),
        };
        feeds.insert(node, NodeFeed::new(held, false));
    }

    /// The node has learned everything committed so far.
    fn catch_up(&self, node: NodeId) {
        if let Some(feed) = self.feeds.borrow().get(&node) {
            let _ = feed.publisher.send(self.view());
            feed.caught_up.set(true);
        }
    }

    fn feed(&self, node: NodeId) -> MetaFeed {
        self.feeds.borrow()[&node].feed.clone()
    }

    fn caught_up(&self, node: NodeId) -> bool {
        self.feeds.borrow()[&node].caught_up.get()
    }
}

/// One node's handle on the stand-in.
/// The simulated cluster has no other cluster to ship to: a remote child
/// here would stay failing with this said.
struct NoRemoteClusters;

impl narad_broker::ship::Ship for NoRemoteClusters {
    fn ship(
        &self,
        shipment: narad_broker::ship::Shipment,
    ) -> narad_raft::node::BoxFuture<Result<(), String>> {
        let url = shipment.target.url;
        Box::pin(async move {
            Err(format!(
                "could not reach the remote {url}: the simulation has no other cluster"
            ))
        })
    }
}

struct NodeMeta {
    standin: Rc<StandIn>,
    me: NodeId,
}

impl Metastore for NodeMeta {
    fn snapshot(&self) -> MetaSnapshot {
        MetaSnapshot::new(self.standin.feed(self.me))
    }

    fn subscribe(&self) -> MetaFeed {
        self.standin.feed(self.me)
    }

    fn view(&self) -> Arc<MetaView> {
        self.standin.feed(self.me).borrow().clone()
    }

    fn caught_up(&self) -> bool {
        self.standin.caught_up(self.me)
    }

    fn leader(&self) -> Option<NodeId> {
        Some(1)
    }

    fn is_leader(&self) -> bool {
        self.me == 1
    }

    fn term(&self) -> u64 {
        1
    }

    fn members(&self) -> Vec<(NodeId, String)> {
        self.standin.members.clone()
    }

    fn learners(&self) -> Vec<NodeId> {
        Vec::new()
    }

    fn propose(&self, command: Command) -> Proposal<'_> {
        let applied = self.standin.apply(&command);
        Box::pin(async move { applied })
    }

    fn change_members(&self, _change: MemberChange) -> Proposal<'_> {
        Box::pin(async {
            Err(MetaError::Failed(
                "the simulation's membership is fixed".into(),
            ))
        })
    }
}

// ------------------------------------------------------------ network

/// A running node: its task group and its shards.
type Running = (Group, Vec<Rc<SimShard>>);

/// The running shards of every node, and the faults between nodes.
pub struct Network {
    executor: Rc<Executor>,
    rng: RefCell<SimRng>,
    running: RefCell<BTreeMap<NodeId, Running>>,
    /// Nodes cut off from every other.
    pub cut: RefCell<BTreeSet<NodeId>>,
    /// One way of a link that carries nothing: what `.0` sends to `.1` is
    /// lost (the other way still carries).
    pub one_way: RefCell<BTreeSet<(NodeId, NodeId)>>,
    /// Messages between nodes lost, per thousand.
    pub loss_per_mille: Cell<u64>,
}

impl Network {
    fn new(executor: Rc<Executor>, seed: u64) -> Rc<Self> {
        Rc::new(Self {
            executor,
            rng: RefCell::new(SimRng::new(seed ^ 0x4E37)),
            running: RefCell::default(),
            cut: RefCell::default(),
            one_way: RefCell::default(),
            loss_per_mille: Cell::new(0),
        })
    }

    fn shards_of(&self, node: NodeId) -> Option<Vec<Rc<SimShard>>> {
        self.running.borrow().get(&node).map(|(_, s)| s.clone())
    }

    /// A running node's task group and shards.
    pub fn target(&self, node: NodeId) -> Option<Running> {
        self.running.borrow().get(&node).cloned()
    }

    fn lost(&self, from: NodeId, to: NodeId) -> bool {
        let cut = self.cut.borrow();
        cut.contains(&from)
            || cut.contains(&to)
            || self.one_way.borrow().contains(&(from, to))
            || self
                .rng
                .borrow_mut()
                .chance(self.loss_per_mille.get(), 1000)
    }

    fn hop(&self) -> super::executor::Sleep {
        let ms = self.rng.borrow_mut().below(HOP_MS_MAX + 1);
        self.executor.sleep(Duration::from_millis(ms))
    }
}

/// The transport between the shards of one node.
struct SimShards {
    network: Weak<Network>,
    node: NodeId,
}

fn stopped() -> CallError {
    CallError::Refused(ApiError::new(ErrorCode::Stopping, "the node stopped"))
}

impl Transport for SimShards {
    fn deliver(&self, to: Address, envelope: Envelope, _: Option<Duration>) -> Delivered<'_> {
        self.hand_over(to, envelope);
        Box::pin(async { Ok(()) })
    }
}

impl SimShards {
    fn hand_over(&self, to: Address, envelope: Envelope) {
        let Address::Shard(shard) = to else {
            return;
        };
        let target = self
            .network
            .upgrade()
            .and_then(|n| n.shards_of(self.node))
            .and_then(|shards| shards.get(shard).cloned());
        // A node that stopped drops the envelope: its reply end goes too.
        if let Some(target) = target {
            target.receive(envelope, Reach::Shard);
        }
    }
}

/// The transport between nodes: operations travel in their wire form.
struct SimNodes {
    network: Weak<Network>,
    me: NodeId,
}

struct Trip {
    network: Rc<Network>,
    from: NodeId,
    to: NodeId,
    timeout: Duration,
}

impl Visit for Trip {
    type Output = Delivered<'static>;

    fn visit<O: Operation>(self, op: O, reply: Reply<O::Reply>) -> Delivered<'static> {
        let Trip {
            network,
            from,
            to,
            timeout,
        } = self;
        Box::pin(async move {
            let unreachable = |why: &str| CallError::Unreachable(why.to_string());
            let bytes = encode_request(&op).map_err(CallError::Unreachable)?;
            if network.lost(from, to) {
                network.executor.sleep(timeout).await;
                return Err(unreachable("the request was lost"));
            }
            network.hop().await;
            let Some(shards) = network.shards_of(to) else {
                network.executor.sleep(timeout).await;
                return Err(unreachable("the node is down"));
            };
            let (envelope, answer) = open(O::KIND, &bytes).map_err(CallError::Unreachable)?;
            let home = envelope.home().map_or(0, |(topic, partition)| {
                shard_for(topic, partition, shards.len())
            });
            shards[home].receive(envelope, Reach::Node);
            let expired = async {
                network.executor.sleep(timeout).await;
                Err("no answer in time".to_string())
            };
            let bytes = futures_lite::future::or(answer, expired)
                .await
                .map_err(CallError::Unreachable)?;
            if network.lost(to, from) {
                return Err(unreachable("the answer was lost"));
            }
            network.hop().await;
            answer_from_wire::<O>(&bytes, reply)
        })
    }
}

impl Transport for SimNodes {
    fn deliver(&self, to: Address, envelope: Envelope, timeout: Option<Duration>) -> Delivered<'_> {
        let (Address::Node(node), Some(network)) = (to, self.network.upgrade()) else {
            return Box::pin(async { Err(stopped()) });
        };
        envelope.visit(Trip {
            network,
            from: self.me,
            to: node,
            timeout: timeout.unwrap_or(CALL_TIMEOUT_DEFAULT),
        })
    }
}

// ------------------------------------------------------------ nodes

/// One node: its disk, and its shards while it runs.
pub struct SimNode {
    pub fs: SimFs,
    /// Its volume was lost since it last ran.
    wiped: bool,
    pub latency: Rc<Latency>,
    key: ReceiptKey,
    epoch: u32,
    pub group: Option<Group>,
}

pub struct SimCluster {
    pub executor: Rc<Executor>,
    pub standin: Rc<StandIn>,
    pub network: Rc<Network>,
    pub nodes: Vec<SimNode>,
    pub settings: Arc<Settings>,
    rng: RefCell<SimRng>,
}

impl SimCluster {
    pub fn new(seed: u64, nodes: u64, overrides: &[(&str, &str)]) -> Self {
        let executor = Executor::new(seed, 1_000_000);
        let mut rng = SimRng::new(seed);
        let nodes = (1..=nodes)
            .map(|id| {
                let mut key = [0u8; 32];
                rng.fill(&mut key);
                SimNode {
                    wiped: false,
                    fs: SimFs::new(seed ^ (id << 32)),
                    latency: Latency::new(executor.clone(), seed ^ id),
                    key: ReceiptKey::from_bytes(key),
                    epoch: 0,
                    group: None,
                }
            })
            .collect::<Vec<_>>();
        let count = nodes.len() as u64;
        Self {
            network: Network::new(executor.clone(), seed),
            standin: StandIn::new(count),
            executor,
            nodes,
            settings: settings(overrides),
            rng: RefCell::new(rng),
        }
    }

    fn index(&self, node: NodeId) -> usize {
        usize::try_from(node - 1).expect("a node id")
    }

    /// A shard of a running node.
    pub fn shard(&self, node: NodeId, shard: usize) -> Option<Rc<SimShard>> {
        self.network.shards_of(node)?.get(shard).cloned()
    }

    /// Starts a node on its disk: each shard opens its WAL and commits
    /// again what it held, as a process start does.
    pub fn start(&mut self, node: NodeId) {
        let index = self.index(node);
        assert!(
            self.nodes[index].group.is_none(),
            "node {node} runs already"
        );
        let group = self.executor.group();
        let incarnation = self.rng.borrow_mut().next_u64();
        let catch_up_ms = self.rng.borrow_mut().below(CATCH_UP_MS_MAX + 1);
        let sim = &mut self.nodes[index];
        sim.epoch += 1;
        self.standin.restart(node, std::mem::take(&mut sim.wiped));
        let (standin, sleeper) = (self.standin.clone(), self.executor.clone());
        self.executor.spawn(
            group,
            Box::pin(async move {
                sleeper.sleep(Duration::from_millis(catch_up_ms)).await;
                standin.catch_up(node);
            }),
        );
        let members: std::collections::BTreeMap<NodeId, String> = self
            .standin
            .members
            .iter()
            .map(|(id, addr)| (*id, addr.clone()))
            .collect();
        let peers = Arc::new(Peers::new(node, &members));
        let wal_failed = Arc::new(AtomicBool::new(false));
        let keys = NodeKeys::new(IDEMPOTENCY_KEYS_PER_SHARD_MAX * SHARDS, SHARDS);
        let recovered = Arc::new(narad_broker::recovered::Recovered::default());
        let folders = Arc::new(narad_broker::folders::TopicFolders::default());
        let mut shards = Vec::with_capacity(SHARDS);
        sim.latency.instant.set(true);
        for index in 0..SHARDS {
            let fs = TimedFs::new(sim.fs.clone(), sim.latency.clone());
            let wal_dir = std::path::PathBuf::from(format!("/data/wal/shard-{index}"));
            let config = WalConfig {
                ring_bytes: self.settings.storage.wal_ring_bytes,
                ..WalConfig::default()
            };
            let (wal, recovery) = futures_lite::future::block_on(Wal::open(&fs, &wal_dir, config))
                .expect("the simulated WAL opens");
            keys.recover(
                recovery.keys.iter().map(|(_, key)| key),
                self.executor.clock.now_ms(),
            );
            keys.shard_loaded();
            let identity = ShardIdentity {
                node_id: u16::try_from(node).expect("a node id"),
                shard_id: u16::try_from(index).expect("a shard"),
                shards: u16::try_from(SHARDS).expect("shards"),
                epoch: sim.epoch,
                incarnation,
            };
            let clock: SharedClock = self.executor.clock.clone();
            let shard = Shard::new(ShardParts {
                identity,
                settings: self.settings.clone(),
                links: Links {
                    shards: Box::new(SimShards {
                        network: Rc::downgrade(&self.network),
                        node,
                    }),
                    nodes: Some(Box::new(SimNodes {
                        network: Rc::downgrade(&self.network),
                        me: node,
                    })),
                },
                wal,
                peers: Some(peers.clone()),
                env: ShardEnv {
                    data_dir: "/data".into(),
                    fs,
                    clock,
                    runtime: Rc::new(SimRuntime {
                        executor: self.executor.clone(),
                        group,
                    }),
                    meta: Rc::new(NodeMeta {
                        standin: self.standin.clone(),
                        me: node,
                    }),
                    receipt_key: sim.key.clone(),
                    metrics: metrics_handle(),
                    wal_failed: wal_failed.clone(),
                    keys: keys.clone(),
                    recovered: recovered.clone(),
                    folders: folders.clone(),
                    http_budget: NodeBudget::new(1024, 1 << 30),
                    ship: Arc::new(NoRemoteClusters),
                    faults: FaultControl::new(false),
                },
            });
            let recovered = recovery
                .records
                .into_iter()
                .map(|r| (r.pos, r.record))
                .collect();
            shard.start_tasks(recovered);
            self.executor
                .spawn(group, Box::pin(shard.clone().run_dispatcher()));
            shards.push(shard);
        }
        sim.latency.instant.set(false);
        sim.group = Some(group);
        self.network
            .running
            .borrow_mut()
            .insert(node, (group, shards));
        self.standin
            .apply(&Command::SetNodeState {
                id: node,
                addr: format!("sim-{node}"),
                alive: true,
                now_ms: self.executor.now_ms(),
            })
            .expect("mark alive");
    }

    /// The process dies: its tasks go, its open files stop working; with
    /// `power`, what was not synced is lost or torn too.
    pub fn crash(&mut self, node: NodeId, power: bool) {
        let index = self.index(node);
        let Some(group) = self.nodes[index].group.take() else {
            return;
        };
        self.network.running.borrow_mut().remove(&node);
        self.executor.kill(group);
        let fs = &self.nodes[index].fs;
        if power {
            fs.power_loss();
        } else {
            fs.crash_process();
        }
    }

    /// The node's volume is lost: it starts again on an empty disk, with a
    /// new receipt key and start counter, as a node on a new volume does.
    pub fn wipe(&mut self, node: NodeId) {
        self.crash(node, false);
        let index = self.index(node);
        let mut key = [0u8; 32];
        self.rng.borrow_mut().fill(&mut key);
        let seed = self.rng.borrow_mut().next_u64();
        let sim = &mut self.nodes[index];
        sim.fs = SimFs::new(seed);
        sim.wiped = true;
        sim.key = ReceiptKey::from_bytes(key);
        sim.epoch = 0;
    }

    /// What node `from` gets back when it sends `op` to node `to` over the
    /// simulated network (which must not be cut or lossy for a sure answer).
    pub async fn call_node<O: Operation>(
        &self,
        from: NodeId,
        to: NodeId,
        op: O,
    ) -> Result<O::Reply, CallError> {
        let transport = SimNodes {
            network: Rc::downgrade(&self.network),
            me: from,
        };
        let runtime = SimRuntime {
            executor: self.executor.clone(),
            group: self.executor.group(),
        };
        narad_broker::rpc::call(&transport, &runtime, Address::Node(to), op, None).await
    }

    /// The controller's failure detector on the simulated clock, as the
    /// Raft leader runs it: every heartbeat interval each node that runs
    /// and is not cut off, nor has a link out of it cut, is heard, and [`Detector::judge`] marks a node
    /// silent for `cluster.node_dead_after_ms` dead (dated from its last
    /// heartbeat) and a heard one alive again.
    pub fn run_failure_detector(&self) {
        let executor = self.executor.clone();
        let network = self.network.clone();
        let standin = self.standin.clone();
        let members: Vec<(NodeId, String)> = (1..=self.nodes.len() as u64)
            .map(|id| (id, format!("sim-{id}")))
            .collect();
        let detector = Detector {
            me: 0,
            leading_since_ms: executor.now_ms(),
            dead_after_ms: self.settings.cluster.node_dead_after_ms,
        };
        let interval = Duration::from_millis(self.settings.cluster.heartbeat_interval_ms);
        let group = executor.group();
        executor.clone().spawn(
            group,
            Box::pin(async move {
                let mut heard: BTreeMap<NodeId, u64> = BTreeMap::new();
                loop {
                    executor.sleep(interval).await;
                    let now = executor.now_ms();
                    for (id, _) in &members {
                        let running = network.running.borrow().contains_key(id);
                        let mute = network.one_way.borrow().iter().any(|(from, _)| from == id);
                        if running && !mute && !network.cut.borrow().contains(id) {
                            heard.insert(*id, now);
                        }
                    }
                    let known = standin.view().state.nodes.clone();
                    for verdict in detector.judge(now, &heard, &members, &known) {
                        tracing::info!(
                            node = verdict.id,
                            alive = verdict.alive,
                            since_ms = verdict.changed_ms,
                            "the simulated controller marks a node"
                        );
                        let _ = standin.apply(&Command::SetNodeState {
                            id: verdict.id,
                            addr: verdict.addr,
                            alive: verdict.alive,
                            now_ms: verdict.changed_ms,
                        });
                    }
                }
            }),
        );
    }
}
