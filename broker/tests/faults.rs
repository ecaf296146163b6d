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

/// libfaketime, which moves a process's wall clock (and only it) as a
/// file says; `None` where it is missing (`ops/install-check-tools.sh`
/// installs it; required where `NARAD_OPS_CHECKS=required`).
fn faketime_library() -> Option<&'static str> {
    const LIBRARY: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
    if std::path::Path::new(LIBRARY).exists() {
        return Some(LIBRARY);
    }
    assert!(
        std::env::var("NARAD_OPS_CHECKS").map_or(true, |v| v != "required"),
        "libfaketime is missing: run ops/install-check-tools.sh"
    );
    eprintln!("skipped: libfaketime is not installed (ops/install-check-tools.sh)");
    None
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Steps the node's wall clock to `offset_s` from the real one and waits
/// until the node's new messages carry the stepped time.
fn step_wall_clock(node: &Node, file: &std::path::Path, offset_s: i64) {
    std::fs::write(file, format!("{offset_s:+}\n")).expect("faketime file");
    let stepped = eventually(WAIT, || {
        produce_one(node, "clock", "probe");
        let got = node.consume("clock", json!({"max_messages": 10, "wait_ms": 100}));
        support::ack_batch(node, "clock", &got);
        got.iter().any(|m| {
            let at = m["produced_at_ms"].as_i64().unwrap_or(0);
            let off = at - wall_ms() as i64;
            (off - offset_s * 1_000).abs() < 60_000
        })
    });
    assert!(
        stepped,
        "the node's wall clock did not step to {offset_s:+} s"
    );
}

/// A step of a node's wall clock (as NTP steps it) neither ends leases
/// early nor holds them longer: a lease lapses one visibility timeout
/// after it was taken, on the monotonic clock. Before, 10 minutes forward
/// redelivered held messages at once (their acks answered 410), and 10
/// minutes back held 5 s leases for 10 minutes.
#[test]
fn a_stepped_wall_clock_changes_no_lease() {
    let Some(library) = faketime_library() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let file = tmp.path().join("faketime");
    std::fs::write(&file, "+0\n").expect("faketime file");
    let launcher = vec![
        "env".to_string(),
        format!("LD_PRELOAD={library}"),
        format!("FAKETIME_TIMESTAMP_FILE={}", file.display()),
        "FAKETIME_DONT_FAKE_MONOTONIC=1".to_string(),
        "FAKETIME_CACHE_DURATION=1".to_string(),
    ];
    let node = Node::start_by(&tmp.path().join("n"), &[], launcher);
    node.create_topic("clock", json!({"partitions": 1}));
    node.create_topic(
        "held",
        json!({"partitions": 2, "visibility_timeout_ms": 20_000}),
    );
    node.create_topic(
        "short",
        json!({"partitions": 2, "visibility_timeout_ms": 5_000}),
    );
    for i in 0..60 {
        assert_eq!(produce_one(&node, "held", &format!("h{i}")).0, 202);
    }
    let leased = node.consume("held", json!({"max_messages": 100, "wait_ms": 1000}));
    assert_eq!(leased.len(), 60);
    let taken = std::time::Instant::now();

    // Ten minutes forward: every lease is still held, and its ack lands.
    step_wall_clock(&node, &file, 600);
    let again = node.consume("held", json!({"max_messages": 100, "wait_ms": 0}));
    let acked = support::ack_batch(&node, "held", &leased);
    assert!(
        taken.elapsed() < Duration::from_secs(15),
        "the step took {:?}: too long to judge 20 s leases",
        taken.elapsed()
    );
    assert!(
        again.is_empty(),
        "{} of 60 leased messages delivered again after a forward step",
        again.len()
    );
    assert!(
        acked.iter().all(|s| *s == 204),
        "acks after the step: {acked:?}"
    );

    // Ten minutes back (twenty from where it was): 5 s leases lapse in 5 s.
    for i in 0..30 {
        assert_eq!(produce_one(&node, "short", &format!("s{i}")).0, 202);
    }
    let leased = node.consume("short", json!({"max_messages": 100, "wait_ms": 1000}));
    assert_eq!(leased.len(), 30);
    let taken = std::time::Instant::now();
    step_wall_clock(&node, &file, -600);
    let mut back = BTreeSet::new();
    let lapsed = eventually(WAIT, || {
        for m in node.consume("short", json!({"max_messages": 100, "wait_ms": 500})) {
            back.insert(m["value"].as_str().unwrap_or("").to_string());
        }
        back.len() == 30
    });
    assert!(
        lapsed,
        "{} of 30 leases of 5 s lapsed within 30 s after a backward step",
        back.len()
    );
    assert!(
        taken.elapsed() >= Duration::from_millis(4_900),
        "not before their end"
    );
}
