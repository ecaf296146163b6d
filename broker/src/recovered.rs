//! The partitions that records recovered from this node's WALs are
//! committed to again after a crash. A record above a WAL's checkpoint may
//! have been committed before the crash (the checkpoint only passes a
//! record once every record below it is committed), so its partition's
//! owner first recalls the records its log holds from about when those
//! were written ([`crate::owner::PartitionOwner::recall_before_next_append`])
//! and appends only the others: a crash then stores nothing twice that the
//! log's tail still shows. Node-wide: any shard may own the partition.

use std::collections::HashMap;
use std::sync::Mutex;

/// Recovered records' partitions, each with the oldest write time among
/// its records, until the partition's owner takes it.
#[derive(Debug, Default)]
pub struct Recovered {
    targets: Mutex<HashMap<(String, u32), u64>>,
}

impl Recovered {
    /// A record recovered for `partition` of `topic`, written at `accept_ms`.
    pub fn note(&self, topic: &str, partition: u32, accept_ms: u64) {
        let mut targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        targets
            .entry((topic.to_string(), partition))
            .and_modify(|oldest| *oldest = (*oldest).min(accept_ms))
            .or_insert(accept_ms);
    }

    /// The oldest write time of the records recovered for a partition, if
    /// any; once (the first commit there takes it).
    pub fn take(&self, topic: &str, partition: u32) -> Option<u64> {
        let mut targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        if targets.is_empty() {
            return None;
        }
        targets.remove(&(topic.to_string(), partition))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_is_taken_once_with_its_oldest_write_time() {
        let recovered = Recovered::default();
        recovered.note("t", 1, 500);
        recovered.note("t", 1, 300);
        recovered.note("t", 2, 900);
        assert_eq!(recovered.take("t", 1), Some(300));
        assert_eq!(recovered.take("t", 1), None);
        assert_eq!(recovered.take("u", 2), None);
        assert_eq!(recovered.take("t", 2), Some(900));
    }
}
