//! Suite 4, network partitions: three real nodes, each in a network
//! namespace of its own (`support::netns`), with producers and consumers at
//! every node throughout, while links between the nodes are cut silently,
//! one way or both, and healed. The history (with every cut and heal in it)
//! is judged by `narad-check` as suite 2's is.
//!
//! - `suite_4_partitions_*_scripted`: one schedule after another, each
//!   asserting what the contract promises while it lasts and measuring it
//!   against the bounds that `docs/availability.md` states: a node cut off
//!   for longer than `cluster.node_dead_after_ms`, the Raft leader cut off,
//!   a bridge, and one-way cuts in both senses.
//! - `suite_4_partitions_*_flapping`: seeded random cuts that come and go,
//!   among SIGKILLs and restarts (`NARAD_SUITE_SEED` replays a schedule;
//!   `NARAD_PARTITION_SECONDS` runs it for longer).
//!
//! Both need root and `ip`: elsewhere they say they skipped, unless
//! `NARAD_NETNS=required` (as `.ci/run` sets it).

use std::collections::{BTreeSet, HashMap};

use narad_check::Event;

use super::*;
use support::netns::{self, Network};

/// `cluster.node_dead_after_ms` in this suite: short, so that a node is
/// marked dead within a schedule.
const NODE_DEAD_AFTER_MS: u64 = 4_000;
/// A node cut off from the others answers `/readyz` 503 within this (a
/// follower waits out the leader's lease, then an election timeout; a
/// leader, `LEADER_QUORUM_STALE_MS`).
pub const UNREADY_BOUND: Duration = Duration::from_secs(6);
/// The nodes still joined take a topic change within this of a cut (an
/// election may split and go again).
pub const TOPIC_CHANGE_BOUND: Duration = Duration::from_secs(10);
/// Every node is ready again within this of the heal.
pub const READY_AFTER_HEAL_BOUND: Duration = Duration::from_secs(10);
/// A pinned consume of a cut-off owner's partition answers 503 within this
/// of the cut (it answers 502 before, from the first call).
const OWNER_DEAD_BOUND: Duration = Duration::from_millis(NODE_DEAD_AFTER_MS + 4_000);
/// How long one try of a topic change may take before the next node is
/// asked.
const TOPIC_CHANGE_ATTEMPT: Duration = Duration::from_secs(1);
/// How long the flapping schedule runs.
const FLAPPING_SECONDS: u64 = 20;
/// The shortest and longest time a flapping step lasts.
const FLAP_MIN_MS: u64 = 300;
const FLAP_MAX_MS: u64 = 3_000;

/// A cluster on a network of its own, and the history it shares with its
/// clients.
struct Partitioned {
    cluster: Cluster,
    network: Arc<Network>,
    shared: Arc<Shared>,
    /// The suite's name and seed, for the files a failure leaves.
    suite: &'static str,
    seed: u64,
}

impl Drop for Partitioned {
    /// A failure keeps the history and every node's log (the cluster's
    /// folders go with the test).
    fn drop(&mut self) {
        if std::thread::panicking() {
            keep_logs(self.suite, self.seed, &self.cluster);
            let path = history_path(self.suite, self.seed);
            if self.shared.history.write(&path).is_ok() {
                eprintln!(
                    "{}: history and logs kept at {}",
                    self.suite,
                    path.display()
                );
            }
        }
    }
}

/// Every node's flags in this suite.
fn partition_flags() -> Vec<String> {
    vec![
        "--set".into(),
        format!("cluster.node_dead_after_ms={NODE_DEAD_AFTER_MS}"),
    ]
}

impl Partitioned {
    fn start(suite: &'static str, seed: u64) -> Self {
        let network = Arc::new(Network::new(CLUSTER_NODES));
        let cluster = Cluster::start_on(network.clone(), |_| partition_flags());
        cluster.wait_ready(SETTLE_DEADLINE);
        let shared = shared_for(&cluster);
        create_topics(&cluster, &shared, 2_000);
        Self {
            cluster,
            network,
            shared,
            suite,
            seed,
        }
    }

    /// Cuts packets from `from` to `to`, recorded in the history.
    fn cut(&self, from: usize, to: usize) {
        let begin = now_ms();
        self.network.cut(from, to);
        self.record_link(begin, from, to, true);
    }

    fn record_link(&self, begin: u64, from: usize, to: usize, cut: bool) {
        self.shared.history.record(
            "nemesis",
            begin,
            Op::Link {
                from: format!("n{}", from + 1),
                to: format!("n{}", to + 1),
                cut,
            },
        );
    }

    fn record_nemesis(&self, begin: u64, action: NemesisAction, node: usize) {
        self.shared.history.record(
            "nemesis",
            begin,
            Op::Nemesis {
                action,
                node: format!("n{}", node + 1),
            },
        );
    }

    fn isolate(&self, node: usize) {
        for other in (0..CLUSTER_NODES).filter(|o| *o != node) {
            self.cut(node, other);
            self.cut(other, node);
        }
    }

    /// Every link carries again, recorded in the history.
    fn heal(&self) {
        let begin = now_ms();
        let cuts = self.network.cuts();
        self.network.heal();
        for (from, to) in cuts {
            self.record_link(begin, from, to, false);
        }
    }

    fn addr(&self, node: usize) -> String {
        self.shared.addr(node)
    }

    fn ready(&self, node: usize) -> bool {
        matches!(
            try_request(&self.addr(node), "GET", "/readyz", b"", CLIENT_TIMEOUT),
            Ok((200, _))
        )
    }

    fn leader(&self) -> Option<usize> {
        self.cluster.leader(&(0..CLUSTER_NODES).collect::<Vec<_>>())
    }

    /// How long after `since` one of `nodes` says it leads (within
    /// [`TOPIC_CHANGE_BOUND`]).
    fn time_to_leader(&self, nodes: &[usize], since: Instant) -> Option<Duration> {
        eventually(TOPIC_CHANGE_BOUND.saturating_sub(since.elapsed()), || {
            self.cluster.leader(nodes).is_some()
        })
        .then(|| since.elapsed())
    }

    /// A produce straight to `node`, recorded in the history: whether it
    /// was answered 202.
    /// Produces `value` at `node`: the answer, if it is not a 202.
    fn produce_at(&self, node: usize, value: &str) -> Result<(), String> {
        let start = now_ms();
        let answer = try_request(
            &self.addr(node),
            "POST",
            &format!("/v1/topics/{}/messages", TOPICS[0]),
            value.as_bytes(),
            CLIENT_TIMEOUT,
        );
        let outcome = outcome_of(&answer, |b| b["id"].as_str().unwrap_or("").to_string());
        if let Outcome::Ok { .. } = &outcome {
            self.shared
                .accepted
                .lock()
                .expect("accepted")
                .insert(value.to_string());
        }
        self.shared.history.record(
            &via("probe", node),
            start,
            Op::Produce {
                topic: TOPICS[0].to_string(),
                value: value.to_string(),
                partition: None,
                outcome,
            },
        );
        match answer {
            Ok((202, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    }

    /// Creates topic `name` at `node`: the status, or `None` without an
    /// answer within `timeout`.
    fn create_topic_at(&self, node: usize, name: &str, timeout: Duration) -> Option<u16> {
        try_request(
            &self.addr(node),
            "PUT",
            &format!("/v1/topics/{name}"),
            json!({"partitions": 1}).to_string().as_bytes(),
            timeout,
        )
        .ok()
        .map(|(status, _)| status)
    }

    /// Sends the creation of topic `name` to `nodes` in turn until one
    /// says it is taken (2xx, or 409 once an earlier try that got no answer
    /// went through): how long after `since` that was, within
    /// [`TOPIC_CHANGE_BOUND`].
    fn take_topic_change(&self, nodes: &[usize], name: &str, since: Instant) -> Option<Duration> {
        let mut turn = 0;
        eventually(TOPIC_CHANGE_BOUND.saturating_sub(since.elapsed()), || {
            turn += 1;
            let node = nodes[turn % nodes.len()];
            matches!(
                self.create_topic_at(node, name, TOPIC_CHANGE_ATTEMPT),
                Some(200..=299 | 409)
            )
        })
        .then(|| since.elapsed())
    }

    fn has_topic(&self, node: usize, name: &str) -> bool {
        matches!(
            try_request(
                &self.addr(node),
                "GET",
                &format!("/v1/topics/{name}"),
                b"",
                CLIENT_TIMEOUT
            ),
            Ok((200, _))
        )
    }

    /// The topics `node` lists, by name.
    fn topic_names(&self, node: usize) -> Option<Vec<String>> {
        let Ok((200, body)) =
            try_request(&self.addr(node), "GET", "/v1/topics", b"", CLIENT_TIMEOUT)
        else {
            return None;
        };
        let mut names: Vec<String> = body["topics"]
            .as_array()?
            .iter()
            .filter_map(|t| t["name"].as_str().map(str::to_string))
            .collect();
        names.sort();
        Some(names)
    }

    /// Heals, and measures how long until every node is ready and every
    /// node lists the same topics (no change taken on one side only).
    fn heal_and_wait(&self, schedule: &str) -> Duration {
        self.heal();
        let healed = Instant::now();
        assert!(
            eventually(READY_AFTER_HEAL_BOUND, || (0..CLUSTER_NODES)
                .all(|n| self.ready(n))),
            "{schedule}: every node ready within {READY_AFTER_HEAL_BOUND:?} of the heal"
        );
        let ready = healed.elapsed();
        let agree = eventually(READY_AFTER_HEAL_BOUND, || {
            let lists: Vec<_> = (0..CLUSTER_NODES).map(|n| self.topic_names(n)).collect();
            lists[0].is_some() && lists.iter().all(|l| *l == lists[0])
        });
        assert!(
            agree,
            "{schedule}: the nodes list the same topics after the heal"
        );
        ready
    }

    /// The index of a partition of `TOPICS[0]` that `node` owns, if any.
    fn partition_of(&self, node: usize) -> Option<usize> {
        let Ok((200, body)) = try_request(
            &self.addr((node + 1) % CLUSTER_NODES),
            "GET",
            &format!("/v1/topics/{}", TOPICS[0]),
            b"",
            CLIENT_TIMEOUT,
        ) else {
            return None;
        };
        body["partition_stats"]
            .as_array()?
            .iter()
            .position(|p| p["owner"].as_u64() == Some(node as u64 + 1))
    }

    /// A consume pinned to `partition` of `TOPICS[0]`, sent to `node`.
    fn pinned_consume(&self, node: usize, partition: usize) -> (u16, String) {
        match try_request(
            &self.addr(node),
            "POST",
            &format!("/v1/topics/{}/consume", TOPICS[0]),
            json!({"partition": partition, "max_messages": 1})
                .to_string()
                .as_bytes(),
            CLIENT_TIMEOUT,
        ) {
            Ok((status, body)) => (
                status,
                body["error"]["code"].as_str().unwrap_or("").to_string(),
            ),
            Err(reason) => (0, reason),
        }
    }
}

/// What one schedule measured (`docs/availability.md` publishes them).
#[derive(Debug, Default)]
struct Figures {
    /// When the schedule began and ended (its heal included).
    window: (u64, u64),
    unready: Option<Duration>,
    /// Until one of the nodes still joined said it leads.
    leader: Option<Duration>,
    topic_change: Option<Duration>,
    owner_dead: Option<Duration>,
    ready_after_heal: Option<Duration>,
}

fn secs(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.1} s", d.as_secs_f64()))
}

/// `victim` cut off from the others, both ways, for `hold` at least. While
/// cut: it answers produce 202 and `/readyz` 503 (within
/// [`UNREADY_BOUND`]); the others take a topic change (within
/// [`TOPIC_CHANGE_BOUND`]); a change sent to it is never answered 2xx
/// unless the others took it; a consume pinned to its partition answers
/// 502, then 503 once it is marked dead (when `hold` outlasts
/// `cluster.node_dead_after_ms`).
fn cut_off(p: &Partitioned, schedule: &str, victim: usize, hold: Duration) -> Figures {
    let others: Vec<usize> = (0..CLUSTER_NODES).filter(|n| *n != victim).collect();
    let pinned = p.partition_of(victim);
    p.isolate(victim);
    let cut_at = Instant::now();
    let answer = p.produce_at(victim, &format!("{schedule}-while-cut"));
    assert!(
        answer.is_ok(),
        "{schedule}: the cut-off node answers a produce 202 ({answer:?})"
    );
    // Each promise is timed on a thread of its own from the cut, while the
    // cut-off node keeps taking produces.
    let (unready, topic_change, owner_dead, answered, leader) = std::thread::scope(|scope| {
        let unready = scope
            .spawn(|| eventually(UNREADY_BOUND, || !p.ready(victim)).then(|| cut_at.elapsed()));
        let topic_change =
            scope.spawn(|| p.take_topic_change(&others, &format!("{schedule}-majority"), cut_at));
        let leader = scope.spawn(|| p.time_to_leader(&others, cut_at));
        let owner_dead = scope.spawn(|| {
            let partition = pinned?;
            let first = p.pinned_consume(others[0], partition);
            assert_eq!(
                first,
                (502, "owner_unreachable".to_string()),
                "{schedule}: a consume pinned to the cut-off owner's partition"
            );
            (hold > Duration::from_millis(NODE_DEAD_AFTER_MS)).then_some(())?;
            eventually(OWNER_DEAD_BOUND, || {
                p.pinned_consume(others[0], partition) == (503, "owner_dead".to_string())
            })
            .then(|| cut_at.elapsed())
        });
        // A change sent to the cut-off node, once it knows it has no
        // leader: refused or unanswered, or taken by the others too.
        let answered = scope.spawn(|| {
            eventually(UNREADY_BOUND, || !p.ready(victim));
            p.create_topic_at(victim, &format!("{schedule}-cut-off"), CLIENT_TIMEOUT)
        });
        let mut i = 0;
        while cut_at.elapsed() < hold {
            i += 1;
            let answer = p.produce_at(victim, &format!("{schedule}-while-cut-{i}"));
            assert!(
                answer.is_ok(),
                "{schedule}: the cut-off node answers a produce 202 throughout ({answer:?})"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let join = |name, handle: std::thread::ScopedJoinHandle<'_, Option<Duration>>| {
            handle
                .join()
                .unwrap_or_else(|_| panic!("{schedule}: {name} failed"))
        };
        (
            join("the readiness check", unready),
            join("the topic change", topic_change),
            join("the pinned consume", owner_dead),
            answered.join().expect("the change at the cut-off node"),
            join("the leader watch", leader),
        )
    });
    assert!(
        unready.is_some(),
        "{schedule}: n{} answers /readyz 503 within {UNREADY_BOUND:?}",
        victim + 1
    );
    assert!(
        topic_change.is_some(),
        "{schedule}: the joined nodes take a topic change within {TOPIC_CHANGE_BOUND:?}"
    );
    if pinned.is_some() && hold > Duration::from_millis(NODE_DEAD_AFTER_MS) {
        assert!(
            owner_dead.is_some(),
            "{schedule}: a pinned consume answers 503 owner_dead within {OWNER_DEAD_BOUND:?} \
             of the cut"
        );
    }
    eprintln!("suite4: {schedule}: a topic change sent to the cut-off node: {answered:?}");
    assert!(
        matches!(answered, None | Some(200..=299 | 503)),
        "{schedule}: the cut-off node answered a topic change {answered:?}, not 503 or nothing"
    );
    let split_topic = format!("{schedule}-cut-off");
    if matches!(answered, Some(200..=299)) {
        assert!(
            others.iter().all(|n| p.has_topic(*n, &split_topic)),
            "{schedule}: the cut-off node answered {answered:?} to a change the others lack"
        );
    }
    let ready_after_heal = Some(p.heal_and_wait(schedule));
    if matches!(answered, Some(300..)) {
        // What it refused never appears (a change without an answer may).
        assert!(
            !p.has_topic(others[0], &split_topic),
            "{schedule}: the cut-off node refused a change ({answered:?}) that was taken"
        );
    }
    Figures {
        window: (0, 0),
        unready,
        leader,
        topic_change,
        owner_dead,
        ready_after_heal,
    }
}

/// `a` and `b` cannot talk while both reach `bridge`: the cluster keeps a
/// leader that takes topic changes, and produces go on at every node.
fn bridged(p: &Partitioned, schedule: &str, bridge: usize, hold: Duration) -> Figures {
    let (a, b) = ((bridge + 1) % CLUSTER_NODES, (bridge + 2) % CLUSTER_NODES);
    let mut figures = Figures::default();
    p.cut(a, b);
    p.cut(b, a);
    let cut_at = Instant::now();
    let all: Vec<usize> = (0..CLUSTER_NODES).collect();
    figures.topic_change = p.take_topic_change(&all, &format!("{schedule}-change"), cut_at);
    assert!(
        figures.topic_change.is_some(),
        "{schedule}: a topic change is taken within {TOPIC_CHANGE_BOUND:?}"
    );
    let mut i = 0;
    while cut_at.elapsed() < hold {
        i += 1;
        for node in 0..CLUSTER_NODES {
            let answer = p.produce_at(node, &format!("{schedule}-{node}-{i}"));
            assert!(
                answer.is_ok(),
                "{schedule}: n{} answers a produce 202 ({answer:?})",
                node + 1
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    figures.ready_after_heal = Some(p.heal_and_wait(schedule));
    figures
}

/// One way only: `victim`'s packets to the others dropped (it hears them
/// but is not heard), or theirs to it (`deaf`). It answers produce 202
/// throughout; a change sent to it is never 2xx unless the others took it.
fn one_way(p: &Partitioned, schedule: &str, victim: usize, deaf: bool, hold: Duration) -> Figures {
    let others: Vec<usize> = (0..CLUSTER_NODES).filter(|n| *n != victim).collect();
    let mut figures = Figures::default();
    // A follower that hears nothing must not call elections that would
    // unseat the leader when the link heals: the term stays.
    let was_leader = p.leader() == Some(victim);
    let follower_term = (!was_leader).then(|| p.cluster.term(others[0]));
    for &other in &others {
        if deaf {
            p.cut(other, victim);
        } else {
            p.cut(victim, other);
        }
    }
    let cut_at = Instant::now();
    let name = format!("{schedule}-change");
    let answered = std::thread::scope(|scope| {
        let leader = scope.spawn(|| p.time_to_leader(&others, cut_at));
        let unready =
            scope.spawn(|| eventually(hold, || !p.ready(victim)).then(|| cut_at.elapsed()));
        let answered = scope.spawn(|| p.create_topic_at(victim, &name, CLIENT_TIMEOUT));
        figures.topic_change =
            p.take_topic_change(&others, &format!("{schedule}-majority"), cut_at);
        let mut i = 0;
        while cut_at.elapsed() < hold {
            i += 1;
            let answer = p.produce_at(victim, &format!("{schedule}-{i}"));
            assert!(
                answer.is_ok(),
                "{schedule}: n{} answers a produce 202 throughout ({answer:?})",
                victim + 1
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        figures.leader = leader.join().expect("the leader watch");
        figures.unready = unready.join().expect("the readiness watch");
        answered.join().expect("the change at the cut node")
    });
    assert!(
        figures.topic_change.is_some(),
        "{schedule}: the others take a topic change within {TOPIC_CHANGE_BOUND:?}"
    );
    // A deaf node hears no leader, and a leader either way hears no quorum.
    if deaf || was_leader {
        assert!(
            figures.unready.is_some_and(|t| t <= UNREADY_BOUND),
            "{schedule}: n{} answers /readyz 503 within {UNREADY_BOUND:?} ({:?})",
            victim + 1,
            figures.unready
        );
    }
    // A node that still hears its leader forwards the change, and cannot
    // know whether it arrived: 500 (it may have been taken) is honest too.
    assert!(
        matches!(answered, None | Some(200..=299 | 500 | 503)),
        "{schedule}: n{} answered a topic change {answered:?}",
        victim + 1
    );
    if matches!(answered, Some(200..=299)) {
        assert!(
            others.iter().all(|n| p.has_topic(*n, &name)),
            "{schedule}: n{} answered {answered:?} to a change the others lack",
            victim + 1
        );
    }
    figures.ready_after_heal = Some(p.heal_and_wait(schedule));
    if let Some(term) = follower_term {
        let after: Vec<String> = (0..CLUSTER_NODES).map(|n| p.cluster.term(n)).collect();
        assert!(
            after.iter().all(|t| *t == term),
            "{schedule}: the heal cost an election (term {term} before, {after:?} after)"
        );
    }
    figures
}

/// Stops the clients, waits for every accepted message to be acked, keeps
/// the logs, and judges the history as suite 2's: the report.
fn finish_partitioned(
    p: &Partitioned,
    suite: &str,
    seed: u64,
    clients: (
        Vec<std::thread::JoinHandle<()>>,
        Vec<std::thread::JoinHandle<()>>,
    ),
) -> Report {
    let drained = finish(&p.shared, clients.0, clients.1, true);
    keep_logs(suite, seed, &p.cluster);
    let report = judge(suite, seed, &p.shared, Strictness::Faults);
    assert!(
        report.accepted > 0,
        "produces went through between the cuts"
    );
    assert!(
        drained,
        "the cluster holds nothing unacked within {SETTLE_DEADLINE:?} of the heal (seed {seed})"
    );
    let whole_run = duplicates_by_window(&p.shared.history.events(), &[(0, u64::MAX)]);
    let (accepted, twice) = whole_run[0];
    eprintln!(
        "{suite}: {accepted} accepted, {twice} of them stored twice or more (delivered from more \
         than one offset: {:.1} per 1,000)",
        twice as f64 * 1000.0 / accepted.max(1) as f64
    );
    report
}

/// For each window (from, to), the messages accepted by produces that
/// started in it, and how many of those were delivered from more than one
/// place (partition and offset): stored twice.
fn duplicates_by_window(events: &[Event], windows: &[(u64, u64)]) -> Vec<(usize, usize)> {
    let mut places: HashMap<&str, BTreeSet<(u32, u64)>> = HashMap::new();
    for event in events {
        if let Op::Consume {
            outcome: Outcome::Ok { value },
            ..
        } = &event.op
        {
            for d in value {
                places
                    .entry(d.id.as_str())
                    .or_default()
                    .insert((d.partition, d.offset));
            }
        }
    }
    windows
        .iter()
        .map(|(from, to)| {
            let accepted: Vec<&str> = events
                .iter()
                .filter(|e| (*from..*to).contains(&e.start_ms))
                .filter_map(|e| match &e.op {
                    Op::Produce {
                        outcome: Outcome::Ok { value },
                        ..
                    } => Some(value.as_str()),
                    _ => None,
                })
                .collect();
            let twice = accepted
                .iter()
                .filter(|id| places.get(*id).is_some_and(|p| p.len() > 1))
                .count();
            (accepted.len(), twice)
        })
        .collect()
}

fn client_mix() -> Mix {
    Mix {
        nack_percent: 5,
        vanish_percent: VANISH_PERCENT,
        ..Mix::plain()
    }
}

#[test]
fn suite_4_partitions_cut_nodes_off_and_lose_nothing_scripted() {
    if !netns::can_run("suite 4") {
        return;
    }
    let seed = seed();
    let p = Partitioned::start("suite4-scripted", seed);
    let clients = start_clients(&p.shared, seed, 4, None, 3, client_mix());
    let hold = Duration::from_millis(NODE_DEAD_AFTER_MS + 2_000);
    let short = Duration::from_secs(4);
    let mut figures: Vec<(&str, Figures)> = Vec::new();
    let mut timed = |name, schedule: &dyn Fn() -> Figures| {
        let begin = now_ms();
        let f = schedule();
        figures.push((
            name,
            Figures {
                window: (begin, now_ms()),
                ..f
            },
        ));
    };
    let follower = (p.leader().unwrap_or(0) + 1) % CLUSTER_NODES;
    timed("a follower cut off past node_dead_after_ms", &|| {
        cut_off(&p, "follower-cut", follower, hold)
    });
    timed("the Raft leader cut off", &|| {
        let leader = p.leader().expect("a leader after the heal");
        cut_off(&p, "leader-cut", leader, short)
    });
    timed("a bridge", &|| {
        let bridge = p.leader().map_or(0, |l| (l + 1) % CLUSTER_NODES);
        bridged(&p, "bridge", bridge, short)
    });
    let victim = p.leader().map_or(0, |l| (l + 2) % CLUSTER_NODES);
    timed("one node not heard (its packets out dropped)", &|| {
        one_way(&p, "not-heard", victim, false, short)
    });
    // Long enough for a deaf node to time out more than once.
    timed("one node deaf (packets to it dropped)", &|| {
        one_way(&p, "deaf", victim, true, Duration::from_secs(8))
    });
    timed("the Raft leader not heard", &|| {
        let leader = p.leader().expect("a leader after the heal");
        one_way(&p, "leader-not-heard", leader, false, short)
    });
    timed("the Raft leader deaf", &|| {
        let leader = p.leader().expect("a leader after the heal");
        one_way(&p, "leader-deaf", leader, true, short)
    });
    finish_partitioned(&p, "suite4-scripted", seed, clients);
    let windows: Vec<(u64, u64)> = figures.iter().map(|(_, f)| f.window).collect();
    let duplicates = duplicates_by_window(&p.shared.history.events(), &windows);
    eprintln!(
        "suite4: schedule | to unready | to a leader among the others | to a topic change | \
         to owner_dead | to ready after heal | accepted | at two offsets or more (per 1,000)"
    );
    for ((name, f), (accepted, twice)) in figures.iter().zip(duplicates) {
        eprintln!(
            "suite4: {name} | {} | {} | {} | {} | {} | {accepted} | {twice} ({:.1})",
            secs(f.unready),
            secs(f.leader),
            secs(f.topic_change),
            secs(f.owner_dead),
            secs(f.ready_after_heal),
            twice as f64 * 1000.0 / accepted.max(1) as f64
        );
    }
}

/// One step of the flapping schedule.
#[derive(Debug, Clone)]
enum Flap {
    /// These one-way cuts (from, to), on top of those in force.
    Cut(Vec<(usize, usize)>),
    /// Every link heals.
    Heal,
    /// SIGKILL a node and start it again.
    Crash(usize),
}

/// The seeded schedule: each step and how long to wait after it.
fn flapping_plan(rng: &mut Rng, seconds: u64) -> Vec<(Flap, u64)> {
    let mut plan = Vec::new();
    let mut total = 0;
    while total < seconds * 1000 {
        let a = rng.below(CLUSTER_NODES as u64) as usize;
        let b = (a + 1 + rng.below(CLUSTER_NODES as u64 - 1) as usize) % CLUSTER_NODES;
        let c = (0..CLUSTER_NODES).find(|n| *n != a && *n != b).unwrap_or(0);
        let step = match rng.below(7) {
            0 => Flap::Cut(vec![(a, b)]),
            1 => Flap::Cut(vec![(a, b), (b, a)]),
            2 => Flap::Cut(vec![(a, b), (b, a), (a, c), (c, a)]),
            3 => Flap::Cut(vec![(a, b), (a, c)]),
            4 => Flap::Crash(a),
            _ => Flap::Heal,
        };
        let wait = rng.between(FLAP_MIN_MS, FLAP_MAX_MS);
        total += wait;
        plan.push((step, wait));
    }
    plan.push((Flap::Heal, 0));
    plan
}

#[test]
fn suite_4_partitions_flap_among_crashes_and_lose_nothing_flapping() {
    if !netns::can_run("suite 4") {
        return;
    }
    let seed = seed();
    let seconds = std::env::var("NARAD_PARTITION_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(FLAPPING_SECONDS);
    let plan = flapping_plan(&mut Rng::new(seed), seconds);
    eprintln!("suite4-flapping: seed {seed}, schedule {plan:?}");
    let mut p = Partitioned::start("suite4-flapping", seed);
    let clients = start_clients(&p.shared, seed, 4, None, 3, client_mix());
    for (step, wait) in &plan {
        match step {
            Flap::Cut(cuts) => {
                for (from, to) in cuts {
                    p.cut(*from, *to);
                }
            }
            Flap::Heal => p.heal(),
            Flap::Crash(node) => {
                let begin = now_ms();
                p.cluster.nodes[*node].kill();
                p.record_nemesis(begin, NemesisAction::Kill, *node);
                let begin = now_ms();
                p.cluster.restart_node(*node, &partition_flags());
                p.record_nemesis(begin, NemesisAction::Start, *node);
                *p.shared.addrs.lock().expect("addrs") = p.cluster.addrs();
            }
        }
        std::thread::sleep(Duration::from_millis(*wait));
    }
    let ready = p.heal_and_wait("flapping");
    eprintln!(
        "suite4-flapping: every node ready {:.1} s after the last heal",
        ready.as_secs_f64()
    );
    finish_partitioned(&p, "suite4-flapping", seed, clients);
}
