//! Partition moves and the node lifecycle in the metastore: a move is
//! planned, started (at most `max_running` at once), copies, freezes, and
//! ends done (the destination owns the partition), promoted (its source
//! died and the destination's copy took over) or abandoned. Nodes are
//! admitted, decommissioned and removed here too. Every rule is checked
//! before anything changes, as in the rest of the state machine.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::state::{Applied, ChildKind, MetaState, NodeId, NodeRecord, Refused, Topic};

/// Finished moves (done, promoted, abandoned) the metastore keeps listed.
pub const MOVES_KEPT: usize = 200;

/// One partition's move from one node to another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    pub id: String,
    pub topic: String,
    /// The topic's incarnation when the move was planned: a topic created
    /// again under the name is not moved by it.
    pub incarnation: u64,
    pub partition: u32,
    pub from: NodeId,
    pub to: NodeId,
    pub state: MoveState,
    pub planned_at_ms: u64,
    pub started_at_ms: Option<u64>,
    pub finished_at_ms: Option<u64>,
    /// As last reported by the destination.
    pub copied_bytes: u64,
    pub total_bytes: u64,
    pub rate_bytes_per_s: u64,
    /// A promoted move: the offset up to which the destination held the
    /// source's log (a returning source quarantines what it has past it).
    pub promoted_at_offset: Option<u64>,
    /// Why it was abandoned.
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MoveState {
    Planned,
    Copying,
    Freezing,
    Done,
    Promoted,
    Abandoned,
}

impl MoveState {
    pub fn name(self) -> &'static str {
        match self {
            MoveState::Planned => "planned",
            MoveState::Copying => "copying",
            MoveState::Freezing => "freezing",
            MoveState::Done => "done",
            MoveState::Promoted => "promoted",
            MoveState::Abandoned => "abandoned",
        }
    }

    /// Started and not ended: the destination is copying or handing over.
    pub fn is_running(self) -> bool {
        matches!(self, MoveState::Copying | MoveState::Freezing)
    }

    /// Not ended: planned or running.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            MoveState::Planned | MoveState::Copying | MoveState::Freezing
        )
    }
}

/// One move a plan asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MovePlan {
    pub topic: String,
    pub partition: u32,
    pub from: NodeId,
    pub to: NodeId,
}

/// How a move ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MoveEnd {
    /// The handover: the destination took the tail during the freeze.
    Done,
    /// The source died: the destination's copy, which holds the source's
    /// log up to `offset`, takes over.
    Promoted {
        offset: u64,
    },
    Abandoned {
        reason: String,
    },
}

impl MetaState {
    /// Whether `node` may own partition `partition` of `topic` without
    /// sitting beside its replica pair (a replica child's partition and its
    /// parent's are on different nodes).
    pub fn replica_conflict(&self, topic: &Topic, partition: u32, node: NodeId) -> bool {
        let pair_owner = |other: &Topic| other.owners.get(partition as usize) == Some(&node);
        let replica_children = topic
            .children
            .iter()
            .filter(|(_, c)| c.kind == ChildKind::Replica)
            .filter_map(|(name, _)| self.topics.get(name));
        let replica_parent = topic
            .parent
            .as_ref()
            .and_then(|p| self.topics.get(p))
            .filter(|p| {
                p.children
                    .get(&topic.name)
                    .is_some_and(|c| c.kind == ChildKind::Replica)
            });
        replica_children.chain(replica_parent).any(pair_owner)
    }

    /// The active move of a partition, if any.
    pub fn active_move(&self, topic: &str, partition: u32) -> Option<&Move> {
        self.moves
            .values()
            .find(|m| m.topic == topic && m.partition == partition && m.state.is_active())
    }

    /// Whether a node is being (or was) decommissioned.
    pub fn decommissioning(&self, node: NodeId) -> bool {
        self.nodes.get(&node).is_some_and(|r| r.decommissioning)
    }

    /// Partitions a node owns, over every topic.
    pub fn partitions_of(&self, node: NodeId) -> usize {
        self.topics
            .values()
            .flat_map(|t| t.owners.iter())
            .filter(|o| **o == node)
            .count()
    }

    pub(crate) fn plan_moves(
        &mut self,
        plans: &[MovePlan],
        decommission: Option<NodeId>,
        now_ms: u64,
    ) -> Result<Applied, Refused> {
        if let Some(node) = decommission {
            if !self.nodes.contains_key(&node) {
                return Err(Refused::NoSuchNode(node));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for plan in plans {
            let topic = self
                .topics
                .get(&plan.topic)
                .ok_or_else(|| Refused::NoSuchTopic(plan.topic.clone()))?;
            let owner = topic.owners.get(plan.partition as usize).copied();
            if owner != Some(plan.from) || plan.from == plan.to {
                return Err(Refused::MoveSourceNotOwner {
                    topic: plan.topic.clone(),
                    partition: plan.partition,
                    from: plan.from,
                });
            }
            let target_ok = self
                .nodes
                .get(&plan.to)
                .is_some_and(|r| r.alive && !r.decommissioning)
                && decommission != Some(plan.to);
            if !target_ok {
                return Err(Refused::MoveTargetUnfit(plan.to));
            }
            if self.active_move(&plan.topic, plan.partition).is_some()
                || !seen.insert((plan.topic.clone(), plan.partition))
            {
                return Err(Refused::PartitionMoving {
                    topic: plan.topic.clone(),
                    partition: plan.partition,
                });
            }
            if self.replica_conflict(topic, plan.partition, plan.to) {
                return Err(Refused::ReplicaPlacement {
                    partition: plan.partition,
                    owner: plan.to,
                });
            }
        }
        // Refusals above, changes below.
        if let Some(node) = decommission {
            if let Some(record) = self.nodes.get_mut(&node) {
                record.decommissioning = true;
            }
        }
        let mut planned = Vec::with_capacity(plans.len());
        for plan in plans {
            let incarnation = self.topics.get(&plan.topic).map_or(0, |t| t.incarnation);
            self.next_move += 1;
            let id = format!("{:08}", self.next_move);
            let planned_move = Move {
                id: id.clone(),
                topic: plan.topic.clone(),
                incarnation,
                partition: plan.partition,
                from: plan.from,
                to: plan.to,
                state: MoveState::Planned,
                planned_at_ms: now_ms,
                started_at_ms: None,
                finished_at_ms: None,
                copied_bytes: 0,
                total_bytes: 0,
                rate_bytes_per_s: 0,
                promoted_at_offset: None,
                reason: None,
            };
            self.moves.insert(id, planned_move.clone());
            planned.push(planned_move);
        }
        self.forget_old_moves();
        Ok(Applied::MovesPlanned(planned))
    }

    pub(crate) fn start_move(
        &mut self,
        id: &str,
        max_running: u32,
        now_ms: u64,
    ) -> Result<Applied, Refused> {
        let running = self.moves.values().filter(|m| m.state.is_running()).count();
        let found = self
            .moves
            .get(id)
            .ok_or_else(|| Refused::NoSuchMove(id.to_string()))?;
        if found.state != MoveState::Planned {
            return Err(Refused::MoveNotPlanned {
                id: id.to_string(),
                state: found.state.name().to_string(),
            });
        }
        if running >= max_running as usize {
            return Err(Refused::TooManyMoves { running });
        }
        let stale = self.topics.get(&found.topic).is_none_or(|t| {
            t.incarnation != found.incarnation
                || t.owners.get(found.partition as usize) != Some(&found.from)
        });
        let record = self
            .moves
            .get_mut(id)
            .ok_or(Refused::NoSuchMove(id.into()))?;
        if stale {
            record.state = MoveState::Abandoned;
            record.reason = Some("the partition's owner or topic changed".into());
            record.finished_at_ms = Some(now_ms);
            return Ok(Applied::MoveChanged(record.clone()));
        }
        record.state = MoveState::Copying;
        record.started_at_ms = Some(now_ms);
        Ok(Applied::MoveChanged(record.clone()))
    }

    pub(crate) fn move_progress(
        &mut self,
        id: &str,
        copied_bytes: u64,
        total_bytes: u64,
        rate_bytes_per_s: u64,
        freezing: bool,
    ) -> Result<Applied, Refused> {
        let record = self
            .moves
            .get_mut(id)
            .ok_or_else(|| Refused::NoSuchMove(id.to_string()))?;
        if !record.state.is_running() {
            return Err(Refused::MoveNotRunning {
                id: id.to_string(),
                state: record.state.name().to_string(),
            });
        }
        record.copied_bytes = copied_bytes;
        record.total_bytes = total_bytes;
        record.rate_bytes_per_s = rate_bytes_per_s;
        if freezing {
            record.state = MoveState::Freezing;
        }
        Ok(Applied::MoveChanged(record.clone()))
    }

    pub(crate) fn end_move(
        &mut self,
        id: &str,
        end: &MoveEnd,
        now_ms: u64,
    ) -> Result<Applied, Refused> {
        let record = self
            .moves
            .get(id)
            .ok_or_else(|| Refused::NoSuchMove(id.to_string()))?;
        let handover = !matches!(end, MoveEnd::Abandoned { .. });
        let allowed = if handover {
            record.state.is_running()
        } else {
            record.state.is_active()
        };
        if !allowed {
            return Err(Refused::MoveNotRunning {
                id: id.to_string(),
                state: record.state.name().to_string(),
            });
        }
        if handover {
            let topic = self
                .topics
                .get(&record.topic)
                .filter(|t| t.incarnation == record.incarnation)
                .ok_or_else(|| Refused::NoSuchTopic(record.topic.clone()))?;
            if topic.owners.get(record.partition as usize) != Some(&record.from) {
                return Err(Refused::MoveSourceNotOwner {
                    topic: record.topic.clone(),
                    partition: record.partition,
                    from: record.from,
                });
            }
            if self.replica_conflict(topic, record.partition, record.to) {
                return Err(Refused::ReplicaPlacement {
                    partition: record.partition,
                    owner: record.to,
                });
            }
        }
        let (topic_name, partition, to) = (record.topic.clone(), record.partition, record.to);
        if handover {
            if let Some(owner) = self
                .topics
                .get_mut(&topic_name)
                .and_then(|t| t.owners.get_mut(partition as usize))
            {
                *owner = to;
            }
        }
        let record = self
            .moves
            .get_mut(id)
            .ok_or_else(|| Refused::NoSuchMove(id.to_string()))?;
        record.finished_at_ms = Some(now_ms);
        match end {
            MoveEnd::Done => {
                record.state = MoveState::Done;
                record.copied_bytes = record.total_bytes.max(record.copied_bytes);
            }
            MoveEnd::Promoted { offset } => {
                record.state = MoveState::Promoted;
                record.promoted_at_offset = Some(*offset);
            }
            MoveEnd::Abandoned { reason } => {
                record.state = MoveState::Abandoned;
                record.reason = Some(reason.clone());
            }
        }
        let changed = record.clone();
        self.forget_old_moves();
        Ok(Applied::MoveChanged(changed))
    }

    /// Keeps at most [`MOVES_KEPT`] ended moves, the newest.
    fn forget_old_moves(&mut self) {
        let ended: Vec<String> = self
            .moves
            .iter()
            .filter(|(_, m)| !m.state.is_active())
            .map(|(id, _)| id.clone())
            .collect();
        let excess = ended.len().saturating_sub(MOVES_KEPT);
        for id in ended.into_iter().take(excess) {
            self.moves.remove(&id);
        }
    }

    /// A node asked to join (or an operator admitted it): it is recorded,
    /// alive, and no longer counted as removed.
    pub(crate) fn admit_node(&mut self, id: NodeId, addr: &str, now_ms: u64) -> Applied {
        self.removed_nodes.remove(&id);
        match self.nodes.get(&id) {
            Some(record) if record.addr == addr => Applied::Nothing,
            _ => {
                self.nodes.insert(
                    id,
                    NodeRecord {
                        addr: addr.to_string(),
                        alive: true,
                        since_ms: now_ms,
                        decommissioning: false,
                    },
                );
                Applied::ClusterChanged
            }
        }
    }

    /// Forgets a node before its removal from the Raft membership: only a
    /// dead or decommissioned node that owns no partition.
    pub(crate) fn remove_node(&mut self, id: NodeId, member: bool) -> Result<Applied, Refused> {
        if self.removed_nodes.contains(&id) && !self.nodes.contains_key(&id) {
            return Ok(Applied::Nothing);
        }
        let record = match self.nodes.get(&id) {
            Some(record) => record,
            None if member => return Err(Refused::NodeInService(id)),
            None => return Err(Refused::NoSuchNode(id)),
        };
        let owned = self.partitions_of(id);
        if owned > 0 {
            return Err(Refused::NodeOwnsPartitions {
                node: id,
                partitions: owned,
            });
        }
        if record.alive && !record.decommissioning {
            return Err(Refused::NodeInService(id));
        }
        if self
            .moves
            .values()
            .any(|m| m.state.is_active() && (m.to == id || m.from == id))
        {
            return Err(Refused::NodeOwnsPartitions {
                node: id,
                partitions: 0,
            });
        }
        self.nodes.remove(&id);
        self.kafka_addrs.remove(&id);
        self.removed_nodes.insert(id);
        Ok(Applied::ClusterChanged)
    }

    /// A deleted topic's active moves end.
    pub(crate) fn abandon_moves_of(&mut self, topic: &str, now_ms: Option<u64>) {
        for record in self.moves.values_mut() {
            if record.topic == topic && record.state.is_active() {
                record.state = MoveState::Abandoned;
                record.reason = Some("the topic was deleted".into());
                record.finished_at_ms = now_ms.or(record.started_at_ms);
            }
        }
    }
}

/// A balanced plan: moves that even the partitions of `nodes` (the live
/// nodes that may hold partitions), each from the node with the most to the
/// one with the fewest, until no two differ by more than one; `drain` lists
/// nodes every partition leaves. Partitions already moving stay put, and a
/// replica pair never lands on one node. Deterministic.
pub fn plan_balance(
    state: &MetaState,
    nodes: &[NodeId],
    drain: &[NodeId],
    max_moves: usize,
) -> Vec<MovePlan> {
    let mut plans = Vec::new();
    if nodes.is_empty() {
        return plans;
    }
    // Where every partition is, as the plan goes.
    let mut owners: BTreeMap<(String, u32), NodeId> = BTreeMap::new();
    let mut load: BTreeMap<NodeId, Vec<(String, u32)>> =
        nodes.iter().map(|n| (*n, Vec::new())).collect();
    let mut draining: BTreeMap<NodeId, Vec<(String, u32)>> = BTreeMap::new();
    for topic in state.topics.values() {
        for (partition, owner) in (0u32..).zip(&topic.owners) {
            let key = (topic.name.clone(), partition);
            owners.insert(key.clone(), *owner);
            if state.active_move(&topic.name, partition).is_some() {
                continue;
            }
            if drain.contains(owner) {
                draining.entry(*owner).or_default().push(key);
            } else if let Some(held) = load.get_mut(owner) {
                held.push(key);
            }
        }
    }
    let fits = |owners: &BTreeMap<(String, u32), NodeId>, key: &(String, u32), to: NodeId| {
        let Some(topic) = state.topics.get(&key.0) else {
            return false;
        };
        let pairs = topic
            .children
            .iter()
            .filter(|(_, c)| c.kind == ChildKind::Replica)
            .map(|(name, _)| name.clone())
            .chain(topic.parent.clone().filter(|p| {
                state
                    .topics
                    .get(p)
                    .and_then(|p| p.children.get(&topic.name))
                    .is_some_and(|c| c.kind == ChildKind::Replica)
            }));
        let fits = pairs
            .into_iter()
            .all(|pair| owners.get(&(pair, key.1)) != Some(&to));
        fits
    };
    // Same-topic spread: prefer moving a partition of the topic the source
    // holds most of, relative to the target.
    let per_topic =
        |held: &[(String, u32)], topic: &str| held.iter().filter(|k| k.0 == topic).count();
    // Drain first: each partition to the least loaded node that fits.
    for (from, keys) in draining {
        for key in keys {
            if plans.len() >= max_moves {
                return plans;
            }
            let mut targets: Vec<NodeId> = load.keys().copied().collect();
            targets.sort_by_key(|n| (load[n].len(), per_topic(&load[n], &key.0), *n));
            let Some(to) = targets.into_iter().find(|to| fits(&owners, &key, *to)) else {
                continue;
            };
            owners.insert(key.clone(), to);
            if let Some(held) = load.get_mut(&to) {
                held.push(key.clone());
            }
            plans.push(MovePlan {
                topic: key.0,
                partition: key.1,
                from,
                to,
            });
        }
    }
    // Then even the rest out.
    while plans.len() < max_moves {
        let most = load
            .iter()
            .max_by_key(|(n, held)| (held.len(), std::cmp::Reverse(**n)))
            .map(|(n, _)| *n);
        let fewest = load
            .iter()
            .min_by_key(|(n, held)| (held.len(), **n))
            .map(|(n, _)| *n);
        let (Some(from), Some(to)) = (most, fewest) else {
            break;
        };
        if load[&from].len() <= load[&to].len() + 1 {
            break;
        }
        let candidates = load[&from].clone();
        let pick = candidates
            .iter()
            .filter(|key| fits(&owners, key, to))
            .max_by_key(|key| {
                let there = per_topic(&load[&from], &key.0);
                let here = per_topic(&load[&to], &key.0);
                (
                    there.saturating_sub(here),
                    std::cmp::Reverse((*key).clone()),
                )
            })
            .cloned();
        let Some(key) = pick else {
            break;
        };
        if let Some(held) = load.get_mut(&from) {
            held.retain(|k| *k != key);
        }
        if let Some(held) = load.get_mut(&to) {
            held.push(key.clone());
        }
        owners.insert(key.clone(), to);
        plans.push(MovePlan {
            topic: key.0,
            partition: key.1,
            from,
            to,
        });
    }
    plans
}

#[cfg(test)]
mod tests;
