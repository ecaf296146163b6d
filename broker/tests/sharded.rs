//! Process tests of one `narad` node with two shards: produces land on
//! either shard (the kernel spreads connections over the shared port),
//! partitions live on one shard each, and commits, consumes, settles and
//! figures cross between them.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use support::{eventually, Node};

const WAIT: Duration = Duration::from_secs(30);
const TWO_SHARDS: &[&str] = &["--shards", "2"];

fn ids_of(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .map(|m| m["id"].as_str().expect("id").to_string())
        .collect()
}

/// The shard that accepted a message, from its id (node, shard,
/// incarnation and sequence packed into 128 bits).
fn accepting_shard(id: &str) -> u16 {
    u16::from_str_radix(&id[4..8], 16).expect("hex id")
}

/// Produces from `threads` threads, each request on a fresh connection, and
/// returns the ids answered 202.
fn produce_concurrently(
    node: &Node,
    topic: &str,
    threads: usize,
    per_thread: usize,
) -> BTreeSet<String> {
    let accepted = Arc::new(Mutex::new(BTreeSet::new()));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (accepted, addr, topic) = (accepted.clone(), node.addr.clone(), topic.to_string());
            std::thread::spawn(move || {
                for i in 0..per_thread {
                    let key = format!("k{}", (t * per_thread + i) % 97);
                    let (status, answer) = support::request(
                        &addr,
                        "POST",
                        &format!("/v1/topics/{topic}/messages"),
                        &[("Narad-Key", &key)],
                        format!("t{t}-{i}").as_bytes(),
                    );
                    assert_eq!(status, 202, "{answer}");
                    let id = answer["id"].as_str().expect("id").to_string();
                    accepted.lock().expect("lock").insert(id);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("producer");
    }
    let accepted = accepted.lock().expect("lock").clone();
    accepted
}

/// Consumes and acks from `threads` consumers until every expected id was
/// seen; returns how often each id was delivered.
fn drain_concurrently(
    node: &Node,
    topic: &str,
    threads: usize,
    expected: &BTreeSet<String>,
) -> BTreeMap<String, u64> {
    let seen: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let expected = Arc::new(expected.clone());
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (seen, expected, addr, topic) = (
                seen.clone(),
                expected.clone(),
                node.addr.clone(),
                topic.to_string(),
            );
            std::thread::spawn(move || {
                eventually(WAIT, || {
                    let (status, answer) = support::request(
                        &addr,
                        "POST",
                        &format!("/v1/topics/{topic}/consume"),
                        &[],
                        json!({"max_messages": 50, "wait_ms": 200})
                            .to_string()
                            .as_bytes(),
                    );
                    assert_eq!(status, 200, "{answer}");
                    let messages = answer["messages"].as_array().cloned().unwrap_or_default();
                    if !messages.is_empty() {
                        let receipts: Vec<&str> = messages
                            .iter()
                            .map(|m| m["receipt"].as_str().expect("receipt"))
                            .collect();
                        let (status, acked) = support::request(
                            &addr,
                            "POST",
                            &format!("/v1/topics/{topic}/ack/batch"),
                            &[],
                            json!({ "receipts": receipts }).to_string().as_bytes(),
                        );
                        assert_eq!(status, 200, "{acked}");
                        for result in acked["results"].as_array().expect("results") {
                            assert_eq!(result["status"], 204, "{result}");
                        }
                    }
                    let mut seen = seen.lock().expect("lock");
                    for id in ids_of(&messages) {
                        *seen.entry(id).or_insert(0) += 1;
                    }
                    expected.iter().all(|id| seen.contains_key(id))
                })
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("consumer");
    }
    let seen = seen.lock().expect("lock").clone();
    let missing = expected.iter().filter(|id| !seen.contains_key(*id)).count();
    assert_eq!(
        missing,
        0,
        "{missing} of {} never delivered",
        expected.len()
    );
    seen
}

#[test]
fn two_shards_deliver_every_message_once_across_shards() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), TWO_SHARDS);
    node.create_topic("orders", json!({"partitions": 6}));
    let expected = produce_concurrently(&node, "orders", 8, 150);
    assert_eq!(expected.len(), 1200);
    let shards: BTreeSet<u16> = expected.iter().map(|id| accepting_shard(id)).collect();
    assert_eq!(
        shards,
        BTreeSet::from([0, 1]),
        "both shards accepted produces (the kernel spreads 1200 connections)"
    );
    let seen = drain_concurrently(&node, "orders", 4, &expected);
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered twice: {twice:?}");
    assert!(
        seen.keys().all(|id| expected.contains(id)),
        "nothing never produced"
    );

    // Figures come from the shard that owns each partition.
    let (_, topic) = node.request("GET", "/v1/topics/orders", b"");
    let stats = topic["partition_stats"].as_array().expect("stats");
    let total: u64 = stats
        .iter()
        .map(|s| s["high_watermark"].as_u64().expect("hw"))
        .sum();
    assert_eq!(total, 1200, "{topic}");
    assert!(
        stats.iter().all(|s| s["high_watermark"].as_u64() > Some(0)),
        "every partition got messages"
    );
    let (status, _, metrics) = support::raw_request(&node.addr, "GET", "/metrics", &[], b"");
    assert_eq!(status, 200);
    let metrics = String::from_utf8_lossy(&metrics);
    for line in [
        "narad_wal_used_bytes{shard=\"0\"}",
        "narad_wal_used_bytes{shard=\"1\"}",
        "narad_dispatcher_pending_records{shard=\"1\"}",
    ] {
        assert!(metrics.contains(line), "{line} in /metrics");
    }
    let partitions = metrics
        .lines()
        .filter(|l| l.starts_with("narad_partition_high_watermark{topic=\"orders\""))
        .count();
    assert_eq!(partitions, 6, "every shard's partitions in /metrics");
}

#[test]
fn two_shards_lose_nothing_on_sigkill_and_keep_acks_over_sigterm() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut node = Node::start(&tmp.path().join("n"), TWO_SHARDS);
    node.create_topic("events", json!({"partitions": 4}));
    let expected = produce_concurrently(&node, "events", 8, 60);
    node.kill();
    node.restart();
    let seen = drain_concurrently(&node, "events", 2, &expected);
    assert!(
        seen.keys().all(|id| expected.contains(id)),
        "nothing never produced"
    );

    // Lease ten, ack six, SIGTERM: the four unacked come back at once, the
    // six never. (A fresh topic: the one above may still hold copies that
    // the crash window explains.)
    node.create_topic("kept", json!({"partitions": 4}));
    let batch: Vec<Value> = (0..10).map(|i| json!({"value": format!("m{i}")})).collect();
    let (status, _) = node.json(
        "POST",
        "/v1/topics/kept/messages/batch",
        json!({ "messages": batch }),
    );
    assert_eq!(status, 202);
    let mut got = Vec::new();
    assert!(eventually(WAIT, || {
        got.extend(node.consume("kept", json!({"max_messages": 10, "wait_ms": 200})));
        got.len() >= 10
    }));
    let receipts: Vec<&str> = got[..6]
        .iter()
        .map(|m| m["receipt"].as_str().expect("receipt"))
        .collect();
    let (status, _) = node.json(
        "POST",
        "/v1/topics/kept/ack/batch",
        json!({ "receipts": receipts }),
    );
    assert_eq!(status, 200);
    let leased: BTreeSet<String> = ids_of(&got[6..]).into_iter().collect();
    node.terminate();
    node.restart();
    let mut again = BTreeSet::new();
    assert!(eventually(WAIT, || {
        again.extend(ids_of(
            &node.consume("kept", json!({"max_messages": 100, "wait_ms": 200})),
        ));
        again.len() >= leased.len()
    }));
    assert_eq!(again, leased, "exactly the unacked ones come back");
}

#[test]
fn a_node_restarted_with_fewer_shards_delivers_what_the_removed_shard_accepted() {
    let tmp = tempfile::tempdir().expect("tmp");
    // A long checkpoint interval keeps every record in the WAL rings, so the
    // removed shard's ring still holds records when the node comes back.
    let mut node = Node::start(
        &tmp.path().join("n"),
        &[
            "--shards",
            "2",
            "--set",
            "dispatcher.checkpoint_interval_ms=60000",
        ],
    );
    node.create_topic("t", json!({"partitions": 4}));
    let expected = produce_concurrently(&node, "t", 8, 25);
    assert!(
        expected.iter().any(|id| accepting_shard(id) == 1),
        "shard 1 accepted some"
    );
    node.kill();
    node.restart_with(&["--shards", "1"]);
    // Messages already committed before the kill may come twice (a crash
    // window); none may be missing.
    drain_concurrently(&node, "t", 2, &expected);
    let removed = node.data_dir.join("wal").join("shard-1");
    assert!(
        eventually(WAIT, || !removed.exists()),
        "the adopted ring is removed"
    );
    assert!(node.stderr().contains("adopted the WAL of a removed shard"));
}

/// A keyed message for a partition of the other shard takes one hop to
/// that shard before anything is written, and is committed through its
/// journal there: a consume sent right after the 202, without waiting,
/// gets it, whichever shard took the produce.
#[test]
fn a_keyed_message_for_the_other_shards_partition_is_consumable_when_its_202_returns() {
    use narad_broker::mesh::shard_for;
    use narad_broker::partitioner::partition_for_key;
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), TWO_SHARDS);
    node.create_topic(
        "hop",
        json!({"partitions": 2, "visibility_timeout_ms": 60000}),
    );
    // A key for each partition; the partitions lie on different shards.
    let key_of = |partition: u32| {
        (0..)
            .map(|i| format!("key-{i}"))
            .find(|k| partition_for_key(k.as_bytes(), 2) == partition)
            .expect("a key")
    };
    let keys = [key_of(0), key_of(1)];
    assert_ne!(shard_for("hop", 0, 2), shard_for("hop", 1, 2));
    let produce = |i: usize| {
        let key = &keys[i % 2];
        let (status, answer) = support::request(
            &node.addr,
            "POST",
            "/v1/topics/hop/messages",
            &[("Narad-Key", key)],
            format!("m{i}").as_bytes(),
        );
        assert_eq!(status, 202, "{answer}");
        answer["id"].as_str().expect("id").to_string()
    };
    // The first commits open the partitions (the journal needs them open).
    let warm: BTreeSet<String> = (0..6).map(produce).collect();
    let mut seen = BTreeSet::new();
    let drained = eventually(WAIT, || {
        let got = node.consume("hop", json!({"max_messages": 100, "wait_ms": 100}));
        support::ack_batch(&node, "hop", &got);
        seen.extend(ids_of(&got));
        warm.is_subset(&seen)
    });
    assert!(drained, "the warm-up drained");
    let mut hops = 0;
    for i in 0..30 {
        let id = produce(i);
        let partition = (i % 2) as u32;
        if usize::from(accepting_shard(&id)) != shard_for("hop", partition, 2) {
            hops += 1;
        }
        let got = node.consume("hop", json!({"max_messages": 10, "wait_ms": 0}));
        assert_eq!(
            ids_of(&got),
            vec![id.clone()],
            "message {i} (partition {partition}, taken by shard {}) consumable as its 202 returned",
            accepting_shard(&id)
        );
        support::ack_batch(&node, "hop", &got);
    }
    assert!(hops > 0, "some produces were taken by the other shard");
}
