//! The 202 promise against clients and operators that misbehave: clients
//! that hang up mid-request, a second process on one folder or port, and
//! messages that run out of deliveries by nacks.

mod support;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::{eventually, Node};

const WAIT: Duration = Duration::from_secs(30);

/// Sends a whole produce and hangs up without reading the answer: the
/// node reads the request, then finds its client gone.
fn produce_and_vanish(addr: &str, topic: &str, body: &[u8]) {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return;
    };
    let head = format!(
        "POST /v1/topics/{topic}/messages HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let _ = stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body));
    let _ = stream.shutdown(Shutdown::Both);
}

/// Consumes until every id of `wanted` was delivered, acking each message
/// as it comes; returns every id delivered.
fn consume_and_ack_until(node: &Node, topic: &str, wanted: &BTreeSet<String>) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let all = eventually(WAIT * 2, || {
        let messages = node.consume(topic, json!({"max_messages": 500, "wait_ms": 200}));
        if !messages.is_empty() {
            let statuses = support::ack_batch(node, topic, &messages);
            assert!(statuses.iter().all(|s| *s == 204), "acks: {statuses:?}");
        }
        for message in &messages {
            if let Some(id) = message["id"].as_str() {
                seen.insert(id.to_string());
            }
        }
        wanted.is_subset(&seen)
    });
    assert!(
        all,
        "{} of {} answered messages delivered",
        wanted.intersection(&seen).count(),
        wanted.len()
    );
    seen
}

#[test]
fn clients_that_hang_up_mid_produce_neither_jam_the_ring_nor_bring_acked_messages_back() {
    let tmp = tempfile::tempdir().expect("tmp");
    // A small ring: records that were never handed on would fill it.
    let mut node = Node::start(
        &tmp.path().join("n"),
        &["--set", "storage.wal_ring_bytes=262144"],
    );
    node.create_topic("t", json!({"partitions": 2}));
    let value = vec![b'v'; 512];
    for _ in 0..1500 {
        produce_and_vanish(&node.addr, "t", &value);
    }
    // The ring frees as the dispatcher commits: produces are taken again.
    let mut answered = BTreeSet::new();
    let taken = eventually(WAIT, || {
        let (status, answer) = node.request("POST", "/v1/topics/t/messages", b"after");
        if status == 202 {
            answered.insert(answer["id"].as_str().expect("id").to_string());
        }
        status == 202
    });
    assert!(taken, "produces still refused after the vanished clients");
    // A small ring may still say 429 (retry) while it frees space.
    for i in 0..49 {
        let mut id = None;
        let taken = eventually(WAIT, || {
            let body = format!("answered {i}");
            let (status, answer) = node.request("POST", "/v1/topics/t/messages", body.as_bytes());
            assert!(status == 202 || status == 429, "{status} {answer}");
            id = answer["id"].as_str().map(str::to_string);
            status == 202
        });
        assert!(taken, "produce {i} refused for {WAIT:?}");
        answered.extend(id);
    }
    // Consume and ack everything the vanished clients and the answered
    // ones left; a graceful restart then delivers none of it again.
    let acked = consume_and_ack_until(&node, "t", &answered);
    node.terminate();
    node.restart();
    let again = node.consume("t", json!({"max_messages": 1000, "wait_ms": 1000}));
    let repeated: Vec<&Value> = again
        .iter()
        .filter(|m| m["id"].as_str().is_some_and(|id| acked.contains(id)))
        .collect();
    assert!(
        repeated.is_empty(),
        "{} acked messages delivered again after a graceful restart (of {} acked)",
        repeated.len(),
        acked.len()
    );
}

#[test]
fn a_nack_of_the_last_allowed_delivery_moves_the_message_to_the_dead_letter_topic() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(
        &tmp.path().join("n"),
        &["--set", "leases.sweep_interval_ms=100"],
    );
    node.create_topic("dead", json!({"partitions": 1}));
    node.create_topic(
        "work",
        json!({"partitions": 1, "max_deliveries": 2, "dead_letter_topic": "dead"}),
    );
    let id = node.produce("work", "poison");
    for delivery in 1..=2 {
        let got = node.consume("work", json!({"wait_ms": 5000}));
        assert_eq!(got.len(), 1, "delivery {delivery}");
        assert_eq!(got[0]["delivery_count"], delivery);
        let (status, answer) = node.json(
            "POST",
            "/v1/topics/work/nack",
            json!({"receipt": got[0]["receipt"]}),
        );
        assert_eq!(status, 204, "{answer}");
    }
    let third = node.consume("work", json!({"wait_ms": 1000}));
    assert!(
        third.is_empty(),
        "delivered more than max_deliveries times: {third:?}"
    );
    let mut dead = Vec::new();
    assert!(eventually(WAIT, || {
        dead = node.consume("dead", json!({"wait_ms": 500}));
        !dead.is_empty()
    }));
    assert_eq!(dead[0]["id"], id.as_str());
}

fn narad(data_dir: &std::path::Path, listen: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_narad"));
    command
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen", listen, "--shards", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// Runs `command` until it exits or [`WAIT`] passes (then kills it);
/// returns whether it exited with a failure by itself, and its stderr.
fn run_briefly(mut command: Command) -> (bool, String) {
    let mut child = command.spawn().expect("spawn");
    let mut status = None;
    eventually(WAIT, || {
        status = child.try_wait().ok().flatten();
        status.is_some()
    });
    if status.is_none() {
        let _ = child.kill();
    }
    let output = child.wait_with_output().expect("wait");
    let failed = status.is_some_and(|s| !s.success());
    (failed, String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn a_second_process_on_the_same_folder_or_port_is_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("n");
    let node = Node::start(&dir, &[]);
    node.create_topic("t", json!({"partitions": 1}));

    let (exited, stderr) = run_briefly(narad(&dir, "127.0.0.1:0"));
    assert!(exited, "a second process on one folder started: {stderr}");
    assert!(
        stderr.contains(&dir.display().to_string()) && stderr.contains("in use"),
        "names the folder and says it is in use: {stderr}"
    );

    let (exited, stderr) = run_briefly(narad(&tmp.path().join("other"), &node.addr));
    assert!(exited, "a second process on one port started: {stderr}");
    assert!(stderr.contains(&node.addr), "names the port: {stderr}");

    // The first node still serves.
    node.produce("t", "still here");
}

/// Reads what the node answers on `stream` until it closes the connection
/// or `WAIT` passes; the status, if any.
fn read_status(stream: &mut TcpStream) -> Option<u16> {
    use std::io::Read;
    stream.set_read_timeout(Some(WAIT)).ok()?;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    text.split(' ').nth(1)?.parse().ok()
}

#[test]
fn connections_and_buffered_bodies_are_bounded_node_wide() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(
        &tmp.path().join("n"),
        &[
            "--set",
            "http.max_connections=4",
            "--set",
            "http.max_batch_bytes=1024",
            "--set",
            "http.max_buffered_body_bytes=100000",
        ],
    );
    node.create_topic("t", json!({"partitions": 1}));
    // A body promised and not sent holds its share of the budget.
    let mut slow = TcpStream::connect(&node.addr).expect("connect");
    slow.write_all(
        b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: t\r\nContent-Length: 60000\r\n\r\npartial",
    )
    .expect("send");
    assert!(eventually(WAIT, || support::metric(
        &node,
        "narad_http_buffered_body_bytes"
    ) >= 60000.0));
    let big = vec![b'x'; 60000];
    let (status, answer) = node.request("POST", "/v1/topics/t/messages", &big);
    // (The refused request read nothing, so its connection closes.)
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (429, Some("overloaded")),
        "{answer}"
    );
    drop(slow);
    assert!(eventually(WAIT, || {
        node.request("POST", "/v1/topics/t/messages", b"small").0 == 202
    }));
    assert!(eventually(WAIT, || support::metric(
        &node,
        "narad_http_buffered_body_bytes"
    ) == 0.0));

    // Idle clients hold connections; past the bound new ones are refused,
    // and a connection given back makes room.
    let idle: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(&node.addr).expect("connect"))
        .collect();
    // (A metrics request would need a fifth connection of its own.)
    let mut extra = TcpStream::connect(&node.addr).expect("connect");
    let _ = extra.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(
        read_status(&mut extra),
        Some(429),
        "a fifth connection is refused"
    );
    drop(idle);
    assert!(eventually(WAIT, || node.request("GET", "/healthz", b"").0 == 200));
    assert!(eventually(WAIT, || support::metric(
        &node,
        "narad_connections_open"
    ) == 1.0));
}
