//! Elections only a node that can win calls.
//!
//! openraft 0.9 has no pre-vote. Without one, a follower that sends but
//! hears nothing (deaf: a one-way network cut) calls an election every
//! timeout, each at a higher term. The others refuse its votes while they
//! hear their leader, but when the link heals the leader meets the higher
//! term and steps down: the heal costs an election, and every node is
//! unready meanwhile.
//!
//! [`Guard::run`] adds the classic remedy on openraft's runtime switch. A
//! follower that has heard no leader for the shortest election timeout asks
//! every voter whether it would vote ([`KIND_PRE_VOTE`]); a voter says yes
//! only if it has heard no leader for as long itself and leads nothing with
//! a quorum ([`grants`]). Elections are switched on
//! (`runtime_config().elect`) only while a quorum said yes ([`may_stand`]),
//! and never on a node handing its leadership over on a graceful stop
//! (that handover calls an election directly). A pre-vote does not compare
//! logs: the real vote does, and a node that cannot win only raises the
//! term where no leader is heard anyway.
//!
//! A leader that is deaf needs no switch here: its followers stop hearing
//! it because its peer connections time out and a new QUIC handshake needs
//! both directions, so they elect another (suite 4's "the leader deaf").
//!
//! [`KIND_PRE_VOTE`]: crate::node::KIND_PRE_VOTE

use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Set once this node hands its leadership over to stop: it stands in
    /// no election from then on.
    pub leaving: Arc<AtomicBool>,
    /// How often to look, and how long a pre-vote may take.
    pub interval: Duration,
    /// The shortest election timeout: a follower that heard no leader for
    /// this long asks.
    pub election_timeout_min: Duration,
}

impl Guard {
    pub async fn run(self) {
        let mut electing = true;
        loop {
            tokio::time::sleep(self.interval).await;
            if self.leaving.load(Ordering::SeqCst) {
                // `hand_over_leadership` switched elections off for good.
                return;
            }
            let (leader, voters) = {
                let metrics = self.raft.metrics();
                let metrics = metrics.borrow();
                let membership = metrics.membership_config.membership();
                let voters: Vec<(NodeId, String)> = membership
                    .voter_ids()
                    .filter_map(|id| Some((id, membership.get_node(&id)?.addr.clone())))
                    .collect();
                (metrics.current_leader, voters)
            };
            let elect = if voters.len() <= 1 {
                true
            } else if leader == Some(self.node_id) {
                // A leader's switch matters only once it follows again.
                electing
            } else {
                !self.contact.fresh(self.election_timeout_min)
                    && may_stand(voters.len(), self.ask(&voters).await)
            };
            if elect != electing && !self.leaving.load(Ordering::SeqCst) {
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
    fn leader_contact_is_fresh_only_once_heard_and_for_a_while() {
        let contact = LeaderContact::default();
        assert!(!contact.fresh(Duration::from_secs(60)));
        contact.heard();
        assert!(contact.fresh(Duration::from_secs(60)));
    }
}
