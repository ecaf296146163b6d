//! Process tests of remote children (docs/children.md, "What a remote
//! child promises"; docs/disaster-recovery.md): two single-node clusters
//! on loopback, the remote behind a proxy the test controls, so the link
//! can refuse, drop answers after the remote took a batch, or go slow.
//! Every message a 202 accepted on the parent arrives on the remote at
//! least once (duplicates only from resends), through an outage, a revoked
//! token, a crash of the parent's node and of the remote; what ages out of
//! the parent before it ships is skipped and counted; https is verified
//! against the configured CA and the byte rate kept; and a failover to the
//! remote cluster and back follows the documented steps.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};
use support::{child_status, eventually, metric, Access, Node};

const WAIT: Duration = Duration::from_secs(60);
const ADMIN_PASSWORD: &str = "admin-pw";

fn basic(user: &str, password: &str) -> String {
    let pair = format!("{user}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

/// What the proxy does to the link, switched while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    Forward,
    /// Closes every connection at once: the remote never sees a request.
    Refuse,
    /// The remote gets the request and answers; the answer is thrown away
    /// and the connection closed (this many times, then forwards again).
    DropAnswers(u64),
    /// Every answer waits this long on its way back.
    Slow(Duration),
}

/// A TCP proxy in front of the remote cluster, on an address that stays
/// while the remote restarts on another port.
struct Proxy {
    addr: String,
    target: Arc<Mutex<String>>,
    link: Arc<Mutex<Link>>,
    dropped: Arc<AtomicU64>,
}

impl Proxy {
    fn start(target: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("addr").to_string();
        let target = Arc::new(Mutex::new(target.to_string()));
        let link = Arc::new(Mutex::new(Link::Forward));
        let dropped = Arc::new(AtomicU64::new(0));
        let (to, mode, count) = (target.clone(), link.clone(), dropped.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let (to, mode, count) = (to.clone(), mode.clone(), count.clone());
                std::thread::spawn(move || relay(client, &to, &mode, &count));
            }
        });
        Self {
            addr,
            target,
            link,
            dropped,
        }
    }

    fn set(&self, link: Link) {
        *self.link.lock().expect("link") = link;
    }

    fn retarget(&self, target: &str) {
        *self.target.lock().expect("target") = target.to_string();
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

fn relay(client: TcpStream, target: &Mutex<String>, link: &Mutex<Link>, dropped: &AtomicU64) {
    if *link.lock().expect("link") == Link::Refuse {
        return;
    }
    let to = target.lock().expect("target").clone();
    let Ok(server) = TcpStream::connect(&to) else {
        return;
    };
    let (Ok(mut client_in), Ok(mut server_out)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let upstream = std::thread::spawn(move || {
        let mut buf = [0u8; 64 * 1024];
        while let Ok(n) = client_in.read(&mut buf) {
            if n == 0 || server_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = server_out.shutdown(std::net::Shutdown::Write);
    });
    let (mut server_in, mut client_out) = (server, client);
    let mut buf = [0u8; 64 * 1024];
    while let Ok(n) = server_in.read(&mut buf) {
        if n == 0 {
            break;
        }
        let now = *link.lock().expect("link");
        match now {
            Link::Refuse => break,
            Link::DropAnswers(left) => {
                if left > 0 {
                    *link.lock().expect("link") = if left == 1 {
                        Link::Forward
                    } else {
                        Link::DropAnswers(left - 1)
                    };
                }
                dropped.fetch_add(1, Ordering::SeqCst);
                break;
            }
            Link::Slow(pause) => std::thread::sleep(pause),
            Link::Forward => {}
        }
        if client_out.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = client_out.shutdown(std::net::Shutdown::Both);
    let _ = server_in.shutdown(std::net::Shutdown::Both);
    let _ = upstream.join();
}

fn admin_access() -> Access {
    Access {
        tls: None,
        authorization: Some(basic("admin", ADMIN_PASSWORD)),
    }
}

/// A node with auth on; every request helper reaches it as `admin`.
fn start_secured(dir: &std::path::Path) -> Node {
    let mut node = Node::start(
        dir,
        &[
            "--set",
            "auth.enabled=true",
            "--set",
            &format!("auth.admin_password={ADMIN_PASSWORD}"),
        ],
    );
    node.set_access(admin_access());
    assert!(
        eventually(Duration::from_secs(20), || node
            .request("GET", "/v1/topics", b"")
            .0
            == 200),
        "the user admin is bootstrapped"
    );
    node
}

/// A token of `user` (created if new) with produce on `topic`: (id, token).
fn produce_token(node: &Node, user: &str, topic: &str) -> (String, String) {
    let (status, answer) = node.json(
        "PUT",
        &format!("/v1/users/{user}"),
        json!({"password": "shipper-pw"}),
    );
    assert!(status == 201 || status == 200, "{answer}");
    let (status, answer) = node.json(
        "PUT",
        &format!("/v1/users/{user}/grants"),
        json!({"grants": [{"topic": topic, "actions": ["produce"]}]}),
    );
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = node.json("POST", &format!("/v1/users/{user}/tokens"), json!({}));
    assert_eq!(status, 201, "{answer}");
    (
        answer["id"].as_str().expect("id").to_string(),
        answer["token"].as_str().expect("token").to_string(),
    )
}

fn remote_child(node: &Node, parent: &str, child: &str, remote: Value) -> (u16, Value) {
    node.json(
        "PUT",
        &format!("/v1/topics/{parent}/children/{child}"),
        json!({"kind": "remote", "remote": remote}),
    )
}

/// Produces `count` messages with values `{tag}-{i}` in batches of 50 (with
/// keys on every other one); returns the values answered 202, stopping at
/// the first batch that is not (a node that was killed).
fn produce(node: &Node, topic: &str, tag: &str, count: usize) -> Vec<String> {
    produce_at(&node.addr, topic, tag, count)
}

fn produce_at(addr: &str, topic: &str, tag: &str, count: usize) -> Vec<String> {
    let mut accepted = Vec::new();
    let values: Vec<String> = (0..count).map(|i| format!("{tag}-{i}")).collect();
    for chunk in values.chunks(50) {
        let messages: Vec<Value> = chunk
            .iter()
            .enumerate()
            .map(|(i, value)| {
                if i % 2 == 0 {
                    json!({"key": format!("k{}", i % 5), "value": value})
                } else {
                    json!({"value": value})
                }
            })
            .collect();
        let body = json!({ "messages": messages }).to_string();
        let path = format!("/v1/topics/{topic}/messages/batch");
        let Ok((202, answer)) = support::try_request(
            addr,
            "POST",
            &path,
            body.as_bytes(),
            support::REQUEST_DEADLINE,
        ) else {
            break;
        };
        assert_eq!(answer["ids"].as_array().map(Vec::len), Some(chunk.len()));
        accepted.extend(chunk.iter().cloned());
    }
    accepted
}

/// Consumes and acks `topic` until every value in `expected` was seen:
/// value → how often it was delivered (duplicates included).
fn collect(
    node: &Node,
    topic: &str,
    expected: &BTreeSet<String>,
    seen: &mut BTreeMap<String, u64>,
) {
    let done = eventually(WAIT, || {
        let messages = node.consume(topic, json!({"max_messages": 500, "wait_ms": 200}));
        if !messages.is_empty() {
            support::ack_batch(node, topic, &messages);
        }
        for message in &messages {
            let value = message["value"].as_str().unwrap_or_default().to_string();
            *seen.entry(value).or_insert(0) += 1;
        }
        expected.iter().all(|v| seen.contains_key(v))
    });
    let missing: Vec<&String> = expected
        .iter()
        .filter(|v| !seen.contains_key(*v))
        .take(5)
        .collect();
    assert!(
        done,
        "{} of {} messages never reached {topic}, e.g. {missing:?}",
        expected.iter().filter(|v| !seen.contains_key(*v)).count(),
        expected.len()
    );
}

#[test]
fn a_remote_child_ships_every_accepted_message_through_outages_refusals_and_crashes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut remote = start_secured(&tmp.path().join("remote"));
    remote.create_topic("orders-dr", json!({"partitions": 3}));
    let (first_id, first_token) = produce_token(&remote, "shipper", "orders-dr");
    let proxy = Proxy::start(&remote.addr);

    let mut primary = Node::start(&tmp.path().join("primary"), &["--shards", "2"]);
    primary.create_topic("orders", json!({"partitions": 4}));
    let early = produce(&primary, "orders", "before-the-child", 20);
    assert_eq!(early.len(), 20);
    let target = json!({"url": proxy.url(), "topic": "orders-dr", "token": first_token});
    let (status, answer) = remote_child(&primary, "orders", "dr", target.clone());
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["kind"], "remote");
    assert_eq!(answer["remote"]["url"], proxy.url());
    assert_eq!(answer["remote"]["topic"], "orders-dr");
    let (status, again) = remote_child(&primary, "orders", "dr", target);
    assert_eq!(status, 200, "the same child again is an update: {again}");
    // The token is never shown again.
    assert!(!answer.to_string().contains(&first_token), "{answer}");
    for path in ["/v1/topics/orders/children", "/v1/topics/orders"] {
        let (_, shown) = primary.request("GET", path, b"");
        assert!(!shown.to_string().contains(&first_token), "{path}: {shown}");
    }
    assert_eq!(
        child_status(&primary, "orders", "dr")["remote"]["topic"],
        "orders-dr"
    );

    // Under load.
    let mut accepted: BTreeSet<String> = produce(&primary, "orders", "load", 2_000)
        .into_iter()
        .collect();
    assert_eq!(accepted.len(), 2_000);
    let mut seen = BTreeMap::new();
    collect(&remote, "orders-dr", &accepted, &mut seen);
    assert!(eventually(WAIT, || {
        let status = child_status(&primary, "orders", "dr");
        status["lag_messages"] == 0 && status["state"] == "copying"
    }));
    // Nothing waits: the headroom is the parent's whole retention (7 days).
    let headroom = metric(
        &primary,
        r#"narad_remote_child_headroom_seconds{parent="orders",child="dr"}"#,
    );
    assert!((headroom - 604_800.0).abs() < 1.0, "headroom {headroom}");

    // The remote unreachable: failing, then caught up when it returns.
    proxy.set(Link::Refuse);
    let during = produce(&primary, "orders", "outage", 200);
    assert!(eventually(WAIT, || {
        let status = child_status(&primary, "orders", "dr");
        status["state"] == "failing"
            && status["last_error"]
                .as_str()
                .is_some_and(|e| e.contains(&proxy.addr))
            && status["lag_messages"].as_u64().is_some_and(|l| l > 0)
    }));
    let waiting = metric(
        &primary,
        r#"narad_remote_child_headroom_seconds{parent="orders",child="dr"}"#,
    );
    assert!(
        waiting > 0.0 && waiting <= 604_800.0,
        "headroom {waiting} while messages wait"
    );
    proxy.set(Link::Forward);
    accepted.extend(during.iter().cloned());
    collect(
        &remote,
        "orders-dr",
        &during.into_iter().collect(),
        &mut seen,
    );

    // Answers lost after the remote took the batch: sent again.
    proxy.set(Link::DropAnswers(3));
    let resent = produce(&primary, "orders", "resent", 300);
    accepted.extend(resent.iter().cloned());
    collect(
        &remote,
        "orders-dr",
        &resent.into_iter().collect(),
        &mut seen,
    );
    assert!(proxy.dropped.load(Ordering::SeqCst) >= 3);

    // A slow remote: the copy trails, then catches up.
    proxy.set(Link::Slow(Duration::from_millis(200)));
    let slow = produce(&primary, "orders", "slow", 300);
    accepted.extend(slow.iter().cloned());
    collect(&remote, "orders-dr", &slow.into_iter().collect(), &mut seen);
    proxy.set(Link::Forward);

    // The token revoked on the remote: a clear error, and copying resumes
    // once the child has a new token.
    let (status, answer) = remote.request(
        "DELETE",
        &format!("/v1/users/shipper/tokens/{first_id}"),
        b"",
    );
    assert_eq!(status, 204, "{answer}");
    let refused = produce(&primary, "orders", "refused", 50);
    assert!(eventually(WAIT, || {
        let status = child_status(&primary, "orders", "dr");
        status["state"] == "failing"
            && status["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("401"))
    }));
    assert!(
        eventually(WAIT, || primary.stderr().contains("401")),
        "the refusal is logged"
    );
    let (_, second_token) = produce_token(&remote, "shipper", "orders-dr");
    let (status, answer) = remote_child(
        &primary,
        "orders",
        "dr",
        json!({"url": proxy.url(), "topic": "orders-dr", "token": second_token}),
    );
    assert_eq!(status, 200, "{answer}");
    accepted.extend(refused.iter().cloned());
    collect(
        &remote,
        "orders-dr",
        &refused.into_iter().collect(),
        &mut seen,
    );

    // The parent's node killed while it ships, and while it accepts more.
    let addr = primary.addr.clone();
    let producing = std::thread::spawn(move || produce_at(&addr, "orders", "crash", 2_000));
    assert!(eventually(WAIT, || {
        producing.is_finished()
            || child_status(&primary, "orders", "dr")["lag_messages"]
                .as_u64()
                .is_some_and(|lag| lag > 0)
    }));
    primary.kill();
    let busy = producing.join().expect("producer");
    primary.restart();
    accepted.extend(busy.iter().cloned());
    // The remote killed and back on another port, behind the same proxy.
    remote.kill();
    let meanwhile = produce(&primary, "orders", "remote-down", 100);
    remote.restart();
    proxy.retarget(&remote.addr);
    accepted.extend(meanwhile.iter().cloned());
    collect(&remote, "orders-dr", &accepted, &mut seen);

    // Every accepted message at least once; nothing no producer sent (the
    // messages accepted just before the child existed may be there too: a
    // new child starts about a second back); nothing dropped.
    let tags = [
        "before-the-child-",
        "load-",
        "outage-",
        "resent-",
        "slow-",
        "refused-",
        "crash-",
        "remote-down-",
    ];
    assert!(seen.keys().all(|v| tags.iter().any(|t| v.starts_with(t))));
    let status = child_status(&primary, "orders", "dr");
    assert_eq!(status["dropped_messages"], 0, "{status}");
    let twice = seen.values().filter(|n| **n > 1).count();
    eprintln!(
        "{} messages shipped, {twice} of them twice or more (resends)",
        accepted.len()
    );
    // The token was never written to either log.
    for log in [primary.stderr(), remote.stderr()] {
        assert!(!log.contains(&first_token) && !log.contains(&second_token));
    }
}

#[test]
fn failing_over_to_the_remote_cluster_and_back() {
    let tmp = tempfile::tempdir().expect("tmp");
    // Two clusters without auth: a remote child needs no token then.
    let standby = Node::start(&tmp.path().join("standby"), &[]);
    standby.create_topic("orders", json!({"partitions": 2}));
    let mut primary = Node::start(&tmp.path().join("primary"), &[]);
    primary.create_topic("orders", json!({"partitions": 2}));
    let (status, answer) = remote_child(
        &primary,
        "orders",
        "dr",
        json!({"url": format!("http://{}", standby.addr), "topic": "orders"}),
    );
    assert_eq!(status, 201, "{answer}");

    // The primary is lost right after accepting a burst: what it shipped
    // is on the standby, where consumers and producers go now.
    let before_loss: BTreeSet<String> = produce(&primary, "orders", "primary", 500)
        .into_iter()
        .collect();
    primary.kill();
    let mut on_standby = BTreeMap::new();
    let shipped = {
        let messages = standby.consume("orders", json!({"max_messages": 1000, "wait_ms": 200}));
        support::ack_batch(&standby, "orders", &messages);
        for message in &messages {
            let value = message["value"].as_str().unwrap_or_default().to_string();
            *on_standby.entry(value).or_insert(0) += 1;
        }
        messages.len()
    };
    let after_failover: BTreeSet<String> = produce(&standby, "orders", "standby", 100)
        .into_iter()
        .collect();
    collect(&standby, "orders", &after_failover, &mut on_standby);

    // The primary returns: its child ships what it had not; once its lag
    // is 0 the child goes, and the primary's old topic is emptied.
    primary.restart();
    collect(&standby, "orders", &before_loss, &mut on_standby);
    assert!(eventually(WAIT, || child_status(&primary, "orders", "dr")
        ["lag_messages"]
        == 0));
    let (status, answer) = primary.request("DELETE", "/v1/topics/orders/children/dr", b"");
    assert_eq!(status, 204, "{answer}");
    let (status, answer) = primary.request("DELETE", "/v1/topics/orders", b"");
    assert_eq!(status, 204, "{answer}");
    primary.create_topic("orders", json!({"partitions": 2}));

    // The other direction: the standby is the primary now, shipping back
    // (made with the CLI, as the docs show).
    let url = format!("http://{}", primary.addr);
    let (ok, out, err) = support::narad(
        &standby,
        &[
            "child",
            "create",
            "orders",
            "back",
            "--kind",
            "remote",
            "--remote-url",
            &url,
            "--remote-topic",
            "orders",
        ],
    );
    assert!(ok, "{out}{err}");
    assert!(out.contains("created remote child back of orders"), "{out}");
    let (ok, out, err) = support::narad(&standby, &["topic", "children", "orders"]);
    assert!(ok && out.contains("remote"), "{out}{err}");
    let reversed: BTreeSet<String> = produce(&standby, "orders", "reversed", 100)
        .into_iter()
        .collect();
    collect(&standby, "orders", &reversed, &mut on_standby);
    let mut on_primary = BTreeMap::new();
    collect(&primary, "orders", &reversed, &mut on_primary);
    // A new child also copies what its parent accepted up to about a
    // second before it existed (clocks of nodes differ): the standby's own
    // latest messages may come back too, nothing else.
    let strays: Vec<&String> = on_primary
        .keys()
        .filter(|v| !reversed.contains(*v) && !on_standby.contains_key(*v))
        .collect();
    assert!(strays.is_empty(), "the recreated topic holds {strays:?}");
    eprintln!(
        "{shipped} of {} messages were on the standby when the primary was lost",
        before_loss.len()
    );
}

#[test]
fn a_remote_child_verifies_the_remote_against_its_ca_and_keeps_to_its_rate() {
    use support::tls::{path, TestCa};
    let tmp = tempfile::tempdir().expect("tmp");
    let ca = TestCa::new(tmp.path(), "dr");
    let server = ca.issue("remote", &["127.0.0.1"]);
    let ca_file = path(&ca.cert_file);
    let mut remote = Node::start(
        &tmp.path().join("remote"),
        &[
            "--set",
            &format!("http.tls.cert_file={}", path(&server.cert_file)),
            "--set",
            &format!("http.tls.key_file={}", path(&server.key_file)),
        ],
    );
    let files = narad_net::tls::ClientTlsFiles {
        ca_file: Some(ca_file.clone()),
        ..Default::default()
    };
    remote.set_access(Access {
        tls: Some(narad_net::tls::client_config(&files).expect("client TLS")),
        authorization: None,
    });
    remote.create_topic("far", json!({"partitions": 2}));
    let target = json!({"url": format!("https://{}", remote.addr), "topic": "far"});

    // A node that trusts only the system's CAs does not trust the remote.
    let untrusting = Node::start(&tmp.path().join("untrusting"), &[]);
    untrusting.create_topic("orders", json!({"partitions": 2}));
    let (status, answer) = remote_child(&untrusting, "orders", "dr", target.clone());
    assert_eq!(status, 201, "{answer}");
    produce(&untrusting, "orders", "untrusted", 10);
    assert!(eventually(WAIT, || {
        let status = child_status(&untrusting, "orders", "dr");
        status["state"] == "failing"
            && status["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("CA"))
    }));

    // One given the remote's CA ships, at no more than the child's rate.
    let trusting = Node::start(
        &tmp.path().join("trusting"),
        &["--set", &format!("children.remote_ca_file={ca_file}")],
    );
    trusting.create_topic("orders", json!({"partitions": 2}));
    const RATE: u64 = 100_000;
    let mut limited = target.clone();
    limited["rate_bytes_per_s"] = json!(RATE);
    let (status, answer) = remote_child(&trusting, "orders", "dr", limited);
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["remote"]["rate_bytes_per_s"], RATE);
    let padding = "x".repeat(1_000);
    let started = std::time::Instant::now();
    let mut sent = BTreeSet::new();
    for chunk in 0..8 {
        let messages: Vec<Value> = (0..50)
            .map(|i| json!({"value": format!("rated-{chunk}-{i}-{padding}")}))
            .collect();
        let (status, answer) = trusting.json(
            "POST",
            "/v1/topics/orders/messages/batch",
            json!({ "messages": messages }),
        );
        assert_eq!(status, 202, "{answer}");
        sent.extend(
            messages
                .iter()
                .filter_map(|m| m["value"].as_str().map(str::to_string)),
        );
    }
    let bytes: usize = sent.iter().map(String::len).sum();
    collect(&remote, "far", &sent, &mut BTreeMap::new());
    // The first batch goes at once (at most a quarter second of the rate);
    // the rest cannot go faster than the rate.
    let least = Duration::from_secs_f64((bytes as f64 - RATE as f64 / 4.0) / RATE as f64);
    assert!(
        started.elapsed() >= least,
        "{bytes} bytes shipped in {:?} at {RATE} bytes/s",
        started.elapsed()
    );

    // A CA file that holds no certificate refuses the start, naming the key.
    let not_a_ca = tmp.path().join("not-a-ca.pem");
    std::fs::write(&not_a_ca, "not a certificate").expect("write");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_narad"));
    command
        .args(["serve", "--data-dir"])
        .arg(tmp.path().join("refused"))
        .args(["--listen", "127.0.0.1:0", "--set"])
        .arg(format!("children.remote_ca_file={}", path(&not_a_ca)));
    let output = support::run_to_exit(command, Duration::from_secs(30));
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("children.remote_ca_file"), "{said}");
}

#[test]
fn a_remote_child_skips_and_counts_what_ages_out_of_its_parent_before_it_ships() {
    let tmp = tempfile::tempdir().expect("tmp");
    let remote = Node::start(&tmp.path().join("remote"), &[]);
    remote.create_topic("far", json!({"partitions": 1}));
    let proxy = Proxy::start(&remote.addr);
    let parent = Node::start(
        &tmp.path().join("parent"),
        &[
            "--set",
            "topics.retention_floor_ms=1000",
            "--set",
            "testing.short_retention=true",
            "--set",
            "storage.segment_bytes=65536",
        ],
    );
    parent.create_topic("feed", json!({"partitions": 1, "retention_ms": 2_000}));
    let (status, answer) = remote_child(
        &parent,
        "feed",
        "dr",
        json!({"url": proxy.url(), "topic": "far"}),
    );
    assert_eq!(status, 201, "{answer}");

    // The link down while the parent's retention removes what did not ship.
    proxy.set(Link::Refuse);
    let value = "x".repeat(4096);
    let produced: Vec<String> = (0..64).map(|_| parent.produce("feed", &value)).collect();
    let frontier = || {
        let (_, topic) = parent.request("GET", "/v1/topics/feed", b"");
        topic["partition_stats"][0]["frontier"]
            .as_u64()
            .unwrap_or(0)
    };
    assert!(
        eventually(WAIT, || frontier() > 0),
        "retention removed the oldest messages"
    );
    let headroom = metric(
        &parent,
        r#"narad_remote_child_headroom_seconds{parent="feed",child="dr"}"#,
    );
    assert!(headroom < 2.0, "headroom {headroom} with a 2 s retention");
    proxy.set(Link::Forward);

    assert!(
        eventually(WAIT, || {
            let status = child_status(&parent, "feed", "dr");
            status["dropped_messages"].as_u64().unwrap_or(0) > 0 && status["lag_messages"] == 0
        }),
        "the copy skipped and counted: {}",
        child_status(&parent, "feed", "dr")
    );
    let dropped = child_status(&parent, "feed", "dr")["dropped_messages"]
        .as_u64()
        .unwrap_or(0);
    assert_eq!(
        metric(
            &parent,
            r#"narad_fanout_child_dropped_messages{parent="feed",child="dr"}"#
        ) as u64,
        dropped
    );
    // Everything not counted as dropped reached the remote.
    let delivered = support::consume_all(&remote, "far");
    assert!(
        delivered.len() as u64 + dropped >= produced.len() as u64,
        "{} delivered + {dropped} dropped < {} produced",
        delivered.len(),
        produced.len()
    );
}
