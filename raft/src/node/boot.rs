//! Starting the metastore: its thread and runtime, opening or joining the
//! cluster (bootstrap, probing peers, catching up).

use super::*;

/// What a probe answers.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub(super) struct ProbeAnswer {
    pub(super) initialized: bool,
    pub(super) term: u64,
    /// The index of the last entry the answering node applied (older
    /// nodes leave it out).
    #[serde(default)]
    pub(super) applied: u64,
}

/// What the other members said when this node started.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Probed {
    /// Some member is part of an initialized cluster.
    pub(super) initialized: bool,
    /// The highest term any member is in.
    pub(super) term: u64,
    /// The highest index any member applied: this node is caught up once it
    /// applied as far (what the cluster had committed when it started).
    pub(super) applied: u64,
}

/// Whether metrics show a node with a leader that applied every entry it
/// holds, and at least `catch_up_to`.
/// A follower whose replicated log reaches this leader's last entry.
pub(super) fn caught_up_follower(
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

pub(super) fn metrics_caught_up(
    metrics: &openraft::RaftMetrics<NodeId, BasicNode>,
    catch_up_to: u64,
) -> bool {
    let applied = metrics.last_applied.map(|l| l.index);
    metrics.current_leader.is_some()
        && applied >= metrics.last_log_index
        && applied.unwrap_or(0) >= catch_up_to
}

impl MetaNode {
    /// Starts the node's thread, opens its storage and, on a first start,
    /// bootstraps a single-member cluster.
    pub fn start(config: MetaNodeConfig) -> Result<Self, MetaError> {
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
        let started = narad_thread::start("narad-raft", move |ready| async move {
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
                                interval: Duration::from_millis(config.heartbeat_interval_ms),
                                election_timeout_min,
                            }
                            .run(),
                        );
                    }
                    ready.send(Ok((raft.clone(), view, handle, refuse, catch_up_to)));
                    let _ = stopped.await;
                    let _ = raft.shutdown().await;
                }
                Err(error) => ready.send(Err(error)),
            }
        });
        let (booted, thread) = started.map_err(|e| MetaError::Failed(e.to_string()))?;
        let (raft, view, runtime, refuse_votes_up_to, catch_up_to) = booted?;
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
}
