//! Which node Metadata names as a partition's leader when its owner does
//! not answer. A Kafka producer sends a partition's records only to the
//! leader Metadata names; while an owner is down but not yet marked dead
//! (`cluster.node_dead_after_ms`), naming it would stall the producer for
//! that long, where an HTTP producer is answered `202` at any live node.
//! So a node that asks an owner and gets no answer for the dispatcher's
//! reroute time (`dispatcher.reroute_after_ms`, the contract's 3 s) names
//! itself instead: it takes the records into its WAL and its dispatcher
//! brings them to the owner, or reroutes them to a sibling, as for HTTP.
//!
//! Pure: Metadata asks [`OwnerWatch::naming`] with the monotonic time and
//! starts the probes [`OwnerWatch::start_probe`] allows (one in flight per
//! node, at most one per [`KAFKA_LEADER_PROBE_INTERVAL_MS`]); each probe's
//! outcome comes back through [`OwnerWatch::probed`].

use std::collections::HashMap;

use crate::limits::KAFKA_LEADER_PROBE_INTERVAL_MS;

#[derive(Debug, Default, Clone, Copy)]
struct Watched {
    /// When the first probe of the current run of unanswered ones began.
    failing_since: Option<u64>,
    /// When the last unanswered probe gave up.
    failed_at: u64,
    /// When the last probe began.
    probed_at: Option<u64>,
    in_flight: bool,
}

/// What this node knows of other owners' answers, on its monotonic clock.
/// Holds an entry per node Metadata named (the cluster's members).
#[derive(Debug, Default)]
pub struct OwnerWatch {
    nodes: HashMap<u64, Watched>,
}

impl OwnerWatch {
    /// Whether Metadata names `node` as the leader of its partitions: not
    /// once probes have seen it not answer for `reroute_after_ms`, while
    /// that is recent (a failure long ago with no probe since is no
    /// evidence: the node is named, and probed again).
    pub fn naming(&self, node: u64, now_ms: u64, reroute_after_ms: u64) -> bool {
        let Some(watched) = self.nodes.get(&node) else {
            return true;
        };
        let Some(since) = watched.failing_since else {
            return true;
        };
        let seen_failing = watched.failed_at.saturating_sub(since) >= reroute_after_ms;
        let fresh = now_ms.saturating_sub(watched.failed_at) < reroute_after_ms;
        !(seen_failing && fresh)
    }

    /// Whether to ask `node` now; if so the probe is counted in flight
    /// until [`Self::probed`].
    pub fn start_probe(&mut self, node: u64, now_ms: u64) -> bool {
        let watched = self.nodes.entry(node).or_default();
        let due = watched
            .probed_at
            .is_none_or(|at| now_ms.saturating_sub(at) >= KAFKA_LEADER_PROBE_INTERVAL_MS);
        if watched.in_flight || !due {
            return false;
        }
        watched.in_flight = true;
        watched.probed_at = Some(now_ms);
        true
    }

    /// The probe begun at `started_ms` ended at `ended_ms`: answered, or
    /// not.
    pub fn probed(&mut self, node: u64, started_ms: u64, ended_ms: u64, answered: bool) {
        let watched = self.nodes.entry(node).or_default();
        watched.in_flight = false;
        if answered {
            watched.failing_since = None;
        } else {
            watched.failing_since.get_or_insert(started_ms);
            watched.failed_at = ended_ms;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_is_named_until_probes_see_it_not_answer_for_the_reroute_time() {
        let mut watch = OwnerWatch::default();
        assert!(watch.naming(2, 0, 3_000));
        assert!(watch.start_probe(2, 100));
        // One probe at a time, and not more often than the interval.
        assert!(!watch.start_probe(2, 150));
        watch.probed(2, 100, 1_100, false);
        assert!(!watch.start_probe(2, 600));
        // One failed probe is not yet the reroute time.
        assert!(watch.naming(2, 3_100, 3_000));
        assert!(watch.start_probe(2, 1_100));
        watch.probed(2, 1_100, 2_100, false);
        assert!(watch.start_probe(2, 2_100));
        watch.probed(2, 2_100, 3_100, false);
        assert!(!watch.naming(2, 3_200, 3_000));
        // Once it answers, it is named again at once.
        assert!(watch.start_probe(2, 3_300));
        watch.probed(2, 3_300, 3_310, true);
        assert!(watch.naming(2, 3_400, 3_000));
        // Other nodes are their own.
        assert!(watch.naming(3, 10_000, 3_000));
    }

    #[test]
    fn a_failure_long_ago_with_no_probe_since_is_no_evidence() {
        let mut watch = OwnerWatch::default();
        assert!(watch.start_probe(2, 100));
        watch.probed(2, 100, 1_100, false);
        // Minutes later, no Metadata (and no probe) in between.
        assert!(watch.naming(2, 300_000, 3_000));
        // A long failing run that stopped being probed goes stale too.
        for start in [1_100, 2_100, 3_100] {
            assert!(watch.start_probe(2, start));
            watch.probed(2, start, start + 1_000, false);
        }
        assert!(!watch.naming(2, 4_200, 3_000));
        assert!(watch.naming(2, 300_000, 3_000));
    }
}
