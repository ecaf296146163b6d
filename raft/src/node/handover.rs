//! Handing leadership over before this node stops.

use super::*;

impl MetaNode {
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
}
