//! Placement: which node owns each new partition of a topic. Pure, so the
//! rule is written and tested once; the shard asks it with the nodes the
//! controller holds alive, and the metastore records the answer.

use narad_raft::state::NodeId;

use crate::mesh::shard_for;

/// Owners for `added` partitions of topic `name`, which has `existing`
/// partitions already: round the live nodes (in id order) from a start
/// that depends on the topic, so topics spread evenly and a node marked
/// dead gets none. `live` must not be empty (this node is always in it).
pub fn place(name: &str, existing: u32, added: u32, live: &[NodeId]) -> Vec<NodeId> {
    if live.is_empty() {
        return Vec::new();
    }
    let start = shard_for(name, existing, live.len());
    (0..added as usize)
        .map(|i| live[(start + i) % live.len()])
        .collect()
}

/// Owners for a replica child's partitions: partition `i` on a live node
/// other than `parent_owners[i]`, going round those nodes so the copies
/// spread. `None` when some parent partition's owner is the only live node.
pub fn place_replica(name: &str, parent_owners: &[NodeId], live: &[NodeId]) -> Option<Vec<NodeId>> {
    let start = shard_for(name, 0, live.len().max(1));
    parent_owners
        .iter()
        .enumerate()
        .map(|(i, owner)| {
            let others: Vec<NodeId> = live.iter().copied().filter(|n| n != owner).collect();
            (!others.is_empty()).then(|| others[(start + i) % others.len()])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_partitions_go_elsewhere_or_nowhere() {
        let parents = [1, 2, 3, 1, 2, 3];
        let replicas = place_replica("orders-dr", &parents, &[1, 2, 3]).expect("placed");
        assert!(
            parents.iter().zip(&replicas).all(|(p, r)| p != r),
            "{replicas:?}"
        );
        for node in [1, 2, 3] {
            assert!(replicas.contains(&node), "{replicas:?}");
        }
        assert_eq!(place_replica("x", &[1, 1], &[1]), None);
        assert_eq!(place_replica("x", &[1, 2], &[1, 2]), Some(vec![2, 1]));
    }

    #[test]
    fn new_partitions_go_round_the_live_nodes() {
        let live = [1, 2, 3];
        let owners = place("orders", 0, 6, &live);
        assert_eq!(owners.len(), 6);
        for node in live {
            assert_eq!(
                owners.iter().filter(|o| **o == node).count(),
                2,
                "{owners:?}"
            );
        }
        // Consecutive partitions go to consecutive nodes.
        for pair in owners.windows(2) {
            let at = |n: NodeId| live.iter().position(|l| *l == n).unwrap_or(0);
            assert_eq!((at(pair[0]) + 1) % live.len(), at(pair[1]));
        }
    }

    #[test]
    fn a_dead_node_gets_none_and_a_single_node_gets_all() {
        assert!(place("orders", 0, 5, &[1, 3])
            .iter()
            .all(|n| *n == 1 || *n == 3));
        assert_eq!(place("orders", 0, 3, &[4]), vec![4, 4, 4]);
        assert!(place("orders", 0, 3, &[]).is_empty());
        assert!(place("orders", 2, 0, &[1, 2]).is_empty());
    }

    #[test]
    fn topics_start_at_different_nodes() {
        let live: Vec<NodeId> = (1..=5).collect();
        let firsts: std::collections::BTreeSet<NodeId> = (0..40)
            .map(|i| place(&format!("topic-{i}"), 0, 1, &live)[0])
            .collect();
        assert!(firsts.len() >= 4, "one-partition topics spread: {firsts:?}");
    }
}
