//! Cross-node consume on an otherwise idle machine (its own test binary, so
//! that no other cluster's load runs beside it): one consume on a node that
//! owns none of the messages returns up to 100 of them, receipts settle at
//! the owner from any node, and a long poll parked on a third node wakes
//! within milliseconds of a produce on the owner.

mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::cluster::Cluster;
use support::{ack_batch, eventually, metric, try_request};

const WAIT: Duration = Duration::from_secs(30);
/// The issue's bound on a long poll woken by a produce on another node.
const CROSS_NODE_WAKE_BOUND: Duration = Duration::from_millis(50);

fn high_watermark(cluster: &Cluster, topic: &str, partition: usize) -> u64 {
    cluster.describe(0, topic)["partition_stats"][partition]["high_watermark"]
        .as_u64()
        .unwrap_or(0)
}

#[test]
fn consumes_lease_from_other_nodes_and_long_polls_wake_within_milliseconds() {
    let cluster = Cluster::start(3);
    cluster.wait_ready(WAIT);
    cluster.nodes[0].create_topic("solo", json!({"partitions": 1}));
    let owner = cluster.owners("solo")[0];
    let (near, far) = ((owner + 1) % 3, (owner + 2) % 3);

    // 150 messages on the owner; one consume of 100 on another node.
    let messages: Vec<Value> = (0..150)
        .map(|i| json!({"value": format!("m{i}")}))
        .collect();
    let (status, answer) = cluster.nodes[owner].json(
        "POST",
        "/v1/topics/solo/messages/batch",
        json!({ "messages": messages }),
    );
    assert_eq!(status, 202, "{answer}");
    assert!(eventually(WAIT, || high_watermark(&cluster, "solo", 0) == 150));
    let got = cluster.nodes[near].consume("solo", json!({"max_messages": 100}));
    assert_eq!(got.len(), 100, "one consume on another node");
    assert!(got.iter().all(|m| m["partition"] == 0));
    // Receipts are settled at the owner, whichever node they are sent to.
    assert!(ack_batch(&cluster.nodes[far], "solo", &got)
        .iter()
        .all(|s| *s == 204));
    let rest = cluster.nodes[far].consume("solo", json!({"max_messages": 100}));
    assert_eq!(rest.len(), 50);
    assert!(ack_batch(&cluster.nodes[near], "solo", &rest)
        .iter()
        .all(|s| *s == 204));

    // A long poll parked on a third node wakes when the owner stores a
    // message.
    let mut wakes = Vec::new();
    for round in 0..5 {
        let addr = cluster.nodes[far].addr.clone();
        let poll = std::thread::spawn(move || {
            let answer = try_request(
                &addr,
                "POST",
                "/v1/topics/solo/consume",
                br#"{"wait_ms": 10000}"#,
                Duration::from_secs(15),
            );
            (Instant::now(), answer)
        });
        assert!(
            eventually(WAIT, || metric(
                &cluster.nodes[far],
                "narad_consume_long_polls_waiting"
            ) >= 1.0),
            "the long poll parks"
        );
        let sent = Instant::now();
        let (status, _) = cluster.nodes[owner].request(
            "POST",
            "/v1/topics/solo/messages",
            format!("wake-{round}").as_bytes(),
        );
        assert_eq!(status, 202);
        let (returned, answer) = poll.join().expect("poll");
        let (status, body) = answer.expect("answered");
        assert_eq!(status, 200);
        let got = body["messages"].as_array().cloned().unwrap_or_default();
        assert_eq!(got.len(), 1, "{body}");
        ack_batch(&cluster.nodes[owner], "solo", &got);
        wakes.push(returned.duration_since(sent));
    }
    wakes.sort();
    let median = wakes[wakes.len() / 2];
    eprintln!("cross-node long-poll wake after a produce: {wakes:?}");
    assert!(
        median <= CROSS_NODE_WAKE_BOUND,
        "median wake {median:?} (all: {wakes:?})"
    );
}
