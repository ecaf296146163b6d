//! The metastore on real files: commands go through openraft, every topic
//! comes back after a restart from the fsynced log and snapshot, and a torn
//! log tail is cut.

use std::path::Path;
use std::time::Duration;

use narad_raft::node::{MetaError, MetaNode, MetaNodeConfig};
use narad_raft::state::{Applied, Command, Refused, TopicConfig};
use narad_raft::store::MetaView;

const LEADER_DEADLINE: Duration = Duration::from_secs(20);
const SNAPSHOT_AFTER: u64 = 10;

fn config(partitions: u32) -> TopicConfig {
    TopicConfig {
        partitions,
        visibility_timeout_ms: 30_000,
        retention_ms: 0,
        max_deliveries: 0,
        dead_letter_topic: None,
        schema: None,
        max_message_bytes: 1 << 20,
        idempotency_window_ms: 300_000,
    }
}

fn start(dir: &Path) -> MetaNode {
    let mut settings = MetaNodeConfig::single(1, dir.to_path_buf(), "127.0.0.1:9080".into());
    settings.snapshot_after_entries = SNAPSHOT_AFTER;
    MetaNode::start(settings).expect("metastore starts")
}

fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(future)
}

/// Waits (on the published state, with a deadline) until `done` holds.
fn wait_for_view(node: &MetaNode, done: impl Fn(&MetaView) -> bool) -> bool {
    let mut receiver = node.subscribe();
    block_on(async {
        tokio::time::timeout(LEADER_DEADLINE, async {
            loop {
                if done(&receiver.borrow_and_update()) {
                    return;
                }
                if receiver.changed().await.is_err() {
                    return;
                }
            }
        })
        .await
        .is_ok()
    })
}

fn create(node: &MetaNode, name: &str, partitions: u32) -> Result<Applied, MetaError> {
    block_on(node.propose(Command::PutTopic {
        name: name.into(),
        config: config(partitions),
        new_owners: vec![1; partitions as usize],
        now_ms: 1,
    }))
}

#[test]
fn topics_survive_restarts_through_the_log_and_snapshots() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("raft");
    let node = start(&dir);
    assert_eq!(
        block_on(node.wait_for_leader(LEADER_DEADLINE)).expect("leader"),
        1
    );
    assert!(node.is_leader());
    // More changes than the snapshot threshold.
    for i in 0..3 * SNAPSHOT_AFTER {
        assert!(matches!(
            create(&node, &format!("t{i}"), 2),
            Ok(Applied::TopicCreated(_))
        ));
    }
    block_on(node.propose(Command::DeleteTopic { name: "t0".into() })).expect("delete");
    assert_eq!(
        block_on(node.propose(Command::DeleteTopic { name: "t0".into() })),
        Err(MetaError::Refused(Refused::NoSuchTopic("t0".into())))
    );
    let before = node.view();
    assert_eq!(before.state.topics.len() as u64, 3 * SNAPSHOT_AFTER - 1);
    assert!(dir.join("snapshot.json").exists(), "a snapshot was taken");
    node.shutdown();

    let node = start(&dir);
    block_on(node.wait_for_leader(LEADER_DEADLINE)).expect("leader after restart");
    assert!(
        wait_for_view(&node, |view| view.state == before.state),
        "every topic is back"
    );
    assert!(matches!(
        create(&node, "after", 1),
        Ok(Applied::TopicCreated(_))
    ));
    node.shutdown();
}

#[test]
fn a_torn_log_tail_is_cut_and_the_node_starts() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("raft");
    let node = start(&dir);
    block_on(node.wait_for_leader(LEADER_DEADLINE)).expect("leader");
    create(&node, "kept", 1).expect("create");
    node.shutdown();
    // Half a record at the end, as a crash in the middle of a write leaves it.
    let log = dir.join("raft.log");
    let mut bytes = std::fs::read(&log).expect("log");
    let torn: Vec<u8> = bytes.iter().take(40).copied().collect();
    bytes.extend_from_slice(&torn);
    std::fs::write(&log, &bytes).expect("write");
    let node = start(&dir);
    block_on(node.wait_for_leader(LEADER_DEADLINE)).expect("leader");
    assert!(wait_for_view(&node, |view| view
        .state
        .topics
        .contains_key("kept")));
    node.shutdown();
}

/// A node that caught up stays caught up while it writes: an entry that is
/// appended but not yet applied does not make it "still learning the
/// cluster's metadata" (which turns a final 404 into a 503 "retry").
#[test]
fn a_caught_up_node_stays_caught_up_while_entries_are_in_flight() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let node = std::sync::Arc::new(start(&tmp.path().join("raft")));
    block_on(node.wait_for_leader(LEADER_DEADLINE)).expect("leader");
    block_on(node.wait_caught_up(LEADER_DEADLINE)).expect("caught up");
    let writer = {
        let node = node.clone();
        std::thread::spawn(move || {
            for i in 0..200 {
                create(&node, &format!("t{i}"), 1).expect("create");
            }
        })
    };
    let mut checks = 0u64;
    let mut lapses = 0u64;
    while !writer.is_finished() {
        checks += 1;
        if !node.caught_up() {
            lapses += 1;
        }
    }
    writer.join().expect("writer");
    assert!(checks > 0);
    assert_eq!(lapses, 0, "not caught up in {lapses} of {checks} checks");
}
