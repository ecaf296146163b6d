//! The delivery-contract suites: producers and consumers record every
//! operation in a history (`narad-check`), a seeded nemesis stops, kills,
//! pauses and power-cuts nodes of a three-node cluster, and the checker
//! judges the history.
//!
//! - Suite 1, healthy: nothing is broken; any loss, duplicate, stray message
//!   or message on the wrong topic fails. It runs with HTTPS on the client
//!   port and authentication on, as production does.
//! - Suite 2, faults: at least one fault every 5 seconds and every kind of
//!   fault in every run, and clients that now and then send a produce, a
//!   consume or an ack whole and hang up without reading the answer; every
//!   202'd message must end up acked, no message may appear that was never
//!   produced or on the wrong topic, and no message acked with a 204 may be
//!   delivered again unless its partition's owner crashed within the
//!   contract's window after the ack. Duplicates are counted and reported.
//!   `orders` has a fanout and a delay child, consumed by a client of their
//!   own: every message accepted on `orders` after they existed must be
//!   delivered in each, and none in the delay child before its delay.
//!   It also has a remote child on a single-node cluster of its own: every
//!   message accepted on `orders` must be there at least once, unless the
//!   child counted it dropped, and nothing else.
//! - Suite 3, a lost volume: under load, one node is killed, its data folder
//!   deleted, and it rejoins empty. Only the messages that may have been on
//!   that volume may be lost; every other 202'd message, and every one
//!   accepted after the loss, must end up acked, under suite 2's other rules.
//! - Suite 4, network partitions (`contract/partitions.rs`): the nodes in
//!   network namespaces of their own, links between them cut one way or
//!   both, and healed, among crashes.
//!
//! Each runs three nodes (on loopback but for suite 4) with producers and consumers spread over
//! them; a client whose node does not answer moves to the next one, as
//! behind a load balancer, and a producer sends the message again there
//! with its idempotency key (the partition's owner stores it once). The owner of every partition is recorded in the
//! history at the start (partitions do not move here): the checker needs it
//! to tell a crash that can lose an ack from one that cannot.
//! `NARAD_SUITE_SEED` replays a run;
//! `NARAD_SOAK_SECONDS` runs the fault suite for longer. A failure prints the
//! seed and the path of the history file.

mod support;

#[path = "contract/partitions.rs"]
mod partitions;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use narad_broker::partitioner::partition_for_key;
use narad_check::{
    check, now_ms, Delivery, History, NemesisAction, Op, Outcome, Report, SettleAction, Strictness,
};
use serde_json::{json, Value};
use support::cluster::Cluster;
use support::{eventually, send_and_vanish, try_raw_request, try_request, Node};

/// How long a client waits for one answer before recording it as unknown.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long consumers may take to ack every 202'd message once faults stop.
const SETTLE_DEADLINE: Duration = Duration::from_secs(90);
/// The fault suite's length in CI.
const FAULT_SUITE_SECONDS: u64 = 20;
/// The fault suite's length when it runs a broken build (every kind of
/// fault still comes once).
const BROKEN_BUILD_SUITE_SECONDS: u64 = 8;
/// Faults come at least this often.
const FAULT_INTERVAL_MAX_MS: u64 = 4_000;
const FAULT_INTERVAL_MIN_MS: u64 = 1_000;
const TOPICS: [&str; 3] = ["orders", "payments", "audit"];
const PARTITIONS: usize = 6;
const CLUSTER_NODES: usize = 3;
/// Suite 2's children of `orders`: (name, delay_ms of a delay child).
const CHILDREN_PARENT: &str = "orders";
const CHILDREN: [(&str, Option<u64>); 2] = [("orders-copy", None), ("orders-later", Some(1_500))];
/// Suite 2's remote child of `orders`, and its topic on a single-node
/// cluster of its own.
const REMOTE_CHILD: &str = "orders-dr";
const REMOTE_TOPIC: &str = "orders-far";
/// Attempts at most per message: the first, then retries with its
/// idempotency key at the next node.
const PRODUCE_ATTEMPTS_MAX: u32 = 3;

/// In the fault suite, the share (percent) of produces, consumes and ack
/// batches a client sends whole and then abandons, closing the connection
/// before it reads the answer (only while producers run, so the drain is
/// not slowed down by leases nobody holds).
const VANISH_PERCENT: u64 = 1;

/// xorshift64*: the suites' only source of randomness, from the seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }
}

fn seed() -> u64 {
    std::env::var("NARAD_SUITE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| now_ms() ^ u64::from(std::process::id()))
}

/// What the clients share: the nodes' addresses (one changes when its node
/// restarts), the history, and the messages answered 202 and acked, by
/// value (each is unique): a retry dropped at the partition's owner as a
/// copy of its first attempt is answered with an id that is never
/// delivered, and its message is acked under the first copy's id.
struct Shared {
    addrs: Mutex<Vec<String>>,
    history: History,
    accepted: Mutex<HashSet<String>>,
    acked: Mutex<HashSet<String>>,
    /// Acked without an answer (or answered 502): it may have landed.
    maybe_acked: Mutex<HashSet<String>>,
    stop_producers: AtomicBool,
    stop_consumers: AtomicBool,
}

impl Shared {
    fn addr(&self, node: usize) -> String {
        let addrs = self.addrs.lock().expect("addrs");
        addrs[node % addrs.len()].clone()
    }

    fn all_acked(&self) -> bool {
        let accepted = self.accepted.lock().expect("accepted");
        let acked = self.acked.lock().expect("acked");
        let maybe = self.maybe_acked.lock().expect("maybe acked");
        accepted
            .iter()
            .all(|id| acked.contains(id) || maybe.contains(id))
    }
}

fn outcome_of<T>(
    answer: &Result<(u16, Value), String>,
    ok: impl FnOnce(&Value) -> T,
) -> Outcome<T> {
    match answer {
        Ok((status, body)) if *status < 300 => Outcome::Ok { value: ok(body) },
        Ok((status, body)) => Outcome::Refused {
            status: *status,
            code: body["error"]["code"].as_str().unwrap_or("").to_string(),
        },
        Err(reason) => Outcome::Unknown {
            reason: reason.clone(),
        },
    }
}

/// How a client is named in the history: itself and the node it asked
/// (`p1@n2`), so that a history shows which node answered what.
fn via(client: &str, node: usize) -> String {
    format!("{client}@n{}", node % CLUSTER_NODES + 1)
}

/// Whether a client should try another node next (no answer, or a node
/// that is stopping, failed or without a leader).
fn move_on<T>(answer: &Result<(u16, T), String>) -> bool {
    !matches!(answer, Ok((status, _)) if *status < 500)
}

/// How the clients behave: their seed, how often they nack or vanish, and
/// whether producers send keys (each message its own, so the checker knows
/// the partition of every message, stored or lost).
#[derive(Debug, Clone, Copy)]
struct Mix {
    seed: u64,
    nack_percent: u64,
    vanish_percent: u64,
    keyed: bool,
    /// Every produce carries an idempotency key and is sent again to the
    /// next node when unanswered; without, each is sent once.
    idempotent: bool,
}

impl Mix {
    /// No nacks, no vanishing clients, no keys; idempotent produces.
    fn plain() -> Self {
        Self {
            seed: 0,
            nack_percent: 0,
            vanish_percent: 0,
            keyed: false,
            idempotent: true,
        }
    }

    /// Whether to abandon the next request (never once producers stopped).
    fn vanish(&self, rng: &mut Rng, shared: &Shared) -> bool {
        rng.below(100) < self.vanish_percent && !shared.stop_producers.load(Ordering::SeqCst)
    }
}

/// Sends `count` messages (or until told to stop), round robin over topics,
/// starting at node `node`; `mix.vanish_percent` of them are sent whole and
/// abandoned.
fn producer(shared: Arc<Shared>, client: String, count: Option<u64>, mut node: usize, mix: Mix) {
    let mut rng = Rng::new(mix.seed);
    let mut i = 0u64;
    while count.is_none_or(|c| i < c) && !shared.stop_producers.load(Ordering::SeqCst) {
        let topic = TOPICS[(i % TOPICS.len() as u64) as usize];
        let value = format!("{client}-{i}");
        let start = now_ms();
        let who = via(&client, node);
        if mix.vanish(&mut rng, &shared) {
            let path = format!("/v1/topics/{topic}/messages");
            let sent = send_and_vanish(
                &shared.addr(node),
                "POST",
                &path,
                value.as_bytes(),
                CLIENT_TIMEOUT,
            );
            let op = match sent {
                Ok(()) => Op::ProduceAbandoned {
                    topic: topic.to_string(),
                    value,
                },
                Err(reason) => {
                    node += 1;
                    Op::Produce {
                        topic: topic.to_string(),
                        value,
                        partition: None,
                        outcome: Outcome::Unknown { reason },
                    }
                }
            };
            shared.history.record(&who, start, op);
            i += 1;
            continue;
        }
        // The value doubles as the key: the partition follows from it.
        let key = mix.keyed.then_some(value.as_str());
        let partition = key.map(|k| partition_for_key(k.as_bytes(), PARTITIONS as u32));
        // Every message carries an idempotency key (its value, unique), and
        // one without an answer, or refused by a node that is stopping,
        // failed or without a leader, is sent again with it to the next
        // node: the owner stores it once (a copy rerouted to a sibling
        // partition meanwhile is the one exception the checker allows).
        let mut headers: Vec<(&str, &str)> = Vec::new();
        if mix.idempotent {
            headers.push(("Narad-Idempotency-Key", value.as_str()));
        }
        headers.extend(key.map(|k| ("Narad-Key", k)));
        let attempts = if mix.idempotent {
            PRODUCE_ATTEMPTS_MAX
        } else {
            1
        };
        let mut accepted = false;
        let mut answer = Err(String::new());
        for attempt in 1..=attempts {
            let start = if attempt == 1 { start } else { now_ms() };
            let who = via(&client, node);
            answer = try_raw_request(
                &shared.addr(node),
                "POST",
                &format!("/v1/topics/{topic}/messages"),
                &headers,
                value.as_bytes(),
                CLIENT_TIMEOUT,
            )
            .map(|(status, _, body)| {
                (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
            });
            let outcome = outcome_of(&answer, |b| b["id"].as_str().unwrap_or("").to_string());
            accepted = matches!(answer, Ok((202, _)));
            let again = move_on(&answer);
            if again {
                node += 1;
            }
            if let Outcome::Ok { .. } = &outcome {
                shared
                    .accepted
                    .lock()
                    .expect("accepted")
                    .insert(value.clone());
            }
            shared.history.record(
                &who,
                start,
                Op::Produce {
                    topic: topic.to_string(),
                    value: value.clone(),
                    partition,
                    outcome,
                },
            );
            if !again || shared.stop_producers.load(Ordering::SeqCst) {
                break;
            }
        }
        // A message still without an answer is not sent again: the checker
        // allows it to appear or not.
        i += 1;
        if !accepted && count.is_some() {
            // The healthy suite must not lose messages to refusals.
            panic!("healthy suite: produce {i} answered {answer:?}");
        }
    }
}

fn deliveries_of(body: &Value) -> Vec<Delivery> {
    body["messages"]
        .as_array()
        .map(|messages| {
            messages
                .iter()
                .map(|m| Delivery {
                    id: m["id"].as_str().unwrap_or("").to_string(),
                    topic: m["topic"].as_str().unwrap_or("").to_string(),
                    partition: m["partition"].as_u64().unwrap_or(0) as u32,
                    offset: m["offset"].as_u64().unwrap_or(0),
                    value: m["value"].as_str().unwrap_or("").to_string(),
                    delivery_count: m["delivery_count"].as_u64().unwrap_or(0) as u32,
                    lease_expires_at_ms: m["lease_expires_at_ms"].as_u64().unwrap_or(0),
                    receipt: m["receipt"].as_str().unwrap_or("").to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Settles receipts with one batch request and records each answer.
fn settle(
    shared: &Shared,
    client: &str,
    node: usize,
    topic: &str,
    action: SettleAction,
    items: &[(Delivery, String)],
) {
    if items.is_empty() {
        return;
    }
    let receipts: Vec<&str> = items.iter().map(|(_, r)| r.as_str()).collect();
    let (path, body) = match action {
        SettleAction::Ack => ("ack", json!({ "receipts": receipts })),
        SettleAction::Nack => ("nack", json!({ "receipts": receipts, "delay_ms": 0 })),
        SettleAction::Extend => (
            "extend",
            json!({ "receipts": receipts, "visibility_timeout_ms": 10_000 }),
        ),
    };
    let start = now_ms();
    let who = via(client, node);
    let answer = try_request(
        &shared.addr(node),
        "POST",
        &format!("/v1/topics/{topic}/{path}/batch"),
        body.to_string().as_bytes(),
        CLIENT_TIMEOUT,
    );
    let results = match &answer {
        Ok((200, body)) => body["results"].as_array().cloned().unwrap_or_default(),
        _ => Vec::new(),
    };
    for (index, (delivery, _)) in items.iter().enumerate() {
        let outcome = match (&answer, results.get(index)) {
            (Ok((200, _)), Some(result)) => {
                let status = result["status"].as_u64().unwrap_or(0) as u16;
                if status < 300 {
                    Outcome::Ok {
                        value: result["lease_expires_at_ms"].as_u64(),
                    }
                } else {
                    Outcome::Refused {
                        status,
                        code: result["error"]["code"].as_str().unwrap_or("").to_string(),
                    }
                }
            }
            (answer, _) => outcome_of(answer, |_| None),
        };
        if action == SettleAction::Ack {
            match &outcome {
                Outcome::Ok { .. } => {
                    shared
                        .acked
                        .lock()
                        .expect("acked")
                        .insert(delivery.value.clone());
                }
                Outcome::Unknown { .. } | Outcome::Refused { status: 502, .. } => {
                    shared
                        .maybe_acked
                        .lock()
                        .expect("maybe acked")
                        .insert(delivery.value.clone());
                }
                Outcome::Refused { .. } => {}
            }
        }
        shared.history.record(
            &who,
            start,
            Op::Settle {
                action,
                topic: topic.to_string(),
                id: delivery.id.clone(),
                receipt: delivery.receipt.clone(),
                outcome,
            },
        );
    }
}

/// Sends an ack batch whole and hangs up: each ack may or may not land.
fn abandon_acks(
    shared: &Shared,
    client: &str,
    node: usize,
    topic: &str,
    items: &[(Delivery, String)],
) -> bool {
    if items.is_empty() {
        return true;
    }
    let receipts: Vec<&str> = items.iter().map(|(_, r)| r.as_str()).collect();
    let start = now_ms();
    let who = via(client, node);
    let sent = send_and_vanish(
        &shared.addr(node),
        "POST",
        &format!("/v1/topics/{topic}/ack/batch"),
        json!({ "receipts": receipts }).to_string().as_bytes(),
        CLIENT_TIMEOUT,
    );
    for (delivery, _) in items {
        shared
            .maybe_acked
            .lock()
            .expect("maybe acked")
            .insert(delivery.value.clone());
        let op = match &sent {
            Ok(()) => Op::AckAbandoned {
                topic: topic.to_string(),
                id: delivery.id.clone(),
                receipt: delivery.receipt.clone(),
            },
            Err(reason) => Op::Settle {
                action: SettleAction::Ack,
                topic: topic.to_string(),
                id: delivery.id.clone(),
                receipt: delivery.receipt.clone(),
                outcome: Outcome::Unknown {
                    reason: reason.clone(),
                },
            },
        };
        shared.history.record(&who, start, op);
    }
    sent.is_ok()
}

/// Long-polls every topic in turn and settles what it gets: mostly acks,
/// with `mix.nack_percent` nacks and a few extends before the ack; now and
/// then it abandons a consume or an ack batch (`mix.vanish_percent`).
fn consumer(shared: Arc<Shared>, client: String, mix: Mix, mut node: usize) {
    let mut rng = Rng::new(mix.seed);
    let nack_percent = mix.nack_percent;
    let mut turn = 0usize;
    while !shared.stop_consumers.load(Ordering::SeqCst) {
        let topic = TOPICS[turn % TOPICS.len()];
        turn += 1;
        let start = now_ms();
        let who = via(&client, node);
        let path = format!("/v1/topics/{topic}/consume");
        let body = json!({"max_messages": 25, "wait_ms": 200}).to_string();
        if mix.vanish(&mut rng, &shared) {
            // Whatever it leased comes back when the visibility timeout ends.
            let op = match send_and_vanish(
                &shared.addr(node),
                "POST",
                &path,
                body.as_bytes(),
                CLIENT_TIMEOUT,
            ) {
                Ok(()) => Op::ConsumeAbandoned {
                    topic: topic.to_string(),
                },
                Err(reason) => {
                    node += 1;
                    Op::Consume {
                        topic: topic.to_string(),
                        outcome: Outcome::Unknown { reason },
                    }
                }
            };
            shared.history.record(&who, start, op);
            continue;
        }
        let answer = try_request(
            &shared.addr(node),
            "POST",
            &path,
            body.as_bytes(),
            CLIENT_TIMEOUT,
        );
        let outcome = outcome_of(&answer, deliveries_of);
        let receipts: Vec<String> = match &answer {
            Ok((200, body)) => body["messages"]
                .as_array()
                .map(|m| {
                    m.iter()
                        .map(|m| m["receipt"].as_str().unwrap_or("").to_string())
                        .collect()
                })
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        let delivered = match &outcome {
            Outcome::Ok { value } => value.clone(),
            _ => Vec::new(),
        };
        shared.history.record(
            &who,
            start,
            Op::Consume {
                topic: topic.to_string(),
                outcome,
            },
        );
        if move_on(&answer) {
            // The node is down, paused or stopping: try the next one.
            node += 1;
            continue;
        }
        let (mut acks, mut nacks, mut extends) = (Vec::new(), Vec::new(), Vec::new());
        for item in delivered.into_iter().zip(receipts) {
            match rng.below(100) {
                n if n < nack_percent => nacks.push(item),
                n if n < nack_percent * 2 => {
                    extends.push(item.clone());
                    acks.push(item);
                }
                _ => acks.push(item),
            }
        }
        settle(&shared, &client, node, topic, SettleAction::Nack, &nacks);
        settle(
            &shared,
            &client,
            node,
            topic,
            SettleAction::Extend,
            &extends,
        );
        if mix.vanish(&mut rng, &shared) {
            if !abandon_acks(&shared, &client, node, topic, &acks) {
                node += 1;
            }
        } else {
            settle(&shared, &client, node, topic, SettleAction::Ack, &acks);
        }
    }
}

fn history_path(suite: &str, seed: u64) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("histories");
    std::fs::create_dir_all(&dir).expect("histories dir");
    dir.join(format!("{suite}-{seed}.jsonl"))
}

/// Copies every node's log (all its starts) beside the history, since the
/// cluster's folder goes away with the test: a node that died on its own
/// (a panic, an abort) shows only there.
fn keep_logs(suite: &str, seed: u64, cluster: &Cluster) {
    for (i, node) in cluster.nodes.iter().enumerate() {
        let path = history_path(suite, seed).with_extension(format!("n{}.log", i + 1));
        if let Err(error) = std::fs::write(&path, node.stderr()) {
            eprintln!("{suite}: could not keep {}: {error}", path.display());
        }
    }
}

/// Writes the history and checks it.
fn judged(suite: &str, seed: u64, shared: &Shared) -> Report {
    let path = history_path(suite, seed);
    shared.history.write(&path).expect("write history");
    let report = check(&shared.history.events());
    eprintln!(
        "{suite}: seed {seed}, history {}\n{}",
        path.display(),
        report.summary()
    );
    report
}

/// Writes the history and fails on any violation, naming seed and file.
fn judge(suite: &str, seed: u64, shared: &Shared, strictness: Strictness) -> Report {
    let path = history_path(suite, seed);
    let report = judged(suite, seed, shared);
    let violations = report.violations(strictness);
    assert!(
        violations.is_empty(),
        "{suite} failed (seed {seed}, history {}): {:?}\n{}",
        path.display(),
        violations.iter().map(|(name, _)| *name).collect::<Vec<_>>(),
        report.summary()
    );
    report
}

/// Creates the topics and records in the history which node owns each
/// partition (as the nemesis names nodes: `n1` is `cluster.nodes[0]`), as
/// node 0 describes them once it knows every topic.
fn create_topics(cluster: &Cluster, shared: &Shared, visibility_timeout_ms: u64) {
    for (i, topic) in TOPICS.iter().enumerate() {
        cluster.nodes[i % cluster.nodes.len()].create_topic(
            topic,
            json!({"partitions": PARTITIONS, "visibility_timeout_ms": visibility_timeout_ms}),
        );
    }
    for topic in TOPICS {
        let mut owners = Vec::new();
        let described = eventually(SETTLE_DEADLINE, || {
            let answer = try_request(
                &cluster.nodes[0].addr,
                "GET",
                &format!("/v1/topics/{topic}"),
                b"",
                CLIENT_TIMEOUT,
            );
            let Ok((200, body)) = answer else {
                return false;
            };
            owners = body["partition_stats"]
                .as_array()
                .map(|parts| {
                    parts
                        .iter()
                        .filter_map(|p| p["owner"].as_u64().filter(|o| *o > 0))
                        .map(|o| format!("n{o}"))
                        .collect()
                })
                .unwrap_or_default();
            owners.len() == PARTITIONS
        });
        assert!(described, "node 1 describes {topic} with its owners");
        shared.history.record(
            "suite",
            now_ms(),
            Op::Owners {
                topic: topic.to_string(),
                owners,
            },
        );
    }
}

/// Creates (or changes) a child of `orders` through the first node, trying
/// until a leader takes it.
fn put_child(cluster: &Cluster, child: &str, body: &Value) {
    let path = format!("/v1/topics/{CHILDREN_PARENT}/children/{child}");
    let created = eventually(SETTLE_DEADLINE, || {
        matches!(
            try_request(
                &cluster.nodes[0].addr,
                "PUT",
                &path,
                body.to_string().as_bytes(),
                CLIENT_TIMEOUT
            ),
            Ok((201 | 200, _))
        )
    });
    assert!(created, "child {child} created");
}

/// Creates suite 2's children and records when each existed.
fn create_children(cluster: &Cluster, shared: &Shared) {
    for (child, delay_ms) in CHILDREN {
        let body = match delay_ms {
            Some(delay_ms) => json!({"kind": "delay", "delay_ms": delay_ms}),
            None => json!({"kind": "fanout"}),
        };
        let begin = now_ms();
        put_child(cluster, child, &body);
        shared.history.record(
            "suite",
            begin,
            Op::Child {
                parent: CHILDREN_PARENT.to_string(),
                child: child.to_string(),
                delay_ms,
            },
        );
    }
}

/// Creates suite 2's remote child: `orders` copied to a topic of another
/// (single-node) cluster.
fn create_remote_child(cluster: &Cluster, remote: &Node) {
    remote.create_topic(REMOTE_TOPIC, json!({"partitions": 2}));
    let body = json!({
        "kind": "remote",
        "remote": {"url": format!("http://{}", remote.addr), "topic": REMOTE_TOPIC},
    });
    put_child(cluster, REMOTE_CHILD, &body);
}

/// After the faults: the remote child catches up, and every message a 202
/// accepted on its parent is on the remote cluster at least once, unless
/// the child counted it dropped; the remote holds nothing no producer sent
/// to the parent. Returns how many copies were there twice or more.
fn check_remote_copy(shared: &Shared, remote: &Node, seed: u64) -> usize {
    let mut dropped = 0;
    let caught_up = eventually(SETTLE_DEADLINE, || {
        let listing = try_request(
            &shared.addr(0),
            "GET",
            &format!("/v1/topics/{CHILDREN_PARENT}/children"),
            b"",
            CLIENT_TIMEOUT,
        );
        let Ok((200, listing)) = listing else {
            return false;
        };
        listing["children"].as_array().is_some_and(|children| {
            children.iter().any(|c| {
                dropped = c["dropped_messages"].as_u64().unwrap_or(0);
                c["name"] == REMOTE_CHILD && c["lag_messages"] == 0 && c["state"] == "copying"
            })
        })
    });
    assert!(caught_up, "the remote child caught up (seed {seed})");
    let mut required = HashSet::new();
    let mut sent = HashSet::new();
    for event in shared.history.events() {
        match event.op {
            Op::Produce {
                topic,
                value,
                outcome,
                ..
            } if topic == CHILDREN_PARENT => {
                if matches!(outcome, Outcome::Ok { .. }) {
                    required.insert(value.clone());
                }
                sent.insert(value);
            }
            Op::ProduceAbandoned { topic, value } if topic == CHILDREN_PARENT => {
                sent.insert(value);
            }
            _ => {}
        }
    }
    let mut copies: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    eventually(SETTLE_DEADLINE, || {
        let messages = remote.consume(REMOTE_TOPIC, json!({"max_messages": 1000, "wait_ms": 100}));
        if !messages.is_empty() {
            support::ack_batch(remote, REMOTE_TOPIC, &messages);
        }
        for message in &messages {
            let value = message["value"].as_str().unwrap_or_default().to_string();
            *copies.entry(value).or_insert(0) += 1;
        }
        messages.is_empty() && required.iter().all(|v| copies.contains_key(v))
    });
    let missing: Vec<&String> = required
        .iter()
        .filter(|v| !copies.contains_key(*v))
        .collect();
    assert!(
        missing.len() as u64 <= dropped,
        "{} of {} accepted messages never reached the remote ({dropped} counted dropped), e.g. {:?} (seed {seed})",
        missing.len(),
        required.len(),
        missing.iter().take(5).collect::<Vec<_>>()
    );
    let strays: Vec<&String> = copies.keys().filter(|v| !sent.contains(*v)).collect();
    assert!(
        strays.is_empty(),
        "the remote holds messages nobody sent to {CHILDREN_PARENT}: {strays:?} (seed {seed})"
    );
    copies.values().filter(|n| **n > 1).count()
}

/// Consumes the children, recording each consume, and acks all it gets
/// (the children keep acks of their own: the parent's are not theirs).
fn child_consumer(shared: Arc<Shared>, stop: Arc<AtomicBool>) {
    let mut node = 0;
    let mut turn = 0;
    while !stop.load(Ordering::SeqCst) {
        let (topic, _) = CHILDREN[turn % CHILDREN.len()];
        turn += 1;
        let start = now_ms();
        let who = via("children", node);
        let answer = try_request(
            &shared.addr(node),
            "POST",
            &format!("/v1/topics/{topic}/consume"),
            json!({"max_messages": 100, "wait_ms": 100})
                .to_string()
                .as_bytes(),
            CLIENT_TIMEOUT,
        );
        let outcome = outcome_of(&answer, deliveries_of);
        shared.history.record(
            &who,
            start,
            Op::Consume {
                topic: topic.to_string(),
                outcome,
            },
        );
        let receipts: Vec<String> = match &answer {
            Ok((200, body)) => body["messages"]
                .as_array()
                .map(|m| {
                    m.iter()
                        .filter_map(|m| m["receipt"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        if move_on(&answer) {
            node += 1;
            continue;
        }
        if !receipts.is_empty() {
            let acked = try_request(
                &shared.addr(node),
                "POST",
                &format!("/v1/topics/{topic}/ack/batch"),
                json!({ "receipts": receipts }).to_string().as_bytes(),
                CLIENT_TIMEOUT,
            );
            if move_on(&acked) {
                node += 1;
            }
        }
    }
}

/// Whether every child has copied all it has and holds nothing unacked.
fn children_drained(shared: &Shared) -> bool {
    let copied = try_request(
        &shared.addr(0),
        "GET",
        &format!("/v1/topics/{CHILDREN_PARENT}/children"),
        b"",
        CLIENT_TIMEOUT,
    );
    let Ok((200, listing)) = copied else {
        return false;
    };
    let caught_up = listing["children"].as_array().is_some_and(|children| {
        let local: Vec<&Value> = children
            .iter()
            .filter(|c| CHILDREN.iter().any(|(name, _)| c["name"] == *name))
            .collect();
        local.len() == CHILDREN.len()
            && local
                .iter()
                .all(|c| c["lag_messages"] == 0 && c["state"] == "copying")
    });
    caught_up
        && CHILDREN
            .iter()
            .all(|(child, _)| topic_drained(shared, child))
}

fn start_clients(
    shared: &Arc<Shared>,
    seed: u64,
    producers: usize,
    per_producer: Option<u64>,
    consumers: usize,
    mix: Mix,
) -> (
    Vec<std::thread::JoinHandle<()>>,
    Vec<std::thread::JoinHandle<()>>,
) {
    let mix = |client_seed: u64| Mix {
        seed: client_seed,
        ..mix
    };
    let producing = (0..producers)
        .map(|p| {
            let shared = shared.clone();
            let mix = mix(seed.wrapping_add(1_001 + p as u64));
            std::thread::spawn(move || producer(shared, format!("p{p}"), per_producer, p, mix))
        })
        .collect();
    let consuming = (0..consumers)
        .map(|c| {
            let shared = shared.clone();
            let mix = mix(seed.wrapping_add(1 + c as u64));
            std::thread::spawn(move || consumer(shared, format!("c{c}"), mix, c))
        })
        .collect();
    (producing, consuming)
}

/// Whether the cluster holds nothing more to deliver: every partition of
/// every topic, as node 1 describes them, has nothing available and nothing
/// leased.
fn drained(shared: &Shared) -> bool {
    TOPICS.iter().all(|topic| topic_drained(shared, topic))
}

/// Prints what each node says of every partition that still holds
/// something to deliver (or its answer, if not a topic).
fn report_undrained(shared: &Shared) {
    for node in 0..CLUSTER_NODES {
        for topic in TOPICS {
            let answer = try_request(
                &shared.addr(node),
                "GET",
                &format!("/v1/topics/{topic}"),
                b"",
                CLIENT_TIMEOUT,
            );
            match answer {
                Ok((200, body)) => {
                    let busy: Vec<&Value> = body["partition_stats"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|p| p["available"] != 0 || p["in_flight"] != 0)
                        .collect();
                    eprintln!("not drained: n{} {topic}: {busy:?}", node + 1);
                }
                other => eprintln!("not drained: n{} {topic}: {other:?}", node + 1),
            }
        }
    }
}

/// Whether every partition of `topic`, as node 1 describes it, has nothing
/// available and nothing leased.
fn topic_drained(shared: &Shared, topic: &str) -> bool {
    let answer = try_request(
        &shared.addr(0),
        "GET",
        &format!("/v1/topics/{topic}"),
        b"",
        CLIENT_TIMEOUT,
    );
    let Ok((200, body)) = answer else {
        return false;
    };
    body["partition_stats"].as_array().is_some_and(|parts| {
        parts.len() == PARTITIONS
            && parts
                .iter()
                .all(|p| p["available"] == 0 && p["in_flight"] == 0)
    })
}

/// Waits for the producers (stopping them first unless they send a fixed
/// count), stops the consumers once every 202'd message is acked and the
/// cluster holds nothing more to deliver (or the deadline passed), and
/// joins everything. Returns whether the cluster drained: an ack without
/// an answer may not have landed, and then its message comes back and is
/// acked again, so only the cluster can say that every message was acked.
fn finish(
    shared: &Arc<Shared>,
    producing: Vec<std::thread::JoinHandle<()>>,
    consuming: Vec<std::thread::JoinHandle<()>>,
    stop_producers: bool,
) -> bool {
    finish_when(shared, producing, consuming, stop_producers, || {
        shared.all_acked()
    })
}

/// [`finish`], with the consumers' work done once `all_acked` holds.
fn finish_when(
    shared: &Arc<Shared>,
    producing: Vec<std::thread::JoinHandle<()>>,
    consuming: Vec<std::thread::JoinHandle<()>>,
    stop_producers: bool,
    all_acked: impl Fn() -> bool,
) -> bool {
    shared
        .stop_producers
        .store(stop_producers, Ordering::SeqCst);
    for handle in producing {
        handle.join().expect("producer");
    }
    let drained = eventually(SETTLE_DEADLINE, || all_acked() && drained(shared));
    if !drained {
        eprintln!("not drained: every accepted message acked: {}", all_acked());
        report_undrained(shared);
    }
    shared.stop_consumers.store(true, Ordering::SeqCst);
    for handle in consuming {
        handle.join().expect("consumer");
    }
    drained
}

fn shared_for(cluster: &Cluster) -> Arc<Shared> {
    Arc::new(Shared {
        addrs: Mutex::new(cluster.addrs()),
        history: History::new(),
        accepted: Mutex::default(),
        acked: Mutex::default(),
        maybe_acked: Mutex::default(),
        stop_producers: AtomicBool::new(false),
        stop_consumers: AtomicBool::new(false),
    })
}

/// Suite 1 runs as production does: HTTPS on the client port, and every
/// client authenticated (Basic, as the user admin).
fn secured_cluster(dir: &std::path::Path) -> Cluster {
    let ca = support::tls::TestCa::new(dir, "suite");
    let server = ca.issue("node", &["127.0.0.1"]);
    let flags = vec![
        "--set".to_string(),
        format!(
            "http.tls.cert_file={}",
            support::tls::path(&server.cert_file)
        ),
        "--set".to_string(),
        format!("http.tls.key_file={}", support::tls::path(&server.key_file)),
        "--set".to_string(),
        "auth.enabled=true".to_string(),
        "--set".to_string(),
        format!("auth.admin_password={SUITE_ADMIN_PASSWORD}"),
    ];
    let mut cluster = Cluster::start_each(3, |_| flags.clone());
    let tls = narad_net::tls::client_config(&narad_net::tls::ClientTlsFiles {
        ca_file: Some(support::tls::path(&ca.cert_file)),
        ..Default::default()
    })
    .expect("client TLS");
    let pair =
        base64::engine::general_purpose::STANDARD.encode(format!("admin:{SUITE_ADMIN_PASSWORD}"));
    for node in &mut cluster.nodes {
        node.set_access(support::Access {
            tls: Some(tls.clone()),
            authorization: Some(format!("Basic {pair}")),
        });
    }
    cluster.wait_ready(SETTLE_DEADLINE);
    // The user admin exists once the metastore took its bootstrap.
    let known = eventually(SETTLE_DEADLINE, || {
        cluster
            .nodes
            .iter()
            .all(|n| n.request("GET", "/v1/topics", b"").0 == 200)
    });
    assert!(known, "every node knows the user admin");
    cluster
}

const SUITE_ADMIN_PASSWORD: &str = "suite-admin-pw";

#[test]
fn suite_1_healthy_cluster_delivers_every_message_once() {
    let seed = seed();
    let certificates = tempfile::tempdir().expect("tmp");
    let cluster = secured_cluster(certificates.path());
    let shared = shared_for(&cluster);
    create_topics(&cluster, &shared, 30_000);
    let (producing, consuming) = start_clients(&shared, seed, 4, Some(300), 3, Mix::plain());
    let drained = finish(&shared, producing, consuming, false);
    keep_logs("suite1-healthy", seed, &cluster);
    let report = judge("suite1-healthy", seed, &shared, Strictness::Healthy);
    assert_eq!(report.accepted, 1200, "every produce answered 202");
    assert!(drained, "the cluster holds nothing unacked (seed {seed})");
}

/// One fault of the nemesis: what, and to which nodes (0-based): one, or
/// sometimes two at once.
type Fault = (NemesisAction, Vec<usize>);

/// How often (one in N) a fault that stops nodes stops two at once
/// (`NARAD_NEMESIS_TWO_AT_ONCE=0` turns it off).
const TWO_AT_ONCE_ONE_IN: u64 = 4;

/// The nemesis' plan: every kind once, in a seeded order, then random kinds,
/// each on a seeded node (crashes sometimes on two nodes at once).
fn fault_plan(rng: &mut Rng, count: usize, nodes: usize) -> Vec<Fault> {
    let two_at_once = !std::env::var("NARAD_NEMESIS_TWO_AT_ONCE").is_ok_and(|v| v == "0");
    let mut kinds = vec![
        NemesisAction::Kill,
        NemesisAction::PowerCut,
        NemesisAction::Terminate,
        NemesisAction::Pause,
    ];
    for i in (1..kinds.len()).rev() {
        kinds.swap(i, rng.below(i as u64 + 1) as usize);
    }
    while kinds.len() < count {
        kinds.push(kinds[rng.below(4) as usize]);
    }
    kinds
        .into_iter()
        .map(|kind| {
            let first = rng.below(nodes as u64) as usize;
            let mut targets = vec![first];
            if two_at_once && kind != NemesisAction::Pause && rng.below(TWO_AT_ONCE_ONE_IN) == 0 {
                targets.push((first + 1 + rng.below(nodes as u64 - 1) as usize) % nodes);
            }
            (kind, targets)
        })
        .collect()
}

/// Whether the next fault that stops `node` is a power cut.
fn next_crash_is_power_cut(plan: &[Fault], node: usize) -> bool {
    plan.iter()
        .find(|(kind, targets)| targets.contains(&node) && *kind != NemesisAction::Pause)
        .is_some_and(|(kind, _)| *kind == NemesisAction::PowerCut)
}

/// A power cut needs a node that kept its unsynced writes in memory: a node
/// runs in power-loss mode from a start whose next crash is a power cut.
/// A broken build (`switches`) needs the fault layer on in every node.
fn node_flags(power_loss: bool, switches: Option<&str>) -> Vec<String> {
    let mode = match (power_loss, switches) {
        (true, _) => "power_loss",
        (false, Some(_)) => "switchable",
        (false, None) => return Vec::new(),
    };
    vec!["--set".into(), format!("testing.faults={mode}")]
}

#[test]
fn suite_2_faults_every_accepted_message_is_acked_in_the_end() {
    let seconds = std::env::var("NARAD_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(FAULT_SUITE_SECONDS);
    faults_suite(seed(), seconds, None);
}

/// A build that commits its whole WAL again each time a node starts (the
/// fault layer makes the WAL's checkpoint read as lost) stores old messages
/// again long after any crash could have: suite 2's checker must say so.
/// Its producers send no idempotency keys, whose owners would drop the
/// copies sent again (seen: with keys the run found none).
#[test]
fn suite_2_catches_a_build_that_commits_its_whole_wal_again_at_each_start() {
    faults_suite(
        seed(),
        BROKEN_BUILD_SUITE_SECONDS,
        Some("forget_wal_checkpoint"),
    );
}

/// Suite 2 with the fault layer's `switches` raised in every node from its
/// first restart on (a broken build), or as the product is (`None`).
fn faults_suite(seed: u64, seconds: u64, switches: Option<&str>) {
    let mut rng = Rng::new(seed);
    let faults = (seconds * 1000 / FAULT_INTERVAL_MIN_MS) as usize + 4;
    let plan = fault_plan(&mut rng, faults, CLUSTER_NODES);
    let mut cluster = Cluster::start_each(CLUSTER_NODES, |i| {
        node_flags(next_crash_is_power_cut(&plan, i), switches)
    });
    cluster.wait_ready(SETTLE_DEADLINE);
    if let Some(switches) = switches {
        for node in &cluster.nodes {
            node.set_faults(switches);
        }
    }
    // Short leases, so pauses also end leases and late acks get tested.
    let shared = shared_for(&cluster);
    create_topics(&cluster, &shared, 2_000);
    create_children(&cluster, &shared);
    let remote_dir = tempfile::tempdir().expect("tmp");
    let remote = Node::start(&remote_dir.path().join("remote"), &[]);
    create_remote_child(&cluster, &remote);
    // A broken build's resends must show: idempotency keys would have the
    // owners drop them (within the window), as they should.
    let mix = Mix {
        nack_percent: 5,
        vanish_percent: VANISH_PERCENT,
        idempotent: switches.is_none(),
        ..Mix::plain()
    };
    let (producing, consuming) = start_clients(&shared, seed, 4, None, 3, mix);
    let children_stop = Arc::new(AtomicBool::new(false));
    let children_consuming = {
        let (shared, stop) = (shared.clone(), children_stop.clone());
        std::thread::spawn(move || child_consumer(shared, stop))
    };
    // Partitions move while nodes crash.
    let moving_stop = Arc::new(AtomicBool::new(false));
    let moving = {
        let (shared, stop) = (shared.clone(), moving_stop.clone());
        std::thread::spawn(move || mover(shared, seed, stop))
    };

    let started = Instant::now();
    let mut done = Vec::new();
    while started.elapsed() < Duration::from_secs(seconds) || done.len() < 4 {
        let wait = rng.between(FAULT_INTERVAL_MIN_MS, FAULT_INTERVAL_MAX_MS);
        std::thread::sleep(Duration::from_millis(wait));
        let Some((fault, victims)) = plan.get(done.len()).cloned() else {
            break;
        };
        // Each action is recorded from just before its signal to just after
        // it took effect: the checker compares crash times with ack times.
        let record = |action, victim: usize, begin: u64| {
            shared.history.record(
                "nemesis",
                begin,
                Op::Nemesis {
                    action,
                    node: format!("n{}", victim + 1),
                },
            );
        };
        match fault {
            NemesisAction::Pause => {
                let victim = victims[0];
                let begin = now_ms();
                cluster.nodes[victim].pause();
                record(NemesisAction::Pause, victim, begin);
                std::thread::sleep(Duration::from_millis(rng.between(500, 3_000)));
                let begin = now_ms();
                cluster.nodes[victim].resume();
                record(NemesisAction::Resume, victim, begin);
            }
            crash => {
                // Two at once: both go down before either comes back (with
                // two of three down there is no quorum for a while).
                for &victim in &victims {
                    let begin = now_ms();
                    if crash == NemesisAction::Terminate {
                        cluster.nodes[victim].terminate();
                    } else {
                        cluster.nodes[victim].kill();
                    }
                    record(crash, victim, begin);
                }
                for &victim in &victims {
                    let begin = now_ms();
                    let power_loss = next_crash_is_power_cut(&plan[done.len() + 1..], victim);
                    cluster.restart_node(victim, &node_flags(power_loss, switches));
                    record(NemesisAction::Start, victim, begin);
                }
                *shared.addrs.lock().expect("addrs") = cluster.addrs();
            }
        }
        done.push(fault);
    }
    moving_stop.store(true, Ordering::SeqCst);
    let planned_moves = moving.join().expect("the mover");
    let drained = finish(&shared, producing, consuming, true);
    let handed_over = record_handovers(&shared);
    let children_done = eventually(SETTLE_DEADLINE, || children_drained(&shared));
    if !children_done {
        for node in 0..CLUSTER_NODES {
            for path in [
                format!("/v1/topics/{CHILDREN_PARENT}/children"),
                format!("/v1/topics/{CHILDREN_PARENT}"),
                "/v1/topics/orders-later".to_string(),
                "/v1/topics/orders-copy".to_string(),
            ] {
                let answer = try_request(&shared.addr(node), "GET", &path, b"", CLIENT_TIMEOUT);
                eprintln!(
                    "suite2: children not drained: n{} {path}: {answer:?}",
                    node + 1
                );
            }
            let answer = try_request(
                &shared.addr(node),
                "GET",
                "/v1/cluster",
                b"",
                CLIENT_TIMEOUT,
            );
            eprintln!(
                "suite2: children not drained: n{} cluster: {answer:?}",
                node + 1
            );
            for (child, _) in CHILDREN {
                let answer = try_request(
                    &shared.addr(node),
                    "POST",
                    &format!("/v1/topics/{child}/consume"),
                    br#"{"max_messages": 3}"#,
                    CLIENT_TIMEOUT,
                );
                eprintln!(
                    "suite2: children not drained: n{} consume {child}: {answer:?}",
                    node + 1
                );
            }
        }
    }
    children_stop.store(true, Ordering::SeqCst);
    children_consuming.join().expect("children's consumer");
    keep_logs("suite2-faults", seed, &cluster);
    let resent = check_remote_copy(&shared, &remote, seed);
    eprintln!("suite2: {resent} messages are on the remote cluster twice or more (resends)");
    for kind in [
        NemesisAction::Kill,
        NemesisAction::PowerCut,
        NemesisAction::Terminate,
        NemesisAction::Pause,
    ] {
        assert!(done.contains(&kind), "{kind:?} was injected (seed {seed})");
    }
    if let Some(switches) = switches {
        let report = judged("suite2-broken", seed, &shared);
        assert!(
            report
                .violations(Strictness::Faults)
                .iter()
                .any(|(name, _)| *name == "duplicates_unexplained"),
            "a build with {switches} passed suite 2 (seed {seed})\n{}",
            report.summary()
        );
        return;
    }
    let report = judge("suite2-faults", seed, &shared, Strictness::Faults);
    assert!(report.accepted > 0, "produces went through between faults");
    assert!(
        handed_over > 0,
        "{planned_moves} moves planned, none handed over among the faults (seed {seed})"
    );
    assert!(
        children_done && report.child_delivered > 0,
        "the children copied and delivered everything within {SETTLE_DEADLINE:?} (seed {seed})"
    );
    assert!(
        drained,
        "the cluster holds nothing unacked within {SETTLE_DEADLINE:?} of the faults' end \
         (seed {seed})"
    );
    let count = |kind| done.iter().filter(|k| **k == kind).count();
    let two_at_once = plan[..done.len()]
        .iter()
        .filter(|(_, victims)| victims.len() > 1)
        .count();
    eprintln!(
        "suite2: {} faults in {:.0} s: {} kills, {} power cuts, {} SIGTERMs, {} pauses; \
         {two_at_once} of them on two nodes at once; {planned_moves} moves planned, \
         {handed_over} handed over",
        done.len(),
        started.elapsed().as_secs_f64(),
        count(NemesisAction::Kill),
        count(NemesisAction::PowerCut),
        count(NemesisAction::Terminate),
        count(NemesisAction::Pause),
    );
    if done.len() <= 12 {
        eprintln!("suite2: faults {:?}", &plan[..done.len()]);
    }
}

/// Moves partitions of the topics to other nodes, one every few seconds,
/// while the nemesis runs (`POST /v1/cluster/moves`; a refusal, such as a
/// partition moving already or no quorum, is skipped).
fn mover(shared: Arc<Shared>, seed: u64, stop: Arc<AtomicBool>) -> usize {
    let mut rng = Rng::new(seed ^ 0x4D0E);
    let mut planned = 0;
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(rng.between(1_000, 4_000)));
        let node = usize::try_from(rng.below(CLUSTER_NODES as u64)).unwrap_or(0);
        let topic = TOPICS[usize::try_from(rng.below(TOPICS.len() as u64)).unwrap_or(0)];
        let Ok((200, described)) = try_request(
            &shared.addr(node),
            "GET",
            &format!("/v1/topics/{topic}"),
            b"",
            CLIENT_TIMEOUT,
        ) else {
            continue;
        };
        let partitions = described["partitions"].as_u64().unwrap_or(1);
        let partition = rng.below(partitions);
        let owner = described["partition_stats"][partition as usize]["owner"]
            .as_u64()
            .unwrap_or(0);
        let to = 1 + (owner + rng.below(CLUSTER_NODES as u64 - 1)) % CLUSTER_NODES as u64;
        let body = json!({"topic": topic, "partition": partition, "to": to});
        if let Ok((202, _)) = try_request(
            &shared.addr(node),
            "POST",
            "/v1/cluster/moves",
            body.to_string().as_bytes(),
            CLIENT_TIMEOUT,
        ) {
            planned += 1;
        }
    }
    planned
}

/// Records each handover the cluster made (it ended its partition's
/// leases); answers how many moves ended done or promoted.
fn record_handovers(shared: &Shared) -> usize {
    let listing = (0..CLUSTER_NODES).find_map(|node| {
        match try_request(
            &shared.addr(node),
            "GET",
            "/v1/cluster/moves",
            b"",
            CLIENT_TIMEOUT,
        ) {
            Ok((200, listing)) => Some(listing),
            _ => None,
        }
    });
    let moves = listing
        .and_then(|l| l["moves"].as_array().cloned())
        .unwrap_or_default();
    let mut handed = 0;
    for done in moves
        .iter()
        .filter(|m| m["state"] == "done" || m["state"] == "promoted")
    {
        let at = done["finished_at_ms"].as_u64().unwrap_or(0);
        shared.history.record_at(
            "metastore",
            at,
            at,
            Op::Handover {
                topic: done["topic"].as_str().unwrap_or_default().to_string(),
                partition: u32::try_from(done["partition"].as_u64().unwrap_or(0)).unwrap_or(0),
                from: format!("n{}", done["from"]),
                to: format!("n{}", done["to"]),
            },
        );
        handed += 1;
    }
    handed
}

/// Accepted messages to wait for before the volume is lost, and again after
/// its node rejoined.
const SUITE_3_LOAD: usize = 600;

/// Suite 3: under load, a node loses its volume (SIGKILL, data folder
/// deleted) and rejoins empty. Records wait for their partition's owner
/// instead of being rerouted, so each message's partition follows from its
/// key; the checker then allows the loss of exactly the messages that may
/// have been on the wiped volume (in its partitions, or still in its WAL)
/// when it went, and of nothing else. Everything accepted after that is
/// delivered and acked.
#[test]
fn suite_3_a_lost_volume_loses_only_what_was_stored_on_it() {
    let seed = seed();
    let mut rng = Rng::new(seed);
    let flags: Vec<String> = vec!["--set".into(), "dispatcher.reroute_after_ms=600000".into()];
    let mut cluster = Cluster::start_each(CLUSTER_NODES, |_| flags.clone());
    cluster.wait_ready(SETTLE_DEADLINE);
    let shared = shared_for(&cluster);
    create_topics(&cluster, &shared, 5_000);
    let mix = Mix {
        nack_percent: 5,
        keyed: true,
        ..Mix::plain()
    };
    let (producing, consuming) = start_clients(&shared, seed, 4, None, 3, mix);
    let accepted = || shared.accepted.lock().expect("accepted").len();
    assert!(
        eventually(SETTLE_DEADLINE, || accepted() >= SUITE_3_LOAD),
        "produces went through before the volume was lost"
    );

    let victim = rng.below(CLUSTER_NODES as u64) as usize;
    let record = |action, begin: u64| {
        shared.history.record(
            "nemesis",
            begin,
            Op::Nemesis {
                action,
                node: format!("n{}", victim + 1),
            },
        );
    };
    let begin = now_ms();
    cluster.nodes[victim].kill();
    std::fs::remove_dir_all(&cluster.nodes[victim].data_dir).expect("wipe the volume");
    record(NemesisAction::Wipe, begin);
    let begin = now_ms();
    cluster.restart_node(victim, &flags);
    record(NemesisAction::Start, begin);
    *shared.addrs.lock().expect("addrs") = cluster.addrs();
    let before = accepted();
    assert!(
        eventually(SETTLE_DEADLINE, || accepted() >= before + SUITE_3_LOAD),
        "produces went through after the node rejoined"
    );

    // Every accepted message the checker does not allow to be lost.
    let all_acked = || check(&shared.history.events()).never_acked.count == 0;
    let drained = finish_when(&shared, producing, consuming, true, all_acked);
    keep_logs("suite3-lost-volume", seed, &cluster);
    let report = judge("suite3-lost-volume", seed, &shared, Strictness::Faults);
    eprintln!(
        "suite3: n{} lost its volume; {} accepted messages may have gone with it, {} of them did",
        victim + 1,
        report.on_a_lost_volume,
        report.lost_with_a_volume.count
    );
    assert!(
        drained,
        "the cluster holds nothing unacked within {SETTLE_DEADLINE:?} (seed {seed})"
    );
}
