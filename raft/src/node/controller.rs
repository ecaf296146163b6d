//! The controller on the leader: heartbeats in, the failure detector's
//! verdicts ([`crate::detector`]) applied on the wall clock, learners
//! promoted once caught up.

use super::*;

/// Set once a stopping node starts to hand its leadership over.
pub(super) type Leaving = Arc<std::sync::atomic::AtomicBool>;

/// When the leader last heard from each node, and its address.
pub(super) type Heard = Arc<std::sync::Mutex<BTreeMap<NodeId, (std::time::Instant, String)>>>;

/// A node's heartbeat to the leader.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct Heartbeat {
    pub(super) id: NodeId,
    pub(super) addr: String,
}

/// Runs on every node: sends this node's heartbeat to the leader, and, on
/// the leader, names the cluster once and marks nodes dead or alive through
/// Raft when their heartbeats stop or start again.
pub(super) struct Controller {
    pub(super) raft: Raft<TypeConfig>,
    pub(super) view: watch::Receiver<Arc<MetaView>>,
    pub(super) caller: Option<Arc<dyn PeerCaller>>,
    pub(super) node_id: NodeId,
    pub(super) addr: String,
    pub(super) interval: Duration,
    pub(super) dead_after: Duration,
    pub(super) heard: Heard,
    pub(super) leaving: Leaving,
    pub(super) contact: LeaderContact,
    /// `--join`: the member to ask for admission until this node is one.
    pub(super) join: Option<String>,
}

impl Controller {
    pub(super) async fn run(self) {
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

pub(super) fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
