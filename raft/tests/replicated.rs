//! Three metastore nodes in one process, joined by an in-memory peer
//! network: one bootstraps the membership, a write at a follower is
//! forwarded to the leader, every node applies it, and the cluster keeps
//! going when one node stops (and refuses writes without a quorum).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use narad_raft::node::{BoxFuture, MetaError, MetaNode, MetaNodeConfig, PeerCaller};
use narad_raft::state::{Applied, Command, TopicConfig};

const DEADLINE: Duration = Duration::from_secs(20);

/// Peers by address; a removed peer is unreachable.
#[derive(Default)]
struct Loopback {
    nodes: Mutex<BTreeMap<String, Arc<MetaNode>>>,
}

impl PeerCaller for Loopback {
    fn call(
        &self,
        addr: &str,
        kind: u8,
        payload: Vec<u8>,
        _timeout: Duration,
    ) -> BoxFuture<Result<Vec<u8>, String>> {
        let node = self.nodes.lock().expect("nodes").get(addr).cloned();
        match node {
            Some(node) => node.serve(kind, payload),
            None => {
                let down = format!("{addr} is down");
                Box::pin(async move { Err(down) })
            }
        }
    }
}

fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(future)
}

fn put(node: &MetaNode, name: &str) -> Result<Applied, MetaError> {
    block_on(node.propose(Command::PutTopic {
        name: name.into(),
        config: TopicConfig {
            partitions: 2,
            visibility_timeout_ms: 30_000,
            retention_ms: 0,
            max_deliveries: 0,
            dead_letter_topic: None,
            schema: None,
            max_message_bytes: 1 << 20,
            idempotency_window_ms: 300_000,
        },
        new_owners: vec![1, 2],
        now_ms: 1,
    }))
}

fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + DEADLINE;
    while std::time::Instant::now() < end {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}

#[test]
fn three_nodes_agree_forward_writes_and_survive_one_loss() {
    let tmp = tempfile::tempdir().expect("tmp");
    let network = Arc::new(Loopback::default());
    let members: BTreeMap<u64, String> = (1..=3).map(|id| (id, format!("node-{id}"))).collect();
    let mut nodes = BTreeMap::new();
    for (id, addr) in &members {
        let mut config =
            MetaNodeConfig::single(*id, tmp.path().join(format!("raft-{id}")), addr.clone());
        config.members = members.clone();
        config.caller = Some(network.clone() as Arc<dyn PeerCaller>);
        let node = Arc::new(MetaNode::start(config).expect("start"));
        network
            .nodes
            .lock()
            .expect("nodes")
            .insert(addr.clone(), node.clone());
        nodes.insert(*id, node);
    }
    assert!(
        eventually(|| nodes.values().all(|n| n.leader().is_some())),
        "every node sees a leader"
    );
    let leader = nodes[&1].leader().expect("leader");
    let follower = *nodes.keys().find(|id| **id != leader).expect("follower");

    // A write at a follower goes to the leader and reaches every node.
    assert!(matches!(
        put(&nodes[&follower], "orders"),
        Ok(Applied::TopicCreated(_))
    ));
    assert!(eventually(|| nodes.values().all(|n| n
        .view()
        .state
        .topics
        .contains_key("orders"))));

    // The leader goes away: the other two elect one and keep taking writes.
    network
        .nodes
        .lock()
        .expect("nodes")
        .remove(&members[&leader]);
    let old_leader = nodes.remove(&leader).expect("leader node");
    drop(old_leader);
    assert!(
        eventually(|| nodes
            .values()
            .all(|n| n.leader().is_some_and(|l| l != leader))),
        "a new leader"
    );
    let survivor = *nodes.keys().next().expect("survivor");
    assert!(matches!(
        put(&nodes[&survivor], "payments"),
        Ok(Applied::TopicCreated(_))
    ));

    // One node alone has no quorum: 503 no_quorum, not a hang.
    let lone = *nodes.keys().last().expect("lone");
    let other = *nodes.keys().next().expect("other");
    network
        .nodes
        .lock()
        .expect("nodes")
        .remove(&members[&other]);
    drop(nodes.remove(&other));
    // Once it knows it has no quorum (a leader that stopped hearing from
    // one, or a follower whose leader went away), a write is refused
    // without being appended. (Sent in the moment before, it would be
    // appended and answer "may still apply".)
    assert!(
        eventually(|| nodes[&lone].leader().is_none()),
        "the lone node sees no leader"
    );
    let started = std::time::Instant::now();
    let refused = put(&nodes[&lone], "audit");
    assert!(
        matches!(refused, Err(MetaError::NoQuorum(_))),
        "{refused:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(15));
}
