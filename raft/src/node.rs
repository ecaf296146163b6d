//! Runs the metastore: openraft on its own OS thread with a tokio
//! current-thread runtime. Shards on glommio hold a [`MetaNode`] and await
//! its methods directly (the `Raft` handle is `Send + Sync`); they read the
//! applied state from the watch channel, never by asking.
//!
//! Other nodes are reached through a [`PeerCaller`] (the broker gives it the
//! node's QUIC endpoint): Raft RPCs and control-plane writes forwarded to
//! the leader travel as serialized requests of the kinds below, and
//! [`MetaNode::serve`] answers them. Without peers a node bootstraps a
//! single-member cluster on its first start; with peers, the member with the
//! smallest id bootstraps the whole initial membership once.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use narad_storage::io::blocking::BlockingFs;
use openraft::error::{
    ClientWriteError, InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, ChangeMembers, Config, Raft, SnapshotPolicy};
use tokio::sync::{oneshot, watch};

use crate::detector::Detector;
use crate::prevote::{self, Guard, LeaderContact, PreVoteAnswer};
use crate::state::{Applied, Command, Refused};
use crate::store::{LogStore, MetaView, NodeId, StateMachine, TypeConfig};

/// Request kinds of the metastore on the peer network.
pub const KIND_APPEND_ENTRIES: u8 = 1;
pub const KIND_VOTE: u8 = 2;
pub const KIND_INSTALL_SNAPSHOT: u8 = 3;
/// A control-plane write forwarded to the leader.
pub const KIND_FORWARD_WRITE: u8 = 4;
/// "Are you part of an initialized cluster, and at which term?"
pub const KIND_PROBE: u8 = 5;
/// A node's liveness heartbeat to the leader.
pub const KIND_HEARTBEAT: u8 = 7;
/// "Stand for election now": a leaving leader's request to its successor.
pub const KIND_ELECT: u8 = 6;
/// A change of the membership ([`MemberChange`]), done by the leader.
pub const KIND_MEMBER_CHANGE: u8 = 8;
/// "Would you vote for me?", asked before an election (see `prevote`).
pub const KIND_PRE_VOTE: u8 = 9;
/// How often a joining node asks to be admitted until it is a member.
const JOIN_RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// A learner this many entries or fewer behind the leader's log is caught
/// up and becomes a voter.
const LEARNER_CAUGHT_UP_LAG: u64 = 10;
/// How long a membership change may take before it is reported failed.
const MEMBER_CHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// A change of who belongs to the cluster.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum MemberChange {
    /// Add a node as a learner (it becomes a voter once caught up) and
    /// record it. `--join` sends this; so does `POST /v1/cluster/nodes`.
    Admit { id: NodeId, addr: String },
    /// Forget a dead or decommissioned node that owns nothing and take it
    /// out of the membership.
    Remove { id: NodeId },
}
/// How long a leaving leader waits for a follower to catch up and take
/// over. Its shards drain meanwhile, and the node's stop waits for both:
/// this must stay well under `dispatcher.reroute_after_ms` (3 s), or other
/// nodes reroute around a node that is still stopping and store copies
/// twice.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one handover election may take before the successor is asked
/// to stand again.
const HANDOVER_ATTEMPT_WAIT: Duration = Duration::from_millis(300);
/// After a leaving leader stepped down, how long it gives its successor's
/// running election before asking for another.
const HANDOVER_STEP_DOWN_WAIT: Duration = Duration::from_millis(50);
/// How long a starting node with an empty folder asks its peers.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// A leader whose last quorum acknowledgement is older than this is not
/// counted as a leader (a few heartbeat rounds and election timeouts).
const LEADER_QUORUM_STALE_MS: u64 = 2_000;

/// Whether a leader's last quorum acknowledgement (openraft's
/// `millis_since_quorum_ack`) is recent enough for it to count as leader.
fn quorum_fresh(millis_since_quorum_ack: Option<u64>) -> bool {
    millis_since_quorum_ack.is_some_and(|ms| ms <= LEADER_QUORUM_STALE_MS)
}

/// Whether this node heard its leader recently enough to count it (as a
/// leader counts its quorum).
fn leader_heard(contact: &LeaderContact) -> bool {
    contact.fresh(Duration::from_millis(LEADER_QUORUM_STALE_MS))
}
/// How long a leader without a fresh quorum acknowledgement waits for one
/// before it refuses a write.
const QUORUM_ACK_WAIT: Duration = Duration::from_secs(1);
/// How long a control-plane write may wait for a leader and a quorum.
const PROPOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// A write forwarded to a leader that does not answer within this is sent
/// again to whichever node leads by then (a leader that just stopped must
/// not hold writes for the whole `PROPOSE_TIMEOUT`).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(1);
/// After a failed forward, how long to wait for another leader to show.
const FORWARD_RETRY_WAIT: Duration = Duration::from_millis(500);

/// A future that may cross threads.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// How the metastore reaches another node: one request of `kind` to the
/// peer address `addr`, answered within `timeout`.
pub trait PeerCaller: Send + Sync + 'static {
    fn call(
        &self,
        addr: &str,
        kind: u8,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<Result<Vec<u8>, String>>;
}

/// Settings of one metastore node.
#[derive(Clone)]
pub struct MetaNodeConfig {
    pub node_id: NodeId,
    pub dir: PathBuf,
    /// The address other nodes reach this one at (for the membership).
    pub peer_addr: String,
    /// The initial members with their peer addresses, this node included;
    /// empty for a single-node cluster.
    pub members: BTreeMap<NodeId, String>,
    /// A member's peer address to join through (`--join`): the node does
    /// not bootstrap, and asks to be admitted until it is a member.
    pub join: Option<String>,
    /// The peer network (none for a single-node cluster).
    pub caller: Option<Arc<dyn PeerCaller>>,
    /// Take a snapshot (and purge the log) after this many entries.
    pub snapshot_after_entries: u64,
    pub heartbeat_interval_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// How often a node tells the leader it lives (`cluster.heartbeat_interval_ms`).
    pub liveness_interval_ms: u64,
    /// Silence after which the controller marks a node dead
    /// (`cluster.node_dead_after_ms`).
    pub node_dead_after_ms: u64,
    /// The files' I/O (through the fault layer in tests).
    pub fs: BlockingFs,
}

impl MetaNodeConfig {
    pub fn single(node_id: NodeId, dir: PathBuf, peer_addr: String) -> Self {
        Self {
            node_id,
            dir,
            peer_addr,
            members: BTreeMap::new(),
            join: None,
            caller: None,
            snapshot_after_entries: 1000,
            // openraft gives an AppendEntries one heartbeat interval to
            // answer; loaded two-core machines (CI runs many nodes at once)
            // missed 100 ms and leadership churned.
            heartbeat_interval_ms: 250,
            election_timeout_min_ms: 1000,
            election_timeout_max_ms: 2000,
            liveness_interval_ms: 1000,
            node_dead_after_ms: 30_000,
            fs: BlockingFs::real(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum MetaError {
    /// The command was refused by the state machine's rules.
    #[error(transparent)]
    Refused(#[from] Refused),
    /// No leader could take the command (API: 503 `no_quorum`).
    #[error("no Raft quorum: {0}")]
    NoQuorum(String),
    /// The metastore is shut down or failed.
    #[error("metastore failed: {0}")]
    Failed(String),
}

/// The peer network as openraft sees it.
#[derive(Clone, Default)]
pub struct PeerNetwork {
    caller: Option<Arc<dyn PeerCaller>>,
}

/// One target of the peer network.
pub struct PeerClient {
    caller: Option<Arc<dyn PeerCaller>>,
    target: NodeId,
    addr: String,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerClient;
    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        PeerClient {
            caller: self.caller.clone(),
            target,
            addr: node.addr.clone(),
        }
    }
}

fn unreachable<E: std::error::Error>(why: &str) -> RPCError<NodeId, BasicNode, E> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other(why.to_string())))
}

impl PeerClient {
    /// Sends one RPC; the peer answers the serialized result of the same
    /// call on its own Raft.
    async fn rpc<Req, Resp, E>(
        &self,
        kind: u8,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Req: serde::Serialize,
        Resp: serde::de::DeserializeOwned,
        E: std::error::Error + serde::de::DeserializeOwned,
    {
        let Some(caller) = &self.caller else {
            return Err(unreachable("no peer network"));
        };
        let payload = serde_json::to_vec(request).map_err(|e| unreachable(&e.to_string()))?;
        let answer = caller
            .call(&self.addr, kind, payload, option.hard_ttl())
            .await
            .map_err(|e| unreachable(&e))?;
        let result: Result<Resp, RaftError<NodeId, E>> =
            serde_json::from_slice(&answer).map_err(|e| unreachable(&e.to_string()))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.rpc(KIND_APPEND_ENTRIES, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.rpc(KIND_INSTALL_SNAPSHOT, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.rpc(KIND_VOTE, &rpc, &option).await
    }
}

/// Writes at this node if it leads; else sends the command to the leader
/// once it is known.
async fn propose_at_leader(
    raft: Raft<TypeConfig>,
    caller: Option<Arc<dyn PeerCaller>>,
    command: Command,
    node_id: NodeId,
    submitted: &std::sync::atomic::AtomicBool,
    leaving: &std::sync::atomic::AtomicBool,
    contact: &LeaderContact,
) -> Result<Applied, MetaError> {
    loop {
        // A follower that has not heard its leader for a while is cut off
        // from it (it calls no election, see `prevote`): it has no leader
        // to forward to, and waits for one as if none were known.
        let unheard_leader = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            metrics
                .current_leader
                .is_some_and(|leader| leader != node_id)
                && !leader_heard(contact)
        };
        if unheard_leader {
            let _ = raft
                .wait(Some(FORWARD_RETRY_WAIT))
                .metrics(|m| m.current_leader == Some(node_id), "leadership")
                .await;
            continue;
        }
        // A leader handing over appends nothing more: an entry its
        // successor lacks would cost the successor this node's vote. The
        // write waits for the next leader instead.
        let handing_over = leaving.load(std::sync::atomic::Ordering::SeqCst)
            && raft.metrics().borrow().current_leader == Some(node_id);
        if handing_over {
            let _ = raft
                .wait(Some(FORWARD_RETRY_WAIT))
                .metrics(|m| m.current_leader != Some(node_id), "another leader")
                .await;
            continue;
        }
        // A leader cut off from its quorum refuses at once instead of
        // appending a change that might commit much later.
        let stale_leader = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            metrics.current_leader == Some(node_id)
                && !quorum_fresh(metrics.millis_since_quorum_ack)
                && metrics.membership_config.membership().voter_ids().count() > 1
        };
        if stale_leader {
            // A new leader hears from its quorum within a heartbeat or two.
            let heard = raft
                .wait(Some(QUORUM_ACK_WAIT))
                .metrics(
                    |m| {
                        m.current_leader != Some(node_id) || quorum_fresh(m.millis_since_quorum_ack)
                    },
                    "a quorum acknowledgement",
                )
                .await;
            if heard.is_err() {
                return Err(MetaError::NoQuorum(
                    "this node leads but has not heard from a quorum".into(),
                ));
            }
            continue;
        }
        submitted.store(true, std::sync::atomic::Ordering::SeqCst);
        let forward = match raft.client_write(command.clone()).await {
            Ok(response) => return Ok(response.data?),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => forward,
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                return Err(MetaError::Failed(e.to_string()))
            }
            Err(RaftError::Fatal(fatal)) => return Err(MetaError::Failed(fatal.to_string())),
        };
        match (forward.leader_node, &caller) {
            (Some(leader), Some(caller)) => {
                let payload =
                    serde_json::to_vec(&command).map_err(|e| MetaError::Failed(e.to_string()))?;
                match caller
                    .call(&leader.addr, KIND_FORWARD_WRITE, payload, FORWARD_TIMEOUT)
                    .await
                {
                    Ok(answer) => {
                        return serde_json::from_slice::<Result<Applied, MetaError>>(&answer)
                            .map_err(|e| MetaError::Failed(format!("the leader's answer: {e}")))?
                    }
                    // The leader may have just stopped: try whoever leads
                    // next (the caller's timeout bounds the retries).
                    Err(error) => {
                        tracing::debug!(%error, "a forwarded write got no answer; trying again");
                        let tried = forward.leader_id;
                        let _ = raft
                            .wait(Some(FORWARD_RETRY_WAIT))
                            .metrics(|m| m.current_leader != tried, "another leader")
                            .await;
                    }
                }
            }
            // No leader yet: wait for one (the caller's timeout bounds this).
            _ => {
                submitted.store(false, std::sync::atomic::Ordering::SeqCst);
                let _ = raft
                    .wait(Some(Duration::from_millis(500)))
                    .metrics(|m| m.current_leader.is_some(), "a leader")
                    .await;
            }
        }
    }
}

/// Makes a membership change on the leader: this node if it leads, else
/// the leader it knows of (retried while leadership moves).
async fn change_members_at_leader(
    raft: Raft<TypeConfig>,
    caller: Option<Arc<dyn PeerCaller>>,
    change: MemberChange,
) -> Result<Applied, MetaError> {
    loop {
        let (leader, leader_addr, me) = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            let addr = metrics.current_leader.and_then(|l| {
                metrics
                    .membership_config
                    .membership()
                    .get_node(&l)
                    .map(|n| n.addr.clone())
            });
            (metrics.current_leader, addr, metrics.id)
        };
        match leader {
            Some(leader) if leader == me => return change_members_here(&raft, &change).await,
            Some(_) => {
                let (Some(addr), Some(caller)) = (leader_addr, &caller) else {
                    return Err(MetaError::NoQuorum(
                        "the leader's address is unknown".into(),
                    ));
                };
                let payload =
                    serde_json::to_vec(&change).map_err(|e| MetaError::Failed(e.to_string()))?;
                match caller
                    .call(&addr, KIND_MEMBER_CHANGE, payload, MEMBER_CHANGE_TIMEOUT)
                    .await
                {
                    Ok(answer) => {
                        return serde_json::from_slice::<Result<Applied, MetaError>>(&answer)
                            .map_err(|e| MetaError::Failed(format!("the leader's answer: {e}")))?
                    }
                    Err(error) => {
                        tracing::debug!(%error, "a membership change got no answer; trying again");
                        let _ = raft
                            .wait(Some(FORWARD_RETRY_WAIT))
                            .metrics(|m| m.current_leader != leader, "another leader")
                            .await;
                    }
                }
            }
            None => {
                let _ = raft
                    .wait(Some(FORWARD_RETRY_WAIT))
                    .metrics(|m| m.current_leader.is_some(), "a leader")
                    .await;
            }
        }
    }
}

/// A membership change on this node, the leader.
async fn change_members_here(
    raft: &Raft<TypeConfig>,
    change: &MemberChange,
) -> Result<Applied, MetaError> {
    let failed = |e: &dyn std::fmt::Display| MetaError::NoQuorum(e.to_string());
    let write = |command: Command| async move {
        match raft.client_write(command).await {
            Ok(response) => response.data.map_err(MetaError::from),
            Err(error) => Err(failed(&error)),
        }
    };
    match change {
        MemberChange::Admit { id, addr } => {
            let known = raft
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .get_node(id)
                .map(|n| n.addr.clone());
            match known {
                Some(known) if known != *addr => {
                    return Err(MetaError::Refused(Refused::MemberAddressTaken {
                        id: *id,
                        addr: known,
                    }))
                }
                Some(_) => {}
                None => {
                    raft.add_learner(*id, BasicNode { addr: addr.clone() }, false)
                        .await
                        .map_err(|e| failed(&e))?;
                    tracing::info!(node = id, %addr, "admitted a node as a learner");
                }
            }
            write(Command::AdmitNode {
                id: *id,
                addr: addr.clone(),
                now_ms: wall_ms(),
            })
            .await
        }
        MemberChange::Remove { id } => {
            let member = raft
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .get_node(id)
                .is_some();
            let applied = write(Command::RemoveNode { id: *id, member }).await?;
            let (voter, member) = {
                let metrics = raft.metrics();
                let metrics = metrics.borrow();
                let membership = metrics.membership_config.membership();
                (
                    membership.voter_ids().any(|v| v == *id),
                    membership.get_node(id).is_some(),
                )
            };
            let ids = BTreeSet::from([*id]);
            if voter {
                raft.change_membership(ChangeMembers::RemoveVoters(ids), false)
                    .await
                    .map_err(|e| failed(&e))?;
            } else if member {
                raft.change_membership(ChangeMembers::RemoveNodes(ids), false)
                    .await
                    .map_err(|e| failed(&e))?;
            }
            tracing::info!(node = id, "removed a node from the cluster");
            Ok(applied)
        }
    }
}

/// One reader's copy of the applied metadata (a shard keeps one): reading
/// it costs an atomic load while nothing changed, and it is refreshed from
/// the metastore the first time it is read after an apply, so it is never
/// older than what the metastore has published.
pub struct MetaSnapshot {
    feed: MetaFeed,
    view: Arc<MetaView>,
}

/// A feed of applied states: a reader sees the latest, and can wait for
/// the next.
pub type MetaFeed = watch::Receiver<Arc<MetaView>>;

/// The sending end of a feed: the metastore's, or a stand-in's.
pub type MetaPublisher = watch::Sender<Arc<MetaView>>;

/// A feed that starts at `view`.
pub fn meta_feed(view: MetaView) -> (MetaPublisher, MetaFeed) {
    watch::channel(Arc::new(view))
}

impl MetaSnapshot {
    /// A snapshot that follows `feed`.
    pub fn new(mut feed: MetaFeed) -> Self {
        let view = feed.borrow_and_update().clone();
        Self { feed, view }
    }

    /// The current applied state, and whether it changed since the last
    /// read.
    pub fn current(&mut self) -> (&Arc<MetaView>, bool) {
        let changed = self.feed.has_changed().unwrap_or(false);
        if changed {
            self.view = self.feed.borrow_and_update().clone();
        }
        (&self.view, changed)
    }
}

/// A running metastore node.
pub struct MetaNode {
    raft: Raft<TypeConfig>,
    view: watch::Receiver<Arc<MetaView>>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    node_id: NodeId,
    /// The metastore thread's runtime: proposals run there, with its timer.
    runtime: tokio::runtime::Handle,
    caller: Option<Arc<dyn PeerCaller>>,
    /// A node that came back with an empty folder may have voted, before it
    /// lost it, in any term up to this one: it grants no vote in those terms.
    refuse_votes_up_to: u64,
    /// How far the other members had applied when this node started: it is
    /// caught up only once it applied as far.
    catch_up_to: u64,
    /// Set the first time this node applied every entry it held (and at
    /// least `catch_up_to`): from then on an entry appended but not yet
    /// applied is a write in flight, not metadata still being learned.
    caught_up_once: Arc<std::sync::atomic::AtomicBool>,
    /// Heartbeats this node received while it leads.
    heard: Heard,
    leaving: Leaving,
    /// When a leader's append last reached this node, and the shortest
    /// election timeout (a pre-vote's terms).
    contact: LeaderContact,
    election_timeout_min: Duration,
}

/// Set once a stopping node starts to hand its leadership over.
type Leaving = Arc<std::sync::atomic::AtomicBool>;

/// When the leader last heard from each node, and its address.
type Heard = Arc<std::sync::Mutex<BTreeMap<NodeId, (std::time::Instant, String)>>>;

/// A node's heartbeat to the leader.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Heartbeat {
    id: NodeId,
    addr: String,
}

/// Runs on every node: sends this node's heartbeat to the leader, and, on
/// the leader, names the cluster once and marks nodes dead or alive through
/// Raft when their heartbeats stop or start again.
struct Controller {
    raft: Raft<TypeConfig>,
    view: watch::Receiver<Arc<MetaView>>,
    caller: Option<Arc<dyn PeerCaller>>,
    node_id: NodeId,
    addr: String,
    interval: Duration,
    dead_after: Duration,
    heard: Heard,
    leaving: Leaving,
    contact: LeaderContact,
    /// `--join`: the member to ask for admission until this node is one.
    join: Option<String>,
}

impl Controller {
    async fn run(self) {
        let mut leading_since: Option<std::time::Instant> = None;
        loop {
            tokio::time::sleep(self.interval).await;
            let (leader, members) = {
                let metrics = self.raft.metrics();
                let metrics = metrics.borrow();
                let members: Vec<(NodeId, String)> = metrics
                    .membership_config
                    .membership()
                    .nodes()
                    .map(|(id, node)| (*id, node.addr.clone()))
                    .collect();
                (metrics.current_leader, members)
            };
            if leader != Some(self.node_id) {
                leading_since = None;
                if !members.iter().any(|(id, _)| *id == self.node_id) {
                    self.ask_to_join(leader, &members).await;
                }
                self.send_heartbeat(leader, &members).await;
                continue;
            }
            let since = *leading_since.get_or_insert_with(std::time::Instant::now);
            self.judge(since, &members).await;
            self.promote_learners().await;
        }
    }

    /// A joining node that is not a member yet asks (the leader it knows
    /// of, else the `--join` address) to be admitted.
    async fn ask_to_join(&self, leader: Option<NodeId>, members: &[(NodeId, String)]) {
        let Some(caller) = &self.caller else {
            return;
        };
        let leader_addr = leader.and_then(|l| members.iter().find(|(id, _)| *id == l));
        let Some(addr) = leader_addr.map(|(_, a)| a.clone()).or(self.join.clone()) else {
            return;
        };
        let change = MemberChange::Admit {
            id: self.node_id,
            addr: self.addr.clone(),
        };
        let Ok(payload) = serde_json::to_vec(&change) else {
            return;
        };
        match caller
            .call(&addr, KIND_MEMBER_CHANGE, payload, MEMBER_CHANGE_TIMEOUT)
            .await
        {
            Ok(answer) => match serde_json::from_slice::<Result<Applied, MetaError>>(&answer) {
                Ok(Ok(_)) => {
                    tracing::info!(through = %addr, "admitted to the cluster as a learner")
                }
                Ok(Err(error)) => tracing::warn!(through = %addr, %error, "not admitted yet"),
                Err(error) => tracing::warn!(through = %addr, %error, "a bad answer to joining"),
            },
            Err(error) => {
                tracing::warn!(through = %addr, %error, "could not reach the member to join through; trying again")
            }
        }
        tokio::time::sleep(JOIN_RETRY_INTERVAL.saturating_sub(self.interval)).await;
    }

    /// On the leader: a learner whose log caught up with the leader's
    /// becomes a voter (unless it is being decommissioned).
    async fn promote_learners(&self) {
        let ready: BTreeSet<NodeId> = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            let membership = metrics.membership_config.membership();
            let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
            let last = metrics.last_log_index.unwrap_or(0);
            let view = self.view.borrow().clone();
            membership
                .learner_ids()
                .filter(|id| !voters.contains(id) && !view.state.decommissioning(*id))
                .filter(|id| {
                    metrics
                        .replication
                        .as_ref()
                        .and_then(|r| r.get(id).copied().flatten())
                        .is_some_and(|matched| matched.index + LEARNER_CAUGHT_UP_LAG >= last)
                })
                .collect()
        };
        if ready.is_empty() {
            return;
        }
        tracing::info!(?ready, "learners caught up: making them voters");
        match self
            .raft
            .change_membership(ChangeMembers::AddVoterIds(ready), true)
            .await
        {
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "could not make caught-up learners voters"),
        }
    }

    async fn send_heartbeat(&self, leader: Option<NodeId>, members: &[(NodeId, String)]) {
        let (Some(leader), Some(caller)) = (leader, &self.caller) else {
            return;
        };
        let Some((_, addr)) = members.iter().find(|(id, _)| *id == leader) else {
            return;
        };
        let beat = Heartbeat {
            id: self.node_id,
            addr: self.addr.clone(),
        };
        if let Ok(payload) = serde_json::to_vec(&beat) {
            let _ = caller
                .call(addr, KIND_HEARTBEAT, payload, self.interval)
                .await;
        }
    }

    /// On the leader: what the state should say about each member.
    async fn judge(&self, leading_since: std::time::Instant, members: &[(NodeId, String)]) {
        let view = self.view.borrow().clone();
        if view.state.cluster_id.is_none() {
            let seed = format!(
                "{}-{:?}-{}",
                self.node_id,
                std::time::SystemTime::now(),
                std::process::id()
            );
            let id = blake3::hash(seed.as_bytes()).to_hex();
            self.propose(Command::InitCluster {
                cluster_id: id.as_str().get(..32).unwrap_or_default().to_string(),
            })
            .await;
        }
        // The detector's clock: milliseconds since this leader started.
        let ms = |at: std::time::Instant| {
            u64::try_from(at.saturating_duration_since(leading_since).as_millis())
                .unwrap_or(u64::MAX)
        };
        let now_ms = ms(std::time::Instant::now());
        let heard: BTreeMap<NodeId, u64> = self
            .heard
            .lock()
            .map(|h| h.iter().map(|(id, (at, _))| (*id, ms(*at))).collect())
            .unwrap_or_default();
        let detector = Detector {
            me: self.node_id,
            leading_since_ms: 0,
            dead_after_ms: u64::try_from(self.dead_after.as_millis()).unwrap_or(u64::MAX),
        };
        for verdict in detector.judge(now_ms, &heard, members, &view.state.nodes) {
            if !verdict.alive {
                tracing::warn!(
                    node = verdict.id,
                    "no heartbeat for {:?}: marking the node dead",
                    self.dead_after
                );
            }
            // On the wall clock, as the metastore keeps it.
            let changed_ms = wall_ms().saturating_sub(now_ms.saturating_sub(verdict.changed_ms));
            self.propose(Command::SetNodeState {
                id: verdict.id,
                addr: verdict.addr,
                alive: verdict.alive,
                now_ms: changed_ms,
            })
            .await;
        }
    }

    async fn propose(&self, command: Command) {
        let submitted = std::sync::atomic::AtomicBool::new(false);
        let proposing = propose_at_leader(
            self.raft.clone(),
            self.caller.clone(),
            command,
            self.node_id,
            &submitted,
            &self.leaving,
            &self.contact,
        );
        if let Ok(Err(error)) = tokio::time::timeout(PROPOSE_TIMEOUT, proposing).await {
            tracing::debug!(%error, "controller change not applied");
        }
    }
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What a probe answers.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
struct ProbeAnswer {
    initialized: bool,
    term: u64,
    /// The index of the last entry the answering node applied (older
    /// nodes leave it out).
    #[serde(default)]
    applied: u64,
}

/// What the other members said when this node started.
#[derive(Debug, Clone, Copy, Default)]
struct Probed {
    /// Some member is part of an initialized cluster.
    initialized: bool,
    /// The highest term any member is in.
    term: u64,
    /// The highest index any member applied: this node is caught up once it
    /// applied as far (what the cluster had committed when it started).
    applied: u64,
}

/// Whether metrics show a node with a leader that applied every entry it
/// holds, and at least `catch_up_to`.
/// A follower whose replicated log reaches this leader's last entry.
fn caught_up_follower(
    metrics: &openraft::RaftMetrics<NodeId, BasicNode>,
    node_id: NodeId,
) -> Option<NodeId> {
    let last = metrics.last_log_index?;
    metrics
        .replication
        .as_ref()?
        .iter()
        .find(|(id, matched)| **id != node_id && matched.map(|l| l.index) == Some(last))
        .map(|(id, _)| *id)
}

fn metrics_caught_up(metrics: &openraft::RaftMetrics<NodeId, BasicNode>, catch_up_to: u64) -> bool {
    let applied = metrics.last_applied.map(|l| l.index);
    metrics.current_leader.is_some()
        && applied >= metrics.last_log_index
        && applied.unwrap_or(0) >= catch_up_to
}

impl MetaNode {
    /// Starts the node's thread, opens its storage and, on a first start,
    /// bootstraps a single-member cluster.
    pub fn start(config: MetaNodeConfig) -> Result<Self, MetaError> {
        let (ready_sender, ready) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let node_id = config.node_id;
        let caller = config.caller.clone();
        let heard: Heard = Arc::default();
        let served_heard = heard.clone();
        let leaving: Leaving = Arc::default();
        let controller_leaving = leaving.clone();
        let guard_leaving = leaving.clone();
        let contact = LeaderContact::default();
        let guard_contact = contact.clone();
        let election_timeout_min = Duration::from_millis(config.election_timeout_min_ms);
        let thread = std::thread::Builder::new()
            .name("narad-raft".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        let _ = ready_sender.send(Err(MetaError::Failed(error.to_string())));
                        return;
                    }
                };
                runtime.block_on(async move {
                    match Self::boot(&config).await {
                        Ok((raft, view, refuse, catch_up_to)) => {
                            let handle = tokio::runtime::Handle::current();
                            let controller = Controller {
                                raft: raft.clone(),
                                view: view.clone(),
                                caller: config.caller.clone(),
                                node_id: config.node_id,
                                addr: config.peer_addr.clone(),
                                interval: Duration::from_millis(config.liveness_interval_ms),
                                dead_after: Duration::from_millis(config.node_dead_after_ms),
                                heard: heard.clone(),
                                leaving: controller_leaving,
                                contact: guard_contact.clone(),
                                join: config.join.clone(),
                            };
                            tokio::spawn(controller.run());
                            if let Some(caller) = config.caller.clone() {
                                tokio::spawn(
                                    Guard {
                                        raft: raft.clone(),
                                        node_id: config.node_id,
                                        caller,
                                        contact: guard_contact,
                                        leaving: guard_leaving,
                                        interval: Duration::from_millis(
                                            config.heartbeat_interval_ms,
                                        ),
                                        election_timeout_min,
                                    }
                                    .run(),
                                );
                            }
                            let _ = ready_sender.send(Ok((
                                raft.clone(),
                                view,
                                handle,
                                refuse,
                                catch_up_to,
                            )));
                            let _ = stopped.await;
                            let _ = raft.shutdown().await;
                        }
                        Err(error) => {
                            let _ = ready_sender.send(Err(error));
                        }
                    }
                });
            })
            .map_err(|e| MetaError::Failed(e.to_string()))?;
        let (raft, view, runtime, refuse_votes_up_to, catch_up_to) = ready
            .recv()
            .map_err(|e| MetaError::Failed(e.to_string()))??;
        Ok(Self {
            raft,
            view,
            stop: Some(stop),
            thread: Some(thread),
            node_id,
            runtime,
            caller,
            refuse_votes_up_to,
            catch_up_to,
            caught_up_once: Arc::default(),
            heard: served_heard,
            leaving,
            contact,
            election_timeout_min,
        })
    }

    async fn boot(
        config: &MetaNodeConfig,
    ) -> Result<(Raft<TypeConfig>, watch::Receiver<Arc<MetaView>>, u64, u64), MetaError> {
        let failed = |e: &dyn std::fmt::Display| MetaError::Failed(e.to_string());
        let raft_config = Config {
            cluster_name: "narad".into(),
            heartbeat_interval: config.heartbeat_interval_ms,
            election_timeout_min: config.election_timeout_min_ms,
            election_timeout_max: config.election_timeout_max_ms,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_after_entries),
            max_in_snapshot_log_to_keep: 0,
            ..Config::default()
        }
        .validate()
        .map_err(|e| failed(&e))?;
        let log = LogStore::open(&config.fs, &config.dir).map_err(|e| failed(&e))?;
        let (machine, view) =
            StateMachine::open(&config.fs, &config.dir).map_err(|e| failed(&e))?;
        let network = PeerNetwork {
            caller: config.caller.clone(),
        };
        let raft = Raft::new(config.node_id, Arc::new(raft_config), network, log, machine)
            .await
            .map_err(|e| failed(&e))?;
        // One node bootstraps: this one alone, or the member with the
        // smallest id for the whole initial membership. The others learn it
        // from that node's first messages. A node with an empty folder whose
        // peers already form a cluster lost its volume: it bootstraps
        // nothing, and grants no vote in a term it may have voted in before.
        let initialized = raft.is_initialized().await.map_err(|e| failed(&e))?;
        if initialized {
            Self::warn_of_moved_peers(config, &raft);
        }
        // Every start asks the others how far they applied: until this node
        // applied as far, it cannot tell a missing topic from one it has not
        // learned yet (`caught_up`).
        let probed = Self::probe_peers(config).await;
        let (peers_initialized, peers_term) = if initialized {
            (false, 0)
        } else {
            (probed.initialized, probed.term)
        };
        let refuse_votes_up_to = if peers_initialized {
            // A member's first start after the others formed the cluster
            // looks the same: say both, so a first start does not alarm.
            tracing::warn!(
                node = config.node_id,
                term = peers_term,
                "joining an existing cluster with an empty data folder (this node's first start, or a lost volume): metadata comes from the peers"
            );
            peers_term
        } else {
            0
        };
        let bootstraps = config.join.is_none()
            && config
                .members
                .keys()
                .next()
                .is_none_or(|first| *first == config.node_id);
        if bootstraps && !initialized && !peers_initialized {
            let members: BTreeMap<NodeId, BasicNode> = if config.members.is_empty() {
                BTreeMap::from([(
                    config.node_id,
                    BasicNode {
                        addr: config.peer_addr.clone(),
                    },
                )])
            } else {
                config
                    .members
                    .iter()
                    .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
                    .collect()
            };
            raft.initialize(members).await.map_err(|e| failed(&e))?;
        }
        Ok((raft, view, refuse_votes_up_to, probed.applied))
    }

    /// Says so when `peers` names members at other addresses than the
    /// membership this node's folder holds: the stored membership is what
    /// Raft uses (a cluster restored on hosts with other addresses finds no
    /// quorum).
    fn warn_of_moved_peers(config: &MetaNodeConfig, raft: &Raft<TypeConfig>) {
        let metrics = raft.metrics();
        let stored: BTreeMap<NodeId, String> = metrics
            .borrow()
            .membership_config
            .membership()
            .nodes()
            .map(|(id, node)| (*id, node.addr.clone()))
            .collect();
        let differ: Vec<String> = config
            .members
            .iter()
            .filter_map(|(id, addr)| match stored.get(id) {
                Some(kept) if kept == addr => None,
                Some(kept) => Some(format!("{id}={addr} (stored {id}={kept})")),
                None => Some(format!("{id}={addr} (not a stored member)")),
            })
            .collect();
        if !differ.is_empty() {
            tracing::warn!(
                differ = %differ.join(", "),
                "the peers given disagree with the membership stored in the data folder, which is what this node uses: members are reached at their stored addresses (keep them, or use DNS names that move with the hosts)"
            );
        }
    }

    /// Asks every other member, all at once, whether it is part of an
    /// initialized cluster, at which term, and how far it applied (members
    /// that do not answer within [`PROBE_TIMEOUT`] are skipped).
    async fn probe_peers(config: &MetaNodeConfig) -> Probed {
        let Some(caller) = &config.caller else {
            return Probed::default();
        };
        let asks: Vec<_> = config
            .members
            .iter()
            .filter(|(id, _)| **id != config.node_id)
            .map(|(_, addr)| addr)
            .chain(config.join.as_ref())
            .map(|addr| {
                let (caller, addr) = (caller.clone(), addr.clone());
                tokio::spawn(async move {
                    caller
                        .call(&addr, KIND_PROBE, Vec::new(), PROBE_TIMEOUT)
                        .await
                })
            })
            .collect();
        let mut probed = Probed::default();
        for ask in asks {
            let Ok(Ok(answer)) = ask.await else {
                continue;
            };
            if let Ok(probe) = serde_json::from_slice::<ProbeAnswer>(&answer) {
                probed.initialized |= probe.initialized;
                probed.term = probed.term.max(probe.term);
                probed.applied = probed.applied.max(probe.applied);
            }
        }
        probed
    }

    /// Proposes a command and waits until it is applied: at this node if it
    /// leads, else forwarded to the leader. `NoQuorum` when no leader takes
    /// it within a few seconds. Can be awaited from any executor.
    pub async fn propose(&self, command: Command) -> Result<Applied, MetaError> {
        let (raft, caller) = (self.raft.clone(), self.caller.clone());
        let node_id = self.node_id;
        let leaving = self.leaving.clone();
        let contact = self.contact.clone();
        let task = self.runtime.spawn(async move {
            let submitted = std::sync::atomic::AtomicBool::new(false);
            let proposing = propose_at_leader(
                raft, caller, command, node_id, &submitted, &leaving, &contact,
            );
            match tokio::time::timeout(PROPOSE_TIMEOUT, proposing).await {
                Ok(result) => result,
                // Once in a leader's log, a change may still be committed
                // later: say so rather than "it did not happen".
                Err(_) if submitted.load(std::sync::atomic::Ordering::SeqCst) => {
                    Err(MetaError::Failed(format!(
                        "no quorum confirmed the change within {PROPOSE_TIMEOUT:?}; it may still apply"
                    )))
                }
                Err(_) => Err(MetaError::NoQuorum(format!(
                    "no leader with a quorum within {PROPOSE_TIMEOUT:?}"
                ))),
            }
        });
        task.await
            .map_err(|e| MetaError::Failed(format!("the metastore thread: {e}")))?
    }

    /// Changes the membership ([`MemberChange`]) at the leader, forwarded
    /// there if another node leads; answers once applied.
    pub async fn change_members(&self, change: MemberChange) -> Result<Applied, MetaError> {
        let (raft, caller) = (self.raft.clone(), self.caller.clone());
        let task = self.runtime.spawn(async move {
            tokio::time::timeout(
                MEMBER_CHANGE_TIMEOUT,
                change_members_at_leader(raft, caller, change),
            )
            .await
            .unwrap_or_else(|_| {
                Err(MetaError::NoQuorum(format!(
                    "no leader made the membership change within {MEMBER_CHANGE_TIMEOUT:?}"
                )))
            })
        });
        task.await
            .map_err(|e| MetaError::Failed(format!("the metastore thread: {e}")))?
    }

    /// Members that are learners (joining: not voters yet).
    pub fn learners(&self) -> Vec<NodeId> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        metrics
            .membership_config
            .membership()
            .learner_ids()
            .collect()
    }

    /// Answers a request from another node (see the `KIND_` constants).
    pub fn serve(&self, kind: u8, payload: Vec<u8>) -> BoxFuture<Result<Vec<u8>, String>> {
        let raft = self.raft.clone();
        let caller = self.caller.clone();
        let heard = self.heard.clone();
        let refuse_votes_up_to = self.refuse_votes_up_to;
        let leaving = self.leaving.clone();
        let (contact, election_timeout_min) = (self.contact.clone(), self.election_timeout_min);
        let me = self.node_id;
        Box::pin(async move {
            let bad = |e: serde_json::Error| format!("bad request of kind {kind}: {e}");
            let answer = match kind {
                KIND_APPEND_ENTRIES => {
                    let request = serde_json::from_slice(&payload).map_err(bad)?;
                    let answer = raft.append_entries(request).await;
                    // A leader of this term or a later one (a stale one is
                    // answered with the higher vote and is no contact).
                    if !matches!(answer, Err(_) | Ok(AppendEntriesResponse::HigherVote(_))) {
                        contact.heard();
                    }
                    serde_json::to_vec(&answer)
                }
                KIND_PRE_VOTE => {
                    let leads_with_quorum = {
                        let metrics = raft.metrics();
                        let metrics = metrics.borrow();
                        metrics.current_leader == Some(me)
                            && quorum_fresh(metrics.millis_since_quorum_ack)
                    };
                    serde_json::to_vec(&PreVoteAnswer {
                        granted: prevote::grants(
                            leads_with_quorum,
                            contact.fresh(election_timeout_min),
                        ),
                    })
                }
                KIND_VOTE => {
                    let request: VoteRequest<NodeId> =
                        serde_json::from_slice(&payload).map_err(bad)?;
                    if request.vote.leader_id().term <= refuse_votes_up_to {
                        // Not granted, and nothing recorded: see `boot`.
                        let refused: Result<VoteResponse<NodeId>, RaftError<NodeId>> =
                            Ok(VoteResponse::new(request.vote, None, false));
                        serde_json::to_vec(&refused)
                    } else {
                        serde_json::to_vec(&raft.vote(request).await)
                    }
                }
                KIND_HEARTBEAT => {
                    let beat: Heartbeat = serde_json::from_slice(&payload).map_err(bad)?;
                    if let Ok(mut heard) = heard.lock() {
                        heard.insert(beat.id, (std::time::Instant::now(), beat.addr));
                    }
                    Ok(Vec::new())
                }
                KIND_ELECT => {
                    raft.trigger().elect().await.map_err(|e| e.to_string())?;
                    Ok(Vec::new())
                }
                KIND_PROBE => {
                    let metrics = raft.metrics().borrow().clone();
                    let initialized = metrics
                        .membership_config
                        .membership()
                        .voter_ids()
                        .next()
                        .is_some();
                    serde_json::to_vec(&ProbeAnswer {
                        initialized,
                        term: metrics.current_term,
                        applied: metrics.last_applied.map_or(0, |l| l.index),
                    })
                }
                KIND_INSTALL_SNAPSHOT => {
                    let request: InstallSnapshotRequest<TypeConfig> =
                        serde_json::from_slice(&payload).map_err(bad)?;
                    let sender = request.vote;
                    let answer = raft.install_snapshot(request).await;
                    // A deposed leader is answered with the higher vote.
                    if answer.as_ref().is_ok_and(|a| a.vote <= sender) {
                        contact.heard();
                    }
                    serde_json::to_vec(&answer)
                }
                KIND_FORWARD_WRITE => {
                    if leaving.load(std::sync::atomic::Ordering::SeqCst) {
                        // The sender tries whoever leads next.
                        return Err("handing leadership over".to_string());
                    }
                    let command: Command = serde_json::from_slice(&payload).map_err(bad)?;
                    // Only the leader takes forwarded writes: no second hop.
                    let result = match raft.client_write(command).await {
                        Ok(response) => response.data.map_err(MetaError::from),
                        Err(error) => Err(MetaError::NoQuorum(format!(
                            "the node forwarded to could not take the write: {error}"
                        ))),
                    };
                    serde_json::to_vec(&result)
                }
                KIND_MEMBER_CHANGE => {
                    let change: MemberChange = serde_json::from_slice(&payload).map_err(bad)?;
                    let result = tokio::time::timeout(
                        MEMBER_CHANGE_TIMEOUT,
                        change_members_at_leader(raft, caller, change),
                    )
                    .await
                    .unwrap_or_else(|_| {
                        Err(MetaError::NoQuorum(
                            "the membership change took too long".into(),
                        ))
                    });
                    serde_json::to_vec(&result)
                }
                other => return Err(format!("no metastore request of kind {other}")),
            };
            answer.map_err(|e| e.to_string())
        })
    }

    /// The applied state, swapped whole on each apply.
    pub fn view(&self) -> Arc<MetaView> {
        self.view.borrow().clone()
    }

    /// A receiver that sees every applied state.
    pub fn subscribe(&self) -> MetaFeed {
        self.view.clone()
    }

    /// A reader's own copy of the applied state: see [`MetaSnapshot`].
    pub fn snapshot(&self) -> MetaSnapshot {
        MetaSnapshot::new(self.view.clone())
    }

    /// The current leader, if any. A leader that has not heard from a
    /// quorum for a while does not count: it cannot commit anything. Nor
    /// does a leader this node has not heard from for as long: a follower
    /// cut off from it calls no election (see `prevote`), so Raft's own
    /// record of the leader stays.
    pub fn leader(&self) -> Option<NodeId> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        // A Raft that stopped for good leads nothing and follows no one.
        if metrics.running_state.is_err() {
            return None;
        }
        match metrics.current_leader {
            Some(leader) if leader == self.node_id => {
                quorum_fresh(metrics.millis_since_quorum_ack).then_some(leader)
            }
            Some(leader) => leader_heard(&self.contact).then_some(leader),
            None => None,
        }
    }

    /// Why this node's Raft stopped for good (a storage error), if it did.
    pub fn failed(&self) -> Option<String> {
        let metrics = self.raft.metrics();
        let failed = metrics
            .borrow()
            .running_state
            .as_ref()
            .err()
            .map(ToString::to_string);
        failed
    }

    /// The members of the cluster with their peer addresses.
    pub fn members(&self) -> Vec<(NodeId, String)> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        metrics
            .membership_config
            .membership()
            .nodes()
            .map(|(id, node)| (*id, node.addr.clone()))
            .collect()
    }

    pub fn is_leader(&self) -> bool {
        self.leader() == Some(self.node_id)
    }

    pub fn term(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    /// Waits until this node sees a leader, for at most `timeout`. Runs on
    /// the metastore thread (its timer), awaitable from any executor.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<NodeId, MetaError> {
        let raft = self.raft.clone();
        let task = self.runtime.spawn(async move {
            raft.wait(Some(timeout))
                .metrics(|m| m.current_leader.is_some(), "a leader")
                .await
                .map_err(|e| MetaError::NoQuorum(e.to_string()))?
                .current_leader
                .ok_or_else(|| MetaError::NoQuorum("no leader".into()))
        });
        task.await
            .map_err(|e| MetaError::Failed(format!("the metastore thread: {e}")))?
    }

    /// Whether this node has a leader and applied every entry it holds: only
    /// then does a topic missing from its state mean the topic is gone.
    /// Once caught up, a node stays so while it knows a leader: entries it
    /// appended and has not applied yet are writes whose callers have no
    /// answer yet, so its state is as current as any client may expect.
    pub fn caught_up(&self) -> bool {
        use std::sync::atomic::Ordering;
        let receiver = self.raft.metrics();
        let metrics = receiver.borrow();
        if self.caught_up_once.load(Ordering::Acquire) {
            return metrics.current_leader.is_some();
        }
        let caught_up = metrics_caught_up(&metrics, self.catch_up_to);
        if caught_up {
            self.caught_up_once.store(true, Ordering::Release);
        }
        caught_up
    }

    /// Waits until every entry of the log is applied (at start, before the
    /// state is trusted), for at most `timeout`; awaitable from any executor.
    pub async fn wait_caught_up(&self, timeout: Duration) -> Result<(), MetaError> {
        let (raft, catch_up_to) = (self.raft.clone(), self.catch_up_to);
        let task = self.runtime.spawn(async move {
            raft.wait(Some(timeout))
                .metrics(
                    |m| metrics_caught_up(m, catch_up_to),
                    "applied the whole log",
                )
                .await
                .map(|_| ())
                .map_err(|e| MetaError::NoQuorum(e.to_string()))
        });
        task.await
            .map_err(|e| MetaError::Failed(format!("the metastore thread: {e}")))??;
        self.caught_up_once
            .store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Before a graceful stop: if this node leads, waits (briefly) until a
    /// follower holds every entry this node has, asks it to stand for
    /// election at once, and waits until it leads, so the cluster is
    /// leaderless for about one round trip instead of an election timeout.
    /// This node stands in no election from here on. Returns the new leader,
    /// if one took over.
    pub fn hand_over_leadership(&self) -> Option<NodeId> {
        let caller = self.caller.clone()?;
        let (raft, node_id) = (self.raft.clone(), self.node_id);
        let leaving = self.leaving.clone();
        let (done, result) = std::sync::mpsc::channel();
        self.runtime.spawn(async move {
            // A leaving node stands in no election: it would win leadership
            // only to drop it a moment later.
            raft.runtime_config().elect(false);
            leaving.store(true, std::sync::atomic::Ordering::SeqCst);
            if raft.metrics().borrow().current_leader != Some(node_id) {
                tracing::info!("not the Raft leader at stop: nothing to hand over");
                let _ = done.send(None);
                return;
            }
            let deadline = tokio::time::Instant::now() + HANDOVER_TIMEOUT;
            let remaining = || deadline.saturating_duration_since(tokio::time::Instant::now());
            // How far each follower's log was last seen to match this one.
            let mut matched: BTreeMap<NodeId, u64> = BTreeMap::new();
            let mut attempts = 0usize;
            let mut asked: Option<NodeId> = None;
            let mut moved = None;
            while moved.is_none() && !remaining().is_zero() {
                let metrics = raft.metrics().borrow().clone();
                if let Some(leader) = metrics.current_leader.filter(|l| *l != node_id) {
                    moved = Some(leader);
                    break;
                }
                let leading = metrics.current_leader == Some(node_id);
                if leading {
                    for (id, log) in metrics.replication.iter().flatten() {
                        matched.insert(*id, log.map_or(0, |l| l.index));
                    }
                }
                // Only a follower holding every entry of this node can win
                // its vote (and any other node's whose log it matches).
                let last = metrics.last_log_index.unwrap_or(0);
                let able: Vec<NodeId> = matched
                    .iter()
                    .filter(|(id, index)| **id != node_id && **index >= last)
                    .map(|(id, _)| *id)
                    .collect();
                // One successor at a time: asking a second while the first
                // may be winning makes them fight over the same term.
                let successor = match asked {
                    Some(asked) if able.contains(&asked) => Some(asked),
                    _ => (!able.is_empty()).then(|| able[attempts % able.len()]),
                };
                let Some(successor) = successor else {
                    // Wait for replication to catch a follower up (or for
                    // another node to take over).
                    let _ = raft
                        .wait(Some(HANDOVER_ATTEMPT_WAIT.min(remaining())))
                        .metrics(
                            |m| {
                                m.current_leader.is_some_and(|l| l != node_id)
                                    || (leading && caught_up_follower(m, node_id).is_some())
                            },
                            "a follower holds the whole log",
                        )
                        .await;
                    continue;
                };
                attempts += 1;
                asked = Some(successor);
                let Some(addr) = metrics
                    .membership_config
                    .membership()
                    .get_node(&successor)
                    .map(|n| n.addr.clone())
                else {
                    matched.remove(&successor);
                    continue;
                };
                // The first election may fail: a leader elected less than a
                // lease ago refuses votes while its vote is fresh. But the
                // successor's higher term makes this node step down, leaving
                // its vote uncommitted, so a later election gets its vote.
                if let Err(error) = caller
                    .call(&addr, KIND_ELECT, Vec::new(), HANDOVER_ATTEMPT_WAIT)
                    .await
                {
                    tracing::warn!(successor, %error, "a successor did not stand for election");
                    matched.remove(&successor);
                    continue;
                }
                // A heartbeat now meets the successor's higher term, so a
                // leader that refused its vote steps down at once instead of
                // at its next heartbeat. Stop waiting when it does: the next
                // election gets its vote.
                if leading {
                    let _ = raft.trigger().heartbeat().await;
                }
                let waited = raft
                    .wait(Some(HANDOVER_ATTEMPT_WAIT.min(remaining())))
                    .metrics(
                        |m| {
                            m.current_leader.is_some_and(|l| l != node_id)
                                || (leading && m.current_leader != Some(node_id))
                        },
                        "another leader",
                    )
                    .await;
                moved = waited
                    .as_ref()
                    .ok()
                    .and_then(|m| m.current_leader.filter(|l| *l != node_id));
                if moved.is_none() && waited.is_ok() {
                    // Stepped down: the successor may win with the vote
                    // this node just gave; ask again only if it does not.
                    moved = raft
                        .wait(Some(HANDOVER_STEP_DOWN_WAIT.min(remaining())))
                        .metrics(
                            |m| m.current_leader.is_some_and(|l| l != node_id),
                            "another leader",
                        )
                        .await
                        .ok()
                        .and_then(|m| m.current_leader);
                }
            }
            if moved.is_none() {
                tracing::warn!(
                    attempts,
                    "could not hand leadership over: no new leader in time"
                );
            }
            let _ = done.send(moved);
        });
        result.recv_timeout(HANDOVER_TIMEOUT * 2).ok().flatten()
    }

    /// Stops the node and waits for its thread.
    pub fn shutdown(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for MetaNode {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_changes_only_when_something_was_published_and_then_at_once() {
        let (publish, feed) = watch::channel(Arc::new(MetaView::default()));
        let mut feed = feed;
        let view = feed.borrow_and_update().clone();
        let mut snapshot = MetaSnapshot { feed, view };
        let (first, changed) = snapshot.current();
        assert!(!changed);
        let first = first.clone();
        assert!(Arc::ptr_eq(&first, &snapshot.current().0.clone()));
        let next = Arc::new(MetaView {
            applied_index: 7,
            ..MetaView::default()
        });
        publish.send_replace(next.clone());
        let (seen, changed) = snapshot.current();
        assert!(changed, "read right after a publish sees it");
        assert!(Arc::ptr_eq(seen, &next));
        assert!(!snapshot.current().1, "and only once");
        // A closed metastore leaves the last state in place.
        drop(publish);
        assert_eq!(snapshot.current().0.applied_index, 7);
    }
}
