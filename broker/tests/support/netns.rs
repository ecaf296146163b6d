//! A network for a test cluster: each node in a network namespace of its
//! own, every node joined to one router namespace by a veth pair, and the
//! test process reaching every node through the router. Addresses exist
//! only inside these namespaces (and one route in the test's own).
//!
//! A cut drops packets silently in the router, as a firewall's DROP does:
//! a policy rule of type `blackhole` per direction, so nothing answers a
//! refused connection or an ICMP error, and a node learns of a cut only by
//! its timeouts. Needs root and `ip` (iproute2), nothing else.
//!
//! Names: namespaces `narad-{pid}-c{net}-r` (router) and
//! `narad-{pid}-c{net}-n{node}`; the test's end of the router's uplink is
//! the interface `narad-up{net}`, which doubles as the lock on the subnet
//! number `net`. A run that was killed leaves namespaces whose pid is gone:
//! [`Network::new`] removes them first.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// What the cut rules are numbered in the router (before the main table's
/// rule at 32766).
const CUT_RULE_PREF: &str = "100";
/// Every node's peer (QUIC) port: each node has its own address.
pub const PEER_PORT: u16 = 7100;
/// Every node's client (HTTP) port.
pub const CLIENT_PORT: u16 = 7180;
/// Subnet numbers tried for a new network (10.77.{net}.0/24 for the nodes,
/// 10.78.{net}.0/30 for the uplink).
const NETWORKS: u8 = 250;

/// Why these tests cannot run here, if they cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("network namespaces need root".into());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(out) if out.status.success() => None,
        _ => Some("`ip` (iproute2) is not installed".into()),
    }
}

/// Whether a namespaced test may run: `true` if it can; `false` (with a
/// line saying why) if it cannot and `NARAD_NETNS` is not `required`; a
/// panic if it cannot and is required (as `.ci/run` requires it).
pub fn can_run(test: &str) -> bool {
    let Some(why) = unavailable() else {
        return true;
    };
    assert!(
        std::env::var("NARAD_NETNS").as_deref() != Ok("required"),
        "{test}: NARAD_NETNS=required, but {why}"
    );
    eprintln!("{test}: skipped: {why} (set NARAD_NETNS=required to fail instead)");
    false
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip {args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn must(args: &[&str]) {
    ip(args).unwrap_or_else(|e| panic!("network setup: {e}"));
}

/// Removes the namespaces of runs whose process is gone.
fn remove_leftovers() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(pid) = name
            .strip_prefix("narad-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// One way of a link that carries nothing: packets from `.0` to `.1`.
type Cut = (usize, usize);

pub struct Network {
    net: u8,
    nodes: usize,
    cuts: Mutex<BTreeSet<Cut>>,
}

impl Network {
    /// Makes the router and `nodes` node namespaces, all links up.
    pub fn new(nodes: usize) -> Self {
        remove_leftovers();
        let net = (0..NETWORKS)
            .find(|net| {
                // The uplink's name is the lock on the subnet number.
                let router = Self::name(*net, "r");
                ip(&["netns", "add", &router]).is_ok()
                    && (ip(&[
                        "link",
                        "add",
                        &format!("narad-up{net}"),
                        "type",
                        "veth",
                        "peer",
                        "name",
                        "uplink",
                        "netns",
                        &router,
                    ])
                    .is_ok()
                        || {
                            let _ = ip(&["netns", "del", &router]);
                            false
                        })
            })
            .expect("a free subnet number for a test network");
        let network = Self {
            net,
            nodes,
            cuts: Mutex::default(),
        };
        network.wire();
        network
    }

    fn name(net: u8, what: &str) -> String {
        format!("narad-{}-c{net}-{what}", std::process::id())
    }

    fn router(&self) -> String {
        Self::name(self.net, "r")
    }

    /// How many nodes the network joins.
    pub fn size(&self) -> usize {
        self.nodes
    }

    /// Node `index`'s (0-based) namespace.
    pub fn namespace(&self, index: usize) -> String {
        Self::name(self.net, &format!("n{index}"))
    }

    /// Node `index`'s address, the only one it has besides loopback.
    pub fn host(&self, index: usize) -> String {
        format!("10.77.{}.{}", self.net, 4 * index + 2)
    }

    /// The command prefix that runs a program as node `index`.
    pub fn launcher(&self, index: usize) -> Vec<String> {
        ["ip", "netns", "exec", &self.namespace(index)]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    fn in_router(&self, args: &[&str]) -> Result<(), String> {
        let router = self.router();
        let mut all = vec!["-n", &router];
        all.extend_from_slice(args);
        ip(&all)
    }

    fn wire(&self) {
        let net = self.net;
        let router = self.router();
        let uplink = format!("narad-up{net}");
        // The test's end of the uplink, and the way to every node.
        must(&["addr", "add", &format!("10.78.{net}.1/30"), "dev", &uplink]);
        must(&["link", "set", &uplink, "up"]);
        must(&["-n", &router, "link", "set", "lo", "up"]);
        must(&[
            "-n",
            &router,
            "addr",
            "add",
            &format!("10.78.{net}.2/30"),
            "dev",
            "uplink",
        ]);
        must(&["-n", &router, "link", "set", "uplink", "up"]);
        must(&[
            "-n",
            &router,
            "route",
            "add",
            "default",
            "via",
            &format!("10.78.{net}.1"),
        ]);
        must(&[
            "route",
            "add",
            &format!("10.77.{net}.0/24"),
            "via",
            &format!("10.78.{net}.2"),
        ]);
        let status = Command::new("ip")
            .args(["netns", "exec", &router, "sh", "-c"])
            .arg("echo 1 > /proc/sys/net/ipv4/ip_forward")
            .status()
            .expect("ip netns exec");
        assert!(status.success(), "forwarding on in the router");
        for index in 0..self.nodes {
            let ns = self.namespace(index);
            must(&["netns", "add", &ns]);
            must(&["-n", &ns, "link", "set", "lo", "up"]);
            // The node's end is eth0 in its namespace; the router's is n{i}.
            must(&[
                "-n",
                &ns,
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                &format!("n{index}"),
                "netns",
                &router,
            ]);
            let base = 4 * index;
            must(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("10.77.{net}.{}/30", base + 2),
                "dev",
                "eth0",
            ]);
            must(&["-n", &ns, "link", "set", "eth0", "up"]);
            must(&[
                "-n",
                &router,
                "addr",
                "add",
                &format!("10.77.{net}.{}/30", base + 1),
                "dev",
                &format!("n{index}"),
            ]);
            must(&["-n", &router, "link", "set", &format!("n{index}"), "up"]);
            must(&[
                "-n",
                &ns,
                "route",
                "add",
                "default",
                "via",
                &format!("10.77.{net}.{}", base + 1),
            ]);
        }
    }

    fn rule(&self, verb: &str, (from, to): Cut) -> Result<(), String> {
        self.in_router(&[
            "rule",
            verb,
            "pref",
            CUT_RULE_PREF,
            "from",
            &self.host(from),
            "to",
            &self.host(to),
            "blackhole",
        ])
    }

    /// Packets from node `from` to node `to` are dropped from now on (the
    /// other way still carries).
    pub fn cut(&self, from: usize, to: usize) {
        let mut cuts = self.cuts.lock().expect("cuts");
        if cuts.insert((from, to)) {
            self.rule("add", (from, to))
                .unwrap_or_else(|e| panic!("cut: {e}"));
        }
    }

    /// Both ways between `a` and `b`.
    pub fn cut_both(&self, a: usize, b: usize) {
        self.cut(a, b);
        self.cut(b, a);
    }

    /// Node `node` from every other node, both ways (the test still
    /// reaches it).
    pub fn isolate(&self, node: usize) {
        for other in (0..self.nodes).filter(|o| *o != node) {
            self.cut_both(node, other);
        }
    }

    /// Every link carries again.
    pub fn heal(&self) {
        let mut cuts = self.cuts.lock().expect("cuts");
        for cut in std::mem::take(&mut *cuts) {
            self.rule("del", cut)
                .unwrap_or_else(|e| panic!("heal: {e}"));
        }
    }

    /// The one-way cuts in force.
    pub fn cuts(&self) -> BTreeSet<Cut> {
        self.cuts.lock().expect("cuts").clone()
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // The router's namespace takes the uplink (and its route) with it.
        for index in 0..self.nodes {
            let _ = ip(&["netns", "del", &self.namespace(index)]);
        }
        let _ = ip(&["netns", "del", &self.router()]);
    }
}
