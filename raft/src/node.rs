//! Runs the metastore: openraft on its own OS thread with a tokio
//! current-thread runtime. Shards on glommio hold a [`MetaNode`] and await
//! its methods directly (the `Raft` handle is `Send + Sync`); they read the
//! applied state from the watch channel, never by asking.
//!
//! Until the cluster issue adds QUIC, the network reaches no peer: a node
//! bootstraps a single-member cluster on its first start.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Config, Raft, SnapshotPolicy};
use tokio::sync::{oneshot, watch};

use crate::state::{Applied, Command, Refused};
use crate::store::{LogStore, MetaView, NodeId, StateMachine, TypeConfig};

/// Settings of one metastore node.
#[derive(Debug, Clone)]
pub struct MetaNodeConfig {
    pub node_id: NodeId,
    pub dir: PathBuf,
    /// The address other nodes reach this one at (for the membership).
    pub peer_addr: String,
    /// Take a snapshot (and purge the log) after this many entries.
    pub snapshot_after_entries: u64,
    pub heartbeat_interval_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
}

impl MetaNodeConfig {
    pub fn single(node_id: NodeId, dir: PathBuf, peer_addr: String) -> Self {
        Self {
            node_id,
            dir,
            peer_addr,
            snapshot_after_entries: 1000,
            heartbeat_interval_ms: 100,
            election_timeout_min_ms: 300,
            election_timeout_max_ms: 600,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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

/// A network that reaches no one: a single-node cluster needs none.
#[derive(Debug, Clone, Default)]
pub struct NoPeers;

fn unreachable<E: std::error::Error>() -> RPCError<NodeId, BasicNode, E> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other(
        "no peer network yet",
    )))
}

impl RaftNetworkFactory<TypeConfig> for NoPeers {
    type Network = NoPeers;
    async fn new_client(&mut self, _target: NodeId, _node: &BasicNode) -> Self::Network {
        NoPeers
    }
}

impl RaftNetwork<TypeConfig> for NoPeers {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        Err(unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(unreachable())
    }
}

/// A running metastore node.
pub struct MetaNode {
    raft: Raft<TypeConfig>,
    view: watch::Receiver<Arc<MetaView>>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    node_id: NodeId,
}

impl MetaNode {
    /// Starts the node's thread, opens its storage and, on a first start,
    /// bootstraps a single-member cluster.
    pub fn start(config: MetaNodeConfig) -> Result<Self, MetaError> {
        let (ready_sender, ready) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let node_id = config.node_id;
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
                        Ok((raft, view)) => {
                            let _ = ready_sender.send(Ok((raft.clone(), view)));
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
        let (raft, view) = ready
            .recv()
            .map_err(|e| MetaError::Failed(e.to_string()))??;
        Ok(Self {
            raft,
            view,
            stop: Some(stop),
            thread: Some(thread),
            node_id,
        })
    }

    async fn boot(
        config: &MetaNodeConfig,
    ) -> Result<(Raft<TypeConfig>, watch::Receiver<Arc<MetaView>>), MetaError> {
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
        let log = LogStore::open(&config.dir).map_err(|e| failed(&e))?;
        let (machine, view) = StateMachine::open(&config.dir).map_err(|e| failed(&e))?;
        let raft = Raft::new(config.node_id, Arc::new(raft_config), NoPeers, log, machine)
            .await
            .map_err(|e| failed(&e))?;
        if !raft.is_initialized().await.map_err(|e| failed(&e))? {
            let members = BTreeMap::from([(
                config.node_id,
                BasicNode {
                    addr: config.peer_addr.clone(),
                },
            )]);
            raft.initialize(members).await.map_err(|e| failed(&e))?;
        }
        Ok((raft, view))
    }

    /// Proposes a command and waits until it is applied.
    pub async fn propose(&self, command: Command) -> Result<Applied, MetaError> {
        match self.raft.client_write(command).await {
            Ok(response) => Ok(response.data?),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => Err(
                MetaError::NoQuorum(format!("the leader is {:?}", forward.leader_id)),
            ),
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                Err(MetaError::Failed(e.to_string()))
            }
            Err(RaftError::Fatal(fatal)) => Err(MetaError::Failed(fatal.to_string())),
        }
    }

    /// The applied state, swapped whole on each apply.
    pub fn view(&self) -> Arc<MetaView> {
        self.view.borrow().clone()
    }

    /// A receiver that sees every applied state.
    pub fn subscribe(&self) -> watch::Receiver<Arc<MetaView>> {
        self.view.clone()
    }

    /// The current leader, if any.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    pub fn is_leader(&self) -> bool {
        self.leader() == Some(self.node_id)
    }

    pub fn term(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    /// Waits until this node sees a leader, for at most `timeout`.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<NodeId, MetaError> {
        let metrics = self
            .raft
            .wait(Some(timeout))
            .metrics(|m| m.current_leader.is_some(), "a leader")
            .await
            .map_err(|e| MetaError::NoQuorum(e.to_string()))?;
        metrics
            .current_leader
            .ok_or_else(|| MetaError::NoQuorum("no leader".into()))
    }

    /// Waits until every entry of the log is applied (at start, before the
    /// state is trusted), for at most `timeout`.
    pub async fn wait_caught_up(&self, timeout: Duration) -> Result<(), MetaError> {
        self.raft
            .wait(Some(timeout))
            .metrics(
                |m| {
                    m.current_leader.is_some()
                        && m.last_applied.map(|l| l.index) >= m.last_log_index
                },
                "applied the whole log",
            )
            .await
            .map(|_| ())
            .map_err(|e| MetaError::NoQuorum(e.to_string()))
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
