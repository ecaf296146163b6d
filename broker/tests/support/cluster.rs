//! A cluster of real `narad` nodes on loopback: QUIC ports picked free,
//! every node told of every other, mutual TLS from one cluster secret.

use std::time::Duration;

use serde_json::Value;

use super::netns::{self, Network};
use super::{eventually, Node};

pub const CLUSTER_SECRET: &str = "dev-secret";
const CLUSTER_WAL_RING: &str = "storage.wal_ring_bytes=134217728";

pub fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("udp port")
        .port()
}

pub struct Cluster {
    pub nodes: Vec<Node>,
    pub peers: String,
    pub ports: Vec<u16>,
    /// Each node's address (loopback unless the nodes have a network).
    pub hosts: Vec<String>,
    /// The nodes' network, if they run in namespaces of their own (it goes
    /// after the nodes).
    pub network: Option<std::sync::Arc<Network>>,
    _tmp: tempfile::TempDir,
}

pub fn flags(id: usize, port: u16, peers: &str, secret: &str) -> Vec<String> {
    flags_at(id, "127.0.0.1", port, peers, secret)
}

pub fn flags_at(id: usize, host: &str, port: u16, peers: &str, secret: &str) -> Vec<String> {
    [
        "--node-id",
        &id.to_string(),
        "--peer-listen",
        &format!("{host}:{port}"),
        "--peers",
        peers,
        "--cluster-secret",
        secret,
        // Records for an unreachable owner hold the WAL ring until the
        // reroute, and idempotency keys hold their records' place for
        // their window: a ring that outlasts both under test load (at
        // 64 MiB a node that took every producer's traffic while deaf to
        // the others filled it within a suite and answered 429).
        "--set",
        CLUSTER_WAL_RING,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

pub fn as_strs(flags: &[String]) -> Vec<&str> {
    flags.iter().map(String::as_str).collect()
}

impl Cluster {
    pub fn start(size: usize) -> Self {
        Self::start_with(size, &[])
    }

    pub fn start_with(size: usize, extra: &[&str]) -> Self {
        Self::start_each(size, |_| extra.iter().map(|s| s.to_string()).collect())
    }

    /// Starts `size` nodes, node `i` (0-based) with the flags `extra(i)`.
    pub fn start_each(size: usize, extra: impl Fn(usize) -> Vec<String>) -> Self {
        let tmp = tempfile::tempdir().expect("tmp");
        let ports: Vec<u16> = (0..size).map(|_| free_udp_port()).collect();
        let peers = ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let nodes = (0..size)
            .map(|i| {
                let mut flags = flags(i + 1, ports[i], &peers, CLUSTER_SECRET);
                flags.extend(extra(i));
                Node::start(&tmp.path().join(format!("n{}", i + 1)), &as_strs(&flags))
            })
            .collect();
        Self {
            nodes,
            peers,
            ports,
            hosts: vec!["127.0.0.1".to_string(); size],
            network: None,
            _tmp: tmp,
        }
    }

    /// Starts one node in each of `network`'s node namespaces, node `i`
    /// with the flags `extra(i)`, each at its own address (see
    /// [`netns`]).
    pub fn start_on(
        network: std::sync::Arc<Network>,
        extra: impl Fn(usize) -> Vec<String>,
    ) -> Self {
        let tmp = tempfile::tempdir().expect("tmp");
        let size = network.size();
        let hosts: Vec<String> = (0..size).map(|i| network.host(i)).collect();
        let ports = vec![netns::PEER_PORT; size];
        let peers = hosts
            .iter()
            .enumerate()
            .map(|(i, h)| format!("{}={h}:{}", i + 1, netns::PEER_PORT))
            .collect::<Vec<_>>()
            .join(",");
        let nodes = (0..size)
            .map(|i| {
                let mut flags = flags_at(i + 1, &hosts[i], ports[i], &peers, CLUSTER_SECRET);
                flags.extend([
                    "--listen".to_string(),
                    format!("{}:{}", hosts[i], netns::CLIENT_PORT),
                ]);
                flags.extend(extra(i));
                Node::start_by(
                    &tmp.path().join(format!("n{}", i + 1)),
                    &as_strs(&flags),
                    network.launcher(i),
                )
            })
            .collect();
        Self {
            nodes,
            peers,
            ports,
            hosts,
            network: Some(network),
            _tmp: tmp,
        }
    }

    pub fn ready(&self, index: usize) -> bool {
        self.nodes[index].request("GET", "/readyz", b"").0 == 200
    }

    /// The Raft term a node reports.
    pub fn term(&self, index: usize) -> String {
        let (_, _, metrics) =
            super::raw_request(&self.nodes[index].addr, "GET", "/metrics", &[], b"");
        String::from_utf8_lossy(&metrics)
            .lines()
            .find_map(|l| l.strip_prefix("narad_raft_term ").map(str::to_string))
            .unwrap_or_default()
    }

    /// The index of the node that says it leads.
    pub fn leader(&self, among: &[usize]) -> Option<usize> {
        among.iter().copied().find(|i| {
            let (_, _, metrics) =
                super::raw_request(&self.nodes[*i].addr, "GET", "/metrics", &[], b"");
            String::from_utf8_lossy(&metrics).contains("\nnarad_raft_is_leader 1")
        })
    }

    /// Restarts node `index` (0-based) with its cluster flags and `extra`.
    pub fn restart_node(&mut self, index: usize, extra: &[String]) {
        let host = &self.hosts[index];
        let mut all = flags_at(
            index + 1,
            host,
            self.ports[index],
            &self.peers,
            CLUSTER_SECRET,
        );
        if self.network.is_some() {
            all.extend([
                "--listen".to_string(),
                format!("{host}:{}", netns::CLIENT_PORT),
            ]);
        }
        all.extend(extra.iter().cloned());
        self.nodes[index].restart_with(&as_strs(&all));
    }

    /// Waits until every node has a Raft leader.
    pub fn wait_ready(&self, deadline: Duration) {
        assert!(
            eventually(deadline, || (0..self.nodes.len()).all(|i| self.ready(i))),
            "every node ready within {deadline:?}"
        );
    }

    /// The topic as a node describes it.
    pub fn describe(&self, index: usize, topic: &str) -> Value {
        let (status, answer) =
            self.nodes[index].request("GET", &format!("/v1/topics/{topic}"), b"");
        assert_eq!(status, 200, "{answer}");
        answer
    }

    /// The index (into `nodes`) of the node that owns each partition.
    pub fn owners(&self, topic: &str) -> Vec<usize> {
        self.describe(0, topic)["partition_stats"]
            .as_array()
            .expect("partition_stats")
            .iter()
            .map(|p| p["owner"].as_u64().expect("owner") as usize - 1)
            .collect()
    }

    /// Every node's client address.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.addr.clone()).collect()
    }
}
