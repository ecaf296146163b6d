//! Elections only a node that can win calls, and a leader that stops
//! holding its followers once it cannot hear them.
//!
//! openraft 0.9 has neither a pre-vote nor check-quorum. Without them, two
//! one-way network cuts go wrong:
//!
//! - **A deaf follower** (it sends, but hears nothing) calls an election
//!   every timeout, each at a higher term. The others refuse its votes
//!   while they hear their leader, but when the link heals the leader meets
//!   the higher term and steps down: the heal costs an election, and every
//!   node is unready meanwhile.
//! - **A deaf leader** keeps sending appends that its followers take, so
//!   they never time out, while no answer reaches it: no write commits
//!   until the link heals.
//!
//! [`Guard::run`] maps the two classic remedies onto openraft's runtime
//! switches. A follower that has heard no leader for the shortest election
//! timeout asks every voter whether it would vote ([`KIND_PRE_VOTE`]); a
//! voter says yes only if it has heard no leader for as long itself and
//! leads nothing with a quorum ([`grants`]). Elections are switched on
//! (`runtime_config().elect`) only while a quorum said yes
//! ([`may_stand`]). A leader whose last quorum acknowledgement is older
//! than `stale_after_ms` switches its heartbeats off, so that its followers
//! time out and elect a leader that can commit; a new leadership starts with
//! them on. Handing leadership over on a graceful stop calls an election
//! directly and is not affected.
//!
//! [`KIND_PRE_VOTE`]: crate::node::KIND_PRE_VOTE

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::Raft;

use crate::node::{PeerCaller, KIND_PRE_VOTE};
use crate::store::{NodeId, TypeConfig};

/// When this node last took an append or a snapshot from a leader.
#[derive(Clone, Default)]
pub struct LeaderContact(Arc<Mutex<Option<Instant>>>);

impl LeaderContact {
    /// A leader's append or snapshot arrived now.
    pub fn heard(&self) {
        if let Ok(mut at) = self.0.lock() {
            *at = Some(Instant::now());
        }
    }

    /// Whether a leader was heard within `within`.
    pub fn fresh(&self, within: Duration) -> bool {
        self.0
            .lock()
            .ok()
            .and_then(|at| *at)
            .is_some_and(|at| at.elapsed() <= within)
    }
}

/// Whether a voter grants a pre-vote: it leads nothing it can commit with,
/// and has heard from no leader within the election timeout (else the
/// candidate is the one cut off, or too eager).
pub fn grants(leads_with_quorum: bool, heard_a_leader: bool) -> bool {
    !leads_with_quorum && !heard_a_leader
}

/// Whether a node among `voters` (itself included) may stand for election
/// with `granted` pre-votes of the others: with its own, a majority.
pub fn may_stand(voters: usize, granted: usize) -> bool {
    2 * (granted + 1) > voters
}

/// Whether a leader keeps sending heartbeats: while a quorum acknowledged
/// it within `stale_after_ms`, or while its leadership is younger than that.
pub fn keeps_heartbeats(
    millis_since_quorum_ack: Option<u64>,
    leading_ms: u64,
    stale_after_ms: u64,
) -> bool {
    leading_ms <= stale_after_ms || millis_since_quorum_ack.is_some_and(|ms| ms <= stale_after_ms)
}

/// The pre-vote's answer (its question carries nothing).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PreVoteAnswer {
    pub granted: bool,
}

/// Runs beside the Raft of one node (see the module's text).
pub struct Guard {
    pub raft: Raft<TypeConfig>,
    pub node_id: NodeId,
    pub caller: Arc<dyn PeerCaller>,
    pub contact: LeaderContact,
    /// How often to look, and how long a pre-vote may take.
    pub interval: Duration,
    /// The shortest election timeout: a follower that heard no leader for
    /// this long asks.
    pub election_timeout_min: Duration,
    /// A leader without a quorum acknowledgement for this long stops its
    /// heartbeats.
    pub stale_after_ms: u64,
}

impl Guard {
    pub async fn run(self) {
        let mut leading_since: Option<Instant> = None;
        let mut electing = true;
        let mut beating = true;
        loop {
            tokio::time::sleep(self.interval).await;
            let (leader, voters, since_ack) = {
                let metrics = self.raft.metrics();
                let metrics = metrics.borrow();
                let voters: Vec<(NodeId, String)> = metrics
                    .membership_config
                    .membership()
                    .voter_ids()
                    .filter_map(|id| {
                        let node = metrics.membership_config.membership().get_node(&id)?;
                        Some((id, node.addr.clone()))
                    })
                    .collect();
                (
                    metrics.current_leader,
                    voters,
                    metrics.millis_since_quorum_ack,
                )
            };
            let (elect, beat) = if voters.len() <= 1 {
                leading_since = None;
                (true, true)
            } else if leader == Some(self.node_id) {
                let since = *leading_since.get_or_insert_with(Instant::now);
                let leading_ms = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX);
                (
                    electing,
                    keeps_heartbeats(since_ack, leading_ms, self.stale_after_ms),
                )
            } else {
                leading_since = None;
                let stand = !self.contact.fresh(self.election_timeout_min)
                    && may_stand(voters.len(), self.ask(&voters).await);
                (stand, true)
            };
            if elect != electing {
                tracing::info!(
                    elect,
                    "elections {}",
                    if elect {
                        "on: a quorum heard no leader either"
                    } else {
                        "off: no quorum would vote"
                    }
                );
                self.raft.runtime_config().elect(elect);
                electing = elect;
            }
            if beat != beating {
                if beat {
                    tracing::info!("heartbeats on");
                } else {
                    tracing::warn!(
                        stale_after_ms = self.stale_after_ms,
                        "no quorum acknowledged this leader: heartbeats off, so that the followers elect another"
                    );
                }
                self.raft.runtime_config().heartbeat(beat);
                beating = beat;
            }
        }
    }

    /// How many of the other voters grant a pre-vote within the interval.
    async fn ask(&self, voters: &[(NodeId, String)]) -> usize {
        let calls: Vec<_> = voters
            .iter()
            .filter(|(id, _)| *id != self.node_id)
            .map(|(_, addr)| {
                let (caller, addr, wait) = (self.caller.clone(), addr.clone(), self.interval);
                tokio::spawn(async move {
                    let answer = caller.call(&addr, KIND_PRE_VOTE, Vec::new(), wait).await;
                    answer
                        .ok()
                        .and_then(|bytes| serde_json::from_slice::<PreVoteAnswer>(&bytes).ok())
                        .is_some_and(|a| a.granted)
                })
            })
            .collect();
        let mut granted = 0;
        for call in calls {
            if call.await.unwrap_or(false) {
                granted += 1;
            }
        }
        granted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_voter_grants_only_without_a_leader_it_hears_or_a_quorum_it_leads() {
        assert!(grants(false, false));
        assert!(
            !grants(false, true),
            "it hears a leader: the candidate is cut off"
        );
        assert!(!grants(true, false), "it leads with a quorum");
    }

    #[test]
    fn a_node_stands_with_a_majority_of_the_voters_its_own_vote_included() {
        assert!(may_stand(3, 1));
        assert!(!may_stand(3, 0), "a deaf node hears no grant");
        assert!(may_stand(5, 2));
        assert!(!may_stand(5, 1));
        assert!(!may_stand(2, 0));
        assert!(may_stand(2, 1));
        assert!(may_stand(1, 0));
    }

    #[test]
    fn a_leader_stops_its_heartbeats_once_no_quorum_acknowledged_it_for_a_while() {
        assert!(keeps_heartbeats(Some(100), 60_000, 2_000));
        assert!(!keeps_heartbeats(Some(2_500), 60_000, 2_000));
        assert!(!keeps_heartbeats(None, 60_000, 2_000));
        // A leadership younger than the window has had no time for acks.
        assert!(keeps_heartbeats(None, 500, 2_000));
    }

    #[test]
    fn leader_contact_is_fresh_only_once_heard_and_for_a_while() {
        let contact = LeaderContact::default();
        assert!(!contact.fresh(Duration::from_secs(60)));
        contact.heard();
        assert!(contact.fresh(Duration::from_secs(60)));
    }
}
