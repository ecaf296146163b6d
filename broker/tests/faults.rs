//! Process tests of the fault switch (`testing.faults`): a failing WAL disk,
//! power cuts, and a deliberately broken build that the checks must catch.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;
use support::{consume_all, eventually, Node, Producers};

const WAIT: Duration = Duration::from_secs(30);

fn produce_one(node: &Node, topic: &str, body: &str) -> (u16, serde_json::Value) {
    node.request(
        "POST",
        &format!("/v1/topics/{topic}/messages"),
        body.as_bytes(),
    )
}

#[test]
fn a_failing_wal_answers_500_until_restart_and_keeps_what_it_accepted() {
    let tmp = tempfile::tempdir().expect("tmp");
    // Two shards: a failed WAL fails the whole node, not only its shard.
    let mut node = Node::start(
        &tmp.path().join("n"),
        &["--set", "testing.faults=switchable", "--shards", "2"],
    );
    node.create_topic("t", json!({"partitions": 2}));
    let mut accepted = BTreeSet::new();
    for i in 0..30 {
        let (status, answer) = produce_one(&node, "t", &format!("before-{i}"));
        assert_eq!(status, 202, "{answer}");
        accepted.insert(answer["id"].as_str().expect("id").to_string());
    }

    node.set_faults("wal_write_fails");
    let (status, answer) = produce_one(&node, "t", "during");
    assert_eq!(status, 500, "{answer}");
    assert_eq!(answer["error"]["code"], "wal_failed", "{answer}");
    let (status, answer) = node.request("GET", "/readyz", b"");
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "wal_failed", "{answer}");
    let (_, _, metrics) = support::raw_request(&node.addr, "GET", "/metrics", &[], b"");
    assert!(
        String::from_utf8_lossy(&metrics).contains("\nnarad_ingress_wal_failed 1"),
        "narad_ingress_wal_failed is 1"
    );

    // Lifting the fault does not revive the WAL: only a restart does. Every
    // shard answers 500, also one whose own ring wrote nothing meanwhile
    // (fresh connections land on either shard).
    node.set_faults("");
    for i in 0..20 {
        let (status, answer) = produce_one(&node, "t", &format!("after-lift-{i}"));
        assert_eq!(status, 500, "produce {i} after the failure: {answer}");
    }
    assert_eq!(node.request("GET", "/healthz", b"").0, 200, "still alive");

    node.kill();
    node.restart();
    assert!(eventually(WAIT, || node.request("GET", "/readyz", b"").0 == 200));
    let (status, answer) = produce_one(&node, "t", "after-restart");
    assert_eq!(status, 202, "{answer}");
    accepted.insert(answer["id"].as_str().expect("id").to_string());
    let seen = consume_all(&node, "t");
    let missing: Vec<_> = accepted
        .iter()
        .filter(|id| !seen.contains_key(*id))
        .collect();
    assert!(
        missing.is_empty(),
        "accepted before the failure, never delivered: {missing:?}"
    );
}

/// Producers on every shard, then a power cut: what was not fsynced is gone.
fn power_cut_under_load(node: &mut Node, topic: &str) -> BTreeSet<String> {
    let producers = Producers::start(&node.addr, topic, 8);
    assert!(
        eventually(WAIT, || producers.accepted_count() >= 400),
        "producers made progress"
    );
    node.kill();
    producers.finish()
}

#[test]
fn a_power_cut_under_load_loses_no_accepted_message() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut node = Node::start(
        &tmp.path().join("n"),
        &["--shards", "2", "--set", "testing.faults=power_loss"],
    );
    node.create_topic("t", json!({"partitions": 4}));
    for round in 0..2 {
        // A topic made just before the cut lives in the Raft log, which the
        // switch covers too: its 200 promised it is durable.
        let made = format!("made-before-cut-{round}");
        node.create_topic(&made, json!({"partitions": 2}));
        let accepted = power_cut_under_load(&mut node, "t");
        node.restart();
        let (status, body) = node.request("GET", &format!("/v1/topics/{made}"), b"");
        assert_eq!(
            status, 200,
            "round {round}: {made} lost to a power cut: {body}"
        );
        let seen = consume_all(&node, "t");
        let missing = accepted.iter().filter(|id| !seen.contains_key(*id)).count();
        assert_eq!(
            missing,
            0,
            "round {round}: {missing} of {} accepted messages lost to a power cut",
            accepted.len()
        );
    }
}

#[test]
fn a_build_that_skips_the_wal_fsync_is_caught_losing_accepted_messages() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut node = Node::start(
        &tmp.path().join("n"),
        &["--shards", "2", "--set", "testing.faults=power_loss"],
    );
    node.create_topic("t", json!({"partitions": 4}));
    let mut lost = 0;
    for _attempt in 0..5 {
        node.set_faults("skip_wal_sync");
        let accepted = power_cut_under_load(&mut node, "t");
        std::fs::write(node.data_dir.join("fault-control"), "").expect("lift");
        node.restart();
        let seen = consume_all(&node, "t");
        lost = accepted.iter().filter(|id| !seen.contains_key(*id)).count();
        if lost > 0 {
            break;
        }
    }
    assert!(
        lost > 0,
        "202 before a real fsync must show up as lost messages after a power cut"
    );
}

#[test]
fn acks_that_cannot_be_made_durable_answer_503_and_the_node_is_not_ready() {
    const MESSAGES: usize = 1000;
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(
        &tmp.path().join("n"),
        &["--set", "testing.faults=switchable"],
    );
    node.create_topic("t", json!({"partitions": 1}));
    let batch: Vec<_> = (0..MESSAGES)
        .map(|i| json!({"value": format!("m{i}")}))
        .collect();
    let (status, answer) = node.json(
        "POST",
        "/v1/topics/t/messages/batch",
        json!({ "messages": batch }),
    );
    assert_eq!(status, 202, "{answer}");
    let mut messages = Vec::new();
    assert!(eventually(WAIT, || {
        messages.extend(node.consume("t", json!({"max_messages": 500, "wait_ms": 500})));
        messages.len() == MESSAGES
    }));
    node.set_faults("ack_write_fails");
    // Acks are written about every 100 ms: acking one message per poll
    // (every few ms), an ack is refused once a write failed, and from then
    // on none of the partition is answered 204.
    let mut next = messages.iter();
    let mut refused = None;
    eventually(WAIT, || {
        let Some(message) = next.next() else {
            return true;
        };
        let (status, answer) = node.json(
            "POST",
            "/v1/topics/t/ack",
            json!({"receipt": message["receipt"]}),
        );
        if status != 204 {
            refused = Some((status, answer));
        }
        refused.is_some()
    });
    let (status, answer) = refused.expect("every ack answered 204 while none could be written");
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "ack_state_failed", "{answer}");
    let (status, answer) = node.request("GET", "/readyz", b"");
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (503, Some("ack_state_failed")),
        "{answer}"
    );
    assert_eq!(support::metric(&node, "narad_consumer_state_failed"), 1.0);
    let (status, _) = node.json(
        "POST",
        "/v1/topics/t/ack",
        json!({"receipt": messages[MESSAGES - 1]["receipt"]}),
    );
    assert_eq!(status, 503, "the last message's ack did not land either");
}
