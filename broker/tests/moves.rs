//! Scaling out and in with real processes: a fourth node joins a running
//! cluster with `--join`, a rebalance under produce load moves partitions
//! to it, and a decommission moves every partition off a node; every
//! message answered 202 is consumed, and acked ones stay acked.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::cluster::{Cluster, CLUSTER_SECRET};
use support::{consume_all, eventually, Node, Producers};

const MOVES_DEADLINE: Duration = Duration::from_secs(90);

fn narad(node: &Node, args: &[&str]) -> (bool, String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(args)
        .env("NARAD_URL", format!("http://{}", node.addr))
        .output()
        .expect("run narad");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("udp port")
        .port()
}

fn node_state(node: &Node, id: u64) -> Option<(String, u64)> {
    let (_, cluster) = node.request("GET", "/v1/cluster", b"");
    cluster["nodes"].as_array()?.iter().find_map(|n| {
        (n["id"] == id).then(|| {
            (
                n["state"].as_str().unwrap_or_default().to_string(),
                n["partitions"].as_u64().unwrap_or(0),
            )
        })
    })
}

fn moves_settled(node: &Node, ids: &[String]) -> bool {
    let (_, answer) = node.request("GET", "/v1/cluster/moves", b"");
    let Some(moves) = answer["moves"].as_array() else {
        return false;
    };
    ids.iter().all(|id| {
        moves
            .iter()
            .find(|m| m["id"] == id.as_str())
            .is_some_and(|m| m["state"] == "done")
    })
}

fn move_ids(answer: &Value) -> Vec<String> {
    answer["moves"]
        .as_array()
        .map(|moves| {
            moves
                .iter()
                .filter_map(|m| m["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_joined_node_takes_partitions_in_a_rebalance_and_a_decommission_empties_a_node_under_load() {
    let mut cluster = Cluster::start_with(3, &["--set", "cluster.max_concurrent_moves=2"]);
    let first = &cluster.nodes[0];
    first.create_topic("load", json!({"partitions": 6}));
    // Some messages consumed and acked before any move: they must stay acked.
    for i in 0..60 {
        first.produce("load", &format!("before-{i}"));
    }
    let early = consume_all(first, "load");
    assert_eq!(early.len(), 60);

    // A fourth node joins through node 2's peer address.
    let tmp = tempfile::tempdir().expect("tmp");
    let port = free_udp_port();
    let join = format!("127.0.0.1:{}", cluster.ports[1]);
    let fourth = Node::start(
        &tmp.path().join("n4"),
        &[
            "--node-id",
            "4",
            "--peer-listen",
            &format!("127.0.0.1:{port}"),
            "--join",
            &join,
            "--cluster-secret",
            CLUSTER_SECRET,
            "--set",
            "storage.wal_ring_bytes=67108864",
        ],
    );
    assert!(
        eventually(MOVES_DEADLINE, || node_state(first, 4)
            .is_some_and(|(state, _)| state == "alive")),
        "node 4 became a voter: {:?}",
        node_state(first, 4)
    );

    let producers = Producers::start(&cluster.nodes[2].addr, "load", 4);
    assert!(eventually(MOVES_DEADLINE, || producers.accepted_count() > 100));
    // The rebalance through the CLI.
    let (ok, out, err) = narad(first, &["cluster", "rebalance", "--output", "json"]);
    assert!(ok, "{err}");
    let planned: Value = serde_json::from_str(&out).expect("the plan as JSON");
    let ids = move_ids(&planned);
    assert!(!ids.is_empty(), "a fourth node gets partitions: {planned}");
    assert!(
        eventually(MOVES_DEADLINE, || moves_settled(first, &ids)),
        "the rebalance's moves ended done: {}",
        first.request("GET", "/v1/cluster/moves", b"").1
    );
    assert!(node_state(first, 4).is_some_and(|(_, partitions)| partitions >= 1));

    // Node 3 leaves: every partition moves off it, under the same load.
    let (status, planned) = first.json("POST", "/v1/cluster/nodes/3/decommission", json!({}));
    assert_eq!(status, 202, "{planned}");
    let ids = move_ids(&planned);
    assert!(
        eventually(MOVES_DEADLINE, || moves_settled(first, &ids)),
        "the decommission's moves ended done: {}",
        first.request("GET", "/v1/cluster/moves", b"").1
    );
    assert!(
        eventually(MOVES_DEADLINE, || node_state(first, 3).is_some_and(
            |(state, partitions)| state == "decommissioned" && partitions == 0
        )),
        "node 3 is decommissioned: {:?}",
        node_state(first, 3)
    );
    // The moves are listed with their figures, also by the CLI.
    let (ok, out, err) = narad(first, &["cluster", "moves"]);
    assert!(
        ok && out.contains("done") && out.contains("load/"),
        "{out}{err}"
    );
    let (ok, _, err) = narad(first, &["cluster", "decommission", "99"]);
    assert!(
        !ok && err.contains("99"),
        "an unknown node is refused: {err}"
    );
    let (_, listed) = first.request("GET", "/v1/cluster/moves", b"");
    let done = listed["moves"].as_array().expect("moves");
    assert!(done
        .iter()
        .all(|m| m["from"].is_u64() && m["to"].is_u64() && m["copied_bytes"].is_u64()));

    let accepted = producers.finish();
    assert!(accepted.len() > 200, "{} accepted", accepted.len());
    // A decommissioned node may be removed; then it is gone from the cluster.
    let (status, answer) = first.request("DELETE", "/v1/cluster/nodes/2", b"");
    assert_eq!(status, 409, "an alive node in service stays: {answer}");
    let (ok, out, err) = narad(first, &["cluster", "remove", "3"]);
    assert!(ok && out.contains("removed"), "{out}{err}");
    assert!(eventually(MOVES_DEADLINE, || node_state(first, 3).is_none()));
    cluster.nodes[2].terminate();

    // Every message answered 202 arrives; none acked before the moves comes back.
    let seen = consume_all(&fourth, "load");
    let missing: Vec<&String> = accepted
        .iter()
        .filter(|id| !seen.contains_key(*id))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} lost: {:?}",
        missing.len(),
        accepted.len(),
        &missing[..missing.len().min(5)]
    );
    let again: Vec<&String> = early.keys().filter(|id| seen.contains_key(*id)).collect();
    assert!(
        again.is_empty(),
        "acked before the moves, delivered again: {again:?}"
    );
    drop(fourth);
}
