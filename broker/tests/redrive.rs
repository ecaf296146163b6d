//! Process tests of dead-letter redrive (docs/children.md, "Handle retries
//! and dead letters"): messages move at no more than the set rate, each
//! written to the target before it is acked in the dead-letter topic; a
//! cancel stops the move; a node killed mid-redrive carries on after its
//! restart, and no message ends in neither topic.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{consume_all, eventually, Node};

const WAIT: Duration = Duration::from_secs(30);

fn fill(node: &Node, dlq: &str, count: usize) -> BTreeSet<String> {
    (0..count)
        .map(|i| node.produce(dlq, &format!("dead-{i}")))
        .collect()
}

fn task(node: &Node, dlq: &str, id: &str) -> Value {
    let (status, answer) = node.request("GET", &format!("/v1/topics/{dlq}/redrive"), b"");
    assert_eq!(status, 200, "{answer}");
    answer["tasks"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["id"] == id).cloned())
        .unwrap_or_else(|| panic!("no task {id} in {answer}"))
}

fn start(node: &Node, dlq: &str, body: Value) -> String {
    let (status, answer) = node.json("POST", &format!("/v1/topics/{dlq}/redrive"), body);
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["state"], "running");
    answer["id"].as_str().expect("id").to_string()
}

#[test]
fn a_redrive_moves_every_message_at_no_more_than_its_rate() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &["--shards", "2"]);
    node.create_topic("work", json!({"partitions": 2}));
    node.create_topic("work-dlq", json!({"partitions": 2}));
    let dead = fill(&node, "work-dlq", 30);

    // Bad requests, each named.
    for (body, status) in [
        (json!({}), 400),
        (json!({"to": "work-dlq"}), 400),
        (json!({"to": "nowhere"}), 400),
        (json!({"to": "work", "rate_per_s": 0}), 400),
        (json!({"to": "work", "colour": "red"}), 400),
    ] {
        let (got, answer) = node.json("POST", "/v1/topics/work-dlq/redrive", body.clone());
        assert_eq!(got, status, "{body}: {answer}");
    }
    let (status, answer) = node.json("POST", "/v1/topics/missing/redrive", json!({"to": "work"}));
    assert_eq!(status, 404, "{answer}");
    let (status, answer) = node.request("DELETE", "/v1/topics/work-dlq/redrive/nope", b"");
    assert_eq!(status, 404, "{answer}");

    // 10 a second: a second's worth at once, then the rest over 2 s.
    let started = Instant::now();
    let id = start(&node, "work-dlq", json!({"to": "work", "rate_per_s": 10}));
    assert!(eventually(WAIT, || task(&node, "work-dlq", &id)["state"] == "done"));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1_900),
        "30 messages at 10/s took only {took:?}"
    );
    let done = task(&node, "work-dlq", &id);
    assert_eq!(
        (done["moved"].clone(), done["remaining"].clone()),
        (json!(30), json!(0))
    );
    // Every one is in the target, with its id; none is left behind.
    let moved = consume_all(&node, "work");
    let ids: BTreeSet<String> = moved.keys().cloned().collect();
    assert_eq!(ids, dead);
    assert!(consume_all(&node, "work-dlq").is_empty());

    // max_messages stops it early.
    let more = fill(&node, "work-dlq", 10);
    let id = start(&node, "work-dlq", json!({"to": "work", "max_messages": 4}));
    assert!(eventually(WAIT, || task(&node, "work-dlq", &id)["state"] == "done"));
    assert_eq!(task(&node, "work-dlq", &id)["moved"], 4);
    let left = consume_all(&node, "work-dlq");
    let arrived = consume_all(&node, "work");
    assert_eq!((left.len(), arrived.len()), (6, 4));
    let both: BTreeSet<String> = left.keys().chain(arrived.keys()).cloned().collect();
    assert_eq!(both, more);
}

#[test]
fn a_cancelled_redrive_stops_and_a_killed_one_carries_on_losing_nothing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic("work", json!({"partitions": 2}));
    node.create_topic("work-dlq", json!({"partitions": 2}));
    let dead = fill(&node, "work-dlq", 30);

    let id = start(&node, "work-dlq", json!({"to": "work", "rate_per_s": 4}));
    assert!(eventually(WAIT, || {
        task(&node, "work-dlq", &id)["moved"].as_u64().unwrap_or(0) >= 4
    }));
    let (status, answer) =
        node.request("DELETE", &format!("/v1/topics/work-dlq/redrive/{id}"), b"");
    assert_eq!(status, 204, "{answer}");
    assert_eq!(task(&node, "work-dlq", &id)["state"], "cancelled");
    // Cancelled well before the end: most messages stay where they were,
    // and every message is in one topic or the other.
    let left = consume_all(&node, "work-dlq");
    let arrived = consume_all(&node, "work");
    assert!(
        !left.is_empty() && arrived.len() < 30,
        "{} moved",
        arrived.len()
    );
    let both: BTreeSet<String> = left.keys().chain(arrived.keys()).cloned().collect();
    assert_eq!(both, dead);

    // Killed mid-redrive: the node carries the task on after its restart.
    let dead = fill(&node, "work-dlq", 100);
    let id = start(&node, "work-dlq", json!({"to": "work", "rate_per_s": 40}));
    assert!(eventually(WAIT, || {
        task(&node, "work-dlq", &id)["moved"].as_u64().unwrap_or(0) >= 20
    }));
    node.kill();
    node.restart();
    assert!(
        eventually(WAIT * 2, || task(&node, "work-dlq", &id)["state"] == "done"),
        "{}",
        task(&node, "work-dlq", &id)
    );
    let arrived = consume_all(&node, "work");
    let missing = dead.iter().filter(|id| !arrived.contains_key(*id)).count();
    assert_eq!(missing, 0, "messages in neither topic after the kill");
}

/// A message dead-lettered and redriven back where it came from is
/// delivered there again, and dead-lettered again if it fails again: the
/// topics' owners take it in each time although they saw its id before.
#[test]
fn a_message_redriven_back_to_its_topic_is_delivered_there_again() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic("work-dlq", json!({"partitions": 1}));
    node.create_topic(
        "work",
        json!({"partitions": 1, "max_deliveries": 1, "dead_letter_topic": "work-dlq"}),
    );
    let id = node.produce("work", "poison");
    for round in 0..2 {
        // Its one delivery fails: it moves to the dead-letter topic.
        let got = node.consume("work", json!({"max_messages": 1, "wait_ms": 5000}));
        assert_eq!(got.len(), 1, "round {round}: delivered in work");
        assert_eq!(got[0]["id"], id.as_str());
        let receipt = got[0]["receipt"].as_str().expect("receipt");
        let (status, answer) = node.json(
            "POST",
            "/v1/topics/work/nack",
            json!({ "receipt": receipt }),
        );
        assert_eq!(status, 204, "{answer}");
        assert!(
            eventually(WAIT, || {
                let (_, dlq) = node.request("GET", "/v1/topics/work-dlq", b"");
                dlq["partition_stats"][0]["available"] == 1
            }),
            "round {round}: dead-lettered"
        );
        let task = start(&node, "work-dlq", json!({"to": "work"}));
        assert!(eventually(WAIT, || task_done(&node, &task)));
    }
    let back = node.consume("work", json!({"max_messages": 1, "wait_ms": 5000}));
    assert_eq!(back.len(), 1, "redriven twice, delivered a third time");
    assert_eq!(back[0]["id"], id.as_str());
}

fn task_done(node: &Node, id: &str) -> bool {
    task(node, "work-dlq", id)["state"] == "done"
}
