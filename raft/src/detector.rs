//! The failure detector's rule, on whatever clock it is given: which
//! members the Raft leader marks dead or alive, from when it last heard
//! each one's heartbeat. The controller ([`crate::node`]) applies it on the
//! wall clock every heartbeat interval; a test or a simulation can apply it
//! on a clock of its own.
//!
//! A member is alive while its last heartbeat is younger than
//! `dead_after_ms` (`cluster.node_dead_after_ms`). A new leader counts
//! every member as heard when it started leading, so nobody is marked dead
//! before a full interval passed under it. A node that died changed state
//! when it went silent, not when that was noticed: the verdict says so, and
//! a move's promotion counts from then.

use std::collections::BTreeMap;

use crate::state::{NodeId, NodeRecord};

/// What the leader should record about one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub id: NodeId,
    pub addr: String,
    pub alive: bool,
    /// When its state changed: now for a member alive again, its last
    /// heartbeat (or the leader's start) for one that went silent.
    pub changed_ms: u64,
}

/// The failure detector of one leader: who it is, since when it leads,
/// and how long a silence marks a member dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Detector {
    pub me: NodeId,
    pub leading_since_ms: u64,
    pub dead_after_ms: u64,
}

impl Detector {
    /// The changes to record at `now_ms`: every member whose liveness or
    /// address differs from what `known` (the metastore's records) says.
    /// `heard` holds when each member's last heartbeat arrived.
    pub fn judge(
        &self,
        now_ms: u64,
        heard: &BTreeMap<NodeId, u64>,
        members: &[(NodeId, String)],
        known: &BTreeMap<NodeId, NodeRecord>,
    ) -> Vec<Verdict> {
        let mut verdicts = Vec::new();
        for (id, addr) in members {
            let last = heard
                .get(id)
                .map_or(self.leading_since_ms, |at| (*at).max(self.leading_since_ms));
            let silent_ms = now_ms.saturating_sub(last);
            let alive = *id == self.me || silent_ms < self.dead_after_ms;
            if known
                .get(id)
                .is_some_and(|k| k.alive == alive && k.addr == *addr)
            {
                continue;
            }
            verdicts.push(Verdict {
                id: *id,
                addr: addr.clone(),
                alive,
                changed_ms: if alive { now_ms } else { last },
            });
        }
        verdicts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(alive: bool) -> NodeRecord {
        NodeRecord {
            addr: "a".into(),
            alive,
            since_ms: 0,
            decommissioning: false,
        }
    }

    fn members() -> Vec<(NodeId, String)> {
        (1..=3).map(|id| (id, "a".to_string())).collect()
    }

    #[test]
    fn a_member_is_marked_dead_once_silent_for_the_interval_dated_from_its_last_heartbeat() {
        let detector = Detector {
            me: 1,
            leading_since_ms: 0,
            dead_after_ms: 30_000,
        };
        let known: BTreeMap<NodeId, NodeRecord> = (1..=3).map(|id| (id, record(true))).collect();
        let heard = BTreeMap::from([(2, 10_000), (3, 39_000)]);
        assert!(detector
            .judge(39_999, &heard, &members(), &known)
            .is_empty());
        assert_eq!(
            detector.judge(40_000, &heard, &members(), &known),
            vec![Verdict {
                id: 2,
                addr: "a".into(),
                alive: false,
                changed_ms: 10_000
            }],
            "dead 30 s after its last heartbeat, dated then"
        );
    }

    #[test]
    fn a_new_leader_waits_a_full_interval_and_a_heartbeat_brings_a_member_back() {
        let detector = Detector {
            me: 1,
            leading_since_ms: 50_000,
            dead_after_ms: 3_000,
        };
        let mut known: BTreeMap<NodeId, NodeRecord> =
            (1..=3).map(|id| (id, record(true))).collect();
        // Node 2 was last heard long before this leader started.
        let heard = BTreeMap::from([(2, 1_000), (3, 52_000)]);
        assert!(detector
            .judge(52_999, &heard, &members(), &known)
            .is_empty());
        let verdicts = detector.judge(53_000, &heard, &members(), &known);
        assert_eq!(verdicts.len(), 1);
        assert_eq!((verdicts[0].id, verdicts[0].changed_ms), (2, 50_000));
        // Recorded dead; it beats again and is alive from now.
        known.insert(2, record(false));
        let heard = BTreeMap::from([(2, 60_000), (3, 60_000)]);
        let verdicts = detector.judge(60_100, &heard, &members(), &known);
        assert_eq!(
            verdicts,
            vec![Verdict {
                id: 2,
                addr: "a".into(),
                alive: true,
                changed_ms: 60_100
            }]
        );
        // The leader itself is never judged dead.
        let lonely = detector.judge(99_000, &BTreeMap::new(), &members()[..1], &BTreeMap::new());
        assert!(lonely.iter().all(|v| v.alive));
    }
}
