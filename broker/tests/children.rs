//! Process tests of children (docs/children.md): a fanout child gets every
//! later message with its id, key, value and produce time, and keeps its
//! cursor across a crash; a delay child never delivers early; a replica is
//! placed away from its parent and survives the loss of a parent's volume;
//! a child that falls behind its parent's retention skips and counts.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use support::cluster::Cluster;
use support::{child_status, eventually, metric, narad, Node};

const WAIT: Duration = Duration::from_secs(30);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn put_child(node: &Node, parent: &str, child: &str, body: Value) -> (u16, Value) {
    node.json(
        "PUT",
        &format!("/v1/topics/{parent}/children/{child}"),
        body,
    )
}

/// Every message of a topic, consumed and acked until `expected` ids were
/// all seen: id → (key, value, produced_at_ms, deliveries).
fn collect(node: &Node, topic: &str, expected: &BTreeSet<String>) -> BTreeMap<String, Value> {
    let mut seen: BTreeMap<String, Value> = BTreeMap::new();
    let done = eventually(WAIT, || {
        let messages = node.consume(topic, json!({"max_messages": 500, "wait_ms": 200}));
        if !messages.is_empty() {
            support::ack_batch(node, topic, &messages);
        }
        for message in messages {
            let id = message["id"].as_str().unwrap_or_default().to_string();
            seen.insert(id, message);
        }
        expected.iter().all(|id| seen.contains_key(id))
    });
    let missing = expected.iter().filter(|id| !seen.contains_key(*id)).count();
    assert!(
        done,
        "{missing} of {} messages never reached {topic}",
        expected.len()
    );
    seen
}

#[test]
fn a_fanout_child_copies_every_later_message_whole_and_keeps_its_cursor_across_a_crash() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut node = Node::start(&tmp.path().join("n"), &["--shards", "2"]);
    node.create_topic("orders", json!({"partitions": 4}));
    let before: BTreeSet<String> = (0..20)
        .map(|i| node.produce("orders", &format!("early-{i}")))
        .collect();

    // A child with another partition count: copies go by key.
    let (status, answer) = put_child(
        &node,
        "orders",
        "audit",
        json!({"kind": "fanout", "topic": {"partitions": 3}}),
    );
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["parent"], "orders");
    assert_eq!(answer["partitions"], 3);
    let (status, again) = put_child(&node, "orders", "audit", json!({"kind": "fanout"}));
    assert_eq!(status, 200, "the same child again is an update: {again}");

    let mut after = BTreeSet::new();
    for i in 0..200 {
        let (status, answer) = node.request_with(
            "POST",
            "/v1/topics/orders/messages",
            &[("Narad-Key", &format!("k{}", i % 7))],
            format!("late-{i}").as_bytes(),
        );
        assert_eq!(status, 202, "{answer}");
        after.insert(answer["id"].as_str().expect("id").to_string());
    }
    let copies = collect(&node, "audit", &after);
    let originals = collect(&node, "orders", &after.union(&before).cloned().collect());
    for id in &after {
        let (copy, original) = (&copies[id], &originals[id]);
        for field in ["key", "value", "produced_at_ms"] {
            assert_eq!(copy[field], original[field], "{field} of {id}");
        }
        // Same key, same child partition.
        let key = copy["key"].as_str().expect("key");
        let same_key = copies
            .values()
            .filter(|c| c["key"] == key)
            .filter_map(|c| c["partition"].as_u64())
            .collect::<BTreeSet<_>>();
        assert_eq!(same_key.len(), 1, "key {key} went to one child partition");
    }
    assert!(eventually(WAIT, || {
        let status = child_status(&node, "orders", "audit");
        status["lag_messages"] == 0 && status["state"] == "copying"
    }));
    let status = child_status(&node, "orders", "audit");
    assert_eq!(status["kind"], "fanout");
    assert_eq!(status["dropped_messages"], 0);
    let (_, described) = node.request("GET", "/v1/topics/orders", b"");
    assert_eq!(described["children"][0]["name"], "audit", "{described}");
    assert_eq!(
        metric(
            &node,
            r#"narad_fanout_child_lag_messages{parent="orders",child="audit"}"#
        ),
        0.0
    );
    let (_, _, body) = support::raw_request(&node.addr, "GET", "/metrics", &[], b"");
    let text = String::from_utf8_lossy(&body);
    for name in [
        "narad_fanout_child_lag_messages",
        "narad_fanout_child_lag_seconds",
        "narad_fanout_child_dropped_messages",
    ] {
        assert!(
            text.contains(&format!("{name}{{parent=\"orders\",child=\"audit\"}}")),
            "{name} exported"
        );
    }

    // What the API refuses: a replica on one node, a remote child with a
    // URL that is not one, a child of a child, a parent deleted under its
    // children.
    let (status, answer) = put_child(&node, "orders", "dr", json!({"kind": "replica"}));
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("single node"));
    let (status, answer) = put_child(
        &node,
        "orders",
        "far",
        json!({"kind": "remote", "remote": {"url": "ftp://x:1", "topic": "t", "token": "t"}}),
    );
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("remote.url"));
    let (status, answer) = put_child(&node, "audit", "deeper", json!({"kind": "fanout"}));
    assert_eq!(status, 400, "{answer}");
    let (status, answer) = node.request("DELETE", "/v1/topics/orders", b"");
    assert_eq!(status, 409, "{answer}");
    assert!(answer["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("audit"));

    // A crash: the cursors come back from the parent's folder; what was
    // copied is not lost, what is produced next is copied too.
    node.kill();
    node.restart();
    let later: BTreeSet<String> = (0..50)
        .map(|i| node.produce("orders", &format!("after-crash-{i}")))
        .collect();
    collect(&node, "audit", &later);

    // Deleting the child stops the copy; the child topic stays, and the
    // parent can go once it has no children.
    let (status, answer) = node.request("DELETE", "/v1/topics/orders/children/audit", b"");
    assert_eq!(status, 204, "{answer}");
    let (status, audit) = node.request("GET", "/v1/topics/audit", b"");
    assert_eq!(status, 200, "{audit}");
    assert!(audit.get("parent").is_none(), "{audit}");
    let (status, answer) = node.request("DELETE", "/v1/topics/orders/children/audit", b"");
    assert_eq!(status, 404, "{answer}");
    let (status, answer) = node.request("DELETE", "/v1/topics/orders", b"");
    assert_eq!(status, 204, "{answer}");
}

/// The contract: a delay child delivers usually within a second after the
/// delay has passed.
const DELAY_USUALLY_WITHIN_MS: u64 = 1_000;

#[test]
fn a_delay_child_never_delivers_early_and_delivers_within_two_seconds_after() {
    const DELAY_MS: u64 = 1_500;
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &["--shards", "2"]);
    node.create_topic("jobs", json!({"partitions": 2, "retention_ms": 3_600_000}));
    // The parent must keep messages for the delay plus an hour.
    let (status, answer) = put_child(
        &node,
        "jobs",
        "later",
        json!({"kind": "delay", "delay_ms": DELAY_MS}),
    );
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("retention"));
    let (status, answer) = node.json("PUT", "/v1/topics/jobs", json!({"retention_ms": 0}));
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = put_child(
        &node,
        "jobs",
        "later",
        json!({"kind": "delay", "delay_ms": DELAY_MS}),
    );
    assert_eq!(status, 201, "{answer}");
    // ... and a retention change that breaks that is refused.
    let (status, answer) = node.json("PUT", "/v1/topics/jobs", json!({"retention_ms": 3_600_000}));
    assert_eq!(status, 409, "{answer}");

    let mut produced = BTreeSet::new();
    for i in 0..40 {
        produced.insert(node.produce("jobs", &format!("job-{i}")));
        if i % 10 == 9 {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let mut first_delivery: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let all = eventually(WAIT, || {
        let messages = node.consume("later", json!({"max_messages": 100, "wait_ms": 500}));
        let at = now_ms();
        for message in &messages {
            let id = message["id"].as_str().unwrap_or_default().to_string();
            let produced_at = message["produced_at_ms"].as_u64().unwrap_or(0);
            first_delivery.entry(id).or_insert((produced_at, at));
        }
        if !messages.is_empty() {
            support::ack_batch(&node, "later", &messages);
        }
        produced.iter().all(|id| first_delivery.contains_key(id))
    });
    assert!(
        all,
        "{} of {} delivered",
        first_delivery.len(),
        produced.len()
    );
    for (id, (produced_at, delivered_at)) in &first_delivery {
        assert!(
            *delivered_at >= produced_at + DELAY_MS,
            "{id} delivered {} ms early",
            produced_at + DELAY_MS - delivered_at
        );
        assert!(
            *delivered_at <= produced_at + DELAY_MS + 2_000,
            "{id} delivered {} ms after its due time",
            delivered_at - produced_at - DELAY_MS
        );
    }
    // Usually within a second of the due time: the median, with the p99
    // in the report.
    let mut late: Vec<u64> = first_delivery
        .values()
        .map(|(produced_at, delivered_at)| delivered_at - produced_at - DELAY_MS)
        .collect();
    late.sort_unstable();
    let median = late[late.len() / 2];
    let p99 = late[(late.len() * 99).div_ceil(100) - 1];
    eprintln!(
        "delay child: {} messages, after their due time: median {median} ms, p99 {p99} ms",
        late.len()
    );
    assert!(
        median <= DELAY_USUALLY_WITHIN_MS,
        "the median delivery came {median} ms after the due time"
    );
    let status = child_status(&node, "jobs", "later");
    assert_eq!(
        (status["kind"].clone(), status["delay_ms"].clone()),
        (json!("delay"), json!(DELAY_MS))
    );
}

#[test]
fn a_replica_is_placed_away_from_its_parent_and_keeps_a_lost_volumes_messages() {
    let mut cluster = Cluster::start(3);
    cluster.wait_ready(WAIT);
    let (status, answer) = cluster.nodes[0].json("PUT", "/v1/topics/pay", json!({"partitions": 6}));
    assert_eq!(status, 201, "{answer}");
    let (status, answer) = put_child(
        &cluster.nodes[0],
        "pay",
        "pay-dr",
        json!({"kind": "replica", "topic": {"partitions": 4}}),
    );
    assert_eq!(
        status, 400,
        "a replica has its parent's partition count: {answer}"
    );
    let (status, answer) = put_child(
        &cluster.nodes[0],
        "pay",
        "pay-dr",
        json!({"kind": "replica"}),
    );
    assert_eq!(status, 201, "{answer}");
    let parents = cluster.owners("pay");
    let replicas = cluster.owners("pay-dr");
    assert_eq!(replicas.len(), 6);
    for (partition, (parent, replica)) in parents.iter().zip(&replicas).enumerate() {
        assert_ne!(
            parent, replica,
            "replica partition {partition} on its parent's node"
        );
    }

    let produced: BTreeSet<String> = (0..300)
        .map(|i| cluster.nodes[i % 3].produce("pay", &format!("pay-{i}")))
        .collect();
    // The replica caught up: every message is older than the lag now.
    assert!(eventually(WAIT, || {
        let status = child_status(&cluster.nodes[1], "pay", "pay-dr");
        status["lag_messages"] == 0 && status["state"] == "copying"
    }));
    // Which messages node 3's parent partitions hold (consuming the parent
    // leaves the replica alone).
    let parent_copies = collect(&cluster.nodes[0], "pay", &produced);
    let on_node_3: BTreeSet<String> = parent_copies
        .iter()
        .filter(|(_, m)| parents[m["partition"].as_u64().unwrap_or(0) as usize] == 2)
        .map(|(id, _)| id.clone())
        .collect();
    assert!(!on_node_3.is_empty(), "node 3 holds parent messages");
    let stored = |cluster: &Cluster| -> u64 {
        cluster.describe(1, "pay")["partition_stats"]
            .as_array()
            .map_or(0, |parts| {
                parts
                    .iter()
                    .zip(&parents)
                    .filter(|(_, owner)| **owner == 2)
                    .filter_map(|(p, _)| p["high_watermark"].as_u64())
                    .sum()
            })
    };

    // Node 3 loses its volume: its parent partitions come back empty...
    cluster.nodes[2].kill();
    std::fs::remove_dir_all(&cluster.nodes[2].data_dir).expect("wipe");
    cluster.nodes[2].restart();
    assert!(eventually(WAIT, || cluster.ready(2)));
    assert_eq!(
        stored(&cluster),
        0,
        "the lost volume's parent messages are gone"
    );
    // ... and consumers that move to the replica find every one of them
    // (their replica partitions were on other nodes).
    collect(&cluster.nodes[0], "pay-dr", &on_node_3);
}

#[test]
fn a_child_behind_its_parents_retention_skips_what_retention_removed_and_counts_it() {
    let retention = [
        "--set",
        "topics.retention_floor_ms=1000",
        "--set",
        "testing.short_retention=true",
        "--set",
        "storage.segment_bytes=65536",
    ];
    let cluster = Cluster::start_with(3, &retention);
    cluster.wait_ready(WAIT);
    let (status, answer) = cluster.nodes[0].json(
        "PUT",
        "/v1/topics/feed",
        json!({"partitions": 1, "retention_ms": 3_000}),
    );
    assert_eq!(status, 201, "{answer}");
    let (status, answer) = put_child(
        &cluster.nodes[0],
        "feed",
        "feed-copy",
        json!({"kind": "replica"}),
    );
    assert_eq!(status, 201, "{answer}");
    let parent_node = cluster.owners("feed")[0];
    let child_node = cluster.owners("feed-copy")[0];
    assert_ne!(parent_node, child_node);

    // The child's owner stops answering: copies fail while the parent's
    // retention removes what they did not take.
    cluster.nodes[child_node].pause();
    let parent = &cluster.nodes[parent_node];
    let value = "x".repeat(4096);
    let produced: Vec<String> = (0..64).map(|_| parent.produce("feed", &value)).collect();
    let frontier = |node: &Node| {
        let (_, topic) = node.request("GET", "/v1/topics/feed", b"");
        topic["partition_stats"][0]["frontier"]
            .as_u64()
            .unwrap_or(0)
    };
    // The copy reports its failure while there is still something to copy
    // (once retention removed everything, there is nothing left to fail).
    assert!(
        eventually(WAIT, || {
            let status = child_status(parent, "feed", "feed-copy");
            status["state"] == "failing" && status["last_error"].is_string()
        }),
        "the copy reports failing: {}",
        child_status(parent, "feed", "feed-copy")
    );
    assert!(
        eventually(WAIT, || frontier(parent) > 0),
        "retention removed the oldest messages"
    );
    // The copy's next attempt (after the one still waiting on the silent
    // child) reads on from its cursor and finds those messages gone:
    // skipped and counted, while the child is still away.
    assert!(
        eventually(WAIT, || {
            child_status(parent, "feed", "feed-copy")["dropped_messages"]
                .as_u64()
                .unwrap_or(0)
                > 0
        }),
        "the copy skipped and counted: {}",
        child_status(parent, "feed", "feed-copy")
    );
    cluster.nodes[child_node].resume();

    assert!(
        eventually(WAIT, || {
            let status = child_status(parent, "feed", "feed-copy");
            status["dropped_messages"].as_u64().unwrap_or(0) > 0 && status["lag_messages"] == 0
        }),
        "the copy caught up: {}",
        child_status(parent, "feed", "feed-copy")
    );
    let dropped = child_status(parent, "feed", "feed-copy")["dropped_messages"]
        .as_u64()
        .unwrap_or(0);
    assert_eq!(
        metric(
            parent,
            r#"narad_fanout_child_dropped_messages{parent="feed",child="feed-copy"}"#
        ) as u64,
        dropped
    );
    assert!(parent
        .stderr()
        .contains("a child fell behind its parent's retention"));
    // Everything not counted as dropped reached the child.
    let delivered = support::consume_all(&cluster.nodes[child_node], "feed-copy");
    assert!(
        delivered.len() as u64 + dropped >= produced.len() as u64,
        "{} delivered + {dropped} dropped < {} produced",
        delivered.len(),
        produced.len()
    );
}

#[test]
fn the_cli_creates_lists_describes_and_deletes_children_and_redrives() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    let (ok, out, err) = narad(
        &node,
        &[
            "topic",
            "create",
            "orders",
            "--partitions",
            "2",
            "--retention-ms",
            "0",
        ],
    );
    assert!(ok, "{out}{err}");
    let (ok, out, err) = narad(
        &node,
        &[
            "child",
            "create",
            "orders",
            "orders.late",
            "--kind",
            "delay",
            "--delay-ms",
            "60000",
        ],
    );
    assert!(
        ok && out.contains("created delay child orders.late of orders"),
        "{out}{err}"
    );
    let (ok, out, err) = narad(
        &node,
        &["child", "create", "orders", "x", "--kind", "delay"],
    );
    assert!(!ok && err.contains("delay_ms"), "{out}{err}");
    let (ok, out, err) = narad(&node, &["topic", "children", "orders"]);
    assert!(ok, "{err}");
    let row = out
        .lines()
        .find(|l| l.starts_with("orders.late"))
        .unwrap_or_default();
    assert!(row.contains("delay") && row.contains("copying"), "{out}");
    let (ok, out, _) = narad(&node, &["topic", "describe", "orders"]);
    assert!(
        ok && out.contains("orders.late"),
        "describe lists the children: {out}"
    );
    let (ok, out, _) = narad(&node, &["topic", "describe", "orders.late"]);
    assert!(ok && out.contains("parent: orders"), "{out}");
    let (ok, out, _) = narad(&node, &["child", "list", "orders", "--output", "json"]);
    let listed: Value = serde_json::from_str(&out).expect("json");
    assert!(ok && listed["children"][0]["delay_ms"] == 60_000, "{out}");
    let (ok, out, err) = narad(&node, &["child", "delete", "orders", "orders.late"]);
    assert!(ok && out.contains("stays"), "{out}{err}");

    node.create_topic("work", json!({"partitions": 1}));
    node.create_topic("work-dlq", json!({"partitions": 1}));
    for i in 0..5 {
        node.produce("work-dlq", &format!("d{i}"));
    }
    let (ok, out, err) = narad(
        &node,
        &[
            "dlq",
            "redrive",
            "work-dlq",
            "--to",
            "work",
            "--rate-per-s",
            "100",
        ],
    );
    assert!(ok && out.contains("started"), "{out}{err}");
    assert!(eventually(WAIT, || {
        let (_, out, _) = narad(&node, &["dlq", "tasks", "work-dlq"]);
        out.lines().any(|l| l.contains(" done "))
    }));
    let (ok, _, err) = narad(&node, &["dlq", "cancel", "work-dlq", "nope"]);
    assert!(!ok && err.contains("not_found"), "{err}");
}

/// A graceful stop stores every copy's cursor: a rolling restart copies
/// nothing twice (a child's consumers would get acked messages again).
#[test]
fn a_graceful_restart_copies_nothing_twice() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut node = Node::start(&tmp.path().join("n"), &["--shards", "2"]);
    node.create_topic("orders", json!({"partitions": 4}));
    let (status, answer) = put_child(&node, "orders", "audit", json!({"kind": "fanout"}));
    assert_eq!(status, 201, "{answer}");
    let produced: BTreeSet<String> = (0..300)
        .map(|i| node.produce("orders", &format!("m{i}")))
        .collect();
    // Copied (the cursor may not be stored yet), then stopped at once.
    assert!(eventually(WAIT, || child_status(&node, "orders", "audit")
        ["lag_messages"]
        == 0));
    node.terminate();
    node.restart();
    let more: BTreeSet<String> = (0..10)
        .map(|i| node.produce("orders", &format!("after-{i}")))
        .collect();
    let all: BTreeSet<String> = produced.union(&more).cloned().collect();
    let delivered = support::consume_all(&node, "audit");
    let twice: Vec<&String> = delivered
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| id)
        .collect();
    assert!(
        twice.is_empty(),
        "{} messages copied twice, e.g. {:?}",
        twice.len(),
        twice.first()
    );
    assert!(all.iter().all(|id| delivered.contains_key(id)));
}
