//! The routing core: where a partition lives as one shard sees it, how a
//! request's items split by location, the order a consume visits
//! partitions and nodes in, where a reroute goes, and putting answers back
//! in request order. Pure functions: the shard supplies what the metastore
//! and the mesh know, and these decide.

use std::collections::BTreeMap;

use narad_raft::state::NodeId;

use crate::mesh::shard_for;
use crate::rpc::Reach;

/// This node's shards and other nodes a fan-out asks, each with its
/// partitions ([`Placement::fan_out`]).
pub type FanoutParts = (Vec<(usize, Vec<u32>)>, Vec<(NodeId, Vec<u32>)>);

/// Where a partition lives, seen from one shard (ordered: here first, then
/// this node's other shards, then other nodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Location {
    /// This shard owns it.
    Here,
    /// Another shard of this node owns it.
    Shard(usize),
    /// Another node owns it.
    Node(NodeId),
}

impl Location {
    /// Whether an operation that may travel `reach` from here may go to
    /// this location: the one rule of reach (an operation another shard
    /// sent stays on this shard; one another node sent stays on this node).
    pub fn within(self, reach: Reach) -> bool {
        match self {
            Location::Here => true,
            Location::Shard(_) => reach.crosses_shards(),
            Location::Node(_) => reach.crosses_nodes(),
        }
    }
}

/// What one shard knows about a topic's placement.
#[derive(Debug, Clone, Copy)]
pub struct Placement<'a> {
    /// This node.
    pub me: NodeId,
    /// This shard, and how many the node has.
    pub shard: usize,
    pub shards: usize,
    pub topic: &'a str,
    /// The node that owns each partition (per the metastore).
    pub owners: &'a [NodeId],
}

impl Placement<'_> {
    /// The node that owns `partition` (this node for one the metadata does
    /// not place: it is answered here, as missing).
    pub fn node_of(&self, partition: u32) -> NodeId {
        self.owners
            .get(partition as usize)
            .copied()
            .unwrap_or(self.me)
    }

    /// The shard of its node that owns `partition`.
    pub fn shard_of(&self, partition: u32) -> usize {
        shard_for(self.topic, partition, self.shards)
    }

    pub fn locate(&self, partition: u32) -> Location {
        match self.node_of(partition) {
            node if node != self.me => Location::Node(node),
            _ => match self.shard_of(partition) {
                shard if shard == self.shard => Location::Here,
                shard => Location::Shard(shard),
            },
        }
    }

    /// Partitions split into this node's and each other node's, each list
    /// keeping the order it was given in.
    pub fn split_by_node(
        &self,
        partitions: impl IntoIterator<Item = u32>,
    ) -> (Vec<u32>, BTreeMap<NodeId, Vec<u32>>) {
        let mut local = Vec::new();
        let mut remote: BTreeMap<NodeId, Vec<u32>> = BTreeMap::new();
        for partition in partitions {
            match self.node_of(partition) {
                node if node == self.me => local.push(partition),
                node => remote.entry(node).or_default().push(partition),
            }
        }
        (local, remote)
    }

    /// Partitions of this node grouped by the shard that owns them, in
    /// shard order, each group keeping the order it was given in.
    pub fn group_by_shard(
        &self,
        partitions: impl IntoIterator<Item = u32>,
    ) -> Vec<(usize, Vec<u32>)> {
        let mut groups: Vec<Vec<u32>> = vec![Vec::new(); self.shards.max(1)];
        for partition in partitions {
            groups[self.shard_of(partition)].push(partition);
        }
        groups
            .into_iter()
            .enumerate()
            .filter(|(_, group)| !group.is_empty())
            .collect()
    }
}

impl Placement<'_> {
    /// The parts of a fan-out over `partitions` within `reach`: this node's
    /// shards (this one among them) and other nodes, each with its
    /// partitions in the order given, each list rotated by `rotation` (so
    /// no partition starves behind another). A shard or node beyond the
    /// reach is left out.
    pub fn fan_out(
        &self,
        partitions: impl IntoIterator<Item = u32>,
        reach: Reach,
        rotation: u32,
    ) -> FanoutParts {
        let (mine, others) = self.split_by_node(partitions);
        let shards = rotated(self.group_by_shard(mine), rotation)
            .into_iter()
            .filter(|(shard, _)| *shard == self.shard || Location::Shard(*shard).within(reach))
            .collect();
        let nodes = rotated(others.into_iter().collect(), rotation)
            .into_iter()
            .filter(|(node, _)| Location::Node(*node).within(reach))
            .collect();
        (shards, nodes)
    }
}

/// The partitions a consume visits, in order: the pinned one alone, or
/// every partition from a start that moves with `rotation`, so that no
/// partition starves behind another.
pub fn consume_order(partitions: u32, rotation: u32, pinned: Option<u32>) -> Vec<u32> {
    match pinned {
        Some(partition) => vec![partition],
        None => {
            let n = partitions.max(1);
            (0..n).map(|i| rotation.wrapping_add(i) % n).collect()
        }
    }
}

/// `items` rotated left by `rotation` (modulo their count): the order other
/// nodes are asked in, so that each gets its turn to be first.
pub fn rotated<T>(mut items: Vec<T>, rotation: u32) -> Vec<T> {
    if !items.is_empty() {
        let turn = rotation as usize % items.len();
        items.rotate_left(turn);
    }
    items
}

/// Where records waiting for an unreachable owner go instead: a sibling
/// partition of this node if there is one (no network in the way), else
/// one of a node that is neither the failing owner nor marked dead; among
/// those, one this node is not itself rerouting around (`is_failing`: its
/// records would only bounce on), unless all are. `turn` spreads
/// successive reroutes. `None` when no partition qualifies.
pub fn reroute_target(
    placement: &Placement<'_>,
    partitions: u32,
    from: u32,
    is_dead: impl Fn(NodeId) -> bool,
    is_failing: impl Fn(u32) -> bool,
    turn: u32,
) -> Option<u32> {
    let failing = placement.node_of(from);
    let siblings = |accept: &dyn Fn(NodeId) -> bool| -> Vec<u32> {
        (0..partitions)
            .filter(|p| *p != from && accept(placement.node_of(*p)))
            .collect()
    };
    let mut candidates = siblings(&|node| node == placement.me);
    if candidates.is_empty() {
        candidates = siblings(&|node| node != failing && !is_dead(node));
    }
    let healthy: Vec<u32> = candidates
        .iter()
        .copied()
        .filter(|p| !is_failing(*p))
        .collect();
    if !healthy.is_empty() {
        candidates = healthy;
    }
    (!candidates.is_empty()).then(|| candidates[turn as usize % candidates.len()])
}

/// Items of a request grouped by where each goes, remembering each item's
/// place in the request.
#[derive(Debug)]
pub struct Group<T> {
    pub indexes: Vec<usize>,
    pub items: Vec<T>,
}

impl<T> Default for Group<T> {
    fn default() -> Self {
        Self {
            indexes: Vec::new(),
            items: Vec::new(),
        }
    }
}

/// Groups `items` by the key `locate` gives each (with what the item
/// becomes there), in key order; an item `locate` refuses has its answer
/// (the error) put in `answers` at once.
pub fn group_by<K: Ord, T, U, A>(
    items: impl IntoIterator<Item = T>,
    answers: &mut InOrder<A>,
    mut locate: impl FnMut(T) -> Result<(K, U), A>,
) -> BTreeMap<K, Group<U>> {
    let mut groups: BTreeMap<K, Group<U>> = BTreeMap::new();
    for (index, item) in items.into_iter().enumerate() {
        match locate(item) {
            Ok((key, item)) => {
                let group = groups.entry(key).or_default();
                group.indexes.push(index);
                group.items.push(item);
            }
            Err(answer) => answers.put(index, answer),
        }
    }
    groups
}

/// Answers gathered from wherever each item went, back in request order.
#[derive(Debug)]
pub struct InOrder<A> {
    slots: Vec<Option<A>>,
}

impl<A> InOrder<A> {
    pub fn new(len: usize) -> Self {
        Self {
            slots: (0..len).map(|_| None).collect(),
        }
    }

    pub fn put(&mut self, index: usize, answer: A) {
        if let Some(slot) = self.slots.get_mut(index) {
            *slot = Some(answer);
        }
    }

    /// The answers of one group, in the group's order.
    pub fn put_all(&mut self, indexes: Vec<usize>, answers: impl IntoIterator<Item = A>) {
        for (index, answer) in indexes.into_iter().zip(answers) {
            self.put(index, answer);
        }
    }

    /// Every answer in request order; an item nobody answered (a bug, or a
    /// group that answered short) gets `missing()` rather than vanishing.
    pub fn finish(self, missing: impl Fn() -> A) -> Vec<A> {
        self.slots
            .into_iter()
            .map(|slot| slot.unwrap_or_else(&missing))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement<'a>(owners: &'a [NodeId], shard: usize, shards: usize) -> Placement<'a> {
        Placement {
            me: 1,
            shard,
            shards,
            topic: "orders",
            owners,
        }
    }

    #[test]
    fn a_partition_is_here_on_another_shard_or_on_another_node() {
        let owners = [1, 2, 1, 3, 1, 1, 1, 1];
        let shards = 4;
        let here = placement(&owners, 0, shards);
        for partition in 0..8u32 {
            let expected = match owners[partition as usize] {
                1 if shard_for("orders", partition, shards) == 0 => Location::Here,
                1 => Location::Shard(shard_for("orders", partition, shards)),
                node => Location::Node(node),
            };
            assert_eq!(here.locate(partition), expected, "partition {partition}");
        }
        // Beyond the metadata: this node answers (as missing).
        assert_eq!(here.node_of(99), 1);
        // One shard: every partition of this node is here.
        let single = placement(&owners, 0, 1);
        assert_eq!(single.locate(0), Location::Here);
        assert_eq!(single.locate(1), Location::Node(2));
    }

    #[test]
    fn splitting_by_node_and_shard_keeps_the_given_order() {
        let owners = [1, 2, 1, 2, 3, 1];
        let here = placement(&owners, 0, 2);
        let (local, remote) = here.split_by_node([5, 4, 3, 2, 1, 0]);
        assert_eq!(local, vec![5, 2, 0]);
        assert_eq!(remote[&2], vec![3, 1]);
        assert_eq!(remote[&3], vec![4]);
        let groups = here.group_by_shard(local.clone());
        let flat: Vec<u32> = groups.iter().flat_map(|(_, g)| g.clone()).collect();
        assert_eq!(flat.len(), local.len());
        for (shard, group) in &groups {
            assert!(group.iter().all(|p| here.shard_of(*p) == *shard));
            let positions: Vec<usize> = group
                .iter()
                .map(|p| local.iter().position(|q| q == p).expect("given"))
                .collect();
            assert!(positions.windows(2).all(|w| w[0] < w[1]), "order kept");
        }
    }

    #[test]
    fn a_fan_out_asks_what_its_reach_allows_in_a_rotating_order() {
        // Node 1 has partitions 0, 2, 4, 5 over two shards; 1 and 3 are
        // node 2's, 6 node 3's.
        let owners = [1, 2, 1, 2, 1, 1, 3];
        let here = placement(&owners, 0, 2);
        let all = 0..7u32;
        let (shards, nodes) = here.fan_out(all.clone(), Reach::Cluster, 0);
        let mine: Vec<u32> = shards.iter().flat_map(|(_, g)| g.clone()).collect();
        assert_eq!(mine.len(), 4);
        assert_eq!(nodes, vec![(2, vec![1, 3]), (3, vec![6])]);
        let (_, turned) = here.fan_out(all.clone(), Reach::Cluster, 1);
        assert_eq!(turned, vec![(3, vec![6]), (2, vec![1, 3])], "rotated");
        // From another node: this node's shards only.
        let (node_shards, node_nodes) = here.fan_out(all.clone(), Reach::Node, 0);
        assert_eq!(node_shards, shards);
        assert!(node_nodes.is_empty());
        // From another shard: this shard only.
        let (only, none) = here.fan_out(all, Reach::Shard, 1);
        assert!(only.iter().all(|(shard, _)| *shard == 0));
        assert_eq!(
            only.iter().map(|(_, g)| g.len()).sum::<usize>(),
            (0..7u32)
                .filter(|p| owners[*p as usize] == 1 && here.shard_of(*p) == 0)
                .count()
        );
        assert!(none.is_empty());
    }

    #[test]
    fn consumes_start_at_a_moving_partition_and_visit_each_once() {
        assert_eq!(consume_order(4, 0, None), vec![0, 1, 2, 3]);
        assert_eq!(consume_order(4, 2, None), vec![2, 3, 0, 1]);
        assert_eq!(consume_order(4, u32::MAX, None).len(), 4);
        assert_eq!(consume_order(4, 7, Some(1)), vec![1]);
        let firsts: Vec<u32> = (0..4).map(|r| consume_order(4, r, None)[0]).collect();
        assert_eq!(firsts, vec![0, 1, 2, 3], "each partition gets to be first");
        assert_eq!(rotated(vec![10, 20, 30], 4), vec![20, 30, 10]);
        assert!(rotated(Vec::<u8>::new(), 3).is_empty());
    }

    #[test]
    fn a_reroute_prefers_this_node_then_a_live_other_never_the_failing_owner() {
        // Partition 0 on node 2 fails; node 1 (this one) owns partition 2.
        let owners = [2, 2, 1, 3];
        let here = placement(&owners, 0, 1);
        assert_eq!(
            reroute_target(&here, 4, 0, |_| false, |_| false, 0),
            Some(2)
        );
        assert_eq!(
            reroute_target(&here, 4, 0, |_| false, |_| false, 5),
            Some(2)
        );
        // No partition here: another live node's, not the failing owner's.
        let owners = [2, 2, 3, 4];
        let here = placement(&owners, 0, 1);
        let picks: Vec<Option<u32>> = (0..4)
            .map(|turn| reroute_target(&here, 4, 0, |_| false, |_| false, turn))
            .collect();
        assert_eq!(picks, vec![Some(2), Some(3), Some(2), Some(3)]);
        // Node 3 marked dead: only node 4's partition is left.
        assert_eq!(
            reroute_target(&here, 4, 0, |n| n == 3, |_| false, 0),
            Some(3)
        );
        assert_eq!(
            reroute_target(&here, 4, 0, |n| n == 3, |_| false, 1),
            Some(3)
        );
        assert_eq!(
            reroute_target(&here, 4, 0, |n| n == 3 || n == 4, |_| false, 0),
            None
        );
        // Partition 2 (node 3) is failing too: node 4's takes the records,
        // whatever the turn; with every sibling failing, any will do.
        let picks: Vec<Option<u32>> = (0..4)
            .map(|turn| reroute_target(&here, 4, 0, |_| false, |p| p == 2, turn))
            .collect();
        assert_eq!(picks, vec![Some(3); 4]);
        assert_eq!(
            reroute_target(&here, 4, 0, |_| false, |p| p == 2 || p == 3, 1),
            Some(3)
        );
        // A single partition has nowhere to go.
        assert_eq!(
            reroute_target(&placement(&[2], 0, 1), 1, 0, |_| false, |_| false, 0),
            None
        );
    }

    #[test]
    fn answers_come_back_in_request_order_and_none_goes_missing() {
        let mut answers: InOrder<Result<u32, String>> = InOrder::new(5);
        let items = vec![30u32, 11, 99, 12, 31];
        let groups = group_by(items, &mut answers, |item| {
            if item == 99 {
                Err(Err("refused".to_string()))
            } else {
                Ok((item / 10, item))
            }
        });
        assert_eq!(groups.keys().copied().collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(groups[&1].indexes, vec![1, 3]);
        assert_eq!(groups[&3].items, vec![30, 31]);
        for (_, group) in groups {
            // Answer all but the last item of each group.
            let count = group.items.len() - 1;
            answers.put_all(group.indexes, group.items.into_iter().take(count).map(Ok));
        }
        let all = answers.finish(|| Err("missing".to_string()));
        assert_eq!(
            all,
            vec![
                Ok(30),
                Ok(11),
                Err("refused".to_string()),
                Err("missing".to_string()),
                Err("missing".to_string())
            ]
        );
    }
}
