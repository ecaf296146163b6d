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
    /// once it has failed to answer for `reroute_after_ms`.
    pub fn naming(&self, node: u64, now_ms: u64, reroute_after_ms: u64) -> bool {
        self.nodes
            .get(&node)
            .and_then(|w| w.failing_since)
            .is_none_or(|since| now_ms.saturating_sub(since) < reroute_after_ms)
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

    /// The probe begun at `started_ms` ended: answered, or not.
    pub fn probed(&mut self, node: u64, started_ms: u64, answered: bool) {
        let watched = self.nodes.entry(node).or_default();
        watched.in_flight = false;
        if answered {
            watched.failing_since = None;
        } else {
            watched.failing_since.get_or_insert(started_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_is_named_until_it_fails_to_answer_for_the_reroute_time() {
        let mut watch = OwnerWatch::default();
        assert!(watch.naming(2, 0, 3_000));
        assert!(watch.start_probe(2, 100));
        // One probe at a time, and not more often than the interval.
        assert!(!watch.start_probe(2, 150));
        watch.probed(2, 100, false);
        assert!(!watch.start_probe(2, 600));
        assert!(watch.naming(2, 3_099, 3_000));
        assert!(!watch.naming(2, 3_100, 3_000));
        assert!(watch.start_probe(2, 1_100));
        watch.probed(2, 1_100, false);
        // Still failing since the first probe.
        assert!(!watch.naming(2, 3_200, 3_000));
        // Once it answers, it is named again at once.
        assert!(watch.start_probe(2, 3_300));
        watch.probed(2, 3_300, true);
        assert!(watch.naming(2, 3_400, 3_000));
        // Other nodes are their own.
        assert!(watch.naming(3, 10_000, 3_000));
    }
}
