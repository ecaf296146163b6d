//! The delivery-contract suites: producers and consumers record every
//! operation in a history (`narad-check`), a seeded nemesis stops, kills,
//! pauses and power-cuts the node, and the checker judges the history.
//!
//! - Suite 1, healthy: nothing is broken; any loss, duplicate, stray message
//!   or message on the wrong topic fails.
//! - Suite 2, faults: at least one fault every 5 seconds and every kind of
//!   fault in every run; every 202'd message must end up acked, and no
//!   message may appear that was never produced or on the wrong topic.
//!   Duplicates are counted and reported.
//!
//! This build runs the suites against one node with two shards; the cluster
//! issue grows them to three nodes. `NARAD_SUITE_SEED` replays a run;
//! `NARAD_SOAK_SECONDS` runs the fault suite for longer. A failure prints the
//! seed and the path of the history file.

mod support;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use narad_check::{
    check, now_ms, Delivery, History, NemesisAction, Op, Outcome, Report, SettleAction, Strictness,
};
use serde_json::{json, Value};
use support::{eventually, try_request, Node};

/// How long a client waits for one answer before recording it as unknown.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long consumers may take to ack every 202'd message once faults stop.
const SETTLE_DEADLINE: Duration = Duration::from_secs(90);
/// The fault suite's length in CI.
const FAULT_SUITE_SECONDS: u64 = 20;
/// Faults come at least this often.
const FAULT_INTERVAL_MAX_MS: u64 = 4_000;
const FAULT_INTERVAL_MIN_MS: u64 = 1_000;
const TOPICS: [&str; 3] = ["orders", "payments", "audit"];

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

/// What the clients share: the node's address (it changes on restart), the
/// history, and the ids answered 202 and acked.
struct Shared {
    addr: Mutex<String>,
    history: History,
    accepted: Mutex<HashSet<String>>,
    acked: Mutex<HashSet<String>>,
    stop_producers: AtomicBool,
    stop_consumers: AtomicBool,
}

impl Shared {
    fn addr(&self) -> String {
        self.addr.lock().expect("addr").clone()
    }

    fn all_acked(&self) -> bool {
        let accepted = self.accepted.lock().expect("accepted");
        let acked = self.acked.lock().expect("acked");
        accepted.iter().all(|id| acked.contains(id))
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

/// Sends `count` messages (or until told to stop), round robin over topics.
fn producer(shared: Arc<Shared>, client: String, count: Option<u64>) {
    let mut i = 0u64;
    while count.is_none_or(|c| i < c) && !shared.stop_producers.load(Ordering::SeqCst) {
        let topic = TOPICS[(i % TOPICS.len() as u64) as usize];
        let value = format!("{client}-{i}");
        let start = now_ms();
        let answer = try_request(
            &shared.addr(),
            "POST",
            &format!("/v1/topics/{topic}/messages"),
            value.as_bytes(),
            CLIENT_TIMEOUT,
        );
        let outcome = outcome_of(&answer, |b| b["id"].as_str().unwrap_or("").to_string());
        let accepted = matches!(answer, Ok((202, _)));
        if let Outcome::Ok { value: id } = &outcome {
            shared.accepted.lock().expect("accepted").insert(id.clone());
        }
        shared.history.record(
            &client,
            start,
            Op::Produce {
                topic: topic.to_string(),
                value,
                outcome,
            },
        );
        // A refused or unanswered message is not sent again: the checker
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
    let answer = try_request(
        &shared.addr(),
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
        if action == SettleAction::Ack && matches!(outcome, Outcome::Ok { .. }) {
            shared
                .acked
                .lock()
                .expect("acked")
                .insert(delivery.id.clone());
        }
        shared.history.record(
            client,
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

/// Long-polls every topic in turn and settles what it gets: mostly acks,
/// with `nack_percent` nacks and a few extends before the ack.
fn consumer(shared: Arc<Shared>, client: String, seed: u64, nack_percent: u64) {
    let mut rng = Rng::new(seed);
    let mut turn = 0usize;
    while !shared.stop_consumers.load(Ordering::SeqCst) {
        let topic = TOPICS[turn % TOPICS.len()];
        turn += 1;
        let start = now_ms();
        let answer = try_request(
            &shared.addr(),
            "POST",
            &format!("/v1/topics/{topic}/consume"),
            json!({"max_messages": 25, "wait_ms": 200})
                .to_string()
                .as_bytes(),
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
            &client,
            start,
            Op::Consume {
                topic: topic.to_string(),
                outcome,
            },
        );
        if answer.is_err() {
            // The node is down or paused: try again.
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
        settle(&shared, &client, topic, SettleAction::Nack, &nacks);
        settle(&shared, &client, topic, SettleAction::Extend, &extends);
        settle(&shared, &client, topic, SettleAction::Ack, &acks);
    }
}

fn history_path(suite: &str, seed: u64) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("histories");
    std::fs::create_dir_all(&dir).expect("histories dir");
    dir.join(format!("{suite}-{seed}.jsonl"))
}

/// Writes the history and fails on any violation, naming seed and file.
fn judge(suite: &str, seed: u64, shared: &Shared, strictness: Strictness) -> Report {
    let path = history_path(suite, seed);
    shared.history.write(&path).expect("write history");
    let report = check(&shared.history.events());
    eprintln!(
        "{suite}: seed {seed}, history {}\n{}",
        path.display(),
        report.summary()
    );
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

fn create_topics(node: &Node, visibility_timeout_ms: u64) {
    for topic in TOPICS {
        node.create_topic(
            topic,
            json!({"partitions": 4, "visibility_timeout_ms": visibility_timeout_ms}),
        );
    }
}

fn start_clients(
    shared: &Arc<Shared>,
    seed: u64,
    producers: usize,
    per_producer: Option<u64>,
    consumers: usize,
    nack_percent: u64,
) -> (
    Vec<std::thread::JoinHandle<()>>,
    Vec<std::thread::JoinHandle<()>>,
) {
    let producing = (0..producers)
        .map(|p| {
            let shared = shared.clone();
            std::thread::spawn(move || producer(shared, format!("p{p}"), per_producer))
        })
        .collect();
    let consuming = (0..consumers)
        .map(|c| {
            let shared = shared.clone();
            let client_seed = seed.wrapping_add(1 + c as u64);
            std::thread::spawn(move || consumer(shared, format!("c{c}"), client_seed, nack_percent))
        })
        .collect();
    (producing, consuming)
}

/// Waits for the producers (stopping them first unless they send a fixed
/// count), stops the consumers once every 202'd message is acked (or the
/// deadline passed), and joins everything.
fn finish(
    shared: &Arc<Shared>,
    producing: Vec<std::thread::JoinHandle<()>>,
    consuming: Vec<std::thread::JoinHandle<()>>,
    stop_producers: bool,
) {
    shared
        .stop_producers
        .store(stop_producers, Ordering::SeqCst);
    for handle in producing {
        handle.join().expect("producer");
    }
    eventually(SETTLE_DEADLINE, || shared.all_acked());
    shared.stop_consumers.store(true, Ordering::SeqCst);
    for handle in consuming {
        handle.join().expect("consumer");
    }
}

fn shared_for(node: &Node) -> Arc<Shared> {
    Arc::new(Shared {
        addr: Mutex::new(node.addr.clone()),
        history: History::new(),
        accepted: Mutex::default(),
        acked: Mutex::default(),
        stop_producers: AtomicBool::new(false),
        stop_consumers: AtomicBool::new(false),
    })
}

#[test]
fn suite_1_healthy_node_delivers_every_message_once() {
    let seed = seed();
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n1"), &["--shards", "2"]);
    create_topics(&node, 30_000);
    let shared = shared_for(&node);
    let (producing, consuming) = start_clients(&shared, seed, 4, Some(300), 3, 0);
    finish(&shared, producing, consuming, false);
    let report = judge("suite1-healthy", seed, &shared, Strictness::Healthy);
    assert_eq!(report.accepted, 1200, "every produce answered 202");
}

/// The nemesis' plan: every kind once, in a seeded order, then random kinds.
fn fault_plan(rng: &mut Rng, count: usize) -> Vec<NemesisAction> {
    let mut plan = vec![
        NemesisAction::Kill,
        NemesisAction::PowerCut,
        NemesisAction::Terminate,
        NemesisAction::Pause,
    ];
    for i in (1..plan.len()).rev() {
        plan.swap(i, rng.below(i as u64 + 1) as usize);
    }
    while plan.len() < count {
        plan.push(plan[rng.below(4) as usize]);
    }
    plan
}

/// Whether the next fault that stops the node is a power cut.
fn next_crash_is_power_cut(plan: &[NemesisAction]) -> bool {
    plan.iter().find(|f| **f != NemesisAction::Pause) == Some(&NemesisAction::PowerCut)
}

fn node_flags(power_loss: bool) -> Vec<&'static str> {
    let mut flags = vec!["--shards", "2"];
    if power_loss {
        flags.extend(["--set", "testing.faults=power_loss"]);
    }
    flags
}

#[test]
fn suite_2_faults_every_accepted_message_is_acked_in_the_end() {
    let seed = seed();
    let seconds = std::env::var("NARAD_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(FAULT_SUITE_SECONDS);
    let mut rng = Rng::new(seed);
    let faults = (seconds * 1000 / FAULT_INTERVAL_MIN_MS) as usize + 4;
    let plan = fault_plan(&mut rng, faults);
    let tmp = tempfile::tempdir().expect("tmp");
    // A power cut needs a node that kept its unsynced writes in memory: each
    // start runs in power-loss mode when the next fault is a power cut.
    let mut node = Node::start(
        &tmp.path().join("n1"),
        &node_flags(next_crash_is_power_cut(&plan)),
    );
    // Short leases, so pauses also end leases and late acks get tested.
    create_topics(&node, 2_000);
    let shared = shared_for(&node);
    let (producing, consuming) = start_clients(&shared, seed, 4, None, 3, 5);

    let started = Instant::now();
    let mut done = Vec::new();
    while started.elapsed() < Duration::from_secs(seconds) || done.len() < 4 {
        let wait = rng.between(FAULT_INTERVAL_MIN_MS, FAULT_INTERVAL_MAX_MS);
        std::thread::sleep(Duration::from_millis(wait));
        let Some(&fault) = plan.get(done.len()) else {
            break;
        };
        let begin = now_ms();
        let record = |action| {
            shared.history.record(
                "nemesis",
                begin,
                Op::Nemesis {
                    action,
                    node: "n1".into(),
                },
            );
        };
        match fault {
            NemesisAction::Pause => {
                node.pause();
                record(NemesisAction::Pause);
                std::thread::sleep(Duration::from_millis(rng.between(500, 3_000)));
                node.resume();
                record(NemesisAction::Resume);
            }
            crash => {
                if crash == NemesisAction::Terminate {
                    node.terminate();
                } else {
                    node.kill();
                }
                record(crash);
                let power_loss = next_crash_is_power_cut(&plan[done.len() + 1..]);
                node.restart_with(&node_flags(power_loss));
                *shared.addr.lock().expect("addr") = node.addr.clone();
                record(NemesisAction::Start);
            }
        }
        done.push(fault);
    }
    finish(&shared, producing, consuming, true);
    for kind in [
        NemesisAction::Kill,
        NemesisAction::PowerCut,
        NemesisAction::Terminate,
        NemesisAction::Pause,
    ] {
        assert!(done.contains(&kind), "{kind:?} was injected (seed {seed})");
    }
    let report = judge("suite2-faults", seed, &shared, Strictness::Faults);
    assert!(report.accepted > 0, "produces went through between faults");
    eprintln!("suite2: faults {done:?}");
}
