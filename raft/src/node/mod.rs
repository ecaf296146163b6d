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
//!
//! By concern: `boot` starts the thread and opens or joins the cluster,
//! `network` is openraft's network adapter, `leader` takes writes and
//! membership changes at the leader, `controller` sends heartbeats and, on
//! the leader, applies the failure detector and promotes learners, `serve`
//! answers other members, `handover` moves leadership away before a stop;
//! this file holds the handle shards use ([`MetaNode`]) and its readers.

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

mod boot;
mod controller;
mod handover;
mod leader;
mod network;
mod serve;

use boot::*;
use controller::*;
use leader::*;
pub use network::PeerNetwork;

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

impl MetaNode {
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
