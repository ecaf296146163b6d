//! Process tests of one `narad` node: the data plane and topic admin of
//! docs/http-api.md, crashes and graceful stops, and bad input.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{eventually, raw_request, Node};

const WAIT: Duration = Duration::from_secs(30);

fn ids_of(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .map(|m| m["id"].as_str().expect("id").to_string())
        .collect()
}

fn ack_all(node: &Node, topic: &str, messages: &[Value]) {
    if messages.is_empty() {
        return;
    }
    let receipts: Vec<&str> = messages
        .iter()
        .map(|m| m["receipt"].as_str().expect("receipt"))
        .collect();
    let (status, answer) = node.json(
        "POST",
        &format!("/v1/topics/{topic}/ack/batch"),
        json!({ "receipts": receipts }),
    );
    assert_eq!(status, 200, "{answer}");
    for result in answer["results"].as_array().expect("results") {
        assert_eq!(result["status"], 204, "{result}");
    }
}

/// Consumes and acks until `expected` ids were seen; fails on a duplicate.
fn drain(node: &Node, topic: &str, expected: &BTreeSet<String>) -> BTreeMap<String, u64> {
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    let done = eventually(WAIT, || {
        let messages = node.consume(topic, json!({"max_messages": 1000, "wait_ms": 500}));
        for id in ids_of(&messages) {
            *seen.entry(id).or_insert(0) += 1;
        }
        ack_all(node, topic, &messages);
        expected.iter().all(|id| seen.contains_key(id))
    });
    assert!(
        done,
        "{} of {} messages consumed",
        seen.len(),
        expected.len()
    );
    seen
}

#[test]
fn thousands_of_messages_are_delivered_once_each_and_acked() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic("orders", json!({"partitions": 4}));
    let mut expected = BTreeSet::new();
    for batch in 0..20 {
        let messages: Vec<Value> = (0..100)
            .map(|i| json!({"key": format!("k{i}"), "value": format!("b{batch}-{i}")}))
            .collect();
        let answer = node.produce_batch("orders", messages);
        expected.extend(
            answer["ids"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|v| v.as_str().expect("id").to_string()),
        );
    }
    for i in 0..200 {
        let (status, answer) = node.request(
            "POST",
            "/v1/topics/orders/messages",
            format!("single-{i}").as_bytes(),
        );
        assert_eq!(status, 202, "{answer}");
        expected.insert(answer["id"].as_str().expect("id").to_string());
    }
    assert_eq!(expected.len(), 2200, "ids are unique");
    let seen = drain(&node, "orders", &expected);
    assert!(seen.values().all(|n| *n == 1), "nothing delivered twice");
    assert!(
        seen.keys().all(|id| expected.contains(id)),
        "nothing never produced"
    );
    let (_, topic) = node.request("GET", "/v1/topics/orders", b"");
    let stats = topic["partition_stats"].as_array().expect("stats");
    let total: u64 = stats
        .iter()
        .map(|s| s["high_watermark"].as_u64().expect("hw"))
        .sum();
    assert_eq!(total, 2200);
    assert!(eventually(WAIT, || {
        let (_, topic) = node.request("GET", "/v1/topics/orders", b"");
        topic["partition_stats"]
            .as_array()
            .expect("stats")
            .iter()
            .all(|s| s["available"] == 0 && s["in_flight"] == 0)
    }));
}

#[test]
fn leases_expire_nack_extend_and_late_acks_get_410() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(
        &tmp.path().join("n"),
        &["--set", "leases.sweep_interval_ms=100"],
    );
    node.create_topic("jobs", json!({"partitions": 1}));
    let produced = node.request("POST", "/v1/topics/jobs/messages", b"work");
    assert_eq!(produced.0, 202, "{produced:?}");
    let first = node.consume(
        "jobs",
        json!({"wait_ms": 5000, "visibility_timeout_ms": 300}),
    );
    assert_eq!(first[0]["delivery_count"], 1);
    let mut again = Vec::new();
    assert!(eventually(WAIT, || {
        again = node.consume(
            "jobs",
            json!({"wait_ms": 1000, "visibility_timeout_ms": 30000}),
        );
        !again.is_empty()
    }));
    assert_eq!(
        again[0]["delivery_count"], 2,
        "redelivered after the lease expired"
    );
    let (status, answer) = node.json(
        "POST",
        "/v1/topics/jobs/ack",
        json!({"receipt": first[0]["receipt"]}),
    );
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (410, Some("lease_gone")),
        "the late ack"
    );
    let (status, answer) = node.json(
        "POST",
        "/v1/topics/jobs/extend",
        json!({"receipt": again[0]["receipt"], "visibility_timeout_ms": 60000}),
    );
    assert_eq!(status, 200, "{answer}");
    assert!(answer["lease_expires_at_ms"].as_u64() > again[0]["lease_expires_at_ms"].as_u64());
    let (status, _) = node.json(
        "POST",
        "/v1/topics/jobs/nack",
        json!({"receipt": again[0]["receipt"]}),
    );
    assert_eq!(status, 204);
    let third = node.consume("jobs", json!({"wait_ms": 5000}));
    assert_eq!(
        third[0]["delivery_count"], 3,
        "a nack makes it available at once"
    );
    let (status, _) = node.json(
        "POST",
        "/v1/topics/jobs/ack",
        json!({"receipt": third[0]["receipt"]}),
    );
    assert_eq!(status, 204);
    let (status, _) = node.json(
        "POST",
        "/v1/topics/jobs/ack",
        json!({"receipt": third[0]["receipt"]}),
    );
    assert_eq!(status, 410, "a second ack of the same receipt");
}

#[test]
fn messages_out_of_deliveries_move_to_the_dead_letter_topic() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(
        &tmp.path().join("n"),
        &["--set", "leases.sweep_interval_ms=100"],
    );
    node.create_topic("dead", json!({"partitions": 1}));
    node.create_topic(
        "work",
        json!({"partitions": 1, "max_deliveries": 1, "dead_letter_topic": "dead"}),
    );
    let (_, produced) = node.request_with(
        "POST",
        "/v1/topics/work/messages",
        &[("Narad-Key", "poison")],
        b"poison",
    );
    let first = node.consume(
        "work",
        json!({"wait_ms": 5000, "visibility_timeout_ms": 200}),
    );
    assert_eq!(first.len(), 1);
    let mut dead = Vec::new();
    assert!(eventually(WAIT, || {
        dead = node.consume("dead", json!({"wait_ms": 1000}));
        !dead.is_empty()
    }));
    assert_eq!(
        dead[0]["id"], produced["id"],
        "same id in the dead-letter topic"
    );
    assert_eq!(dead[0]["value"], "poison");
    assert_eq!(dead[0]["key"], "poison");
    assert!(
        node.consume("work", json!({"wait_ms": 300})).is_empty(),
        "not redelivered on the original"
    );
    let (status, answer) = node.request("DELETE", "/v1/topics/dead", b"");
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (409, Some("conflict"))
    );
}

#[test]
fn sigkill_during_concurrent_producers_loses_no_accepted_message() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic("events", json!({"partitions": 4}));
    let accepted = Arc::new(Mutex::new(BTreeSet::new()));
    let addr = node.addr.clone();
    let producers: Vec<_> = (0..8)
        .map(|p| {
            let (accepted, addr) = (accepted.clone(), addr.clone());
            std::thread::spawn(move || {
                for i in 0..100_000 {
                    let body = format!("p{p}-{i}");
                    let Ok(result) = std::panic::catch_unwind(|| {
                        support::request(
                            &addr,
                            "POST",
                            "/v1/topics/events/messages",
                            &[],
                            body.as_bytes(),
                        )
                    }) else {
                        return;
                    };
                    match result {
                        (202, answer) => {
                            accepted
                                .lock()
                                .expect("lock")
                                .insert(answer["id"].as_str().expect("id").to_string());
                        }
                        _ => return,
                    }
                }
            })
        })
        .collect();
    assert!(
        eventually(WAIT, || accepted.lock().expect("lock").len() >= 300),
        "producers made progress"
    );
    node.kill();
    for producer in producers {
        let _ = producer.join();
    }
    let expected = accepted.lock().expect("lock").clone();
    node.restart();
    let seen = drain(&node, "events", &expected);
    assert!(
        expected.iter().all(|id| seen.contains_key(id)),
        "every 202'd message survived SIGKILL"
    );
}

#[test]
fn after_sigterm_acked_messages_stay_acked_and_leased_ones_return_at_once() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic("t", json!({"partitions": 1}));
    let batch: Vec<Value> = (0..10).map(|i| json!({"value": format!("m{i}")})).collect();
    node.json(
        "POST",
        "/v1/topics/t/messages/batch",
        json!({ "messages": batch }),
    );
    let mut got = Vec::new();
    assert!(eventually(WAIT, || {
        got.extend(node.consume("t", json!({"max_messages": 10, "wait_ms": 500})));
        got.len() >= 10
    }));
    ack_all(&node, "t", &got[..6]);
    let leased: BTreeSet<String> = ids_of(&got[6..]).into_iter().collect();
    let old_receipt = got[6]["receipt"].clone();
    node.terminate();
    node.restart();
    let again = node.consume("t", json!({"max_messages": 100, "wait_ms": 2000}));
    let again_ids: BTreeSet<String> = ids_of(&again).into_iter().collect();
    assert_eq!(again_ids, leased, "exactly the unacked ones, at once");
    let (status, _) = node.json("POST", "/v1/topics/t/ack", json!({"receipt": old_receipt}));
    assert_eq!(
        status, 410,
        "a receipt from before the restart is gone, not invalid"
    );
}

#[test]
fn bad_input_gets_the_right_code_and_the_node_keeps_serving() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(
        &tmp.path().join("n"),
        &[
            "--set",
            "http.header_timeout_ms=500",
            "--set",
            "http.body_timeout_ms=500",
        ],
    );
    node.create_topic("a", json!({"partitions": 1, "max_message_bytes": 10}));
    node.create_topic("b", json!({"partitions": 1}));
    let code = |(status, answer): (u16, Value)| {
        (
            status,
            answer["error"]["code"].as_str().unwrap_or("").to_string(),
        )
    };
    let expect =
        |got: (u16, String), status: u16, error: &str| assert_eq!(got, (status, error.to_string()));
    expect(
        code(node.request("POST", "/v1/topics/a/consume", b"{not json")),
        400,
        "invalid_request",
    );
    expect(
        code(node.request("POST", "/v1/topics/a/messages", b"01234567890")),
        413,
        "too_large",
    );
    expect(
        code(node.request("POST", "/v1/topics/a%2Fx/messages", b"x")),
        400,
        "invalid_topic_name",
    );
    expect(
        code(node.request(
            "POST",
            "/v1/topics/missing/consume",
            br#"{"wait_ms":20000}"#,
        )),
        404,
        "topic_not_found",
    );
    expect(
        code(node.request("DELETE", "/v1/topics/a/messages", b"")),
        405,
        "method_not_allowed",
    );
    // A search needs a key or some text.
    expect(
        code(node.request("GET", "/v1/topics/a/messages", b"")),
        400,
        "invalid_request",
    );
    expect(
        code(node.request("GET", "/v1/cluster/movez", b"")),
        404,
        "not_found",
    );
    expect(
        code(node.json("POST", "/v1/cluster/nodes", json!({"id": 2}))),
        400,
        "invalid_request",
    );
    expect(
        code(node.request("POST", "/v1/cluster/nodes/x/decommission", b"")),
        400,
        "invalid_request",
    );
    expect(
        code(node.json("POST", "/v1/topics/a/consume", json!({"wait_ms": 20001}))),
        400,
        "invalid_request",
    );
    expect(
        code(node.json("POST", "/v1/topics/a/consume", json!({"partition": 1}))),
        400,
        "invalid_request",
    );
    expect(
        code(node.json("POST", "/v1/topics/a/ack", json!({"receipt": "Zm9yZ2Vk"}))),
        400,
        "invalid_receipt",
    );
    expect(
        code(node.json("PUT", "/v1/topics/c", json!({"retention_ms": 5}))),
        400,
        "invalid_request",
    );
    expect(
        code(node.json("PUT", "/v1/topics/c", json!({"colour": 5}))),
        400,
        "unknown_field",
    );
    // What an API fuzzer (schemathesis) found.
    let (status, _) = node.json(
        "PUT",
        "/v1/users/ann",
        json!({"password": "a long enough password"}),
    );
    assert_eq!(status, 201);
    expect(
        code(node.json(
            "PUT",
            "/v1/users/ann/grants",
            json!({"grants": [{"topic": "", "actions": ["admin"]}]}),
        )),
        400,
        "invalid_request",
    );
    expect(
        code(node.json(
            "PUT",
            "/v1/users/ann/grants",
            json!({"grants": [{"topic": "a", "actions": ["produce"], "colour": 1}]}),
        )),
        400,
        "unknown_field",
    );
    expect(
        code(node.json(
            "POST",
            "/v1/cluster/moves",
            json!({"topic": "a", "partition": 0, "to": 1, "colour": 1}),
        )),
        400,
        "unknown_field",
    );
    expect(
        code(node.json("POST", "/v1/topics/nope/redrive", json!({}))),
        404,
        "topic_not_found",
    );
    expect(
        code(node.json("PUT", "/v1/topics/nope/children/x", json!({}))),
        404,
        "topic_not_found",
    );
    for name in [".", ".."] {
        let (status, _, body) =
            raw_request(&node.addr, "PUT", &format!("/v1/topics/{name}"), &[], b"{}");
        let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (400, Some("invalid_topic_name")),
            "{name}"
        );
    }
    let (status, _) = node.request("PUT", "/v1/schemas/anything", b"");
    assert_eq!(status, 201, "an empty body is the empty schema, as {{}} is");
    let batch = json!({"messages": [{"value": "ok"}, {"value": "x", "value_base64": "eA=="}]});
    let (status, answer) = node.json("POST", "/v1/topics/b/messages/batch", batch);
    assert_eq!(status, 400);
    assert!(answer["error"]["message"]
        .as_str()
        .unwrap_or("")
        .contains("messages[1]"));
    // A receipt of topic b presented on topic a.
    node.request("POST", "/v1/topics/b/messages", b"x");
    let from_b = node.consume("b", json!({"wait_ms": 5000}));
    expect(
        code(node.json(
            "POST",
            "/v1/topics/a/ack",
            json!({"receipt": from_b[0]["receipt"]}),
        )),
        400,
        "invalid_receipt",
    );
    // A client that stalls in the middle of its header gets 408.
    let (status, head, _) = {
        let mut stream = std::net::TcpStream::connect(&node.addr).expect("connect");
        std::io::Write::write_all(
            &mut stream,
            b"POST /v1/topics/b/messages HTTP/1.1\r\nHost: x\r\n",
        )
        .expect("write");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        let mut response = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stream, &mut response);
        let text = String::from_utf8_lossy(&response).to_string();
        let status: u16 = text
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, text, ())
    };
    assert_eq!(status, 408, "{head}");
    // Malformed HTTP (a header line without a colon): 400 in the JSON error
    // shape, like every other error.
    let mut stream = std::net::TcpStream::connect(&node.addr).expect("connect");
    std::io::Write::write_all(
        &mut stream,
        b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n",
    )
    .expect("send");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut response = Vec::new();
    let _ = std::io::Read::read_to_end(&mut stream, &mut response);
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 400 "), "{text}");
    let body: Value =
        serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap_or_default()).expect("json");
    assert_eq!(body["error"]["code"], "invalid_request", "{text}");
    let (status, _, _) = raw_request(&node.addr, "GET", "/healthz", &[], b"");
    assert_eq!(status, 200, "still serving");
    let started = Instant::now();
    node.create_topic("quiet", json!({"partitions": 1}));
    let (status, answer) = node.json("POST", "/v1/topics/quiet/consume", json!({"wait_ms": 200}));
    assert_eq!(
        (status, answer["messages"].as_array().map(Vec::len)),
        (200, Some(0))
    );
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "a long poll waits for wait_ms"
    );
}

#[test]
fn retention_deletes_old_segments_and_the_frontier_skips_with_its_log_line() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(
        &tmp.path().join("n"),
        &[
            "--set",
            "topics.retention_floor_ms=1000",
            "--set",
            "testing.short_retention=true",
        ],
    );
    node.create_topic("short", json!({"partitions": 1, "retention_ms": 2000}));
    let dir = tmp
        .path()
        .join("n")
        .join("partitions")
        .join("short-0")
        .join("0");
    let segments = || {
        std::fs::read_dir(&dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.path().extension().is_some_and(|x| x == "seg"))
                    .count()
            })
            .unwrap_or(0)
    };
    // Keep producing (nothing is acked): segments close on age and expire.
    let line = "consumer frontier fell behind retention; skipped to oldest retained offset";
    let mut produced = 0;
    let skipped = eventually(Duration::from_secs(60), || {
        let (status, _) = node.request("POST", "/v1/topics/short/messages", b"old");
        assert_eq!(status, 202);
        produced += 1;
        // The owner opens on first commit; a GET keeps it maintained.
        node.request("GET", "/v1/topics/short", b"");
        node.stderr().contains(line)
    });
    assert!(
        skipped,
        "the frontier-skip line was logged (produced {produced})"
    );
    let (_, topic) = node.request("GET", "/v1/topics/short", b"");
    assert!(
        topic["partition_stats"][0]["frontier"].as_u64() > Some(0),
        "{topic}"
    );
    assert!(segments() >= 1, "an empty or newer segment remains");
}

#[test]
fn an_idle_partition_ages_out_after_a_restart_without_anyone_touching_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut node = Node::start(
        &tmp.path().join("n"),
        &[
            "--set",
            "topics.retention_floor_ms=1000",
            "--set",
            "testing.short_retention=true",
        ],
    );
    node.create_topic("idle", json!({"partitions": 1, "retention_ms": 1500}));
    for i in 0..5 {
        let (status, _) = node.request(
            "POST",
            "/v1/topics/idle/messages",
            format!("m{i}").as_bytes(),
        );
        assert_eq!(status, 202);
    }
    let partitions = tmp.path().join("n").join("partitions");
    let segments = || -> BTreeSet<String> {
        let Ok(topics) = std::fs::read_dir(&partitions) else {
            return BTreeSet::new();
        };
        topics
            .filter_map(Result::ok)
            .filter(|t| t.file_name().to_string_lossy().starts_with("idle-"))
            .filter_map(|t| std::fs::read_dir(t.path().join("0")).ok())
            .flatten()
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".seg"))
            .collect()
    };
    assert!(eventually(WAIT, || !segments().is_empty()));
    let before = segments();
    node.terminate();
    node.restart();
    // Nobody produces, consumes or describes: the node itself finds the
    // partition and deletes its expired segment.
    assert!(
        eventually(WAIT, || segments().is_disjoint(&before)),
        "segments {before:?} still there: {:?}",
        segments()
    );
}

#[test]
fn topics_come_back_after_sigkill_from_the_raft_log_and_snapshot() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut node = Node::start(
        &tmp.path().join("n"),
        &["--set", "raft.snapshot_after_entries=5"],
    );
    for i in 0..12 {
        node.create_topic(&format!("t{i}"), json!({"partitions": 2}));
    }
    let (status, _) = node.request("DELETE", "/v1/topics/t0", b"");
    assert_eq!(status, 204);
    assert!(
        tmp.path()
            .join("n")
            .join("raft")
            .join("snapshot.json")
            .exists(),
        "a snapshot was taken"
    );
    node.kill();
    node.restart();
    let (_, listing) = node.request("GET", "/v1/topics", b"");
    let names: BTreeSet<String> = listing["topics"]
        .as_array()
        .expect("topics")
        .iter()
        .map(|t| t["name"].as_str().expect("name").to_string())
        .collect();
    let expected: BTreeSet<String> = (1..12).map(|i| format!("t{i}")).collect();
    assert_eq!(names, expected);
    let (status, _) = node.request("GET", "/v1/topics/t0", b"");
    assert_eq!(
        status, 404,
        "a topic created again starts empty; a deleted one stays gone"
    );
}

#[test]
fn metrics_expose_the_contracts_names() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic("m", json!({"partitions": 1}));
    node.create_topic("m-dead", json!({"partitions": 1}));
    node.create_topic(
        "m-retried",
        json!({"partitions": 1, "max_deliveries": 3, "dead_letter_topic": "m-dead"}),
    );
    node.request("POST", "/v1/topics/m/messages", b"x");
    let got = node.consume("m", json!({"wait_ms": 5000}));
    ack_all(&node, "m", &got);
    let (status, head, body) = raw_request(&node.addr, "GET", "/metrics", &[], b"");
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain"),
        "{head}"
    );
    let text = String::from_utf8_lossy(&body);
    for name in [
        "narad_http_requests_total",
        "narad_http_request_seconds",
        "narad_ingress_wal_failed",
        "narad_wal_sync_seconds",
        "narad_wal_records_per_sync",
        "narad_wal_used_bytes",
        "narad_dispatcher_pending_records",
        "narad_dispatcher_reroutes_total",
        "narad_partition_high_watermark",
        "narad_partition_frontier",
        "narad_partition_available_messages",
        "narad_partition_in_flight",
        "narad_partition_oldest_unacked_age_seconds",
        "narad_acks_total",
        "narad_storage_corrupt_records_total",
        "narad_raft_is_leader",
        "narad_raft_term",
        "narad_node_alive",
        // Before their first event, too.
        "narad_moves_in_progress",
        "narad_move_copied_bytes_total",
    ] {
        assert!(text.contains(name), "/metrics lacks {name}:\n{text}");
    }
    assert!(
        text.contains("narad_dead_lettered_total{topic=\"m-retried\"} 0"),
        "a topic with a dead-letter topic has its counter before the first dead letter:\n{text}"
    );
    assert!(text.contains("narad_ingress_wal_failed 0"));
    assert!(text.contains("narad_raft_is_leader 1"));
    // Each metric has one help text, the listed one.
    for line in text.lines().filter(|l| l.starts_with("# HELP ")) {
        let mut words = line.splitn(4, ' ').skip(2);
        let (Some(name), help) = (words.next(), words.next().unwrap_or("")) else {
            panic!("a HELP line without a name: {line}");
        };
        assert!(!help.trim().is_empty(), "{name} has no help text");
        let listed = narad_broker::metric_names::help(name);
        assert_eq!(help, listed, "{name}: the help text is not the listed one");
    }
}

fn narad(node: &Node, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    use std::io::Write as _;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(args)
        .env("NARAD_URL", format!("http://{}", node.addr))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn narad");
    if let Some(mut input) = child.stdin.take() {
        input
            .write_all(stdin.unwrap_or("").as_bytes())
            .expect("stdin");
    }
    let output = child.wait_with_output().expect("narad output");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

#[test]
fn the_cli_creates_produces_consumes_and_reports_errors() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    let (ok, out, _) = narad(
        &node,
        &["topic", "create", "cli", "--partitions", "3"],
        None,
    );
    assert!(
        ok && out.contains("created topic cli (3 partitions)"),
        "{out}"
    );
    let (ok, out, _) = narad(&node, &["topic", "list"], None);
    assert!(
        ok && out.contains("cli") && out.contains("PARTITIONS"),
        "{out}"
    );
    let (ok, id, _) = narad(&node, &["produce", "cli", "from-arg", "--key", "k"], None);
    assert!(ok && id.trim().len() == 32, "{id}");
    let (ok, _, _) = narad(&node, &["produce", "cli", "-"], Some("from-stdin"));
    assert!(ok);
    let mut seen = String::new();
    assert!(eventually(WAIT, || {
        let (ok, out, _) = narad(
            &node,
            &[
                "consume",
                "cli",
                "--max",
                "10",
                "--wait-ms",
                "1000",
                "--ack",
                "--output",
                "json",
            ],
            None,
        );
        assert!(ok);
        seen.push_str(&out);
        seen.contains("from-arg") && seen.contains("from-stdin")
    }));
    let (ok, out, _) = narad(&node, &["topic", "describe", "cli"], None);
    assert!(ok && out.contains("HIGH_WATERMARK"), "{out}");
    let (ok, _, err) = narad(&node, &["topic", "delete", "missing"], None);
    assert!(
        !ok && err.contains("does not exist"),
        "a failure exits non-zero with the message: {err}"
    );
    let (ok, _, err) = narad(&node, &["produce", "bad name", "x"], None);
    assert!(!ok && err.contains("invalid_topic_name"), "{err}");
    // A value with control characters is one escaped cell of one line in
    // the table: it cannot move the cursor or colour the terminal.
    node.create_topic("raw", json!({"partitions": 1}));
    let (ok, _, err) = narad(&node, &["produce", "raw", "-"], Some("\u{1b}[31mred\nline"));
    assert!(ok, "{err}");
    let (ok, out, err) = narad(&node, &["consume", "raw", "--wait-ms", "2000"], None);
    assert!(ok, "{err}");
    assert!(!out.contains('\u{1b}'), "{out:?}");
    assert!(out.contains("\\u{1b}[31mred\\nline"), "{out:?}");
    assert_eq!(out.lines().count(), 2, "a header and one row: {out:?}");
    // The table shows each message's key, escaped as values are; a key
    // that is not ASCII or holds a control character is produced as well.
    node.create_topic("keyed", json!({"partitions": 1}));
    for key in ["ключ-42", "cust\u{7}42"] {
        let (ok, _, err) = narad(&node, &["produce", "keyed", "v", "--key", key], None);
        assert!(ok, "key {key:?}: {err}");
    }
    let mut keys = Vec::new();
    assert!(eventually(WAIT, || {
        let (ok, out, err) = narad(
            &node,
            &[
                "consume",
                "keyed",
                "--wait-ms",
                "1000",
                "--max",
                "10",
                "--ack",
            ],
            None,
        );
        assert!(ok, "{err}");
        let header: Vec<&str> = out
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        let key_column = header.iter().position(|c| *c == "KEY");
        assert!(
            key_column.is_some() || out.starts_with("no messages"),
            "a KEY column: {out:?}"
        );
        for line in out.lines().skip(1).filter(|l| !l.starts_with("acked")) {
            let row: Vec<&str> = line.split_whitespace().collect();
            keys.extend(key_column.and_then(|i| row.get(i)).map(|k| k.to_string()));
        }
        keys.len() >= 2
    }));
    keys.sort();
    assert_eq!(
        keys,
        vec!["cust\\u{7}42".to_string(), "ключ-42".to_string()]
    );
    // A child topic names its parent in the list.
    let (status, _) = node.json(
        "PUT",
        "/v1/topics/keyed/children/keyed-copy",
        json!({"kind": "fanout"}),
    );
    assert_eq!(status, 201);
    let (ok, out, err) = narad(&node, &["topic", "list"], None);
    assert!(ok, "{err}");
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let parent_column = header.iter().position(|c| *c == "PARENT");
    let copy_row: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with("keyed-copy"))
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        parent_column.and_then(|i| copy_row.get(i)).copied(),
        Some("keyed"),
        "{out:?}"
    );
}

#[test]
fn the_cli_produces_lines_follows_a_topic_settles_receipts_and_names_the_server() {
    use std::io::BufRead as _;
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic("lines", json!({"partitions": 2}));
    // Five lines (one empty, one CRLF) in batches of two: four messages.
    let (ok, out, err) = narad(
        &node,
        &["produce", "lines", "--lines", "--batch", "2", "--key", "k"],
        Some("one\ntwo\r\n\nthree\nfour"),
    );
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 4, "one id per message: {out}");
    // A flag out of its range is refused by name, before any request.
    for (flag, value) in [
        ("--max", "1001"),
        ("--wait-ms", "20001"),
        ("--visibility-timeout-ms", "0"),
    ] {
        let (ok, _, err) = narad(&node, &["consume", "lines", flag, value], None);
        assert!(!ok && err.contains(flag), "{flag} {value}: {err}");
    }
    let file = tmp.path().join("more.txt");
    std::fs::write(&file, "five\nsix\n").expect("write");
    let (ok, out, err) = narad(
        &node,
        &[
            "produce",
            "lines",
            "--lines",
            "--file",
            file.to_str().expect("path"),
            "--output",
            "json",
        ],
        None,
    );
    assert!(ok, "{err}");
    let ids: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(ids["ids"].as_array().map(Vec::len), Some(2), "{out}");

    // --follow prints messages as they come, one JSON object a line, and
    // acks them once printed.
    let mut follower = std::process::Command::new(env!("CARGO_BIN_EXE_narad"))
        .args([
            "consume",
            "lines",
            "--follow",
            "--ack",
            "--max",
            "10",
            "--wait-ms",
            "500",
            "--output",
            "json",
        ])
        .env("NARAD_URL", format!("http://{}", node.addr))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn narad");
    let stdout = follower.stdout.take().expect("stdout");
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut values = BTreeSet::new();
    let mut produced_late = false;
    let deadline = Instant::now() + WAIT;
    while values.len() < 7 && Instant::now() < deadline {
        if let Ok(line) = lines_rx.recv_timeout(Duration::from_millis(100)) {
            let message: Value = serde_json::from_str(&line).expect("one JSON object a line");
            assert!(message["receipt"].is_string(), "{line}");
            values.insert(message["value"].as_str().unwrap_or_default().to_string());
        }
        // A message produced while it follows arrives too.
        if values.len() == 6 && !produced_late {
            let (ok, _, _) = narad(&node, &["produce", "lines", "seven"], None);
            assert!(ok);
            produced_late = true;
        }
    }
    let expected: BTreeSet<String> = ["one", "two", "three", "four", "five", "six", "seven"]
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(values, expected);
    // Acked once printed: the follower acks what it printed last while it
    // still runs.
    let acked = eventually(WAIT, || {
        let (_, stats) = node.request("GET", "/v1/topics/lines", b"");
        stats["partition_stats"].as_array().is_some_and(|parts| {
            parts
                .iter()
                .all(|p| p["available"] == 0 && p["in_flight"] == 0)
        })
    });
    follower.kill().expect("kill");
    let _ = follower.wait();
    assert!(acked, "every followed message was acked");

    // ack, nack and extend take a receipt shown in the human output.
    let (ok, _, _) = narad(&node, &["produce", "lines", "settle-me"], None);
    assert!(ok);
    let mut receipt = String::new();
    assert!(eventually(WAIT, || {
        let (ok, out, _) = narad(&node, &["consume", "lines", "--wait-ms", "500"], None);
        assert!(ok && out.starts_with("PARTITION"), "{out}");
        if let Some(row) = out.lines().nth(1) {
            let columns: Vec<&str> = row.split_whitespace().collect();
            receipt = columns.get(4).map(ToString::to_string).unwrap_or_default();
        }
        !receipt.is_empty()
    }));
    let (ok, out, err) = narad(
        &node,
        &[
            "extend",
            "lines",
            &receipt,
            "--visibility-timeout-ms",
            "60000",
        ],
        None,
    );
    assert!(ok && out.contains("lease extended"), "{out}{err}");
    let (ok, out, err) = narad(
        &node,
        &[
            "extend",
            "lines",
            &receipt,
            "--visibility-timeout-ms",
            "60000",
            "--output",
            "json",
        ],
        None,
    );
    let answer: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
    assert!(
        ok && answer["lease_expires_at_ms"].is_u64(),
        "the API's answer: {out}{err}"
    );
    let (ok, out, err) = narad(&node, &["nack", "lines", &receipt], None);
    assert!(ok && out.contains("nacked"), "{out}{err}");
    let (ok, _, err) = narad(&node, &["ack", "lines", &receipt], None);
    assert!(
        !ok && err.contains("lease"),
        "a nacked receipt acks nothing: {err}"
    );
    let again = node.consume("lines", json!({"wait_ms": 5000}));
    assert_eq!(again.len(), 1);
    let receipt = again[0]["receipt"].as_str().expect("receipt");
    let (ok, out, err) = narad(&node, &["ack", "lines", receipt], None);
    assert!(ok && out.contains("acked"), "{out}{err}");

    // A node that does not answer: the error names it.
    let (ok, _, err) = narad(
        &node,
        &[
            "topic",
            "list",
            "--server",
            "http://127.0.0.1:1",
            "--timeout",
            "1",
        ],
        None,
    );
    assert!(!ok && err.contains("http://127.0.0.1:1"), "{err}");
    // Completions and the manual page.
    let (ok, out, _) = narad(&node, &["completions", "bash"], None);
    assert!(
        ok && out.contains("narad") && out.contains("consume"),
        "{out}"
    );
    let (ok, out, _) = narad(&node, &["man"], None);
    assert!(ok && out.contains(".TH narad 1") && out.contains("produce"));
    // Every page the main page names (narad-produce(1), ...) is written.
    let pages = tempfile::tempdir().expect("tmp");
    let dir = pages.path().to_str().expect("utf-8");
    let (ok, _, err) = narad(&node, &["man", "--dir", dir], None);
    assert!(ok, "{err}");
    for page in [
        "narad.1",
        "narad-produce.1",
        "narad-topic-create.1",
        "narad-cluster-move.1",
    ] {
        let text = std::fs::read_to_string(pages.path().join(page)).unwrap_or_default();
        assert!(
            text.starts_with(".ie") || text.contains(".TH"),
            "{page}: {text:.200}"
        );
    }
}

#[test]
fn a_node_stopped_with_clients_connected_starts_again_at_once_on_its_port() {
    use std::io::{Read as _, Write as _};
    let tmp = tempfile::tempdir().expect("tmp");
    // A port below the kernel's ephemeral range, as a configured port is:
    // once the node let go of one the kernel handed out, another test's
    // outgoing connection could take it as its own port (seen in CI: the
    // restart found the port in use).
    let (low, _) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| {
            let mut bounds = range.split_whitespace().map(|b| b.parse::<u16>());
            Some((bounds.next()?.ok()?, bounds.next()?.ok()?))
        })
        .unwrap_or((32768, 60999));
    let start = 20_000 + (std::process::id() % 5_000) as u16;
    let port = (start..low.max(start + 1))
        .chain(20_000..start)
        .find(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .expect("a free port below the ephemeral range");
    let listen = format!("127.0.0.1:{port}");
    let mut node = Node::start(&tmp.path().join("n"), &["--listen", &listen]);
    // Keep-alive clients that stay connected: the node closes their
    // connections at its stop, and those sockets linger in TIME-WAIT.
    let mut clients: Vec<std::net::TcpStream> = (0..4)
        .map(|_| {
            let mut stream = std::net::TcpStream::connect(&listen).expect("connect");
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: n\r\n\r\n")
                .expect("write");
            let mut answer = [0u8; 256];
            let read = stream.read(&mut answer).expect("an answer");
            assert!(answer[..read].starts_with(b"HTTP/1.1 200"));
            stream
        })
        .collect();
    // A second process on the port is refused while the node listens.
    let second = std::process::Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["serve", "--listen", &listen, "--peer-listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(tmp.path().join("second"))
        .output()
        .expect("run narad");
    assert!(!second.status.success());
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("in use by another process"),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    node.terminate();
    clients.clear();
    // As a rolling restart does: the same port, at once.
    node.restart();
    assert_eq!(node.addr, listen);
    let (status, _) = node.request("GET", "/healthz", b"");
    assert_eq!(status, 200);
}

#[test]
fn a_node_whose_locked_memory_limit_is_too_low_says_so_and_exits() {
    // As an unprivileged user (root's CAP_IPC_LOCK ignores the limit): only
    // root can become one here.
    // SAFETY: geteuid takes nothing and cannot fail.
    if unsafe { libc_geteuid() } != 0 {
        eprintln!("skipped: needs root to run the node as an unprivileged user");
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().to_path_buf();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .expect("chmod");
    // The binary where an unprivileged user can run it.
    let binary = dir.join("narad");
    std::fs::hard_link(env!("CARGO_BIN_EXE_narad"), &binary)
        .or_else(|_| std::fs::copy(env!("CARGO_BIN_EXE_narad"), &binary).map(|_| ()))
        .expect("the binary");
    let script = format!(
        "ulimit -l 64 && exec {} serve --data-dir {} --listen 127.0.0.1:0 --peer-listen 127.0.0.1:0 --shards 1",
        binary.display(),
        dir.join("data").display()
    );
    let mut child = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
            &script,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("setpriv");
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
    }
    assert!(
        status.is_some_and(|s| !s.success()),
        "the node exits with an error instead of hanging: {status:?} {stderr}"
    );
    assert!(
        stderr.contains("RLIMIT_MEMLOCK") && stderr.contains("ulimit -l"),
        "it names the limit and how to raise it: {stderr}"
    );
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

/// Keyless messages go round robin over the partitions of the shard that
/// took the request, whose commits need no hop to another shard: one
/// kept-alive connection to a node of two shards fills half of a topic's
/// 16 partitions, evenly; connections spread over both shards fill them
/// all.
#[test]
fn keyless_messages_go_round_robin_over_the_partitions_of_the_shard_that_took_them() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &["--shards", "2"]);
    node.create_topic("spread", json!({"partitions": 16}));
    let held = || -> Vec<u64> {
        let (status, topic) = node.request("GET", "/v1/topics/spread", b"");
        assert_eq!(status, 200, "{topic}");
        topic["partition_stats"]
            .as_array()
            .expect("partition_stats")
            .iter()
            .map(|p| p["high_watermark"].as_u64().expect("high_watermark"))
            .collect()
    };
    let client = narad_client::blocking::Client::builder(&format!("http://{}", node.addr))
        .build()
        .expect("client");
    let mut connection = client.connect().expect("a connection");
    for i in 0..48 {
        connection
            .request(
                "POST",
                "/v1/topics/spread/messages",
                &[],
                format!("m{i}").as_bytes(),
                Duration::ZERO,
            )
            .expect("202");
    }
    // A 202 comes before the commit to the partition: wait for all 48.
    assert!(
        eventually(WAIT, || held().iter().sum::<u64>() == 48),
        "committed: {:?}",
        held()
    );
    let one = held();
    let filled: Vec<u64> = one.iter().copied().filter(|c| *c > 0).collect();
    assert_eq!(
        filled,
        vec![6; 8],
        "one connection, one shard's partitions: {one:?}"
    );
    // New connections land on either shard.
    for i in 0..64 {
        node.produce("spread", &format!("n{i}"));
    }
    assert!(
        eventually(WAIT, || held().iter().sum::<u64>() == 48 + 64),
        "committed: {:?}",
        held()
    );
    let all = held();
    assert!(all.iter().all(|c| *c > 0), "every partition: {all:?}");
}

/// A message for a partition of the shard that took it is committed through
/// the owner journal: a consume sent right after its 202, without waiting,
/// gets it. After a SIGKILL every message is at the offset it was first
/// delivered at and none is stored twice.
#[test]
fn a_message_is_consumable_when_its_202_returns_and_keeps_its_offset_after_sigkill() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut node = Node::start(&tmp.path().join("n"), &["--shards", "1"]);
    node.create_topic(
        "now",
        json!({"partitions": 2, "visibility_timeout_ms": 60000}),
    );
    // The first commits open the partitions (the journal needs them open).
    let warm: BTreeSet<String> = (0..4)
        .map(|i| node.produce("now", &format!("w{i}")))
        .collect();
    drain(&node, "now", &warm);
    let mut offsets: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for i in 0..20 {
        let id = node.produce("now", &format!("m{i}"));
        let got = node.consume("now", json!({"max_messages": 10, "wait_ms": 0}));
        let ids = ids_of(&got);
        assert_eq!(
            ids,
            vec![id.clone()],
            "message {i} consumable as its 202 returned"
        );
        let first = &got[0];
        offsets.insert(
            id,
            (
                first["partition"].as_u64().expect("partition"),
                first["offset"].as_u64().expect("offset"),
            ),
        );
    }
    // Leased, not acked: after the kill they come back at the same offsets.
    node.kill();
    node.restart();
    let mut seen: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let done = eventually(WAIT, || {
        for m in node.consume("now", json!({"max_messages": 100, "wait_ms": 200})) {
            let id = m["id"].as_str().expect("id").to_string();
            // The warm-up's acks may be lost with the kill (about one
            // flush interval of them): those come back too.
            if !offsets.contains_key(&id) {
                continue;
            }
            let at = (
                m["partition"].as_u64().expect("partition"),
                m["offset"].as_u64().expect("offset"),
            );
            assert!(seen.insert(id, at).is_none(), "stored once: {m}");
        }
        seen.len() >= offsets.len()
    });
    assert!(done, "{} of {} back", seen.len(), offsets.len());
    assert_eq!(
        seen, offsets,
        "each message at the offset it had before the kill"
    );
}

/// The Rust client's coalescing producer: 400 callers at once get their
/// own ids, in fewer requests than messages; a message the topic refuses
/// fails alone while the others of its batch are stored; every message is
/// stored once.
#[test]
fn the_rust_clients_coalescing_producer_answers_each_caller_and_batches() {
    use narad_client::{Client, ConsumeRequest, Error, Producer, ProducerOptions};
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic(
        "orders",
        json!({"partitions": 4, "max_message_bytes": 2048}),
    );
    let produce_requests = || {
        let (_, _, body) = support::raw_request(&node.addr, "GET", "/metrics", &[], b"");
        String::from_utf8_lossy(&body)
            .lines()
            .filter(|l| {
                l.starts_with("narad_http_requests_total{")
                    && (l.contains("route=\"produce\"") || l.contains("route=\"produce_batch\""))
            })
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    const CALLERS: usize = 400;
    const BAD: usize = 123;
    let before = produce_requests();
    let answers = runtime.block_on(async {
        let client = Client::builder(&format!("http://{}", node.addr))
            .build()
            .expect("client");
        let options = ProducerOptions {
            lanes: 2,
            ..ProducerOptions::default()
        };
        let producer = std::sync::Arc::new(Producer::new(client, options));
        let callers: Vec<_> = (0..CALLERS)
            .map(|i| {
                let producer = producer.clone();
                tokio::spawn(async move {
                    let value = if i == BAD {
                        "x".repeat(4000)
                    } else {
                        format!("order {i}")
                    };
                    let key = (i % 3 == 0).then(|| format!("customer-{}", i % 7));
                    producer.produce("orders", key.as_deref(), value).await
                })
            })
            .collect();
        let mut answers = Vec::new();
        for caller in callers {
            answers.push(caller.await.expect("the caller"));
        }
        answers
    });
    let requests = produce_requests() - before;
    let mut ids = HashSet::new();
    for (i, answer) in answers.iter().enumerate() {
        match answer {
            Err(Error::Api { status, .. }) if i == BAD => {
                assert!(*status == 400 || *status == 413, "{answer:?}");
            }
            Ok(id) if i != BAD => assert!(ids.insert(id.clone()), "id {id} answered twice"),
            other => panic!("caller {i}: {other:?}"),
        }
    }
    assert!(
        requests < (CALLERS / 2) as f64,
        "{requests} produce requests for {CALLERS} messages"
    );
    // Every good message is there once, the bad one not at all.
    let client = Client::builder(&format!("http://{}", node.addr))
        .build()
        .expect("client");
    let request = ConsumeRequest {
        max_messages: Some(100),
        wait_ms: Some(500),
        ..ConsumeRequest::default()
    };
    let mut stored = Vec::new();
    runtime.block_on(async {
        let deadline = Instant::now() + WAIT;
        while stored.len() < CALLERS - 1 && Instant::now() < deadline {
            for delivery in client.consume("orders", &request).await.expect("consume") {
                stored.push(delivery.id.clone());
                client.ack("orders", &delivery.receipt).await.expect("ack");
            }
        }
    });
    let stored_set: HashSet<String> = stored.iter().cloned().collect();
    assert_eq!(stored.len(), CALLERS - 1, "each good message once");
    assert_eq!(stored_set, ids);
}

#[test]
fn the_rust_client_produces_consumes_settles_and_its_consumer_extends_while_it_works() {
    use narad_client::{
        Client, ConsumeRequest, Consumer, ConsumerOptions, Outcome, Outgoing, Settle,
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let client = Client::builder(&format!("http://{}", node.addr))
            .build()
            .expect("client");
        client
            .put_topic(
                "jobs",
                &json!({"partitions": 2, "visibility_timeout_ms": 1000}),
            )
            .await
            .expect("topic");
        let one = client
            .produce("jobs", Some("k"), "first")
            .await
            .expect("202");
        let batch = [
            Outgoing::new("second"),
            Outgoing::new(vec![0u8, 255, 1]).with_key("k"),
        ];
        let ids = client.produce_batch("jobs", &batch).await.expect("202");
        assert_eq!(ids.len(), 2);
        let request = ConsumeRequest {
            max_messages: Some(10),
            wait_ms: Some(2000),
            ..ConsumeRequest::default()
        };
        let mut got = Vec::new();
        let deadline = Instant::now() + WAIT;
        while got.len() < 3 && Instant::now() < deadline {
            got.extend(client.consume("jobs", &request).await.expect("consume"));
        }
        assert_eq!(got.len(), 3);
        assert!(got
            .iter()
            .any(|d| d.id == one && d.value == "first" && d.key.as_deref() == Some("k")));
        assert!(
            got.iter().any(|d| d.value.as_ref() == [0u8, 255, 1]),
            "bytes survive"
        );
        // One ack, one nack with a delay, one extend then ack in a batch.
        // The order of a consume's answer across partitions is not fixed
        // ("second" goes round robin): put them in the order produced.
        let produced = [&b"first"[..], &b"second"[..], &[0u8, 255, 1][..]];
        got.sort_by_key(|d| produced.iter().position(|p| *p == d.value.as_ref()));
        assert_eq!(got[1].value, "second");
        client.ack("jobs", &got[0].receipt).await.expect("ack");
        let gone = client.ack("jobs", &got[0].receipt).await.expect_err("410");
        assert_eq!(gone.code(), Some(narad_client::ErrorCode::LeaseGone));
        assert!(!gone.is_retryable());
        client
            .nack("jobs", &got[1].receipt, Duration::from_millis(200))
            .await
            .expect("nack");
        let until = client
            .extend("jobs", &got[2].receipt, Duration::from_secs(60))
            .await
            .expect("extend");
        assert!(until > got[2].lease_expires_at_ms);
        let settled = client
            .settle_batch("jobs", &[&got[2].receipt, &got[0].receipt], Settle::Ack)
            .await
            .expect("batch");
        assert!(settled[0].result.is_ok());
        assert!(settled[1].result.is_err(), "an acked receipt acks nothing");

        // The consumer: a handler slower than the 1 s lease keeps its
        // message (extended meanwhile), and what it says is done is acked.
        let consumer = Consumer::new(
            client.clone(),
            "jobs",
            ConsumerOptions {
                wait: Duration::from_millis(2000),
                visibility: Duration::from_millis(1000),
                ..ConsumerOptions::default()
            },
        );
        let mut handled = Vec::new();
        let deadline = Instant::now() + WAIT;
        while handled.is_empty() && Instant::now() < deadline {
            consumer
                .poll_once(&mut |delivery| {
                    handled.push(delivery.value.clone());
                    async {
                        tokio::time::sleep(Duration::from_millis(2500)).await;
                        Outcome::Done
                    }
                })
                .await
                .expect("poll");
        }
        assert_eq!(
            handled,
            vec![bytes_of("second")],
            "the nacked message, once"
        );
        let (_, stats) = node.request("GET", "/v1/topics/jobs", b"");
        let open: u64 = stats["partition_stats"]
            .as_array()
            .expect("stats")
            .iter()
            .map(|p| p["available"].as_u64().unwrap_or(0) + p["in_flight"].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(open, 0, "everything was acked once: {stats}");

        // One request acks the last turn's receipts and takes the next.
        client.produce("jobs", None, "later").await.expect("202");
        let mut got = Vec::new();
        let deadline = Instant::now() + WAIT;
        while got.is_empty() && Instant::now() < deadline {
            got = client.consume("jobs", &request).await.expect("consume");
        }
        let receipt = got[0].receipt.as_str();
        let quick = ConsumeRequest {
            wait_ms: Some(0),
            ..request.clone()
        };
        let turn = client
            .consume_acking("jobs", &[receipt], &quick)
            .await
            .expect("consume");
        assert!(turn.deliveries.is_empty());
        assert_eq!(turn.acks.len(), 1);
        assert!(turn.acks[0].result.is_ok(), "{:?}", turn.acks);
        let again = client
            .consume_acking("jobs", &[receipt], &quick)
            .await
            .expect("consume");
        let error = again.acks[0].result.clone().expect_err("acked already");
        assert_eq!(error.code, narad_client::ErrorCode::LeaseGone);
    });
}

#[test]
fn a_consume_that_accepts_the_binary_type_gets_the_same_messages_length_prefixed() {
    use narad_net::types::{parse_consume_binary, MESSAGES_MEDIA_TYPE};
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic(
        "bin",
        json!({"partitions": 1, "visibility_timeout_ms": 60_000}),
    );
    let batch = json!({"messages": [
        {"key": "k\"1", "value": "plain \"text\"\n"},
        {"value_base64": "AP+A"},
        {"key": "", "value": ""},
    ]});
    let (status, produced) = node.json("POST", "/v1/topics/bin/messages/batch", batch);
    assert_eq!(status, 202, "{produced}");
    let consume = json!({"max_messages": 10, "wait_ms": 2000}).to_string();
    let accept = [(
        "Accept",
        "application/json;q=0.5, application/vnd.narad.messages",
    )];
    let (status, head, body) = raw_request(
        &node.addr,
        "POST",
        "/v1/topics/bin/consume",
        &accept,
        consume.as_bytes(),
    );
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains(&format!("content-type: {MESSAGES_MEDIA_TYPE}")),
        "{head}"
    );
    let answer = parse_consume_binary(&bytes::Bytes::from(body)).expect("a whole answer");
    assert_eq!(answer.acks, None, "no ack list, no ack results");
    let binary = answer.messages;
    assert_eq!(binary.len(), 3);
    let ids: Vec<String> = binary.iter().map(|m| format!("{:032x}", m.id)).collect();
    assert_eq!(json!(ids), produced["ids"]);
    assert_eq!(binary[0].key.as_deref(), Some(&b"k\"1"[..]));
    assert_eq!(binary[0].value, &b"plain \"text\"\n"[..]);
    assert_eq!(binary[1].key, None);
    assert_eq!(binary[1].value, &[0u8, 0xff, 0x80][..]);
    assert_eq!(binary[2].key.as_deref(), Some(&b""[..]));
    assert!(binary[2].value.is_empty());
    // The receipts settle as JSON's do; nacked, the same messages come back
    // as JSON to a client that does not ask for the binary type.
    let receipts: Vec<&str> = binary.iter().map(|m| m.receipt.as_str()).collect();
    let (status, _) = node.json(
        "POST",
        "/v1/topics/bin/nack/batch",
        json!({"receipts": receipts}),
    );
    assert_eq!(status, 200);
    let (status, head, body) = raw_request(
        &node.addr,
        "POST",
        "/v1/topics/bin/consume",
        &[],
        consume.as_bytes(),
    );
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    let answer: Value = serde_json::from_slice(&body).expect("JSON");
    let messages = answer["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 3);
    for (json, binary) in messages.iter().zip(&binary) {
        assert_eq!(json["id"], format!("{:032x}", binary.id));
        assert_eq!(json["topic"], "bin");
        assert_eq!(json["partition"], binary.partition);
        assert_eq!(json["offset"], binary.offset);
        assert_eq!(json["produced_at_ms"], binary.produced_at_ms);
        assert_eq!(json["delivery_count"], binary.delivery_count + 1);
    }
    assert_eq!(messages[0]["key"], "k\"1");
    assert_eq!(messages[0]["value"], "plain \"text\"\n");
    assert_eq!(messages[1]["value_base64"], "AP+A");
    assert!(messages[1].get("key").is_none());
    // An error is JSON whatever the client accepts.
    let (status, head, body) =
        raw_request(&node.addr, "POST", "/v1/topics/nope/consume", &accept, b"");
    assert_eq!(status, 404);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    let error: Value = serde_json::from_slice(&body).expect("JSON error");
    assert_eq!(error["error"]["code"], "topic_not_found");
}

fn bytes_of(text: &str) -> bytes::Bytes {
    bytes::Bytes::copy_from_slice(text.as_bytes())
}

#[test]
fn dead_lettering_survives_sigkill_in_one_topic_or_both_never_neither() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut node = Node::start(
        &tmp.path().join("n"),
        &["--set", "leases.sweep_interval_ms=20"],
    );
    // Kill at different moments around the lease's end, where the move runs.
    for (round, visibility_ms) in [40u64, 60, 80, 100, 150].into_iter().enumerate() {
        let (src, dlq) = (format!("src{round}"), format!("dlq{round}"));
        node.create_topic(&dlq, json!({"partitions": 1}));
        node.create_topic(
            &src,
            json!({"partitions": 1, "max_deliveries": 1, "dead_letter_topic": dlq}),
        );
        let (status, produced) =
            node.request("POST", &format!("/v1/topics/{src}/messages"), b"poison");
        assert_eq!(status, 202);
        let id = produced["id"].as_str().expect("id").to_string();
        let got = node.consume(
            &src,
            json!({"wait_ms": 5000, "visibility_timeout_ms": visibility_ms}),
        );
        assert_eq!(ids_of(&got), vec![id.clone()]);
        let kill_at = Instant::now() + Duration::from_millis(visibility_ms);
        eventually(WAIT, || Instant::now() >= kill_at);
        node.kill();
        node.restart();
        let found = eventually(WAIT, || {
            let from_src = node.consume(
                &src,
                json!({"wait_ms": 100, "visibility_timeout_ms": 60000}),
            );
            let from_dlq = node.consume(&dlq, json!({"wait_ms": 100}));
            ids_of(&from_src).contains(&id) || ids_of(&from_dlq).contains(&id)
        });
        assert!(
            found,
            "round {round}: message {id} is in {src}, {dlq} or both after SIGKILL"
        );
    }
}

/// Anonymous memory of a process, from `/proc/PID/status`.
fn anonymous_memory_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("RssAnon:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("RssAnon in /proc/PID/status");
    kib * 1024
}

/// The memory model of docs/configuration.md: an idle node holds at most
/// this much per shard, whatever `storage.wal_ring_bytes` says (the ring
/// lives on disk; recovery reads it through a window).
const IDLE_MEMORY_PER_SHARD_BYTES: u64 = 64 * 1024 * 1024;

#[test]
fn an_idle_node_holds_the_stated_memory_whatever_the_size_of_its_wal_rings() {
    let tmp = tempfile::tempdir().expect("tmp");
    let ring = format!("storage.wal_ring_bytes={}", 256 * 1024 * 1024);
    let mut node = Node::start(&tmp.path().join("n"), &["--shards", "2", "--set", &ring]);
    node.create_topic("idle", json!({"partitions": 4}));
    for i in 0..20 {
        node.produce("idle", &format!("m{i}"));
    }
    // A restart recovers both rings, as after a crash.
    node.kill();
    node.restart();
    let got = support::consume_all(&node, "idle");
    assert_eq!(got.len(), 20, "every message is there after the restart");
    let limit = 2 * IDLE_MEMORY_PER_SHARD_BYTES;
    let used = anonymous_memory_bytes(node.pid());
    assert!(
        used <= limit,
        "an idle node with 2 shards and two 256 MiB rings holds {used} bytes of anonymous memory, more than the stated {limit}"
    );
}

/// Modification times of a partition folder's segment files.
fn segment_mtimes(dir: &std::path::Path) -> BTreeMap<String, std::time::SystemTime> {
    std::fs::read_dir(dir)
        .expect("partition folder")
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "seg"))
        .map(|e| {
            let modified = e.metadata().and_then(|m| m.modified()).expect("mtime");
            (e.file_name().to_string_lossy().into_owned(), modified)
        })
        .collect()
}

#[test]
fn a_graceful_restart_leaves_segments_untouched_and_a_crash_rewrites_the_newest() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic("kept", json!({"partitions": 1}));
    for i in 0..50 {
        node.produce("kept", &format!("m{i}"));
    }
    assert_eq!(support::consume_all(&node, "kept").len(), 50);
    let folder = tmp
        .path()
        .join("n")
        .join("partitions")
        .join("kept-0")
        .join("0");
    // An empty consume opens the partition and appends nothing.
    let open_partition = |node: &Node| {
        assert!(node
            .consume("kept", json!({"max_messages": 1, "wait_ms": 0}))
            .is_empty());
    };
    node.terminate();
    let stopped = segment_mtimes(&folder);
    assert!(!stopped.is_empty());
    node.restart();
    open_partition(&node);
    assert_eq!(
        segment_mtimes(&folder),
        stopped,
        "after a graceful stop, opening the partition writes none of its segments"
    );
    node.kill();
    let killed = segment_mtimes(&folder);
    node.restart();
    open_partition(&node);
    let newest = killed.keys().last().expect("a segment");
    assert_ne!(
        segment_mtimes(&folder).get(newest),
        killed.get(newest),
        "after a crash the newest segment is rewritten at open"
    );
}

#[test]
fn a_full_wal_ring_answers_429_and_accepts_nothing_of_the_batch() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(
        &tmp.path().join("n"),
        &["--set", "storage.wal_ring_bytes=65536"],
    );
    node.create_topic("big", json!({"partitions": 1}));
    let messages: Vec<Value> = (0..20)
        .map(|i| json!({"value": format!("{i:04}").repeat(1000)}))
        .collect();
    let (status, answer) = node.json(
        "POST",
        "/v1/topics/big/messages/batch",
        json!({ "messages": messages }),
    );
    assert_eq!(
        (
            status,
            answer["error"]["code"].as_str(),
            answer["error"]["retry"].as_bool()
        ),
        (429, Some("overloaded"), Some(true))
    );
    let (status, _) = node.request("POST", "/v1/topics/big/messages", b"small");
    assert_eq!(status, 202, "the node still accepts what fits");
    let got = node.consume("big", json!({"max_messages": 100, "wait_ms": 5000}));
    assert_eq!(
        got.iter().map(|m| m["value"].clone()).collect::<Vec<_>>(),
        vec![json!("small")],
        "nothing of the refused batch"
    );
}

#[test]
fn a_relative_data_folder_works_as_the_readme_runs_it() {
    use std::io::BufRead as _;
    let tmp = tempfile::tempdir().expect("tmp");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_narad"))
        .args([
            "serve",
            "--data-dir",
            "narad-data",
            "--listen",
            "127.0.0.1:0",
            "--set",
            "storage.wal_ring_bytes=8388608",
        ])
        .current_dir(tmp.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(rest) = line.strip_prefix("listening client=") {
                let _ = sender.send(
                    rest.split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_string(),
                );
            }
        }
    });
    let addr = receiver.recv_timeout(support::START_DEADLINE);
    let served = addr.as_ref().ok().map(|addr| {
        let (created, _) =
            support::request(addr, "PUT", "/v1/topics/t", &[], br#"{"partitions": 1}"#);
        let (produced, _) = support::request(addr, "POST", "/v1/topics/t/messages", &[], b"x");
        (created, produced)
    });
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        served,
        Some((201, 202)),
        "a node with a relative data folder starts and serves"
    );
    assert!(tmp.path().join("narad-data").join("wal").exists());
}

#[test]
fn consumes_of_one_message_take_turns_over_every_partition() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = Node::start(dir.path(), &[]);
    node.create_topic("turns", json!({"partitions": 8}));
    // Two messages in every partition, each sent with a key of that partition.
    for partition in 0..8u32 {
        let key = (0..)
            .map(|n| format!("key-{n}"))
            .find(|k| narad_broker::partitioner::partition_for_key(k.as_bytes(), 8) == partition)
            .expect("a key for every partition");
        for _ in 0..2 {
            let (status, answer) = node.request_with(
                "POST",
                "/v1/topics/turns/messages",
                &[("Narad-Key", &key)],
                b"queued",
            );
            assert_eq!(status, 202, "{answer}");
        }
    }
    let all_available = || {
        let (_, topic) = node.request("GET", "/v1/topics/turns", b"");
        topic["partition_stats"]
            .as_array()
            .is_some_and(|p| p.iter().all(|s| s["available"] == 2))
    };
    assert!(eventually(WAIT, all_available), "every partition holds two");
    // Eight consumes of one message each, none acked: a consume starts one
    // partition further on each time, so each takes from another partition.
    let partitions: BTreeSet<u64> = (0..8)
        .map(|_| {
            let got = node.consume("turns", json!({"max_messages": 1}));
            got[0]["partition"].as_u64().expect("partition")
        })
        .collect();
    assert_eq!(partitions, (0..8).collect::<BTreeSet<u64>>());
}

/// A topic deleted while its partitions commit (and roll small segments)
/// must not take the node down, and its folder goes: only once the last
/// commit of each of its partitions (which may open a new segment file in
/// it) is done, on whichever shard.
#[test]
fn deleting_a_topic_while_its_partitions_roll_segments_keeps_the_node_up() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(
        &tmp.path().join("n"),
        &["--set", "storage.segment_bytes=8192", "--shards", "2"],
    );
    // Each round is a fraction of a second; the race needs a few.
    for round in 0..20 {
        let topic = format!("doomed{round}");
        node.create_topic(&topic, json!({"partitions": 8}));
        let producers = support::Producers::start(&node.addr, &topic, 4);
        assert!(eventually(Duration::from_secs(20), || producers
            .accepted_count()
            >= 100));
        let (status, answer) = node.request("DELETE", &format!("/v1/topics/{topic}"), b"");
        assert_eq!(status, 204, "{answer}");
        producers.finish();
        let (status, _) = node.request("GET", "/healthz", b"");
        assert_eq!(status, 200, "round {round}: the node is up");
        let partitions = tmp.path().join("n").join("partitions");
        let gone = || {
            std::fs::read_dir(&partitions).is_ok_and(|entries| {
                !entries.flatten().any(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("{topic}-"))
                })
            })
        };
        assert!(
            eventually(Duration::from_secs(20), gone),
            "round {round}: the deleted topic's folder is removed"
        );
    }
}

/// Sends one request whose header bytes are given as they are (a header
/// value need not be UTF-8 on the wire), and returns the status and body.
fn request_with_raw_header(addr: &str, path: &str, header: &[u8], body: &[u8]) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(WAIT)).expect("timeout");
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(header);
    request.extend_from_slice(b"\r\n\r\n");
    request.extend_from_slice(body);
    stream.write_all(&request).expect("send");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).expect("read");
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&response[..split]).to_string();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    (
        status,
        serde_json::from_slice(&response[split + 4..]).unwrap_or(Value::Null),
    )
}

/// Idempotent produce is specified but not served by this release: its
/// header, batch field and topic setting are each refused naming them, and
/// nothing is written (a retry that relied on the header would otherwise
/// be stored twice without a word).
#[test]
fn a_key_over_the_limit_or_not_utf8_is_refused_and_nothing_is_written() {
    use narad_net::batch::KEY_BYTES_MAX;
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic("keys", json!({"partitions": 1, "max_message_bytes": 10}));

    // A key may be longer than the topic's max_message_bytes (which bounds
    // the value), up to the key limit.
    let longest = "k".repeat(KEY_BYTES_MAX);
    let (status, answer) = node.json(
        "POST",
        "/v1/topics/keys/messages/batch",
        json!({"messages": [{"key": longest, "value": "v"}]}),
    );
    assert_eq!(status, 202, "{answer}");

    let too_long = "k".repeat(KEY_BYTES_MAX + 1);
    let (status, answer) = node.json(
        "POST",
        "/v1/topics/keys/messages/batch",
        json!({"messages": [{"value": "a"}, {"key": too_long, "value": "b"}]}),
    );
    assert_eq!(status, 413, "{answer}");
    assert_eq!(answer["error"]["code"], "too_large", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("messages[1].key"), "{answer}");

    let header = format!("Narad-Key: {too_long}");
    let (status, answer) = request_with_raw_header(
        &node.addr,
        "/v1/topics/keys/messages",
        header.as_bytes(),
        b"c",
    );
    assert_eq!(status, 413, "{answer}");
    assert_eq!(answer["error"]["code"], "too_large", "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("Narad-Key"),
        "{answer}"
    );

    let (status, answer) = request_with_raw_header(
        &node.addr,
        "/v1/topics/keys/messages",
        b"Narad-Key: caf\xe9",
        b"d",
    );
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "invalid_request", "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("UTF-8"),
        "{answer}"
    );

    // A UTF-8 key that is not ASCII goes through the header as it is.
    let (status, answer) = request_with_raw_header(
        &node.addr,
        "/v1/topics/keys/messages",
        "Narad-Key: café".as_bytes(),
        b"e",
    );
    assert_eq!(status, 202, "{answer}");

    // Only the two accepted messages are there, with their keys whole.
    let mut messages = Vec::new();
    assert!(eventually(WAIT, || {
        messages.extend(node.consume("keys", json!({"max_messages": 10, "wait_ms": 500})));
        messages.len() >= 2
    }));
    assert!(node.consume("keys", json!({"max_messages": 10})).is_empty());
    let mut keys: Vec<&str> = messages
        .iter()
        .map(|m| m["key"].as_str().expect("key"))
        .collect();
    keys.sort();
    assert_eq!(keys, vec!["café", longest.as_str()]);
}

#[test]
fn a_consume_acks_its_list_first_and_answers_each_receipt_in_json_and_in_binary() {
    use narad_net::types::{parse_consume_binary, MESSAGES_MEDIA_TYPE};
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic(
        "work",
        json!({"partitions": 2, "visibility_timeout_ms": 60_000}),
    );
    node.create_topic("other", json!({"partitions": 1}));
    let values: Vec<Value> = (0..4)
        .map(|i| json!({ "value": format!("m{i}") }))
        .collect();
    let (status, _) = node.json(
        "POST",
        "/v1/topics/work/messages/batch",
        json!({ "messages": values }),
    );
    assert_eq!(status, 202);
    let take = |count: usize| -> Vec<Value> {
        let mut got = Vec::new();
        let deadline = Instant::now() + WAIT;
        while got.len() < count && Instant::now() < deadline {
            let (status, answer) = node.json(
                "POST",
                "/v1/topics/work/consume",
                json!({"max_messages": count - got.len(), "wait_ms": 1000}),
            );
            assert_eq!(status, 200, "{answer}");
            assert!(
                answer.get("acks").is_none(),
                "no ack list, no acks: {answer}"
            );
            got.extend(answer["messages"].as_array().cloned().unwrap_or_default());
        }
        assert_eq!(got.len(), count);
        got
    };
    let first = take(2);
    let receipt = |m: &Value| m["receipt"].as_str().unwrap_or_default().to_string();

    // A pinned partition beyond the topic is refused before anything is acked.
    let (status, answer) = node.json(
        "POST",
        "/v1/topics/work/consume",
        json!({"ack": [receipt(&first[0])], "partition": 7}),
    );
    assert_eq!(status, 400, "{answer}");
    // JSON: one result per receipt, in order, as the batch ack answers.
    let (status, other) = node.json("POST", "/v1/topics/other/messages", json!("x"));
    assert_eq!(status, 202, "{other}");
    let (_, other) = node.json("POST", "/v1/topics/other/consume", json!({"wait_ms": 2000}));
    let foreign = receipt(&other["messages"][0]);
    let (status, answer) = node.json(
        "POST",
        "/v1/topics/work/consume",
        json!({"ack": [receipt(&first[0]), foreign, receipt(&first[0])], "max_messages": 1, "wait_ms": 1000}),
    );
    assert_eq!(status, 200, "{answer}");
    let statuses: Vec<u64> = answer["acks"]
        .as_array()
        .expect("acks")
        .iter()
        .map(|a| a["status"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(statuses, [204, 400, 410], "{answer}");
    assert_eq!(answer["acks"][0]["receipt"], json!(receipt(&first[0])));
    assert_eq!(answer["acks"][2]["error"]["code"], "lease_gone", "{answer}");
    assert_eq!(
        answer["messages"].as_array().map(Vec::len),
        Some(1),
        "{answer}"
    );
    let third = answer["messages"][0].clone();

    // Binary: the results follow the messages.
    let body =
        json!({"ack": [receipt(&first[1]), receipt(&third)], "max_messages": 10, "wait_ms": 1000})
            .to_string();
    let (status, _, body) = raw_request(
        &node.addr,
        "POST",
        "/v1/topics/work/consume",
        &[("Accept", MESSAGES_MEDIA_TYPE)],
        body.as_bytes(),
    );
    assert_eq!(status, 200);
    let answer = parse_consume_binary(&bytes::Bytes::from(body)).expect("a whole answer");
    let acks = answer.acks.expect("ack results");
    assert_eq!(
        acks.iter().map(|a| a.status).collect::<Vec<_>>(),
        [204, 204]
    );
    assert!(acks.iter().all(|a| a.error.is_none()));
    assert_eq!(answer.messages.len(), 1, "the one message left");
    let last = answer.messages[0].receipt.clone();
    let (status, answer) = node.json(
        "POST",
        "/v1/topics/work/consume",
        json!({"ack": [last], "wait_ms": 0}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["acks"][0]["status"], 204, "{answer}");
    assert_eq!(answer["messages"], json!([]), "all four acked, none left");
    let (status, answer) = node.json(
        "POST",
        "/v1/topics/work/consume",
        json!({"ack": vec!["R"; 1001]}),
    );
    assert_eq!(status, 400, "{answer}");
    let (_, topic) = node.request("GET", "/v1/topics/work", b"");
    let open: u64 = topic["partition_stats"]
        .as_array()
        .expect("stats")
        .iter()
        .map(|p| p["available"].as_u64().unwrap_or(0) + p["in_flight"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(open, 0, "nothing left to deliver: {topic}");
}

/// A topic created without `visibility_timeout_ms` leases for 30 s: a
/// message taken and never acked comes back no sooner than 30 s after the
/// consume was sent, and about a second (one sweep) after that at most.
/// This test takes over 30 s; it runs beside the others.
#[test]
fn a_topic_without_a_visibility_timeout_leases_for_30_s() {
    const LEASE: Duration = Duration::from_secs(30);
    // One sweep (`leases.sweep_interval_ms`, 1 s), and this test's polling.
    const LATE: Duration = Duration::from_millis(1_500);
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic("plain", json!({"partitions": 1}));
    let (_, described) = node.request("GET", "/v1/topics/plain", b"");
    assert_eq!(described["visibility_timeout_ms"], 30_000, "{described}");
    let id = node.produce("plain", "once");
    let sent = Instant::now();
    let first = node.consume("plain", json!({"wait_ms": 5000}));
    let answered = Instant::now();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0]["id"], id.as_str());
    let mut again = None;
    assert!(eventually(LEASE + WAIT, || {
        let got = node.consume("plain", json!({"wait_ms": 200}));
        if got.iter().any(|m| m["id"] == id.as_str()) {
            again = Some(Instant::now());
        }
        again.is_some()
    }));
    let again = again.expect("delivered again");
    eprintln!("delivered again {:?} after the first consume", again - sent);
    assert!(
        again - sent >= LEASE,
        "delivered again {:?} after the consume was sent",
        again - sent
    );
    assert!(
        again - answered <= LEASE + LATE,
        "delivered again {:?} after the first lease was answered",
        again - answered
    );
}

/// At a low rate a message is consumable within single-digit milliseconds
/// of its produce (the median over a run; the p99 is in the report).
#[test]
fn at_a_low_rate_a_message_is_consumable_within_milliseconds() {
    const MESSAGES: usize = 100;
    const PACE: Duration = Duration::from_millis(20);
    const MEDIAN_BOUND: Duration = Duration::from_millis(10);
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic("quick", json!({"partitions": 1}));
    let seen: Arc<Mutex<BTreeMap<String, Instant>>> = Arc::default();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let consumer = {
        let (seen, done, addr) = (seen.clone(), done.clone(), node.addr.clone());
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let body = json!({"max_messages": 100, "wait_ms": 500}).to_string();
                let Ok((200, answer)) = support::try_request(
                    &addr,
                    "POST",
                    "/v1/topics/quick/consume",
                    body.as_bytes(),
                    Duration::from_secs(5),
                ) else {
                    continue;
                };
                let now = Instant::now();
                let mut seen = seen.lock().expect("lock");
                for message in answer["messages"].as_array().into_iter().flatten() {
                    let id = message["id"].as_str().unwrap_or("").to_string();
                    seen.entry(id).or_insert(now);
                }
            }
        })
    };
    let mut produced = Vec::new();
    for i in 0..MESSAGES {
        let started = Instant::now();
        produced.push((started, node.produce("quick", &format!("m{i}"))));
        std::thread::sleep(PACE);
    }
    assert!(eventually(WAIT, || {
        let seen = seen.lock().expect("lock");
        produced.iter().all(|(_, id)| seen.contains_key(id))
    }));
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    consumer.join().expect("consumer");
    let seen = seen.lock().expect("lock");
    let mut took: Vec<Duration> = produced
        .iter()
        .map(|(started, id)| seen[id].saturating_duration_since(*started))
        .collect();
    took.sort_unstable();
    let median = took[took.len() / 2];
    let p99 = took[(took.len() * 99).div_ceil(100) - 1];
    eprintln!("produce to consumable at 50 msg/s: median {median:?}, p99 {p99:?}");
    assert!(
        median < MEDIAN_BOUND,
        "the median produce to consumable took {median:?}"
    );
}

/// A commit wakes only the long polls of its topic, and only as many as
/// it brings messages: commits of another topic wake nobody, and one
/// message wakes one of two polls that each take one. A wake-up that finds
/// nothing would be counted in `narad_consume_empty_wakes_total` (seen
/// failing when every commit woke every poll of the node).
#[test]
fn a_commit_wakes_only_polls_of_its_topic_one_per_message() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic("quiet", json!({"partitions": 1}));
    node.create_topic("busy", json!({"partitions": 4}));
    let counted = || support::metric(&node, "narad_consume_empty_wakes_total");
    let waiting = || support::metric(&node, "narad_consume_long_polls_waiting");
    assert_eq!(counted(), 0.0, "the counter is there from the start");
    let (polls, answered) = support::single_message_polls(&node.addr, "quiet", 2);
    assert!(
        eventually(Duration::from_secs(10), || waiting() >= 2.0),
        "both polls park"
    );
    for i in 0..20 {
        node.produce("busy", &format!("not for the quiet topic {i}"));
    }
    node.produce("quiet", "one");
    let (status, body) = answered
        .recv_timeout(Duration::from_secs(10))
        .expect("one poll answers")
        .expect("an answer");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["messages"][0]["value"], "one", "{body}");
    assert_eq!(waiting(), 1.0, "the other poll still waits");
    node.produce("quiet", "two");
    let (status, body) = answered
        .recv_timeout(Duration::from_secs(10))
        .expect("the other poll answers")
        .expect("an answer");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["messages"][0]["value"], "two", "{body}");
    for poll in polls {
        poll.join().expect("the poll");
    }
    assert_eq!(
        counted(),
        0.0,
        "no poll was woken for the other topic's commits or for the message the other took"
    );
}

/// The Rust client browses, searches (following the cursor) and reads a
/// topic's rates, with the figures the node holds.
#[test]
fn the_rust_client_browses_searches_and_reads_rates() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic("shop", json!({"partitions": 2}));
    let batch: Vec<Value> = (0..30)
        .map(|i| json!({"key": format!("customer-{}", i % 3), "value": format!("order {i}")}))
        .collect();
    node.produce_batch("shop", batch);
    // A 202 comes before the commit: wait for all 30.
    assert!(eventually(WAIT, || node.stat_sum("shop", "high_watermark") == 30));
    let mut leased = Vec::new();
    assert!(eventually(WAIT, || {
        leased.extend(node.consume(
            "shop",
            json!({"max_messages": 4 - leased.len(), "wait_ms": 1000}),
        ));
        leased.len() == 4
    }));
    assert_eq!(support::ack_batch(&node, "shop", &leased), vec![204; 4]);

    let client = narad_client::blocking::Client::builder(&format!("http://{}", node.addr))
        .build()
        .expect("client");
    let mut browsed = 0;
    for partition in 0..2 {
        let page = client
            .browse("shop", partition, Some(0), 100)
            .expect("browse");
        assert_eq!(page.next_offset, page.high_watermark);
        assert!(page.messages.iter().all(|m| m.partition == partition));
        browsed += page.messages.len();
    }
    assert_eq!(browsed, 30);

    // One match per call: the cursor leads through all ten of customer-1.
    let mut query = narad_client::SearchQuery {
        key: Some("customer-1".into()),
        limit: Some(1),
        ..Default::default()
    };
    let mut found = BTreeSet::new();
    loop {
        let page = client.search("shop", &query).expect("search");
        assert!(page.messages.len() <= 1);
        for m in page.messages {
            assert_eq!(m.key.as_deref(), Some("customer-1"));
            found.insert(String::from_utf8_lossy(&m.value).to_string());
        }
        match page.cursor {
            Some(cursor) => query.cursor = Some(cursor),
            None => break,
        }
    }
    let wanted: BTreeSet<String> = (0..30)
        .filter(|i| i % 3 == 1)
        .map(|i| format!("order {i}"))
        .collect();
    assert_eq!(found, wanted);
    let refused = client
        .search("shop", &narad_client::SearchQuery::default())
        .expect_err("neither key nor text");
    assert!(refused.to_string().contains("400"), "{refused}");

    let rates = client.rates("shop").expect("rates");
    assert_eq!(rates.interval_ms, 5_000);
    let produced: u64 = rates.points.iter().map(|p| p.produced).sum();
    let acked: u64 = rates.points.iter().map(|p| p.acked).sum();
    assert_eq!((produced, acked), (30, 4), "{rates:?}");
}

/// A browse shows a partition's messages with their state and delivery
/// count, pages by offset, and changes nothing: a consume afterwards gets
/// what it would have got. Bad parameters are 400 in the error shape.
#[test]
fn browsing_a_partition_shows_each_messages_state_and_changes_nothing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic("jobs", json!({"partitions": 1}));
    let messages = json!({"messages": [
        {"key": "customer-1", "value": "m0"}, {"value": "m1"},
        {"value_base64": "AP8="}, {"value": "{\"total\": 12}"}, {"value": "m4"}]});
    let (status, answer) = node.json("POST", "/v1/topics/jobs/messages/batch", messages);
    assert_eq!(status, 202, "{answer}");
    let leased = node.consume("jobs", json!({"max_messages": 2}));
    assert_eq!(leased.len(), 2);
    let (status, _) = node.json(
        "POST",
        "/v1/topics/jobs/ack",
        json!({"receipt": leased[0]["receipt"]}),
    );
    assert_eq!(status, 204);

    let (status, page) = node.request("GET", "/v1/topics/jobs/partitions/0/messages?offset=0", b"");
    assert_eq!(status, 200, "{page}");
    let shown: Vec<(u64, &str, u64)> = page["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            let state = m["state"].as_str().expect("state");
            (
                m["offset"].as_u64().expect("offset"),
                state,
                m["delivery_count"].as_u64().expect("count"),
            )
        })
        .collect();
    assert_eq!(
        shown,
        // An acked message's count is not kept.
        vec![
            (0, "acked", 0),
            (1, "leased", 1),
            (2, "available", 0),
            (3, "available", 0),
            (4, "available", 0)
        ]
    );
    let first = &page["messages"][0];
    assert_eq!(first["key"], "customer-1");
    assert_eq!(first["value"], "m0");
    assert_eq!(first["id"], leased[0]["id"]);
    assert!(first["produced_at_ms"].as_u64().is_some_and(|t| t > 0));
    assert!(
        first.get("receipt").is_none(),
        "a browse hands out no receipt"
    );
    assert_eq!(page["messages"][2]["value_base64"], "AP8=");
    assert!(page["messages"][2].get("value").is_none());
    assert_eq!(
        (
            page["next_offset"].as_u64(),
            page["frontier"].as_u64(),
            page["high_watermark"].as_u64()
        ),
        (Some(5), Some(1), Some(5))
    );

    // Without an offset: from the frontier; pages by `limit`.
    let (_, from_frontier) = node.request("GET", "/v1/topics/jobs/partitions/0/messages", b"");
    assert_eq!(from_frontier["messages"][0]["offset"], 1);
    assert_eq!(from_frontier["messages"].as_array().map(Vec::len), Some(4));
    let (_, paged) = node.request(
        "GET",
        "/v1/topics/jobs/partitions/0/messages?offset=1&limit=2",
        b"",
    );
    assert_eq!(paged["messages"].as_array().map(Vec::len), Some(2));
    assert_eq!(paged["next_offset"], 3);
    let (_, past_end) = node.request(
        "GET",
        "/v1/topics/jobs/partitions/0/messages?offset=99",
        b"",
    );
    assert_eq!(past_end["messages"], json!([]));
    assert_eq!(past_end["next_offset"], 5);

    // Nothing changed: the next consume gets offsets 2, 3 and 4, first
    // deliveries, and the leased one is still leased.
    let rest = node.consume("jobs", json!({"max_messages": 10}));
    let offsets: Vec<u64> = rest.iter().filter_map(|m| m["offset"].as_u64()).collect();
    assert_eq!(offsets, vec![2, 3, 4]);
    assert!(rest.iter().all(|m| m["delivery_count"] == 1));

    for (path, code) in [
        (
            "/v1/topics/jobs/partitions/0/messages?limit=0",
            "invalid_request",
        ),
        (
            "/v1/topics/jobs/partitions/0/messages?limit=1001",
            "invalid_request",
        ),
        (
            "/v1/topics/jobs/partitions/0/messages?offset=-1",
            "invalid_request",
        ),
        (
            "/v1/topics/jobs/partitions/0/messages?colour=red",
            "unknown_field",
        ),
        ("/v1/topics/jobs/partitions/1/messages", "invalid_request"),
        (
            "/v1/topics/jobs/partitions/first/messages",
            "invalid_request",
        ),
    ] {
        let (status, error) = node.request("GET", path, b"");
        assert_eq!(status, 400, "{path}: {error}");
        assert_eq!(error["error"]["code"], code, "{path}");
    }
    let (status, error) = node.request("GET", "/v1/topics/nope/partitions/0/messages", b"");
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (404, Some("topic_not_found"))
    );

    // The CLI shows the same page.
    let (ok, out, err) = narad(
        &node,
        &["browse", "jobs", "--partition", "0", "--offset", "0"],
        None,
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("acked") && out.contains("leased") && out.contains("customer-1"),
        "{out}"
    );
    assert!(
        out.contains("next offset 5, frontier 1, high watermark 5"),
        "{out}"
    );
    let (ok, out, err) = narad(
        &node,
        &[
            "browse",
            "jobs",
            "--partition",
            "0",
            "--limit",
            "1",
            "--output",
            "json",
        ],
        None,
    );
    assert!(ok, "{err}");
    let json: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(json["messages"].as_array().map(Vec::len), Some(1));
}

/// Partitions on another shard are read at their owner through the mesh:
/// browsing every partition shows every message once, each in its own.
#[test]
fn browsing_every_partition_of_a_two_shard_node_shows_every_message_once() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &["--shards", "2"]);
    node.create_topic("orders", json!({"partitions": 4}));
    let messages: Vec<Value> = (0..40)
        .map(|i| json!({"key": format!("customer-{i}"), "value": format!("order {i}")}))
        .collect();
    node.produce_batch("orders", messages);
    // Accepted messages reach their owners a moment after the 202.
    let browse_all = || {
        let mut seen = BTreeSet::new();
        for partition in 0..4 {
            let path =
                format!("/v1/topics/orders/partitions/{partition}/messages?offset=0&limit=1000");
            let (status, page) = node.request("GET", &path, b"");
            assert_eq!(status, 200, "{page}");
            for m in page["messages"].as_array().expect("messages") {
                assert_eq!(m["partition"], partition);
                assert_eq!(m["state"], "available");
                assert!(
                    seen.insert(m["value"].as_str().expect("value").to_string()),
                    "{m}"
                );
            }
        }
        seen
    };
    let mut seen = BTreeSet::new();
    assert!(
        eventually(WAIT, || {
            seen = browse_all();
            seen.len() == 40
        }),
        "browsed {} of 40",
        seen.len()
    );
}

/// Search: a topic of 100,000 messages over four partitions on two shards,
/// in many segments, holds a few planted matches, by key and by text.
/// Following the cursor finds each exactly once and nothing else, and ends
/// with a null cursor; since a call looks at no more than 10,000 messages
/// of each partition, that takes several calls. Searching changes nothing.
#[test]
fn searching_a_hundred_thousand_messages_finds_the_few_that_match_by_following_the_cursor() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(
        &tmp.path().join("n"),
        &["--shards", "2", "--set", "storage.segment_bytes=262144"],
    );
    node.create_topic("orders", json!({"partitions": 4}));
    let needles = [137, 25_000, 51_234, 77_777, 99_999];
    let gifts = [10, 33_333, 60_000, 88_001];
    for batch in 0..100 {
        let messages: Vec<Value> = (batch * 1000..(batch + 1) * 1000)
            .map(|n| {
                if needles.contains(&n) {
                    json!({"key": "needle-customer", "value": format!("the needle {n}")})
                } else if gifts.contains(&n) {
                    json!({"key": format!("c{n}"), "value": format!("order {n}: gift card")})
                } else {
                    json!({"key": format!("c{}", n % 5000), "value": format!("order {n}")})
                }
            })
            .collect();
        node.produce_batch("orders", messages);
    }
    assert!(eventually(WAIT, || node
        .stat_sum("orders", "high_watermark")
        == 100_000));
    // Follows the cursor to its end: the values found and the calls made.
    let search = |query: &str| {
        let (mut values, mut calls) = (Vec::new(), 0);
        let mut cursor: Option<String> = None;
        loop {
            let mut path = format!("/v1/topics/orders/messages?{query}&limit=2");
            if let Some(cursor) = &cursor {
                path.push_str(&format!("&cursor={cursor}"));
            }
            let (status, answer) = node.request("GET", &path, b"");
            assert_eq!(status, 200, "{answer}");
            calls += 1;
            for m in answer["messages"].as_array().expect("messages") {
                assert_eq!(m["state"], "available");
                values.push(m["value"].as_str().expect("value").to_string());
            }
            match answer["cursor"].as_str() {
                Some(next) => cursor = Some(next.to_string()),
                None => return (values, calls),
            }
            assert!(calls < 100, "the search does not end");
        }
    };
    let (mut found, calls) = search("key=needle-customer");
    found.sort();
    let mut expected: Vec<String> = needles.iter().map(|n| format!("the needle {n}")).collect();
    expected.sort();
    assert_eq!(found, expected);
    assert!(
        calls >= 3,
        "25,000 messages a partition at 10,000 a call: {calls} calls"
    );
    let (mut found, _) = search("contains=gift%20card");
    found.sort();
    let mut expected: Vec<String> = gifts
        .iter()
        .map(|n| format!("order {n}: gift card"))
        .collect();
    expected.sort();
    assert_eq!(found, expected);
    // Both at once: the key and the text.
    let (found, _) = search("key=needle-customer&contains=needle%2077777");
    assert_eq!(found, vec!["the needle 77777".to_string()]);

    for (path, code) in [
        ("/v1/topics/orders/messages", "invalid_request"),
        ("/v1/topics/orders/messages?contains=", "invalid_request"),
        (
            "/v1/topics/orders/messages?key=a&limit=0",
            "invalid_request",
        ),
        (
            "/v1/topics/orders/messages?key=a&cursor=bm9wZQ",
            "invalid_request",
        ),
        (
            "/v1/topics/orders/messages?key=a&colour=red",
            "unknown_field",
        ),
    ] {
        let (status, error) = node.request("GET", path, b"");
        assert_eq!(
            (status, error["error"]["code"].as_str()),
            (400, Some(code)),
            "{path}: {error}"
        );
    }
    // Searches leased nothing.
    assert_eq!(node.stat_sum("orders", "in_flight"), 0);
    // The CLI follows the cursor with --all.
    let (ok, out, err) = narad(
        &node,
        &["search", "orders", "--key", "needle-customer", "--all"],
        None,
    );
    assert!(ok, "{err}");
    assert_eq!(out.matches("the needle").count(), 5, "{out}");
    assert!(out.contains("every retained message searched"), "{out}");
}

/// A topic's rates add up what happened to it: messages produced, acked
/// and dead-lettered in 5-second points, and the backlog at the end.
#[test]
fn a_topics_rates_count_what_was_produced_acked_and_dead_lettered() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &["--shards", "2"]);
    node.create_topic("jobs.dlq", json!({"partitions": 1}));
    node.create_topic(
        "jobs",
        json!({"partitions": 4, "max_deliveries": 1, "dead_letter_topic": "jobs.dlq"}),
    );
    let messages: Vec<Value> = (0..20)
        .map(|i| json!({"value": format!("job {i}")}))
        .collect();
    node.produce_batch("jobs", messages);
    assert!(eventually(WAIT, || node.stat_sum("jobs", "high_watermark") == 20));
    let mut leased = Vec::new();
    assert!(eventually(WAIT, || {
        leased.extend(node.consume("jobs", json!({"max_messages": 15 - leased.len()})));
        leased.len() == 15
    }));
    // Ten acked; five nacked on their last allowed delivery: dead letters.
    for (i, message) in leased.iter().enumerate() {
        let how = if i < 10 { "ack" } else { "nack" };
        let (status, answer) = node.json(
            "POST",
            &format!("/v1/topics/jobs/{how}"),
            json!({"receipt": message["receipt"]}),
        );
        assert_eq!(status, 204, "{answer}");
    }
    assert!(eventually(WAIT, || node
        .stat_sum("jobs.dlq", "high_watermark")
        == 5));
    let sums = |topic: &str| {
        let (status, rates) = node.request("GET", &format!("/v1/topics/{topic}/rates"), b"");
        assert_eq!(status, 200, "{rates}");
        assert_eq!(rates["interval_ms"], 5000);
        let points = rates["points"].as_array().cloned().expect("points");
        assert!(!points.is_empty() && points.len() <= 180, "{rates}");
        for point in &points {
            assert_eq!(
                point["at_ms"].as_u64().map(|at| at % 5000),
                Some(0),
                "{point}"
            );
        }
        let sum = |field: &str| points.iter().filter_map(|p| p[field].as_u64()).sum::<u64>();
        let last = points.last().cloned().expect("a point");
        (
            sum("produced"),
            sum("acked"),
            sum("dead_lettered"),
            last["available"].clone(),
            last["in_flight"].clone(),
        )
    };
    let mut got = sums("jobs");
    assert!(
        eventually(WAIT, || {
            got = sums("jobs");
            got.2 == 5
        }),
        "{got:?}"
    );
    assert_eq!(got, (20, 10, 5, json!(5), json!(0)));
    assert_eq!(sums("jobs.dlq"), (5, 0, 0, json!(5), json!(0)));
    let (status, error) = node.request("GET", "/v1/topics/jobs/rates?window=1h", b"");
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (400, Some("unknown_field"))
    );
    let (status, _) = node.request("GET", "/v1/topics/nope/rates", b"");
    assert_eq!(status, 404);
}

/// The console: `GET /` leads to `/ui/`, whose files come from the binary
/// with a policy that lets the page use this origin only and never be
/// framed; `ui.enabled = false` turns it off.
#[test]
fn the_console_is_served_from_the_binary_for_this_origin_only_and_can_be_turned_off() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    let (status, head, _) = raw_request(&node.addr, "GET", "/", &[], b"");
    assert_eq!(status, 308, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("location: /ui/"),
        "{head}"
    );
    for (path, media) in [
        ("/ui/", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/app.css", "text/css"),
    ] {
        let (status, head, body) = raw_request(&node.addr, "GET", path, &[], b"");
        let head = head.to_ascii_lowercase();
        assert_eq!(status, 200, "{path}: {head}");
        assert!(
            head.contains(&format!("content-type: {media}")),
            "{path}: {head}"
        );
        assert!(
            head.contains("content-security-policy: default-src 'self'"),
            "{head}"
        );
        assert!(head.contains("frame-ancestors 'none'"), "{head}");
        let text = String::from_utf8_lossy(&body);
        assert!(!text.is_empty());
        // Nothing is loaded from another origin.
        for reference in [
            "src=\"http",
            "href=\"http",
            "url(http",
            "fetch(\"http",
            "//cdn",
        ] {
            assert!(
                !text.contains(reference),
                "{path} refers elsewhere: {reference}"
            );
        }
    }
    let (status, _, body) = raw_request(&node.addr, "GET", "/ui/nothing.js", &[], b"");
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));
    let (status, head, _) = raw_request(&node.addr, "POST", "/ui/", &[], b"");
    assert_eq!(status, 405);
    assert!(
        head.to_ascii_lowercase().contains("allow: get, head"),
        "{head}"
    );

    let off = Node::start(&tmp.path().join("off"), &["--set", "ui.enabled=false"]);
    for path in ["/", "/ui/", "/ui/app.js"] {
        let (status, _, body) = raw_request(&off.addr, "GET", path, &[], b"");
        assert_eq!(status, 404, "{path}: {}", String::from_utf8_lossy(&body));
    }
    let (status, _) = off.request("GET", "/v1/topics", b"");
    assert_eq!(status, 200, "the API stays");
}
