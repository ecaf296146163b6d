//! Idempotent produce at the node that accepts: a retry with the same
//! `Narad-Idempotency-Key` (or batch `idempotency_key`) answers the first
//! id and stores nothing new, on any shard, across the node's crashes,
//! stops and power cuts; bad keys and windows are refused whole.

mod support;

use std::time::Duration;

use narad_broker::partitioner::partition_for_key;
use serde_json::{json, Value};
use support::{consume_all, eventually, metric, Node};

const KEY_HEADER: &str = "Narad-Idempotency-Key";

fn produce_keyed(node: &Node, topic: &str, key: &str, value: &str) -> (u16, Value) {
    node.request_with(
        "POST",
        &format!("/v1/topics/{topic}/messages"),
        &[(KEY_HEADER, key)],
        value.as_bytes(),
    )
}

/// Produces with `key` and expects a 202; returns the id and whether the
/// answer said it was a duplicate.
fn accepted(node: &Node, topic: &str, key: &str, value: &str) -> (String, bool) {
    let (status, answer) = produce_keyed(node, topic, key, value);
    assert_eq!(status, 202, "{answer}");
    let id = answer["id"].as_str().expect("an id").to_string();
    let duplicate = match answer.get("duplicate") {
        None => false,
        Some(Value::Bool(true)) => true,
        Some(other) => panic!("duplicate is true or absent, got {other}"),
    };
    (id, duplicate)
}

/// Messages stored in `topic`, summed over its partitions.
fn stored(node: &Node, topic: &str) -> u64 {
    let (status, body) = node.request("GET", &format!("/v1/topics/{topic}"), b"");
    assert_eq!(status, 200, "{body}");
    body["partition_stats"]
        .as_array()
        .expect("partition stats")
        .iter()
        .map(|p| p["high_watermark"].as_u64().unwrap_or(0))
        .sum()
}

/// Messages stored in `topic` once the node committed everything it
/// accepted (keyed messages reach their partition after the 202).
fn stored_when_committed(node: &Node, topic: &str) -> u64 {
    let committed = eventually(Duration::from_secs(20), || {
        let (_, _, body) = support::raw_request(&node.addr, "GET", "/metrics", &[], b"");
        let pending: f64 = String::from_utf8_lossy(&body)
            .lines()
            .filter(|l| l.starts_with("narad_dispatcher_pending_records"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        pending == 0.0
    });
    assert!(committed, "the node committed what it accepted");
    stored(node, topic)
}

/// Every message of `topic`, consumed and acked: (value, partition) by id.
fn drain(node: &Node, topic: &str) -> Vec<(String, String, u64)> {
    let mut all = Vec::new();
    let done = eventually(Duration::from_secs(20), || {
        let messages = node.consume(topic, json!({"max_messages": 100, "wait_ms": 100}));
        for m in &messages {
            all.push((
                m["id"].as_str().unwrap_or_default().to_string(),
                m["value"].as_str().unwrap_or_default().to_string(),
                m["partition"].as_u64().unwrap_or(u64::MAX),
            ));
        }
        if !messages.is_empty() {
            support::ack_batch(node, topic, &messages);
        }
        messages.is_empty() && all.len() as u64 >= stored(node, topic)
    });
    assert!(done, "{topic} did not drain: {all:?}");
    all
}

#[test]
fn a_retried_produce_answers_the_first_id_on_any_shard_and_is_stored_once() {
    let tmp = tempfile::tempdir().expect("tmp");
    // Two shards: each request is a new connection, so retries land on both.
    let node = Node::start(&tmp.path().join("n"), &["--shards", "2"]);
    node.create_topic("orders", json!({"partitions": 4}));

    let (first, duplicate) = accepted(&node, "orders", "order-1", "a");
    assert!(!duplicate, "the first copy is no duplicate");
    for attempt in 0..8 {
        // Another value with the same key is a duplicate all the same.
        let value = if attempt % 2 == 0 { "a" } else { "b" };
        let (id, duplicate) = accepted(&node, "orders", "order-1", value);
        assert_eq!(id, first, "retry {attempt} answers the first id");
        assert!(duplicate, "retry {attempt} says it is a duplicate");
    }

    // A batch: each item judged alone, also against earlier items.
    let batch = json!({"messages": [
        {"value": "c", "idempotency_key": "order-1"},
        {"value": "d", "idempotency_key": "order-2"},
        {"value": "e", "idempotency_key": "order-2"},
        {"value": "f"},
    ]});
    let (status, answer) = node.json("POST", "/v1/topics/orders/messages/batch", batch.clone());
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["ids"][0], first.as_str(), "{answer}");
    assert_eq!(answer["ids"][2], answer["ids"][1], "{answer}");
    assert_eq!(answer["duplicates"], json!([0, 2]), "{answer}");
    let second = answer["ids"][1].as_str().expect("id").to_string();
    let (status, again) = node.json("POST", "/v1/topics/orders/messages/batch", batch);
    assert_eq!(status, 202, "{again}");
    assert_eq!(again["duplicates"], json!([0, 1, 2]), "{again}");
    assert_eq!(again["ids"][1], second.as_str(), "{again}");
    assert_ne!(again["ids"][3], answer["ids"][3], "a keyless item is new");

    // A produce without keys answers as it always did.
    let (status, plain) = node.json(
        "POST",
        "/v1/topics/orders/messages/batch",
        json!({"messages": [{"value": "g"}]}),
    );
    assert_eq!(status, 202, "{plain}");
    assert!(plain.get("duplicates").is_none(), "{plain}");

    let messages = drain(&node, "orders");
    let mut values: Vec<&str> = messages.iter().map(|(_, v, _)| v.as_str()).collect();
    values.sort_unstable();
    assert_eq!(values, vec!["a", "d", "f", "f", "g"], "{messages:?}");
    // Keyless messages with an idempotency key go where the key hashes.
    for (id, value, partition) in &messages {
        let key = match value.as_str() {
            "a" => "order-1",
            "d" => "order-2",
            _ => continue,
        };
        let expected = u64::from(partition_for_key(key.as_bytes(), 4));
        assert_eq!(
            *partition, expected,
            "{value} ({id}) by its idempotency key"
        );
    }
    let counted = metric(
        &node,
        "narad_produce_duplicates_total{topic=\"orders\",at=\"node\"}",
    );
    assert_eq!(counted, 13.0, "8 single retries, then 2 and 3 batch items");
    assert!(metric(&node, "narad_idempotency_keys") >= 2.0);
}

#[test]
fn keys_outlive_a_sigkill_a_sigterm_and_a_power_cut() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut ids = Vec::new();
    // A plain node for SIGKILL and SIGTERM, one that loses unsynced writes
    // at its kill for the power cut.
    for (dir, flags) in [
        ("plain", vec!["--shards", "2"]),
        (
            "power",
            vec!["--shards", "2", "--set", "testing.faults=power_loss"],
        ),
    ] {
        let mut node = Node::start(&tmp.path().join(dir), &flags);
        node.create_topic("once", json!({"partitions": 2}));
        let stops: &[&str] = if dir == "plain" {
            &["kill", "terminate"]
        } else {
            &["kill"]
        };
        ids.clear();
        for (round, stop) in stops.iter().enumerate() {
            let key = format!("{dir}-{round}");
            let (id, duplicate) = accepted(&node, "once", &key, "v");
            assert!(!duplicate);
            ids.push((key, id));
            match *stop {
                "kill" => node.kill(),
                _ => node.terminate(),
            }
            node.restart();
            for (key, id) in &ids {
                let (again, duplicate) = accepted(&node, "once", key, "retried");
                assert_eq!(&again, id, "{dir}: {key} after a {stop}");
                assert!(duplicate, "{dir}: {key} after a {stop}");
            }
        }
        assert_eq!(
            stored_when_committed(&node, "once"),
            ids.len() as u64,
            "{dir}"
        );
        let seen = consume_all(&node, "once");
        for (key, id) in &ids {
            assert_eq!(seen.get(id), Some(&1), "{dir}: {key} delivered once");
        }
    }
}

#[test]
fn bad_keys_and_windows_are_refused_by_name_and_nothing_is_written() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic("once", json!({"partitions": 1}));
    let long = "k".repeat(257);
    for key in ["", long.as_str(), "caf\u{e9}", "tab\there"] {
        let (status, answer) = produce_keyed(&node, "once", key, "a");
        assert_eq!(status, 400, "{key:?}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_request", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(KEY_HEADER), "{answer}");
    }
    let longest = "k".repeat(256);
    assert!(!accepted(&node, "once", &longest, "kept").1);
    let (status, answer) = node.json(
        "POST",
        "/v1/topics/once/messages/batch",
        json!({"messages": [
            {"value": "b", "idempotency_key": "fine"},
            {"value": "c", "idempotency_key": ""},
        ]}),
    );
    assert_eq!(status, 400, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("messages[1].idempotency_key"), "{answer}");
    let (status, answer) = node.request_with(
        "POST",
        "/v1/topics/once/messages/batch",
        &[(KEY_HEADER, "for-one-message")],
        br#"{"messages": [{"value": "d"}]}"#,
    );
    assert_eq!(status, 400, "the header names one message: {answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(KEY_HEADER), "{answer}");
    assert_eq!(
        stored_when_committed(&node, "once"),
        1,
        "nothing of the bad batch is written"
    );

    let (status, answer) = node.json(
        "PUT",
        "/v1/topics/once",
        json!({"idempotency_window_ms": 86_400_001u64}),
    );
    assert_eq!(status, 400, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("idempotency_window_ms"), "{answer}");
    let (_, topic) = node.request("GET", "/v1/topics/once", b"");
    assert_eq!(
        topic["idempotency_window_ms"], 300_000,
        "the default: {topic}"
    );
    let (status, topic) = node.json(
        "PUT",
        "/v1/topics/once",
        json!({"idempotency_window_ms": 86_400_000u64}),
    );
    assert_eq!(status, 200, "{topic}");
    assert_eq!(topic["idempotency_window_ms"], 86_400_000u64, "{topic}");
}

#[test]
fn a_window_of_zero_ignores_keys_and_a_key_is_new_again_once_its_window_ends() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(
        &tmp.path().join("n"),
        &["--set", "topics.default_idempotency_window_ms=0"],
    );
    node.create_topic("off", json!({"partitions": 1}));
    let (first, _) = accepted(&node, "off", "k", "a");
    let (second, duplicate) = accepted(&node, "off", "k", "a");
    assert_ne!(first, second, "a window of 0 ignores keys");
    assert!(!duplicate);
    assert_eq!(stored_when_committed(&node, "off"), 2);

    node.create_topic(
        "short",
        json!({"partitions": 1, "idempotency_window_ms": 1000}),
    );
    let (first, _) = accepted(&node, "short", "k", "a");
    let mut retries = 0;
    let renewed = eventually(Duration::from_secs(10), || {
        retries += 1;
        let (id, duplicate) = accepted(&node, "short", "k", "a");
        assert_eq!(duplicate, id == first, "a duplicate answers the first id");
        !duplicate
    });
    assert!(renewed, "the key held past its window");
    assert!(retries > 1, "the key held within its window");
    assert_eq!(stored_when_committed(&node, "short"), 2);
}

/// A proxy in front of a node that forwards the first request and drops
/// the node's answer to it (the client sees the connection close), then
/// passes everything through: a produce whose 202 was lost.
fn answer_losing_proxy(node: &str) -> String {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let node = node.to_string();
    std::thread::spawn(move || {
        for (index, client) in listener.incoming().enumerate() {
            let Ok(mut client) = client else { return };
            let node = node.clone();
            std::thread::spawn(move || {
                let Ok(mut upstream) = TcpStream::connect(&node) else {
                    return;
                };
                let (Ok(mut client_read), Ok(mut upstream_read)) =
                    (client.try_clone(), upstream.try_clone())
                else {
                    return;
                };
                let up = std::thread::spawn(move || {
                    let _ = std::io::copy(&mut client_read, &mut upstream);
                    let _ = upstream.shutdown(Shutdown::Write);
                });
                if index == 0 {
                    // Read the node's whole answer, send none of it.
                    let mut answer = [0u8; 4096];
                    let _ = upstream_read.read(&mut answer);
                    let _ = client.shutdown(Shutdown::Both);
                } else {
                    let mut buf = [0u8; 8192];
                    while let Ok(n) = upstream_read.read(&mut buf) {
                        if n == 0 || client.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = client.shutdown(Shutdown::Write);
                }
                let _ = up.join();
            });
        }
    });
    addr
}

#[test]
fn the_clients_retry_of_a_produce_whose_answer_was_lost_is_stored_once() {
    use narad_client::blocking::Client;
    use narad_client::Outgoing;
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic("once", json!({"partitions": 2}));
    for batch in [false, true] {
        let proxy = answer_losing_proxy(&node.addr);
        let client = Client::builder(&format!("http://{proxy}"))
            .build()
            .expect("client");
        let before = stored_when_committed(&node, "once");
        let id = if batch {
            let messages = [Outgoing::new("b1"), Outgoing::new("b2")];
            let answer = client
                .produce_batch_detailed("once", &messages)
                .expect("the retry is answered");
            assert_eq!(answer.duplicates, vec![0, 1], "{answer:?}");
            answer.ids[0].clone()
        } else {
            let produced = client
                .produce_message("once", &Outgoing::new("single"))
                .expect("the retry is answered");
            assert!(produced.duplicate, "the first attempt was stored");
            produced.id
        };
        let expected = if batch { 2 } else { 1 };
        assert_eq!(
            stored_when_committed(&node, "once") - before,
            expected,
            "the client's retry stored nothing new"
        );
        let seen = consume_all(&node, "once");
        assert_eq!(seen.get(&id), Some(&1), "{seen:?}");
    }
    // Without keys (for an older release), the same loss stores a copy twice.
    let proxy = answer_losing_proxy(&node.addr);
    let client = Client::builder(&format!("http://{proxy}"))
        .idempotency_keys(false)
        .build()
        .expect("client");
    let before = stored_when_committed(&node, "once");
    client.produce("once", None, "twice").expect("answered");
    assert_eq!(stored_when_committed(&node, "once") - before, 2);
}

#[test]
fn the_cli_sends_a_given_idempotency_key_and_says_when_it_was_a_duplicate() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic("once", json!({"partitions": 1}));
    let produce = |args: &[&str]| {
        let (ok, out, err) = support::narad(&node, args);
        assert!(ok, "{args:?}: {err}");
        serde_json::from_str::<Value>(&out).expect("json")
    };
    let args = [
        "produce",
        "once",
        "order 1",
        "--idempotency-key",
        "order-1",
        "--output",
        "json",
    ];
    let first = produce(&args);
    assert!(first.get("duplicate").is_none(), "{first}");
    let again = produce(&args);
    assert_eq!(again["id"], first["id"], "{again}");
    assert_eq!(again["duplicate"], true, "{again}");
    let lines = [
        "produce",
        "once",
        "a\nb\nc",
        "--lines",
        "--batch",
        "2",
        "--idempotency-key",
        "run-7",
        "--output",
        "json",
    ];
    let first = produce(&lines);
    let again = produce(&lines);
    assert_eq!(first["ids"], again["ids"], "line N is run-7-N both times");
    assert_eq!(stored_when_committed(&node, "once"), 4);
    let (ok, _, err) = support::narad(&node, &["produce", "once", "x", "--idempotency-key", ""]);
    assert!(!ok);
    assert!(err.contains("Narad-Idempotency-Key"), "{err}");
}

/// `narad_produce_duplicates_total` summed over a node's topics, for `at`.
fn duplicates_at(node: &Node, at: &str) -> f64 {
    let (_, _, body) = support::raw_request(&node.addr, "GET", "/metrics", &[], b"");
    let label = format!("at=\"{at}\"");
    String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| l.starts_with("narad_produce_duplicates_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// A retry sent to another node is accepted there under a new id, and its
/// copy meets the first at the partition's owner, which stores it not:
/// every key is delivered once, with its first value, also after each
/// owner restarted and rebuilt its keys from its log.
#[test]
fn a_retry_sent_to_another_node_is_dropped_at_the_owner_across_its_restarts() {
    let mut cluster = support::cluster::Cluster::start(3);
    cluster.wait_ready(Duration::from_secs(30));
    cluster.nodes[0].create_topic("orders", json!({"partitions": 6}));
    let keys: Vec<String> = (0..24).map(|i| format!("order-{i}")).collect();
    let mut first = std::collections::BTreeMap::new();
    for key in &keys {
        let (id, duplicate) = accepted(&cluster.nodes[0], "orders", key, &format!("{key}:first"));
        assert!(!duplicate);
        first.insert(key.clone(), id);
    }
    for node in &cluster.nodes {
        stored_when_committed(node, "orders");
    }
    // A retry at node 2 (before every node restarted, one after another,
    // and rebuilt its keys), then one at node 3, which never saw them.
    let mut retries = 0;
    for (round, at) in [1, 2].into_iter().enumerate() {
        for key in &keys {
            let value = format!("{key}:retry-{round}");
            let (id, duplicate) = accepted(&cluster.nodes[at], "orders", key, &value);
            assert!(!duplicate, "node {} does not know the key", at + 1);
            assert_ne!(id, first[key], "another node gives a new id");
            retries += 1;
        }
        for node in &cluster.nodes {
            stored_when_committed(node, "orders");
        }
        if round == 0 {
            for index in 0..cluster.nodes.len() {
                if index == 0 {
                    cluster.nodes[index].terminate();
                } else {
                    cluster.nodes[index].kill();
                }
                cluster.restart_node(index, &[]);
                cluster.wait_ready(Duration::from_secs(30));
            }
        }
    }
    // Every owner answers for its partitions again (after the restarts
    // some take a moment), and holds each key once.
    stored_when_committed(&cluster.nodes[0], "orders");
    let complete = eventually(Duration::from_secs(20), || {
        stored(&cluster.nodes[0], "orders") >= 24
    });
    assert!(complete, "every partition's figures come back");
    assert_eq!(stored(&cluster.nodes[0], "orders"), 24);
    let delivered = drain(&cluster.nodes[0], "orders");
    let mut values: Vec<String> = delivered.into_iter().map(|(_, v, _)| v).collect();
    values.sort();
    let mut expected: Vec<String> = keys.iter().map(|k| format!("{k}:first")).collect();
    expected.sort();
    assert_eq!(values, expected, "each key once, with its first value");
    // Counted at the owners: those that restarted count afresh, so at
    // least the last round's retries are in the figures.
    let counted: f64 = cluster
        .nodes
        .iter()
        .map(|n| duplicates_at(n, "owner"))
        .sum();
    assert!(
        counted >= keys.len() as f64 && counted <= f64::from(retries),
        "{counted} duplicates counted at the owners"
    );
    // The exception: with an owner gone, keyed records for its partitions
    // go to a sibling after 3 s, and are counted.
    let owners = cluster.owners("orders");
    cluster.nodes[2].kill();
    let keys: Vec<String> = (0..200)
        .map(|i| format!("rerouted-{i}"))
        .filter(|k| owners[partition_for_key(k.as_bytes(), 6) as usize] == 2)
        .take(3)
        .collect();
    assert!(!keys.is_empty(), "some key lands on node 3's partitions");
    for key in &keys {
        accepted(&cluster.nodes[0], "orders", key, key);
    }
    let rerouted = "narad_idempotency_keys_rerouted_total{topic=\"orders\"}";
    let counted = eventually(Duration::from_secs(20), || {
        metric(&cluster.nodes[0], rerouted) >= keys.len() as f64
    });
    assert!(
        counted,
        "keyed records rerouted around a dead owner are counted"
    );
}
